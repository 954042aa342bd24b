"""The extractor: legal plans, fusion decisions that follow the cost model, the unoptimized fallback."""
import numpy as np
import pytest

from eqgrad import Tensor
from eqgrad.extract.cost import CostModel, DeviceParams
from eqgrad.extract.egraph import from_json, from_program
from eqgrad.extract.greedy import GreedyExtractor
from eqgrad.extract.plan import build_plan
from eqgrad.graph.plan import check_plan
from eqgrad.graph.program import linearize
from eqgrad.rules.ir import emit_program
from eqgrad.rules.saturate import default_saturator
from eqgrad.devices.numpy_device import NumpyDevice
from eqgrad.devices import Buffer


def saturated(*outs: Tensor):
    lbs = [o.lazydata for o in outs]
    prog = linearize(lbs)
    js, rep = default_saturator().run(emit_program(prog).text)
    assert rep.stop_reason == "completed"
    return from_json(js, emit_program(prog).roots), prog


def run_plan(g, choice, prog, ev=None):
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    plan = build_plan(g, choice, specs, ev.kernels if ev else None)
    check_plan(plan)
    bufs = [lb.buffer for lb in prog.inputs] + [Buffer.empty(s, d, "NUMPY") for s, d in plan.buffers[len(specs):]]
    NumpyDevice().prepare(plan)(bufs)
    return plan, [bufs[o].data for o in plan.outputs]


@pytest.mark.parametrize("row_fusion,n_kernels", [(True, 1), (False, 3)])
def test_every_kernel_of_the_chosen_plan_is_legal(row_fusion, n_kernels):
    """softmax: one row-fused kernel where the device allows it (CPU), else max, sum, divide."""
    x = Tensor(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32), device="NUMPY")
    g, prog = saturated(x.softmax(-1))
    params = DeviceParams(row_fusion=row_fusion)
    res = GreedyExtractor(g, CostModel(params), [(lb.shape, lb.dtype) for lb in prog.inputs]).extract()
    choice, ev = res.choice, res.evaluation
    assert ev.legal and all(k.legal for k in ev.kernels.values())
    plan, (out,) = run_plan(g, choice, prog, ev)
    assert len(plan.kernels) == n_kernels
    e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_materialize_or_recompute_follows_the_cost_model():
    """t = exp2(a*b) feeds two reductions: recompute t in both (GPU-like balance) or materialize
    it once (compute-poor target); the extractor must switch between the two."""
    rng = np.random.default_rng(1)
    a = Tensor(rng.standard_normal((256, 512)).astype(np.float32), device="NUMPY")
    b = Tensor(rng.standard_normal((256, 512)).astype(np.float32), device="NUMPY")
    t = (a * b).exp2()
    s0, s1 = t.sum(0), t.sum(1)
    g, prog = saturated(s0, s1)
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    counts = {}
    for name, params in {"cheap-flops": DeviceParams(launch=3e-6, bandwidth=2e12, peak=5e13),
                         "dear-flops": DeviceParams(launch=3e-6, bandwidth=2e12, peak=5e10)}.items():
        res = GreedyExtractor(g, CostModel(params), specs).extract()
        choice, ev = res.choice, res.evaluation
        plan, outs = run_plan(g, choice, prog, ev)
        counts[name] = len(plan.kernels)
        ta = np.exp2(a.numpy() * b.numpy())
        np.testing.assert_allclose(outs[0], ta.sum(0), rtol=1e-4)
        np.testing.assert_allclose(outs[1], ta.sum(1), rtol=1e-4)
    assert counts == {"cheap-flops": 2, "dear-flops": 3}


def test_launch_overhead_drives_fusion():
    x = Tensor(np.ones((32, 32), np.float32), device="NUMPY")
    g, prog = saturated(((x + 1) * 2 - 3).exp2())
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    choice = GreedyExtractor(g, CostModel(DeviceParams(launch=1e-3)), specs).extract().choice
    plan, _ = run_plan(g, choice, prog)
    assert len(plan.kernels) == 1


