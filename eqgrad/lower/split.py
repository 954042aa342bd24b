"""Splitting a large reduction into parallel partial reductions: the rewrite that the
``split reductions`` pass (``passes.SplitReductions``, where its condition and measurement live)
decides, performed for the device that allocates the scratch buffer (devices/cpu.py).

A kernel that reduces a large tensor to one value (``x.sum()``, ``x.max()``, a loss's mean) has
no parallel output loop, so the thread split cannot use more than one core. It becomes two
kernels:

    partial[p] = reduce(src reshaped so its leading axis is (P, s0 / P))   over all but p
    out        = epilogue(reduce(partial))                                   the original kernel

The partial kernel's P output elements are independent, so threads split them. The leading
axis is split (rather than the flattened tensor) so that the index arithmetic stays free of
division. Float sums are reassociated, as vectorized reductions already are (docs/semantics.md).
A reduction to more than one value whose output loop is too short to share (a convolution's
weight gradient, the pass's docstring) is split the same way along its first reduced axis: its
partials are P copies of its output, P outermost, and the final kernel sums them.
"""
from __future__ import annotations

from eqgrad import config
from eqgrad.graph.plan import Kernel, KNode
from eqgrad.graph.sizes import ELEMENTWISE
from eqgrad.lower.passes import LowerOptions, describe_steps, run_passes
from eqgrad.ops import numel


def split_reduction(k: Kernel, new_buffer: int, options: LowerOptions) -> tuple[Kernel, Kernel] | None:
    """(partial kernel writing buffer ``new_buffer``, the rewritten kernel), or None when the
    ``split reductions`` pass does not apply under ``options`` (threads, the device's threshold)."""
    steps = run_passes(k, options, stage="plan")
    if config.DEBUG.value >= 5:
        print(describe_steps(k, steps))
    decision = steps[-1].schedule.split if steps else None
    if decision is None:
        return None
    red, lead, p = decision.reduce, decision.axis, decision.parts
    src = red.src[0]
    shape = src.shape
    split_shape = shape[:lead] + (p, shape[lead] // p) + shape[lead + 1:]
    reshaped = _reshaped(src, split_shape)
    # the reduced axes, the split one's second half in place of it; the first half (P) is kept
    axes = tuple(sorted({d + (d > lead) for d in red.arg} - {lead} | {lead + 1}))
    kept = tuple(1 if d in axes else n for d, n in enumerate(split_shape))
    partial = KNode(red.op, (reshaped,), axes, kept, red.dtype)
    # P outermost: the loop the threads share (a full reduction's partials are P values either way)
    order = (lead,) + tuple(d for d in range(len(kept)) if d != lead)
    part_shape = tuple(kept[d] for d in order)
    if order != tuple(range(len(kept))):
        partial = KNode("PERMUTE", (partial,), order, part_shape, red.dtype) if numel(red.shape) > 1 else \
            KNode("RESHAPE", (partial,), part_shape, part_shape, red.dtype)
    k1 = Kernel(f"{k.name}a", new_buffer, partial, partial.buffers(), k.predicted, k.nbytes, k.flops, k.kind,
                k.stats)
    final = KNode(red.op, (KNode("BUF", (), new_buffer, part_shape, red.dtype),), (0,),
                  (1,) + part_shape[1:], red.dtype)
    final = KNode("RESHAPE", (final,), red.shape, red.shape, red.dtype)
    ast = k.ast.replaced({id(red): final})
    out = numel(red.shape)
    k2 = Kernel(k.name, k.out, ast, ast.buffers(), 5e-6, 4 * p * out, p * out, k.kind, k.stats)
    return k1, k2


def _reshaped(n: KNode, shape: tuple[int, ...], memo: dict[int, KNode] | None = None) -> KNode:
    """``n`` reshaped to ``shape``, the reshape pushed below the elementwise ops at its top (their
    operands have ``n``'s shape): the partials of a contraction stay a sum of a product of
    broadcasts, which the lanes pass and the classifier (lower/classify.py) recognize as one. A
    node shared below stays shared (``memo``)."""
    memo = {} if memo is None else memo
    hit = memo.get(id(n))
    if hit is None:
        hit = memo[id(n)] = KNode(n.op, tuple(_reshaped(x, shape, memo) for x in n.src), n.arg, shape, n.dtype) \
            if n.op in ELEMENTWISE else KNode("RESHAPE", (n,), shape, shape, n.dtype)
    return hit
