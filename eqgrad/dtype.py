"""Data types and NumPy-like type promotion.

eqgrad's dtypes: ``bool``, ``uint8 int8 int16 int32 uint32 int64``, ``float16 bfloat16 float32
float64``. Two tensors promote by :data:`PROMOTION`: across kinds the higher kind wins
(bool < integer < float, as torch: ``int64 + float16`` is float16), within a kind NumPy's table
(``uint8 + int8`` is int16, ``uint32 + int32`` is int64), ``bfloat16 + float16`` is float32.
A Python scalar takes the category of its value but never widens a tensor's dtype
("weak" scalars, as in NumPy 2 / JAX): ``int32_tensor + 1.5`` is float32,
``float16_tensor + 2`` stays float16, ``bool_tensor + 1`` is int32. Unknown names are errors.

Values from Python and NumPy enter through ``convert_scalar``/``convert_array`` (bottom of this
file; docs/semantics.md, "Conversions from Python and NumPy"): exact, rounded to float32, or an error.
"""
from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass

import numpy as np

from eqgrad.errors import DTypeError


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
        return self.name.startswith(("float", "bfloat"))

    @property
    def is_int(self) -> bool:
        """Any integer dtype, signed or not (not bool)."""
        return self.name.startswith(("int", "uint"))

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"

    @property
    def is_signed(self) -> bool:
        """Floats and signed integers (torch's ``is_signed``)."""
        return self.is_float or self.name.startswith("int")

    @property
    def is_narrow_float(self) -> bool:
        """float16/bfloat16: stored narrow, computed in float32 and rounded back after each op
        where a device lacks their arithmetic (docs/semantics.md, "Dtypes")."""
        return self.name in ("float16", "bfloat16")

    @property
    def kind(self) -> str:
        """NumPy's kind letter: b(ool), i(nt), u(nsigned), f(loat)."""
        return "b" if self.is_bool else "f" if self.is_float else "u" if self.name[0] == "u" else "i"

    @property
    def vnp(self) -> type:
        """The NumPy type the reference computes values in (float32 for bfloat16; else ``np``)."""
        return np.float32 if self.name == "bfloat16" else self.np

    @property
    def min(self) -> int | float | bool:
        """The smallest finite value (torch.finfo/iinfo ``min``; False for bool)."""
        return finite_range(self)[0]

    @property
    def max(self) -> int | float | bool:
        """The largest finite value (torch.finfo/iinfo ``max``; True for bool)."""
        return finite_range(self)[1]


bool_ = DType(0, "bool", 1, "i8", np.bool_)
uint8 = DType(1, "uint8", 1, "i8", np.uint8)
int8 = DType(2, "int8", 1, "i8", np.int8)
int16 = DType(3, "int16", 2, "i16", np.int16)
int32 = DType(4, "int32", 4, "i32", np.int32)
uint32 = DType(5, "uint32", 4, "i32", np.uint32)
int64 = DType(6, "int64", 8, "i64", np.int64)
float16 = DType(7, "float16", 2, "half", np.float16)
# NumPy has no bfloat16: its host arrays hold the raw bits as uint16 (``np``); the NumPy reference
# computes on float32 values rounded to bfloat16 after every op (bf16_to_f32 / f32_to_bf16 below)
bfloat16 = DType(8, "bfloat16", 2, "bfloat", np.uint16)
float32 = DType(9, "float32", 4, "float", np.float32)
float64 = DType(10, "float64", 8, "double", np.float64)

ALL_DTYPES: tuple[DType, ...] = (bool_, uint8, int8, int16, int32, uint32, int64, float16, bfloat16, float32, float64)
DTYPES: dict[str, DType] = {d.name: d for d in ALL_DTYPES}
# torch's other spellings (torch.half, torch.long, ...): names, never a different dtype
ALIASES: dict[str, DType] = {"half": float16, "float": float32, "double": float64, "short": int16,
                             "int": int32, "long": int64, "bool_": bool_}
_BY_NP: dict[np.dtype, DType] = {np.dtype(d.np): d for d in ALL_DTYPES if d is not bfloat16}


def _supported() -> str:
    return ", ".join(DTYPES)


