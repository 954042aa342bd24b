#!/usr/bin/env python3
"""Training-step benchmark: one full-batch Adam step of a 64 -> 128 -> 10 MLP on scikit-learn's
digits (1797 x 64, cross-entropy), in eqgrad (without and with @eqgrad.jit), PyTorch eager (CPU;
all cores, and one thread) and tinygrad 0.14.0 with TinyJit (CPU).

Per framework: the first step's latency (for the lazy frameworks it includes compiling: for
eqgrad saturation, extraction and LLVM), then the median step time over --reps timed steps after
--warmup untimed ones, and the ratio to each other framework. Every framework starts from the same
weights; the script checks that their losses agree after the timed steps. For the jitted eqgrad
step it also measures the Python overhead of a replay: the median replay time minus the median
time of running the same captured kernels back to back.

  python bench/bench_train.py                  # full run, 50 reps
  python bench/bench_train.py --reps 10 --json bench/results/train.json
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import time
from importlib import metadata
from typing import Any, Callable

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(REPO_ROOT, "eqgrad", "__init__.py")) or importlib.util.find_spec("eqgrad") is None:
    sys.path.insert(1, REPO_ROOT)        # this checkout's eqgrad where it runs from one (bench_core.py)

LR = 1e-2


def data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int32)


def init_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """torch.nn.Linear's default init, drawn once with NumPy and loaded into every framework."""
    rng = np.random.default_rng(seed)
    b1, b2 = 1 / np.sqrt(64), 1 / np.sqrt(128)
    return {"w1": rng.uniform(-b1, b1, (128, 64)).astype(np.float32), "b1": rng.uniform(-b1, b1, 128).astype(np.float32),
            "w2": rng.uniform(-b2, b2, (10, 128)).astype(np.float32), "b2": rng.uniform(-b2, b2, 10).astype(np.float32)}


# ------------------------------------------------------------------ frameworks: make() -> (step, sync, info)

def make_eqgrad(jit: bool):
    def make(x: np.ndarray, y: np.ndarray, w: dict[str, np.ndarray]):
        import eqgrad
        from eqgrad import Tensor, engine, optim
        from eqgrad.devices import get_device
        import eqgrad.nn.functional as F
        # a cold start for each variant: the first step pays saturation, extraction and LLVM
        engine.clear_cache()
        getattr(get_device("LLVM"), "programs", {}).clear()
        ps = {k: Tensor(v, requires_grad=True) for k, v in w.items()}
        opt = optim.Adam(list(ps.values()), lr=LR)
        xt, yt = Tensor(x), Tensor(y)

        def step(xb: Tensor, yb: Tensor) -> Tensor:
            opt.zero_grad()
            h = (xb @ ps["w1"].T + ps["b1"]).relu()
            loss = F.cross_entropy(h @ ps["w2"].T + ps["b2"], yb)
            loss.backward()
            opt.step(loss)             # forward + backward + Adam update: one program
            return loss

        fn = eqgrad.jit(step) if jit else step
        info = {"version": eqgrad.__version__, "threads": eqgrad.config.THREADS.value}
        return (lambda: fn(xt, yt)), (lambda: None), info, fn
    return make


def make_torch(x: np.ndarray, y: np.ndarray, w: dict[str, np.ndarray], threads: int = 0):
    import torch
    torch.set_num_threads(threads or os.cpu_count() or 1)
    ps = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
    opt = torch.optim.Adam(list(ps.values()), lr=LR)
    xt, yt = torch.tensor(x), torch.tensor(y, dtype=torch.long)

    def step():
        opt.zero_grad()
        h = torch.relu(xt @ ps["w1"].T + ps["b1"])
        loss = torch.nn.functional.cross_entropy(h @ ps["w2"].T + ps["b2"], yt)
        loss.backward()
        opt.step()
        return loss
    return step, (lambda: None), {"version": torch.__version__, "threads": torch.get_num_threads()}, None


def make_tinygrad(x: np.ndarray, y: np.ndarray, w: dict[str, np.ndarray]):
    os.environ.setdefault("DEV", "CPU")
    if "CC" not in os.environ and not shutil.which("clang") and shutil.which("clang-15"):
        os.environ["CC"] = "clang-15"
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.helpers import Context
    from tinygrad.nn.optim import Adam
    ps = {k: Tensor(v, device="CPU").realize() for k, v in w.items()}      # tensors are parameters by default (is_param)
    opt = Adam(list(ps.values()), lr=LR)
    xt, yt = Tensor(x, device="CPU").realize(), Tensor(y, device="CPU").realize()

    @TinyJit
    def step(xb, yb):
        with Context(TRAINING=1):
            opt.zero_grad()
            h = (xb @ ps["w1"].T + ps["b1"]).relu()
            loss = (h @ ps["w2"].T + ps["b2"]).sparse_categorical_crossentropy(yb)
            loss.backward()
            # NOTE: the loss in the same realize as the update; realized after it, it would be
            # computed from the updated weights
            Tensor.realize(loss, *opt.schedule_step())
            return loss
    info = {"version": metadata.version("tinygrad"), "device": "CPU", "CC": os.environ.get("CC", "clang")}
    return (lambda: step(xt, yt)), (lambda: Device["CPU"].synchronize()), info, None


