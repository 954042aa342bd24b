"""The loop IR: a kernel as a flat list of instructions with structured loops.

Instructions (``LInst``; an instruction's id is its position, ``src`` are ids):

====================  ===========================================================================
``PARAM``             arg = parameter number (0 is the output); dtype = element dtype
``CONST``             arg = Python scalar; dtype
``RANGE``             arg = extent; dtype ``index``; opens a loop whose variable is this value
``ENDRANGE``          src = (range,): closes the loop
``DEFACC``            arg = initial value; dtype: an accumulator (mutable, declared before its loops)
``ACCUM``             src = (acc, value); arg = "ADD" | "MAX": acc <- acc op value
``ACCREAD``           src = (acc,): the accumulator's current value
``LOAD``              src = (param, index); dtype
``STORE``             src = (param, index, value)
ALU ops               the op table's unary/binary/ternary ops; dtype of the result; ``CAST``'s
                      dtype is the target. Index arithmetic uses ADD/MUL/IDIV/MOD/CMPLT/AND/WHERE
                      with dtype ``index`` (64-bit) or bool.
====================  ===========================================================================

Index ``IDIV``/``MOD`` (dtype ``index``) divide by a positive constant with **floor** semantics,
like ``symbolic.Lin``, for every sign of the numerator (unlike the op table's int32 ``IDIV``/``MOD``,
which truncate). ``arg = NONNEG`` records that the numerator is proven non-negative (by its
bounds), so a renderer may emit the cheaper truncating instruction; without it a renderer must
emit true floor division/modulo. :func:`run` checks every ``NONNEG`` claim it executes.

Every value used inside a loop is defined before it or inside it; no value defined inside a loop
is used after it except through ``ACCREAD``.

The first ``parallel`` instructions after the ``PARAM``s are ``RANGE``s over output axes that
enclose the whole body (their ``ENDRANGE``s are the last instructions). Their iterations are
independent -- each writes its own output elements -- so a device may run them in any order or
at once (GPU work-items, CPU threads); every other loop runs in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtype import DType
from ..ops import OPS

INDEX = "index"
NONNEG = "nonneg"        # arg of an index IDIV/MOD whose numerator is proven >= 0 (see above)


@dataclass(frozen=True)
class LInst:
    op: str
    dtype: DType | str | None
    src: tuple[int, ...] = ()
    arg: Any = None


@dataclass
class LoopKernel:
    name: str
    params: list[tuple[str, DType, bool]]     # (name, element dtype, written)
    insts: list[LInst]
    loop_vectorize: bool = True     # False when lanes are already explicit (SLP packs them instead)
    parallel: int = 0               # leading RANGEs whose iterations are independent (see above)

    def parallel_ranges(self) -> list[int]:
        """Instruction ids of the leading independent RANGEs, outermost first."""
        start = len(self.params)
        out = list(range(start, start + self.parallel))
        assert all(self.insts[i].op == "RANGE" for i in out), "parallel loops must lead the body"
        return out

    def __str__(self) -> str:
        lines = [f"kernel {self.name}({', '.join(f'{n}: {d.name}*' for n, d, _ in self.params)})"]
        depth = 1
        for i, x in enumerate(self.insts):
            if x.op == "ENDRANGE":
                depth -= 1
            dt = x.dtype if isinstance(x.dtype, str) or x.dtype is None else x.dtype.name
            arg = "" if x.arg is None else f" {x.arg.name if isinstance(x.arg, DType) else x.arg}"
            src = " " + ", ".join(f"%{s}" for s in x.src) if x.src else ""
            lines.append(f"{'  ' * depth}%{i} = {x.op}{'' if dt is None else ':' + dt}{src}{arg}")
            if x.op == "RANGE":
                depth += 1
        return "\n".join(lines)


class LoopIRError(AssertionError):
    """The loop IR broke its own rules while running (:func:`run`): an out-of-bounds load or
    store, a ``NONNEG`` division of a negative numerator, a non-positive index divisor."""


def run(k: LoopKernel, buffers: list[np.ndarray]) -> None:
    """Execute ``k`` in Python, one instruction at a time: the reference semantics of the loop IR
    (slow; for tests and the index fuzzer, ``eqgrad/fuzz_index.py``). ``buffers[i]`` is parameter
    ``i`` as a flat NumPy array of its dtype; parameter 0 is written. Index values are exact
    Python integers; every load and store is bounds-checked and every ``NONNEG`` claim verified,
    so a lowering bug that a device would turn into a silent wrong read raises
    :class:`LoopIRError` here instead."""
    insts = k.insts
    end_of: dict[int, int] = {}
    open_: list[int] = []
    for i, x in enumerate(insts):
        if x.op == "RANGE":
            open_.append(i)
        elif x.op == "ENDRANGE":
            r = open_.pop() if open_ else None
            if r is None or x.src != (r,):
                raise LoopIRError(f"%{i}: ENDRANGE closes %{x.src[0]}, but the innermost open loop is %{r}")
            end_of[r] = i
    if open_:
        raise LoopIRError(f"loops %{open_} are never closed")
    val: dict[int, Any] = {}
    kind: dict[int, str] = {}

    def index_alu(i: int, x: LInst, a: list[Any]) -> Any:
        op = x.op
        if op in ("IDIV", "MOD"):
            n, d = a
            if d <= 0:
                raise LoopIRError(f"%{i}: index {op} by {d}: index division is by a positive constant")
            if x.arg == NONNEG and n < 0:
                raise LoopIRError(f"%{i}: index {op} marked {NONNEG} got the numerator {n}")
            return n // d if op == "IDIV" else n % d
        if op == "WHERE":
            return a[1] if a[0] else a[2]
        ops = {"ADD": lambda p, q: p + q, "MUL": lambda p, q: p * q, "NEG": lambda p: -p,
               "MAX": max, "CMPLT": lambda p, q: np.bool_(p < q), "CMPEQ": lambda p, q: np.bool_(p == q)}
        if op not in ops:
            raise LoopIRError(f"%{i}: {op} is not an index operation")
        return ops[op](*a)

    def element(i: int, p: int, idx: int) -> int:
        if not 0 <= idx < buffers[p].size:
            raise LoopIRError(f"%{i}: {insts[i].op} at index {idx} of parameter {p} ({buffers[p].size} elements)")
        return idx

    def block(lo: int, hi: int) -> None:
        i = lo
        while i < hi:
            x = insts[i]
            op, src = x.op, x.src
            if op == "RANGE":
                kind[i] = INDEX
                for v in range(x.arg):
                    val[i] = v
                    block(i + 1, end_of[i])
                i = end_of[i] + 1
                continue
            if op == "PARAM":
                val[i], kind[i] = x.arg, "param"
            elif op == "CONST":
                val[i] = int(x.arg) if x.dtype == INDEX else np.asarray(x.arg, dtype=x.dtype.np)
                kind[i] = INDEX if x.dtype == INDEX else x.dtype.name
            elif op == "DEFACC":
                val[i], kind[i] = np.asarray(x.arg, dtype=x.dtype.np), x.dtype.name
            elif op == "ACCUM":
                acc, v = src
                val[acc] = OPS[x.arg].ref([val[acc], val[v]], None, insts[acc].dtype)
            elif op == "ACCREAD":
                val[i], kind[i] = val[src[0]], kind[src[0]]
            elif op == "LOAD":
                p, ix = val[src[0]], val[src[1]]
                val[i], kind[i] = np.asarray(buffers[p][element(i, p, ix)]), x.dtype.name
            elif op == "STORE":
                p, ix = val[src[0]], val[src[1]]
                buffers[p][element(i, p, ix)] = val[src[2]]
            elif op != "ENDRANGE":
                operand = src[1] if op == "WHERE" else src[0]
                a = [val[s] for s in src]
                if kind[operand] == INDEX:
                    val[i] = index_alu(i, x, a)
                    kind[i] = INDEX if x.dtype == INDEX else "bool"
                else:
                    arg = x.dtype if op == "CAST" else None
                    val[i] = OPS[op].ref([np.asarray(v) for v in a], arg, x.dtype)
                    kind[i] = x.dtype.name
            i += 1

    block(0, len(insts))
