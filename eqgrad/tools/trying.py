"""``python -m eqgrad rules try RULEBOOK --program FILE.py``: what a rulebook does to one program.

The program is planned twice on the same lazy graph -- under the active rules, and with the rulebook
added at its phase -- and the two are compared: each of the rulebook's rules with its matches
(``SaturationReport.rule_matches``: through-Realize variants and a birewrite's two directions
folded in), the e-nodes its rules added to the e-graph and the chosen nodes they introduced
(provenance, rules/provenance.py), whether the plan changed, the e-graph per phase, and the
predicted and measured time of both plans (median of ``runs`` timed runs and their spread).
Nothing is realized: the plans are timed on random inputs of the program's shapes (engine.time_plan_runs).
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from eqgrad.engine import plan_for
from eqgrad.engine.core import time_plan_runs
from eqgrad.graph.program import linearize
from eqgrad.rules import rulebook
from eqgrad.rules.ir import emit_program
from eqgrad.rules.saturate import default_saturator
from eqgrad.rules.provenance import INPUT, rule_of
from eqgrad.tools.experiments import load_callable
from eqgrad.tools.explain import provenance_of, same_plan


def load_program(spec: str) -> Callable[[], Any]:
    """``FILE.py`` (its function ``program``), ``FILE.py:function`` or ``module:function``: a
    function of no arguments returning the Tensor (or Tensors) to plan. A ValueError says what is wrong."""
    path, sep, name = spec.rpartition(":") if spec.count(":") and not spec.endswith(".py") else (spec, "", "")
    if not sep:
        path, name = spec, "program"
    if not path.endswith(".py"):
        return load_callable(spec, "--program")
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--program {spec!r}: no file {path!r}")
    mspec = importlib.util.spec_from_file_location(f"_eqgrad_try_{p.stem}", p)
    mod = importlib.util.module_from_spec(mspec)
    try:
        mspec.loader.exec_module(mod)
    except Exception as e:
        raise ValueError(f"--program {spec!r}: running {path} failed: {type(e).__name__}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"--program {spec!r}: {path} defines no function {name!r} (expected a function of no "
                         "arguments returning the Tensor(s) to plan)")
    return fn


@dataclass
class Side:
    """One planning of the program: before (active rules) or after (the rulebook added)."""
    kernels: int
    predicted: float
    measured: list[float]
    enodes: int
    phases: list[tuple[str, int, int]]          # (phase, iterations, e-nodes after it)
    plan: Any
    report: Any

    @property
    def median(self) -> float:
        return statistics.median(self.measured) if self.measured else float("nan")

    def spread(self) -> str:
        if not self.measured:
            return "not measured"
        return f"{self.median * 1e6:.1f} us (min {min(self.measured) * 1e6:.1f}, max {max(self.measured) * 1e6:.1f}, " \
               f"{len(self.measured)} runs)"


@dataclass
class TryResult:
    rulebook: str
    phase: str
    before: Side
    after: Side
    matches: dict[str, int]                     # the rulebook's rules -> matches (after)
    added: dict[str, int]                       # rule -> e-nodes it introduced into the e-graph
    chosen: dict[str, list[str]]                # rule -> ops of the chosen plan's nodes it introduced
    where: dict[str, str] = field(default_factory=dict)   # rule -> file:line
    provenance_note: str = ""
    growth: tuple[str, str] = ("", "")          # with trace: the traced growth tables before and after

    @property
    def changed(self) -> bool:
        return not same_plan(self.before.plan, self.after.plan)

    def __str__(self) -> str:
        b, a = self.before, self.after
        lines = [f"rules try {self.rulebook} (phase {self.phase})", "matches (each of the rulebook's rules):"]
        for r, n in self.matches.items():
            extra = ""
            if r in self.added:
                extra += f"; added {self.added[r]} e-node(s)"
            if r in self.chosen:
                ops = self.chosen[r]
                extra += f"; {len(ops)} in the chosen plan ({' '.join(dict.fromkeys(ops))})"
            lines.append(f"  {r:<28} {n:6d} match(es)  {self.where.get(r, '')}{extra}")
        if self.provenance_note:
            lines.append(f"  (provenance: {self.provenance_note})")
        lines.append(f"e-graph: {b.enodes} e-nodes before, {a.enodes} after")
        for (ph, it, n), (_, it2, n2) in zip(b.phases, a.phases):
            lines.append(f"  phase {ph:<10} {it:3d} -> {it2:3d} iterations, {n:7d} -> {n2:7d} e-nodes")
        lines.append(f"plan: {'CHANGED' if self.changed else 'unchanged'}: {b.kernels} -> {a.kernels} kernel(s)")
        lines.append(f"predicted: {b.predicted * 1e6:.1f} us -> {a.predicted * 1e6:.1f} us")
        lines.append(f"measured:  {b.spread()} -> {a.spread()}")
        for when, table in zip(("before", "after"), self.growth):
            if table:
                lines.append(f"{when} the rulebook, {table}")
        if self.changed:
            lines.append("before:\n" + "\n".join("  " + x for x in b.plan.describe().splitlines()[1:]))
            lines.append("after:\n" + "\n".join("  " + x for x in a.plan.describe().splitlines()[1:]))
        return "\n".join(lines)


def _side(cp: Any, device: str, runs: int) -> Side:
    rep = cp.report
    return Side(len(cp.plan.kernels), cp.plan.predicted, time_plan_runs(cp.plan, device, runs) if runs else [],
                rep.enodes, [(p.name, p.iterations, p.enodes) for p in rep.phases], cp.plan, rep)


def _traced(lbs: list, device: str) -> str:
    """The growth table (SaturationReport.growth) of a traced saturation of ``lbs`` under the active rules."""
    cfg = rulebook.active_config()
    prog = linearize([lb for lb in lbs if not lb.realized], device=device, inspected=cfg.inspected_constants)
    _, rep = default_saturator().run(emit_program(prog).text, rules=cfg, trace=True)
    return rep.growth()


def try_rulebook(path: str | Path, program: Callable[[], Any], phase: str = rulebook.DEFAULT_PHASE,
                 iterations: int = 4, runs: int = 5, trace: bool = False) -> TryResult:
    """Plan ``program()`` without and with the rulebook at ``path`` (module docstring). ``trace``:
    also saturate both step by step and keep their per-iteration growth tables."""
    out = program()
    tensors = list(out) if isinstance(out, (list, tuple)) else [out]
    lbs = [t.lazydata for t in tensors]
    cp0, device = plan_for(lbs)
    before = _side(cp0, device, runs)
    growth = (_traced(lbs, device), "") if trace else ("", "")
    with rulebook.using(path, phase, iterations) as rb:
        cp1, _ = plan_for(lbs)
        pcp, _ = plan_for(lbs, provenance=True)
        if trace:
            growth = (growth[0], _traced(lbs, device))
    after = _side(cp1, device, runs)
    names = list(dict.fromkeys(rule_of(r.name) for r in rb.rules))      # a template's expansions: one name
    m = cp1.report.rule_matches
    matches = {r: m.get(r, 0) for r in names}
    added: dict[str, int] = {}
    chosen: dict[str, list[str]] = {}
    note = ""
    if pcp.egraph is None or not pcp.egraph.provenance:
        note = f"not recorded (the instrumented planning: {pcp.report.stop_reason})"
    else:
        for tag in pcp.egraph.provenance.values():
            r = rule_of(tag)
            if r in matches:
                added[r] = added.get(r, 0) + 1
        if not same_plan(pcp.plan, cp1.plan):
            note = "the instrumented planning chose another plan; chosen nodes not attributed"
        else:
            for nodes in provenance_of(pcp).values():
                for op, r in nodes:
                    if r != INPUT and r in matches:
                        chosen.setdefault(r, []).append(op)
    return TryResult(str(path), phase, before, after, matches, added, chosen,
                     {rule_of(r.name): r.where for r in reversed(rb.rules)}, note, growth)



def main(args: Any) -> int:
    """The CLI's ``rules try`` (cli.py parses the arguments)."""
    try:
        prog = load_program(args.program)
        res = try_rulebook(args.rulebook, prog, args.phase, args.iterations, args.runs, args.trace)
    except ValueError as e:          # a RulebookError is one too
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res)
    return 0
