"""The op table: every primitive op of eqgrad, defined once.

Each :class:`OpDef` carries the op's arity, its egglog constructor (name and the sorts of its
non-tensor arguments), its shape rule, dtype rule, NumPy reference semantics, gradient, cost
weight and flags. The shape and dtype rules are named declaratively (``shape_of``, ``dtype_of``)
and so are the argument positions that may fuse (``fuse``): the Python rules here and the egglog
rule families (``eqgrad.rules.families``: analysis, fusion) are both built from those names, so
they cannot disagree. The egglog declarations (``eqgrad.rules.ir``), the NumPy reference device,
the LLVM renderer's op map, autograd (``eqgrad.frontend.autograd``) and the op tests are all
driven from this table; ``tests/test_optable.py`` fails when an op lacks one of its pieces.

Conventions
- Shapes are tuples of ints. Reductions keep reduced axes as size 1.
- In egglog every constructor takes its tensor arguments first, then its attributes.
- Integer ``IDIV``/``MOD`` truncate toward zero (C semantics); division by zero gives 0.
  The frontend composes NumPy's floor division from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from eqgrad.errors import OpError
from eqgrad.dtype import ALL_DTYPES, DType, bfloat16, bool_, round_bf16

Shape = tuple[int, ...]
MAX_RANK = 8          # egglog analysis rules are generated per rank up to this


@dataclass(frozen=True)
class OpDef:
    name: str                         # e.g. "ADD"
    egg: str                          # egglog constructor, e.g. "Add"
    kind: str                         # leaf | unary | binary | ternary | reduce | movement | boundary
    arity: int                        # number of tensor sources
    attrs: tuple[str, ...] = ()       # egglog sorts of the attributes, in order
    flops: int = 0                    # cost weight per evaluated element
    dtypes: str = "fib"               # accepted input kinds: f(loat) i(nt) b(ool)
    doc: str = ""
    shape_rule: Callable[..., Shape] = field(default=None, repr=False)   # (src_shapes, arg) -> shape
    dtype_rule: Callable[..., DType] = field(default=None, repr=False)   # (src_dtypes, arg) -> dtype
    ref: Callable[..., np.ndarray] = field(default=None, repr=False)     # (src arrays, arg, out dtype)
    grad: "Callable[..., tuple] | NoGrad" = field(default=None, repr=False)  # see "Gradients" below
    # Declarative descriptions that both the Python rules above and the generated egglog rules
    # (eqgrad/rules/families.py) are built from, so the two cannot disagree:
    shape_of: str = ""                # a key of SHAPE_RULES: how the result's shape follows
    dtype_of: str = ""                # a key of DTYPE_RULES: how the result's dtype follows
    fuse: tuple[int, ...] = ()        # argument positions whose producer may be computed inside
                                      # this op's kernel: one consumer-side fusion rule each
    libm: str = ""                    # a float unary op's C99 <math.h> function (double; C-style
                                      # renderers add their float spelling), "" if none

    @property
    def attr_sizes(self) -> str:
        """Where the attribute holds sizes, read off the shape rule: "shape" (RESHAPE, EXPAND: every
        entry of the target is a size), "pairs" (PAD, SHRINK: two per-axis vectors of sizes), ""
        (none: axes, a permutation, a dtype, or no attribute). The one answer for every module
        that abstracts, rewrites or checks sizes (graph/resize.py, lower/trace.py)."""
        if self.shape_of == "attr" and self.attrs == ("IVec",):
            return "shape"
        return "pairs" if self.shape_of in ("pad", "shrink") else ""


# ------------------------------------------------------------------ shape rules

def _same_shape(srcs: list[Shape], arg: Any) -> Shape:
    return srcs[0]


def _reduce_shape(srcs: list[Shape], axes: tuple[int, ...]) -> Shape:
    return tuple(1 if i in axes else s for i, s in enumerate(srcs[0]))


def _attr_shape(srcs: list[Shape], new: Shape) -> Shape:
    return tuple(new)


def _arg1_shape(srcs: list[Shape], arg: Any) -> Shape:
    return srcs[1]


def _permute_shape(srcs: list[Shape], perm: tuple[int, ...]) -> Shape:
    return tuple(srcs[0][p] for p in perm)


def _pad_shape(srcs: list[Shape], arg: tuple[tuple[int, ...], tuple[int, ...]]) -> Shape:
    before, after = arg
    return tuple(b + s + a for s, b, a in zip(srcs[0], before, after))


def _shrink_shape(srcs: list[Shape], arg: tuple[tuple[int, ...], tuple[int, ...]]) -> Shape:
    starts, ends = arg
    return tuple(e - b for b, e in zip(starts, ends))


def _leaf_shape(srcs: list[Shape], arg: Any) -> Shape:
    raise OpError("leaf shapes are given, not computed")


# OpDef.shape_of -> the shape rule. In egglog (families.py): "given" and "attr" read the op's IVec
# attribute, "same"/"arg1" the shape of source 0/1, the others are generated per rank.
SHAPE_RULES: dict[str, Callable[..., Shape]] = {
    "given": _leaf_shape,       # a leaf: its IVec attribute is its shape
    "same": _same_shape,        # the shape of source 0
    "arg1": _arg1_shape,        # the shape of source 1 (WHERE: the condition may be anything)
    "attr": _attr_shape,        # the IVec attribute is the new shape (RESHAPE, EXPAND)
    "reduce": _reduce_shape,    # reduced axes (the attribute) become size 1
    "permute": _permute_shape,
    "pad": _pad_shape,
    "shrink": _shrink_shape,
}


# ------------------------------------------------------------------ dtype rules

def _same_dtype(srcs: list[DType], arg: Any) -> DType:
    return srcs[0]


def _bool_dtype(srcs: list[DType], arg: Any) -> DType:
    return bool_


def _arg1_dtype(srcs: list[DType], arg: Any) -> DType:
    return srcs[1]


def _attr_dtype(srcs: list[DType], arg: DType) -> DType:
    return arg


def _leaf_dtype(srcs: list[DType], arg: Any) -> DType:
    raise OpError("leaf dtypes are given, not computed")


# OpDef.dtype_of -> the dtype rule. In egglog: "given"/"attr" read the op's String attribute,
# "same"/"arg1" the dtype of source 0/1, "bool" is the constant "bool".
DTYPE_RULES: dict[str, Callable[..., DType]] = {
    "given": _leaf_dtype,       # a leaf: its String attribute is its dtype
    "same": _same_dtype,
    "arg1": _arg1_dtype,        # WHERE: the branches' dtype, not the condition's
    "bool": _bool_dtype,        # comparisons
    "attr": _attr_dtype,        # CAST: the attribute is the target dtype
}


# ------------------------------------------------------------------ NumPy references
# Each takes the source arrays (already of the op's input dtype), the attribute and the output
# dtype, and returns an array of exactly the output shape and dtype.

def _np(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(srcs: list[np.ndarray], arg: Any, out: DType) -> np.ndarray:
        with np.errstate(all="ignore"):
            r = np.asarray(f(*srcs) if arg is None else f(*srcs, arg)).astype(out.vnp, copy=False)
            # bfloat16 values are float32 arrays (NumPy has no bfloat16), rounded after every op
            return round_bf16(r).reshape(r.shape) if out is bfloat16 else r
    return run


def _bitcast(a: np.ndarray, dt: DType) -> np.ndarray:
    """``a``'s bits as ``dt`` (same width). bfloat16 values are float32 arrays here: a float32 array
    bitcast to a 2-byte dtype is a bfloat16 one (its top 16 bits), a 2-byte one bitcast to
    bfloat16 becomes those 16 bits on top of a float32."""
    if a.dtype == np.float32 and dt.itemsize == 2:              # from bfloat16
        return (np.asarray(a, order="C").view(np.uint32) >> 16).astype(np.uint16).view(dt.np)
    if dt is bfloat16:
        return (np.asarray(a, order="C").view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, order="C").view(dt.np)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Truncating integer division; x / 0 = 0."""
    bz = b == 0
    safe = np.where(bz, 1, b)
    q = (a - np.fmod(a, safe)) // safe          # exact for every integer width (int64 too)
    return np.where(bz, 0, q).astype(a.dtype)


