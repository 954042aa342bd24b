"""The LLVM device (the default): loop IR -> LLVM IR text -> llvmlite (O3, host CPU) -> ctypes call.

Renderer: ``render_llvm`` is a table from op to LLVM instructions (``ALU``), one entry per ALU op
of the op table (``tests/test_optable.py`` checks coverage). Values are SSA; loop counters and
accumulators are ``alloca``s that LLVM's mem2reg promotes. Bools are ``i1`` in registers and
``i8`` in memory. Float constants are written as exact hex doubles. Integer division and modulo
guard against division by zero (result 0) and INT_MIN / -1, which are undefined in LLVM. Index
division is floor division (``sdiv``/``srem`` plus a fix-up of a negative remainder), or a bare
``sdiv``/``srem`` where the loop IR marks the numerator non-negative (``loopir.NONNEG``).
Sum accumulators carry the ``reassoc`` flag so LLVM may vectorize reductions (the summation order
then differs from a sequential loop, within float tolerance).
"""
from __future__ import annotations

import ctypes
import math
import re
import struct
import threading
from typing import Any

import numpy as np

from eqgrad.dtype import DType, bool_, float32, int32
from eqgrad.graph.loopir import INDEX, NONNEG, LInst, LoopKernel

LT = {"float32": "float", "int32": "i32", "bool": "i1", INDEX: "i64"}     # register types
MT = {"float32": "float", "int32": "i32", "bool": "i8"}                    # memory types


def _name(dt: Any) -> str:
    return dt if isinstance(dt, str) else dt.name


def _const(v: Any, dt: Any) -> str:
    n = _name(dt)
    if n == "float32":
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(np.float32(v))))[0]
    if n == "bool":
        return "true" if v else "false"
    return str(int(v))


class _Ctx:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.decls: set[str] = set()

    def tmp(self) -> str:
        self.n += 1
        return f"%t{self.n}"

    def __call__(self, rhs: str) -> str:
        t = self.tmp()
        self.lines.append(f"  {t} = {rhs}")
        return t


def _intrinsic(c: _Ctx, name: str, ty: str, *args: str) -> str:
    c.decls.add(f"declare {ty} @{name}({', '.join(ty for _ in args)})")
    return c(f"call {ty} @{name}({', '.join(f'{ty} {a}' for a in args)})")


# ------------------------------------------------------------------ vectorizable exp2 / log2
# libm's exp2f/log2f are scalar calls that stop LLVM from vectorizing a loop; these are straight-line
# IR that vectorizes. Error bounds (tests/test_transcendental.py checks them against NumPy):
#   exp2: relative error < 4e-7 for x in [-126, 128]; 0 below -127 (NumPy gives subnormals there,
#         absolute error < 1.2e-38); inf above 128; NaN -> NaN.
#   log2: absolute error < 2e-7 for every finite x > 0, subnormals included; 0 -> -inf,
#         x < 0 -> NaN, inf -> inf, NaN -> NaN.
EXP2_POLY = (1.0, 0.6931470036506653, 0.2402298003435135, 0.05548352375626564,
             0.009678472764790058, 0.0012443081941455603, 0.00021690608991775662)   # 2**f on [0, 1)
# log2(1+t) = t * Q(t) for t = m-1 in [sqrt(1/2)-1, sqrt(2)-1]: Q is a degree-8 Chebyshev
# least-squares fit of log2(1+t)/t, rounded to float32 (max error 7.7e-8 with float32 Horner).
# A polynomial in t instead of the classic atanh series in s = (m-1)/(m+1) saves the division,
# which on AVX-512 is the longest-latency instruction of the loop.
LOG2_POLY = (1.4426950216293335, -0.721347451210022, 0.48090794682502747, -0.3606933057308197,
             0.28800520300865173, -0.2392456978559494, 0.2150873988866806, -0.20480544865131378,
             0.12453901767730713)
