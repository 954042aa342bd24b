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

from . import config
from .devices import Buffer, get_device
from .extract.egraph import EGraph, from_json, from_lazy
from .extract import make_extractor, settings_key
from .extract.plan import Kernel, KernelPlan, build_plan
from .frontend.lazy import LazyBuffer, toposort
from .ops import OPS, numel
from .rules.ir import emit_program
from .rules.rulebook import RuleConfig, active_config
from .rules.saturate import SaturationReport, default_saturator
from .rules.stats import record


class EqgradWarning(UserWarning):
    """Optimization fell back to a less optimized plan (the message says why)."""


class GlobalCounters:
    kernel_count = 0          # kernels launched
    realize_count = 0         # realize() calls that ran a plan
    plans_compiled = 0        # plan cache misses
    saturations = 0

    @classmethod
    def reset(cls) -> None:
        cls.kernel_count = cls.realize_count = cls.plans_compiled = cls.saturations = 0


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


def structure_key(order: list[LazyBuffer], targets: list[LazyBuffer], device: str) -> tuple:
    """A hashable description of the graph that ignores buffer contents (mirrors emit_program)."""
    pos: dict[int, int] = {}
    idx: dict[int, int] = {}
    items: list[tuple] = [(device,)]

    def leaf(lb: LazyBuffer) -> tuple:
        if lb.op == "CONST":
            return ("C", repr(lb.arg), lb.shape, lb.dtype.name)
        if id(lb) not in pos:
            pos[id(lb)] = len(pos)
        return ("B", pos[id(lb)], lb.shape, lb.dtype.name)

    for lb in order:
        if lb.op in ("BUF", "CONST"):
            continue
        srcs = tuple(leaf(s) if s.op in ("BUF", "CONST") else idx[id(s)] for s in lb.src)
        arg = lb.arg.name if lb.op == "CAST" else lb.arg
        idx[id(lb)] = len(items)
        items.append((lb.op, arg, lb.shape, lb.dtype.name, srcs))
    items.append(tuple(leaf(t) if t.op in ("BUF", "CONST") else idx[id(t)] for t in targets))
    return tuple(items)


def _compile(targets: list[LazyBuffer], order: list[LazyBuffer], device: str,
             rules: RuleConfig) -> tuple[CompiledPlan, list[LazyBuffer]]:
    dev = get_device(device)
    dbg = config.DEBUG.value
    t0 = time.perf_counter()
    prog = emit_program(targets, order)
    if dbg >= 6:
        print(f"--- egglog program\n{prog.text}")
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]
    g: EGraph | None = None
    if config.OPT.value:
        js, report = default_saturator().run(prog.text, rules=rules)
        GlobalCounters.saturations += 1
        record(report)
        if js is not None:
            g = from_json(js, prog.roots)
            report.eclasses = len(g.classes)
        if report.stop_reason != "completed":
            warnings.warn(f"eqgrad: saturation stopped early ({report.stop_reason}: {report.detail}); "
                          f"{'using the e-graph of the last finished phase' if g is not None else 'running the unoptimized plan'}",
                          EqgradWarning, stacklevel=4)
    else:
        report = SaturationReport("skipped", detail="EQGRAD_OPT=0")
    if g is None:
        g = from_lazy(targets, order, prog.inputs)
    t1 = time.perf_counter()
    name = config.EXTRACTOR.value
    measure = (lambda choice: _measure(g, choice, specs, device)) if name == "measured" else None
    cache_key = hashlib.sha256(repr((structure_key(order, targets, device), rules.key)).encode()).hexdigest()[:24]
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
    return cp, prog.inputs


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


