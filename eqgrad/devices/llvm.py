"""The LLVM device (the default): loop IR -> LLVM IR text -> llvmlite (O3, for EQGRAD_CPU) -> object code
(cached on disk: kernelcache.py) -> an MCJIT engine freed with its plans (CodeEngine) -> ctypes call.

Renderer: ``render_llvm`` renders each instruction by its rule in ``LLVM_OPS``, a table from op to
LLVM instructions (``tests/test_renderers.py`` checks that it covers every op it can be given);
exp2, log2 and sin have no rule and are decomposed first (``lower/decomp.py``): libm's calls are
scalar and stop the vectorizer. Values are SSA; loop counters and
accumulators are ``alloca``s that LLVM's mem2reg promotes. Bools are ``i1`` in registers and
``i8`` in memory. Float constants are written as exact hex doubles. Integer division and modulo
guard against division by zero (result 0) and INT_MIN / -1, which are undefined in LLVM. Index
division is floor division (``sdiv``/``srem`` plus a fix-up of a negative remainder), or a bare
``sdiv``/``srem`` where the loop IR marks the numerator non-negative (``loopir.NONNEG``).
Sum accumulators carry the ``reassoc`` flag so LLVM may vectorize reductions (the summation order
then differs from a sequential loop, within float tolerance), and not ``nsz``: with both, LLVM
folded ``acc + (x - x)`` to ``acc``, a sum of ``x - x`` to 0 where x holds inf or NaN (NumPy: NaN);
without ``nsz`` the sums vectorize the same (checked: <16 x float> accumulators on znver4).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import re
import struct
import sys
import threading
import weakref
from typing import Any, Callable

import llvmlite.binding as llvm
import numpy as np

from eqgrad.counters import GlobalCounters
from eqgrad.devices import kernelcache, llvm_worker
from eqgrad.devices.render import MissingRule, Operation
from eqgrad.dtype import DTYPES, cast_scalar
from eqgrad.errors import CompileError
from eqgrad.graph.caps import LANES_LAST
from eqgrad.graph.loopir import INDEX, LInst, LoopKernel, Table
from eqgrad.lower.decomp import decompose, libm64

# float16/bfloat16 are stored narrow (MT) and computed in float32 registers (LT), rounded back to
# their type after every op (_round_narrow): the values of NumPy's float16 arithmetic, whatever the
# CPU has (x86 without AVX512-FP16 has no half arithmetic); unsigned integers differ from the
# signed ones of their width only in the instructions (_UNSIGNED: udiv, icmp ult, zext, uitofp)
LT = {"float32": "float", "float64": "double", "float16": "float", "bfloat16": "float", "int8": "i8",
      "uint8": "i8", "int16": "i16", "int32": "i32", "uint32": "i32", "int64": "i64", "bool": "i1",
      INDEX: "i64"}                                                        # register types
MT = {**LT, "float16": "half", "bfloat16": "bfloat", "bool": "i8"}         # memory types
_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f32", "bfloat16": "f32"}   # of intrinsics' names
_NARROW = {"float16": "half", "bfloat16": "bfloat"}
_UNSIGNED = frozenset({"uint8", "uint32"})
_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}


def _name(dt: Any) -> str:
    return dt if isinstance(dt, str) else dt.name


def _dbl(v: float) -> str:
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", v))[0]


def _const(v: Any, dt: Any) -> str:
    n = _name(dt)
    if n == "float32":
        return _dbl(float(np.float32(v)))
    if n in _NARROW:           # its value in the float32 register that holds it
        return _dbl(cast_scalar(float(v), DTYPES[n]))
    if n == "float64":
        return _dbl(float(v))
    if n == "bool":
        return "true" if v else "false"
    if n in _UNSIGNED:         # LLVM's integer literals are signed
        return str(cast_scalar(int(v), DTYPES[n.removeprefix("u")]))
    return str(int(v))


def _round_narrow(c: "_Ctx", v: str, kd: str) -> str:
    """A float32 register value rounded to float16/bfloat16 (``kd``), still in a float32 register."""
    t = _NARROW[kd]
    return c(f"fpext {t} {_to_narrow(c, v, kd)} to float")


# Conversions to the narrow floats are written so that no target needs a library routine for them:
# x86 has no instruction for double -> half/bfloat, nor float -> bfloat without AVX512-BF16, and
# LLVM calls compiler-rt/libgcc (__truncdfhf2, __truncdfbf2, __truncsfbf2) there, which a JIT may
# not find (measured: a segfault on an AMD EPYC, Zen 4, whose process had no such symbol).

def _to_narrow(c: "_Ctx", v: str, kd: str) -> str:
    """The float register value ``v`` rounded to nearest (ties to even) into float16/bfloat16."""
    if kd == "float16":          # vcvtps2ph where F16C exists; else libgcc's __truncsfhf2 (_libcalls)
        return c(f"fptrunc float {v} to half")
    b = c(f"bitcast float {v} to i32")            # bfloat16 is float32's top half: round at bit 16
    hi = c(f"lshr i32 {b}, 16")
    lsb = c(f"and i32 {hi}, 1")
    bias = c(f"add i32 {lsb}, 32767")
    up = c(f"add i32 {b}, {bias}")
    quiet = c(f"or i32 {b}, 4194304")             # a NaN stays a NaN (its quiet bit set), never rounds to inf
    nan = c(f"fcmp uno float {v}, 0.0")
    pick = c(f"select i1 {nan}, i32 {quiet}, i32 {up}")
    top = c(f"lshr i32 {pick}, 16")
    h = c(f"trunc i32 {top} to i16")
    return c(f"bitcast i16 {h} to bfloat")


def _f64_to_narrow(c: "_Ctx", d: str, kd: str) -> str:
    """A double rounded once to float16/bfloat16: first to float32 rounding to odd (truncate toward
    zero, then set the last bit if anything was cut off), then to nearest. float32's 24 bits are
    at least twice the narrow type's precision plus 2, so the two steps round as one would."""
    t = c(f"fptrunc double {d} to float")
    back = c(f"fpext float {t} to double")
    inexact = c(f"fcmp one double {back}, {d}")   # false for NaN and for exact values
    # rounded away from zero (|t| > |d|): step the magnitude down one ulp; a float's magnitude is
    # its bits less the sign, so that is bits - 1 for either sign
    above = c(f"fcmp ogt double {back}, {d}")
    negative = c(f"fcmp olt double {d}, 0.0")
    away = c(f"xor i1 {above}, {negative}")
    bits = c(f"bitcast float {t} to i32")
    step = c(f"zext i1 {away} to i32")
    down = c(f"sub i32 {bits}, {step}")
    odd = c(f"or i32 {down}, 1")
    r = c(f"select i1 {inexact}, i32 {odd}, i32 {bits}")
    return _to_narrow(c, c(f"bitcast i32 {r} to float"), kd)


def _int_to_f64_odd(c: "_Ctx", a: str, ts: str, unsigned: bool) -> str:
    """An integer register value as a double: exact up to 53 bits; a wider i64 rounded to odd (as
    ``dtype.ints_to_f64_odd``), so that rounding it to nearest again rounds as the integer would."""
    conv = "uitofp" if unsigned else "sitofp"
    if _BITS[ts] < 64:
        return c(f"{conv} {ts} {a} to double")
    c.decls.add("declare i64 @llvm.ctlz.i64(i64, i1)")
    if unsigned:
        mag = a
    else:
        neg = c(f"icmp slt i64 {a}, 0")
        minus = c(f"sub i64 0, {a}")
        mag = c(f"select i1 {neg}, i64 {minus}, i64 {a}")     # -2**63 gives 2**63, read unsigned
    lz = c(f"call i64 @llvm.ctlz.i64(i64 {mag}, i1 false)")
    shift = _intrinsic(c, "llvm.smax.i64", "i64", c(f"sub i64 11, {lz}"), "0")    # bits beyond 53
    one = c(f"shl i64 1, {shift}")
    mask = c(f"sub i64 {one}, 1")
    cut = c(f"and i64 {mag}, {mask}")
    lost = c(f"icmp ne i64 {cut}, 0")
    keep = c(f"xor i64 {mask}, -1")
    top = c(f"and i64 {mag}, {keep}")
    odd = c(f"select i1 {lost}, i64 {one}, i64 0")
    kept = c(f"or i64 {top}, {odd}")
    f = c(f"uitofp i64 {kept} to double")             # exact
    if unsigned:
        return f
    fn = c(f"fneg double {f}")
    return c(f"select i1 {neg}, double {fn}, double {f}")


_LIBCALLS = ("__truncsfhf2", "__extendhfsf2")     # float <-> half on x86 without F16C (x86-64-v2)
_libcalls_done: list[Any] = []


def _own_bf16_routines() -> str:
    """IR for ``__truncsfbf2``/``__truncdfbf2`` (float/double -> bfloat16, one rounding to nearest
    even), written with the integer rounding above. LLVM's optimizer narrows a comparison or a
    select of widened bfloat16 values to bfloat16 itself (``fcmp ogt bfloat``), and a target without
    AVX512-BF16 legalizes that through a float and a call to ``__truncsfbf2``, which libgcc lacks
    (measured: celu in bfloat16 for x86-64-v2 segfaulted on an AMD EPYC)."""
    out = []
    for name, ty, conv in (("__truncsfbf2", "float", _to_narrow), ("__truncdfbf2", "double", _f64_to_narrow)):
        c = _Ctx()
        r = conv(c, "%x", "bfloat16")
        body = "\n".join(c.lines)
        out.append(f"define bfloat @{name}({ty} %x) {{\n{body}\n  ret bfloat {r}\n}}\n")
    return "".join(out)


def _libcalls(compiler: "LLVMCompiler") -> None:
    """Make the float <-> narrow float routines LLVM may call visible to the JIT; once per process.
    libgcc's float <-> half routines serve targets without F16C (LLVM calls them there); the
    bfloat16 ones are compiled here (``_own_bf16_routines``). Where libgcc lacks the half ones such
    a target cannot run float16 kernels, and LLVM reports the unresolved symbol."""
    if _libcalls_done:
        return
    import ctypes.util
    from llvmlite import binding as llvm
    name = ctypes.util.find_library("gcc_s") or "libgcc_s.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        lib = None
    for sym in _LIBCALLS:
        if lib is not None and llvm.address_of_symbol(sym) is None and hasattr(lib, sym):
            llvm.add_symbol(sym, ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value)
    mod = llvm.parse_assembly(_own_bf16_routines())
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, compiler.target_machine())
    engine.finalize_object()
    for sym in ("__truncsfbf2", "__truncdfbf2"):
        if llvm.address_of_symbol(sym) is None:
            llvm.add_symbol(sym, engine.get_function_address(sym))
    _libcalls_done.append(engine)             # the routines' code lives as long as the process