# 2**n for an integer-valued float n in [-127, 128]: n + (1.5 * 2**23 + 127) holds n + 127 in the
# low mantissa bits, which shifted left by 23 are the biased exponent (no float->int conversion,
# which would be poison for NaN; 2**-127 gives 0, 2**128 gives inf).
EXP2_MAGIC = 12583039.0


def _f(v: float) -> str:
    return _const(v, "float32")


def _horner(c: _Ctx, x: str, coeffs: tuple[float, ...]) -> str:
    acc = _f(coeffs[-1])
    for k in reversed(coeffs[:-1]):
        prod = c(f"fmul contract float {acc}, {x}")
        acc = c(f"fadd contract float {prod}, {_f(k)}")
    return acc


def _exp2(c: _Ctx, x: str) -> str:
    gt = c(f"fcmp ogt float {x}, 128.0")
    hi = c(f"select i1 {gt}, float 128.0, float {x}")
    lt = c(f"fcmp olt float {hi}, -127.0")
    xc = c(f"select i1 {lt}, float -127.0, float {hi}")
    c.decls.add("declare float @llvm.floor.f32(float)")
    fl = c(f"call float @llvm.floor.f32(float {xc})")
    frac = c(f"fsub float {xc}, {fl}")
    p = _horner(c, frac, EXP2_POLY)
    biased = c(f"fadd float {fl}, {_f(EXP2_MAGIC)}")           # NaN stays NaN: p is NaN then
    bits = c(f"bitcast float {biased} to i32")
    bits = c(f"shl i32 {bits}, 23")
    scale = c(f"bitcast i32 {bits} to float")
    return c(f"fmul float {p}, {scale}")


def _log2(c: _Ctx, x: str) -> str:
    # x = m * 2**e with m in [sqrt(1/2), sqrt(2)); log2(m) = t * Q(t), t = m - 1
    sub = c(f"fcmp olt float {x}, 0x3810000000000000")                # below 2**-126: rescale
    scaled = c(f"fmul float {x}, 0x4160000000000000")                 # * 2**23
    xs = c(f"select i1 {sub}, float {scaled}, float {x}")
    bits = c(f"bitcast float {xs} to i32")
    ebits = c(f"lshr i32 {bits}, 23")
    e = c(f"sub i32 {ebits}, 127")
    mbits = c(f"and i32 {bits}, 8388607")
    mbits = c(f"or i32 {mbits}, 1065353216")
    m = c(f"bitcast i32 {mbits} to float")
    big = c(f"fcmp ogt float {m}, 0x3FF6A09E60000000")               # sqrt(2)
    half = c(f"fmul float {m}, 0.5")
    m2 = c(f"select i1 {big}, float {half}, float {m}")
    inc = c(f"zext i1 {big} to i32")
    e2 = c(f"add i32 {e}, {inc}")
    ef0 = c(f"sitofp i32 {e2} to float")
    corr = c(f"select i1 {sub}, float 23.0, float 0.0")
    ef = c(f"fsub float {ef0}, {corr}")
    t = c(f"fsub float {m2}, 1.0")
    poly = _horner(c, t, LOG2_POLY)
    tq = c(f"fmul contract float {poly}, {t}")
    r = c(f"fadd contract float {ef}, {tq}")
    zero = c(f"fcmp oeq float {x}, 0.0")
    r = c(f"select i1 {zero}, float 0xFFF0000000000000, float {r}")
    inf = c(f"fcmp oeq float {x}, 0x7FF0000000000000")
    r = c(f"select i1 {inf}, float {x}, float {r}")
    neg = c(f"fcmp ult float {x}, 0.0")                                # also true for NaN
    return c(f"select i1 {neg}, float 0x7FF8000000000000, float {r}")


