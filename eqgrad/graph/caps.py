"""What a device lets the lowering do: one capabilities object per device, as data.

The lowering passes (lower/passes.py) read their thresholds from ``LowerOptions``, which a device
derives from its :class:`Capabilities` (``LowerOptions.for_caps``); the lowered-kernel cache is keyed
by them (devices/__init__.py ``lowered_kernel``), so a kernel lowered for one device is never handed to
another with other capabilities; the frontend asks the tensor's device for its lane widths instead of
importing the lowering's constants (nn/functional.py). On the graph floor because the lowering, the
devices and the frontend all read it and none of them may import another's floor sideways
(docs/layout.md).

The CPU values are the ones the passes were measured with (docs/lowering.md names each measurement):
register blocks of up to 16 lanes on the last output axis and 8 on the one before -- 8 x 16 float
accumulators, the 16 vector registers of AVX2 (on AVX-512 they are 8 of its 32) -- and they are the
same on every x86-64 CPU: a width is a choice of the lowering, not a fact of the host, so no test or
kernel depends on the host's vector width (the EQGRAD_CPU=x86-64-v2 test run lowers identically).
GPU devices (an OpenCL GPU, CUDA) get no CPU register blocks: a work-item keeps one output, and a
reduction's parallelism comes from its work-group (``reduce_group`` work-items), which the renderer
fills in. An OpenCL platform on a CPU (PoCL) keeps them: measured on PoCL, 2-core Xeon, matmul 512
2.2-3.6 ms with register blocks, 45-48 ms without (256: 0.7 vs 6.9-9.8 ms).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

# the CPU lowering's register-block widths and thresholds (lower/passes.py reads them through
# LowerOptions; docs/lowering.md has the measurement behind each)
LANES_LAST = (16, 8, 4)       # lanes tried on the last output axis, first that divides wins
LANES_PREV = (8, 4, 2)        # the axis before it: its largest divisor up to the first; a one-axis block tries them
LANE_BODY_MAX = 8192          # most body nodes x lanes (the unrolled block must stay compilable; docs/lowering.md, Constants)
ROW_STASH_MAX = 16384         # elements of a row's local array: a thread's stack (docs/lowering.md, Constants)
TILE_BLOCKS = 8               # register blocks of the outer lane axis per cache tile (docs/lowering.md, Constants)
TILE_MIN_STREAM = 1 << 20     # bytes a block's reduce loop streams from the lane-axis operand (docs/lowering.md, Constants)
DOT_BLOCK = (4, 2)            # a dot block's lanes on the axis before the last and on the last (docs/lowering.md, Constants)


@dataclass(frozen=True)
class Capabilities:
    """A device's lowering capabilities (hashable: part of the lowered-kernel cache key).

    ``register_lanes``: the lanes and tiling passes may split output axes into register blocks of
    ``lanes_last`` x ``lanes_prev`` (a CPU, and an OpenCL platform that runs on one); False for a GPU,
    which maps outputs to work-items. ``reduce_group``: work-items that share one reduction (0: none),
    which the C-style renderers use. ``dot_block``: the most lanes of a dot block (lower/passes.py
    ``DotLanes``: outputs unrolled while the reduce loop is vectorized; (1, 1): none). Equality (and
    so the cache key) covers the fields the lowering reads, not the names: two devices that lower
    alike share their lowered kernels."""
    device: str = field(compare=False)
    register_lanes: bool = True
    lanes_last: tuple[int, ...] = LANES_LAST
    lanes_prev: tuple[int, ...] = LANES_PREV
    lane_body_max: int = LANE_BODY_MAX
    tile_blocks: int = TILE_BLOCKS
    tile_min_stream: int = TILE_MIN_STREAM
    dot_block: tuple[int, int] = DOT_BLOCK
    # a lone row's row-stash local array holds the most a row may (``ROW_STASH_MAX``: a CPU thread's
    # stack), not the power of two at or above the row (a GPU work-item's private memory):
    # lower/indexing.py ``row_array_size``
    row_arrays_full: bool = True
    reduce_group: int = field(default=0, compare=False)

    def register_block(self, shape: tuple[int, ...], body: int) -> tuple[int, int]:
        """The register block the lanes pass gives a kernel of output ``shape`` whose body has
        ``body`` nodes, as (lanes on the last axis, lanes on the one before): :func:`register_block`
        with this device's widths; (1, 1) on a device without register lanes."""
        if not self.register_lanes:
            return 1, 1
        return register_block(shape, body, self.lanes_last, self.lanes_prev, self.lane_body_max)

    def block_fill(self, block: tuple[int, int]) -> float:
        """The rate, as a share of a register-blocked contraction's, of a contraction lowered with
        lanes ``block`` (last axis, axis before): 1 with any lanes; without them, one lane axis's
        share of the full block (1/8 on the CPU), as the loop vectorizer widens the reduction into
        about one vector of accumulators. The cost model multiplies its contraction rate by it
        (docs/extraction.md: BERT's batched 15 x 15 x 32 attention products get no lanes and ran
        at 14-20 GFLOP/s, blocked contractions at 150-270). A partial block (4 x 4 lanes on a 12 x 12
        image) is priced as a full one: pricing it by its share sent a small convolution to a plan
        that materialized its 16x-expanded windows for the BLAS, 4x slower, and the plan, resized,
        to the large ones (631 against 8 ms at (32, 32, 32, 32))."""
        if not self.register_lanes or block[0] * block[1] > 1:
            return 1.0
        return max(self.lanes_last) / (max(self.lanes_last) * max(self.lanes_prev))

    def lane_room(self, n: int) -> int:
        """How well an axis of ``n`` elements fills this device's register lanes: the largest lane
        width dividing it (1: none, or a device without register lanes)."""
        if not self.register_lanes:
            return 1
        return next((w for w in self.lanes_last if n % w == 0), 1)


