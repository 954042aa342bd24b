"""Rulebook authoring: loading and validation, the soundness checker, user rulebooks, validation."""
import subprocess
import sys

import numpy as np
import pytest

import eqgrad
from eqgrad import EqgradWarning, Tensor, engine
from eqgrad.rules import rulebook
from eqgrad.tools.check import check_rule, check_rules
from eqgrad.rules.rulebook import RulebookError, all_rules, load_rulebook
from eqgrad.rules.stats import collect
from eqgrad.rules.book import RULEBOOK_DIR
from conftest import write


pytestmark = pytest.mark.usefixtures("clean_rules")     # conftest.py: the built-in rules before and after


@pytest.mark.slow
def test_every_builtin_rule_is_sound():
    results = check_rules(all_rules(), n=32)
    bad = [r for r in results if r.status in ("unsound", "untested")]
    assert not bad, "\n".join(map(str, bad))
    assert sum(r.status == "sound" for r in results) > 100


def test_unsound_add_to_mul_is_reported_with_a_counterexample(tmp_path):
    rb = load_rulebook(write(tmp_path, "bad.egg", '(ruleset bad)\n(rewrite (Add a b) (Mul a b) :ruleset bad :name "add-is-mul")\n'))
    (res,) = [check_rule(r) for r in rb.rules]
    assert res.status == "unsound"
    cx = res.counterexample
    assert cx is not None and "Add" in cx.instance and cx.inputs
    assert not np.array_equal(np.asarray(cx.lhs), np.asarray(cx.rhs))
    assert "add-is-mul" in str(res) and "left side" in str(res)


@pytest.mark.slow
def test_movement_rule_that_drops_a_permute_is_unsound(tmp_path):
    rb = load_rulebook(write(tmp_path, "drop.egg",
                             '(ruleset m)\n(rewrite (Permute (Permute x p) q) x :ruleset m :name "drop-permutes")\n'))
    (res,) = [check_rule(r) for r in rb.rules]
    assert res.status == "unsound" and "Permute" in res.counterexample.instance


def test_sound_user_rule_passes(tmp_path):
    rb = load_rulebook(write(tmp_path, "ok.egg", '(ruleset ok)\n;; x * 2 = x + x\n'
                             '(rewrite (Mul x (Const 2.0 d s)) (Add x x) :when ((!= d "bool")) :ruleset ok :name "mul2-add")\n'))
    (res,) = [check_rule(r) for r in rb.rules]
    assert res.status == "sound" and res.fired > 0


def test_finite_annotation_limits_inputs(tmp_path):
    text = ('(ruleset e)\n{ann}(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset e :name "exp2-mul")\n')
    rb = load_rulebook(write(tmp_path, "e1.egg", text.format(ann="")))
    assert check_rule(rb.rules[0]).status == "unsound"      # exp2(200) * exp2(-200) = inf * 0 = NaN, not 1
    rb = load_rulebook(write(tmp_path, "e2.egg", text.format(ann=";; check: finite\n")))
    assert check_rule(rb.rules[0]).status == "sound"


@pytest.mark.parametrize("text,match", [
    ('(ruleset r)\n(rewrite (Add a b) (Add b a) :ruleset r)\n', r"bad\.egg:2: every rule needs a name"),
    ('(ruleset r)\n\n(datatype Foo (Bar i64))\n', r"bad\.egg:3: \(datatype \.\.\.\) is not allowed"),
    ('(ruleset r)\n(rewrite (Addd a b) (Add b a) :ruleset r :name "x")\n', r"bad\.egg:2: rule 'x' calls 'Addd'"),
    ('(ruleset r)\n(rewrite (Add a b) (Add b a) :ruleset q :name "x")\n', r"bad\.egg:2: .*ruleset 'q'"),
    ('(ruleset r)\n(rewrite (Add a b) (Add b a c) :ruleset r :name "x")\n', r"bad\.egg:2: rule 'x': \(Add b a c\) -- Add takes 2 tensors"),
    ('(ruleset r)\n(rewrite (Add a b) (Add b a) :ruleset r :name "x"\n', r"bad\.egg:2: unbalanced"),
    ('(ruleset r)\n(rewrite (Add a b) (Add b a) :ruleset r :name "fuse-neg")\n', r"'fuse-neg' is already used"),
])
def test_malformed_rulebooks_fail_at_load_with_file_and_line(tmp_path, text, match):
    with pytest.raises(RulebookError, match=match):
        rulebook.use(write(tmp_path, "bad.egg", text))


EXP2_RULES = ('(ruleset mine)\n;; check: finite\n;; exp2(a) * exp2(b) = exp2(a + b)\n'
              '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')


def _exp2_count(t: Tensor) -> int:
    t.realize()
    return sum(1 for k in engine.last_plan.plan.kernels for n in k.ast.walk() if n.op == "EXP2")


