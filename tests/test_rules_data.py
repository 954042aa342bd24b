"""Rules as data: the generated families equal the hand-maintained rules they replace,
the egglog analysis agrees with the op table's Python rules, a dump runs exactly like the
configuration it was taken from, and the schedule's limits follow their flags."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from egglog import bindings

import eqgrad
from eqgrad import Tensor
from eqgrad.dtype import DTYPES, bool_, float32, int32
from eqgrad.extract import settings_key
from eqgrad.graph.program import linearize
from eqgrad.ops import DTYPE_RULES, MAX_RANK, OPS, SHAPE_RULES, OpDef, _op
from eqgrad.rules import rulebook
from eqgrad.rules.book import (ACTIONS, ANALYSES, PRIMITIVES, RuleConfig, RulebookError, read_schedule_text,
                               split_schedule, without_rule)
from eqgrad.rules.dump import dump_files, load_dump, load_files, write_dump
from eqgrad.rules.families import analysis_family, families, fusion_family, movement_family
from eqgrad.rules.ir import declarations, emit_program, fmt_attrs
from eqgrad.rules.saturate import Saturator, schedule_phases
from eqgrad.rules.sexpr import SList, Str, Sym, parse

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "rules"
OLD = "2addb74"       # the last commit with the hand-written fusion.egg and the f-string families


pytestmark = pytest.mark.usefixtures("clean_rules")     # conftest.py: the built-in rules before and after


# ------------------------------------------------------------------ generated == what it replaces

CONSTRUCTORS = {o.egg for o in OPS.values()}
KNOWN = CONSTRUCTORS | PRIMITIVES | ACTIONS | ANALYSES | {"rule", "rewrite", "birewrite", "ruleset"}


def normalized(text: str) -> dict[str, str]:
    """Rule name -> the rule with its variables renamed in order of first appearance (?0, ?1, ...)."""
    out = {}
    for form in parse(text):
        if form.head == "ruleset":
            continue
        names: dict[str, str] = {}

        def go(e) -> str:
            if isinstance(e, SList):
                return "(" + " ".join(go(x) for x in e.items) + ")"
            if isinstance(e, Sym) and e.name not in KNOWN and not e.name.startswith(":"):
                return names.setdefault(e.name, f"?{len(names)}")
            return repr(e)
        items = form.items
        name = items[items.index(Sym(":name")) + 1]
        assert isinstance(name, Str)
        out[name.value] = go(form)
    return out


def _constructors(rule: str) -> set[str]:
    return set(re.findall(r"\(([A-Z]\w*)", rule)) & CONSTRUCTORS


def assert_same_rules(old_text: str, new_text: str, what: str) -> None:
    """Every old rule is generated unchanged (up to variable names); a generated rule that the old
    text lacks may only be about an op added since (a constructor the old declarations lack)."""
    old, new = normalized(old_text), normalized(new_text)
    old_ctors = set().union(*(_constructors(r) for r in old.values()))
    changed = {k: (old[k], new.get(k)) for k in old if new.get(k) != old[k]}
    assert not changed, f"{what}: rules that differ from the old ones (old, new): {changed}"
    extra = [k for k in new if k not in old and _constructors(new[k]) <= old_ctors]
    assert not extra, f"{what}: generated rules that the old text does not have: {extra}"


def test_generated_fusion_family_equals_the_hand_written_one():
    assert_same_rules((GOLDEN / f"fusion-{OLD}.egg").read_text(), fusion_family().text, "fusion")


def test_the_fusion_golden_is_the_hand_written_file_from_git():
    """The golden copy is exactly rulebooks/fusion.egg as it was at OLD (checked where git and the
    commit are at hand: a checkout, not an unpacked sdist)."""
    try:
        old = subprocess.run(["git", "show", f"{OLD}:rulebooks/fusion.egg"], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git is not available")
    if old.returncode != 0:
        pytest.skip(f"commit {OLD} is not in this checkout: {old.stderr.strip()[:100]}")
    assert old.stdout == (GOLDEN / f"fusion-{OLD}.egg").read_text()


def test_generated_analysis_and_movement_equal_the_old_f_strings():
    # generated-OLD.egg is what eqgrad.rules.ir.generated_rulebooks() returned at OLD
    old = (GOLDEN / f"generated-{OLD}.egg").read_text()
    assert_same_rules(old, analysis_family().text + movement_family().text, "analysis + movement-gen")


def test_families_are_named_rulesets_with_unique_rule_names():
    names = [n for f in families() for n in normalized(f.text)]
    assert len(names) == len(set(names))
    assert [f.name for f in families()] == ["analysis", "movement-gen", "fusion"]
    for f in families():
        assert f"(ruleset {f.name})" in f.text and f.n_rules == len(normalized(f.text))


def test_an_op_that_does_not_fuse_has_no_fusion_rule():
    assert OPS["REALIZE"].fuse == ()
    assert "(Realize (Realize" not in fusion_family().text
    assert all(o.fuse == tuple(range(o.arity)) for o in OPS.values() if o.name != "REALIZE")


# ------------------------------------------------------------------ analysis == Python rules

KIND = {"f": float32, "i": int32, "b": bool_}


def _shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(x) for x in rng.integers(1, 5, rank))


def _example(o: OpDef, rng: np.random.Generator, rank: int):
    """(source shapes, source dtypes, attribute) of a valid application of ``o``."""
    dt = KIND[rng.choice(list(o.dtypes))]
    shape = _shape(rng, rank)
    dts = [dt] * o.arity
    arg = None
    if o.name == "WHERE":
        dts[0] = bool_
    if o.name == "CAST":
        arg = DTYPES[str(rng.choice(["float32", "int32", "bool"]))]
    elif o.name == "BITCAST":               # float32 <-> int32: the widths KIND has
        arg = int32 if dt is not int32 else DTYPES["float32"]
    elif o.shape_of == "reduce":
        k = int(rng.integers(1, rank + 1))
        arg = tuple(sorted(int(a) for a in rng.choice(rank, k, replace=False)))
    elif o.shape_of == "permute":
        arg = tuple(int(a) for a in rng.permutation(rank))
    elif o.shape_of == "pad":
        arg = (tuple(int(x) for x in rng.integers(0, 3, rank)), tuple(int(x) for x in rng.integers(0, 3, rank)))
    elif o.shape_of == "shrink":
        starts = tuple(int(rng.integers(0, s)) for s in shape)
        arg = (starts, tuple(int(rng.integers(b + 1, s + 1)) for b, s in zip(starts, shape)))
    elif o.name == "RESHAPE":
        arg = tuple(reversed(shape)) + (1,)
    elif o.name == "EXPAND":
        shape = tuple(1 if rng.random() < 0.5 else s for s in shape)
        arg = tuple(s if s != 1 else int(rng.integers(1, 4)) for s in shape)
    elif o.attrs and o.kind != "leaf":
        arg = tuple(int(a) for a in rng.choice(rank, int(rng.integers(0, rank + 1)), replace=False)) if rank else ()
    return [shape] * o.arity, dts, arg


def _read(eg, expr: str) -> str:
    (out,) = eg.run_program(*eg.parse_program(f"(extract {expr})"))
    return str(out).strip()


def _ivec(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


@pytest.mark.parametrize("name", sorted(OPS))
def test_analysis_agrees_with_the_python_rules(name):
    """Insert random terms of the op, saturate the generated analysis alone, read shape and dtype
    back and compare with OpDef.shape_rule/dtype_rule (for a leaf: with what it was given)."""
    o = OPS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    eg = bindings.EGraph()
    eg.run_program(*eg.parse_program(declarations() + analysis_family().text))
    ranked = o.shape_of in ("reduce", "permute", "pad", "shrink")
    # every rank the ranked families generate (a rank-0 movement or reduction never reaches egglog:
    # the frontend drops it as a no-op), and ranks 0..4 for the others
    ranks = [r for r in range(1, MAX_RANK + 1) for _ in range(3)] if ranked else [r % 5 for r in range(15)]
    lines, expected = [], []
    for i, rank in enumerate(ranks):
        shapes, dts, arg = _example(o, rng, rank)
        if o.kind == "leaf":
            shape, dt = _shape(rng, rank), KIND[rng.choice(list("fib"))]
            term = (f'(Buf {i} {_vec(shape)} "{dt.name}")' if name == "BUF"
                    else f'(Const 1.0 "{dt.name}" {_vec(shape)})')
        else:
            srcs = [f'(Buf {100 * i + j} {_vec(s)} "{d.name}")' for j, (s, d) in enumerate(zip(shapes, dts))]
            term = f"({o.egg} {' '.join(srcs + fmt_attrs(o, arg))})"
            shape, dt = tuple(o.shape_rule(shapes, arg)), o.dtype_rule(dts, arg)
        lines.append(f"(let $t{i} {term})")
        expected.append((term, shape, dt.name))
    eg.run_program(*eg.parse_program("\n".join(lines) + "\n(run-schedule (saturate analysis))\n"))
    for i, (term, shape, dt) in enumerate(expected):
        got = (_ivec(_read(eg, f"(shape $t{i})")), _read(eg, f"(dtype $t{i})").strip('"'))
        assert got == (shape, dt), f"{term}: egglog analysis gives {got}, the op table {(shape, dt)}"


def _vec(xs) -> str:
    return f"(vec-of {' '.join(map(str, xs))})" if xs else "(vec-empty)"


def test_the_python_rules_are_built_from_the_declarative_names():
    for o in OPS.values():
        assert o.shape_rule is SHAPE_RULES[o.shape_of] and o.dtype_rule is DTYPE_RULES[o.dtype_of], o.name
    # an op written the old way (a shape rule function) is refused with what is expected
    with pytest.raises(ValueError, match=r"op FOO: shape_of must be one of \[.*'same'.*\], got <function"):
        _op("FOO", "Foo", "unary", 1, lambda s, a: s[0], "same", None)
    with pytest.raises(ValueError, match=r"op FOO: fuse positions must be in range\(1\), got \(1,\)"):
        _op("FOO", "Foo", "unary", 1, "same", "same", None, fuse=(1,))


# ------------------------------------------------------------------ dump round trip

EXP2_RULES = ('(ruleset mine)\n;; check: finite\n;; exp2(a) * exp2(b) = exp2(a + b)\n'
              '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')


def _programs() -> dict[str, str]:
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    w = Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    progs = {
        "softmax": x.softmax(-1),
        "mlp": ((x @ w).relu() * 1.0 + 0.0).sum(0),
        "movement": x.reshape(4, 2, 16).permute(2, 0, 1).flip(0)[1:3] * 2,
        "exp2": x.exp2() * (x + 1).exp2(),
        "adds": (x * 2) + x.exp2(),
        "integers": (Tensor(rng.integers(-9, 9, (6, 5)).astype(np.int32)) * 3 + 1) // 2,
    }
    return {k: emit_program(linearize([t.lazydata])).text for k, t in progs.items()}


def test_a_dump_runs_exactly_like_the_configuration_it_came_from(tmp_path):
    book = tmp_path / "mine.egg"
    book.write_text(EXP2_RULES)
    rulebook.use(book)                  # a user rulebook too: its runs travel in the dumped schedule
    cfg = rulebook.active_config()
    files = write_dump(tmp_path / "dump", cfg)
    assert [f.kind for f in files] == ["generated"] * 3 + ["built-in"] * 4 + ["user", "schedule"]
    assert sum(f.count for f in files if f.kind != "schedule") == len(rulebook.all_rules(cfg))
    dumped = load_dump(tmp_path / "dump")
    assert not dumped.generated and len(dumped.books) == 8
    # the dump alone holds every rule
    assert sorted(r.name for r in rulebook.all_rules(dumped)) == sorted(r.name for r in rulebook.all_rules(cfg))
    sat = Saturator()
    try:
        for name, text in _programs().items():
            js1, rep1 = sat.run(text, timeout=60, rules=cfg)
            js2, rep2 = sat.run(text, timeout=60, rules=dumped)
            assert rep1.stop_reason == rep2.stop_reason == "completed", (name, rep1, rep2)
            assert rep1.matches == rep2.matches, name
            assert json.loads(js1) == json.loads(js2), f"{name}: the dump saturates to another e-graph"
            if name == "exp2":
                assert rep2.matches.get("exp2-mul", 0) >= 1
    finally:
        sat.close()


def test_the_dump_is_checked_as_a_whole_configuration(tmp_path):
    d = tmp_path / "dump"
    write_dump(d)
    books, schedule = load_files(sorted(d.glob("*.egg")))
    assert schedule == d / "schedule.egg" and len(books) == 7
    out = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", *map(str, sorted(d.glob("*.egg"))),
                          "--rule", "fuse-where-2", "--rule", "permute-permute-3", "--rule", "mul-one", "-n", "4"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "3 rules: 3 sound" in out.stdout and "02-gen-fusion.egg" in out.stdout
    # a schedule that names a ruleset the files lack is refused
    (d / "schedule.egg").write_text(";; phase p\n(run-schedule (run nosuchruleset))\n")
    with pytest.raises(RulebookError, match="nosuchruleset"):
        load_files(sorted(d.glob("*.egg")))


def test_rules_check_names_the_generated_families():
    out = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "check", "--rule", "fuse-add-1",
                          "--rule", "shape-add", "--rule", "reshape-through-mul", "-n", "4"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    for family in ("fusion (generated)", "analysis (generated)", "movement-gen (generated)"):
        assert family in out.stdout
    summary = subprocess.run([sys.executable, "-m", "eqgrad", "rules", "dump"], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
    n_fusion = len(normalized(fusion_family().text))          # one per op and fusable position (40 + new ops)
    assert summary.returncode == 0 and re.search(rf"fusion\s+generated\s+{n_fusion}\s+02-gen-fusion\.egg",
                                                 summary.stdout)


def test_a_generated_rule_can_be_blamed_and_removed():
    """Rule blame (EQGRAD_VALIDATE) re-plans without each fired rule: that works for a generated
    rule too (the fusion rules were in fusion.egg before)."""
    cfg, where = without_rule(rulebook.active_config(), "fuse-add-0")
    assert cfg is not None and where.startswith("<generated:fusion>:")
    assert not cfg.generated and all('"fuse-add-0"' not in t for t in cfg.texts)
    assert sum('"fuse-add-1"' in t for t in cfg.texts) == 1
    text = _programs()["adds"]
    sat = Saturator()
    try:
        _, rep = sat.run(text, timeout=60, rules=cfg)
        _, rep0 = sat.run(text, timeout=60, rules=rulebook.active_config())
    finally:
        sat.close()
    assert rep0.matches.get("fuse-add-0", 0) > 0 and rep0.matches.get("fuse-add-1", 0) > 0
    assert rep.stop_reason == "completed" and rep.matches.get("fuse-add-0", 0) == 0
    assert rep.matches.get("fuse-add-1", 0) > 0


# ------------------------------------------------------------------ schedule limits from flags

def _algebra(cfg: RuleConfig) -> str:
    return dict(schedule_phases(cfg))["algebra"]


def test_schedule_limit_follows_the_flag(tmp_path):
    default = rulebook.active_config()
    assert "(get-size!) 200000)" in _algebra(default)
    key_default, settings_default = default.key, settings_key("LLVM")
    with eqgrad.Context(EGRAPH_NODES=1234):
        cfg = rulebook.active_config()
        assert "(get-size!) 1234)" in _algebra(cfg)
        assert cfg.key != key_default and settings_key("LLVM") != settings_default
        sched = {f.filename: f.text for f in dump_files()}["schedule.egg"]
        assert "(get-size!) 1234)" in sched and "EGRAPH_NODES=1234" in sched
    assert rulebook.active_config().key == key_default


def test_the_substituted_limit_reaches_the_worker():
    """Under a tiny EGRAPH_NODES the algebra phase's guard stops algebra at once, while the phase
    check (given a huge node_limit here) lets every phase run."""
    text = _programs()["mlp"]
    sat = Saturator()
    try:
        _, big = sat.run(text, timeout=60, node_limit=10**9)
        with eqgrad.Context(EGRAPH_NODES=10):
            _, small = sat.run(text, timeout=60, node_limit=10**9)
    finally:
        sat.close()
    algebra = {p.name: p for p in big.phases}["algebra"], {p.name: p for p in small.phases}["algebra"]
    assert sum(algebra[0].matches.values()) > 0 and sum(algebra[1].matches.values()) == 0


def test_an_unknown_schedule_placeholder_is_an_error(tmp_path):
    p = tmp_path / "s.egg"
    p.write_text(";; phase a\n(run-schedule (saturate analysis))\n;; phase b\n(run-schedule (run-with x :until (>= (get-size!) {NODES})))\n")
    with pytest.raises(RulebookError, match=r"s\.egg:4: unknown placeholder \{NODES\}.*\{EGRAPH_NODES\}"):
        read_schedule_text(p)
    assert split_schedule(";; phase a\n(run-schedule (run-with x :until (>= (get-size!) {EGRAPH_NODES})))\n",
                          "t")[0][1].count("200000") == 1
