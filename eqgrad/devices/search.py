"""Kernel-level search: try register-lane (upcast) settings for a kernel on the device, keep the
fastest, remember it on disk.

With ``EQGRAD_BEAM=k`` the LLVM device lowers each kernel with the heuristic setting and up to
``k`` alternatives from :func:`candidates` (:data:`CANDIDATES`, and a row-fused kernel's covering
width with fewer rows), compiles and times each (median of 3 runs on random
inputs of the kernel's buffer shapes, threads as in a real run), checks that every candidate
computes the same output as the heuristic one (a candidate that does not is discarded: the search
never changes results), and keeps the fastest. Each kernel's search stops after
``EQGRAD_BEAM_TIME`` seconds. The winner is cached by the kernel's source and the machine in
``~/.cache/eqgrad/beam.json`` (versioned, written atomically, a corrupt file is ignored), so the
search runs once per kernel and machine.
"""
from __future__ import annotations

import hashlib
import time
from typing import Callable

import numpy as np

from eqgrad.cache import JsonCache
from eqgrad.cache import machine_key
from eqgrad.graph.plan import Kernel, KernelPlan
from eqgrad.devices import Buffer
from eqgrad.dtype import to_storage

CACHE_VERSION = 1
# most promising first (the search may stop at its time limit); (0, 0) is "no lanes"
CANDIDATES: list[tuple[int, int]] = [(16, 4), (16, 8), (32, 4), (8, 8), (32, 2), (8, 4), (16, 2), (4, 4),
                                     (32, 1), (16, 1), (8, 2), (8, 1), (4, 1), (0, 0)]


# the widest last-axis lanes a setting may have (a row-fused kernel's lanes cover its last axis:
# ``candidates``' covering width), and the rows a block such a width is tried with; a stored pick
# outside them is not one the search made
MAX_LANES = 4096
COVERING_ROWS = (4, 2, 1)
_WIDEST = max(w for w, _ in CANDIDATES)


def _check_entry(v: object) -> str | None:
    """Why a stored pick is unusable (neither null, meaning the heuristic, nor a setting the search
    tries: one of CANDIDATES or a covering width's, ``candidates``), or None."""
    if v is None or (isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
                     and (tuple(v) in CANDIDATES or (_WIDEST < v[0] <= MAX_LANES and v[1] in COVERING_ROWS))):
        return None
    return f"expected null or one of the search's settings {[list(c) for c in CANDIDATES[:3]]}..., got {v!r}"


def candidates(covering: int = 0) -> list[tuple[int, int]]:
    """The settings tried, most promising first: CANDIDATES, and where the heuristic's lanes on the
    last axis are wider than any of theirs (``covering``: a row-fused kernel's lanes cover its last
    axis -- attention's head dim of 64, 4 vectors a row), that width with fewer rows a block first:
    the bounded attention backward's kernels ran 5-8 % faster with 4 rows of 64 lanes than with the
    heuristic's 8 (their 8 x 64 accumulators spill), where forward attention ran faster with 8
    (lower/passes.py ``row_block``) -- which only timing tells apart."""
    if covering <= _WIDEST:
        return list(CANDIDATES)
    return [(covering, r) for r in COVERING_ROWS] + list(CANDIDATES)


CACHE = JsonCache("beam", CACHE_VERSION, check=_check_entry)


def search_upcast(k: Kernel, plan: KernelPlan, width: int, time_limit: float,
                  build: Callable[[tuple[int, int] | None], tuple[str, Callable[..., None]]],
                  progress: Callable[[int, int], None] | None = None,
                  covering: int = 0) -> tuple[tuple[int, int] | None, dict]:
    """Best upcast for kernel ``k`` among the first ``width`` of ``candidates(covering)`` (the
    heuristic's lanes on the last axis). ``build(upcast)`` returns (source, run(bufs)) for a setting."""
    base_src, base_run = build(None)
    key = hashlib.sha256((base_src + machine_key("LLVM")).encode()).hexdigest()[:24]
    cached = CACHE.get(key, "miss")
    if cached != "miss":
        return (tuple(cached) if cached else None), {"cache": "hit"}
    rng = np.random.default_rng(0)
    ids = list(k.params)
    bufs: dict[int, Buffer] = {}
    for b in ids:
        shape, dt = plan.buffers[b]
        arr = rng.standard_normal(shape).astype(dt.vnp) if dt.is_float else rng.integers(-3, 4, shape).astype(dt.np)
        bufs[b] = Buffer.from_numpy(to_storage(arr, dt), "LLVM", dt)

    def timed(run: Callable, best: float = float("inf")) -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        run(bufs)
        first = time.perf_counter() - t0
        if first > 4 * best:            # hopeless: do not spend three more runs on it
            return first, bufs[k.out].data.copy()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            run(bufs)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)), bufs[k.out].data.copy()

    t0 = time.perf_counter()
    best_t, ref = timed(base_run)
    best, seen, tried = None, {base_src}, {"heuristic": best_t}
    cands = candidates(covering)[:width]
    for i, up in enumerate(cands):
        if time.perf_counter() - t0 > time_limit:
            break
        src, run = build(up)
        if src in seen:
            continue
        seen.add(src)
        t, out = timed(run, best_t)
        # float results may differ by summation order only (reassociated reductions)
        scale = float(np.nanmax(np.abs(ref[np.isfinite(ref)]))) if out.dtype.kind == "f" and np.isfinite(ref).any() else 1.0
        same = np.allclose(out, ref, rtol=1e-3, atol=1e-4 * max(1.0, scale), equal_nan=True) \
            if out.dtype.kind == "f" else np.array_equal(out, ref)
        tried[str(up)] = t if same else "wrong result: discarded"
        if same and t < best_t * 0.97:
            best, best_t = up, t
        if progress:
            progress(i + 1, len(cands))
    CACHE.put(key, list(best) if best else None)
    return best, tried