def to_dtype(x: "DType | str | type | np.dtype") -> DType:
    """An eqgrad dtype from a dtype, its name (or torch's alias: ``"half"``, ``"long"``), a NumPy
    dtype, a torch dtype, or Python's bool/int/float (bool, int32, float32). Anything else -- an
    unknown name, ``np.uint16``, ``np.complex64``, ``torch.uint64`` -- is a DTypeError naming the
    supported dtypes: a dtype is never replaced by another one."""
    if isinstance(x, DType):
        return x
    if x is bool:
        return bool_
    if x is int:
        return int32
    if x is float:
        return float32
    if type(x).__module__ == "torch" and type(x).__name__ == "dtype":   # torch.float16 (torch not imported)
        x = str(x).removeprefix("torch.")
    if isinstance(x, str):
        d = DTYPES.get(x) or ALIASES.get(x)
        if d is None:
            raise DTypeError(f"unsupported dtype {x!r}: eqgrad supports {_supported()}")
        return d
    try:
        npd = np.dtype(x)
    except TypeError:
        raise DTypeError(f"unsupported dtype {x!r}: eqgrad supports {_supported()}") from None
    if npd.names is None and npd.kind == "V" and npd.itemsize == 2 and "bfloat16" in str(npd):   # ml_dtypes
        return bfloat16
    d = _BY_NP.get(npd)
    if d is None:
        raise DTypeError(f"unsupported NumPy dtype {npd}: eqgrad supports {_supported()}")
    return d


def _category(d: DType) -> int:
    return 0 if d is bool_ else 2 if d.is_float else 1


def _promote_pair(a: DType, b: DType) -> DType:
    """Torch's rule where the kinds differ (bool < any integer < any float: the operand of the
    higher kind wins, whatever its width), NumPy's table within a kind (``uint8 + int8 = int16``,
    ``uint32 + int32 = int64``, ``float16 + float32 = float32``); bfloat16 with float16 is float32
    (as torch and ml_dtypes)."""
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if a is b:
        return a
    if {a, b} == {float16, bfloat16}:
        return float32
    if bfloat16 in (a, b):
        return a if b is bfloat16 else b             # float32/float64: the wider
    return _BY_NP[np.promote_types(a.np, b.np)]


PROMOTION: dict[tuple[DType, DType], DType] = {(a, b): _promote_pair(a, b) for a in ALL_DTYPES for b in ALL_DTYPES}


def promote(a: DType, b: DType) -> DType:
    """The dtype of ``a <op> b`` for two tensors (docs/semantics.md, "Dtypes")."""
    return PROMOTION[a, b]


def scalar_dtype(v: object) -> DType:
    if isinstance(v, (bool, np.bool_)):
        return bool_
    if isinstance(v, (int, np.integer)):
        return int32
    if isinstance(v, (float, np.floating)):
        return float32
    raise TypeError(f"expected a Python bool, int or float scalar, got {type(v).__name__}")


def result_with_scalar(t: DType, v: object) -> DType:
    """dtype of ``tensor(t) <op> python_scalar(v)`` (weak scalar promotion): the tensor's dtype,
    unless the scalar is of a higher kind (bool < int < float); then that kind's default dtype."""
    s = scalar_dtype(v)
    return t if _category(t) >= _category(s) else s


def round_to(v: float, d: DType) -> float:
    """The float ``v`` rounded to the float dtype ``d`` (to nearest, ties to even; beyond the range: inf)."""
    if d is float64:
        return float(v)
    if d is float32 and -FLOAT32_MAX <= v <= FLOAT32_MAX:
        return _round32(v)
    with np.errstate(over="ignore", invalid="ignore"):
        if d is bfloat16:
            return float(round_bf16(np.array([v], np.float64))[0]) if math.isfinite(v) and abs(v) <= FLOAT32_MAX \
                else float(np.float32(v)) if not math.isfinite(v) else math.copysign(math.inf, v)
        return float(d.np(v))


def _wrap(v: int, d: DType) -> int:
    """The integer ``v`` wrapped to the width of the integer dtype ``d`` (two's complement)."""
    bits = 8 * d.itemsize
    v &= (1 << bits) - 1
    return v - (1 << bits) if d.is_signed and v >> (bits - 1) else v


def cast_scalar(v: float | int | bool, dt: DType) -> float | int | bool:
    """The value ``v`` takes once stored in ``dt`` by the IR's CAST (float rounding, integer
    wrap-around, a float into an integer truncated and saturated, NaN -> 0: ops._cast)."""
    if dt is bool_:
        return bool(v)
    if dt.is_int:
        if isinstance(v, float):
            if math.isnan(v):
                return 0
            lo, hi = finite_range(dt)
            return lo if v <= lo else hi if v >= hi else int(v)
        return _wrap(int(v), dt)
    if type(v) is float and dt is float32 and -FLOAT32_MAX <= v <= FLOAT32_MAX:
        return _round32(v)                      # the common case, without NumPy (~0.2 against ~2 us)
    return round_to(float(v), dt)


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
    lo, hi = finite_range(d)
    if d.is_int:
        return f"is out of bounds for {d.name} (range {lo}..{hi})"
    return f"is out of bounds for {d.name} (largest finite {hi:.8g}): it would become inf"


