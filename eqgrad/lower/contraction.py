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

from dataclasses import dataclass, replace

from eqgrad.dtype import float32
from eqgrad.graph.caps import register_gemm_rule
from eqgrad.graph.plan import Kernel, KNode
from eqgrad.lower import symbolic
from eqgrad.lower.indexing import flat_index, move_index, strides_of
from eqgrad.lower.symbolic import Lin, Var
from eqgrad.ops import OPS, numel

GEMM_MOVES = ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK")
PACK_MAX = 2        # a packed operand's elements, at most, per element of the buffers it reads (docs/lowering.md, Constants)


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


def _coefficients(flat: Lin, names: list[str]) -> list[int] | None:
    """The coefficient of each variable ``names[d]`` in ``flat``, or None when ``flat`` holds
    anything else (a division or modulo: not affine)."""
    out = [0] * len(names)
    for atom, c in flat.terms:
        if not isinstance(atom, Var) or atom.name not in names:
            return None
        out[names.index(atom.name)] = c
    return out


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
    strides = _coefficients(flat, names)
    if strides is None or flat.const < 0 or any(s < 0 for s in strides):
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


def _out_strides(root: KNode, red: KNode) -> list[int] | None:
    """Where each element of ``red`` lands in the root's buffer, as a stride per axis of ``red``,
    for a root that is ``red`` under reshapes and permutes (a weight gradient written transposed);
    None when that is not affine in ``red``'s index."""
    chain = []
    n = root
    while n is not red:
        if n.op not in ("RESHAPE", "PERMUTE"):
            return None
        chain.append(n)
        n = n.src[0]
    names = [f"out{d}" for d in range(len(red.shape))]
    with symbolic.lowering():
        idx = tuple(Lin.var(names[d], e) for d, e in enumerate(red.shape))
        for m in reversed(chain):               # from red up: each op's inverse maps up a level
            src = m.src[0]
            if m.op == "RESHAPE":
                inv = KNode("RESHAPE", (m,), src.shape, src.shape, m.dtype)
            else:
                q = [0] * len(m.arg)
                for i, p in enumerate(m.arg):
                    q[p] = i
                inv = KNode("PERMUTE", (m,), tuple(q), src.shape, m.dtype)
            idx = move_index(inv, idx)
        flat = flat_index(idx, root.shape)
    return _coefficients(flat, names)


def match_contraction(red: KNode, sc: list[int] | None = None) -> Gemm | None:
    """The GEMM that computes reduction ``red`` (an RSUM of a MUL of two moved float32 buffers),
    written with element strides ``sc`` per axis of ``red`` (default: contiguously in ``red``'s
    shape), or None (see the module docstring)."""
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
    sc = strides_of(red.shape) if sc is None else sc
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


@dataclass(frozen=True)
class Found:
    """A contraction in a kernel body: the reduction ``red``; the operand values to materialize
    first (``packs``: each becomes a kernel of its own writing a contiguous scratch buffer, named
    here by the placeholder ids -1, -2); ``red`` with those operands read from their buffers
    (``packed``); and the GEMM of ``packed``, writing the kernel's output itself when ``pure``,
    else a scratch buffer in ``red``'s shape that the rest of the body reads (``split_epilogue``)."""
    red: KNode
    packs: tuple[KNode, ...]
    packed: KNode
    gemm: Gemm
    pure: bool = False            # the root is ``red`` under reshapes and permutes: the GEMM writes it


def _pack_operand(o: KNode, placeholder: int) -> tuple[KNode, KNode] | None:
    """(the value to materialize, the operand reading it back) for an operand that is not an
    affine view of a buffer: a computed operand (relu's mask times a gradient) or a view with a
    mask (a padded im2col). What is materialized is the operand below its broadcast, so it is
    written once, not once per element of the product."""
    u = o.src[0] if o.op == "EXPAND" else o
    if u.dtype != float32 or u.op == "BUF":
        return None
    # only a pack at most twice what it reads (a padded operand, a relu mask and a gradient): an
    # im2col (a convolution's padded windows, 9x its input for 3x3) would write and read back far
    # more than the generated kernel reads
    if numel(u.shape) > PACK_MAX * sum(numel(n.shape) for n in u.walk() if n.op == "BUF"):
        return None
    leaf = KNode("BUF", (), placeholder, u.shape, u.dtype)
    return u, (KNode("EXPAND", (leaf,), o.arg, o.shape, o.dtype) if o.op == "EXPAND" else leaf)


def candidate(root: KNode) -> KNode | None:
    """The body's one reduction when it could be a contraction (a float32 sum of a product; no
    other reduction), found without index arithmetic: most kernels stop here."""
    reds = [n for n in root.walk() if n.op in ("RSUM", "RMAX")]
    if len(reds) != 1:
        return None
    red = reds[0]
    return red if red.op == "RSUM" and red.dtype == float32 and red.src[0].op == "MUL" else None


