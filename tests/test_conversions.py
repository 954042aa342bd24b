"""Conversions from Python and NumPy into eqgrad's dtypes (docs/semantics.md, "Conversions from
Python and NumPy"): a value is kept exactly, rounded to the nearest float32, or cast by an explicit
``dtype=``; a value that would wrap (an int outside int32) or overflow to inf (a finite value beyond
float32) raises, naming the value and the dtype. Comparisons with an out-of-range scalar give the
exact answer (as NumPy 2). Every case runs on each device of tests/conftest.py's DEVICES."""
from __future__ import annotations

import operator

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor

I32, F32, BOOL = eqgrad.int32, eqgrad.float32, eqgrad.bool_
IMIN, IMAX = -2**31, 2**31 - 1
FMAX = float(np.finfo(np.float32).max)
INT_MSG = r"out of bounds for int32 \(range -2147483648\.\.2147483647"
FLOAT_MSG = r"out of bounds for float32 .*would become inf"


def same(t: Tensor, expected: np.ndarray, dtype: eqgrad.DType) -> None:
    """Exactly the expected values, in the expected eqgrad dtype."""
    assert t.dtype == dtype, f"dtype {t.dtype}, expected {dtype}"
    got = t.numpy()
    assert got.dtype == dtype.np and got.shape == np.shape(expected)
    np.testing.assert_array_equal(got, np.asarray(expected).astype(dtype.np))


# ------------------------------------------------------------------ Python ints outside int32

@pytest.mark.parametrize("make", [
    lambda d: Tensor(2**40, device=d),
    lambda d: Tensor(-2**31 - 1, device=d),
    lambda d: Tensor(2**31, requires_grad=False, device=d),
    lambda d: Tensor([2**40], device=d),
    lambda d: Tensor([1, 2, 2**31], device=d),
    lambda d: Tensor([[1, 2], [3, -2**31 - 1]], device=d),
    lambda d: Tensor([2**63], device=d),                  # NumPy: uint64
    lambda d: Tensor([2**70], device=d),                  # NumPy: an object array
    lambda d: Tensor([[1], [-2**70]], device=d),
    lambda d: Tensor([True, 2**40], device=d),
    lambda d: Tensor([2**40], dtype=I32, device=d),
    lambda d: Tensor.full((2, 2), 2**40, device=d),
    lambda d: Tensor.full(3, -2**31 - 1, dtype=I32, device=d),
    lambda d: Tensor.arange(2**40, device=d),
    lambda d: Tensor.arange(2**31 - 2, 2**31 + 1, device=d),
    lambda d: Tensor.arange(-2**31 - 1, -2**31 + 1, device=d),
], ids=lambda f: "")
def test_python_int_outside_int32_raises(device, make):
    with pytest.raises(OverflowError, match=INT_MSG):
        make(device)


def test_error_names_the_value_and_the_dtype(device):
    with pytest.raises(OverflowError, match=r"^Tensor\(\): Python integer 1099511627776 is out of bounds for int32 "
                                            r"\(range -2147483648\.\.2147483647"):
        Tensor(2**40, device=device)
    with pytest.raises(OverflowError, match=r"^add: Python integer 1099511627776 is " + INT_MSG):
        Tensor([1, 2], device=device) + 2**40
    with pytest.raises(OverflowError, match=r"value 1099511627776 at index \(1, 0\) of the int64 array"):
        Tensor(np.array([[1], [2**40]], dtype=np.int64), dtype=I32, device=device)