# ------------------------------------------------------------------ vectorizable sin
# libm's sinf is a scalar call as well. This is straight-line IR, exact enough in its range reduction
# for every finite float (its table lookups vectorize as gathers). Error bounds, against NumPy's float64
# sin of the float32 input (tests/test_transcendental.py checks them on every device):
#   absolute error < SIN_ABS_ERR = 1e-7 and relative error < SIN_REL_ERR = 2e-7 for every finite x
#   (x close to a multiple of pi keeps its relative accuracy); sin(-0) = -0, a subnormal x gives x,
#   inf and NaN give NaN. Measured over every float32 (with FMA contraction, AVX-512): absolute
#   7.3e-8 (x = 3829304576), relative 1.21e-7 (x = 3.3882929e38), 1.54 ulp at most. The bounds
#   also hold for NumPy's own float32 sin (relative 1.55e-7 measured).
# Range reduction (Payne-Hanek, in double): |x| = m * 2**e, m a 24-bit integer (e = max(expfield, 1) - 150).
# |x| * 2/pi = m * F, F = 2/pi * 2**e; since m is an integer, the bits of F of weight >= 4 only add
# multiples of 4 (which leave sin unchanged) and are dropped. The next 96 bits of F, from weight
# 2**min(1, e - 1) (F's leading bit when F < 4) down, are four 24-bit chunks W_0..W_3:
# SIN_TABLE[4 * expfield + i]. v_i = m * W_i are exact (48-bit products); v0 < 2**26 is reduced mod 4
# exactly, v1 < 4, v2 < 2**-22, v3 < 2**-46, and the dropped rest is below 2**-70. n is the integer
# nearest to v0 mod 4 + v1 + v2, and r = ((v0 mod 4 + v1) - n) + v2 + v3 in [-1/2, 1/2] (the first
# difference is exact, so r keeps ~52 bits even when it is tiny); then |x| = (4k + n) pi/2 + y with
# y = r * pi/2 in [-pi/4, pi/4], and sin |x| is sin y, cos y, -sin y, -cos y for n mod 4 = 0, 1, 2, 3.


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
# sin y = y + y**3 * P(y*y), cos y = 1 - y*y/2 + y**4 * Q(y*y) on |y| <= pi/4: P and Q fitted to the
# relative error of sin and cos (iteratively reweighted least squares towards minimax; coefficients
# rounded to float32 one at a time, the later ones refitted). Approximation error 4e-9 (sin), 1.2e-10 (cos).
SIN_POLY = (-0.16666655242443085, 0.008332189172506332, -0.00019518285989761353)
COS_POLY = (1.0, -0.5, 0.04166664555668831, -0.0013887310633435845, 2.4432561986031942e-05)
SIN_ABS_ERR = 1e-7
SIN_REL_ERR = 2e-7


def _dbl(v: float) -> str:
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", v))[0]


_SIN_TBL = ("@sin_tbl = private unnamed_addr constant [1024 x double] ["
            + ", ".join(f"double {_dbl(w)}" for w in SIN_TABLE) + "]")


