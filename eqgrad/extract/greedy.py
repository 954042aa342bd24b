"""The default extractor: a semantic choice per class, then fusion by producer toggles.

1. **Semantic choice.** Per e-class, the node of least tree cost (FLOP weight x elements + 1 per
   node), with ``Realize`` transparent -- this picks among algebra and movement variants (``x``
   over ``x*1``, a folded constant over its expression). Among nodes of equal cost it takes the one
   with the most ``Realize`` children: the plan starts *unfused*, which is always legal.
2. **Fusion by toggles** (shared/notes/fusion-prototype.md). A move takes one producer class P and
   switches *every* consumer edge between ``Realize(P)`` (materialize) and ``P`` (inline) at once;
   flipping single edges gets stuck exactly on materialize-vs-recompute decisions. A move is kept
   when the plan's total cost under the kernel cost model drops and every kernel stays legal.
   Passes repeat until no move improves.

Toggling only swaps ``Realize(P)`` and ``P`` children, which reach the same classes, so a plan that
starts acyclic stays acyclic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ops import OPS, REDUCE_OPS, numel
from .cost import DeviceParams, KernelCost, kernel_time
from .egraph import EGraph, ENode

INF = float("inf")


@dataclass
class Evaluation:
    total: float
    kernels: dict[int, KernelCost]
    legal: bool


class GreedyExtractor:
    name = "greedy"

    def __init__(self, g: EGraph, params: DeviceParams, max_passes: int = 4):
        self.g, self.p, self.max_passes = g, params, max_passes
        self.realize_of: dict[int, int] = {}
        self.variants: list[dict[tuple, ENode]] = []
        for c, nodes in enumerate(g.classes):
            self.variants.append({(n.op, n.arg, n.children): n for n in nodes})
            for n in nodes:
                if n.op == "REALIZE":
                    self.realize_of[n.children[0]] = c
        self.evaluations = 0

    # ------------------------------------------------------------------ step 1
    def semantic_choice(self) -> dict[int, ENode]:
        g = self.g
        cost = [INF] * len(g.classes)
        best: list[ENode | None] = [None] * len(g.classes)
        changed = True
        while changed:
            changed = False
            for c, nodes in enumerate(g.classes):
                for n in nodes:
                    if any(cost[k] == INF for k in n.children):
                        continue
                    if n.op == "REALIZE":
                        v = cost[n.children[0]]
                        # transparent: fused and unfused variants tie, and the tie goes to the
                        # unfused one (below); never a Realize of its own class (a cycle)
                        v = v if n.children[0] != c else INF
                    else:
                        w = OPS[n.op].flops
                        v = w * numel(g.shapes[c]) + 1 + sum(cost[k] for k in n.children)
                    realized = sum(1 for k in n.children if self._is_realize(k))
                    cur = best[c]
                    if v < cost[c] or (v == cost[c] and cur is not None and
                                       realized > sum(1 for k in cur.children if self._is_realize(k))):
                        if v < cost[c]:
                            changed = True
                        cost[c], best[c] = v, n
        missing = [c for c, b in enumerate(best) if b is None]
        if missing:
            raise RuntimeError(f"extraction: e-classes {missing[:8]} have no finite-cost node")
        return dict(enumerate(best))

    def _is_realize(self, c: int) -> bool:
        return any(n.op == "REALIZE" for n in self.g.classes[c])

    # ------------------------------------------------------------------ evaluation
    def _inner_leaf(self, choice: dict[int, ENode], c: int) -> bool:
        return choice[c].op in ("BUF", "CONST")

    def kernel_cost(self, choice: dict[int, ENode], k: int) -> tuple[KernelCost, list[int]]:
        g, p = self.g, self.p
        # body in topological order (consumers first) by iterative DFS post-order, reversed
        order: list[int] = []
        seen: set[int] = set()
        stack: list[tuple[int, bool]] = [(k, False)]
        loads: dict[int, int] = {}      # materialized producer class -> element reads
        inputs: dict[int, int] = {}     # input position -> element reads
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
        flops, nodes, legal, why = 0.0, 0, True, ""
        deps: list[int] = []
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
            if n.op == "CONTIGUOUS" and c != k:
                legal, why = False, "a Contiguous is inlined into a consumer"
            mult = 1
            if n.op in REDUCE_OPS:
                mult = numel(g.shapes[n.children[0]]) // max(1, numel(g.shapes[c]))
                if e > numel(g.shapes[c]):
                    legal, why = False, f"reduction {n.op} recomputed {e / numel(g.shapes[c]):.0f}x per element"
            flops += OPS[n.op].flops * e * max(1, mult)
            for ch in n.children:
                ev[ch] = max(ev.get(ch, 0), e * mult)
        if nodes > p.max_nodes:
            legal, why = False, f"body of {nodes} nodes > {p.max_nodes}"
        isz = g.dtypes[k].itemsize
        nbytes = numel(g.shapes[k]) * isz
        for pos, reads in inputs.items():
            nbytes += min(reads, numel(self._input_shape(pos))) * self._input_itemsize(pos)
        for c, reads in loads.items():
            nbytes += min(reads, numel(g.shapes[c])) * g.dtypes[c].itemsize
        t = kernel_time(p, nbytes, flops)
        return KernelCost(t, int(nbytes), int(flops), nodes, legal, why), deps

    def _input_shape(self, pos: int):
        return self._inputs[pos][0]

    def _input_itemsize(self, pos: int) -> int:
        return self._inputs[pos][1].itemsize

    def evaluate(self, choice: dict[int, ENode]) -> Evaluation:
        self.evaluations += 1
        kernels: dict[int, KernelCost] = {}
        todo = [r for r in self.g.roots if not (choice[r].op == "BUF")]
        while todo:
            k = todo.pop()
            if k in kernels:
                continue
            kc, deps = self.kernel_cost(choice, k)
            kernels[k] = kc
            todo.extend(d for d in deps if d not in kernels)
        total = sum(kc.seconds for kc in kernels.values())
        return Evaluation(total, kernels, all(kc.legal for kc in kernels.values()))

    # ------------------------------------------------------------------ step 2
    def toggle(self, choice: dict[int, ENode], prod: int, inline: bool) -> dict[int, ENode] | None:
        r = self.realize_of.get(prod)
        if r is None:
            return None
        old, new = (r, prod) if inline else (prod, r)
        out = dict(choice)
        changed = False
        for c, n in choice.items():
            if n.op == "REALIZE" or old not in n.children:
                continue
            kids = tuple(new if k == old else k for k in n.children)
            v = self.variants[c].get((n.op, n.arg, kids))
            if v is None:      # saturation may have stopped before every variant was added
                for i, k in enumerate(n.children):
                    if k == old:
                        kk = out[c].children[:i] + (new,) + out[c].children[i + 1:]
                        v2 = self.variants[c].get((n.op, n.arg, kk))
                        if v2 is not None:
                            out[c] = v2
                            changed = True
                continue
            out[c] = v
            changed = True
        return out if changed else None

    def extract(self, inputs: list[tuple]) -> tuple[dict[int, ENode], Evaluation]:
        self._inputs = inputs
        choice = self.semantic_choice()
        cur = self.evaluate(choice)
        if not cur.legal:
            raise RuntimeError("extraction: the unfused starting plan is illegal: "
                               + "; ".join(kc.why for kc in cur.kernels.values() if not kc.legal))
        producers = [c for c in range(len(self.g.classes)) if c in self.realize_of]
        passes = self.max_passes if len(producers) < 400 else 1
        for _ in range(passes):
            improved = False
            for prod in producers:
                for inline in (True, False):
                    cand = self.toggle(choice, prod, inline)
                    if cand is None:
                        continue
                    ev = self.evaluate(cand)
                    if ev.legal and ev.total < cur.total * (1 - 1e-9):
                        choice, cur, improved = cand, ev, True
            if not improved:
                break
        return choice, cur


def extract_plan_choice(g: EGraph, params: DeviceParams, inputs: list[tuple]) -> tuple[dict[int, ENode], Evaluation]:
    return GreedyExtractor(g, params).extract(inputs)


_ = math