OPS = {
    "add": lambda x, v: x + v, "radd": lambda x, v: v + x, "sub": lambda x, v: x - v,
    "rsub": lambda x, v: v - x, "mul": lambda x, v: x * v, "floordiv": lambda x, v: x // v,
    "mod": lambda x, v: x % v, "pow": lambda x, v: x ** v, "and": lambda x, v: x & v,
    "or": lambda x, v: v | x, "xor": lambda x, v: x ^ v, "maximum": lambda x, v: x.maximum(v),
    "minimum": lambda x, v: x.minimum(v), "where_x": lambda x, v: (x > 0).where(x, v),
    "where_y": lambda x, v: (x > 0).where(v, x), "where_scalars": lambda x, v: (x > 0).where(v, 0.0 if x.dtype is F32 else 0),
    "pad_value": lambda x, v: x.pad(((1, 1),), value=v), "clip_min_above": lambda x, v: x.clip(v, None),
    "clip_max_below": lambda x, v: x.clip(None, -int(v) - 1 if isinstance(v, (int, np.integer)) else -v), "full_like": lambda x, v: x.full_like(v),
}


@pytest.mark.parametrize("v", [2**40, 2**31, np.int64(2**40), np.uint64(2**63)], ids=repr)
@pytest.mark.parametrize("op", sorted(OPS))
def test_int32_op_with_out_of_range_int_raises(device, op, v):
    """NumPy 2 raises OverflowError for ``int32_array + 2**40``; eqgrad used to wrap 2**40 to 0."""
    x = Tensor(np.array([1, -2, 3], np.int32), device=device)
    with pytest.raises(OverflowError, match=INT_MSG):
        OPS[op](x, v).numpy()
    if op != "full_like":       # full_like(v) of a bool tensor is an explicit cast to bool (v != 0)
        with pytest.raises(OverflowError, match=INT_MSG):       # a bool tensor promotes to int32 first
            OPS[op](Tensor([True, False, True], device=device), v).numpy()


CMP = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
       "eq": operator.eq, "ne": operator.ne}


@pytest.mark.parametrize("v", [2**31, -2**31 - 1, 2**40, -2**40, 2**63, 2**70, -2**70,
                               IMAX, IMIN, IMAX - 1, np.int64(2**40), np.int64(-2**33)], ids=repr)
@pytest.mark.parametrize("op", sorted(CMP))
def test_int_comparison_with_any_python_int_is_exact(device, op, v):
    """``int32_x < 2**40`` is all true (NumPy 2 gives the same); it used to compare with 0."""
    a = np.array([IMIN, -7, 0, 5, IMAX - 1, IMAX], np.int32)
    expected = np.array([CMP[op](int(e), int(v)) for e in a])
    same(CMP[op](Tensor(a, device=device), v), expected, BOOL)
    same(CMP[op](v, Tensor(a, device=device)), np.array([CMP[op](int(v), int(e)) for e in a]), BOOL)
    b = np.array([True, False])
    same(CMP[op](Tensor(b, device=device), v), np.array([CMP[op](int(e), int(v)) for e in b]), BOOL)


@pytest.mark.parametrize("v", [1e300, -1e300, 2**200, -2**200, 2**2000, 3.5e38, -3.5e38, 1e39,
                               np.float64(1e300)], ids=repr)
@pytest.mark.parametrize("op", sorted(CMP))
def test_float_comparison_beyond_float32_is_exact(device, op, v):
    """A finite scalar beyond float32 compares like the real number it is: ``inf > 1e300`` is true,
    ``inf == 1e300`` false, ``FLOAT32_MAX < 1e300`` true (NumPy rounds 1e300 to inf, with a warning)."""
    a = np.array([-np.inf, -FMAX, -1.0, 0.0, 2.5, FMAX, np.inf, np.nan], np.float32)
    expected = np.array([CMP[op](float(e), v) if not np.isnan(e) else op == "ne" for e in a])
    same(CMP[op](Tensor(a, device=device), v), expected, BOOL)
    ints = np.array([IMIN, 0, IMAX], np.int32)        # int32 <op> float promotes to float32
    same(CMP[op](Tensor(ints, device=device), v), np.array([CMP[op](float(np.float32(e)), v) for e in ints]), BOOL)