def _sin(c: _Ctx, x: str) -> str:
    c.decls.update((_SIN_TBL, "declare double @llvm.floor.f64(double)", "declare double @llvm.roundeven.f64(double)"))
    bits = c(f"bitcast float {x} to i32")
    sign = c(f"and i32 {bits}, -2147483648")
    ex = c(f"lshr i32 {bits}, 23")
    ex = c(f"and i32 {ex}, 255")
    mant = c(f"and i32 {bits}, 8388607")
    normal = c(f"icmp ne i32 {ex}, 0")
    withbit = c(f"or i32 {mant}, 8388608")
    mi = c(f"select i1 {normal}, i32 {withbit}, i32 {mant}")
    m = c(f"uitofp i32 {mi} to double")
    row = c(f"shl nuw nsw i32 {ex}, 2")
    row = c(f"zext i32 {row} to i64")
    v = []
    for i in range(4):                                  # gathers from the table
        idx = c(f"add nuw nsw i64 {row}, {i}") if i else row
        p = c(f"getelementptr inbounds [1024 x double], ptr @sin_tbl, i64 0, i64 {idx}")
        w = c(f"load double, ptr {p}")
        v.append(c(f"fmul double {m}, {w}"))            # exact
    quarter = c(f"fmul double {v[0]}, 0.25")
    fl = c(f"call double @llvm.floor.f64(double {quarter})")
    four = c(f"fmul double {fl}, 4.0")
    v0 = c(f"fsub double {v[0]}, {four}")               # v0 mod 4, exact
    a = c(f"fadd double {v0}, {v[1]}")                  # exact: < 8, a multiple of 2**-46
    s = c(f"fadd double {a}, {v[2]}")
    n = c(f"call double @llvm.roundeven.f64(double {s})")
    r = c(f"fsub double {a}, {n}")                      # exact
    r = c(f"fadd double {r}, {v[2]}")
    r = c(f"fadd double {r}, {v[3]}")
    yd = c(f"fmul double {r}, {_dbl(math.pi / 2)}")
    y = c(f"fptrunc double {yd} to float")
    z = c(f"fmul contract float {y}, {y}")
    y3 = c(f"fmul contract float {z}, {y}")
    ps = _horner(c, z, SIN_POLY)
    ps = c(f"fmul contract float {y3}, {ps}")
    sn = c(f"fadd contract float {y}, {ps}")
    cs = _horner(c, z, COS_POLY)
    q = c(f"fptosi double {n} to i32")                   # n in [0, 8]: finite for inf/NaN too
    odd = c(f"and i32 {q}, 1")
    odd = c(f"icmp ne i32 {odd}, 0")
    res = c(f"select i1 {odd}, float {cs}, float {sn}")
    flip = c(f"and i32 {q}, 2")                          # n mod 4 in {2, 3}: negate
    flip = c(f"shl i32 {flip}, 30")
    flip = c(f"xor i32 {flip}, {sign}")                  # sin(-x) = -sin(x)
    rb = c(f"bitcast float {res} to i32")
    rb = c(f"xor i32 {rb}, {flip}")
    res = c(f"bitcast i32 {rb} to float")
    special = c(f"icmp eq i32 {ex}, 255")               # inf, NaN
    return c(f"select i1 {special}, float 0x7FF8000000000000, float {res}")


def _max(c: _Ctx, k: str, ty: str, a: str, b: str) -> str:
    if k == "float32":     # NaN-propagating, like NumPy's maximum (and vectorizable as a reduction)
        c.decls.add("declare float @llvm.maximum.f32(float, float)")
        return c(f"call float @llvm.maximum.f32(float {a}, float {b})")
    if k == "bool":
        return c(f"or i1 {a}, {b}")
    return c(f"select i1 {c(f'icmp sgt {ty} {a}, {b}')}, {ty} {a}, {ty} {b}")


def _div_guarded(c: _Ctx, ty: str, a: str, b: str, instr: str, index: bool, nonneg: bool = False) -> str:
    if index:     # index arithmetic divides by positive constants only, with floor semantics (loopir.py)
        q = c(f"{instr} {ty} {a}, {b}")
        if nonneg:               # the numerator is proven >= 0: truncation is floor
            return q
        r = q if instr == "srem" else c(f"srem {ty} {a}, {b}")
        neg = c(f"icmp slt {ty} {r}, 0")            # a negative remainder: truncation rounded up
        fixed = c(f"add {ty} {r}, {b}") if instr == "srem" else c(f"sub {ty} {q}, 1")
        return c(f"select i1 {neg}, {ty} {fixed}, {ty} {q}")
    zero = c(f"icmp eq {ty} {b}, 0")
    m1 = c(f"icmp eq {ty} {b}, -1")
    bad = c(f"or i1 {zero}, {m1}")
    safe = c(f"select i1 {bad}, {ty} 1, {ty} {b}")
    q = c(f"{instr} {ty} {a}, {safe}")
    special = c(f"sub {ty} 0, {a}") if instr == "sdiv" else "0"       # x / -1 = -x (wraps), x % -1 = 0
    q = c(f"select i1 {m1}, {ty} {special}, {ty} {q}")
    return c(f"select i1 {zero}, {ty} 0, {ty} {q}")


