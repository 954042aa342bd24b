"""The soundness checker (eqgrad/tools/check.py) against the false SOUND verdicts it used to give:
instances isolated in e-graphs of their own, special values always sampled, ranks up to 5, the
tolerance settable and `;; check: exact`, enough instances by default, birewrites checked in both
directions, and counterexamples that show the instance that failed."""
import subprocess
import sys

import numpy as np
import pytest

from eqgrad.rules import rulebook
from eqgrad.rules.book import RULEBOOK_DIR
from eqgrad.rules.rulebook import load_rulebook
from eqgrad.rules.saturate import Saturator
from eqgrad.tools import check
from eqgrad.tools.check import DEFAULT_N, check_rule, check_rules
from conftest import write


pytestmark = pytest.mark.usefixtures("clean_rules")     # conftest.py: the built-in rules before and after


@pytest.fixture(scope="module")
def sat():
    s = Saturator()
    yield s
    s.close()


def rule_of(tmp_path, body, name="r.egg"):
    (r,) = load_rulebook(write(tmp_path, name, f"(ruleset t)\n{body}\n")).rules
    return r


REASSOC = '(rewrite (Mul (Mul x a) b) (Mul x (Mul a b)) :ruleset t :name "reassoc")'
RECIP2 = '(rewrite (Recip (Recip x)) x :ruleset t :name "recip-recip")'
LOG2EXP2 = '(rewrite (Log2 (Exp2 x)) x :ruleset t :name "log2-exp2")'


# 5. the default instance count catches the three example rules

def test_float_reassociation_is_unsound_at_the_default_count(tmp_path, sat):
    """Was SOUND at the default 48 instances (UNSOUND only at 200): overflow with special values."""
    res = check_rule(rule_of(tmp_path, REASSOC), saturator=sat)
    assert res.status == "unsound", str(res)
    assert res.instances == DEFAULT_N or res.instances >= 48


@pytest.mark.parametrize("seed", range(5))
def test_double_reciprocal_is_unsound(tmp_path, sat, seed):
    """Was SOUND even at 1,000 instances: recip(recip(float32 max)) is inf (1/max rounds to 2^-128)."""
    res = check_rule(rule_of(tmp_path, RECIP2), seed=seed, saturator=sat)
    assert res.status == "unsound", str(res)


def test_log2_exp2_passes_with_tolerance_and_fails_exact(tmp_path, sat):
    fin = check_rule(rule_of(tmp_path, ";; check: finite\n" + LOG2EXP2, "a.egg"), saturator=sat)
    assert fin.status == "sound", str(fin)
    exact = check_rule(rule_of(tmp_path, ";; check: finite, exact\n" + LOG2EXP2, "b.egg"), saturator=sat)
    assert exact.status == "unsound" and "exact" in exact.note
    cx = exact.counterexample
    assert not np.array_equal(np.asarray(cx.lhs), np.asarray(cx.rhs))
    # the explicit tolerance: a loose one accepts log2(exp2 x) even without `finite`'s restriction
    # of the sign of zero, a zero one rejects it
    assert check_rule(rule_of(tmp_path, ";; check: finite\n" + LOG2EXP2, "c.egg"), saturator=sat,
                      rtol=0, atol=0).status == "unsound"


# 2. special values in every rule's instances

def test_special_values_are_always_sampled(tmp_path, sat):
    """The first instances' leaves are special values: every one of them occurs."""
    seen: set = set()
    orig = check.Builder.leaf

    def spy(self, shape, dt):
        inst = orig(self, shape, dt)
        if dt.name == "float32":
            seen.update(np.asarray(inst.value, np.float32).reshape(-1).view(np.uint32).tolist())
        return inst
    check.Builder.leaf = spy
    try:
        check_rule(rule_of(tmp_path, '(rewrite (Neg (Neg x)) x :ruleset t :name "neg-neg")'), saturator=sat)
    finally:
        check.Builder.leaf = orig
    want = [0.0, -0.0, 1e-40, -3e-39, 1.4e-45, np.inf, -np.inf, np.finfo(np.float32).max, np.finfo(np.float32).min]
    for v in want:
        assert int(np.float32(v).view(np.uint32)) in seen, v
    assert any(np.isnan(np.uint32(x).view(np.float32)) for x in seen)


def test_subnormal_flushed_to_zero_is_caught_exactly(tmp_path, sat):
    """x * 2^-100 * 2^100 = x away from underflow only: a subnormal input comes back as 0. Only the
    special values reach the subnormals, and only `exact` (or atol=0) tells 1e-40 from 0."""
    body = ('(rewrite (Mul (Mul x (Const 7.888609052210118e-31 d s)) (Const 1.2676506002282294e+30 d s)) x '
            ':when ((= d "float32")) :ruleset t :name "scale-back")')
    assert check_rule(rule_of(tmp_path, body), saturator=sat).status == "sound"
    res = check_rule(rule_of(tmp_path, ";; check: exact\n" + body, "e.egg"), saturator=sat)
    assert res.status == "unsound", str(res)


