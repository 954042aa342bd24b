"""Every Tensor op against NumPy, on every device that can run here (conftest.DEVICES: LLVM, NUMPY,
OPENCL where an OpenCL platform exists, CUDA where a GPU exists).

Each distinct program costs a compile (~30-60 ms), so shapes and inputs are reused and the
parameter grids are kept small; the cases are chosen to hit 0-d tensors, size-1 and size-0 axes,
broadcasting, non-contiguous NumPy inputs and eqgrad views, and chains that the compiler fuses.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from conftest import check, compare, data

F32, I32, BOOL = eqgrad.float32, eqgrad.int32, eqgrad.bool_
nan, inf = float("nan"), float("inf")

# ---------------------------------------------------------------------------- shared inputs
# A handful of float arrays reused across tests (same shapes -> fewer distinct programs).
X34 = data((3, 4), seed=1)
X234 = data((2, 3, 4), seed=2)
X0 = np.array(1.25, dtype=np.float32)                 # 0-d
X1 = data((1,), seed=3)                               # size-1 axis
X131 = data((1, 3, 1), seed=4)
X03 = np.zeros((0, 3), dtype=np.float32)              # size-0 axis
X43T = data((3, 4), seed=5).T                         # non-contiguous (transposed) NumPy input
X36S = data((3, 6), seed=6)[:, ::2]                   # non-contiguous (strided) NumPy input

UNARY_SHAPES = {"0d": X0, "1": X1, "3x4": X34, "1x3x1": X131, "0x3": X03, "T": X43T, "strided": X36S}


def pos(x: np.ndarray) -> np.ndarray:
    """A positive version of ``x`` (for log/sqrt), keeping its layout."""
    return np.abs(x) + np.float32(0.5)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def np_relu(x):
    return np.where(x > 0, x, 0).astype(x.dtype)


def np_softmax_last(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------- creation

@pytest.mark.parametrize("value, np_dtype, dtype", [
    ([1, 2, 3], np.int32, I32),
    ([1.0, 2, 3], np.float32, F32),
    ([True, False, True], np.bool_, BOOL),
    ([[1, 2], [3, 4], [5, 6]], np.int32, I32),
    ([[[0.5]], [[1.5]]], np.float32, F32),
    (3, np.int32, I32),
    (-2.5, np.float32, F32),
    (True, np.bool_, BOOL),
    ([], np.float32, F32),
])
def test_tensor_from_python(device, value, np_dtype, dtype):
    t = Tensor(value, device=device)
    compare(t, np.array(value, dtype=np_dtype), device, dtype)


@pytest.mark.parametrize("arr, dtype", [
    (np.arange(6, dtype=np.float64).reshape(2, 3) / 4, eqgrad.float64),     # a NumPy array keeps its dtype
    (np.arange(-3, 3, dtype=np.int64), eqgrad.int64),
    (np.arange(4, dtype=np.uint8), eqgrad.uint8),
    (np.array([True, False]), BOOL),
    (np.array(7.5, dtype=np.float32), F32),
    (np.zeros((2, 0, 3), dtype=np.float32), F32),
    (X43T, F32),
    (X36S, F32),
    (data((4, 6), seed=9)[::-1, 1::2], F32),
])
def test_tensor_from_numpy(device, arr, dtype):
    compare(Tensor(arr, device=device), arr, device, dtype)


def test_tensor_explicit_dtype(device):
    compare(Tensor([1, 2, 3], dtype=F32, device=device), np.array([1.0, 2.0, 3.0]), device, F32)
    compare(Tensor([1.7, -1.7, 0.2], dtype="int32", device=device), np.array([1, -1, 0]), device, I32)
    compare(Tensor(np.array([0, 2, 0]), dtype=bool, device=device), np.array([False, True, False]), device, BOOL)
    compare(Tensor(3, dtype=F32, device=device), np.array(3.0), device, F32)


def test_tensor_copies_its_input(device):
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    t = Tensor(a, device=device)
    a[0] = 100.0
    compare(t + 1, np.array([2.0, 3.0, 4.0]), device)
    compare(Tensor(t, device=device), np.array([1.0, 2.0, 3.0]), device)


CREATION = {
    "zeros": (lambda d: Tensor.zeros(2, 3, device=d), np.zeros((2, 3)), F32),
    "zeros_tuple": (lambda d: Tensor.zeros((2, 3), device=d), np.zeros((2, 3)), F32),
    "zeros_empty": (lambda d: Tensor.zeros(0, 3, device=d), np.zeros((0, 3)), F32),
    "ones_int": (lambda d: Tensor.ones(4, dtype=I32, device=d), np.ones(4, dtype=np.int32), I32),
    "ones_0d": (lambda d: Tensor.ones((), device=d), np.ones(()), F32),
    "full_int": (lambda d: Tensor.full((2, 2), 7, device=d), np.full((2, 2), 7), I32),
    "full_float": (lambda d: Tensor.full(3, 1.5, device=d), np.full(3, 1.5), F32),
    "full_bool_0d": (lambda d: Tensor.full((), True, device=d), np.array(True), BOOL),
    "full_neg_inf": (lambda d: Tensor.full((2, 1), -inf, device=d), np.full((2, 1), -inf), F32),
    "arange": (lambda d: Tensor.arange(5, device=d), np.arange(5), I32),
    "arange_step": (lambda d: Tensor.arange(2, 10, 3, device=d), np.arange(2, 10, 3), I32),
    "arange_neg_step": (lambda d: Tensor.arange(5, 0, -2, device=d), np.arange(5, 0, -2), I32),
    "arange_float": (lambda d: Tensor.arange(0, 1, 0.25, device=d), np.arange(0, 1, 0.25), F32),
    "arange_empty": (lambda d: Tensor.arange(0, device=d), np.arange(0), I32),
    "arange_dtype": (lambda d: Tensor.arange(4, dtype=F32, device=d), np.arange(4.0), F32),
    "eye": (lambda d: Tensor.eye(3, device=d), np.eye(3), F32),
    "eye_rect": (lambda d: Tensor.eye(2, 4, device=d), np.eye(2, 4), F32),
    "eye_int": (lambda d: Tensor.eye(3, dtype=I32, device=d), np.eye(3, dtype=np.int32), I32),
    "eye_1": (lambda d: Tensor.eye(1, device=d), np.eye(1), F32),
}


@pytest.mark.parametrize("case", list(CREATION))
def test_creation_functions(device, case):
    make, expected, dtype = CREATION[case]
    compare(make(device), expected, device, dtype)


def test_like_functions(device):
    t = Tensor(data((2, 3), np.int32), device=device)
    compare(t.zeros_like(), np.zeros((2, 3)), device, I32)
    compare(t.ones_like(), np.ones((2, 3)), device, I32)
    compare(t.full_like(5), np.full((2, 3), 5), device, I32)


def test_creation_under_context(device):
    with eqgrad.Context(DEVICE=device):
        for t in (Tensor.zeros(2), Tensor.arange(3), Tensor([1, 2]), Tensor.rand(2, seed=1), Tensor.eye(2)):
            assert t.device == device
        compare(Tensor.ones(2, 2) * 3, np.full((2, 2), 3.0), device)


@pytest.mark.parametrize("fn", ["rand", "randn"])
def test_random_seeded(device, fn):
    make = getattr(Tensor, fn)
    a = make(3, 4, seed=42, device=device).numpy()
    b = make((3, 4), seed=42, device=device).numpy()
    c = make(3, 4, seed=43, device=device).numpy()
    assert a.shape == (3, 4) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)                     # same seed: same numbers
    assert not np.array_equal(a, c)                          # another seed: other numbers
    assert len(np.unique(a)) == a.size                      # not a constant fill
    if fn == "rand":
        assert (a >= 0).all() and (a < 1).all()
    else:
        assert (a < 0).any() and (a > 0).any()
    big = make(20000, seed=0, device=device)
    m, s = big.mean().item(), big.std().item()
    exp_m, exp_s = (0.5, math.sqrt(1 / 12)) if fn == "rand" else (0.0, 1.0)
    assert abs(m - exp_m) < 0.02 and abs(s - exp_s) < 0.02


def test_manual_seed(device):
    eqgrad.manual_seed(123)
    a = Tensor.randn(5, device=device).numpy()
    b = Tensor.randn(5, device=device).numpy()
    eqgrad.manual_seed(123)
    np.testing.assert_array_equal(Tensor.randn(5, device=device).numpy(), a)
    assert not np.array_equal(a, b)


def test_properties(device):
    t = Tensor(X234, device=device)
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert t.size() == (2, 3, 4) and t.size(-1) == 4 and t.size(0) == 2
    assert t.dtype == F32 and t.device == device
    s = Tensor(3, device=device)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1
    e = Tensor.zeros(0, 3, device=device)
    assert e.numel() == 0 and e.ndim == 2
    lazy = t + 1
    r = repr(lazy)
    assert "(2, 3, 4)" in r and "float32" in r and device in r and "lazy" in r
    lazy.realize()
    assert repr(lazy).startswith("Tensor([[[") and "float32" in repr(lazy)      # realized: its values
    assert "int32" in repr(Tensor([1], device=device)) and "bool" in repr(Tensor([True], device=device))


def test_item_tolist_to(device):
    assert Tensor(2.5, device=device).item() == 2.5 and isinstance(Tensor(2.5, device=device).item(), float)
    i = Tensor([[7]], device=device).item()
    assert i == 7 and isinstance(i, int)
    assert Tensor(True, device=device).item() is True
    assert (Tensor([1, 2, 3], device=device) * 2).tolist() == [2, 4, 6]
    assert Tensor([[1.5, 2.0]], device=device).tolist() == [[1.5, 2.0]]
    other = "NUMPY" if device == "LLVM" else "LLVM"
    t = (Tensor(X34, device=device) + 1).to(other)
    compare(t * 2, (X34 + 1) * 2, other)


# ---------------------------------------------------------------------------- dtype promotion

PROMOTION = {   # name: (fn, inputs, result dtype)
    "int+float": (lambda a: a + 1.5, [np.array([1, -2, 3], np.int32)], F32),
    "float+int": (lambda a: a + 2, [np.array([1.5, -2.5], np.float32)], F32),
    "bool+int": (lambda a: a + 1, [np.array([True, False])], I32),
    "bool*float": (lambda a: a * 2.0, [np.array([True, False])], F32),
    "int+bool": (lambda a: a + True, [np.array([1, 2], np.int32)], I32),
    "int_rsub": (lambda a: 2 - a, [np.array([1, -2], np.int32)], I32),
    "float_rsub_int": (lambda a: 0.5 - a, [np.array([1, -2], np.int32)], F32),
    "int/int": (lambda a, b: a / b, [np.array([7, -7, 1], np.int32), np.array([2, 2, 3], np.int32)], F32),
    "int/scalar": (lambda a: a / 2, [np.array([7, -7, 1], np.int32)], F32),
    "scalar/int": (lambda a: 1 / a, [np.array([2, -4], np.int32)], F32),
    "int+float_tensor": (lambda a, b: a + b, [np.array([1, 2], np.int32), np.array([0.5, 0.25], np.float32)], F32),
    "bool*int_tensor": (lambda a, b: a * b, [np.array([True, False]), np.array([3, 4], np.int32)], I32),
    "bool+bool": (lambda a, b: a + b, [np.array([True, False, False]), np.array([True, True, False])], BOOL),
    "bool*bool": (lambda a, b: a * b, [np.array([True, False, True]), np.array([True, True, False])], BOOL),
    "bool-float": (lambda a, b: a - b, [np.array([True, False]), np.array([1.5, 2.5], np.float32)], F32),
    "int<float": (lambda a: a < 1.5, [np.array([1, 2], np.int32)], BOOL),
}


@pytest.mark.parametrize("case", list(PROMOTION))
def test_promotion(device, case):
    fn, inputs, dtype = PROMOTION[case]
    check(fn, fn, inputs, device, dtype=dtype)


@pytest.mark.parametrize("fn, x, dtype", [
    (lambda a: a.float(), np.array([1, -2], np.int32), F32),
    (lambda a: a.int(), np.array([1.7, -1.7, 0.0, 2.0, -0.5], np.float32), I32),   # truncation toward zero
    (lambda a: a.bool(), np.array([0.0, -0.5, 2.0], np.float32), BOOL),
    (lambda a: a.cast(F32), np.array([True, False]), F32),
    (lambda a: a.cast("int32"), np.array([True, False]), I32),
    (lambda a: a.bool(), np.array([0, 3, -1], np.int32), BOOL),
    (lambda a: a.cast(np.float32), np.array([2**24 + 1, -7], np.int32), F32),
], ids=["int->float", "float->int", "float->bool", "bool->float", "bool->int", "int->bool", "int->float_rounding"])
def test_cast(device, fn, x, dtype):
    check(fn, lambda a: a.astype(dtype.np), [x], device, dtype=dtype, rtol=0, atol=0)


def test_cast_special_values(device):
    """NaN is truthy (as in NumPy); float -> int32 saturates and maps NaN to 0 (docs/semantics.md)."""
    x = np.array([nan, inf, -inf, -0.0, 0.0, 3e9, -3e9, 2.9, -2.9, 2147483520.0], dtype=np.float32)
    check(lambda t: t.bool(), lambda a: a.astype(np.bool_), [x], device)
    check(lambda t: (t != 0), lambda a: a != 0, [x], device)
    check(lambda t: t.int(), lambda a: np.array([0, 2**31 - 1, -2**31, 0, 0, 2**31 - 1, -2**31, 2, -2, 2147483520]),
          [x], device, dtype=I32)


def test_numpy_operands(device):
    """NumPy arrays and lists on either side of an op become tensors (Tensor has __array_priority__)."""
    a = Tensor(X34, device=device)
    compare(a + np.ones(4, np.float32), X34 + 1, device)
    compare(np.full((3, 1), 2.0, np.float32) * a, X34 * 2, device)
    compare(a - [1.0, 2.0, 3.0, 4.0], X34 - np.array([1, 2, 3, 4], np.float32), device)


# ---------------------------------------------------------------------------- elementwise unary

def _scipy_erf(x):
    from scipy.special import erf
    return erf(x)


UNARY = {
    "neg": (lambda x: -x, np.negative, None),
    "abs": (lambda x: x.abs(), np.abs, None),
    "exp": (lambda x: x.exp(), np.exp, None),
    "log": (lambda x: x.log(), np.log, pos),
    "exp2": (lambda x: x.exp2(), np.exp2, None),
    "log2": (lambda x: x.log2(), np.log2, pos),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, pos),
    "rsqrt": (lambda x: x.rsqrt(), lambda x: 1 / np.sqrt(x), pos),
    "sin": (lambda x: x.sin(), np.sin, None),
    "cos": (lambda x: x.cos(), np.cos, None),
    "erf": (lambda x: x.erf(), lambda x: _scipy_erf(x.astype(np.float64)).astype(np.float32), None),
    "relu": (lambda x: x.relu(), np_relu, None),
    "sigmoid": (lambda x: x.sigmoid(), np_sigmoid, None),
    "tanh": (lambda x: x.tanh(), np.tanh, None),
    "square": (lambda x: x.square(), np.square, None),
    "reciprocal": (lambda x: x.reciprocal(), np.reciprocal, pos),
    "floor": (lambda x: x.floor(), np.floor, None),
    "ceil": (lambda x: x.ceil(), np.ceil, None),
    "trunc": (lambda x: x.trunc(), np.trunc, None),
    "sign": (lambda x: x.sign(), np.sign, None),
}


# every op on a 2-d tensor; shape handling is shared by all elementwise ops, so the rarer shapes
# (0-d, size-1 and size-0 axes, non-contiguous NumPy inputs) go to a few ops
EXACT_UNARY = ("neg", "abs", "relu", "square", "floor", "ceil", "trunc", "sign")
UNARY_CASES = [(op, "3x4") for op in UNARY] + \
    [(op, "0d") for op in ("neg", "exp", "sqrt", "tanh")] + \
    [(op, shape) for op in ("neg", "exp", "sqrt", "relu", "sigmoid") for shape in ("1x3x1", "0x3")] + [("neg", "1")] + \
    [(op, shape) for op in ("neg", "exp") for shape in ("T", "strided")]


@pytest.mark.parametrize("op, shape", UNARY_CASES)
def test_unary(device, op, shape):
    fn, ref, domain = UNARY[op]
    x = UNARY_SHAPES[shape]
    x = domain(x) if domain else x
    if op in EXACT_UNARY:
        check(fn, ref, [x], device, rtol=0, atol=0)
    else:
        check(fn, ref, [x], device)


@pytest.mark.parametrize("op", ["neg", "abs", "relu", "sign", "exp", "sqrt"])
def test_unary_int(device, op):
    """int32 inputs: neg/abs/relu/sign keep int32, transcendental ops give float32."""
    fn, ref, _ = UNARY[op]
    x = np.array([[-3, 0, 2], [5, -1, 4]], dtype=np.int32)
    if op == "sqrt":
        x = np.abs(x)
    expected_dtype = I32 if op in ("neg", "abs", "relu", "sign") else F32
    check(fn, ref, [x], device, dtype=expected_dtype)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 1e-30, 80.0, -80.0], dtype=np.float32)


@pytest.mark.parametrize("op", ["exp", "log", "exp2", "log2", "sqrt", "sigmoid", "tanh", "floor", "reciprocal"])
def test_unary_special_values(device, op):
    """inf/NaN/zero inputs give NumPy's inf/NaN/zero results."""
    fn, ref, _ = UNARY[op]
    check(fn, ref, [SPECIAL], device, rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------- elementwise binary

BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.true_divide),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum),
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
}

