"""Parameter sweeps: cost-model parameters x extractors x programs, in parallel.

A grid of DeviceParams overrides (``{"launch": [1e-6, 5e-6], "bandwidth": [10e9, 40e9]}``: their
cartesian product, each point a dict override that keeps the rest of the calibration, as
``using(params={"LLVM": {"launch": 1e-6}})`` does) times the extractors times the programs; each
combination is one job: plan the program under that grid point with that extractor and record the
kernels, the predicted time and (unless ``measure=False``) the measured median and spread of the
timed runs (``experiments.plan_program``). Jobs run in local processes (``jobs``; the "spawn"
start method: a fork would copy LLVM's and egglog's threads) or, given ``ray_address``, as Ray
tasks on that cluster; a tqdm bar counts completed jobs. The rows are merged, in grid order
whatever order they finished in, into one :class:`Sweep`: one table, one CSV/JSON, one plot.

Jobs are sent program *names* (built-in or ``module:function``) and resolve them where they run,
since programs are closures; the caller's ``sys.path`` goes with them. Jobs measuring at the same
time on shared cores perturb each other: the measured times of a parallel sweep rank plans, they are
not absolute times (``jobs=1`` for those, or ``measure=False`` for predictions only).
``python -m eqgrad tune sweep`` is the command-line form.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from eqgrad.extract import ALL_DEVICES, EXTRACTORS, using
from eqgrad.extract.cost import DeviceParams, Overrides
from eqgrad.tools.experiments import (Row, median, param_names, plan_program, progress_bar, correlation_text,
                                      resolve_programs, rows_to_csv, rows_to_json)

PARAM_NAMES = [f.name for f in fields(DeviceParams) if f.name != "source"]
Point = tuple[tuple[str, Any], ...]      # one grid point: the overridden fields, sorted by name


def _convert(text: str, typ: type) -> Any:
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    return typ(text)


def parse_param(spec: str) -> tuple[str, list]:
    """``--param NAME=V1,V2,...`` as (name, values), each value of the field's type and checked as
    DeviceParams checks it; a ValueError names what is wrong (an unknown name lists the fields)."""
    name, sep, text = spec.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--param {spec!r}: expected NAME=V1,V2,... (e.g. launch=1e-6,5e-6)")
    if name not in PARAM_NAMES:
        raise ValueError(f"--param {spec!r}: unknown parameter {name!r}; the DeviceParams fields are "
                         f"{', '.join(PARAM_NAMES)}")
    typ = type(getattr(DeviceParams(), name))
    values = []
    for v in (v.strip() for v in text.split(",")):
        if not v:
            continue
        try:
            x = _convert(v, typ)
        except ValueError:
            raise ValueError(f"--param {spec!r}: {v!r} is not {'an' if typ is int else 'a'} {typ.__name__}") from None
        try:
            Overrides.of({name: x})
        except ValueError as e:
            raise ValueError(f"--param {spec!r}: {e}") from None
        values.append(x)
    if not values:
        raise ValueError(f"--param {spec!r}: no values")
    return name, list(dict.fromkeys(values))


def parse_grid(specs: Sequence[str]) -> dict[str, list]:
    """Every ``--param``; a parameter given twice is an error."""
    grid: dict[str, list] = {}
    for spec in specs:
        name, values = parse_param(spec)
        if name in grid:
            raise ValueError(f"--param {name} given twice: give its values once, comma-separated")
        grid[name] = values
    return grid


def grid_points(grid: dict[str, Sequence]) -> list[Point]:
    """The cartesian product of the grid's values (one point, no override, for an empty grid);
    each point is checked as a DeviceParams override."""
    names = list(grid)
    points = []
    for combo in itertools.product(*(grid[n] for n in names)):
        points.append(Overrides.of(dict(zip(names, combo))).items)
    return points


def check_extractors(spec: str | Sequence[str]) -> tuple[str, ...]:
    names = tuple(s.strip() for s in spec.split(",") if s.strip()) if isinstance(spec, str) else tuple(spec)
    bad = [n for n in names if n not in EXTRACTORS]
    if bad or not names:
        raise ValueError(f"--extractors: unknown extractor(s) {bad or names!r}; expected some of "
                         f"{', '.join(EXTRACTORS)}")
    return names


def label(point: Point) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in point) or "default"


@dataclass(frozen=True)
class Job:
    program: str                 # a built-in name or module:function, resolved where the job runs
    extractor: str
    params: Point
    device: str = "LLVM"
    reps: int = 5
    measure: bool = True
    path: tuple[str, ...] = ()   # the caller's sys.path, appended where missing (module:function programs)


_PROGRAMS: dict[str, Callable[[], list]] = {}      # resolved once per process (the tensors are made once)


def run_job(job: Job) -> Row:
    """One grid point: plan the program under its overrides with its extractor (and time it)."""
    for p in job.path:
        if p not in sys.path:
            sys.path.append(p)
    fn = _PROGRAMS.get(job.program)
    if fn is None:
        fn = _PROGRAMS[job.program] = resolve_programs(job.program)[job.program]
    with using(params={job.device: dict(job.params)} if job.params else None):
        kernels, predicted, runs, status = plan_program(fn, job.extractor, job.device, job.reps, job.measure)
    return Row(job.program, label(job.params), job.extractor, kernels, predicted, median(runs), status=status,
               runs=runs, params=job.params)


def _run_local(jobs: list[Job], workers: int, done: Callable[[int, Row], None]) -> None:
    if workers <= 1:
        for i, j in enumerate(jobs):
            done(i, run_job(j))
        return
    # spawn: a forked child would copy the LLVM device's and egglog's threads mid-flight
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(run_job, j): i for i, j in enumerate(jobs)}
        try:
            for f in as_completed(futures):
                done(futures[f], f.result())
        except BaseException:
            ex.shutdown(wait=False, cancel_futures=True)
            raise


def _run_ray(jobs: list[Job], address: str, done: Callable[[int, Row], None]) -> int:
    """Runs the jobs as Ray tasks; the cluster's CPUs (jobs at a time, at most)."""
    import ray          # only for --ray: importing it takes seconds
    started = not ray.is_initialized()
    if started:
        ray.init(address=address)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        task = ray.remote(num_cpus=1)(run_job)
        refs = {task.remote(j): i for i, j in enumerate(jobs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                done(refs[r], ray.get(r))
        return cpus
    finally:
        if started:
            ray.shutdown()


@dataclass
class Sweep:
    """A sweep's rows, in grid order (program, grid point, extractor), and how they were run."""
    rows: list[Row]
    grid: dict[str, list]
    measure: bool
    workers: int                 # jobs run at a time (on Ray: the cluster's CPUs, at most the jobs)
    backend: str                 # "in-process", "N local processes" or "ray ADDRESS"
    seconds: float = 0.0
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = list(self.grid) or param_names(self.rows)

    def table(self) -> str:
        widths = [max(len(n), 9) for n in self.names]
        head = (f"{'program':<12} {'extractor':<9} " + " ".join(f"{n:>{w}}" for n, w in zip(self.names, widths))
                + f" {'kernels':>7} {'predicted':>12} {'measured':>12} {'spread':>9}  status")
        lines = [head, "-" * max(len(head) + 10, 100)]
        for r in self.rows:
            given = dict(r.params)
            vals = " ".join(f"{_fmt(given.get(n, '')):>{w}}" for n, w in zip(self.names, widths))
            measured = f"{r.measured * 1e6:>10.1f}us {r.spread * 1e6:>7.1f}us" if r.runs else f"{'-':>12} {'-':>9}"
            lines.append(f"{r.program:<12} {r.extractor:<9} {vals} {r.kernels:>7} {r.predicted * 1e6:>10.1f}us "
                         f"{measured}  {r.status}")
        lines.append("")
        lines.append(f"{len(self.rows)} jobs ({len(grid_points(self.grid))} grid points) on {self.backend} "
                     f"in {self.seconds:.1f} s")
        groups: dict[tuple[str, str], list[Row]] = {}
        for r in self.rows:
            groups.setdefault((r.program, r.extractor), []).append(r)
        lines.append("per program and extractor: the distinct kernel counts over the grid"
                     + ("; the grid point whose plan measured fastest; Spearman of predicted vs measured "
                        "(3 points or more)" if self.measure else ""))
        for (p, e), sub in groups.items():
            plans = len({r.kernels for r in sub})
            line = f"  {p:<12} {e:<9} {plans} kernel count(s) ({', '.join(map(str, sorted({r.kernels for r in sub})))})"
            if self.measure and sub:
                best = min(sub, key=lambda r: r.measured)
                line += f", fastest at {best.setting} ({best.measured * 1e6:.1f} us)"
                if len(sub) >= 3:
                    line += f", Spearman {correlation_text(sub)}"
            lines.append(line)
        if self.measure and self.workers > 1:
            lines.append(f"note: measured with up to {self.workers} jobs at a time on shared cores: they perturb "
                         "each other, so the measured times rank plans; they are not absolute times "
                         "(--jobs 1 for those)")
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        return rows_to_json(self.rows)

    def to_csv(self, path: str) -> str:
        return rows_to_csv(self.rows, path)

    def plot(self, path: str) -> str:
        """Predicted vs measured (when measured), then the time against each swept parameter
        (measured, else predicted), one colour per extractor, one marker per program."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        panels = (["predicted vs measured"] if self.measure else []) + self.names
        fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.5 * max(len(panels), 1), 4), squeeze=False)
        extractors = list(dict.fromkeys(r.extractor for r in self.rows))
        programs = list(dict.fromkeys(r.program for r in self.rows))
        markers = "osd^vP*X"
        y = (lambda r: r.measured) if self.measure else (lambda r: r.predicted)
        for ax, panel in zip(axes[0], panels):
            for ei, e in enumerate(extractors):
                for pi, p in enumerate(programs):
                    sub = [r for r in self.rows if r.extractor == e and r.program == p]
                    xs = [r.predicted * 1e6 if panel == "predicted vs measured" else dict(r.params)[panel]
                          for r in sub]
                    ax.scatter(xs, [y(r) * 1e6 for r in sub], s=20, color=f"C{ei}", marker=markers[pi % len(markers)],
                               label=f"{p} / {e}")
            if panel == "predicted vs measured":
                ts = [t * 1e6 for r in self.rows for t in (r.predicted, r.measured) if t > 0]
                if ts:
                    ax.plot([min(ts), max(ts)], [min(ts), max(ts)], "k:", linewidth=0.8)
                ax.set_xlabel("predicted (us)")
                ax.set_xscale("log")
            else:
                vals = [float(v) for v in self.grid.get(panel, [])]
                if vals and min(vals) > 0 and max(vals) / min(vals) >= 10:
                    ax.set_xscale("log")
                ax.set_xlabel(panel)
            ax.set_yscale("log")
            ax.set_ylabel(("measured" if self.measure else "predicted") + " (us)")
            ax.set_title(panel, fontsize=9)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"eqgrad sweep: {len(self.rows)} jobs", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def run_sweep(programs: str | Sequence[str], extractors: str | Sequence[str] = ("greedy", "improve"),
              grid: dict[str, Sequence] | None = None, device: str = "LLVM", reps: int = 5, measure: bool = True,
              jobs: int | None = None, ray_address: str | None = None, progress: bool = True) -> Sweep:
    """Every (program, grid point, extractor) planned (and timed) once, in ``jobs`` local processes
    (default: the CPU count; 1: in this process) or on the Ray cluster at ``ray_address`` ("auto",
    "ray://host:10001", "local" for a new local instance; an already initialized Ray is used as is).
    Bad programs, extractors, parameters or devices are ValueErrors, raised before any job runs."""
    names = [s.strip() for s in programs.split(",") if s.strip()] if isinstance(programs, str) else list(programs)
    names = list(resolve_programs(",".join(names)))      # checks them; "" is every built-in one
    extractors = check_extractors(extractors)
    grid = {k: list(v) for k, v in (grid or {}).items()}
    points = grid_points(grid)
    if device not in ALL_DEVICES:
        raise ValueError(f"--device: unknown device {device!r}; expected one of {', '.join(ALL_DEVICES)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs: expected an integer >= 1, got {jobs}")
    if reps < 1:
        raise ValueError(f"--reps: expected an integer >= 1, got {reps}")
    path = tuple(os.path.abspath(p or ".") for p in sys.path)
    todo = [Job(p, e, pt, device, reps, measure, path) for p in names for pt in points for e in extractors]
    rows: list[Row | None] = [None] * len(todo)
    bar = progress_bar(len(todo), progress, desc="sweep", unit="job")

    def done(i: int, row: Row) -> None:
        rows[i] = row
        bar.update(1)

    t0 = time.perf_counter()
    try:
        if ray_address:
            workers = min(_run_ray(todo, ray_address, done), len(todo))
            backend = f"ray {ray_address}"
        else:
            workers = min(jobs or os.cpu_count() or 1, len(todo))
            _run_local(todo, workers, done)
            backend = "in-process" if workers <= 1 else f"{workers} local processes"
    finally:
        bar.close()
    return Sweep([r for r in rows if r is not None], grid, measure, workers, backend, time.perf_counter() - t0)


__all__ = ["Job", "PARAM_NAMES", "Sweep", "check_extractors", "grid_points", "label", "parse_grid", "parse_param",
           "run_job", "run_sweep"]
