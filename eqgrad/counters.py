"""Counters and log lines that every layer may use (the ground floor: imports nothing of eqgrad).

tinygrad keeps its GlobalCounters at the bottom for the same reason: the devices count kernels and
print per-kernel lines, and the orchestrator imports the devices, never the other way round.
"""
from __future__ import annotations

from typing import Any


class EqgradWarning(UserWarning):
    """Optimization fell back to a less optimized plan (the message says why)."""


class GlobalCounters:
    kernel_count = 0          # kernels launched
    realize_count = 0         # realize() calls that ran a plan
    plans_compiled = 0        # plan cache misses (compile_plan calls, disk-cache hits included)
    saturations = 0           # e-graphs the engine saturated, those reused from an earlier run included
    saturations_reused = 0    # of which the answer of an earlier run of the same request (Saturator.run(memo=True))
    disk_hits = 0             # plans read from the disk cache (no saturation, no extraction)
    plans_resized = 0         # plan cache misses served by resizing a plan of other sizes (graph/resize.py)
    kernels_compiled = 0      # kernels compiled to machine code: LLVM's object code (devices/llvm.py), OpenCL's builds
    kernel_disk_hits = 0      # LLVM kernels whose object code was read from disk (devices/kernelcache.py)
    lowered_disk_hits = 0     # LLVM kernels whose source was read from disk instead of lowered (the same)
    # seconds spent in compile_plan's phases, summed over its calls: saturation (with inserting
    # the program), extraction (with building the plan), the device's compile (``prepare``), and
    # reading plans from the disk cache
    saturate_seconds = 0.0
    extract_seconds = 0.0
    compile_seconds = 0.0
    load_seconds = 0.0
    # a list to record every kernel run into (name, seconds, predicted seconds, flops, bytes), timed
    # one by one as with DEBUG >= 2 but printing nothing (None: off); the cost model's check
    # (bench/bench_model.py) reads it
    kernel_log: list | None = None

    @classmethod
    def reset(cls) -> None:
        cls.kernel_count = cls.realize_count = cls.plans_compiled = cls.disk_hits = 0
        cls.saturations = cls.saturations_reused = 0
        cls.plans_resized = cls.kernels_compiled = cls.kernel_disk_hits = cls.lowered_disk_hits = 0
        cls.saturate_seconds = cls.extract_seconds = cls.compile_seconds = cls.load_seconds = 0.0


def timing_kernels(debug: int) -> bool:
    """Are kernels timed one by one (DEBUG >= 2 prints them, ``kernel_log`` records them)?"""
    return debug >= 2 or GlobalCounters.kernel_log is not None


def log_kernel(k: Any, seconds: float, debug: int = 2, predicted: float | None = None) -> None:
    """Record and (DEBUG >= 2) print kernel ``k``'s run; ``predicted``: its prediction where it ran
    (``KernelPlan.in_context``), else ``k.predicted``."""
    predicted = k.predicted if predicted is None else predicted
    log = GlobalCounters.kernel_log
    if log is not None:
        log.append((k.name, seconds, predicted, k.flops, k.nbytes, k))
    if debug < 2:
        return
    gbs = k.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    gfl = k.flops / seconds / 1e9 if seconds > 0 else 0.0
    print(f"  {k.name:<5} {seconds * 1e6:10.1f} us  {gbs:7.2f} GB/s  {gfl:7.2f} GFLOP/s  "
          f"(predicted {predicted * 1e6:.1f} us)  {k.ast.render()[:100]}")