class _Ctx:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.decls: set[str] = set()
        self.tables: set[str] = set()       # names of the constant tables declared

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


# ------------------------------------------------------------------ the op table
# A rule gets the context (emit with c(...), declare with c.decls), the Operation (the kinds it works
# on) and its operands' SSA names, and returns the result's name. EXP2, LOG2 and SIN have no rule:
# libm's exp2f/log2f/sinf are scalar calls that stop LLVM's loop vectorizer, so lower/decomp.py
# rewrites them into straight-line loop IR that vectorizes (its error bounds: docs/semantics.md).
Rule = Callable[[_Ctx, Operation, list[str]], str]


def _by_kind(f: str | None = None, i: str | None = None, b: str | None = None) -> Rule:
    """A one-instruction rule whose text depends on the operands' kind: ``f`` for floats, ``i`` for
    int32 and index, ``b`` for bool (None: not defined on that kind). ``{t}`` is the operands' LLVM
    type, ``{0}``, ``{1}``, ... the operands."""
    def rule(c: _Ctx, o: Operation, a: list[str]) -> str:
        text = f if o.is_float else b if o.src == "bool" else i
        if text is None:
            raise MissingRule("LLVM", o)
        return c(text.format(*a, t=LT[o.src]))
    return rule


def _libm_call(name: str) -> Rule:
    """A call of the C library's double function ``name`` (resolved in the process at load)."""
    return lambda c, o, a: _intrinsic(c, name, "double", *a)


def _float_intrinsic(name: str) -> Rule:
    def rule(c: _Ctx, o: Operation, a: list[str]) -> str:
        if not o.is_float:
            raise MissingRule("LLVM", o)
        return _intrinsic(c, f"llvm.{name}.{_SUFFIX[o.src]}", LT[o.src], *a)
    return rule


def _max(c: _Ctx, k: str, ty: str, a: str, b: str) -> str:
    if k in _SUFFIX:       # NaN-propagating, like NumPy's maximum (and vectorizable as a reduction)
        return _intrinsic(c, f"llvm.maximum.{_SUFFIX[k]}", ty, a, b)
    if k == "bool":
        return c(f"or i1 {a}, {b}")
    gt = c(f"icmp {'ugt' if k in _UNSIGNED else 'sgt'} {ty} {a}, {b}")
    return c(f"select i1 {gt}, {ty} {a}, {ty} {b}")


# A float max reduction of the scalar path accumulates integers that order as the floats do: the
# bits with the magnitude flipped when the sign is set (-inf < ... < -0 < +0 < ... < +inf < NaN), a
# NaN made positive first, so that it wins as ``maximum``'s does (the result is the canonical
# NaN). LLVM's loop vectorizer reduces ``llvm.maximum`` with NaN and signed-zero checks between
# every scalar step of the final horizontal reduction (~45 dependent instructions a row on x86)
# and with 6 instructions a vector in the loop; the integer max is one instruction in both. Measured
# (2-vCPU Xeon, each kernel over 4 MB of float32, two runs): amax over rows of 8 541 -> 267 us, of
# 15 596 -> 300 us, of 1024 unchanged; softmax over rows of 15 1,900 -> 1,040 us, of 1024 1,250 ->
# 1,125 us; BERT's (32, 12, 15, 15) softmax 147 -> 93 us; 3 x 3 max pooling 1,650 -> 1,290 us.
# The flip is ``b ^ ((b >>s (w-1)) >>u 1)``: written ``b ^ ((b >>s (w-1)) & 0x7FF...)``, LLVM's
# AVX-512 code (mask registers) gave a NaN first row on the first call of a cross-entropy
# backward kernel on a 2-vCPU Xeon VM, and the right one on every later call; not reproduced out
# of the process, not with AVX2 code, not with this form.
_ORDERED = {"float": "i32", "double": "i64"}
_ORDERED_BITS = {"i32": 32, "i64": 64}


def _ordered(c: _Ctx, ty: str, v: str) -> str:
    """The ordered integer of float ``v`` (a NaN's is the largest)."""
    nan = c(f"fcmp uno {ty} {v}, {v}")
    clean = c(f"select i1 {nan}, {ty} {_dbl(float('nan'))}, {ty} {v}")
    return _flip(c, _ORDERED[ty], c(f"bitcast {ty} {clean} to {_ORDERED[ty]}"))


def _from_ordered(c: _Ctx, ty: str, k: str) -> str:
    return c(f"bitcast {_ORDERED[ty]} {_flip(c, _ORDERED[ty], k)} to {ty}")


def _flip(c: _Ctx, it: str, b: str) -> str:
    """Bits <-> ordered integer (its own inverse: the sign bit is unchanged)."""
    sign = c(f"ashr {it} {b}, {_ORDERED_BITS[it] - 1}")
    return c(f"xor {it} {b}, {c(f'lshr {it} {sign}, 1')}")


def _ordered_const(v: float, ty: str) -> int:
    """The ordered integer of the float constant ``v`` (an accumulator's start)."""
    if v != v:
        v = float("nan")
    if ty == "float":
        b = struct.unpack("<i", struct.pack("<f", v))[0]
    else:
        b = struct.unpack("<q", struct.pack("<d", v))[0]
    return b ^ ((1 << (_ORDERED_BITS[_ORDERED[ty]] - 1)) - 1 if b < 0 else 0)


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


def _divmod(instr: str) -> Rule:
    def rule(c: _Ctx, o: Operation, a: list[str]) -> str:     # _div_guarded looked up per call (tests patch it)
        if o.src in _UNSIGNED:     # no INT_MIN / -1 case; only x / 0 = 0
            ty = LT[o.src]
            zero = c(f"icmp eq {ty} {a[1]}, 0")
            q = c(f"{'udiv' if instr == 'sdiv' else 'urem'} {ty} {a[0]}, {c(f'select i1 {zero}, {ty} 1, {ty} {a[1]}')}")
            return c(f"select i1 {zero}, {ty} 0, {ty} {q}")
        return _div_guarded(c, LT[o.src], a[0], a[1], instr, o.src == INDEX, o.nonneg)
    return rule


def _cast(c: _Ctx, a: str, src: str, dst: str) -> str:
    if src == dst:
        return a
    ts, td = LT[src], LT[dst]
    unsigned = src in _UNSIGNED or src == "bool"
    if dst in _NARROW:            # straight to the narrow type (one rounding), back in a float register
        t = _NARROW[dst]
        if src == "float64":
            n = _f64_to_narrow(c, a, dst)
        elif src in _SUFFIX and src != dst:
            n = _to_narrow(c, a, dst)
        elif src in _SUFFIX:
            return a
        elif dst == "bfloat16":     # through a double that rounds as the integer (LLVM goes through float: twice)
            n = _f64_to_narrow(c, _int_to_f64_odd(c, a, ts, unsigned), dst)
        else:                       # float16: every integer that stays finite is exact in float32
            n = c(f"{'uitofp' if unsigned else 'sitofp'} {ts} {a} to {t}")
        return c(f"fpext {t} {n} to float")
    if src in _SUFFIX:
        if dst in _SUFFIX:
            return a if ts == td else c(f"{'fptrunc' if td == 'float' else 'fpext'} {ts} {a} to {td}")
        if dst == "bool":
            return c(f"fcmp une {ts} {a}, 0.0")
        sat = "fptoui" if dst in _UNSIGNED else "fptosi"       # saturating, NaN -> 0
        return _intrinsic_cast(c, f"llvm.{sat}.sat.{td}.{_SUFFIX[src]}", ts, td, a)
    if dst in _SUFFIX:
        return c(f"{'uitofp' if unsigned else 'sitofp'} {ts} {a} to {td}")
    if dst == "bool":
        return c(f"icmp ne {ts} {a}, 0")
    if _BITS[ts] == _BITS[td]:
        return a
    if _BITS[ts] < _BITS[td]:
        return c(f"{'zext' if unsigned else 'sext'} {ts} {a} to {td}")
    return c(f"trunc {ts} {a} to {td}")


def _bitcast(c: _Ctx, o: Operation, a: list[str]) -> str:
    """The same bits as another type of the same size; a narrow float is rounded into its memory type."""
    v = _to_narrow(c, a[0], o.src) if o.src in _NARROW else a[0]
    if o.dst in _NARROW:
        return c(f"fpext {_NARROW[o.dst]} {c(f'bitcast {MT[o.src]} {v} to {_NARROW[o.dst]}')} to float")
    return c(f"bitcast {MT[o.src] if o.src in _NARROW else LT[o.src]} {v} to {LT[o.dst]}")


def _intrinsic_cast(c: _Ctx, name: str, ts: str, td: str, a: str) -> str:
    c.decls.add(f"declare {td} @{name}({ts})")
    return c(f"call {td} @{name}({ts} {a})")


def _cmplt(c: _Ctx, o: Operation, a: list[str]) -> str:
    if o.src == "bool":                            # a < b is !a & b
        return c(f"and i1 {c(f'xor i1 {a[0]}, true')}, {a[1]}")
    cmp = "fcmp olt" if o.is_float else "icmp ult" if o.src in _UNSIGNED else "icmp slt"
    return c(f"{cmp} {LT[o.src]} {a[0]}, {a[1]}")


def _muladd(c: _Ctx, o: Operation, a: list[str]) -> str:
    # both contractible: LLVM fuses them into an FMA where the target has one
    t = LT[o.src]
    return c(f"fadd contract {t} {c(f'fmul contract {t} {a[0]}, {a[1]}')}, {a[2]}")


@functools.lru_cache(maxsize=16)
def _table_decl(t: Table, dt: Any) -> str:
    """A table's global constant: rendered once per process (sin's 1,024 doubles took ~4 ms, and a
    kernel of 2,000 chained ops reads the table 1,000 times: 1.5-2 s of its compile)."""
    ty = LT[dt]
    return (f"@{t.name} = private unnamed_addr constant [{len(t.values)} x {ty}] ["
            + ", ".join(f"{ty} {_const(v, dt)}" for v in t.values) + "]")