def _inputs_in_order(order: list[LazyBuffer], targets: list[LazyBuffer]) -> list[LazyBuffer]:
    seen: dict[int, LazyBuffer] = {}
    for lb in order:
        if lb.op in ("BUF", "CONST"):
            continue
        for s in lb.src:
            if s.op == "BUF" and id(s) not in seen:
                seen[id(s)] = s
    for t in targets:
        if t.op == "BUF" and id(t) not in seen:
            seen[id(t)] = t
    return list(seen.values())


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
    order = toposort(targets)
    rules = active_config()
    key = (rules.key, settings_key(device), structure_key(order, targets, device))
    cp = _plan_cache.get(key)
    if cp is None:
        cp, _ = _compile(targets, order, device, rules)
        _plan_cache[key] = cp
    return cp, device


def _realize_on(device: str, targets: list[LazyBuffer]) -> None:
    dbg = config.DEBUG.value
    t0 = time.perf_counter()
    order = toposort(targets)
    rules = active_config()
    key = (rules.key, settings_key(device), structure_key(order, targets, device))
    cp = _plan_cache.get(key)
    inputs = _inputs_in_order(order, targets)
    if cp is None:
        cp, _ = _compile(targets, order, device, rules)
        _plan_cache[key] = cp
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
        validate(targets, order, [bufs[o] for o in plan.outputs], cp, rules)
    for hook in capture_hooks:
        hook(cp, inputs, targets, bufs)
    for t, o in zip(targets, plan.outputs):
        t.op, t.src, t.arg, t.buffer = "BUF", (), None, bufs[o]
    if dbg >= 1:
        print(f"realize: {len(plan.kernels)} kernel(s) in {(t2 - t1) * 1e3:.3f} ms, "
              f"total {(t2 - t0) * 1e3:.3f} ms{'' if dbg < 2 else ' ' + str({k: round(v * 1e3, 2) for k, v in cp.seconds.items()})}")


def log_kernel(k: Kernel, seconds: float) -> None:
    gbs = k.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    gfl = k.flops / seconds / 1e9 if seconds > 0 else 0.0
    print(f"  {k.name:<5} {seconds * 1e6:10.1f} us  {gbs:7.2f} GB/s  {gfl:7.2f} GFLOP/s  "
          f"(predicted {k.predicted * 1e6:.1f} us)  {k.ast.render()[:100]}")


# ------------------------------------------------------------------ validation against the reference

def reference(targets: list[LazyBuffer], order: list[LazyBuffer]) -> list[np.ndarray]:
    """Evaluate the lazy graph directly with the op table's NumPy references (no optimizer)."""
    vals: dict[int, np.ndarray] = {}
    for lb in order:
        if lb.op == "BUF":
            vals[id(lb)] = lb.buffer.numpy().reshape(lb.shape)
        elif lb.op == "CONST":
            vals[id(lb)] = np.full(lb.shape, lb.arg, dtype=lb.dtype.np)
        elif lb.op in ("CONTIGUOUS",):
            vals[id(lb)] = vals[id(lb.src[0])]
        else:
            vals[id(lb)] = OPS[lb.op].ref([vals[id(s)] for s in lb.src], lb.arg, lb.dtype)
    return [vals[id(t)] for t in targets]


class ValidationError(AssertionError):
    pass


def _matches(targets: list[LazyBuffer], refs: list[np.ndarray], outs: list[np.ndarray]) -> list[str]:
    """Descriptions of the outputs that differ from the reference (empty when all agree)."""
    bad = []
    for t, ref, got in zip(targets, refs, outs):
        got = got.reshape(t.shape)
        if t.dtype.is_float:
            # a reordered float sum of n terms differs by ~n*eps*sum|terms|, not relative to the
            # (possibly cancelled) result: the absolute tolerance scales with the tensor's magnitude
            fin = np.abs(ref[np.isfinite(ref)]) if ref.size else ref
            scale = max(1.0, float(fin.max())) if fin.size else 1.0
            close = np.isclose(got, ref, rtol=1e-4, atol=1e-5 * scale, equal_nan=True)
        else:
            close = got == ref
        if not close.all():
            idx = np.argwhere(~close)
            bad.append(f"tensor of shape {t.shape}: {len(idx)} of {numel(t.shape)} elements differ "
                       f"(first at {idx[0].tolist()}: got {got[tuple(idx[0])]}, expected {ref[tuple(idx[0])]})")
    return bad


