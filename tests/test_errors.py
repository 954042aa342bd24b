"""Bad input raises at the API call (before anything is realized), with the right exception class
and a message naming the op, what it expected and what it got."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import AxisError, DeviceError, DTypeError, ShapeError, Tensor

# Errors are raised while the graph is built, so the device only matters for device errors;
# most tests run on NUMPY and nothing here realizes a program unless it says so.


@pytest.fixture
def t34():
    return Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="NUMPY")


@pytest.fixture
def i34():
    return Tensor(np.arange(12, dtype=np.int32).reshape(3, 4), device="NUMPY")


# ---------------------------------------------------------------------------- shapes

def test_broadcast_error_names_op_and_shapes(t34):
    b = Tensor(np.ones(5, np.float32), device="NUMPY")
    with pytest.raises(ShapeError, match=r"add.*\(3, 4\).*\(5,\)"):
        t34 + b
    with pytest.raises(ShapeError, match=r"mul.*\(3, 4\).*\(5,\).*broadcast"):
        t34 * b
    with pytest.raises(ShapeError, match=r"sub.*\(5,\).*\(3, 4\)"):
        b - t34
    with pytest.raises(ShapeError, match=r"maximum.*\(3, 4\).*\(5,\)"):
        t34.maximum(b)
    with pytest.raises(ShapeError, match=r"lt.*\(3, 4\).*\(5,\)"):
        t34 < b
    with pytest.raises(ShapeError, match=r"add.*\(3, 4\).*\(2, 1, 4, 2\)"):
        t34 + Tensor.zeros(2, 1, 4, 2, device="NUMPY")
    with pytest.raises(ShapeError, match=r"where.*\(3, 4\).*\(5,\)"):
        (t34 > 1).where(t34, b)
    with pytest.raises(ShapeError, match=r"add.*\(3, 4\).*\(2,\)"):
        t34 + np.ones(2, np.float32)


@pytest.mark.parametrize("new, pattern", [
    ((5, 2), r"reshape.*\(3, 4\).*12 elements.*\(5, 2\)"),
    ((5, -1), r"reshape.*\(3, 4\).*\(5, -1\)"),
    ((-1, -1), r"reshape.*only one dimension can be -1.*\(-1, -1\)"),
    ((0, -1), r"reshape.*\(3, 4\).*\(0, -1\)"),
    ((-2, -6), r"reshape.*invalid size.*\(-2, -6\)"),
    ((13,), r"reshape.*\(3, 4\).*\(13,\).*13 elements"),
])
def test_reshape_wrong_size(t34, new, pattern):
    with pytest.raises(ShapeError, match=pattern):
        t34.reshape(new)


def test_reshape_bad_entries(t34):
    with pytest.raises(ShapeError, match=r"shape entries must be ints.*2\.5"):
        t34.reshape(2.5, 4)


def test_too_many_dimensions(t34):
    with pytest.raises(ShapeError, match=r"reshape.*at most 8 dimensions"):
        t34.reshape(3, 4, 1, 1, 1, 1, 1, 1, 1)
    with pytest.raises(ShapeError, match=r"Tensor\(\).*at most 8 dimensions"):
        Tensor(np.zeros((1,) * 9, np.float32), device="NUMPY")


@pytest.mark.parametrize("sa, sb, pattern", [
    ((3, 4), (5, 2), r"matmul.*inner dimensions.*\(3, 4\).*\(5, 2\).*4 != 5"),
    ((4,), (3,), r"matmul.*\(4,\).*\(3,\)"),
    ((3, 4), (3,), r"matmul.*\(3, 4\).*\(3,\)"),
    ((2, 3, 4), (2, 5, 6), r"matmul.*\(2, 3, 4\).*\(2, 5, 6\)"),
    ((2, 3, 4), (3, 4, 5), r"matmul.*\(2, 3, 4\).*\(3, 4, 5\)"),       # batch dims do not broadcast
    ((), (3,), r"matmul.*at least 1 dimension.*\(\).*\(3,\)"),
])
def test_matmul_shape_errors(sa, sb, pattern):
    a, b = Tensor.zeros(*sa, device="NUMPY"), Tensor.zeros(*sb, device="NUMPY")
    with pytest.raises(ShapeError, match=pattern):
        a @ b


def test_expand_errors(t34):
    with pytest.raises(ShapeError, match=r"expand.*\(3, 4\).*\(5, 4\).*size-1"):
        t34.expand(5, 4)
    with pytest.raises(ShapeError, match=r"expand.*\(3, 4\).*\(2, 3, 8\)"):
        t34.expand(2, 3, 8)
    with pytest.raises(ShapeError, match=r"expand.*\(4,\).*fewer dimensions.*\(3, 4\)"):
        t34.expand(4)


def test_pad_shrink_errors(t34):
    with pytest.raises(ShapeError, match=r"pad.*one \(before, after\) pair per axis \(2\).*got 1"):
        t34.pad(((1, 1),))
    with pytest.raises(ShapeError, match=r"pad.*crops more than shape \(3, 4\)"):
        t34.pad(((-2, -2), (0, 0)))
    with pytest.raises(ShapeError, match=r"shrink.*\[2, 5\).*size 4.*\(3, 4\)"):
        t34.shrink((None, (2, 5)))
    with pytest.raises(ShapeError, match=r"shrink.*\[2, 1\)"):
        t34.shrink(((2, 1), None))
    with pytest.raises(ShapeError, match=r"shrink.*one \(start, end\) pair per axis \(2\).*got 3"):
        t34.shrink((None, None, None))


def test_cat_stack_errors(t34):
    with pytest.raises(ShapeError, match=r"cat.*\(3, 4\).*\(3, 5\).*dim 0"):
        t34.cat(Tensor.zeros(3, 5, device="NUMPY"))
    with pytest.raises(ShapeError, match=r"cat.*\(3, 4\).*\(4,\)"):
        t34.cat(Tensor.zeros(4, device="NUMPY"), dim=1)
    with pytest.raises(DTypeError, match=r"cat.*Tensors.*ndarray"):
        t34.cat(np.zeros((1, 4), np.float32))
    with pytest.raises(ShapeError, match=r"stack.*\(3, 4\).*\(4, 3\)"):
        Tensor.stack([t34, t34.T])
    with pytest.raises(ShapeError, match=r"stack.*at least one"):
        Tensor.stack([])


def test_reduce_over_empty_axis():
    e = Tensor.zeros(0, 3, device="NUMPY")
    with pytest.raises(ShapeError, match=r"max.*zero-size.*\(0, 3\)"):
        e.max(0)
    with pytest.raises(ShapeError, match=r"min.*zero-size.*\(0, 3\)"):
        e.min()
    with pytest.raises(ShapeError, match=r"argmax.*\(0, 3\).*empty"):
        e.argmax(0)


# ---------------------------------------------------------------------------- axes

@pytest.mark.parametrize("call, pattern", [
    (lambda t: t.sum(2), r"sum.*axis 2.*out of range.*2 dimension.*\(3, 4\)"),
    (lambda t: t.sum(-3), r"sum.*axis -3.*out of range"),
    (lambda t: t.max(axis=(0, 5)), r"max.*axis 5.*out of range"),
    (lambda t: t.min(7), r"min.*axis 7.*out of range"),
    (lambda t: t.mean(2), r"mean.*axis 2.*out of range"),
    (lambda t: t.var(-5), r"var.*axis -5.*out of range"),
    (lambda t: t.std(3), r"std.*axis 3.*out of range"),
    (lambda t: t.argmax(2), r"argmax.*axis 2.*out of range"),
    (lambda t: t.argmin(2), r"argmin.*axis 2.*out of range"),
    (lambda t: t.softmax(2), r"softmax.*axis 2.*out of range"),
    (lambda t: t.log_softmax(-3), r"log_softmax.*axis -3.*out of range"),
    (lambda t: t.transpose(0, 3), r"transpose.*axis 3.*out of range"),
    (lambda t: t.unsqueeze(3), r"unsqueeze.*axis 3.*out of range"),
    (lambda t: t.unsqueeze(-4), r"unsqueeze.*axis -4.*out of range"),
    (lambda t: t.squeeze(2), r"squeeze.*axis 2.*out of range"),
    (lambda t: t.flatten(0, 2), r"flatten.*axis 2.*out of range"),
    (lambda t: t.flatten(1, 0), r"flatten.*start_dim 1.*end_dim 0"),
    (lambda t: t.flip(2), r"flip.*axis 2.*out of range"),
    (lambda t: t.cat(t, dim=2), r"cat.*axis 2.*out of range"),
    (lambda t: Tensor.stack([t, t], dim=4), r"stack.*axis 4.*out of range"),
    (lambda t: t.sum((0, 0)), r"sum.*repeated axis.*\(0, 0\)"),
    (lambda t: t.sum((1, -1)), r"sum.*repeated axis.*\(1, -1\)"),
    (lambda t: t.sum(1.0), r"sum.*axis must be an int.*1\.0"),
    (lambda t: t.size(2), r"size.*axis 2.*out of range"),
])
def test_axis_out_of_range(t34, call, pattern):
    with pytest.raises(AxisError, match=pattern):
        call(t34)


def test_axis_error_is_index_and_value_error(t34):
    with pytest.raises(IndexError):
        t34.sum(5)
    with pytest.raises(ValueError):
        t34.sum(5)
    with pytest.raises(AxisError, match=r"sum.*axis 1.*0 dimension"):
        Tensor(1.0, device="NUMPY").sum(1)


@pytest.mark.parametrize("order", [(0, 0), (0, 1, 2), (0,), (1, 2), (-3, 0)])
def test_bad_permute(t34, order):
    with pytest.raises(AxisError, match=r"permute.*" + str(order).replace("(", r"\(").replace(")", r"\)")
                       + r".*not a permutation.*\(3, 4\)"):
        t34.permute(order)


# ---------------------------------------------------------------------------- indexing

def test_too_many_indices(t34):
    with pytest.raises(AxisError, match=r"too many indices.*\(3, 4\).*3 given"):
        t34[0, 0, 0]
    with pytest.raises(AxisError, match=r"too many indices.*\(3, 4\)"):
        t34[0, ..., 1, None, 2]
    with pytest.raises(AxisError, match=r"too many indices.*\(\)"):
        Tensor(1.0, device="NUMPY")[0]
    with pytest.raises(AxisError, match=r"single ellipsis"):
        t34[..., 0, ...]


@pytest.mark.parametrize("idx, pattern", [
    ((3,), r"index 3 is out of bounds for axis 0 with size 3"),
    ((-4,), r"index -4 is out of bounds for axis 0 with size 3"),
    ((slice(None), 4), r"index 4 is out of bounds for axis 1 with size 4"),
    ((0, -5), r"index -5 is out of bounds for axis 1 with size 4"),
    ((None, 1, 9), r"index 9 is out of bounds for axis 1 with size 4"),
])
def test_index_out_of_bounds(t34, idx, pattern):
    with pytest.raises(AxisError, match=pattern):
        t34[idx]


def test_unsupported_indices(t34):
    with pytest.raises(AxisError, match=r"unsupported index 'a'"):
        t34["a"]
    with pytest.raises(AxisError, match=r"unsupported index 1\.5"):
        t34[1.5]
    # lists and tensors index (tests/test_indexing.py); what stays an error:
    with pytest.raises(AxisError, match=r"index 5 is out of bounds for axis 0 with size 3"):
        t34[[0, 5]]
    with pytest.raises(AxisError, match=r"index lists must be rectangular"):
        t34[[[0, 1], [0.5]]]
    with pytest.raises(DeviceError, match=r"the index is on LLVM, the tensor on NUMPY"):
        t34[Tensor([0, 1], device="LLVM")]


# ---------------------------------------------------------------------------- dtypes

def test_bitwise_on_floats(t34, i34):
    with pytest.raises(DTypeError, match=r"and.*integer or bool.*got float32"):
        t34 & t34
    with pytest.raises(DTypeError, match=r"or.*integer or bool.*got float32"):
        t34 | 1
    with pytest.raises(DTypeError, match=r"xor.*integer or bool.*got float32"):
        i34 ^ t34                                   # promoted to float32
    with pytest.raises(DTypeError, match=r"and.*integer or bool.*got float32"):
        i34 & 1.5
    with pytest.raises(DTypeError, match=r"invert.*integer or bool.*got float32"):
        ~t34


def test_dtype_errors(t34):
    b = Tensor([True, False], device="NUMPY")
    with pytest.raises(DTypeError, match=r"sub.*bool"):
        b - b
    with pytest.raises(DTypeError, match=r"neg.*bool"):
        -b
    with pytest.raises(DTypeError, match=r"add.*unsupported operand type str"):
        t34 + "1"
    with pytest.raises(DTypeError, match=r"mul.*unsupported operand type NoneType"):
        t34 * None
    with pytest.raises(ValueError, match=r"pow.*integers to negative integer powers.*-1"):
        Tensor([2, 3], device="NUMPY") ** -1                   # as NumPy
    with pytest.raises(TypeError, match=r"unsupported dtype.*complex"):
        t34.cast("complex64")
    with pytest.raises(TypeError, match=r"unsupported dtype.*'float16x'"):
        Tensor([1.0], dtype="float16x", device="NUMPY")


def test_tensor_constructor_errors():
    with pytest.raises(ShapeError, match=r"Tensor\(\).*rectangular"):
        Tensor([[1, 2], [3]], device="NUMPY")
    with pytest.raises(DTypeError, match=r"Tensor\(\).*expected a number, list.*got str"):
        Tensor("abc", device="NUMPY")
    with pytest.raises(DTypeError, match=r"Tensor\(\).*unsupported NumPy dtype complex"):
        Tensor(np.zeros(2, np.complex64), device="NUMPY")
    with pytest.raises(DTypeError, match=r"Tensor\(\).*got dict"):
        Tensor({"a": 1}, device="NUMPY")


def test_creation_errors():
    with pytest.raises(ShapeError, match=r"full.*negative dimension.*\(2, -1\)"):
        Tensor.zeros(2, -1, device="NUMPY")
    with pytest.raises(ShapeError, match=r"shape entries must be ints.*2\.5"):
        Tensor.ones(2.5, device="NUMPY")
    with pytest.raises(ShapeError, match=r"eye.*non-negative.*-1"):
        Tensor.eye(-1, device="NUMPY")
    with pytest.raises(ValueError, match=r"arange.*step must not be zero"):
        Tensor.arange(0, 5, 0, device="NUMPY")


# ---------------------------------------------------------------------------- scalars out of tensors

def test_item_multi_element(t34):
    with pytest.raises(ShapeError, match=r"item\(\).*one element.*\(3, 4\)"):
        t34.item()
    with pytest.raises(ShapeError, match=r"item\(\).*one element.*\(0,\)"):
        Tensor([], device="NUMPY").item()
    with pytest.raises(ValueError, match=r"truth value of a tensor with 12 elements is ambiguous"):
        bool(t34)
    with pytest.raises(TypeError, match=r"len\(\) of a 0-d tensor"):
        len(Tensor(1.0, device="NUMPY"))


# ---------------------------------------------------------------------------- devices and flags

@pytest.mark.parametrize("make", [
    lambda: Tensor([1.0], device="TPU"),
    lambda: Tensor.zeros(2, device="tpu"),
    lambda: Tensor.arange(3, device="TPU"),
    lambda: Tensor.rand(2, device="TPU"),
    lambda: Tensor([1.0], device="NUMPY").to("TPU"),
])
def test_unknown_device(make):
    with pytest.raises(DeviceError, match=r"unknown device 'TPU'.*expected one of LLVM, NUMPY"):
        make()


def test_mixed_devices():
    a, b = Tensor([1.0], device="LLVM"), Tensor([1.0], device="NUMPY")
    with pytest.raises(DeviceError, match=r"add.*different devices.*LLVM.*NUMPY"):
        a + b


def test_bad_device_env(monkeypatch):
    monkeypatch.setenv("EQGRAD_DEVICE", "TPU")
    with pytest.raises(ValueError, match=r"EQGRAD_DEVICE.*expected LLVM, NUMPY, OPENCL or CUDA.*got 'TPU'"):
        Tensor([1.0])
    with pytest.raises(ValueError, match=r"EQGRAD_DEVICE.*got 'TPU'"):
        Tensor.zeros(2)
    # an explicit device does not read the flag
    assert Tensor([1.0], device="NUMPY").device == "NUMPY"
    monkeypatch.setenv("EQGRAD_DEVICE", "numpy")
    assert Tensor([1.0]).device == "NUMPY"


def test_bad_debug_env(monkeypatch):
    monkeypatch.setenv("DEBUG", "verbose")
    t = Tensor([1.0, 2.0], device="NUMPY") + 1
    with pytest.raises(ValueError, match=r"DEBUG.*expected an integer.*got 'verbose'"):
        t.numpy()


def test_bad_opt_env(monkeypatch):
    monkeypatch.setenv("EQGRAD_OPT", "fast")
    t = Tensor([1.0, 2.0], device="NUMPY") * 3
    with pytest.raises(ValueError, match=r"EQGRAD_OPT.*got 'fast'"):
        t.numpy()


def test_bad_context_values():
    with pytest.raises(ValueError, match=r"unknown flag 'NOPE'"):
        with eqgrad.Context(NOPE=1):
            pass
    # config.py promises that a malformed value names the flag, what it expects and what it got
    with pytest.raises(ValueError, match=r"EQGRAD_DEVICE.*LLVM, NUMPY, OPENCL or CUDA.*'TPU'"):
        with eqgrad.Context(DEVICE="TPU"):
            pass
    with pytest.raises(ValueError, match=r"DEBUG.*integer.*'loud'"):
        with eqgrad.Context(DEBUG="loud"):
            pass


# ---------------------------------------------------------------------------- sizes

def test_expand_rejects_negative_sizes_other_than_keep():
    """-1 keeps an existing axis's size (torch); any other negative size was taken as given:
    ``expand(-5, 3)`` had shape (-5, 3) and summed to 3.0."""
    t = Tensor(np.ones((1, 3), np.float32), device="NUMPY")
    with pytest.raises(ShapeError, match=r"expand.*invalid size -5 at axis 0 of \(-5, 3\).*\(1, 3\)"):
        t.expand(-5, 3)
    with pytest.raises(ShapeError, match=r"expand.*invalid size -2 at axis 1 of \(4, -2\)"):
        t.expand(4, -2)
    with pytest.raises(ShapeError, match=r"expand.*invalid size -1 at axis 0 of \(-1, 2, 3\)"):
        t.expand(-1, 2, 3)                         # a new axis has no size to keep
    assert t.expand(4, -1).shape == (4, 3) and t.expand(2, -1, -1).shape == (2, 1, 3)


@pytest.mark.parametrize("make, pattern", [
    (lambda: Tensor.zeros(2**62, 4), r"full\(\): shape \(4611686018427387904, 4\) of float32 is too large.*"
                                     r"73786976294838206464 bytes.*2\*\*63 - 1.*axis 0 \(size 4611686018427387904\)"),
    (lambda: Tensor.ones(10**10, 10**10), r"full\(\).*\(10000000000, 10000000000\).*axis 1 \(size 10000000000\)"),
    (lambda: Tensor.full((0, 2**62, 4), 1.0), r"full\(\).*\(0, 4611686018427387904, 4\)"),   # strides overflow too
    (lambda: Tensor.zeros(2**63, dtype="bool"), r"full\(\).*\(9223372036854775808,\) of bool"),
    (lambda: Tensor.eye(2**40), r"eye\(\).*\(1099511627776, 1099511627776\)"),
    (lambda: Tensor.rand(2**62, 2), r"rand\(\).*\(4611686018427387904, 2\)"),
    (lambda: Tensor.randn(2**62, 2, seed=0), r"randn\(\).*\(4611686018427387904, 2\)"),
    (lambda: Tensor.zeros(0, 3).reshape(2**62, 0, 4), r"reshape\(\).*\(4611686018427387904, 0, 4\)"),
    (lambda: Tensor.zeros(1, 3).expand(2**40, 2**40, 3), r"expand\(\).*\(1099511627776, 1099511627776, 3\).*axis 1"),
])
def test_sizes_beyond_what_can_be_addressed(make, pattern):
    """A tensor's bytes (empty axes counted as 1) stay below 2**63: a larger shape is a ShapeError at
    the call naming the size, not "Python int too large to convert to C ssize_t" at a realize."""
    with eqgrad.Context(DEVICE="NUMPY"), pytest.raises(ShapeError, match=pattern):
        make()


def test_sizes_just_within_the_bound_are_made_lazily():
    with eqgrad.Context(DEVICE="NUMPY"):
        assert Tensor.zeros(2**61 - 1).shape == (2**61 - 1,)            # 2**63 - 4 bytes of float32
        assert Tensor.zeros(2**63 - 1, dtype="bool").shape == (2**63 - 1,)
        assert Tensor.zeros(0, 2**61 - 1).reshape(2**61 - 1, 0).shape == (2**61 - 1, 0)
    with pytest.raises(ShapeError, match=r"rand\(\).*negative dimension.*\(2, -1\)"):
        Tensor.rand(2, -1)


# ---------------------------------------------------------------------------- empty axes

@pytest.mark.parametrize("device", ["LLVM", "NUMPY"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_an_empty_axis_is_empty(device, op):
    """torch gives an empty tensor of the input's shape (and an empty gradient); eqgrad raised
    "max(): zero-size reduction"."""
    for shape, axis in (((2, 0), -1), ((0, 3), 0), ((0,), 0), ((3, 0, 2), 1)):
        x = Tensor(np.ones(shape, np.float32), device=device, requires_grad=True)
        y = getattr(x, op)(axis)
        assert y.shape == shape and y.numpy().shape == shape and y.dtype is eqgrad.float32
        y.sum().backward()
        assert x.grad.numpy().shape == shape
    # an empty axis other than the softmax's still normalizes the rest
    x = Tensor(np.ones((0, 3), np.float32), device=device)
    assert getattr(x, op)(-1).numpy().shape == (0, 3)


@pytest.mark.parametrize("device", ["LLVM", "NUMPY"])
def test_logsumexp_over_an_empty_axis_is_minus_infinity(device):
    x = Tensor(np.ones((2, 0), np.float32), device=device, requires_grad=True)
    y = x.logsumexp(-1)
    np.testing.assert_array_equal(y.numpy(), np.full(2, -np.inf, np.float32))      # torch: log(0)
    assert x.logsumexp(-1, keepdim=True).shape == (2, 1)
    y.sum().backward()
    assert x.grad.numpy().shape == (2, 0)


def test_a_buffer_larger_than_memory_and_swap_is_refused_naming_its_shape():
    """zeros(10**6, 10**6).numpy() used to fail inside NumPy; now the device refuses it
    before allocating, naming the shape, dtype and bytes."""
    with pytest.raises(eqgrad.OutOfMemoryError, match=r"float32 buffer of shape \(1000000, 1000000\) needs 4000000000000 bytes"):
        Tensor.zeros(10**6, 10**6).numpy()
    assert issubclass(eqgrad.OutOfMemoryError, MemoryError)


def test_broadcasting_past_the_addressable_bound_is_a_shape_error():
    """(2**40, 1) + (1, 2**40) used to have shape (2**40, 2**40), 2**82 bytes."""
    a, b = Tensor.zeros(2**40, 1), Tensor.zeros(1, 2**40)
    for f in (lambda: a + b, lambda: a * b, lambda: (a > 0).where(a, b)):
        with pytest.raises(ShapeError, match=r"shape \(1099511627776, 1099511627776\) of float32 is too large to address"):
            f()
