"""Data types and NumPy-like type promotion.

eqgrad has three dtypes: ``bool``, ``int32`` and ``float32`` (ordered by promotion rank).
Promotion follows NumPy for arrays of these types: bool < int32 < float32.
A Python scalar takes the category of its value but never widens a tensor's dtype
("weak" scalars, as in NumPy 2 / JAX): ``int32_tensor + 1.5`` is float32,
``float32_tensor + 2`` stays float32, ``bool_tensor + 1`` is int32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class DType:
    rank: int        # promotion order
    name: str        # "float32", "int32", "bool" -- also the egglog String
    itemsize: int
    llvm: str        # LLVM IR type of one element
    np: type         # NumPy scalar type

    def __repr__(self) -> str:
        return f"eqgrad.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.name.startswith("float")

    @property
    def is_int(self) -> bool:
        return self.name.startswith("int")

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"


bool_ = DType(0, "bool", 1, "i8", np.bool_)
int32 = DType(1, "int32", 4, "i32", np.int32)
float32 = DType(2, "float32", 4, "float", np.float32)

DTYPES: dict[str, DType] = {d.name: d for d in (bool_, int32, float32)}


def to_dtype(x: "DType | str | type | np.dtype") -> DType:
    """Accept an eqgrad dtype, its name, a NumPy dtype or Python's bool/int/float."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in DTYPES:
        return DTYPES[x]
    if x is bool:
        return bool_
    if x is int:
        return int32
    if x is float:
        return float32
    try:
        npd = np.dtype(x)
    except TypeError:
        npd = None
    if npd is not None:
        if npd == np.bool_:
            return bool_
        if npd.kind in "iu":
            return int32
        if npd.kind == "f":
            return float32
    raise TypeError(f"unsupported dtype {x!r}: expected one of {sorted(DTYPES)} "
                    "(or a NumPy/Python type that maps to them)")


def promote(a: DType, b: DType) -> DType:
    return a if a.rank >= b.rank else b


def scalar_dtype(v: object) -> DType:
    if isinstance(v, (bool, np.bool_)):
        return bool_
    if isinstance(v, (int, np.integer)):
        return int32
    if isinstance(v, (float, np.floating)):
        return float32
    raise TypeError(f"expected a Python bool, int or float scalar, got {type(v).__name__}")


def result_with_scalar(t: DType, v: object) -> DType:
    """dtype of ``tensor(t) <op> python_scalar(v)`` (weak scalar promotion)."""
    s = scalar_dtype(v)
    return t if t.rank >= s.rank else s


def cast_scalar(v: float | int | bool, dt: DType) -> float | int | bool:
    """The value ``v`` takes once stored in ``dt`` (float32 rounding, int32 wrap-around)."""
    if dt is bool_:
        return bool(v)
    if dt is int32:
        if isinstance(v, float):
            v = int(v) if np.isfinite(v) else 0
        return int(np.array(int(v) & 0xFFFFFFFF, dtype=np.uint32).astype(np.int32))
    with np.errstate(over="ignore"):
        return float(np.float32(v))
