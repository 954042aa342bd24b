"""Device capabilities as data (graph/caps.py): the lowering reads a device's capabilities, the
lowered-kernel cache is keyed by them, a GPU gets no CPU register blocks, and the frontend asks the
device instead of importing the lowering's constants."""
import ast
from pathlib import Path

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.devices import _lowered, get_device
from eqgrad.graph.caps import CPU, Capabilities
from eqgrad.lower.passes import LowerOptions, run_passes
from conftest import DEVICES

ROOT = Path(__file__).resolve().parent.parent
GPU_LIKE = Capabilities("a GPU", register_lanes=False, reduce_group=128)


def _matmul_plan(device):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    out = Tensor(a, device=device) @ Tensor(b, device=device)
    cp, _ = engine.plan_for([out.lazydata])
    return cp.plan, out, a @ b


def test_the_cpu_options_are_the_defaults_and_a_gpu_has_no_register_blocks():
    assert LowerOptions.for_caps(CPU) == LowerOptions()
    gpu = LowerOptions.for_caps(GPU_LIKE)
    assert {"lanes", "tiling"} <= gpu.disabled
    plan, _, _ = _matmul_plan("NUMPY")
    (k,) = plan.kernels
    applied = {st.name for st in run_passes(k, gpu) if st.status == "applied"}
    assert "lanes" not in applied and "lanes" in {st.name for st in run_passes(k) if st.status == "applied"}


def test_names_are_not_part_of_the_key():
    assert Capabilities("OPENCL some CPU", reduce_group=16) == CPU
    assert hash(Capabilities("OPENCL some CPU", reduce_group=16)) == hash(CPU)
    assert GPU_LIKE != CPU


def test_lane_room_follows_the_device():
    assert CPU.lane_room(48) == 16 and CPU.lane_room(24) == 8 and CPU.lane_room(7) == 1
    assert GPU_LIKE.lane_room(48) == 1
    from eqgrad.devices.cpu import target_caps
    dev = get_device("LLVM")
    assert dev.caps is target_caps(eqgrad.config.CPU.value)


def test_the_cpu_register_block_is_two_vectors_of_the_target():
    """The LLVM device's capabilities are its target's (graph/caps.py ``cpu_caps``): a block row of
    two vectors -- 32 floats where AVX-512's 32 registers are, AVX2's 16 (``CPU``'s widths) -- and
    they follow EQGRAD_CPU; capabilities set on the device win until they are set back."""
    from eqgrad.devices.cpu import target_caps
    from eqgrad.graph.caps import cpu_caps
    assert cpu_caps(8) is CPU and cpu_caps(4) is CPU
    assert cpu_caps(16).lanes_last == (32, *CPU.lanes_last) and cpu_caps(16).lanes_prev == CPU.lanes_prev
    assert target_caps("x86-64-v3") is CPU                              # AVX2
    assert target_caps("skylake-avx512").lanes_last[0] == 32            # (a query: nothing runs)
    dev = get_device("LLVM")
    with eqgrad.Context(CPU="x86-64-v2"):
        assert dev.caps is CPU
        old = dev.caps
        dev.caps = GPU_LIKE
        assert dev.caps is GPU_LIKE
        dev.caps = old
        assert dev.caps is CPU
    assert dev.caps is target_caps(eqgrad.config.CPU.value)


