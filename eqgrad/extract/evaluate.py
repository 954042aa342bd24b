"""Whole-plan evaluation under the kernel cost model (shared by every extractor).

A *choice* maps each e-class to one of its e-nodes. Its kernels are the roots plus the inner class
of every chosen ``Realize`` reachable from them; :meth:`PlanEvaluator.evaluate` costs each kernel
(bytes, evaluation-weighted FLOPs, legality -- see cost.py) and sums them.

A kernel's cost depends only on the chosen nodes of the classes it *reads*: its body classes and
the inner classes of the ``Realize`` leaves it stops at. A local-search move changes a few classes,
so :class:`PlanState` keeps one plan's kernels, their dependencies and read sets, and evaluates a
candidate by re-costing only the kernels that read a changed class (plus kernels that become
reachable); the rest are reused. Its results are identical to :meth:`PlanEvaluator.evaluate`
(tests/test_extract_incremental.py): same kernels and costs, the same total (the full evaluation
sums with ``math.fsum``, the state keeps an exact sum: both round the exact total once, in any
order), the same legality and ``why``. Measured on a
6-layer BERT-shaped encoder, the greedy search's 1,350 plan evaluations re-costed 4,224 kernels
instead of 519,647 (57.8 s -> 0.35 s of extraction; docs/extraction.md).
"""
from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from eqgrad.ops import OPS, REDUCE_OPS, numel
from eqgrad.extract.cost import CostModel, KernelCost, after_stream, row_share
from eqgrad.extract.egraph import EGraph, ENode
from eqgrad.graph.caps import ROW_STASH_MAX, rows_kept, strided_loads
from eqgrad.graph.plan import KernelStats, KNode, broadcast_product, lanes_axis

Choice = dict[int, ENode]

# leaves a kernel body stops at: read from a buffer (BUF) or free and never materialized (CONST,
# SIZE: a size as a constant, and PARAM: a runtime scalar argument, costed exactly like a constant)
_SCALARS = ("CONST", "PARAM", "SIZE")
_LEAVES = ("BUF",) + _SCALARS
# a kernel without a reduction writing more than this many times the elements it reads is a
# materialized broadcast (a window tensor, an outer product feeding a sum): charged masked_read
# flops per element written, for the index arithmetic (pad masks, reshape div/mod) each costs.
# Measured: a convolution input gradient's 151 MB product ran at 5 GB/s (1.35 G elements/s) where
# the model had priced its bytes alone, and the greedy extractor chose such plans (docs/extraction.md)
BROADCAST_WRITE = 4        # docs/lowering.md, Constants
OFFSET_PATHS = 8           # distinct SHRINK/PAD paths told apart per class (docs/lowering.md, Constants)
KERNEL_MEMO = 4            # bodies remembered per kernel class by kernel_cost_reads (docs/lowering.md, Constants)


class Evaluation:
    """A plan's predicted cost: the total seconds, the kernels (by the class each computes), whether
    every kernel is legal and, if not, why (the first illegal kernel's reason, in class order).

    A full evaluation also keeps, per kernel, the kernels it reads (with repeats) and the classes its
    cost depends on, so that a PlanState can start from it without re-costing. An incremental one
    (PlanState.evaluate) builds its ``kernels`` dict only when it is read: most candidates are
    rejected on their total, and copying a dict of every kernel for each was an O(plan) step."""

    def __init__(self, total: float, kernels: dict[int, KernelCost] | Callable[[], dict[int, KernelCost]],
                 legal: bool, why: str = "", deps: dict[int, tuple[int, ...]] | None = None,
                 reads: dict[int, set[int]] | None = None, delta: "_Delta | None" = None,
                 n_kernels: int | None = None):
        self.total, self.legal, self.why = total, legal, why
        self.deps, self.reads, self.delta = deps, reads, delta
        # the bytes of the buffers the kernels write (the plan's intermediates and outputs, all held
        # while it runs): what EQGRAD_PEAK_MEMORY bounds (docs/extraction.md, "A bound on memory")
        self.peak = 0
        self._kernels = kernels if isinstance(kernels, dict) else None
        self._build = None if isinstance(kernels, dict) else kernels
        self._n = len(kernels) if isinstance(kernels, dict) else n_kernels

    @property
    def kernels(self) -> dict[int, KernelCost]:
        if self._kernels is None:
            self._kernels, self._build = self._build(), None
        return self._kernels

    @property
    def n_kernels(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Evaluation):
            return NotImplemented
        return (self.total, self.legal, self.why, self.kernels) == (other.total, other.legal, other.why, other.kernels)

    def __repr__(self) -> str:
        return f"Evaluation(total={self.total!r}, n_kernels={self.n_kernels}, legal={self.legal}, why={self.why!r})"


def _why(kernels: dict[int, KernelCost], illegal) -> str:
    return kernels[min(illegal)].why if illegal else ""


