"""Transcendentals written once, as loop IR: exp2, log2, sin and erf rewritten into primitive loop-IR
instructions (polynomials, range reduction, bit tricks) for a renderer that has no fast native
instruction for them.

A renderer's op table (``devices/llvm.py``'s ``LLVM_OPS``, ``devices/cstyle.py``'s
``code_for_op``) says which ops it has natively; ``decompose(kernel, table)`` rewrites every
instruction whose op has a decomposition here but no entry there, and the renderer then only sees
ops it has. Today: the LLVM device decomposes all of them (libm's exp2f/log2f/sinf/erff are scalar calls,
which stop LLVM's loop vectorizer; these sequences vectorize), a CPU OpenCL all of them (PoCL's
library calls are scalar too, ~10 ns per element), a GPU OpenCL exp2/log2 (its library sin is
fast, and this sin reduces in double), CUDA none (``exp2f``/``log2f``/``sinf``/``erff``).

The sequences use the op table's ALU ops and the loop IR's own (``loopir.LOOP_ALU_OPS``: bit
casts, shifts, floor/rint, multiply-add, constant tables), and ``float64`` only for sin's exact
range reduction. Error bounds, checked against NumPy by tests/test_transcendental.py on every
device and by tests/test_renderers.py on the loop-IR interpreter (docs/semantics.md):

- exp2: relative error < 4e-7 for x in [-126, 128]; 0 below -127 (NumPy gives subnormals there,
  absolute error < 1.2e-38); inf above 128; NaN -> NaN.
- log2: absolute error < 2e-7 for every finite x > 0, subnormals included; 0 -> -inf,
  x < 0 -> NaN, inf -> inf, NaN -> NaN.
- sin: absolute error < SIN_ABS_ERR and relative error < SIN_REL_ERR for every finite x, against
  NumPy's float64 sin of the float32 input (x close to a multiple of pi keeps its relative
  accuracy); sin(-0) = -0, a subnormal x gives x, inf and NaN give NaN. Measured over every
  float32 (with FMA contraction, AVX-512): absolute 7.3e-8 (x = 3829304576), relative 1.21e-7
  (x = 3.3882929e38), 1.54 ulp at most. The bounds also hold for NumPy's own float32 sin
  (relative 1.55e-7 measured).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Collection

from eqgrad.dtype import DType, bfloat16, bool_, float16, float32, int32
from eqgrad.graph.loopir import FLOAT64, LInst, LoopKernel, Table
from eqgrad.ops import OPS

# ------------------------------------------------------------------ constants
# exp2: 2**f on [0, 1) by a degree-6 polynomial, highest power last
EXP2_POLY = (1.0, 0.6931470036506653, 0.2402298003435135, 0.05548352375626564,
             0.009678472764790058, 0.0012443081941455603, 0.00021690608991775662)
# 2**n for an integer-valued float n in [-127, 128]: n + (1.5 * 2**23 + 127) holds n + 127 in the
# low mantissa bits, which shifted left by 23 are the biased exponent (no float->int conversion,
# which would be poison for NaN; 2**-127 gives 0, 2**128 gives inf).
EXP2_MAGIC = 12583039.0
# log2(1+t) = t * Q(t) for t = m-1 in [sqrt(1/2)-1, sqrt(2)-1]: Q is a degree-8 Chebyshev
# least-squares fit of log2(1+t)/t, rounded to float32 (max error 7.7e-8 with float32 Horner).
# A polynomial in t instead of the classic atanh series in s = (m-1)/(m+1) saves the division,
# which on AVX-512 is the longest-latency instruction of the loop.
LOG2_POLY = (1.4426950216293335, -0.721347451210022, 0.48090794682502747, -0.3606933057308197,
             0.28800520300865173, -0.2392456978559494, 0.2150873988866806, -0.20480544865131378,
             0.12453901767730713)
SQRT2_F32 = 1.4142135381698608           # sqrt(2) rounded to float32


# sin's range reduction (Payne-Hanek, in double): |x| = m * 2**e, m a 24-bit integer
# (e = max(expfield, 1) - 150). |x| * 2/pi = m * F, F = 2/pi * 2**e; since m is an integer, the bits
# of F of weight >= 4 only add multiples of 4 (which leave sin unchanged) and are dropped. The next
# 96 bits of F, from weight 2**min(1, e - 1) (F's leading bit when F < 4) down, are four 24-bit
# chunks W_0..W_3: SIN_TABLE[4 * expfield + i]. v_i = m * W_i are exact (48-bit products);
# v0 < 2**26 is reduced mod 4 exactly, v1 < 4, v2 < 2**-22, v3 < 2**-46, and the dropped rest is
# below 2**-70. n is the integer nearest to v0 mod 4 + v1 + v2, and
# r = ((v0 mod 4 + v1) - n) + v2 + v3 in [-1/2, 1/2] (the first difference is exact, so r keeps ~52
# bits even when it is tiny); then |x| = (4k + n) pi/2 + y with y = r * pi/2 in [-pi/4, pi/4], and
# sin |x| is sin y, cos y, -sin y, -cos y for n mod 4 = 0, 1, 2, 3.

def _two_over_pi(bits: int) -> int:
    """floor(2/pi * 2**bits), exactly: pi from Machin's formula pi = 16 atan(1/5) - 4 atan(1/239) in
    integer fixed point with 64 guard bits (tests/test_transcendental.py checks it against mpmath)."""
    prec = bits + 64
    one = 1 << prec

    def atan_inv(k: int) -> int:           # atan(1/k) * 2**prec = sum_i (-1)**i / ((2i+1) k**(2i+1))
        total, power, i = 0, one // k, 0
        while power:
            total += (-1) ** i * (power // (2 * i + 1))
            power //= k * k
            i += 1
        return total
    pi = 16 * atan_inv(5) - 4 * atan_inv(239)        # pi * 2**prec, off by a few units
    return (2 << (prec + bits)) // pi


TWO_OVER_PI_BITS = 240                 # enough for the largest exponent: 2**105 * 2/pi down to 2**-95
TWO_OVER_PI = _two_over_pi(TWO_OVER_PI_BITS)


def _sin_row(expfield: int) -> list[float]:
    """The four 24-bit chunks of 2/pi * 2**e below weight 4 (or from its leading bit when smaller)."""
    e = max(expfield, 1) - 150
    top = min(1, e - 1)                # weight of the chunks' leading bit
    out = []
    for i in range(4):
        low = top - 24 * i - 23        # weight of the chunk's lowest bit
        chunk = (TWO_OVER_PI >> (low - e + TWO_OVER_PI_BITS)) & 0xFFFFFF
        out.append(math.ldexp(chunk, low))
    return out


SIN_TABLE = tuple(w for ex in range(256) for w in _sin_row(ex))
SIN_TBL = Table("sin_tbl", SIN_TABLE)
# sin y = y + y**3 * P(y*y), cos y = 1 - y*y/2 + y**4 * Q(y*y) on |y| <= pi/4: P and Q fitted to the
# relative error of sin and cos (iteratively reweighted least squares towards minimax; coefficients
# rounded to float32 one at a time, the later ones refitted). Approximation error 4e-9 (sin), 1.2e-10 (cos).
SIN_POLY = (-0.16666655242443085, 0.008332189172506332, -0.00019518285989761353)
COS_POLY = (1.0, -0.5, 0.04166664555668831, -0.0013887310633435845, 2.4432561986031942e-05)
SIN_ABS_ERR = 1e-7
SIN_REL_ERR = 2e-7

# erf: erf(x) = x * S(x**2) for |x| < 1 (S: degree-6 relative least-squares fit of erf(x)/x in x**2
# on [0, 1], 1.2e-9 relative in float64), and erf(a) = 1 - 2**L(a - 2.5) for 1 <= a (L: degree-10
# fit of log2(erfc(a)) on [1, 4], 6e-9 absolute; a clamped to 4, where erfc is 1.5e-8 and erf
# rounds to 1). log2(erfc) is smooth where erfc itself spans 8 decades, so one short polynomial
# covers the whole tail; the small branch keeps erf's relative accuracy down to the subnormals
# (erf(1e-11) = 1.128e-11, where 1 - erfc(x) would give 0). Coefficients rounded to float32; fitted
# with numpy (least squares on Chebyshev nodes, iteratively reweighted toward minimax). Measured
# with float32 Horner over 2M points in [-6, 6] and 3,100 decades-spaced points in [1e-30, 1]:
# at most 2.4 ulp against float64 erf (3.4 with this module's exp2).
ERF_SMALL = (1.1283791065216064, -0.3761262595653534, 0.1128358244895935, -0.026853693649172783,
             0.00518810236826539, -0.0008008221630007029, 7.847365486668423e-05)
ERF_LARGE = (-11.262853622436523, -7.722285747528076, -1.361750841140747, -0.015664977952837944,
             0.003124405164271593, -0.0006070212693884969, 0.00011073258792748675, -1.8679354980122298e-05,
             2.799454478008556e-06, -1.031310290500187e-07, -8.39203977420766e-08)
ERF_ULP = 4.0                            # the bound tests/test_transcendental.py checks, in float32 ulp


# ------------------------------------------------------------------ building loop IR
@dataclass(frozen=True)
class Val:
    """A value being built: the id of the instruction that defines it, and its dtype."""
    id: int
    dtype: DType


Operand = Val | float | int          # a Python number is a CONST of the other operands' dtype


class Builder:
    """Appends loop-IR instructions to ``insts``; each method returns the value it defines."""

    def __init__(self, insts: list[LInst], native: Collection[str] = ()) -> None:
        self.insts = insts
        self.native = native             # ops the renderer has: a decomposition may use them as such

    def emit(self, op: str, dtype: DType, *src: Val, arg: object = None) -> Val:
        self.insts.append(LInst(op, dtype, tuple(s.id for s in src), arg))
        return Val(len(self.insts) - 1, dtype)

    def const(self, value: float | int, dtype: DType) -> Val:
        return self.emit("CONST", dtype, arg=value)

    def _vals(self, *xs: Operand) -> list[Val]:
        dts = {x.dtype for x in xs if isinstance(x, Val)}
        if len(dts) != 1:
            raise TypeError(f"operands must share one dtype, got {sorted(d.name for d in dts)}")
        (dt,) = dts
        return [x if isinstance(x, Val) else self.const(x, dt) for x in xs]

    def _same(self, op: str, *xs: Operand) -> Val:
        vs = self._vals(*xs)
        return self.emit(op, vs[0].dtype, *vs)

    def add(self, a: Operand, b: Operand) -> Val:
        return self._same("ADD", a, b)

    def sub(self, a: Operand, b: Operand) -> Val:
        """a - b as a + (-b), the same number in IEEE arithmetic (the loop IR has no SUB)."""
        if isinstance(b, Val):
            return self.add(a, self.neg(b))
        return self.add(a, -b)

    def mul(self, a: Operand, b: Operand) -> Val:
        return self._same("MUL", a, b)

    def muladd(self, a: Operand, b: Operand, c: Operand) -> Val:
        return self._same("MULADD", a, b, c)

    def neg(self, a: Val) -> Val:
        return self.emit("NEG", a.dtype, a)

    def floor(self, a: Val) -> Val:
        return self.emit("FLOOR", a.dtype, a)

    def rint(self, a: Val) -> Val:
        return self.emit("RINT", a.dtype, a)

    def and_(self, a: Operand, b: Operand) -> Val:
        return self._same("AND", a, b)

    def or_(self, a: Operand, b: Operand) -> Val:
        return self._same("OR", a, b)

    def xor(self, a: Operand, b: Operand) -> Val:
        return self._same("XOR", a, b)

    def shl(self, a: Val, n: int) -> Val:
        return self._same("SHL", a, n)

    def shr(self, a: Val, n: int) -> Val:
        return self._same("SHR", a, n)

    def lt(self, a: Operand, b: Operand) -> Val:
        vs = self._vals(a, b)
        return self.emit("CMPLT", bool_, *vs)

    def eq(self, a: Operand, b: Operand) -> Val:
        vs = self._vals(a, b)
        return self.emit("CMPEQ", bool_, *vs)

    def ne(self, a: Operand, b: Operand) -> Val:
        return self.neg(self.eq(a, b))

    def where(self, c: Val, a: Operand, b: Operand) -> Val:
        va, vb = self._vals(a, b)
        return self.emit("WHERE", va.dtype, c, va, vb)

    def cast(self, a: Val, dtype: DType) -> Val:
        return self.emit("CAST", dtype, a)

    def bitcast(self, a: Val, dtype: DType) -> Val:
        return self.emit("BITCAST", dtype, a)

    def table(self, t: Table, i: Val) -> Val:
        return self.emit("TABLE", FLOAT64, i, arg=t)

    def call(self, op: str, x: Val) -> Val:
        """``op`` applied to ``x``: the renderer's own instruction if it has one, else its decomposition."""
        if op in self.native:
            return self.emit(op, x.dtype, x)
        if x.dtype != float32:       # float16/bfloat16/float64: the float32 polynomial, rounded back once
            return self.cast(DECOMPOSITIONS[op](self, self.cast(x, float32)), x.dtype)
        return DECOMPOSITIONS[op](self, x)

    def horner(self, x: Val, coeffs: tuple[float, ...]) -> Val:
        """sum coeffs[k] * x**k, highest power first: acc * x + c, each step a MULADD."""
        acc = self.const(coeffs[-1], x.dtype)
        for c in reversed(coeffs[:-1]):
            acc = self.muladd(acc, x, c)
        return acc