def _table(c: _Ctx, o: Operation, a: list[str]) -> str:
    t, ty = o.arg, LT[o.dst]
    size = f"[{len(t.values)} x {ty}]"
    if t.name not in c.tables:           # once per kernel
        c.tables.add(t.name)
        c.decls.add(_table_decl(t, o.dst))
    p = c(f"getelementptr inbounds {size}, ptr @{t.name}, i64 0, {LT[o.src]} {a[0]}")
    return c(f"load {ty}, ptr {p}")


LLVM_OPS: dict[str, Rule] = {
    "NEG": _by_kind(f="fneg {t} {0}", i="sub {t} 0, {0}", b="xor i1 {0}, true"),
    "SQRT": _float_intrinsic("sqrt"),
    "TRUNC": _float_intrinsic("trunc"),
    "FLOOR": _float_intrinsic("floor"),
    "RINT": _float_intrinsic("roundeven"),
    "RECIP": _by_kind(f="fdiv {t} 1.0, {0}"),
    "CAST": lambda c, o, a: _cast(c, a[0], o.src, o.dst),
    "BITCAST": _bitcast,
    # float ADD/MUL may contract into an FMA; int32 wraps (no nsw: overflow is defined)
    "ADD": _by_kind(f="fadd contract {t} {0}, {1}", i="add {t} {0}, {1}", b="or i1 {0}, {1}"),
    "MUL": _by_kind(f="fmul contract {t} {0}, {1}", i="mul {t} {0}, {1}", b="and i1 {0}, {1}"),
    "MULADD": _muladd,
    "MAX": lambda c, o, a: _max(c, o.src, LT[o.src], a[0], a[1]),
    "CMPLT": _cmplt,
    "CMPEQ": _by_kind(f="fcmp oeq {t} {0}, {1}", i="icmp eq {t} {0}, {1}", b="icmp eq i1 {0}, {1}"),
    "IDIV": _divmod("sdiv"),
    "MOD": _divmod("srem"),
    "AND": _by_kind(i="and {t} {0}, {1}", b="and i1 {0}, {1}"),
    "OR": _by_kind(i="or {t} {0}, {1}", b="or i1 {0}, {1}"),
    "XOR": _by_kind(i="xor {t} {0}, {1}", b="xor i1 {0}, {1}"),
    "SHL": _by_kind(i="shl {t} {0}, {1}"),
    "SHR": _by_kind(i="lshr {t} {0}, {1}"),
    "WHERE": lambda c, o, a: c(f"select i1 {a[0]}, {LT[o.src]} {a[1]}, {LT[o.src]} {a[2]}"),
    "TABLE": _table,
}


# ------------------------------------------------------------------ register lanes as vectors
# A lane kernel (lower/passes.py "lanes") computes a block of output elements per iteration: per
# lane, its own accumulators and its own copy of the body. Rendered one scalar per lane, an 8 x 16
# block is 128 accumulators and 128 copies of the reduce body, which LLVM's SLP vectorizer packs
# back into vectors: most of the compile time of the kernels that matter (the 64->128->10 MLP Adam
# step: its two largest kernels, 1,400-1,900 lines each, took 320 of its 870 ms of LLVM).
# _Lanes finds, in the loop IR, the groups of ``vector_lanes`` consecutive lanes -- accumulators
# (runs of DEFACCs) and output stores (runs of STOREs at consecutive addresses) -- and the value
# trees feeding them; the renderer then emits each group as one <W x T> instruction. A tree node
# is a vector op where all lanes have the same op (float and bool ops below), a vector load where
# the lanes load consecutive elements, a splat where they share one scalar, a vector constant,
# the accumulators' own vector, and anything else is packed from the lanes' scalars (correct,
# and what SLP would have to do). LLVM legalizes <W x T> to the target's registers: two 256-bit
# halves of a <16 x float> with AVX2, one 512-bit register with AVX-512 -- no width is a constant
# here. Scalar instructions that only vector groups use are not emitted.
_VEC_FLOAT = frozenset({"ADD", "MUL", "MULADD", "MAX", "NEG", "SQRT", "FLOOR", "TRUNC", "RINT", "RECIP",
                        "CMPLT", "CMPEQ"})
_VEC_BOOL = frozenset({"AND", "OR", "NEG", "ADD", "MUL"})
_VEC_INTRINSIC = {"SQRT": "sqrt", "FLOOR": "floor", "TRUNC": "trunc", "RINT": "roundeven"}
# ops whose float16/bfloat16 result is already of that type (no rounding after them)
_EXACT_IN_NARROW = frozenset({"NEG", "MAX", "WHERE", "CAST", "BITCAST", "TRUNC", "FLOOR", "RINT", "TABLE"})


class _Lanes:
    """The vector groups of one (decomposed) lane kernel, worked out before it is rendered."""

    def __init__(self, k: LoopKernel, sized: dict[int, int]) -> None:
        self.k, self.W, self.sized = k, k.vector_lanes, sized
        insts, W = k.insts, k.vector_lanes
        self.scope: list[int] = []          # per instruction: the innermost open RANGE (-1: none)
        open_: list[int] = []
        uses: dict[int, list[int]] = {}     # accumulator -> its ACCUMs and ACCREADs, in order
        for i, x in enumerate(insts):
            if x.op == "ENDRANGE":
                open_.pop()
            self.scope.append(open_[-1] if open_ else -1)
            if x.op == "RANGE":
                open_.append(i)
            elif x.op in ("ACCUM", "ACCREAD"):
                uses.setdefault(x.src[0], []).append(i)
        self.trees: dict[tuple, tuple] = {}
        self.leaves: set[int] = set()       # scalars the vector code reads
        self.first_acc: dict[int, tuple] = {}       # first DEFACC of a chunk -> the chunk
        self.acc_last: dict[int, tuple] = {}        # last ACCUM of a group -> (its ACCUMs in lane order)
        self.read_first: dict[int, tuple] = {}      # first ACCREAD of a group -> (its ACCREADs in lane order)
        self.store_last: dict[int, tuple] = {}      # last STORE of a group -> (its STOREs in lane order)
        self.grouped: set[int] = set()              # every instruction that a group renders
        # accumulators: runs of consecutive float DEFACCs with one initial value, W at a time
        i = 0
        while i < len(insts):
            x = insts[i]
            if x.op != "DEFACC" or _name(x.dtype) != "float32":
                i += 1
                continue
            j = i
            while j < len(insts) and insts[j].op == "DEFACC" and insts[j].dtype == x.dtype and insts[j].arg == x.arg:
                j += 1
            if (j - i) % W == 0:
                for c0 in range(i, j, W):
                    self._chunk(tuple(range(c0, c0 + W)), uses)
            i = j
        # (after every chunk: a blocked sum's fold reads another chunk's accumulators as a vector)
        for g in self.acc_last.values():
            self._tree(tuple(insts[u].src[1] for u in g))
        # output stores: W consecutive STOREs to consecutive elements of one parameter, one loop
        run: list[int] = []
        for i, x in enumerate(insts):
            if x.op == "STORE":
                if run and not self._continues(run, i):
                    run = []
                if not run and self.kind(x.src[2]) != "float32":
                    continue
                run.append(i)
                if len(run) == W:
                    g = tuple(run)
                    self.store_last[g[-1]] = g
                    self.grouped.update(g)
                    self._tree(tuple(insts[s].src[2] for s in g))
                    self.leaves.add(insts[g[0]].src[1])
                    run = []
            elif x.op in ("RANGE", "ENDRANGE"):
                run = []      # (a group's stores may move past loads: a kernel never reads its output)
        # scalars still needed: those of the instructions no group renders, and the groups' leaves
        need = set(self.leaves)
        for i, x in enumerate(insts):
            if x.op in ("STORE", "ACCUM") and i not in self.grouped:
                need.update(x.src)
        for i in range(len(insts) - 1, -1, -1):
            if i in need and insts[i].op not in ("DEFACC", "PARAM"):
                need.update(insts[i].src)
        self.need = need

    def _continues(self, run: list[int], i: int) -> bool:
        insts = self.k.insts
        a, b = insts[run[-1]], insts[i]
        if b.src[0] != a.src[0] or self.scope[i] != self.scope[run[0]] or self.kind(b.src[2]) != "float32":
            return False
        (b0, o0), (b1, o1) = self._offset(a.src[1]), self._offset(b.src[1])
        return b0 == b1 and o1 == o0 + 1

    def kind(self, i: int) -> str:
        return _name(self.k.insts[i].dtype)

    def _offset(self, i: int) -> tuple[int | None, int]:
        """An index instruction as (base instruction, constant offset)."""
        x, insts = self.k.insts[i], self.k.insts
        if x.op == "CONST" and i not in self.sized:
            return None, int(x.arg)
        if x.op == "ADD" and x.dtype == INDEX:
            c = insts[x.src[1]]
            if c.op == "CONST" and x.src[1] not in self.sized:
                return x.src[0], int(c.arg)
        return i, 0

    def _chunk(self, accs: tuple[int, ...], uses: dict[int, list[int]]) -> None:
        """Make ``accs`` (W lanes' accumulators) one vector if every lane uses its own the same way."""
        insts, W = self.k.insts, self.W
        per = [uses.get(a, []) for a in accs]
        n = len(per[0])
        if any(len(u) != n for u in per):
            return
        merged = sorted(u for us in per for u in us)
        groups = []
        for j in range(n):
            g = tuple(u[j] for u in per)
            xs = [insts[u] for u in g]
            # the j-th uses of all lanes: adjacent among the chunk's uses, one op, one loop
            if set(merged[j * W:(j + 1) * W]) != set(g) or len({(x.op, x.arg) for x in xs}) != 1 \
                    or len({self.scope[u] for u in g}) != 1:
                return
            if xs[0].op == "ACCUM" and xs[0].arg not in ("ADD", "MAX"):
                return
            groups.append(g)
        self.first_acc[accs[0]] = accs
        self.grouped.update(accs)
        for g in groups:
            self.grouped.update(g)
            if insts[g[0]].op == "ACCUM":
                self.acc_last[max(g)] = g
            else:
                self.read_first[min(g)] = g
                self.trees[g] = ("accread",)

    def _tree(self, g: tuple[int, ...]) -> tuple:
        hit = self.trees.get(g)
        if hit is None:
            hit = self.trees[g] = self._classify(g)
        return hit

    def _classify(self, g: tuple[int, ...]) -> tuple:
        insts = self.k.insts
        x0 = insts[g[0]]
        kind = self.kind(g[0])
        if all(i == g[0] for i in g):
            if x0.op == "CONST" and g[0] not in self.sized:
                return ("splat_const",)
            self.leaves.add(g[0])
            return ("splat",)
        xs = [insts[i] for i in g]
        if kind not in ("float32", "bool"):
            pass
        elif all(x.op == "CONST" for x in xs) and not any(i in self.sized for i in g):
            return ("const",)
        elif x0.op == "LOAD" and kind == "float32" and all(x.op == "LOAD" and x.src[0] == x0.src[0] for x in xs):
            offs = [self._offset(x.src[1]) for x in xs]
            if all(b == offs[0][0] and o == offs[0][1] + l for l, (b, o) in enumerate(offs)):
                self.leaves.add(x0.src[1])
                return ("load",)
            masked = self._masked_load(xs)
            if masked is not None:
                return masked
        elif all(x.op == x0.op and x.dtype == x0.dtype and x.arg == x0.arg for x in xs) and self._vectorizes(x0) \
                and all(self._operand_kinds(i) == self._operand_kinds(g[0]) for i in g):
            # (the operands' kinds too: a CMPLT is bool on floats and on indices alike -- cat's bounds
            # check beside a float compare -- and a kid group is one vector of one element type)
            kids = tuple(tuple(insts[i].src[j] for i in g) for j in range(len(x0.src)))
            for kg in kids:
                self._tree(kg)
            return ("op", kids)
        self.leaves.update(g)
        return ("pack",)

    def _masked_load(self, xs: list[LInst]) -> tuple | None:
        """("masked_load", the lanes' masks (None: a lane read unmasked), the first lane's index) for
        loads of consecutive elements each behind its own validity (a read under a PAD:
        ``LOAD(p, WHERE(valid, index, 0))``, lower/lowering.py), or None: one masked vector load, where
        each lane's select of a safe index made them W scalar loads (a convolution's padded input read
        inside its reduction: lanes along a row, only the edge lanes' masks differ). A lane whose mask
        is off reads 0 where it read element 0: the lowering reads under a mask only below the PAD
        whose select discards that value (as ``_guarded_loads`` relies on for scalar loops)."""
        insts = self.k.insts
        masks: list[int | None] = []
        index: list[int] = []
        for x in xs:
            w = insts[x.src[1]]
            if w.op == "WHERE" and insts[w.src[2]].op == "CONST" and w.src[2] not in self.sized and insts[w.src[2]].arg == 0:
                masks.append(w.src[0])
                index.append(w.src[1])
            else:                   # (a lane read unmasked: one its Pad's bounds prove in range)
                masks.append(None)
                index.append(x.src[1])
        if all(m is None for m in masks):
            return None
        offs = [self._offset(i) for i in index]
        if not all(b == offs[0][0] and o == offs[0][1] + l for l, (b, o) in enumerate(offs)):
            return None
        self.leaves.update(m for m in masks if m is not None)
        self.leaves.add(index[0])
        return ("masked_load", tuple(masks), index[0])

    def _operand_kinds(self, i: int) -> tuple[str, ...]:
        return tuple(self.kind(s) for s in self.k.insts[i].src)

    def _vectorizes(self, x: LInst) -> bool:
        """Has this op a vector rule (``_Kernel.vector_op``) for its operands' kind?"""
        src = self.kind(x.src[1] if x.op == "WHERE" else x.src[0]) if x.src else None
        if x.op == "WHERE":
            return src == "float32"
        if x.op == "CAST":
            return (src, _name(x.dtype)) in (("bool", "float32"), ("float32", "bool"))
        if src == "float32":
            return x.op in _VEC_FLOAT
        return src == "bool" and x.op in _VEC_BOOL


