"""exp2/log2 over the whole float range on every device, within the bounds docs/semantics.md promises
(the LLVM device's are its own vectorizable code; OpenCL and CUDA use their full-precision library)."""
import numpy as np

from eqgrad import Tensor


def test_exp2_relative_error_over_range(device):
    x = np.linspace(-126, 128, 400_001, dtype=np.float32)
    got = Tensor(x, device=device).exp2().numpy()
    ref = np.exp2(x.astype(np.float64))
    fin = ref < 3.4e38
    assert np.max(np.abs(got[fin] - ref[fin]) / ref[fin]) < 4e-7


def test_exp2_specials(device):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 200.0, -200.0, 128.5], np.float32)
    with np.errstate(over="ignore"):
        ref = np.exp2(x)
    got = Tensor(x, device=device).exp2().numpy()
    np.testing.assert_array_equal(got, ref)


def test_log2_error_over_range(device):
    x = np.exp(np.linspace(-103, 88.7, 400_001)).astype(np.float32)   # subnormals to near max
    got = Tensor(x, device=device).log2().numpy()
    ref = np.log2(x.astype(np.float64))
    assert np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref))) < 2e-7


def test_log2_specials(device):
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0, 2.0, 1e-45], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = np.log2(x)
    np.testing.assert_array_equal(Tensor(x, device=device).log2().numpy(), ref)


def test_exp_and_log_compose(device):
    # exp(x) = exp2(x * log2(e)): rounding the float32 product costs a relative error of about
    # |x| * 2**-23 * ln2 on top of exp2's own (docs/semantics.md)
    x = np.linspace(-80, 80, 10_001, dtype=np.float32)
    rel = np.abs(Tensor(x, device=device).exp().numpy() / np.exp(x.astype(np.float64)) - 1)
    assert np.all(rel <= 5e-7 + np.abs(x) * 2.0**-23 * 0.7)
    y = np.exp(np.linspace(-80, 80, 10_001)).astype(np.float32)
    np.testing.assert_allclose(Tensor(y, device=device).log().numpy(), np.log(y), rtol=2e-6, atol=1e-6)
