"""Float composites in every float dtype: the result keeps the input's float dtype;
float16/bfloat16 compute in float32 and round once (as torch's CPU kernels), float64 computes in
float64 -- the transcendental primitives through the C library's double functions, the
composites accurate to float64 (erfc above 3 excepted, docs/semantics.md) -- forward and backward
against torch in the same dtype."""
import math

import numpy as np
import pytest

import eqgrad.dtype as dt
from eqgrad import Tensor

torch = pytest.importorskip("torch")

# name -> (eqgrad call, torch call, input range)
UNARY = {
    "exp": (lambda t: t.exp(), torch.exp, (-5, 5)),
    "log": (lambda t: t.log(), torch.log, (0.01, 50)),
    "exp2": (lambda t: t.exp2(), torch.exp2, (-5, 5)),
    "log2": (lambda t: t.log2(), torch.log2, (0.01, 50)),
    "log10": (lambda t: t.log10(), torch.log10, (0.01, 50)),
    "log1p": (lambda t: t.log1p(), torch.log1p, (-0.9, 5)),
    "expm1": (lambda t: t.expm1(), torch.expm1, (-3, 3)),
    "sqrt": (lambda t: t.sqrt(), torch.sqrt, (0.01, 50)),
    "rsqrt": (lambda t: t.rsqrt(), torch.rsqrt, (0.01, 50)),
    "sin": (lambda t: t.sin(), torch.sin, (-10, 10)),
    "cos": (lambda t: t.cos(), torch.cos, (-1.4, 1.4)),
    "tan": (lambda t: t.tan(), torch.tan, (-1.2, 1.2)),
    "asin": (lambda t: t.asin(), torch.asin, (-0.95, 0.95)),
    "acos": (lambda t: t.acos(), torch.acos, (-0.95, 0.95)),
    "atan": (lambda t: t.atan(), torch.atan, (-20, 20)),
    "sinh": (lambda t: t.sinh(), torch.sinh, (-5, 5)),
    "cosh": (lambda t: t.cosh(), torch.cosh, (-5, 5)),
    "tanh": (lambda t: t.tanh(), torch.tanh, (-5, 5)),
    "asinh": (lambda t: t.asinh(), torch.asinh, (-20, 20)),
    "acosh": (lambda t: t.acosh(), torch.acosh, (1.1, 20)),
    "atanh": (lambda t: t.atanh(), torch.atanh, (-0.9, 0.9)),
    "erf": (lambda t: t.erf(), torch.erf, (-3, 3)),
    "erfc": (lambda t: t.erfc(), torch.erfc, (-2, 2.9)),
    "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid, (-8, 8)),
    "silu": (lambda t: t.silu(), torch.nn.functional.silu, (-5, 5)),
    "gelu": (lambda t: t.gelu(), torch.nn.functional.gelu, (-5, 5)),
    "gelu_tanh": (lambda t: t.gelu("tanh"), lambda x: torch.nn.functional.gelu(x, approximate="tanh"), (-5, 5)),
    "elu": (lambda t: t.elu(), torch.nn.functional.elu, (-5, 5)),
    "selu": (lambda t: t.selu(), torch.selu, (-5, 5)),
    "celu": (lambda t: t.celu(0.5), lambda x: torch.celu(x, 0.5), (-5, 5)),     # torch rounds 1/alpha to float32
    "softplus": (lambda t: t.softplus(), torch.nn.functional.softplus, (-5, 5)),
    "logsigmoid": (lambda t: t.logsigmoid(), torch.nn.functional.logsigmoid, (-5, 5)),
    "mish": (lambda t: t.mish(), torch.nn.functional.mish, (-5, 5)),
    "softsign": (lambda t: t.softsign(), torch.nn.functional.softsign, (-5, 5)),
    "quick_gelu": (lambda t: t.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), (-5, 5)),
    "softmax": (lambda t: t.softmax(-1), lambda x: torch.softmax(x, -1), (-5, 5)),
    "log_softmax": (lambda t: t.log_softmax(-1), lambda x: torch.log_softmax(x, -1), (-5, 5)),
    "logsumexp": (lambda t: t.logsumexp(-1), lambda x: torch.logsumexp(x, -1), (-5, 5)),
    "mean": (lambda t: t.mean(-1), lambda x: x.mean(-1), (-5, 5)),
    "var": (lambda t: t.var(-1), lambda x: x.var(-1), (-5, 5)),
    "std": (lambda t: t.std(-1), lambda x: x.std(-1), (-5, 5)),
    "sum": (lambda t: t.sum(-1), lambda x: x.sum(-1), (-5, 5)),
}
BINARY = {
    "atan2": (lambda a, b: a.atan2(b), torch.atan2),
    "hypot": (lambda a, b: a.hypot(b), torch.hypot),
    "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp),
    "copysign": (lambda a, b: a.copysign(b), torch.copysign),
    "lerp": (lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3)),
}
# relative tolerances: float64 to ~float64 (a few ulp, 1e-12 for the composites of composites),
# float16/bfloat16 one rounding of a float32 result (torch rounds once too; both may round differently)
RTOL = {dt.float64: 1e-12, dt.float16: 2e-3, dt.bfloat16: 1.6e-2}
ATOL = {dt.float64: 1e-14, dt.float16: 2e-3, dt.bfloat16: 1.6e-2}
FLOATS = [dt.float16, dt.bfloat16, dt.float64]


def _tdt(d):
    return getattr(torch, d.name)


def _inputs(lo, hi, d, shape=(3, 17), seed=0):
    x = np.random.default_rng(seed).uniform(lo, hi, shape)
    return torch.tensor(x, dtype=_tdt(d))


def _device_ok(device, d):
    # OpenCL/CUDA store float16/bfloat16 but do not compute in them (DTypeError, docs/devices.md)
    return device in ("LLVM", "NUMPY") or d is dt.float64