# ------------------------------------------------------------------ the decompositions
def xexp2(b: Builder, x: Val) -> Val:
    """2**x for float32 x: 2**floor(x) built as exponent bits, 2**frac(x) by EXP2_POLY; x clamped
    to [-127, 128] (0 below, inf above), NaN passes through (the polynomial is NaN)."""
    hi = b.where(b.lt(128.0, x), 128.0, x)
    xc = b.where(b.lt(hi, -127.0), -127.0, hi)
    fl = b.floor(xc)
    p = b.horner(b.sub(xc, fl), EXP2_POLY)
    bits = b.shl(b.bitcast(b.add(fl, EXP2_MAGIC), int32), 23)
    return b.mul(p, b.bitcast(bits, float32))


def xlog2(b: Builder, x: Val) -> Val:
    """log2(x) for float32 x: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log2(m) = t * Q(t) for
    t = m - 1; a subnormal x is scaled by 2**23 first."""
    sub = b.lt(x, 2.0 ** -126)
    bits = b.bitcast(b.where(sub, b.mul(x, 2.0 ** 23), x), int32)
    e = b.add(b.shr(bits, 23), -127)
    m = b.bitcast(b.or_(b.and_(bits, 8388607), 1065353216), float32)
    big = b.lt(SQRT2_F32, m)
    m2 = b.where(big, b.mul(m, 0.5), m)
    # + (sub ? -23 : +0) rather than - (sub ? 23 : 0): the same numbers, and a select of +0 is a bit mask
    ef = b.add(b.cast(b.add(e, b.cast(big, int32)), float32), b.where(sub, b.const(-23.0, float32), 0.0))
    t = b.sub(m2, 1.0)
    r = b.muladd(b.horner(t, LOG2_POLY), t, ef)
    r = b.where(b.eq(x, 0.0), -math.inf, r)
    r = b.where(b.eq(x, math.inf), x, r)
    nan_or_neg = b.or_(b.lt(x, 0.0), b.ne(x, x))
    return b.where(nan_or_neg, math.nan, r)


