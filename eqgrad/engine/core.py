"""realize(): lazy graph -> e-graph -> saturation -> extraction -> kernel plan -> device.

Compile work is cached by graph *structure* (ops, attributes, shapes, dtypes, constants, how the
realized inputs are wired -- not buffer contents), so a program saturates once per process.
"""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from eqgrad import config
from eqgrad.counters import EqgradWarning, GlobalCounters
from eqgrad.devices import Buffer, get_device
from eqgrad.engine.validate import validate
from eqgrad.extract import make_extractor, settings_key
from eqgrad.extract.egraph import EGraph, from_json, from_program
from eqgrad.extract.plan import build_plan
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.plan import KernelPlan
from eqgrad.graph.program import Program, linearize
from eqgrad.rules.ir import emit_program
from eqgrad.rules.rulebook import RuleConfig, active_config
from eqgrad.rules.saturate import SaturationReport, default_saturator
from eqgrad.rules.stats import record


@dataclass
class CompiledPlan:
    plan: KernelPlan
    run: Callable[[list[Buffer]], None]
    report: SaturationReport
    egraph: EGraph
    seconds: dict[str, float]
    result: Any = None            # the extractor's Result (choice, evaluation, alternatives, info)


class PlanCache(OrderedDict):
    """Compiled plans by graph structure, least recently used first; at most EQGRAD_PLAN_CACHE."""

    def get(self, key: Any, default: Any = None) -> Any:
        cp = super().get(key, default)
        if cp is not None:
            self.move_to_end(key)
        return cp

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > max(1, config.PLAN_CACHE.value):
            self.popitem(last=False)


_plan_cache: PlanCache = PlanCache()
# JIT capture (eqgrad/jit.py): called after each plan runs with (plan, input LazyBuffers, targets,
# buffers), before the targets turn into buffers
capture_hooks: list[Callable[[CompiledPlan, list[LazyBuffer], list[LazyBuffer], list[Buffer]], None]] = []
last_plan: CompiledPlan | None = None      # the plan of the most recent realize (for tools and tests)


def clear_cache() -> None:
    _plan_cache.clear()


def structure_key(prog: Program) -> tuple:
    """The plan cache's key for a program (``Program.key``: structure, never buffer contents)."""
    return prog.key


def _compile(prog: Program, rules: RuleConfig) -> CompiledPlan:
    device = prog.device
    dev = get_device(device)
    dbg = config.DEBUG.value
    t0 = time.perf_counter()
    emitted = emit_program(prog)
    if dbg >= 6:
        print(f"--- egglog program\n{emitted.text}")
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    g: EGraph | None = None
    if config.OPT.value:
        js, report = default_saturator().run(emitted.text, rules=rules)
        GlobalCounters.saturations += 1
        record(report)
        if js is not None:
            g = from_json(js, emitted.roots)
            report.eclasses = len(g.classes)
        if report.stop_reason != "completed":
            warnings.warn(f"eqgrad: saturation stopped early ({report.stop_reason}: {report.detail}); "
                          f"{'using the e-graph of the last finished phase' if g is not None else 'running the unoptimized plan'}",
                          EqgradWarning, stacklevel=4)
    else:
        report = SaturationReport("skipped", detail="EQGRAD_OPT=0")
    if g is None:
        g = from_program(prog)
    t1 = time.perf_counter()
    name = config.EXTRACTOR.value
    measure = (lambda choice: _measure(g, choice, specs, device)) if name == "measured" else None
    cache_key = hashlib.sha256(repr((prog.key, rules.key)).encode()).hexdigest()[:24]
    result = make_extractor(name, g, device, specs, measure=measure, cache_key=cache_key).extract()
    choice, ev = result.choice, result.evaluation
    plan = build_plan(g, choice, specs, ev.kernels)
    t2 = time.perf_counter()
    run = dev.prepare(plan)
    t3 = time.perf_counter()
    GlobalCounters.plans_compiled += 1
    cp = CompiledPlan(plan, run, report, g, dict(saturate=t1 - t0, extract=t2 - t1, compile=t3 - t2), result)
    if dbg >= 3:
        print(report)
        print(plan.describe())
    return cp