# ------------------------------------------------------------------ the kernel
class _Kernel:
    """One kernel being rendered: a method per structural instruction (loops, accumulators,
    memory); every other instruction is its LLVM_OPS rule. Values are SSA names."""

    def __init__(self, k: LoopKernel, sized: dict[int, int] | None = None) -> None:
        self.k, self.c = k, _Ctx()
        # instruction id -> slot of the i64 array %sz that holds its value (index CONSTs and RANGE
        # extents of a sized program, devices/sizeargs.py); the others are literals
        self.sized = sized or {}
        self.val: dict[int, str] = {}
        self.kinds: dict[int, str] = {}
        self.allocas: list[str] = []
        # the outermost parallel loop runs [lo, hi): the runtime splits it across threads
        self.split = k.parallel_ranges()[0] if k.parallel else None
        # innermost loops with a long body of independent iterations get a forced interleave count:
        # LLVM's own choice for znver4 is 1, which leaves the out-of-order window too small to overlap
        # the long dependency chains of exp2/log2 across iterations (elementwise chain: -15% time)
        self.inner = _interleaved_loops(k) if k.loop_vectorize else set()
        # loops that hold another loop are never unrolled by LLVM (see _outer_loops), unless all
        # they hold is short constant loops (see _short_nests)
        outer = _outer_loops(k)
        roots, inside = _short_nests(k, set(self.sized) | {self.split})
        self.outer = outer - roots - inside
        # short loops over strided rows: not vectorized (see _gathering_loops); a short nest's own
        # loops are left to LLVM to unroll
        self.gathering = (_gathering_loops(k) & outer) - inside if k.loop_vectorize else set()
        # register lanes as vectors (see _Lanes); vector values by lane group, dropped with the
        # loop they were emitted in (a value of a closed loop's body is not available after it)
        lanes = _Lanes(k, self.sized) if k.vector_lanes >= 2 else None
        self.lanes = lanes if lanes is not None and lanes.grouped else None
        # in a kernel with lanes (its loop vectorizer off), a row-fused kernel's row loops (the
        # scores' dot products and the row's sum of softmax(q @ k.T) @ v: LoopKernel.row_loops),
        # which LLVM's loop vectorizer may widen as in a kernel without lanes
        self.scalar_loops = (set(k.row_loops) & _loops_without(k, self.lanes.grouped)) if self.lanes is not None else set()
        self.vmemo: dict[tuple, str] = {}
        self.vscopes: list[list[tuple]] = [[]]
        # float max accumulators of the scalar path, kept as ordered integers (_ordered)
        # loads of a masked read (a pad's border) whose every reader discards them where the mask
        # is off: loaded under a branch from their unclamped address (see _guarded_loads)
        self.guarded = _guarded_loads(k) if self.lanes is None else {}
        self.max_accs = {x.src[0] for x in k.insts if x.op == "ACCUM" and x.arg == "MAX"
                         and _name(k.insts[x.src[0]].dtype) in _SUFFIX
                         and (self.lanes is None or x.src[0] not in self.lanes.grouped)}

    def set(self, i: int, v: str, kd: str) -> None:
        self.val[i], self.kinds[i] = v, kd

    def PARAM(self, i: int, x: LInst) -> None:
        self.set(i, f"%p{x.arg}", _name(x.dtype))

    def CONST(self, i: int, x: LInst) -> None:
        self.set(i, f"%sz{self.sized[i]}" if i in self.sized else _const(x.arg, x.dtype), _name(x.dtype))

    def RANGE(self, i: int, x: LInst) -> None:
        self.vscopes.append([])
        self.allocas.append(f"  %r{i}.p = alloca i64")
        start, end = ("%lo", "%hi") if i == self.split else ("0", f"%sz{self.sized[i]}" if i in self.sized else str(x.arg))
        self.c.lines += [f"  store i64 {start}, ptr %r{i}.p", f"  br label %L{i}.cond", f"L{i}.cond:",
                         f"  %r{i} = load i64, ptr %r{i}.p", f"  %r{i}.c = icmp slt i64 %r{i}, {end}",
                         f"  br i1 %r{i}.c, label %L{i}.body, label %L{i}.exit", f"L{i}.body:"]
        self.set(i, f"%r{i}", INDEX)

    def ENDRANGE(self, i: int, x: LInst) -> None:
        for g in self.vscopes.pop():
            del self.vmemo[g]
        r = x.src[0]
        self.c.lines += [f"  %r{r}.n = add nuw nsw i64 %r{r}, 1", f"  store i64 %r{r}.n, ptr %r{r}.p",
                         f"  br label %L{r}.cond, !llvm.loop {self._loop_md(r)}", f"L{r}.exit:"]

    def _loop_md(self, r: int) -> str:
        if r in self.scalar_loops:
            return "!9" if r in self.outer else "!8"
        return '!3' if r in self.inner else '!6' if r in self.gathering else '!4' if r in self.outer else '!0'

    def DEFACC(self, i: int, x: LInst) -> None:
        kd = _name(x.dtype)
        if self.lanes is not None and i in self.lanes.grouped:
            if i in self.lanes.first_acc:          # the chunk's one vector accumulator
                vt = self.vt(kd)
                self.allocas.append(f"  %a{i} = alloca {vt}")
                self.c.lines.append(f"  store {vt} splat ({LT[kd]} {_const(x.arg, x.dtype)}), ptr %a{i}")
                for a in self.lanes.first_acc[i]:
                    self.set(a, f"%a{i}", kd)
            return
        if i in self.max_accs:
            it = _ORDERED[LT[kd]]
            self.allocas.append(f"  %a{i} = alloca {it}")
            self.c.lines.append(f"  store {it} {_ordered_const(x.arg, LT[kd])}, ptr %a{i}")
            self.set(i, f"%a{i}", kd)
            return
        self.allocas.append(f"  %a{i} = alloca {LT[kd]}")
        self.c.lines.append(f"  store {LT[kd]} {_const(x.arg, x.dtype)}, ptr %a{i}")
        self.set(i, f"%a{i}", kd)

    def DEFLOCAL(self, i: int, x: LInst) -> None:
        # in the entry block with the other allocas: one array per call (per thread), not per row
        kd = _name(x.dtype)
        self.allocas.append(f"  %l{i} = alloca {MT[kd]}, i64 {x.arg}, align 64")
        self.set(i, f"%l{i}", kd)

    def ACCUM(self, i: int, x: LInst) -> None:
        c = self.c
        acc, v = x.src
        if self.lanes is not None and i in self.lanes.grouped:
            g = self.lanes.acc_last.get(i)
            if g is not None:                      # the group's last lane: one vector ACCUM
                kd = self.kinds[acc]
                vt = self.vt(kd)
                val = self.vec(tuple(self.k.insts[u].src[1] for u in g))
                cur = c(f"load {vt}, ptr {self.val[acc]}")
                new = c(f"fadd reassoc contract {vt} {cur}, {val}") if x.arg == "ADD" else \
                    _intrinsic(c, f"llvm.maximum.v{self.lanes.W}f32", vt, cur, val)
                c.lines.append(f"  store {vt} {new}, ptr {self.val[acc]}")
            return
        kd = self.kinds[acc]
        ty = LT[kd]
        if acc in self.max_accs:
            it = _ORDERED[ty]
            key = _ordered(c, ty, self.val[v])
            new = _intrinsic(c, f"llvm.smax.{it}", it, c(f"load {it}, ptr {self.val[acc]}"), key)
            c.lines.append(f"  store {it} {new}, ptr {self.val[acc]}")
            return
        cur = c(f"load {ty}, ptr {self.val[acc]}")
        if x.arg == "ADD":        # reassoc: LLVM may vectorize the sum (docs/semantics.md, "Float sums")
            new = c(f"fadd reassoc contract {ty} {cur}, {self.val[v]}") if kd in _SUFFIX else \
                c(f"or i1 {cur}, {self.val[v]}") if kd == "bool" else c(f"add {ty} {cur}, {self.val[v]}")
        else:
            new = _max(c, kd, ty, cur, self.val[v])
        c.lines.append(f"  store {ty} {new}, ptr {self.val[acc]}")

    def ACCREAD(self, i: int, x: LInst) -> None:
        kd = _name(x.dtype)
        if self.lanes is not None and i in self.lanes.grouped:
            g = self.lanes.read_first.get(i)
            if g is not None:                      # the group's first lane: one vector load
                v = self.c(f"load {self.vt(kd)}, ptr {self.val[x.src[0]]}")
                self.remember(g, v)
                for lane, r in enumerate(g):       # lanes that scalar code reads
                    if r in self.lanes.need:
                        self.set(r, self.c(f"extractelement {self.vt(kd)} {v}, i64 {lane}"), kd)
            return
        if x.src[0] in self.max_accs:
            it = _ORDERED[LT[kd]]
            v = _from_ordered(self.c, LT[kd], self.c(f"load {it}, ptr {self.val[x.src[0]]}"))
        else:
            v = self.c(f"load {LT[kd]}, ptr {self.val[x.src[0]]}")
        # a float16/bfloat16 sum is accumulated in float32 and rounded once, here
        self.set(i, _round_narrow(self.c, v, kd) if kd in _NARROW else v, kd)

    def LOAD(self, i: int, x: LInst) -> None:
        if self.lanes is not None and i not in self.lanes.need:
            return
        c, kd = self.c, _name(x.dtype)
        p, idx = x.src
        guard = self.guarded.get(i)
        if guard is not None:
            cond, addr = guard
            ptr = c(f"getelementptr {MT[kd]}, ptr {self.val[p]}, i64 {self.val[addr]}")
            c.lines += [f"  br label %G{i}.pre", f"G{i}.pre:", f"  br i1 {self.val[cond]}, label %G{i}.ld, label %G{i}.join",
                        f"G{i}.ld:"]
            ld = c(f"load {MT[kd]}, ptr {ptr}")
            c.lines += [f"  br label %G{i}.join", f"G{i}.join:"]
            v = c(f"phi {MT[kd]} [ {ld}, %G{i}.ld ], [ zeroinitializer, %G{i}.pre ]")
        else:
            ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {self.val[p]}, i64 {self.val[idx]}")
            v = c(f"load {MT[kd]}, ptr {ptr}")
        self.set(i, c(f"trunc i8 {v} to i1") if kd == "bool" else
                 c(f"fpext {MT[kd]} {v} to float") if kd in _NARROW else v, kd)

    def STORE(self, i: int, x: LInst) -> None:
        c = self.c
        p, idx, v = x.src
        if self.lanes is not None and i in self.lanes.grouped:
            g = self.lanes.store_last.get(i)
            if g is not None:                      # the group's last lane: one vector store
                insts = self.k.insts
                kd = _name(insts[insts[g[0]].src[2]].dtype)
                val = self.vec(tuple(insts[s].src[2] for s in g))
                ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {self.val[p]}, i64 {self.val[insts[g[0]].src[1]]}")
                c.lines.append(f"  store {self.vt(kd)} {val}, ptr {ptr}, align 4")
            return
        kd = self.kinds[v]
        ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {self.val[p]}, i64 {self.val[idx]}")
        sv = c(f"zext i1 {self.val[v]} to i8") if kd == "bool" else \
            _to_narrow(c, self.val[v], kd) if kd in _NARROW else self.val[v]
        c.lines.append(f"  store {MT[kd]} {sv}, ptr {ptr}")

    # ---------------------------------------------------------------- vectors (see _Lanes)
    def vt(self, kd: str) -> str:
        return f"<{self.lanes.W} x {LT[kd]}>"

    def remember(self, g: tuple, v: str) -> None:
        self.vmemo[g] = v
        self.vscopes[-1].append(g)

    def vec(self, g: tuple[int, ...]) -> str:
        """The vector of lane group ``g``'s values, emitted here unless this loop has it already."""
        hit = self.vmemo.get(g)
        if hit is not None:
            return hit
        insts, c = self.k.insts, self.c
        node = self.lanes.trees[g]
        kd = _name(insts[g[0]].dtype)
        mixed = [(lane, _name(insts[i].dtype)) for lane, i in enumerate(g) if _name(insts[i].dtype) != kd]
        if mixed:          # _Lanes groups lanes of one kind only; a mix would be mistyped IR text
            lane, other = mixed[0]
            raise CompileError(f"LLVM renderer: lane group %{g[0]}..: one vector of {kd} expected, "
                               f"got lane {lane} (%{g[lane]}) of {other}")
        vt, ty = self.vt(kd), LT[kd]
        how = node[0]
        if how == "splat_const":
            return f"splat ({ty} {_const(insts[g[0]].arg, kd)})"        # a constant: nothing to emit
        if how == "const":
            return "<" + ", ".join(f"{ty} {_const(insts[i].arg, kd)}" for i in g) + ">"
        if how == "splat":
            one = c(f"insertelement {vt} poison, {ty} {self.val[g[0]]}, i64 0")
            v = c(f"shufflevector {vt} {one}, {vt} poison, <{self.lanes.W} x i32> zeroinitializer")
        elif how == "load":
            x = insts[g[0]]
            ptr = c(f"getelementptr inbounds {MT[kd]}, ptr {self.val[x.src[0]]}, i64 {self.val[x.src[1]]}")
            v = c(f"load {vt}, ptr {ptr}, align 4")
        elif how == "masked_load":
            # the lanes whose mask is off are not read (their index may lie outside the buffer: no
            # inbounds), and read as 0, as the scalar selects of a safe index and a PAD make them
            x, W = insts[g[0]], self.lanes.W
            ptr = c(f"getelementptr {MT[kd]}, ptr {self.val[x.src[0]]}, i64 {self.val[node[2]]}")
            name = f"llvm.masked.load.v{W}f32.p0"
            c.decls.add(f"declare {vt} @{name}(ptr, i32, <{W} x i1>, {vt})")
            v = c(f"call {vt} @{name}(ptr {ptr}, i32 4, <{W} x i1> {self._mask_vector(node[1])}, {vt} zeroinitializer)")
        elif how == "op":
            v = self.vector_op(insts[g[0]], [self.vec(kg) for kg in node[1]], [_name(insts[kg[0]].dtype) for kg in node[1]])
        elif kd == "bool" and self.lanes.W <= 64:
            v = self._mask_vector(g)
        else:                                      # "pack": from the lanes' scalars
            # the value most lanes hold splat, the others put in
            common = max(set(g), key=g.count)
            if g.count(common) > 2:
                one = c(f"insertelement {vt} poison, {ty} {self.val[common]}, i64 0")
                v = c(f"shufflevector {vt} {one}, {vt} poison, <{self.lanes.W} x i32> zeroinitializer")
            else:
                v, common = "poison", None
            for lane, i in enumerate(g):
                if i != common:
                    v = c(f"insertelement {vt} {v}, {ty} {self.val[i]}, i64 {lane}")
        self.remember(g, v)
        return v

    def _mask_vector(self, g: tuple[int | None, ...]) -> str:
        """Lanes of truth values (None: true) as a ``<W x i1>``, built as the bits of one integer: the
        value most lanes hold, the others' bits put in, then a bitcast (a masked load's lanes along a
        padded row share one mask but at its edges; W ``insertelement``s of an ``i1`` became W
        mask-register shifts and ors a vector on AVX-512)."""
        c, W = self.c, len(g)
        if W > 64:
            v = "poison"
            for lane, i in enumerate(g):
                v = c(f"insertelement <{W} x i1> {v}, i1 {'true' if i is None else self.val[i]}, i64 {lane}")
            return v
        common = max(set(g), key=lambda i: (g.count(i), i is None))
        v = "-1" if common is None else c(f"sext i1 {self.val[common]} to i{W}")
        for lane, i in enumerate(g):
            if i != common:
                clear = ~(1 << lane) if lane < W - 1 else (1 << lane) - 1
                bit = str(1 << lane if lane < W - 1 else -(1 << lane)) if i is None else \
                    c(f"shl i{W} {c(f'zext i1 {self.val[i]} to i{W}')}, {lane}")
                v = c(f"or i{W} {c(f'and i{W} {v}, {clear}')}, {bit}")
        return c(f"bitcast i{W} {v} to <{W} x i1>")

    def vector_op(self, x: LInst, a: list[str], kinds: list[str]) -> str:
        """One op on <W x T> operands: the ops ``_Lanes._vectorizes`` admits, as LLVM_OPS renders
        them on scalars (the same flags, the same NaN-propagating maximum)."""
        c, op, W = self.c, x.op, self.lanes.W
        src = kinds[1] if op == "WHERE" else kinds[0]
        vt = self.vt(src)
        if op == "WHERE":
            return c(f"select <{W} x i1> {a[0]}, {vt} {a[1]}, {vt} {a[2]}")
        if op == "CAST":
            if src == "bool":
                return c(f"uitofp <{W} x i1> {a[0]} to <{W} x float>")
            return c(f"fcmp une {vt} {a[0]}, zeroinitializer")
        if src == "bool":
            instr = {"AND": "and", "MUL": "and", "OR": "or", "ADD": "or"}.get(op)
            if instr is None:                      # NEG
                return c(f"xor {vt} {a[0]}, splat (i1 true)")
            return c(f"{instr} {vt} {a[0]}, {a[1]}")
        if op in _VEC_INTRINSIC:
            return _intrinsic(c, f"llvm.{_VEC_INTRINSIC[op]}.v{W}f32", vt, *a)
        if op == "MAX":
            return _intrinsic(c, f"llvm.maximum.v{W}f32", vt, *a)
        if op == "MULADD":
            return c(f"fadd contract {vt} {c(f'fmul contract {vt} {a[0]}, {a[1]}')}, {a[2]}")
        if op == "NEG":
            return c(f"fneg {vt} {a[0]}")
        if op == "RECIP":
            return c(f"fdiv {vt} splat (float 1.0), {a[0]}")
        if op == "CMPLT":
            return c(f"fcmp olt {vt} {a[0]}, {a[1]}")
        if op == "CMPEQ":
            return c(f"fcmp oeq {vt} {a[0]}, {a[1]}")
        return c(f"{'fadd' if op == 'ADD' else 'fmul'} contract {vt} {a[0]}, {a[1]}")

    def value(self, i: int, x: LInst) -> None:
        if self.lanes is not None and i not in self.lanes.need:
            return                                 # only vector groups use it
        # the operands' kind picks the instruction (CMP* give bool from any kind; WHERE's condition is bool)
        src = self.kinds[x.src[1] if x.op == "WHERE" else x.src[0]]
        o = Operation(x.op, src, _name(x.dtype), x.arg)
        rule = LLVM_OPS.get(x.op)
        if rule is None and o.src == "float64" and libm64(x.op):    # not decomposed: libm's double one
            rule = _libm_call(libm64(x.op))
        if rule is None:
            raise MissingRule("LLVM", o)
        r = rule(self.c, o, [self.val[s] for s in x.src])
        if o.dst in _NARROW and x.op not in _EXACT_IN_NARROW:
            r = _round_narrow(self.c, r, o.dst)       # float16/bfloat16 arithmetic: round each op
        self.set(i, r, o.dst)

    def text(self) -> str:
        k, c = self.k, self.c
        args = ", ".join(f"ptr noalias {'' if w else 'readonly '}%p{i}" for i, (_, _, w) in enumerate(k.params))
        # every kernel takes [lo, hi) of its outermost parallel loop, so the runtime can split it
        # across threads (a kernel without parallel loops ignores them)
        entry = list(self.allocas)
        if self.sized:        # a sized program reads its sizes from one more argument, first thing
            args += ", ptr noalias readonly %sz"
            for s in sorted(set(self.sized.values())):
                entry += [f"  %sz{s}.p = getelementptr inbounds i64, ptr %sz, i64 {s}", f"  %sz{s} = load i64, ptr %sz{s}.p"]
        args += ", i64 %lo, i64 %hi"
        body = "\n".join(c.lines)
        tiny = " (tiny)" if _iterations(k, self.sized) <= TINY_ITERATIONS else ""
        # (_WIDE_ATTRS: a kernel with register lanes, and loops the loop vectorizer may widen)
        wide = " #0" if self.lanes is not None and (k.loop_vectorize or self.scalar_loops) else ""
        return (f"; kernel {k.name}{tiny}\n" + "\n".join(sorted(c.decls)) + "\n\n"
                f"define void @{k.name}({args}) nounwind{wide} {{\nentry:\n" + "\n".join(entry) + "\n"
                f"{body}\n  ret void\n}}\n\n" + _LOOP_MD[k.loop_vectorize] + (_GATHERING_MD if self.gathering else "")
                + (_SCALAR_MD if self.scalar_loops else "") + (_WIDE_ATTRS if wide else ""))