# shape pairs: equal, trailing broadcast, both-sided broadcast, 0-d with 2-d, size-0 axis
BIN_SHAPES = {
    "same": ((3, 4), (3, 4)),
    "row": ((3, 4), (4,)),
    "both": ((2, 1, 4), (3, 1)),
    "scalar": ((), (3, 4)),
    "empty": ((0, 4), (1, 4)),
}


def _bin_inputs(shape_id: str, dtype) -> list[np.ndarray]:
    sa, sb = BIN_SHAPES[shape_id]
    a, b = data(sa, dtype, seed=11), data(sb, dtype, seed=12)
    if dtype is np.float32 and shape_id == "same":
        b[0, :2] = a[0, :2]              # some equal elements for the comparisons
    return [a, b]


# (broadcasting is shared by all binary ops, so the broadcast shapes go to a few ops)
BINARY_CASES = [(op, "same") for op in BINARY] + \
    [(op, shape) for op in ("add", "lt") for shape in ("row", "both", "scalar", "empty")] + \
    [(op, shape) for op in ("div", "maximum") for shape in ("row", "both")] + \
    [("sub", "row"), ("eq", "both"), ("minimum", "scalar"), ("ge", "row")]


@pytest.mark.parametrize("op, shape", BINARY_CASES)
def test_binary_float(device, op, shape):
    fn, ref = BINARY[op]
    check(fn, ref, _bin_inputs(shape, np.float32), device)


