"""Memory stays flat: buffers are freed when no tensor needs them, caches are bounded."""
import gc

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def test_repeated_realizes_keep_memory_flat():
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((64, 64)).astype(np.float32))
    x = Tensor(rng.standard_normal((32, 64)).astype(np.float32))
    for _ in range(100):                                    # warm: plans compiled, pools filled
        w = (w - ((x @ w).relu()).sum(0).reshape(1, 64) * 1e-6).realize()
    gc.collect()
    before = rss_mb()
    for i in range(2000):
        w = (w - ((x @ w).relu() * (i % 3)).sum(0).reshape(1, 64) * 1e-6).realize()
    gc.collect()
    assert rss_mb() - before < 20, f"RSS grew {rss_mb() - before:.1f} MB over 2000 realizes"


def test_varied_shapes_keep_memory_bounded():
    with eqgrad.Context(PLAN_CACHE=16):
        for n in range(1, 40):                               # warm
            Tensor(np.ones((n, 3), np.float32)).sum(0).realize()
        gc.collect()
        before = rss_mb()
        for i in range(600):
            n = 1 + i % 40
            Tensor(np.ones((n, 3), np.float32)).sum(0).realize()
        gc.collect()
        assert len(engine._plan_cache) <= 16
        assert rss_mb() - before < 40, f"RSS grew {rss_mb() - before:.1f} MB"


@pytest.fixture
def no_validation():
    # 600 Adam steps drive the gradients to rounding noise, which Adam's normalisation amplifies
    # into lr-sized steps: a different summation order (threads, lanes) then legitimately differs
    # from NumPy's by more than validation's tolerance. Correctness of training is tested against
    # torch in test_optim.py; this test is about memory.
    with eqgrad.Context(VALIDATE=0):
        yield


def test_training_loop_keeps_memory_flat_with_and_without_jit(no_validation):
    from eqgrad import nn, optim
    import eqgrad.nn.functional as F
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((32, 16)).astype(np.float32), rng.integers(0, 4, 32).astype(np.int32)
    for use_jit, steps in ((True, 600), (False, 300)):
        model = nn.Sequential(nn.Linear(16, 32), Tensor.relu, nn.Linear(32, 4))
        opt = optim.Adam(nn.state.get_parameters(model), lr=1e-3)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss)
            return loss
        f = eqgrad.jit(step) if use_jit else step
        for _ in range(30):
            f(Tensor(xs), Tensor(ys))
        from eqgrad.devices import clear_pool
        gc.collect()
        clear_pool()                   # pooled memory is reuse, not a leak: measure without it
        before = rss_mb()
        for _ in range(steps):
            f(Tensor(xs), Tensor(ys))
        gc.collect()
        clear_pool()
        grew = rss_mb() - before
        assert grew < 25, f"jit={use_jit}: RSS grew {grew:.1f} MB over {steps} steps"


# ------------------------------------------------------------------ the host buffer pool

from eqgrad.devices import POOL_MIN_BYTES, clear_pool, pool   # noqa: E402


def test_pool_reuses_memory_across_runs_of_a_cached_plan():
    clear_pool()
    a = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)     # 1 MiB
    x = Tensor(a)
    ptrs = []
    for i in range(6):
        y = (x * 2 + i).realize()
        ptrs.append(y.lazydata.buffer.ptr)
        np.testing.assert_allclose(y.numpy(), a * 2 + i, rtol=1e-6)
        del y                                   # the output goes back to the pool
    hits = pool.hits
    (x * 3).realize()                           # result dropped at once: its buffer comes back
    assert pool.hits == hits + 1
    assert len(set(ptrs[1:])) == 1, "the freed output of one run should be the next run's output"


def test_pool_never_hands_out_memory_still_referenced():
    clear_pool()
    x = Tensor(np.ones(1 << 18, np.float32))
    y = (x + 1).realize()
    view = y.lazydata.buffer.data               # a view into the pooled memory, kept past the tensor
    addr = view.ctypes.data
    del y
    z = (x + 5).realize()
    assert z.lazydata.buffer.ptr != addr
    assert (view == 2).all() and (z.numpy() == 6).all()
    del view, z
    w = (x + 7).realize()                       # the dropped array is not in the pool any more
    assert (w.numpy() == 8).all()