def _cast(c: _Ctx, a: str, src: str, dst: str) -> str:
    if src == dst:
        return a
    ts, td = LT[src], LT[dst]
    if src == "float32":
        if dst == "bool":
            return c(f"fcmp une float {a}, 0.0")
        c.decls.add(f"declare {td} @llvm.fptosi.sat.{td}.f32(float)")
        return c(f"call {td} @llvm.fptosi.sat.{td}.f32(float {a})")
    if dst == "float32":
        return c(f"{'uitofp' if src == 'bool' else 'sitofp'} {ts} {a} to float")
    if dst == "bool":
        return c(f"icmp ne {ts} {a}, 0")
    if src == "bool":
        return c(f"zext i1 {a} to {td}")
    return c(f"{'sext' if LT[dst] == 'i64' else 'trunc'} {ts} {a} to {td}")


def _alu(c: _Ctx, op: str, k: str, ty: str, a: list[str], index: bool = False, nonneg: bool = False) -> str:
    f, b = k == "float32", k == "bool"
    if op == "NEG":
        return c(f"fneg float {a[0]}") if f else c(f"xor i1 {a[0]}, true") if b else c(f"sub {ty} 0, {a[0]}")
    if op == "EXP2":
        return _exp2(c, a[0])
    if op == "LOG2":
        return _log2(c, a[0])
    if op == "SIN":
        return _sin(c, a[0])
    if op in ("SQRT", "TRUNC"):
        return _intrinsic(c, f"llvm.{op.lower()}.f32", "float", a[0])
    if op == "RECIP":
        return c(f"fdiv float 1.0, {a[0]}")
    if op == "ADD":
        return c(f"fadd contract float {a[0]}, {a[1]}") if f else c(f"or i1 {a[0]}, {a[1]}") if b else c(f"add {ty} {a[0]}, {a[1]}")
    if op == "MUL":
        return c(f"fmul contract float {a[0]}, {a[1]}") if f else c(f"and i1 {a[0]}, {a[1]}") if b else c(f"mul {ty} {a[0]}, {a[1]}")
    if op == "MAX":
        return _max(c, k, ty, a[0], a[1])
    if op == "CMPLT":
        if b:
            return c(f"and i1 {c(f'xor i1 {a[0]}, true')}, {a[1]}")
        return c(f"fcmp olt float {a[0]}, {a[1]}") if f else c(f"icmp slt {ty} {a[0]}, {a[1]}")
    if op == "CMPEQ":
        return c(f"fcmp oeq float {a[0]}, {a[1]}") if f else c(f"icmp eq {ty} {a[0]}, {a[1]}")
    if op == "IDIV":
        return _div_guarded(c, ty, a[0], a[1], "sdiv", index, nonneg)
    if op == "MOD":
        return _div_guarded(c, ty, a[0], a[1], "srem", index, nonneg)
    if op in ("AND", "OR", "XOR"):
        return c(f"{op.lower()} {ty} {a[0]}, {a[1]}")
    if op == "WHERE":
        return c(f"select i1 {a[0]}, {ty} {a[1]}, {ty} {a[2]}")
    raise NotImplementedError(f"LLVM renderer: no rule for {op}")


# ops the renderer implements (checked against the op table by the tests)
ALU = ("NEG", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "TRUNC", "CAST", "ADD", "MUL", "MAX", "CMPLT", "CMPEQ",
       "IDIV", "MOD", "AND", "OR", "XOR", "WHERE")