def time_plan(plan: KernelPlan, device: str, reps: int = 3) -> float:
    """Median seconds of one run of ``plan`` on ``device``, on random inputs of its input shapes
    (after one warm-up run). Used by the measured extractor and the experiments."""
    run = get_device(device).prepare(plan)
    rng = np.random.default_rng(0)
    bufs = [Buffer.from_numpy(rng.standard_normal(s).astype(d.np) if d.is_float else np.ones(s, d.np), device)
            for s, d in plan.buffers[:plan.n_inputs]]
    bufs += [Buffer.empty(s, d, device) for s, d in plan.buffers[plan.n_inputs:]]
    run(bufs)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run(bufs)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _measure(g: EGraph, choice: Any, specs: list, device: str) -> float:
    return time_plan(build_plan(g, choice, specs), device)


def realize(lbs: list[LazyBuffer]) -> None:
    targets = list({id(lb): lb for lb in lbs if not lb.realized}.values())
    if not targets:
        return
    by_device: dict[str, list[LazyBuffer]] = {}
    for t in targets:
        by_device.setdefault(t.device, []).append(t)
    for device, ts in by_device.items():
        _realize_on(device, ts)


def plan_for(lbs: list[LazyBuffer]) -> tuple[CompiledPlan, str]:
    """The compiled plan that realize() would run for these lazy buffers (compiled and cached if
    needed, not run). For explain() and tools."""
    targets = list({id(lb): lb for lb in lbs if not lb.realized}.values())
    if not targets:
        raise ValueError("explain: the tensors are already realized; there is no plan left to explain")
    devices = {t.device for t in targets}
    if len(devices) != 1:
        raise ValueError(f"explain: tensors on several devices {sorted(devices)}; explain one device at a time")
    device = devices.pop()
    prog = linearize(targets, device=device)
    cp, _ = _cached_plan(prog, active_config())
    return cp, device


def _cached_plan(prog: Program, rules: RuleConfig) -> tuple[CompiledPlan, tuple]:
    key = (rules.key, settings_key(prog.device), prog.key)
    cp = _plan_cache.get(key)
    if cp is None:
        cp = _compile(prog, rules)
        _plan_cache[key] = cp
    return cp, key


def _realize_on(device: str, targets: list[LazyBuffer]) -> None:
    dbg = config.DEBUG.value
    t0 = time.perf_counter()
    prog = linearize(targets, device=device)
    rules = active_config()
    cp, _ = _cached_plan(prog, rules)
    inputs = prog.inputs
    global last_plan
    last_plan = cp
    plan = cp.plan
    # host buffers come from the pool (devices/__init__.py); the intermediates go back to it as soon
    # as ``bufs`` is dropped at the end of this call, the outputs when no tensor holds them any more
    bufs: list[Buffer] = [lb.buffer for lb in inputs]
    for shape, dt in plan.buffers[len(inputs):]:
        bufs.append(Buffer.empty(shape, dt, device))
    t1 = time.perf_counter()
    cp.run(bufs)
    t2 = time.perf_counter()
    GlobalCounters.realize_count += 1
    if config.VALIDATE.value:
        validate(targets, prog, [bufs[o] for o in plan.outputs], plan, cp.report, rules)
    for hook in capture_hooks:
        hook(cp, inputs, targets, bufs)
    for t, o in zip(targets, plan.outputs):
        t.op, t.src, t.arg, t.buffer = "BUF", (), None, bufs[o]
    if dbg >= 1:
        print(f"realize: {len(plan.kernels)} kernel(s) in {(t2 - t1) * 1e3:.3f} ms, "
              f"total {(t2 - t0) * 1e3:.3f} ms{'' if dbg < 2 else ' ' + str({k: round(v * 1e3, 2) for k, v in cp.seconds.items()})}")