def test_pool_bounded_and_clearable():
    clear_pool()
    with eqgrad.Context(POOL_BYTES="1M"):
        for n in range(20):                     # 20 distinct sizes of 256-332 KiB, all freed at once
            b = Tensor(np.zeros((1 << 16) + 1024 * n, np.float32))
            del b
        assert 0 < pool.nbytes <= 1 << 20
        assert sum(a.nbytes for arrs in pool.free.values() for a in arrs) == pool.nbytes
    with eqgrad.Context(POOL_BYTES=0):
        clear_pool()
        Tensor(np.zeros(1 << 18, np.float32))
        assert pool.nbytes == 0
    Tensor(np.zeros(1 << 18, np.float32))
    assert pool.nbytes >= 1 << 20
    clear_pool()
    assert pool.nbytes == 0 and not pool.free


def test_a_growing_buffer_reuses_freed_ones():
    """A KV cache extended by ``cat`` every step (64 -> 128 KiB, 1 KiB a step): the pool keeps freed
    buffers by size class (``size_class``: 8 per power of two), so a new cache reuses the one freed
    a few steps before. Kept by exact size, every freed cache was a size no later step asked for:
    64 sizes in the pool, no hit (a decode loop filled the 1 GiB pool with them)."""
    from eqgrad.devices import SIZE_CLASSES, size_class
    clear_pool()
    hits = pool.hits
    cache = Tensor(np.zeros(1 << 14, np.float32)).realize()
    tok = Tensor(np.ones(256, np.float32)).realize()
    for _ in range(64):
        new = cache.cat(tok).realize()
        del cache
        cache = new
    assert pool.hits - hits >= 40
    assert len(pool.free) <= SIZE_CLASSES + 1          # one octave of classes, not one size per step
    np.testing.assert_array_equal(cache.numpy(), np.r_[np.zeros(1 << 14), np.ones(64 * 256)].astype(np.float32))
    assert all(cls == size_class(cls) for _, cls in pool.free)
    clear_pool()


def test_small_buffers_bypass_the_pool():
    clear_pool()
    misses = pool.misses
    Tensor(np.zeros(POOL_MIN_BYTES // 4 - 1, np.float32)).realize()
    assert pool.misses == misses and pool.nbytes == 0


def test_jit_replays_with_pooled_buffers_stay_right():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((256, 256)).astype(np.float32) / 16
    w2 = rng.standard_normal((256, 256)).astype(np.float32) / 16
    W1, W2 = Tensor(w1), Tensor(w2)

    @eqgrad.jit
    def f(x):
        return ((x @ W1).relu() @ W2 + 1).realize()
    xs = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(6)]
    outs = [f(Tensor(x)) for x in xs]           # earlier results are kept while later replays run
    assert f.replays == 4
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o.numpy(), np.maximum(x @ w1, 0) @ w2 + 1, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not hasattr(__import__("resource"), "RUSAGE_THREAD"), reason="per-thread page-fault counts are Linux's")
@pytest.mark.parametrize("nbytes", [1 << 20, 12 << 20])
def test_fresh_host_buffers_are_faulted_in_when_allocated(nbytes):
    """A fresh host buffer's pages are mapped when it is allocated, not when a kernel first writes
    it: the device times a kernel's first runs to choose its thread split, and those runs write
    fresh buffers (a page fault costs ~1.4 us here: a one-thread probe of a small softmax timed at
    2-3x its steady state, and the split chosen where one thread is faster)."""
    import resource
    from eqgrad.devices import hostmem
    a = hostmem.host_empty(nbytes)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    a[:] = 1
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert faults <= 2, f"{faults} page faults writing a fresh {nbytes}-byte buffer"


