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

from eqgrad.dtype import DType

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
