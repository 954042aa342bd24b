"""Saturation always stops, says why, and the answer stays right."""
import warnings

import numpy as np
import pytest

import eqgrad
from eqgrad import EqgradWarning, Tensor
from eqgrad import engine
from eqgrad.engine import Session
from eqgrad.rules.book import RULEBOOK_DIR, read_schedule
from eqgrad.rules.saturate import Saturator


def blowup_program(x: Tensor, depth: int = 120) -> Tensor:
    """Deep chain with many constants and movement: every permute is pushed through the chain."""
    y = x
    for i in range(depth):
        y = (y * (1.0 + i / depth) + 0.5).permute(1, 0) if i % 3 == 0 else y * 1.0 + 0.0 - (i % 5)
    return y


def reference(x: np.ndarray, depth: int = 120) -> np.ndarray:
    y = x.astype(np.float32)
    for i in range(depth):
        if i % 3 == 0:
            y = (y * np.float32(1.0 + i / depth) + np.float32(0.5)).T
        else:
            y = y * np.float32(1.0) + np.float32(0.0) - np.float32(i % 5)
    return y


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)


def test_schedule_has_phases():
    names = [n for n, _ in read_schedule(RULEBOOK_DIR / "schedule.egg")]
    assert names[:4] == ["analysis", "movement", "algebra", "fusion"]


def test_blowup_completes_and_is_correct(x, monkeypatch):
    # one saturation of the whole chain (regions would cut this long elementwise chain at the
    # kernel-body cap and saturate each repeat: engine/regions.py)
    monkeypatch.setenv("EQGRAD_REGIONS", "0")
    out = blowup_program(Tensor(x))
    np.testing.assert_allclose(out.numpy(), reference(x), rtol=1e-4, atol=1e-3)
    rep = engine.last_plan.report
    assert rep.stop_reason == "completed"
    assert max(p.enodes for p in rep.phases) > rep.enodes_before       # rules really fired
    assert rep.matches.get("mul-one", 0) > 0 and rep.matches.get("add-negzero", 0) > 0


def test_node_limit_stops_with_warning_and_correct_result(x, monkeypatch):
    # the program starts near 780 e-nodes and fusion grows it past 1000 (planned whole, as above)
    monkeypatch.setenv("EQGRAD_REGIONS", "0")
    with eqgrad.Context(EGRAPH_NODES=1000), pytest.warns(EqgradWarning, match="node limit"):
        out = blowup_program(Tensor(x), depth=121)
        got = out.numpy()
    np.testing.assert_allclose(got, reference(x, 121), rtol=1e-4, atol=1e-3)
    rep = engine.last_plan.report
    assert rep.stop_reason == "node limit" and "EQGRAD_EGRAPH_NODES" in rep.detail


def test_timeout_falls_back_to_unoptimized_plan(x):
    sat = Saturator()
    try:
        sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)   # warm the worker
        js, rep = sat.run(blowup_program_text(), timeout=1e-4)
        assert js is None and rep.stop_reason == "timeout"
        assert "EQGRAD_SATURATION_TIMEOUT" in rep.detail
        # the saturator restarts its worker on the next call
        js2, rep2 = sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)
        assert js2 is not None and rep2.stop_reason == "completed"
    finally:
        sat.close()


def blowup_program_text() -> str:
    from eqgrad.graph.program import linearize
    from eqgrad.rules.ir import emit_program
    t = blowup_program(Tensor(np.ones((6, 6), np.float32)), depth=200)
    return emit_program(linearize([t.lazydata])).text


def test_timeout_in_realize_warns_and_is_correct(x):
    engine.clear_cache()
    with eqgrad.Context(SATURATION_TIMEOUT=1e-4), pytest.warns(EqgradWarning, match="timeout"):
        got = blowup_program(Tensor(x), depth=122).numpy()
    np.testing.assert_allclose(got, reference(x, 122), rtol=1e-4, atol=1e-3)


def test_memory_limit_kills_worker_and_falls_back(x, tmp_path):
    """Free commutativity/associativity grows the e-graph without bound: under a 64 MiB address-space
    limit (and no node limit) the worker dies, the realize warns and runs the unoptimized plan.
    (blowup_program did this until its constants became runtime parameters, which no rule folds:
    its e-graph now stays at ~1,300 e-nodes.)"""
    from eqgrad.rules import saturate
    (tmp_path / "ac.egg").write_text(AC_RULES)
    session = Session()
    session.rules.use(tmp_path / "ac.egg", "cleanup", iterations=40)
    a = Tensor(x)
    y = a
    for i in range(30):
        y = (y + float(i)) * (a + float(i % 7))
    ref = x.astype(np.float32)
    for i in range(30):
        ref = (ref + np.float32(i)) * (x + np.float32(i % 7))
    saturate.reset_saturator()
    try:
        with session, eqgrad.Context(EGRAPH_MEMORY="64M", EGRAPH_NODES=10**9, SATURATION_TIMEOUT=300), \
                pytest.warns(EqgradWarning, match="worker died"):
            got = y.numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-4)
    finally:
        saturate.reset_saturator()