@pytest.mark.parametrize("nbytes", [64 << 10, (64 << 10) + 4, 1 << 20, (3 << 20) + 12, 4 << 20])
def test_host_buffers_start_on_a_cache_line(nbytes):
    """Every host buffer the pool hands out starts on a cache line (``hostmem.ALIGN``): below
    HUGE_MIN NumPy's memory is 16-byte aligned (glibc), and a vector load of 64 bytes from it
    crosses a line every time (a (32, 15, 384) layer norm, one thread: 30.6-34.1 us aligned against
    34.8-36.9 at 16 bytes past a line)."""
    from eqgrad.devices import Buffer, hostmem
    from eqgrad.dtype import float32
    a = hostmem.host_empty(nbytes)
    assert a.ctypes.data % hostmem.ALIGN == 0 and a.nbytes == nbytes and a.dtype == np.uint8
    a[:] = 3
    assert int(a[-1]) == 3
    b = Buffer.empty((nbytes // 4,), float32, "LLVM")
    assert b.ptr % hostmem.ALIGN == 0


def test_large_host_buffers_are_huge_page_mappings():
    """Buffers of HUGE_MIN bytes or more are page-aligned anonymous mappings (advised MADV_HUGEPAGE
    where Linux allows it), smaller ones plain NumPy memory; both hold what is written to them and
    a large one goes back to the pool and is reused."""
    import mmap
    from eqgrad.devices import Buffer, hostmem, pool
    from eqgrad.dtype import float32
    def mapped(a):
        return isinstance(getattr(a.base, "obj", a.base), mmap.mmap)
    assert not mapped(hostmem.host_empty(hostmem.HUGE_MIN - 1))
    big = hostmem.host_empty(hostmem.HUGE_MIN)
    assert mapped(big) and big.ctypes.data % 4096 == 0
    big[:] = 7
    assert big.size == hostmem.HUGE_MIN and int(big[::4096].sum()) == 7 * (hostmem.HUGE_MIN // 4096)
    n = hostmem.HUGE_MIN // 4 + 1024
    b = Buffer.empty((n,), float32, "LLVM")
    b.copyin(np.arange(n, dtype=np.float32))
    assert b.numpy()[-1] == n - 1
    ptr = b.ptr
    del b
    hits = pool.hits
    b2 = Buffer.empty((n,), float32, "LLVM")
    assert pool.hits == hits + 1 and b2.ptr == ptr


def test_intermediates_share_memory_by_lifetime():
    """graph/plan.py ``shared_memory``: an intermediate takes the memory of one of its size that no
    launch uses any more (the one freed last first); a launch never writes memory a later launch
    still reads; inputs, outputs and a device's scratch ids keep their own; the launches of one
    step (a kernel with several outputs) all get memory before that step frees any."""
    from eqgrad.dtype import float32
    from eqgrad.graph.plan import shared_memory
    buffers = [((64,), float32)] * 7 + [((32,), float32)]
    # b0 input; a chain b1 -> b2 -> b3 -> b4 -> b5 (output); b6 and b7 written together at the end
    io = [((0,), (1,)), ((1,), (2,)), ((2,), (3,)), ((3,), (4,)), ((4,), (5,)), ((5,), (6, 7)), ((6, 7, 9), (8,))]
    owner = shared_memory(buffers, 1, [5, 8], io)
    assert owner == {3: 1, 4: 2, 6: 2}, owner           # 6 takes the memory 4 had (2's), the last freed
    assert 5 not in owner and 0 not in owner and 7 not in owner      # an output, the input, another size
    # a buffer's memory is never taken while it is still to be read
    last = {b: max(j for j, (r, w) in enumerate(io) if b in (*r, *w)) for b in range(8)}
    first = {b: min(j for j, (r, w) in enumerate(io) if b in w) for b in range(1, 8)}
    root = lambda b: owner.get(b, b)
    for a in range(1, 8):
        for b in range(1, 8):
            if a != b and root(a) == root(b) and first[a] < first[b]:
                assert last[a] < first[b], (a, b)


def test_a_plans_intermediates_share_memory_and_give_the_same_numbers():
    """On the LLVM device a realize's intermediates of equal size whose lifetimes do not overlap
    share memory (engine/session.py ``_intermediates``): fewer bytes held, explain() says so, and
    the numbers are NumPy's at every run."""
    engine.clear_cache()
    rng = np.random.default_rng(4)
    x, w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) / 8 for s in ((64, 256), (256, 256), (256, 256), (256, 256)))
    h = np.maximum(x @ w1, 0)
    h = np.maximum(h @ w2, 0) + h
    want = (np.maximum(h @ w3, 0) + h).sum(0)
    X, W1, W2, W3 = (Tensor(a) for a in (x, w1, w2, w3))
    for _ in range(3):
        H = (X @ W1).relu()
        H = (H @ W2).relu() + H
        out = ((H @ W3).relu() + H).sum(0)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    cp = engine.last_plan
    assert getattr(cp.run, "shared", None), (cp.plan.buffers, getattr(cp.run, "buffer_io", None))
    H = (X @ W1).relu()
    H = (H @ W2).relu() + H
    assert "held at once" in str(eqgrad.explain(((H @ W3).relu() + H).sum(0)))
