"""compile_plan(): program -> e-graph -> saturation -> extraction -> kernel plan -> device code.

Compile work is cached by graph *structure* (ops, attributes, shapes, dtypes, constants, how the
realized inputs are wired -- not buffer contents), so a program saturates once per session. The
cache, the configuration and realize() live in a Session (session.py); this module holds no state
but the process-wide compile lock.
"""
from __future__ import annotations

import gc
import hashlib
import os
import threading
import time
from collections import OrderedDict
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from eqgrad import config, progress
from eqgrad.cache import machine_key
from eqgrad.counters import EqgradWarning, GlobalCounters
from eqgrad.devices import Buffer, get_device
from eqgrad.dtype import to_storage
from eqgrad.engine import diskcache
from eqgrad.engine import regions
from eqgrad.extract import ExtractSettings, cost_model, extractor_name, make_extractor, settings_key
from eqgrad.extract.cost import in_order
from eqgrad.extract.egraph import EGraph, from_json, from_program
from eqgrad.extract.plan import build_plan
from eqgrad.graph.plan import KernelPlan
from eqgrad.graph.program import Program
from eqgrad.ops import numel
from eqgrad.rules.ir import emit_program
from eqgrad.rules.rulebook import RuleConfig
from eqgrad.rules.saturate import SaturationReport, Saturator, default_saturator
from eqgrad.rules.stats import record


@dataclass
class CompiledPlan:
    plan: KernelPlan
    run: Callable[[list[Buffer]], None]
    report: SaturationReport
    egraph: EGraph | None         # None: the plan came from the disk cache (compile_plan)
    seconds: dict[str, float]
    result: Any = None            # the extractor's Result (choice, evaluation, alternatives, info); None as egraph
    trail: Any = None             # a resized plan's: what the next resize from it may take (graph/resize.py Trail)


