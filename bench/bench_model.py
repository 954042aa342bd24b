#!/usr/bin/env python3
"""Cost-model check: how close the extractor's predicted kernel times are to the measured ones.

Runs bench_core's training rows (CNN, CNN with pooling, FFN, layernorm backward), its attention
and Linear rows, and bench_compile's BERT-shaped encoder forward on eqgrad's LLVM device, records
every kernel of the last --reps runs one by one (``GlobalCounters.kernel_log``: each kernel timed
alone, as DEBUG=2 does, printing nothing), and reports per workload and overall the share of
kernels whose prediction is within 2x of the median measured time (the target: >= 90 %),
the predicted and measured sums, and the worst kernels.

After the first workload and at the end it times how much faster two threads do plain work than one
(``two_core_speedup``): 1.7-1.8 on the two healthy cores of a 2-vCPU VM; a run that prints well under that was taken
while the shared machine ran a core slowly, and its times say little about the cost model.

The parameters are the cost model's in effect: the defaults, or the calibration of this machine
(``python -m eqgrad tune calibrate``; --calibrate runs it first, into the cache directory in use).

  python bench/bench_model.py                    # defaults or the stored calibration
  python bench/bench_model.py --calibrate        # calibrate this machine first
  python bench/bench_model.py --only cnn_step --worst 10
  python bench/bench_model.py --fit              # and the best share any parameters give this model's form

--fit separates what parameters can fix from what they cannot: it searches launch, bandwidth,
peak and contraction rate (log grids, then a finer pass around the best) for the share of kernels
within 2x that the cost model's form ``launch + max(bytes / bandwidth, compute)`` (plus the launch
after a stream, the cost model's own ``cold``, not searched) reaches on the kernels just measured,
once with the kinds the cost model assigned and once with the kinds the lowering builds
(lower/classify.py). A ceiling well under the target means the form, not the
calibration, is what misses.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
from dataclasses import asdict
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
if os.path.isfile(os.path.join(REPO_ROOT, "eqgrad", "__init__.py")) or importlib.util.find_spec("eqgrad") is None:
  sys.path.insert(1, REPO_ROOT)          # this checkout's eqgrad where it runs from one (bench_core.py)


def _load(name: str) -> Any:
  spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod             # its dataclasses look their module up
  spec.loader.exec_module(mod)
  return mod


CORE_ROWS = ("cnn_step", "cnn_pool_step", "ffn_step", "layernorm_backward", "attention_t128", "linear480_t",
             "matmul512")


def workloads(quick: bool) -> dict[str, Callable[[], Any]]:
  """name -> a function that runs one step (realized) on eqgrad's LLVM device."""
  core, comp = _load("bench_core"), _load("bench_compile")
  fw = core.EqgradFW("LLVM")
  fw.setup()
  out: dict[str, Callable[[], Any]] = {}
  for w in core.WORKLOADS:
    if w.name in CORE_ROWS:
      inputs = [fw.to_input(a) for a in core.make_inputs(w, quick)]
      out[w.name] = (lambda w=w, inputs=inputs: fw.force(w.fn(fw, *inputs)))
  from eqgrad import Tensor
  import eqgrad.nn.functional as F
  s = comp.QUICK if quick else comp.FULL
  layers = [{k: Tensor(v) for k, v in p.items()} for p in comp.bert_weights(s)]
  x = Tensor(np.random.default_rng(1).standard_normal((s.bert_batch, s.bert_tokens, s.bert_hidden), dtype=np.float32))
  norm = lambda t, g, b: F.layer_norm(t, (s.bert_hidden,), g, b)
  out["bert_encoder"] = lambda: comp.bert_forward(s, x, layers, F.linear, norm).realize()
  return out


