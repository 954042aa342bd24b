"""Bits. Tensor.bitcast: the BITCAST primitive reads the same bits as another dtype of the
same width, through the whole pipeline (e-graph, extraction, lowering) on every device, against
NumPy's view; special values keep their bits; bad targets are errors naming the widths. Shifts and
~ on every integer dtype against torch (uint32: NumPy), shift counts beyond the width included."""
import numpy as np
import pytest

import eqgrad.dtype as dt
from eqgrad import Tensor
from eqgrad.errors import DTypeError

F32 = np.array([1.0, -0.0, np.inf, -np.inf, np.nan, 3.5e-39, -2.5, 3.4e38], np.float32)
PAIRS = [("float32", "int32"), ("float32", "uint32"), ("int32", "float32"), ("uint32", "float32"),
         ("float16", "int16"), ("int16", "float16"), ("float64", "int64"), ("int64", "float64"),
         ("int8", "uint8"), ("uint8", "int8"), ("int32", "uint32")]


def _source(name):
    bits = np.random.default_rng(0).integers(-2 ** 62, 2 ** 62, 64, dtype=np.int64)
    if name == "float32":
        return np.concatenate([F32, bits.view(np.float32)[:24]])
    return bits.view(np.dtype(name))[:32].copy()


def _device_ok(device, *names):
    if device == "OPENCL":          # every dtype but the narrow floats (docs/semantics.md, Dtypes)
        return not set(names) & {"float16", "bfloat16"}
    return device in ("LLVM", "NUMPY") or set(names) <= {"float32", "int32", "float64"}


@pytest.mark.parametrize("src,dst", PAIRS)
def test_bitcast_matches_numpy_view(src, dst, device):
    if not _device_ok(device, src, dst):
        pytest.skip(f"{device} has no {src}/{dst} kernels (docs/semantics.md, Dtypes)")
    x = _source(src)
    got = Tensor(x, device=device).bitcast(dst)
    assert got.dtype is dt.to_dtype(dst)
    want = x.view(np.dtype(dst))
    assert np.array_equal(got.numpy().view(np.uint8), want.view(np.uint8))


def test_bitcast_of_computed_values_and_back(device):
    x = Tensor(F32, device=device)
    bits = (x * 2.0).bitcast("int32")
    with np.errstate(over="ignore"):
        want = (F32 * np.float32(2.0)).view(np.int32)
    if device == "CUDA":    # an arithmetic NaN is NVIDIA's canonical one (docs/semantics.md, Dtypes)
        want = np.where(np.isnan(F32), np.int32(0x7FFFFFFF), want)
    assert np.array_equal(bits.numpy(), want)
    # clearing the sign bit is abs(), NaN included, inside one fused kernel
    a = (x.bitcast("int32") & 0x7FFFFFFF).bitcast("float32")
    assert np.array_equal(a.numpy().view(np.int32), np.abs(F32).view(np.int32))


def test_nan_payloads_and_negative_zero_keep_their_bits(device):
    bits = np.array([0x7FC00001, 0x7F800001 | 0x00400000, -2 ** 31, 0xFFC12345 - 2 ** 32], np.int32)
    back = Tensor(bits, device=device).bitcast("float32").bitcast("int32")
    assert np.array_equal(back.numpy(), bits)


@pytest.mark.parametrize("device_", ["LLVM", "NUMPY"])
def test_bfloat16_bits(device_):
    v = np.array([1.0, -2.0, 3.140625, -0.0, np.inf], np.float32)
    b = Tensor(v, device=device_).cast("bfloat16")
    want = (v.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    assert np.array_equal(b.bitcast("int16").numpy(), want)
    assert np.array_equal(Tensor(want, device=device_).bitcast("bfloat16").numpy(), v)


def test_bitcast_errors_name_the_widths():
    with pytest.raises(DTypeError, match=r"float32's width \(4 bytes\).*float32, int32, uint32.*got int16"):
        Tensor([1.0]).bitcast("int16")
    with pytest.raises(DTypeError, match="not bool"):
        Tensor([1.0]).bitcast("bool")
    with pytest.raises(DTypeError, match="not bool"):
        Tensor([True]).bitcast("int8")
    with pytest.raises(DTypeError):
        Tensor([1.0]).bitcast("complex64")


def test_bitcast_is_not_differentiable():
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert not x.bitcast("int32").requires_grad
    y = (x * 3).sum() + x.bitcast("int32").bitcast("float32").sum()
    y.backward()
    assert x.grad.tolist() == [3.0, 3.0]
    t = Tensor([1.5])
    assert t.bitcast("float32") is t


INTS = ["int8", "uint8", "int16", "int32", "uint32", "int64"]


@pytest.mark.parametrize("d", INTS)
@pytest.mark.parametrize("device_", ["LLVM", "NUMPY"])
def test_shifts_and_invert_on_every_integer_dtype(d, device_):
    torch = pytest.importorskip("torch")
    bits = np.dtype(d).itemsize * 8
    info = np.iinfo(d)
    a = np.array([info.min, -5 if info.min < 0 else 5, 0, 1, 7, info.max, 3], d)
    for b in [0, 1, 3, bits - 2, bits - 1, bits, bits + 3]:
        bb = np.full(a.shape, b, d)
        left = (Tensor(a, device=device_) << Tensor(bb, device=device_)).numpy()
        right = (Tensor(a, device=device_) >> Tensor(bb, device=device_)).numpy()
        if d == "uint32":          # torch has no uint32 shifts on the CPU: NumPy's, with counts in range
            if b < bits:
                assert np.array_equal(left, a << bb) and np.array_equal(right, a >> bb), b
            else:
                assert not left.any() and not right.any()
            continue
        ta, tb = torch.from_numpy(a), torch.from_numpy(bb)
        assert np.array_equal(left, (ta << tb).numpy()), (b, left)
        assert np.array_equal(right, (ta >> tb).numpy()), (b, right)
    assert np.array_equal((~Tensor(a, device=device_)).numpy(), ~a)
    assert (Tensor(a, device=device_) << 1).dtype is dt.to_dtype(d)


def test_shifts_of_floats_are_errors_naming_the_integer_dtypes():
    with pytest.raises(DTypeError, match="shifts need integer tensors.*got float32"):
        Tensor([1.0]) << 1
    with pytest.raises(DTypeError, match="needs an integer or bool tensor, got float32"):
        ~Tensor([1.0])


def test_copysign_reads_the_sign_bit_of_nan_and_negative_zero(device):
    src = np.array([np.copysign(np.nan, -1), np.nan, -0.0, 0.0], np.float32)
    got = Tensor([2.0, 2.0, 2.0, -2.0], device=device).copysign(Tensor(src, device=device))
    assert got.tolist() == [-2.0, 2.0, -2.0, 2.0]
