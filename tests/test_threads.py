"""Concurrent realizes from several threads give right answers (docs/engine.md).

The stress runs in a child process (this file run as a script): before the fix, concurrent LLVM
compiles crashed the process with a segfault, which would have taken the whole test run down, and
a hang must fail the test, not CI. The child sets a 10 us thread switch interval: at the default
5 ms one thread runs a whole small realize between switches and the races hide (the old code
passed 4 of 5 runs at 5 ms and crashed or went wrong in every run at 10 us). Each result is checked
against NumPy; the child prints every thread's stack if it is still running after ``HANG_S``.

The other tests pin each piece of per-thread state with two threads in lockstep (barriers), so
they fail deterministically when that state is shared.
"""
from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
THREADS = 4
ROUNDS = 200
HANG_S = 60           # the child dumps its threads' stacks and exits after this long
SHAPES = [(8, 16), (4, 32), (16, 8), (8, 8)]      # "different": each thread changes shape once, halfway
MODES = ("identical", "different")

# (eqgrad function, NumPy function) of two (rows, cols) float32 arrays
PROGRAMS = [
    (lambda a, b: (a * b + a).sum(axis=1), lambda a, b: (a * b + a).sum(axis=1)),
    (lambda a, b: (a - b).exp().amax(axis=0), lambda a, b: np.exp(a - b).max(axis=0)),
    (lambda a, b: a @ b.T + 1, lambda a, b: a @ b.T + 1),
    (lambda a, b: a.maximum(b) * 2 - b, lambda a, b: np.maximum(a, b) * 2 - b),
]