def _close(got: Tensor, want, d):
    assert got.dtype is d, (got.dtype, d)
    g = torch.tensor(got.float().numpy() if d is dt.bfloat16 else got.numpy()).double()
    w = want.double()
    assert g.shape == w.shape
    torch.testing.assert_close(g, w, rtol=RTOL[d], atol=ATOL[d], equal_nan=True)


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_keeps_the_float_dtype_and_matches_torch(name, d, device):
    if not _device_ok(device, d):
        pytest.skip(f"{device} computes float32/float64 only")
    f, tf, (lo, hi) = UNARY[name]
    x = _inputs(lo, hi, d)
    _close(f(Tensor(x, device=device)), tf(x), d)


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_keeps_the_promoted_float_dtype_and_matches_torch(name, d, device):
    if not _device_ok(device, d):
        pytest.skip(f"{device} computes float32/float64 only")
    f, tf = BINARY[name]
    a, b = _inputs(-4, 4, d, seed=1), _inputs(-4, 4, d, seed=2)
    _close(f(Tensor(a, device=device), Tensor(b, device=device)), tf(a, b), d)
    # with a float32 operand the result promotes (float64 stays; float16/bfloat16 give float32)
    want = dt.promote(d, dt.float32)
    out = f(Tensor(a, device=device), Tensor(b.float(), device=device))
    assert out.dtype is want


@pytest.mark.parametrize("name", sorted(UNARY))
def test_float64_gradients_match_torch(name):
    f, tf, (lo, hi) = UNARY[name]
    x = _inputs(lo, hi, dt.float64, seed=3).requires_grad_()
    tf(x).sum().backward() if tf(x).ndim else tf(x).backward()
    t = Tensor(x.detach().numpy(), requires_grad=True)
    f(t).sum().backward()
    assert t.grad.dtype is dt.float64
    torch.testing.assert_close(torch.tensor(t.grad.numpy()), x.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d", [dt.float16, dt.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh", "gelu", "softmax", "mean", "log_softmax", "atan"])
def test_narrow_float_gradients_keep_the_dtype_and_match_torch(name, d):
    f, tf, (lo, hi) = UNARY[name]
    x = _inputs(lo, hi, d, seed=4).requires_grad_()
    tf(x).float().sum().backward()
    t = Tensor(x.detach(), requires_grad=True)
    f(t).float().sum().backward()
    _close(t.grad, x.grad, d)


def test_float64_transcendentals_are_double_precise_far_out():
    x = np.concatenate([np.linspace(-700, 700, 301), [1e-300, -1e-300, 1e-17, 0.0, -0.0, 1e5, 1e15]])
    t = Tensor(x)
    np.testing.assert_allclose(t.exp().numpy(), np.exp(x), rtol=4e-15, atol=0)
    np.testing.assert_allclose(t.sin().numpy(), np.sin(x), rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(t.abs().log().numpy(), np.log(np.abs(x)), rtol=1e-15)
    assert Tensor([700.0], dtype="float64").sinh().item() == pytest.approx(math.sinh(700.0), rel=1e-14)  # not float32's 88 cut
    assert math.isfinite(Tensor([710.0], dtype="float64").cosh().item())
    assert Tensor([1e-10], dtype="float64").tanh().item() == pytest.approx(1e-10, rel=1e-15)
    assert Tensor([0.2], dtype="float64").tanh().item() == pytest.approx(math.tanh(0.2), rel=1e-15)


def test_float64_with_infinities():
    t = Tensor([1.0, -2.0], dtype="float64")
    assert (t + float("inf")).tolist() == [math.inf, math.inf]
    assert t.maximum(float("-inf")).tolist() == [1.0, -2.0]
    assert Tensor([math.inf, -math.inf, 0.0], dtype="float64").sigmoid().tolist() == [1.0, 0.0, 0.5]


def test_narrow_sums_accumulate_in_float32_and_small_ints_widen():
    x = np.full(4096, 1.0, np.float16)
    assert Tensor(x).sum().item() == 4096.0                # float16 accumulation would stop at 2048
    assert Tensor(x).sum().dtype is dt.float16
    assert Tensor(x).mean().item() == 1.0
    u = Tensor(np.array([200, 100], np.uint8))
    assert u.sum().item() == 300 and u.sum().dtype is dt.int32
    assert Tensor(np.array([100, 100, 100], np.int8)).cumsum(0).tolist() == [100, 200, 300]
    assert Tensor(np.array([2 ** 40, 1])).sum().dtype is dt.int64


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", ["0-d", "size-0", "transposed"])
@pytest.mark.parametrize("name", ["exp", "tanh", "gelu", "atan", "softmax", "mean", "erfc", "expm1"])
def test_edge_shapes_forward_and_backward(name, shape, d):
    f, tf, (lo, hi) = UNARY[name]
    if shape == "0-d":
        if name in ("softmax", "mean"):
            pytest.skip("a reduction over the last axis: needs one")
        x = _inputs(lo, hi, d, shape=())
    elif shape == "size-0":
        x = _inputs(lo, hi, d, shape=(0, 4))
    else:
        x = _inputs(lo, hi, d, shape=(5, 3)).T            # a non-contiguous view
    _close(f(Tensor(x)), tf(x), d)
    if d is dt.float64:
        xg = x.detach().clone().requires_grad_()
        tf(xg).sum().backward()
        t = Tensor(x.detach().contiguous().numpy(), requires_grad=True)
        f(t).sum().backward()
        assert t.grad.shape == tuple(xg.shape)
        torch.testing.assert_close(torch.tensor(t.grad.numpy()).reshape(xg.shape), xg.grad, rtol=1e-10, atol=1e-12)
