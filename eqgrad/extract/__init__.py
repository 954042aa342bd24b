"""Extraction: choose one e-node per e-class -- a kernel plan -- under the kernel cost model.

Extractors (``EQGRAD_EXTRACTOR`` or :func:`using`): ``greedy`` (default: semantic choice + producer
toggles), ``improve`` (adds per-class flips, more passes), ``ilp`` (exact integer program with HiGHS
for small graphs, greedy fallback), ``measured`` (times the top candidate plans on the device,
cached on disk). The cost model (cost.py) is pluggable: ``using(cost_fn=..., params=...)``.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from eqgrad import config
from eqgrad.counters import EqgradWarning
from eqgrad.extract.cost import CALIBRATIONS, CostFn, CostModel, DeviceParams, Overrides, default_cost, params_for
from eqgrad.graph.caps import caps_for, library_for
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice
from eqgrad.extract.greedy import GreedyExtractor, ImproveExtractor, Result
from eqgrad.extract.ilp import ILPExtractor
from eqgrad.extract.measured import MeasuredExtractor

EXTRACTORS = {"greedy": GreedyExtractor, "improve": ImproveExtractor, "ilp": ILPExtractor,
              "measured": MeasuredExtractor}

ALL_DEVICES = ("LLVM", "NUMPY", "OPENCL", "CUDA")


@dataclass
class ExtractSettings:
    """How plans are chosen: the extractor (None: ``EQGRAD_EXTRACTOR``), the cost function (None:
    ``cost.default_cost``) and device parameters by device name (a device not named: ``params_for``,
    the calibration in effect). Each ``eqgrad.engine.Session`` holds one (its ``extraction``);
    ``DEFAULT`` is the default session's. :func:`using` overrides it for a block, in the running
    thread only (as ``config.Context``): precedence is ``using`` > the session's settings >
    ``EQGRAD_EXTRACTOR``."""
    extractor: str | None = None
    cost_fn: CostFn | None = None
    params: dict[str, DeviceParams] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.extractor is not None:
            self.extractor = config.EXTRACTOR.checked(self.extractor, "extractor")
        if isinstance(self.params, DeviceParams):       # one DeviceParams applies to every device
            self.params = {d: self.params for d in ALL_DEVICES}
        self.params = {d: _params_value(d, v) for d, v in self.params.items()}


DEFAULT = ExtractSettings()
_WARNED_REPLACED: set[tuple[str, str]] = set()      # (device, calibration) pairs using() warned about
# the overrides of the ``using`` blocks the running thread (or asyncio task) is in
_using: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("eqgrad_extract_using", default={})


def effective(settings: ExtractSettings | None = None) -> ExtractSettings:
    """``settings`` (None: ``DEFAULT``) with the running thread's ``using`` overrides applied."""
    base = settings if settings is not None else DEFAULT
    ov = _using.get()
    if not ov:
        return base
    return ExtractSettings(ov.get("extractor") or base.extractor, ov.get("cost_fn") or base.cost_fn,
                           {**base.params, **ov.get("params", {})})


def extractor_name(settings: ExtractSettings | None = None) -> str:
    """The extractor plans are chosen with under ``settings`` (None: ``DEFAULT``) in this thread."""
    return effective(settings).extractor or config.EXTRACTOR.value


def cost_model(device: str, settings: ExtractSettings | None = None) -> CostModel:
    s = effective(settings)
    p = s.params.get(device)
    p = p.apply(params_for(device)) if isinstance(p, Overrides) else p or params_for(device)
    return CostModel(p, s.cost_fn or default_cost, caps_for(device), library_for(device), max(1, config.THREADS.value))


def _params_value(device: str, v: Any) -> DeviceParams | Overrides:
    """A ``params`` entry: a whole DeviceParams, or a dict of fields to override on the parameters
    in effect (kept hashable, as ``Overrides``)."""
    if isinstance(v, (DeviceParams, Overrides)):
        return v
    if isinstance(v, dict):
        return Overrides.of(v)
    raise TypeError(f"params[{device!r}]: expected a DeviceParams or a dict of its fields to override, "
                    f"got {type(v).__name__}")


