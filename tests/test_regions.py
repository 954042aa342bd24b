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
    ws = [Tensor(w, requires_grad=True) for w, _ in weights(8)]
    h = Tensor(np.ones((4, D), np.float32))
    for w in ws:
        h = (h @ w).relu()
    h.sum().backward()
    assert regions.split(program([w.grad for w in ws])) is None                                       # the backward reads every layer