def render_llvm(k: LoopKernel) -> str:
    c = _Ctx()
    val: dict[int, str] = {}
    kinds: dict[int, str] = {}
    allocas: list[str] = []
    args = ", ".join(f"ptr noalias {'' if w else 'readonly '}%p{i}" for i, (_, _, w) in enumerate(k.params))
    # every kernel takes [lo, hi) of its outermost parallel loop, so the runtime can split it
    # across threads (a kernel without parallel loops ignores them)
    args += ", i64 %lo, i64 %hi"
    split = k.parallel_ranges()[0] if k.parallel else None
    open_loops: list[int] = []
    # innermost loops with a long body of independent iterations get a forced interleave count:
    # LLVM's own choice for znver4 is 1, which leaves the out-of-order window too small to overlap
    # the long dependency chains of exp2/log2 across iterations (elementwise chain: -15% time)
    inner = _interleaved_loops(k) if k.loop_vectorize else set()
    for i, x in enumerate(k.insts):
        kd = _name(x.dtype) if x.dtype is not None else None
        if x.op == "PARAM":
            val[i] = f"%p{x.arg}"
            kinds[i] = _name(x.dtype)
        elif x.op == "CONST":
            val[i] = _const(x.arg, x.dtype)
            kinds[i] = kd
        elif x.op == "RANGE":
            allocas.append(f"  %r{i}.p = alloca i64")
            start, end = ("%lo", "%hi") if i == split else ("0", str(x.arg))
            c.lines += [f"  store i64 {start}, ptr %r{i}.p", f"  br label %L{i}.cond", f"L{i}.cond:",
                        f"  %r{i} = load i64, ptr %r{i}.p", f"  %r{i}.c = icmp slt i64 %r{i}, {end}",
                        f"  br i1 %r{i}.c, label %L{i}.body, label %L{i}.exit", f"L{i}.body:"]
            val[i], kinds[i] = f"%r{i}", INDEX
            open_loops.append(i)
        elif x.op == "ENDRANGE":
            r = x.src[0]
            c.lines += [f"  %r{r}.n = add nuw nsw i64 %r{r}, 1", f"  store i64 %r{r}.n, ptr %r{r}.p",
                        f"  br label %L{r}.cond, !llvm.loop {'!3' if r in inner else '!0'}", f"L{r}.exit:"]
            open_loops.pop()
        elif x.op == "DEFACC":
            ty = LT[kd]
            allocas.append(f"  %a{i} = alloca {ty}")
            c.lines.append(f"  store {ty} {_const(x.arg, x.dtype)}, ptr %a{i}")
            val[i], kinds[i] = f"%a{i}", kd
        elif x.op == "ACCUM":
            acc, v = x.src
            kd = kinds[acc]
            ty = LT[kd]
            cur = c(f"load {ty}, ptr {val[acc]}")
            if x.arg == "ADD":
                new = c(f"fadd reassoc nsz contract float {cur}, {val[v]}") if kd == "float32" else \
                    c(f"or i1 {cur}, {val[v]}") if kd == "bool" else c(f"add {ty} {cur}, {val[v]}")
            else:
                new = _max(c, kd, ty, cur, val[v])
            c.lines.append(f"  store {ty} {new}, ptr {val[acc]}")
        elif x.op == "ACCREAD":
            val[i] = c(f"load {LT[kd]}, ptr {val[x.src[0]]}")
            kinds[i] = kd
        elif x.op == "LOAD":
            p, idx = x.src
            ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {val[p]}, i64 {val[idx]}")
            v = c(f"load {MT[kd]}, ptr {ptr}")
            val[i] = c(f"trunc i8 {v} to i1") if kd == "bool" else v
            kinds[i] = kd
        elif x.op == "STORE":
            p, idx, v = x.src
            kd = kinds[v]
            ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {val[p]}, i64 {val[idx]}")
            sv = c(f"zext i1 {val[v]} to i8") if kd == "bool" else val[v]
            c.lines.append(f"  store {MT[kd]} {sv}, ptr {ptr}")
        elif x.op == "CAST":
            val[i] = _cast(c, val[x.src[0]], kinds[x.src[0]], kd)
            kinds[i] = kd
        else:
            # ALU: the operand kind decides the instruction (CMP* produce bool from any kind)
            opk = kinds[x.src[1]] if x.op == "WHERE" else kinds[x.src[0]]
            val[i] = _alu(c, x.op, opk, LT[opk], [val[s] for s in x.src], index=opk == INDEX,
                          nonneg=x.arg == NONNEG)
            kinds[i] = kd
    body = "\n".join(c.lines)
    return (f"; kernel {k.name}\n" + "\n".join(sorted(c.decls)) + "\n\n"
            f"define void @{k.name}({args}) nounwind {{\nentry:\n" + "\n".join(allocas) + "\n"
            f"{body}\n  ret void\n}}\n\n" + _LOOP_MD[k.loop_vectorize])