def _int_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C remainder (sign of the dividend); x % 0 = 0."""
    bz = b == 0
    r = np.fmod(a, np.where(bz, 1, b))
    return np.where(bz, 0, r).astype(a.dtype)


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return a | b
    return np.maximum(a, b)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a | b) if a.dtype == np.bool_ else a + b


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a & b) if a.dtype == np.bool_ else a * b


def _neg(a: np.ndarray) -> np.ndarray:
    return np.logical_not(a) if a.dtype == np.bool_ else np.negative(a)


def _cast(a: np.ndarray, dt: DType) -> np.ndarray:
    if dt.is_int and a.dtype.kind == "f":
        # saturating float -> integer conversion with NaN -> 0 (LLVM's fptosi.sat/fptoui.sat), see
        # docs/semantics.md; float64 holds every int32 bound exactly, and int64's through the clip below
        lo, hi = dt.min, dt.max
        t = np.trunc(a.astype(np.float64))
        out = np.where(np.isnan(t), 0, np.clip(t, lo, hi)).astype(dt.np)
        if dt.itemsize == 8:       # 2**63 - 1 is not a float64: the clip gave 2**63, astype is undefined there
            out = np.where(t >= 2.0**63, hi, out).astype(dt.np)
        return out
    if dt is bfloat16 and a.dtype != np.float32:     # rounded once (float32 first would round twice)
        return round_bf16(a)
    return a.astype(dt.vnp)


def _reduce_sum(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if a.dtype == np.bool_:
        return np.any(a, axis=axes, keepdims=True)
    return np.sum(a, axis=axes, keepdims=True, dtype=a.dtype)


def _reduce_max(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if a.size == 0:
        return np.full(_reduce_shape([a.shape], axes), _max_identity(a.dtype), dtype=a.dtype)
    return np.max(a, axis=axes, keepdims=True)


def _max_identity(npdt: np.dtype) -> Any:
    if npdt == np.bool_:
        return False
    if npdt.kind in "iu":
        return np.iinfo(npdt).min
    return -np.inf


def _pad(a: np.ndarray, arg: tuple[tuple[int, ...], tuple[int, ...]]) -> np.ndarray:
    return np.pad(a, list(zip(*arg))) if a.ndim else a


def _shrink(a: np.ndarray, arg: tuple[tuple[int, ...], tuple[int, ...]]) -> np.ndarray:
    return a[tuple(slice(b, e) for b, e in zip(*arg))]


def _flip(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.flip(a, axes) if axes else a


def _where(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(c, a, b)


# ------------------------------------------------------------------ gradients
# Reverse-mode rules, one per differentiable primitive: ``grad(g, out, srcs, arg)`` gets the
# gradient ``g`` of the output (same shape as ``out``), the output ``out`` and the sources ``srcs``
# (all LazyBuffers, so the rules build lazy graphs of primitives) and the op's attribute; it
# returns one gradient per source (``None``: no gradient flows to that source). Every composite
# op of the frontend gets its gradient from these. An op without a gradient says so with
# :class:`NoGrad` and a reason; ``tests/test_optable.py`` fails for an op that has neither.


@dataclass(frozen=True)
class NoGrad:
    """Marks an op as not differentiable; no gradient flows through it to its sources."""
    reason: str


LN_2 = math.log(2.0)


def _g_neg(g, out, s, arg):
    return (g.alu("NEG"),)


def _g_exp2(g, out, s, arg):            # d 2^x = 2^x ln 2
    return (g.alu("MUL", out).alu("MUL", g.const_like(LN_2)),)


def _g_log2(g, out, s, arg):            # d log2 x = 1 / (x ln 2)
    return (g.alu("MUL", s[0].alu("RECIP")).alu("MUL", g.const_like(1.0 / LN_2)),)


def _g_sin(g, out, s, arg):             # d sin x = cos x = sin(pi/2 - x), as Tensor.cos
    x = s[0]
    return (g.alu("MUL", x.const_like(math.pi / 2).alu("ADD", x.alu("NEG")).alu("SIN")),)


def _g_erf(g, out, s, arg):             # d erf x = 2/sqrt(pi) exp(-x^2) = 2/sqrt(pi) 2^(-x^2 log2 e)
    x = s[0]
    e = x.alu("MUL", x).alu("MUL", x.const_like(-1.0 / LN_2)).alu("EXP2")
    return (g.alu("MUL", e).alu("MUL", g.const_like(2.0 / math.sqrt(math.pi))),)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf computed in float64 (scipy.special.erf; math.erf is the same function, scalar)."""
    import scipy.special      # here, not at the top: importing it costs 0.25 s, 40% of `import eqgrad`
    return scipy.special.erf(np.asarray(x, np.float64))