_STRUCTURE = {op: getattr(_Kernel, op) for op in
              ("PARAM", "CONST", "RANGE", "ENDRANGE", "DEFACC", "ACCUM", "ACCREAD", "LOAD", "STORE", "DEFLOCAL")}


def render_llvm(k: LoopKernel, sized: dict[int, int] | None = None) -> str:
    """LLVM IR of ``k``, after rewriting the ops LLVM_OPS lacks (lower/decomp.py). ``sized`` maps
    instruction ids of ``k`` -- which must then be decomposed already -- to the slot of the extra
    argument array that holds their value at run time (devices/sizeargs.py)."""
    k = decompose(k, LLVM_OPS)
    r = _Kernel(k, sized)
    for i, x in enumerate(k.insts):
        _STRUCTURE.get(x.op, _Kernel.value)(r, i, x)
    return r.text()


def _iterations(k: LoopKernel, sized: dict[int, int] | None) -> float:
    """How many iterations the kernel's loops run in all (the product of every loop's extent, an
    upper bound where loops follow one another); infinite where an extent is a size argument."""
    n = 1
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            if type(x.arg) is not int or (sized and i in sized):
                return math.inf
            n *= x.arg
    return n


INTERLEAVE = 4            # forced interleave count of long innermost loops (docs/lowering.md, Constants)
INTERLEAVE_MIN_TRIP = 1024  # docs/lowering.md, Constants

