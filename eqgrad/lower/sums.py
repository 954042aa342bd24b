"""Blocked float sums: how a long sum is cut into levels, and the error bound that gives.

The lowering's "blocked sums" pass (``passes.BlockedSums``) marks every float sum of more than
``SUM_BLOCK`` values; the emitter (``lowering.Lowerer._reduce_axes``) loops over the pieces that
:func:`sum_pieces` gives, each level with its own accumulator. :func:`sum_error_terms` is the
bound docs/semantics.md ("Float sums") states and :func:`sum_depth` reads the same quantity off
emitted loop IR, so a test can check that the kernels keep the promise.
"""
from __future__ import annotations

import math

from eqgrad.graph.loopir import LoopKernel

SUM_BLOCK = 1024              # values per innermost block (and most iterations of the outermost level; docs/lowering.md, Constants)
SUM_RADIX = 32                # values per accumulator of the levels between (docs/lowering.md, Constants)


def sum_pieces(e: int, block: int, radix: int, top: int) -> list[tuple[int, tuple[int, ...]]]:
    """Split ``e`` iterations into pieces of nested loops for a blocked sum: [(offset, extents
    outermost first)], biggest piece first. The extents are the digits of ``e`` in the mixed radix
    (innermost first) ``block``, ``radix``, ``radix``, ..., with as few ``radix`` levels as keep the
    outermost digit below ``top`` (so that the outermost loop is long enough to share between
    threads or work-items). Loops of one iteration are left out.

    >>> sum_pieces(1_000_000, 1024, 32, 1024)
    [(0, (976, 1024)), (999424, (576,))]
    """
    q, mids = e // block, 0
    while q // radix ** mids >= top:
        mids += 1
    radices = [block] + [radix] * mids + [0]        # 0: the outermost digit is unbounded (< top)
    digits, rest = [], e
    for rad in radices:
        digits.append(rest % rad if rad else rest)
        rest = rest // rad if rad else 0
    pieces, offset = [], 0
    for p in range(len(digits) - 1, -1, -1):       # most significant digit first
        if digits[p]:
            ext = (digits[p],) + tuple(radices[:p][::-1])
            pieces.append((offset, tuple(x for x in ext if x > 1)))
            offset += digits[p] * math.prod(radices[:p])
    return pieces


def sum_error_terms(n: int, block: int = SUM_BLOCK, radix: int = SUM_RADIX, top: int = SUM_BLOCK) -> int:
    """The largest number of additions any one element of a blocked float sum of ``n`` elements
    (one reduced axis, or axes that sum at most ``block`` values inside it) goes through:
    the first-order error bound is ``sum_error_terms(n) * 2**-24 * sum(|x_i|)`` (docs/semantics.md)."""
    if n <= block:
        return max(0, n - 1)
    pieces = sum_pieces(n, block, radix, top)
    return max(sum(x - 1 for x in ext) for _, ext in pieces) + len(pieces) - 1


def sum_depth(k: LoopKernel) -> int:
    """The most rounded additions any one summed value goes through in ``k``'s float sum
    accumulators (the first-order error bound of a float sum is ``sum_depth * 2**-24 * sum|x_i|``,
    docs/semantics.md "Sums"). A value added into an accumulator goes through every later addition
    into it, then through the additions that follow where that accumulator is folded (ACCREAD)
    into the next one. Read from the loop IR, so it checks what the lowering emitted. Conservative:
    a value added inside a loop counts every addition of that loop and after it."""
    open_at: list[int] = []                  # open RANGEs: instruction ids
    ext: dict[int, int] = {}
    at: dict[int, int] = {}                  # float sum accumulator -> loops open at its definition
    sites: dict[int, list[list]] = {}        # acc -> [[executions, group, source acc or None]]
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            open_at.append(i)
            ext[i] = x.arg
        elif x.op == "ENDRANGE":
            open_at.pop()
        elif x.op == "DEFACC" and getattr(x.dtype, "is_float", False):
            at[i], sites[i] = len(open_at), []
        elif x.op == "ACCUM" and x.arg == "ADD" and x.src[0] in at:
            a, v = x.src
            inner = open_at[at[a]:]
            child = k.insts[v].src[0] if k.insts[v].op == "ACCREAD" and k.insts[v].src[0] in at else None
            sites[a].append([math.prod(ext[r] for r in inner), inner[0] if inner else ("once", i), child])
    remaining: dict[tuple[int, int], int] = {}
    fold: dict[int, tuple[int, int]] = {}     # child acc -> (parent acc, site)
    for a, ss in sites.items():
        for n, (_, group, child) in enumerate(ss):
            first = next(m for m, t in enumerate(ss) if t[1] == group)
            remaining[(a, n)] = sum(t[0] for t in ss[first:]) - 1
            if child is not None:
                fold[child] = (a, n)

    def up(a: int) -> int:                   # roundings after a's value leaves it
        if a not in fold:
            return 0
        p, n = fold[a]
        return remaining[(p, n)] + up(p)
    return max((remaining[(a, n)] + up(a) for a, ss in sites.items() for n, t in enumerate(ss) if t[2] is None),
               default=0)
