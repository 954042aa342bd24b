"""Rulebook errors in the user's terms, in every path. A constructor with the wrong
arity, or an egglog number function (lowercase ``neg``) where a tensor goes, is a RulebookError at
the rule's file:line showing the user's own term and what the constructor takes; an error only
egglog finds names the rule and its path (egglog names the basename and internal terms); a
broken rulebook in EQGRAD_RULEBOOKS is an error at the next realize, not a warning and the
unoptimized plan."""
import subprocess
import sys

import numpy as np
import pytest

import eqgrad
import eqgrad.rules.rulebook as rules
from eqgrad import Tensor
from eqgrad.rules.rulebook import RulebookError, load_rulebook


def write(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("(ruleset mine)\n" + body)
    return p


def test_constructor_arity_names_the_term_and_the_signature(tmp_path):
    p = write(tmp_path, "arity.egg", ";; a comment\n(rewrite (Sum (Neg x)) (Neg (Sum x)) :ruleset mine :name \"sum-neg\")\n")
    with pytest.raises(RulebookError) as e:
        load_rulebook(p)
    msg = str(e.value)
    assert f"{p}:3: rule 'sum-neg': (Sum (Neg x))" in msg
    assert "Sum takes a tensor and an integer vector (IVec" in msg and "(Sum x axes)" in msg and "got 1 argument" in msg
    assert "@Neg" not in msg


def test_lowercase_primitive_where_a_tensor_goes(tmp_path):
    p = write(tmp_path, "lower.egg", "(rewrite (Neg (neg x)) x :ruleset mine :name \"negneg\")\n")
    with pytest.raises(RulebookError, match=r"lower\.egg:2: rule 'negneg': \(neg x\) is a tensor argument of Neg.*"
                                            r"the IR's tensor op is Neg"):
        load_rulebook(p)
    p = write(tmp_path, "lhs.egg", "(rewrite (max (Neg x) (Neg y)) (Neg (Max x y)) :ruleset mine :name \"m\")\n")
    with pytest.raises(RulebookError, match=r"applies egglog's number function 'max' to a tensor; the IR's tensor op is Max"):
        load_rulebook(p)
    p = write(tmp_path, "lit.egg", "(rewrite (Add x 0.0) x :ruleset mine :name \"add0\")\n")
    with pytest.raises(RulebookError, match=r"0\.0 is a tensor argument of Add: a constant tensor is \(Const"):
        load_rulebook(p)


def test_an_error_only_egglog_finds_names_the_rule_and_its_path(tmp_path):
    p = write(tmp_path, "typed.egg", "(rewrite (Neg x) x :ruleset mine :name \"ok\")\n"
                                     "(rewrite (Neg x) (Sum x (vec-of \"a\")) :ruleset mine :name \"weird\")\n")
    rb = load_rulebook(p)                  # the term shapes are right; the vector's element type is not
    with pytest.raises(RulebookError) as e:
        rules.validate([rb])
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: rule 'weird': (rewrite (Neg x) (Sum x (vec-of \"a\"))")
    assert "egglog:" in msg and "type i64" in msg


def test_a_broken_env_rulebook_fails_at_realize(tmp_path):
    p = write(tmp_path, "typed.egg", "(rewrite (Neg x) (Sum x (vec-of \"a\")) :ruleset mine :name \"weird\")\n")
    code = ("import numpy as np, eqgrad, warnings\n"
            "warnings.simplefilter('error')\n"
            "x = eqgrad.Tensor(np.ones(4, np.float32))\n"
            "for _ in range(2):\n"
            "    try:\n"
            "        (-(x + 1)).sigmoid().sum().numpy(); print('ran')\n"
            "    except eqgrad.rules.rulebook.RulebookError as e:\n"
            "        print('RulebookError', str(e).splitlines()[0])\n")
    env = {**__import__("os").environ, "EQGRAD_RULEBOOKS": str(p)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines == [f"RulebookError EQGRAD_RULEBOOKS={str(p)!r}: {p}:2: rule 'weird': "
                     f"(rewrite (Neg x) (Sum x (vec-of \"a\")) :ruleset mine :name \"weird\")"] * 2, out.stderr[-2000:]


def test_the_builtin_rulebooks_pass_the_term_checks():
    assert len(rules.all_rules()) > 100
