"""Data types and NumPy-like type promotion.

eqgrad has three dtypes: ``bool``, ``int32`` and ``float32`` (ordered by promotion rank).
Promotion follows NumPy for arrays of these types: bool < int32 < float32.
A Python scalar takes the category of its value but never widens a tensor's dtype
("weak" scalars, as in NumPy 2 / JAX): ``int32_tensor + 1.5`` is float32,
``float32_tensor + 2`` stays float32, ``bool_tensor + 1`` is int32.

Values from Python and NumPy enter through ``convert_scalar``/``convert_array`` (bottom of this
file; docs/semantics.md, "Conversions from Python and NumPy"): exact, rounded to float32, or an error.
"""
from __future__ import annotations

import math
import struct
import warnings
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

    def __eq__(self, other: object) -> bool:
        # the dtypes are module singletons (one copy per process unless unpickled): identity
        # first, the fields after (graph building compares dtypes at every op). The dataclass
        # still generates the field hash (frozen, and __eq__ written here)
        if self is other:
            return True
        if other.__class__ is not DType:
            return NotImplemented
        return (self.rank, self.name, self.itemsize, self.llvm, self.np) == \
            (other.rank, other.name, other.itemsize, other.llvm, other.np)

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
    if type(v) is float and -FLOAT32_MAX <= v <= FLOAT32_MAX:
        return _round32(v)                      # the common case, without NumPy (~0.2 against ~2 us)
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _round32(v: float) -> float:
    """A Python float within float32's finite range rounded to float32 (to nearest, ties to even,
    as NumPy's conversion; ``struct`` raises only beyond the range, which the callers exclude)."""
    return _F32.unpack(_F32.pack(v))[0]


_F32 = struct.Struct("f")


# ------------------------------------------------------------------ conversions from Python and NumPy
# Every value that enters eqgrad from Python or NumPy (Tensor(), full(), arange(), a scalar operand,
# assign()) goes through convert_scalar/convert_array: a value is kept exactly, rounded to the
# nearest float32, or -- for an explicit dtype= of another kind -- cast by the rules of .cast();
# anything else (an int outside int32, a finite float beyond float32, NaN or inf into int32) raises.
# cast_scalar above is the IR's own wrap-around, for constants folded inside the compiler.

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
PY_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _int32_range() -> str:
    return f"range {INT32_MIN}..{INT32_MAX}"


def _describe(v: object) -> str:
    if type(v) in (bool, int, float):
        return f"Python {'integer' if type(v) is int else type(v).__name__} {v!r}"
    return f"NumPy {np.asarray(v).dtype} {np.asarray(v).item()!r}"


def _prefix(op: str) -> str:
    return f"{op}: " if op else ""


def _out_of_bounds(d: DType) -> str:
    if d is int32:
        return f"is out of bounds for int32 ({_int32_range()}; eqgrad has no 64-bit integer dtype)"
    return f"is out of bounds for float32 (largest finite {FLOAT32_MAX:.8g}): it would become inf"


def finite_range(d: DType) -> tuple[int | float, int | float]:
    """The smallest and largest finite values of ``d``."""
    if d is int32:
        return INT32_MIN, INT32_MAX
    if d is float32:
        return -FLOAT32_MAX, FLOAT32_MAX
    return False, True


def beyond_range(v: object, d: DType) -> int:
    """+1 (-1) when the scalar ``v`` lies above (below) every finite value ``d`` can hold, so that
    storing it would overflow; 0 when it is inside (rounding aside) or is inf/NaN (a float32 holds
    those). Only the range is checked, not the kind (``2.5`` is inside int32)."""
    if isinstance(v, (bool, np.bool_)) or d is bool_:
        return 0
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if d is int32:
            return 1 if v > INT32_MAX else -1 if v < INT32_MIN else 0
        try:
            f = float(v)
        except OverflowError:                    # beyond float64 as well
            return 1 if v > 0 else -1
    else:
        f = float(v)
        if not math.isfinite(f):
            return 0
    if d is float32:
        with np.errstate(over="ignore"):
            return 0 if math.isfinite(np.float32(f)) else (1 if f > 0 else -1)
    # a float into int32: inside when it truncates to an int32
    return 1 if f >= 2.0**31 else -1 if f <= -2.0**31 - 1 else 0