@pytest.mark.parametrize("op", [op for op in BINARY if op not in ("le", "gt", "ne")])
def test_binary_int(device, op):
    fn, ref = BINARY[op]
    a = np.array([[-3, 0, 2, 7], [5, -1, 4, -6], [2, 2, -2, 1]], dtype=np.int32)
    b = np.array([1, -2, 2, 3], dtype=np.int32)
    check(fn, ref, [a, b], device)


@pytest.mark.parametrize("op", ["add", "mul", "maximum", "minimum", "lt", "ge", "ne"])
def test_binary_bool(device, op):
    fn, ref = BINARY[op]
    a = np.array([[True, False], [True, False]])
    b = np.array([True, True])
    check(fn, ref, [a, b], device)


@pytest.mark.parametrize("op", ["add", "sub", "div", "maximum", "lt"])
def test_binary_mixed_dtypes(device, op):
    fn, ref = BINARY[op]
    a = np.array([[1, -2, 3]], dtype=np.int32)
    b = np.array([[0.5], [-2.0]], dtype=np.float32)
    check(fn, ref, [a, b], device)
    check(lambda x, y: fn(y, x), lambda x, y: ref(y, x), [a, b], device)


@pytest.mark.parametrize("op", ["add", "sub", "div", "maximum", "minimum", "ge"])
def test_binary_scalar_operand(device, op):
    fn, ref = BINARY[op]
    check(lambda a: fn(a, 1.5), lambda a: ref(a, np.float32(1.5)), [X34], device)
    if op in ("maximum", "minimum"):
        check(lambda a: fn(a, 2), lambda a: ref(a, np.int32(2)), [np.array([1, 2, 3], np.int32)], device)
    else:   # reflected operators: python scalar on the left
        check(lambda a: fn(2, a), lambda a: ref(np.int32(2), a), [np.array([1, 2, 3], np.int32)], device)


def test_binary_noncontiguous(device):
    a, b = X43T, data((4, 3), seed=13)
    check(lambda x, y: x * y + x, lambda x, y: x * y + x, [a, b], device)
    check(lambda x, y: x - y, lambda x, y: x - y, [X36S, X34[:, :3]], device)


def test_comparisons_with_nan(device):
    a = np.array([nan, 1.0, nan, -inf, inf], dtype=np.float32)
    b = np.array([nan, nan, 1.0, -inf, 1.0], dtype=np.float32)
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        fn, ref = BINARY[op]
        check(fn, ref, [a, b], device)


def test_maximum_minimum_nan(device):
    a = np.array([nan, 1.0, 2.0, -inf, inf, nan], dtype=np.float32)
    b = np.array([0.0, nan, -1.0, 3.0, nan, nan], dtype=np.float32)
    check(lambda x, y: x.maximum(y), np.maximum, [a, b], device)
    check(lambda x, y: x.minimum(y), np.minimum, [a, b], device)


def test_min_max_int_extremes(device):
    a = np.array([-2**31, 2**31 - 1, 0, -5], dtype=np.int32)
    b = np.array([2**31 - 1, -2**31, -1, -5], dtype=np.int32)
    check(lambda x, y: x.maximum(y), np.maximum, [a, b], device)
    check(lambda x, y: x.minimum(y), np.minimum, [a, b], device)


def test_division_special(device):
    a = np.array([1.0, -1.0, 0.0, inf, 3.0], dtype=np.float32)
    b = np.array([0.0, 0.0, 0.0, inf, -0.0], dtype=np.float32)
    check(lambda x, y: x / y, np.true_divide, [a, b], device, atol=0)


# ---------------------------------------------------------------------------- // and %

IA = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1, 9], dtype=np.int32)
IB = np.array([2, 2, -2, -2, 3, 3, -3, 5, 5, -4], dtype=np.int32)
FA = np.array([7.5, -7.5, 7.5, -7.5, 0.0, 6.0, -6.0, 1.0, -1.0, 9.25], dtype=np.float32)
FB = np.array([2.0, 2.0, -2.0, -2.0, 4.0, 0.5, -0.5, 4.0, 4.0, -4.0], dtype=np.float32)


