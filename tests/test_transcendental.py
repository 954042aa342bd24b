"""exp2/log2/sin/erf over the whole float range on every device, within the bounds docs/semantics.md
promises (the LLVM and OpenCL devices' are eqgrad's own vectorizable loop-IR decompositions,
lower/decomp.py; CUDA uses its full-precision library)."""
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from eqgrad import Tensor
from eqgrad.devices.cuda import CUDARenderer
from eqgrad.devices.llvm import compiler, render_llvm
from eqgrad.devices.opencl import OpenCLRenderer
from eqgrad.lower.decomp import ERF_ULP, SIN_ABS_ERR, SIN_REL_ERR, SIN_TABLE, TWO_OVER_PI, TWO_OVER_PI_BITS
from conftest import lowered_only_kernel


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


def test_erf_error_over_range_and_specials(device):
    """Within ERF_ULP of float64 erf on a dense sweep and at decades down to 1e-37 (where the old
    composite, 1 - poly * exp(-x^2), gave 0 for erf(1e-11)); signed zeros, +-1 at +-inf, NaN."""
    from scipy.special import erf
    x = np.concatenate([np.linspace(-5, 5, 200_001, dtype=np.float32),
                        np.float32(10.0) ** np.arange(-37, 0.5, 0.125, dtype=np.float32)])
    ref = erf(x.astype(np.float64))
    got = Tensor(x, device=device).erf().numpy().astype(np.float64)
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - ref) / ulp) < ERF_ULP
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 4.0, -1e30], np.float32)
    got = Tensor(sp, device=device).erf().numpy()
    np.testing.assert_array_equal(got, erf(sp.astype(np.float64)).astype(np.float32))
    assert np.signbit(got[1])


def test_erf_gradient(device):
    x = np.linspace(-3, 3, 13, dtype=np.float32)
    t = Tensor(x, device=device, requires_grad=True)
    t.erf().sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 2 / np.sqrt(np.pi) * np.exp(-x.astype(np.float64) ** 2), rtol=2e-6)


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


# ---------------------------------------------------------------------------- sin
def _sin_bounds(device):
    # CUDA's sinf is documented at 2 ulp: absolute 2**-23, relative 2**-22
    return (1.2e-7, 2.4e-7) if device == "CUDA" else (SIN_ABS_ERR, SIN_REL_ERR)


def _check_sin(x, device):
    got = Tensor(x, device=device).sin().numpy().astype(np.float64)
    ref = np.sin(x.astype(np.float64))
    err = np.abs(got - ref)
    rel = err[ref != 0] / np.abs(ref[ref != 0])
    a, r = _sin_bounds(device)
    assert np.max(err) < a, f"absolute error {np.max(err):.3g} at x = {x[np.argmax(err)]!r}"
    assert np.max(rel) < r, f"relative error {np.max(rel):.3g} at x = {x[ref != 0][np.argmax(rel)]!r}"
    return got


def test_sin_error_over_range(device):
    _check_sin(np.linspace(-1e4, 1e4, 1_000_001, dtype=np.float32), device)


def test_sin_error_over_all_exponents(device):
    # random bit patterns: every exponent, both signs, subnormals (inf/NaN left out)
    bits = np.random.default_rng(0).integers(0, 2**32, 2_200_000, dtype=np.uint64).astype(np.uint32)
    x = bits[(bits & 0x7F800000) != 0x7F800000].view(np.float32)
    assert x.size > 2_000_000
    _check_sin(x, device)


# float32 values closest to a multiple of pi/2 (found by an exact search over every float): the
# range reduction must keep the relative accuracy of sin near k*pi for a huge k
NEAR_PI_2 = [16367173 * 2.0**72,      # 1.61e-9 from a multiple of pi/2, the closest: sin = 1
             16367173 * 2.0**73,      # sin = -3.23e-9
             16367173 * 2.0**74,      # sin = 6.46e-9
             10741887 * 2.0**11,      # sin = 1
             10741887 * 2.0**12,      # sin = -4.03e-9
             16573937 * 2.0**-16]     # 252.898..., sin = 1


def test_sin_specials(device):
    x = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1.1754942e-38, np.inf, -np.inf, np.nan], np.float32)
    got = Tensor(x, device=device).sin().numpy()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.sin(x))
    assert np.signbit(got[1]) and not np.signbit(got[0])


def test_sin_near_multiples_of_half_pi(device):
    k = np.array([1, 2, 3, 4, 100, 12345, 2**20 + 1, 10**7, 2**40 + 3, 10**20, 2**100 + 5], np.float64)
    near = (k * (math.pi / 2)).astype(np.float32)
    x = np.concatenate([near, np.nextafter(near, np.float32(np.inf)), np.array(NEAR_PI_2, np.float32),
                        np.array([3.4028235e38, 2.0**127, 2.0**24, 2.0**24 - 1, 1.5707964, 3.1415927], np.float32)])
    x = np.concatenate([x, -x])
    got = _check_sin(x, device)
    np.testing.assert_array_equal(got[:x.size // 2], -got[x.size // 2:])        # odd


def test_sin_reduction_table():
    """2/pi's bits and decomp.py's table of its chunks: for every exponent, the four chunks are 24-bit
    integers times powers of two and add up to 2/pi * 2**e mod 4 up to the dropped tail."""
    assert float(Fraction(TWO_OVER_PI, 2**TWO_OVER_PI_BITS)) == 2 / math.pi
    two_over_pi = Fraction(TWO_OVER_PI, 2**TWO_OVER_PI_BITS)
    for ex in range(256):
        e = max(ex, 1) - 150
        top = min(1, e - 1)
        ws = SIN_TABLE[4 * ex: 4 * ex + 4]
        for i, w in enumerate(ws):
            chunk = Fraction(w) / Fraction(2) ** (top - 24 * i - 23)
            assert chunk.denominator == 1 and 0 <= chunk < 2**24
        f = two_over_pi * Fraction(2) ** e
        f -= 4 * math.floor(f / 4)
        assert 0 <= f - sum(Fraction(w) for w in ws) < Fraction(2) ** (top - 95), ex


def test_two_over_pi_bits():
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(TWO_OVER_PI_BITS + 64):
        assert int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** TWO_OVER_PI_BITS)) == TWO_OVER_PI


def _sin_kernel():
    return lowered_only_kernel(Tensor(np.zeros(4096, np.float32), device="NUMPY").sin())


def test_sin_kernel_is_vectorized_on_llvm():
    import llvmlite.binding as llvm
    src = render_llvm(_sin_kernel())
    assert "@llvm.sin" not in src and "call float" not in src
    # the pipeline LLVMCompiler.object_code runs
    mod = llvm.parse_assembly(src)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = pto.slp_vectorization = pto.loop_unrolling = True
    pb = llvm.create_pass_builder(compiler().tm, pto)
    pb.getModulePassManager().run(mod, pb)
    ir = str(mod)
    assert re.search(r"fptrunc <(\d+) x double> %\S+ to <\1 x float>", ir), "the sin loop was not vectorized"
    assert re.search(r"call <\d+ x double> @llvm\.roundeven", ir)


def test_sin_renderers():
    # OpenCL on a CPU: the decomposition, with the same table in double (a device without cl_khr_fp64
    # keeps the library sin: tests/test_renderers.py); CUDA: its sinf
    lk = _sin_kernel()
    cl = OpenCLRenderer().render(lk)
    assert "sin(" not in cl and "__constant double sin_tbl[1024]" in cl and "cl_khr_fp64 : enable" in cl
    cu = CUDARenderer().render(lk)
    assert "sinf(v" in cu and "sin_tbl" not in cu
