"""Sessions: each owns its plan cache, rules, extraction settings and random generator; the module
functions act on the current one (docs/engine.md)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.engine import Session, current_session, default_session
from eqgrad.extract import ExtractSettings
from eqgrad.rules import rulebook

EXP2_RULES = ('(ruleset mine)\n;; check: finite\n;; exp2(a) * exp2(b) = exp2(a + b)\n'
              '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')
NO_FUSION = ";; phase analysis\n(run-schedule (saturate analysis))\n"


pytestmark = pytest.mark.usefixtures("clean_rules")     # conftest.py: the built-in rules before and after


@pytest.fixture
def mine(tmp_path):
    p = tmp_path / "mine.egg"
    p.write_text(EXP2_RULES)
    return p


def _exp2s(cp) -> int:
    return sum(1 for k in cp.plan.kernels for n in k.ast.walk() if n.op == "EXP2")


def _ab():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2)]


def test_two_sessions_with_different_rules_give_their_own_plans(mine):
    a, b = _ab()
    ruled = Session(rulebooks=[mine])
    plain = Session()
    outs = {}
    for name, s in (("ruled", ruled), ("plain", plain), ("ruled again", ruled)):
        with s:
            out = Tensor(a).exp2() * Tensor(b).exp2()
            outs[name] = (out.numpy(), _exp2s(engine.last_plan), engine.last_plan.report.matches.get("exp2-mul", 0))
    assert outs["ruled"][1] == 1 and outs["ruled"][2] >= 1        # one EXP2: the rule fired
    assert outs["plain"][1:] == (2, 0)
    assert outs["ruled again"][1] == 1
    for got, _, _ in outs.values():
        np.testing.assert_allclose(got, np.exp2(a) * np.exp2(b), rtol=1e-5)
    # the default session was not touched by either
    assert rulebook.active_config().key == default_session().rules.config().key != ruled.rules.config().key
    assert _exp2s(engine.plan_for([(Tensor(a).exp2() * Tensor(b).exp2()).lazydata])[0]) == 2


def test_sessions_in_two_threads_at_once_keep_their_rules(tmp_path, mine):
    sched = tmp_path / "schedule.egg"
    sched.write_text(NO_FUSION)
    fused, unfused = Session(), Session(schedule=sched)
    a, _ = _ab()
    kernels: dict[str, set[int]] = {"fused": set(), "unfused": set()}
    barrier = threading.Barrier(2, timeout=60)
    errors = []

    def run(name, s):
        try:
            barrier.wait()
            with s:
                for i in range(20):
                    out = (Tensor(a) + 1) * 2
                    np.testing.assert_allclose(out.numpy(), (a + 1) * 2)
                    kernels[name].add(len(s.last_plan.plan.kernels))
        except BaseException as e:        # noqa: BLE001 -- re-raised below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(n, s)) for n, s in (("fused", fused), ("unfused", unfused))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not errors, errors
    assert kernels == {"fused": {1}, "unfused": {2}}
    assert len(fused.plan_cache) == len(unfused.plan_cache) == 1


def test_module_names_follow_the_current_session():
    s = Session()
    assert current_session() is default_session()
    with s:
        assert current_session() is s
        (Tensor(np.ones(3, np.float32)) + 1).realize()
        assert engine.last_plan is s.last_plan is not None
        assert engine._plan_cache is s.plan_cache and len(s.plan_cache) == 1
        assert engine.capture_hooks is s.capture_hooks
        with default_session():                        # sessions nest
            assert current_session() is default_session()
        engine.clear_cache()
        assert len(s.plan_cache) == 0
    assert current_session() is default_session() and engine._plan_cache is default_session().plan_cache


def test_each_session_compiles_its_own_plans():
    s1, s2 = Session(), Session()
    x = np.arange(6, dtype=np.float32)
    GlobalCounters.reset()
    for s in (s1, s2, s1, s2):
        s.realize(y := Tensor(x) * 3 - 1)
        np.testing.assert_array_equal(y.numpy(), x * 3 - 1)
    assert GlobalCounters.plans_compiled == 2 and len(s1.plan_cache) == len(s2.plan_cache) == 1


def test_a_session_chooses_its_extractor_and_cost():
    seen = []

    def cost(stats, params):
        seen.append(stats)
        return float(stats.nbytes)
    s = Session(extractor="improve", cost_fn=cost)
    s.realize(Tensor(np.ones((4, 4), np.float32)).exp().sum())
    assert s.last_plan.result.extractor == "improve" and seen
    n = len(seen)
    (Tensor(np.ones((4, 4), np.float32)).exp().sum() + 1).realize()     # the default session: not this cost
    assert len(seen) == n and engine.last_plan.result.extractor == eqgrad.config.EXTRACTOR.value
    with pytest.raises(ValueError, match="extractor EQGRAD_EXTRACTOR: expected greedy, improve, ilp or measured"):
        Session(extractor="best")
    with pytest.raises(ValueError, match="either extraction="):
        Session(extractor="ilp", extraction=ExtractSettings())


def test_session_realize_commits_assigns():
    s = Session()
    w = Tensor(np.ones(3, np.float32)).realize()
    w.assign(w * 5)
    s.realize(w)
    assert not eqgrad.frontend.tensor.pending_assigns()
    assert w.tolist() == [5.0, 5.0, 5.0] and len(s.plan_cache) == 1


def test_each_session_has_its_own_generator():
    s = Session(seed=7)
    eqgrad.manual_seed(1)
    first = Tensor.randn(4).numpy()
    with s:
        mine = Tensor.randn(4).numpy()
        eqgrad.manual_seed(7)                        # seeds the current session's generator
        again = Tensor.randn(4).numpy()
    eqgrad.manual_seed(1)
    np.testing.assert_array_equal(Tensor.randn(4).numpy(), first)      # the default one, untouched
    np.testing.assert_array_equal(mine, again)
    np.testing.assert_array_equal(mine, np.random.default_rng(7).standard_normal(4, dtype=np.float32))


def test_a_jit_captures_on_the_current_session():
    s = Session()

    @eqgrad.jit
    def f(x):
        return (x + 2).realize()
    with s:
        for i in range(4):
            assert f(Tensor(np.full(2, float(i), np.float32))).tolist() == [i + 2.0] * 2
        assert s.capture_hooks == [] and default_session().capture_hooks == []
    assert f.replays == 2 and len(s.plan_cache) == 1


def test_session_blocks_exit_in_order():
    s1, s2 = Session(), Session()
    s1.__enter__()
    s2.__enter__()
    with pytest.raises(RuntimeError, match="in the order they were entered"):
        s1.__exit__(None, None, None)
    s2.__exit__(None, None, None)
    s1.__exit__(None, None, None)
    assert current_session() is default_session()