@pytest.mark.parametrize("op", ["floordiv", "mod"])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_floordiv_mod(device, op, kind):
    fn = (lambda a, b: a // b) if op == "floordiv" else (lambda a, b: a % b)
    a, b = (IA, IB) if kind == "int" else (FA, FB)
    check(fn, fn, [a, b], device)
    check(lambda x: fn(x, 3), lambda x: fn(x, a.dtype.type(3)), [a], device)       # tensor op scalar
    check(lambda x: fn(-3, x), lambda x: fn(a.dtype.type(-3), x), [b], device)     # scalar op tensor
    if kind == "int":
        check(fn, fn, [a.reshape(2, 5), b[:5]], device)                             # broadcasting


def test_floordiv_mod_mixed_and_bool(device):
    check(lambda a, b: a // b, np.floor_divide, [IA, FB], device)
    check(lambda a: a % 2.5, lambda a: np.remainder(a, 2.5), [IA], device)
    t, f = np.array([True, False, True]), np.array([True, True, True])
    check(lambda a, b: a // b, np.floor_divide, [t, f], device, dtype=I32)
    check(lambda a, b: a % b, np.remainder, [t, f], device, dtype=I32)


def test_int_division_by_zero_and_overflow(device):
    """NumPy defines integer x // 0 and x % 0 as 0, and INT_MIN // -1 wraps to INT_MIN."""
    a = np.array([5, -5, 0, -2**31, -2**31, 2**31 - 1], dtype=np.int32)
    b = np.array([0, 0, 0, -1, 1, -1], dtype=np.int32)
    check(lambda x, y: x // y, np.floor_divide, [a, b], device)
    check(lambda x, y: x % y, np.remainder, [a, b], device)


# ---------------------------------------------------------------------------- pow

@pytest.mark.parametrize("case", ["sq", "cube", "zero", "neg2", "half", "float_exp", "tensor_exp",
                                  "rpow", "neg_base_int_exp", "neg_base_frac_exp", "zero_zero", "big_int_exp"])
def test_pow(device, case):
    x = X34
    if case == "sq":
        check(lambda a: a ** 2, lambda a: a ** 2, [x], device)
    elif case == "cube":
        check(lambda a: a ** 3, lambda a: a ** 3, [x], device)
    elif case == "zero":
        check(lambda a: a ** 0, lambda a: a ** 0, [x], device)
    elif case == "neg2":
        check(lambda a: a ** -2, lambda a: a ** -2.0, [pos(x)], device)
    elif case == "half":
        check(lambda a: a ** 0.5, lambda a: a ** np.float32(0.5), [pos(x)], device)
    elif case == "float_exp":
        check(lambda a: a ** 2.5, lambda a: a ** np.float32(2.5), [pos(x)], device)
    elif case == "tensor_exp":
        check(lambda a, b: a ** b, np.power, [pos(x), data((4,), seed=21)], device)
    elif case == "rpow":
        check(lambda a: 2.0 ** a, lambda a: np.float32(2.0) ** a, [x], device)
    elif case == "neg_base_int_exp":
        a = np.array([-2.0, -2.0, -0.5, -3.0, 2.0], dtype=np.float32)
        b = np.array([3.0, 2.0, -1.0, 0.0, 5.0], dtype=np.float32)
        check(lambda p, q: p ** q, np.power, [a, b], device)
    elif case == "neg_base_frac_exp":
        a = np.array([-2.0, -8.0], dtype=np.float32)
        check(lambda p: p ** 0.5, lambda p: p ** np.float32(0.5), [a], device)
    elif case == "zero_zero":
        a = np.array([0.0, 0.0, 2.0], dtype=np.float32)
        b = np.array([0.0, 2.0, 0.0], dtype=np.float32)
        check(lambda p, q: p ** q, np.power, [a, b], device)
    elif case == "big_int_exp":
        check(lambda a: a ** 7, lambda a: a ** np.float32(7), [x], device)


def test_pow_int(device):
    a = np.array([[-3, 0, 2], [5, -1, 4]], dtype=np.int32)
    check(lambda x: x ** 2, lambda x: x ** 2, [a], device, dtype=I32)
    check(lambda x: x ** 3, lambda x: x ** 3, [a], device, dtype=I32)
    check(lambda x: x ** 0.5, lambda x: x ** 0.5, [np.abs(a)], device, dtype=F32)
    # int32 ** int32 stays int32 in NumPy, whatever the exponent
    e = np.array([3, 0, 5], dtype=np.int32)
    check(lambda x, y: x ** y, np.power, [a, e], device, dtype=I32)
    check(lambda x: x ** 5, lambda x: x ** 5, [a], device, dtype=I32)



@pytest.mark.parametrize("np_dtype", [np.int32, np.int8, np.uint8, np.int64])
def test_pow_int_by_python_ints_wraps_like_numpy(device, np_dtype):
    """``x ** n`` for a Python int is square-and-multiply over n's bits: exponents 0 to 100 (wrapping
    around like NumPy: 3 ** 40 in int32), bases of either sign, the base's dtype kept; bools as int32."""
    info = np.iinfo(np_dtype)
    a = np.array([[-3, 0, 2, 5], [-1, 1, 3, 7]], np.int64).clip(info.min, info.max).astype(np_dtype)
    for n in (0, 1, 2, 7, 13, 31, 40, 100):
        got = (Tensor(a, device=device) ** n).numpy()
        want = a ** np_dtype(n) if n else np.ones_like(a)
        assert got.dtype == want.dtype, (n, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"exponent {n}")
    b = np.array([True, False])
    np.testing.assert_array_equal((Tensor(b, device=device) ** 3).numpy(), b.astype(np.int32))


# ---------------------------------------------------------------------------- where, clip, bitwise

def test_where(device):
    c = data((3, 4), bool, seed=31)
    a, b = data((3, 4), seed=32), data((3, 4), seed=33)
    check(lambda c, a, b: c.where(a, b), np.where, [c, a, b], device)
    # broadcasting: cond (3,1), x (1,4), y 0-d
    check(lambda c, a, b: c.where(a, b), np.where, [c[:, :1], a[:1], np.array(2.5, np.float32)], device)
    # scalar branches, and dtypes from NumPy's promotion
    check(lambda c, a: c.where(a, 0.5), lambda c, a: np.where(c, a, np.float32(0.5)), [c, a], device)
    check(lambda c, a: c.where(-1, a), lambda c, a: np.where(c, np.float32(-1), a), [c, a], device)
    check(lambda c: c.where(1, 2), lambda c: np.where(c, 1, 2), [c], device, dtype=I32)
    check(lambda c: c.where(1, 2.5), lambda c: np.where(c, 1, 2.5), [c], device, dtype=F32)
    ia = data((3, 4), np.int32, seed=34)
    check(lambda c, a: c.where(a, 1.5), lambda c, a: np.where(c, a, 1.5), [c, ia], device, dtype=F32)
    check(lambda c, a, b: c.where(a, b), np.where, [c, ia, a], device, dtype=F32)
    # a non-bool condition is its truth value
    check(lambda c, a, b: c.where(a, b), np.where, [ia, a, b], device)


def test_where_nan_inf(device):
    c = np.array([True, False, True, False])
    a = np.array([nan, nan, inf, 1.0], dtype=np.float32)
    b = np.array([0.0, -inf, nan, nan], dtype=np.float32)
    check(lambda c, a, b: c.where(a, b), np.where, [c, a, b], device, atol=0)
    # a NaN comparison selects the "false" branch
    check(lambda a, b: (a > 0).where(a, b), lambda a, b: np.where(a > 0, a, b), [a, b], device, atol=0)


@pytest.mark.parametrize("case", ["both", "min_only", "max_only", "int", "nan", "tensor_bounds"])
def test_clip(device, case):
    if case == "both":
        check(lambda a: a.clip(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), [X34], device)
    elif case == "min_only":
        check(lambda a: a.clip(0.0), lambda a: np.clip(a, 0.0, None), [X34], device)
    elif case == "max_only":
        check(lambda a: a.clamp(max_=1), lambda a: np.clip(a, None, 1.0), [X34], device)
    elif case == "int":
        check(lambda a: a.clip(-1, 2), lambda a: np.clip(a, -1, 2), [data((3, 4), np.int32)], device, dtype=I32)
    elif case == "nan":
        a = np.array([nan, -inf, inf, 0.25], dtype=np.float32)
        check(lambda a: a.clip(-1.0, 1.0), lambda a: np.clip(a, -1.0, 1.0), [a], device)
    elif case == "tensor_bounds":
        lo, hi = data((4,), seed=41, high=0), data((3, 1), seed=42, low=0)
        check(lambda a, l, h: a.clip(l, h), np.clip, [X34, lo, hi], device)


@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_bitwise(device, op):
    fn = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}[op]
    ia = np.array([[12, -1, 0, 7], [5, 3, -8, 2**31 - 1]], dtype=np.int32)
    ib = np.array([10, 6, -3, 1], dtype=np.int32)
    check(fn, fn, [ia, ib], device)
    ba, bb = np.array([True, True, False, False]), np.array([True, False, True, False])
    check(fn, fn, [ba, bb], device)
    if op == "and":
        check(lambda a: fn(a, 3), lambda a: fn(a, np.int32(3)), [ia], device)
    else:
        check(lambda a: fn(True, a), lambda a: fn(np.True_, a), [ba], device)


def test_invert_logical_not(device):
    check(lambda a: ~a, np.invert, [np.array([0, -1, 5, 2**31 - 1], np.int32)], device)
    check(lambda a: ~a, np.logical_not, [np.array([True, False])], device)
    check(lambda a: a.logical_not(), np.logical_not, [np.array([0.0, 2.0, nan], np.float32)], device)


# ---------------------------------------------------------------------------- reductions

AXES = [None, 0, -1, (-1, 0), ()]
REDUCE = {
    "sum": (lambda t, ax, k: t.sum(ax, keepdim=k), lambda a, ax, k: np.sum(a, axis=ax, keepdims=k)),
    "max": (lambda t, ax, k: t.amax(ax, keepdim=k), lambda a, ax, k: np.max(a, axis=ax, keepdims=k)),
    "min": (lambda t, ax, k: t.amin(ax, keepdim=k), lambda a, ax, k: np.min(a, axis=ax, keepdims=k)),
    "mean": (lambda t, ax, k: t.mean(ax, keepdim=k), lambda a, ax, k: np.mean(a, axis=ax, keepdims=k)),
    "var": (lambda t, ax, k: t.var(ax, keepdim=k), lambda a, ax, k: np.var(a, axis=ax, keepdims=k, ddof=1)),
    "std": (lambda t, ax, k: t.std(ax, keepdim=k), lambda a, ax, k: np.std(a, axis=ax, keepdims=k, ddof=1)),
}


# (axis handling is shared by all reductions: the full grid for sum and max, a few axes for the rest)
REDUCE_CASES = [("sum", axis, False) for axis in AXES] + [("max", axis, False) for axis in (None, 0, (-1, 0))] + \
    [("sum", axis, True) for axis in (None, 1, (0, 2))] + [("max", 1, True)] + \
    [(op, axis, False) for op in ("min", "mean", "var", "std") for axis in (None, -1, (-1, 0))] + \
    [(op, (0, 2), True) for op in ("min", "mean", "var", "std")] + [("min", (), False), ("mean", 1, True)]


@pytest.mark.parametrize("op, axis, keepdim", REDUCE_CASES, ids=str)
def test_reduce(device, op, axis, keepdim):
    fn, ref = REDUCE[op]
    check(lambda t: fn(t, axis, keepdim), lambda a: ref(a, axis, keepdim), [X234], device)


@pytest.mark.parametrize("op", ["sum", "min", "mean"])
def test_reduce_int_bool(device, op):
    fn, ref = REDUCE[op]
    ia = np.array([[3, -7, 2], [-1, 8, 0]], dtype=np.int32)
    check(lambda t: fn(t, 1, False), lambda a: ref(a, 1, False), [ia], device, dtype=F32 if op == "mean" else I32)
    check(lambda t: fn(t, None, False), lambda a: ref(a, None, False), [ia], device,
          dtype=F32 if op == "mean" else I32)
    ba = np.array([[True, False, True], [False, False, True]])
    want = {"sum": I32, "mean": F32}.get(op, BOOL)
    check(lambda t: fn(t, 0, True), lambda a: ref(a, 0, True), [ba], device, dtype=want)


def test_reduce_int_extremes(device):
    a = np.array([-2**31, 2**31 - 1, 0], dtype=np.int32)
    check(lambda t: t.max(), np.max, [a], device)
    check(lambda t: t.min(), np.min, [a], device)


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean", "var", "std"])
def test_reduce_shapes(device, op):
    """0-d, size-1 axes and non-contiguous inputs."""
    fn, ref = REDUCE[op]
    if op not in ("var", "std"):
        check(lambda t: fn(t, None, False), lambda a: ref(a, None, False), [X0], device)
        check(lambda t: fn(t, (0, 2), True), lambda a: ref(a, (0, 2), True), [X131], device)
    else:
        check(lambda t: fn(t, 1, True), lambda a: ref(a, 1, True), [X131], device)
    if op in ("sum", "var"):
        check(lambda t: fn(t, 0, False), lambda a: ref(a, 0, False), [X43T], device)
        check(lambda t: fn(t, -1, True), lambda a: ref(a, -1, True), [X36S], device)


def test_reduce_degenerate(device):
    # sums over empty axes are 0, the mean of nothing is NaN
    check(lambda t: t.sum(0), lambda a: a.sum(0), [X03], device)
    check(lambda t: t.sum(), lambda a: a.sum(), [X03], device)
    check(lambda t: t.sum(1), lambda a: a.sum(1), [X03], device)
    check(lambda t: t.amax(1), lambda a: a.max(1), [X03], device)            # reduces a non-empty axis
    check(lambda t: t.mean(0), lambda a: a.mean(0), [X03], device)
    # one element, unbiased variance: NaN; biased: 0
    check(lambda t: t.var(0), lambda a: np.var(a, 0, ddof=1), [X1], device)
    check(lambda t: t.var(0, correction=0), lambda a: np.var(a, 0), [X1], device)
    check(lambda t: t.std(correction=0), lambda a: np.std(a), [X34], device)
    check(lambda t: t.var((0, 1), keepdim=True, correction=0), lambda a: np.var(a, (0, 1), keepdims=True),
          [X234], device)


def test_reduce_nan_inf(device):
    a = np.array([[1.0, nan, 3.0], [inf, 2.0, -inf], [-inf, -inf, 0.5], [inf, -inf, 1.0]], dtype=np.float32)
    for ax in (None, 0, 1):
        check(lambda t: t.sum(ax), lambda x: np.sum(x, ax), [a], device)
        check(lambda t: t.amax(ax), lambda x: np.max(x, ax), [a], device)
        check(lambda t: t.amin(ax), lambda x: np.min(x, ax), [a], device)
    check(lambda t: t.mean(1), lambda x: np.mean(x, 1), [a], device)


@pytest.mark.parametrize("axis, keepdim", [(None, False), (0, False), (-1, False), (2, False), (None, True),
                                           (1, True)])
def test_argmax(device, axis, keepdim):
    x = X234.copy()
    x[0, 0, 1] = x[0, 0, 3] = x[0, 0].max() + 1        # ties: the first index wins
    check(lambda t: t.argmax(axis, keepdim), lambda a: np.argmax(a, axis, keepdims=keepdim), [x], device,
          dtype=I32)


def test_argmax_argmin_more(device):
    ia = np.array([[3, 9, 9], [-1, -1, -5]], dtype=np.int32)
    check(lambda t: t.argmax(1), lambda a: np.argmax(a, 1), [ia], device, dtype=I32)
    check(lambda t: t.argmin(1), lambda a: np.argmin(a, 1), [ia], device, dtype=I32)
    check(lambda t: t.argmin(0), lambda a: np.argmin(a, 0), [X34], device, dtype=I32)
    check(lambda t: t.argmax(), lambda a: np.argmax(a), [X0], device, dtype=I32)
    check(lambda t: t.argmax(0), lambda a: np.argmax(a, 0), [X43T], device, dtype=I32)
    b = np.array([[False, True, True], [False, False, False]])
    check(lambda t: t.argmax(1), lambda a: np.argmax(a, 1), [b], device, dtype=I32)
    f = np.array([[-inf, -inf], [1.0, inf]], dtype=np.float32)
    check(lambda t: t.argmax(1), lambda a: np.argmax(a, 1), [f], device, dtype=I32)


def test_argmax_nan(device):
    """NumPy's argmax/argmin return the index of the first NaN."""
    a = np.array([[1.0, nan, 3.0, nan], [0.0, 2.0, 5.0, 1.0]], dtype=np.float32)
    check(lambda t: t.argmax(1), lambda x: np.argmax(x, 1), [a], device, dtype=I32)
    check(lambda t: t.argmin(1), lambda x: np.argmin(x, 1), [a], device, dtype=I32)


def test_any_all(device):
    a = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    check(lambda t: t.any(1), lambda x: np.any(x, 1), [a], device)
    check(lambda t: t.all(0, keepdim=True), lambda x: np.all(x, 0, keepdims=True), [a != 0], device)
    check(lambda t: t.any(), np.any, [X03], device)
    check(lambda t: t.all(), np.all, [X03], device)


# ---------------------------------------------------------------------------- movement

MOVEMENT = {
    "reshape": (lambda t: t.view(4, 6), lambda a: a.reshape(4, 6)),
    "reshape_-1": (lambda t: t.reshape(-1, 3), lambda a: a.reshape(-1, 3)),
    "reshape_1s": (lambda t: t.reshape(1, 2, 1, 12, 1), lambda a: a.reshape(1, 2, 1, 12, 1)),
    "permute": (lambda t: t.permute((2, -3, -2)), lambda a: a.transpose(2, 0, 1)),
    "transpose": (lambda t: t.transpose(), lambda a: a.swapaxes(-2, -1)),
    "transpose_0_2": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "T": (lambda t: t.T, lambda a: a.T),
    "expand": (lambda t: t[:, :1].expand(2, 5, 4), lambda a: np.broadcast_to(a[:, :1], (2, 5, 4))),
    "expand_new_axes": (lambda t: t[:1].expand(3, -1, -1, 4), lambda a: np.broadcast_to(a[:1], (3, 1, 3, 4))),
    "pad": (lambda t: t.pad(((1, 0), None, (2, 3))), lambda a: np.pad(a, ((1, 0), (0, 0), (2, 3)))),
    "pad_value": (lambda t: t.pad(((0, 1), (1, 1), (0, 0)), value=-2.5),
                  lambda a: np.pad(a, ((0, 1), (1, 1), (0, 0)), constant_values=-2.5)),
    "pad_crop": (lambda t: t.pad(((0, 0), (-1, 2), (1, -2))),
                 lambda a: np.pad(a[:, 1:, :-2], ((0, 0), (0, 2), (1, 0)))),
    "shrink": (lambda t: t.shrink(((1, 2), None, (1, 3))), lambda a: a[1:2, :, 1:3]),
    "flip_all": (lambda t: t.flip(), lambda a: np.flip(a)),
    "flip_axis": (lambda t: t.flip(-1), lambda a: np.flip(a, -1)),
    "flip_axes": (lambda t: t.flip((0, 1)), lambda a: np.flip(a, (0, 1))),
    "squeeze_none": (lambda t: t[:, :1, None].squeeze(), lambda a: a[:, :1, None].squeeze()),
    "squeeze_dim": (lambda t: t[:, :1].squeeze(1), lambda a: a[:, :1].squeeze(1)),
    "squeeze_non1": (lambda t: t.squeeze(0), lambda a: a),              # as PyTorch: a no-op
    "unsqueeze_neg": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "flatten": (lambda t: t.flatten(), lambda a: a.reshape(-1)),
    "flatten_1": (lambda t: t.flatten(1), lambda a: a.reshape(2, -1)),
    "flatten_0_1": (lambda t: t.flatten(0, -2), lambda a: a.reshape(6, 4)),
}


@pytest.mark.parametrize("op", list(MOVEMENT))
def test_movement(device, op):
    fn, ref = MOVEMENT[op]
    check(fn, ref, [X234], device, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["permute", "flip_all", "pad"])
def test_movement_int_bool(device, op):
    fn, ref = MOVEMENT[op]
    check(fn, ref, [data((2, 3, 4), np.int32, seed=51)], device)
    check(fn, ref, [data((2, 3, 4), bool, seed=52)], device)


def test_movement_small_shapes(device):
    check(lambda t: t.reshape(1, 1), lambda a: a.reshape(1, 1), [X0], device)
    check(lambda t: t.reshape(()), lambda a: a.reshape(()), [X1], device)
    check(lambda t: t.flatten(), lambda a: a.reshape(1), [X0], device)
    check(lambda t: t.unsqueeze(0), lambda a: a[None], [X0], device)
    check(lambda t: t.squeeze(), lambda a: a.squeeze(), [X131], device)
    check(lambda t: t.flip(), lambda a: np.flip(a), [X0], device)
    check(lambda t: t.expand(2, 3), lambda a: np.broadcast_to(a, (2, 3)), [X0], device)
    check(lambda t: t.reshape(3, 0), lambda a: a.reshape(3, 0), [X03], device)
    check(lambda t: t.permute(1, 0), lambda a: a.T, [X03], device)
    check(lambda t: t.pad(((1, 1), (0, 0))), lambda a: np.pad(a, ((1, 1), (0, 0))), [X03], device)
    check(lambda t: t.reshape(4, 3).T, lambda a: a.reshape(4, 3).T, [X43T], device)      # non-contiguous in


@pytest.mark.parametrize("case", ["dim0", "dim1", "neg_dim", "three", "mixed_dtype", "empty_part", "bool"])
def test_cat(device, case):
    a, b = X34, data((2, 4), seed=61)
    if case == "dim0":
        check(lambda x, y: x.cat(y), lambda x, y: np.concatenate([x, y]), [a, b], device)
    elif case == "dim1":
        check(lambda x, y: x.cat(y, dim=1), lambda x, y: np.concatenate([x, y], 1), [a, X43T.T], device)
    elif case == "neg_dim":
        check(lambda x, y: x.cat(y, dim=-1), lambda x, y: np.concatenate([x, y], -1), [X234, X234[:, :, :1]],
              device)
    elif case == "three":
        check(lambda x, y, z: x.cat(y, z, dim=0), lambda x, y, z: np.concatenate([x, y, z]), [a, b, a[1:]], device)
    elif case == "mixed_dtype":
        ia = data((2, 4), np.int32, seed=62)
        check(lambda x, y: x.cat(y), lambda x, y: np.concatenate([x, y]), [ia, a], device, dtype=F32)
    elif case == "empty_part":
        check(lambda x, y: x.cat(y), lambda x, y: np.concatenate([x, y]), [np.zeros((0, 4), np.float32), b],
              device)
    elif case == "bool":
        ba, bb = data((2, 3), bool, seed=63), data((1, 3), bool, seed=64)
        check(lambda x, y: x.cat(y), lambda x, y: np.concatenate([x, y]), [ba, bb], device)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack(device, dim):
    a, b, c = X34, data((3, 4), seed=71), X43T.T
    check(lambda x, y, z: Tensor.stack([x, y, z], dim=dim), lambda x, y, z: np.stack([x, y, z], dim), [a, b, c],
          device)


def test_stack_more(device):
    ia, ib = np.array([1, 2], np.int32), np.array([3, 4], np.int32)
    check(lambda x, y: Tensor.stack([x, y]), lambda x, y: np.stack([x, y]), [ia, ib], device)
    check(lambda x, y: Tensor.stack([x, y]), lambda x, y: np.stack([x, y]), [X0, X0 + 1], device)
    check(lambda x: Tensor.stack([x]), lambda x: np.stack([x]), [X34], device)


# ---------------------------------------------------------------------------- indexing

X456 = data((4, 5, 6), seed=81)
INDICES = {
    "basic": (slice(1, 3), slice(None, None, 2), None, -1),      # t[1:3, ::2, None, -1]
    "ellipsis_rev": (Ellipsis, slice(None, None, -1)),
    "scalar": (1, 2, 3),
    "neg_scalar": (-1, -5, -6),
    "step2": (slice(None, None, 2),),
    "step3_off": (slice(None), slice(None), slice(1, 6, 3)),
    "neg_step3": (slice(None), slice(None), slice(None, None, -3)),
    "neg_range": (slice(3, 0, -2), slice(-1, -4, -1)),
    "steps_all": (slice(None, None, 3), slice(None, None, -2), slice(5, None, -4)),
    "none_front": (None,),
    "ellipsis_mid": (0, Ellipsis, 1),
    "empty_slice": (slice(3, 1),),
    "out_of_range_slice": (slice(-100, 100), slice(2, 99)),
    "int_and_neg_step": (slice(None), 4, slice(None, None, -1)),
}


@pytest.mark.parametrize("idx", list(INDICES))
def test_getitem(device, idx):
    index = INDICES[idx]
    check(lambda t: t[index], lambda a: a[index], [X456], device, rtol=0, atol=0)


def test_getitem_small_and_views(device):
    check(lambda t: t[()], lambda a: a[()], [X0], device)
    check(lambda t: t[None], lambda a: a[None], [X0], device)
    check(lambda t: t[0], lambda a: a[0], [X1], device)
    check(lambda t: t[1:, ::-1], lambda a: a[1:, ::-1], [X43T], device)     # non-contiguous NumPy input
    check(lambda t: t[::2][1], lambda a: a[::2][1], [X456], device)         # index of a view
    check(lambda t: t.T[::-1, 1:3], lambda a: a.T[::-1, 1:3], [X34], device)
    check(lambda t: t[..., ::2][:, ::-1], lambda a: a[..., ::2][:, ::-1], [X34], device)
    check(lambda t: t[1:3][1:2], lambda a: a[1:3][1:2], [X456], device)
    check(lambda t: t[np.int64(1), np.int32(-1)], lambda a: a[1, -1], [X34], device)
    check(lambda t: t[::-1], lambda a: a[::-1], [np.array([True, False, False])], device)
    check(lambda t: t[1::2], lambda a: a[1::2], [np.arange(7, dtype=np.int32)], device)


# ---------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("sa, sb", [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (2, 4, 3)),
    ((3, 0), (0, 2)),
    ((0, 4), (4, 2)),
], ids=str)
def test_matmul(device, sa, sb):
    a, b = data(sa, seed=91), data(sb, seed=92)
    check(lambda x, y: x @ y, np.matmul, [a, b], device, rtol=1e-5, atol=1e-5)


def test_matmul_more(device):
    a, b = data((3, 4), np.int32, seed=93), data((4, 2), np.int32, seed=94)
    check(lambda x, y: x @ y, np.matmul, [a, b], device, dtype=I32)
    check(lambda x, y: x.matmul(y), np.matmul, [a, data((4, 2), seed=95)], device, dtype=F32)
    check(lambda x, y: x.dot(y), np.matmul, [X43T, X36S], device, atol=1e-5)               # non-contiguous
    check(lambda x: x.T @ x, lambda x: x.T @ x, [X34], device, atol=1e-5)                    # eqgrad view
    check(lambda x, y: x @ y, np.matmul, [X34[:, ::-1], data((3, 8), seed=98)[:, ::2].T], device, atol=1e-5)
    check(lambda x: x @ np.ones((4, 2), np.float32), lambda x: x @ np.ones((4, 2), np.float32), [X34], device,
          atol=1e-5)
    check(lambda x: np.ones((2, 3), np.float32) @ x, lambda x: np.ones((2, 3), np.float32) @ x, [X34], device,
          atol=1e-5)
    w, bias = data((4, 5), seed=96), data((5,), seed=97)
    check(lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, [X34, w, bias], device, atol=1e-5)


# ---------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(device, axis):
    def ref_softmax(x):
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    def ref_log_softmax(x):
        m = x - x.max(axis, keepdims=True)
        return m - np.log(np.exp(m).sum(axis, keepdims=True))

    check(lambda t: t.softmax(axis), ref_softmax, [X234], device)
    check(lambda t: t.log_softmax(axis), ref_log_softmax, [X234], device)


def test_softmax_edge_cases(device):
    big = (X34 * 100 + 1000).astype(np.float32)             # would overflow without max subtraction
    sm = np_softmax_last
    check(lambda t: t.softmax(), sm, [big], device)
    check(lambda t: t.log_softmax(), lambda x: np.log(sm(x.astype(np.float64))), [big], device, atol=1e-4)
    masked = np.array([[-inf, 0.0, 1.0], [2.0, -inf, -inf]], dtype=np.float32)
    check(lambda t: t.softmax(), sm, [masked], device)
    check(lambda t: t.softmax(), lambda x: np.ones_like(x), [X1], device)
    check(lambda t: t.softmax(), sm, [np.array([[1, 2, 3]], np.int32)], device, dtype=F32)
    check(lambda t: t.softmax(0), lambda x: sm(x.T).T, [X43T], device)
    check(lambda t: t.logsumexp(1), lambda x: np.log(np.exp(x.astype(np.float64)).sum(1)), [X34], device)


# ---------------------------------------------------------------------------- chains (fused programs)

CHAINS = {
    "strided_view_math": (lambda a, b: a[::2].exp() * 2, lambda a, b: np.exp(a[::2]) * 2),
    "sum_of_expr": (lambda a, b: (a * b + 1).sum(), lambda a, b: (a * b + 1).sum()),
    "max_of_expr": (lambda a, b: (a - b).abs().amax(axis=1), lambda a, b: np.abs(a - b).max(1)),
    "reduce_then_broadcast": (lambda a, b: a - a.mean(0), lambda a, b: a - a.mean(0)),
    "normalize": (lambda a, b: (a - a.mean(1, keepdim=True)) / (a.std(1, keepdim=True) + 1e-5),
                  lambda a, b: (a - a.mean(1, keepdims=True)) / (a.std(1, ddof=1, keepdims=True) + 1e-5)),
    "transpose_sum": (lambda a, b: ((a.T + 1) * 2).sum(0), lambda a, b: ((a.T + 1) * 2).sum(0)),
    "reshape_of_expr": (lambda a, b: (a + b).reshape(4, 3).sum(1), lambda a, b: (a + b).reshape(4, 3).sum(1)),
    "expand_permute": (lambda a, b: a[:, :1].expand(3, 4).T * b.T,
                       lambda a, b: np.broadcast_to(a[:, :1], (3, 4)).T * b.T),
    "pad_reduce": (lambda a, b: a.pad(((1, 1), (0, 2))).sum(1), lambda a, b: np.pad(a, ((1, 1), (0, 2))).sum(1)),
    "flip_of_reduce": (lambda a, b: a.sum(0).flip(), lambda a, b: a.sum(0)[::-1]),
    "shared_subexpr": (lambda a, b: a.exp() + a.exp().sum(), lambda a, b: np.exp(a) + np.exp(a).sum()),
    "relu_linear": (lambda a, b: (a @ b.T + 1).relu().sum(-1), lambda a, b: np.maximum(a @ b.T + 1, 0).sum(-1)),
    "where_chain": (lambda a, b: (a > b).where(a * 2, b.sin()).max(),
                    lambda a, b: np.where(a > b, a * 2, np.sin(b)).max()),
    "contiguous": (lambda a, b: a.T.contiguous() + b.T, lambda a, b: a.T + b.T),
    "cat_then_reduce": (lambda a, b: a.cat(b, dim=1).sum(0), lambda a, b: np.concatenate([a, b], 1).sum(0)),
    "slice_of_elementwise": (lambda a, b: (a * b)[1:, ::-2], lambda a, b: (a * b)[1:, ::-2]),
    "softmax_matmul": (lambda a, b: (a @ b.T).softmax() @ b, lambda a, b: np_softmax_last(a @ b.T) @ b),
    "argmax_of_expr": (lambda a, b: (a * b).argmax(1), lambda a, b: (a * b).argmax(1)),
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_chain(device, chain):
    fn, ref = CHAINS[chain]
    check(fn, ref, [X34, data((3, 4), seed=101)], device, rtol=1e-5, atol=1e-5)


X234B = data((2, 3, 4), seed=102)
XI46 = data((4, 6), np.int32, seed=103, low=-5, high=5)

# views of views: reshapes of non-contiguous views cannot be folded into one stride pattern
VIEW_CHAINS = {
    "permute_reshape": (lambda b: b.permute(2, 0, 1).reshape(4, 6), lambda b: b.transpose(2, 0, 1).reshape(4, 6)),
    "T_flatten": (lambda b: b.T.flatten(), lambda b: b.T.reshape(-1)),
    "T_reshape_slice": (lambda b: b.T.reshape(3, 8)[::2, 1::3], lambda b: b.T.reshape(3, 8)[::2, 1::3]),
    "expand_reshape": (lambda b: b[:, None].expand(2, 3, 3, 4).reshape(6, 3, 4),
                       lambda b: np.broadcast_to(b[:, None], (2, 3, 3, 4)).reshape(6, 3, 4)),
    "pad_reshape": (lambda b: b.pad(((0, 0), (1, 1), (0, 2))).reshape(-1, 6),
                    lambda b: np.pad(b, ((0, 0), (1, 1), (0, 2))).reshape(-1, 6)),
    "flip_reshape": (lambda b: b.flip(2).reshape(4, 6), lambda b: b[..., ::-1].reshape(4, 6)),
    "slice_reshape_T": (lambda b: b[:, 1:, 1:3].reshape(2, 4).T, lambda b: b[:, 1:, 1:3].reshape(2, 4).T),
    "permute_permute": (lambda b: b.permute(1, 2, 0).permute(2, 0, 1).permute(0, 2, 1),
                        lambda b: b.transpose(1, 2, 0).transpose(2, 0, 1).transpose(0, 2, 1)),
    "flip_flip": (lambda b: b.flip(0).flip(0) * 2, lambda b: b * 2),
    "reshape_T_sum": (lambda b: b.reshape(6, 4).T.sum(1), lambda b: b.reshape(6, 4).T.sum(1)),
    "strided_of_padded": (lambda b: b.pad(((1, 1), (0, 0), (2, 0)))[::3, ::2, ::-3],
                          lambda b: np.pad(b, ((1, 1), (0, 0), (2, 0)))[::3, ::2, ::-3]),
    "pad_exp": (lambda b: b.pad(((1, 0), (0, 0), (0, 1))).exp(), lambda b: np.exp(np.pad(b, ((1, 0), (0, 0), (0, 1))))),
    "pad_eq_zero": (lambda b: b.pad(((1, 0), (0, 0), (0, 1))) == 0, lambda b: np.pad(b, ((1, 0), (0, 0), (0, 1))) == 0),
    "expand_sum": (lambda b: b[:, :1].expand(2, 5, 4).sum(1), lambda b: np.broadcast_to(b[:, :1], (2, 5, 4)).sum(1)),
    "expand_sum_all": (lambda b: b[:1, :1, :1].expand(2, 3, 4).sum(),
                       lambda b: np.broadcast_to(b[:1, :1, :1], (2, 3, 4)).sum()),
}


@pytest.mark.parametrize("chain", list(VIEW_CHAINS))
def test_view_chain(device, chain):
    fn, ref = VIEW_CHAINS[chain]
    check(fn, ref, [X234B], device)


def test_view_chain_int(device):
    check(lambda a: a[:, :1].expand(4, 6).sum(1), lambda a: np.broadcast_to(a[:, :1], (4, 6)).sum(1), [XI46], device)
    check(lambda a: a.T.reshape(3, 8)[::-1], lambda a: a.T.reshape(3, 8)[::-1], [XI46], device)


# ---------------------------------------------------------------------------- compiler corner cases

@pytest.mark.parametrize("case", ["matmul", "sum0", "sum1", "max_T", "softmax", "elementwise"])
def test_larger_odd_sizes(device, case):
    """Sizes that are not multiples of any vector width or tile."""
    a, b = data((33, 65), seed=111), data((65, 17), seed=112)
    if case == "matmul":
        check(lambda x, y: x @ y, np.matmul, [a, b], device, rtol=1e-4, atol=1e-4)
    elif case == "sum0":
        check(lambda x: x.sum(0), lambda x: x.sum(0), [a], device, rtol=1e-4, atol=1e-4)
    elif case == "sum1":
        check(lambda x: x.sum(1), lambda x: x.sum(1), [a], device, rtol=1e-4, atol=1e-4)
    elif case == "max_T":
        check(lambda x: x.T.amax(0), lambda x: x.T.max(0), [a], device)
    elif case == "softmax":
        check(lambda x: x.softmax(0), lambda x: np_softmax_last(x.T).T, [a], device)
    elif case == "elementwise":
        check(lambda x, y: (x[:17, :17] * y[:17].T + 1).relu(), lambda x, y: np.maximum(x[:17, :17] * y[:17].T + 1, 0),
              [a, b], device)


def test_int_wraparound(device):
    """int32 arithmetic wraps around, as NumPy's int32."""
    a = np.array([2**31 - 1, -2**31, 123456789, -5], dtype=np.int32)
    check(lambda x: x + 1, lambda x: x + np.int32(1), [a], device)
    check(lambda x: x - 2, lambda x: x - np.int32(2), [a], device)
    check(lambda x: x * 1000, lambda x: x * np.int32(1000), [a], device)
    check(lambda x: -x, np.negative, [a], device)
    check(lambda x: x.sum(), lambda x: x.sum(dtype=np.int32), [np.full(1000, 3_000_000, np.int32)], device)


def test_compiler_keeps_ieee_semantics(device):
    """Rewrites must be exact for every float input: NaN, inf and signed zeros included."""
    s = np.array([nan, inf, -inf, 0.0, -0.0, 1.0], dtype=np.float32)
    check(lambda x: x * 0, lambda x: x * np.float32(0), [s], device, atol=0)
    check(lambda x: x - x, lambda x: x - x, [s], device, atol=0)
    check(lambda x: x / x, lambda x: x / x, [s], device, atol=0)
    check(lambda x: x == x, lambda x: x == x, [s], device)
    check(lambda x: x * 1 + 0 - 0, lambda x: x * np.float32(1) + np.float32(0) - np.float32(0), [s], device, atol=0)
    check(lambda x: x.maximum(x), lambda x: np.maximum(x, x), [s], device, atol=0)
    check(lambda x: (x > 0).where(x, x), lambda x: x, [s], device, atol=0)


@pytest.mark.parametrize("expr", ["x+0", "0+x", "x-0", "neg_neg", "x*1"])
def test_compiler_keeps_signed_zero(device, expr):
    """The sign of zero is visible through division: -0.0 + 0.0 is +0.0, -0.0 - 0.0 is -0.0."""
    s = np.array([nan, inf, -inf, 0.0, -0.0, 1.0], dtype=np.float32)
    fn, ref = {
        "x+0": (lambda x: 1 / (x + 0), lambda x: 1 / (x + np.float32(0))),
        "0+x": (lambda x: 1 / (0 + x), lambda x: 1 / (np.float32(0) + x)),
        "x-0": (lambda x: 1 / (x - 0), lambda x: 1 / (x - np.float32(0))),
        "neg_neg": (lambda x: 1 / -(-x), lambda x: 1 / x),
        "x*1": (lambda x: 1 / (x * 1), lambda x: 1 / x),
    }[expr]
    check(fn, ref, [s], device, atol=0)


def test_compiler_float32_rounding(device):
    """Every intermediate is a float32: no folding in higher precision."""
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    check(lambda t: (t + 1e8) - 1e8, lambda t: (t + np.float32(1e8)) - np.float32(1e8), [x], device, atol=0)
    with eqgrad.Context(DEVICE=device):
        big = Tensor.full((3,), 1e8)
        compare((big + 1) - 1e8, np.zeros(3), device, F32, atol=0)          # 1e8 + 1 rounds back to 1e8
        huge = Tensor.full((2,), 1e30)
        compare(huge * 1e30 * 1e-30, np.full(2, inf), device, F32)         # 1e60 overflows float32
        third = Tensor.full((2,), 0.1) + 0.2
        compare(third, np.full(2, np.float32(0.1) + np.float32(0.2)), device, F32, rtol=0, atol=0)


# ---------------------------------------------------------------------------- laziness and caching

def test_lazy_reuse(device):
    """A realized intermediate feeds later programs; realizing twice gives the same numbers."""
    a = Tensor(X34, device=device)
    t = a * 2 + 1
    compare(t, X34 * 2 + 1, device)
    compare(t.sum(0), (X34 * 2 + 1).sum(0), device)
    compare(t * t, (X34 * 2 + 1) ** 2, device)
    u = a.exp()
    v, w = u + 1, u * 2                     # u is shared by two pending tensors
    compare(w, np.exp(X34) * 2, device)
    compare(v, np.exp(X34) + 1, device)
    compare(t, X34 * 2 + 1, device)


def test_same_program_other_data(device):
    """Programs are cached by structure: new data through the same program gives new numbers."""
    for seed in (1, 2):
        x = data((3, 4), seed=seed)
        check(lambda t: (t * 3 - 1).sum(1), lambda a: (a * 3 - 1).sum(1), [x], device)
