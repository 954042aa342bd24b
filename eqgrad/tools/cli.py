"""Command line: ``python -m eqgrad rules check [FILES]``, ``rules stats``, ``rules dump [DIR]``, ``rules try``,
``tune calibrate``, ``tune experiment``, ``tune sweep``."""
from __future__ import annotations

import argparse
import sys


def _rules_check(args: argparse.Namespace) -> int:
    from eqgrad.tools.check import check_rules
    from eqgrad.rules.dump import load_files, source_label
    from eqgrad.rules.rulebook import RulebookError, all_rules
    from eqgrad.rules.ranks import base_name
    try:
        if args.files:      # a schedule among them: a whole configuration (a `rules dump`)
            books, _ = load_files(args.files)
            rules = [r for b in books for r in b.rules]
        else:
            rules = all_rules()
    except RulebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rule:           # a rank-generic rule by its own name: every rank's expansion (rules/ranks.py)
        rules = [r for r in rules if r.name in args.rule or base_name(r.name) in args.rule]
    counts: dict[str, int] = {}
    per_source: dict[str, dict[str, int]] = {}

    def show(res) -> None:
        counts[res.status] = counts.get(res.status, 0) + 1
        src = per_source.setdefault(res.rule.file, {})
        src[res.status] = src.get(res.status, 0) + 1
        if res.status not in ("sound", "skipped") or args.verbose:
            print(res, flush=True)

    check_rules(rules, n=args.n, seed=args.seed, progress=show, rtol=args.rtol, atol=args.atol)
    width = max([len(source_label(src)) for src in per_source] + [0])
    for src, c in per_source.items():
        print(f"  {source_label(src):<{width}} {sum(c.values()):4d} rules: "
              + ", ".join(f"{v} {k}" for k, v in sorted(c.items())))
    print(f"{len(rules)} rules: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    bad = counts.get("unsound", 0) + (counts.get("untested", 0) if args.strict else 0)
    return 1 if bad else 0


def _rules_stats(args: argparse.Namespace) -> int:
    from eqgrad.rules.dump import source_label
    from eqgrad.rules.rulebook import all_rules
    from eqgrad.tools.stats import run_corpus
    st = run_corpus(include_examples=not args.no_examples,
                    progress=(lambda name: print(f"  ran {name}", file=sys.stderr)) if args.verbose else None)
    rules = all_rules()
    names = [r.name for r in rules if not r.name.startswith("shape-")]
    print(st.report(names, top=args.top))
    groups: dict[str, list[str]] = {}
    for r in rules:
        groups.setdefault(source_label(r.file), []).append(r.name)
    print(st.by_source(groups))
    return 0


def _rules_try(args: argparse.Namespace) -> int:
    from eqgrad.tools.trying import main as try_main
    return try_main(args)


def _rules_dump(args: argparse.Namespace) -> int:
    from eqgrad.rules.dump import dump_files, write_dump
    from eqgrad.rules.rulebook import RulebookError
    try:
        files = write_dump(args.dir) if args.dir else dump_files()
    except RulebookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'family':<16} {'kind':<10} {'rules':>5}  file")
    for f in files:
        count = f"{f.count} phases" if f.kind == "schedule" else f"{f.count}"
        print(f"{f.family:<16} {f.kind:<10} {count:>5}  {f.filename}  ({f.source or '-'})")
    total = sum(f.count for f in files if f.kind != "schedule")
    if args.dir:
        print(f"{total} rules in {len(files)} files written to {args.dir}; check them with "
              f"`python -m eqgrad rules check {args.dir}/*.egg`")
    else:
        print(f"{total} rules; `python -m eqgrad rules dump DIR` writes them as .egg files")
    return 0


