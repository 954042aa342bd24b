"""Calibration: measure a device's launch overhead, bandwidth, peak FLOP/s (an FMA chain: the
rate of elementwise work) and contraction FLOP/s (matmul 512, run as the device runs it: register
lanes or the BLAS) with small eqgrad kernels (``python -m eqgrad tune calibrate``); the result is
stored per device and machine and read by ``eqgrad.extract.cost.params_for``."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np

from eqgrad import engine
from eqgrad.devices import Buffer
from eqgrad.extract.cost import DEFAULT_PARAMS, DeviceParams
from eqgrad.frontend.tensor import Tensor
from eqgrad.graph.program import linearize


# The launch overhead is timed as programs pay it: a one-element kernel run right after a streaming
# kernel of each of these sizes (float32 elements: 0.5 to 33.6 MB of traffic, the sizes of a model's
# elementwise kernels), whose traffic evicts the interpreter's working set from the caches. In a
# tight loop of the tiny kernel alone it costs 2.8 us; after these kernels 2.8, 4.7, 11.0 and 16.4 us
# (Intel Xeon, Emerald Rapids, two threads; one thread: 7.2, 4.5, 13.2, 20.6), and the one-element
# kernels of the CNN and FFN training steps measured 7.5-27 us (10th-90th percentile, median 11.8)
# against the 4.8 us the tight loop gave.
LAUNCH_CONTEXT = (1 << 16, 1 << 18, 1 << 20, 1 << 22)


def _prepared(make: Callable[[], Tensor], device: str) -> Callable[[], None]:
    """The compiled plan of ``make()`` with its buffers allocated once: a call runs its kernels."""
    make().realize()                          # compile once
    cp = engine.last_plan
    ins = [lb.buffer for lb in linearize([make().lazydata]).inputs]
    bufs = ins + [Buffer.empty(s, d, device) for s, d in cp.plan.buffers[len(ins):]]
    return lambda: cp.run(bufs)


def _launch_in_context(tiny_run: Callable[[], None], device: str, reps: int, rng: np.random.Generator) -> float:
    """The median time of the one-element kernel ``tiny_run`` right after a streaming kernel of each
    ``LAUNCH_CONTEXT`` size (``reps`` times each)."""
    ts = []
    for n in LAUNCH_CONTEXT:
        x = Tensor(rng.random(n, dtype=np.float32), device=device)
        stream = _prepared(lambda: x * 2 + 1, device)
        for _ in range(reps):
            stream()
            t0 = time.perf_counter()
            tiny_run()
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


FIELDS = ("launch", "bandwidth", "peak", "contraction")


def calibrate(device: str = "LLVM", reps: int = 7, progress: Callable[[str], None] | None = None,
              runs: int = 1, spread: dict | None = None) -> DeviceParams:
    """Measure launch overhead, bandwidth, peak and contraction FLOP/s of ``device`` with small eqgrad
    kernels (the two rates are the cost model's kernel classes, cost.py). With ``runs`` > 1 the
    whole measurement is repeated and each parameter is the median of the runs; ``spread`` (a dict)
    receives each parameter's (min, max) over the runs -- one run on a shared machine gave
    bandwidths of 3.4 to 5.7 GB/s."""
    if runs < 1:
        raise ValueError(f"calibrate(): runs must be >= 1, got {runs}")
    got = [_calibrate_once(device, reps, np.random.default_rng(i), progress) for i in range(runs)]
    med = {f: float(np.median([g[f] for g in got])) for f in FIELDS}
    if spread is not None:
        spread.update({f: (min(g[f] for g in got), max(g[f] for g in got)) for f in FIELDS})
    how = f" (median of {runs} runs)" if runs > 1 else ""
    return replace(DEFAULT_PARAMS.get(device, DeviceParams()), **med,
                   source=f"calibrated {time.strftime('%Y-%m-%d %H:%M')}{how}")


def _calibrate_once(device: str, reps: int, rng: np.random.Generator,
                    progress: Callable[[str], None] | None) -> dict[str, float]:
    def timed(make: Callable[[], Tensor]) -> tuple[float, Callable[[], None]]:
        run = _prepared(make, device)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)), run

    tiny = Tensor(np.ones((1,), np.float32), device=device)
    tight, tiny_run = timed(lambda: tiny + 1)
    n = 1 << 24
    big = Tensor(rng.random(n, dtype=np.float32), device=device)
    t_copy, _ = timed(lambda: big + 1)
    bandwidth = 8 * n / max(t_copy - tight, 1e-9)
    launch = _launch_in_context(tiny_run, device, reps, rng)
    if progress:
        progress(f"launch overhead {launch * 1e6:.1f} us ({tight * 1e6:.1f} us in a tight loop)")
        progress(f"bandwidth {bandwidth / 1e9:.1f} GB/s")
    m = 512
    a = Tensor(rng.random((m, m), dtype=np.float32), device=device)
    t_mm, _ = timed(lambda: a @ a)
    small = Tensor(rng.random(1 << 18, dtype=np.float32), device=device)

    def fma_chain() -> Tensor:
        y = small
        for _ in range(64):
            y = y * 0.999 + 0.001
        return y
    t_fma, _ = timed(fma_chain)
    contraction = 2 * m ** 3 / max(t_mm - launch, 1e-9)
    peak = 128 * (1 << 18) / max(t_fma - launch, 1e-9)
    if progress:
        progress(f"peak {peak / 1e9:.1f} GFLOP/s, contraction {contraction / 1e9:.1f} GFLOP/s")
    return dict(launch=launch, bandwidth=bandwidth, peak=peak, contraction=contraction)