CPU = Capabilities("CPU")


def cpu_caps(vector_floats: int) -> Capabilities:
    """The CPU capabilities for a target whose vector registers hold ``vector_floats`` float32s
    (16 with AVX-512, 8 with AVX2, 4 with SSE): the register block's rows get two vectors on the
    last axis where that is wider than ``LANES_LAST``'s first width -- AVX-512's 32 registers then
    hold 8 x 2 accumulators, where 8 x 1 re-read each row's value for every vector (attention's
    p @ v, 384 products of 128 x 32 x 128, two threads: 1.67 -> 1.43 ms; its q @ k^T 1.38 -> 1.27;
    2-vCPU Xeon, Rocket Lake). AVX2's two vectors are ``LANES_LAST``'s 16: ``CPU`` itself."""
    first = 2 * vector_floats
    if first <= max(LANES_LAST):
        return CPU
    return Capabilities("CPU", lanes_last=(first,) + LANES_LAST)


def register_block(shape: tuple[int, ...], body: int, lanes_last: tuple[int, ...], lanes_prev: tuple[int, ...],
                   body_max: int, whole: "bool | Callable[[], bool]" = False) -> tuple[int, int]:
    """The lanes pass's widths (lower/passes.py ``Lanes``) for output ``shape``: on the last axis
    with more than one element, the first of ``lanes_last`` that divides it and keeps
    ``body * lanes <= body_max``; if one does, on the axis before it (with more than one element)
    its largest divisor up to ``max(lanes_prev)`` within the same bound (8 of 24 rows, 6 of 12, 5 of
    10, 3 channels: the block's lanes on that axis are independent accumulators, so any width is
    one; measured below). An output with one such
    axis gets the whole block on it: ``w1`` times the first of ``lanes_prev`` that divides what is
    left of it, as (w1 * w0, 1) -- or the whole axis, where it is no longer than a full block
    (``max(lanes_last) * max(lanes_prev)`` lanes). With ``whole`` (a contraction over windows along
    that axis: lower/passes.py ``_windowed``; a bool, or a function asked only where the answer can
    change the widths), an axis up to a full block that none of them divides,
    or only one narrower than a vector register (half the widest width), gets its largest divisor up
    to a vector. (1, 1): no lanes. The one definition the lowering and the cost model
    (``Capabilities.block_fill``) read.

    The one-axis block is for column sums (a bias gradient: a (480, 1536) tensor summed over its
    rows) and other reductions that stream along a lone output axis: with 16 lanes, one vector
    accumulator per block of columns made the reduce loop a chain of dependent adds that jumped a
    row's stride each step. Measured on a 2-vCPU Xeon, one thread: (480, 1536).sum(0) 300 -> 99
    us, (32768, 64).sum(0) 810 -> 286 us; on two threads 214 -> 81 us and 424 -> 284 us.

    The largest divisor, not the first of (8, 4, 2) that divides: the weight gradient of a
    convolution with 3 input channels (the CNN step's first layer, outputs (3, 3, 1, 3, 16), a
    32,768-long reduction) had lanes on its last axis alone, one vector accumulator, a chain of
    dependent FMAs at 40 GFLOP/s (706 us); with 3 x 16 lanes three chains, 94 GFLOP/s (301 us). A
    Linear layer's weight gradient (10, 32768) = g.T @ x over a batch of 32: 2 x 16 lanes re-read
    x for every pair of rows, 462-482 us; 5 x 16, 222-224 us (2-vCPU EPYC, two threads,
    EQGRAD_BLAS=0)."""
    big = [d for d, n in enumerate(shape) if n > 1]
    if not big:
        return 1, 1
    last = shape[big[-1]]
    w1 = next((w for w in lanes_last if w > 1 and last % w == 0 and body * w <= body_max), 1)
    if w1 < max(lanes_last) // 2 and last <= max(lanes_last) * max(lanes_prev) \
            and (whole() if callable(whole) else whole):       # (asked only where it can matter)
        # no width divides an axis of a contraction over windows (``whole``: a 7 x 7 or 14 x 14 image,
        # rows of 30), or only one narrower than a vector (rows of 28 or 52: 4 lanes): its largest
        # divisor that fills at most one vector register (half the widest block row, ``cpu_caps``), a
        # vector of that length (LLVM widens a <7 x float> to the register's width; a <30 x float> of
        # the whole axis it split into pieces, 10x slower). Up to a full block's lanes
        vector = max(lanes_last) // 2
        w1 = next((w for w in range(min(vector, last), w1, -1) if last % w == 0 and body * w <= body_max), w1)
    if w1 == 1:
        return w1, 1
    if len(big) < 2:
        # the whole axis where it fits in a block (a head dim of 96 or 80: one block, not three or five
        # of 32 or 16 -- attention's probabilities in dk and dv are computed once per block)
        if last <= max(lanes_last) * max(lanes_prev) and body * last <= body_max:
            return last, 1
        w0 = next((w for w in lanes_prev if w > 1 and (last // w1) % w == 0 and body * w * w1 <= body_max), 1)
        return w1 * w0, 1
    prev = shape[big[-2]]
    w0 = next((w for w in range(max(lanes_prev), 1, -1) if prev % w == 0 and body * w * w1 <= body_max), 1)
    return w1, w0


# the lanes pass's decision for a kernel body on a device (lower/passes.py ``block_of`` registers
# itself when imported): the cost model asks it through here, as the extractor's floor does not
# import the lowering's
_BLOCK_OF: Callable[[Any, Capabilities], tuple[int, int]] | None = None


def register_block_rule(fn: Callable[[Any, Capabilities], tuple[int, int]]) -> None:
    """Install the lanes pass's decision (``fn(kernel body, caps) -> (lanes last, lanes before)``)."""
    global _BLOCK_OF
    _BLOCK_OF = fn


def block_of(body: Any, caps: Capabilities) -> tuple[int, int]:
    """The register block the lanes pass gives kernel body ``body`` (a KNode) on a device with
    ``caps``; (1, 1) before the lowering is imported."""
    return _BLOCK_OF(body, caps) if _BLOCK_OF is not None else (1, 1)


# whether the lowering computes a row-fused body's reductions once per row, whether the ones it
# keeps inside a hoisted loop stream their loads, and whether it computes those as register blocks
# (lower/passes.py ``rows_kept``, ``row_dots_streamed`` and ``row_dots_blocked`` register themselves
# when imported): the cost model asks before it prices a reduction nested in a row's passes, or
# below an operand a contraction's lanes share, once per element
_ROWS_KEPT: Callable[[Any, bool], tuple[bool, bool, bool]] | None = None


def register_rows_rule(fn: Callable[[Any, bool], tuple[bool, bool, bool]]) -> None:
    """Install the lowering's answer to ``rows_kept`` (``fn(kernel body, blocked) -> (kept, streamed, blocked)``)."""
    global _ROWS_KEPT
    _ROWS_KEPT = fn


def rows_kept(body: Any, blocked: bool = True) -> tuple[bool, bool, bool]:
    """Whether the lowering computes every reduction of kernel body ``body`` (a KNode) once per row
    or once per output element (hoisted, kept by a hoisted loop, or the root's own), whether the
    kept ones read their loads with unit stride along their innermost reduced axis (vectorized
    along it), and whether it computes the kept sums of products as register blocks (lower/passes.py
    ``RowDots``, after the device's pack); (False, False, False) before the lowering is imported.
    ``blocked`` False: the third answer leaves out the row-dots pass's dry run (the costly part),
    answering only for the kernel's own reduction."""
    return _ROWS_KEPT(body, blocked) if _ROWS_KEPT is not None else (False, False, False)


# the GEMM a kernel body is (lower/contraction.py ``gemm_shape`` registers itself when imported):
# (batches, m, n, k), or None for a body that is not one
_GEMM_OF: Callable[[Any], tuple[int, int, int, int] | None] | None = None


def register_gemm_rule(fn: Callable[[Any], tuple[int, int, int, int] | None]) -> None:
    """Install the contraction matcher (``fn(kernel body) -> (batches, m, n, k) or None``)."""
    global _GEMM_OF
    _GEMM_OF = fn


def gemm_of(body: Any) -> tuple[int, int, int, int] | None:
    """(batches, m, n, k) of the GEMM kernel body ``body`` is, or None (also before the lowering is
    imported)."""
    return _GEMM_OF(body) if _GEMM_OF is not None else None


# the loads a kernel body reads a cache line or more apart along its innermost output loop (lower/
# passes.py ``strided_loads`` registers itself when imported): the cost model prices their bytes at
# the device's strided rate (extract/cost.py, strided reads)
_STRIDED: Callable[[Any], frozenset[int]] | None = None


def register_strided_rule(fn: Callable[[Any], frozenset[int]]) -> None:
    """Install the lowering's answer to ``strided_loads`` (``fn(kernel body) -> buffer numbers``)."""
    global _STRIDED
    _STRIDED = fn


def strided_loads(body: Any) -> frozenset[int]:
    """The buffers (their BUF nodes' ``arg``) kernel body ``body`` (a KNode) reads a cache line or
    more apart from one element of its innermost output loop to the next, outside any reduction (a
    permute of NCHW to NHWC reads its input so): each element a line of its own, which the loop's
    other elements do not share. Empty before the lowering is imported."""
    return _STRIDED(body) if _STRIDED is not None else frozenset()


# each device created in this process, by its name (devices/__init__.py get_device records it):
# the cost model reads a device's capabilities from here, since the extractor's floor does not
# import the devices; read at each use, so capabilities a user set on the device object count
_BY_DEVICE: dict[str, Any] = {}


def record(device: str, owner: Any) -> None:
    """Note ``owner`` (an object whose ``caps`` are a Capabilities) as device ``device``."""
    _BY_DEVICE[device] = owner


def caps_for(device: str) -> Capabilities | None:
    """The capabilities of device ``device`` if it was created in this process, else None."""
    owner = _BY_DEVICE.get(device)
    return owner.caps if owner is not None else None


def library_for(device: str) -> Callable[[], tuple[float, float, int] | None] | None:
    """How to ask device ``device`` for the library GEMM it hands large contractions to, if it was
    created in this process and has one (the LLVM device: the BLAS): a function that returns
    (seconds a call costs, FLOP/s of one thread on a product of ``size`` cubed, ``size``), measured
    on this machine the first time it is asked, or None when the library is off. A function, so that
    a program without a contraction never loads or times the library."""
    owner = _BY_DEVICE.get(device)
    return getattr(owner, "library_speed", None) if owner is not None else None


def library_seconds(call: float, rate: float, flops: float, batches: int, threads: int, threaded: bool) -> float:
    """The library GEMM's best-case seconds for ``batches`` products of ``flops`` FLOPs in all, from
    what the device measured of it (``library_for``): each call costs ``call`` seconds plus its
    arithmetic at ``rate`` FLOP/s on one thread. A single product the library threads itself
    (``threaded``: at least as large in every dimension as the product ``rate`` was timed on) shares
    its arithmetic across ``threads``; otherwise each call runs on one thread and the calls are
    shared across ``threads``. The one estimate of both readers: the cost model prices a large GEMM
    with it (extract/cost.py ``CostModel.library_gemm``) and the device skips timing a call-bound
    product whose best case loses to the generated kernel (devices/blas.py ``pays``)."""
    threads, batches = max(1, threads), max(1, batches)
    if batches == 1 and threaded:
        return call + flops / (rate * threads)
    return batches * (call + flops / batches / rate) / min(threads, batches)


# a core's private cache when the host does not say (no Linux sysfs): what the two-core x86 hosts
# measured have or exceed (Intel Ice Lake / Sapphire Rapids 1.25-2 MiB of L2 a core, AMD Zen 3-5
# 0.5-1 MiB); the launch-after-a-stream term of the cost model (extract/cost.py) reads it
PRIVATE_CACHE_FALLBACK = 1 << 20          # docs/lowering.md, Constants


def _data_caches(sysfs: str) -> list[tuple[int, int]] | None:
    """(level, bytes) of each data or unified cache Linux's sysfs lists for one core (``sysfs``: its
    cache directory), or None where the directory cannot be read."""
    try:
        entries = os.listdir(sysfs)
    except OSError:
        return None
    out = []
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            with open(os.path.join(sysfs, e, "level")) as f:
                level = int(f.read())
            with open(os.path.join(sysfs, e, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(sysfs, e, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        try:
            n = int(size[:-1]) * units[size[-1].upper()] if size[-1:].upper() in units else int(size)
        except (ValueError, IndexError):
            continue
        out.append((level, n))
    return out


def private_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The bytes of the largest cache private to one core of this host (its L2, where the
    interpreter's working set lives between kernels), from Linux's sysfs; PRIVATE_CACHE_FALLBACK where
    that cannot be read. A level-3 cache is shared and left out."""
    caches = _data_caches(sysfs)
    return max((n for level, n in caches or () if level == 2), default=0) or PRIVATE_CACHE_FALLBACK


def private_caches_bytes(cores: int | None = None, sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The private caches (``private_cache_bytes``: each core's L2) of the ``cores`` a kernel's threads
    run on (default: this host's CPUs, the device's threads): what the kernels just before a kernel
    wrote stays in, each thread's part of a buffer in its own core's L2."""
    n = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, n) * private_cache_bytes(sysfs)


# CPU vendors (/proc/cpuinfo ``vendor_id``) whose last-level cache belongs to a core complex of a few
# cores and serves their re-reads fast (AMD Zen, and Hygon's: an L3 a CCX), which the cost model's
# reads from cache count (``reuse_cache_bytes``); Intel's server parts spread their L3 over a mesh
CORE_COMPLEX_L3 = ("AuthenticAMD", "HygonGenuine")


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This host's CPU vendor as Linux reports it (``vendor_id``: "GenuineIntel", "AuthenticAMD"), or
    "" where that cannot be read."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def reuse_cache_bytes(cores: int | None = None, sysfs: str = "/sys/devices/system/cpu/cpu0/cache",
                      vendor: str | None = None) -> int:
    """The bytes within which a kernel's reads find what the kernels just before it wrote or read (the
    cost model's reads from cache, extract/cost.py): the private caches of the ``cores`` its threads
    run on (``private_caches_bytes``), and the last level where it is a core complex's
    (``CORE_COMPLEX_L3``, by ``vendor``: default this host's). What a hit in the shared L3 is worth
    depends on the part: on a 2-vCPU Intel Xeon (mesh L3; sysfs says 480 MiB) a re-read of 2.6 MB
    that the kernel before wrote ran 1.05-1.18x faster than from memory and column sums read 3-66 MB
    after their producer ran at memory speed (bench_model with the L3 as the window 133-138 of 153
    kernels within 2x, with the L2s 143-145); on a 2-vCPU AMD EPYC (Zen 4, 32 MiB of L3 a core
    complex) bench_model's kernels that read the kernel before them ran at 60-80 GB/s against 20.
    ``tune calibrate`` fits the window on the machine (tools/calibrate.py ``fit_window``)."""
    window = private_caches_bytes(cores, sysfs)
    if (cpu_vendor() if vendor is None else vendor) in CORE_COMPLEX_L3:
        window += max((n for level, n in _data_caches(sysfs) or () if level >= 3), default=0)
    return window