def _tune_calibrate(args: argparse.Namespace) -> int:
    from eqgrad.tools.calibrate import calibrate
    from eqgrad.extract.cost import save_calibration
    spread: dict = {}
    params = calibrate(args.device, progress=lambda msg: print(f"  {msg}", flush=True), runs=args.runs, spread=spread,
                       fit_corpus=not args.no_fit)
    print(f"{args.device}: launch {params.launch * 1e6:.1f} us, bandwidth {params.bandwidth / 1e9:.1f} GB/s, "
          f"peak {params.peak / 1e9:.1f} GFLOP/s, contraction {params.contraction / 1e9:.1f} GFLOP/s, "
          f"{params.cold * 1e6:.1f} us more a launch after a stream, {params.row_pass * 1e9:.2f} ns a row pass, "
          f"reads from cache {params.cache_bandwidth / 1e9:.1f} GB/s within {params.cache_bytes / 2 ** 20:g} MiB of reuse, strided reads {params.strided_bandwidth / 1e9:.1f} GB/s"
          + (f" (median of {args.runs} runs)" if args.runs > 1 else ""))
    if args.runs > 1:
        unit = {"launch": (1e6, "us"), "bandwidth": (1e-9, "GB/s"), "peak": (1e-9, "GFLOP/s"),
                "contraction": (1e-9, "GFLOP/s"), "cold": (1e6, "us"), "row_pass": (1e9, "ns"),
                "cache_bandwidth": (1e-9, "GB/s"), "strided_bandwidth": (1e-9, "GB/s")}
        print("  spread (min-max over the runs): " + ", ".join(
            f"{f} {lo * unit[f][0]:.1f}-{hi * unit[f][0]:.1f} {unit[f][1]}" for f, (lo, hi) in spread.items()))
    if not args.dry_run:
        where = save_calibration(args.device, params)
        print(f"saved to {where}" if where is not None else
              "not saved: the cache directory is unusable (see the warning above; EQGRAD_CACHE_DIR)")
    return 0


def load_callable(spec: str, what: str):
    """``module:function`` imported, or a ValueError that says what went wrong
    (``experiments.load_callable``)."""
    from eqgrad.tools.experiments import load_callable as load
    return load(spec, what)


def experiment_programs(spec: str) -> dict:
    """``--programs``: built-in names or ``module:function`` (``experiments.resolve_programs``)."""
    from eqgrad.tools.experiments import resolve_programs
    return resolve_programs(spec)


