"""Experiments: run programs under several extractors and cost-model settings, measure every plan.

``run_experiment`` plans each program with each (extractor, cost setting), times the plan on the
device, and also times the best few *candidate* plans the local search costed, to report how well
predicted time ranks measured time (Spearman's rank correlation per program and overall). Results
come back as rows, print as a table (:func:`format_table`) and plot (:func:`plot`, matplotlib:
predicted vs measured, one colour per program). ``python -m eqgrad tune experiment`` is the
command-line form; progress bars use tqdm. The pieces a parameter sweep reuses (tools/sweep.py):
:func:`resolve_programs` (programs by name, picklable), :func:`plan_program` (one plan, timed),
the rows' CSV and JSON, :func:`progress_bar`.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from eqgrad.extract.cost import DeviceParams
from eqgrad.frontend.tensor import Tensor
from eqgrad.engine.core import time_plan_runs
from eqgrad import engine
from eqgrad.extract import make_extractor, using
from eqgrad.extract.plan import build_plan


@dataclass
class Row:
    program: str
    setting: str
    extractor: str
    kernels: int
    predicted: float       # seconds
    measured: float        # seconds (median)
    candidate: bool = False
    status: str = ""       # how the extractor ended (Result.status: the ILP's optimal / fallback ...)
    runs: tuple[float, ...] = ()    # every timed run's seconds
    params: tuple[tuple[str, Any], ...] = ()    # the DeviceParams fields overridden (a sweep's grid point)

    @property
    def spread(self) -> float:
        """Seconds between the fastest and the slowest timed run."""
        return max(self.runs) - min(self.runs) if self.runs else 0.0


def default_programs() -> dict[str, Callable[[], list]]:
    rng = np.random.default_rng(0)

    def t(*s):
        return Tensor(rng.standard_normal(s).astype(np.float32))
    x = t(1024, 1024)
    q, k, v = t(8, 8, 256, 64), t(8, 8, 256, 64), t(8, 8, 256, 64)
    w1, w2, xb = t(64, 128), t(128, 10), t(256, 64)

    def layernorm():
        m = x.mean(-1, keepdim=True)
        return [(x - m) / ((x - m) * (x - m)).mean(-1, keepdim=True).add(1e-5).sqrt()]

    def mlp_step():
        """One SGD step of a 2-layer MLP (needs autograd); falls back to the forward pass."""
        a, b = w1.detach(), w2.detach()
        if hasattr(Tensor, "backward") and hasattr(Tensor, "requires_grad_"):
            a.requires_grad_(True)
            b.requires_grad_(True)
            loss = ((xb @ a).relu() @ b).log_softmax(-1).mean()
            loss.backward()
            return [a - 0.1 * a.grad, b - 0.1 * b.grad]
        return [((xb @ a).relu() @ b).log_softmax(-1)]

    return {"softmax": lambda: [x.softmax(-1)], "layernorm": layernorm,
            "attention": lambda: [((q @ k.transpose(-1, -2)) * 0.125).softmax(-1) @ v],
            "mlp_step": mlp_step}


def load_callable(spec: str, what: str):
    """``module:function`` imported (the working directory is importable), or a ValueError that
    says what went wrong."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"{what} {spec!r}: expected module:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import {mod!r} ({e})") from None
    fn = getattr(m, name, None)
    if not callable(fn):
        raise ValueError(f"{what} {spec!r}: {mod} has no function {name!r}")
    return fn


def _as_list(fn: Callable) -> Callable[[], list]:
    return lambda: (lambda r: list(r) if isinstance(r, (list, tuple)) else [r])(fn())


def resolve_programs(spec: str) -> dict[str, Callable[[], list]]:
    """``--programs``: comma-separated built-in names (``default_programs``) or ``module:function``
    (a function of no arguments returning the Tensor or list of Tensors to plan); an unknown name
    is a ValueError naming the known ones (it used to run the defaults silently). The names are
    what a process or a Ray worker is sent: it resolves them again (the programs are closures)."""
    known = default_programs()
    if not spec:
        return known
    out = {}
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if ":" in item:
            out[item] = _as_list(load_callable(item, "--programs"))
        elif item in known:
            out[item] = known[item]
        else:
            raise ValueError(f"--programs: unknown program {item!r}; the built-in ones are {', '.join(known)}, "
                             "or give module:function")
    return out


def _time_plan(plan, device: str, reps: int) -> tuple[float, ...]:
    """Every timed run's seconds (the median is the row's ``measured``)."""
    return tuple(time_plan_runs(plan, device, reps))


def plan_program(fn: Callable[[], list], extractor: str, device: str, reps: int,
                 measure: bool = True) -> tuple[int, float, tuple[float, ...], str]:
    """Plan ``fn``'s tensors with ``extractor`` (under the ``using()`` settings in effect) and time
    the plan ``reps`` times unless ``measure`` is false: (kernels, predicted seconds, the timed runs'
    seconds, the extractor's status)."""
    with using(extractor=extractor):
        outs = fn()
        cp, _ = engine.plan_for([o.lazydata for o in outs])
    runs = _time_plan(cp.plan, device, reps) if measure else ()
    return (len(cp.plan.kernels), cp.plan.predicted, runs,
            cp.result.status if cp.result is not None else "resized plan")


def median(runs: tuple[float, ...]) -> float:
    """The row's ``measured``: the runs' median (NaN when it was not measured)."""
    return float(np.median(runs)) if runs else float("nan")