def xsin(b: Builder, x: Val) -> Val:
    """sin(x) for float32 x: the Payne-Hanek reduction above, in double, from SIN_TABLE, then
    SIN_POLY / COS_POLY in float; the quadrant picks sin or cos and the sign."""
    bits = b.bitcast(x, int32)
    sign = b.and_(bits, -2 ** 31)
    ex = b.and_(b.shr(bits, 23), 255)
    mant = b.and_(bits, 8388607)
    m = b.cast(b.where(b.ne(ex, 0), b.or_(mant, 8388608), mant), FLOAT64)
    row = b.shl(ex, 2)
    v = [b.mul(m, b.table(SIN_TBL, b.add(row, i) if i else row)) for i in range(4)]     # exact
    v0 = b.sub(v[0], b.mul(b.floor(b.mul(v[0], 0.25)), 4.0))      # v0 mod 4, exact
    a = b.add(v0, v[1])                                            # exact: < 8, a multiple of 2**-46
    n = b.rint(b.add(a, v[2]))
    r = b.add(b.add(b.sub(a, n), v[2]), v[3])                      # the first difference is exact
    y = b.cast(b.mul(r, math.pi / 2), float32)
    z = b.mul(y, y)
    sn = b.muladd(b.mul(z, y), b.horner(z, SIN_POLY), y)
    cs = b.horner(z, COS_POLY)
    # n in [0, 8] (finite for inf/NaN too) as an int: float32(n) + 2**23 holds n in its low mantissa
    # bits -- the exp2 trick; a vector double -> int32 conversion that saturates is scalarized on AVX2
    q = b.bitcast(b.add(b.cast(n, float32), 2.0 ** 23), int32)
    res = b.where(b.ne(b.and_(q, 1), 0), cs, sn)
    flip = b.xor(b.shl(b.and_(q, 2), 30), sign)                    # n mod 4 in {2, 3}: negate; sin(-x) = -sin(x)
    res = b.bitcast(b.xor(b.bitcast(res, int32), flip), float32)
    return b.where(b.eq(ex, 255), math.nan, res)                   # inf, NaN


