"""Repeated layers plan once (eqgrad/engine/regions.py): a program is cut where one tensor flows on,
each distinct region is saturated and extracted once, and the stitched plan gives the numbers of
the program planned whole and of NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.engine import regions
from eqgrad.engine.core import _REGION_PLANS
from eqgrad.graph.plan import check_plan
from eqgrad.graph.program import linearize
from eqgrad.nn import functional as F

D = 32


def weights(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32), rng.standard_normal(D).astype(np.float32))
            for _ in range(n)]


def block_np(x: np.ndarray, w: np.ndarray, g: np.ndarray, scale: float) -> np.ndarray:
    h = x * (1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)) * g
    return x + np.maximum(h @ w, 0) * np.float32(scale)


def block(x: Tensor, w: Tensor, g: Tensor, scale: float) -> Tensor:
    """A residual block: RMS norm, a linear layer, ReLU, scaled and added back."""
    h = x * ((x * x).mean(-1, keepdim=True) + 1e-6).rsqrt() * g
    return x + (h @ w).relu() * scale


def forward(n: int, seed: int = 0, keep: tuple[int, ...] = ()) -> tuple[list[Tensor], list[np.ndarray]]:
    """``n`` blocks over a (4, D) input; the output, and the activations after the blocks ``keep``."""
    ws = weights(n, seed)
    x0 = np.random.default_rng(seed + 1).standard_normal((4, D)).astype(np.float32)
    x, xn, outs, want = Tensor(x0), x0, [], []
    for i, (w, g) in enumerate(ws):
        x, xn = block(x, Tensor(w), Tensor(g), 0.5 + i / 8), block_np(xn, w, g, 0.5 + i / 8)
        if i in keep:
            outs.append(x)
            want.append(xn)
    return [x.sum(-1)] + outs, [xn.sum(-1)] + want


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    engine.clear_cache()
    _REGION_PLANS.clear()
    yield
    engine.clear_cache()


def program(ts: list[Tensor]):
    """The program the engine plans when ``ts`` are realized together (its float constants are
    parameters, as the engine's rules make them)."""
    rules = engine.current_session().rules.config()
    return linearize([t.lazydata for t in ts], device=ts[0].lazydata.device, inspected=rules.inspected_constants)


def run(ts: list[Tensor]) -> list[np.ndarray]:
    eqgrad.realize(*ts)
    return [t.numpy() for t in ts]


def test_cuts_are_where_one_tensor_flows_on():
    x = Tensor(np.ones((2, 3), np.float32)).realize()
    z = ((x * 2).sum(1) + 1).exp()
    prog = linearize([z.lazydata])
    assert regions.cuts(prog) == list(range(1, len(prog.nodes)))     # a chain: one tensor everywhere
    a = x.exp()
    prog = linearize([(a + a.sum(1, keepdim=True)).lazydata])
    assert [n.op for n in prog.nodes] == ["MUL", "EXP2", "RSUM", "EXPAND", "ADD"]
    # one tensor flows after MUL and after EXP2; from the sum on, ``a`` and the sum both do
    assert regions.cuts(prog) == [1, 2]


def test_no_cut_materializes_a_broadcast():
    """A product of broadcasts before its sum is the only tensor flowing on when both operands are
    computed from realized buffers (a first attention layer's q k^T): no cut there -- it would
    write the product at many times its data's size instead of fusing it into the sum."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 8), dtype=np.float32)).realize()
    w = Tensor(rng.standard_normal((8, 5), dtype=np.float32)).realize()
    a, b = (x * 2).exp(), (w + 1).exp()
    z = ((a.reshape(4, 8, 1) * b.reshape(1, 8, 5)).sum(1) + 1).exp()
    prog = linearize([z.lazydata])
    ops = [n.op for n in prog.nodes]
    mul = max(i for i, op in enumerate(ops) if op == "MUL" and prog.nodes[i].shape == (4, 8, 5))
    assert ops[mul + 1] == "RSUM"
    c = regions.cuts(prog)
    assert mul + 1 not in c                 # after the product: it alone flows on, but it is a broadcast
    assert mul + 2 in c                     # after the sum: the sum alone, no larger than its data


def _post_norm(x: Tensor, xn: np.ndarray, n: int, seed: int = 3) -> tuple[Tensor, np.ndarray]:
    """``n`` post-norm encoder layers (single-head attention, a ReLU MLP, layer norms without
    affine) on eqgrad and NumPy."""
    rng = np.random.default_rng(seed)
    def ln(t): return (t - t.mean(-1, keepdims=True)) / np.sqrt(((t - t.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True) + 1e-5)
    for _ in range(n):
        wq, w1 = ((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(2))
        q = x @ Tensor(wq)
        x = F.layer_norm(x + (q @ q.transpose(1, 2)).softmax(-1) @ q, (D,))
        x = F.layer_norm(x + (x @ Tensor(w1)).relu(), (D,))
        qn = xn @ wq
        s = qn @ qn.transpose(0, 2, 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        xn = ln(xn + (e / e.sum(-1, keepdims=True)) @ qn)
        xn = ln(xn + np.maximum(xn @ w1, 0))
    return x, xn


def test_regions_keep_a_layer_norm_and_a_softmax_in_one_kernel_each(fresh, monkeypatch):
    """A post-norm encoder's layer norm has single-tensor points inside it (``x - mean`` alone flows
    on to the variance and the output): cut there, each norm ran as 3 kernels and each softmax as 2.
    Regions are cut only where the tensor flowing on is read by or after a contraction
    (``worth_cutting``), so the plan by regions has no more kernels than the plan of the whole
    program, and the numbers are NumPy's. (Both planned without greedy's rows phase, which fuses
    the whole program's norms into their readers across those very points -- 28 -> 13 kernels
    here, at D = 32 -- what separately planned regions cannot: the cuts are what this checks.)"""
    from eqgrad.extract.greedy import GreedyExtractor
    monkeypatch.setattr(GreedyExtractor, "_rows_phase", lambda self, st, cur, deadline, taken=None: (st, cur, ""))
    x0 = np.random.default_rng(4).standard_normal((2, 6, D)).astype(np.float32)
    x, want = _post_norm(Tensor(x0), x0, 4)
    prog = program([x])
    assert regions.split(prog) is not None
    assert len(regions.worth_cutting(prog)) < len(regions.cuts(prog))
    got = run([x])[0]
    plan = engine.last_plan.plan
    assert any("planned by regions" in note for note in plan.notes), plan.notes
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    by_regions = len(plan.kernels)
    engine.clear_cache()
    _REGION_PLANS.clear()
    monkeypatch.setattr(regions, "split", lambda prog, max_nodes=None: None)
    x, _ = _post_norm(Tensor(x0), x0, 4)
    np.testing.assert_allclose(run([x])[0], want, rtol=1e-4, atol=1e-4)
    whole = len(engine.last_plan.plan.kernels)
    assert by_regions <= whole, (by_regions, whole)


def test_a_first_attention_layer_fuses_its_product_into_its_sum(fresh):
    """Layers of single-head attention over a realized input, planned by regions: the first
    layer's q k^T and p v are fused contractions as in the others, no buffer the size of a
    broadcast product is written, and the numbers are NumPy's."""
    rng = np.random.default_rng(2)
    B, T, E, n = 2, 6, 16, 6
    x0 = rng.standard_normal((B, T, E)).astype(np.float32)
    ws = [[(rng.standard_normal((E, E)) / 4).astype(np.float32) for _ in range(3)] for _ in range(n)]
    x, xn = Tensor(x0), x0
    for wq, wk, wv in ws:
        q, k, v = x @ Tensor(wq), x @ Tensor(wk), x @ Tensor(wv)
        x = x + (q @ k.transpose(1, 2)).softmax(-1) @ v
        s = xn @ wq @ (xn @ wk).transpose(0, 2, 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        xn = xn + (e / e.sum(-1, keepdims=True)) @ (xn @ wv)
    assert regions.split(program([x])) is not None
    got = run([x])[0]
    plan = engine.last_plan.plan
    assert any("planned by regions" in note for note in plan.notes), plan.notes
    product = B * T * T * E
    written = [np.prod(plan.buffers[k.out][0]) for k in plan.kernels]
    assert max(written) < product, sorted(written)[-3:]
    np.testing.assert_allclose(got, xn, rtol=1e-4, atol=1e-4)


def test_repeated_blocks_plan_once_and_give_the_numbers_of_the_whole_program(fresh, monkeypatch):
    ts, want = forward(12)
    s0 = GlobalCounters.saturations
    got = run(ts)
    plan = engine.last_plan.plan
    assert any("planned by regions" in n for n in plan.notes), plan.notes
    check_plan(plan)
    regs = regions.split(program(forward(12)[0]))
    distinct = len({r.program.key for r in regs})
    assert GlobalCounters.saturations - s0 == distinct < len(regs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("EQGRAD_REGIONS", "0")
    engine.clear_cache()
    whole = run(forward(12)[0])
    assert not any("planned by regions" in n for n in engine.last_plan.plan.notes)
    for a, b in zip(got, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_deeper_model_reuses_the_regions_a_shallower_one_planned(fresh):
    run(forward(12)[0])
    s0 = GlobalCounters.saturations
    ts, want = forward(20, seed=3)
    got = run(ts)
    assert GlobalCounters.saturations == s0, "every region of the deeper model was planned already"
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_activations_requested_mid_model_are_outputs_of_their_region(fresh):
    ts, want = forward(12, keep=(2, 5, 9))
    got = run(ts)
    assert any("planned by regions" in n for n in engine.last_plan.plan.notes)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_small_programs_training_steps_and_chains_plan_whole():
    assert regions.split(program(forward(12)[0])) is not None
    assert regions.split(program(forward(4)[0])) is None                     # the repeat spares too little
    x = Tensor(np.ones((8, 8), np.float32)).realize()
    for _ in range(300):
        x = (x * 1.01 + 0.5).sin()
    assert regions.split(program([x])) is None                               # no reduction: one region
    assert regions.split(program([x]), max_nodes=1000) is None               # ... that fits a kernel
    ws = [Tensor(w, requires_grad=True) for w, _ in weights(8)]
    h = Tensor(np.ones((4, D), np.float32))
    for w in ws:
        h = (h @ w).relu()
    h.sum().backward()
    assert regions.split(program([w.grad for w in ws])) is None              # its repeats spare too little


def _chain(n: int) -> tuple[Tensor, np.ndarray]:
    x0 = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    x, xn = Tensor(x0).realize(), x0
    for i in range(n):
        x = (x * 1.01 + 0.5).sin().transpose(0, 1) if i % 2 else (x * 1.01 + 0.5).sin()
        xn = np.sin(xn * np.float32(1.01) + np.float32(0.5)).astype(np.float32)
        xn = xn.T if i % 2 else xn
    return x, xn


def test_a_long_elementwise_chain_is_cut_where_the_kernel_cap_would_cut_it(fresh, monkeypatch):
    """An elementwise chain longer than the largest kernel body (DeviceParams.max_nodes) is cut by
    the extractor anyway; where it repeats, regions cut it every largest multiple of its period that
    fits the cap (a short gap joins the repeat next to it), so one region is saturated and
    extracted for all its repeats -- with the kernels of the whole program's plan, near its
    predicted time, and the same numbers. (A cap of 40 keeps the chain short; the engine reads the
    session's cap.)"""
    from eqgrad.extract import DeviceParams, params_for, using
    cap = DeviceParams(**{**params_for("LLVM").__dict__, "max_nodes": 40})
    x, want = _chain(100)                                        # 7 nodes a repeat of 2 steps: 350 nodes
    prog = program([x])
    assert regions.split(prog) is None                           # no cap given: planned whole
    regs = regions.split(prog, max_nodes=40)
    assert regs is not None and all(r.end - r.start <= 40 for r in regs)
    assert len({r.program.key for r in regs}) <= 3 < len(regs)
    with using(params=cap):
        got = run([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        plan = engine.current_session().last_plan.plan
        assert "planned by regions" in plan.notes[0]
        check_plan(plan)
        engine.clear_cache()
        _REGION_PLANS.clear()
        monkeypatch.setenv("EQGRAD_REGIONS", "0")
        x, _ = _chain(100)
        np.testing.assert_allclose(run([x])[0], got, rtol=1e-6, atol=1e-6)
        whole = engine.current_session().last_plan.plan
    assert len(plan.kernels) <= len(whole.kernels) + 1
    assert plan.predicted <= whole.predicted * 1.15


def _train_step(n: int, seed: int = 0) -> tuple[list[Tensor], list[np.ndarray]]:
    """An n-layer ReLU MLP's gradients and SGD-with-momentum updates (as tensors), and NumPy's."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(n)]
    ms = [rng.standard_normal((D, D)).astype(np.float32) * 0.1 for _ in range(n)]
    x0 = rng.standard_normal((4, D)).astype(np.float32)
    wt = [Tensor(w, requires_grad=True) for w in ws]
    h = Tensor(x0)
    for w in wt:
        h = (h @ w).relu()
    (h * h).sum().backward()
    outs = []
    for w, m in zip(wt, ms):
        mom = Tensor(m) * 0.9 + w.grad
        outs += [w.grad, mom, w.detach() - mom * 0.01]
    # NumPy: forward, then backward layer by layer
    acts, hn = [x0], x0
    for w in ws:
        hn = np.maximum(hn @ w, 0)
        acts.append(hn)
    g, grads = 2 * acts[-1], [None] * n
    for i in range(n - 1, -1, -1):
        g = g * (acts[i + 1] > 0)
        grads[i] = acts[i].T @ g
        g = g @ ws[i].T
    want = []
    for w, m, gr in zip(ws, ms, grads):
        mom = m * np.float32(0.9) + gr
        want += [gr, mom, w - mom * np.float32(0.01)]
    return outs, want


def test_a_training_step_plans_its_repeated_layers_once(fresh, monkeypatch):
    """A training step has no single-tensor cuts, but its layers repeat in the program's order
    (each layer's forward, then each backward, then each update): ``periodic`` cuts the repeats,
    the distinct ones are planned once, and the numbers are the whole plan's and NumPy's. No cut
    materializes a view or a broadcast (a weight gradient's outer product): later regions
    recompute those from the data they are made of."""
    ts, want = _train_step(14)
    prog = program(ts)
    assert regions.cuts(prog) == [] or regions._split_at_cuts(prog) is None
    found = regions.periodic(prog)
    assert found is not None
    bounds, inline = found
    regs = regions.split(prog)
    assert regs is not None and len({r.program.key for r in regs}) < len(regs) - 8
    for r in regs:          # region outputs: never a view or broadcast unless the program outputs it
        assert all(not inline[i] or i in prog.roots for i in r.roots)
    s0 = GlobalCounters.saturations
    got = run(ts)
    assert any("planned by regions" in n for n in engine.last_plan.plan.notes)
    assert GlobalCounters.saturations - s0 == len({r.program.key for r in regs})
    kernels, predicted = len(engine.last_plan.plan.kernels), engine.last_plan.plan.predicted
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("EQGRAD_REGIONS", "0")
    engine.clear_cache()
    whole = run(_train_step(14)[0])
    for a, b in zip(got, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # what the cuts cost the plan: a few more kernels, a few per cent of predicted time at most
    plan = engine.last_plan.plan
    assert kernels <= len(plan.kernels) * 1.25 and predicted <= plan.predicted * 1.10, \
        (kernels, len(plan.kernels), predicted, plan.predicted)


def test_explain_shows_the_stitched_plan_realize_runs_and_whole_plans_it_whole(fresh):
    """explain() of a program of repeated layers shows the plan realize runs (stitched from its
    regions: no e-graph, no alternatives, provenance said to need whole=True) without planning the
    program again; explain(whole=True) plans it whole, with its e-graph and provenance, and realize
    then runs that plan."""
    from eqgrad.tools.explain import explain
    ts, want = forward(12)
    prog = program(ts)
    assert regions.split(prog) is not None
    GlobalCounters.reset()
    ex = explain(*ts)
    assert GlobalCounters.plans_compiled == 1 and ex.compiled.egraph is None and regions.stitched(ex.plan)
    assert ex.provenance == {} and "whole=True" in ex.provenance_note
    text = str(ex)
    assert "planned by regions" in text and "whole=True" in text
    with pytest.raises(ValueError, match="whole=True"):
        ex.egraph_dot()
    got = run(ts)                                       # the plan explain showed: nothing compiled again
    assert GlobalCounters.plans_compiled == 1 and engine.last_plan.plan is ex.plan
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    ts, want = forward(12)
    whole = explain(*ts, whole=True)
    assert whole.compiled.egraph is not None and not regions.stitched(whole.plan) and whole.provenance
    assert "digraph egraph" in whole.egraph_dot()
    got = run(ts)
    assert engine.last_plan.plan is whole.plan
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
