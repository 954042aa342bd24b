"""The loop-IR index fuzzer (eqgrad/fuzz_index.py): bounded, seeded campaigns in CI, the
interpreter's own checks, and proof that the fuzzer finds the old truncating-division bug
(a negative index numerator divided by truncation, not floor)."""
import numpy as np
import pytest

from eqgrad.tools import fuzz_index
from eqgrad.dtype import int32
from eqgrad.tools.fuzz_index import Chain, campaign, check_chain
from eqgrad.graph import interp
from eqgrad.graph.loopir import NONNEG, LInst, LoopIRError, LoopKernel

from conftest import DEVICES


def test_loop_ir_campaign():
    """300 random movement chains: lowered, run by the loop-IR interpreter, every index
    expression's bounds checked at every point (no compiler: a few seconds)."""
    res = campaign(seed=12, count=300, devices=(), interp=True)
    assert res.failure is None, res.failure
    assert res.count == 300


def test_llvm_campaign():
    res = campaign(seed=13, count=120, devices=("LLVM", "NUMPY"), interp=False)
    assert res.failure is None, res.failure


@pytest.mark.skipif("OPENCL" not in DEVICES, reason="no OpenCL platform")
def test_opencl_campaign():
    res = campaign(seed=14, count=12, devices=("OPENCL",), interp=False)
    assert res.failure is None, res.failure


def test_engine_campaign():
    """Through the whole pipeline (saturation, extraction, lowering), as a user runs it."""
    res = campaign(seed=15, count=8, devices=("LLVM", "NUMPY"), interp=False, engine=True)
    assert res.failure is None, res.failure


def test_the_reported_chain():
    assert check_chain(Chain((2, 3), (("reshape", (6,)), ("flip", (0,)))), DEVICES) is None


def test_the_fuzzer_finds_the_truncation_bug(monkeypatch):
    """Put the old defect back -- the constant split that leaves negative numerators, rendered
    with truncating division -- and the campaign must find it within a few dozen chains and
    shrink it to a flip (or pad) after a merging reshape."""
    from eqgrad.devices import llvm
    from eqgrad.lower import symbolic
    monkeypatch.setattr(symbolic, "_split_constant", lambda const, rest_lo, d: divmod(const, d))
    real = llvm._div_guarded

    def truncating(c, ty, a, b, instr, index, nonneg=False):
        return real(c, ty, a, b, instr, index, nonneg=True if index else nonneg)
    monkeypatch.setattr(llvm, "_div_guarded", truncating)
    res = campaign(seed=0, count=60, devices=("LLVM",), interp=False)
    assert res.failure is not None, "the planted bug was not found"
    assert "[LLVM kernel]" in res.failure and "shrunk:" in res.failure
    shrunk = res.failure.split("shrunk: ")[1].splitlines()[0]
    assert "reshape" in shrunk and ("flip" in shrunk or "pad" in shrunk), res.failure


def test_interpreter_checks_nonneg_claims_and_bounds():
    ix = "index"
    head = [LInst("PARAM", int32, (), 0), LInst("PARAM", int32, (), 1), LInst("RANGE", ix, (), 4),
            LInst("CONST", ix, (), -2), LInst("ADD", ix, (2, 3)), LInst("CONST", ix, (), 3)]
    tail = [LInst("LOAD", int32, (1, 6)), LInst("STORE", None, (0, 2, 7)), LInst("ENDRANGE", None, (2,))]
    params = [("b1", int32, True), ("b0", int32, False)]
    out, inp = np.zeros(4, np.int32), np.arange(10, dtype=np.int32)
    ok = LoopKernel("k", params, head + [LInst("MOD", ix, (4, 5))] + tail, parallel=1)
    interp.run_loop(ok, [out, inp])
    np.testing.assert_array_equal(out, [(i - 2) % 3 for i in range(4)])       # floor modulo
    lie = LoopKernel("k", params, head + [LInst("MOD", ix, (4, 5), NONNEG)] + tail, parallel=1)
    with pytest.raises(LoopIRError, match="marked nonneg got the numerator -2"):
        interp.run_loop(lie, [out, inp])
    oob = LoopKernel("k", params, head + [LInst("ADD", ix, (4, 5))] + tail, parallel=1)   # i + 1 on 2 elements
    with pytest.raises(LoopIRError, match="LOAD at index 2 of parameter 1"):
        interp.run_loop(oob, [out, inp[:2].copy()])


def test_bounds_check_finds_an_unsound_bound(monkeypatch):
    from eqgrad.lower.symbolic import Div, Lin
    e = Lin(((Div(Lin.var("i", 6), 2), 1),), 0)          # i // 2 for i in [0, 5]: [0, 2]
    assert fuzz_index.check_bounds([e]) is None
    monkeypatch.setattr(Div, "bounds", property(lambda self: (0, 1)))
    err = fuzz_index.check_bounds([e])
    assert err is not None and "takes [0, 2], claimed bounds [0, 1]" in err


def test_cli_index_fuzz(capsys):
    from eqgrad.__main__ import main
    assert main(["fuzz", "--index", "--seed", "3", "--count", "20", "--device", "LLVM,NUMPY"]) == 0
    out = capsys.readouterr().out
    assert "20 random movement chains (seed 3)" in out and "no failures" in out