def _g_sqrt(g, out, s, arg):            # d sqrt x = 1 / (2 sqrt x)
    return (g.alu("MUL", out.alu("RECIP")).alu("MUL", g.const_like(0.5)),)


def _g_recip(g, out, s, arg):           # d 1/x = -1/x^2
    return (g.alu("MUL", out.alu("MUL", out)).alu("NEG"),)


def _g_cast(g, out, s, arg):
    return (g.alu("CAST", arg=s[0].dtype) if s[0].dtype.is_float else None,)


def _g_add(g, out, s, arg):
    return (g, g)


def _g_mul(g, out, s, arg):
    return (g.alu("MUL", s[1]), g.alu("MUL", s[0]))


def _g_max(g, out, s, arg):
    # NOTE: ties split the gradient evenly between both sources, as torch.maximum does
    a, b = s
    zero, half = g.const_like(0.0), g.alu("MUL", g.const_like(0.5))
    tie = a.alu("CMPEQ", b).alu("WHERE", half, zero)
    return (b.alu("CMPLT", a).alu("WHERE", g, tie), a.alu("CMPLT", b).alu("WHERE", g, tie))


def _g_where(g, out, s, arg):
    zero = g.const_like(0.0)
    return (None, s[0].alu("WHERE", g, zero), s[0].alu("WHERE", zero, g))