AC_RULES = """
(ruleset ac)
(rewrite (Add a b) (Add b a) :ruleset ac :name "comm-add")
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset ac :name "assoc-add")
(rewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset ac :name "assoc-add-r")
(rewrite (Mul a b) (Mul b a) :ruleset ac :name "comm-mul")
(rewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset ac :name "distribute")
"""


def test_free_ac_rules_blow_up_and_are_stopped(tmp_path):
    """Free commutativity/associativity explodes; the node limit and the timeout both stop it."""
    sat, text = _endless_ac(tmp_path, phases=12)
    try:
        js, rep = sat.run(text, timeout=60, node_limit=20_000)
        assert rep.stop_reason == "node limit" and js is not None, rep
        assert rep.phases[-1].enodes > 20_000 and len(rep.phases) < 14
        js, rep = sat.run(text, timeout=0.5, node_limit=10**9)
        assert rep.stop_reason == "timeout" and js is None
    finally:
        sat.close()


def _endless_ac(tmp_path, phases: int = 40) -> tuple[Saturator, str]:
    """A saturator (no worker yet) whose schedule runs free commutativity/associativity for
    ``phases`` phases on a deep chain with many constants: at 40 it does not finish within seconds;
    the tests give it a node or time limit."""
    (tmp_path / "ac.egg").write_text(AC_RULES)
    (tmp_path / "schedule.egg").write_text(
        ";; phase analysis\n(run-schedule (saturate analysis))\n"
        ";; phase fusion\n(run-schedule (saturate (seq (run fusion) (saturate analysis))))\n"
        + "".join(f";; phase ac{i}\n(run-schedule (run ac) (saturate analysis))\n" for i in range(phases)))
    x = Tensor(np.ones((4, 4), np.float32))
    y = x
    for i in range(30):
        y = (y + float(i)) * (x + float(i % 7))
    from eqgrad.graph.program import linearize
    from eqgrad.rules.ir import emit_program
    sat = Saturator(rulebooks=[RULEBOOK_DIR / "fusion.egg", tmp_path / "ac.egg"], schedule=tmp_path / "schedule.egg")
    return sat, emit_program(linearize([y.lazydata])).text


def test_the_time_limit_covers_saturation_and_the_start_is_bounded_apart(tmp_path):
    """A new worker's start (the process's first program, the one after a timeout
    kill) was counted as 10 s on top of EQGRAD_SATURATION_TIMEOUT: a 1 s limit stopped after ~11 s.
    Now the limit counts from when the worker is ready, the start is bounded apart (STARTUP_LIMIT)
    and reported, and a request takes at most the two together."""
    import time
    from eqgrad.rules.saturate import STARTUP_LIMIT
    sat, text = _endless_ac(tmp_path)
    try:
        for _ in range(2):                 # a new worker, then the one started after the kill
            t0 = time.monotonic()
            js, rep = sat.run(text, timeout=1.0, node_limit=10**9)
            wall = time.monotonic() - t0
            assert js is None and rep.stop_reason == "timeout" and "EQGRAD_SATURATION_TIMEOUT" in rep.detail
            assert 0 < rep.startup < STARTUP_LIMIT
            assert 1.0 + rep.startup <= wall < 1.0 + rep.startup + 2.0, (wall, rep.startup)
            assert "starting the worker" in str(rep)
        js, rep = sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)
        assert rep.stop_reason == "completed" and rep.startup > 0       # started again after the kill
        js, rep = sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)
        assert rep.stop_reason == "completed" and rep.startup == 0      # a ready worker: no start
    finally:
        sat.close()


def test_a_worker_that_does_not_start_in_time_is_killed_and_says_so(tmp_path, monkeypatch):
    """The start-up bound holds on its own: past it the worker is killed, the report says the start
    (not the saturation limit) was exceeded, and the next request starts a new worker."""
    from eqgrad.rules import saturate
    monkeypatch.setattr(saturate, "STARTUP_LIMIT", 1e-3)      # no worker loads egglog in 1 ms
    sat, _ = _endless_ac(tmp_path)
    tiny = "(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n"
    try:
        js, rep = sat.run(tiny, timeout=30)
        assert js is None and rep.stop_reason == "timeout" and sat.pid is None
        assert "not ready within 0.001s of start-up (STARTUP_LIMIT" in rep.detail
        monkeypatch.setattr(saturate, "STARTUP_LIMIT", 60.0)
        js, rep = sat.run(tiny, timeout=30)
        assert js is not None and rep.stop_reason == "completed"
    finally:
        sat.close()


def test_bad_rulebook_reports_file_and_line(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset fusion2)\n(rewrite (Addd a b) (Add b a) :ruleset fusion2)\n")
    sat = Saturator(rulebooks=[RULEBOOK_DIR / "movement.egg", bad])
    try:
        js, rep = sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)
    finally:
        sat.close()
    assert js is None and rep.stop_reason == "error"
    assert "bad.egg" in rep.detail and "Addd" in rep.detail


