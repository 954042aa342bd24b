"""Validation (EQGRAD_VALIDATE): every realize's result against the NumPy reference, and rule blame
when they differ."""
from __future__ import annotations

from typing import Callable

import numpy as np

from eqgrad.dtype import bf16_to_f32, from_storage
from eqgrad.devices import Buffer
from eqgrad.devices.numpy_device import NumpyDevice
from eqgrad.extract import make_extractor
from eqgrad.extract.egraph import EGraph, from_json, from_program
from eqgrad.extract.plan import build_plan
from eqgrad.graph.interp import run_program, run_program_ties
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.plan import KernelPlan
from eqgrad.graph.program import Program
from eqgrad.ops import numel
from eqgrad.rules.ir import emit_program
from eqgrad.rules.rulebook import RuleConfig, without_rule
from eqgrad.rules.saturate import SaturationReport, default_saturator

def reference(prog: Program) -> list[np.ndarray]:
    """The program evaluated directly with the NumPy interpreter (no optimizer, no plan)."""
    return run_program(prog)


class ValidationError(AssertionError):
    pass


def _nan_bits(a: np.ndarray, fdt) -> np.ndarray:
    """Where the integers ``a`` hold the bits of a NaN of the float dtype ``fdt`` (same width)."""
    u = a.view(f"u{fdt.itemsize}")
    return np.isnan(bf16_to_f32(u) if fdt.name == "bfloat16" else u.view(f"f{fdt.itemsize}"))


def _matches(targets: list[LazyBuffer], refs: list[np.ndarray], outs: list[np.ndarray],
             magnitudes: list[np.ndarray | None] | None = None,
             ties: list[np.ndarray | None] | None = None) -> list[str]:
    """Descriptions of the outputs that differ from the reference (empty when all agree).

    ``magnitudes`` (per root, from :func:`run_program_ties`) widen each element's absolute
    tolerance to the size of what was added up into it, where that is larger than the tensor's own
    magnitude: a gradient that cancels to 0 over terms of size 1 is rounding noise of that size.
    ``ties`` (per root, the same function's) are the elements that depend on a comparison of floats
    within rounding of a tie, which either answer may decide: ``x < s`` where ``x = max(y, s)`` was
    realized before and the plan sums ``s`` again (the fuzzer, seed 1205002 on OPENCL: the device
    said False, as its own ``s`` and ``x`` agree; the reference, whose ``s`` rounded an ulp lower,
    said True)."""
    bad = []
    for i, (t, ref, got) in enumerate(zip(targets, refs, outs)):
        got = got.reshape(t.shape)
        if t.dtype.is_float:
            # a reordered float sum of n terms differs by ~n*eps*sum|terms|, not relative to the
            # (possibly cancelled) result: the absolute tolerance scales with the tensor's magnitude
            fin = np.abs(ref[np.isfinite(ref)]) if ref.size else ref
            scale = max(1.0, float(fin.max())) if fin.size else 1.0
            mag = magnitudes[i] if magnitudes is not None else None
            if mag is not None:
                scale = np.maximum(scale, np.where(np.isfinite(mag), mag, 0.0))
            # float16/bfloat16: two correct evaluations may round to neighbouring values (one ulp)
            ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}.get(t.dtype.name, 0.0)
            close = np.isclose(got, ref, rtol=max(1e-4, 1.01 * ulp), atol=max(1e-5, ulp) * scale, equal_nan=True)
        elif t.op == "BITCAST" and t.src[0].dtype.is_float:
            # the bits of a computed float: IEEE 754 leaves the payload of an arithmetic NaN to the
            # hardware (x86 keeps the operand's, NVIDIA GPUs give 0x7fffffff), so any NaN is right
            # where the reference has a NaN; every other element must match bit for bit
            fdt = t.src[0].dtype
            close = (got == ref) | (_nan_bits(got, fdt) & _nan_bits(ref, fdt))
        else:
            close = got == ref
        tie = ties[i] if ties is not None else None
        if tie is not None:
            close = close | tie.reshape(close.shape)
        if not close.all():
            idx = np.argwhere(~close)
            bad.append(f"tensor of shape {t.shape}: {len(idx)} of {numel(t.shape)} elements differ "
                       f"(first at {idx[0].tolist()}: got {got[tuple(idx[0])]}, expected {ref[tuple(idx[0])]})")
    return bad


def _checker(targets: list[LazyBuffer], prog: Program, refs: list[np.ndarray]
             ) -> Callable[[list[np.ndarray]], list[str]]:
    """:func:`_matches` against ``refs`` as a function of the outputs, with the program's rounding
    magnitudes and near ties computed the first time the cheap check fails (a second evaluation
    of the program) and kept for the checks after it (rule blame checks one plan per fired rule)."""
    mags: list[tuple] = []

    def check(outs: list[np.ndarray]) -> list[str]:
        if not _matches(targets, refs, outs):
            return []
        if not mags:
            mags.append(run_program_ties(prog)[1:])
        return _matches(targets, refs, outs, *mags[0])
    return check


def validate(targets: list[LazyBuffer], prog: Program, outs: list[Buffer], plan: KernelPlan,
             report: SaturationReport, rules: RuleConfig) -> None:
    refs = reference(prog)
    bad = _checker(targets, prog, refs)([from_storage(o.numpy(), o.dtype) for o in outs])
    if not bad:
        return
    fired = sorted(k for k, v in report.matches.items() if v and not k.startswith("shape-"))
    verdict = blame_rules(targets, prog, refs, rules, fired, plan, targets[0].device)
    raise ValidationError("the plan's result differs from the NumPy reference:\n  " + "\n  ".join(bad)
                          + f"\nrules that fired: {', '.join(fired) or '-'}"
                          + f"\n{verdict}\n"
                          + plan.describe())


NOT_A_RULE = "the mismatch is not caused by a rule: lowering or device"


def blame_rules(targets: list[LazyBuffer], prog: Program, refs: list[np.ndarray],
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
    emitted = emit_program(prog)
    specs = prog.input_specs
    ins = [lb.buffer.to("NUMPY") for lb in prog.inputs] + [Buffer.scalar(v, dt, "NUMPY")
                                                          for v, dt in prog.params]

    check = _checker(targets, prog, refs)

    def right_on_numpy(p: KernelPlan) -> bool:
        bufs = ins + [Buffer.empty(s, d, "NUMPY") for s, d in p.buffers[len(specs):]]
        NumpyDevice().prepare(p)(bufs)
        return not check([bufs[o].data for o in p.outputs])

    def plan_of(g: EGraph) -> KernelPlan:
        res = make_extractor("greedy", g, "NUMPY", specs).extract()
        return build_plan(g, res.choice, specs, res.evaluation.kernels, n_params=len(prog.params))

    if plan is not None and device != "NUMPY" and right_on_numpy(plan):
        return (f"{NOT_A_RULE} (the same plan is right on the NUMPY reference device, so {device}'s "
                f"lowering or runtime computes it wrong; no rule is blamed)")
    out = []
    for name in fired:
        cfg, where = without_rule(rules, name)
        if cfg is None:
            continue
        js, rep = default_saturator().run(emitted.text, rules=cfg)
        if js is None:
            continue
        if right_on_numpy(plan_of(from_json(js, emitted.roots))):
            out.append(f"{name} ({where})")
    if out:
        return f"rules whose removal alone fixes it: {', '.join(out)}"
    if not right_on_numpy(plan_of(from_program(prog))):
        return f"{NOT_A_RULE} (the plan without any rule differs from the reference too)"
    return ("rules whose removal alone fixes it: none found (the plan without any rule is right: "
            "several rules together cause it)")
