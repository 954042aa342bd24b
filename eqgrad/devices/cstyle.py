"""Loop IR -> C-like kernel source, shared by the OpenCL C and CUDA C renderers.

``CStyleRenderer`` holds everything the two dialects have in common; a dialect is a subclass that
sets a dozen strings (kernel qualifier, address space, global id, math function names, types) and,
where it differs, its op table ``code_for_op`` (``CSTYLE_OPS`` with entries replaced or left out).
An op the table lacks is decomposed before rendering (``lower/decomp.py``: exp2, log2, sin).
The semantics mirror the LLVM renderer (``llvm.py``) exactly:

- bools are ``bool`` in registers and one byte (0 or 1) in memory;
- int32 ``+ * -x`` wrap around (computed in unsigned arithmetic: signed overflow is undefined in C),
  and so do shifts (``SHR`` is logical: unsigned; shifts are int32 only);
- the other integer dtypes (``INT_KINDS``: int8 uint8 int16 uint32 int64) where a dialect has them
  (``supported_kinds``, ``int_types``: OpenCL C's char uchar short uint long) are computed in their
  own type, ``+ * -x`` through an unsigned type of at least 32 bits and converted back (C promotes
  the 8- and 16-bit ones to int, whose product overflows); the unsigned ones compare, divide and
  take maxima unsigned; integer -> integer casts are C's conversions (wrap, sign- or zero-extend);
- ``IDIV``/``MOD`` of every integer dtype give 0 for a zero divisor, and ``MIN / -1`` wraps to ``MIN``
  (helpers ``idiv_i32``/``mod_i32``, ``idiv_<dtype>``/``mod_<dtype>``);
  index arithmetic (64-bit) divides by positive constants only, with floor semantics: plain C
  ``/ %`` where the loop IR marks the numerator non-negative (``loopir.NONNEG``), otherwise the
  helpers ``floordiv_idx``/``floormod_idx``;
- float ``MAX`` propagates NaN (NumPy's ``maximum``; C's ``fmax`` would drop it);
- float -> integer casts truncate, saturate at the dtype's range and map NaN to 0 (LLVM's
  ``fptosi.sat``/``fptoui.sat``: helpers ``f2i_sat``, ``f2<dtype>_sat``); float -> bool is ``!= 0``;
- float constants are exact hex literals; division and sqrt are correctly rounded;
- ``MULADD`` is one expression ``a * b + c``, which the C compilers contract into an FMA (OpenCL's
  and nvcc's default), as LLVM does; every other instruction is its own statement, never contracted;
- exp2/log2/sin are the dialect's full-precision library functions (never the ``native_``/``__``
  fast variants) where its table has them, else the decompositions (the LLVM device's numbers,
  and vectorizable where a CPU OpenCL's library calls are not); both are inside the documented
  error bounds (docs/semantics.md). sin's decomposition reduces in double, so a dialect renders
  ``float64`` and its constant tables (``fp64_pragma``, ``table_prefix``).

Every instruction becomes one typed local (``v12``), constants are written inline, loops are C
``for`` loops and accumulators are locals declared before their loops. The loop IR's ``parallel``
leading output loops are not loops here: work-items (threads) run their iterations, mapped as
``launch`` decides (a grid over the innermost loops, or a work-group per output element for a long
reduction); the runtime launches what ``launch`` returns, so the two always agree.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from eqgrad.devices.render import FLOATS, MissingRule, Operation, kind as _kind
from eqgrad.graph.loopir import FLOAT64, INDEX, NONNEG, LInst, LoopKernel, Table
from eqgrad.errors import DTypeError
from eqgrad.lower.decomp import decompose, libm64
from eqgrad.ops import OPS

# ------------------------------------------------------------------ the op table
# A rule gets the renderer (its dialect's strings, ``helper`` for helper functions, ``table`` for
# constant arrays), the Operation (the kinds it works on) and its operands' C expressions, and
# returns the result's expression.
CRule = Callable[["CStyleRenderer", Operation, list[str]], str]


# the integer kinds besides int32: (bits, signed). A dialect computes them where its
# ``supported_kinds`` has them and ``int_types`` names their C types (OpenCL C: char, uchar, ...)
INT_KINDS = {"int8": (8, True), "uint8": (8, False), "int16": (16, True), "uint32": (32, False),
             "int64": (64, True)}

_SAME: Any = object()      # _by_kind: float64 as float32, index as int32


def _by_kind(f: Any = None, i: Any = None, b: Any = None, ix: Any = _SAME, d: Any = _SAME,
             n: Any = _SAME) -> CRule:
    """A rule whose expression depends on the operands' kind: ``f`` float32, ``d`` float64 (default:
    as ``f``), ``i`` int32, ``ix`` index (default: as ``i``), ``n`` the other integer kinds (int8,
    uint8, int16, uint32, int64: default as ``i``), ``b`` bool. Each is a template (``{0}``.. the
    operands, ``{u}`` the dialect's unsigned int), a function (renderer, Operation, operands) ->
    expression, or None (undefined on that kind)."""
    by_kind = {"float32": f, "float64": f if d is _SAME else d, "int32": i, INDEX: i if ix is _SAME else ix,
               "bool": b, **dict.fromkeys(INT_KINDS, i if n is _SAME else n)}

    def rule(r: CStyleRenderer, o: Operation, a: list[str]) -> str:
        text = by_kind.get(o.src)
        if text is None:
            raise MissingRule(r.name, o)
        return text(r, o, a) if callable(text) else text.format(*a, u=r.uint_type)
    return rule


def _math(op: str) -> CRule:
    """The dialect's float32 library function (``math``), or C's double one."""
    def rule(r: CStyleRenderer, o: Operation, a: list[str]) -> str:
        if not o.is_float:
            raise MissingRule(r.name, o)
        return f"{r.math[op] if o.src == 'float32' else MATH64[op]}({a[0]})"
    return rule


# C99 <math.h> functions: the op table's (OpDef.libm) and the loop IR's own (FLOOR, RINT)
MATH64 = {**{o.name: o.libm for o in OPS.values() if o.libm}, "FLOOR": "floor", "RINT": "rint"}


def _wrap(op: str) -> Callable[[CStyleRenderer, Operation, list[str]], str]:
    return lambda r, o, a: r.wrap(a[0], op, a[1], o.src)


def _divmod(op: str) -> CRule:
    def rule(r: CStyleRenderer, o: Operation, a: list[str]) -> str:
        if o.src == INDEX:           # by positive constants only, floor semantics (loopir.py)
            if o.nonneg:             # the numerator is proven >= 0: truncation is floor
                return f"{a[0]} {'/' if op == 'IDIV' else '%'} {a[1]}"
            return f"{r.helper('floordiv_idx' if op == 'IDIV' else 'floormod_idx')}({a[0]}, {a[1]})"
        if o.src == "int32":
            return f"{r.helper('idiv_i32' if op == 'IDIV' else 'mod_i32')}({a[0]}, {a[1]})"
        if o.src not in INT_KINDS:
            raise MissingRule(r.name, o)
        return f"{r.helper(('idiv_' if op == 'IDIV' else 'mod_') + o.src)}({a[0]}, {a[1]})"
    return rule


_WIDTH = {"float32": 4, "int32": 4, "float64": 8, **{k: b // 8 for k, (b, _) in INT_KINDS.items()}}


def _bitcast(r: CStyleRenderer, o: Operation, a: list[str]) -> str:
    casts = {("float32", "int32"): r.as_int, ("int32", "float32"): r.as_float}
    if (o.src, o.dst) in casts:
        return f"{casts[o.src, o.dst]}({a[0]})"
    if r.as_type and {o.src, o.dst} <= r.supported_kinds and o.src in _WIDTH and \
            _WIDTH[o.src] == _WIDTH.get(o.dst):          # OpenCL C's as_<type>: the same bits
        return f"{r.as_type}{r.reg_type(o.dst)}({a[0]})"
    raise MissingRule(r.name, o)


CSTYLE_OPS: dict[str, CRule] = {
    "NEG": _by_kind(f="-{0}", i=lambda r, o, a: r.wrap("0", "-", a[0], o.src), b="!{0}", ix="-{0}"),
    **{op: _math(op) for op in MATH64},
    "RECIP": lambda r, o, a: f"1.0{'f' if o.src == 'float32' else ''} / {a[0]}",
    "CAST": lambda r, o, a: r.cast(a[0], o.src, o.dst),
    "BITCAST": _bitcast,
    "ADD": _by_kind(f="{0} + {1}", i=_wrap("+"), b="{0} || {1}", ix="{0} + {1}"),
    "MUL": _by_kind(f="{0} * {1}", i=_wrap("*"), b="{0} && {1}", ix="{0} * {1}"),
    "MULADD": _by_kind(f="{0} * {1} + {2}"),
    "MAX": _by_kind(f=lambda r, o, a: f"{r.helper('max_f32')}({a[0]}, {a[1]})",
                    d=lambda r, o, a: f"{r.helper('max_f64')}({a[0]}, {a[1]})", i="{0} > {1} ? {0} : {1}",
                    b="{0} || {1}"),
    "CMPLT": _by_kind(f="{0} < {1}", i="{0} < {1}", b="!{0} && {1}"),
    "CMPEQ": _by_kind(f="{0} == {1}", i="{0} == {1}", b="{0} == {1}"),
    "IDIV": _divmod("IDIV"),
    "MOD": _divmod("MOD"),
    "AND": _by_kind(i="{0} & {1}", b="{0} & {1}"),
    "OR": _by_kind(i="{0} | {1}", b="{0} | {1}"),
    "XOR": _by_kind(i="{0} ^ {1}", b="{0} ^ {1}"),
    "SHL": _by_kind(i="(int)(({u}){0} << {1})", ix=None, n=None),      # int32 only (the loop IR's)
    "SHR": _by_kind(i="(int)(({u}){0} >> {1})", ix=None, n=None),
    "WHERE": lambda r, o, a: f"{a[0]} ? {a[1]} : {a[2]}",
    "TABLE": lambda r, o, a: f"{r.table(o.arg, o.dst)}[{a[0]}]",
}


@dataclass(frozen=True)
class Launch:
    mode: str                              # "grid" | "flat" | "group" (CStyleRenderer.launch)
    global_size: tuple[int, int, int]      # work-items per dimension, a multiple of local_size
    local_size: tuple[int, int, int]       # work-items per group


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def work_items(k: LoopKernel) -> int:
    """How many work-items the kernel's parallel loops make (1 when it has none)."""
    return math.prod(k.insts[r].arg for r in k.parallel_ranges())


def _reduce_tops(k: LoopKernel) -> dict[int, list[tuple[int, str]]] | None:
    """The outermost reduce loops directly inside ``k``'s parallel loops, each with the accumulators
    declared outside it that it fills ({RANGE: [(accumulator, op), ...]}); None where there is none or
    the kernel stores inside a loop (row-fused). Structure only (no extent): worked out once per
    loop kernel, since a prepare asks for a kernel's launch several times (its family's key, its
    source's prologue, its launch), a decode step's ~50 walks of up to thousands of instructions
    cost ~15 ms on OpenCL."""
    memo = k.__dict__.get("_reduce_tops", False)
    if memo is not False:
        return memo
    body = range(len(k.params) + k.parallel, len(k.insts) - k.parallel)
    depth, cur, top, acc_depth = 0, -1, {}, {}
    out: dict[int, list[tuple[int, str]]] | None = None
    for i in body:
        x = k.insts[i]
        if x.op == "RANGE":
            if depth == 0:
                cur, top[i] = i, []
            depth += 1
        elif x.op == "ENDRANGE":
            depth -= 1
        elif x.op == "DEFACC":
            acc_depth[i] = depth
        elif x.op == "STORE" and depth > 0:
            break               # a row-fused kernel (Lowerer.hoist): its output loop is not a reduction
        elif x.op == "ACCUM" and depth > 0 and acc_depth[x.src[0]] == 0 and (x.src[0], x.arg) not in top[cur]:
            top[cur].append((x.src[0], x.arg))
    else:
        out = top or None
    k.__dict__["_reduce_tops"] = out
    return out


SUPPORTED_KINDS = frozenset({"bool", "int32", "float32", "float64", INDEX})   # tensors' and registers' kinds


class CStyleRenderer:
    """A C dialect: the strings below, its op table, and the helpers and tables a kernel uses."""
    code_for_op: dict[str, CRule] = CSTYLE_OPS
    supported_kinds = SUPPORTED_KINDS      # the kinds it renders; any other dtype is a DTypeError
    # INT_KINDS it has: kind -> (C type, the unsigned C type its wrapping arithmetic is done in,
    # literal suffix); only where ``supported_kinds`` has them too
    int_types: dict[str, tuple[str, str, str]] = {}
    as_type = ""                           # prefix of the dialect's same-bits casts (OpenCL C: as_)
    kernel_prefix = "void"                 # what precedes the kernel's name
    global_ptr = ""                        # address space of buffer parameters
    restrict = "restrict"
    func_prefix = "static inline"          # helper functions
    table_prefix = "static const"          # constant tables (loopir.Table)
    fp64_pragma = ""                       # what a kernel that uses double needs first
    global_id = "0"                        # the work-item's global linear id (an index expression)
    global_ids = ("0", "0", "0")           # its global id in dimensions 0, 1, 2
    max_grid = (2**31 - 1, 2**31 - 1, 2**31 - 1)    # most groups per dimension
    group_id = "0"                         # the work-group's id and the work-item's id in it
    local_id = "0"
    local_prefix = ""                      # declares an array in work-group (local/shared) memory
    barrier = ""                           # a work-group barrier on local memory
    group_size = 64                        # work-items per group (at most; a power of two)
    reduce_group = 0                       # work-items that share one reduction (0: never)
    index_type = "long"                    # 64-bit signed, like LLVM's i64 index
    index_suffix = "L"
    uint_type = "unsigned int"
    byte_type = "unsigned char"            # how a bool is stored in memory
    math = {**MATH64, "FMAX": "fmax"}      # float32 library functions (overloaded, as in OpenCL C)
    as_float, as_int = "as_float", "as_int"   # bit casts between float and int
    inf = "INFINITY"
    nan = "NAN"
    name = "C"

    # ------------------------------------------------------------------ literals and types
    def reg_type(self, kind: str) -> str:
        if kind in self.int_types:
            return self.int_types[kind][0]
        return {"float32": "float", "float64": "double", "int32": "int", "bool": "bool", INDEX: self.index_type}[kind]

    def mem_type(self, kind: str) -> str:
        if kind in self.int_types:
            return self.int_types[kind][0]
        return {"float32": "float", "float64": "double", "int32": "int", "bool": self.byte_type}[kind]

    def const(self, v: Any, kind: str) -> str:
        if kind in FLOATS:
            f = float(np.float32(v)) if kind == "float32" else float(v)
            suffix, cast = ("f", "") if kind == "float32" else ("", "(double)")
            if math.isnan(f):
                return f"{cast}{self.nan}"
            if math.isinf(f):
                return f"{cast}{self.inf}" if f > 0 else f"(-{cast}{self.inf})"
            if f == 0.0:
                return f"(-0.0{suffix})" if math.copysign(1.0, f) < 0 else f"0.0{suffix}"
            h = re.sub(r"\.?0+p", "p", f.hex())          # 0x1.8000000000000p+1 -> 0x1.8p+1
            return f"({h}{suffix})" if f < 0 else f"{h}{suffix}"
        if kind == "bool":
            return "true" if v else "false"
        n = int(v)
        if kind in self.int_types:
            bits, signed = INT_KINDS[kind]
            lo = -2 ** (bits - 1) if signed else 0
            n = (n - lo) % 2 ** bits + lo                   # wrapped into the dtype's range
            suffix = self.int_types[kind][2]
            if n == lo and bits > 16 and signed:            # -2**63 is no literal: 2**63 overflows
                return f"(-{-n - 1}{suffix} - 1)"
            return f"({n}{suffix})" if n < 0 else f"{n}{suffix}"
        suffix = self.index_suffix if kind == INDEX else ""
        if kind == "int32" and n == -2**31:
            return "(-2147483647 - 1)"
        return f"({n}{suffix})" if n < 0 else f"{n}{suffix}"

    # ------------------------------------------------------------------ helpers and tables (emitted on use)
    def helper(self, name: str) -> str:
        """Use the helper function ``name`` (``helpers``): it is emitted before the kernel."""
        self.used.add(name)
        return name

    def table(self, t: Table, kind: str) -> str:
        """Use the constant table ``t`` of ``kind`` elements: it is emitted before the kernel, once."""
        self.tables[t.name] = (t, kind)
        return t.name

    def helpers(self) -> dict[str, str]:
        p, u, fmax, ix = self.func_prefix, self.uint_type, self.math["FMAX"], self.index_type
        return {
            # NaN-propagating maximum, like NumPy's maximum and LLVM's llvm.maximum
            "max_f32": f"{p} float max_f32(float a, float b) {{ return (a != a || b != b) ? a + b : {fmax}(a, b); }}",
            "max_f64": f"{p} double max_f64(double a, double b) {{ return (a != a || b != b) ? a + b : fmax(a, b); }}",
            # truncating division with x / 0 = 0 and INT_MIN / -1 = INT_MIN (both undefined in C)
            "idiv_i32": f"{p} int idiv_i32(int a, int b) {{ return b == 0 ? 0 : b == -1 ? (int)(0u - ({u})a) : a / b; }}",
            "mod_i32": f"{p} int mod_i32(int a, int b) {{ return (b == 0 || b == -1) ? 0 : a % b; }}",
            # floor division and modulo of an index by a positive constant (C's / and % truncate)
            "floordiv_idx": f"{p} {ix} floordiv_idx({ix} a, {ix} b) {{ return a / b - (a % b < 0); }}",
            "floormod_idx": f"{p} {ix} floormod_idx({ix} a, {ix} b) {{ {ix} r = a % b; return r < 0 ? r + b : r; }}",
            # saturating float -> int32 with NaN -> 0, like LLVM's fptosi.sat
            "f2i_sat": f"{p} int f2i_sat(float x) {{ return x != x ? 0 : x >= 0x1p+31f ? 2147483647 : "
                       f"x <= -0x1p+31f ? (-2147483647 - 1) : (int)x; }}",
            "d2i_sat": f"{p} int d2i_sat(double x) {{ return x != x ? 0 : x >= 0x1p+31 ? 2147483647 : "
                       f"x <= -0x1p+31 ? (-2147483647 - 1) : (int)x; }}",
            **{h: f"{p} {src}" for k in self.int_types for h, src in self._int_helpers(k).items()},
        }

    def _int_helpers(self, k: str) -> dict[str, str]:
        """The helpers of the integer kind ``k`` (INT_KINDS): division and modulo with x / 0 = 0,
        x % 0 = 0 and MIN / -1 = MIN (signed), and float -> ``k`` that truncates, saturates at the
        range and maps NaN to 0 (LLVM's fptosi.sat/fptoui.sat). Each comparison is exact: the
        limits are powers of two, and a value between the limit and its truncation truncates to it."""
        t, u, _ = self.int_types[k]
        bits, signed = INT_KINDS[k]
        hi = self.const(2 ** (bits - 1 if signed else bits) - 1, k)
        lo = self.const(-2 ** (bits - 1) if signed else 0, k)
        out = {}
        if signed:
            out[f"idiv_{k}"] = (f"{t} idiv_{k}({t} a, {t} b) {{ return b == 0 ? 0 : b == -1 ? "
                                f"({t})(({u})0 - ({u})a) : a / b; }}")
            out[f"mod_{k}"] = f"{t} mod_{k}({t} a, {t} b) {{ return (b == 0 || b == -1) ? 0 : a % b; }}"
        else:
            out[f"idiv_{k}"] = f"{t} idiv_{k}({t} a, {t} b) {{ return b == 0 ? 0 : a / b; }}"
            out[f"mod_{k}"] = f"{t} mod_{k}({t} a, {t} b) {{ return b == 0 ? 0 : a % b; }}"
        for pre, ft, sfx in (("f2", "float", "f"), ("d2", "double", "")):
            top = f"0x1p+{bits - 1 if signed else bits}{sfx}"
            low = f"x <= -0x1p+{bits - 1}{sfx}" if signed else f"x <= 0.0{sfx}"
            out[f"{pre}{k}_sat"] = (f"{t} {pre}{k}_sat({ft} x) {{ return x != x ? 0 : x >= {top} ? {hi} : "
                                    f"{low} ? {lo} : ({t})x; }}")
        return out

    # ------------------------------------------------------------------ ALU
    def wrap(self, a: str, op: str, b: str, kind: str = "int32") -> str:
        """Integer arithmetic that wraps around (unsigned in C, converted back): int32 in the
        dialect's unsigned int, the other INT_KINDS in their ``int_types`` unsigned type (the 8- and
        16-bit ones in a 32-bit one: C promotes them to int, whose product can overflow)."""
        if kind in self.int_types:
            t, u, _ = self.int_types[kind]
            return f"({t})(({u}){a} {op} ({u}){b})"
        u = self.uint_type
        return f"(int)(({u}){a} {op} ({u}){b})"

    def alu(self, op: str, k: str, a: list[str], nonneg: bool = False, dst: str | None = None) -> str:
        """The expression of ``op`` on operands ``a`` of kind ``k`` (its rule in ``code_for_op``)."""
        o = Operation(op, k, dst or k, NONNEG if nonneg else None)
        rule = self.code_for_op.get(op)
        if rule is None:
            raise MissingRule(self.name, o)
        return rule(self, o, a)

    def cast(self, a: str, src: str, dst: str) -> str:
        if src == dst:
            return a
        if src in FLOATS:
            if dst == "bool":
                return f"{a} != 0.0{'f' if src == 'float32' else ''}"      # NaN -> true, as LLVM's fcmp une
            if dst in FLOATS:
                return f"({self.reg_type(dst)}){a}"
            if dst in self.int_types:
                return f"{self.helper(('f2' if src == 'float32' else 'd2') + dst + '_sat')}({a})"
            i = f"{self.helper('f2i_sat' if src == 'float32' else 'd2i_sat')}({a})"
            return i if dst == "int32" else f"({self.reg_type(dst)}){i}"
        if dst == "bool":
            return f"{a} != 0"
        return f"({self.reg_type(dst)}){a}"

    # ------------------------------------------------------------------ launch geometry
    def group_reduce(self, k: LoopKernel) -> dict[int, list[tuple[int, str]]] | None:
        """Where the kernel shape allows, reduce with a work-group: one group per output element,
        whose ``reduce_group`` work-items split the outermost reduce loops (those directly inside
        the parallel loops) between them and combine each accumulator those loops fill through
        local memory; the rest of the body runs on every work-item and work-item 0 stores.
        Returns {outermost reduce RANGE: [(accumulator, "ADD" | "MAX"), ...]}, or None when the
        kernel keeps one work-item per output element (no reduction long enough to share, or many
        accumulators, e.g. a matmul tile, which is better kept in one work-item's registers)."""
        L = self.reduce_group
        if not L or any(x.op == "DEFLOCAL" for x in k.insts):
            # a local array (a row's stash) is per work-item: one work-item must fill all of it
            return None
        top = _reduce_tops(k)
        if top is None or sum(len(a) for a in top.values()) > 4 or max(k.insts[r].arg for r in top) < 4 * L \
                or work_items(k) * L >= 2**31:
            return None
        return top

    def launch(self, k: LoopKernel) -> Launch:
        """How to launch ``k`` (the runtime follows it; ``render`` writes the matching index code).

        - "group": a long reduction (``group_reduce``), one work-group per output element;
        - "grid": the innermost parallel loop is dimension 0, the next one dimension 1, the rest
          are fused into dimension 2, so neighbouring work-items read neighbouring memory (a CPU
          OpenCL vectorizes dimension 0 with plain vector loads; a GPU coalesces them); groups
          span dimensions 0 and 1, rounded up (the kernel returns early past the end);
        - "flat": one linear id, split by division -- only where the grid exceeds ``max_grid``."""
        if self.group_reduce(k):
            n = work_items(k)
            return Launch("group", (n * self.reduce_group, 1, 1), (self.reduce_group, 1, 1))
        ext = [k.insts[r].arg for r in k.parallel_ranges()][::-1] + [1, 1, 1]      # innermost first
        e0, e1, e2 = ext[0], ext[1], math.prod(ext[2:])
        l0 = _pow2_at_most(min(self.group_size, e0))
        l1 = _pow2_at_most(min(self.group_size // l0, e1))
        grid = (-(-e0 // l0), -(-e1 // l1), e2)
        if any(g > m for g, m in zip(grid, self.max_grid)):
            n = work_items(k)
            l0 = _pow2_at_most(min(self.group_size, n))
            return Launch("flat", (-(-n // l0) * l0, 1, 1), (l0, 1, 1))
        return Launch("grid", (grid[0] * l0, grid[1] * l1, e2), (l0, l1, 1))

    def _delinearize(self, par: list[int], k: LoopKernel, gid: str, put: Callable[[str], None],
                     val: dict[int, str], kinds: dict[int, str], sized: dict[int, int] | None = None) -> None:
        """Declare the loop variables of ``par`` (outermost first) from one linear id. ``sized``: a
        sized program's slots (``render``), whose extents are read from its argument ``sz``."""
        sized = sized or {}
        decls, lit, syms = [], 1, []       # the stride so far: a literal product times sized extents
        for r in reversed(par):                          # innermost varies fastest
            parts = ([self.const(lit, INDEX)] if lit != 1 or not syms else []) + syms
            stride = None if lit == 1 and not syms else " * ".join(parts)
            q = gid if stride is None else f"{gid} / {stride}" if len(parts) == 1 else f"{gid} / ({stride})"
            if r != par[0]:
                e = f"sz[{sized[r]}]" if r in sized else self.const(k.insts[r].arg, INDEX)
                q = f"{q} % {e}" if stride is None else f"({q}) % {e}"
            decls.append((r, q))
            if r in sized:
                syms.append(f"sz[{sized[r]}]")
            else:
                lit *= k.insts[r].arg
        for r, q in reversed(decls):
            val[r], kinds[r] = f"r{r}", INDEX
            put(f"{self.index_type} r{r} = {q};")

    # ------------------------------------------------------------------ the kernel
    def param(self, i: int, kind: str, written: bool) -> str:
        const = "" if written else "const "
        return f"{self.global_ptr}{const}{self.mem_type(kind)}* {self.restrict} b{i}"

    def render(self, k: LoopKernel, sized: dict[int, int] | None = None) -> str:
        """C source of ``k``, after rewriting the ops ``code_for_op`` lacks (lower/decomp.py).
        ``sized`` (instruction id -> slot, devices/sizeargs.py): a *sized* program, which reads
        those index constants and loop extents from its last argument ``sz`` (``k`` must be
        decomposed for this renderer already: the ids are its instructions')."""
        for x in (*(d for _, d, _ in k.params), *(x.dtype for x in k.insts)):
            if x is not None and _kind(x) not in self.supported_kinds:
                # never wrong numbers: a dtype this renderer has no types and casts for is refused
                raise DTypeError(f"the {self.name} device does not support {_kind(x)} yet (it supports "
                                 f"{', '.join(sorted(self.supported_kinds - {INDEX}))}; float64 needs cl_khr_fp64 "
                                 f"on OpenCL); use the LLVM or NUMPY device, or cast to a supported dtype")
        dk = decompose(k, self.code_for_op)
        if sized and dk is not k:
            raise ValueError("render: a sized program's loop kernel must be decomposed for the renderer first")
        k = dk
        self.used: set[str] = set()
        self.tables: dict[str, tuple[Table, str]] = {}
        body = _CKernel(self, k, sized or {})
        for i, x in enumerate(k.insts):
            if i not in body.skip:
                _STRUCTURE.get(x.op, _CKernel.value)(body, i, x)
        assert body.n_par_end == 0 and body.depth == 1, "unbalanced loops"
        params = ", ".join(self.param(i, _kind(d), w) for i, (_, d, w) in enumerate(k.params))
        if sized:
            params += f", {self.global_ptr}const {self.index_type}* {self.restrict} sz"
        helpers = self.helpers()
        head = "".join(helpers[h] + "\n" for h in sorted(self.used))
        if any(x.dtype == FLOAT64 for x in k.insts) and self.fp64_pragma:
            head = self.fp64_pragma + "\n" + head
        for t, kd in self.tables.values():
            values = ", ".join(self.const(v, kd) for v in t.values)
            head += f"{self.table_prefix} {self.reg_type(kd)} {t.name}[{len(t.values)}] = {{{values}}};\n"
        return f"{head}{self.kernel_prefix} {k.name}({params}) {{\n" + "\n".join(body.lines) + "\n}\n"


def _local_kind(kd: str) -> str:
    """The kind of the local-memory array that combines a group's accumulators of kind ``kd``: its
    own, except bool, which is combined in int32 (float64 was combined in int32 too: wrong sums)."""
    return "int32" if kd == "bool" else kd


class _CKernel:
    """One kernel's body being rendered: the work-item prologue, then a method per structural
    instruction (loops, accumulators, memory); every other instruction is its ``code_for_op`` rule,
    declared as a local ``v<id>``."""

    def __init__(self, r: CStyleRenderer, k: LoopKernel, sized: dict[int, int]) -> None:
        self.r, self.k, self.sized = r, k, sized
        self.val: dict[int, str] = {}
        self.kinds: dict[int, str] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.grouped = r.group_reduce(k)
        par = k.parallel_ranges()
        self.skip = set(par)                  # the parallel loops are work-items, not C loops
        self.n_par_end = len(par)
        self.prologue(par)

    def put(self, s: str) -> None:
        self.lines.append("  " * self.depth + s)

    def define(self, i: int, kind: str, rhs: str) -> None:
        self.val[i], self.kinds[i] = f"v{i}", kind
        self.put(f"{self.r.reg_type(kind)} v{i} = {rhs};")

    def size(self, i: int) -> str:
        """Instruction ``i``'s size (an index constant's value, a loop's extent): the argument's
        slot in a sized program, else the literal."""
        slot = self.sized.get(i)
        return self.r.const(self.k.insts[i].arg, INDEX) if slot is None else f"sz[{slot}]"

    def prologue(self, par: list[int]) -> None:
        """The parallel loops' variables from the work-item's ids, as ``launch`` maps them."""
        r, k, idx_t = self.r, self.k, self.r.index_type
        geo = r.launch(k)
        if self.grouped:
            local_kinds = sorted({_local_kind(_kind(k.insts[a].dtype))
                                  for accs in self.grouped.values() for a, _ in accs})
            for lk in local_kinds:
                self.put(f"{r.local_prefix} {r.reg_type(lk)} red_{lk}[{r.reduce_group}];")
            self.put(f"{idx_t} gid = {r.group_id};")
            self.put(f"{idx_t} lid = {r.local_id};")
            r._delinearize(par, k, "gid", self.put, self.val, self.kinds, self.sized)
        elif geo.mode == "flat":
            self.put(f"{idx_t} gid = {r.global_id};")
            n = " * ".join(self.size(p) for p in par) if any(p in self.sized for p in par) else \
                r.const(work_items(k), INDEX)
            self.put(f"if (gid >= {n}) return;")
            r._delinearize(par, k, "gid", self.put, self.val, self.kinds, self.sized)
        elif par:
            inner = par[::-1][:2]                            # dimensions 0 and 1
            for d, rg in reversed(list(enumerate(inner))):
                self.val[rg], self.kinds[rg] = f"r{rg}", INDEX
                self.put(f"{idx_t} r{rg} = {r.global_ids[d]};")
            if len(par) > 2:
                self.put(f"{idx_t} gid = {r.global_ids[2]};")
                r._delinearize(par[:-2], k, "gid", self.put, self.val, self.kinds, self.sized)
            # (a sized extent is checked whatever this member's rounding: another's may round up)
            past = [f"r{rg} >= {self.size(rg)}" for d, rg in enumerate(inner)
                    if geo.global_size[d] != k.insts[rg].arg or rg in self.sized]
            if past:
                self.put(f"if ({' || '.join(past)}) return;")

    def combine(self, acc: int, op: str) -> None:
        """Every work-item's partial accumulator -> the group's, in every work-item (a tree)."""
        r, kd = self.r, self.kinds[acc]
        lk = _local_kind(kd)
        arr, a = f"red_{lk}", self.val[acc]
        self.put(f"{arr}[lid] = {a};")
        self.put(r.barrier)
        s = r.reduce_group // 2
        while s:
            both = [f"{arr}[lid]", f"{arr}[lid + {s}]"]
            self.put(f"if (lid < {s}) {arr}[lid] = {r.alu(op, lk if kd != 'bool' else 'bool', both)};")
            self.put(r.barrier)
            s //= 2
        self.put(f"{a} = {arr}[0]{' != 0' if kd == 'bool' else ''};")
        self.put(r.barrier)                        # before the array is reused

    def PARAM(self, i: int, x: LInst) -> None:
        self.val[i], self.kinds[i] = f"b{x.arg}", _kind(x.dtype)

    def CONST(self, i: int, x: LInst) -> None:
        self.val[i], self.kinds[i] = (self.size(i) if i in self.sized else self.r.const(x.arg, _kind(x.dtype))), \
            _kind(x.dtype)

    def RANGE(self, i: int, x: LInst) -> None:
        r, idx_t = self.r, self.r.index_type
        ext = self.size(i)
        if self.grouped and i in self.grouped:             # this work-item's share of the iterations
            self.put(f"for ({idx_t} r{i} = lid; r{i} < {ext}; r{i} += {r.const(r.reduce_group, INDEX)}) {{")
        else:
            self.put(f"for ({idx_t} r{i} = 0; r{i} < {ext}; r{i}++) {{")
        self.val[i], self.kinds[i] = f"r{i}", INDEX
        self.depth += 1

    def ENDRANGE(self, i: int, x: LInst) -> None:
        if x.src[0] in self.skip:
            self.n_par_end -= 1
            return
        self.depth -= 1
        self.put("}")
        if self.grouped and x.src[0] in self.grouped:
            for acc, op in self.grouped[x.src[0]]:
                self.combine(acc, op)

    def DEFACC(self, i: int, x: LInst) -> None:
        kd = _kind(x.dtype)
        self.val[i], self.kinds[i] = f"acc{i}", kd
        self.put(f"{self.r.reg_type(kd)} acc{i} = {self.r.const(x.arg, kd)};")

    def DEFLOCAL(self, i: int, x: LInst) -> None:
        # private memory: each work-item's own array (declared in the loop whose iterations own it)
        kd = _kind(x.dtype)
        self.val[i], self.kinds[i] = f"loc{i}", kd
        self.put(f"{self.r.mem_type(kd)} loc{i}[{x.arg}];")

    def ACCUM(self, i: int, x: LInst) -> None:
        acc, v = x.src
        op = "ADD" if x.arg == "ADD" else "MAX"
        self.put(f"{self.val[acc]} = {self.r.alu(op, self.kinds[acc], [self.val[acc], self.val[v]])};")

    def ACCREAD(self, i: int, x: LInst) -> None:
        self.define(i, _kind(x.dtype), self.val[x.src[0]])

    def LOAD(self, i: int, x: LInst) -> None:
        p, idx = x.src
        kd = _kind(x.dtype)
        ld = f"{self.val[p]}[{self.val[idx]}]"
        self.define(i, kd, f"{ld} != 0" if kd == "bool" else ld)

    def STORE(self, i: int, x: LInst) -> None:
        p, idx, v = x.src
        sv = f"({self.r.byte_type}){self.val[v]}" if self.kinds[v] == "bool" else self.val[v]
        self.put(f"{'if (lid == 0) ' if self.grouped else ''}{self.val[p]}[{self.val[idx]}] = {sv};")

    def value(self, i: int, x: LInst) -> None:
        # the operands' kind picks the expression (CMP* give bool from any kind; WHERE's condition is bool)
        src = self.kinds[x.src[1] if x.op == "WHERE" else x.src[0]]
        o = Operation(x.op, src, _kind(x.dtype), x.arg)
        rule = self.r.code_for_op.get(x.op)
        if rule is None and o.src == "float64" and libm64(x.op):      # not decomposed: C's double one
            rule = _math(x.op)
        if rule is None:
            raise MissingRule(self.r.name, o)
        operands = [self.val[s] for s in x.src]
        rhs = rule(self.r, o, operands)
        if rhs in operands:                      # an identity (a CAST to its own kind): no new local
            self.val[i], self.kinds[i] = rhs, o.dst
        else:
            self.define(i, o.dst, rhs)


_STRUCTURE = {op: getattr(_CKernel, op) for op in
              ("PARAM", "CONST", "RANGE", "ENDRANGE", "DEFACC", "ACCUM", "ACCREAD", "LOAD", "STORE", "DEFLOCAL")}


# ------------------------------------------------------------------ several kernels, one program

_DECLARES = re.compile(r"(\w+)\s*[\[(]")      # the name a helper or table line declares


def one_program(srcs: list[str], prefix: str, name: str = "eqk") -> list[tuple[str, list[str]]]:
    """Sources rendered by one renderer (each its helpers, tables and pragma, one line each, then
    the kernel ``{prefix} {name}(...)``) as programs that each define several kernels, named
    ``{name}_0``, ``{name}_1``, ...: ``[(program, [its kernels' names, in the order of srcs])]``.
    A line before a kernel is written once per program; a source whose line declares a name that a
    program holds with other text (two tables of one name) goes to a program of its own.

    An OpenCL build has a fixed cost that does not grow with the kernels it builds (PoCL on a
    2-core AMD EPYC: 101 ms for one small kernel and for eight), and a plan's new kernels are built
    together (``OpenCLDevice.kernels``)."""
    programs: list[tuple[dict[str, str], list[str], list[str], list[str]]] = []   # declared, head, kernels, names
    for j, src in enumerate(srcs):
        at = src.index(f"{prefix} {name}(")
        lines = [ln for ln in src[:at].splitlines() if ln]
        mine = {}
        for ln in lines:
            m = _DECLARES.search(ln) if not ln.startswith("#") else None
            if m:
                mine[m.group(1)] = ln
        for declared, head, kernels, names in programs:
            if all(declared.get(d, ln) == ln for d, ln in mine.items()):
                break
        else:
            declared, head, kernels, names = {}, [], [], []
            programs.append((declared, head, kernels, names))
        declared.update(mine)
        head.extend(ln for ln in lines if ln not in head)
        names.append(f"{name}_{j}")
        kernels.append(src[at:].replace(f"{prefix} {name}(", f"{prefix} {name}_{j}(", 1))
    # a pragma first: it applies to what follows it
    return [("".join(ln + "\n" for ln in sorted(head, key=lambda ln: not ln.startswith("#"))) + "".join(kernels), names)
            for _, head, kernels, names in programs]