# A kernel whose loops run at most this many iterations in all (a scalar's bookkeeping, a test's
# (3, 5) array) is compiled without the loop vectorizer, the SLP vectorizer and unrolling
# (llvm_worker.py ``compile_object``): scalar, its 64 iterations take well under a microsecond,
# below the ~2 us a launch costs, while those passes made its object code take ~10 ms instead of
# ~4 (an elementwise (3, 5) kernel with exp: O3 5.0 + codegen 4.5 ms against 1.9 + 2.3). 64 = the
# forced interleave (4) times the widest lanes (16 floats): no vectorized body of that shape could
# run even once. (docs/lowering.md, Constants)
TINY_ITERATIONS = INTERLEAVE * max(LANES_LAST)


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


# instructions that are not pure values of their sources: a guarded load's value may not reach them
# (a store or an accumulation would keep it, a load or a table would read at an address made from it)
_EFFECTS = frozenset({"LOAD", "STORE", "ACCUM", "DEFACC", "ACCREAD", "RANGE", "ENDRANGE", "TABLE"})


def _guarded_loads(k: LoopKernel) -> dict[int, tuple[int, int]]:
    """The lowering's masked reads (lower/indexing.py: a pad's border): ``LOAD(p, WHERE(c, a, e))``,
    the address clamped to ``e`` where the mask ``c`` is off, whose value is discarded there -- every
    path from it through pure instructions ends in a ``WHERE(c, ..., z)`` that takes it only where
    ``c`` holds, before any store, accumulation, load or table. Load id -> (c, a): rendered as a load
    from ``a`` under a branch on ``c`` (0 where it is off), so the address stays affine in the loop
    and the loop vectorizer makes a masked load of it, where the clamped address was a gather.
    The pure instructions that then compute on that 0 cannot trap (integer division is rendered
    with its divisor guarded, ``_divmod``)."""
    insts = k.insts
    masked = [i for i, x in enumerate(insts)
              if x.op == "LOAD" and insts[x.src[1]].op == "WHERE" and insts[x.src[1]].dtype == INDEX]
    if not masked:                                  # most kernels: no use map to build
        return {}
    users: dict[int, list[int]] = {}
    for i, x in enumerate(insts):
        for s in x.src:
            users.setdefault(s, []).append(i)

    def discarded(v: int, c: int) -> bool:
        """Every use of ``v`` leads only into the taken side of a WHERE on ``c`` (iteratively: a
        chain after a pad may be deeper than Python's recursion limit)."""
        seen, stack = set(), [v]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            us = users.get(n)
            if not us:
                return False
            for u in us:
                x = insts[u]
                if x.op == "WHERE" and x.src[0] == c and x.src[1] == n and x.src[2] != n:
                    continue
                if x.op in _EFFECTS:
                    return False
                stack.append(u)
        return True
    out = {}
    for i in masked:
        w = insts[insts[i].src[1]]
        if discarded(i, w.src[0]):
            out[i] = (w.src[0], w.src[1])
    return out


GATHER_TRIP = 16          # docs/lowering.md, Constants


def _gathering_loops(k: LoopKernel) -> set[int]:
    """Loops of a static trip count of at most GATHER_TRIP in which a load or store steps by more
    than one element per iteration (or by an index that is not affine in the loop): their latches
    get ``llvm.loop.vectorize.width 1`` (``!6``).

    Once LLVM has unrolled the short constant loops inside such a loop (a row of an attention
    score's 15 x 15 block), the loop itself is innermost, and on a target with 16 float lanes
    (AVX-512) the loop vectorizer made one masked vector iteration of it out of gathers and
    scatters of the strided rows. 16 is the widest float32 vector of x86-64: on a target of 8 lanes
    (x86-64-v3) the same kernels ran the same with and without the metadata. Measured on a 2-vCPU
    AMD EPYC (znver4), ns per element, (32, 12, 15, 15): ``x - x.amax(-1)`` 1.29 -> 0.48,
    ``x.sum(-1)`` 0.42 -> 0.19; a column sum (the loop's loads step by 1) keeps its vectorized loop;
    a long or run-time loop over rows of 2-3 elements is vectorized with gathers as before, 2-3x
    faster than its rows one at a time. A loop of exactly 16 is one unmasked vector of them: a cache
    block's rows written from its local array (lowering.py ``_block_tile``) were 32 scatters of 8
    floats a block, 3.0 against 0.37 ns an element (1024 x 1024 transpose, one thread, znver4)."""
    # index value -> {range: coefficient} where affine in the ranges, else the set of ranges it depends on
    coeff: dict[int, dict[int, int] | frozenset[int]] = {}
    out: set[int] = set()
    open_: list[int] = []
    steps: dict[int, bool] = {}                       # open short range -> a load/store in it steps by != 0, 1

    def of(v: int) -> dict[int, int] | frozenset[int]:
        got = coeff.get(v)                            # not an index value (a loaded integer): any open range
        return got if got is not None else frozenset(open_)

    def deps(c: dict[int, int] | frozenset[int]) -> frozenset[int]:
        return c if isinstance(c, frozenset) else frozenset(r for r, v in c.items() if v)

    for i, x in enumerate(k.insts):
        op = x.op
        if op == "RANGE":
            open_.append(i)
            coeff[i] = {i: 1}
            if isinstance(x.arg, int) and x.arg <= GATHER_TRIP:
                steps[i] = False
        elif op == "ENDRANGE":
            r = open_.pop()
            if steps.pop(r, False):
                out.add(r)
        elif op in ("LOAD", "STORE"):
            c = of(x.src[1])
            for r in steps:
                if (r in c) if isinstance(c, frozenset) else c.get(r, 0) not in (0, 1):
                    steps[r] = True
        elif x.dtype == INDEX:
            srcs = [of(v) for v in x.src]
            if op == "CONST":
                coeff[i] = {}
            elif op == "ADD" and all(isinstance(c, dict) for c in srcs):
                a, b = srcs
                coeff[i] = {r: a.get(r, 0) + b.get(r, 0) for r in a.keys() | b.keys()}
            elif op == "MUL" and all(isinstance(c, dict) for c in srcs) and any(k.insts[v].op == "CONST" for v in x.src):
                a, b = srcs
                f, c = (k.insts[x.src[1]].arg, a) if k.insts[x.src[1]].op == "CONST" else (k.insts[x.src[0]].arg, b)
                coeff[i] = {r: v * f for r, v in c.items()}
            else:
                coeff[i] = frozenset().union(*map(deps, srcs))
    return out


