"""A plan's new kernels compile two at a time, here and in the compile worker
(eqgrad/devices/compilepool.py): the worker's object code is the same bytes, its kernels run right,
and a worker that dies or answers an error only means this process compiles those kernels."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.devices import compilepool, get_device
from eqgrad.devices.llvm import compiler, render_llvm
from eqgrad.devices.llvm_worker import compile_object
from eqgrad.lower import trace


UNARY = [(lambda t: t.exp(), np.exp), (lambda t: t.sin(), np.sin), (lambda t: t.abs().sqrt(), lambda a: np.sqrt(np.abs(a))),
         (lambda t: (t.abs() + 1).log(), lambda a: np.log(np.abs(a) + 1)), (lambda t: t.tanh(), np.tanh),
         (lambda t: t.relu(), lambda a: np.maximum(a, 0))]


def distinct_kernels(tag: int, n: int = 6) -> tuple[list[Tensor], list[np.ndarray]]:
    """``n`` outputs that need ``n`` kernels of distinct structure (a different op each, reduced);
    ``tag`` picks sizes no other tag uses."""
    rng = np.random.default_rng(tag)
    xs = [rng.standard_normal((3 + i, 5 + 17 * tag)).astype(np.float32) for i in range(n)]
    outs = [UNARY[i][0](Tensor(x) * 0.5).sum(1) for i, x in enumerate(xs)]
    return outs, [UNARY[i][1](x * np.float32(0.5)).sum(1) for i, x in enumerate(xs)]


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    engine.clear_cache()
    gc.collect()
    get_device("LLVM").families.clear()
    # (a body traced by an earlier test -- its sizes kept changing there -- starts its family with
    # one sized program here, and later tags compile nothing: lower/trace.py)
    trace.TRACES.clear()
    yield compilepool.pool()
    engine.clear_cache()


def realize_and_check(tag: int) -> int:
    outs, want = distinct_kernels(tag)
    c0 = GlobalCounters.kernels_compiled
    eqgrad.realize(*outs)
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o.numpy(), w, rtol=2e-5, atol=1e-5)
    return GlobalCounters.kernels_compiled - c0


def test_new_kernels_compile_here_and_in_the_worker(two_threads, monkeypatch):
    pool = two_threads
    counts = {"local": 0, "remote": 0}
    local_remote = pool._remote

    def remote(target, job):
        counts["remote"] += 1
        return local_remote(target, job)
    monkeypatch.setattr(pool, "_remote", remote)
    assert realize_and_check(1) >= 6
    assert counts["remote"] >= 1, "the worker compiled none of the plan's kernels"
    assert pool.pid is not None


def test_the_worker_gives_the_bytes_this_process_gives(two_threads):
    pool = two_threads
    c = compiler(None)
    outs, _ = distinct_kernels(2, n=1)
    eqgrad.realize(*outs)
    plan = engine.last_plan.plan
    lk = get_device("LLVM").lowered_kernel(plan.kernels[0], plan)
    job = (render_llvm(lk), lk.name, "eqk_test_symbol", False)
    with pool._lock:
        assert pool._running()
        theirs = pool._remote((c.cpu, c.features), job)
    assert theirs is not None
    assert theirs == compile_object(c.llvm, c.tm, *job)


def test_a_dead_worker_means_this_process_compiles(two_threads):
    pool = two_threads
    realize_and_check(3)
    assert pool.pid is not None
    pool._proc.kill()
    pool._proc.wait()
    assert realize_and_check(4) >= 6          # compiled here; nothing lost
    assert realize_and_check(5) >= 6          # and a fresh worker for the next plan
    assert pool._proc.poll() is None


def test_a_job_the_worker_cannot_compile_is_compiled_here_and_raises_here(two_threads):
    pool = two_threads
    c = compiler(None)
    bad = ("define void @eqk() {\n  ret i32 0\n}\n", "eqk", "eqk_bad", False)
    with pool._lock:
        assert pool._running()
        assert pool._remote((c.cpu, c.features), bad) is None    # an error there: None, and it lives on
        assert pool._proc.poll() is None
    calls = []

    def local(job):
        calls.append(job)
        if job is bad:
            raise RuntimeError("invalid IR")
        return compile_object(c.llvm, c.tm, *job)
    good = ("define void @eqk() {\n  ret void\n}\n", "eqk", "eqk_good", False)
    with pytest.raises(RuntimeError, match="invalid IR"):
        pool.compile_all((c.cpu, c.features), [bad, good, good], local)
    assert bad in calls


def test_one_thread_compiles_everything_here(two_threads, monkeypatch):
    monkeypatch.setenv("EQGRAD_THREADS", "1")
    pool = two_threads
    pool.close()
    assert realize_and_check(6) >= 6
    assert pool.pid is None, "no worker is started with EQGRAD_THREADS=1"


def test_a_plan_with_nothing_new_to_compile_starts_no_worker(two_threads):
    """(A second process whose kernels are all on disk must not pay for a worker's start.)"""
    pool = two_threads
    outs, _ = distinct_kernels(7)
    eqgrad.realize(*outs)
    plan, keep = engine.last_plan.plan, engine.last_plan.run      # its programs stay alive
    pool.close()
    c0 = GlobalCounters.kernels_compiled
    get_device("LLVM").prepare(plan)
    assert GlobalCounters.kernels_compiled == c0 and pool.pid is None
    del keep


@pytest.mark.parametrize("shape, reduce, tiny", [((3, 5), False, True), ((8, 8), False, True), ((4, 16), True, True),
                                                 ((5, 13), False, False), ((5, 16), True, False), ((64, 64), False, False)])
def test_a_tiny_kernel_compiles_without_the_vectorizers(shape, reduce, tiny, monkeypatch):
    """A kernel whose loops run at most TINY_ITERATIONS iterations in all is marked so in its source
    and optimized without the loop and SLP vectorizers and unrolling (only compile time to gain:
    no vector body of the forced interleave on the widest lanes could run); a larger one keeps them.
    Its values are the reference's either way."""
    from eqgrad.devices.llvm import TINY_ITERATIONS
    from eqgrad.devices.llvm_worker import is_tiny, optimize, target_machine
    import llvmlite.binding as llvm
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = (Tensor(x) * 2 + 1).exp()
    out = t.sum(1) if reduce else t
    want = np.exp(x * np.float32(2) + np.float32(1))
    np.testing.assert_allclose(out.numpy(), want.sum(1) if reduce else want, rtol=1e-5)
    plan = engine.last_plan.plan
    dev = get_device("LLVM")
    srcs = [render_llvm(dev.lowered_kernel(k, plan)) for k in plan.kernels]
    assert len(srcs) == 1 and is_tiny(srcs[0]) == tiny, (srcs[0].splitlines()[0], TINY_ITERATIONS)
    c = compiler(None)
    tm = target_machine(llvm, c.cpu, c.features)

    def vectors(vectorize: bool) -> bool:
        mod = llvm.parse_assembly(srcs[0])
        optimize(llvm, tm, mod, slp=vectorize, vectorize=vectorize)
        return " x float>" in str(mod)
    assert vectors(True) and not vectors(False)
    from eqgrad.devices import llvm_worker
    asked: list[dict] = []
    monkeypatch.setattr(llvm_worker, "optimize", lambda *a, **kw: (asked.append(kw), optimize(*a, **kw))[1])
    assert compile_object(llvm, tm, srcs[0], "eqk", "eqk_t")[0]
    assert asked == [dict(slp=not tiny and llvm_worker.wants_slp(srcs[0]), vectorize=not tiny)]