def test_int32_extremes_are_sampled(tmp_path, sat):
    """-x = x * -1 holds with wrap-around; (-x) / ... : neg of INT_MIN is INT_MIN, so `x = -(-x)` holds
    but `max(x, -x) >= 0` does not: abs via max is wrong for INT_MIN only."""
    body = ('(rewrite (CmpLt (Max x (Neg x)) (Const 0.0 d s)) (CmpLt (Const 1.0 d s) (Const 0.0 d s)) '
            ':when ((= d "int32")) :ruleset t :name "abs-nonneg")')
    res = check_rule(rule_of(tmp_path, body), saturator=sat)
    assert res.status == "unsound", str(res)


# 3. ranks up to 5

def test_rank_five_rules_are_tested(tmp_path, sat):
    """A rule whose guard asks for rank 5 used to be built with rank <= 3 shapes and fire on none."""
    body = ('(rewrite (Permute x p) x :when ((= (vec-length p) 5) (= p (vec-of 0 1 2 3 4))) '
            ':ruleset t :name "identity-permute-5")')
    res = check_rule(rule_of(tmp_path, body), saturator=sat)
    assert res.status == "sound" and res.fired > 0, str(res)
    seen_ranks = set()
    orig = check.Builder.build

    def spy(self, pat, shape, dt):
        seen_ranks.add(len(shape))
        return orig(self, pat, shape, dt)
    check.Builder.build = spy
    try:
        check_rule(rule_of(tmp_path, '(rewrite (Neg (Neg x)) x :ruleset t :name "neg-neg")', "n.egg"), saturator=sat)
    finally:
        check.Builder.build = orig
    assert {4, 5} <= seen_ranks


# 1 and 7. one e-graph per instance; the counterexample is the instance that failed

def test_each_instance_has_its_own_egraph(tmp_path, sat):
    """x * 0 -> 0 unions instances with a shared constant: in one shared e-graph (the old checker)
    `(Mul b 0)` of one instance and the constant 0 of another ended in one class, and the
    counterexample could name an instance that did not fail. Each instance alone: the failing one
    is shown, and its two sides are its own values."""
    body = '(rewrite (Mul x (Const 0.0 d s)) (Const 0.0 d s) :ruleset t :name "times-zero")'
    res = check_rule(rule_of(tmp_path, body), saturator=sat)
    assert res.status == "unsound"
    cx = res.counterexample
    assert cx.instance.startswith("(Mul ") and "Const 0.0" in cx.instance
    lhs, rhs = np.asarray(cx.lhs), np.asarray(cx.rhs)
    (b,) = [np.asarray(v) for v in cx.inputs.values()]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(lhs, b * b.dtype.type(0))     # the left side is this instance's
    assert np.all(rhs == 0)
    assert "left side" in str(res) and "right side" in str(res)


def test_batched_run_is_the_same_as_separate_runs(tmp_path, sat):
    """The checker runs instances that share no term in one egglog e-graph and checks that every
    class belongs to one instance; an instance tangled with another is run again alone. The
    verdicts and match counts equal those of one e-graph per instance."""
    body = '(rewrite (Add x (Const 0.0 d s)) x :when ((!= d "float32")) :ruleset t :name "add-zero-int")'
    r = rule_of(tmp_path, body)
    batched = check_rule(r, n=40, saturator=sat)
    old = check.BATCH
    check.BATCH = 1
    try:
        alone = check_rule(r, n=40, saturator=sat)
    finally:
        check.BATCH = old
    assert batched.status == alone.status == "sound"
    assert batched.fired == alone.fired and batched.instances == alone.instances


def test_smallest_failing_instance_is_reported(tmp_path, sat):
    rb = load_rulebook(write(tmp_path, "bad.egg", '(ruleset bad)\n(rewrite (Add a b) (Mul a b) :ruleset bad :name "add-is-mul")\n'))
    res = check_rule(rb.rules[0], saturator=sat)
    cx = res.counterexample
    assert res.status == "unsound" and cx.instance.startswith("(Add")
    lhs, rhs = np.asarray(cx.lhs), np.asarray(cx.rhs)
    assert lhs.shape == rhs.shape and lhs.size <= 4          # a small one: rank-0 instances exist
    assert not check._close(lhs, rhs, check.float32 if lhs.dtype.kind == "f" else
                            (check.int32 if lhs.dtype.kind == "i" else check.bool_)).all()


# 6. birewrite in both directions

def test_birewrite_is_checked_in_both_directions(tmp_path, sat):
    """Both directions fire and are counted (they were counted as 0 matches: UNTESTED)."""
    res = check_rule(rule_of(tmp_path, '(birewrite (Mul a b) (Mul b a) :ruleset t :name "comm")'), saturator=sat)
    assert res.status == "sound" and res.fired > 0 and "=>" in res.note and "<=" in res.note, str(res)