# the flags settings_key reads, and its answers by (device, settings, the flags' raw state, the
# calibration file's stamp): a cached realize asks on every call, and reading 13 flags and building
# the device parameters was ~15 us of a ~50 us realize
_KEY_FLAGS = (config.OPT, config.SATURATION_TIMEOUT, config.EGRAPH_NODES, config.EGRAPH_MEMORY, config.EXTRACTOR,
              config.ILP_TIME, config.ILP_MAX_CLASSES, config.EXTRACT_TIME, config.THREADS, config.BEAM,
              config.BEAM_TIME, config.CPU, config.BLAS, config.PEAK_MEMORY, config.MERGE)
_KEYS: dict[tuple, tuple] = {}


def settings_key(device: str, settings: ExtractSettings | None = None) -> tuple:
    """Every setting that changes the plan compiled for ``device`` (with the extraction ``settings``
    of a session, None: ``DEFAULT``; the flags as this thread sees them): the plan cache key is
    ``(rules.key, settings_key(device), Program.key)``, so a change of any of these plans again.

    Flag by flag (eqgrad/config.py), and why it is in the key or not:
      EQGRAD_OPT                 in: 0 skips saturation (one kernel per op)
      EQGRAD_SATURATION_TIMEOUT  in: a saturation stopped at the limit gives another (fallback) plan, and
                                 a user who raises the limit after the warning expects a new try
                                 (this and the next two only while OPT=1: without saturation its
                                 limits change nothing)
      EQGRAD_EGRAPH_NODES        in: the node limit decides after which phase saturation stops
      EQGRAD_EGRAPH_MEMORY       in: a worker out of memory gives the unoptimized plan (as the timeout)
      EQGRAD_EXTRACTOR           in: the extractor chooses the plan
      EQGRAD_EXTRACT_TIME        in: a local search stopped at its limit keeps an earlier plan
      EQGRAD_ILP_TIME, EQGRAD_ILP_MAX_CLASSES
                                 in for the ilp extractor only (the others never read them)
      EQGRAD_PEAK_MEMORY         in: a bound on the plan's buffers makes the extractors store fewer of them
      cost function, DeviceParams (using(), or the calibration in effect from the cache directory)
                                 in: the extractor minimizes the cost they give
      EQGRAD_THREADS             in for LLVM only: a large reduction is split for the threads, and the
                                 compiled steps launch that many (the other devices never read it)
      EQGRAD_BEAM, EQGRAD_BEAM_TIME
                                 in for LLVM only: the kernel search picks each kernel's lanes
      EQGRAD_CPU                 in for LLVM only: the compiled steps are machine code for that target
                                 (lowering itself does not read it: LLVM picks the vector width)
      EQGRAD_BLAS                in for LLVM only: it decides whether a contraction's step calls the BLAS
      EQGRAD_MERGE               in: the compiled steps (LLVM, OpenCL) run sibling kernels as one
      rulebooks and schedule (EQGRAD_RULEBOOKS, EQGRAD_SCHEDULE, eqgrad.rules.use)
                                 in, as ``rules.key`` (a hash of the text of every file) next to this
      DEBUG                      out: it only prints
      EQGRAD_DEVICE              out: the default device of new tensors; the plan's own device is in the
                                 structure key
      EQGRAD_PLAN_CACHE          out: the size of this cache, not what is in it
      EQGRAD_RESIZE              out: it decides only how a missing plan is made (resized from a plan of
                                 other sizes, or compiled); a plan already cached is kept
      EQGRAD_POOL_BYTES          out: reuse of freed memory, not the plan
      EQGRAD_VALIDATE            out: a check after the run, on the same plan
      EQGRAD_VERIFY              out: a check of the loop IR as it is lowered; the kernels are the same
      EQGRAD_CACHE_DIR           out by itself: what it changes in a plan (the calibration) is keyed
                                 above; measured and kernel-search choices are read from it when a
                                 plan is compiled, and another directory does not make a compiled
                                 plan wrong
    The cost function is keyed by the object itself, not ``id()``: a new function may reuse a
    collected one's id.
    """
    s = effective(settings)
    try:
        memo = (device, s.extractor, s.cost_fn, tuple(s.params.items()), config.raw_state(_KEY_FLAGS),
                CALIBRATIONS.stamp())
        hash(memo)
    except TypeError:                    # an unhashable cost function or override: no memo
        return _settings_key(device, s)
    k = _KEYS.get(memo)
    if k is None:
        if len(_KEYS) >= 256:
            _KEYS.clear()
        k = _KEYS[memo] = _settings_key(device, s)
    return k


