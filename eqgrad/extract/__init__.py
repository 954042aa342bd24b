"""Extraction: choose one e-node per e-class -- a kernel plan -- under the kernel cost model.

Extractors (``EQGRAD_EXTRACTOR`` or :func:`using`): ``greedy`` (default: semantic choice + producer
toggles), ``improve`` (adds per-class flips, more passes), ``ilp`` (exact integer program with HiGHS
for small graphs, greedy fallback), ``measured`` (times the top candidate plans on the device,
cached on disk). The cost model (cost.py) is pluggable: ``using(cost_fn=..., params=...)``.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from eqgrad import config
from eqgrad.extract.cost import CostFn, CostModel, DeviceParams, default_cost, params_for
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice
from eqgrad.extract.greedy import GreedyExtractor, ImproveExtractor, Result
from eqgrad.extract.ilp import ILPExtractor
from eqgrad.extract.measured import MeasuredExtractor

EXTRACTORS = {"greedy": GreedyExtractor, "improve": ImproveExtractor, "ilp": ILPExtractor,
              "measured": MeasuredExtractor}

_cost_fn: CostFn | None = None
_params: dict[str, DeviceParams] = {}


def cost_model(device: str) -> CostModel:
    return CostModel(_params.get(device) or params_for(device), _cost_fn or default_cost)


def settings_key(device: str) -> tuple:
    """Every setting that changes the plan compiled for ``device``: the plan cache key is
    ``(rules.key, settings_key(device), structure_key(...))``, so a change of any of these plans again.

    Flag by flag (eqgrad/config.py), and why it is in the key or not:
      EQGRAD_OPT                 in: 0 skips saturation (one kernel per op)
      EQGRAD_SATURATION_TIMEOUT  in: a saturation stopped at the limit gives another (fallback) plan, and
                                 a user who raises the limit after the warning expects a new try
                                 (this and the next two only while OPT=1: without saturation its
                                 limits change nothing)
      EQGRAD_EGRAPH_NODES        in: the node limit decides after which phase saturation stops
      EQGRAD_EGRAPH_MEMORY       in: a worker out of memory gives the unoptimized plan (as the timeout)
      EQGRAD_EXTRACTOR           in: the extractor chooses the plan
      EQGRAD_ILP_TIME, EQGRAD_ILP_MAX_CLASSES
                                 in for the ilp extractor only (the others never read them)
      cost function, DeviceParams (using(), or the calibration in effect from the cache directory)
                                 in: the extractor minimizes the cost they give
      EQGRAD_THREADS             in for LLVM only: a large reduction is split for the threads, and the
                                 compiled steps launch that many (the other devices never read it)
      EQGRAD_BEAM, EQGRAD_BEAM_TIME
                                 in for LLVM only: the kernel search picks each kernel's lanes
      rulebooks and schedule (EQGRAD_RULEBOOKS, EQGRAD_SCHEDULE, eqgrad.rules.use)
                                 in, as ``rules.key`` (a hash of the text of every file) next to this
      DEBUG                      out: it only prints
      EQGRAD_DEVICE              out: the default device of new tensors; the plan's own device is in the
                                 structure key
      EQGRAD_PLAN_CACHE          out: the size of this cache, not what is in it
      EQGRAD_POOL_BYTES          out: reuse of freed memory, not the plan
      EQGRAD_VALIDATE            out: a check after the run, on the same plan
      EQGRAD_CACHE_DIR           out by itself: what it changes in a plan (the calibration) is keyed
                                 above; measured and kernel-search choices are read from it when a
                                 plan is compiled, and another directory does not make a compiled
                                 plan wrong
    The cost function is keyed by the object itself, not ``id()``: a new function may reuse a
    collected one's id.
    """
    opt = config.OPT.value
    sat = (config.SATURATION_TIMEOUT.value, config.EGRAPH_NODES.value, config.EGRAPH_MEMORY.value) if opt else None
    extractor = config.EXTRACTOR.value
    ilp = (config.ILP_TIME.value, config.ILP_MAX_CLASSES.value) if extractor == "ilp" else None
    llvm = (config.THREADS.value, config.BEAM.value, config.BEAM_TIME.value) if device == "LLVM" else None
    fn = _cost_fn or default_cost
    try:
        hash(fn)
    except TypeError:               # a callable object without __hash__: while using() holds it, its id is its own
        fn = ("cost function", id(fn))
    return (opt, sat, extractor, ilp, fn, cost_model(device).params, llvm)


@contextlib.contextmanager
def using(extractor: str | None = None, cost_fn: CostFn | None = None,
          params: dict[str, DeviceParams] | DeviceParams | None = None) -> Iterator[None]:
    """Temporarily choose the extractor, the cost function and/or the device parameters
    (a DeviceParams applies to every device)."""
    global _cost_fn, _params
    old = (_cost_fn, dict(_params))
    try:
        if cost_fn is not None:
            _cost_fn = cost_fn
        if isinstance(params, DeviceParams):
            _params = {d: params for d in ("LLVM", "NUMPY", "OPENCL", "CUDA")}
        elif params:
            _params.update(params)
        if extractor is not None:
            with config.Context(EXTRACTOR=extractor):
                yield
        else:
            yield
    finally:
        _cost_fn, _params = old


def make_extractor(name: str, g: EGraph, device: str, inputs: list[tuple],
                   measure: Callable[[Choice], float] | None = None, cache_key: str | None = None,
                   progress=None):
    cost = cost_model(device)
    if name == "measured":
        return MeasuredExtractor(g, cost, inputs, measure=measure, cache_key=cache_key, progress=progress)
    if name == "ilp":
        return ILPExtractor(g, cost, inputs, time_limit=config.ILP_TIME.value, max_classes=config.ILP_MAX_CLASSES.value)
    if name not in EXTRACTORS:
        raise ValueError(f"unknown extractor {name!r}: expected one of {sorted(EXTRACTORS)}")
    return EXTRACTORS[name](g, cost, inputs, max_passes=4 if name == "greedy" else 8)


__all__ = ["EXTRACTORS", "Result", "cost_model", "using", "make_extractor", "settings_key", "DeviceParams"]