def test_birewrite_right_side_instances_are_checked(tmp_path, sat):
    """recip(x) * recip(y) <-> recip(x * y) is unsound (overflow of x * y); the right side's own
    instances are built too (side 1) so the right-to-left direction is exercised."""
    body = ('(birewrite (Mul (Recip x) (Recip y)) (Recip (Mul x y)) :ruleset t :name "recip-mul")')
    res = check_rule(rule_of(tmp_path, body), saturator=sat)
    assert res.status == "unsound", str(res)
    # the right side's own instances are built and the backward direction fires on them
    sides = set()
    orig = check._run

    def spy(rule, cases, sat_, tol):
        sides.update(c.side for c in cases)
        return orig(rule, cases, sat_, tol)
    check._run = spy
    try:
        check_rule(rule_of(tmp_path, '(birewrite (Mul a b) (Mul b a) :ruleset t :name "comm")', "c.egg"),
                   n=8, saturator=sat)
    finally:
        check._run = orig
    assert sides == {0, 1}


# 4. tolerance settable

def test_tolerance_parameters(tmp_path, sat):
    """x * 3 * 5 = x * 15 within the default tolerance (one rounding against two); not with rtol=0
    and atol=0, nor `exact`."""
    body = ('(rewrite (Mul (Mul x (Const 3.0 d s)) (Const 5.0 d s)) (Mul x (Const 15.0 d s)) :when ((= d "float32")) '
            ':ruleset t :name "fifteen")')
    r = rule_of(tmp_path, ";; check: finite\n" + body)
    assert check_rule(r, saturator=sat).status == "sound"
    assert check_rule(r, saturator=sat, rtol=0.0, atol=0.0).status == "unsound"
    assert check_rules([r], rtol=0.0, atol=0.0)[0].status == "unsound"
    r2 = rule_of(tmp_path, ";; check: finite, exact\n" + body, "x.egg")
    assert check_rule(r2, saturator=sat).status == "unsound"


def test_command_line_tolerance(tmp_path):
    body = ('(ruleset t)\n;; check: finite\n(rewrite (Mul (Mul x (Const 3.0 d s)) (Const 5.0 d s)) '
            '(Mul x (Const 15.0 d s)) :when ((= d "float32")) :ruleset t :name "fifteen")\n')
    path = write(tmp_path, "third.egg", body)
    ok = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", "-n", "16", str(path)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", "-n", "16", "--rtol", "0", "--atol", "0",
                          str(path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "UNSOUND" in bad.stdout, bad.stdout + bad.stderr


# 6. terms the op table rejects, the sign of zero, and instances steered by shape guards

def test_an_ill_formed_right_side_is_unsound(tmp_path, sat):
    """NumPy broadcasts (Mul x y) over shapes [1 3] and [2 3]; eqgrad's op table does not. A rule
    that builds such a term used to pass: its values were right after broadcasting."""
    body = '(rewrite (Mul y (Expand x s)) (Mul y x) :ruleset t :name "drop-the-broadcast")'
    res = check_rule(rule_of(tmp_path, body), saturator=sat)
    assert res.status == "unsound", res
    assert "ill-formed" in str(res) and "sources of shapes" in str(res)


def test_zerosign_compares_the_zeros_equal(tmp_path, sat):
    """x + 0.0 = x differs from x only on -0.0: unsound as it stands, sound up to the sign of zero."""
    body = '(rewrite (Add x (Const 0.0 "float32" s)) x :ruleset t :name "add-plus-zero")'
    assert check_rule(rule_of(tmp_path, body), saturator=sat).status == "unsound"
    assert check_rule(rule_of(tmp_path, ";; check: zerosign\n" + body, "z.egg"), saturator=sat).status == "sound"


def test_shape_guards_steer_the_instances(tmp_path, sat):
    """A rule over a product of products guards six shapes; drawn blind, no instance of 64 fitted
    them (the rule was reported untested). The guards' vec-of / vec-get / shape equations now
    choose the instances' shapes, and most instances fire."""
    rb = load_rulebook(RULEBOOK_DIR / "contraction.egg")
    for r in rb.rules:
        res = check_rule(r, saturator=sat)
        assert res.status == "sound" and res.fired >= DEFAULT_N // 2, res
    g = check.Guides(rb.rules[0].guards)
    assert set(g.vec) >= {"t", "s1", "s2"} and set(g.shape) == {"ra", "rb", "y"}


def test_a_wrong_permutation_in_a_guarded_rule_is_caught_for_every_seed(tmp_path, sat):
    """matmul-assoc-left with b transposed the wrong way round ((2 1 0) for (1 2 0)): with the
    sizes drawn blind it fired 3-7 times in 64 and passed for two seeds of five."""
    text = (RULEBOOK_DIR / "contraction.egg").read_text()
    body = text[text.index(";; a @ (b @ c)"):]
    assert body.count("(vec-of 1 2 0)") == 1
    body = body.replace("(vec-of 1 2 0)", "(vec-of 2 1 0)")
    body = body.replace(":ruleset contraction", ":ruleset t").replace("matmul-assoc-left", "wrong-way")
    r = rule_of(tmp_path, body)
    for seed in range(5):
        assert check_rule(r, seed=seed, saturator=sat).status == "unsound", seed