def xerf(b: Builder, x: Val) -> Val:
    """erf(x) for float32 x: ERF_SMALL below |x| = 1, 1 - 2**ERF_LARGE above, with x's sign;
    erf(-0) = -0, erf(+-inf) = +-1, NaN -> NaN."""
    bits = b.bitcast(x, int32)
    a = b.bitcast(b.and_(bits, 2 ** 31 - 1), float32)
    small = b.mul(x, b.horner(b.mul(x, x), ERF_SMALL))
    tail = b.sub(1.0, b.call("EXP2", b.horner(b.sub(b.where(b.lt(4.0, a), 4.0, a), 2.5), ERF_LARGE)))
    tail = b.bitcast(b.xor(b.bitcast(tail, int32), b.and_(bits, -2 ** 31)), float32)     # x's sign
    return b.where(b.ne(x, x), x, b.where(b.lt(a, 1.0), small, tail))


Decomposition = Callable[[Builder, Val], Val]
DECOMPOSITIONS: dict[str, Decomposition] = {"EXP2": xexp2, "LOG2": xlog2, "SIN": xsin, "ERF": xerf}


def decomposed_for(native: Collection[str]) -> set[str]:
    """The ops a renderer whose table holds ``native`` gets as decompositions."""
    return {op for op in DECOMPOSITIONS if op not in native}


