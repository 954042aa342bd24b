"""The measured extractor repeats measurements until the winner beats the others beyond
noise (else it keeps the model's choice), always measures greedy's plan, and never keeps a plan
measured slower than greedy's (it cached a 2-kernel layernorm at 6.0 ms against greedy's 1.1 ms)."""
import numpy as np
import pytest

from eqgrad import engine
from eqgrad.extract import cost_model, make_extractor
from eqgrad.extract.measured import ROUNDS_MAX, ROUNDS_MIN, MeasuredExtractor, choice_signature
from test_improve_never_worse import _mlp4_wide


@pytest.fixture(scope="module")
def planned():
    cp, _ = engine.plan_for([o.lazydata for o in _mlp4_wide()])
    return cp.egraph, [cp.plan.buffers[i] for i in range(cp.plan.n_inputs)]


def _extract(planned, times):
    g, specs = planned
    calls = []

    def measure(choice):
        calls.append(choice)
        return times(choice, len(calls))
    ex = MeasuredExtractor(g, cost_model("LLVM"), specs, measure=measure, k=4)
    return ex, ex.extract(), calls


def test_greedy_plan_is_measured_and_a_slower_winner_gives_way(planned):
    g, specs = planned
    greedy = make_extractor("greedy", g, "LLVM", specs).extract()
    ex = MeasuredExtractor(g, cost_model("LLVM"), specs, k=4)

    def sig(ch):
        return choice_signature(g, ch, ex.ev.reachable(ch))
    # every plan but greedy's measures 6 ms, greedy's 1 ms (the layernorm it once cached: 6.0 vs 1.1)
    ex.measure = lambda choice: 1e-3 if sig(choice) == sig(ex.greedy_plan[0]) else 6e-3
    res = ex.extract()
    assert ex.greedy_plan is not None and sig(res.choice) == sig(ex.greedy_plan[0])
    assert res.evaluation.total == pytest.approx(greedy.evaluation.total)
    assert res.info["verdict"] == "fastest beyond noise" and res.info["rounds"] == ROUNDS_MIN


def test_noise_keeps_the_models_choice(planned):
    rng = np.random.default_rng(0)
    ex, res, calls = _extract(planned, lambda choice, n: 1e-3 * (1 + 0.2 * rng.random()))   # all alike
    assert res.info["rounds"] == ROUNDS_MAX and len(calls) == ROUNDS_MAX * len(res.candidates) + \
        (ROUNDS_MAX if len(res.info["measured"]) > len(res.candidates) else 0)
    assert res.info["picked"] == 0 and "model's choice" in res.info["verdict"]
