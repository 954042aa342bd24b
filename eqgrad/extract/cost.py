"""The kernel cost model: one small function, with its units and assumptions.

    time(kernel) = launch + max((bytes - hot - strided) / bandwidth + hot / cache_bandwidth
                                + strided / strided_bandwidth,
                                flops / peak + cflops / contraction + passes * row_pass)    [seconds]
    time(plan)   = sum over kernels, + cold * stream_share(bytes) for each kernel (the launch after it)

- bytes: the kernel's output written once, plus each distinct input buffer read once (or only the
  elements actually read, for a slice), at the dtype's item size. Constants cost nothing.
- flops: each body node's weight (``OpDef.flops``; EXP2/LOG2/SIN ~20, SQRT/RECIP 4, IDIV/MOD 8,
  others 1, movement 0) times the number of times it is *evaluated*. Evaluations propagate from
  the kernel's output: a node is evaluated once per output element of its consumer, and a
  reduction's source once per reduced element. Work shared inside one kernel counts once; a
  producer inlined into two kernels counts in both; a producer inlined under a broadcast
  (``Expand``) is evaluated once per broadcast element.
- masked reads: a ``Pad`` evaluated more often than its kernel has output elements (inside a
  reduction loop, e.g. a padded convolution's input) costs ``masked_read`` flops per evaluation:
  on the CPU the per-lane masks stopped the register lanes from using plain vector loads (measured:
  a 3x3 convolution with padding fused ran ~8x slower than on a materialized padded input; with
  the masked vector loads the LLVM renderer now makes, 1.05-1.4x at 32 channels and 0.9x at 16:
  docs/extraction.md), so materializing the padded tensor first is usually cheaper. GPUs predicate
  masks almost for free.
- kernel classes: ``cflops`` are the flops of a contraction at the kernel's root (a sum of a
  product of broadcast operands: a matmul, a convolution; its epilogue excluded), which the
  lowering gives register lanes or hands to the BLAS; ``contraction`` is their rate, ``peak`` the
  rate of everything else (streaming elementwise work). ``contraction`` 0 means ``peak``;
  calibration measures both (matmul 512 as a generated kernel, the BLAS off; independent FMA chains). The LLVM default is
  250 GFLOP/s, the middle of what generated contractions run at: on a 2-vCPU Xeon (AVX-512, Rocket
  Lake, two threads, the BLAS off, medians of 7) matmul 512 220, 1024 142, (480, 384) @ (384,
  1536) 118-125 (its B streamed again for each block of rows), convolutions (32, 32|16, 32, 32) by
  3 x 3 340-367, attention's batched products 265-319, (64, 256, 64) @ (64, 64, 256) 299 GFLOP/s
  (the median of these nine 265). It was 150, what they ran at before the register block's second
  axis was chosen for reuse (lower/passes.py ``block_axis``: a CNN step's 302-MFLOP convolutions
  160-195 GFLOP/s on a Zen 5, now 308-417 on the Xeon) and before the row blocks; bench_model with
  the defaults then put those convolutions 2.1-2.8x too slow and 87-94 % of its kernels within 2x
  (91-92 % at 250), with no plan of bench_core changed by the new rate (kernels and bytes of every
  row the same). With contraction = peak the default parameters had predicted 60 % within 2x.
  That rate is a register-blocked contraction's: one the lowering gives no lanes at all runs at
  ``contraction * fill`` (``KernelStats.fill``: one lane axis's share of the block, 1/8 on the CPU;
  graph/caps.py ``Capabilities.block_fill``, docs/extraction.md). A large GEMM the device hands its
  library (the BLAS) is priced at the library's rate, timed by the device on this machine, where
  that is faster: its fill is then that rate over ``contraction``, above 1 (``CostModel.library_gemm``).
- unlaned contractions: a sum of a product of broadcast operands (a matmul or convolution) that
  is hoisted into a row-fused kernel (its result broadcast along the kernel's trailing output
  axes, e.g. a convolution's input gradient fused into max-pool's backward) is rendered in its
  own loop nest without register lanes (the lanes pass needs it at the kernel's root); its flops
  cost ``unlaned`` times more. Measured (LLVM, Zen 5): 3.7 GFLOP/s fused against the 50 assumed
  (~95 GFLOP/s when it was its own kernel), a 21 ms kernel predicted at 1.6 ms.
- legality (the extractor is its authority, not a rewrite guard: docs/extraction.md): a reduction
  evaluated more often than it has output elements (i.e. recomputed under a broadcast) is illegal,
  as is a body larger than ``max_nodes``. A ``Contiguous`` is never inlined: a kernel that reaches
  its class reads its buffer (it is a kernel of its own, as a chosen ``Realize`` is).

- row passes: a row-fused kernel loops over each row once per reduction of the row (a softmax's
  max and sum, a layer norm's mean and variance) and once more for its output, and each such loop
  costs ``row_pass`` seconds beyond its elements' work (its setup and exit, the horizontal reduction
  of a vector accumulator, a short row's remainder). ``KernelStats.passes`` counts them; plain
  reductions and elementwise kernels have none (their loops over rows are vectorized across rows
  or unrolled). Measured (LLVM, 2-vCPU Intel Xeon, Rocket Lake; kernel time of 86,400 elements in
  rows of R, in cache): softmax R = 256 35 us, 64 43, 32 53, 16 87, 15 86, 8 132; a layer norm R =
  256 18 us, 16 33, 15 50, 12 51 -- 1.5-3.4 ns a pass over the long rows' time, where a plain sum
  over the same rows took 7-13 us at every R. With no such term, BERT's softmax over rows of 15 was
  predicted at 59 us and ran 125-143 in the encoder; bench_model with the default parameters 140
  of 158 kernels within 2x before, 154-158 of 168 after (the encoder's plan changed with it). The
  LLVM default is 2 ns (the middle of the range); ``tune calibrate`` measures it (softmax over rows
  of 16 against rows of 512). A pass over a row shorter than ``ROW_PASS_FULL`` (16) elements counts
  as that share of one
  (``row_share``): such a loop is unrolled or fills part of a vector, and LLVM vectorized softmax
  over rows of 4 across its rows (57 us above; 0.4 ns a pass).

- launch after a stream: what a launch costs depends on what ran before it. A kernel whose bytes
  exceed a core's private cache (``stream_bytes``: the host's L2, graph/caps.py
  ``private_cache_bytes``) evicts the interpreter's and the launch path's working set, and the next
  launch takes ``cold`` longer -- a share of it from half the L2, all of it from one and a half
  (graph/plan.py ``stream_share``: a one-element kernel after copies of 0.75, 1, 1.5, 2 and 3 MiB
  took 2.8, 4.6, 9.7, 12.5 and 18.7 us on a 2 MiB L2, 2.3 in a tight loop). Measured: a one-element kernel 2.1-2.8 us in a tight loop, 10.8-16.4
  us right after a stream of 8 to 34 MB (2-vCPU Intel Xeon, Rocket Lake and Emerald Rapids); after a
  64 MB copy an empty Python call took 3.75 us (0.07 warm), a ctypes call 18 us (0.34). In
  bench/bench_model.py the training steps' small kernels took 9-22 us right after a kernel of more
  than 2 MB and 2-8 us elsewhere, where one launch constant had to miss one group or the other
  (default parameters 154/183 within 2x on a 2-vCPU Xeon; 162/183 with this term). Extraction does
  not know the order kernels run in, so the term is charged to the streaming kernel (``after_stream``:
  a plan's total is the same either way); per kernel as run (DEBUG=2, ``GlobalCounters.kernel_log``),
  graph/plan.py ``KernelPlan.in_context`` moves it to the kernel after it. The LLVM default
  ``cold`` is 6 us: the 10.8-16.4 us measured after a stream are 6-11 us over the default launch of
  5 us, the low end taken; ``tune calibrate`` measures it on the machine.

- reads from cache: a kernel reading a buffer that a kernel just before it in its plan wrote or read
  finds it in the cache, where the bytes moved since (its reuse distance, the buffer itself counted)
  fit ``cache_bytes`` (by default the private caches of the cores the threads run on, and the L3 where
  it is a core complex's: graph/caps.py ``reuse_cache_bytes``, which says why a mesh L3 is left out;
  ``tune calibrate`` fits it); those bytes
  (``KernelStats.hot``, graph/plan.py ``KernelPlan.cache_reads``) move at ``cache_bandwidth``. Like the
  launch after a stream it depends on the order kernels run in, which extraction does not know: its
  kernels are priced cold (``hot`` 0), and ``in_order`` prices a built plan's kernels in their order
  -- ``stats.hot`` and the seconds it saves, ``Kernel.warm``, which ``KernelPlan.in_context`` (DEBUG=2,
  kernel_log) takes off; extraction's predictions and what a device decides from them are unchanged.
  Measured (LLVM, 2-vCPU AMD EPYC, Zen 4, 32 MiB of L3): a copy whose input the run before left in the
  cache, 1, 2, 4 and 8 MiB moved, ran at 43, 61, 90 and 51 GB/s against 47-52 from memory, and
  bench_model's kernels that read what the kernel before them wrote ran at 60-80 GB/s, where
  ``bandwidth`` (fitted to kernels as models run them, mostly cold) is 20; priced offline on a
  bench_model run, the term took 81 % of its kernels within 2x to 84-88 % for windows of 4-32 MiB at
  30-60 GB/s, 89 % at 100 (docs/extraction.md). The LLVM default is 60 GB/s (the middle of those
  copies); ``tune calibrate`` measures it on the machine (tools/calibrate.py ``CACHE_SHARES``).

- strided reads: a kernel that reads a buffer ``CACHE_LINE`` (64) bytes or more apart from one
  element of its innermost output loop to the next (a permute of NCHW to NHWC: graph/caps.py
  ``strided_loads``, which the lowering answers; outside reductions, in kernels without a root
  contraction, whose operands the lanes and the pack read) touches a line for each element, and
  those bytes (``KernelStats.strided``) move at ``strided_bandwidth``, from memory or cache alike.
  Unlike the reads from cache it is a property of the kernel, so extraction prices it (a plan
  that materializes a permuted copy pays for it there). Measured (LLVM, 2-vCPU AMD EPYC, Zen 4):
  bench_model's NCHW -> NHWC copies and relu gradients read at 8.5-21.5 GB/s (their writes at
  ``bandwidth``), where it had priced them at 20 GB/s and put one 0.40x off; NCHW tensors of 8 MiB
  permuted at 1-16 KiB strides, as copies (in cache blocks) and under a select, 1.5-70 GB/s. The
  LLVM default is 15 GB/s (the median of those 14 rates, 14.5); ``tune calibrate`` measures it on
  the machine (tools/calibrate.py ``STRIDED_SHAPES``); other devices price none (0: at
  ``bandwidth``).

Worked example (LLVM defaults below: 5 us launch, 20 GB/s, 50 GFLOP/s). ``(a+b+1)*2`` on 1M
float32: unfused, 3 kernels each reading/writing ~8 MB: 3 * (5 us + 8e6/20e9 s) = 3 * 405 us =
1.2 ms; fused, one kernel reading 8 MB and writing 4 MB: 5 us + 12e6/20e9 s = 605 us -> fused wins.

Parameters are per device. ``python -m eqgrad tune calibrate`` measures them on this machine
(launch overhead with a one-element kernel run after streaming kernels, bandwidth with a large copy-like kernel, peak with a
matmul and independent FMA chains), then fits them to the kernels of a small corpus of model-like programs as
they run (eqgrad/tools/calibrate.py ``fit``: a large copy streams far faster than a model's
kernels), and stores them in ``~/.cache/eqgrad/calibration.json`` (or
``$EQGRAD_CACHE_DIR``), keyed by device and machine; :func:`params_for` prefers them to the
defaults. Users can replace the whole function: ``eqgrad.extract.using(cost_fn=my_fn)`` where
``my_fn(stats: KernelStats, params: DeviceParams) -> seconds``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

from eqgrad.cache import JsonCache, check_fields, machine_key
from eqgrad.graph.caps import Capabilities, block_of, gemm_of, library_seconds, private_cache_bytes, reuse_cache_bytes
from eqgrad.graph.plan import KernelPlan, KernelStats, stream_share   # the cost function's input (on the graph floor: plans keep it)

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class DeviceParams:
    launch: float = 5e-6          # seconds per kernel launch
    bandwidth: float = 20e9       # bytes per second (one core streaming)
    peak: float = 50e9            # flops per second
    max_nodes: int = 160          # largest kernel body (nodes) the extractor will form (docs/lowering.md, Constants)
    masked_read: float = 8.0      # flops charged per Pad evaluation inside a reduction loop (see above)
    unlaned: float = 12.0         # flops multiplier of a contraction hoisted into a row-fused kernel (above)
    contraction: float = 0.0      # flops per second of a root contraction (above); 0: peak
    row_fusion: bool = True       # reductions broadcast along trailing axes may share a kernel (below)
    # a launch right after a kernel that moved more than ``stream_bytes`` costs ``cold`` seconds more
    # ("launch after a stream" above); 0 for either: no such term
    cold: float = 0.0
    stream_bytes: int = 0
    row_pass: float = 0.0         # seconds a row-fused kernel's loop over one row costs ("row passes" above)
    # reads the kernels just before it in its plan left in the cache (``KernelStats.hot``: within
    # ``cache_bytes`` of reuse) run at ``cache_bandwidth`` ("reads from cache" above); 0 for either: none do
    cache_bandwidth: float = 0.0
    cache_bytes: int = 0
    # reads a cache line apart along the innermost output loop (``KernelStats.strided``) run at
    # ``strided_bandwidth`` ("strided reads" above); 0: at ``bandwidth``
    strided_bandwidth: float = 0.0
    source: str = "given"         # "default", "calibrated <date>", "given" (built by the user), or with overrides

    def __post_init__(self) -> None:
        # a zero bandwidth or peak would divide by zero deep inside extraction: refuse it here
        for f in ("launch", "bandwidth", "peak", "masked_read", "unlaned", "contraction", "cold", "row_pass",
                  "cache_bandwidth", "strided_bandwidth"):
            x = getattr(self, f)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 \
                    or (x == 0 and f in ("bandwidth", "peak")):
                raise ValueError(f"DeviceParams.{f}: expected a finite number {'> 0' if f in ('bandwidth', 'peak') else '>= 0'}, "
                                 f"got {x!r}")
        if isinstance(self.max_nodes, bool) or not isinstance(self.max_nodes, int) or self.max_nodes < 1:
            raise ValueError(f"DeviceParams.max_nodes: expected an integer >= 1, got {self.max_nodes!r}")
        for f in ("stream_bytes", "cache_bytes"):
            x = getattr(self, f)
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise ValueError(f"DeviceParams.{f}: expected an integer >= 0, got {x!r}")


DEFAULT_PARAMS: dict[str, DeviceParams] = {
    # contraction: 250 GFLOP/s, what generated contractions run at (see "kernel classes" above)
    # cold: 6 us more after a stream larger than a core's L2 (see "launch after a stream" above);
    # row_pass: 2 ns a loop over a row of a row-fused kernel ("row passes" above);
    # cache_bandwidth: 60 GB/s the reads within the cores' L2s (and an AMD core complex's L3) of reuse ("reads from cache");
    # strided_bandwidth: 15 GB/s the reads a cache line apart along the innermost loop ("strided reads")
    "LLVM": DeviceParams(contraction=250e9, cold=6e-6, stream_bytes=private_cache_bytes(), row_pass=2e-9,
                         cache_bandwidth=60e9, cache_bytes=reuse_cache_bytes(), strided_bandwidth=15e9, source="default"),
    "NUMPY": DeviceParams(launch=20e-6, bandwidth=5e9, peak=2e9, source="default"),
    # PoCL 3.1, 2 cores (calibrated). No row fusion: PoCL vectorizes across work-items, not a
    # work-item's loops, so a row-fused softmax ran 19.8 ms vs 11.4 ms as three kernels
    "OPENCL": DeviceParams(launch=20e-6, bandwidth=25e9, peak=50e9, row_fusion=False, source="default"),
    "CUDA": DeviceParams(launch=5e-6, bandwidth=3e12, peak=5e13, masked_read=1.0, row_fusion=False, source="default"),
}


@dataclass
class KernelCost:
    seconds: float
    bytes: int
    flops: int
    nodes: int
    legal: bool
    why: str = ""
    fused: tuple[str, ...] = ()       # the ops of the kernel body, for explain()
    # what the cost model took the lowering to do with the kernel (graph/plan.py KERNEL_KINDS),
    # which lower/classify.py checks against what the lowering does
    kind: frozenset[str] = frozenset()
    stats: KernelStats | None = None  # what the cost function was given (Kernel.stats)
    recomputed: tuple[int, ...] = ()  # the reductions (e-classes) that make it illegal by being recomputed



def kernel_time(p: DeviceParams, nbytes: float, flops: float, cflops: float = 0.0, fill: float = 1.0,
                passes: float = 0.0, hot: float = 0.0, strided: float = 0.0) -> float:
    compute = (flops - cflops) / p.peak + (cflops / (p.contraction * fill) if p.contraction else cflops / p.peak) \
        + passes * p.row_pass
    return p.launch + max(moved_seconds(p, nbytes, hot, strided), compute)


def moved_seconds(p: DeviceParams, nbytes: float, hot: float = 0.0, strided: float = 0.0) -> float:
    """The seconds a kernel's ``nbytes`` take to move: ``strided`` of them read a cache line apart
    ("strided reads" above: at ``strided_bandwidth``, where the parameters have one), ``hot`` of the
    others read from cache ("reads from cache": at ``cache_bandwidth``), the rest at ``bandwidth``."""
    strided = min(strided, nbytes) if p.strided_bandwidth else 0.0
    hot = min(hot, nbytes - strided) if p.cache_bandwidth and p.cache_bytes else 0.0
    return (nbytes - hot - strided) / p.bandwidth + (hot / p.cache_bandwidth if hot > 0 else 0.0) \
        + (strided / p.strided_bandwidth if strided > 0 else 0.0)


# A pass over a row shorter than this many elements costs that share of ``row_pass``: x86-64's
# widest float32 vector (AVX-512). Such a row's loop is unrolled or fills part of one vector (softmax
# over rows of 4: 57 us for 86,400 elements against 35 over rows of 256, 0.4 ns a pass; rows of 8,
# 3 ns). (docs/lowering.md, Constants)
ROW_PASS_FULL = 16


def row_share(length: float) -> float:
    """The share of a full row pass (``row_pass``) that a pass over a row of ``length`` elements
    costs (cost.py, row passes)."""
    return min(1.0, length / ROW_PASS_FULL)


def after_stream(p: DeviceParams, nbytes: float) -> float:
    """What a kernel that moves ``nbytes`` costs the launch after it ("launch after a stream" above):
    ``cold`` times its ``stream_share`` (graph/plan.py: 0 under half of ``stream_bytes``, all of it
    from one and a half, linear between). The plan evaluator adds it to the streaming kernel's
    seconds (a plan's total is the same whichever kernel carries it, and extraction does not know
    the order the kernels will run in)."""
    return p.cold * stream_share(nbytes, p.stream_bytes) if p.cold else 0.0


def in_order(plan: KernelPlan, model: "CostModel") -> None:
    """Price each kernel of ``plan`` where it runs, in the plan's order: the bytes it reads from
    cache ("reads from cache" above; ``KernelPlan.cache_reads`` within ``cache_bytes``) go into its
    stats (``KernelStats.hot``, what the cost function is then given) and what that takes off its
    prediction into ``Kernel.warm``, which ``KernelPlan.in_context`` (DEBUG=2, kernel_log) subtracts.
    Extraction's predictions (``Kernel.predicted``, the plan's total, what a device's decisions read)
    stay as they were. Parameters without the term leave every kernel cold."""
    p = model.params
    on = p.cache_bandwidth > 0 and p.cache_bytes > 0
    for k, hot in zip(plan.kernels, plan.cache_reads(p.cache_bytes) if on else [0.0] * len(plan.kernels)):
        st = k.stats
        if st is None:
            continue
        if not hot:
            if st.hot:
                k.stats = replace(st, hot=0.0)
            k.warm = 0.0
            continue
        if st.hot != hot:
            k.stats = replace(st, hot=float(hot))
        if model.fn is default_cost:        # (a grow step reprices its resized plan: no more objects than needed)
            args = (p, st.nbytes, st.flops, st.cflops, st.fill, st.passes)
            k.warm = max(0.0, kernel_time(*args, 0.0, st.strided) - kernel_time(*args, float(hot), st.strided))
        else:
            k.warm = max(0.0, model.fn(replace(st, hot=0.0), p) - model.fn(k.stats, p))


def default_cost(s: KernelStats, p: DeviceParams) -> float:
    return kernel_time(p, s.nbytes, s.flops, s.cflops, s.fill, s.passes, s.hot, s.strided)


CostFn = Callable[[KernelStats, DeviceParams], float]


def rescaled(p: DeviceParams, predicted: float, old_bytes: float, old_flops: float,
             new_bytes: float, new_flops: float, old_passes: float = 0.0, new_passes: float = 0.0) -> float:
    """A kernel's predicted seconds at other sizes, from its prediction at the old ones: the
    prediction of a plan resized without extraction (graph/resize.py), whose kernels' bytes and
    flops were rescaled but not costed again. The old prediction's body (``predicted - launch``)
    is compute where it exceeds the bytes term, else at most the bytes term; the compute scales
    with the flops, the bytes term is recomputed. The device reads the prediction to decide whether
    a kernel is split across threads and whether the BLAS runs it, so a plan resized from 8 rows to
    8,192 must not keep the small plan's 10 us. The launch after a stream (``after_stream``) is
    taken off at the old bytes and charged again at the new; a row-fused kernel's passes (row
    passes above: ``old_passes``, ``new_passes``) come out of the compute and go back at the new
    count."""
    body = max(predicted - p.launch - after_stream(p, old_bytes), 0.0)
    t_bytes = old_bytes / p.bandwidth
    loops = old_passes * p.row_pass
    compute = body if body > t_bytes else min(body, old_flops / p.peak + loops)
    loops = min(loops, compute)
    scale = new_flops / old_flops if old_flops > 0 else (new_bytes / old_bytes if old_bytes > 0 else 1.0)
    return p.launch + max(new_bytes / p.bandwidth, (compute - loops) * scale + new_passes * p.row_pass) \
        + after_stream(p, new_bytes)


@dataclass(frozen=True)
class Overrides:
    """Some fields of the device parameters in effect (the calibration, else the defaults) replaced:
    ``using(params={"LLVM": {"launch": 1e-6}})`` keeps the calibrated bandwidth and peak, where a
    whole ``DeviceParams(launch=1e-6)`` replaces them all."""
    items: tuple[tuple[str, Any], ...]

    @staticmethod
    def of(values: dict) -> "Overrides":
        names = [f.name for f in fields(DeviceParams) if f.name != "source"]
        bad = sorted(set(values) - set(names))
        if bad:
            raise ValueError(f"DeviceParams overrides: unknown field(s) {bad}; the fields are {names}")
        replace(DeviceParams(), **values)          # the values are checked as DeviceParams checks them
        return Overrides(tuple(sorted(values.items())))

    def apply(self, base: DeviceParams) -> DeviceParams:
        given = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.items)
        return replace(base, **dict(self.items), source=f"{base.source} with {given}")


@dataclass(frozen=True)
class CostModel:
    params: DeviceParams
    fn: CostFn = default_cost
    # the device's lowering capabilities (graph/caps.py), for the register block a contraction
    # gets; None (a cost model built by hand): every contraction fills it
    caps: Capabilities | None = None
    # the device's library GEMM (graph/caps.py ``library_for``: (call seconds, FLOP/s of one
    # thread, the size it was timed at), asked the first time a large GEMM is priced) and the
    # threads it runs a single product on; None: no library
    library: Callable[[], tuple[float, float, int] | None] | None = None
    threads: int = 1

    def seconds(self, nbytes: float, flops: float, nodes: int, cflops: float = 0.0, fill: float = 1.0) -> float:
        return self.fn(KernelStats(nbytes, flops, nodes, cflops, fill), self.params)

    def fill(self, body: Any) -> float:
        """The rate, as a share of a register-blocked contraction's, of a root contraction with
        kernel body ``body`` (a KNode) on this device (``Capabilities.block_fill`` of the lanes
        pass's block); 1 without a contraction rate of its own or known capabilities."""
        return self.fill_parts(body)[0]

    def fill_parts(self, body: Any) -> tuple[float, float]:
        """(``fill``, the library GEMM's FLOP/s where the library sets it, else 0)."""
        if self.caps is None or not self.params.contraction:
            return 1.0, 0.0
        fill = self.caps.block_fill(block_of(body, self.caps))
        lib = self.library_gemm(body)
        if lib is None or lib / self.params.contraction <= fill:
            return fill, 0.0
        return lib / self.params.contraction, lib

    def library_speed(self) -> tuple[float, float, int] | None:
        return self.library() if self.library is not None else None

    def library_gemm(self, body: Any) -> float | None:
        """The FLOP/s the device's library GEMM runs kernel body ``body`` at, when the body is one
        GEMM (no batch) at least as large in every dimension as the product the library was timed
        on (``size`` cubed): its calls cost ``call`` and its arithmetic runs at the timed rate on
        each of ``threads`` threads. None otherwise: smaller or batched products run the library
        at rates the one timing does not tell (attention's 384 products of 128 x 128 x 32 ran at
        89 GFLOP/s against 277 for the timed 256-cubed one on two threads), and the device times the
        library against the generated kernel for them (devices/cpustage.py). Measured on a 2-vCPU
        Xeon: 139 GFLOP/s a thread timed; Linear 480 x 1536 x 384 ran at 300-320 GFLOP/s on two
        threads, matmul 512 at 260, both priced at the generated contraction's 150 before."""
        lib = self.library_speed()
        if lib is None:
            return None
        call, rate, size = lib
        if math.prod(body.shape) < size * size:     # (cheap: most bodies stop here, before the match)
            return None
        g = gemm_of(body)
        if g is None or g[0] != 1 or min(g[1:]) < size:
            return None
        flops = 2.0 * g[1] * g[2] * g[3]
        return flops / library_seconds(call, rate, flops, 1, self.threads, threaded=True)


# ------------------------------------------------------------------ calibration storage

def _check_calibration(v: object) -> str | None:
    """Why a stored calibration is unusable (a zero bandwidth would divide by zero), or None."""
    return check_fields(v, positive=("bandwidth", "peak"), non_negative=("launch",))


def _measured_of(e: dict, name: str, default: float) -> float:
    """A stored calibration's field ``name`` (``default`` where it predates the field or is not a
    non-negative finite number: the contraction rate 0, then ``peak`` applies; ``cold`` and
    ``row_pass`` the device's default)."""
    try:
        v = float(e.get(name, default))
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) and v >= 0 else default


