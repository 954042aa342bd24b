"""A forked child can realize (issue 12, item 3): the LLVM device's thread pool, the saturation
worker and its lock are re-created in the child; the parent's worker is left alone. It can also
when another thread was compiling at the fork (issue 38, item 5). A hang fails the test after a
timeout instead of hanging CI."""
import faulthandler
import itertools
import multiprocessing
import os
import signal
import threading
import time
import traceback

import numpy as np
import pytest

import eqgrad
import eqgrad.devices
from eqgrad import Tensor, engine
from eqgrad.devices import llvm_worker
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


def _wait(pid: int, timeout: float, fail: bool = True) -> int | None:
    """The child's exit code; a child that runs past ``timeout`` is killed and fails the test
    (``fail``) or gives None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if fail:
        pytest.fail(f"the forked child hung (no exit within {timeout:g} s)")
    return None


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


FORK_DELAYS = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)   # seconds after the other thread enters LLVM
FORK_HANG = 60.0
_RUNS = itertools.count()


def _new_program(seed: int, n: int = 64) -> tuple[Tensor, np.ndarray]:
    """A small program of a structure of its own per ``seed`` (its bits choose the ops), so its
    realize saturates and compiles new kernels (two: a row reduction feeds the rest); and its
    NumPy value."""
    x = np.linspace(-1, 1, n * 8, dtype=np.float32).reshape(n, 8)
    t, ref = Tensor(x), x
    for bit in range(seed.bit_length()):
        if seed >> bit & 1:
            t, ref = (t * 0.5).exp2(), np.exp2(ref * np.float32(0.5))
        else:
            t, ref = (t + 2.0).sqrt(), np.sqrt(ref + np.float32(2))
    t, ref = t / t.sum(1, keepdim=True), ref / ref.sum(1, keepdims=True)
    return t.sum(0), ref.sum(0)


def _fork_child(seed: int) -> tuple[int, int]:
    """Fork a child that realizes a new program (it saturates and compiles) and exits 0 when its
    value is right; (its pid, the read end of a pipe with its error or, if it hangs, where)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code, msg = 1, ""
        try:
            signal.alarm(int(FORK_HANG) + 30)          # a last resort if the parent's kill fails
            faulthandler.dump_traceback_later(FORK_HANG / 2, file=w)
            t, ref = _new_program(seed, n=8)
            err = float(np.max(np.abs(t.numpy() - ref) / np.maximum(1, np.abs(ref))))
            code, msg = (0 if err < 1e-4 else 1), f"err={err}"
        except BaseException:
            msg = traceback.format_exc()
        finally:
            os.write(w, msg.encode()[:60000])
            os.close(w)
            os._exit(code)
    os.close(w)
    return pid, r


def test_fork_at_any_moment_of_another_threads_compile(monkeypatch):
    """Issue 38 item 5: a fork while another thread compiles hung the child (3 of 3 at the right
    moment): it waited on a lock that a thread it does not have held at the fork -- llvmlite's (the
    parent's thread inside LLVM), COMPILE_LOCK, a module's import lock (a first import inside a
    function). Each child here realizes a new program whatever the parent's thread was doing:
    forks at its start, and at 0-50 ms after it entered an LLVM compile (of new programs, one
    after another)."""
    base = 64 + 256 * next(_RUNS)          # new structures in each run of the test in one process
    stop, errors, entered = False, [], threading.Event()
    compile_object = llvm_worker.compile_object

    def signalling(*args, **kwargs):
        entered.set()
        return compile_object(*args, **kwargs)
    monkeypatch.setattr(llvm_worker, "compile_object", signalling)

    def compile_new_programs():
        try:
            for s in range(base, base + 128):
                if stop:
                    return
                # every other one on one thread: with two, the compile worker takes some kernels
                with eqgrad.Context(THREADS=1 + s % 2):
                    _new_program(s)[0].numpy()
        except BaseException:
            errors.append(traceback.format_exc())

    th = threading.Thread(target=compile_new_programs, daemon=True)
    th.start()
    children = []
    try:
        children.append(("at its start", *_fork_child(8)))      # seeds 8-15: structures the parent never compiles
        for i, delay in enumerate(FORK_DELAYS):
            entered.clear()
            assert entered.wait(FORK_HANG), "the thread compiled nothing"
            time.sleep(delay)
            children.append((f"{delay * 1e3:g} ms into an LLVM compile", *_fork_child(9 + i)))
    finally:
        stop = True
    failed = []
    deadline = time.monotonic() + FORK_HANG
    for when, pid, r in children:
        code = _wait(pid, max(1.0, deadline - time.monotonic()), fail=False)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode()
        if code != 0:
            failed.append(f"fork {when}: {'hung' if code is None else f'exit {code}'}: {msg}")
    th.join(FORK_HANG)
    assert not failed, "\n".join(failed)
    assert not errors, errors[0]