def test_unsaturated_graph_gives_the_unfused_plan():
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="NUMPY")
    y = (x + 1).permute(1, 0) * 2
    lbs = [y.lazydata]
    prog = linearize(lbs)
    g = from_program(prog)
    choice = GreedyExtractor(g, CostModel(DeviceParams()), [(lb.shape, lb.dtype) for lb in prog.inputs],
                             max_passes=0).extract().choice
    plan, (out,) = run_plan(g, choice, prog)
    assert len(plan.kernels) == 3                      # add | permute (a copy) | mul
    np.testing.assert_array_equal(out.reshape(4, 3), ((x.numpy() + 1).T * 2))


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_extract_to_valid_plans(seed):
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((6, 8)).astype(np.float32), device="NUMPY")
    ops = [lambda t: t + 1, lambda t: t * 2, lambda t: t.exp2(), lambda t: t - t.amax(-1, keepdim=True),
           lambda t: t.sum(-1, keepdim=True).expand(*t.shape) * t, lambda t: (t @ t.T @ t) * 0.01,
           lambda t: t.flip(0), lambda t: t.pad(((1, 0), (0, 0)))[1:], lambda t: (t > 0).where(t, t * 0.5)]
    y = x
    for _ in range(8):
        y = ops[rng.integers(len(ops))](y)
    g, prog = saturated(y)
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    res = GreedyExtractor(g, CostModel(DeviceParams()), specs).extract()
    choice, ev = res.choice, res.evaluation
    assert ev.legal
    plan, (out,) = run_plan(g, choice, prog, ev)
    from eqgrad.engine import reference
    (ref,) = reference(linearize([y.lazydata]))
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_the_cost_model_sees_a_root_contraction_as_its_own_class():
    """KernelStats.cflops: the flops of a contraction at the kernel's root (matmul, convolution;
    its epilogue excluded), costed at DeviceParams.contraction; none for elementwise work, and
    none for a contraction hoisted into a row-fused kernel (charged ``unlaned`` instead)."""
    from eqgrad.extract import using
    from eqgrad.extract.cost import KernelStats, default_cost
    seen: list[KernelStats] = []

    def record(s, p):
        seen.append(s)
        return default_cost(s, p)
    rng = np.random.default_rng(5)
    a, b = (Tensor(rng.standard_normal((24, 40), dtype=np.float32)), Tensor(rng.standard_normal((40, 56), dtype=np.float32)))
    with using(cost_fn=record):
        out = ((a @ b) + 1.0).relu()
        out.realize()
    np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() @ b.numpy() + 1, 0), rtol=1e-5, atol=1e-5)
    fused = [s for s in seen if s.cflops > 0]
    assert fused and all(s.cflops == 2 * 24 * 40 * 56 and s.flops >= s.cflops for s in fused)
    assert any(s.flops > s.cflops for s in fused)          # the bias and relu fused after it: not the class
    seen.clear()
    with using(cost_fn=record):
        (a * 2 + 1).exp().realize()
    assert seen and all(s.cflops == 0 for s in seen)


def test_the_contraction_rate_prices_only_contractions():
    from eqgrad.extract.cost import DeviceParams, KernelStats, default_cost
    p, fast = DeviceParams(), DeviceParams(contraction=500e9)
    mm = KernelStats(nbytes=1e5, flops=2e8, nodes=5, cflops=2e8)
    ew = KernelStats(nbytes=1e5, flops=2e8, nodes=5)
    assert default_cost(mm, fast) < default_cost(mm, p) == default_cost(ew, p) == default_cost(ew, fast)
    with pytest.raises(ValueError, match="contraction"):
        DeviceParams(contraction=-1.0)


