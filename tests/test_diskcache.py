"""The disk cache of plans (eqgrad/engine/diskcache.py, docs/engine.md): plans as exact JSON, a second
process that does not saturate, keys that miss when anything the plan depends on changes, bad files
that warn and recompile, the byte bound, concurrent writers. The rest of the suite runs with the
cache off (tests/conftest.py); these tests turn it on in their own directory."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.cache import CacheWarning
from eqgrad.counters import EqgradWarning
from eqgrad.dtype import bool_, float32, int32
from eqgrad.engine import Session, diskcache
from eqgrad.engine.core import compile_plan
from eqgrad.graph.plan import (Kernel, KernelPlan, KNode, plan_difference, plan_from_data, plan_from_json,
                               plan_to_data, plan_to_json)
from eqgrad.graph.program import linearize
from eqgrad.rules import rulebook
from eqgrad.rules.saturate import SaturationReport
from conftest import OTHER_UID, needs_root, open_up

ROOT = Path(__file__).resolve().parents[1]
RULE = ('(ruleset mine)\n;; check: finite\n;; exp2(a) * exp2(b) = exp2(a + b)\n'
        '(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)) :ruleset mine :name "exp2-mul")\n')


@pytest.fixture
def disk(tmp_path, monkeypatch) -> Path:
    """The disk cache on, in a directory of this test's own; the plans dir."""
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1")
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EQGRAD_DISK_CACHE_BYTES", raising=False)
    rulebook.reset()
    engine.clear_cache()
    yield tmp_path / "cache" / "plans"
    engine.clear_cache()
    rulebook.reset()


def _program(device: str = "LLVM") -> Tensor:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((4, 8)).astype(np.float32), device=device)
    b = Tensor(rng.standard_normal((8, 3)).astype(np.float32), device=device)
    return ((a @ b).exp2() * 0.5 + 1).softmax(-1)


def _realize(session: Session | None = None, device: str = "LLVM") -> tuple[np.ndarray, int, int]:
    """The program's result, and the saturations and disk hits it took (in ``session``)."""
    s0, h0 = GlobalCounters.saturations, GlobalCounters.disk_hits
    with session or engine.default_session():
        out = _program(device).numpy()
    return out, GlobalCounters.saturations - s0, GlobalCounters.disk_hits - h0


def _other(n: int) -> None:
    """Realize the n-th of three programs of other structures than _program's (not only other sizes:
    a plan of other sizes is resized, not compiled, and not stored)."""
    x = Tensor(np.ones((3, 5), np.float32))
    with engine.default_session():
        [x.exp2(), x.sqrt() + 2, (x * 4).amax(1)][n].numpy()


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.json")) if d.exists() else []


# ------------------------------------------------------------------ plans as JSON

def _corpus() -> dict[str, callable]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    i = rng.integers(-5, 5, (3, 4)).astype(np.int32)

    def t(v):
        return Tensor(v)
    return {
        "elementwise": lambda: (t(x) * 3 + 1).sqrt().sin(),
        "specials": lambda: t(x).maximum(float("-inf")) + float("nan") * (t(x) < -0.0).where(-0.0, float("inf")),
        "int and bool": lambda: ((t(i) * 3 + 7) % 4 == 1).where(t(i), -t(i)).cast(eqgrad.float32),
        "reductions": lambda: t(x).sum(1, keepdim=True) - t(x).amax(0, keepdim=True),
        "movement": lambda: t(x).permute(1, 0).reshape(2, 6).pad(((1, 0), (0, 2))).flip(1)[:, 1:5],
        "shared node": lambda: (lambda y: y * y + y)(t(x).exp()),
        "matmul softmax": lambda: (t(x) @ t(x).transpose(0, 1)).softmax(-1),
        "two outputs": lambda: [t(x) + 1, (t(x) * 2).sum()],
    }


@pytest.mark.parametrize("name", list(_corpus()))
def test_every_plan_of_a_corpus_round_trips_exactly(name):
    """plan == plan_from_json(plan_to_json(plan)), field for field and type for type. (Every plan
    the suite compiles is also checked so, by compile_plan under EQGRAD_VERIFY.)"""
    outs = _corpus()[name]()
    outs = outs if isinstance(outs, list) else [outs]
    cp, _ = engine.plan_for([o.lazydata for o in outs])
    text = plan_to_json(cp.plan)
    back = plan_from_json(text)
    assert plan_difference(cp.plan, back) is None
    assert plan_to_json(back) == text
    assert diskcache.round_trip_error(cp.plan) is None


