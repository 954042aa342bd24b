"""Rule statistics: matches and time per rule and per phase, for one realize or a whole corpus.

One realize: ``eqgrad.engine.last_plan.report`` (a :class:`SaturationReport`) has ``matches`` and
``rule_seconds`` per rule and ``phases`` with time, iterations and e-nodes; ``DEBUG=3`` prints it.

Many realizes: ``with collect() as stats: ...`` aggregates every saturation that runs inside the
block. ``python -m eqgrad rules stats`` runs the corpus below (and the examples) under it and lists
the rules that never matched and the rules that cost the most time.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from eqgrad.rules.saturate import SaturationReport

_collectors: list["RuleStats"] = []


@dataclass
class RuleStats:
    matches: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    programs: dict[str, int] = field(default_factory=dict)     # programs in which the rule matched
    phase_seconds: dict[str, float] = field(default_factory=dict)
    saturations: int = 0
    stops: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)      # programs (examples) that could not run, and why

    def add(self, rep: SaturationReport) -> None:
        self.saturations += 1
        self.stops[rep.stop_reason] = self.stops.get(rep.stop_reason, 0) + 1
        for k, v in rep.rule_matches.items():
            self.matches[k] = self.matches.get(k, 0) + v
            if v:
                self.programs[k] = self.programs.get(k, 0) + 1
        for k, v in rep.rule_seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        for p in rep.phases:
            self.phase_seconds[p.name] = self.phase_seconds.get(p.name, 0.0) + p.seconds

    def never_matched(self, names: list[str]) -> list[str]:
        return [n for n in names if not self.matches.get(n)]

    def report(self, names: list[str], top: int = 10) -> str:
        matched = [n for n in names if self.matches.get(n)]
        lines = [f"{self.saturations} saturations ({', '.join(f'{k}: {v}' for k, v in self.stops.items())}); "
                 f"{len(names)} rules, {len(matched)} matched"]
        lines.append("time per phase: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.phase_seconds.items()))
        lines.append(f"most time (top {top}):")
        for n, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {n:<28} {s * 1e3:8.2f} ms  {self.matches.get(n, 0):7d} matches in "
                         f"{self.programs.get(n, 0)} programs")
        never = self.never_matched(names)
        lines.append(f"never matched ({len(never)}): " + (", ".join(never) if never else "-"))
        for name, why in self.skipped.items():
            lines.append(f"skipped {name}: {why[:200]}")
        return "\n".join(lines)

    def by_source(self, groups: dict[str, list[str]]) -> str:
        """One line per rulebook or generated family: its rules, how many matched, its matches."""
        lines = ["per rulebook and generated family:"]
        width = max([len(label) for label in groups] + [0])
        for label, names in groups.items():
            matched = [n for n in names if self.matches.get(n)]
            lines.append(f"  {label:<{width}} {len(names):4d} rules, {len(matched):4d} matched, "
                         f"{sum(self.matches.get(n, 0) for n in names):8d} matches")
        return "\n".join(lines)


def record(rep: SaturationReport) -> None:
    for c in _collectors:
        c.add(rep)


@contextlib.contextmanager
def collect() -> Iterator[RuleStats]:
    st = RuleStats()
    _collectors.append(st)
    try:
        yield st
    finally:
        _collectors.remove(st)
