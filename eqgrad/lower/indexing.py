"""The index function of a kernel body: how a movement op maps an output index to its source's.

Shared by the emitter (``lowering.Lowerer``, which renders loads at these indices) and the passes'
dry runs (``passes``: which reductions can be hoisted, which loads stream along an axis), so that
a decision made before emission sees exactly the indices the emission will use.
"""
from __future__ import annotations

from typing import Callable

from eqgrad.graph.caps import ROW_STASH_MAX
from eqgrad.graph.plan import GROUP, KNode
from eqgrad.lower import symbolic
from eqgrad.lower.symbolic import Lin, substitute_free

MOVES = ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK", "FLIP")       # PAD is a move with a mask: apart
REDUCES = ("RSUM", "RMAX")

Index = tuple[Lin, ...]
Sources = Callable[[KNode, Index, str], list[tuple[KNode, Index]]]


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous strides, 0 for size-1 axes (they are never iterated)."""
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc if s != 1 else 0)
        acc *= s
    return tuple(reversed(st))


def full_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous strides, size-1 axes included (a reshape's flat position)."""
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def flat_index(idx: Index, shape: tuple[int, ...]) -> Lin:
    """The contiguous element number of ``idx`` in a buffer of ``shape``."""
    flat = Lin.num(0)
    for i, st in zip(idx, strides_of(shape)):
        flat = flat + i * st
    return flat


# move_index by what it depends on (op, attribute, the two shapes, the index): the kernels of a
# program share their movement ops and loop variables (r0, r1, ... in every kernel), so about half of
# the calls of a lowering repeat an earlier one (an MLP/ResNet/BERT/decoder corpus: 11,500 calls a
# pass, 5,600 distinct), and a reshape's index costs ~40 us of Lin arithmetic. Bounded by clearing.
_MOVES_MEMO: dict = {}
_MOVES_MEMO_MAX = 65_536                    # docs/lowering.md, Constants
symbolic.on_release(_MOVES_MEMO.clear)       # its keys hold interned expressions


def move_index(n: KNode, idx: Index) -> Index:
    """The index of ``n``'s source read at ``n``'s index ``idx`` (``n`` a movement op but PAD)."""
    if symbolic._tracing[0]:            # its keys are shapes: a traced size would match a plain one
        return _move_index(n, idx)
    key = (n.op, n.arg, n.shape, n.src[0].shape, idx)
    try:
        hit = _MOVES_MEMO.get(key)
    except TypeError:                   # a shape or attribute given as a list: not kept
        return _move_index(n, idx)
    if hit is None:
        hit = _move_index(n, idx)
        if len(_MOVES_MEMO) >= _MOVES_MEMO_MAX:
            _MOVES_MEMO.clear()
        _MOVES_MEMO[key] = hit
    return hit