INTERLEAVE = 4            # forced interleave count of long innermost loops
INTERLEAVE_MIN_TRIP = 1024


def _interleaved_loops(k: LoopKernel) -> set[int]:
    """Innermost loops (no RANGE inside) with a static trip count of at least INTERLEAVE_MIN_TRIP."""
    out, stack = set(), []
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            if stack: stack[-1][1] = False
            stack.append([i, True])
        elif x.op == "ENDRANGE":
            r, innermost = stack.pop()
            if innermost and isinstance(k.insts[r].arg, int) and k.insts[r].arg >= INTERLEAVE_MIN_TRIP:
                out.add(r)
    return out


# loop metadata: with explicit lanes the loop vectorizer must stay off (it would vectorize the
# reduce loop with gathers); the SLP vectorizer packs the lanes instead. !3 marks interleaved loops.
_LOOP_MD = {
    True: ('!0 = distinct !{!0, !1}\n!1 = !{!"llvm.loop.mustprogress"}\n'
           f'!2 = !{{!"llvm.loop.interleave.count", i32 {INTERLEAVE}}}\n!3 = distinct !{{!3, !1, !2}}\n'),
    False: '!0 = distinct !{!0, !1, !2}\n!1 = !{!"llvm.loop.mustprogress"}\n!2 = !{!"llvm.loop.vectorize.width", i32 1}\n',
}


# ------------------------------------------------------------------ compiler and runtime

class LLVMCompiler:
    """Compiles LLVM IR text for the host CPU at O3 into ONE MCJIT engine (kept alive).

    Every program is its own module, added to the engine, with its function renamed uniquely.
    (An llvmlite engine takes ownership of the target machine it is created with, so engines must
    never share one: two engines freeing one target machine corrupt the heap.)"""

    _lock = threading.Lock()
    _initialized = False

    def __init__(self) -> None:
        import llvmlite.binding as llvm
        self.llvm = llvm
        with LLVMCompiler._lock:
            if not LLVMCompiler._initialized:
                llvm.initialize_native_target()
                llvm.initialize_native_asmprinter()
                LLVMCompiler._initialized = True
        self.tm = self._target_machine()                 # for the optimization pipeline
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._target_machine())
        self.count = 0
        self.nontemporal_stores = 0      # of the last module compiled with nontemporal=True

    def _target_machine(self):
        llvm = self.llvm
        return llvm.Target.from_default_triple().create_target_machine(
            opt=3, cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            codemodel="jitdefault")

    def compile(self, src: str, name: str, nontemporal: bool = False) -> int:
        """Optimize (O3, host CPU) and add to the engine; returns the function's address.
        ``nontemporal``: see ``streaming_store`` (the caller guarantees the alignment it claims)."""
        llvm = self.llvm
        self.count += 1
        unique = f"{name}_{self.count}"
        mod = llvm.parse_assembly(src.replace(f"@{name}(", f"@{unique}("))
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        if nontemporal:
            text = str(mod)
            md = 1 + max((int(m) for m in re.findall(r"!(\d+)", text)), default=0)
            # a <N x float> store at a multiple of N from a 64-byte aligned base is 4N-byte aligned
            # (the vector width is the target's: 16 lanes with AVX-512, 8 with AVX2, 4 with SSE)
            text, hits = _VEC_STORE.subn(lambda m: f"{m[1]}, align {4 * int(m[2])}, !nontemporal !{md}", text)
            self.nontemporal_stores = hits
            if hits:
                mod = llvm.parse_assembly(text + f"\n!{md} = !{{i32 1}}\n")
                mod.verify()
        self.engine.add_module(mod)
        self.engine.finalize_object()
        return self.engine.get_function_address(unique)

    def assembly(self, src: str) -> str:
        mod = self.llvm.parse_assembly(src)
        return self.tm.emit_assembly(mod)