def _hand_plan(shared: bool = True, zero: float = -0.0) -> KernelPlan:
    nan = struct.unpack(">d", bytes.fromhex("fff8000000000123"))[0]      # a negative NaN with a payload
    b0 = KNode("BUF", (), 0, (2, 3), float32)
    e = KNode("EXP2", (b0,), None, (2, 3), float32)
    e2 = e if shared else KNode("EXP2", (b0,), None, (2, 3), float32)
    consts = [KNode("CONST", (), v, (2, 3), float32) for v in (zero, nan, float("inf"), 1e-45)]
    body = KNode("ADD", (KNode("MUL", (e, e2), None, (2, 3), float32), consts[0]), None, (2, 3), float32)
    for c in consts[1:]:
        body = KNode("MAX", (body, c), None, (2, 3), float32)
    i = KNode("CAST", (KNode("PAD", (KNode("CONST", (), 3, (1, 3), int32),), ((1, 0), (0, 0)), (2, 3), int32),),
              float32, (2, 3), float32)
    w = KNode("WHERE", (KNode("CONST", (), True, (2, 3), bool_), body, i), None, (2, 3), float32)
    k = Kernel("k0", 1, w, (0,), predicted=1.5e-6, nbytes=48, flops=30)
    return KernelPlan([((2, 3), float32), ((2, 3), float32)], 1, [k], [1], predicted=1.5e-6, notes=["a note"])


def test_special_floats_ints_bools_and_sharing_round_trip():
    plan = _hand_plan()
    back = plan_from_json(plan_to_json(plan))
    assert plan_difference(plan, back) is None
    consts = {d: [n.arg for n in back.kernels[0].ast.walk() if n.op == "CONST" and n.dtype == d]
              for d in (float32, int32, bool_)}
    zero, nan, inf, tiny = consts[float32]
    assert math.copysign(1, zero) == -1 and struct.pack(">d", nan).hex() == "fff8000000000123"
    assert inf == math.inf and tiny == 1e-45
    assert [type(c) for c in consts[int32] + consts[bool_]] == [int, bool]
    ast = back.kernels[0].ast
    mul = [n for n in ast.walk() if n.op == "MUL"][0]
    assert mul.src[0] is mul.src[1]                       # the shared EXP2 is one node again


def test_plan_difference_sees_what_equality_of_values_would_not():
    assert plan_difference(_hand_plan(), _hand_plan(zero=0.0)) is not None          # -0.0 vs 0.0
    assert plan_difference(_hand_plan(), _hand_plan(shared=False)) is not None      # sharing
    p, q = _hand_plan(), _hand_plan()
    q.kernels[0].nbytes = 48.0
    assert "float" in plan_difference(p, q)                                          # 48 vs 48.0
    q = _hand_plan()
    q.buffers[0] = ([2, 3], float32)
    assert "list" in plan_difference(p, q)                                           # tuple vs list


def _corrupt(data: dict, how: str) -> dict:
    nodes = data["kernels"][0]["kernel"]["ast"]["dag"]
    if how == "unknown op":
        nodes[1]["op"] = "FROB"
    elif how == "wrong shape":
        nodes[1]["shape"] = {"tuple": [3, 2]}
    elif how == "forward source":
        nodes[1]["src"] = [5]
    elif how == "buffer out of range":
        next(n for n in nodes if n["op"] == "BUF")["arg"] = 9
    elif how == "unknown dtype":
        next(n for n in nodes if n["op"] == "BUF")["dtype"] = {"dtype": "float64"}
    elif how == "untagged float":
        data["predicted"] = 1.5
    elif how == "unknown field":
        data["extra"] = 1
    elif how == "inputs":
        data["kernels"][0]["kernel"]["inputs"] = {"tuple": [1]}
    return data


@pytest.mark.parametrize("how", ["unknown op", "wrong shape", "forward source", "buffer out of range",
                                 "unknown dtype", "untagged float", "unknown field", "inputs"])
def test_a_plan_read_back_is_checked(how):
    data = json.loads(json.dumps(plan_to_data(_hand_plan())))
    with pytest.raises(ValueError):
        plan_from_data(_corrupt(data, how))


def test_a_value_the_encoding_cannot_write_is_named():
    plan = _hand_plan()
    plan.notes = [{"a": 1}]
    with pytest.raises(TypeError, match=r"plan\.notes: expected None, bool, int, float.*got dict"):
        plan_to_data(plan)


# ------------------------------------------------------------------ in one process

def test_a_stored_plan_is_read_instead_of_saturated(disk):
    want, sats, hits = _realize()
    assert sats == 1 and hits == 0 and len(_files(disk)) == 1
    got, sats, hits = _realize(Session())          # a new session: an empty in-memory plan cache
    assert sats == 0 and hits == 1
    np.testing.assert_array_equal(got, want)