def _g_sum(g, out, s, arg):
    return (g.movement("EXPAND", s[0].shape),)


def _g_rmax(g, out, s, arg):
    # NOTE: ties share the gradient evenly (as torch.amax); the mask is where x equals the max.
    # x is materialized and its max taken again from that buffer: a kernel that recomputes x
    # may round differently (FMA contraction, summation order) from the kernel that computed the
    # forward max, and then no element would equal it (a zero count: inf gradients).
    x = s[0].contiguous()
    mask = x.alu("CMPEQ", x.reduce("RMAX", arg).movement("EXPAND", x.shape)).alu("CAST", arg=x.dtype)
    share = g.alu("MUL", mask.reduce("RSUM", arg).alu("RECIP"))
    return (mask.alu("MUL", share.movement("EXPAND", x.shape)),)


def _g_reshape(g, out, s, arg):
    return (g.movement("RESHAPE", s[0].shape),)


def _g_permute(g, out, s, arg):
    return (g.movement("PERMUTE", tuple(int(i) for i in np.argsort(arg))),)


def _g_expand(g, out, s, arg):
    axes = tuple(i for i, (a, b) in enumerate(zip(s[0].shape, out.shape)) if a != b)
    return (g.reduce("RSUM", axes),)


def _g_pad(g, out, s, arg):
    before, _ = arg
    return (g.movement("SHRINK", (tuple(before), tuple(b + n for b, n in zip(before, s[0].shape)))),)


def _g_shrink(g, out, s, arg):
    starts, ends = arg
    return (g.movement("PAD", (tuple(starts), tuple(n - e for n, e in zip(s[0].shape, ends)))),)


def _g_flip(g, out, s, arg):
    return (g.movement("FLIP", arg),)


def _g_identity(g, out, s, arg):
    return (g,)


_LEAF = NoGrad("a leaf: gradients are accumulated into the tensor that owns it")
_BOOL_OUT = NoGrad("boolean output: piecewise constant")
_INT_ONLY = NoGrad("integer and bool inputs only")
_PIECEWISE = NoGrad("piecewise constant: the gradient is zero almost everywhere (as torch.trunc)")


# ------------------------------------------------------------------ the table