_compiler: LLVMCompiler | None = None


def compiler() -> LLVMCompiler:
    global _compiler
    if _compiler is None:
        _compiler = LLVMCompiler()
    return _compiler


# ------------------------------------------------------------------ streaming stores
# A large elementwise kernel writes its output once and never reads it back in the kernel: normal
# stores first read each output line into the cache (write-allocate), a third of the DRAM traffic
# of a 2-input kernel. Non-temporal stores skip that (measured: the 8-op chain on 16M floats,
# 7.9 -> 7.0 ms on two cores). x86 needs them aligned to the vector, which the loop vectorizer
# cannot know from scalar IR (it then refuses to vectorize), so they are added to the vectorized
# module's main-loop stores after optimization; the runtime guarantees the alignment they claim:
# outputs of NT_MIN bytes or more are page-aligned mappings (hostmem.py), the thread split cuts
# at multiples of 16 elements (cpu.py), and a misaligned output runs a plain copy of the kernel.
NT_MIN = 4 << 20
_VEC_STORE = re.compile(r"(store <(4|8|16) x (?:float|i32)> %[\w.]+, ptr %[\w.]+), align 4(?=\n)")


def streaming_store(k: LoopKernel, out_bytes: int) -> bool:
    """One parallel loop whose only store writes element ``i`` at iteration ``i`` (so vector stores
    from a loop start that is a multiple of 16 are 64-byte aligned), with an output of NT_MIN+ bytes."""
    ranges = [i for i, x in enumerate(k.insts) if x.op == "RANGE"]
    stores = [x for x in k.insts if x.op == "STORE"]
    return (k.loop_vectorize and k.parallel == 1 and len(ranges) == 1 and len(stores) == 1
            and stores[0].src[1] == ranges[0] and k.insts[ranges[0]].arg % 16 == 0
            and out_bytes >= NT_MIN and _name(k.params[0][1]) in ("float32", "int32"))


class LLVMProgram:
    def __init__(self, k: LoopKernel, src: str, nontemporal: bool = False):
        self.name, self.src, self.nontemporal = k.name, src, nontemporal
        self._sig = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(k.params)), ctypes.c_int64, ctypes.c_int64)
        self.fn = self._sig(compiler().compile(src, k.name, nontemporal))
        self.nontemporal_stores = compiler().nontemporal_stores if nontemporal else 0   # vector stores made NT
        self._plain = None if not nontemporal else False     # compiled on first misaligned output

    def __call__(self, *ptrs: int, lo: int, hi: int) -> None:
        """Run iterations [lo, hi) of the kernel's outermost parallel loop (ignored without one).
        With streaming stores, ``lo`` must be a multiple of 16 (cpu.py cuts so)."""
        if self.nontemporal and ptrs[0] % 64:
            if not self._plain:
                self._plain = self._sig(compiler().compile(self.src, self.name))
            self._plain(*ptrs, lo, hi)
            return
        self.fn(*ptrs, lo, hi)


_ = (DType, bool_, float32, int32, LInst)