def test_disk_hit_keeps_the_report_and_has_no_egraph(disk):
    _realize()
    first = engine.last_plan
    s = Session()
    _realize(s)
    cp = s.last_plan
    assert cp.egraph is None and cp.result is None
    assert cp.report.stop_reason == "completed" and "disk cache" in cp.report.detail
    assert cp.report.matches == first.report.matches and cp.report.matches
    assert plan_difference(cp.plan, first.plan) is None
    assert set(cp.seconds) >= {"saturate", "extract", "compile", "load"} and cp.seconds["saturate"] == 0.0


def test_compile_plan_with_disk_false_saturates_and_keeps_the_egraph(disk):
    _realize()
    t = _program()
    rules = engine.default_session().rules.config()
    prog = linearize([t.lazydata], device="LLVM", inspected=rules.inspected_constants)
    s0 = GlobalCounters.saturations
    assert compile_plan(prog, rules).egraph is None and GlobalCounters.saturations == s0
    cp = compile_plan(prog, rules, disk=False)      # what plan_for (explain, the tools) asks for
    assert cp.egraph is not None and cp.result is not None and cp.result.alternatives is not None
    assert GlobalCounters.saturations == s0 + 1


def test_explain_of_a_plan_read_from_disk_has_the_egraph_and_alternatives(disk):
    _realize()
    s = Session()
    with s:
        e = eqgrad.explain(_program())               # plan_for compiles with disk=False (session.py)
    assert s.last_plan is None or s.last_plan.egraph is not None
    assert e.compiled.egraph is not None and e.result is not None and "alternatives" in str(e)
    assert e.egraph_dot().startswith("digraph")


@pytest.mark.filterwarnings("ignore:eqgrad. your rule 'exp2-mul'")      # it matches nothing here: only the key changes
@pytest.mark.parametrize("change", ["rulebook", "extractor", "device", "EQGRAD_CPU", "eqgrad's code",
                                    "EQGRAD_OPT", "EQGRAD_EGRAPH_NODES"])
def test_a_change_of_what_the_plan_depends_on_misses(disk, change, tmp_path, monkeypatch):
    _realize()
    assert _realize(Session())[1:] == (0, 1)         # the same settings hit
    if change == "rulebook":
        (tmp_path / "mine.egg").write_text(RULE)
        new = lambda: Session(rulebooks=[tmp_path / "mine.egg"])      # noqa: E731
    elif change == "extractor":
        new = lambda: Session(extractor="improve")                   # noqa: E731
    else:
        new = Session
        if change == "EQGRAD_CPU":
            monkeypatch.setenv("EQGRAD_CPU", "x86-64-v2")
        elif change == "eqgrad's code":
            monkeypatch.setattr(diskcache, "code_digest", lambda: "another checkout")
        elif change == "EQGRAD_OPT":
            monkeypatch.setenv("EQGRAD_OPT", "0")
        elif change == "EQGRAD_EGRAPH_NODES":
            monkeypatch.setenv("EQGRAD_EGRAPH_NODES", "150000")
    device = "NUMPY" if change == "device" else "LLVM"
    out, sats, hits = _realize(new(), device)
    assert hits == 0 and sats == (0 if change == "EQGRAD_OPT" else 1) and len(_files(disk)) >= 2
    out2, sats, hits = _realize(new(), device)       # and that plan is stored under its own key
    assert (sats, hits) == (0, 1)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("kind", ["cost function", "measured", "own saturator", "EQGRAD_DISK_CACHE=0"])
def test_what_is_not_cached_on_disk(disk, kind, monkeypatch):
    if kind == "EQGRAD_DISK_CACHE=0":
        _realize()                                   # stored while the cache is on
        monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
        s = Session
    elif kind == "cost function":
        from eqgrad.extract.cost import default_cost
        s = lambda: Session(cost_fn=lambda *a, **k: default_cost(*a, **k))     # noqa: E731
    elif kind == "measured":
        s = lambda: Session(extractor="measured")                               # noqa: E731
    else:
        from eqgrad.rules.saturate import default_saturator
        s = lambda: Session(saturator=default_saturator())                      # noqa: E731
    before = _files(disk)
    for _ in range(2):
        assert _realize(s())[1:] == (1, 0)           # saturated both times: nothing read
    assert _files(disk) == before                    # and nothing written


