"""explain() names, for each chosen e-node, the rule (or the input) that introduced it;
``python -m eqgrad rules try RULEBOOK --program FILE.py`` shows what a rulebook does to a program."""
import textwrap

import numpy as np
import pytest

import eqgrad
import eqgrad.rules.rulebook as rulebook
from eqgrad import Tensor
from eqgrad.rules.provenance import INPUT, instrument, instrument_text
from eqgrad.rules.book import builtin_config
from eqgrad.tools import cli
from eqgrad.tools.trying import load_program, try_rulebook

EXP2 = ('(ruleset mine)\n;; check: finite\n'
        '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')


def _ab():
    rng = np.random.default_rng(0)
    return [Tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(2)]


def test_a_rewrite_gets_a_companion_with_its_pattern_guards_and_ruleset():
    text = instrument_text('(rewrite (Mul x (Const 1.0 d s)) (Neg (Neg x)) :when ((= (dtype x) "float32")) '
                           ':ruleset algebra :name "r")\n', "t.egg")
    lines = text.splitlines()
    assert lines[0].startswith("(rewrite (Mul x")                       # the rule itself, unchanged
    assert lines[1] == ('(rule ((= __prov (Mul x (Const 1.0 d s))) (= (dtype x) "float32")) '
                        '((set (prov-of-Neg x) "r") (set (prov-of-Neg (Neg x)) "r")) :ruleset algebra :name "r~prov")')


def test_a_rule_records_the_terms_of_its_actions():
    text = instrument_text('(rule ((= e (Exp2 a))) ((union e (Exp2 (Neg (Neg a))))) :ruleset r :name "q")\n', "t.egg")
    assert '(set (prov-of-Neg a) "q")' in text and '(set (prov-of-Exp2 (Neg (Neg a))) "q")' in text


def test_instrumented_rules_give_the_same_plan_and_tag_every_chosen_node():
    x = Tensor(np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32))
    y = x.softmax(-1)
    ex = eqgrad.explain(y)
    assert ex.provenance and not ex.provenance_note
    tags = [r for nodes in ex.provenance.values() for _, r in nodes]
    assert "?" not in tags and INPUT in tags
    used = ex.rules_used()
    assert any(r.startswith("fuse-") for r in used), used        # one kernel: the fusion rules made it
    assert "rules in the chosen plan: fuse-" in str(ex) and "introduced by:" in str(ex)
    assert eqgrad.explain(y, provenance=False).provenance is None
    np.testing.assert_allclose(y.numpy(), np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
                               / np.exp(x.numpy() - x.numpy().max(-1, keepdims=True)).sum(-1, keepdims=True),
                               rtol=1e-5)


def test_a_user_rules_nodes_are_named(tmp_path):
    p = tmp_path / "mine.egg"
    p.write_text(EXP2)
    a, b = _ab()
    with rulebook.using(p, phase="algebra"):
        out = (a * 2).exp2() * (b + 1).exp2()
        ex = eqgrad.explain(out)
        assert ex.rules_used().get("exp2-mul", 0) >= 1, str(ex)      # variants ~realizeK fold into the name
        assert "exp2-mul" in str(ex)
        np.testing.assert_allclose(out.numpy(), np.exp2(a.numpy() * 2) * np.exp2(b.numpy() + 1), rtol=1e-5)


def test_the_instrumented_config_keeps_the_schedule_and_adds_a_first_phase():
    cfg = instrument(builtin_config())
    assert cfg.key != builtin_config().key and not cfg.generated
    assert cfg.schedule_text.index(";; phase provenance") < cfg.schedule_text.index(";; phase analysis")


PROGRAM = textwrap.dedent("""
    import numpy as np
    from eqgrad import Tensor

    def program():
        rng = np.random.default_rng(0)
        a, b = (Tensor(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(2))
        return (a * 2).exp2() * (b + 1).exp2()

    def other():
        return program() + 1
""")


def test_rules_try_reports_matches_terms_plan_and_times(tmp_path):
    rb, prog = tmp_path / "mine.egg", tmp_path / "prog.py"
    rb.write_text(EXP2)
    prog.write_text(PROGRAM)
    res = try_rulebook(rb, load_program(str(prog)), phase="algebra", runs=3)
    assert res.matches["exp2-mul"] >= 1 and res.added.get("exp2-mul", 0) >= 1
    assert res.chosen.get("exp2-mul"), res              # the EXP2 of the sum is in the plan
    assert res.changed and len(res.after.measured) == 3 and res.after.median > 0
    text = str(res)
    for word in ("exp2-mul", "match(es)", "CHANGED", "predicted:", "measured:", "phase algebra"):
        assert word in text, text
    assert eqgrad.rules.rulebook.active_config().key == rulebook.active_config().key   # the rulebook is off again


def test_rules_try_cli(tmp_path, capsys):
    rb, prog = tmp_path / "mine.egg", tmp_path / "prog.py"
    rb.write_text(EXP2)
    prog.write_text(PROGRAM)
    assert cli.main(["rules", "try", str(rb), "--program", f"{prog}:other", "--phase", "algebra", "--runs", "1",
                     "--trace"]) == 0
    out = capsys.readouterr().out
    assert "exp2-mul" in out and "after the rulebook, e-graph growth per iteration (traced" in out
    assert "  algebra " in out.split("after the rulebook")[1]             # the phase the rule ran in, per iteration


@pytest.mark.parametrize("spec, why", [("nope.py", "no file"), ("{prog}:missing", "no function 'missing'"),
                                       ("notamodule", "expected module:function")])
def test_rules_try_bad_program(tmp_path, capsys, spec, why):
    rb, prog = tmp_path / "mine.egg", tmp_path / "prog.py"
    rb.write_text(EXP2)
    prog.write_text(PROGRAM)
    assert cli.main(["rules", "try", str(rb), "--program", spec.format(prog=prog)]) == 2
    assert why in capsys.readouterr().err