def test_clip_with_a_bound_that_cannot_bind(device):
    """NumPy 2: ``np.clip(int32_x, 0, 2**40)`` is ``np.clip(x, 0, None)``; the bound beyond the range
    on its non-binding side leaves the values as they are."""
    a = np.array([IMIN, -5, 0, 7, IMAX], np.int32)
    same(Tensor(a, device=device).clip(0, 2**40), np.clip(a, 0, None), I32)
    same(Tensor(a, device=device).clip(-2**40, 3), np.clip(a, None, 3), I32)
    same(Tensor(a, device=device).clip(-2**40, 2**63), a, I32)
    f = np.array([-np.inf, -1.5, 0.0, FMAX, np.inf, np.nan], np.float32)
    same(Tensor(f, device=device).clip(-1e300, 1e300), f, F32)
    same(Tensor(a, device=device).clip(-1e300, 0.5), np.clip(a.astype(np.float32), None, 0.5), F32)
    with pytest.raises(OverflowError, match=FLOAT_MSG):
        Tensor(f, device=device).clip(1e300, None)


# ------------------------------------------------------------------ floats beyond float32

@pytest.mark.parametrize("make", [
    lambda d: Tensor(1e300, device=d),
    lambda d: Tensor(-1e39, device=d),
    lambda d: Tensor(np.float64(1e300), device=d),
    lambda d: Tensor(2**200, dtype=F32, device=d),
    lambda d: Tensor(1e300, requires_grad=True, device=d),
    lambda d: Tensor([1.0, 1e300], device=d),
    lambda d: Tensor([2**200, 1.5], device=d),           # NumPy: an object array
    lambda d: Tensor([[0.5], [-3.5e38]], device=d),
    lambda d: Tensor(np.array([0.0, 1e300]), dtype=F32, device=d),
    lambda d: Tensor(np.array([[1.0, 2.0], [3.0, -1e39]]), dtype=F32, device=d),
    lambda d: Tensor(np.array([1e300]), dtype=F32, device=d),
    lambda d: Tensor(np.array([3.4028236e38]), dtype=F32, device=d),     # just past FLOAT32_MAX + ulp/2: rounds to inf
    lambda d: Tensor.full(3, 1e39, device=d),
    lambda d: Tensor.full(3, 2**200, dtype=F32, device=d),
    lambda d: Tensor.arange(0.0, 3e300, 1e300, device=d),
], ids=lambda f: "")
def test_finite_float_beyond_float32_raises(device, make):
    with pytest.raises(OverflowError, match=FLOAT_MSG):
        make(device)


@pytest.mark.parametrize("v", [1e300, -1e39, 2**200, np.float64(1e300), 2**2000], ids=repr)
@pytest.mark.parametrize("op", ["add", "radd", "sub", "rsub", "mul", "maximum", "minimum", "where_x",
                                "where_y", "where_scalars", "pad_value", "full_like"])
def test_float32_op_with_out_of_range_scalar_raises(device, op, v):
    """NumPy rounds 1e300 to inf (with a RuntimeWarning); eqgrad raises instead of changing it."""
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32), device=device)
    with pytest.raises(OverflowError, match=FLOAT_MSG):
        OPS[op](x, v).numpy()
    with pytest.raises(OverflowError, match=FLOAT_MSG):     # int32 with a Python float promotes to float32
        (Tensor([1, 2], device=device) * 1e300).numpy()


def test_non_finite_floats_are_values(device):
    a = np.array([np.inf, -np.inf, np.nan, 0.5])
    same(Tensor(a, dtype=F32, device=device), a.astype(np.float32), F32)
    same(Tensor(a, device=device), a, eqgrad.float64)                       # a NumPy array keeps its dtype
    same(Tensor([float("inf"), float("nan")], device=device), np.array([np.inf, np.nan], np.float32), F32)
    same(Tensor(np.array([1.0, 2.0], np.float32), device=device) + float("inf"), np.array([np.inf, np.inf]), F32)
    same(Tensor.full(2, float("-inf"), device=device), np.full(2, -np.inf), F32)


# ------------------------------------------------------------------ NumPy arrays of other dtypes