def stress(device: str, mode: str, rounds: int = ROUNDS, threads: int = THREADS) -> list[str]:
    """``threads`` threads realize ``rounds`` programs each on ``device`` and compare with NumPy;
    the errors (empty when all were right). ``identical``: every thread runs program 0 and all
    change shape every 25 rounds, so they miss the plan cache together and compile the same plans
    at once (under EQGRAD_OPT=0: the saturation worker serves one request at a time, which would
    space the compiles out). ``different``: thread t runs program t, saturated, and changes shape
    halfway, so plans saturate and compile while other threads run theirs."""
    from eqgrad import Tensor
    errors: list[str] = []
    start = threading.Barrier(threads)

    def work(tid: int) -> None:
        rng = np.random.default_rng(tid)
        f, g = PROGRAMS[tid % len(PROGRAMS) if mode == "different" else 0]
        try:
            start.wait()
            for r in range(rounds):
                if mode == "different":
                    shape = SHAPES[(2 * r // rounds + tid) % len(SHAPES)]
                else:
                    shape = (SHAPES[r // 25 % len(SHAPES)][0], 16 + r // 25 // len(SHAPES))
                x = rng.standard_normal(shape).astype(np.float32)
                y = rng.standard_normal(shape).astype(np.float32)
                got = f(Tensor(x, device=device), Tensor(y, device=device)).numpy()
                want = g(x, y)
                if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                    errors.append(f"thread {tid} round {r}: wrong result {got.ravel()[:4]} != {want.ravel()[:4]}")
                    return
        except Exception as e:            # noqa: BLE001 -- reported by the parent
            errors.append(f"thread {tid}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=HANG_S)
    errors += [f"{t.name} still running after {HANG_S}s" for t in ts if t.is_alive()]
    return errors


def _available(device: str) -> bool:
    import eqgrad.devices
    try:
        eqgrad.devices.get_device(device)
        return True
    except eqgrad.DeviceError:
        return False


@pytest.mark.parametrize("device", ["LLVM", "NUMPY", "OPENCL"])
def test_concurrent_realizes_are_right(device):
    """Both modes in one child per device (a child's start-up, ~4 s here, is most of the cost)."""
    if not _available(device):
        pytest.skip(f"{device} is not available here")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run([sys.executable, __file__, device, *MODES], capture_output=True, text=True,
                           timeout=2 * HANG_S + 60, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{device}: the stress hung (killed after {e.timeout}s):\n{(e.stderr or '')[-3000:]}")
    assert r.returncode == 0, f"{device}: exit code {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.split() == [f"{m}:ok" for m in MODES], r.stdout


# ------------------------------------------------------------------ per-thread state, in lockstep

def _lockstep(*steps_of_threads):
    """Run one function per thread; each gets a barrier ``sync()`` to line the threads up. Raises
    the first error of any thread."""
    barrier = threading.Barrier(len(steps_of_threads), timeout=60)
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn(barrier.wait)
        except BaseException as e:        # noqa: BLE001 -- re-raised below
            errors.append(e)
            barrier.abort()
    ts = [threading.Thread(target=run, args=(fn,)) for fn in steps_of_threads]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    if errors:
        raise errors[0]


def test_context_overrides_belong_to_their_thread():
    import eqgrad
    from eqgrad import config
    before = config.DEBUG.value              # the environment's: the main thread overrides no DEBUG

    def a(sync):
        with eqgrad.Context(DEBUG=1):
            sync()                           # 1: a's block is open
            sync()                           # 2: b's block is open
            assert config.DEBUG.value == 1, "another thread's Context changed this thread's flags"
        sync()                               # 3: a's block has closed, b's is still open
        sync()

    def b(sync):
        sync()
        assert config.DEBUG.value == before, "another thread's Context changed this thread's flags"
        with eqgrad.Context(DEBUG=2):
            sync()
            sync()
            assert config.DEBUG.value == 2, "another thread's Context exit dropped this block's override"
        sync()
    _lockstep(a, b)


def test_extraction_overrides_belong_to_their_thread():
    from eqgrad.extract import settings_key, using

    def cost(s, p):
        return s.nbytes
    base = settings_key("NUMPY")

    def a(sync):
        with using(cost_fn=cost, extractor="improve"):
            mine = settings_key("NUMPY")
            sync()
            sync()
            assert settings_key("NUMPY") == mine
        sync()

    def b(sync):
        sync()
        assert settings_key("NUMPY") == base, "another thread's using() changed this thread's extraction"
        sync()
        sync()
        assert settings_key("NUMPY") == base
    _lockstep(a, b)


def test_a_jit_capture_records_only_its_own_thread():
    import eqgrad
    from eqgrad import Tensor
    inside, outside_done = threading.Event(), threading.Event()

    @eqgrad.jit
    def step(x):
        y = (x * 2).realize()
        if capturing[0]:
            inside.set()
            assert outside_done.wait(60)      # another thread realizes while this call captures
        return (y + 1).realize()
    capturing = [False]          # stays True after the capture: the JIT guards what the capture read
    got = []

    def a(sync):
        x = Tensor(np.ones(4, np.float32))
        step(x)                               # warm-up
        capturing[0] = True
        got.append(step(x).numpy())           # the capture
        got.append(step(Tensor(np.full(4, 3.0, np.float32))).numpy())    # a replay

    def b(sync):
        assert inside.wait(60)
        z = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        (z.exp() * 5).sum().realize()         # two plans of its own: not the capture's
        outside_done.set()
    _lockstep(a, b)
    assert step.replays == 1
    np.testing.assert_array_equal(got[0], np.full(4, 3.0))
    np.testing.assert_array_equal(got[1], np.full(4, 7.0))
    assert step.kernels_per_call() == 2, "the capture recorded another thread's kernels"


def test_last_plan_is_per_thread():
    from eqgrad import Tensor, engine
    plans = {}

    def run(name, shape):
        def f(sync):
            t = Tensor(np.ones(shape, np.float32)) + 1
            sync()
            t.realize()
            sync()                            # both realized: each still sees its own plan
            plans[name] = engine.last_plan.plan.buffers[-1][0]
        return f
    _lockstep(run("a", (3,)), run("b", (5, 2)))
    assert plans == {"a": (3,), "b": (5, 2)}


if __name__ == "__main__":
    sys.setswitchinterval(1e-5)
    faulthandler.enable()
    faulthandler.dump_traceback_later(2 * HANG_S + 30, exit=True)
    failed = False
    for mode in sys.argv[2:]:
        os.environ["EQGRAD_OPT"] = "0" if mode == "identical" else "1"
        errs = stress(sys.argv[1], mode)
        print(f"{mode}:{'ok' if not errs else 'FAILED'}", flush=True)
        for e in errs[:8]:
            print(f"  {e}", flush=True)
        failed |= bool(errs)
    sys.exit(1 if failed else 0)
