"""A forked child can realize (issue 12, item 3): the LLVM device's thread pool, the saturation
worker and its lock are re-created in the child; the parent's worker is left alone. A hang fails
the test after a timeout instead of hanging CI."""
import multiprocessing
import os
import signal
import time
import traceback

import numpy as np
import pytest

import eqgrad
import eqgrad.devices
from eqgrad import Tensor, engine
from eqgrad.rules import saturate

BIG = (2048, 2048)          # 4M elements, split across threads (PARALLEL_MIN pinned: the split is otherwise measured)
HANG = 120.0                # seconds before a child counts as hung


def _threaded_and_saturating(seed: int) -> tuple[float, str]:
    """A kernel split across EQGRAD_THREADS=2 threads and a program of a new structure (it must be
    saturated); returns the larger relative error against NumPy and the saturation's stop reason."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(BIG).astype(np.float32)
    with eqgrad.Context(THREADS=2):
        got = (Tensor(x) * 3.0 - 1.0).numpy()
        err = float(np.max(np.abs(got - (x * np.float32(3) - np.float32(1)))))
        a = rng.standard_normal((3 + seed % 5, 4)).astype(np.float32)
        # a new structure per seed (one more sqrt each): new sizes alone would resize a cached plan
        t, ref = (Tensor(a) * (2.0 + seed)).permute(1, 0).exp2() + 1.0, np.exp2((a * np.float32(2.0 + seed)).T) + np.float32(1)
        for _ in range(seed):
            t, ref = t.sqrt(), np.sqrt(ref)
        y, ref = t.sum(0).numpy(), ref.sum(0)
        err = max(err, float(np.max(np.abs(y - ref) / np.maximum(1, np.abs(ref)))))
    return err, engine.last_plan.report.stop_reason


def _worker_pid() -> int | None:
    proc = saturate.default_saturator()._proc
    return proc.pid if proc is not None else None


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung (no exit within {timeout:g} s)")


@pytest.fixture(autouse=True)
def _split_every_kernel(monkeypatch):
    import eqgrad.devices.cpu as cpu
    monkeypatch.setattr(cpu, "PARALLEL_MIN", 0.0)


def test_forked_child_realizes_threaded_kernels_and_saturates():
    # the parent has a pool with idle threads and a running worker
    err, stop = _threaded_and_saturating(0)
    assert err < 1e-4 and stop == "completed"
    cpu = eqgrad.devices.get_device("LLVM")
    parent_pool = cpu._pool
    assert parent_pool is not None, "the parent's kernel did not use the thread pool"
    parent_worker = _worker_pid()
    assert parent_worker is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: report through the pipe, never return
        os.close(r)
        code, msg = 1, ""
        try:
            signal.alarm(int(HANG) + 30)           # a last resort if the parent's kill fails
            err, stop = _threaded_and_saturating(1)
            child_pool = eqgrad.devices.get_device("LLVM")._pool
            child_worker = _worker_pid()
            ok = (err < 1e-4 and stop == "completed" and child_pool is not None and child_pool is not parent_pool
                  and child_worker not in (None, parent_worker))
            msg = f"err={err} stop={stop} pool_new={child_pool is not parent_pool} worker={child_worker}"
            saturate.reset_saturator()             # what the child's atexit does: ends the CHILD's worker
            code = 0 if ok else 1
        except BaseException:
            msg = traceback.format_exc()
        finally:
            os.write(w, msg.encode()[:60000])
            os.close(w)
            os._exit(code)
    os.close(w)
    code = _wait(pid, HANG)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    assert code == 0, msg
    # the parent's worker was not touched by the child, and the parent still realizes
    sat = saturate.default_saturator()
    assert _worker_pid() == parent_worker and sat._proc.poll() is None
    err, stop = _threaded_and_saturating(2)
    assert err < 1e-4 and stop == "completed" and _worker_pid() == parent_worker


def _pool_job(seed: int) -> tuple[float, str, int]:
    err, stop = _threaded_and_saturating(seed)
    return err, stop, os.getpid()


@pytest.mark.parametrize("method", [None, "forkserver"])
def test_multiprocessing_pool_realizes(method):
    """The default start method (fork on Linux up to Python 3.13) and forkserver (3.14's default)."""
    err, stop = _threaded_and_saturating(3)            # pools and worker exist before the Pool forks
    assert err < 1e-4 and stop == "completed"
    ctx = multiprocessing.get_context(method)
    pool = ctx.Pool(2)
    try:
        results = pool.map_async(_pool_job, range(10, 14)).get(timeout=HANG)
    except multiprocessing.TimeoutError:
        pytest.fail(f"a multiprocessing worker hung (start method {ctx.get_start_method()})")
    finally:
        pool.terminate()
        pool.join()
    for err, stop, pid in results:
        assert err < 1e-4 and stop == "completed" and pid != os.getpid()
    assert saturate.default_saturator()._proc.poll() is None     # the parent's worker still runs


def test_forked_child_gets_a_clear_error_for_an_opencl_runtime_started_before_the_fork():
    try:
        eqgrad.devices.get_device("OPENCL")
    except eqgrad.DeviceError:
        pytest.skip("no OpenCL here")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msg = ""
        try:
            signal.alarm(int(HANG) + 30)
            Tensor(np.ones(4, np.float32), device="OPENCL").numpy()
            msg = "no error"
        except eqgrad.DeviceError as e:
            msg = str(e)
        except BaseException:
            msg = traceback.format_exc()
        finally:
            os.write(w, msg.encode()[:60000])
            os.close(w)
            os._exit(0)
    os.close(w)
    _wait(pid, 60)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    assert "os.fork()" in msg and "spawn" in msg, msg
    # the parent's OpenCL still works
    np.testing.assert_allclose((Tensor(np.ones(4, np.float32), device="OPENCL") * 2).numpy(), 2.0)
