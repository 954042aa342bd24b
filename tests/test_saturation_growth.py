"""Per-iteration e-graph growth in the saturation report: every phase's egglog iterations with their
matches per rule (always), and in trace mode (``Saturator.run(trace=True)``, DEBUG>=4) the e-nodes
after each, from a step-by-step run that gives the same e-graph as a whole one."""
import numpy as np
import pytest

import eqgrad
import eqgrad.rules.rulebook as rulebook
from eqgrad import Tensor, engine
from eqgrad.counters import EqgradWarning
from eqgrad.graph.program import linearize
from eqgrad.rules.ir import emit_program
from eqgrad.rules.saturate import IterationStats, PhaseReport, SaturationReport, Saturator

AC_ADD = ('(ruleset acadd)\n'
          '(rewrite (Add a b) (Add b a) :ruleset acadd :name "add-comm")\n'
          '(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset acadd :name "add-assoc")\n')


def _chain(depth: int = 40) -> Tensor:
    x = Tensor(np.ones((6, 6), np.float32))
    y = x
    for i in range(depth):
        y = (y * (1.0 + i / depth) + 0.5).permute(1, 0) if i % 3 == 0 else y * 1.0 + 0.0 - (i % 5)
    return y


def _sum_chain(n: int = 8) -> Tensor:
    xs = [Tensor(np.full((4, 4), float(i + 1), np.float32)) for i in range(n)]
    y = xs[0]
    for x in xs[1:]:
        y = y + x
    return y


def _text(t: Tensor) -> str:
    return emit_program(linearize([t.lazydata])).text


@pytest.fixture(scope="module")
def sat():
    s = Saturator()
    yield s
    s.close()


