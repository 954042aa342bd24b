"""A forked child can realize: the LLVM device's thread pool, the saturation
worker and its lock are re-created in the child; the parent's worker is left alone. It can also
when another thread was compiling at the fork. A hang fails the test after a
timeout instead of hanging CI."""
import faulthandler
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, NoReturn

import numpy as np
import pytest

import eqgrad
import eqgrad.devices
from eqgrad import Tensor, cache, engine
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


def _report_and_exit(w: int, body: Callable[[], tuple[int, str]]) -> NoReturn:
    """In a forked child: run ``body`` (its exit code and message), write the message -- or the
    traceback of what it raised, with exit code 1 -- to the pipe ``w``, and exit without returning."""
    code, msg = 1, ""
    try:
        code, msg = body()
    except BaseException:
        msg = traceback.format_exc()
    finally:
        os.write(w, msg.encode()[:60000])
        os.close(w)
        os._exit(code)


def _split_runner() -> object | None:
    """What runs this process's split kernels: its native workers (devices/spin.py) where the
    platform has them, else the LLVM device's Python pool; None if there is none yet."""
    from eqgrad.devices import spin
    if spin.available():
        w = spin._WORKERS
        return w if w is not None and w._pid == os.getpid() else None
    return eqgrad.devices.get_device("LLVM")._pool


def test_forked_child_realizes_threaded_kernels_and_saturates():
    # the parent has worker threads (idle) and a running saturation worker
    err, stop = _threaded_and_saturating(0)
    assert err < 1e-4 and stop == "completed"
    parent_pool = _split_runner()
    assert parent_pool is not None, "the parent's kernel did not use the worker threads"
    parent_worker = _worker_pid()
    assert parent_worker is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: report through the pipe, never return
        os.close(r)

        def child() -> tuple[int, str]:
            signal.alarm(int(HANG) + 30)           # a last resort if the parent's kill fails
            err, stop = _threaded_and_saturating(1)
            child_pool = _split_runner()
            child_worker = _worker_pid()
            ok = (err < 1e-4 and stop == "completed" and child_pool is not None and child_pool is not parent_pool
                  and child_worker not in (None, parent_worker))
            msg = f"err={err} stop={stop} pool_new={child_pool is not parent_pool} worker={child_worker}"
            saturate.reset_saturator()             # what the child's atexit does: ends the CHILD's worker
            return (0 if ok else 1), msg
        _report_and_exit(w, child)
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

        def child() -> tuple[int, str]:
            signal.alarm(int(HANG) + 30)
            try:
                Tensor(np.ones(4, np.float32), device="OPENCL").numpy()
            except eqgrad.DeviceError as e:
                return 0, str(e)
            return 0, "no error"
        _report_and_exit(w, child)
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


