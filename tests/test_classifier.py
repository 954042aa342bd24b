"""The cost model and the lowering agree on what kind of kernel each one is (lower/classify.py):
row-fused, a root contraction at the contraction rate (register lanes or the BLAS), a contraction
left without lanes inside a row-fused kernel, masked pad reads in a reduction loop. The cost model
decides from the e-graph (``KernelCost.kind``), the lowering from its passes; where they disagree the
model prices a kernel the lowering does not build. Run over representative programs and a fuzz
corpus; the disagreements that remain are listed with why, so a new one fails and a fixed one
must be taken off the list."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.extract.plan import build_plan
from eqgrad.engine import regions
from eqgrad.engine.core import _REGION_PLANS
from eqgrad.graph.plan import KERNEL_KINDS
from eqgrad.graph.program import linearize
from eqgrad.lower.classify import classify
from eqgrad.tools.fuzz import BY_NAME, make_input, program_strategy

rng = np.random.default_rng(0)


def _t(*s, grad=False):
    return Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=grad)


def _mlp_step():
    ws = [_t(64, 128, grad=True), _t(128, 10, grad=True)]
    ((_t(256, 64) @ ws[0]).relu() @ ws[1]).log_softmax(-1).mean().backward()
    return [w - 0.1 * w.grad for w in ws]


def _conv_weight_grad():
    w = _t(16, 8, 3, 3, grad=True)
    eqgrad.nn.functional.conv2d(_t(4, 8, 16, 16), w, padding=1).relu().mean().backward()
    return [w.grad]


def _layernorm():
    x = _t(256, 128)
    m = x.mean(-1, keepdim=True)
    return [(x - m) / ((x - m) * (x - m)).mean(-1, keepdim=True).add(1e-5).sqrt() * _t(128) + _t(128)]


def _layernorm_backward():
    x, w = _t(64, 96, grad=True), _t(96, grad=True)
    m = x.mean(-1, keepdim=True)
    ((x - m) / ((x - m) * (x - m)).mean(-1, keepdim=True).add(1e-5).sqrt() * w).square().sum().backward()
    return [x.grad, w.grad]


PROGRAMS = {
    "mlp_step": _mlp_step,
    "conv_weight_grad": _conv_weight_grad,
    "attention": lambda: [((_t(2, 4, 64, 32) @ _t(2, 4, 64, 32).transpose(-1, -2)) * 0.17).softmax(-1) @ _t(2, 4, 64, 32)],
    "layernorm": _layernorm,
    "layernorm_backward": _layernorm_backward,
    "softmax": lambda: [_t(256, 128).softmax(-1)],
    "padded": lambda: [_t(32, 32).pad(((1, 1), (2, 2))).exp2() * 2],
    "conv": lambda: [eqgrad.nn.functional.conv2d(_t(2, 4, 12, 12), _t(8, 4, 3, 3), padding=1).relu()],
    "column_sum": lambda: [_t(512, 64).sum(0) * 3],
    # a sum of squares is no contraction (no operand reuse), fused into its row or not
    "rms_norm": lambda: [(lambda x: x * ((x * x).mean(-1, keepdim=True) + 1e-6).rsqrt())(_t(480, 384))],
    "squared_error": lambda: [((_t(64, 32) - _t(64, 32)).square().mean() * _t(1))],
}

# (program, kind) -> why the two disagree today
KNOWN: dict[tuple[str, str], str] = {
    # (the convolution weight gradient priced as a laned contraction that the lowering runs without
    # lanes was listed here until the cost model priced each contraction by the lanes pass's own
    # block, graph/caps.py block_of)
}


def disagreements(outs: list) -> list[tuple[str, str, bool, bool]]:
    """(kernel, kind, model says, lowering says) for each kind the two see differently."""
    cp, _ = engine.plan_for([o.lazydata for o in outs])
    res = cp.result
    bodies: dict[str, list[int]] = {}
    plan = build_plan(cp.egraph, res.choice, cp.plan.buffers[:cp.plan.n_inputs], bodies=bodies)
    out = []
    costed = res.evaluation.kernels
    for k in plan.kernels:
        kc = costed.get(bodies[k.name][0])
        if kc is None:          # a root the evaluation keys by another class (a Realize of a root)
            continue
        model = kc.kind
        lowering = classify(k, blas=True).kinds            # the LLVM device's stage may hand a GEMM to the BLAS
        out += [(k.name, kind, kind in model, kind in lowering) for kind in KERNEL_KINDS
                if (kind in model) != (kind in lowering)]
    return out


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_model_and_the_lowering_agree_on_each_kernels_kind(name):
    found = {(name, kind): (k, m, lo) for k, kind, m, lo in disagreements(PROGRAMS[name]())}
    new = {key: v for key, v in found.items() if key not in KNOWN}
    assert not new, f"the cost model and the lowering disagree (kernel, model, lowering): {new}"
    gone = [key for key in KNOWN if key[0] == name and key not in found]
    assert not gone, f"fixed: take {gone} off KNOWN"


def test_a_fuzz_corpus_agrees_on_99_percent_of_its_kernels_kinds():
    """Random programs (the fuzzer's, fixed seed). Measured when written: 1,284 of 1,288 (kernel,
    kind) pairs agree on 150 programs; the 3 left are a column max broadcast back and compared
    inside a row max, which the model takes for row-fused and the lowering cannot hoist (it depends
    on the outer reduction's index)."""
    seen, bad = [0], []

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(program_strategy())
    def run(prog):
        vals = [Tensor(make_input(s, dt, i)) for i, (s, dt) in enumerate(prog.inputs)]
        for step, args, p in prog.steps:
            vals.append(BY_NAME[step].eq(*[vals[a] for a in args], p))
        outs = [v for v in vals[len(prog.inputs):] if not v.lazydata.realized]
        if outs:
            cp, _ = engine.plan_for([o.lazydata for o in outs])
            seen[0] += len(cp.plan.kernels) * len(KERNEL_KINDS)
            bad.extend((str(prog), d) for d in disagreements(outs))
    run()
    assert seen[0] > 200
    assert len(bad) <= 0.01 * seen[0], bad


def _blocks(n: int, rows: int) -> Tensor:
    """``n`` residual blocks (RMS norm, a matmul, ReLU) over a (rows, 32) input: planned by regions."""
    r = np.random.default_rng(5)
    x = Tensor(r.standard_normal((rows, 32)).astype(np.float32))
    for i in range(n):
        w, g = (Tensor(r.standard_normal(s).astype(np.float32)) for s in ((32, 32), (32,)))
        x = x + (x * ((x * x).mean(-1, keepdim=True) + 1e-6).rsqrt() * g @ w).relu() * 0.5
    return x


@pytest.mark.parametrize("how", ["regions", "resized", "disk"])
def test_a_kernels_kind_survives_regions_resizing_and_the_disk_cache(how, monkeypatch, tmp_path):
    """Every kernel of a plan keeps the kind its cost was predicted for, however the plan was made:
    stitched from regions, resized from another size, or read back from the disk cache (a plan made
    by regions once lost every kernel's kind, and explain() and bench_model read each as plain)."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1" if how == "disk" else "0")
    engine.clear_cache()
    _REGION_PLANS.clear()
    if how == "regions":
        _blocks(12, 4).realize()
        plan = engine.last_plan.plan
        assert any("planned by regions" in n for n in plan.notes), plan.notes
        # the region plans, in the order stitch() laid out their kernels
        x = _blocks(12, 4)
        prog = linearize([x.lazydata], device=x.lazydata.device,
                         inspected=engine.current_session().rules.config().inspected_constants)
        keys = {key[-1]: p for key, (p, _, _) in _REGION_PLANS.items()}
        want = [k.kind for r in regions.split(prog) for k in keys[r.program.key].kernels]
    else:
        _blocks(2, 64).realize()
        want = [k.kind for k in engine.last_plan.plan.kernels]
        engine.clear_cache()
        resized, hits = eqgrad.GlobalCounters.plans_resized, eqgrad.GlobalCounters.disk_hits
        if how == "resized":
            monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
            _blocks(2, 64).realize()              # the plan at the first size, in memory
            _blocks(2, 96).realize()
            assert eqgrad.GlobalCounters.plans_resized > resized
        else:
            _blocks(2, 64).realize()
            assert eqgrad.GlobalCounters.disk_hits > hits
        plan = engine.last_plan.plan
    assert any("contraction" in k for k in want), want
    assert [k.kind for k in plan.kernels] == want
    engine.clear_cache()
    _REGION_PLANS.clear()


# ------------------------------------------------------------------ the register block a contraction is priced at

def _predicted_with_and_without_caps(outs: list) -> tuple[float, float]:
    """The plan's predicted seconds as extracted (the device's capabilities known: contractions
    priced by the register block they get) and re-costed with no capabilities (every contraction
    at the full block's rate)."""
    from eqgrad.extract.cost import CostModel
    from eqgrad.extract.evaluate import PlanEvaluator
    cp, _ = engine.plan_for([o.lazydata for o in outs])
    res = cp.result
    ev = PlanEvaluator(cp.egraph, CostModel(_params()), cp.plan.buffers[:cp.plan.n_inputs])
    return res.evaluation.total, ev.evaluate(res.choice).total


def _params():
    from eqgrad.extract import cost_model
    return cost_model("LLVM").params


def test_a_small_batched_product_is_priced_at_the_block_the_lowering_gives_it():
    """BERT's attention product (15 x 15 x 32 per head): no lane width divides 15, so the lanes pass
    gives it no register block and it ran at 14-20 GFLOP/s (bench_model); priced at 1/8 of the
    contraction rate (at least its flops' time at that rate), not at the full block's (below it)."""
    from eqgrad.graph.caps import CPU
    from eqgrad.lower.passes import block_of
    q, k = _t(32, 12, 15, 32), _t(32, 12, 15, 32)
    out = q @ k.transpose(-1, -2)
    with_caps, without = _predicted_with_and_without_caps([out])
    at_an_eighth = 2 * 32 * 12 * 15 * 15 * 32 / (_params().contraction / 8)
    assert with_caps >= at_an_eighth > without
    cp, _ = engine.plan_for([out.lazydata])
    (kern,) = [kk for kk in cp.plan.kernels if "contraction" in kk.kind]
    assert block_of(kern.ast, CPU) == (1, 1) and CPU.block_fill((1, 1)) == 1 / 8
    np.testing.assert_allclose(out.numpy(), q.numpy() @ k.numpy().transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shapes", [((64, 48), (48, 80)), ((8, 32, 64), (8, 64, 32))])
def test_a_gemm_a_block_wide_is_priced_at_the_full_rate(shapes):
    """A GEMM (or a batch of them) at least 16 wide in every dimension: the BLAS runs it at the
    full rate where the generated kernel would get a smaller block, so the fill is 1."""
    a, b = _t(*shapes[0]), _t(*shapes[1])
    with_caps, without = _predicted_with_and_without_caps([a @ b])
    assert with_caps == pytest.approx(without)


def _priced_with_library(a, b, speed) -> tuple[float, float]:
    """(a @ b)'s one kernel priced with the device's library GEMM answering ``speed`` and without a
    library, in seconds."""
    from eqgrad.extract import cost_model
    from dataclasses import replace
    cp, _ = engine.plan_for([(a @ b).lazydata])
    (k,) = cp.plan.kernels
    base = cost_model("LLVM")
    with_lib = replace(base, library=lambda: speed, threads=2)
    without = replace(base, library=None)
    ev = lambda cm: cm.seconds(k.nbytes, k.flops, 0, k.flops, cm.fill(k.ast))
    return ev(with_lib), ev(without)


def test_a_large_gemm_is_priced_at_the_library_rate():
    """A GEMM at least as large in every dimension as the product the device timed its library on
    is priced at that rate on the device's threads (plus a call), not the generated kernel's: a
    Linear 480 x 1536 x 384 ran at 300-320 GFLOP/s in the BLAS on two threads and was priced at the
    generated kernel's 150. Here the library runs at the default contraction rate on each of two
    threads. A library slower than the generated kernel changes nothing (the device runs the faster)."""
    a, b = _t(512, 384), _t(384, 1536)
    p = _params()
    fast, base = _priced_with_library(a, b, (1e-6, p.contraction, 256))
    flops = 2 * 512 * 384 * 1536
    assert fast == pytest.approx(p.launch + 1e-6 + flops / (2 * p.contraction), rel=1e-6)   # (the arithmetic outweighs the bytes)
    assert fast < base / 1.5
    slow, base2 = _priced_with_library(a, b, (1e-6, 10e9, 256))
    assert slow == pytest.approx(base2)


@pytest.mark.parametrize("shapes", [((128, 384), (384, 1536)), ((8, 256, 256), (8, 256, 256))])
def test_a_small_or_batched_gemm_keeps_the_generated_rate(shapes):
    """Smaller than the timed product in a dimension, or a batch of products: the one timing does not
    tell the library's rate there (attention's 384 products of 128 x 128 x 32 ran at 89 GFLOP/s), so
    the generated kernel's price stands (the device times both and runs the faster)."""
    fast, base = _priced_with_library(_t(*shapes[0]), _t(*shapes[1]), (1e-6, 150e9, 256))
    assert fast == pytest.approx(base)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_cost_models_block_is_the_lanes_passs(name):
    """``block_of`` (what the cost model prices a contraction by) is the lanes pass's block for every
    kernel the pass gives lanes; without lanes, the full block for a GEMM the BLAS takes at its rate
    (16 wide in every dimension, or one GEMM over all rows: a factor shared by every row), else none."""
    from eqgrad.graph.caps import CPU
    from eqgrad.graph.plan import shared_factor
    from eqgrad.lower.contraction import candidate, find_contraction
    from eqgrad.lower.passes import block_of
    cp, _ = engine.plan_for([o.lazydata for o in PROGRAMS[name]()])
    for k in cp.plan.kernels:
        lanes = dict(classify(k).lanes)
        w = [lanes[d] for d in sorted(lanes, reverse=True)] + [1, 1]
        found, red = find_contraction(k.ast), candidate(k.ast)
        if lanes:
            assert block_of(k.ast, CPU) == tuple(w[:2]), k.ast.render()[:200]
        elif (found is not None and min(found.gemm.m, found.gemm.n, found.gemm.k) >= 16) or (
                red is not None and shared_factor(red.src[0], red.arg, lambda n: n.op, lambda n: n.src, lambda n: n.shape)):
            assert block_of(k.ast, CPU) == (16, 8)
        else:
            assert block_of(k.ast, CPU) == (1, 1), k.ast.render()[:200]
