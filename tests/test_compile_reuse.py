"""A new number or a new size reuses the compiled plan: float constants that no rule
inspects are runtime parameters (graph/program.py ``ParamLeaf``), and a program that differs from a
cached one only in sizes gets the cached plan resized (graph/resize.py, Session._cached_plan)."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine, jit
from eqgrad.engine import Session
from eqgrad.graph.program import ConstLeaf, ParamLeaf, linearize
from eqgrad.rules import rulebook


def _x(*shape: int, seed: int = 0) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()


# ------------------------------------------------------------------ parameters

def test_a_new_scalar_runs_the_cached_plan():
    x = _x(16, 16)
    engine.clear_cache()
    GlobalCounters.reset()
    for s in (0.25, 2.5, -3.75, 1e-3, 7.0):
        y = (x * s + 1).numpy()
        np.testing.assert_allclose(y, x.numpy() * np.float32(s) + 1, rtol=1e-6, atol=1e-6)   # (an FMA)
    assert GlobalCounters.plans_compiled == 1 and GlobalCounters.saturations == 1


def test_values_the_rules_name_stay_structural():
    inspected = rulebook.DEFAULT.config().inspected_constants
    assert {0.0, 1.0, -1.0} <= inspected
    x = _x(4, 4)
    prog = linearize([(x * 1.0 + 0.5).lazydata, (x * float("inf")).lazydata, (x.cast(eqgrad.int32) + 3).lazydata],
                     inspected=inspected)
    leaves = {type(r).__name__ + ":" + (repr(r.value) if isinstance(r, ConstLeaf) else str(prog.params[r.index][0]))
              for n in prog.nodes for r in n.src if isinstance(r, (ConstLeaf, ParamLeaf))}
    assert leaves == {"ConstLeaf:1.0", "ParamLeaf:0.5", "ConstLeaf:inf", "ConstLeaf:3"}
    # and x * 1 still folds away: the output is the input itself
    engine.clear_cache()
    GlobalCounters.reset()
    (x * 1.0).realize()
    assert GlobalCounters.kernel_count == 0


def test_a_value_named_by_a_user_rule_is_structural(tmp_path):
    rb = tmp_path / "two.egg"
    rb.write_text("(ruleset two)\n(rewrite (Mul x (Const 2.0 d s)) (Add x x) :ruleset two :name \"mul-two\")\n")
    s = Session(rulebooks=[(rb, "algebra")])
    assert 2.0 in s.rules.config().inspected_constants
    assert 2.0 not in rulebook.DEFAULT.config().inspected_constants
    x = _x(8)
    with s:
        y = (x * 2.0).realize()
        assert s.last_plan.report.matches.get("mul-two", 0) >= 1      # the rule saw the value
        np.testing.assert_allclose(y.numpy(), x.numpy() * 2, rtol=1e-6)
        y = (x * 3.0).realize()                                      # another value: a parameter
        assert not s.last_plan.report.matches.get("mul-two", 0)
        np.testing.assert_allclose(y.numpy(), x.numpy() * 3, rtol=1e-6)


def test_parameters_are_free_in_the_cost_model_and_never_materialized():
    x = _x(64, 64)
    engine.clear_cache()
    (x * 0.3 + 0.7).realize()
    plan = engine.last_plan.plan
    assert len(plan.kernels) == 1
    assert [s for s, _ in plan.buffers[:plan.n_inputs]] == [(64, 64), (), ()]
    # the same bytes as the plan would move with immediates: the input and the output
    assert plan.kernels[0].nbytes == 2 * 64 * 64 * 4


def test_parameters_through_autograd_and_a_jit():
    w = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)

    @jit
    def step(x: Tensor, scale: float = 0.5) -> Tensor:
        loss = ((x @ w.T) * scale).square().mean()
        loss.backward()
        out = w.grad.realize()
        w.grad = None
        return out

    xs = [_x(5, 4, seed=i) for i in range(4)]
    got = [step(x).numpy() for x in xs]
    for x, g in zip(xs, got):
        y = x.numpy() @ w.numpy().T
        ref = 2 * 0.25 * (y.T @ x.numpy()) / y.size
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)
    assert step.replays >= 2


# ------------------------------------------------------------------ new sizes

def _mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    return ((x @ w1).relu() @ w2).softmax(-1)


def _mlp_ref(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ w1, 0) @ w2
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_new_batch_size_resizes_the_plan():
    w1, w2 = _x(24, 16, seed=1), _x(16, 10, seed=2)
    engine.clear_cache()
    GlobalCounters.reset()
    for b in (8, 12, 20, 8, 33):
        x = _x(b, 24, seed=b)
        np.testing.assert_allclose(_mlp(x, w1, w2).numpy(), _mlp_ref(x.numpy(), w1.numpy(), w2.numpy()),
                                   rtol=1e-5, atol=1e-6)
    assert GlobalCounters.saturations == 1 and GlobalCounters.plans_compiled == 1
    assert GlobalCounters.plans_resized == 3              # 12, 20, 33 (the second 8 is cached)


def test_resizing_off_compiles_every_size():
    w1, w2 = _x(24, 16, seed=1), _x(16, 10, seed=2)
    engine.clear_cache()
    GlobalCounters.reset()
    with eqgrad.Context(RESIZE=0):
        for b in (8, 12):
            x = _x(b, 24, seed=b)
            np.testing.assert_allclose(_mlp(x, w1, w2).numpy(), _mlp_ref(x.numpy(), w1.numpy(), w2.numpy()),
                                       rtol=1e-5, atol=1e-6)
    assert GlobalCounters.plans_compiled == 2 and GlobalCounters.plans_resized == 0


def test_a_growing_cache_by_cat_resizes_each_step():
    rng = np.random.default_rng(0)
    k = Tensor(rng.standard_normal((1, 3, 8)).astype(np.float32)).realize()
    engine.clear_cache()
    GlobalCounters.reset()
    for t in range(6):
        q = Tensor(rng.standard_normal((1, 1, 8)).astype(np.float32))
        new = Tensor(rng.standard_normal((1, 1, 8)).astype(np.float32))
        kk = k.cat(new, dim=1)
        att = (q @ kk.transpose(1, 2) * 0.35).softmax(-1)
        out = att @ kk
        eqgrad.realize(out, kk)
        kn, qn = kk.numpy(), q.numpy()
        a = qn @ kn.transpose(0, 2, 1) * np.float32(0.35)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        np.testing.assert_allclose(out.numpy(), a @ kn, rtol=1e-5, atol=1e-6)
        k = kk
    assert GlobalCounters.plans_compiled + GlobalCounters.plans_resized == 6
    assert GlobalCounters.plans_resized >= 4


def test_explain_of_a_resized_plan_compiles_its_own_sizes():
    w1, w2 = _x(24, 16, seed=1), _x(16, 10, seed=2)
    engine.clear_cache()
    _mlp(_x(8, 24), w1, w2).realize()
    y = _mlp(_x(12, 24), w1, w2)
    ex = eqgrad.explain(y)
    assert ex.compiled.egraph is not None
    assert all(s[0] == 12 for s, _ in ex.plan.buffers[ex.plan.n_inputs:] if len(s) == 2 and s[1] in (16, 10))


# ------------------------------------------------------------------ repeated kernels lower once

def test_repeated_layers_lower_once(monkeypatch):
    from eqgrad.devices import _lowered
    from eqgrad.lower import lowering
    calls = []
    real = lowering.lower_kernel

    def counting(k, plan, upcast=None, options=None):
        calls.append(k.name)
        return real(k, plan, upcast, options)
    monkeypatch.setattr(lowering, "lower_kernel", counting)
    _lowered.clear()
    engine.clear_cache()
    rng = np.random.default_rng(0)
    ws = [Tensor(rng.standard_normal((32, 32)).astype(np.float32)).realize() for _ in range(6)]
    x = _x(8, 32)
    outs = [((x @ w).relu() * 0.5).softmax(-1) for w in ws]      # six layers of one structure, side by side
    with eqgrad.Context(BLAS=0):        # every kernel lowered (with the BLAS, the matmuls are not)
        eqgrad.realize(*outs)
    plan = engine.last_plan.plan
    # every layer's kernels have one structure: lowered once for the first layer, reused for five
    assert len(plan.kernels) % 6 == 0 and len(calls) == len(plan.kernels) // 6, (len(calls), len(plan.kernels))
    for o, w in zip(outs, ws):
        h = np.maximum(x.numpy() @ w.numpy(), 0) * 0.5
        e = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(o.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_kernels_that_differ_in_a_sign_of_zero_do_not_share_their_lowering():
    from eqgrad.devices import kernel_structure
    from eqgrad.graph.plan import Kernel, KernelPlan, KNode
    f32 = eqgrad.float32

    def plan(c: float, out: int = 1) -> KernelPlan:
        ast = KNode("ADD", (KNode("BUF", (), 0, (4,), f32), KNode("CONST", (), c, (4,), f32)), None, (4,), f32)
        bufs = [((4,), f32)] * (out + 1)
        return KernelPlan(bufs, 1, [Kernel("k0", out, ast, (0,))], [out])
    a, b, c = plan(0.0), plan(-0.0), plan(0.0, out=2)
    assert kernel_structure(a.kernels[0], a) != kernel_structure(b.kernels[0], b)
    assert kernel_structure(a.kernels[0], a) == kernel_structure(c.kernels[0], c)   # buffer ids do not matter