def test_a_calibration_without_the_launch_after_a_stream_keeps_the_devices_default(tmp_path, monkeypatch):
    """A calibration stored before ``cold`` existed (or with a bad one) reads the device's default
    term; ``stream_bytes`` is the host's, never read from the file."""
    import json
    from eqgrad.cache import machine_key
    from eqgrad.extract.cost import DEFAULT_PARAMS, params_for
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    for extra, cold in (({}, DEFAULT_PARAMS["LLVM"].cold), ({"cold": "slow"}, DEFAULT_PARAMS["LLVM"].cold),
                        ({"cold": -1.0}, DEFAULT_PARAMS["LLVM"].cold), ({"cold": 9e-6, "stream_bytes": 7}, 9e-6)):
        entry = dict(launch=3e-6, bandwidth=2e10, peak=4e10, source="calibrated then", **extra)
        (tmp_path / "calibration.json").write_text(json.dumps(
            {"version": 1, "entries": {f"LLVM|{machine_key('LLVM')}": entry}}))
        p = params_for("LLVM")
        assert p.source == "calibrated then" and p.cold == cold and p.stream_bytes == DEFAULT_PARAMS["LLVM"].stream_bytes
    # likewise the row passes (cost.py): stored before the field, or bad, the default; else the stored
    for extra, row_pass in (({}, DEFAULT_PARAMS["LLVM"].row_pass), ({"row_pass": -2e-9}, DEFAULT_PARAMS["LLVM"].row_pass),
                            ({"row_pass": 3.5e-9}, 3.5e-9)):
        entry = dict(launch=3e-6, bandwidth=2e10, peak=4e10, source="calibrated then", **extra)
        (tmp_path / "calibration.json").write_text(json.dumps(
            {"version": 1, "entries": {f"LLVM|{machine_key('LLVM')}": entry}}))
        assert params_for("LLVM").row_pass == row_pass


def test_a_calibration_without_the_contraction_rate_reads_as_peak(tmp_path, monkeypatch):
    import json
    from eqgrad.cache import machine_key
    from eqgrad.extract.cost import CALIBRATION_VERSION, params_for
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    entry = {"launch": 4e-6, "bandwidth": 3e10, "peak": 7e10, "source": "calibrated before the field"}
    (tmp_path / "calibration.json").write_text(json.dumps(
        {"version": CALIBRATION_VERSION, "entries": {f"LLVM|{machine_key('LLVM')}": entry}}))
    p = params_for("LLVM")
    assert (p.peak, p.contraction) == (7e10, 0.0)
    entry["contraction"] = 2e11
    (tmp_path / "calibration.json").write_text(json.dumps(
        {"version": CALIBRATION_VERSION, "entries": {f"LLVM|{machine_key('LLVM')}": entry}}))
    assert params_for("LLVM").contraction == 2e11


def test_a_long_shared_chain_into_a_product_is_priced_without_unfolding_it():
    """A kernel body is keyed by its structure for the lowering's answers (the register block of its
    contraction, whether it keeps its rows): as nested tuples, a body whose values are each read twice
    -- ``y = (y * 0.5 + 0.25) * tanh(y)``, 40 times, then ``y @ w`` -- hashed as the tree it unfolds
    to (2^40 nodes), and extraction ran into its time limit (60 s) for a 1,328-op program. The key
    is flat now (each class once, its sources by position): the search completes, and the numbers
    are NumPy's."""
    from eqgrad import engine
    r = np.random.default_rng(0)
    x0, w0 = r.uniform(-1, 1, (8, 16)).astype(np.float32), r.uniform(-1, 1, (16, 16)).astype(np.float32)
    y, want = Tensor(x0), x0
    for _ in range(40):
        y, want = (y * 0.5 + 0.25) * y.tanh(), (want * 0.5 + 0.25) * np.tanh(want)
    out = y @ Tensor(w0)
    cp, _ = engine.plan_for([out.lazydata])
    assert cp.result.status == "complete", cp.result.status
    np.testing.assert_allclose(out.numpy(), want @ w0, rtol=1e-4, atol=1e-5)