def test_plans_that_depend_on_timing_are_not_stored():
    ok = SaturationReport("completed")
    assert diskcache.why_not_stored(ok, {}) is None
    assert diskcache.why_not_stored(SaturationReport("node limit"), {}) is None
    assert diskcache.why_not_stored(SaturationReport("skipped"), {}) is None
    for stop in ("timeout", "worker died", "error"):
        assert stop in diskcache.why_not_stored(SaturationReport(stop), {})
    assert "EXTRACT_TIME" in diskcache.why_not_stored(ok, {"stopped": "time limit 1 s (EQGRAD_EXTRACT_TIME)"})
    assert "ILP" in diskcache.why_not_stored(ok, {"ilp": "time limit (best found)"})
    assert diskcache.why_not_stored(ok, {"ilp": "optimal"}) is None


def test_a_node_limited_plan_is_stored_and_warns_again_on_a_hit(disk, monkeypatch):
    monkeypatch.setenv("EQGRAD_EGRAPH_NODES", "1")
    with pytest.warns(EqgradWarning, match="node limit"):
        want, sats, _ = _realize()
    assert sats == 1 and len(_files(disk)) == 1
    with pytest.warns(EqgradWarning, match="node limit"):
        got, sats, hits = _realize(Session())
    assert (sats, hits) == (0, 1)
    np.testing.assert_array_equal(got, want)


def test_counters_sum_the_phases_and_reset(disk):
    GlobalCounters.reset()
    _realize()
    assert GlobalCounters.saturate_seconds > 0 and GlobalCounters.extract_seconds > 0
    assert GlobalCounters.compile_seconds > 0 and GlobalCounters.disk_hits == 0
    cp = engine.last_plan
    assert GlobalCounters.saturate_seconds == pytest.approx(cp.seconds["saturate"])
    _realize(Session())
    assert GlobalCounters.disk_hits == 1 and GlobalCounters.load_seconds > 0 and GlobalCounters.plans_compiled == 2
    GlobalCounters.reset()
    assert (GlobalCounters.saturate_seconds, GlobalCounters.extract_seconds, GlobalCounters.compile_seconds,
            GlobalCounters.load_seconds, GlobalCounters.disk_hits) == (0.0, 0.0, 0.0, 0.0, 0)


# ------------------------------------------------------------------ bad files

def _spoil(path: Path, how: str) -> None:
    data = json.loads(path.read_text())
    if how == "not JSON":
        path.write_text("{not json")
    elif how == "truncated":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif how == "a JSON list":
        path.write_text("[1, 2]")
    elif how == "another format":
        path.write_text(json.dumps({**data, "format": 999}))
    elif how == "another key":
        path.write_text(json.dumps({**data, "key": "0" * 64}))
    elif how == "a bad plan":
        data["value"]["plan"]["kernels"][0]["kernel"]["ast"]["dag"][-1]["op"] = "FROB"
        path.write_text(json.dumps(data))
    elif how == "a bad report":
        data["value"]["report"]["phases"] = [{"name": 3}]
        path.write_text(json.dumps(data))
    elif how == "a directory":
        path.unlink()
        path.mkdir()
    elif how == "its name as key":                 # what format 1 stored: the key's hash, not the key
        path.write_text(json.dumps({**data, "key": path.stem}))
    elif how == "another user's":
        os.chown(path, OTHER_UID, OTHER_UID)
    elif how == "mode 0666":
        path.chmod(0o666)
    elif how == "mode 0620":
        path.chmod(0o620)
    elif how == "a symlink":                       # to a valid file: still not followed
        real = path.with_name("elsewhere")
        path.rename(real)
        path.symlink_to(real)


@pytest.mark.parametrize("how", ["not JSON", "truncated", "a JSON list", "another format", "another key",
                                 "a bad plan", "a bad report", "a directory", "its name as key",
                                 pytest.param("another user's", marks=needs_root), "mode 0666", "mode 0620",
                                 "a symlink"])
def test_a_bad_file_warns_once_and_recompiles(disk, how):
    want, _, _ = _realize()
    (path,) = _files(disk)
    _spoil(path, how)
    with pytest.warns(CacheWarning, match=rf"ignored the cached plan {path}") as rec:
        got, sats, hits = _realize(Session())
    assert (sats, hits) == (1, 0)
    assert len([w for w in rec if "ignored the cached plan" in str(w.message)]) == 1
    if how == "a directory":                         # and the directory in the way is named, not replaced
        assert any("could not store a plan" in str(w.message) for w in rec)
    np.testing.assert_array_equal(got, want)
    if how != "a directory":                         # the recompiled plan replaced the file
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            assert _realize(Session())[1:] == (0, 1)


