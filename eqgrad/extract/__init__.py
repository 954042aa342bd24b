"""Extraction: choose one e-node per e-class -- a kernel plan -- under the kernel cost model.

Extractors (``EQGRAD_EXTRACTOR`` or :func:`using`): ``greedy`` (default: semantic choice + producer
toggles), ``improve`` (adds per-class flips, more passes), ``ilp`` (exact integer program with HiGHS
for small graphs, greedy fallback), ``measured`` (times the top candidate plans on the device,
cached on disk). The cost model (cost.py) is pluggable: ``using(cost_fn=..., params=...)``.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from .. import config
from .cost import CostFn, CostModel, DeviceParams, default_cost, params_for
from .egraph import EGraph
from .evaluate import Choice
from .greedy import GreedyExtractor, ImproveExtractor, Result
from .ilp import ILPExtractor
from .measured import MeasuredExtractor

EXTRACTORS = {"greedy": GreedyExtractor, "improve": ImproveExtractor, "ilp": ILPExtractor,
              "measured": MeasuredExtractor}

_cost_fn: CostFn | None = None
_params: dict[str, DeviceParams] = {}


def cost_model(device: str) -> CostModel:
    return CostModel(_params.get(device) or params_for(device), _cost_fn or default_cost)


def settings_key(device: str) -> tuple:
    """What the plan cache must distinguish: extractor, cost function and parameters, and the
    settings the device's compiled code depends on (threads: a large reduction is split for them;
    the kernel search)."""
    return (config.EXTRACTOR.value, id(_cost_fn), cost_model(device).params, config.THREADS.value, config.BEAM.value)


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