def _loops_without(k: LoopKernel, grouped: set[int]) -> set[int]:
    """The RANGEs of ``k`` with no instruction of ``grouped`` (a lane group's) inside them."""
    out, open_, has = set(), [], []
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            open_.append(i)
            has.append(False)
        elif x.op == "ENDRANGE":
            r, h = open_.pop(), has.pop()
            if not h:
                out.add(r)
            elif has:
                has[-1] = True
        elif i in grouped and has:
            has[-1] = True
    return out


def _outer_loops(k: LoopKernel) -> set[int]:
    """Loops that hold another loop: their latches get ``llvm.loop.unroll.disable`` (``!4``).

    LLVM's O3 unroller fully unrolls a loop whose body became straight-line once the loops inside it
    were vectorized and unrolled, so a nest of short constant loops (a convolution's weight
    gradient: 4 x 4 x 16 x 16 taps) was replicated hundreds of times: 150 lines of IR took 1 s
    to compile into 25 KB of code. With the outer loops kept, the innermost loop is still
    vectorized, interleaved and unrolled. Measured with both versions of every kernel compiled in
    one process and run in turn (15 runs each, 2-core EPYC): LLVM compile of a small ResNet
    training step's 49 kernels 12.2 s -> 6.4 s; run time of that step, a BERT forward, a LLaMA-shaped decode step, a 4-layer MLP step,
    512/1024 matmuls, attention and a conv 0.97-1.03x (total 0.98-1.00x)."""
    out, stack = set(), []
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            if stack: out.add(stack[-1])
            stack.append(i)
        elif x.op == "ENDRANGE":
            stack.pop()
    return out


def _short_nests(k: LoopKernel, runtime: set[int | None]) -> tuple[set[int], set[int]]:
    """Loops of a constant trip count that hold only short constant loops -- each loop directly
    inside runs, with the loops inside it, fewer than GATHER_TRIP iterations in all -- as (those
    loops, the loops inside them); ``runtime``: the loops whose extent is known only when the kernel
    runs (a sized program's, the loop split across threads).
    Both are left out of :func:`_outer_loops`: LLVM unrolls the short loops fully (they are
    shorter than a vector; its unroller takes them whole), and the loop that held them is then an
    innermost loop with a straight-line body, which LLVM may vectorize and unroll like any other.
    Kept, a row-fused kernel over short rows ran its rows one at a time: max-pool's backward over
    2 x 2 windows (a max, a count and the output, rows of 4, under a loop of 16 windows) took
    515-840 us for (32, 16, 32, 32), 104-114 us without the metadata (2-vCPU Intel Xeon, Rocket
    Lake). A loop run over rows split across threads or of a run-time extent keeps its metadata
    (layer norm over rows of 12 and sums over rows of 3 ran 1.2-1.5x slower without it). Unrolling
    stops at the first loop up: a loop that holds such a loop is outer again, so
    the nests of the conv weight gradient in _outer_loops are not replicated. A short nest's loop
    that strides over rows (``_gathering_loops``) keeps its own metadata."""
    children: dict[int, list[int]] = {}
    stack: list[int] = []
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            if stack:
                children.setdefault(stack[-1], []).append(i)
            stack.append(i)
        elif x.op == "ENDRANGE":
            stack.pop()
    span: dict[int, int | None] = {}

    def iterations(r: int) -> int | None:
        """Iterations of ``r``'s body, the loops inside it counted, per entry; None if not static."""
        if r not in span:
            n, got = k.insts[r].arg, [iterations(c) for c in children.get(r, ())]
            span[r] = None if not isinstance(n, int) or r in runtime or None in got else n * max(1, sum(got))
        return span[r]
    roots = {r for r, cs in children.items() if iterations(r) is not None
             and all((n := iterations(c)) is not None and n < GATHER_TRIP for c in cs)}
    inside: set[int] = set()
    todo = [c for r in roots for c in children[r]]
    while todo:
        c = todo.pop()
        inside.add(c)
        todo += children.get(c, ())
    return roots - inside, inside


# loop metadata: with explicit lanes the loop vectorizer must stay off (it would vectorize the
# reduce loop with gathers); the lanes are vectors already (_Lanes), or SLP packs what is left. !3 marks interleaved loops.
_LOOP_MD = {
    True: ('!0 = distinct !{!0, !1}\n!1 = !{!"llvm.loop.mustprogress"}\n'
           f'!2 = !{{!"llvm.loop.interleave.count", i32 {INTERLEAVE}}}\n!3 = distinct !{{!3, !1, !2}}\n'
           '!4 = distinct !{!4, !1, !5}\n!5 = !{!"llvm.loop.unroll.disable"}\n'),
    False: '!0 = distinct !{!0, !1, !2}\n!1 = !{!"llvm.loop.mustprogress"}\n!2 = !{!"llvm.loop.vectorize.width", i32 1}\n'
           '!4 = distinct !{!4, !1, !2, !5}\n!5 = !{!"llvm.loop.unroll.disable"}\n',
}


_GATHERING_MD = '!6 = distinct !{!6, !1, !5, !7}\n!7 = !{!"llvm.loop.vectorize.width", i32 1}\n'
# a lane kernel's loops with no lane group inside (_loops_without): the loop vectorizer may widen them
_SCALAR_MD = '!8 = distinct !{!8, !1}\n!9 = distinct !{!9, !1, !5}\n'
# In a kernel with register lanes, the loops the loop vectorizer widens (those above, or every loop
# of a root-dots kernel without lanes) may be as wide as the lanes (a float32 vector of the widest
# of LANES_LAST: 512 bits, AVX-512's): x86's tuning for AVX-512 cores prefers 256-bit vectors for
# what the vectorizers make (so code that would use no 512-bit register does not pay for it), and
# a row-fused attention kernel, whose lanes are 16-wide, computed each row's exp2 and sum 8 wide
# (docs/lowering.md, "wide row loops"). LLVM clamps the width to the target's vectors: the same
# source serves an AVX2 target.
WIDE_LOOP_BITS = 32 * max(LANES_LAST)
_WIDE_ATTRS = f'attributes #0 = {{ "prefer-vector-width"="{WIDE_LOOP_BITS}" }}\n'

# ------------------------------------------------------------------ compiler and runtime

# llvmlite parses every module into LLVM's one global context, and MCJIT's add_object_file /
# finalize_object are not thread-safe: compiles from two threads at once crashed the process
# (tests/test_threads.py, 3 of 5 runs). So one compile (and one load, and one engine disposal) at
# a time, process-wide; running compiled code needs no lock (finalize_object never re-protects
# pages that already hold code).
COMPILE_LOCK = threading.RLock()

# Both locks are held across os.fork() (a fork used to hang the child): a thread inside LLVM at the
# fork -- an O3 run holds llvmlite's own lock, which the child would wait on forever, and leaves
# LLVM's state half changed -- makes the fork wait for it instead. Re-creating a lock in the child
# is no fix: the parent's thread is gone mid-call, and other modules hold COMPILE_LOCK by name. The
# order is the code's (llvmlite is only called inside COMPILE_LOCK, never the other way round); both
# are re-entrant, so a thread that holds them may fork. llvmlite's lock (``ffi.lib._lock``, every
# call into LLVM takes it) is private: a llvmlite without it leaves COMPILE_LOCK alone guarding.
_LLVMLITE_LOCK = getattr(llvm.ffi.lib, "_lock", None)
_LLVMLITE_LOCK = _LLVMLITE_LOCK if hasattr(_LLVMLITE_LOCK, "__enter__") else contextlib.nullcontext()


def _before_fork() -> None:
    COMPILE_LOCK.acquire()
    _LLVMLITE_LOCK.__enter__()


def _after_fork() -> None:               # in the parent and in the child (the forking thread holds both)
    _LLVMLITE_LOCK.__exit__(None, None, None)
    COMPILE_LOCK.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)

llvm.initialize_native_target()           # (0.2 ms: at import, not behind a lock of its own)
llvm.initialize_native_asmprinter()


def _serialized(fn):
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with COMPILE_LOCK:
            return fn(*args, **kwargs)
    return locked


@functools.lru_cache(maxsize=None)
def host_target() -> tuple[str, str]:
    """This CPU's LLVM name and feature string (asked once: 0.4 ms a call)."""
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