def test_report_is_printable(x):
    (Tensor(x) * 2 + 1).realize()
    text = str(engine.last_plan.report)
    assert "phase analysis" in text and "e-nodes" in text


def test_no_warning_on_normal_programs(x):
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqgradWarning)
        (Tensor(x).exp().sum(0) / 3).realize()


def _counting_requests(monkeypatch) -> list[str]:
    """The kinds of the requests every Saturator sends its worker from now on."""
    from eqgrad.rules import saturate
    asked: list[str] = []
    real = saturate.Saturator._request

    def request(self, kind, *args, **kw):
        asked.append(kind)
        return real(self, kind, *args, **kw)
    monkeypatch.setattr(saturate.Saturator, "_request", request)
    return asked


def test_a_program_planned_again_for_another_device_or_extractor_is_saturated_once(x, monkeypatch):
    """The engine's saturations are remembered per Saturator (run(memo=True)): the same program
    planned for NUMPY, then LLVM, then under another extractor reads the first run's e-graph (parsed
    once: engine/core.py _read_egraph); the report says so and carries the first run's phases and
    matches."""
    from eqgrad import GlobalCounters
    asked = _counting_requests(monkeypatch)
    sat = Saturator()
    GlobalCounters.reset()
    try:
        reps, outs, graphs = [], [], []
        for device, extractor in (("NUMPY", None), ("LLVM", None), ("LLVM", "ilp")):
            with Session(saturator=sat, extractor=extractor):
                outs.append(((Tensor(x, device=device) * 3.0).exp2() - 1.5).sum(1).numpy())
                reps.append(engine.last_plan.report)
                graphs.append(engine.last_plan.egraph)
        assert asked == ["run"]
        assert [r.reused for r in reps] == [False, True, True]
        assert GlobalCounters.saturations == 3 and GlobalCounters.saturations_reused == 2
        assert graphs[0] is not None and graphs[1] is graphs[0] and graphs[2] is graphs[0]   # read once
        assert all(r.stop_reason == "completed" for r in reps)
        assert reps[2].enodes == reps[0].enodes and reps[2].matches == reps[0].matches and reps[2].phases
        assert "reused" in str(reps[1]) and "reused" not in str(reps[0])
        want = (np.exp2(x * np.float32(3.0)) - np.float32(1.5)).sum(1)
        for got in outs:
            np.testing.assert_allclose(got, want, rtol=1e-5)
        # not for a direct caller (the tools, the soundness checker): each run is a run
        sat.run(emitted_text_of(x), timeout=30)
        sat.run(emitted_text_of(x), timeout=30)
        assert asked == ["run"] * 3
    finally:
        sat.close()


def emitted_text_of(x: np.ndarray) -> str:
    from eqgrad.graph.program import linearize
    from eqgrad.rules.ir import emit_program
    return emit_program(linearize([((Tensor(x) * 3.0).exp2() - 1.5).sum(1).lazydata])).text


def test_remembered_saturations_are_keyed_by_what_the_worker_runs_and_bounded(x, monkeypatch):
    """Another node limit or other rules are another request; a timed-out run is not kept (the
    next asks the worker again); the memo keeps SATURATED_BYTES, least recently used dropped first."""
    from eqgrad.rules import saturate
    from eqgrad.rules.book import builtin_config
    asked = _counting_requests(monkeypatch)
    text, other = emitted_text_of(x), emitted_text_of(x[:3])
    sat = Saturator()
    try:
        js, rep = sat.run(text, timeout=30, memo=True)
        assert sat.run(text, timeout=30, memo=True)[0] == js and len(asked) == 1
        sat.run(text, timeout=30, node_limit=10**6, memo=True)            # another node limit
        cfg = builtin_config()
        fewer = type(cfg)(cfg.rulebooks[:-1], cfg.schedule, key="fewer")
        sat.run(text, timeout=30, rules=fewer, memo=True)                  # other rulebook texts
        assert len(asked) == 3
        _, slow = sat.run(blowup_program_text(), timeout=1e-4, memo=True)
        assert slow.stop_reason == "timeout"
        _, again = sat.run(blowup_program_text(), timeout=60, memo=True)
        assert again.stop_reason == "completed" and not again.reused and len(asked) == 5
        # a bound of a little more than either entry: keeping another drops the least recently used
        js_other = sat.run(other, timeout=30)[0]
        monkeypatch.setattr(saturate, "SATURATED_BYTES", max(len(text) + len(js), len(other) + len(js_other)) + 100)
        sat.run(other, timeout=30, memo=True)
        n = len(asked)
        assert sat.run(other, timeout=30, memo=True)[1].reused and len(asked) == n
        assert not sat.run(text, timeout=30, memo=True)[1].reused and len(asked) == n + 1
        assert sat._saturated_bytes <= saturate.SATURATED_BYTES and len(sat._saturated) == 1
    finally:
        sat.close()
