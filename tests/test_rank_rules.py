"""Rank-generic rules (eqgrad/rules/ranks.py, docs/rulebooks.md "Rank-generic rules"): a rule
written once with ``;; for-rank A..B`` and starred variables is expanded at load time into one
rule per rank (``NAME@rankR``), runs and matches on real programs, is checked per rank by
``rules check``, is shown expanded by ``rules dump``, and its matches are counted as NAME's."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import eqgrad.rules.rulebook as rulebook
from eqgrad import Tensor, engine
from eqgrad.counters import EqgradWarning
from eqgrad.rules.book import through_realize
from eqgrad.rules.dump import dump_files, load_dump, write_dump
from eqgrad.rules.ranks import base_name, expand, rank_of
from eqgrad.rules.rulebook import RulebookError, load_rulebook
from conftest import write

SHRINK_OF_PAD = """\
;; check: exact
;; for-rank 1..5
(rewrite (Shrink (Pad x (vec-of p*) (vec-of q*)) (vec-of p*) (vec-of e*)) x
         :when ((= (shape x) (vec-of n*)) (= e* (+ p* n*))) :ruleset mine :name "shrink-of-pad")
"""
IDENTITY_PERMUTE = """\
;; for-rank 0..5
(rewrite (Permute x (vec-of #*)) x :ruleset mine :name "identity-permute")
"""
BOOK = "(ruleset mine)\n" + SHRINK_OF_PAD + "\n" + IDENTITY_PERMUTE


pytestmark = pytest.mark.usefixtures("clean_rules")     # conftest.py: the built-in rules before and after


def _expected_shrink_of_pad(r: int) -> str:
    def facts(v):
        return [f"(= (vec-length {v}*) {r})"] + [f"(= {v}{k} (vec-get {v}* {k}))" for k in range(r)]
    when = facts("p") + facts("q") + facts("e") + facts("n") + ["(= (shape x) n*)"] + \
        [f"(= e{k} (+ p{k} n{k}))" for k in range(r)]
    return (f"(rewrite (Shrink (Pad x p* q*) p* e*) x :when ({' '.join(when)}) :ruleset mine "
            f":name \"shrink-of-pad@rank{r}\")")


# 1. the expansion text
def test_shrink_of_pad_expands_to_one_rule_per_rank(tmp_path):
    text = "(ruleset mine)\n" + SHRINK_OF_PAD.replace("1..5", "1..3")
    out = expand(text, "t.egg")
    forms = [line for line in out.splitlines() if line.startswith("(rewrite")]
    assert len(forms) == 1                      # all on the template's line: later lines keep their numbers
    assert out.count("\n") == text.count("\n")
    assert forms[0] == " ".join(_expected_shrink_of_pad(r) for r in (1, 2, 3))
    assert ";; (expanded) for-rank 1..3" in out
    assert expand(out, "t.egg") == out           # the expanded text expands to itself (a dump reloads)
    rb = load_rulebook(write(tmp_path, "t.egg", text))
    assert [r.name for r in rb.rules] == ["shrink-of-pad@rank1", "shrink-of-pad@rank2", "shrink-of-pad@rank3"]
    assert all(r.where == f"{rb.path}:4" and r.check == {"exact"} for r in rb.rules)
    assert rb.text == out


def test_index_star_and_rank_zero():
    out = expand("(ruleset mine)\n" + IDENTITY_PERMUTE, "t.egg")
    assert '(rewrite (Permute x (vec-empty)) x :ruleset mine :name "identity-permute@rank0")' in out
    assert '(rewrite (Permute x (vec-of 0 1 2)) x :ruleset mine :name "identity-permute@rank3")' in out
    assert "identity-permute@rank5" in out and "@rank6" not in out


def test_replicated_actions_in_a_rule_form():
    text = ("(ruleset mine)\n;; for-rank 2\n"
            "(rule ((= e (Shrink x (vec-of b*) (vec-of f*))) (= f* (+ b* 1))) ((union e (Flip e (vec-of #*)))) "
            ":ruleset mine :name \"r\")\n")
    out = expand(text, "t.egg")
    assert ("(rule ((= e (Shrink x b* f*)) (= f0 (+ b0 1)) (= f1 (+ b1 1)) (= (vec-length b*) 2) "
            "(= b0 (vec-get b* 0)) (= b1 (vec-get b* 1)) (= (vec-length f*) 2) (= f0 (vec-get f* 0)) "
            "(= f1 (vec-get f* 1))) ((union e (Flip e (vec-of 0 1)))) :ruleset mine :name \"r@rank2\")") in out


def test_names_fold_back(tmp_path):
    assert base_name("shrink-of-pad@rank3~realize2") == "shrink-of-pad"
    assert base_name("comm@rank2=>") == "comm=>"
    assert base_name("exp2-mul~realize1") == "exp2-mul"
    assert rank_of("shrink-of-pad@rank3~realize2") == 3 and rank_of("exp2-mul") is None
    rb = load_rulebook(write(tmp_path, "mine.egg", BOOK))
    variants = through_realize(rb.rules)
    assert '"shrink-of-pad@rank2~realize1"' in variants


# 2. the rules run on real programs, at several ranks, and the results are right
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2, 3)])
def test_shrink_of_pad_fires_at_each_rank(tmp_path, shape):
    p = write(tmp_path, "mine.egg", BOOK)
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    pads = [(1 + i % 2, i % 3) for i in range(len(shape))]
    with rulebook.using(p), warnings.catch_warnings():
        warnings.simplefilter("ignore", EqgradWarning)
        t = (Tensor(a) + 1).pad(pads).shrink([(b, b + s) for (b, _), s in zip(pads, shape)]) * 2
        np.testing.assert_allclose(t.numpy(), (a + 1) * 2, rtol=1e-6)
        rep = engine.last_plan.report
    assert rep.rule_matches["shrink-of-pad"] >= 1
    raw = {k for ph in rep.phases for k, v in ph.matches.items() if v}
    assert any(k.startswith(f"shrink-of-pad@rank{len(shape)}") for k in raw), raw
    assert not any(k.startswith("shrink-of-pad@rank") and rank_of(k) != len(shape) for k in raw)


# rank 1: every permutation of one axis is the identity, which the frontend never puts in a program
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2, 3)])
def test_identity_permute_fires_at_each_rank(tmp_path, shape):
    p = write(tmp_path, "mine.egg", BOOK)
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    rev = tuple(reversed(range(len(shape))))
    with rulebook.using(p), warnings.catch_warnings():
        warnings.simplefilter("ignore", EqgradWarning)
        t = ((Tensor(a) * 3).exp2().permute(*rev) + 1).permute(*rev)     # composed: Permute x (0 1 ..)
        np.testing.assert_allclose(t.numpy(), np.exp2(a * 3) + 1, rtol=1e-5)
        rep = engine.last_plan.report
    assert rep.rule_matches["identity-permute"] >= 1
    raw = {k for ph in rep.phases for k, v in ph.matches.items() if v}
    assert any(k.startswith(f"identity-permute@rank{len(shape)}") for k in raw), raw


def test_unmatched_template_is_reported_once_under_its_name(tmp_path):
    p = write(tmp_path, "quiet.egg", "(ruleset mine)\n" + IDENTITY_PERMUTE.replace("identity-permute", "idp-quiet"))
    with rulebook.using(p), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        (Tensor(np.ones((2, 3), np.float32)) + 7).numpy()
    msgs = [str(x.message) for x in w if "idp-quiet" in str(x.message)]
    assert len(msgs) == 1 and "'idp-quiet'" in msgs[0] and "@rank" not in msgs[0], msgs


def test_dump_shows_the_expansions(tmp_path):
    p = write(tmp_path, "mine.egg", BOOK)
    with rulebook.using(p):
        cfg = rulebook.active_config()
        assert [n for n, _, _ in cfg.user_rules] == ["shrink-of-pad", "identity-permute"]
        files = dump_files(cfg)
        write_dump(tmp_path / "dump", cfg)
    (user,) = [f for f in files if f.kind == "user"]
    assert user.count == 16         # 5 + 6 expansions, and a through-Realize variant per shrink-of-pad rank
    assert '"shrink-of-pad@rank5"' in user.text and '"identity-permute@rank0"' in user.text
    assert '"shrink-of-pad@rank2~realize1"' in user.text
    loaded = load_dump(tmp_path / "dump")              # the expanded text loads as it is
    assert any('"identity-permute@rank4"' in t for t in loaded.texts)


# 3. the soundness checker, per rank
def _check(path):
    return subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", str(path)], capture_output=True,
                          text=True, timeout=600)


def test_checker_says_sound_for_both_templates(tmp_path):
    r = _check(write(tmp_path, "good.egg", BOOK))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "11 rules: 11 sound" in r.stdout, r.stdout


def test_checker_finds_wrong_templates(tmp_path):
    bad = ("(ruleset mine)\n;; for-rank 1..2\n"
           "(rewrite (Shrink (Pad x (vec-of p*) (vec-of q*)) (vec-of p*) (vec-of e*)) x\n"
           "         :when ((= (shape x) (vec-of n*)) (= e* (+ (+ p* n*) 1))) :ruleset mine :name \"off-by-one\")\n"
           ";; for-rank 2..3\n"
           "(rewrite (Permute x (vec-of #*)) (Flip x (vec-of #*)) :ruleset mine :name \"identity-is-flip\")\n")
    r = _check(write(tmp_path, "bad.egg", bad))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(x.startswith("UNSOUND") and "off-by-one@rank1" in x for x in lines), r.stdout
    for k in (2, 3):
        assert any(x.startswith("UNSOUND") and f"identity-is-flip@rank{k}" in x for x in lines), r.stdout


# 4. template errors name file:line
@pytest.mark.parametrize("body, line, match", [
    (";; for-rank 1..3\n(rewrite (Neg p*) x :ruleset mine :name \"a\")\n", 3, "starred variable p\\* outside"),
    (";; for-rank 3..1\n(rewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 2, "bad ;; for-rank range"),
    (";; for-rank 1..99\n(rewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 2, "bad ;; for-rank range"),
    (";; for-rank two\n(rewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 2, "bad ;; for-rank range"),
    (";; for-rank 1..2\n;; for-rank 3\n(rewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 3,
     "a second ;; for-rank"),
    (";; for-rank 1..2\n\n(rewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 2, "right before a rule"),
    (";; for-rank 1..2\n(rewrite (Neg x) x :ruleset mine :name \"a\")\n", 3, "no starred variable"),
    (";; for-rank 1..2\n(rewrite (Permute x (vec-of p*)) (Permute x (vec-of p1 p0)) :ruleset mine :name \"a\")\n",
     3, "mixes p\\* with p"),
    ("(rewrite (Permute x (vec-of p*)) x :ruleset mine :name \"a\")\n", 2, "without a ';; for-rank"),
    (";; for-rank 1..2\n(birewrite (Permute x (vec-of #*)) x :ruleset mine :name \"a\")\n", 2, "birewrite"),
    (";; for-rank 1..2\n(rewrite (Shrink x (vec-of b*) (vec-of e*)) x\n :when ((= e* (+ b* 1)))\n"
     " :ruleset mine :name \"a\" :subsume q*)\n", 3, "starred variable q\\* outside"),
])
def test_template_errors_name_file_and_line(tmp_path, body, line, match):
    p = write(tmp_path, "tpl.egg", "(ruleset mine)\n" + body)
    with pytest.raises(RulebookError, match=match) as e:
        load_rulebook(p)
    assert str(e.value).startswith(f"{p}:{line}:"), str(e.value)