def _op(name: str, egg: str, kind: str, arity: int, shape_of: str, dtype_of: str,
        ref: Callable | None, attrs: tuple[str, ...] = (), flops: int = 0, dtypes: str = "fib",
        doc: str = "", grad: "Callable[..., tuple] | NoGrad | None" = None,
        fuse: tuple[int, ...] | None = None, libm: str = "") -> OpDef:
    """One op. ``shape_of``/``dtype_of`` name its shape and dtype rules (SHAPE_RULES, DTYPE_RULES);
    ``fuse`` defaults to every argument position."""
    if shape_of not in SHAPE_RULES:
        raise ValueError(f"op {name}: shape_of must be one of {sorted(SHAPE_RULES)}, got {shape_of!r}")
    if dtype_of not in DTYPE_RULES:
        raise ValueError(f"op {name}: dtype_of must be one of {sorted(DTYPE_RULES)}, got {dtype_of!r}")
    fuse = tuple(range(arity)) if fuse is None else tuple(fuse)
    if any(not 0 <= i < arity for i in fuse):
        raise ValueError(f"op {name}: fuse positions must be in range({arity}), got {fuse}")
    return OpDef(name, egg, kind, arity, attrs, flops, dtypes, doc, SHAPE_RULES[shape_of], DTYPE_RULES[dtype_of],
                 ref, grad, shape_of, dtype_of, fuse, libm)


