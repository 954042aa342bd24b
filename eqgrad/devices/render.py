"""What every renderer shares: a dialect is a table from op to code (docs/devices.md).

A rule of a table (``llvm.LLVM_OPS``, ``cstyle.CSTYLE_OPS`` and its dialects' ``code_for_op``)
gets the :class:`Operation` -- the op and the kinds it works on -- and its operands' code, and
returns the result's code. An op missing from a table is either decomposed before rendering
(``lower/decomp.py``: exp2, log2, sin) or an error; :func:`required_ops` is what a table must hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection

from eqgrad.graph.loopir import LOOP_ALU_OPS, NONNEG
from eqgrad.lower.decomp import decomposed_for
from eqgrad.ops import ALU_OPS

FLOATS = ("float32", "float64", "float16", "bfloat16")
VALUE_OPS = frozenset(ALU_OPS) | frozenset(LOOP_ALU_OPS)    # every op a table rule renders


def kind(dt: Any) -> str:
    """A loop-IR dtype as a kind name: float32 | float64 | int32 | bool | index."""
    return dt if isinstance(dt, str) else dt.name


@dataclass(frozen=True)
class Operation:
    """One instruction as a rule sees it."""
    op: str
    src: str             # the operands' kind (WHERE: its value operands'; TABLE: the index's)
    dst: str             # the result's kind
    arg: Any = None      # the instruction's arg (loopir.NONNEG, a loopir.Table)

    @property
    def is_float(self) -> bool:
        return self.src in FLOATS

    @property
    def nonneg(self) -> bool:
        return self.arg == NONNEG


def required_ops(table: Collection[str]) -> set[str]:
    """The ops a renderer whose table holds ``table`` can be given: every op of the op table and
    of the loop IR, less those decomposed for it."""
    return set(VALUE_OPS) - decomposed_for(table)


class MissingRule(NotImplementedError):
    """A renderer was given an op (or an op on a kind) that its table has no rule for."""

    def __init__(self, renderer: str, o: Operation) -> None:
        super().__init__(f"{renderer} renderer: no rule for {o.op} on {o.src} (result {o.dst})")