BFLOAT16_MAX = 3.3895313892515355e38


def finite_range(d: DType) -> tuple[int | float, int | float]:
    """The smallest and largest finite values of ``d``."""
    if d is int32:
        return INT32_MIN, INT32_MAX
    if d is float32:
        return -FLOAT32_MAX, FLOAT32_MAX
    if d is bfloat16:
        return -BFLOAT16_MAX, BFLOAT16_MAX
    if d.is_float:
        m = float(np.finfo(d.np).max)
        return -m, m
    if d.is_int:
        i = np.iinfo(d.np)
        return int(i.min), int(i.max)
    return False, True


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32 values: the upper half of a float32, exactly."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def ints_to_f64_odd(x: np.ndarray) -> np.ndarray:
    """Integers (or bools) as float64: exact where they fit in 53 bits; a wider int64 is rounded to
    odd (toward zero, the last kept bit set if anything was cut off), so that rounding the result to
    nearest at 51 bits or fewer rounds as the integer would (NumPy's own conversion rounds to nearest,
    and a second rounding to nearest after it is wrong just above a midpoint)."""
    x = np.asarray(x)
    if x.dtype.kind == "b" or x.dtype.itemsize < 8:
        return x.astype(np.float64)
    if x.dtype.kind == "u":                                    # a uint64 array from the host
        neg, mag = np.zeros(x.shape, bool), x.astype(np.uint64)
    else:
        neg = x < 0
        a = x.astype(np.int64).view(np.uint64)
        mag = np.where(neg, ~a + np.uint64(1), a)              # |x|, 2**63 included, as uint64
    e = np.frexp(mag.astype(np.float64))[1]                    # the bit length, or one more
    shift = np.clip(e - 53, 0, 63).astype(np.uint64)           # keeping 52 bits rounds as well
    mask = (np.uint64(1) << shift) - np.uint64(1)
    kept = (mag & ~mask) | (((mag & mask) != 0).astype(np.uint64) << shift)
    f = kept.astype(np.float64)                                # exact: at most 53 bits
    return np.where(neg, -f, f)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Integers, float32 or float64 values as bfloat16 bits: round to nearest, ties to even, once (LLVM's
    fptrunc to bfloat); NaN stays a quiet NaN of its sign. A float64 goes to float32 rounding to
    odd first (toward zero, then the last bit set if anything was cut off), which then rounds to
    bfloat16 as the float64 would have: rounding it to nearest twice is wrong just above a midpoint."""
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        x = ints_to_f64_odd(x)
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.asarray(x, np.float32, order="C").view(np.uint32)       # (asarray: a 0-d array stays 0-d)
        if x.dtype == np.float64:
            back = u.view(np.float32).astype(np.float64)
            inexact = (back != x) & ~np.isnan(x)
            away = (inexact & (np.abs(back) > np.abs(x))).astype(np.uint32)
            u = np.where(inexact, (u - away) | np.uint32(1), u).astype(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), r).astype(np.uint16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (still float32): the reference's bfloat16 value."""
    return bf16_to_f32(f32_to_bf16(x))


def to_storage(a: np.ndarray, d: DType) -> np.ndarray:
    """Values of ``d`` (in ``d.vnp``) as the host array that holds them (``d.np``)."""
    return f32_to_bf16(a) if d is bfloat16 else np.asarray(a).astype(d.np, copy=False)


def from_storage(a: np.ndarray, d: DType) -> np.ndarray:
    """A host array of ``d`` (``d.np``) as its values (``d.vnp``)."""
    return bf16_to_f32(a).reshape(np.shape(a)) if d is bfloat16 else a


def beyond_range(v: object, d: DType) -> int:
    """+1 (-1) when the scalar ``v`` lies above (below) every finite value ``d`` can hold, so that
    storing it would overflow; 0 when it is inside (rounding aside) or is inf/NaN (a float holds
    those). Only the range is checked, not the kind (``2.5`` is inside int32)."""
    if isinstance(v, (bool, np.bool_)) or d is bool_:
        return 0
    lo, hi = finite_range(d)
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if d.is_int:
            return 1 if v > hi else -1 if v < lo else 0
        try:
            f = float(v)
        except OverflowError:                    # beyond float64 as well
            return 1 if v > 0 else -1
    else:
        f = float(v)
        if not math.isfinite(f):
            return 0
    if d.is_float:
        return 0 if math.isfinite(round_to(f, d)) else (1 if f > 0 else -1)
    # a float into an integer dtype: inside when it truncates into the range
    return 1 if f >= hi + 1 else -1 if f <= lo - 1 else 0