def _summed(p: PhaseReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in p.per_iteration:
        for k, v in it.matches.items():
            out[k] = out.get(k, 0) + v
    return out


@pytest.mark.parametrize("trace", [False, True])
def test_per_iteration_matches_sum_to_the_phase_totals(sat, trace):
    js, rep = sat.run(_text(_chain()), trace=trace)
    assert js is not None and rep.stop_reason == "completed"
    assert [p.name for p in rep.phases] == ["analysis", "movement", "algebra", "fusion", "contraction", "cleanup"]
    for p in rep.phases:
        assert p.traced == trace
        assert len(p.per_iteration) == p.iterations
        assert _summed(p) == {k: v for k, v in p.matches.items() if v}, p.name
        assert all(v > 0 for it in p.per_iteration for v in it.matches.values())
    assert sum(sum(it.matches.values()) for p in rep.phases for it in p.per_iteration) == sum(rep.matches.values())
    if not trace:
        assert all(it.enodes is None and it.wall is None for p in rep.phases for it in p.per_iteration)


def test_trace_gives_the_same_egraph_sizes_and_matches(sat):
    for t in (_chain(), _chain(90), _sum_chain()):
        text = _text(t)
        js0, r0 = sat.run(text, trace=False)
        js1, r1 = sat.run(text, trace=True)
        assert r0.stop_reason == r1.stop_reason == "completed"
        assert js0 == js1                                    # the same e-graph
        assert r0.enodes_before == r1.enodes_before and r0.enodes == r1.enodes
        assert [p.enodes for p in r0.phases] == [p.enodes for p in r1.phases]
        assert [p.iterations for p in r0.phases] == [p.iterations for p in r1.phases]
        assert r0.matches == r1.matches
        assert not r0.traced and r1.traced


def test_debug_4_traces_and_prints_the_growth(monkeypatch, capsys):
    # the same e-graph as untraced (test above), so the same plan; a program no other test compiled
    monkeypatch.setenv("EQGRAD_REGIONS", "0")
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    with eqgrad.Context(DEBUG=4):
        got = (_chain(61) * 3.0).numpy()
    rep = engine.last_plan.report
    assert rep.traced and rep.stop_reason == "completed" and np.isfinite(got).all()
    out = capsys.readouterr().out
    assert "e-graph growth per iteration (traced" in out and "cleanup" in out


def test_the_growth_table_lists_every_phase_with_the_sizes_per_iteration(sat):
    js, rep = sat.run(_text(_chain()), trace=True)
    rows = rep.growth_rows()
    names = [p.name for p in rep.phases]
    assert [r["phase"] for r in rows if r["iteration"] is None] == names          # an end row per phase
    prev = rep.enodes_before
    for r in rows:
        if r["iteration"] is None:
            assert r["enodes"] == next(p.enodes for p in rep.phases if p.name == r["phase"])
            assert r["delta"] == r["enodes"] - prev
            prev = r["enodes"]
        elif r["enodes"] is not None:
            assert r["delta"] == r["enodes"] - prev and r["seconds"] is not None
            prev = r["enodes"]
        else:
            assert r["whole"]        # only inside a run-schedule that trace mode ran whole (let-scheduler)
    # split phases (no scheduler) have a size after every iteration; algebra's let-scheduler runs whole
    for p in rep.phases:
        if p.name != "algebra":
            assert all(it.enodes is not None and not it.whole and it.ruleset for it in p.per_iteration), p.name
    alg = next(p for p in rep.phases if p.name == "algebra")
    assert all(it.whole for it in alg.per_iteration) and alg.per_iteration[-1].enodes == alg.enodes
    table = rep.growth()
    for name in names:
        assert f"  {name:<10}" in table
    assert "let-scheduler" in table and "traced" in table
    assert "e-nodes per phase only" in sat.run(_text(_chain()), trace=False)[1].growth()


def test_a_blowup_rulebook_shows_its_growth_iteration_by_iteration(sat, tmp_path):
    p = tmp_path / "acadd.egg"
    p.write_text(AC_ADD)
    text = _text(_sum_chain(10))
    with eqgrad.Context(EGRAPH_NODES=100_000), rulebook.using(p, phase="algebra", iterations=5):
        js, rep = sat.run(text, rules=rulebook.active_config(), trace=True)
    assert rep.stop_reason == "completed", rep
    alg = next(p for p in rep.phases if p.name == "algebra")
    mine = [it for it in alg.per_iteration if it.ruleset == "acadd"]
    assert len(mine) == 5
    sizes = [it.enodes for it in mine]
    assert sizes == sorted(sizes) and sizes[-1] > 4 * sizes[0]          # it grows, iteration by iteration
    assert all(any(k.startswith(("add-comm", "add-assoc")) for k in it.matches) for it in mine)
    assert "add-comm" in rep.growth() or "add-assoc" in rep.growth()


def test_the_node_limit_stop_names_the_phase_in_the_growth_table(sat, tmp_path):
    p = tmp_path / "acadd.egg"
    p.write_text(AC_ADD)
    text = _text(_sum_chain(10))
    with eqgrad.Context(EGRAPH_NODES=3000), rulebook.using(p, phase="algebra", iterations=6):
        cfg = rulebook.active_config()
        js0, r0 = sat.run(text, rules=cfg, trace=False)
        js1, r1 = sat.run(text, rules=cfg, trace=True)
    for rep in (r0, r1):
        assert rep.stop_reason == "node limit" and "after phase algebra" in rep.detail, rep
        assert rep.phases[-1].name == "algebra" and rep.phases[-1].enodes > 3000
        assert "stopped:" in rep.growth() and "after phase algebra (EQGRAD_EGRAPH_NODES)" in rep.growth()
    assert js0 == js1 and r0.enodes == r1.enodes
    traced = [it.enodes for it in r1.phases[-1].per_iteration if it.ruleset == "acadd"]
    assert traced and traced[-1] > 3000                       # the iteration that crossed the limit
    assert max(traced[:-1], default=0) < 3000


def test_reports_with_iterations_survive_the_disk_cache_form():
    import dataclasses
    from eqgrad.engine import diskcache
    rep = SaturationReport("completed", [PhaseReport("a", 0.1, 1, 10, {"r": 2}, {}, [IterationStats({"r": 2}, enodes=10)],
                                                     traced=True)], 5, 10)
    back = diskcache._report_of(dataclasses.asdict(rep))
    assert back == rep and isinstance(back.phases[0].per_iteration[0], IterationStats)
    old = dataclasses.asdict(rep)
    for ph in old["phases"]:                  # a report stored before per-iteration data existed
        del ph["per_iteration"], ph["traced"]
    assert diskcache._report_of(old).phases[0].per_iteration == []
    with pytest.raises((TypeError, ValueError)):
        diskcache._report_of({**old, "phases": [{**old["phases"][0], "per_iteration": [{"bogus": 1}]}]})