@pytest.mark.parametrize("a", [
    np.array([2**40, 1], np.int64), np.array([-2**31 - 1], np.int64), np.array([2**31], np.uint32),
    np.array([2**32 - 1, 0], np.uint32), np.array([2**63], np.uint64), np.array([[0], [2**31]], np.int64),
], ids=lambda a: f"{a.dtype}{a.ravel().tolist()}")
def test_int_array_outside_int32_raises(device, a):
    if a.dtype == np.uint64:           # no uint64 dtype: an error, never another dtype
        with pytest.raises(eqgrad.DTypeError, match="unsupported NumPy dtype uint64"):
            Tensor(a, device=device)
    else:                              # int64/uint32 keep their dtype and their values
        same(Tensor(a, device=device), a, eqgrad.dtype.to_dtype(a.dtype))
    with pytest.raises(OverflowError, match=INT_MSG):
        Tensor(a, dtype=I32, device=device)


@pytest.mark.parametrize("a", [
    np.array([IMIN, -1, 0, 1, IMAX], np.int64), np.array([0, 7, IMAX], np.uint32),
    np.array([0, 2**31 - 1], np.uint64), np.array([-128, 0, 127], np.int8), np.array([0, 65535], np.uint16),
    np.array([[IMIN, IMAX]], np.int32), np.arange(-3, 3, dtype=np.int64).reshape(2, 3),
], ids=lambda a: f"{a.dtype}{a.ravel().tolist()}")
def test_int_arrays_inside_int32_are_exact(device, a):
    same(Tensor(a, dtype=I32, device=device), a, I32)
    same(Tensor(a, dtype=I32, device=device) + 0, a, I32)


def test_uint8_image_and_bool_arrays_are_exact(device):
    img = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    same(Tensor(img, device=device), img, eqgrad.uint8)
    same(Tensor(img, dtype=I32, device=device), img.astype(np.int32), I32)
    if device == "CUDA":
        # uint8 is stored there but not computed with (docs/semantics.md, "Dtypes"): a clear error, never
        # wrong numbers; converting on the way in (the next line) is the way to use it there
        with pytest.raises(eqgrad.DTypeError, match=r"does not support uint8 yet"):
            (Tensor(img, device=device).float() / 255).numpy()
    else:
        same(Tensor(img, device=device).float() / 255, img.astype(np.float32) * np.float32(1 / 255), F32)
    same(Tensor(img, dtype=F32, device=device), img.astype(np.float32), F32)
    b = np.array([[True, False], [False, True]])
    same(Tensor(b, device=device), b, BOOL)
    same(Tensor(b, dtype=I32, device=device), b.astype(np.int32), I32)
    same(Tensor(b, dtype=F32, device=device), b.astype(np.float32), F32)


@pytest.mark.filterwarnings("ignore::eqgrad.ConversionWarning")
def test_float64_rounds_to_nearest_float32(device):
    """float64 -> float32 rounds to nearest (the convention of float frameworks): every finite
    float64 within float32's range, subnormals and underflow to 0 included."""
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.standard_normal(50) * 10.0 ** rng.integers(-40, 38, 50), [0.1, 1 / 3, -0.0, 1e-46,
                        FMAX, -FMAX, 3.4028235e38, 5e-324, np.inf, np.nan]])
    same(Tensor(a, dtype=F32, device=device), a.astype(np.float32), F32)
    same(Tensor(a.reshape(6, 10), dtype=F32, device=device), a.reshape(6, 10).astype(np.float32), F32)
    same(Tensor(a.tolist(), device=device), a.astype(np.float32), F32)
    f16 = np.array([0.5, -65504.0, np.inf], np.float16)
    same(Tensor(f16, dtype=F32, device=device), f16.astype(np.float32), F32)
    same(Tensor(f16, device=device), f16, eqgrad.float16)


