"""Elementwise kernels over whole contiguous buffers are lowered as one flat loop.

A kernel whose body is elementwise ops over buffers of its own shape (and over scalars broadcast to
it) computes element ``i`` of its output from element ``i`` of each input, in row-major order, so
its loops can be one: a (128, 64) Adam update and a (10, 128) one become the same loop over
``numel`` elements, whose extent is the launch's (the split loop's ``[lo, hi)``). Their loop IR,
their LLVM IR and their compiled code are then one -- an optimizer step over many parameters
compiles each update once, not once per parameter shape -- and the one loop is as long as the
output, which suits the vectorizer and the thread split better than a short inner axis.

``collapse`` returns the kernel with its body rewritten over ``(numel,)``, or the kernel itself
when anything in the body reads across elements: a reduction, a permute, a pad or shrink, an
expand that is not of a one-element value, a reshape that is not of a whole buffer. Buffers are
dense row-major (graph/plan.py), so reading ``b`` as ``(numel,)`` is reading it.

``merge_axes`` does the same for the kernels ``collapse`` keeps, one group of adjacent output axes
at a time: an elementwise kernel (no reduction, no pad) whose every buffer read steps along axis
``d`` exactly ``shape[d+1]`` times as far as along axis ``d+1`` (both contiguous, both broadcast,
or a transpose's inner pair) loops over the two as one. A bias added over ``(N, C, H, W)`` reads
``x`` contiguously and ``b`` along ``C`` only, so it becomes ``(N, C, H*W)``: one inner loop of
1024 iterations instead of 32 of 32 (docs/lowering.md has the measurements). The body
is the old one under a ``RESHAPE`` to the merged shape: the emitter reads each old axis as a
division and a modulo of the merged loop variable, which the index arithmetic folds back
(``symbolic._recombine``) wherever the merge condition holds, so every read is linear again.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from eqgrad.graph.plan import GROUP, Kernel, KNode, broadcast_product
from eqgrad.lower.indexing import REDUCES, dry_sources, flat_index
from eqgrad.lower.symbolic import Lin, Var
from eqgrad.ops import OPS, numel

_ELEMENTWISE = ("unary", "binary", "ternary")


class _Keep(Exception):
    """The body reads across elements: lowered as it is."""


def collapse(kernel: Kernel) -> Kernel:
    root = kernel.ast
    shape = root.shape
    if len(shape) < 2:
        return kernel
    n = numel(shape)
    flat = (n,)
    memo: dict[int, KNode] = {}

    def one_element(x: KNode) -> KNode | None:
        """The one-element value a chain of reshapes and expands broadcasts (any body: a scalar
        computed in the kernel, such as Adam's bias correction), or None."""
        while x.op in ("RESHAPE", "EXPAND") and numel(x.shape) != 1:
            x = x.src[0]
        return x if numel(x.shape) == 1 else None

    def go(x: KNode) -> KNode:
        hit = memo.get(id(x))
        if hit is not None:
            return hit
        if x.shape != shape:
            raise _Keep
        if x.op in ("BUF", "CONST"):
            out = KNode(x.op, (), x.arg, flat, x.dtype)
        elif x.op in ("RESHAPE", "EXPAND"):
            base = one_element(x)
            src = x.src[0]
            if base is not None:           # a scalar broadcast to every element
                one = base if base.shape == (1,) else KNode("RESHAPE", (base,), (1,), (1,), base.dtype)
                out = KNode("EXPAND", (one,), flat, flat, x.dtype)
            elif x.op == "RESHAPE" and src.op == "BUF" and numel(src.shape) == n:
                out = KNode("BUF", (), src.arg, flat, x.dtype)      # a whole buffer, read in order
            else:
                raise _Keep
        elif x.op == GROUP or OPS[x.op].kind in _ELEMENTWISE:        # (a GROUP: each of its roots)
            out = KNode(x.op, tuple(go(s) for s in x.src), x.arg, flat, x.dtype)
        else:
            raise _Keep
        memo[id(x)] = out
        return out

    try:
        body = go(root)
    except _Keep:
        return kernel
    return replace(kernel, ast=body)


_NO_MERGE = frozenset({"RSUM", "RMAX", "PAD"})     # reads across elements, or per-axis masks


def merge_axes(kernel: Kernel) -> Kernel:
    """The kernel over its output shape with mergeable adjacent axes merged (module docstring),
    or the kernel itself when none merges."""
    root = kernel.ast
    shape = root.shape
    axes = [d for d, e in enumerate(shape) if e > 1]
    if len(axes) < 2 or 0 in shape:
        return kernel
    out = tuple(Lin.var(f"o{d}", e) for d, e in enumerate(shape))
    coefs = _read_strides(root, out, {f"o{d}": d for d in axes}, _NO_MERGE)   # (a GROUP: each root)
    if coefs is None:
        return kernel
    groups = _runs(axes, lambda a, d: _steps_as_one(coefs, a, d, shape[d]))
    if len(groups) == len(axes):
        return kernel
    merged = tuple(numel(tuple(shape[d] for d in g)) for g in groups)
    if root.op == GROUP:            # each root under the reshape, the GROUP stays the root
        body = KNode(GROUP, tuple(KNode("RESHAPE", (r,), merged, merged, r.dtype) for r in root.src), None, merged,
                     root.dtype)
    else:
        body = KNode("RESHAPE", (root,), merged, merged, root.dtype)
    return replace(kernel, ast=body)


def _read_strides(start: KNode, idx: tuple, names: dict[str, int], stop) -> list[dict[int, int]] | None:
    """Per buffer read below ``start`` (read at ``idx``): each axis ``names`` maps its variable to ->
    the read's stride along it (other variables, an inner reduction's own, left out); None where a
    read is not linear in the variables (a reshape that splits an axis of a moved view) or an op in
    ``stop`` lies below."""
    coefs: list[dict[int, int]] = []
    seen: set = set()
    stack: list[tuple[KNode, tuple]] = [(start, idx)]
    while stack:
        n, at = stack.pop()
        if n.op in stop:
            return None
        if (id(n), at) in seen:
            continue
        seen.add((id(n), at))
        if n.op == "BUF":
            c: dict[int, int] = {}
            for a, k in flat_index(at, n.shape).terms:
                if type(a) is not Var:
                    return None
                if a.name in names:
                    c[names[a.name]] = k
            coefs.append(c)
        else:
            stack.extend(dry_sources(n, at, "r"))
    return coefs


def _runs(dims: Iterable[int], joins: Callable[[int, int], bool]) -> list[list[int]]:
    """``dims`` in runs: each joins the run before it where ``joins(the run's last, it)`` holds."""
    groups: list[list[int]] = []
    for d in dims:
        if groups and joins(groups[-1][-1], d):
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def _steps_as_one(coefs: list[dict[int, int]], outer: int, inner: int, extent: int) -> bool:
    """Whether every read steps ``extent`` times as far along axis ``outer`` as along the next axis
    ``inner`` (both contiguous, both broadcast, or a transpose's inner pair): the two are one axis."""
    return all(c.get(outer, 0) == c.get(inner, 0) * extent for c in coefs)


def _reduce_strides(red: KNode) -> list[dict[int, int]] | None:
    """Per buffer read under reduction ``red``: each axis of its source -> the read's stride along
    it; None where a read is not linear in the source's axes or a pad masks one (the axes are kept)."""
    src = red.src[0]
    idx = tuple(Lin.var(f"_m{d}", e) for d, e in enumerate(src.shape))
    return _read_strides(src, idx, {f"_m{d}": d for d in range(len(src.shape))}, ("PAD",))


def _merged_reduction(red: KNode, src: KNode) -> KNode | None:
    """``red`` (over ``src``, its source rebuilt) with each run of adjacent reduced axes that every
    read under it steps through as one axis summed as one axis, under a RESHAPE to ``red``'s shape;
    None when no two merge."""
    shape, axes = src.shape, set(red.arg)
    if not any(d - 1 in axes for d in axes):
        return None                    # no two reduced axes are adjacent: nothing to read
    coefs = _reduce_strides(red)
    if coefs is None:
        return None
    groups = _runs(range(len(shape)), lambda a, d: a in axes and d in axes and _steps_as_one(coefs, a, d, shape[d]))
    if len(groups) == len(shape):
        return None
    merged = tuple(numel(tuple(shape[d] for d in g)) for g in groups)
    new_axes = tuple(j for j, g in enumerate(groups) if g[0] in axes)
    kept = tuple(1 if j in new_axes else e for j, e in enumerate(merged))
    inner = KNode(red.op, (KNode("RESHAPE", (src,), merged, merged, src.dtype),), new_axes, kept, red.dtype)
    return KNode("RESHAPE", (inner,), red.shape, red.shape, red.dtype)


def merge_reduced(kernel: Kernel) -> Kernel:
    """The kernel with each reduction over adjacent axes that it reads as one axis reduced over one
    merged axis (a channel's sum over ``(N, C, H, W)``'s ``H`` and ``W``: one loop of ``H*W``), or the
    kernel itself when none merges. A sum of a broadcast product (a contraction: the lanes pass and
    the BLAS read its axes as they are) keeps them."""
    root = kernel.ast
    if not any(n.op in REDUCES and len(n.arg) > 1 for n in root.walk()):
        return kernel
    memo: dict[int, KNode] = {}
    changed = False

    def go(n: KNode) -> KNode:
        nonlocal changed
        hit = memo.get(id(n))
        if hit is not None:
            return hit
        src = tuple(go(s) for s in n.src)
        out = n if all(a is b for a, b in zip(src, n.src)) else KNode(n.op, src, n.arg, n.shape, n.dtype)
        if n.op in REDUCES and len(n.arg) > 1 and not broadcast_product(n.src[0], lambda x: x.op, lambda x: x.src):
            m = _merged_reduction(n, src[0])
            if m is not None:
                out, changed = m, True
        memo[id(n)] = out
        return out

    body = go(root)
    return replace(kernel, ast=body) if changed else kernel
