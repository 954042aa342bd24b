"""Faults never give a wrong answer or a hang: each is forced here and must produce the right
numbers with a warning that names the limit, or a clear error."""
import os
import signal

import numpy as np
import pytest

import eqgrad
from eqgrad import EqgradWarning, Tensor, engine
from eqgrad.rules import saturate


def _prog(x: Tensor, depth: int) -> Tensor:
    y = x
    for i in range(depth):
        y = (y * 1.5 + i).permute(1, 0) if i % 2 else y.exp2() * 0.5
    return y


def _ref(x: np.ndarray, depth: int) -> np.ndarray:
    y = x
    for i in range(depth):
        y = (y * np.float32(1.5) + np.float32(i)).T if i % 2 else np.exp2(y) * np.float32(0.5)
    return y


def test_killed_worker_falls_back_with_a_warning(monkeypatch):
    """The egglog worker is killed (SIGKILL) while it holds the request: the realize still returns
    the right numbers (unoptimized plan) with a warning, and the next realize gets a new worker."""
    saturate.reset_saturator()
    sat = saturate.default_saturator()
    sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)       # worker up
    real_send = saturate.Connection.send

    def send_then_die(conn, obj):
        real_send(conn, obj)
        if isinstance(obj, tuple) and obj and obj[0] == "run" and sat._proc is not None:
            os.kill(sat._proc.pid, signal.SIGKILL)
    monkeypatch.setattr(saturate.Connection, "send", send_then_die)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32) * 0.1
    with pytest.warns(EqgradWarning, match="worker died"):
        got = _prog(Tensor(x), 41).numpy()
    np.testing.assert_allclose(got, _ref(x, 41), rtol=1e-4, atol=1e-4)
    assert engine.last_plan.report.stop_reason == "worker died"
    monkeypatch.setattr(saturate.Connection, "send", real_send)
    out = Tensor(x) * 2 + 1
    np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
    assert engine.last_plan.report.stop_reason == "completed"


def test_kernel_that_fails_to_compile_names_kernel_device_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    import eqgrad.devices.cpu as cpu
    real = cpu.render_llvm
    monkeypatch.setattr(cpu, "render_llvm", lambda lk: real(lk).replace("ret void", "ret i32 0"))
    engine.clear_cache()
    with pytest.raises(eqgrad.CompileError, match=r"LLVM device: kernel k0 .* failed to compile.*written to") as e:
        (Tensor(np.ones((3, 3), np.float32)) * 17 + 3).realize()
    path = str(e.value).rsplit("written to ", 1)[1]
    assert os.path.exists(path) and "ret i32 0" in open(path).read()
    monkeypatch.setattr(cpu, "render_llvm", real)
    engine.clear_cache()


def test_unknown_device_is_a_clear_error():
    with pytest.raises(eqgrad.DeviceError, match="unknown device 'TPU'"):
        Tensor([1.0], device="TPU")


def test_plan_cache_is_bounded_and_clearable():
    with eqgrad.Context(PLAN_CACHE=5):
        for n in range(1, 12):
            Tensor(np.ones((n, 2), np.float32)).sum(0).realize()
        assert len(engine._plan_cache) <= 5
    engine.clear_cache()
    assert len(engine._plan_cache) == 0