def _move_index(n: KNode, idx: Index) -> Index:
    src = n.src[0]
    if 0 in src.shape:      # nothing is ever read from an empty tensor
        return tuple(Lin.num(0) for _ in src.shape)
    if n.op == "RESHAPE":
        flat = Lin.num(0)
        for i, st in zip(idx, full_strides(n.shape)):
            flat = flat + i * st
        out = []
        for s, st in zip(src.shape, full_strides(src.shape)):
            out.append(Lin.num(0) if s == 1 else (flat // st) % s)
        return tuple(out)
    if n.op == "PERMUTE":
        perm: list[Lin] = [Lin.num(0)] * len(idx)
        for i, p in enumerate(n.arg):
            perm[p] = idx[i]
        return tuple(perm)
    if n.op == "EXPAND":
        return tuple(Lin.num(0) if s == 1 else i for i, s in zip(idx, src.shape))
    if n.op == "SHRINK":
        return tuple(i + b for i, b in zip(idx, n.arg[0]))
    if n.op == "FLIP":
        return tuple(Lin.num(s - 1) - i if d in n.arg else i for d, (i, s) in enumerate(zip(idx, n.shape)))
    raise NotImplementedError(f"move_index: expected one of {MOVES}, got {n.op}")


def dry_sources(n: KNode, idx: Index, tag: str,
                move: Callable[[KNode, Index], Index] = move_index) -> list[tuple[KNode, Index]]:
    """The sources of ``n`` with the index each is read at, as the emitter maps them: a reduction's
    reduced axes become fresh variables named ``{tag}{id}_{axis}``. For dry runs of the index
    function (hoisting, lanes)."""
    if n.op in REDUCES:
        src = n.src[0]
        return [(src, tuple(Lin.var(f"{tag}{id(n)}_{d}", src.shape[d]) if d in n.arg else i
                            for d, i in enumerate(idx)))]
    if n.op == "PAD":
        return [(n.src[0], tuple(i - b for i, b in zip(idx, n.arg[0])))]
    if n.op in MOVES:
        return [(n.src[0], move(n, idx))]
    return [(x, idx) for x in n.src]


def reduce_map(root: KNode) -> dict[int, bool]:
    """id(node) -> whether a reduction is at or below it."""
    has: dict[int, bool] = {}
    for n in root.walk():
        has[id(n)] = n.op in REDUCES or any(has[id(x)] for x in n.src)
    return has


def row_output(r: KNode) -> bool:
    """Whether a GROUP's root ``r`` is a row statistic written by the row-fused kernel that computes
    it (lower/merge.py ``absorb_rows``): a reduction broadcast along the kernel's last axis, hoisted
    at the kernel's rows like the kernel's own reads of it -- not a reduction of the kernel's own --
    and stored once a row in its own shape (lowering.py)."""
    return r.op == "EXPAND" and r.src[0].op in REDUCES


def roots_of(root: KNode) -> frozenset[int]:
    """The ids of a kernel body's roots: ``root``, or a GROUP and each of its roots (graph/plan.py)."""
    if root.op == GROUP:
        return frozenset((id(root), *(id(r) for r in root.src)))
    return frozenset((id(root),))


def hoistable(root: KNode, idx: Index, has_reduce: dict[int, bool],
              sources: Sources = dry_sources) -> list[tuple[KNode, Index]]:
    """The reductions below ``root`` (not ``root`` itself) whose index depends only on the loops
    open so far, with that index, each after the reductions it uses (the variance after the mean).
    ``idx`` names open output loops by variables that do not start with ``_`` and the output axes
    still to open by variables that do; reduced axes get ``_r`` variables. Reads under a PAD stay
    where they are (their mask is per element)."""
    order: list[tuple[KNode, Index]] = []
    seen: set = set()
    tops = roots_of(root)

    def walk(n: KNode, ix: Index) -> None:
        if (id(n), ix) in seen or not has_reduce[id(n)] or n.op == "PAD":
            return
        seen.add((id(n), ix))
        for x, cix in sources(n, ix, "_r"):
            walk(x, cix)
        if n.op in REDUCES and id(n) not in tops and not any(
                v.startswith("_") for i in ix for v in substitute_free(i)):
            order.append((n, ix))

    walk(root, idx)
    return order


def row_array_cap(extent: int) -> int:
    """The elements a row's local array holds for a row of ``extent``: the power of two at or above
    it, at least 16. The kernels of a growing row (a decode step's cache) then share their code
    (devices/sizeargs.py: the extent is not a size) and a trace (lower/trace.py: comparisons guard a
    band of lengths, where the length itself would pin the trace to one)."""
    cap = 16
    while cap < extent:
        cap *= 2
    return cap


def row_array_size(extent: int, rows: int, full: bool) -> int:
    """The elements a row of a row-stash local array holds, for a row of ``extent`` in a block of
    ``rows`` rows. ``full`` (a CPU thread's stack, ``Capabilities.row_arrays_full``) and a lone
    row: ``ROW_STASH_MAX``, whatever the row's length -- a growing row (a decode step's one query
    over its KV cache) then keeps one loop IR, one trace and one program from 16 positions to
    ``ROW_STASH_MAX``, where the power of two at or above it (``row_array_cap``) started another band
    at every doubling: a decode step traced its attention kernel again (~13 ms) and compiled it
    (~40 ms) at lengths 16, 32 and 64. The row touches its own part; the rest is stack address space.
    A block of rows keeps ``row_array_cap``: its rows a full array apart, each touching a short
    part, fell into the same few L1 sets (attention b8 h8 s256 d64 in row blocks of 8: 4.9 -> 5.1 ms,
    interleaved runs on a 2-vCPU Intel Xeon), and a prefill's row length does not grow."""
    if full and rows == 1 and extent <= ROW_STASH_MAX:
        return ROW_STASH_MAX
    return row_array_cap(extent)


def stash_read(red: KNode, ix: Index, x: KNode, sources: Sources = dry_sources) -> Index | None:
    """The one index at which reduction ``red``, rendered at ``ix``, reads ``x`` in its own loop
    (a dry run: ``red``'s reduced axes are ``_k{id(red)}_{axis}`` variables; a reduction met on the
    way whose index does not vary along ``red``'s loop is a value of the row, computed before it,
    not entered); None where ``x`` is read at more than one index or not at all. The row stash's
    layout (lower/lowering.py ``Lowerer._stash_layout``) and its dots (lower/passes.py ``RowDots``)."""
    mine = f"_k{id(red)}_"
    found: set = set()
    seen: set = set()
    todo: list = [(red, ix)]
    while todo:
        n, i = todo.pop()
        if (id(n), i) in seen:
            continue
        seen.add((id(n), i))
        if n is x:
            found.add(i)
            continue
        if n is not red and n.op in REDUCES and not any(
                v.startswith(mine) for l in i for v in substitute_free(l)):
            continue
        todo.extend(sources(n, i, "_k"))
    return next(iter(found)) if len(found) == 1 else None


def stash_layout(red: KNode, ix: Index, x: KNode, sources: Sources = dry_sources) -> tuple[Index, tuple[int, ...]] | None:
    """(the index ``stash_read`` finds, the axes of ``x`` that hoisted reduction ``red`` loops over
    there): each such axis indexed by one of ``red``'s loop variables alone over the whole axis,
    every other axis by open loops only (variables not starting with ``_``); None where ``x`` is
    read at more than one index, inside another reduction's loop, or not so. The row stash's
    arrays (lower/lowering.py ``Lowerer._open_rows``) and its dots (lower/passes.py ``RowDots``)."""
    xi = stash_read(red, ix, x, sources)
    if xi is None:
        return None
    mine = f"_k{id(red)}_"
    axes, names = [], set()
    for d, l in enumerate(xi):
        free = substitute_free(l)
        if any(v.startswith(mine) for v in free):
            (name,) = free if len(free) == 1 else (None,)
            if name is None or l != Lin.var(name, x.shape[d]) or name in names:
                return None
            axes.append(d)
            names.add(name)
        elif any(v.startswith("_") for v in free):
            return None               # an output axis not open yet, or another reduction's loop
    return (xi, tuple(axes)) if axes else None