_U, _B = "unary", "binary"
OPS: dict[str, OpDef] = {o.name: o for o in [
    # leaves -- BUF's attribute is the input position of a realized buffer; CONST is a scalar with a shape
    _op("BUF", "Buf", "leaf", 0, "given", "given", None, ("i64", "IVec", "String"),
        doc="a realized buffer (input position, shape, dtype)", grad=_LEAF),
    _op("CONST", "Const", "leaf", 0, "given", "given", None, ("f64", "String", "IVec"),
        doc="a scalar broadcast to a shape (value, dtype, shape)", grad=_LEAF),
    # a runtime scalar argument broadcast to a shape (param index, dtype, shape): a float constant
    # whose value no active rule inspects (graph/program.py), so a new value reuses the plan
    _op("PARAM", "Param", "leaf", 0, "given", "given", None, ("i64", "String", "IVec"),
        doc="a runtime scalar argument broadcast to a shape (index, dtype, shape)", grad=_LEAF),
    # a size of the program as a constant (the size, dtype, shape): what a rule writes where a value
    # is a size (expand-sum: a sum over an axis expanded from 1 is x * n). Extraction makes it a
    # CONST whose value remembers the size (graph/plan.py ``size_value``), so that a plan resized
    # for new sizes gives it the new size (graph/resize.py) instead of guessing which constants are sizes
    _op("SIZE", "Size", "leaf", 0, "given", "given", None, ("i64", "String", "IVec"),
        doc="a size of the program as a constant (size, dtype, shape)", grad=_LEAF),
    # unary
    _op("NEG", "Neg", _U, 1, "same", "same", _np(_neg), flops=1, doc="-x (logical not for bool)", grad=_g_neg),
    _op("EXP2", "Exp2", _U, 1, "same", "same", _np(np.exp2), flops=20, dtypes="f", grad=_g_exp2, libm="exp2"),
    _op("LOG2", "Log2", _U, 1, "same", "same", _np(np.log2), flops=20, dtypes="f", grad=_g_log2, libm="log2"),
    _op("SIN", "Sin", _U, 1, "same", "same", _np(np.sin), flops=20, dtypes="f", grad=_g_sin, libm="sin"),
    _op("ERF", "Erf", _U, 1, "same", "same", _np(_erf), flops=40, dtypes="f", grad=_g_erf, libm="erf"),
    _op("SQRT", "Sqrt", _U, 1, "same", "same", _np(np.sqrt), flops=4, dtypes="f", grad=_g_sqrt, libm="sqrt"),
    _op("RECIP", "Recip", _U, 1, "same", "same", _np(np.reciprocal), flops=4, dtypes="f", grad=_g_recip),
    _op("TRUNC", "Trunc", _U, 1, "same", "same", _np(np.trunc), flops=1, dtypes="f", grad=_PIECEWISE, libm="trunc"),
    _op("CAST", "Cast", _U, 1, "same", "attr", _np(_cast), ("String",), flops=1, grad=_g_cast),
    # the same bits read as another dtype of the same width (torch's view(dtype)); not bool
    _op("BITCAST", "Bitcast", _U, 1, "same", "attr", _np(_bitcast), ("String",), dtypes="fi",
        grad=NoGrad("reinterprets bits: not differentiable (torch's view(dtype))")),
    # binary (both sources have the same shape and dtype; the frontend broadcasts and promotes)
    _op("ADD", "Add", _B, 2, "same", "same", _np(_add), flops=1, grad=_g_add),
    _op("MUL", "Mul", _B, 2, "same", "same", _np(_mul), flops=1, grad=_g_mul),
    _op("MAX", "Max", _B, 2, "same", "same", _np(_maximum), flops=1, doc="NaN-propagating", grad=_g_max),
    _op("CMPLT", "CmpLt", _B, 2, "same", "bool", _np(np.less), flops=1, grad=_BOOL_OUT),
    _op("CMPEQ", "CmpEq", _B, 2, "same", "bool", _np(np.equal), flops=1, grad=_BOOL_OUT),
    _op("IDIV", "IDiv", _B, 2, "same", "same", _np(_int_div), flops=8, dtypes="i", grad=_INT_ONLY),
    _op("MOD", "Mod", _B, 2, "same", "same", _np(_int_mod), flops=8, dtypes="i", grad=_INT_ONLY),
    _op("AND", "And", _B, 2, "same", "same", _np(np.bitwise_and), flops=1, dtypes="ib", grad=_INT_ONLY),
    _op("OR", "Or", _B, 2, "same", "same", _np(np.bitwise_or), flops=1, dtypes="ib", grad=_INT_ONLY),
    _op("XOR", "Xor", _B, 2, "same", "same", _np(np.bitwise_xor), flops=1, dtypes="ib", grad=_INT_ONLY),
    # ternary
    _op("WHERE", "Where", "ternary", 3, "arg1", "arg1", _np(_where), flops=1, grad=_g_where),
    # reductions over a sorted tuple of axes, keeping them as size 1
    _op("RSUM", "Sum", "reduce", 1, "reduce", "same", _np(_reduce_sum), ("IVec",), flops=1, grad=_g_sum),
    _op("RMAX", "RMax", "reduce", 1, "reduce", "same", _np(_reduce_max), ("IVec",), flops=1, grad=_g_rmax),
    # movement: never copy data by themselves
    _op("RESHAPE", "Reshape", "movement", 1, "attr", "same",
        _np(lambda a, s: a.reshape(s)), ("IVec",), grad=_g_reshape),
    _op("PERMUTE", "Permute", "movement", 1, "permute", "same",
        _np(lambda a, p: a.transpose(p)), ("IVec",), grad=_g_permute),
    _op("EXPAND", "Expand", "movement", 1, "attr", "same",
        _np(lambda a, s: np.broadcast_to(a, s)), ("IVec",), grad=_g_expand),
    _op("PAD", "Pad", "movement", 1, "pad", "same", _np(_pad), ("IVec", "IVec"),
        doc="zero padding (before, after) per axis", grad=_g_pad),
    _op("SHRINK", "Shrink", "movement", 1, "shrink", "same", _np(_shrink), ("IVec", "IVec"),
        doc="slice [start, end) per axis", grad=_g_shrink),
    _op("FLIP", "Flip", "movement", 1, "same", "same", _np(_flip), ("IVec",), grad=_g_flip),
    # boundaries: a kernel writes its value to a buffer
    _op("REALIZE", "Realize", "boundary", 1, "same", "same", _np(lambda a: a),
        doc="kernel boundary inserted by the compiler; fusion rules remove it", grad=_g_identity,
        fuse=()),   # fusing into a Realize is what its consumers' rules do; Realize(Realize x) never arises
    _op("CONTIGUOUS", "Contiguous", "boundary", 1, "same", "same", _np(lambda a: a),
        doc="kernel boundary forced by the user; never fused away", grad=_g_identity),
]}
# the unary ops whose result dtype is their String attribute (a value conversion, a reinterpretation)
RETYPES = frozenset(o.name for o in OPS.values() if o.kind == _U and o.dtype_of == "attr")

EGG_TO_OP: dict[str, OpDef] = {o.egg: o for o in OPS.values()}
# egglog's name of the function recording which rule introduced a node of constructor C:
# PROVENANCE_PREFIX + C (rules/provenance.py writes it, extract/egraph.py reads it)
PROVENANCE_PREFIX = "prov-of-"
ALU_OPS = tuple(n for n, o in OPS.items() if o.kind in ("unary", "binary", "ternary"))
REDUCE_OPS = ("RSUM", "RMAX")
MOVEMENT_OPS = tuple(n for n, o in OPS.items() if o.kind == "movement")