def run_experiment(programs: dict[str, Callable[[], list]] | None = None,
                   extractors: tuple[str, ...] = ("greedy", "improve", "ilp", "measured"),
                   settings: dict[str, DeviceParams | None] | None = None, device: str = "LLVM",
                   reps: int = 5, candidates: int = 6, progress: bool = True,
                   cost_fn: Callable | None = None) -> list[Row]:
    programs = programs or default_programs()
    settings = settings or {"default": None}
    jobs = [(p, s, e) for p in programs for s in settings for e in extractors]
    bar = progress_bar(len(jobs) + len(programs) * len(settings), progress)
    rows: list[Row] = []
    for pname, fn in programs.items():
        for sname, params in settings.items():
            with using(params={device: params} if params else None, cost_fn=cost_fn):
                for ex in extractors:
                    kernels, predicted, runs, status = plan_program(fn, ex, device, reps)
                    rows.append(Row(pname, sname, ex, kernels, predicted, median(runs), status=status, runs=runs))
                    bar.update(1)
                # candidate plans of the local search, for the rank correlation
                outs = fn()
                cp, _ = engine.plan_for([o.lazydata for o in outs])
                specs = [cp.plan.buffers[i] for i in range(cp.plan.n_inputs)]
                res = make_extractor("improve", cp.egraph, device, specs)
                res.keep = candidates
                r = res.extract()
                for total, choice in r.candidates:
                    plan = build_plan(cp.egraph, choice, specs, res.ev.evaluate(choice).kernels)
                    runs = _time_plan(plan, device, reps)
                    rows.append(Row(pname, sname, "candidate", len(plan.kernels), total, float(np.median(runs)),
                                    candidate=True, runs=runs))
                bar.update(1)
    bar.close()
    return rows


def rank_correlation(rows: list[Row]) -> float:
    from scipy.stats import spearmanr
    if len(rows) < 3 or len({r.predicted for r in rows}) < 2 or len({r.measured for r in rows}) < 2:
        return float("nan")          # undefined: a constant side has no ranks (correlation_text says so)
    rho = spearmanr([r.predicted for r in rows], [r.measured for r in rows]).statistic
    return float(rho)


def correlation_text(rows: list[Row]) -> str:
    rho = rank_correlation(rows)
    if rho == rho:
        return f"{rho:+.2f}"
    if len(rows) >= 3 and len({r.predicted for r in rows}) < 2:
        return "n/a: every plan tried was predicted the same time"
    return "n/a: fewer than 3 plans, or every one measured the same"


def format_table(rows: list[Row]) -> str:
    lines = [f"{'program':<10} {'setting':<9} {'extractor':<10} {'kernels':>7} {'predicted':>12} {'measured':>12} "
             f"{'spread':>9}  status", "-" * 100]
    for r in rows:
        if r.candidate:
            continue
        lines.append(f"{r.program:<10} {r.setting:<9} {r.extractor:<10} {r.kernels:>7} "
                     f"{r.predicted * 1e6:>10.1f}us {r.measured * 1e6:>10.1f}us {r.spread * 1e6:>7.1f}us  {r.status}")
    lines.append("")
    lines.append("rank correlation (Spearman) of predicted vs measured, per program (the plans tried for it):")
    for p in dict.fromkeys(r.program for r in rows):
        sub = [r for r in rows if r.program == p]
        lines.append(f"  {p:<10} {correlation_text(sub)}  ({len(sub)} plans)")
    lines.append(f"  {'all':<10} {correlation_text(rows)}  ({len(rows)} plans; pools programs whose times differ "
                 "by orders of magnitude, so it is high whatever each program's own: read the rows above)")
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 5))
    for i, p in enumerate(dict.fromkeys(r.program for r in rows)):
        sub = [r for r in rows if r.program == p]
        ax.scatter([r.predicted * 1e6 for r in sub], [r.measured * 1e6 for r in sub], label=p, s=18,
                   marker="o" if i % 2 == 0 else "s")
    lo = min(min(r.predicted, r.measured) for r in rows) * 1e6
    hi = max(max(r.predicted, r.measured) for r in rows) * 1e6
    ax.plot([lo, hi], [lo, hi], "k:", linewidth=0.8, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted (us)")
    ax.set_ylabel("measured (us)")
    ax.set_title(f"eqgrad plans: predicted vs measured (Spearman {rank_correlation(rows):+.2f})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rows_to_json(rows: list[Row]) -> list[dict]:
    """Every row with every timed run (``runs``), its spread, the extractor's status and the
    parameters overridden (``params``, a dict)."""
    return [dict(asdict(r), spread=r.spread, params=dict(r.params)) for r in rows]


def param_names(rows: list[Row]) -> list[str]:
    """The overridden DeviceParams fields of the rows, in the order first seen."""
    return list(dict.fromkeys(k for r in rows for k, _ in r.params))


def rows_to_csv(rows: list[Row], path: str) -> str:
    """One CSV line per timed run (one per row where none was timed): program, setting, the
    overridden parameters (a column each, for a sweep's rows), extractor, candidate, kernels,
    predicted seconds, the row's median, status, run number, the run's seconds."""
    import csv
    names = param_names(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["program", "setting", *names, "extractor", "candidate", "kernels", "predicted_s", "median_s",
                    "status", "run", "seconds"])
        for r in rows:
            given = dict(r.params)
            for i, t in enumerate(r.runs or (r.measured,)):
                w.writerow([r.program, r.setting, *(given.get(n, "") for n in names), r.extractor, int(r.candidate),
                            r.kernels, r.predicted, r.measured, r.status, i, t])
    return path


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool, desc: str = "plans", unit: str = "plan"):
    """A tqdm bar (``update(n)``, ``close()``), or one that shows nothing when disabled or when
    tqdm is not installed."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit)
