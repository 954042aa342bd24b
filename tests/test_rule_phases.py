"""The phase trap: a user rule sees the program in the form its patterns expect in every
phase (the program is inserted with every argument wrapped in Realize until fusion: the rule
runs with through-Realize variants), the built-in rules re-run over what it adds, and a user
rule that matches nothing is reported once with its phase."""
import warnings

import numpy as np
import pytest

import eqgrad
import eqgrad.rules.rulebook as rulebook
from eqgrad import Tensor, engine
from eqgrad.counters import EqgradWarning
from eqgrad.rules.book import through_realize
from eqgrad.rules.rulebook import load_rulebook

EXP2 = ('(ruleset mine)\n;; check: finite\n'
        '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')
# its output holds -(-a), which only the built-in algebra rule removes
EXP2_NEGNEG = ('(ruleset mine)\n;; check: finite\n'
               '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add (Neg (Neg a)) b)) :ruleset mine :name "exp2-mul-nn")\n')


def _ops(t: Tensor) -> list[str]:
    t.realize()
    return [n.op for k in engine.last_plan.plan.kernels for n in k.ast.walk()]


@pytest.fixture
def ab():
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(2))


@pytest.mark.parametrize("phase", ["movement", "algebra", "fusion", "cleanup"])
def test_a_user_rule_matches_in_every_phase(tmp_path, ab, phase):
    a, b = ab
    p = tmp_path / "mine.egg"
    p.write_text(EXP2)
    ref = np.exp2(a.numpy() * 2) * np.exp2(b.numpy() + 1)
    with rulebook.using(p, phase=phase):
        out = (a * 2).exp2() * (b + 1).exp2()
        assert _ops(out).count("EXP2") == 1, phase           # before: 2 in movement and algebra (0 matches)
        assert engine.last_plan.report.matches["exp2-mul"] >= 1
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)


@pytest.mark.parametrize("phase", ["algebra", "cleanup"])
def test_builtin_rules_rerun_over_what_a_user_rule_adds(tmp_path, ab, phase):
    a, b = ab
    p = tmp_path / "nn.egg"
    p.write_text(EXP2_NEGNEG)
    with rulebook.using(p, phase=phase):
        ops = _ops((a * 2).exp2() * (b + 1).exp2())
    assert ops.count("EXP2") == 1 and "NEG" not in ops        # the built-in -(-x) -> x ran on the output


def test_variants_are_generated_per_nested_call(tmp_path):
    p = tmp_path / "mine.egg"
    p.write_text(EXP2)
    text = through_realize(load_rulebook(p).rules)
    assert text.splitlines() == [
        '(rewrite (Mul (Realize (Exp2 a)) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul~realize1")',
        '(rewrite (Mul (Exp2 a) (Realize (Exp2 b))) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul~realize2")',
        '(rewrite (Mul (Realize (Exp2 a)) (Realize (Exp2 b))) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul~realize3")']


def test_a_rule_that_matches_nothing_is_reported_once_with_its_phase(tmp_path):
    p = tmp_path / "sq.egg"
    p.write_text('(ruleset mine)\n(rewrite (Sqrt (Sqrt (Sqrt x))) (Sqrt (Sqrt (Sqrt x))) :ruleset mine :name "never")\n')
    x = Tensor(np.ones((4, 4), np.float32))
    with rulebook.using(p, phase="algebra"):
        with pytest.warns(EqgradWarning, match=r"your rule 'never' \(.*sq\.egg:2\), run in phase 'algebra', matched nothing"):
            (x + 1).exp2().realize()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (x * 3).exp2().realize()                        # reported once


def test_a_birewrite_counts_both_directions_under_its_name(tmp_path, ab):
    a, b = ab
    p = tmp_path / "bi.egg"
    p.write_text('(ruleset mine)\n;; check: finite\n'
                 '(birewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-bi")\n')
    with rulebook.using(p, phase="cleanup"), warnings.catch_warnings():
        warnings.simplefilter("error")                   # not reported as unmatched
        ((a * 2).exp2() * (b + 1).exp2()).realize()
    rep = engine.last_plan.report
    assert rep.rule_matches["exp2-bi"] == sum(v for k, v in rep.matches.items() if k.startswith("exp2-bi"))
    assert "exp2-bi=>" not in rep.rule_matches and rep.matches.get("exp2-bi=>", 0) >= 1