def numel(shape: Shape) -> int:
    return math.prod(shape)


# ------------------------------------------------------------------ valid attributes
# What an attribute must satisfy for the shape rule to apply to the sources: a shape rule
# computes, it does not check (a reshape's target is its shape whatever the element count). A
# plan rewritten for new sizes (graph/resize.py) is checked against these and the shape rules.

def _axes_error(srcs: list[Shape], axes: tuple[int, ...]) -> str:
    return "" if all(0 <= a < len(srcs[0]) for a in axes) else f"axes {axes} of rank {len(srcs[0])}"


def _permute_error(srcs: list[Shape], perm: tuple[int, ...]) -> str:
    return "" if sorted(perm) == list(range(len(srcs[0]))) else f"permutation {perm} of rank {len(srcs[0])}"


def _reshape_error(srcs: list[Shape], new: Shape) -> str:
    return "" if numel(new) == numel(srcs[0]) else f"{srcs[0]} ({numel(srcs[0])} elements) into {new}"


def _expand_error(srcs: list[Shape], new: Shape) -> str:
    s = srcs[0]
    ok = len(new) == len(s) and all(a == b or a == 1 for a, b in zip(s, new))
    return "" if ok else f"{s} to {new}"


def _pairs_error(op: str) -> Callable[[list[Shape], Any], str]:
    def check(srcs: list[Shape], arg: tuple[Shape, Shape]) -> str:
        s, (lo, hi) = srcs[0], arg
        if len(lo) != len(s) or len(hi) != len(s):
            return f"{arg} of rank {len(s)}"
        if op == "PAD":
            return "" if all(x >= 0 for x in lo + hi) else f"negative padding {arg}"
        return "" if all(0 <= b <= e <= d for b, e, d in zip(lo, hi, s)) else f"range {arg} outside {s}"
    return check


_ATTR_ERRORS: dict[str, Callable[[list[Shape], Any], str]] = {
    "RSUM": _axes_error, "RMAX": _axes_error, "FLIP": _axes_error, "PERMUTE": _permute_error,
    "RESHAPE": _reshape_error, "EXPAND": _expand_error, "PAD": _pairs_error("PAD"), "SHRINK": _pairs_error("SHRINK"),
}


def attr_error(op: str, srcs: list[Shape], arg: Any) -> str:
    """Why ``arg`` is not a valid attribute of ``op`` over sources of shapes ``srcs`` ("" if it is);
    an elementwise op's or a boundary's sources must all have one shape."""
    check = _ATTR_ERRORS.get(op)
    if check is not None:
        return check(srcs, arg)
    return "" if all(x == srcs[0] for x in srcs) else f"sources of shapes {srcs}"


def reduce_identity(op: str, dt: DType) -> float | int | bool:
    if op == "RSUM":
        return False if dt is bool_ else (0 if dt.is_int else 0.0)
    return _max_identity(np.dtype(dt.vnp))


# op.dtypes ("fib") -> the names of its dtypes, built once each: a set of names, as graph building
# checks every op's sources (membership in a tuple of dtypes ran DType.__eq__ on each one before the
# match: 9 calls and ~1 us of a 4.3 us ``a + a``)
_ALLOWED: dict[str, frozenset[str]] = {}


def check_dtypes(op: OpDef, dtypes: list[DType]) -> None:
    allowed = _ALLOWED.get(op.dtypes)
    if allowed is None:
        kinds = {"f": "f", "i": "iu", "b": "b"}             # "i": signed and unsigned integers
        allowed = _ALLOWED[op.dtypes] = frozenset(d.name for d in ALL_DTYPES
                                                  if d.kind in "".join(kinds[k] for k in op.dtypes))
    for d in dtypes:
        if d.name not in allowed:
            kinds = {"f": "a float", "i": "an integer", "b": "bool"}
            raise OpError(f"{op.name.lower()} expects {' or '.join(kinds[k] for k in op.dtypes)} input, got {d.name}")