def _tune_experiment(args: argparse.Namespace) -> int:
    import json
    from dataclasses import replace
    from eqgrad.extract.cost import params_for
    from eqgrad.tools.experiments import format_table, plot, rows_to_csv, rows_to_json, run_experiment
    try:
        progs = experiment_programs(args.programs)
        cost_fn = load_callable(args.cost, "--cost") if args.cost else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = params_for(args.device)
    settings = {"default": None}
    if args.sweep:
        settings.update({"launch x10": replace(base, launch=base.launch * 10),
                         "flops/10": replace(base, peak=base.peak / 10)})
    rows = run_experiment(progs, tuple(args.extractors.split(",")), settings, args.device, args.reps,
                          progress=not args.no_progress, cost_fn=cost_fn)
    print(format_table(rows))
    if args.plot:
        print(f"plot: {plot(rows, args.plot)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_to_json(rows), f, indent=1)
    if args.csv:
        print(f"csv: {rows_to_csv(rows, args.csv)}")
    return 0


def _tune_sweep(args: argparse.Namespace) -> int:
    import json
    from eqgrad.tools.sweep import parse_grid, run_sweep
    try:
        grid = parse_grid(args.param)
        programs = list(experiment_programs(args.programs))
        sweep = run_sweep(programs, args.extractors, grid, args.device, args.reps, measure=not args.no_measure,
                          jobs=args.jobs, ray_address=args.ray or None, progress=not args.no_progress)
    except ValueError as e:         # raised before any job runs
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(sweep.table())
    if args.plot:
        print(f"plot: {sweep.plot(args.plot)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sweep.to_json(), f, indent=1)
        print(f"json: {args.json}")
    if args.csv:
        print(f"csv: {sweep.to_csv(args.csv)}")
    return 0


def _fuzz_index(args: argparse.Namespace) -> int:
    import random
    from eqgrad.tools.fuzz_index import campaign
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    devs = tuple(d for d in args.device.split(",") if d)
    res = campaign(seed, args.count, devs, max_steps=args.steps, engine=args.engine,
                   progress=(lambda i: print(f"  {i + 1} chains", file=sys.stderr, flush=True)
                             if (i + 1) % 500 == 0 else None))
    print(f"{res.count} random movement chains (seed {seed}) on loop IR{''.join(',' + d for d in devs)}"
          f"{' (and the engine)' if args.engine else ''} in {res.seconds:.1f} s: "
          f"{'no failures' if res.failure is None else f'FAILED after {res.first_failure_s:.2f} s'}")
    if res.failure:
        print(res.failure)
    return 1 if res.failure else 0


def _fuzz(args: argparse.Namespace) -> int:
    if args.index:
        return _fuzz_index(args)
    import time
    from hypothesis import HealthCheck, given, seed, settings
    from eqgrad import config
    from eqgrad.tools.fuzz import check_program, program_strategy
    failures: list[str] = []
    count = 0

    @settings(max_examples=args.examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(program_strategy(max_steps=args.steps))
    def run(prog) -> None:
        nonlocal count
        count += 1
        for dev in devs:
            try:
                err = check_program(prog, dev)
            except Exception as e:          # a crash is a failure too (and is shrunk like one)
                raise AssertionError(f"[{dev}] raised {type(e).__name__}: {e}\n{prog}") from e
            assert err is None, f"[{dev}] {err}\n{prog}"
    devs = args.device.split(",")
    if args.seed is not None:
        run = seed(args.seed)(run)            # the same seed gives the same programs
    t0 = time.perf_counter()
    try:
        with config.Context(VALIDATE=0 if args.no_validate else 1):
            run()
    except AssertionError as e:          # hypothesis has shrunk it to a small program
        failures.append(str(e))
    print(f"{count} random programs (seed {args.seed if args.seed is not None else 'random'}) on "
          f"{','.join(devs)} in {time.perf_counter() - t0:.1f} s: {'no failures' if not failures else 'FAILED'}")
    for f in failures:
        print(f)
    return 1 if failures else 0


def _outputs(p: argparse.ArgumentParser) -> None:
    """The result files and the progress switch of ``tune experiment`` and ``tune sweep``."""
    p.add_argument("--plot", default="", help="save the plot (PNG) here")
    p.add_argument("--json", default="", help="every row, with each timed run, as JSON here")
    p.add_argument("--csv", default="", help="one line per timed run, as CSV here")
    p.add_argument("--no-progress", action="store_true")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eqgrad", description="eqgrad tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    rules = sub.add_parser("rules", help="rulebook tools").add_subparsers(dest="rcmd", required=True)
    c = rules.add_parser("check", help="check rules for soundness on random instances")
    c.add_argument("files", nargs="*", help="rulebook files (default: every active rulebook, generated included)")
    c.add_argument("--rule", action="append", help="only the rule(s) with this name")
    c.add_argument("-n", type=int, default=64, help="random instances per rule, per direction of a birewrite "
                                                    "(default 64; the first 24 take only special values)")
    c.add_argument("--rtol", type=float, default=1e-5,
                   help="relative tolerance of float comparisons (default 1e-5; `;; check: exact` rules use none)")
    c.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance of float comparisons (default 1e-6)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--strict", action="store_true", help="fail on rules no instance could exercise")
    c.add_argument("-v", "--verbose", action="store_true", help="print sound rules too")
    c.set_defaults(fn=_rules_check)
    s = rules.add_parser("stats", help="run the corpus and the examples; list dead and expensive rules")
    s.add_argument("--top", type=int, default=10)
    s.add_argument("--no-examples", action="store_true")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(fn=_rules_stats)
    d = rules.add_parser("dump", help="every rule that runs (generated, built-in, user) and the schedule used, "
                                      "as .egg files")
    d.add_argument("dir", nargs="?", default="", help="write the files here (default: print a summary)")
    d.set_defaults(fn=_rules_dump)
    tr = rules.add_parser("try", help="plan a program without and with a rulebook: matches per rule, the terms "
                                      "added, whether the plan changed, predicted and measured time")
    tr.add_argument("rulebook", help="the .egg file")
    tr.add_argument("--program", required=True, help="FILE.py (its function program()), FILE.py:function or "
                    "module:function: returns the Tensor(s) to plan")
    tr.add_argument("--phase", default="cleanup", help="the schedule phase the rulebook runs at (default cleanup, as "
                    "rules.use)")
    tr.add_argument("--iterations", type=int, default=4, help="rounds of the rulebook's rulesets in the phase")
    tr.add_argument("--runs", type=int, default=5, help="timed runs of each plan (0: do not measure)")
    tr.add_argument("--trace", action="store_true", help="also saturate step by step and print the e-graph's growth "
                    "per iteration, before and after")
    tr.set_defaults(fn=_rules_try)
    tune = sub.add_parser("tune", help="cost model and extraction tools").add_subparsers(dest="tcmd", required=True)
    cal = tune.add_parser("calibrate", help="measure launch overhead, bandwidth, peak and contraction FLOP/s of a device")
    cal.add_argument("--device", default="LLVM")
    cal.add_argument("--dry-run", action="store_true", help="measure and print, do not save")
    cal.add_argument("--runs", type=int, default=3, help="whole measurements; each parameter is their median "
                     "(the spread is printed)")
    cal.add_argument("--no-fit", action="store_true", help="keep the microbenchmarks' values; do not fit them to "
                     "the kernels of a corpus of model-like programs (eqgrad/tools/calibrate.py, fit)")
    cal.set_defaults(fn=_tune_calibrate)
    ex = tune.add_parser("experiment", help="plan programs with several extractors; predicted vs measured")
    ex.add_argument("--programs", default="", help="comma-separated: softmax,layernorm,attention,mlp_step, or "
                    "module:function (returns the Tensor(s) to plan)")
    ex.add_argument("--cost", default="", help="a cost function module:function (stats, params) -> seconds")
    ex.add_argument("--extractors", default="greedy,improve,ilp,measured")
    ex.add_argument("--device", default="LLVM")
    ex.add_argument("--reps", type=int, default=5)
    ex.add_argument("--sweep", action="store_true", help="also run with 10x launch overhead and 1/10 peak")
    _outputs(ex)
    ex.set_defaults(fn=_tune_experiment)
    sw = tune.add_parser("sweep", help="cost parameters x extractors x programs, in parallel (local processes "
                                       "or Ray); one table, CSV/JSON and plot")
    sw.add_argument("--programs", default="", help="comma-separated built-in names or module:function "
                    "(as for experiment; default: every built-in one)")
    sw.add_argument("--extractors", default="greedy,improve", help="comma-separated (default greedy,improve)")
    sw.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="a DeviceParams field and its values (repeat for more: the grid is their product), "
                         "e.g. --param launch=1e-6,5e-6 --param bandwidth=10e9,40e9")
    sw.add_argument("--device", default="LLVM")
    sw.add_argument("--reps", type=int, default=5, help="timed runs per plan (the median is reported)")
    sw.add_argument("--jobs", type=int, default=None, help="local processes (default: the CPU count; 1: in this "
                    "process, the only setting whose measured times are not perturbed by other jobs)")
    sw.add_argument("--ray", default="", metavar="ADDRESS", help="run the jobs as Ray tasks on this cluster "
                    "(auto, HOST:PORT, ray://HOST:10001, or local for a new local instance)")
    sw.add_argument("--no-measure", action="store_true", help="predicted times only (no plan is run)")
    _outputs(sw)
    sw.set_defaults(fn=_tune_sweep)
    fz = sub.add_parser("fuzz", help="random programs through the whole pipeline, compared with NumPy")
    fz.add_argument("--examples", type=int, default=500)
    fz.add_argument("--steps", type=int, default=8, help="most ops per program")
    fz.add_argument("--device", default="LLVM,NUMPY", help="comma-separated devices")
    fz.add_argument("--seed", type=int, default=None, help="seed of the program generator (reproducible run)")
    fz.add_argument("--no-validate", action="store_true",
                    help="skip plan validation against the op table (on by default, as in the tests)")
    fz.add_argument("--index", action="store_true",
                    help="fuzz index arithmetic instead: random movement chains lowered to loop IR and run by "
                         "the loop-IR interpreter and each device (eqgrad/tools/fuzz_index.py)")
    fz.add_argument("--count", type=int, default=2000, help="with --index: how many chains")
    fz.add_argument("--engine", action="store_true", help="with --index: also realize each chain through the engine")
    fz.set_defaults(fn=_fuzz)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