def test_an_unwritable_plans_directory_warns_and_still_runs(disk):
    disk.parent.mkdir(parents=True)
    disk.write_text("a file where the directory should be")
    with pytest.warns(CacheWarning, match="could not store a plan") as rec:
        out, sats, _ = _realize()
    assert sats == 1 and np.isfinite(out).all() and len(rec) == 1


@pytest.mark.parametrize("how", [pytest.param("another user's", marks=needs_root), "mode 0777", "mode 0770",
                                 "mode 1777"])
def test_a_plans_directory_of_another_user_or_open_to_others_is_refused(disk, how):
    """Its plans are neither read nor written, with one warning naming it; the program still runs."""
    want, _, _ = _realize()
    (path,) = _files(disk)
    open_up(disk, how)
    with pytest.warns(CacheWarning, match=rf"cache directory {disk} cannot be used") as rec:
        for _ in range(2):
            got, sats, hits = _realize(Session())
            assert (sats, hits) == (1, 0)                # not read
            np.testing.assert_array_equal(got, want)
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1
    assert _files(disk) == [path] and not list(disk.glob(".*.tmp"))      # nor written


@pytest.mark.parametrize("how", [pytest.param("another user's", marks=needs_root), "mode 0777", "mode 0666"])
def test_a_kernels_directory_of_another_user_or_open_to_others_is_refused(disk, how):
    from eqgrad.devices import kernelcache
    key = "0" * 64
    path = kernelcache.store(key, b"object code", 0)
    assert path == disk.parent / "kernels" / f"{key}.o" and kernelcache.load(key) == (b"object code", 0)
    open_up(path.parent, how)
    with pytest.warns(CacheWarning, match=rf"cache directory {path.parent} cannot be used") as rec:
        assert kernelcache.load(key) is None and kernelcache.load(key) is None
        assert kernelcache.store(key, b"other code", 0) is None
    assert len(rec) == 1 and path.read_bytes().endswith(b"object code")


# ------------------------------------------------------------------ a plan of another program

FITS = {"x.exp() + y": lambda x, y: x.exp() + y,
        "x.exp()": lambda x, y: x.exp(),
        "x[:1].exp() + y[:1]": lambda x, y: x[:1].exp() + y[:1],
        "x.exp().sum(1) + y.sum(1)": lambda x, y: x.exp().sum(1) + y.sum(1),
        "(x.exp() + y).cast(int32)": lambda x, y: (x.exp() + y).cast(int32)}


def _fresh_program(name: str) -> tuple:
    """(program, rules) of ``FITS[name]`` over x (2, 3) and y (2, 3), both realized."""
    rng = np.random.default_rng(2)
    x, y = (Tensor(rng.standard_normal((2, 3)).astype(np.float32)).realize() for _ in range(2))
    rules = engine.default_session().rules.config()
    t = FITS[name](x, y)
    return linearize([t.lazydata], device="LLVM", inspected=rules.inspected_constants), rules


@pytest.mark.parametrize("stored, asked", [("x.exp() + y", "x.exp()"), ("x.exp()", "x.exp() + y"),
                                           ("x.exp() + y", "x[:1].exp() + y[:1]"),
                                           ("x.exp() + y", "x.exp().sum(1) + y.sum(1)"),
                                           ("x.exp() + y", "(x.exp() + y).cast(int32)")])
def test_a_plan_that_does_not_fit_the_program_is_a_miss(disk, stored, asked):
    """The key in the file matches (as if edited to), the plan is another program's of other inputs or
    outputs: one warning, a miss, never an exception."""
    prog_s, rules = _fresh_program(stored)
    prog_a, _ = _fresh_program(asked)
    key_s, key_a = diskcache.plan_key(prog_s, rules, None), diskcache.plan_key(prog_a, rules, None)
    cp = compile_plan(prog_s, rules)
    assert diskcache.plan_mismatch(cp.plan, prog_s) is None
    value = diskcache.load(key_s)
    assert value is not None
    diskcache.store(key_a, value)                      # the stored program's plan under the asked one's key
    with pytest.warns(CacheWarning, match="does not fit this program") as rec:
        assert diskcache.load_plan(key_a, prog_a) is None
    assert len(rec) == 1
    assert diskcache.load_plan(key_s, prog_s) is not None