@pytest.mark.skipif("OPENCL" not in DEVICES, reason="OPENCL device unavailable")
def test_a_gpu_capability_set_lowers_its_own_kernels_and_they_are_right(monkeypatch):
    dev = get_device("OPENCL")
    assert dev.caps.register_lanes == bool(dev.device.type & dev.cl.device_type.CPU)
    plan, out, ref = _matmul_plan("OPENCL")
    (k,) = plan.kernels
    _lowered.clear()
    cpu_lk = dev.lowered_kernel(k, plan) if dev.caps == CPU else get_device("LLVM").lowered_kernel(k, plan)
    assert cpu_lk.vector_lanes > 1                        # the CPU's register block
    monkeypatch.setattr(dev, "caps", GPU_LIKE)
    gpu_lk = dev.lowered_kernel(k, plan)
    assert gpu_lk is not cpu_lk and gpu_lk.vector_lanes == 0 and gpu_lk.loop_vectorize
    assert dev.lowered_kernel(k, plan) is gpu_lk          # kept, by structure and capabilities
    assert get_device("LLVM").lowered_kernel(k, plan) is not gpu_lk
    engine.clear_cache()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_the_frontend_does_not_import_the_lowering():
    """nn/functional.py imported the lane widths from lower/passes.py to pick a convolution's layout."""
    bad = []
    for folder in ("frontend", "nn"):
        for f in sorted((ROOT / "eqgrad" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eqgrad.lower"):
                    bad.append(f"{f.relative_to(ROOT)}: from {node.module} import ...")
    assert not bad, bad


def test_conv_weight_gradient_on_both_devices_matches():
    import torch
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(x), tw, padding=1).sum().backward()
    for device in [d for d in ("LLVM", "OPENCL") if d in DEVICES]:
        ew = Tensor(w, device=device, requires_grad=True)
        eqgrad.nn.functional.conv2d(Tensor(x, device=device), ew, padding=1).sum().backward()
        np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_the_cost_model_reads_the_devices_capabilities_as_they_are_now():
    """The cost model prices a contraction by the register block the device's capabilities give it
    (extract/cost.py ``CostModel.fill``): capabilities set on the device object after it was
    created are the ones it reads."""
    from eqgrad.devices import get_device
    from eqgrad.extract import cost_model
    dev = get_device("LLVM")
    old = dev.caps
    try:
        assert cost_model("LLVM").caps == old
        dev.caps = Capabilities("CPU", lanes_last=(8, 4), lanes_prev=(4, 2))
        assert cost_model("LLVM").caps.lanes_last == (8, 4)
    finally:
        dev.caps = old


def test_one_estimate_of_the_librarys_time_serves_the_cost_model_and_the_device():
    """graph/caps.py ``library_seconds`` is the BLAS time both the cost model (a large GEMM's rate)
    and the device (whether a call-bound product is worth timing) read: a large single product
    shares its arithmetic across threads and pays one call; small products pay a call each, one
    thread a call, the calls shared across threads."""
    from eqgrad.devices import blas
    from eqgrad.extract.cost import CostModel, DeviceParams
    from eqgrad.graph.caps import library_seconds
    from eqgrad.lower.contraction import Gemm
    call, rate = 1e-6, 1e11
    assert library_seconds(call, rate, 2e9, 1, 2, threaded=True) == pytest.approx(1e-6 + 2e9 / 2e11)
    assert library_seconds(call, rate, 2e9, 1, 2, threaded=False) == pytest.approx(1e-6 + 2e9 / 1e11)
    # 384 products of 15 x 15 x 32 on two threads: 192 calls a thread
    f = 384 * 2 * 15 * 15 * 32
    assert library_seconds(call, rate, f, 384, 2, threaded=False) == pytest.approx(192 * (call + f / 384 / rate))
    assert library_seconds(call, rate, f, 3, 8, threaded=False) == pytest.approx(call + f / 3 / rate)
    # the cost model's library rate is that estimate's
    a = Tensor(np.ones((512, 512), np.float32)) @ Tensor(np.ones((512, 512), np.float32))
    cm = CostModel(DeviceParams(contraction=1.5e11), library=lambda: (call, rate, 256), threads=2)
    from eqgrad.graph.caps import gemm_of
    from eqgrad.tools.explain import explain
    k = explain(a, provenance=False).device_plan().plan.kernels[0]
    if gemm_of(k.ast) is None:
        pytest.skip("the product is not planned as one GEMM kernel")
    flops = 2.0 * 512 ** 3
    assert cm.library_gemm(k.ast) == pytest.approx(flops / library_seconds(call, rate, flops, 1, 2, threaded=True))
    # and the device's skip: a batch whose best case is above the prediction is not timed
    if blas.blas() is not None:
        c, r = blas.speeds()
        g = Gemm(15, 15, 32, 0, 1, 0, 0, 32, 1, 15, 1, 15, 1, ((384, 225, 480, 480),))
        best = library_seconds(c, r, g.flops, g.batches, 2, threaded=False)
        if g.flops / g.batches / r < c:
            assert blas.pays(g, best * 0.99, 2) is False
            assert blas.pays(g, best * 1.01, 2) is None


def test_the_axis_before_the_last_gets_its_largest_divisor_up_to_the_widest():
    """A weight gradient of a 3-channel convolution, (3, 3, 1, 3, 16) outputs, had lanes on its last
    axis alone -- no width of (8, 4, 2) divides 3: one vector accumulator for a 32,768-long reduction,
    bound by the FMA's latency (706 us, 40 GFLOP/s, in bench_model's CNN step); a Linear layer's
    weight gradient (10, 32768) had 2 x 16 lanes, re-reading its input for every pair of rows. The
    axis before the last gets its largest divisor up to the widest lane width (3; 5 of 10), and the
    body bound holds."""
    from eqgrad.graph.caps import LANE_BODY_MAX, LANES_LAST, LANES_PREV, register_block

    def block(shape, body=10):
        return register_block(shape, body, LANES_LAST, LANES_PREV, LANE_BODY_MAX)
    assert block((3, 3, 1, 3, 16)) == (16, 3)
    assert block((2, 12, 15, 32)) == (16, 5)
    assert block((7, 16)) == (16, 7)
    assert block((12, 16)) == (16, 6) and block((10, 32768)) == (16, 5) and block((24, 16)) == (16, 8)
    assert block((11, 16)) == (16, 1)            # no divisor up to 8
    assert block((3, 16), body=200) == (16, 1)   # 200 nodes x 48 lanes is over the bound
    from eqgrad.lower.passes import schedule_kernel
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    g = rng.standard_normal((4, 16, 16, 16)).astype(np.float32)
    ew = Tensor(w, requires_grad=True)
    (eqgrad.nn.functional.conv2d(Tensor(x), ew, padding=1) * Tensor(g)).sum().backward()
    cp, _ = engine.plan_for([ew.grad.lazydata])
    blocks = [dict(schedule_kernel(k).lanes) for k in cp.plan.kernels if any(n.op == "RSUM" for n in k.ast.walk())]
    assert any(sorted(b.values()) == [3, 16] for b in blocks), blocks
    import torch
    tw = torch.tensor(w, requires_grad=True)
    (torch.nn.functional.conv2d(torch.tensor(x), tw, padding=1) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_a_convolutions_image_axis_that_no_width_divides_gets_its_largest_divisor_within_a_vector():
    """A convolution over a 7 x 7 or 14 x 14 image (ResNet's last stages) had no lanes -- no width of
    (16, 8, 4) divides 7 or 14 -- and ran its sums in scalar loops: (32, 128, 7, 7) by (128, 128, 3, 3)
    123 ms, 76x torch's; over 28 x 28 4 lanes, 2.1x slower than with 14. A contraction over windows
    along its last axis (``whole``) gets that axis's largest divisor up to one vector (half the widest
    width) where no width divides it or only one narrower than a vector: 7 of 7, 7 of 14, 6 of 12 and of 30,
    7 of 28 with AVX2's widths, 14 of 14 and of 28 with AVX-512's; not where a vector's width
    divides, not past a full block, not for a plain product (a length that keeps changing keeps one
    decision for its traces). Numbers: torch's, forward and both gradients."""
    from eqgrad.graph.caps import LANE_BODY_MAX, LANES_LAST, LANES_PREV, register_block
    from eqgrad.lower.passes import schedule_kernel
    wide = (32,) + LANES_LAST                     # (an AVX-512 target's, graph/caps.py cpu_caps)

    def block(shape, whole=True, lanes=LANES_LAST, body=10):
        return register_block(shape, body, lanes, LANES_PREV, LANE_BODY_MAX, whole)
    assert block((128, 7)) == (7, 8) and block((64, 14)) == (7, 8) and block((64, 14), lanes=wide) == (14, 8)
    assert block((64, 30)) == (6, 8) and block((64, 30), lanes=wide) == (15, 8)
    assert block((64, 12)) == (6, 8) and block((64, 28)) == (7, 8) and block((64, 28), lanes=wide) == (14, 8)
    assert block((64, 7), whole=False) == (1, 1) and block((64, 12), whole=False) == (4, 8)
    assert block((64, 24)) == (8, 8) and block((64, 48), lanes=wide) == (16, 8)      # a vector's width divides
    assert block((64, 37), lanes=wide) == (1, 1) and block((64, 300)) == (4, 8)       # prime; past a full block
    assert block((64, 13), body=1000) == (1, 1)                                        # 13 lanes x 1000 nodes
    import torch
    rng = np.random.default_rng(3)
    for shape in ((4, 8, 7, 7), (2, 4, 14, 14)):
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal((8, shape[1], 3, 3)).astype(np.float32)
        ex, ew = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        y = eqgrad.nn.functional.conv2d(ex, ew, padding=1)
        cp, _ = engine.plan_for([y.lazydata])
        (k,) = [k for k in cp.plan.kernels if any(n.op == "RSUM" for n in k.ast.walk())]
        assert dict(schedule_kernel(k).lanes).get(3) == 7, (shape, schedule_kernel(k).lanes)
        (y * y).sum().backward()
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        ty = torch.nn.functional.conv2d(tx, tw, padding=1)
        (ty * ty).sum().backward()
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    # a product whose last axis no width divides keeps none (its length may keep changing)
    a, b = Tensor(rng.standard_normal((64, 24)).astype(np.float32)), Tensor(rng.standard_normal((24, 14)).astype(np.float32))
    cp, _ = engine.plan_for([(a @ b).lazydata])
    assert all(not schedule_kernel(k).lanes for k in cp.plan.kernels)
