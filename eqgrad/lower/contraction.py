"""Contractions a library GEMM can run: a kernel body read as ``C[b, m, n] = sum_k X[b, m, k] Y[b, k, n]``.

A matmul reaches a kernel as ``RESHAPE(RSUM(MUL(moves(Buf x), moves(Buf y)), axes))``: the frontend
broadcasts both operands to one (..., m, n, k) space, multiplies and sums the k axes. Each
operand's chain of movement ops (reshape, permute, expand, shrink) folds into one index function
(``indexing.move_index``, as the emitter folds it); when both are affine in the loop variables --
no division or modulo, no pad, no flip -- every axis of the product space has one element stride
per operand (a pad counts where its padding is never read), and the axes sort themselves by which operand reads them:

    reduced                     k (both operands move along it)
    read by X only              m        read by Y only        n
    read by both, not reduced   batch    (and axes neither reads: batch with stride 0)

Adjacent axes of one group merge when their strides chain (a (batch, seq, d) input of a Linear
is one m axis of batch*seq rows); an m or n axis that does not merge becomes a batch axis; a k
axis that does not merge, or a matrix operand whose m/k (k/n) strides are both other than 1
(``readable``), is not a GEMM (it stays a generated kernel). The result is written contiguously in the reduction's shape,
which a reshape above it does not reorder.

``split_epilogue`` takes a body whose contraction sits under elementwise ops and reshapes only (a
bias, an activation, attention's scale) apart: the contraction into a scratch buffer, and the
rest as a kernel reading it, so the GEMM runs the first and the usual lowering the second.
The device decides whether a GEMM pays (devices/blas.py); this module only says what one is.
"""
from __future__ import annotations

from dataclasses import dataclass

from eqgrad.dtype import float32
from eqgrad.graph.plan import Kernel, KNode
from eqgrad.lower import symbolic
from eqgrad.lower.indexing import flat_index, move_index, strides_of
from eqgrad.lower.symbolic import Lin, Var
from eqgrad.ops import OPS

GEMM_MOVES = ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK")


@dataclass(frozen=True)
class Gemm:
    """Row-major ``C[m, n] = X[m, k] @ Y[k, n]`` for each batch index, in element strides:
    X[m, k] is at ``x_off + b.x + m*sx_m + k*sx_k`` of buffer ``x``, and so on. ``batch`` holds
    (extent, C stride, X stride, Y stride) per batch axis, outermost first."""
    m: int
    n: int
    k: int
    x: int
    y: int
    x_off: int
    y_off: int
    sx_m: int
    sx_k: int
    sy_k: int
    sy_n: int
    sc_m: int
    sc_n: int
    batch: tuple[tuple[int, int, int, int], ...]

    @property
    def batches(self) -> int:
        n = 1
        for e, *_ in self.batch:
            n *= e
        return n

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batches


def _strip_reshapes(n: KNode) -> KNode:
    while n.op == "RESHAPE":
        n = n.src[0]
    return n


def _operand(n: KNode, names: list[str], rank: int) -> tuple[int, int, list[int]] | None:
    """(buffer id, offset, stride per product axis) of a chain of movement ops over a float32
    buffer read at the product space's index, or None when it is not affine in that index."""
    chain = []
    while n.op in GEMM_MOVES or n.op == "PAD":
        chain.append(n)
        n = n.src[0]
    if n.op != "BUF" or n.dtype != float32:
        return None
    idx = tuple(Lin.var(names[d], chain[0].shape[d] if chain else n.shape[d]) for d in range(rank))
    for mv in chain:
        if mv.op == "PAD":
            # a pad whose padding is never read (a strided slice pads to a multiple of its
            # step and drops the rest) is a shift; one that is read is a mask: not a GEMM
            idx = tuple(i - b for i, b in zip(idx, mv.arg[0]))
            if any(i.bounds[0] < 0 or i.bounds[1] >= e for i, e in zip(idx, mv.src[0].shape)):
                return None
        else:
            idx = move_index(mv, idx)
    flat = flat_index(idx, n.shape)
    strides = [0] * rank
    for atom, c in flat.terms:
        if not isinstance(atom, Var) or atom.name not in names:
            return None
        strides[names.index(atom.name)] = c
    if flat.const < 0 or any(s < 0 for s in strides):
        return None
    return n.arg, flat.const, strides