def test_plan_mismatch_names_what_does_not_fit(disk):
    prog, rules = _fresh_program("x.exp() + y")
    plan = compile_plan(prog, rules).plan
    assert diskcache.plan_mismatch(plan, prog) is None

    def changed(**kw) -> str:
        p = dataclasses.replace(plan, **kw)
        return diskcache.plan_mismatch(p, prog)
    n = len(prog.input_specs)
    assert f"expected {n} input buffers" in changed(n_inputs=n - 1)
    assert "input b1: expected (2, 3) float32, the plan has (3, 2) float32" in changed(
        buffers=[plan.buffers[0], ((3, 2), float32)] + plan.buffers[2:])
    assert "input b0: expected (2, 3) float32" in changed(buffers=[((2, 3), int32)] + plan.buffers[1:])
    assert "expected 1 outputs" in changed(outputs=plan.outputs * 2)
    assert "output 0" in changed(buffers=plan.buffers[:-1] + [((2, 3), int32)])
    assert "neither an input nor written" in changed(kernels=[])


CHILD_OP = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    from eqgrad import GlobalCounters, Tensor
    from eqgrad.cache import CacheWarning
    x = Tensor(np.array([[0.0, 1.0, 2.0], [-1.0, 0.5, 3.0]], np.float32))
    y = Tensor(np.array([[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]], np.float32))
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        out = {"add": lambda: x.exp() + y, "mul": lambda: x.exp() * y, "exp": lambda: x.exp()}[sys.argv[1]]()
        out = out.numpy()
    print(json.dumps(dict(out=out.tolist(), disk_hits=GlobalCounters.disk_hits,
                          warnings=[str(w.message) for w in ws if issubclass(w.category, CacheWarning)])))
