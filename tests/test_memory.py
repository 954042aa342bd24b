"""Memory stays flat: buffers are freed when no tensor needs them, caches are bounded."""
import gc

import numpy as np

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


def test_training_loop_keeps_memory_flat_with_and_without_jit():
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
        gc.collect()
        before = rss_mb()
        for _ in range(steps):
            f(Tensor(xs), Tensor(ys))
        gc.collect()
        assert rss_mb() - before < 15, f"jit={use_jit}: RSS grew {rss_mb() - before:.1f} MB over {steps} steps"