def _features(k: Any) -> dict[str, int]:
  """Facts of a kernel's body a cost model might read, for studying the misses (--json): its output
  elements, the elements its reductions read, its rows (output elements over the last axis) and the
  buffers it writes and reads (a term per buffer fitted nothing: docs/extraction.md)."""
  out = int(np.prod(k.ast.shape)) if k.ast.shape else 1
  red = sum(int(np.prod(n.src[0].shape)) for n in k.ast.walk() if n.op in ("RSUM", "RMAX"))
  last = k.ast.shape[-1] if k.ast.shape else 1
  return dict(out_elems=out, reduce_elems=red, rows=out // max(1, last), buffers=len(k.params))


def _buffer_bytes(k: Any) -> dict[int, int]:
  """The bytes of each buffer kernel ``k`` writes or reads, from its body (a read's BUF leaf, an
  output's root; a GROUP's roots in ``outs`` order)."""
  out: dict[int, int] = {}
  for n in k.ast.walk():
    if n.op == "BUF":
      out[n.arg] = int(np.prod(n.shape)) * n.dtype.itemsize
  roots = k.ast.src if k.ast.op == "GROUP" else (k.ast,)
  for b, r in zip(k.outs, roots):
    out[b] = int(np.prod(r.shape)) * r.dtype.itemsize
  return out


def reads_in_order(log: list[tuple]) -> dict[str, list[list]]:
  """For each kernel of one run (by plan kernel name, over the pieces the device ran it as), each
  buffer it reads: [its bytes, the bytes the kernels between the last one that touched it and this
  one wrote and read (None: nothing touched it earlier in the step)] -- the reuse distance that says
  whether a read comes from cache, for studying the misses (--json ``reads``; docs/extraction.md)."""
  from eqgrad.graph.plan import plan_kernel_name as base
  last: dict[int, int] = {}          # buffer -> bytes moved by the run when its last toucher ended
  moved, out = 0, {}
  for n, _, _, _, _, k in log:
    sizes = _buffer_bytes(k)
    out.setdefault(base(n), []).extend([sizes.get(b, 0), None if b not in last else moved - last[b]]
                                       for b in k.inputs)
    moved += sum(sizes.values())
    for b in k.params:
      last[b] = moved
  return out


def check(name: str, step: Callable[[], Any], reps: int, warmup: int, prm: Any) -> dict[str, Any]:
  from eqgrad import GlobalCounters
  from eqgrad.graph.plan import stream_share
  from eqgrad.lower.classify import classify
  for _ in range(1 + warmup):
    step()
  runs: list[list[tuple]] = []
  for _ in range(reps):
    GlobalCounters.kernel_log = log = []
    try:
      step()
    finally:
      GlobalCounters.kernel_log = None
    runs.append(log)
  # the pieces the device runs one plan kernel as (the BLAS's "k4g", its packs "k4p0", a split
  # reduction's partials "k4a" and the rest "k4") are summed into it, whose prediction the pieces
  # carry (a split reduction's final kernel its own few microseconds: the largest is the kernel's);
  # siblings the device runs as one kernel ("k3+k4", devices/cpustage.py) are one row, k3's
  from eqgrad.graph.plan import plan_kernel_name as base
  names = list(dict.fromkeys(base(e[0]) for e in runs[-1]))
  per: dict[str, list[float]] = {n: [] for n in names}
  info: dict[str, tuple] = {}
  kernels: dict[str, Any] = {}          # base name -> the plan kernel (its model kind and body)
  pieces: dict[str, dict[str, Any]] = {}  # base name -> the pieces the device ran it as, by name
  for r in runs:
    sums: dict[str, float] = {}
    for n, sec, pred, flops, nbytes, k in r:
      if n == base(n) or "+" in n:       # (a GROUP of siblings "k3+k4" runs as one kernel: k3's row)
        kernels[base(n)] = k
      pieces.setdefault(base(n), {})[n] = k
      b = base(n)
      sums[b] = sums.get(b, 0.0) + sec
      old = info.get(b, (0.0, 0, 0))
      info[b] = (max(pred, old[0]), old[1] + flops, old[2] + nbytes)
    for b, sec in sums.items():
      if b in per:
        per[b].append(sec)
  info = {b: (pred, flops / len(runs), nbytes / len(runs)) for b, (pred, flops, nbytes) in info.items()}
  # the predictions logged are each kernel's where it ran (KernelPlan.in_context: a kernel right after
  # one that moved more than about stream_bytes takes that one's launch-after-a-stream term, cost.py;
  # its reads from cache, Kernel.warm, are taken off); the share of that term each kernel took, for --fit
  reads = reads_in_order(runs[-1])
  priced = [kernels[n].stats.nbytes if n in kernels and kernels[n].stats is not None else 0 for n in names]
  after = [0.0] + [stream_share(b, prm.stream_bytes) for b in priced[:-1]]
  rows = []
  for i, n in enumerate(names):
    m = statistics.median(per[n])
    pred, flops, nbytes = info[n]
    k = kernels.get(n)
    model = list(k.kind) if k is not None else []
    # what the lowering built, over the pieces the device ran the plan kernel as (its GEMM, the
    # ops after it, a split reduction's partials; each piece keeps the plan kernel's kind)
    lowering = sorted(set().union(*(classify(p, blas=True).kinds for p in pieces.get(n, {}).values())))
    feats = _features(k) if k is not None else {}
    stats = asdict(k.stats) if k is not None and k.stats is not None else None
    fill = stats["fill"] if stats else 1.0
    rows.append(dict(kernel=n, measured_s=m, predicted_s=pred, ratio=pred / m if m > 0 else float("inf"), **feats,
                     gflops=flops / m / 1e9 if m > 0 else 0.0, gbs=nbytes / m / 1e9 if m > 0 else 0.0,
                     model_kind=model, lowering_kind=lowering, fill=fill, stats=stats, after=after[i],
                     warm=k.warm if k is not None else 0.0,
                     reads=reads.get(n, []),
                     body=k.ast.render()[:160] if k is not None else ""))
  within = sum(1 for r in rows if 0.5 <= r["ratio"] <= 2.0)
  return dict(workload=name, kernels=len(rows), within_2x=within, measured_s=sum(r["measured_s"] for r in rows),
              predicted_s=sum(r["predicted_s"] for r in rows), rows=rows)


QUIET_S = 0.5      # idle seconds before two_core_speedup: a BLAS's or OpenMP's spinning workers have slept by then


def two_core_speedup(n: int = 1 << 15, calls: int = 200, reps: int = 7) -> float:
  """How much faster two threads do two shares of plain work than one thread does them in turn
  (each share ``calls`` of NumPy's exp over ``n`` floats, which releases the GIL: in a core's own
  cache, not the memory both share; no BLAS, whose threads spin): ~2 on two healthy cores, ~1
  where the machine runs one of them slowly. The medians of ``reps``, after ``QUIET_S`` seconds
  idle: the workers of a BLAS spin for ~0.1 s after a product (devices/blas.py), and timed at once
  after the BERT encoder's products this check read 1.28 where a run's kernels were all at speed."""
  time.sleep(QUIET_S)
  a = [np.random.default_rng(i).random(n, dtype=np.float32) for i in range(2)]
  out = [np.empty_like(x) for x in a]

  def work(i: int) -> None:
    for _ in range(calls):
      np.exp(a[i], out=out[i])
  one, two = [], []
  for r in range(reps + 1):            # (the first round wakes the other core: not counted)
    t = time.perf_counter()
    work(0), work(1)
    t1 = time.perf_counter() - t
    th = threading.Thread(target=work, args=(1,))
    t = time.perf_counter()
    th.start()
    work(0)
    th.join()
    if r:
      one.append(t1)
      two.append(time.perf_counter() - t)
  return statistics.median(one) / statistics.median(two)


# --fit's search: a wide log grid over the rates seen on two-core x86 hosts, then a fine one around
# its best point (eqgrad/tools/calibrate.py ``fit``, which `tune calibrate` uses within FIT_SPAN)
FIT_CENTER = dict(launch=6.3e-6, bandwidth=17.9e9, peak=31.6e9, contraction=77.5e9)
FIT_WIDE = dict(launch=(1 / 6.3, 6.3, 12), bandwidth=(1 / 4.5, 4.5, 14), peak=(1 / 6.3, 6.3, 12),
                contraction=(1 / 7.7, 7.7, 14))
FIT_FINE = {f: (0.7, 1.4, 7) for f in FIT_WIDE}


def strided_cost(stats: dict[str, float], prm: Any) -> float:
  """The seconds the strided-reads term (extract/cost.py) adds to a kernel priced from ``stats``
  (a row's ``stats``) with parameters ``prm``: its prediction less the same kernel's with its
  strided bytes at the bandwidth."""
  from dataclasses import replace
  from eqgrad.extract.cost import KernelStats, default_cost
  s = KernelStats(**stats)
  return default_cost(s, prm) - default_cost(replace(s, strided=0.0), prm) if s.strided else 0.0


def fit(rows: list[dict[str, Any]], prm: Any, kinds: str = "model_kind") -> tuple[float, dict[str, float]]:
  """The largest share of ``rows`` within 2x that any (launch, bandwidth, peak, contraction) gives
  the cost model's form, evaluated on the stats each kernel was priced from; with ``kinds``
  "lowering_kind", a kernel the lowering builds as a contraction and the cost model did not has all
  its FLOPs at the contraction rate, and the other way round none; the launch after a stream and
  the row passes, the reads from cache and the strided reads are ``prm``'s. And those parameters."""
  from eqgrad.extract.cost import DeviceParams, KernelStats
  from eqgrad.tools.calibrate import KernelSample, fit as fit_params
  samples = []
  for r in rows:
    if not r.get("stats"):
      continue
    s = KernelStats(**r["stats"])
    model, built = "contraction" in r["model_kind"], "contraction" in r[kinds]
    if built and not model:
      s = KernelStats(s.nbytes, s.flops, s.nodes, s.flops, passes=s.passes, hot=s.hot, strided=s.strided)
    elif model and not built:
      s = KernelStats(s.nbytes, s.flops, s.nodes, passes=s.passes, hot=s.hot, strided=s.strided)
    samples.append(KernelSample(r["measured_s"], s, r.get("after", False)))
  if not samples:
    return 0.0, {}
  start = DeviceParams(**FIT_CENTER, cold=prm.cold, stream_bytes=prm.stream_bytes, row_pass=prm.row_pass,
                       cache_bandwidth=prm.cache_bandwidth, cache_bytes=prm.cache_bytes,
                       strided_bandwidth=prm.strided_bandwidth)
  p, share, _ = fit_params(samples, start, FIT_WIDE)
  p, share, _ = fit_params(samples, p, FIT_FINE)
  return share, {f: getattr(p, f) for f in FIT_CENTER}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--reps", type=int, default=5, help="recorded runs per workload (default 5: medians per kernel)")
  p.add_argument("--warmup", type=int, default=2, help="unrecorded runs after the first (default 2)")
  p.add_argument("--quick", action="store_true", help="bench_core's --quick sizes and a one-layer encoder")
  p.add_argument("--only", default=None, help="comma-separated workloads: " + ",".join(CORE_ROWS + ("bert_encoder",)))
  p.add_argument("--calibrate", action="store_true", help="calibrate the LLVM device first (stored in the cache)")
  p.add_argument("--worst", type=int, default=3, help="worst-predicted kernels to print per workload (default 3)")
  p.add_argument("--fit", action="store_true", help="also print the best share any parameters give the model's form")
  p.add_argument("--json", default=None, metavar="PATH", help="write every kernel's row as JSON")
  args = p.parse_args(argv)
  if args.reps < 1:
    p.error("--reps must be >= 1")
  from eqgrad.extract.cost import params_for, save_calibration
  from eqgrad.graph.plan import cold_words
  if args.calibrate:
    from eqgrad.tools.calibrate import calibrate
    save_calibration("LLVM", calibrate("LLVM", progress=lambda m: print(f"  calibrate: {m}", flush=True), runs=3,
                                       fit_corpus=True))
  prm = params_for("LLVM")
  core = _load("bench_core")
  print(f"CPU: {core.cpu_model()}; cost model {prm.source}: launch {prm.launch * 1e6:.1f} us, "
        f"{prm.bandwidth / 1e9:.1f} GB/s, peak {prm.peak / 1e9:.1f} GFLOP/s, "
        f"contraction {(prm.contraction or prm.peak) / 1e9:.1f} GFLOP/s, {cold_words(prm.cold, prm.stream_bytes)}, "
        f"{prm.row_pass * 1e9:.2f} ns a row pass"
        + (f", reads within {prm.cache_bytes / 2 ** 20:g} MiB of reuse from cache at {prm.cache_bandwidth / 1e9:.1f} GB/s"
           if prm.cache_bandwidth and prm.cache_bytes else "")
        + (f", strided reads at {prm.strided_bandwidth / 1e9:.1f} GB/s" if prm.strided_bandwidth else ""))
  todo = workloads(args.quick)
  if args.only:
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in todo]
    if unknown:
      p.error(f"unknown workload(s) {unknown}; choose from {sorted(todo)}")
    todo = {k: v for k, v in todo.items() if k in wanted}
  # the machine's state, after the first workload and at the end: on a shared VM one vCPU can run
  # slowly for minutes, and every two-thread kernel (the BLAS's products first) with it -- a BERT
  # encoder measured 99-102 ms against 60-64 in other runs of the same plan, 66 % within 2x against
  # 85 % (docs/extraction.md). (Not before it: the saturation worker that ``import eqgrad`` starts
  # is still loading its rules on the other core then -- 1.06x measured where it was 1.6-1.8 after.)
  speedup: list[float] = []
  results = []
  print(f"\n{'workload':<20} {'kernels':>7} {'within 2x':>10} {'predicted':>10} {'measured':>10}")
  for name, step in todo.items():
    r = check(name, step, args.reps, args.warmup, prm)
    results.append(r)
    if not speedup:
      speedup.append(two_core_speedup())
    print(f"{name:<20} {r['kernels']:>7} {r['within_2x']:>6} ({100 * r['within_2x'] / max(1, r['kernels']):.0f}%)"
          f" {r['predicted_s'] * 1e3:>8.2f}ms {r['measured_s'] * 1e3:>8.2f}ms")
    worst = sorted(r["rows"], key=lambda x: -abs(np.log(max(x["ratio"], 1e-9))))[:args.worst]
    for w in worst:
      kinds = "" if w["model_kind"] == w["lowering_kind"] else \
          f"  [model: {','.join(w['model_kind']) or 'plain'}; lowering: {','.join(w['lowering_kind']) or 'plain'}]"
      print(f"    {w['kernel']:<6} predicted {w['predicted_s'] * 1e6:9.1f} us  measured {w['measured_s'] * 1e6:9.1f} us"
            f"  ({w['ratio']:.2f}x; {w['gflops']:.1f} GFLOP/s, {w['gbs']:.1f} GB/s){kinds}")
  speedup.append(two_core_speedup())
  total = sum(r["kernels"] for r in results)
  within = sum(r["within_2x"] for r in results)
  share = 100 * within / max(1, total)
  print(f"\nall: {within}/{total} kernels within 2x ({share:.1f}%; target >= 90%: {'met' if share >= 90 else 'missed'})")
  print(f"two threads did {speedup[0]:.2f}x one thread's work after the first workload, {speedup[1]:.2f}x at the end"
        + (" (under 1.5: a core ran slowly during this run; its times are not this machine's)"
           if min(speedup) < 1.5 else ""))
  # the reads-from-cache term's share of that (cost.py; Kernel.warm, each kernel's saving as its plan runs)
  rows = [w for r in results for w in r["rows"]]
  warm = [w for w in rows if w["warm"] > 0]
  cold = sum(1 for w in rows if w["measured_s"] > 0 and 0.5 <= (w["predicted_s"] + w["warm"]) / w["measured_s"] <= 2.0)
  print(f"reads from cache: {len(warm)} kernels predicted {sum(w['warm'] for w in warm) * 1e3:.2f} ms faster for them; "
        f"without that term {cold}/{total} within 2x ({100 * cold / max(1, total):.0f}%)")
  # and the strided-reads term's (cost.py; KernelStats.strided, priced at strided_bandwidth in extraction)
  slow = [(w, strided_cost(w["stats"], prm)) for w in rows if w["stats"] and w["stats"].get("strided")]
  flat = sum(1 for w in rows if w["measured_s"] > 0 and 0.5 <= (
      w["predicted_s"] - (strided_cost(w["stats"], prm) if w["stats"] else 0.0)) / w["measured_s"] <= 2.0)
  print(f"strided reads: {len(slow)} kernels predicted {sum(c for _, c in slow) * 1e3:.2f} ms slower for them; "
        f"without that term {flat}/{total} within 2x ({100 * flat / max(1, total):.0f}%)")
  off = [w for r in results for w in r["rows"] if not 0.5 <= w["ratio"] <= 2.0]
  split = sum(1 for w in off if w["model_kind"] != w["lowering_kind"])
  print(f"of the {len(off)} outside 2x, {split} are kernels the cost model takes for another kind than the lowering "
        "builds (lower/classify.py; [model; lowering] above)")
  if args.fit:
    rows = [w for r in results for w in r["rows"]]
    for kinds, said in (("model_kind", "the cost model's kinds"), ("lowering_kind", "the lowering's kinds")):
      share, prm_fit = fit(rows, prm, kinds)
      print(f"best fit with {said}: {100 * share:.0f}% within 2x at launch {prm_fit['launch'] * 1e6:.1f} us, "
            f"{prm_fit['bandwidth'] / 1e9:.1f} GB/s, peak {prm_fit['peak'] / 1e9:.1f}, "
            f"contraction {prm_fit['contraction'] / 1e9:.1f} GFLOP/s")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"params": prm.__dict__, "two_core_speedup": speedup, "results": results}, f, indent=1)
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