def libm64(op: str) -> str | None:
    """The C library's double function for a float64 ``op`` that has a decomposition here (the
    decompositions are float32 algorithms: a float64 instruction is left to the renderer, which
    calls this), None for any other op."""
    return OPS[op].libm if op in DECOMPOSITIONS else None


def decompose(k: LoopKernel, native: Collection[str]) -> LoopKernel:
    """``k`` with every float32 (or float16/bfloat16, computed in float32) instruction whose op has a
    decomposition but is not in ``native`` rewritten into it (``k`` itself when there is none);
    instruction ids are renumbered (``row_loops`` with them), nothing else moves. float64 instructions stay: the renderer
    calls the C library's double function for them (``libm64``)."""
    todo = decomposed_for(native)
    if not any(x.op in todo and x.dtype != FLOAT64 for x in k.insts):
        return k
    insts: list[LInst] = []
    b = Builder(insts, native)
    new: list[int] = []                    # old id -> new id
    for x in k.insts:
        if x.op in todo and x.dtype != FLOAT64:
            if x.dtype == float32:
                new.append(DECOMPOSITIONS[x.op](b, Val(new[x.src[0]], float32)).id)
            elif x.dtype in (float16, bfloat16):     # in float32, rounded once to the narrow type
                wide = b.cast(Val(new[x.src[0]], x.dtype), float32)
                new.append(b.cast(DECOMPOSITIONS[x.op](b, wide), x.dtype).id)
            else:
                raise TypeError(f"{x.op} is decomposed for float32, float16 and bfloat16, got {x.dtype}")
        else:
            insts.append(replace(x, src=tuple(new[s] for s in x.src)))
            new.append(len(insts) - 1)
    return replace(k, insts=insts, row_loops=frozenset(new[r] for r in k.row_loops))