FRAMEWORKS: dict[str, Callable] = {
    "eqgrad": make_eqgrad(False),
    "eqgrad+jit": make_eqgrad(True),
    "torch": make_torch,
    # NOTE: on a loaded 2-core machine torch's OpenMP threads wait on each other; one thread is steadier
    "torch-1thread": lambda x, y, w: make_torch(x, y, w, threads=1),
    "tinygrad+TinyJit": make_tinygrad,
}


def loss_value(loss: Any) -> float:
    return float(loss.item() if hasattr(loss, "item") else loss)


def bench(name: str, make: Callable, x: np.ndarray, y: np.ndarray, w: dict, warmup: int, reps: int) -> dict[str, Any]:
    step, sync, info, fn = make(x, y, w)
    t0 = time.perf_counter()
    loss = step()
    sync()
    first = loss_value(loss)
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    sync()
    times = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    out = dict(framework=name, first_step_s=first_s, median_ms=statistics.median(times) * 1e3,
               mad_ms=statistics.median(abs(t - statistics.median(times)) for t in times) * 1e3,
               first_loss=first, final_loss=loss_value(loss), steps=1 + warmup + reps, info=info)
    if name.startswith("eqgrad"):
        import eqgrad
        k0 = eqgrad.GlobalCounters.kernel_count
        step()
        out["kernels_per_step"] = eqgrad.GlobalCounters.kernel_count - k0
        if fn is not None and hasattr(fn, "_captures"):
            out.update(replay_overhead(fn, step, reps, out["median_ms"]))
    return out


def replay_overhead(jitted: Any, step: Callable, reps: int, median_ms: float) -> dict[str, float]:
    """Python overhead of one replay: the same replays with every captured plan's kernels replaced
    by a no-op (binding buffers, allocating outputs, re-pointing LazyBuffers, building the returned
    tensors). Run last: the no-op replays leave garbage in the parameters."""
    cap = next(iter(jitted._captures.values()))
    runs = [r for kind, r in cap.actions if kind == "run"]
    saved = [r.run for r in runs]
    for r in runs:
        r.run = lambda bufs: None
    times = []
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    finally:
        for r, run in zip(runs, saved):
            r.run = run
    overhead = statistics.median(times)
    return {"replay_ms": median_ms, "overhead_us": overhead * 1e6, "kernels_ms": median_ms - overhead * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    x, y = data()
    w = init_weights()
    rows = []
    for name in args.frameworks.split(","):
        try:
            rows.append(bench(name, FRAMEWORKS[name], x, y, w, args.warmup, args.reps))
        except ImportError as e:
            print(f"{name}: skipped ({e})")
    base = {r["framework"]: r["median_ms"] for r in rows}
    print(f"\nOne full-batch Adam step, MLP 64-128-10 on digits ({len(x)} x 64); median of {args.reps} steps "
          f"after {args.warmup} warm-up steps; {platform.machine()}, {os.cpu_count()} CPUs\n")
    names = [r["framework"] for r in rows]
    print(f"{'framework':<18} {'median ms':>10} {'(mad)':>7} {'first step s':>13} " + " ".join(f"{'/' + n:>18}" for n in names))
    for r in rows:
        ratios = " ".join(f"{r['median_ms'] / base[n]:>18.2f}" for n in names)
        print(f"{r['framework']:<18} {r['median_ms']:>10.2f} {r['mad_ms']:>7.2f} {r['first_step_s']:>13.2f} {ratios}")
    losses = {r["framework"]: (r["first_loss"], r["final_loss"]) for r in rows}
    print("\nloss after the first step / after all steps: " +
          ", ".join(f"{k} {a:.5f} / {b:.5f}" for k, (a, b) in losses.items()))
    for r in rows:
        if "kernels_per_step" in r:
            print(f"{r['framework']}: {r['kernels_per_step']} kernels per step" +
                  (f"; replay {r['replay_ms']:.3f} ms = kernels {r['kernels_ms']:.3f} ms + Python overhead "
                   f"{r['overhead_us']:.0f} us" if "replay_ms" in r else ""))
    firsts = [a for a, _ in losses.values()]
    ok = max(firsts) - min(firsts) < 1e-4
    if not ok:
        print("MISMATCH: the frameworks' first losses differ")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, reps=args.reps, warmup=args.warmup, machine=platform.machine(),
                           cpus=os.cpu_count()), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