def find_contraction(root: KNode) -> Found | None:
    """The body's one reduction when it is a GEMM (``match_contraction``), after materializing
    an operand that is not an affine view (``_pack_operand``), and its value reaches the root
    through elementwise ops, reshapes and permutes only; None otherwise (a body with another
    reduction, a contraction read at a moved index, a product of no GEMM's shape)."""
    red = candidate(root)
    if red is None:
        return None
    reach = _reaches(root, red)
    for n in root.walk():
        if n is red or id(n) not in reach:
            continue
        if n.op not in ("RESHAPE", "PERMUTE") and not _elementwise(n):
            return None
    sc = _out_strides(root, red) if is_pure(root, red) else None

    def gemm_of(r: KNode) -> tuple[Gemm | None, bool]:
        # written in place where the root's layout allows it, else into a scratch buffer that
        # the rest of the body (a permuted copy) reads
        g = match_contraction(r, sc) if sc is not None else None
        return (g, True) if g is not None else (match_contraction(r), False)
    g, pure = gemm_of(red)
    if g is not None:
        return Found(red, (), red, g, pure)
    prod = red.src[0]
    names = [f"gemm{d}" for d in range(len(prod.shape))]
    with symbolic.lowering():
        affine = [_operand(o, names, len(prod.shape)) is not None for o in prod.src]
    # operands that are not views must be packed; where both are views but one has no unit
    # stride (a ``::2`` slice), try packing either, then both
    need = [i for i, ok in enumerate(affine) if not ok]
    tries = [need] if need else [[0], [1], [0, 1]]
    for which in tries:
        packs, srcs = [], []
        for i, o in enumerate(prod.src):
            if i not in which:
                srcs.append(o)
                continue
            pk = _pack_operand(o, -1 - len(packs))
            if pk is None:
                break
            packs.append(pk[0])
            srcs.append(pk[1])
        else:
            packed = KNode("RSUM", (KNode("MUL", tuple(srcs), prod.arg, prod.shape, prod.dtype),), red.arg,
                           red.shape, red.dtype)
            g, pure = gemm_of(packed)
            if g is not None:
                return Found(red, tuple(packs), packed, g, pure)
    return None


def with_buffers(f: Found, ids: list[int]) -> tuple[KNode, Gemm]:
    """``f.packed`` and its GEMM with the packs' placeholder buffers -1, -2 named ``ids``."""
    body = f.packed.replaced({id(n): KNode("BUF", (), ids[-1 - n.arg], n.shape, n.dtype)
                              for n in f.packed.walk() if n.op == "BUF" and n.arg < 0})
    g = f.gemm
    name = lambda b: ids[-1 - b] if b < 0 else b
    return body, replace(g, x=name(g.x), y=name(g.y))


def is_pure(root: KNode, red: KNode) -> bool:
    """Whether the body is the contraction itself, under reshapes and permutes only."""
    while root.op in ("RESHAPE", "PERMUTE"):
        root = root.src[0]
    return root is red


def split_epilogue(k: Kernel, red: KNode, new_buffer: int, body: KNode | None = None) -> tuple[Kernel, Kernel]:
    """(the contraction ``red`` -- or ``body``, its packed form -- as a kernel writing buffer
    ``new_buffer``, the rest of ``k`` reading it there): a bias, an activation or a scale
    applied after the GEMM."""
    body = red if body is None else body
    gemm = Kernel(f"{k.name}g", new_buffer, body, body.buffers(), k.predicted, k.nbytes, k.flops, k.kind, k.stats)
    ast = k.ast.replaced({id(red): KNode("BUF", (), new_buffer, red.shape, red.dtype)})
    # (each piece keeps the plan kernel's kind: the kind its prediction was made for)
    rest = Kernel(k.name, k.out, ast, ast.buffers(), k.predicted, 8 * numel(ast.shape), 0, k.kind, k.stats)
    return gemm, rest


def pack_kernels(k: Kernel, f: Found, first_buffer: int) -> list[Kernel]:
    """The kernels that materialize ``f``'s packed operands into buffers ``first_buffer``, ..."""
    out = []
    for i, u in enumerate(f.packs):
        out.append(Kernel(f"{k.name}p{i}", first_buffer + i, u, u.buffers(), k.predicted, 8 * numel(u.shape), 0,
                          k.kind, k.stats))
    return out


def gemm_shape(root: KNode) -> tuple[int, int, int, int] | None:
    """(batches, m, n, k) of the GEMM kernel body ``root`` is (``find_contraction``), or None: the cost
    model's question (graph/caps.py ``gemm_of``), as it may not import the lowering."""
    found = find_contraction(root)
    if found is None:
        return None
    g = found.gemm
    return g.batches, g.m, g.n, g.k


register_gemm_rule(gemm_shape)
