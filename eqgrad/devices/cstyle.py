"""Loop IR -> C-like kernel source, shared by the OpenCL C and CUDA C renderers.

``CStyleRenderer`` holds everything the two dialects have in common; a dialect is a subclass that
sets a dozen strings (kernel qualifier, address space, global id, math function names, types).
The semantics mirror the LLVM renderer (``llvm.py``) exactly:

- bools are ``bool`` in registers and one byte (0 or 1) in memory;
- int32 ``+ * -x`` wrap around (computed in unsigned arithmetic: signed overflow is undefined in C);
- ``IDIV``/``MOD`` of int32 give 0 for a zero divisor, and ``INT_MIN / -1`` wraps to ``INT_MIN``;
  index arithmetic (64-bit) divides by positive constants only and stays plain C;
- float ``MAX`` propagates NaN (NumPy's ``maximum``; C's ``fmax`` would drop it);
- float -> int32 casts saturate and map NaN to 0 (LLVM's ``fptosi.sat``); float -> bool is ``!= 0``;
- float constants are exact hex literals; exp2/log2/sin/sqrt are the dialect's full-precision
  library functions (never the ``native_``/``__`` fast variants), well inside the LLVM device's
  documented error bounds (docs/semantics.md); division and sqrt are correctly rounded.

Every instruction becomes one typed local (``v12``), constants are written inline, loops are C
``for`` loops and accumulators are locals declared before their loops. The loop IR's ``parallel``
leading output loops are not loops here: each work-item (thread) computes one iteration of them,
found from its global linear id (the innermost loop varies fastest, so neighbouring work-items
touch neighbouring memory); the runtime launches ``work_items(k)`` of them, rounded up to its
group size, and the kernel returns early past the end.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np

from ..lower.loopir import INDEX, LoopKernel

# ops the renderer implements (checked against the op table by tests/test_optable.py)
ALU = ("NEG", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "TRUNC", "CAST", "ADD", "MUL", "MAX", "CMPLT", "CMPEQ",
       "IDIV", "MOD", "AND", "OR", "XOR", "WHERE")


def _kind(dt: Any) -> str:
    return dt if isinstance(dt, str) else dt.name


def work_items(k: LoopKernel) -> int:
    """How many work-items the kernel's parallel loops make (1 when it has none)."""
    return math.prod(k.insts[r].arg for r in k.parallel_ranges())


class CStyleRenderer:
    """A C dialect: the strings below, and the helpers that ``_helper`` adds when a kernel uses them."""
    kernel_prefix = "void"                 # what precedes the kernel's name
    global_ptr = ""                        # address space of buffer parameters
    restrict = "restrict"
    func_prefix = "static inline"          # helper functions
    global_id = "0"                        # the work-item's global linear id (an index expression)
    index_type = "long"                    # 64-bit signed, like LLVM's i64 index
    index_suffix = "L"
    uint_type = "unsigned int"
    byte_type = "unsigned char"            # how a bool is stored in memory
    math = {"EXP2": "exp2", "LOG2": "log2", "SIN": "sin", "SQRT": "sqrt", "TRUNC": "trunc", "FMAX": "fmax"}
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
        p, u, fmax = self.func_prefix, self.uint_type, self.math["FMAX"]
        return {
            # NaN-propagating maximum, like NumPy's maximum and LLVM's llvm.maximum
            "max_f32": f"{p} float max_f32(float a, float b) {{ return (a != a || b != b) ? a + b : {fmax}(a, b); }}",
            # truncating division with x / 0 = 0 and INT_MIN / -1 = INT_MIN (both undefined in C)
            "idiv_i32": f"{p} int idiv_i32(int a, int b) {{ return b == 0 ? 0 : b == -1 ? (int)(0u - ({u})a) : a / b; }}",
            "mod_i32": f"{p} int mod_i32(int a, int b) {{ return (b == 0 || b == -1) ? 0 : a % b; }}",
            # saturating float -> int32 with NaN -> 0, like LLVM's fptosi.sat
            "f2i_sat": f"{p} int f2i_sat(float x) {{ return x != x ? 0 : x >= 0x1p+31f ? 2147483647 : "
                       f"x <= -0x1p+31f ? (-2147483647 - 1) : (int)x; }}",
        }

    # ------------------------------------------------------------------ ALU
    def wrap(self, a: str, op: str, b: str) -> str:
        """int32 arithmetic that wraps around (unsigned in C, converted back)."""
        u = self.uint_type
        return f"(int)(({u}){a} {op} ({u}){b})"

    def alu(self, op: str, k: str, a: list[str]) -> str:
        f, b, i32 = k == "float32", k == "bool", k == "int32"
        if op == "NEG":
            return f"-{a[0]}" if f or k == INDEX else f"!{a[0]}" if b else self.wrap("0", "-", a[0])
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
            if k == INDEX:           # index arithmetic divides by positive constants only
                return f"{a[0]} {'/' if op == 'IDIV' else '%'} {a[1]}"
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

        def put(s: str) -> None:
            lines.append("  " * depth + s)

        def define(i: int, kind: str, rhs: str) -> None:
            val[i], kinds[i] = f"v{i}", kind
            put(f"{self.reg_type(kind)} v{i} = {rhs};")

        par = k.parallel_ranges()
        if par:
            put(f"{self.index_type} gid = {self.global_id};")
            put(f"if (gid >= {self.const(work_items(k), INDEX)}) return;")
            decls, stride = [], 1
            for r in reversed(par):                          # innermost varies fastest
                e = k.insts[r].arg
                q = "gid" if stride == 1 else f"gid / {self.const(stride, INDEX)}"
                if r != par[0]:
                    q = f"{q} % {self.const(e, INDEX)}" if stride == 1 else f"({q}) % {self.const(e, INDEX)}"
                decls.append((r, q))
                stride *= e
            for r, q in reversed(decls):
                val[r], kinds[r] = f"r{r}", INDEX
                put(f"{self.index_type} r{r} = {q};")
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
                put(f"for ({self.index_type} r{i} = 0; r{i} < {self.const(x.arg, INDEX)}; r{i}++) {{")
                val[i], kinds[i] = f"r{i}", INDEX
                depth += 1
            elif x.op == "ENDRANGE":
                if x.src[0] in skip:
                    n_par_end -= 1
                    continue
                depth -= 1
                put("}")
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
                put(f"{val[p]}[{val[idx]}] = {sv};")
            elif x.op == "CAST":
                src = kinds[x.src[0]]
                if src == kd:
                    val[i], kinds[i] = val[x.src[0]], kd
                else:
                    define(i, kd, self.cast(val[x.src[0]], src, kd))
            else:
                # the operand kind decides the operation (CMP* produce bool from any kind)
                opk = kinds[x.src[1]] if x.op == "WHERE" else kinds[x.src[0]]
                define(i, kd, self.alu(x.op, opk, [val[s] for s in x.src]))
        assert n_par_end == 0 and depth == 1, "unbalanced loops"
        params = ", ".join(self.param(i, _kind(d), w) for i, (_, d, w) in enumerate(k.params))
        helpers = self.helpers()
        head = "".join(helpers[h] + "\n" for h in sorted(self.used))
        return (f"{self.preamble()}{head}{self.kernel_prefix} {k.name}({params}) {{\n"
                + "\n".join(lines) + "\n}\n")

    def preamble(self) -> str:
        return ""