class LLVMCompiler:
    """Compiles LLVM IR text at O3 for one target CPU to object code. ``target`` is (LLVM CPU
    name, feature string), as devices/cpu.py resolves EQGRAD_CPU; None is the host's name and
    features (``cpu`` and ``features`` are then the host's, for cache keys)."""

    def __init__(self, target: tuple[str, str] | None = None) -> None:
        self.llvm = llvm
        self.target = target
        self.cpu, self.features = target or host_target()
        self._warm = False
        self.tm = self.target_machine()                  # for the optimization pipeline and codegen

    def target_machine(self):
        """A new target machine for this target (engines must never share one: llvm_worker.py)."""
        return llvm_worker.target_machine(self.llvm, self.cpu, self.features)

    def optimize(self, mod):
        """Run the O3 pipeline for this target on a parsed module (in place); returns it."""
        return llvm_worker.optimize(self.llvm, self.tm, mod)

    @_serialized
    def object_code(self, src: str, name: str, symbol: str, nontemporal: bool = False) -> tuple[bytes, int]:
        """Optimize (O3, for the target) and compile ``src`` with its function ``name`` renamed
        ``symbol``; returns (the object code, how many vector stores were made non-temporal).
        ``nontemporal``: see ``streaming_store`` (the caller guarantees the alignment it claims).
        The compile worker runs the same function (llvm_worker.compile_object)."""
        GlobalCounters.kernels_compiled += 1
        return llvm_worker.compile_object(self.llvm, self.tm, src, name, symbol, nontemporal)

    @_serialized
    def warm(self) -> None:
        """Compile one tiny function and drop it (once): LLVM sets up its pass pipelines and code
        generator on the first compile (~25 ms), which a first realize would otherwise wait for."""
        if self._warm:
            return
        self._warm = True
        src = "define void @eqwarm(ptr %p) {\n  store float 1.0, ptr %p\n  ret void\n}\n"
        llvm_worker.compile_object(self.llvm, self.tm, src, "eqwarm", "eqwarm")

    @_serialized
    def assembly(self, src: str) -> str:
        mod = self.llvm.parse_assembly(src)
        return self.tm.emit_assembly(mod)


_compilers: dict[tuple[str, str] | None, LLVMCompiler] = {}


def compiler(target: tuple[str, str] | None = None) -> LLVMCompiler:
    """The compiler for ``target`` (None: the host), created on first use."""
    with COMPILE_LOCK:
        if target not in _compilers:
            _compilers[target] = LLVMCompiler(target)
        return _compilers[target]


# object code compiled ahead for the kernels of plans being prepared (cpu.py ``prefetch``), by kernel
# key: LLVMProgram takes it as it takes a disk-cache hit
PREFETCHED: dict[str, tuple[bytes, int]] = {}
_engines: "weakref.WeakSet[CodeEngine]" = weakref.WeakSet()
_unfreed: list[Any] = []        # MCJIT engines dropped while another thread held COMPILE_LOCK


def _free_unfreed() -> None:
    """Dispose of the engines dropped while the lock was taken (the caller holds COMPILE_LOCK)."""
    while _unfreed:
        _unfreed.pop().close()


class CodeEngine:
    """One MCJIT engine and the machine code loaded into it, which is unmapped when the last
    program holding the engine is gone (``LLVMProgram.engine``).

    MCJIT frees code only with its engine: ``remove_module`` after ``finalize_object`` frees the
    module's IR but keeps its code (2,000 small kernels in one engine: +29 MB RSS with
    remove_module, +80 MB without; one engine per kernel, dropped: +6 MB, all of it the pass
    builder's and LLVM's context's own small leaks). So the LLVM device gives each prepared plan
    its own engine (cpu.py): its kernels live as long as the plan, or longer where a later plan
    shares one. An engine costs ~1 ms, made on the first load (a plan whose kernels are all
    compiled already makes none); its initial empty module is removed at once, since finalizing
    it would run codegen (1.6 ms). Loading an object file costs 0.1-0.3 ms."""

    def __init__(self, compiler: LLVMCompiler) -> None:
        self.compiler = compiler
        self._engine: Any = None
        self._symbols: dict[str, int] = {}
        self.code_bytes = 0           # object code loaded

    @_serialized
    def load(self, symbol: str, obj: bytes) -> int:
        """Load object code defining ``symbol`` (once: a symbol already loaded is not loaded
        again) and return the function's address."""
        if symbol in self._symbols:
            return self._symbols[symbol]
        _free_unfreed()
        llvm = self.compiler.llvm
        if self._engine is None:
            _libcalls(self.compiler)
            empty = llvm.parse_assembly("")
            self._engine = llvm.create_mcjit_compiler(empty, self.compiler.target_machine())
            self._engine.remove_module(empty)
            _engines.add(self)
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        addr = self._engine.get_function_address(symbol)
        if not addr:
            raise RuntimeError(f"the object code ({len(obj)} bytes) defines no function {symbol}")
        self._symbols[symbol] = addr
        self.code_bytes += len(obj)
        return addr

    def __del__(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None or sys is None or sys.is_finalizing():      # (sys: None late in shutdown)
            return
        # never wait in a finalizer: the thread that holds the lock may be waiting for this one
        if COMPILE_LOCK.acquire(blocking=False):
            try:
                engine.close()
                _free_unfreed()
            finally:
                COMPILE_LOCK.release()
        else:
            _unfreed.append(engine)


def live_code() -> tuple[int, int]:
    """(MCJIT engines alive, bytes of object code loaded into them): what compiled kernels hold."""
    alive = [e for e in list(_engines) if e._engine is not None]
    return len(alive), sum(e.code_bytes for e in alive)


# ------------------------------------------------------------------ streaming stores
# A large elementwise kernel writes its output once and never reads it back in the kernel: normal
# stores first read each output line into the cache (write-allocate), a third of the DRAM traffic
# of a 2-input kernel. Non-temporal stores skip that (measured: the 8-op chain on 16M floats,
# 7.9 -> 7.0 ms on two cores). x86 needs them aligned to the vector, which the loop vectorizer
# cannot know from scalar IR (it then refuses to vectorize), so they are added to the vectorized
# module's main-loop stores after optimization; the runtime guarantees the alignment they claim:
# outputs of NT_MIN bytes or more are page-aligned mappings (hostmem.py), the thread split cuts
# at multiples of 16 elements (cpu.py), and a misaligned output runs a plain copy of the kernel.
NT_MIN = 4 << 20          # = hostmem.HUGE_MIN, from which outputs are page-aligned (docs/lowering.md, Constants)


def streaming_store(k: LoopKernel, out_bytes: int) -> bool:
    """One parallel loop whose stores, one per output (a GROUP's several), each write element ``i``
    at iteration ``i`` (so vector stores from a loop start that is a multiple of 16 are 64-byte
    aligned, for outputs that are: ``LLVMProgram`` checks), with outputs of NT_MIN+ bytes each."""
    if out_bytes < NT_MIN or not k.loop_vectorize or k.parallel != 1:
        return False
    ranges = [i for i, x in enumerate(k.insts) if x.op == "RANGE"]
    stores = [x for x in k.insts if x.op == "STORE"]
    outs = [i for i, p in enumerate(k.params) if p[2]]
    return (len(ranges) == 1 and sorted(x.src[0] for x in stores) == outs
            and all(x.src[1] == ranges[0] for x in stores) and k.insts[ranges[0]].arg % 16 == 0
            and all(_name(k.params[i][1]) in ("float32", "int32") for i in outs))


class LLVMProgram:
    """One compiled kernel: a ctypes function into the machine code of ``engine`` (a new
    CodeEngine by default), which it keeps alive. The object code is read from the disk cache
    when an earlier process compiled the same source for the same target (kernelcache.py), else
    compiled and stored there. The function is named by that key (``eqk_<sha256 prefix>``), so
    symbols are unique in an engine and an object file defines the symbol its key names."""

    def __init__(self, k: LoopKernel, src: str, nontemporal: bool = False, target: tuple[str, str] | None = None,
                 engine: CodeEngine | None = None, sized: bool = False):
        self.name, self.src, self.nontemporal = k.name, src, nontemporal
        self.compiler = compiler(target)
        self.engine = engine if engine is not None else CodeEngine(self.compiler)
        # a sized program (render_llvm's ``sized``) takes its size array after the buffers
        self.n_params = len(k.params)
        # the outputs: the first parameters, the buffers the code writes (not ``readonly``; read off
        # the source, which a disk-cached kernel has without its loop IR)
        head = src[src.find("define void @"):]
        self.n_outs = len(re.findall(r"ptr noalias %p\d+[,)]", head[:head.find("{")]))
        n_ptrs = len(k.params) + bool(sized)
        self._sig = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_ptrs), ctypes.c_int64, ctypes.c_int64)
        self.fn, stores = self._load(nontemporal)
        self.nontemporal_stores = stores if nontemporal else 0       # vector stores made NT
        self._plain: Any = None if not nontemporal else False     # compiled on first misaligned output

    def _load(self, nontemporal: bool) -> tuple[Any, int]:
        c = self.compiler
        key = kernelcache.kernel_key(self.src, c.cpu, c.features, nontemporal)
        symbol = f"eqk_{key[:32]}"
        hit = PREFETCHED.pop(key, None) or kernelcache.load(key)
        if hit is not None:
            try:
                return self._sig(self.engine.load(symbol, hit[0])), hit[1]
            except RuntimeError as e:          # checked bytes that still do not load: compile instead
                kernelcache.unusable(key, str(e))
        obj, stores = c.object_code(self.src, self.name, symbol, nontemporal)
        kernelcache.store(key, obj, stores)
        return self._sig(self.engine.load(symbol, obj)), stores

    def __call__(self, *ptrs: int, lo: int, hi: int) -> None:
        """Run iterations [lo, hi) of the kernel's outermost parallel loop (ignored without one).
        With streaming stores, ``lo`` must be a multiple of 16 (cpu.py cuts so)."""
        (self._function(ptrs) if self.nontemporal else self.fn)(*ptrs, lo, hi)

    def native(self, ptrs: list[int] | tuple[int, ...]) -> tuple[int, list[int] | tuple[int, ...]]:
        """(the address of the function ``__call__`` runs for buffers ``ptrs``, its pointer
        arguments): spin.py's workers call it as ``fn(*ptrs, lo, hi)``."""
        return ctypes.cast(self._function(ptrs), ctypes.c_void_p).value, ptrs

    def _function(self, ptrs: list[int] | tuple[int, ...]) -> Any:
        """The function for these buffers: without streaming stores where an output is not
        64-byte aligned."""
        if self.nontemporal and (ptrs[0] % 64 or (self.n_outs > 1 and any(p % 64 for p in ptrs[1:self.n_outs]))):
            if not self._plain:
                self._plain = self._load(False)[0]
            return self._plain
        return self.fn