def validate(targets: list[LazyBuffer], order: list[LazyBuffer], outs: list[Buffer], cp: CompiledPlan,
             rules: RuleConfig) -> None:
    refs = reference(targets, order)
    bad = _matches(targets, refs, [o.numpy() for o in outs])
    if not bad:
        return
    fired = sorted(k for k, v in cp.report.matches.items() if v and not k.startswith("shape-"))
    verdict = blame_rules(targets, order, refs, rules, fired, cp.plan, targets[0].device)
    raise ValidationError("the plan's result differs from the NumPy reference:\n  " + "\n  ".join(bad)
                          + f"\nrules that fired: {', '.join(fired) or '-'}"
                          + f"\n{verdict}\n"
                          + cp.plan.describe())


NOT_A_RULE = "the mismatch is not caused by a rule: lowering or device"


def blame_rules(targets: list[LazyBuffer], order: list[LazyBuffer], refs: list[np.ndarray],
                rules: RuleConfig, fired: list[str], plan: KernelPlan | None = None,
                device: str = "NUMPY") -> str:
    """Who is to blame for a failed validation, as one line. Only runs on a failed validation.

    Rules only choose the plan, so first the failing ``plan`` itself runs on the NumPy device,
    which evaluates kernel bodies with the op table's references (no lowering, no renderer): when
    it is right there, the plan is sound and no rule is to blame -- ``device``'s lowering or
    runtime computes it wrong (a sound fusion rule may merely have made the kernel that exposes
    it; re-planning without it would "fix" the result and blame an innocent rule). Otherwise the
    program is re-planned without each fired rule in turn, and a rule whose removal alone makes
    the NumPy device agree with the reference is named (with file:line); when none does, the plan
    without any rule (the unoptimized graph, as ``EQGRAD_OPT=0``) tells "several rules together"
    from "not a rule at all"."""
    from .devices.numpy_device import NumpyDevice
    from .rules.rulebook import without_rule
    prog = emit_program(targets, order)
    specs = [(lb.shape, lb.dtype) for lb in prog.inputs]

    def right_on_numpy(p: KernelPlan) -> bool:
        bufs = [lb.buffer.to("NUMPY") for lb in prog.inputs] + [Buffer.empty(s, d, "NUMPY") for s, d in p.buffers[len(specs):]]
        NumpyDevice().prepare(p)(bufs)
        return not _matches(targets, refs, [bufs[o].data for o in p.outputs])

    def plan_of(g: EGraph) -> KernelPlan:
        res = make_extractor("greedy", g, "NUMPY", specs).extract()
        return build_plan(g, res.choice, specs, res.evaluation.kernels)

    if plan is not None and device != "NUMPY" and right_on_numpy(plan):
        return (f"{NOT_A_RULE} (the same plan is right on the NUMPY reference device, so {device}'s "
                f"lowering or runtime computes it wrong; no rule is blamed)")
    out = []
    for name in fired:
        cfg, where = without_rule(rules, name)
        if cfg is None:
            continue
        js, rep = default_saturator().run(prog.text, rules=cfg)
        if js is None:
            continue
        if right_on_numpy(plan_of(from_json(js, prog.roots))):
            out.append(f"{name} ({where})")
    if out:
        return f"rules whose removal alone fixes it: {', '.join(out)}"
    if not right_on_numpy(plan_of(from_lazy(targets, order, prog.inputs))):
        return f"{NOT_A_RULE} (the plan without any rule differs from the reference too)"
    return ("rules whose removal alone fixes it: none found (the plan without any rule is right: "
            "several rules together cause it)")