def test_inexact_float64_array_warns_once(monkeypatch):
    """A float64 array that float32 cannot hold exactly warns once per process (ConversionWarning,
    naming the conversion); an exact one, an explicit dtype= and Python floats do not warn."""
    import warnings
    from eqgrad import dtype as dt
    monkeypatch.setattr(dt, "_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tensor(np.arange(5.0), device="NUMPY")                     # exact: no warning
        Tensor(np.array([0.1, 1 / 3]), dtype=F32, device="NUMPY")  # asked for: no warning
        Tensor([0.1, 1 / 3], device="NUMPY")                       # Python floats: weak scalars
        Tensor(np.array([0.1]), device="NUMPY")                    # a NumPy array keeps float64
    with pytest.warns(eqgrad.ConversionWarning, match=r"float64 array rounded to float32"):
        dt.convert_array(np.array([0.1]), F32, warn=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt.convert_array(np.array([0.2]), F32, warn=True)          # once per process


def test_exactness_property_on_random_arrays():
    """A conversion is exact or raises, never anything else: random int64 near the int32 limits and
    random float64 near float32's largest value."""
    rng = np.random.default_rng(2)
    for _ in range(100):
        a = rng.integers(-2**31 - 3, 2**31 + 3, rng.integers(1, 6), dtype=np.int64)
        a[rng.random(a.shape) < 0.7] //= 2                    # mostly in range, sometimes not
        if ((a < IMIN) | (a > IMAX)).any():
            with pytest.raises(OverflowError, match=INT_MSG):
                Tensor(a, dtype=I32, device="NUMPY")
        else:
            assert Tensor(a, dtype=I32, device="NUMPY").numpy().tolist() == a.tolist()
        f = rng.choice([-1.0, 1.0], 4) * FMAX * (1 + rng.choice([0.0, 2.0**-25, 2.0**-24, 2.0**-23, 1e-6], 4))
        with np.errstate(over="ignore"):
            rounded = f.astype(np.float32)
        if np.isinf(rounded).any():
            with pytest.raises(OverflowError, match=FLOAT_MSG):
                Tensor(f, dtype=F32, device="NUMPY")
        else:
            np.testing.assert_array_equal(Tensor(f, dtype=F32, device="NUMPY").numpy(), rounded)


# ------------------------------------------------------------------ Python lists and scalars

def test_python_lists(device):
    same(Tensor([1, 2.5], device=device), np.array([1.0, 2.5]), F32)                # mixed -> float32
    same(Tensor([True, 2], device=device), np.array([1, 2]), I32)
    same(Tensor([[True], [False]], device=device), np.array([[True], [False]]), BOOL)
    same(Tensor([IMIN, IMAX], device=device), np.array([IMIN, IMAX]), I32)            # the limits exactly
    same(Tensor([2**70, 1.5], device=device), np.array([np.float32(2**70), 1.5]), F32)  # a float list rounds
    same(Tensor([2**40], dtype=F32, device=device), np.array([2.0**40]), F32)
    same(Tensor([0.1, 1e-50], device=device), np.array([0.1, 1e-50]).astype(np.float32), F32)


def test_python_and_numpy_scalars(device):
    same(Tensor(IMAX, device=device), np.array(IMAX), I32)
    same(Tensor(IMIN, device=device), np.array(IMIN), I32)
    same(Tensor(np.int64(IMIN), device=device), np.array(IMIN), I32)
    same(Tensor(np.uint64(7), device=device), np.array(7), I32)
    same(Tensor(IMAX, requires_grad=False, dtype=F32, device=device), np.array(2.0**31), F32)
    same(Tensor(FMAX, device=device), np.array(FMAX), F32)
    same(Tensor.full(2, IMAX, device=device), np.full(2, IMAX), I32)
    same(Tensor.full(2, 2**40, dtype=F32, device=device), np.full(2, 2.0**40), F32)
    same(Tensor.arange(IMAX - 2, IMAX + 1, device=device), np.arange(IMAX - 2, IMAX + 1), I32)
    same(Tensor.arange(IMIN, IMIN + 4, 2, device=device), np.arange(IMIN, IMIN + 4, 2), I32)
    x = np.array([1, -2, 3], np.int32)
    same(Tensor(x, device=device) + IMAX, x + np.int32(IMAX), I32)            # int32 arithmetic wraps, as NumPy
    same(Tensor(x, device=device) * np.int64(-5), x * -5, I32)
    same(Tensor(x, device=device) ** 3, x ** 3, I32)
    same(Tensor(x, device=device) + np.float64(0.1), x + np.float32(0.1), F32)
    same(Tensor(x, device=device).clip(IMIN, IMAX), x, I32)
    same(Tensor(x, device=device).pad(((1, 0),), value=IMIN), np.pad(x, (1, 0), constant_values=IMIN), I32)


def test_explicit_dtype_casts_but_never_overflows(device):
    """``dtype=`` of another kind is a cast by the rules of ``.cast()`` (float -> int32 truncates
    toward zero, anything -> bool is ``!= 0``), as NumPy and torch; but a value the int32 cannot hold
    (NaN, inf, beyond the range) raises instead of saturating."""
    same(Tensor([1.7, -1.7, 0.2], dtype=I32, device=device), np.array([1, -1, 0]), I32)
    same(Tensor(np.array([2147483647.0, -2147483648.9]), dtype=I32, device=device), np.array([IMAX, IMIN]), I32)
    same(Tensor(np.array([0, 2, 0]), dtype=BOOL, device=device), np.array([False, True, False]), BOOL)
    same(Tensor(2.9, dtype=I32, device=device), np.array(2), I32)
    same(Tensor.full(2, -2.5, dtype=I32, device=device), np.array([-2, -2]), I32)
    for bad, err in ((np.array([1.0, 2.0**31]), OverflowError), (np.array([1e10]), OverflowError),
                     (np.array([-2147483649.0]), OverflowError), (np.array([np.inf]), OverflowError),
                     (np.array([0.0, np.nan]), ValueError), (np.array([np.nan], np.float32), ValueError)):
        with pytest.raises(err, match="int32"):
            Tensor(bad, dtype=I32, device=device)
    for bad, err in ((float("nan"), ValueError), (float("inf"), OverflowError), (3e9, OverflowError)):
        with pytest.raises(err, match="int32"):
            Tensor(bad, dtype=I32, device=device)
        with pytest.raises(err, match="int32"):
            Tensor.full(2, bad, dtype=I32, device=device)
    inf = Tensor(np.array([1.0, np.inf], np.float32), device=device)
    with pytest.raises(OverflowError, match="int32"):
        Tensor(inf, dtype=I32, device=device)
    same(inf.cast(I32), np.array([1, IMAX]), I32)          # .cast() is the saturating cast (docs/semantics.md)


def test_assign_converts_like_construction(device):
    w = Tensor(np.array([1, 2], np.int32), device=device).realize()
    with pytest.raises(OverflowError, match=INT_MSG):
        w.assign(np.array([2**40, 0]))
    with pytest.raises(OverflowError, match=INT_MSG):
        w.assign(2**40)
    same(w, np.array([1, 2]), I32)                          # unchanged by a rejected assign
    w.assign(np.array([IMAX, IMIN], np.int64))
    same(w, np.array([IMAX, IMIN]), I32)
    p = Tensor(np.array([1.0, 2.0], np.float32), device=device).realize()
    with pytest.raises(OverflowError, match=FLOAT_MSG):
        p.assign(np.array([1e300, 0.0]))
    same(p, np.array([1.0, 2.0]), F32)
    p.assign(np.array([0.1, 1 / 3]))                        # float64 rounds to nearest
    same(p, np.array([0.1, 1 / 3]).astype(np.float32), F32)


def test_indexing_with_out_of_range_ints(device):
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    for i in (2**40, -2**40, np.int64(2**40), 2**31, 2):
        with pytest.raises(eqgrad.AxisError, match="out of bounds"):
            x[i]
    with pytest.raises(eqgrad.AxisError, match="out of bounds"):
        x[0, np.int64(-2**63)]
    same(x[np.int64(-1), np.int64(2)], np.array(5.0), F32)