def convert_scalar(v: object, d: DType, op: str = "") -> bool | int | float:
    """The value the Python/NumPy scalar ``v`` takes in ``d``, or an error: never a silent wrap.

    Exact conversions are kept; a float32 rounds to nearest (as NumPy: ``0.1``, ``2**24 + 1``);
    an explicit change of kind casts (float -> int32 truncates toward zero, any -> bool is ``!= 0``).
    An int outside int32, a finite value beyond float32 (it would become inf), and NaN/inf into
    int32 raise OverflowError/ValueError naming the value and the dtype."""
    if type(v) is float and d is float32 and -FLOAT32_MAX <= v <= FLOAT32_MAX:
        return _round32(v)                      # the common case (x * 0.5), checked by the range test
    if type(v) is int:                          # x + 1: exact in either dtype, no range check needed
        if d is float32 and -2**24 <= v <= 2**24:
            return float(v)
        if d is int32 and INT32_MIN <= v <= INT32_MAX:
            return v
    if not isinstance(v, PY_SCALARS):
        raise TypeError(f"{_prefix(op)}expected a Python bool, int or float scalar, got {type(v).__name__}")
    if d is bool_:
        return bool(v)
    if isinstance(v, (bool, np.bool_)):
        return int(v) if d is int32 else float(v)
    if isinstance(v, (float, np.floating)) and d is int32 and not math.isfinite(v):
        raise (ValueError if math.isnan(v) else OverflowError)(
            f"{_prefix(op)}cannot convert {_describe(v)} to int32 ({_int32_range()})")
    if beyond_range(v, d):
        raise OverflowError(f"{_prefix(op)}{_describe(v)} {_out_of_bounds(d)}")
    if d is int32:
        return int(v)              # a float truncates toward zero, as .cast(int32)
    if isinstance(v, (int, np.integer)):
        return float(np.float32(float(int(v))))
    return float(np.float32(v))


class ConversionWarning(UserWarning):
    """A NumPy array lost precision on its way into a tensor (float64 -> float32, or integers
    beyond 2**24 -> float32). Shown once per process and kind of conversion."""


_warned: set[tuple[str, str]] = set()


def _warn_inexact(a: np.ndarray, out: np.ndarray, op: str) -> None:
    """Warn once per (source dtype, target) when ``out`` does not hold ``a`` exactly. The check runs
    only until the first warning of its kind, so steady-state conversions cost nothing extra."""
    key = (str(a.dtype), str(out.dtype))
    if key in _warned:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.array_equal(out.astype(a.dtype), a, equal_nan=a.dtype.kind == "f")
    if not exact:
        _warned.add(key)
        warnings.warn(f"{_prefix(op)}{a.dtype} array rounded to {out.dtype} (eqgrad has no {a.dtype} dtype; "
                      f"shown once per process; pass dtype=float32 or convert with .astype(np.float32) to "
                      f"say the rounding is intended)", ConversionWarning, stacklevel=4)


def convert_array(a: np.ndarray, d: DType, op: str = "", source: str = "", warn: bool = False) -> np.ndarray:
    """``a`` as an array of ``d`` (no copy where it already is), by the rules of convert_scalar:
    integers of any width are kept when every value fits int32, float64 rounds to the nearest float32,
    an explicit change of kind casts; a value that would wrap, overflow to inf, or is NaN/inf going
    into int32 raises, naming the first such value, its index and the conversion. ``source`` names
    where ``a`` came from in that message (default: "<dtype> array")."""
    k = a.dtype.kind
    if k not in "biuf":
        raise TypeError(f"{_prefix(op)}unsupported NumPy dtype {a.dtype}; expected bool, integer or float")
    source = source or f"{a.dtype} array"
    if d is bool_ or k == "b" or a.dtype == d.np or a.size == 0:
        return a.astype(d.np, copy=False)
    if d is int32:
        if k in "iu":
            if np.can_cast(a.dtype, np.int32):
                return a.astype(np.int32, copy=False)
            bad = (a < INT32_MIN) | (a > INT32_MAX)
        else:
            bad = ~np.isfinite(a) | (a >= 2.0**31) | (a <= -2.0**31 - 1)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            v = a[i].item()
            if k == "f" and not math.isfinite(v):
                raise (ValueError if math.isnan(v) else OverflowError)(
                    f"{_prefix(op)}cannot convert {v!r} at index {i} of the {source} to int32 ({_int32_range()})")
            raise OverflowError(f"{_prefix(op)}value {v!r} at index {i} of the {source} {_out_of_bounds(d)}")
        return a.astype(np.int32)              # floats truncate toward zero, as .cast(int32)
    # float32: ints of any width and float64 round to nearest; a finite value must stay finite
    with np.errstate(over="ignore", invalid="ignore"):
        out = a.astype(np.float32)
    if k == "f" and a.dtype.itemsize > 4:
        bad = np.isinf(out) & np.isfinite(a)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise OverflowError(f"{_prefix(op)}value {a[i].item()!r} at index {i} of the {source} {_out_of_bounds(d)}")
    if warn:
        _warn_inexact(a, out, op)
    return out


def numbers_from_objects(arr: np.ndarray, want: DType | None, op: str = "") -> np.ndarray | None:
    """An object array that NumPy made of a list of Python scalars (it keeps ints beyond int64 as
    objects) as an array of its eqgrad dtype (``want``, or the default of its values), each element
    converted by convert_scalar: ``[2**70]`` is an OverflowError naming the value. None when the
    elements are not all numbers."""
    leaves = list(arr.flat)
    if not leaves or not all(isinstance(x, PY_SCALARS) for x in leaves):
        return None
    d = want or (float32 if any(isinstance(x, (float, np.floating)) for x in leaves) else
                 int32 if any(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in leaves) else bool_)
    return np.array([convert_scalar(x, d, op) for x in leaves], dtype=d.np).reshape(arr.shape)