def convert_scalar(v: object, d: DType, op: str = "") -> bool | int | float:
    """The value the Python/NumPy scalar ``v`` takes in ``d``, or an error: never a silent wrap.

    Exact conversions are kept; a float dtype rounds to nearest (as NumPy: ``0.1``, ``2**24 + 1``);
    an explicit change of kind casts (float -> integer truncates toward zero, any -> bool is ``!= 0``).
    An int outside the integer dtype's range, a finite value beyond a float dtype's (it would become
    inf), and NaN/inf into an integer dtype raise OverflowError/ValueError naming the value and dtype."""
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
        return int(v) if d.is_int else float(v)
    if isinstance(v, (float, np.floating)) and d.is_int and not math.isfinite(v):
        lo, hi = finite_range(d)
        raise (ValueError if math.isnan(v) else OverflowError)(
            f"{_prefix(op)}cannot convert {_describe(v)} to {d.name} (range {lo}..{hi})")
    if beyond_range(v, d):
        raise OverflowError(f"{_prefix(op)}{_describe(v)} {_out_of_bounds(d)}")
    if d.is_int:
        return int(v)              # a float truncates toward zero, as .cast()
    if isinstance(v, (int, np.integer)):
        return round_to(float(int(v)), d)
    return round_to(float(v), d)


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
        warnings.warn(f"{_prefix(op)}{a.dtype} array rounded to {out.dtype} (shown once per process; pass "
                      f"dtype= to say the rounding is intended)", ConversionWarning, stacklevel=4)


def convert_array(a: np.ndarray, d: DType, op: str = "", source: str = "", warn: bool = False) -> np.ndarray:
    """``a`` as the host array of ``d`` (``d.np``; no copy where it already is), by the rules of
    convert_scalar: integers of any width are kept when every value fits ``d``, a wider float rounds
    to the nearest ``d``, an explicit change of kind casts; a value that would wrap, overflow to inf,
    or is NaN/inf going into an integer dtype raises, naming the first such value, its index and the
    conversion. ``source`` names where ``a`` came from in that message (default: "<dtype> array").
    A bfloat16 result holds the bits (uint16), rounded to nearest even."""
    k = a.dtype.kind
    if k not in "biuf":
        raise TypeError(f"{_prefix(op)}unsupported NumPy dtype {a.dtype}; expected bool, integer or float")
    source = source or f"{a.dtype} array"
    if d is not bfloat16 and (d is bool_ or k == "b" or a.dtype == d.np or a.size == 0):
        return a.astype(d.np, copy=False)
    if d is bfloat16 and (a.size == 0 or k == "b"):
        return f32_to_bf16(a.astype(np.float32))
    if d.is_int:
        lo, hi = finite_range(d)
        if k in "iu":
            if np.can_cast(a.dtype, d.np):
                return a.astype(d.np, copy=False)
            bad = (a < lo) | (a > hi)
        else:
            bad = ~np.isfinite(a) | (a >= float(hi) + 1) | (a <= float(lo) - 1)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            v = a[i].item()
            if k == "f" and not math.isfinite(v):
                raise (ValueError if math.isnan(v) else OverflowError)(
                    f"{_prefix(op)}cannot convert {v!r} at index {i} of the {source} to {d.name} (range {lo}..{hi})")
            raise OverflowError(f"{_prefix(op)}value {v!r} at index {i} of the {source} {_out_of_bounds(d)}")
        return a.astype(d.np)                  # floats truncate toward zero, as .cast()
    # a float dtype: ints of any width and wider floats round to nearest; a finite value must stay finite
    with np.errstate(over="ignore", invalid="ignore"):
        if d is bfloat16:
            vals = round_bf16(a)
            big = np.abs(a.astype(np.float64)) > BFLOAT16_MAX * (1 + 2.0**-9)   # rounds to inf
            vals = np.where(big & np.isfinite(a), np.copysign(np.inf, a.astype(np.float32)), vals)
        else:
            vals = a.astype(d.np)
    if k != "b":
        bad = np.isinf(vals) & np.isfinite(a)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise OverflowError(f"{_prefix(op)}value {a[i].item()!r} at index {i} of the {source} {_out_of_bounds(d)}")
    if warn:
        _warn_inexact(a, vals, op)
    return f32_to_bf16(vals) if d is bfloat16 else vals


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
    vals = np.array([convert_scalar(x, d, op) for x in leaves], dtype=d.vnp).reshape(arr.shape)
    return to_storage(vals, d)