def _fork_child(seed: int, hang: float = FORK_HANG) -> tuple[int, int]:
    """Fork a child that realizes a new program (it saturates and compiles) and exits 0 when its
    value is right; (its pid, the read end of a pipe with its error or, if it hangs, where)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)

        def child() -> tuple[int, str]:
            signal.alarm(int(hang) + 30)          # a last resort if the parent's kill fails
            faulthandler.dump_traceback_later(hang / 2, file=w)
            t, ref = _new_program(seed, n=8)
            err = float(np.max(np.abs(t.numpy() - ref) / np.maximum(1, np.abs(ref))))
            return (0 if err < 1e-4 else 1), f"err={err}"
        _report_and_exit(w, child)
    os.close(w)
    return pid, r


def test_fork_at_any_moment_of_another_threads_compile(monkeypatch):
    """A fork while another thread compiles used to hang the child (3 of 3 at the right
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
    failed = _reap(children, FORK_HANG)
    th.join(FORK_HANG)
    assert not failed, "\n".join(failed)
    assert not errors, errors[0]


def _reap(children: list[tuple[str, int, int]], hang: float) -> list[str]:
    """Wait for the children of ``_fork_child`` (when it forked, pid, pipe), killing those still
    running ``hang`` seconds from now; one line for each that hung or failed, naming when it forked."""
    failed = []
    deadline = time.monotonic() + hang
    for when, pid, r in children:
        code = _wait(pid, max(1.0, deadline - time.monotonic()), fail=False)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode()
        if code != 0:
            failed.append(f"fork {when}: {'hung' if code is None else f'exit {code}'}: {msg}")
    return failed


FIRST_USE_DELAYS_MS = (0, 0.1, 0.5, 1, 2, 5, 10, 15, 20, 30, 50, 100, 200, 400)
FIRST_USE_HANG = 15.0          # seconds (a child realizes in ~1-5 s, all of them at once on 2 cores)


def _fork_into_first_use(delays_ms: list[float], hang: float) -> list[str]:
    """A thread makes this process's first Tensor and realizes new programs; a child is forked at
    each of ``delays_ms`` after the thread started (the first Tensor imports the LLVM device's
    module, then the first realize starts the saturation worker, saturates and compiles) and
    realizes a new program of its own. One line for each child that hung or failed. Run in a
    process of its own (``__main__`` below), where nothing has used eqgrad yet."""
    stop = False

    def first_use():
        for s in range(64, 192):
            if stop:
                return
            _new_program(s)[0].numpy()

    th = threading.Thread(target=first_use, daemon=True)
    t0 = time.perf_counter()
    th.start()
    children = []
    try:
        for i, delay in enumerate(delays_ms):
            time.sleep(max(0.0, t0 + delay / 1e3 - time.perf_counter()))
            # seeds 8-21: structures the thread never builds
            children.append((f"{delay:g} ms into another thread's first use", *_fork_child(8 + i, hang)))
    finally:
        stop = True
    failed = _reap(children, hang)
    th.join(hang)
    return failed


def test_fork_at_any_moment_of_another_threads_first_use(tmp_path):
    """A fork while another thread starts eqgrad, in a process of its own, where nothing has used
    eqgrad yet (in pytest's the LLVM device exists already): a fork while another thread made its first Tensor hung the child
    on the import lock of devices/cpu.py, which that thread was importing (get_device). Forks at
    0-400 ms after the thread started; each child realizes a new program. Before: 14, 13 and 13
    of the 14 children hung in 3 runs."""
    args = [sys.executable, __file__, ",".join(map(str, FIRST_USE_DELAYS_MS)), str(FIRST_USE_HANG)]
    proc = subprocess.Popen(args, env=dict(os.environ, EQGRAD_CACHE_DIR=str(tmp_path)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=FIRST_USE_HANG + 60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)           # faulthandler prints where its threads are
        out, err = proc.communicate()
        pytest.fail(f"the forking process itself hung (fork hooks taking locks in the wrong order?):\n{err[-20000:]}")
    assert proc.returncode == 0, f"{out}\n{err[-20000:]}"


def test_forked_child_writes_a_json_cache_another_thread_was_writing(tmp_path, monkeypatch):
    """A fork while another thread stored a JSON cache entry (cache.py ``JsonCache.put``, which
    holds cache._lock and a flock on the cache's lock file): the child's own store waited forever,
    on cache._lock, and on the flock, which the child's copy of the descriptor kept after the
    parent's thread had closed its own."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    store = cache.JsonCache("forktest", 1)
    writing, write_atomic = threading.Event(), cache._write_atomic

    def slow_write(*args, **kwargs):          # the parent's thread holds both locks for 0.3 s
        writing.set()
        time.sleep(0.3)
        return write_atomic(*args, **kwargs)
    monkeypatch.setattr(cache, "_write_atomic", slow_write)
    th = threading.Thread(target=store.put, args=("parent", 1))
    th.start()
    assert writing.wait(30)
    pid = os.fork()
    if pid == 0:
        signal.alarm(int(FORK_HANG))
        cache._write_atomic = write_atomic
        os._exit(0 if store.put("child", 2) is not None else 1)
    th.join()
    assert _wait(pid, 30) == 0
    assert cache.JsonCache("forktest", 1).load() == {"parent": 1, "child": 2}


_LOCK_ORDER = """
import os, threading, time
from eqgrad import devices
from eqgrad.devices import llvm
held = threading.Event()

def first_device():               # as get_device making the LLVM device: LLVM called under _devices_lock
    with devices._devices_lock:
        held.set()
        time.sleep(0.2)           # the fork starts meanwhile
        with llvm.COMPILE_LOCK:
            llvm.host_target.__wrapped__()

th = threading.Thread(target=first_device)
th.start()
held.wait()
pid = os.fork()
if pid == 0:
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
th.join()
"""


def test_fork_takes_devices_lock_before_compile_lock():
    """The fork hooks take _devices_lock, then COMPILE_LOCK: a device's import or constructor,
    which get_device runs under _devices_lock, may call LLVM (llvm.py's import did, when the LLVM
    device's import imported it), and in the other order a fork made meanwhile deadlocked. Hooks
    run last registered first, so devices/__init__.py imports llvm.py before registering its own;
    without that import this deadlocks."""
    try:
        r = subprocess.run([sys.executable, "-c", _LOCK_ORDER], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the fork deadlocked: its hooks took COMPILE_LOCK before _devices_lock")
    assert r.returncode == 0, r.stderr


if __name__ == "__main__":       # test_fork_at_any_moment_of_another_threads_first_use's process
    # (not dump_traceback_later: its watchdog thread's lock, held at a fork, hangs the child's own)
    faulthandler.enable()
    failed = _fork_into_first_use([float(d) for d in sys.argv[1].split(",")], float(sys.argv[2]))
    print("\n".join(failed))
    sys.exit(1 if failed else 0)
