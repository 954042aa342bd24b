"""Whole-plan evaluation under the kernel cost model (shared by every extractor).

A *choice* maps each e-class to one of its e-nodes. Its kernels are the roots plus the inner class
of every chosen ``Realize`` reachable from them; :meth:`PlanEvaluator.evaluate` costs each kernel
(bytes, evaluation-weighted FLOPs, legality -- see cost.py) and sums them.
"""
from __future__ import annotations

from dataclasses import dataclass

from eqgrad.ops import OPS, REDUCE_OPS, numel
from eqgrad.extract.cost import CostModel, KernelCost
from eqgrad.extract.egraph import EGraph, ENode

Choice = dict[int, ENode]


@dataclass
class Evaluation:
    total: float
    kernels: dict[int, KernelCost]
    legal: bool

    @property
    def n_kernels(self) -> int:
        return len(self.kernels)


def _row_invariant(src: tuple, shape: tuple, rg: "str | frozenset") -> bool:
    """Does Expand(src -> shape) in region ``rg`` broadcast exactly along the trailing non-trivial
    output axes ("out") or exactly along the region's reduced axes?"""
    if len(src) != len(shape):
        return False
    bcast = [d for d, (a, b) in enumerate(zip(src, shape)) if a == 1 and b > 1]
    if not bcast:
        return False
    if rg == "out":      # a proper suffix: the lowering hoists into the loop of an outer axis
        big = [d for d, b in enumerate(shape) if b > 1]
        return len(bcast) < len(big) and bcast == big[len(big) - len(bcast):]
    return frozenset(bcast) == rg


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
        # region[c]: c is evaluated at its kernel's output index ("out") or at the source index of
        # a reduction over the given axes (a frozenset), reached through same-shape elementwise
        # ops only; None otherwise. An Expand in a region that broadcasts exactly along the trailing
        # output axes ("out") or exactly along the reduced axes (a reduction) is row-invariant: the
        # lowering hoists the reductions under it out of those loops (Lowerer.hoist), so its
        # source is evaluated once per distinct index, not once per broadcast element.
        # A class reached in several regions (x - mean in layernorm's output and inside its
        # variance) keeps them all; a class also reached outside any region gets None.
        region: dict[int, frozenset | None] = {k: frozenset({"out"}) if p.row_fusion else None}
        nested: dict[int, bool] = {k: False}     # evaluated inside a reduction loop (after hoisting)
        loads: dict[int, float] = {}       # materialized producer class -> element reads
        inputs: dict[int, float] = {}      # input position -> element reads
        flops, nodes, legal, why = 0.0, 0, True, ""
        hoisted = inner_reduce = False
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
                inner_reduce = inner_reduce or nested.get(c, True)
                mult = numel(g.shapes[n.children[0]]) // max(1, numel(g.shapes[c]))
                if e > numel(g.shapes[c]):       # (an empty reduction under a Pad is read e > 0 times, masked)
                    legal, why = False, f"reduction {n.op} recomputed {e / max(1, numel(g.shapes[c])):.0f}x per element"
            flops += OPS[n.op].flops * e * max(1, mult)
            if n.op == "PAD" and e > numel(g.shapes[k]):
                flops += p.masked_read * e
            rg, nest = region.get(c), nested.get(c, True)
            for ch in n.children:
                ce, cr, cn = e * mult, None, nest
                if rg and n.op == "EXPAND" and all(_row_invariant(g.shapes[ch], g.shapes[c], t) for t in rg):
                    ce, cn, hoisted = e * numel(g.shapes[ch]) / max(1, numel(g.shapes[c])), False, True
                elif n.op in REDUCE_OPS:
                    cn = True
                    if p.row_fusion and not nest:      # a reduction inside another's loop is not hoisted from
                        cr = frozenset({frozenset(d for d in n.arg if g.shapes[ch][d] > 1)})
                elif rg and OPS[n.op].kind in ("unary", "binary", "ternary") and g.shapes[ch] == g.shapes[c]:
                    cr = rg
                ev[ch] = max(ev.get(ch, 0), ce)
                nested[ch] = nested.get(ch, False) or cn
                if ch in region:
                    cr = None if cr is None or region[ch] is None else region[ch] | cr
                region[ch] = cr
        if nodes > p.max_nodes:
            legal, why = False, f"body of {nodes} nodes > {p.max_nodes}"
        if hoisted and inner_reduce:
            # a row-fused kernel makes several passes over each row (max, sum, output) and keeps
            # no register lanes: a contraction inside them (softmax(q @ k)) would be recomputed
            # in every pass without lanes (measured 100x slower than materializing it)
            legal, why = False, "a reduction nested inside a row-fused kernel's passes"
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