class PlanCache(OrderedDict):
    """Compiled plans by graph structure, least recently used first; at most EQGRAD_PLAN_CACHE.
    Every method that reorders or trims holds a lock: threads share a session's cache (unlocked,
    ``move_to_end`` of a key another thread had just dropped raised KeyError)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()

    def get(self, key: Any, default: Any = None) -> Any:
        with self._lock:
            cp = super().get(key, default)
            if cp is not None:
                self.move_to_end(key)
            return cp

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            super().__setitem__(key, value)
            self.move_to_end(key)
            while len(self) > max(1, config.PLAN_CACHE.value):
                self.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            super().clear()

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()      # a parent thread may have held it at the fork


# One plan compiles at a time in the process (saturation, extraction, the device's compiler), for
# every session: the saturation worker serves one request at a time anyway, llvmlite's compile is
# not thread-safe (devices/llvm.py), and the devices' compile caches are plain dicts. A realize
# waits here only when its plan is not cached; running a compiled plan takes no lock. Re-entrant:
# the measured extractor compiles candidate plans (time_plan) while its own plan compiles.
COMPILE_LOCK = threading.RLock()


def _new_lock_in_child() -> None:
    global COMPILE_LOCK
    COMPILE_LOCK = threading.RLock()      # a parent thread may have held it at the fork
    _COMPILES[0] = 0                      # (and been inside a compile that never ends here)


os.register_at_fork(after_in_child=_new_lock_in_child)


# a compile that took GC_PAYS x the last full collection's time or more ends with one
# (``_settled``): docs/lowering.md, Constants
GC_PAYS = 20
_LAST_FULL = [0.0, 0.0]         # the last full collection's seconds; when the one running began
_COMPILES = [0]                 # compile_plan calls open (nested: a measured extractor's candidates)


def _timed_full(phase: str, info: dict) -> None:
    """gc callback: the seconds each full collection takes (``_settled`` reads the last)."""
    if info["generation"] == 2:
        if phase == "start":
            _LAST_FULL[1] = time.perf_counter()
        else:
            _LAST_FULL[0] = time.perf_counter() - _LAST_FULL[1]


gc.callbacks.append(_timed_full)


def _settled(seconds: float) -> None:
    """After a compile of ``seconds`` (the outermost): a full collection, where the last one took at
    most 1/GC_PAYS of that. A compile leaves its plan, programs and the lowering's caches in the
    old generation, and the full collection those call for otherwise comes at a later allocation
    -- inside a short step of the user's: a jitted MLP step at a new batch size (bench_compile's
    jit_batch) took 60-70 instead of 40 ms in one process of four, 17-20 ms of it one full
    collection (~11 ms with numpy, scipy, egglog and llvmlite imported; 2-vCPU Intel Xeon). A
    compile long enough to hide one pays it where it ends; a short one (a resize is not a
    compile here) does not, nor a process whose heap makes one costly (a test worker's: 0.3 s).
    docs/engine.md, "The garbage collector after a compile"."""
    if _LAST_FULL[0] and seconds >= GC_PAYS * _LAST_FULL[0] and gc.isenabled():
        gc.collect()


def compile_plan(prog: Program, rules: RuleConfig, extraction: ExtractSettings | None = None,
                 saturator: Saturator | None = None, disk: bool = True) -> CompiledPlan:
    """Saturate ``prog`` under ``rules``, extract a plan under ``extraction`` (None: the default
    session's settings) and compile it for its device. The caller holds COMPILE_LOCK.

    With ``disk`` (and EQGRAD_DISK_CACHE=1) a plan that an earlier process stored for the same
    key (engine/diskcache.py: the program, eqgrad, the rules, the settings, the machine) is read
    instead, and only compiled for the device: its ``egraph`` and ``result`` are None and its
    report is the stored one (the fired rules and stop reason; ``detail`` says it came from
    disk). ``disk=False`` always saturates and extracts -- for explain() and the tools, which read
    the e-graph and the extractor's alternatives -- and still stores the plan.

    A compile longer than EQGRAD_PROGRESS seconds shows its phase and sizes (eqgrad/progress.py)."""
    t0 = time.perf_counter()
    _COMPILES[0] += 1
    try:
        with progress.compiling(f"{len(prog.nodes):,} ops on {prog.device}"):
            cp = _compile(prog, rules, extraction, saturator, disk)
    finally:
        _COMPILES[0] -= 1
    if not _COMPILES[0]:
        _settled(time.perf_counter() - t0)
    return cp


def _compile(prog: Program, rules: RuleConfig, extraction: ExtractSettings | None, saturator: Saturator | None,
             disk: bool, prepare: bool = True) -> CompiledPlan:
    """``compile_plan``'s work; ``prepare=False`` (a region of a program, _compile_regions) stops at
    the plan: no device code (``run`` is None), no disk cache, not counted as a compiled plan."""
    device = prog.device
    dev = get_device(device)
    dbg = config.DEBUG.value
    t0 = time.perf_counter()
    key = diskcache.plan_key(prog, rules, extraction, saturator) if diskcache.enabled() and prepare else None
    if key is not None and disk:
        hit = diskcache.load_plan(key, prog)          # checked, and checked against prog: a bad file is a miss
        if hit is not None:
            return _from_disk(hit, dev, t0, dbg)
    # (a bound on the plan's memory is one on the whole program's buffers: no regions then)
    if disk and prepare and config.REGIONS.value and not config.PEAK_MEMORY.value:
        regs = regions.split(prog, cost_model(prog.device, extraction).params.max_nodes)
        if regs is not None:
            return _compile_regions(prog, regs, rules, extraction, saturator, dev, key, dbg)
    t0 = time.perf_counter()
    emitted = emit_program(prog)
    if dbg >= 6:
        print(f"--- egglog program\n{emitted.text}")
    specs = prog.input_specs             # the realized inputs, then the parameters (one element each)
    n_params = len(prog.params)
    g: EGraph | None = None
    if config.OPT.value:
        progress.phase("saturating")
        # the device's compiler is set up while the worker saturates (a first realize's ~0.1 s)
        sat = saturator or default_saturator()
        js, report = sat.run(emitted.text, rules=rules, idle=lambda: dev.warm(len(prog.nodes), sat.working), memo=True)
        GlobalCounters.saturations += 1
        GlobalCounters.saturations_reused += report.reused
        record(report)
        if js is not None:
            g = _read_egraph(js, emitted.roots)
            report.eclasses = len(g.classes)
        if report.stop_reason != "completed":
            _warn_saturation(report, g is not None)
        _report_unmatched(report, rules)
    else:
        report = SaturationReport("skipped", detail="EQGRAD_OPT=0")
    if g is None:
        g = from_program(prog)
    t1 = time.perf_counter()
    progress.phase("extracting", e_nodes=sum(len(c) for c in g.classes), e_classes=len(g.classes))
    name = extractor_name(extraction)
    measure = (lambda choice: _measure(g, choice, specs, device, n_params)) if name == "measured" else None
    # what was timed on this machine (and LLVM target) holds for it only
    cache_key = hashlib.sha256(repr((prog.key, rules.key, machine_key(device))).encode()).hexdigest()[:24]
    result = make_extractor(name, g, device, specs, measure=measure, cache_key=cache_key,
                            settings=extraction).extract()
    if result.info.get("stopped"):
        warnings.warn(f"eqgrad: extraction stopped early ({result.info['stopped']}); using the best plan "
                      "found so far", EqgradWarning, stacklevel=6)
    choice, ev = result.choice, result.evaluation
    plan = build_plan(g, choice, specs, ev.kernels, n_params=n_params)
    model = cost_model(device, extraction)
    prm = model.params
    plan.launch, plan.cold, plan.stream_bytes = prm.launch, prm.cold, prm.stream_bytes
    if prepare:         # its kernels' reads from cache, in the order they run (a region's: once stitched)
        in_order(plan, model)
    bound = result.info.get("peak_bound")
    if bound and ev.peak > bound:
        outs = sum(numel(plan.buffers[o][0]) * plan.buffers[o][1].itemsize for o in set(plan.outputs)
                   if o >= plan.n_inputs)
        warnings.warn(f"eqgrad: no plan found keeps its buffers within EQGRAD_PEAK_MEMORY={bound} bytes: the "
                      f"chosen one's take {ev.peak} ({len(ev.kernels)} kernels; the outputs alone {outs}), the "
                      "fewest over the bound that extraction found", EqgradWarning, stacklevel=6)
    t2 = time.perf_counter()
    run: Any = None
    if prepare:
        progress.phase("compiling kernels", total=len(plan.kernels))
        run = dev.prepare(plan)
    t3 = time.perf_counter()
    if config.VERIFY.value:
        _verify_stored(plan, prog)
    if key is not None and diskcache.why_not_stored(report, result.info) is None:
        diskcache.store_plan(key, plan, report, result.extractor)
    GlobalCounters.plans_compiled += prepare
    GlobalCounters.saturate_seconds += t1 - t0
    GlobalCounters.extract_seconds += t2 - t1
    GlobalCounters.compile_seconds += t3 - t2
    cp = CompiledPlan(plan, run, report, g, dict(saturate=t1 - t0, extract=t2 - t1, compile=t3 - t2), result)
    if dbg >= 3:
        print(report)
        if dbg >= 4:                   # per-iteration growth (traced at DEBUG>=4: Saturator.run)
            print(report.growth())
        print(plan.describe())
    return cp


# The e-graph last read from a saturation's JSON, with that string and its roots. A saturation the
# Saturator answers from its memo (run(memo=True)) returns the very same string, so the same program
# planned next for another device or extraction setting reads the e-graph already built: nothing
# changes an EGraph once from_json has made it (extraction and the tools only read it). from_json was
# 5 % of the op tests' time, half of it for programs saturated just before.
_LAST_READ: tuple[str, tuple[str, ...], EGraph] | None = None


def _read_egraph(js: str, roots: list[str]) -> EGraph:
    global _LAST_READ
    last = _LAST_READ
    if last is not None and last[0] is js and last[1] == tuple(roots):
        return last[2]
    g = from_json(js, roots)
    _LAST_READ = (js, tuple(roots), g)
    return g


# region plans by (rules, settings, region structure): a region's plan is a function of these alone
_REGION_PLANS: OrderedDict[tuple, tuple[KernelPlan, SaturationReport, dict]] = OrderedDict()
REGION_PLANS_MAX = 256     # docs/lowering.md, Constants


def _compile_regions(prog: Program, regs: list, rules: RuleConfig, extraction: ExtractSettings | None,
                     saturator: Saturator | None, dev: Any, key: str | None, dbg: int) -> CompiledPlan:
    """``prog`` planned region by region (regions.py): each distinct region saturated and extracted
    once (and kept for later programs), the plans stitched, the whole prepared once."""
    t0 = time.perf_counter()
    settings = settings_key(prog.device, extraction)
    plans, reports, sat, ext = [], [], 0.0, 0.0
    for r in regs:
        rkey = (rules.key, settings, r.program.key)
        hit = _REGION_PLANS.get(rkey)
        if hit is None:
            cp = _compile(r.program, rules, extraction, saturator, disk=False, prepare=False)
            hit = (cp.plan, cp.report, cp.result.info if cp.result is not None else {})
            sat += cp.seconds["saturate"]
            ext += cp.seconds["extract"]
            _REGION_PLANS[rkey] = hit
            while len(_REGION_PLANS) > REGION_PLANS_MAX:
                _REGION_PLANS.popitem(last=False)
        else:
            _REGION_PLANS.move_to_end(rkey)
        plans.append(hit[0])
        reports.append(hit)
    plan = regions.stitch(prog, regs, plans)
    in_order(plan, cost_model(prog.device, extraction))     # across the regions, in the order they run
    t2 = time.perf_counter()
    progress.phase("compiling kernels", total=len(plan.kernels))
    run = dev.prepare(plan)
    t3 = time.perf_counter()
    worst = next((rep for _, rep, _ in reports if rep.stop_reason != "completed"), reports[0][1])
    report = replace(worst, detail=(worst.detail + "; " if worst.detail else "") + plan.notes[0])
    if config.VERIFY.value:
        _verify_stored(plan, prog)
    if key is not None and all(diskcache.why_not_stored(rep, info) is None for _, rep, info in reports):
        diskcache.store_plan(key, plan, report, "regions")
    GlobalCounters.plans_compiled += 1
    GlobalCounters.compile_seconds += t3 - t2
    cp = CompiledPlan(plan, run, report, None, dict(saturate=sat, extract=ext, compile=t3 - t2,
                                                    regions=t2 - t0 - sat - ext))
    if dbg >= 3:
        print(report)
        if dbg >= 4:                   # per-iteration growth (traced at DEBUG>=4: Saturator.run)
            print(report.growth())
        print(plan.describe())
    return cp


def _verify_stored(plan: KernelPlan, prog: Program) -> None:
    """EQGRAD_VERIFY (on in the test suite): what the disk cache stores of ``plan`` reads back equal,
    and passes the check a plan read from disk gets against its program -- so that check never
    refuses a good plan."""
    if (err := diskcache.round_trip_error(plan)) is not None:
        raise AssertionError(f"the plan read back from its JSON (engine/diskcache.py) differs: {err}\n{plan.describe()}")
    if (err := diskcache.plan_mismatch(plan, prog)) is not None:
        raise AssertionError(f"the compiled plan does not fit its program (diskcache.plan_mismatch): {err}\n"
                             f"{plan.describe()}")


_UNMATCHED_REPORTED: set[tuple[str, str]] = set()     # (rule name, file:line) reported once per process
_MATCHED: set[tuple[str, str]] = set()                # user rules that have matched in some saturation


def _report_unmatched(report: SaturationReport, rules: Any) -> None:
    """Warn, once per rule, about a user rule that has matched nothing in any saturation of this
    process so far, at the first completed one it ran in (its phase named): a pattern that never
    fits the program as the phase sees it is usually written against another form
    (docs/rulebooks.md, "Phases")."""
    if report.stop_reason != "completed" or not getattr(rules, "user_rules", ()):
        return
    m = report.rule_matches
    for name, phase, where in rules.user_rules:
        if m.get(name, 0):
            _MATCHED.add((name, where))
        elif (name, where) not in _MATCHED and (name, where) not in _UNMATCHED_REPORTED:
            _UNMATCHED_REPORTED.add((name, where))
            warnings.warn(f"eqgrad: your rule {name!r} ({where}), run in phase {phase!r}, matched nothing in this "
                          f"program (its through-Realize variants included; reported once, unless it matched before). "
                          f"Check the pattern "
                          f"against `python -m eqgrad rules dump` and explain(); DEBUG=3 prints matches per rule",
                          EqgradWarning, stacklevel=4)


def _warn_saturation(report: SaturationReport, have_egraph: bool, stacklevel: int = 7) -> None:
    warnings.warn(f"eqgrad: saturation stopped early ({report.stop_reason}: {report.detail}); "
                  f"{'using the e-graph of the last finished phase' if have_egraph else 'running the unoptimized plan'}",
                  EqgradWarning, stacklevel=stacklevel)


def _from_disk(hit: tuple[KernelPlan, SaturationReport, str], dev: Any, t0: float, dbg: int) -> CompiledPlan:
    """The CompiledPlan of a plan read from the disk cache: compiled for the device only."""
    plan, report, _extractor = hit
    record(report)                 # rule statistics count the plan's matches as if it had saturated here
    if report.stop_reason == "node limit":
        _warn_saturation(report, True, stacklevel=8)      # as the compile that stored it did
    t1 = time.perf_counter()
    progress.phase("compiling kernels (plan from the disk cache)", total=len(plan.kernels))
    run = dev.prepare(plan)
    t2 = time.perf_counter()
    GlobalCounters.plans_compiled += 1
    GlobalCounters.disk_hits += 1
    GlobalCounters.load_seconds += t1 - t0
    GlobalCounters.compile_seconds += t2 - t1
    if dbg >= 3:
        print(report)
        if dbg >= 4:                   # per-iteration growth (traced at DEBUG>=4: Saturator.run)
            print(report.growth())
        print(plan.describe())
    return CompiledPlan(plan, run, report, None, dict(saturate=0.0, extract=0.0, compile=t2 - t1, load=t1 - t0), None)


def time_plan(plan: KernelPlan, device: str, reps: int = 3) -> float:
    """Median seconds of one run of ``plan`` on ``device``, on random inputs of its input shapes
    (after one warm-up run). Used by the measured extractor and the experiments."""
    return float(np.median(time_plan_runs(plan, device, reps)))


def time_plan_runs(plan: KernelPlan, device: str, reps: int = 3) -> list[float]:
    """Seconds of each of ``reps`` runs of ``plan`` on ``device`` (after one warm-up run)."""
    with COMPILE_LOCK:
        run = get_device(device).prepare(plan)
    rng = np.random.default_rng(0)
    bufs = [Buffer.from_numpy(to_storage(rng.standard_normal(s).astype(d.vnp) if d.is_float else np.ones(s, d.np), d),
                              device, d)
            for s, d in plan.buffers[:plan.n_inputs]]
    bufs += [Buffer.empty(s, d, device) for s, d in plan.buffers[plan.n_inputs:]]
    run(bufs)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run(bufs)
        ts.append(time.perf_counter() - t0)
    return ts


def _measure(g: EGraph, choice: Any, specs: list, device: str, n_params: int) -> float:
    return time_plan(build_plan(g, choice, specs, n_params=n_params), device)
