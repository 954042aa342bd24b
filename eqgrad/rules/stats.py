"""Rule statistics: matches and time per rule and per phase, for one realize or a whole corpus.

One realize: ``eqgrad.engine.last_plan.report`` (a :class:`SaturationReport`) has ``matches`` and
``rule_seconds`` per rule and ``phases`` with time, iterations and e-nodes; ``DEBUG=3`` prints it.

Many realizes: ``with collect() as stats: ...`` aggregates every saturation that runs inside the
block. ``python -m eqgrad rules stats`` runs the corpus below (and the examples) under it and lists
the rules that never matched and the rules that cost the most time.
"""
from __future__ import annotations

import contextlib
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .saturate import SaturationReport

_collectors: list["RuleStats"] = []


@dataclass
class RuleStats:
    matches: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    programs: dict[str, int] = field(default_factory=dict)     # programs in which the rule matched
    phase_seconds: dict[str, float] = field(default_factory=dict)
    saturations: int = 0
    stops: dict[str, int] = field(default_factory=dict)

    def add(self, rep: SaturationReport) -> None:
        self.saturations += 1
        self.stops[rep.stop_reason] = self.stops.get(rep.stop_reason, 0) + 1
        for k, v in rep.matches.items():
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


# ------------------------------------------------------------------ the corpus

def corpus() -> dict[str, Callable[[], object]]:
    """Representative programs: each returns the tensors to realize."""
    from ..frontend.tensor import Tensor
    rng = np.random.default_rng(0)

    def t(*shape, dtype=np.float32):
        return Tensor((rng.standard_normal(shape) * 2).astype(dtype))

    x, w, b = t(16, 32), t(32, 8), t(8)
    q, k, v = t(2, 4, 8, 16), t(2, 4, 8, 16), t(2, 4, 8, 16)
    xi = Tensor(rng.integers(-9, 9, (6, 5)).astype(np.int32))

    def attention():
        s = (q @ k.transpose(-1, -2)) * (1 / 4)
        return s.softmax(-1) @ v

    def conv():     # a 3x3 convolution as pad + shifted slices + multiply-add
        img, ker = t(1, 8, 8), t(3, 3)
        p = img.pad(((0, 0), (1, 1), (1, 1)))
        return sum(p[:, i:i + 8, j:j + 8] * ker[i, j] for i in range(3) for j in range(3))

    return {
        "elementwise": lambda: ((x * 2 + 1).exp() - x.abs().sqrt()).relu(),
        "softmax": lambda: x.softmax(-1),
        "log_softmax": lambda: x.log_softmax(0),
        "layernorm": lambda: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0) + 1e-5).sqrt(),
        "mlp": lambda: ((x @ w + b).relu() @ w.T).sum(),
        "attention": attention,
        "conv3x3": conv,
        "movement": lambda: x.reshape(4, 4, 32).permute(2, 0, 1).flip(0)[::2, 1:3].reshape(16, 2, 4).T + 1,
        "cat_stack": lambda: Tensor.stack([x, x * 2], 0).cat(x.unsqueeze(0), dim=0).sum(0),
        "argmax": lambda: x.argmax(1),
        "integers": lambda: ((xi * 3 + 1) // 2 % 5).maximum(xi),
        "where_clip": lambda: (x > 0).where(x.clip(-1, 1), x * 0.1),
        "reductions": lambda: x.max(0) - x.min(0) + x.std(0) * x.sum(0),
        "constants": lambda: x * 1.0 + 0.0 - 0.0 + (-(-x)) * Tensor.ones(16, 32),
    }


def run_corpus(include_examples: bool = True, progress: Callable[[str], None] | None = None) -> RuleStats:
    from ..engine import realize
    from ..frontend.tensor import Tensor
    with collect() as st:
        for name, fn in corpus().items():
            out = fn()
            outs = out if isinstance(out, (list, tuple)) else [out]
            realize([o.lazydata for o in outs if isinstance(o, Tensor)])
            if progress:
                progress(name)
        if include_examples:
            ex_dir = Path(__file__).resolve().parents[2] / "examples"
            for ex in sorted(ex_dir.glob("*.py")):
                with contextlib.redirect_stdout(None):
                    runpy.run_path(str(ex), run_name="__main__")
                if progress:
                    progress(ex.name)
    return st