def _exact(x: float) -> int:
    """x as an integer number of 2**-1074 (the smallest float step): sums of these are exact, and
    dividing one by 2**1074 rounds it correctly, as ``math.fsum`` does."""
    n, d = x.as_integer_ratio()
    return n * (_ULPS // d)


_ULPS = 1 << 1074


def _exact_total(kernels: dict[int, KernelCost]) -> int | None:
    """The exact sum of the kernels' seconds (None when one is not finite: a user's cost function
    may return inf; such a plan's total is summed with ``math.fsum`` each time)."""
    if not all(math.isfinite(kc.seconds) for kc in kernels.values()):
        return None
    return sum(_exact(kc.seconds) for kc in kernels.values())


# KernelCost.kind by (row-fused, contraction, unlaned, masked): made once, not per kernel costed
_KINDS = {flags: frozenset(k for k, on in zip(("row-fused", "contraction", "unlaned", "masked"), flags) if on)
          for flags in itertools.product((False, True), repeat=4)}


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


def _lane_broadcast(src: tuple, shape: tuple, rg: frozenset | None, axis: int | None = None) -> bool:
    """Does Expand(src -> shape), inside the root contraction of a kernel reducing the axes of
    region ``rg``, broadcast exactly along the axis its register lanes run along -- ``axis`` where
    the root reaches the contraction through reshapes and permutes (graph/plan.py ``lanes_axis``),
    else the contraction's last kept axis --, whose lanes all read one element of the operand (an
    attention output row's lanes, ``softmax(q @ k.T)`` the operand)?"""
    if not rg or len(rg) != 1 or len(src) != len(shape):
        return False
    (axes,) = rg
    if axes == "out":
        return False
    kept = [d for d, b in enumerate(shape) if b > 1 and d not in axes]
    bcast = [d for d, (a, b) in enumerate(zip(src, shape)) if a == 1 and b > 1]
    if axis is not None:
        return axis in kept and bcast == [axis]
    return bool(kept) and bcast == kept[-1:]


def body_classes(choice: "Choice", start: int, root: int | None = None) -> Iterator[int]:
    """The classes of a kernel body below class ``start``, each once: down to its leaves and to the
    classes other kernels compute (a Realize or Contiguous that is not ``root``, the kernel's own)."""
    seen, todo = set(), [start]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        yield x
        n = choice[x]
        if n.op in _LEAVES or (n.op in ("REALIZE", "CONTIGUOUS") and x != root):
            continue
        todo.extend(n.children)


def _reduces_below(choice: "Choice", c: int) -> bool:
    """Is a reduction inside the body below class ``c`` (down to its leaves and realized classes)?"""
    return any(choice[x].op in REDUCE_OPS for x in body_classes(choice, c))


def _unit_reshape(src: tuple, shape: tuple, rg: frozenset | None) -> frozenset | None:
    """The region ``rg`` of Reshape(src -> shape) on its source, where the reshape only adds or
    drops axes of one element (each reduced axis keeps its extent, the output's trailing axes are
    the source's); None where it does more."""
    if not rg or [a for a in src if a != 1] != [b for b in shape if b != 1]:
        return None
    to_src = dict(zip([d for d, b in enumerate(shape) if b != 1], [d for d, a in enumerate(src) if a != 1]))
    out: list = []
    for axes in rg:
        if axes == "out":          # the trailing non-trivial axes (_row_invariant): the same ones
            out.append(axes)
        elif any(d not in to_src for d in axes):
            return None
        else:
            out.append(frozenset(to_src[d] for d in axes))
    return frozenset(out)


# PlanEvaluator._fill's answers, by kernel body structure (a bounded memo: cleared when full)
_FILLS: dict[tuple, tuple[float, float]] = {}
# PlanEvaluator._rows_kept's answers, likewise: [the body, without the row-dots dry run, with it]
_ROWS: dict[tuple, list] = {}
# PlanEvaluator._strided's answers, likewise: the buffer numbers (``_body``'s) read strided
_STRIDED: dict[tuple, frozenset[int]] = {}
_UNASKED = object()


def _memo(table: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``table[key]``, made by ``make()`` the first time (the table cleared when it holds 4096)."""
    hit = table.get(key)
    if hit is None:
        if len(table) >= 4096:
            table.clear()
        hit = table[key] = make()
    return hit


def _body(s: tuple) -> KNode:
    """The kernel body (KNodes) of a structure ``PlanEvaluator._structure`` built: its nodes sources
    first, each (op, arg, the positions of its sources, shape, dtype), or a leaf ("BUF", i, shape,
    dtype) / ("CONST", shape, dtype); the last one the root."""
    out: list[KNode] = []
    for e in s:
        if e[0] == "CONST":
            out.append(KNode("CONST", (), 0, e[1], e[2]))
        elif e[0] == "BUF":
            out.append(KNode("BUF", (), e[1], e[2], e[3]))
        else:
            out.append(KNode(e[0], tuple(out[x] for x in e[2]), e[1], e[3], e[4]))
    return out[-1]


class PlanEvaluator:
    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple]):
        self.g, self.cost, self.inputs = g, cost, inputs
        # price a row-fused kernel as the lowering runs it when it keeps its rows (``_kernel_cost_reads``:
        # attention as one kernel); off, such kernels are priced (and illegal) as before those rules
        self.rows = False
        self.evaluations = 0          # plans evaluated (a full evaluation or an incremental one)
        self.full_evaluations = 0     # of which full ones (every kernel costed)
        self.kernels_costed = 0       # kernel_cost calls, over all evaluations
        # kernel class -> its last costed bodies: (params, read classes, their chosen nodes, result)
        self._memo: dict[int, list[tuple[Any, tuple[int, ...], tuple[Any, ...], tuple]]] = {}
        # looked up once per body node: per class, its element count; per op, its FLOP weight and
        # whether it is elementwise
        self._numel = [numel(s) if s is not None else 0 for s in g.shapes]
        self._flops = {name: d.flops for name, d in OPS.items()}
        self._elementwise = {name for name, d in OPS.items() if d.kind in ("unary", "binary", "ternary")}
        self._library: Any = _UNASKED          # the cost model's library speed, asked at the first fill

    def _fill(self, k: int, order: list[int], nodes_of: dict[int, ENode]) -> tuple[float, float]:
        """The rate share and library rate (``CostModel.fill_parts``) of kernel ``k``'s root contraction, by the register
        block the lanes pass gives the body ``nodes_of``: built as the kernel body the plan would
        hold (the lanes pass reads strides), and kept by the body's structure (buffers numbered in
        the order first read), so a body repeated in other layers, regions or programs is worked
        out once (resnet's training step: 333 stride analyses -> 158)."""
        struct = self._structure(k, order, nodes_of)
        if self._library is _UNASKED:             # the device's answer, once per evaluator
            self._library = self.cost.library_speed()
        key = (struct, self.cost.caps, self.cost.params.contraction, self._library, self.cost.threads)
        return _memo(_FILLS, key, lambda: self.cost.fill_parts(_body(struct)))

    def _structure(self, k: int, order: list[int], nodes_of: dict[int, ENode]) -> tuple:
        """Kernel ``k``'s body as a structure ``_body`` builds KNodes of (buffers numbered in the
        order first read): the key of the lowering's answers about it. Flat -- each node once, its
        sources by position, the root last -- so hashing and comparing it is linear in the body's
        nodes: as nested tuples, a body whose values are shared many times (a post-norm encoder's
        layers inlined into one row-fused kernel) hashed as the tree it unfolds to, minutes for
        one move."""
        g = self.g
        pos: dict[int, int] = {}
        bufs: dict[int, int] = {}
        out: list[tuple] = []
        for c in reversed(order):               # sources first
            n = nodes_of[c]
            if n.op in _LEAVES or ((n.op == "REALIZE" or n.op == "CONTIGUOUS") and c != k):
                e = ("CONST",) if n.op in ("CONST", "SIZE") else ("BUF", bufs.setdefault(c, len(bufs)))
            elif n.op in ("REALIZE", "CONTIGUOUS"):
                pos[c] = pos[n.children[0]]
                continue
            else:
                e = (n.op, n.arg, tuple(pos[ch] for ch in n.children))
            pos[c] = len(out)
            out.append(e + (g.shapes[c], g.dtypes[c]))
        if pos[k] != len(out) - 1:            # (the root through a Realize of its own class)
            out.append(out[pos[k]])
        return tuple(out)

    def _rows_kept(self, k: int, order: list[int], nodes_of: dict[int, ENode], blocked: bool
                   ) -> tuple[bool, bool, bool]:
        """The lowering's ``rows_kept`` for kernel ``k``'s body (graph/caps.py: kept, streamed, blocked), by
        structure."""
        struct = self._structure(k, order, nodes_of)
        hit = _memo(_ROWS, struct, lambda: [body := _body(struct), rows_kept(body, False), None])
        if not blocked:
            return hit[1]
        if hit[2] is None:          # (the same body: the lowering's dry run of it is not done again)
            hit[2] = rows_kept(hit[0], True)
        return hit[2]

    def _strided(self, k: int, order: list[int], nodes_of: dict[int, ENode]) -> list[int]:
        """The leaves (input BUF, Realize or Contiguous classes) of kernel ``k``'s body that the
        lowering reads strided along its innermost output loop (graph/caps.py ``strided_loads``), by
        structure."""
        struct = self._structure(k, order, nodes_of)
        hit = _memo(_STRIDED, struct, lambda: strided_loads(_body(struct)))
        if not hit:
            return []
        # numbered as _structure numbers them: in the order first read (``order`` holds each class once)
        leaves = [c for c in reversed(order) if (nodes_of[c].op in _LEAVES and nodes_of[c].op not in ("CONST", "SIZE"))
                  or (nodes_of[c].op in ("REALIZE", "CONTIGUOUS") and c != k)]
        return [leaves[i] for i in hit if i < len(leaves)]

    @staticmethod
    def _contraction(nodes_of: dict[int, ENode], n: ENode, choice: Choice | None = None,
                     read: set[int] | None = None) -> bool:
        """Is reduction ``n`` a contraction: a sum of a product whose factors are broadcasts
        (an Expand under movement ops only), as a matmul's or a convolution's? With ``choice``,
        also when the product is materialized by another kernel (a Realize of it): hoisted, such a
        sum is as slow as the contraction it belongs to would be, and charging it so keeps greedy
        from fusing the sum into a row-fused consumer first (smaller producers go first) and then
        finding the product's inlining unlaned -- the plan that materialized the whole product
        (a CNN-with-pooling step: 151 MB, 5.5 -> 55 ms)."""
        src = n.children[0]
        look: dict[int, ENode] = nodes_of
        m = nodes_of.get(src)
        if m is not None and m.op == "REALIZE" and choice is not None:
            look = choice                  # the classes it looks at are the cost's dependencies
            src = m.children[0]
        if look is choice and read is not None:
            def op(c: int) -> str | None:
                read.add(c)
                m = choice.get(c)
                return m.op if m is not None else None
        else:
            def op(c: int) -> str | None:
                m = look.get(c)
                return m.op if m is not None else None
        return broadcast_product(src, op, lambda c: look[c].children)

    def kernel_cost(self, choice: Choice, k: int) -> tuple[KernelCost, list[int]]:
        kc, deps, _ = self.kernel_cost_reads(choice, k)
        return kc, deps

    def kernel_cost_reads(self, choice: Choice, k: int) -> tuple[KernelCost, list[int], set[int]]:
        """Kernel k's cost, the kernels it reads (one entry per Realize leaf) and the classes whose
        chosen node the cost depends on (no other entry of ``choice`` is read).

        Remembered per kernel class with the chosen nodes of the classes it read (its last
        KERNEL_MEMO bodies): a search costs a body again when a move is tried, undone and its kernel
        reached again."""
        self.kernels_costed += 1
        p = self.cost.params
        seen = self._memo.get(k)
        if seen is not None:
            get = choice.get
            for i, (params, classes, nodes, out) in enumerate(seen):
                if params is p and all(map(operator.is_, map(get, classes), nodes)):
                    if i:
                        seen.insert(0, seen.pop(i))
                    return out[0], list(out[1]), out[2]
        else:
            seen = self._memo[k] = []
        kc, deps, read = self._kernel_cost_reads(choice, k)
        classes = tuple(read)
        seen.insert(0, (p, classes, tuple(map(choice.get, classes)), (kc, tuple(deps), read)))
        del seen[KERNEL_MEMO:]
        return kc, deps, read

    def _kernel_cost_reads(self, choice: Choice, k: int, rows: bool | None = None) -> tuple[KernelCost, list[int], set[int]]:
        """``kernel_cost_reads`` worked out. ``rows``: price a row-fused kernel as the lowering runs
        it when it keeps its rows (lower/passes.py ``rows_kept``: an operand its root contraction's
        lanes share evaluated once per element, a reduction nested in its passes once): where the
        lowering would not, the kernel is priced again without (as before those rules)."""
        g, p = self.g, self.cost.params
        rows = self.rows if rows is None else rows
        kept: dict[bool, tuple[bool, bool, bool]] = {}   # the lowering's rows_kept answers, asked once

        def rows_kept_here(blocked: bool = False) -> tuple[bool, bool, bool]:
            """(blocked: with the third answer complete, the row-dots dry run, asked only for that)"""
            hit = kept.get(blocked)
            if hit is None:
                hit = kept[blocked] = self._rows_kept(k, order, nodes_of, blocked)
            return hit
        size, weight, elementwise, shapes = self._numel, self._flops, self._elementwise, g.shapes
        # body in topological order (consumers first): iterative DFS post-order, reversed. A class
        # is pushed as c, and again as ~c (< 0) to be emitted once its children are done; the
        # chosen nodes are looked up once, here (the hot loop of extraction)
        order: list[int] = []
        nodes_of: dict[int, ENode] = {}
        seen: set[int] = set()
        stack: list[int] = [k]
        while stack:
            c = stack.pop()
            if c < 0:
                order.append(~c)
                continue
            if c in seen:
                continue
            seen.add(c)
            stack.append(~c)
            n = nodes_of[c] = choice[c]
            op = n.op
            if op in _LEAVES or ((op == "REALIZE" or op == "CONTIGUOUS") and c != k):
                continue
            for ch in n.children:
                if ch not in seen:
                    stack.append(ch)
        order.reverse()
        # the axis of the root contraction the lanes run along (its source's), where the root
        # reaches it through reshapes and permutes
        found = lanes_axis(k, lambda c: nodes_of[c].op if c in nodes_of else None, lambda c: nodes_of[c].arg,
                           lambda c: nodes_of[c].children, lambda c: shapes[c]) if rows else None
        lane_axis = found[1] if found is not None else None
        read = seen                        # the body and its leaves; the Realize leaves' inner classes below
        ev: dict[int, float] = {k: size[k]}
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
        # under_hoist[c]: c is below a row-invariant Expand (rendered in a hoisted loop nest);
        # slow[c]: c is inside a contraction rendered there, without register lanes (unlaned)
        under_hoist: set[int] = set()
        slow: set[int] = set()
        fast: set[int] = set()             # inside a contraction at the root (cost.py: the class)
        blocked: set[int] = set()          # a sum of products the root-dots pass blocks, and its product
        cflops = 0.0
        loads: dict[int, float] = {}       # materialized producer class -> element reads
        inputs: dict[int, float] = {}      # input position -> element reads
        flops, nodes, legal, why = 0.0, 0, True, ""
        hoisted = inner_reduce = any_reduce = masked = row_long = permuted = False
        shared: set[int] = set()           # below an operand the root contraction's lanes share
        deps: list[int] = []
        fused: list[str] = []
        recomputed: list[int] = []
        # offsets[c]: the SHRINK/PAD steps on the paths from the root to c, one tuple per distinct
        # sequence (absent: reached through none). The lowering renders a node once per index it
        # is read at (lower/lowering.py memoizes by node and index), so a reduction reached through
        # two sequences -- RoPE's rotated halves of a projection, t * cos + cat(-t[h:], t[:h]) * sin
        # -- runs its loop once per sequence for each element
        offsets: dict[int, frozenset] = {}
        plain: set[int] = {k}              # reached through a path with no SHRINK or PAD
        row_fusion, size_k = p.row_fusion, size[k]
        for c in order:
            e = ev.get(c, 0)
            n = nodes_of[c]
            op = n.op
            if op == "BUF":
                pos = n.arg[0]
                old = inputs.get(pos, 0)
                inputs[pos] = e if e > old else old         # max(old, e), as written before
                continue
            if op in _SCALARS:
                continue
            if op == "REALIZE" and c != k:
                inner = n.children[0]
                read.add(inner)
                ni = choice[inner]
                if ni.op == "BUF":
                    pos = ni.arg[0]
                    old = inputs.get(pos, 0)
                    inputs[pos] = e if e > old else old
                elif ni.op not in _SCALARS:
                    old = loads.get(inner, 0)
                    loads[inner] = e if e > old else old
                    deps.append(inner)
                continue
            if op == "CONTIGUOUS" and c != k:
                # a Contiguous is always a kernel of its own: a consumer that reaches its class
                # (directly, after a rule unioned it with a class the consumer reads) loads it
                old = loads.get(c, 0)
                loads[c] = e if e > old else old
                deps.append(c)
                continue
            nodes += 1
            fused.append(op)
            if op == "PERMUTE" and n.arg[-1] != len(n.arg) - 1:
                permuted = True          # (one that keeps the last axis last steps along it as its source)
            mult = 1
            reduce = op in REDUCE_OPS
            any_reduce = any_reduce or reduce
            size_c = size[c]
            if reduce:
                inner_reduce = inner_reduce or nested.get(c, True)
                mult = size[n.children[0]] // max(1, size_c)
                if c in under_hoist and mult > ROW_STASH_MAX:
                    row_long = True
                paths = len(offsets.get(c, ())) + (c in plain)
                if paths > 1:        # evaluated at that many indices per element (``offsets``)
                    e *= paths
                if e > size_c:       # (an empty reduction under a Pad is read e > 0 times, masked)
                    legal, why = False, f"reduction {op} recomputed {e / max(1, size_c):.0f}x per element"
                    recomputed.append(c)
            f = weight[op] * e * max(1, mult)
            if c in slow:
                f *= p.unlaned
            elif rows and reduce and c in shared and rows_kept_here()[0]:
                # a row's reduction under the operand the lanes share, computed in its own hoisted
                # loop (the max, the sum) or kept by one (the scores of attention as one kernel), not
                # in the root contraction's loop; the scores are a dot product the loop vectorizer
                # widens along its streamed axis (lower/passes.py row_dots_streamed: ~45 GFLOP/s a
                # thread measured), priced as plain flops -- as unlaned, 158.7 ms was predicted
                # against 15.0 measured at s = 1024 -- or, where the lowering computes them as
                # register blocks over the keys (lower/passes.py RowDots: 64 keys x 4 rows a step),
                # at the contraction rate: b1 h4 s1024 d64 ran 6.4 ms, predicted 9.3 as plain flops
                if op == "RSUM" and self._contraction(nodes_of, n):
                    if rows_kept_here(True)[2]:
                        cflops += f
                    elif not rows_kept_here()[1]:
                        f *= p.unlaned
                        slow.add(c)
            elif c in fast and reduce:
                # a reduction inside a root contraction's loop ((A @ B) @ x as one kernel): the
                # lanes are the root's; it runs in a scalar loop per step of the root's (measured:
                # 1024^2 A @ B inside @ x ran at 1 GFLOP/s, 2.26 s, priced 14 ms at the contraction rate)
                f *= p.unlaned
                slow.add(c)
            elif c in fast or c in blocked:
                cflops += f
            elif reduce and op == "RSUM" and self._contraction(nodes_of, n, *((choice, read) if c in under_hoist else ())):
                if c in under_hoist:
                    f *= p.unlaned
                    slow.add(c)
                elif not nested.get(c, True):
                    cflops += f
                    fast.add(c)
                elif rows and rows_kept_here(True)[2]:
                    # a sum of products the kernel's own reduction reads along its loop, computed
                    # for a block of rows as register blocks before it (lower/passes.py root_dots:
                    # the bounded attention backward's scores, 114-179 GFLOP/s measured; priced as
                    # plain flops, its six kernels were predicted 88.6 ms against 36-45 measured),
                    # its product with it
                    cflops += f
                    blocked.add(n.children[0])
            flops += f
            if op == "PAD" and e > size_k:
                masked = True
                flops += p.masked_read * e
                if c in fast:                 # the lanes it slows are the contraction's
                    cflops += p.masked_read * e
            rg, nest = region.get(c), nested.get(c, True)
            same_rg = rg if rg and op in elementwise else None    # regions pass through same-shape elementwise ops
            shape_c = shapes[c] if rg else None
            offs, via_plain = offsets.get(c), c in plain
            if op == "SHRINK" or op == "PAD":
                step = ((op, n.arg),)
                offs = frozenset([o + step for o in offs or ()] + ([step] if via_plain else []))
                via_plain = False
            for ch in n.children:
                if via_plain:
                    plain.add(ch)
                if offs:
                    had = offsets.get(ch)
                    both = offs if had is None else had | offs
                    offsets[ch] = both if len(both) <= OFFSET_PATHS else frozenset(itertools.islice(both, OFFSET_PATHS))
                ce, cr, cn, via, shares = e * mult, None, nest, False, False
                if rg and op == "EXPAND" and all(_row_invariant(shapes[ch], shape_c, t) for t in rg):
                    ce, cn, hoisted, via = e * size[ch] / max(1, size_c), False, True, True
                elif rows and c in fast and op == "EXPAND" and row_fusion \
                        and _lane_broadcast(shapes[ch], shape_c, rg, lane_axis) and _reduces_below(choice, ch):
                    # the root contraction's lanes share the element: evaluated once per block
                    # (the lowering's row lanes cover the axis: lower/passes.py row_lanes), in the
                    # reduction's region, so the row values below it are hoisted; a reduction
                    # below it must be a row's (hoisted, or kept by a hoisted loop: checked below)
                    ce, cr, shares = e * size[ch] / max(1, size_c), rg, True
                elif rg and op == "RESHAPE":
                    cr = _unit_reshape(shapes[ch], shape_c, rg)      # (None where it does more)
                elif reduce:
                    cn = True
                    if row_fusion and not nest:      # a reduction inside another's loop is not hoisted from
                        cr = frozenset({frozenset(d for d in n.arg if shapes[ch][d] > 1)})
                elif same_rg is not None and shapes[ch] == shape_c:
                    cr = same_rg
                old = ev.get(ch, 0)
                ev[ch] = ce if ce > old else old
                if c in slow:
                    slow.add(ch)
                elif c in fast:
                    fast.add(ch)
                if via or c in under_hoist:
                    under_hoist.add(ch)
                if shares or c in shared:
                    shared.add(ch)
                if not nested.get(ch, False):
                    nested[ch] = cn
                if ch in region:
                    cr = None if cr is None or region[ch] is None else region[ch] | cr
                region[ch] = cr
        if nodes > p.max_nodes:
            legal, why = False, f"body of {nodes} nodes > {p.max_nodes}"
        # row-fused: a reduction below a row-invariant broadcast (computed once per row, reused)
        fused_rows = hoisted and any(nodes_of[c].op in REDUCE_OPS for c in under_hoist if c in nodes_of)
        if rows and (shared or (fused_rows and inner_reduce)) and not rows_kept_here()[0]:
            # priced once per element above: the scores of softmax(q @ k.T) in one attention kernel,
            # which the lowering keeps per row; where it would not (lower/passes.py rows_kept), a
            # reduction nested in a row's passes or below an operand the lanes share is computed in
            # every pass or block of lanes (a logits projection fused with its layer's last matvec
            # and norm ran 10 s, priced 0.7 ms): priced as such
            return self._kernel_cost_reads(choice, k, rows=False)
        if (fused_rows if rows else hoisted) and inner_reduce and (row_long or not rows):
            # a row-fused kernel makes several passes over each row (max, sum, output); a value
            # with a reduction inside them (the scores of softmax(q @ k.T)) is kept in a local array
            # of the row's length by the lowering (lower/passes.py RowStash) and computed once,
            # but not past caps.ROW_STASH_MAX: recomputed in every pass, measured 100x slower
            # than materializing it
            legal, why = False, ("a reduction nested inside a row-fused kernel's passes" +
                                 (f" over rows of more than {ROW_STASH_MAX}" if rows else ""))
        nbytes = size_k * g.dtypes[k].itemsize
        for pos, reads in inputs.items():
            shape, dt = self.inputs[pos]
            nbytes += min(reads, numel(shape)) * dt.itemsize
        distinct = sum(min(reads, numel(self.inputs[pos][0])) for pos, reads in inputs.items()) + \
            sum(min(reads, size[c]) for c, reads in loads.items())
        for c, reads in loads.items():
            nbytes += min(reads, size[c]) * g.dtypes[c].itemsize
        if size_k > BROADCAST_WRITE * max(1, distinct) and not any_reduce:
            # a materialized broadcast: each element written is index arithmetic over few inputs
            flops += p.masked_read * size_k
        fill, library = self._fill(k, order, nodes_of) if fast else (1.0, 0.0)   # a root contraction: by its register block
        passes = 0.0
        if fused_rows:
            # a row-fused kernel's loops over its rows (cost.py, row passes): each reduction hoisted
            # out of the output's loops runs once per row (not one nested in another's loop: a dot
            # product inside attention's rows is that loop's work), and the output once more; a
            # row shorter than ROW_PASS_FULL elements counts as that share of a pass
            reds = [c for c in under_hoist if c in nodes_of and nodes_of[c].op in REDUCE_OPS and not nested.get(c, True)]
            if reds:
                rows = max(size[c] for c in reds)
                passes = sum(size[c] * row_share(size[nodes_of[c].children[0]] / max(1, size[c])) for c in reds) \
                    + rows * row_share(size_k / max(1, rows))
        strided = 0.0
        if permuted and p.strided_bandwidth and not (fast or slow or blocked):
            # reads a cache line apart along the innermost output loop (cost.py, strided reads): only
            # through a permute; a contraction's operands are the lanes' and the pack's business
            for c in self._strided(k, order, nodes_of):
                n = nodes_of[c]
                if n.op == "REALIZE":
                    c = n.children[0]
                    n = choice[c]
                if n.op == "BUF":
                    shape, dt = self.inputs[n.arg[0]]
                    strided += min(inputs.get(n.arg[0], 0), numel(shape)) * dt.itemsize
                elif n.op not in _SCALARS:
                    strided += min(loads.get(c, 0), size[c]) * g.dtypes[c].itemsize
        stats = KernelStats(nbytes, flops, nodes, cflops, fill, library, passes, strided=strided)
        t = self.cost.fn(stats, p) + after_stream(p, nbytes)     # (cost.py: launch after a stream)
        kind = _KINDS[(fused_rows, cflops > 0, bool(slow), masked)]
        return KernelCost(t, int(nbytes), int(flops), nodes, legal, why, tuple(reversed(fused)), kind, stats,
                          tuple(recomputed)), deps, read

    def forget(self) -> None:
        """Drop the costed bodies (after a change of how kernels are priced: ``rows``)."""
        self._memo.clear()

    def evaluate(self, choice: Choice) -> Evaluation:
        """The reference: every kernel reachable from the roots, costed from scratch."""
        self.evaluations += 1
        self.full_evaluations += 1
        kernels: dict[int, KernelCost] = {}
        deps_of: dict[int, tuple[int, ...]] = {}
        reads_of: dict[int, set[int]] = {}
        todo = [r for r in self.g.roots if choice[r].op != "BUF"]
        while todo:
            k = todo.pop()
            if k in kernels:
                continue
            kc, deps, reads = self.kernel_cost_reads(choice, k)
            kernels[k], deps_of[k], reads_of[k] = kc, tuple(deps), reads
            todo.extend(d for d in deps if d not in kernels)
        illegal = [k for k, kc in kernels.items() if not kc.legal]
        res = Evaluation(math.fsum(kc.seconds for kc in kernels.values()), kernels, not illegal,
                         _why(kernels, illegal), deps_of, reads_of)
        res.peak = sum(map(self.out_bytes, kernels))
        return res

    def out_bytes(self, k: int) -> int:
        """The bytes of the buffer kernel ``k`` (the class it computes) writes."""
        return self._numel[k] * self.g.dtypes[k].itemsize

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
        """No cycle among the chosen nodes reachable from the roots."""
        return _acyclic_from(choice, self.g.roots)


def globally_acyclic(choice: Choice) -> bool:
    """No cycle among the chosen nodes of *any* classes, reachable from the roots or not (stronger
    than :meth:`PlanEvaluator.is_acyclic`): what PlanState's reference counting relies on."""
    return _acyclic_from(choice, choice)


def _acyclic_from(choice: Choice, starts) -> bool:
    """Iterative three-colour DFS over the chosen nodes from each of ``starts``."""
    state: dict[int, int] = {}
    for r in starts:
        if r in state:
            continue
        state[r] = 1
        stack = [(r, iter(choice[r].children))]
        while stack:
            c, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[c] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return False
            elif nxt not in state and nxt in choice:
                state[nxt] = 1
                stack.append((nxt, iter(choice[nxt].children)))
    return True


@dataclass
class _Delta:
    """What a candidate changes in the plan of the PlanState that evaluated it (for accept)."""
    version: int
    changed: dict[int, ENode]                          # class -> its new chosen node
    removed: set[int]                                  # kernels no longer reachable
    fresh: dict[int, tuple[KernelCost, tuple[int, ...], set[int]]]   # kernels re-costed or new, still reachable
    refs: dict[int, int]                               # change of each kernel's reference count
    exact: int | None                                  # the total in 2**-1074 s (see _exact); None: not finite
    illegal: set[int]


class PlanState:
    """One plan, evaluated, kept so that a candidate a few classes away is evaluated incrementally.

    Per kernel: its cost, the kernels it reads (``deps``) and the classes its cost depends on
    (``reads``); per class, the kernels that read it (``readers``); per kernel, how many references
    reach it (a root, or a Realize leaf of a reachable kernel). A candidate re-costs the kernels that
    read a changed class, then follows the changed references: a kernel whose count drops to zero
    drops out (and releases its own), one that gains its first is costed. Counting references is
    exact because the chosen nodes form no cycle (``acyclic``); the extractors evaluate a move that
    might close one with the full :meth:`PlanEvaluator.evaluate` instead. The total is kept as an
    exact sum, so it rounds as the full evaluation's ``math.fsum`` does, whatever the order.

    The state's ``choice`` is its own copy; ``evaluate`` writes a candidate's nodes into it for the
    duration of the call and restores them, so a state is not shared between threads.
    """

    def __init__(self, ev: PlanEvaluator, choice: Choice, evaluation: Evaluation | None = None):
        if evaluation is None or evaluation.deps is None:
            evaluation = ev.evaluate(choice)
        self.ev = ev
        self.choice: Choice = dict(choice)
        self.evaluation = evaluation
        self.acyclic = globally_acyclic(self.choice)
        self.kernels = evaluation.kernels
        self.deps = dict(evaluation.deps)
        self.reads = dict(evaluation.reads)
        self.readers: dict[int, set[int]] = {}
        for k, rs in self.reads.items():
            for c in rs:
                self.readers.setdefault(c, set()).add(k)
        self.root_count = Counter(ev.g.roots)
        self.refs: Counter = Counter()
        for r, m in self.root_count.items():
            if self.choice[r].op != "BUF":
                self.refs[r] += m
        for ds in self.deps.values():
            self.refs.update(ds)
        self.illegal = {k for k, kc in self.kernels.items() if not kc.legal}
        self.exact = _exact_total(self.kernels)
        self.peak = evaluation.peak
        self.version = 0

    def reachable(self, c: int) -> bool:
        """Is class c reachable from the roots in this plan (as PlanEvaluator.reachable)?"""
        return c in self.root_count or bool(self.readers.get(c))

    def evaluate(self, changes: dict[int, ENode]) -> Evaluation:
        """The evaluation of this plan with ``changes`` applied (the state itself is unchanged)."""
        choice = self.choice
        changed = {c: n for c, n in changes.items() if choice.get(c) is not n}
        old = {c: choice.get(c) for c in changed}
        choice.update(changed)
        try:
            return self._evaluate(changed, old)
        finally:
            for c, n in old.items():
                if n is None:
                    del choice[c]
                else:
                    choice[c] = n

    def _evaluate(self, changed: dict[int, ENode], old: dict[int, ENode | None]) -> Evaluation:
        ev, choice, base = self.ev, self.choice, self.kernels
        ev.evaluations += 1
        dirty: set[int] = set()
        for c in changed:
            dirty.update(self.readers.get(c, ()))
        fresh: dict[int, tuple[KernelCost, tuple[int, ...], set[int]]] = {}
        refs: dict[int, int] = {}
        for k in dirty:
            kc, deps, reads = ev.kernel_cost_reads(choice, k)
            fresh[k] = (kc, tuple(deps), reads)
            for d in self.deps[k]:
                refs[d] = refs.get(d, 0) - 1
            for d in deps:
                refs[d] = refs.get(d, 0) + 1
        for c in changed:
            m = self.root_count.get(c)
            if m:
                was, now = old[c] is not None and old[c].op != "BUF", choice[c].op != "BUF"
                if was != now:
                    refs[c] = refs.get(c, 0) + (m if now else -m)
        # follow the changed reference counts to a fixpoint (unique: the kernel graph is a DAG)
        removed: set[int] = set()
        added: set[int] = set()
        work = list(refs)
        while work:
            k = work.pop()
            alive = (k in base and k not in removed) or k in added
            count = self.refs.get(k, 0) + refs.get(k, 0)
            if count > 0 and not alive:
                if k in base:
                    removed.discard(k)
                else:
                    added.add(k)
                if k in base and k not in dirty:
                    deps = self.deps[k]
                else:
                    if k not in fresh:
                        kc, dl, reads = ev.kernel_cost_reads(choice, k)
                        fresh[k] = (kc, tuple(dl), reads)
                    deps = fresh[k][1]
                for d in deps:
                    refs[d] = refs.get(d, 0) + 1
                work.extend(deps)
            elif count <= 0 and alive:
                if k in base:
                    removed.add(k)
                else:
                    added.discard(k)
                deps = self.deps[k] if k in base and k not in dirty else fresh[k][1]
                for d in deps:
                    refs[d] = refs.get(d, 0) - 1
                work.extend(deps)
        fresh = {k: e for k, e in fresh.items() if k not in removed and (k in base or k in added)}
        illegal = self.illegal - removed
        for k, (kc, _, _) in fresh.items():
            if kc.legal:
                illegal.discard(k)
            else:
                illegal.add(k)

        def kernels() -> dict[int, KernelCost]:
            out = dict(base)
            for k in removed:
                del out[k]
            out.update((k, e[0]) for k, e in fresh.items())
            return out
        why = ""
        if illegal:
            k = min(illegal)
            why = (fresh[k][0] if k in fresh else base[k]).why
        exact = None
        if self.exact is not None and all(math.isfinite(e[0].seconds) for e in fresh.values()):
            exact = self.exact
            for k in removed:
                exact -= _exact(base[k].seconds)
            for k, (kc, _, _) in fresh.items():
                exact += _exact(kc.seconds) - (_exact(base[k].seconds) if k in base else 0)
        result = Evaluation(0.0, kernels, not illegal, why, n_kernels=len(base) - len(removed) + len(added),
                            delta=_Delta(self.version, changed, removed, fresh, refs, exact, illegal))
        result.total = exact / _ULPS if exact is not None else math.fsum(kc.seconds for kc in result.kernels.values())
        out_bytes = ev.out_bytes
        result.peak = self.peak - sum(map(out_bytes, removed)) + sum(map(out_bytes, added))
        return result

    def accept(self, evaluation: Evaluation) -> None:
        """Make the candidate ``evaluation`` (from this state's :meth:`evaluate`) the state's plan."""
        d = evaluation.delta
        if d is None or d.version != self.version:
            raise ValueError("PlanState.accept: expected an evaluation made by this state's evaluate() since "
                             f"its last accept (version {self.version}), got {'a full evaluation' if d is None else f'version {d.version}'}")
        self.choice.update(d.changed)
        for k in d.removed:
            self._unread(k)
            del self.deps[k]
        for k, (kc, deps, reads) in d.fresh.items():
            if k in self.reads:
                self._unread(k)
            self.deps[k], self.reads[k] = deps, reads
            for c in reads:
                self.readers.setdefault(c, set()).add(k)
        for k, v in d.refs.items():
            if v:
                self.refs[k] += v
                if not self.refs[k]:
                    del self.refs[k]
        self.kernels, self.illegal, self.exact, self.peak = evaluation.kernels, d.illegal, d.exact, evaluation.peak
        if self.exact is None:
            self.exact = _exact_total(self.kernels)
        self.evaluation = evaluation
        self.version += 1

    def _unread(self, k: int) -> None:
        for c in self.reads.pop(k):
            rs = self.readers[c]
            rs.discard(k)
            if not rs:
                del self.readers[c]