def _merge(axes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Axes (extent, stride, stride, ...) merged where every stride chains (outer = inner *
    inner's extent), outermost first by the first stride."""
    axes = sorted(axes, key=lambda a: a[1:], reverse=True)
    out: list[tuple[int, ...]] = []
    for a in axes:
        if out and all(p == s * a[0] for p, s in zip(out[-1][1:], a[1:])):
            prev = out.pop()
            a = (prev[0] * a[0], *a[1:])
        out.append(a)
    return out


def match_contraction(red: KNode) -> Gemm | None:
    """The GEMM that computes reduction ``red`` (an RSUM of a MUL of two moved float32 buffers),
    written contiguously in ``red``'s shape, or None (see the module docstring)."""
    if red.op != "RSUM" or red.dtype != float32 or red.src[0].op != "MUL":
        return None
    prod = red.src[0]
    rank = len(prod.shape)
    if 0 in prod.shape:
        return None
    names = [f"gemm{d}" for d in range(rank)]
    with symbolic.lowering():
        a = _operand(prod.src[0], names, rank)
        b = _operand(prod.src[1], names, rank)
    if a is None or b is None:
        return None
    sc = strides_of(red.shape)
    ks, ms, ns, bs = [], [], [], []
    for d, e in enumerate(prod.shape):
        if e == 1:
            continue
        sa, sb = a[2][d], b[2][d]
        if d in red.arg:
            if sa == 0 or sb == 0:          # a sum of a broadcast operand: not a contraction
                return None
            ks.append((e, sa, sb))
        elif sb == 0 and sa != 0:
            ms.append((e, sa, sc[d]))
        elif sa == 0 and sb != 0:
            ns.append((e, sb, sc[d]))
        else:
            bs.append((e, sc[d], sa, sb))
    ks = _merge(ks)
    if len(ks) != 1:
        return None
    ms, ns = _merge(ms), _merge(ns)
    # the innermost m/n axis (by C stride) is the GEMM's; the others loop as batches
    ms.sort(key=lambda t: t[2], reverse=True)
    ns.sort(key=lambda t: t[2], reverse=True)
    while len(ms) > 1:
        e, sa, c = ms.pop(0)
        bs.append((e, c, sa, 0))
    while len(ns) > 1:
        e, sb, c = ns.pop(0)
        bs.append((e, c, 0, sb))
    (K, sa_k, sb_k), = ks
    M, sa_m, sc_m = ms[0] if ms else (1, 0, 0)
    N, sb_n, sc_n = ns[0] if ns else (1, 0, 0)
    x, y = (a[0], a[1], sa_m, sa_k), (b[0], b[1], sb_k, sb_n)
    # row-major C: its n axis has stride 1; a C whose m axis has stride 1 is C^T = Y^T X^T
    if not (sc_n == 1 or N == 1):
        if not (sc_m == 1 or M == 1):
            return None
        M, N, sc_m, sc_n = N, M, sc_n, sc_m
        x, y = (b[0], b[1], sb_n, sb_k), (a[0], a[1], sa_k, sa_m)
        bs = [(e, c, sy, sx) for e, c, sx, sy in bs]
    bs = _merge(bs)                  # sorted outermost first by C stride, merged where they chain
    g = Gemm(M, N, K, x[0], y[0], x[1], y[1], x[2], x[3], y[2], y[3], sc_m if M > 1 else N, 1, tuple(bs))
    return g if readable(g) else None


def lead(rows: int, cols: int, s_row: int, s_col: int) -> tuple[str, int] | None:
    """How a column-major BLAS reads a rows x cols operand whose element (r, c) is at
    ``r*s_row + c*s_col``: ('N', leading dimension) when its rows are contiguous, ('T', ...) when
    its columns are; None when neither is (a size-1 dimension's stride does not matter)."""
    if rows == 1 or s_row == 1:
        ld = s_col if cols > 1 else rows
        if ld >= max(1, rows):
            return "N", ld
    if cols == 1 or s_col == 1:
        ld = s_row if rows > 1 else cols
        if ld >= max(1, cols):
            return "T", ld
    return None


def readable(g: Gemm) -> bool:
    """Whether a BLAS reads the operands in place: each matrix operand has a unit stride along
    one of its axes (a vector operand of a matrix-vector product may have any stride); an
    operand strided along both (a ``::2`` slice) would need packing first."""
    if g.m > 1 and g.n > 1:
        return lead(g.n, g.k, g.sy_n, g.sy_k) is not None and lead(g.k, g.m, g.sx_k, g.sx_m) is not None
    if g.n == 1:
        return lead(g.m, g.k, g.sx_m, g.sx_k) is not None
    return lead(g.n, g.k, g.sy_n, g.sy_k) is not None


def _reaches(root: KNode, target: KNode) -> set[int]:
    """Ids of the nodes of ``root``'s body that have ``target`` in their sources' closure (and
    ``target`` itself)."""
    hit: set[int] = set()
    for n in root.walk():
        if n is target or any(id(s) in hit for s in n.src):
            hit.add(id(n))
    return hit


def _elementwise(n: KNode) -> bool:
    op = OPS.get(n.op)
    return op is not None and op.kind in ("unary", "binary", "ternary") and all(s.shape == n.shape for s in n.src)


def find_contraction(root: KNode) -> tuple[KNode, Gemm] | None:
    """The body's one reduction when it is a GEMM (``match_contraction``) whose value reaches the
    root through elementwise ops and reshapes only, with the GEMM; None otherwise (a body with
    another reduction, a prologue on an operand, a contraction read at a moved index)."""
    reds = [n for n in root.walk() if n.op in ("RSUM", "RMAX")]
    if len(reds) != 1:
        return None
    red = reds[0]
    g = match_contraction(red)
    if g is None:
        return None
    for n in root.walk():
        if n is red or id(n) not in _reaches(root, red):
            continue
        if n.op != "RESHAPE" and not _elementwise(n):
            return None
    return red, g


def is_pure(root: KNode, red: KNode) -> bool:
    """Whether the body is the contraction itself, under reshapes only."""
    return _strip_reshapes(root) is red


def split_epilogue(k: Kernel, red: KNode, new_buffer: int) -> tuple[Kernel, Kernel]:
    """(the contraction ``red`` as a kernel writing buffer ``new_buffer``, the rest of ``k``
    reading it there): a bias, an activation or a scale applied after the GEMM."""
    gemm = Kernel(f"{k.name}g", new_buffer, red, red.buffers(), k.predicted, k.nbytes, k.flops)
    memo: dict[int, KNode] = {id(red): KNode("BUF", (), new_buffer, red.shape, red.dtype)}
    for n in k.ast.walk():
        if id(n) not in memo:
            srcs = tuple(memo[id(s)] for s in n.src)
            memo[id(n)] = n if srcs == n.src else KNode(n.op, srcs, n.arg, n.shape, n.dtype)
    ast = memo[id(k.ast)]
    out_bytes = 1
    for s in ast.shape:
        out_bytes *= s
    rest = Kernel(k.name, k.out, ast, ast.buffers(), 5e-6, 8 * out_bytes, 0)
    return gemm, rest