CALIBRATIONS = JsonCache("calibration", CALIBRATION_VERSION, check=_check_calibration)


def load_calibrations() -> dict:
    """Every good stored calibration (a missing or corrupt file gives none, a bad entry is skipped, each
    with one CacheWarning naming the file; the next calibration rewrites it)."""
    return CALIBRATIONS.load()


def save_calibration(device: str, params: DeviceParams) -> Path | None:
    # the window of reuse a calibration fitted (tools/calibrate.py ``fit_window``) is read back from
    # ``cache_window``: the ``cache_bytes`` of calibrations stored before the fit was the host's
    # last-level cache, not a measurement, and they keep the device's default window
    return CALIBRATIONS.put(f"{device}|{machine_key(device)}", dict(asdict(params), cache_window=params.cache_bytes))


_PARAMS: dict[tuple, DeviceParams] = {}     # (device, machine key, calibration file stamp) -> params_for's answer


def params_for(device: str) -> DeviceParams:
    """Calibrated parameters for this device and machine if present, else the defaults (memoized
    on the calibration file's stamp: a cached realize asks on every call)."""
    key = (device, machine_key(device), CALIBRATIONS.stamp())
    p = _PARAMS.get(key)
    if p is None:
        if len(_PARAMS) >= 64:
            _PARAMS.clear()
        p = _PARAMS[key] = _params_for(device)
    return p


def _params_for(device: str) -> DeviceParams:
    e = load_calibrations().get(f"{device}|{machine_key(device)}")
    base = DEFAULT_PARAMS.get(device, DeviceParams(source="default"))
    if not e:
        return base
    try:
        return replace(base, launch=float(e["launch"]), bandwidth=float(e["bandwidth"]), peak=float(e["peak"]),
                       contraction=_measured_of(e, "contraction", 0.0), cold=_measured_of(e, "cold", base.cold),
                       row_pass=_measured_of(e, "row_pass", base.row_pass),
                       cache_bandwidth=_measured_of(e, "cache_bandwidth", base.cache_bandwidth),
                       cache_bytes=int(_measured_of(e, "cache_window", base.cache_bytes)),
                       strided_bandwidth=_measured_of(e, "strided_bandwidth", base.strided_bandwidth),
                       source=str(e.get("source", "calibrated")))
    except (KeyError, TypeError, ValueError):
        return base