""")
X = np.array([[0.0, 1.0, 2.0], [-1.0, 0.5, 3.0]], np.float32)
Y = np.array([[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]], np.float32)
WANT = {"add": np.exp(X) + Y, "mul": np.exp(X) * Y, "exp": np.exp(X)}


def _run_op(cache: Path, op: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD_OP, op], env=_env(cache), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def three_plans(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """A cache holding the plans of ``add``, ``mul`` and ``exp`` (CHILD_OP), each stored by its own
    process; the plan file of each."""
    cache = tmp_path_factory.mktemp("three") / "cache"
    files: dict[str, Path] = {}
    for op in ("add", "mul", "exp"):
        before = set(_files(cache / "plans"))
        got = _run_op(cache, op)
        assert got["disk_hits"] == 0 and not got["warnings"]
        (files[op],) = set(_files(cache / "plans")) - before
    return cache, files


def _swap(three_plans, tmp_path: Path, stored: str, asked: str, key: str) -> Path:
    """A copy of the three plans' cache where ``asked``'s file holds ``stored``'s plan, its key made
    to match: ``key`` "name" (the file's name: what format 1 stored and compared) or "key" (the key
    field ``asked``'s own file held)."""
    src, files = three_plans
    cache = tmp_path / "cache"
    shutil.copytree(src, cache)
    a = cache / "plans" / files[asked].name
    data = json.loads((cache / "plans" / files[stored].name).read_text())
    data["key"] = a.stem if key == "name" else json.loads(a.read_text())["key"]
    a.write_text(json.dumps(data))
    return cache


def test_a_plan_file_copied_over_another_programs_runs_the_right_program(three_plans, tmp_path):
    """``x.exp() + y``'s plan copied over ``x.exp() * y``'s file, its key edited to the file's
    name, printed ``x.exp() + y`` in a later process with no warning. The file holds the whole key,
    compared with the program's: a miss, one warning, the right numbers."""
    cache = _swap(three_plans, tmp_path, "add", "mul", key="name")
    got = _run_op(cache, "mul")
    np.testing.assert_allclose(got["out"], WANT["mul"], rtol=1e-6)
    assert got["disk_hits"] == 0 and len(got["warnings"]) == 1 and "another key" in got["warnings"][0]
    again = _run_op(cache, "mul")                      # and the recompiled plan replaced it
    assert again["disk_hits"] == 1 and not again["warnings"]
    np.testing.assert_allclose(again["out"], WANT["mul"], rtol=1e-6)


@pytest.mark.parametrize("stored, asked", [("add", "exp"), ("exp", "add")])
def test_a_plan_of_another_input_count_is_a_miss_not_a_crash(three_plans, tmp_path, stored, asked):
    """A plan of 2 inputs under a 1-input program's key (the key field itself copied, so
    only the check against the program can tell) raised and the process died of SIGSEGV; a plan of
    1 input under a 2-input program's wrote its output into the second input. Now: one warning, a
    recompile, the right numbers (in a child process, so a crash fails the test)."""
    cache = _swap(three_plans, tmp_path, stored, asked, key="key")
    got = _run_op(cache, asked)
    np.testing.assert_allclose(got["out"], WANT[asked], rtol=1e-6)
    assert got["disk_hits"] == 0 and len(got["warnings"]) == 1, got["warnings"]
    assert "does not fit this program" in got["warnings"][0] and "input buffers" in got["warnings"][0]


# ------------------------------------------------------------------ the byte bound

def test_eviction_drops_least_recently_used_files_and_stale_temporaries(tmp_path):
    d = tmp_path / "plans"
    d.mkdir()
    for i, name in enumerate(["a", "b", "c"]):
        (d / f"{name}.json").write_text("x" * 100)
        os.utime(d / f"{name}.json", (1000 + i, 1000 + i))
    (d / ".a.json.1.tmp").write_text("partial")
    os.utime(d / ".a.json.1.tmp", (1000, 1000))                    # left by a killed writer long ago
    (d / ".b.json.2.tmp").write_text("partial")                    # a writer at work now
    assert diskcache.evict(d, 250) == 200
    assert sorted(p.name for p in d.iterdir()) == [".b.json.2.tmp", "b.json", "c.json"]
    assert diskcache.evict(d, 0) == 0 and sorted(p.name for p in d.iterdir()) == [".b.json.2.tmp"]


def test_a_hit_makes_its_plan_recently_used(disk, monkeypatch):
    _realize()                                        # A
    (a,) = _files(disk)
    for n in (0, 1):                                  # B, C
        _other(n)
    b, c = sorted(set(_files(disk)) - {a}, key=lambda p: p.stat().st_mtime_ns)
    for p, t in ((a, 1000), (b, 2000), (c, 3000)):
        os.utime(p, (t, t))
    assert _realize(Session())[1:] == (0, 1)          # a hit on A touches it
    assert diskcache.evict(disk, a.stat().st_size + c.stat().st_size) <= a.stat().st_size + c.stat().st_size
    assert a.exists() and c.exists() and not b.exists()


def test_the_flag_bounds_the_directory(disk, monkeypatch):
    monkeypatch.setenv("EQGRAD_DISK_CACHE_BYTES", "0")
    _realize()
    assert _files(disk) == []
    assert _realize(Session())[1:] == (1, 0)
    monkeypatch.setenv("EQGRAD_DISK_CACHE_BYTES", "1M")
    for n in range(3):
        _other(n)
    assert len(_files(disk)) == 3 and sum(p.stat().st_size for p in _files(disk)) <= 1 << 20



def test_storing_plans_scans_the_directory_once_per_process_until_the_bound(disk, monkeypatch):
    """The directory's bytes are counted once and then added up per write (cache.keep_within): a
    scan per stored plan cost 105-119 ms with 14,707 plans in it. Past the bound it is scanned and
    evicted, and other processes' files are counted then."""
    import eqgrad.cache as cache
    scans = []
    real = cache.cache_files
    monkeypatch.setattr(cache, "cache_files", lambda d, suffix: scans.append(d) or real(d, suffix))
    _realize()
    for n in range(3):
        _other(n)
    plans = lambda: [d for d in scans if d == disk]     # (the kernel directories are scanned once each too)
    assert len(_files(disk)) == 4 and plans() == [disk]
    stranger = disk / ("f" * 64 + ".json")           # another process's plan, unseen by this one
    stranger.write_text("x" * 4000)
    os.utime(stranger, (1000, 1000))                 # (the least recently used)
    total = sum(p.stat().st_size for p in _files(disk))
    monkeypatch.setenv("EQGRAD_DISK_CACHE_BYTES", str(total))      # the next plan passes it: a scan
    (Tensor(np.ones((3, 5), np.float32)) * 3).log2().numpy()          # a fifth plan, stored
    assert plans() == [disk] * 2 and not stranger.exists()
    assert sum(p.stat().st_size for p in _files(disk)) <= total


def test_an_eviction_leaves_room_so_a_full_cache_is_not_scanned_at_every_plan(disk, monkeypatch):
    """Past the bound, the least recently used plans are evicted down to EVICT_TO of it: evicted
    only to the bound, a full cache was over it again at the next plan, and every stored plan
    scanned the whole directory (126 ms each with 26,000 plans)."""
    import eqgrad.cache as cache
    x = Tensor(np.ones((3, 5), np.float32))
    programs = [lambda: x.exp2(), lambda: x.sqrt(), lambda: x.log2(), lambda: x.amax(1), lambda: x.sum(0),
                lambda: x.exp2().sum(1), lambda: x.sqrt().amax(0), lambda: x.reciprocal(), lambda: x.sin(),
                lambda: x.log2().sum(), lambda: x.exp2().sqrt(), lambda: x.sin().amax(1), lambda: x.abs(),
                lambda: x.abs().sum(0), lambda: x.reciprocal().sum(1), lambda: x.sin().sum()]
    with engine.default_session():
        for f in programs:
            f().numpy()
    sizes = sorted(p.stat().st_size for p in _files(disk))
    assert len(sizes) == len(programs) and cache.EVICT_TO * sum(sizes) < sum(sizes) - sizes[-1]
    total = sum(sizes)
    scans = []
    real = cache.cache_files
    monkeypatch.setattr(cache, "cache_files", lambda d, suffix: scans.append(d) or real(d, suffix))
    bound = total + sizes[-1] // 2                  # the next plan passes it
    monkeypatch.setenv("EQGRAD_DISK_CACHE_BYTES", str(bound))
    (Tensor(np.ones((3, 5), np.float32)) * 3).log2().numpy()
    after = sum(p.stat().st_size for p in _files(disk))
    assert [d for d in scans if d == disk] == [disk] and after <= cache.EVICT_TO * bound
    (Tensor(np.ones((3, 5), np.float32)) * 5).exp2().numpy()      # fits the room left: no scan
    assert [d for d in scans if d == disk] == [disk]


# ------------------------------------------------------------------ other processes

CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    from eqgrad.cache import CacheWarning
    warnings.simplefilter("error", CacheWarning)
    import eqgrad
    from eqgrad import GlobalCounters, Tensor, nn, optim
    import eqgrad.nn.functional as F
    from eqgrad.lower import lowering
    lowered = []
    real_lower = lowering.lower_kernel
    lowering.lower_kernel = lambda *a, **k: lowered.append(1) or real_lower(*a, **k)

    eqgrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Tensor.relu, nn.Linear(16, 4))
    opt = optim.Adam(nn.state.get_parameters(model), lr=1e-2)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 4, 6).astype(np.int32)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = F.cross_entropy(model(Tensor(x)), Tensor(y))
        loss.backward()
        opt.step(loss)
        losses.append(loss.item())
    w = nn.state.get_parameters(model)[0].numpy()
    race = []
    if len(sys.argv) > 1:              # writers racing on one key
        from eqgrad.engine import diskcache
        for i in range(60):
            diskcache.store("race", {"who": sys.argv[1], "pad": sys.argv[1] * (1000 + 997 * (i % 7))})
            v = diskcache.load("race")
            race.append(v is not None and v["who"] in "ab" and len(v["pad"]) >= 1000)
    print(json.dumps(dict(losses=[float(v).hex() for v in losses], w=w.tobytes().hex(), race=all(race),
                          saturations=GlobalCounters.saturations, disk_hits=GlobalCounters.disk_hits,
                          lowered=len(lowered), lowered_disk_hits=GlobalCounters.lowered_disk_hits,
                          compiled=GlobalCounters.kernels_compiled)))