def test_user_rulebook_changes_the_plan_and_unloading_restores_it(tmp_path):
    path = write(tmp_path, "mine.egg", EXP2_RULES)
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(2))
    ref = np.exp2(a.numpy()) * np.exp2(b.numpy())
    assert _exp2_count(a.exp2() * b.exp2()) == 2
    with rulebook.using(path):
        out = a.exp2() * b.exp2()
        assert _exp2_count(out) == 1
        assert engine.last_plan.report.matches["exp2-mul"] >= 1
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)
    assert _exp2_count(a.exp2() * b.exp2()) == 2


def test_rulebooks_from_the_environment(tmp_path, monkeypatch):
    d = tmp_path / "books"
    d.mkdir()
    write(d, "mine.egg", EXP2_RULES)
    monkeypatch.setenv("EQGRAD_RULEBOOKS", f"{d}@cleanup")
    a = Tensor(np.ones((4, 4), np.float32))
    assert _exp2_count(a.exp2() * (a + 1).exp2()) == 1
    monkeypatch.setenv("EQGRAD_RULEBOOKS", f"{d}@nosuchphase")
    with pytest.raises(RulebookError, match="phase 'nosuchphase' is not in the schedule"):
        (a.exp2() * a.exp2()).realize()


def test_a_custom_schedule_without_fusion(tmp_path):
    sched = write(tmp_path, "schedule.egg", ";; phase analysis\n(run-schedule (saturate analysis))\n")
    a = Tensor(np.ones((4, 4), np.float32))
    rulebook.use_schedule(sched)
    eqgrad.GlobalCounters.reset()
    ((a + 1) * 2).realize()
    assert eqgrad.GlobalCounters.kernel_count == 2
    rulebook.use_schedule(None)
    eqgrad.GlobalCounters.reset()
    ((a + 1) * 2).realize()
    assert eqgrad.GlobalCounters.kernel_count == 1


AC_RULES = """(ruleset ac)
(rewrite (Add a b) (Add b a) :ruleset ac :name "comm-add")
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset ac :name "assoc-add")
(rewrite (Mul a b) (Mul b a) :ruleset ac :name "comm-mul")
(rewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset ac :name "distribute")
"""


def test_exploding_user_rulebook_stops_inside_the_limits(tmp_path):
    path = write(tmp_path, "ac.egg", AC_RULES)
    rulebook.use(path, iterations=10)
    x = Tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    y, ref = x, x.numpy()
    for i in range(14):
        y = (y + float(i)) * (x + 0.5)
        ref = (ref + np.float32(i)) * (x.numpy() + np.float32(0.5))
    with eqgrad.Context(EGRAPH_NODES=10_000), pytest.warns(EqgradWarning, match="node limit|timeout|worker died"):
        got = y.numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-3)
    assert engine.last_plan.report.stop_reason in ("node limit", "timeout", "worker died")


def test_validation_names_the_unsound_rule(tmp_path):
    path = write(tmp_path, "bad.egg", '(ruleset bad)\n(rewrite (Mul (Exp2 a) b) (Exp2 a) :ruleset bad :name "drop-factor")\n')
    rulebook.use(path)
    x = Tensor(np.full((3, 3), 2.0, np.float32))
    with eqgrad.Context(VALIDATE=1), pytest.raises(engine.ValidationError, match=r"drop-factor \(.*bad\.egg:2\)"):
        (x.exp2() * 3.0).realize()


def test_statistics_per_rule_and_phase():
    x = Tensor(np.ones((4, 4), np.float32))
    with collect() as st:
        (x * 1.0 + 2).realize()
        ((x * 1.0).exp2() - 3).realize()
    assert st.saturations == 2 and st.matches.get("mul-one", 0) >= 2
    assert set(st.phase_seconds) >= {"analysis", "movement", "algebra", "fusion"}
    text = st.report([r.name for r in all_rules()])
    assert "matched" in text and "never matched" in text


def test_command_line_check_reports_unsound_rules(tmp_path):
    path = write(tmp_path, "bad.egg", '(ruleset bad)\n(rewrite (Add a b) (Mul a b) :ruleset bad :name "add-is-mul")\n')
    out = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", str(path)], capture_output=True, text=True)
    assert out.returncode == 1 and "UNSOUND" in out.stdout and "add-is-mul" in out.stdout


def test_command_line_check_of_a_builtin_rulebook_checks_it():
    """`rules check rulebooks/movement.egg` said every rule name was "already used" (the file was
    validated as a user rulebook next to itself)."""
    out = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", "-n", "4", str(RULEBOOK_DIR / "movement.egg")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "movement.egg" in out.stdout and "unsound" not in out.stdout.lower()