def _settings_key(device: str, s: ExtractSettings) -> tuple:
    opt = config.OPT.value
    sat = (config.SATURATION_TIMEOUT.value, config.EGRAPH_NODES.value, config.EGRAPH_MEMORY.value) if opt else None
    extractor = s.extractor or config.EXTRACTOR.value
    ilp = (config.ILP_TIME.value, config.ILP_MAX_CLASSES.value) if extractor == "ilp" else None
    search = config.EXTRACT_TIME.value          # a search stopped at its limit may choose another plan
    llvm = ((config.THREADS.value, config.BEAM.value, config.BEAM_TIME.value, config.CPU.value, config.BLAS.value)
            if device == "LLVM" else None)
    fn = s.cost_fn or default_cost
    try:
        hash(fn)
    except TypeError:               # a callable object without __hash__: while using() holds it, its id is its own
        fn = ("cost function", id(fn))
    return (opt, sat, extractor, ilp, search, fn, cost_model(device, s).params, llvm, config.PEAK_MEMORY.value,
            config.MERGE.value)


@contextlib.contextmanager
def using(extractor: str | None = None, cost_fn: CostFn | None = None,
          params: dict[str, DeviceParams] | DeviceParams | None = None) -> Iterator[None]:
    """Temporarily choose the extractor, the cost function and/or the device parameters (a
    DeviceParams applies to every device), over whatever the session says, in the running thread
    only: two threads' blocks never see each other's (before, a block set module globals, and its
    exit could restore them under another thread's block)."""
    ov = dict(_using.get())
    if cost_fn is not None:
        ov["cost_fn"] = cost_fn
    if isinstance(params, DeviceParams):
        ov["params"] = {d: params for d in ALL_DEVICES}
    elif params:
        ov["params"] = {**ov.get("params", {}), **{d: _params_value(d, v) for d, v in params.items()}}
        for d, v in params.items():
            cal = params_for(d) if d in ALL_DEVICES else None
            if isinstance(v, DeviceParams) and cal is not None and cal.source.startswith("calibrated") \
                    and (d, cal.source) not in _WARNED_REPLACED:
                _WARNED_REPLACED.add((d, cal.source))
                warnings.warn(f"using(params={{{d!r}: DeviceParams(...)}}) replaces all of {d}'s {cal.source} "
                              f"parameters (bandwidth {cal.bandwidth / 1e9:.1f} GB/s, peak {cal.peak / 1e9:.1f} "
                              f"GFLOP/s) by the DeviceParams defaults where not given; pass a dict, e.g. "
                              f"{{{d!r}: {{'launch': 1e-6}}}}, to override only those fields", EqgradWarning, stacklevel=3)
    if extractor is not None:
        ov["extractor"] = config.EXTRACTOR.checked(extractor, "extractor")
    token = _using.set(ov)
    try:
        if extractor is not None:
            with config.Context(EXTRACTOR=extractor):     # and the flag reads so too, inside the block
                yield
        else:
            yield
    finally:
        _using.reset(token)


def make_extractor(name: str, g: EGraph, device: str, inputs: list[tuple],
                   measure: Callable[[Choice], float] | None = None, cache_key: str | None = None,
                   progress=None, settings: ExtractSettings | None = None):
    cost = cost_model(device, settings)
    bound = config.PEAK_MEMORY.value
    if name == "measured":
        return MeasuredExtractor(g, cost, inputs, measure=measure, cache_key=cache_key, progress=progress,
                                 peak_bound=bound)
    if name == "ilp":
        return ILPExtractor(g, cost, inputs, time_limit=config.ILP_TIME.value, max_classes=config.ILP_MAX_CLASSES.value,
                            peak_bound=bound)
    if name not in EXTRACTORS:
        raise ValueError(f"unknown extractor {name!r}: expected one of {sorted(EXTRACTORS)}")
    return EXTRACTORS[name](g, cost, inputs, max_passes=4 if name == "greedy" else 8,
                            time_limit=config.EXTRACT_TIME.value, peak_bound=bound)


__all__ = ["EXTRACTORS", "DEFAULT", "DeviceParams", "ExtractSettings", "Result", "cost_model", "effective",
           "extractor_name", "make_extractor", "settings_key", "using"]
