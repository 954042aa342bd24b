"""docs/rulebooks.md's three worked examples, step by step: each rule written, checked (the verdicts the
guide shows, the failing drafts included), tried on its program with ``rules try``, and its results
compared with NumPy."""
import textwrap

import numpy as np
import pytest

import eqgrad.rules.rulebook as rulebook
from eqgrad.rules.book import load_rulebook
from eqgrad.tools.check import check_rule
from eqgrad.tools.trying import load_program, try_rulebook

EXP2_MUL = """\
(ruleset mine)
;; check: finite
;; exp2(a) * exp2(b) = exp2(a + b): one transcendental instead of two; sound away from overflow.
(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")
"""
EXP2_PROG = """\
import numpy as np
from eqgrad import Tensor

def program():
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((256, 256)).astype(np.float32)) for _ in range(2))
    return a.exp2() * b.exp2()
"""

SHRINK_OF_PAD = """\
(ruleset mine)

;; check: exact
;; for-rank 1..5
(rewrite (Shrink (Pad x (vec-of p*) (vec-of q*)) (vec-of p*) (vec-of e*)) x
         :when ((= (shape x) (vec-of n*)) (= e* (+ p* n*))) :ruleset mine :name "shrink-of-pad")
"""
PAD_PROG = """\
import numpy as np
from eqgrad import Tensor

def program():
    x = Tensor(np.random.default_rng(0).standard_normal((16, 32, 8)).astype(np.float32))
    padded = (x + 1).pad(((1, 1), (2, 0), (0, 3)))
    return padded.shrink(((1, 17), (2, 34), (0, 8))) * 2
"""

SUM_OF_NEG_DRAFT = """\
(ruleset mine)
(rewrite (Sum (Realize (Neg x)) ax) (Neg (Sum x ax)) :ruleset mine :name "sum-of-neg")
"""
SUM_OF_NEG_UNGUARDED = """\
(ruleset mine)
(rule ((= e (Sum (Realize (Neg x)) ax)) (= s (shape e)) (= d (dtype e)))
      ((union e (Add (Neg (Sum x ax)) (Const 0.0 d s)))) :ruleset mine :name "sum-of-neg")
"""
SUM_OF_NEG = """\
(ruleset mine)

;; sum(-x) = 0 - sum(x), across the kernel boundary of the unfused program: the negation leaves
;; the n-element loop for the reduced rows. (Not -sum(x): a row that sums to +0 would give -0.)
(rule ((= e (Sum (Realize (Neg x)) ax)) (= s (shape e)) (= d (dtype e)) (= d "float32"))
      ((union e (Add (Neg (Sum x ax)) (Const 0.0 d s)))) :ruleset mine :name "sum-of-neg")
"""
SUMNEG_PROG = """\
import numpy as np
from eqgrad import Tensor

def program():
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((256, 128)).astype(np.float32)) for _ in range(2))
    return (-(a * b)).sum(-1)
"""


def _files(tmp_path, egg: str, prog: str):
    rb, pr = tmp_path / "rules.egg", tmp_path / "prog.py"
    rb.write_text(egg)
    pr.write_text(prog)
    return rb, load_program(str(pr))


def _verdicts(path) -> list[str]:
    return [check_rule(r).status for r in load_rulebook(path).rules]


def _ops(plan) -> list[str]:
    return [n.op for k in plan.kernels for n in k.ast.walk()]


def _realized(path, program, phase):
    with rulebook.using(path, phase=phase):
        return program().numpy()


def test_1_algebraic_rule(tmp_path):
    rb, program = _files(tmp_path, EXP2_MUL, EXP2_PROG)
    assert _verdicts(rb) == ["sound"]
    (tmp_path / "raw.egg").write_text(EXP2_MUL.replace(";; check: finite\n", ""))
    assert _verdicts(tmp_path / "raw.egg") == ["unsound"]          # exp2(-inf) * exp2(huge) = 0 * inf
    res = try_rulebook(rb, program, runs=1)
    assert res.matches["exp2-mul"] >= 1 and res.changed
    assert _ops(res.before.plan).count("EXP2") == 2 and _ops(res.after.plan).count("EXP2") == 1
    assert sorted(res.chosen["exp2-mul"]) == ["ADD", "EXP2"]
    assert res.after.predicted < res.before.predicted
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(_realized(rb, program, "cleanup"), np.exp2(a) * np.exp2(b), rtol=1e-5)


def test_2_rank_generic_rule(tmp_path):
    rb, program = _files(tmp_path, SHRINK_OF_PAD, PAD_PROG)
    assert _verdicts(rb) == ["sound"] * 5                            # ranks 1..5, each on its own rank
    res = try_rulebook(rb, program, phase="movement", runs=1)
    assert list(res.matches) == ["shrink-of-pad"] and res.matches["shrink-of-pad"] >= 1 and res.changed
    assert {"PAD", "SHRINK"} <= set(_ops(res.before.plan)) and not {"PAD", "SHRINK"} & set(_ops(res.after.plan))
    x = np.random.default_rng(0).standard_normal((16, 32, 8)).astype(np.float32)
    np.testing.assert_allclose(_realized(rb, program, "movement"), (x + 1) * 2, rtol=1e-6)


def test_3_fusion_shaped_rule(tmp_path):
    for draft in (SUM_OF_NEG_DRAFT, SUM_OF_NEG_UNGUARDED):            # -0 against +0; a bool instance
        (tmp_path / "draft.egg").write_text(draft)
        assert _verdicts(tmp_path / "draft.egg") == ["unsound"], draft
    rb, program = _files(tmp_path, SUM_OF_NEG, SUMNEG_PROG)
    assert _verdicts(rb) == ["sound"]
    res = try_rulebook(rb, program, phase="algebra", runs=1)
    assert res.matches["sum-of-neg"] == 1 and res.changed and sorted(res.chosen["sum-of-neg"]) == ["ADD", "NEG"]
    (k,) = res.after.plan.kernels                                     # one kernel: NEG after the reduction
    ops = [n.op for n in k.ast.walk()]
    assert ops.index("RSUM") < ops.index("NEG"), k.ast.render()     # walk lists producers first
    assert res.after.plan.kernels[0].flops < res.before.plan.kernels[0].flops
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 128)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(_realized(rb, program, "algebra"), (-(a * b)).sum(-1), rtol=1e-4, atol=1e-5)
