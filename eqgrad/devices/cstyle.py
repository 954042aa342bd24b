"""Loop IR -> C-like kernel source, shared by the OpenCL C and CUDA C renderers.

``CStyleRenderer`` holds everything the two dialects have in common; a dialect is a subclass that
sets a dozen strings (kernel qualifier, address space, global id, math function names, types).
The semantics mirror the LLVM renderer (``llvm.py``) exactly:

- bools are ``bool`` in registers and one byte (0 or 1) in memory;
- int32 ``+ * -x`` wrap around (computed in unsigned arithmetic: signed overflow is undefined in C);
- ``IDIV``/``MOD`` of int32 give 0 for a zero divisor, and ``INT_MIN / -1`` wraps to ``INT_MIN``;
  index arithmetic (64-bit) divides by positive constants only, with floor semantics: plain C
  ``/ %`` where the loop IR marks the numerator non-negative (``loopir.NONNEG``), otherwise the
  helpers ``floordiv_idx``/``floormod_idx``;
- float ``MAX`` propagates NaN (NumPy's ``maximum``; C's ``fmax`` would drop it);
- float -> int32 casts saturate and map NaN to 0 (LLVM's ``fptosi.sat``); float -> bool is ``!= 0``;
- float constants are exact hex literals; division and sqrt are correctly rounded;
- exp2/log2 are either the LLVM device's own straight-line polynomials (``poly_exp2_log2``: the same
  numbers as LLVM, and vectorizable where a CPU OpenCL's library calls are not) or the dialect's
  full-precision library functions (never the ``native_``/``__`` fast variants), which are inside the
  same documented error bounds (docs/semantics.md); sin likewise (``poly_sin``: LLVM's range
  reduction and polynomials, which need doubles, so a device without ``cl_khr_fp64`` falls back to
  the library's sin).

Every instruction becomes one typed local (``v12``), constants are written inline, loops are C
``for`` loops and accumulators are locals declared before their loops. The loop IR's ``parallel``
leading output loops are not loops here: work-items (threads) run their iterations, mapped as
``launch`` decides (a grid over the innermost loops, or a work-group per output element for a long
reduction); the runtime launches what ``launch`` returns, so the two always agree.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from eqgrad.graph.loopir import INDEX, NONNEG, LoopKernel
from eqgrad.devices.llvm import COS_POLY, EXP2_MAGIC, EXP2_POLY, LOG2_POLY, SIN_POLY, SIN_TABLE

# ops the renderer implements (checked against the op table by tests/test_optable.py)
ALU = ("NEG", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "TRUNC", "CAST", "ADD", "MUL", "MAX", "CMPLT", "CMPEQ",
       "IDIV", "MOD", "AND", "OR", "XOR", "WHERE")


def _kind(dt: Any) -> str:
    return dt if isinstance(dt, str) else dt.name


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


_SIN_TABLE_C = ", ".join(float.hex(w) for w in SIN_TABLE)      # llvm.py's range-reduction table


class CStyleRenderer:
    """A C dialect: the strings below, and the helpers that ``_helper`` adds when a kernel uses them."""
    kernel_prefix = "void"                 # what precedes the kernel's name
    global_ptr = ""                        # address space of buffer parameters
    restrict = "restrict"
    func_prefix = "static inline"          # helper functions
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
    math = {"EXP2": "exp2", "LOG2": "log2", "SIN": "sin", "SQRT": "sqrt", "TRUNC": "trunc", "FMAX": "fmax",
            "FLOOR": "floor"}
    poly_exp2_log2 = False                 # exp2/log2 as the LLVM device's polynomials (helpers below)
    poly_sin: bool | None = None           # sin as the LLVM device's code (None: as poly_exp2_log2)
    as_float, as_int = "as_float", "as_int"   # bit casts between float and int
    inf = "INFINITY"
    nan = "NAN"
    name = "C"

    # ------------------------------------------------------------------ literals and types
    def reg_type(self, kind: str) -> str:
        return {"float32": "float", "int32": "int", "bool": "bool", INDEX: self.index_type}[kind]

    def mem_type(self, kind: str) -> str:
        return {"float32": "float", "int32": "int", "bool": self.byte_type}[kind]

    def const(self, v: Any, kind: str) -> str:
        if kind == "float32":
            f = float(np.float32(v))
            if math.isnan(f):
                return self.nan
            if math.isinf(f):
                return self.inf if f > 0 else f"(-{self.inf})"
            if f == 0.0:
                return "(-0.0f)" if struct.pack("<f", f)[3] & 0x80 else "0.0f"
            h = re.sub(r"\.?0+p", "p", f.hex())          # 0x1.8000000000000p+1 -> 0x1.8p+1
            return f"({h}f)" if f < 0 else f"{h}f"
        if kind == "bool":
            return "true" if v else "false"
        n = int(v)
        suffix = self.index_suffix if kind == INDEX else ""
        if kind == "int32" and n == -2**31:
            return "(-2147483647 - 1)"
        return f"({n}{suffix})" if n < 0 else f"{n}{suffix}"

    # ------------------------------------------------------------------ helpers (emitted on use)
    def _helper(self, name: str) -> str:
        self.used.add(name)
        return name

    def helpers(self) -> dict[str, str]:
        p, u, fmax, ix = self.func_prefix, self.uint_type, self.math["FMAX"], self.index_type
        return {
            # NaN-propagating maximum, like NumPy's maximum and LLVM's llvm.maximum
            "max_f32": f"{p} float max_f32(float a, float b) {{ return (a != a || b != b) ? a + b : {fmax}(a, b); }}",
            # truncating division with x / 0 = 0 and INT_MIN / -1 = INT_MIN (both undefined in C)
            "idiv_i32": f"{p} int idiv_i32(int a, int b) {{ return b == 0 ? 0 : b == -1 ? (int)(0u - ({u})a) : a / b; }}",
            "mod_i32": f"{p} int mod_i32(int a, int b) {{ return (b == 0 || b == -1) ? 0 : a % b; }}",
            # floor division and modulo of an index by a positive constant (C's / and % truncate)
            "floordiv_idx": f"{p} {ix} floordiv_idx({ix} a, {ix} b) {{ return a / b - (a % b < 0); }}",
            "floormod_idx": f"{p} {ix} floormod_idx({ix} a, {ix} b) {{ {ix} r = a % b; return r < 0 ? r + b : r; }}",
            # saturating float -> int32 with NaN -> 0, like LLVM's fptosi.sat
            "f2i_sat": f"{p} int f2i_sat(float x) {{ return x != x ? 0 : x >= 0x1p+31f ? 2147483647 : "
                       f"x <= -0x1p+31f ? (-2147483647 - 1) : (int)x; }}",
            "exp2_f32": self._exp2_helper(),
            "log2_f32": self._log2_helper(),
            "sin_f32": self._sin_helper(),
        }

    def _horner(self, x: str, coeffs: tuple[float, ...]) -> str:
        acc = self.const(coeffs[-1], "float32")
        for i, k in enumerate(reversed(coeffs[:-1])):
            acc = f"{acc if i == 0 else f'({acc})'} * {x} + {self.const(k, 'float32')}"
        return acc

    def _exp2_helper(self) -> str:
        # llvm.py's _exp2: 2**floor(x) by building the exponent bits, 2**frac(x) by a polynomial;
        # clamped to [-127, 128] (0 below, inf above), NaN passes through (p is NaN)
        c = lambda v: self.const(v, "float32")
        return (f"{self.func_prefix} float exp2_f32(float x) {{\n"
                f"  float xc = x > {c(128.0)} ? {c(128.0)} : x;\n"
                f"  xc = xc < {c(-127.0)} ? {c(-127.0)} : xc;\n"
                f"  float fl = {self.math['FLOOR']}(xc);\n"
                f"  float f = xc - fl;\n"
                f"  float p = {self._horner('f', EXP2_POLY)};\n"
                f"  {self.uint_type} bits = ({self.uint_type}){self.as_int}(fl + {c(EXP2_MAGIC)}) << 23;\n"
                f"  return p * {self.as_float}(bits);\n}}")

    def _log2_helper(self) -> str:
        # llvm.py's _log2: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log2(m) = t * Q(t),
        # t = m - 1; subnormals rescaled by 2**23 first
        c = lambda v: self.const(v, "float32")
        u = self.uint_type
        return (f"{self.func_prefix} float log2_f32(float x) {{\n"
                f"  bool sub = x < {c(2.0 ** -126)};\n"
                f"  int bits = {self.as_int}(sub ? x * {c(2.0 ** 23)} : x);\n"
                f"  int e = (int)(({u})bits >> 23) - 127;\n"
                f"  float m = {self.as_float}((bits & 8388607) | 1065353216);\n"
                f"  bool big = m > {c(1.4142135381698608)};\n"
                f"  m = big ? m * 0.5f : m;\n"
                f"  float ef = (float)(e + (int)big) - (sub ? {c(23.0)} : 0.0f);\n"
                f"  float t = m - 1.0f;\n"
                f"  float r = ef + ({self._horner('t', LOG2_POLY)}) * t;\n"
                f"  r = x == 0.0f ? (-{self.inf}) : r;\n"
                f"  r = x == {self.inf} ? x : r;\n"
                f"  return (x < 0.0f || x != x) ? {self.nan} : r;\n}}")

    def _sin_helper(self) -> str:
        # llvm.py's _sin: Payne-Hanek range reduction in double with the same table (a constant
        # array), then the same float polynomials; without doubles (no cl_khr_fp64) the library sin
        u = self.uint_type
        return (f"#if defined(cl_khr_fp64)\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                f"__constant double sin_tbl[1024] = {{{_SIN_TABLE_C}}};\n"
                f"{self.func_prefix} float sin_f32(float x) {{\n"
                f"  {u} bits = ({u}){self.as_int}(x);\n"
                f"  {u} ex = (bits >> 23) & 255u;\n"
                f"  {u} mant = bits & 8388607u;\n"
                f"  double m = (double)(ex != 0u ? (mant | 8388608u) : mant);\n"
                f"  double v0 = m * sin_tbl[4u * ex];\n"
                f"  double v2 = m * sin_tbl[4u * ex + 2u];\n"
                f"  double a = (v0 - 4.0 * floor(v0 * 0.25)) + m * sin_tbl[4u * ex + 1u];\n"
                f"  double n = rint(a + v2);\n"
                f"  double r = ((a - n) + v2) + m * sin_tbl[4u * ex + 3u];\n"
                f"  float y = (float)(r * {float.hex(math.pi / 2)});\n"
                f"  float z = y * y;\n"
                f"  float s = y + (z * y) * ({self._horner('z', SIN_POLY)});\n"
                f"  float co = {self._horner('z', COS_POLY)};\n"
                f"  int q = (int)n;\n"
                f"  {u} flip = (({u})(q & 2) << 30) ^ (bits & 0x80000000u);\n"
                f"  float res = {self.as_float}((int)(({u}){self.as_int}((q & 1) ? co : s) ^ flip));\n"
                f"  return ex == 255u ? {self.nan} : res;\n}}\n"
                f"#else\n{self.func_prefix} float sin_f32(float x) {{ return {self.math['SIN']}(x); }}\n#endif")

    # ------------------------------------------------------------------ ALU
    def wrap(self, a: str, op: str, b: str) -> str:
        """int32 arithmetic that wraps around (unsigned in C, converted back)."""
        u = self.uint_type
        return f"(int)(({u}){a} {op} ({u}){b})"

    def alu(self, op: str, k: str, a: list[str], nonneg: bool = False) -> str:
        f, b, i32 = k == "float32", k == "bool", k == "int32"
        if op == "NEG":
            return f"-{a[0]}" if f or k == INDEX else f"!{a[0]}" if b else self.wrap("0", "-", a[0])
        if op in ("EXP2", "LOG2") and self.poly_exp2_log2:
            return f"{self._helper(op.lower() + '_f32')}({a[0]})"
        if op == "SIN" and (self.poly_exp2_log2 if self.poly_sin is None else self.poly_sin):
            return f"{self._helper('sin_f32')}({a[0]})"
        if op in ("EXP2", "LOG2", "SIN", "SQRT", "TRUNC"):
            return f"{self.math[op]}({a[0]})"
        if op == "RECIP":
            return f"1.0f / {a[0]}"
        if op == "ADD":
            return f"{a[0]} || {a[1]}" if b else self.wrap(a[0], "+", a[1]) if i32 else f"{a[0]} + {a[1]}"
        if op == "MUL":
            return f"{a[0]} && {a[1]}" if b else self.wrap(a[0], "*", a[1]) if i32 else f"{a[0]} * {a[1]}"
        if op == "MAX":
            if f:
                return f"{self._helper('max_f32')}({a[0]}, {a[1]})"
            return f"{a[0]} || {a[1]}" if b else f"{a[0]} > {a[1]} ? {a[0]} : {a[1]}"
        if op == "CMPLT":
            return f"!{a[0]} && {a[1]}" if b else f"{a[0]} < {a[1]}"
        if op == "CMPEQ":
            return f"{a[0]} == {a[1]}"
        if op in ("IDIV", "MOD"):
            if k == INDEX:           # by positive constants only, floor semantics (loopir.py)
                if nonneg:           # the numerator is proven >= 0: truncation is floor
                    return f"{a[0]} {'/' if op == 'IDIV' else '%'} {a[1]}"
                return f"{self._helper('floordiv_idx' if op == 'IDIV' else 'floormod_idx')}({a[0]}, {a[1]})"
            return f"{self._helper('idiv_i32' if op == 'IDIV' else 'mod_i32')}({a[0]}, {a[1]})"
        if op in ("AND", "OR", "XOR"):
            return f"{a[0]} {dict(AND='&', OR='|', XOR='^')[op]} {a[1]}"
        if op == "WHERE":
            return f"{a[0]} ? {a[1]} : {a[2]}"
        raise NotImplementedError(f"{self.name} renderer: no rule for {op}")

    def cast(self, a: str, src: str, dst: str) -> str:
        if src == "float32":
            if dst == "bool":
                return f"{a} != 0.0f"                       # NaN -> true, as LLVM's fcmp une
            i = f"{self._helper('f2i_sat')}({a})"
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
        if not L:
            return None
        body = range(len(k.params) + k.parallel, len(k.insts) - k.parallel)
        depth, cur, top, acc_depth = 0, -1, {}, {}
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
                return None        # a row-fused kernel (Lowerer.hoist): its output loop is not a reduction
            elif x.op == "ACCUM" and depth > 0 and acc_depth[x.src[0]] == 0 and (x.src[0], x.arg) not in top[cur]:
                top[cur].append((x.src[0], x.arg))
        n_accs = sum(len(a) for a in top.values())
        if not top or n_accs > 4 or max(k.insts[r].arg for r in top) < 4 * L or work_items(k) * L >= 2**31:
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
                     val: dict[int, str], kinds: dict[int, str]) -> None:
        """Declare the loop variables of ``par`` (outermost first) from one linear id."""
        decls, stride = [], 1
        for r in reversed(par):                          # innermost varies fastest
            e = k.insts[r].arg
            q = gid if stride == 1 else f"{gid} / {self.const(stride, INDEX)}"
            if r != par[0]:
                q = f"{q} % {self.const(e, INDEX)}" if stride == 1 else f"({q}) % {self.const(e, INDEX)}"
            decls.append((r, q))
            stride *= e
        for r, q in reversed(decls):
            val[r], kinds[r] = f"r{r}", INDEX
            put(f"{self.index_type} r{r} = {q};")

    # ------------------------------------------------------------------ the kernel
    def param(self, i: int, kind: str, written: bool) -> str:
        const = "" if written else "const "
        return f"{self.global_ptr}{const}{self.mem_type(kind)}* {self.restrict} b{i}"

    def render(self, k: LoopKernel) -> str:
        self.used: set[str] = set()
        val: dict[int, str] = {}
        kinds: dict[int, str] = {}
        lines: list[str] = []
        depth = 1
        grouped = self.group_reduce(k)
        L = self.reduce_group
        idx_t = self.index_type

        def put(s: str) -> None:
            lines.append("  " * depth + s)

        def define(i: int, kind: str, rhs: str) -> None:
            val[i], kinds[i] = f"v{i}", kind
            put(f"{self.reg_type(kind)} v{i} = {rhs};")

        par = k.parallel_ranges()
        geo = self.launch(k)
        if grouped:
            local_kinds = sorted({"float32" if _kind(k.insts[a].dtype) == "float32" else "int32"
                                  for accs in grouped.values() for a, _ in accs})
            for lk in local_kinds:
                put(f"{self.local_prefix} {self.reg_type(lk)} red_{lk}[{L}];")
            put(f"{idx_t} gid = {self.group_id};")
            put(f"{idx_t} lid = {self.local_id};")
            self._delinearize(par, k, "gid", put, val, kinds)
        elif geo.mode == "flat":
            put(f"{idx_t} gid = {self.global_id};")
            put(f"if (gid >= {self.const(work_items(k), INDEX)}) return;")
            self._delinearize(par, k, "gid", put, val, kinds)
        elif par:
            inner = par[::-1][:2]                            # dimensions 0 and 1
            for d, r in reversed(list(enumerate(inner))):
                val[r], kinds[r] = f"r{r}", INDEX
                put(f"{idx_t} r{r} = {self.global_ids[d]};")
            if len(par) > 2:
                put(f"{idx_t} gid = {self.global_ids[2]};")
                self._delinearize(par[:-2], k, "gid", put, val, kinds)
            past = [f"r{r} >= {self.const(k.insts[r].arg, INDEX)}" for d, r in enumerate(inner)
                    if geo.global_size[d] != k.insts[r].arg]
            if past:
                put(f"if ({' || '.join(past)}) return;")

        def combine(acc: int, op: str) -> None:
            """Every work-item's partial accumulator -> the group's, in every work-item (a tree)."""
            kd = kinds[acc]
            lk = "float32" if kd == "float32" else "int32"
            arr, a = f"red_{lk}", val[acc]
            put(f"{arr}[lid] = {a};")
            put(self.barrier)
            s = L // 2
            while s:
                both = [f"{arr}[lid]", f"{arr}[lid + {s}]"]
                put(f"if (lid < {s}) {arr}[lid] = {self.alu(op, lk if kd != 'bool' else 'bool', both)};")
                put(self.barrier)
                s //= 2
            put(f"{a} = {arr}[0]{' != 0' if kd == 'bool' else ''};")
            put(self.barrier)                        # before the array is reused

        skip = set(par)
        n_par_end = len(par)
        for i, x in enumerate(k.insts):
            if i in skip:
                continue
            kd = _kind(x.dtype) if x.dtype is not None else None
            if x.op == "PARAM":
                val[i], kinds[i] = f"b{x.arg}", kd
            elif x.op == "CONST":
                val[i], kinds[i] = self.const(x.arg, kd), kd
            elif x.op == "RANGE":
                ext = self.const(x.arg, INDEX)
                if grouped and i in grouped:             # this work-item's share of the iterations
                    put(f"for ({idx_t} r{i} = lid; r{i} < {ext}; r{i} += {self.const(L, INDEX)}) {{")
                else:
                    put(f"for ({idx_t} r{i} = 0; r{i} < {ext}; r{i}++) {{")
                val[i], kinds[i] = f"r{i}", INDEX
                depth += 1
            elif x.op == "ENDRANGE":
                if x.src[0] in skip:
                    n_par_end -= 1
                    continue
                depth -= 1
                put("}")
                if grouped and x.src[0] in grouped:
                    for acc, op in grouped[x.src[0]]:
                        combine(acc, op)
            elif x.op == "DEFACC":
                val[i], kinds[i] = f"acc{i}", kd
                put(f"{self.reg_type(kd)} acc{i} = {self.const(x.arg, kd)};")
            elif x.op == "ACCUM":
                acc, v = x.src
                ak = kinds[acc]
                op = "ADD" if x.arg == "ADD" else "MAX"
                put(f"{val[acc]} = {self.alu(op, ak, [val[acc], val[v]])};")
            elif x.op == "ACCREAD":
                define(i, kd, val[x.src[0]])
            elif x.op == "LOAD":
                p, idx = x.src
                ld = f"{val[p]}[{val[idx]}]"
                define(i, kd, f"{ld} != 0" if kd == "bool" else ld)
            elif x.op == "STORE":
                p, idx, v = x.src
                sv = f"({self.byte_type}){val[v]}" if kinds[v] == "bool" else val[v]
                put(f"{'if (lid == 0) ' if grouped else ''}{val[p]}[{val[idx]}] = {sv};")
            elif x.op == "CAST":
                src = kinds[x.src[0]]
                if src == kd:
                    val[i], kinds[i] = val[x.src[0]], kd
                else:
                    define(i, kd, self.cast(val[x.src[0]], src, kd))
            else:
                # the operand kind decides the operation (CMP* produce bool from any kind)
                opk = kinds[x.src[1]] if x.op == "WHERE" else kinds[x.src[0]]
                define(i, kd, self.alu(x.op, opk, [val[s] for s in x.src], nonneg=x.arg == NONNEG))
        assert n_par_end == 0 and depth == 1, "unbalanced loops"
        params = ", ".join(self.param(i, _kind(d), w) for i, (_, d, w) in enumerate(k.params))
        helpers = self.helpers()
        head = "".join(helpers[h] + "\n" for h in sorted(self.used))
        return f"{head}{self.kernel_prefix} {k.name}({params}) {{\n" + "\n".join(lines) + "\n}\n"
