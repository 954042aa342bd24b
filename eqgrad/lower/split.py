"""Splitting a large full reduction into parallel partial reductions (a CPU kernel pass).

A kernel that reduces a large tensor to one value (``x.sum()``, ``x.max()``, a loss's mean) has
no parallel output loop, so the thread split (devices/cpu.py) cannot use more than one core. This
pass rewrites it as two kernels:

    partial[p] = reduce(src reshaped so its leading axis is (P, s0 / P))   over all but p
    out        = epilogue(reduce(partial))                                   the original kernel

The partial kernel's P output elements are independent, so threads split them. The leading
axis is split (rather than the flattened tensor) so that the index arithmetic stays free of
division. Float sums are reassociated, as vectorized reductions already are (docs/semantics.md).
"""
from __future__ import annotations

from eqgrad.graph.plan import Kernel, KNode
from eqgrad.ops import numel

SPLIT_MIN = 1 << 20          # elements: smaller reductions are not worth a second kernel
SPLIT_PARTS = 64             # most partial results (each thread gets several: uneven cores balance)


def _parts(n: int) -> int:
    """The largest divisor of ``n`` in [8, SPLIT_PARTS], or 0."""
    return next((p for p in range(min(SPLIT_PARTS, n // 2), 7, -1) if n % p == 0), 0)


def split_reduction(k: Kernel, new_buffer: int) -> tuple[Kernel, Kernel] | None:
    """(partial kernel writing buffer ``new_buffer``, the rewritten kernel) or None."""
    if numel(k.ast.shape) != 1:
        return None
    cands = [n for n in k.ast.walk() if n.op in ("RSUM", "RMAX") and numel(n.src[0].shape) >= SPLIT_MIN]
    if len(cands) != 1:
        return None
    red = cands[0]
    if any(n.op in ("RSUM", "RMAX") for n in red.src[0].walk()):
        return None                       # a nested reduction: leave the structure alone
    src = red.src[0]
    shape = src.shape
    lead = next((d for d, s in enumerate(shape) if s > 1), None)
    if lead is None:
        return None
    p = _parts(shape[lead])
    if not p:
        return None
    split_shape = shape[:lead] + (p, shape[lead] // p) + shape[lead + 1:]
    reshaped = KNode("RESHAPE", (src,), split_shape, split_shape, src.dtype)
    axes = tuple(d for d in range(len(split_shape)) if d != lead)
    part_shape = tuple(p if d == lead else 1 for d in range(len(split_shape)))
    partial = KNode(red.op, (reshaped,), axes, part_shape, red.dtype)
    k1 = Kernel(f"{k.name}a", new_buffer, partial, partial.buffers(), k.predicted, k.nbytes, k.flops)
    final = KNode(red.op, (KNode("BUF", (), new_buffer, part_shape, red.dtype),), (lead,),
                  (1,) * len(split_shape), red.dtype)
    final = KNode("RESHAPE", (final,), red.shape, red.shape, red.dtype)
    memo: dict[int, KNode] = {id(red): final}
    for n in k.ast.walk():
        if id(n) not in memo:
            srcs = tuple(memo[id(s)] for s in n.src)
            memo[id(n)] = n if srcs == n.src else KNode(n.op, srcs, n.arg, n.shape, n.dtype)
    ast = memo[id(k.ast)]
    k2 = Kernel(k.name, k.out, ast, ast.buffers(), 5e-6, 4 * p, p)
    return k1, k2
