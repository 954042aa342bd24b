"""Whole-plan evaluation under the kernel cost model (shared by every extractor).

A *choice* maps each e-class to one of its e-nodes. Its kernels are the roots plus the inner class
of every chosen ``Realize`` reachable from them; :meth:`PlanEvaluator.evaluate` costs each kernel
(bytes, evaluation-weighted FLOPs, legality -- see cost.py) and sums them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops import OPS, REDUCE_OPS, numel
from .cost import CostModel, KernelCost
from .egraph import EGraph, ENode

Choice = dict[int, ENode]


@dataclass
class Evaluation:
    total: float
    kernels: dict[int, KernelCost]
    legal: bool

    @property
    def n_kernels(self) -> int:
        return len(self.kernels)


class PlanEvaluator:
    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple]):
        self.g, self.cost, self.inputs = g, cost, inputs
        self.evaluations = 0

    def kernel_cost(self, choice: Choice, k: int) -> tuple[KernelCost, list[int]]:
        g, p = self.g, self.cost.params
        # body in topological order (consumers first): iterative DFS post-order, reversed
        order: list[int] = []
        seen: set[int] = set()
        stack: list[tuple[int, bool]] = [(k, False)]
        while stack:
            c, done = stack.pop()
            if done:
                order.append(c)
                continue
            if c in seen:
                continue
            seen.add(c)
            stack.append((c, True))
            n = choice[c]
            if n.op in ("BUF", "CONST") or (n.op == "REALIZE" and c != k):
                continue
            stack.extend((ch, False) for ch in n.children if ch not in seen)
        order.reverse()
        ev: dict[int, float] = {k: numel(g.shapes[k])}
        loads: dict[int, float] = {}       # materialized producer class -> element reads
        inputs: dict[int, float] = {}      # input position -> element reads
        flops, nodes, legal, why = 0.0, 0, True, ""
        deps: list[int] = []
        fused: list[str] = []
        for c in order:
            e = ev.get(c, 0)
            n = choice[c]
            if n.op == "BUF":
                inputs[n.arg[0]] = max(inputs.get(n.arg[0], 0), e)
                continue
            if n.op == "CONST":
                continue
            if n.op == "REALIZE" and c != k:
                inner = n.children[0]
                if choice[inner].op == "BUF":
                    pos = choice[inner].arg[0]
                    inputs[pos] = max(inputs.get(pos, 0), e)
                elif choice[inner].op != "CONST":
                    loads[inner] = max(loads.get(inner, 0), e)
                    deps.append(inner)
                continue
            nodes += 1
            fused.append(n.op)
            if n.op == "CONTIGUOUS" and c != k:
                legal, why = False, "a Contiguous is inlined into a consumer"
            mult = 1
            if n.op in REDUCE_OPS:
                mult = numel(g.shapes[n.children[0]]) // max(1, numel(g.shapes[c]))
                if e > numel(g.shapes[c]):
                    legal, why = False, f"reduction {n.op} recomputed {e / numel(g.shapes[c]):.0f}x per element"
            flops += OPS[n.op].flops * e * max(1, mult)
            if n.op == "PAD" and e > numel(g.shapes[k]):
                flops += p.masked_read * e
            for ch in n.children:
                ev[ch] = max(ev.get(ch, 0), e * mult)
        if nodes > p.max_nodes:
            legal, why = False, f"body of {nodes} nodes > {p.max_nodes}"
        nbytes = numel(g.shapes[k]) * g.dtypes[k].itemsize
        for pos, reads in inputs.items():
            shape, dt = self.inputs[pos]
            nbytes += min(reads, numel(shape)) * dt.itemsize
        for c, reads in loads.items():
            nbytes += min(reads, numel(g.shapes[c])) * g.dtypes[c].itemsize
        t = self.cost.seconds(nbytes, flops, nodes)
        return KernelCost(t, int(nbytes), int(flops), nodes, legal, why, tuple(reversed(fused))), deps

    def evaluate(self, choice: Choice) -> Evaluation:
        self.evaluations += 1
        kernels: dict[int, KernelCost] = {}
        todo = [r for r in self.g.roots if choice[r].op != "BUF"]
        while todo:
            k = todo.pop()
            if k in kernels:
                continue
            kc, deps = self.kernel_cost(choice, k)
            kernels[k] = kc
            todo.extend(d for d in deps if d not in kernels)
        total = sum(kc.seconds for kc in kernels.values())
        return Evaluation(total, kernels, all(kc.legal for kc in kernels.values()))

    def reachable(self, choice: Choice) -> set[int]:
        out, stack = set(), list(self.g.roots)
        while stack:
            c = stack.pop()
            if c in out:
                continue
            out.add(c)
            stack.extend(choice[c].children)
        return out

    def is_acyclic(self, choice: Choice) -> bool:
        state: dict[int, int] = {}
        for r in self.g.roots:
            stack = [(r, iter(choice[r].children))]
            if state.get(r) == 2:
                continue
            state[r] = 1
            while stack:
                c, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[c] = 2
                    stack.pop()
                elif state.get(nxt) == 1:
                    return False
                elif nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(choice[nxt].children)))
        return True