""")


def _env(cache: Path) -> dict:
    return dict(os.environ, EQGRAD_DISK_CACHE="1", EQGRAD_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))


def _child(cache: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, *args], env=_env(cache), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_does_not_saturate_and_gives_the_same_numbers(tmp_path):
    first = _child(tmp_path / "cache")
    second = _child(tmp_path / "cache")
    assert first["saturations"] >= 1 and first["disk_hits"] == 0
    assert second["saturations"] == 0 and second["disk_hits"] == first["saturations"]
    assert (second["losses"], second["w"]) == (first["losses"], first["w"])
    # nor lowers nor compiles: each kernel's source and object code are read back
    assert first["lowered"] > 0 and first["compiled"] > 0
    assert second["lowered"] == 0 and second["compiled"] == 0 and second["lowered_disk_hits"] > 0, second


def test_two_processes_writing_at_once_do_not_corrupt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, who], env=_env(cache), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for who in "ab"]
    outs = [p.communicate(timeout=600) for p in ps]
    assert [p.returncode for p in ps] == [0, 0], [e[-3000:] for _, e in outs]
    a, b = (json.loads(o.strip().splitlines()[-1]) for o, _ in outs)
    assert a["race"] and b["race"]                    # every read while the other wrote was a whole file
    assert (a["losses"], a["w"]) == (b["losses"], b["w"])
    # every file either left is whole and valid (read here, not by a third process: the key holds a
    # digest of eqgrad's source, which an edit of the checkout in between would change)
    keys = [json.loads(p.read_text())["key"] for p in (cache / "plans").glob("*.json")]
    keys = [k for k in keys if k != "race"]
    assert keys and not list((cache / "plans").glob(".*.tmp"))
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(cache))
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert all(plan_from_data(diskcache.load(k)["plan"]) is not None for k in keys)
