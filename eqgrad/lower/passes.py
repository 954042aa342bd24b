"""The lowering's decisions, as a flat list of named passes (docs/lowering.md).

A pass looks at one kernel, and at what the passes before it decided, and records its decision
in a :class:`Schedule`; it emits nothing. The emitter (``lowering.Lowerer``) then writes loop IR
that follows the schedule. So each decision can be inspected alone (:func:`run_passes` returns
the schedule after every pass) or switched off (``LowerOptions(disabled={"hoist"})``), and every
prefix of the list is a schedule that lowers to valid loop IR computing the same values: the
passes change speed, never results (tests/test_lower_interp.py checks both, with ``EQGRAD_VERIFY``
on the whole suite verifies the loop IR after every pass).

:data:`PASSES`, in pipeline order:

====================  =======  ===============================================================
``split reductions``  plan     a large reduction to one value -> parallel partials + a final one
``lanes``             kernel   output axes split into register lanes (upcast)
``dot lanes``         kernel   a block of a contraction's outputs unrolled, its reduce loop vectorized
``tiling``            kernel   a cache tile loop over a two-axis register block
``hoist``             kernel   row fusion: reductions rendered once per row, inside the row loop
``stash``             kernel   a row's costly shared value stored by its reduction's loop, loaded back
``row stash``         kernel   a row's costly values read by several of its passes, kept in a local array
``blocked sums``      kernel   float sums of more than 1024 values summed in levels
``parallel``          kernel   which leading output loops have independent iterations
====================  =======  ===============================================================

A *plan* pass rewrites a plan's kernels before any is lowered; the device that needs it runs it,
because it owns the scratch buffers the rewrite adds (``lower/split.py``, ``devices/cpu.py``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Iterator

from eqgrad.dtype import bool_
from eqgrad.graph.caps import (DOT_BLOCK, LANE_BODY_MAX, LANES_LAST, LANES_PREV, ROW_STASH_MAX, TILE_BLOCKS, TILE_MIN_STREAM,
                               Capabilities, private_cache_bytes, register_block, register_block_rule,
                               register_rows_rule, register_strided_rule)
from eqgrad.graph.plan import GROUP, Kernel, KNode, NodeMemo, broadcast_product, lanes_axis, shared_factor
from eqgrad.graph.sizes import ELEMENTWISE
from eqgrad.lower.contraction import GEMM_MOVES, candidate, find_contraction
from eqgrad.lower.indexing import (MOVES, REDUCES, dry_sources, flat_index, hoistable, reduce_map, roots_of,
                                   row_array_cap, row_output, stash_layout)
from eqgrad.lower.sums import SUM_BLOCK, SUM_RADIX
from eqgrad.lower.symbolic import Lin, Var, substitute_free
from eqgrad.ops import OPS, numel

# The thresholds, named with the measurement behind each in the pass that reads it. The register
# block's are a device's capabilities (graph/caps.py: the CPU's here are its defaults).
SPLIT_MIN = 1 << 20           # elements: smaller reductions are not worth a second kernel (docs/lowering.md, Constants)
SPLIT_PARTS = 64              # most partial results (each thread gets several: uneven cores balance; docs/lowering.md, Constants)
SPLIT_SHARE = 2               # outer-loop iterations a thread below which a large reduction is split (docs/lowering.md, Constants)
SPLIT_WORK = 64               # elements a partial reduces, at least, per element it writes (docs/lowering.md, Constants)
STASH_MIN_FLOPS = 8           # op-table flops per element a stashed value must cost (docs/lowering.md, Constants)


# facts of x86-64 the cache-blocks pass reads (docs/lowering.md, Constants)
CACHE_LINE = 64               # bytes of a cache line
PAGE = 4096                   # bytes of a page: reads a page or more apart share L1 sets and TLB entries


@dataclass(frozen=True)
class LowerOptions:
    """What the caller fixes about a kernel's lowering. The thresholds default to the module's
    constants; tests lower them to reach a pass on a kernel small enough for the interpreter."""
    upcast: tuple[int, int] | None = None     # forced lanes (last output axis, the axis before): kernel search
    disabled: frozenset[str] = frozenset()    # names of passes switched off
    threads: int = 1                           # CPU threads the device splits kernels across
    parallel_min: float = 0.0                  # predicted seconds above which it does (devices/cpu.py)
    lanes_last: tuple[int, ...] = LANES_LAST   # lane widths tried on the last output axis
    lanes_prev: tuple[int, ...] = LANES_PREV   # and on the axis before it
    lane_body_max: int = LANE_BODY_MAX
    tile_blocks: int = TILE_BLOCKS
    tile_min_stream: int = TILE_MIN_STREAM
    dot_block: tuple[int, int] = DOT_BLOCK     # most dot-block lanes (axis before the last, last)
    sum_block: int = SUM_BLOCK
    sum_radix: int = SUM_RADIX
    split_min: int = SPLIT_MIN
    split_parts: int = SPLIT_PARTS
    split_work: int = SPLIT_WORK
    block_stride: int = PAGE                   # cache blocks: least stride (bytes) of a read along the last axis
    block_bytes: int = -1                      # and least output bytes (-1: a core's private cache)
    block_tile: bool = True                    # and each block copied through a local array (a CPU's)
    row_arrays_full: bool = True               # row-stash arrays as large as allowed (indexing.row_array_size)

    @classmethod
    def for_caps(cls, caps: Capabilities, **kw) -> "LowerOptions":
        """The options a device with ``caps`` lowers with: its register-block widths and thresholds,
        and without the lanes and tiling passes where it has no register lanes (a GPU's work-items).
        The same object for the same arguments: the device stage compares a kernel's options with
        its memo's at every prepare (a resized plan's, at every step), and 21 fields compare slower
        than one identity."""
        try:
            return _options_for(caps, tuple(sorted(kw.items())))
        except TypeError:                  # (an argument that does not hash)
            return cls._for_caps(caps, **kw)

    @classmethod
    def _for_caps(cls, caps: Capabilities, **kw) -> "LowerOptions":
        no_lanes = frozenset() if caps.register_lanes else {"lanes", "dot lanes", "tiling"}
        disabled = frozenset(kw.pop("disabled", ())) | no_lanes
        return cls(lanes_last=caps.lanes_last, lanes_prev=caps.lanes_prev, lane_body_max=caps.lane_body_max,
                   tile_blocks=caps.tile_blocks, tile_min_stream=caps.tile_min_stream, dot_block=caps.dot_block,
                   block_tile=caps.register_lanes, row_arrays_full=caps.row_arrays_full, disabled=disabled, **kw)

    def __post_init__(self) -> None:
        names = {self.disabled} if isinstance(self.disabled, str) else self.disabled
        object.__setattr__(self, "disabled", frozenset(names))
        unknown = sorted(self.disabled - set(PASS_NAMES))
        if unknown:
            raise ValueError(f"LowerOptions.disabled: expected pass names from {list(PASS_NAMES)}, got {unknown}")
        if self.sum_block < 2 or self.sum_radix < 2:
            raise ValueError(f"LowerOptions: sum_block and sum_radix must be >= 2, "
                             f"got {self.sum_block}, {self.sum_radix}")


@functools.lru_cache(maxsize=64)
def _options_for(caps: Capabilities, kw: tuple) -> LowerOptions:
    """``LowerOptions.for_caps``'s answer, one object per (capabilities, arguments)."""
    return LowerOptions._for_caps(caps, **dict(kw))


@dataclass(frozen=True)
class Split:
    """The ``split reductions`` decision: reduce ``reduce``'s source in ``parts`` partials along ``axis``."""
    reduce: KNode
    axis: int
    parts: int


@dataclass(frozen=True)
class Schedule:
    """Everything the passes decided about one kernel; the emitter reads only this.

    The empty schedule is the plain lowering: one loop per output axis, reductions rendered where
    they are used, one accumulator per sum, no loop declared parallel."""
    lanes: tuple[tuple[int, int], ...] = ()            # (output axis, lanes), by axis
    tile: tuple[int, int] | None = None                # (outer lane axis, register blocks per tile)
    # (k, reductions): rendered right after the k-th output loop opens (k = 0: a kernel without
    # output loops, before its store); each at the index it is read at from the root
    hoist: tuple[tuple[int, tuple[KNode, ...]], ...] = ()
    blocked: tuple[KNode, ...] = ()                    # float sums summed in levels
    sum_block: int = SUM_BLOCK
    sum_radix: int = SUM_RADIX
    parallel: int = 0                                  # leading output loops with independent iterations
    stash: KNode | None = None                         # a value stored by a hoisted loop, loaded by the row's
    row_stash: tuple[KNode, ...] = ()                  # values a row's first pass stores in a local array
    # row-stash values computed as register blocks before their row's first pass (RowDots): (value,
    # rows of a block a group of accumulators holds)
    row_dots: tuple[tuple[KNode, int], ...] = ()
    # sums of products the kernel's own reduction reads along its loop, computed before that loop as
    # register blocks into a local array (RowDots on a kernel without hoists): (value, elements of
    # the array a step computes, rows of the row block a group of accumulators holds)
    root_dots: tuple[tuple[KNode, int, int], ...] = ()
    # in a kernel with lanes, the values over those dot products that the reduction reads alike in
    # every lane (attention's ds = p * (dp - D)), computed after the blocks in a loop of their own
    # over the row (one LLVM's loop vectorizer widens) into a local array
    root_rows: tuple[KNode, ...] = ()
    # in a kernel without lanes, rows of its last output axis whose root dots one group of
    # accumulators computes (their loads shared); each row's reduction then runs in a loop of its own
    root_block: int = 0
    # cache blocks (CacheBlocks): (output axis, inner extent) -- the axis's loop split into a loop over
    # blocks at its place and an inner loop opened after the last output loop
    blocks: tuple[tuple[int, int], ...] = ()
    split: Split | None = None                         # for the device (a plan pass)
    dot: bool = False                                  # the lanes are a dot block's (DotLanes)

    @property
    def lane_map(self) -> dict[int, int]:
        return dict(self.lanes)


class PassCtx:
    """What a pass may look at: the kernel, the options, and the reductions below each node
    (``has_reduce``: worked out at its first use -- the plan stage's pass does not read it, and a
    growing sequence's device stage asks it of each changed kernel at every step)."""
    __slots__ = ("kernel", "options", "_has_reduce")

    def __init__(self, kernel: Kernel, options: LowerOptions) -> None:
        self.kernel, self.options, self._has_reduce = kernel, options, None

    @property
    def root(self) -> KNode:
        return self.kernel.ast

    @property
    def has_reduce(self) -> dict[int, bool]:
        if self._has_reduce is None:
            self._has_reduce = reduce_map(self.kernel.ast)
        return self._has_reduce


class Pass:
    """A named lowering decision. ``applies`` is its condition; ``run`` records the decision in a
    new schedule; ``describe`` says what it decided. The class docstring names the measurement
    that justified the pass (docs/lowering.md has the table)."""
    name: ClassVar[str]
    stage: ClassVar[str] = "kernel"      # "plan": run by the device before lowering

    @property
    def doc(self) -> str:
        return type(self).__doc__ or ""

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        raise NotImplementedError

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        raise NotImplementedError

    def describe(self, s: Schedule) -> str:
        return ""

    def __repr__(self) -> str:
        return f"<pass {self.name!r}>"


# ------------------------------------------------------------------ split reductions (plan stage)

class SplitReductions(Pass):
    """A kernel that reduces 1M+ elements to one value has no parallel output loop, so only one
    thread could run it: its source's leading axis is split P ways (P <= 64, the largest divisor
    >= 8), giving P independent partials that the threads share, and a final reduction of P values
    (``lower/split.py`` rewrites the kernels; the LLVM device allocates the scratch buffer).
    The leading axis is split, not the flattened tensor, so no index division is added.
    No timing of its own was recorded: it gives a full sum or mean the thread split that other
    kernels get (LLVM, two cores: elementwise 16M 24 -> 13 ms, matmul 1024 111 -> 56 ms).

    So is a reduction of 1M+ elements whose output is not one value but whose outermost output
    axis -- the loop the threads share -- has fewer than two iterations a thread (``SPLIT_SHARE``):
    its first reduced axis is split likewise, and the partials (P of the output each) are laid out
    with P outermost, so that P is the loop the threads share, where each partial element reduces at
    least ``SPLIT_WORK`` (64) elements (the partials then move at most 1/64 of what the reduction
    reads; a batch of two 512 x 512 products is left to its outer loop). A convolution's weight gradient is
    one: (3, 3, 1, 3, 16) from 32 images of 32 x 32 (3 x 3 x 3 x 16 weights, 28 MFLOP) ran in
    490-570 us on one thread and on two alike, the outer loop's 3 iterations not worth sharing.
    Applies with more than one thread, for kernels predicted above the device's threading
    threshold (``LowerOptions.parallel_min``: devices/cpu.py ``SPLIT_FLOOR``)."""
    name = "split reductions"
    stage = "plan"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return self._find(ctx) is not None

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        return replace(s, split=self._find(ctx))

    def describe(self, s: Schedule) -> str:
        return f"axis {s.split.axis} of the {s.split.reduce.op} in {s.split.parts} parts" if s.split else ""

    @staticmethod
    def _find(ctx: PassCtx) -> Split | None:
        o, k = ctx.options, ctx.kernel
        if o.threads < 2 or not k.predicted > o.parallel_min:
            return None
        outer = next((n for n in k.ast.shape if n > 1), 1)
        if outer >= SPLIT_SHARE * o.threads:
            return None                       # the output's own loop shares out
        cands = [n for n in k.ast.walk() if n.op in REDUCES and numel(n.src[0].shape) >= o.split_min]
        if len(cands) != 1:
            return None
        red = cands[0]
        if any(n.op in REDUCES for n in red.src[0].walk()):
            return None                       # a nested reduction: leave the structure alone
        shape = red.src[0].shape
        lead = next((d for d in sorted(red.arg) if shape[d] > 1), None)
        if lead is None:
            return None
        # the largest divisor of the leading reduced axis in [8, split_parts]
        parts = next((p for p in range(min(o.split_parts, shape[lead] // 2), 7, -1) if shape[lead] % p == 0), 0)
        if not parts or numel(red.src[0].shape) < o.split_work * parts * numel(red.shape):
            return None                       # the partials would move more than the split saves
        return Split(red, lead, parts)


# ------------------------------------------------------------------ kernel passes

class Lanes(Pass):
    """Register lanes (upcast): the last output axis with more than one element is split into 16
    lanes (8 or 4 when 16 does not divide) and the axis before it into up to 8 (its largest
    divisor); a reduction then renders one loop nest with one accumulator per lane, an 8x16 block
    meant to stay in registers,
    and the kernel's loop vectorizer is switched off; the LLVM renderer emits the lanes of the last
    axis as vectors (devices/llvm.py, _Lanes; before, LLVM's SLP vectorizer had to find them, and
    on an AVX2 EPYC with llvmlite's LLVM 22 it left matmul 512's 128 lanes scalar). The block
    widths are the device's capabilities (graph/caps.py; the same on every x86-64 CPU, and none on a
    GPU device): 8 x 16 floats are 16 AVX2 registers of accumulators. Measured: matmul 512 415 ms -> 5 ms (one lane axis); 8x16 lanes
    matmul 1024 120 GFLOP/s; lanes on the innermost axis with more than one element: batched
    q @ k 121 ms -> 3 ms. Applies to kernels with a reduction that streams a load with unit stride
    along that axis (matmul, convolution, column sums) and none with a larger stride there (a
    gather per lane; ``contiguous_under_reduce``) -- not to a broadcast operand such as a
    softmax row's max, whose rows stay loop-vectorized. ``LowerOptions.upcast`` forces the widths
    (the kernel search, EQGRAD_BEAM)."""
    name = "lanes"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return lanes_apply(ctx.root, ctx.has_reduce[id(ctx.root)])

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        shape = ctx.root.shape
        o, forced = ctx.options, ctx.options.upcast
        w1s, w0s = ((forced[0],), (forced[1],)) if forced is not None else (o.lanes_last, o.lanes_prev)
        # the widths as the cost model prices them (graph/caps.py, Capabilities.block_fill); a GROUP
        # of reductions (lower/merge.py) renders each root's loop nest in turn: its roots' widths
        # where they agree, each as alone (its body the root's, not the GROUP's)
        each = {_lane_widths(r, len(r.walk()), w1s, w0s, o.lane_body_max) for r in ctx.root.src} \
            if ctx.root.op == GROUP and own_reductions(ctx.root) else set()
        w1, w0, second = next(iter(each)) if len(each) == 1 else \
            _lane_widths(ctx.root, len(ctx.root.walk()), w1s, w0s, o.lane_body_max)
        big = [d for d, n in enumerate(shape) if n > 1]
        up = {big[-1]: w1} if w1 > 1 else {}
        if w0 > 1:
            up[second] = w0
        return replace(s, lanes=tuple(sorted(up.items())))

    def describe(self, s: Schedule) -> str:
        return ", ".join(f"axis {d} x{w}" for d, w in s.lanes) or "no width divides"


class DotLanes(Pass):
    """A dot block: a contraction whose operands stream with unit stride along the reduce loop and not
    along the last output axis (``x @ w.T`` with a Linear layer's (out, in) weight: no lanes,
    ``lanes_apply``) computed a block of outputs per iteration, up to ``dot_block`` = 4 x 2 (on the
    axis before the last, on the last), each lane a scalar accumulator, with the loop vectorizer
    left on: it widens the reduce loop into one vector accumulator per lane, and the lanes share
    their loads -- per step 4 + 2 vector loads feed 8 FMAs, where one output per iteration loaded
    two vectors for one FMA and streamed the (out, in) operand again for every row. 4 x 2: 8
    accumulators and 6 loaded vectors hold 14 of the 16 vector registers of AVX2, the same on every
    x86-64 CPU. Measured (2-vCPU EPYC, two threads, generated kernels, medians of 15; ms without ->
    with): (32, 32768) @ (32768, 10) 0.68 -> 0.44, (8, 4096) @ (4096, 4096) 12.9 -> 5.9, (4, 4096) @
    (4096, 1024) 1.23 -> 0.70, (16, 16384) @ (16384, 64) 0.95 -> 0.53, (12, 3072) @ (3072, 768) the
    same; NumPy's OpenBLAS on the first four 0.51, 7.4, 1.55, 0.55-0.6 ms (the device times the BLAS
    against the generated kernel and runs the faster); on PoCL (OpenCL on the same CPU) the first
    two 4.46 -> 1.30 and 60.8 -> 10.5 ms. Applies where the lanes pass does not, to a kernel whose
    one reduction is a sum of a broadcast product (``contraction.candidate``) with at least two
    output axes of more than one element, every load in it streaming with step 0 or 1 along the
    innermost reduced axis, which is at least a vector of the widest lanes long, and whose operand
    shared by the rows (the reduction's length x the last axis, 4-byte elements) is at least
    ``tile_min_stream`` (1 MiB: from there it streams from beyond L2 for every row; ``dot_widths``)."""
    name = "dot lanes"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return not s.lanes and bool(dot_widths(ctx.root, len(ctx.root.walk()), ctx.options))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        widths = dot_widths(ctx.root, len(ctx.root.walk()), ctx.options)
        return replace(s, lanes=tuple(sorted(widths.items())), dot=True)

    def describe(self, s: Schedule) -> str:
        return ", ".join(f"axis {d} x{w}" for d, w in s.lanes)


def dot_widths(root: KNode, body: int, o: "LowerOptions | Capabilities") -> dict[int, int]:
    """The dot block of ``root`` (DotLanes) under ``o``'s widths and thresholds (the lowering's
    options, or a device's capabilities for the cost model: both carry ``dot_block``, ``lanes_last``,
    ``lane_body_max``, ``tile_min_stream``): {output axis: lanes} on the last two output axes with
    more than one element, each the largest divisor of the axis up to ``o.dot_block``'s width, the
    body's nodes times the lanes within ``o.lane_body_max``, and at least as many accumulators as
    loaded vectors (a x b >= a + b: 2 x 2, 3 x 2, 4 x 2); {} where the block does not apply. An
    axis whose size a trace holds as a symbol gets no lanes."""
    most_prev, most_last = o.dot_block
    if most_prev * most_last <= 1:
        return {}
    big = [d for d, n in enumerate(root.shape) if n > 1]
    red = candidate(root)
    if len(big) < 2 or red is None or not broadcast_product(red.src[0], lambda n: n.op, lambda n: n.src):
        return {}
    inner = max((d for d in red.arg if red.src[0].shape[d] > 1), default=None)
    if inner is None or red.src[0].shape[inner] < max(o.lanes_last):
        return {}
    # the operand the rows share (a Linear layer's weight: the reduction's length x the last axis)
    # must stream from beyond the cache, as for tiling; below, each row re-reads it from L2 and the
    # block's gain is small, while a new batch size that the block no longer divides would lower
    # (and compile) anew what it shared with the old one (a jitted MLP step at batch 29 after 64)
    steps = numel(tuple(red.src[0].shape[d] for d in red.arg))
    if not isinstance(steps, int) or steps * root.shape[big[-1]] * 4 < o.tile_min_stream:
        return {}
    var = f"r{id(red)}_{inner}"
    unit = False
    for n, idx, under in _output_loads(root):
        if under:
            step = _step(flat_index(idx, n.shape), var)
            if step not in (0, 1):
                return {}                  # a gather along the reduce loop: nothing to widen
            unit = unit or step == 1
    if not unit:
        return {}

    def most(n: int, w: int, other: int) -> int:
        if not isinstance(n, int):
            # a size that keeps changing (lower/trace.py traces it as a symbol): its divisibility
            # would pick the block, and each outcome be traced apart (a decode step's q @ k.T over
            # a cache of odd and even lengths)
            return 1
        return next(v for v in range(w, 0, -1) if n % v == 0 and body * v * other <= o.lane_body_max)
    b = most(root.shape[big[-1]], most_last, 1)
    a = most(root.shape[big[-2]], most_prev, b)
    if a * b < a + b:
        return {}
    return {big[-2]: a, big[-1]: b}


def lanes_apply(root: KNode, has_reduce: bool) -> bool:
    """The lanes pass's condition: a reduction below the root and a load it streams with unit stride
    along the last output axis with more than one element. (In a row-fused kernel, whose reductions
    the hoist pass renders once per row -- ``softmax(q @ k.T) @ v`` as one kernel --, the lanes are
    on that axis alone and run after the row's loops: ``row_lanes``.)"""
    big = [d for d, n in enumerate(root.shape) if n > 1]
    return bool(has_reduce and big) and contiguous_under_reduce(root, big[-1])


_private_cache = functools.cache(private_cache_bytes)       # (read from sysfs once)


def lane_pack(root: KNode, o: "LowerOptions | Capabilities") -> tuple[KNode, KNode] | None:
    """(a pack: an operand of ``root``'s contraction copied with the register lanes' axis innermost;
    ``root`` reading that operand back from buffer -1) where the lanes pass gives the contraction no
    lanes -- the operand streams along the lanes' axis with a stride, as ``q @ k.T`` reads k along
    its rows, each head-dim floats apart, and neither other pass (``dot_widths``) blocks it -- and
    the body read so gets them; None otherwise. Only an operand that is a view of one buffer, no
    larger than it, and re-read by at least as many output rows as the register block has
    (``lanes_prev``: a packed vector is then loaded once per block of rows, not once per row):
    attention's scores over 128 keys re-read each head's keys 128 times. The device's stage packs
    it (devices/cpustage.py), where it times the two against the BLAS. Measured on a 2-vCPU Xeon
    (Rocket Lake), (32, 12, 128, 32) @ its keys transposed: 6.1 ms generated without lanes, 3.9
    through the BLAS (384 calls), 0.5 + 1.6 ms packed (256 GFLOP/s).

    Not where the product's output for one batch index (its last two axes) outgrows a core's
    private cache (graph/caps.py ``private_cache_bytes``): the block's rows are then written to
    memory a row apart. Whole attention, packed against the better of the BLAS and the unpacked
    kernel, same machine (2 MiB of L2): 128 keys (64 KB of scores a head) 1.37-1.42 against
    1.86-1.97 ms, 256 keys 1.86-1.90 against 2.09-2.15, 512 (1 MB) 2.24-2.36 against 2.48-2.50;
    1024 keys (4 MB) 7.30-8.52 against 7.19-7.25, at head width 128 6.58-7.55 against 6.36-6.39 --
    where the device's timing of the two in isolation had favoured the packed kernel in one
    process of two."""
    red = candidate(root)
    if red is None or max(o.lanes_last, default=1) <= 1 or max(o.lanes_prev, default=1) <= 1 \
            or "lanes" in getattr(o, "disabled", ()) or not getattr(o, "register_lanes", True):
        return None                    # (a device without register lanes: nothing to pack for)
    # (the cheap conditions first, the lowering's dry runs last: a growing sequence's changed
    # products are asked at every step)
    big = [n for n in root.shape if n > 1]
    if len(big) < 2 or big[-2] * big[-1] * root.dtype.itemsize > _private_cache():
        return None
    if not broadcast_product(red.src[0], lambda n: n.op, lambda n: n.src):
        return None
    found = lanes_axis(root, lambda n: n.op, lambda n: n.arg, lambda n: n.src, lambda n: n.shape)
    if found is None or found[0] is not red:
        return None
    axis, prod = found[1], red.src[0]
    candidates = _packable(prod, axis, o)
    if not candidates or lanes_apply(root, True) or dot_widths(root, len(root.walk()), o):
        return None
    for f, u in candidates:
        pack, body = _packed(root, f, u, axis)
        # (and lanes it gets: no width divides 15 keys, the packed product would have none either)
        if lanes_apply(body, True) and lane_block(body, len(body.walk()), o.lanes_last, o.lanes_prev,
                                                  o.lane_body_max) != (1, 1):
            return pack, body
    return None


def _packable(prod: KNode, axis: int, o: "LowerOptions | Capabilities") -> list[tuple[KNode, KNode]]:
    """The factors ``f`` of product ``prod`` (with ``u``, ``f`` without its broadcast) that a pack
    with ``axis`` innermost may copy: a view of one buffer, no larger than it, that varies along
    ``axis`` and is re-read by at least as many rows as a register block has (``lanes_prev``: a
    packed vector is then loaded once per block of rows, not once per row; a decode step's one
    query would copy its keys to read them once)."""
    out = []
    for f in prod.src:
        u = f.src[0] if f.op == "EXPAND" else f
        if u.shape[axis] == 1 or numel(prod.shape) < max(o.lanes_prev) * numel(u.shape):
            continue
        leaf = u
        while leaf.op in GEMM_MOVES:          # (a view: the movement ops a GEMM operand may have)
            leaf = leaf.src[0]
        if leaf.op == "BUF" and numel(u.shape) <= numel(leaf.shape):
            out.append((f, u))
    return out


def _packed(root: KNode, f: KNode, u: KNode, axis: int, within: KNode | None = None) -> tuple[KNode, KNode]:
    """(the pack: ``u`` copied with ``axis`` innermost; ``root`` reading it back, where it read
    factor ``f`` -- only inside ``within`` where given --, from buffer -1)."""
    perm = tuple(d for d in range(len(u.shape)) if d != axis) + (axis,)
    pack = KNode("PERMUTE", (u,), perm, tuple(u.shape[d] for d in perm), u.dtype)
    back = KNode("PERMUTE", (KNode("BUF", (), -1, pack.shape, u.dtype),), tuple(perm.index(d) for d in range(len(perm))),
                 u.shape, u.dtype)
    if f.op == "EXPAND":
        back = KNode("EXPAND", (back,), f.arg, f.shape, f.dtype)
    if within is not None:
        return pack, root.replaced({id(within): within.replaced({id(f): back})})
    return pack, root.replaced({id(f): back})


def _row_entries(root: KNode, every: bool = False) -> tuple[tuple[int, tuple[KNode, ...]], ...]:
    """The hoist pass's entries for ``root`` before its last output loop (reductions once per row,
    not once per output element; ``every``: after it as well, once per output element, as the pass
    hoists them in a kernel without lanes): () at once where no reduction lies below the roots."""
    own = _own_reductions(root)
    if not any(n.op in REDUCES and id(n) not in own for n in root.walk()):
        return ()                 # a matmul's sum under its reshape: not a row's (no dry run)
    big = sum(1 for n in root.shape if n > 1)
    return tuple((k, ns) for k, ns in row_reductions(root, reduce_map(root)) if every or k < big)


def _own_reductions(root: KNode) -> set[int]:
    """The ids of the roots and of what each is through movement ops (a root's own reduction)."""
    own: set[int] = set(roots_of(root))
    for n in (root.src if root.op == GROUP else (root,)):
        if root.op == GROUP and row_output(n):
            continue                      # (a row statistic the kernel hoists, lower/merge.py absorb_rows)
        while n.op in MOVES:
            n = n.src[0]
        own.add(id(n))
    return own


def row_lanes(root: KNode) -> bool:
    """Whether the lanes of ``root``'s kernel are a row-fused kernel's: on the last output axis only
    (the axes before it are rows, each reduced in loops of their own before its outputs), as the one-axis
    block of ``caps.register_block`` -- a row of attention's output (64 values) is 4 vectors. So are
    the lanes of a contraction whose operand along that axis holds a reduction (``lane_shared``)."""
    return bool(_row_entries(root)) or bool(_lane_shared_covered(root))


def _lane_shared_covered(root: KNode) -> tuple[KNode, ...]:
    """``lane_shared`` where one-axis lanes cover the whole last axis (each element of the factor then
    computed once: attention's head dim); () where they would not (the block of two axes stays)."""
    shared = lane_shared(root)
    if not shared:
        return ()
    last = next(n for n in reversed(root.shape) if n > 1)
    return shared if register_block((last,), len(root.walk()), LANES_LAST, LANES_PREV, LANE_BODY_MAX)[0] == last else ()


def lane_shared(root: KNode) -> tuple[KNode, ...]:
    """The reductions below a factor of ``root``'s contraction that is broadcast exactly along the
    axis the lanes run along (the root's last; ``graph/plan.py lanes_axis`` finds it in the
    contraction through reshapes and permutes), whose lanes all read one element of that factor:
    the probabilities of attention's ``dv[j] = sum_i p[i, j] g[i]``, recomputed from the scores
    ``q[i] . k[j]`` where they are not stored -- autograd writes dv as ``(g.T @ p).T``, whose lanes
    run along the head dim, the contraction's first kept axis. With one-axis lanes over that whole
    axis (``row_lanes``) the lowering computes such a reduction once per element of the factor
    (``Lowerer.render_lanes``: one accumulator per distinct element its lanes read); a block of
    lanes over two axes computes it again for every block along the last one. Only where one of
    them has a value per element of the factor (below); () where there is none."""
    found = lanes_axis(root, lambda n: n.op, lambda n: n.arg, lambda n: n.src, lambda n: n.shape)
    if found is None:
        return ()
    n, axis = found
    if n.src[0].op != "MUL" or not any(x.op in REDUCES for x in n.src[0].walk()):
        return ()
    out: list[KNode] = []
    for f in n.src[0].src:
        if f.op != "EXPAND" or [d for d, (a, b) in enumerate(zip(f.src[0].shape, f.shape))
                                if a == 1 and b > 1] != [axis]:
            continue
        reds = [x for x in f.src[0].walk() if x.op in REDUCES]
        # only where one has a value per element of the factor (the scores, one per (query, key)):
        # a row's statistic inside it (a layer norm's mean in a weight gradient) is a value per row,
        # which a block of lanes over two axes computes once per block as it always has
        if any(numel(x.shape) >= numel(f.src[0].shape) for x in reds):
            out.extend(reds)
    return tuple(dict.fromkeys(out))


def rows_kept(root: KNode) -> bool:
    """Whether this lowering computes every reduction of a row-fused body once per row or once per
    output element: each is hoisted before the last output loop (``row_reductions``), lies inside a
    hoisted one (the row stash keeps what a later pass reads again), or is the root's own (reached
    from a root through movement ops). ``softmax(q @ k.T) @ v`` as one kernel: its max and sum
    are hoisted, the scores lie inside the max, the sum over keys is the root's. The cost model
    asks it (graph/caps.py ``rows_kept``) before it prices such a body so."""
    return _rows_answers(root)[0]


def row_dots_streamed(root: KNode) -> bool:
    """Whether every reduction a row-fused body keeps inside a hoisted one (``rows_kept``: the
    scores of attention as one kernel) reads each load it streams with unit stride along its
    innermost reduced axis, so that LLVM's loop vectorizer widens it along that axis (the scores'
    dot products: ~45 GFLOP/s a thread measured) -- not a strided or gathered loop (a convolution's
    gradient hoisted into a row-fused kernel: 3.7 GFLOP/s, what the cost model's ``unlaned`` charge
    is for). The cost model asks it (graph/caps.py ``rows_kept``) to price such a reduction."""
    return _rows_answers(root)[1]


def _rows_answers(root: KNode, blocked: bool = True) -> tuple[bool, bool, bool]:
    """(``rows_kept``, ``row_dots_streamed`` and ``row_dots_blocked`` where it holds): what
    graph/caps.py ``rows_kept`` answers the cost model, the hoist pass's dry run done once a body
    (``_rows_base``). ``blocked`` False: the third answer without the row-dots pass's dry run
    (``_dots_blocked``, a schedule of the body: most of the cost of the question; the cost model
    asks it only of a row's sums of products)."""
    base = _ROWS_BASE.get(root)
    if base is None:
        base = _ROWS_BASE.put(root, _rows_base(root))
    kept, streamed, own_blocked, dots = base
    return kept, streamed, own_blocked or (dots and blocked and _dots_blocked(root))


_ROWS_BASE = NodeMemo()


def _rows_base(root: KNode) -> tuple[bool, bool, bool, bool]:
    """``_rows_answers`` but the row-dots dry run: (kept, streamed, the kernel's own reduction's
    sums blocked, whether the row-dots question applies)."""
    own = _own_reductions(root)
    rows = [n for _, ns in _row_entries(root) for n in ns]
    if not rows and not lanes_apply(root, any(n.op in REDUCES for n in root.walk())):
        # no lanes: the hoist pass also hoists the reductions the last output loop indexes, once
        # per output element (a row's max for the sum over the row of attention's normalizer);
        # what it does not hoist varies along a reduction's loop and is computed in that loop, once
        # per iteration (g[i] . v[j] inside sum_j p[i, j] * dp[i, j]) -- or recomputed where its
        # value does not vary along it, which the cost model counts (a reduction evaluated more
        # often than it has elements is illegal)
        rows = [n for _, ns in _row_entries(root, every=True) for n in ns]
        if rows:
            return True, _dots_streamed(root, own, {id(n) for n in rows}), False, False
    # a contraction whose lanes share a factor with reductions inside (``lane_shared``) computes
    # each element of that factor once where the one-axis block covers the whole axis: what varies
    # along its own loop (attention's probabilities in dv, g[i] . v[j] in dq) included
    shared = _lane_shared_covered(root)
    # (a kernel without hoists: its own reduction's sums of products, root_dots)
    own_blocked = not rows and _own_dots_blocked(root, LowerOptions())
    if not rows and not shared:
        return False, False, own_blocked, False
    kept: set[int] = set()
    for r in (*rows, *shared):
        kept.update(id(x) for x in r.walk())
    if not all(id(n) in kept or id(n) in own for n in root.walk() if n.op in REDUCES):
        return False, False, own_blocked, False
    return True, _dots_streamed(root, own, {id(n) for n in rows}), own_blocked, bool(rows)


def row_dots_blocked(root: KNode) -> bool:
    """Whether a row-fused body's kept sums of products (``rows_kept``: the scores of attention as
    one kernel) are computed as register blocks by the row-dots pass (``RowDots``), as the body is
    or once the device has packed their operand (``row_pack``). The cost model asks it
    (graph/caps.py ``rows_kept``) to price them at the contraction rate."""
    return _rows_answers(root)[2]


def _sum_in_reduction(root: KNode) -> bool:
    """Whether a sum lies below another reduction of ``root`` (one walk)."""
    sums: dict[int, bool] = {}             # id -> a sum at or below the node
    for n in root.walk():                  # (sources before the nodes that read them)
        below = any(sums[id(x)] for x in n.src)
        if below and n.op in REDUCES:
            return True
        sums[id(n)] = below or n.op == "RSUM"
    return False


def _dots_blocked(root: KNode) -> bool:
    """Whether the row-dots pass computes *every* sum of products the row stash keeps as register
    blocks, as the body is or once the device has packed operands (``_row_pack``). One of several
    is not enough: when the device packed only k^T for the gradient of q alone as one kernel (which
    keeps the scores and ``g . v`` per row; v is read a head dim apart too), only the scores got
    blocks -- priced as if both had, it was predicted 7.4 ms against 17-23 measured, and chosen over
    the 4-kernel plan (10 ms predicted, 11.6-14 measured). Now both are packed; an operand that is
    not a view of one buffer still cannot be."""
    if not _sum_in_reduction(root):
        return False
    o = LowerOptions()
    s = schedule_kernel(Kernel("row_dots", 0, root, root.buffers()), o)
    if not _every_dot(root, s):
        packed = _row_pack(root, o, s) if row_lanes(root) else None
        if packed is None:
            return False
        _, root, s = packed
    return _every_dot(root, s)


def _every_dot(root: KNode, s: Schedule) -> bool:
    """Whether schedule ``s`` of ``root`` has row dots, and for every sum of products its row stash
    keeps (``_row_dot_reads``)."""
    dotted = {id(x) for x, _ in s.row_dots}
    return bool(dotted) and all(id(x) in dotted for x, *_ in _row_dot_reads(root, s, reduce_map(root)))


def _own_dots_blocked(root: KNode, o: LowerOptions) -> bool:
    """Whether the kernel's own reduction reads a sum of products along its loop that ``root_dots``
    computes as register blocks, as the body is or once the device has packed its operand
    (``_root_pack``): its loads along that loop keep their index or step by one, or one that does
    not is a factor the pack may copy. (The cost model's question, without the lowering's dry runs
    of the packed body: asked of every kernel the extractor prices under a memory bound.)"""
    return any((set(st) <= {0, 1} and 1 in st) or bool(_packable(x.src[0], a, o)) for x, a, st in _own_reads(root))


_OWN_READS = NodeMemo()


def _own_reads(root: KNode) -> tuple[tuple[KNode, int, tuple[int | None, ...]], ...]:
    """``_root_dot_reads`` of ``root`` as (value, axis, steps), worked out once per body: the
    lanes pass asks it (``row_block``) of each kernel the cost model prices, as does ``rows_kept``."""
    hit = _OWN_READS.get(root)
    if hit is None:
        hit = _OWN_READS.put(root, tuple((x, a, st) for x, _, a, st in _root_dot_reads(root)))
    return hit


def _dots_streamed(root: KNode, own: set[int], hoisted: set[int]) -> bool:
    for n in root.walk():
        if n.op not in REDUCES or id(n) in own or id(n) in hoisted:
            continue
        axes = [d for d in n.arg if n.src[0].shape[d] > 1]
        if not axes:
            continue
        var = f"_z{id(n)}_{axes[-1]}"
        start = tuple(Lin.var(f"_q{d}", s) for d, s in enumerate(n.shape))
        steps = [_step(flat_index(idx, x.shape), var)
                 for x, idx, _ in _dry_loads(n, start, "_z", lambda x, n=n: x is n or x.op not in REDUCES)]
        if None in steps or any(abs(c) > 1 for c in steps) or 1 not in steps:
            return False
    return True


def _dry_loads(start: KNode, idx: tuple[Lin, ...], tag: str,
               enter: Callable[[KNode], bool]) -> Iterator[tuple[KNode, tuple[Lin, ...], bool]]:
    """The loads (BUF nodes) below ``start`` with the index each is read at (a dry run of the index
    function, reductions' axes as ``tag`` variables) and whether a reduction lies on the way; the
    walk goes into a node only where ``enter`` says so."""
    stack: list[tuple[KNode, tuple[Lin, ...], bool]] = [(start, idx, False)]
    seen: set = set()
    while stack:
        n, ix, under = stack.pop()
        if (id(n), ix) in seen:
            continue
        seen.add((id(n), ix))
        if n.op == "BUF":
            yield n, ix, under
        elif enter(n):
            under = under or n.op in REDUCES
            stack.extend((x, cix, under) for x, cix in dry_sources(n, ix, tag))


def _windowed(root: KNode, axis: int) -> bool:
    """Does a load under a reduction read along output ``axis`` at an index that a reduce variable
    moves too (a window sliding along it: a convolution's ``x[.., h + kh, w + kw]``)?"""
    out = f"o{axis}"
    for n, idx, under in _output_loads(root):
        if under:
            for ix in idx:
                names = {a.name for a, _ in ix.terms if isinstance(a, Var)}
                if out in names and any(v.startswith("r") for v in names):
                    return True
    return False


def _output_loads(root: KNode) -> Iterator[tuple[KNode, tuple[Lin, ...], bool]]:
    """``_dry_loads`` of kernel body ``root`` at its output index (variables ``o0``, ``o1``, ...;
    reductions' axes ``r`` variables): each load, the index it is read at, whether under a reduction."""
    return _dry_loads(root, tuple(Lin.var(f"o{d}", n) for d, n in enumerate(root.shape)), "r", lambda n: True)


def _step(flat: Lin, var: str) -> int | None:
    """The step of a flat index along loop variable ``var`` (0 where it does not depend on it);
    None where ``var`` is inside a division or modulo (no constant step)."""
    step = 0
    for a, c in flat.terms:
        if isinstance(a, Var):
            if a.name == var:
                step += c
        elif var in substitute_free(a.x):
            return None
    return step


def lane_block(root: KNode, body: int, lanes_last: tuple[int, ...], lanes_prev: tuple[int, ...],
               body_max: int) -> tuple[int, int]:
    """The lanes pass's widths for ``root`` (its condition holding): ``register_block``, the second
    width for the axis ``block_axis`` picks; for a row-fused kernel, on the last axis alone and the
    row block (``row_block``, on the axis before it)."""
    return _lane_widths(root, body, lanes_last, lanes_prev, body_max)[:2]


def _lane_widths(root: KNode, body: int, lanes_last: tuple[int, ...], lanes_prev: tuple[int, ...],
                 body_max: int) -> tuple[int, int, int]:
    """``lane_block``'s widths and the axis the second one is on (-1 with none), worked out once."""
    big = [d for d, n in enumerate(root.shape) if n > 1]
    if row_lanes(root):
        w1, _ = register_block((root.shape[big[-1]],), body, lanes_last, lanes_prev, body_max)
        rows = row_block(root, _lane_nodes(root) * w1, lanes_prev, body_max) if w1 > 1 else 1
        return w1, rows, big[-2] if rows > 1 else -1
    # a contraction over windows along its last axis (a convolution's image rows) that no width
    # divides, or only one narrower than a vector, gets its largest divisor within a vector
    # (graph/caps.py register_block ``whole``): a convolution over a 7 x 7 image (32, 128 -> 128
    # channels) ran 123 ms without lanes, 3.2 with 7; 14 x 14 87 -> 2.1 ms, 30 x 30 177 -> 4.6 (15
    # lanes), 28 x 28 8.0 -> 3.8 (4 -> 14); on AVX2 (x86-64-v3) 14 x 14 3.4 ms (7 lanes). Only windows: an image's size is its layer's, where a product's last axis may be a
    # length that keeps changing, whose traces (lower/trace.py) one decision for every length that no
    # width divides keeps shared (a decision per length gave up tracing a matmul family of 14 sizes)
    def whole() -> bool:          # (a dry run of the body: only where no vector's width divides)
        return candidate(root) is not None and _windowed(root, big[-1])
    if len(big) < 2:
        return (*register_block(root.shape, body, lanes_last, lanes_prev, body_max, whole), -1)
    prev = block_axis(root)
    shape = tuple(root.shape[d] for d in big if d not in (prev, big[-1])) + (root.shape[prev], root.shape[big[-1]])
    return (*register_block(shape, body, lanes_last, lanes_prev, body_max, whole), prev)


def _lane_nodes(root: KNode) -> int:
    """The nodes a row-fused kernel renders once per lane of its last output axis: those read at an
    index that varies along that axis (a dry run of the index function), not entering a reduction
    that is not the root's own (a row's value, rendered once per row and read back). Attention as
    one kernel: the head dim's product with v and what follows it, not the probabilities, which
    every lane of a row reads alike (8 of its 36 nodes)."""
    big = [d for d, n in enumerate(root.shape) if n > 1]
    lane = f"o{big[-1]}"
    own = _own_reductions(root)
    seen: set = set()
    counted: set[int] = set()
    todo: list[tuple[KNode, tuple[Lin, ...]]] = [(root, tuple(Lin.var(f"o{d}", n) for d, n in enumerate(root.shape)))]
    while todo:
        n, ix = todo.pop()
        if (id(n), ix) in seen:
            continue
        seen.add((id(n), ix))
        if any(lane in substitute_free(i) for i in ix):
            counted.add(id(n))
        if n.op not in REDUCES or id(n) in own:
            todo.extend(dry_sources(n, ix, "_r"))
    return max(1, len(counted))


def row_block(root: KNode, body: int, lanes_prev: tuple[int, ...], body_max: int) -> int:
    """How many rows of a row-fused kernel with lanes (``row_lanes``; ``body``: the nodes it renders
    per output lane, ``_lane_nodes``, times the lanes on its last axis) the lowering reduces at
    once: where the kernel hoists reductions at its row loop (the output axis before the last), the
    largest divisor of the rows up to ``max(lanes_prev)``, and below their number, that keeps
    ``body`` x rows within ``body_max`` and each row-stash array (at most the longest reduction's
    extent a row) within ``ROW_STASH_MAX``; 1 otherwise.
    The hoisted reductions of a block's rows then run in one loop nest with one accumulator a row
    (``Lowerer.hoist``), so what the rows read alike is loaded once for all of them: attention as
    one kernel (``softmax(q @ k.T) @ v``, no score matrix) read all of K and V from cache once per
    query row -- a stream of L2 whatever the instructions; with 4 rows at once, once per 4.
    Measured (2-vCPU Intel Xeon, Rocket Lake, two threads, kernel time, heads 4): head dim 64, 1,024
    keys 15.2-15.7 -> 8.2 ms with 8 rows (4: 8.6-9.8, 2: 11.4-11.7), 256 keys 0.98 -> 0.58 ms; head
    dim 128, 1,024 keys 24.8 -> 14.1 ms (4: 16.0, 2: 18.1) -- 8 x 128 accumulator lanes spill on
    AVX-512 and still win.

    So, in a kernel without hoists, where the kernel's own reduction reads sums of products along
    its loop, read in order or at the row's own index along it (``root_dots``: attention's dq, dk
    and dv under a memory bound, each recomputing the scores of its row, once the device has packed
    their operands): the block's rows then share the loads of the row-dots blocks and of the
    reduction's loop (K and V for a query row's dq). Measured: see ``root_dots``."""
    big = [d for d, n in enumerate(root.shape) if n > 1]
    if len(big) < 2:
        return 1
    entries = _row_entries(root)
    if not any(k == len(big) - 1 for k, _ in entries) and \
            (entries or not any(set(st) <= {0, 1} and 1 in st for *_, st in _own_reads(root))):
        return 1
    rows = root.shape[big[-2]]
    longest = max((numel(n.src[0].shape) // max(1, numel(n.shape)) for n in root.walk() if n.op in REDUCES), default=1)
    # (fewer than all the rows: the row loop stays a loop, where the emitter hoists the reductions)
    return next((w for w in range(max(lanes_prev, default=1), 1, -1)
                 if rows % w == 0 and rows > w and body * w <= body_max and longest * w <= ROW_STASH_MAX), 1)


def block_axis(root: KNode) -> int:
    """The output axis of ``root`` (two or more of more than one element) that the register block's
    second lane axis runs along: the innermost one, before the last, along which every load that
    the reduction streams along the last axis (the vector-loaded operand) keeps its index, so that
    each vector it loads feeds one FMA per lane of that axis; the axis before the last where none
    does. A matmul's rows (B is read along the columns and not the rows) are that axis either way;
    a convolution's output channels, not its output rows (the input it loads along the output
    columns is read at other rows for other output rows, and at the same place for every output
    channel): 8 output channels x 32 columns loaded two input vectors and eight weights for 16
    FMAs, where 8 rows x 32 columns loaded 16 input vectors and one weight. Measured (2-vCPU Intel
    Xeon, Rocket Lake, two threads, medians of 10): conv2d of (32, 32, 32, 32) by (64, 32, 3, 3),
    padding 1, its kernel 7.2 -> 3.4 ms (168 -> 358 GFLOP/s)."""
    big = [d for d, n in enumerate(root.shape) if n > 1]
    last = f"o{big[-1]}"
    streamed = []
    for n, idx, under in _output_loads(root):
        if not under:
            continue
        flat = flat_index(idx, n.shape)
        if any(isinstance(a, Var) and a.name.startswith("r") for a, _ in flat.terms) and _step(flat, last) != 0:
            streamed.append(flat)
    for d in reversed(big[:-1]):
        if all(_step(f, f"o{d}") == 0 for f in streamed):
            return d
    return big[-2]


def block_of(root: KNode, caps: Capabilities) -> tuple[int, int]:
    """The register block (lanes on the last output axis, on the one before) a contraction with
    kernel body ``root`` runs with on a device with ``caps``, for the cost model (graph/caps.py
    ``block_of``; extract/evaluate.py prices a contraction by it): the lanes pass's condition and
    widths; where the pass gives none, the full block for a GEMM the BLAS would run at its rate --
    at least a block's width (16) in every dimension, one or a batch of them (BERT's batched
    15 x 15 x 32 products ran generated at 14-20 GFLOP/s, attention's 128 x 128 x 32 in the BLAS at
    100-150, though the lanes pass gives neither lanes), or one GEMM over all rows (a factor shared
    by every row: a Linear layer's weight); devices/cpustage.py times the BLAS against the
    generated kernel and runs the faster. The lanes are looked at first: the GEMM match is the
    costly part (resnet's extraction 0.25 -> 0.44 s when it came first)."""
    if not caps.register_lanes:
        return 1, 1
    if lanes_apply(root, any(n.op in REDUCES for n in root.walk())):
        block = lane_block(root, len(root.walk()), caps.lanes_last, caps.lanes_prev, caps.lane_body_max)
        if block != (1, 1):
            return block
    dot = dot_widths(root, len(root.walk()), caps)
    if dot:
        prev, last = sorted(dot)
        return dot[last], dot[prev]
    full = (max(caps.lanes_last), max(caps.lanes_prev))
    red = candidate(root)
    if red is not None and shared_factor(red.src[0], red.arg, lambda n: n.op, lambda n: n.src, lambda n: n.shape):
        return full
    found = find_contraction(root)
    if found is not None and min(found.gemm.m, found.gemm.n, found.gemm.k) >= full[0]:
        return full
    return 1, 1


def strided_loads(root: KNode) -> frozenset[int]:
    """The buffers (BUF ``arg``) kernel body ``root`` reads ``CACHE_LINE`` bytes or more apart from
    one element of its innermost output loop (its last axis of more than one element) to the next,
    outside any reduction -- each element a line of its own (graph/caps.py ``strided_loads``, which
    the cost model prices at the device's strided rate). A read whose step is not constant (an index
    through a division) is not counted. Measured (2-vCPU AMD EPYC, Zen 4): bench_model's copies and
    relu gradients permuted from NCHW to NHWC ran at 8-14 GB/s, cache blocks or not (``CacheBlocks``),
    whatever the cache held, where its other kernels' reads ran at 20-80."""
    roots = root.src if root.op == GROUP else (root,)
    big = [d for d, n in enumerate(root.shape) if n != 1]
    if not big:
        return frozenset()
    var = f"o{big[-1]}"
    found: set[int] = set()
    for r in roots:
        for n, idx, under in _output_loads(r):
            if under or n.arg in found:
                continue
            step = _step(flat_index(idx, n.shape), var)
            if step is not None and abs(step) * n.dtype.itemsize >= CACHE_LINE:
                found.add(n.arg)
    return frozenset(found)


register_block_rule(block_of)
register_rows_rule(_rows_answers)
register_strided_rule(strided_loads)


class Tiling(Pass):
    """Cache tiling of a two-axis register block (matmul-like). Loops are otherwise (outer
    blocks, inner blocks, reduce): every outer block streams the whole lane operand (B of A @ B)
    again, from DRAM once it outgrows the cache (matmul 2048: 16 MB per block row). Tiling loops
    (outer tiles, inner blocks, 8 outer blocks within the tile, reduce), so each strip of B is
    reused from cache by 8 blocks (``tile_blocks``; where 8 does not divide the outer blocks, their
    largest divisor below it: ``_blocks``). Applies to two lane axes with at least two tiles of
    outer blocks and 1 MB or more streamed per block (matmul 2048: a 2048 x 16 float strip)."""
    name = "tiling"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        up = s.lane_map
        if len(up) != 2 or s.dot or row_lanes(ctx.root):     # (a row block is not a matmul's)
            return False
        outer, inner = sorted(up)
        root = ctx.root
        if not self._blocks(root.shape[outer] // up[outer], ctx.options.tile_blocks):
            return False
        red = max((numel(n.src[0].shape) // max(1, numel(n.shape)) for n in root.walk() if n.op in REDUCES),
                  default=1)
        return red * root.shape[inner] * 4 >= ctx.options.tile_min_stream

    @staticmethod
    def _blocks(n_outer: int, most: int) -> int:
        """Outer blocks per tile: the largest divisor of ``n_outer`` up to ``most`` that leaves two
        tiles or more (0: none). Measured (2-vCPU Intel Xeon, Rocket Lake, two threads, the BLAS
        off): (480, 384) @ (384, 1536) -- 60 blocks of 8 rows, untiled while only 8 per tile was
        tried -- 124 -> 214 GFLOP/s with 6; (480, 1536) @ (1536, 384) 133 -> 223; 1000^3 (125
        blocks, 5 a tile) 86 -> 134; 1024^3 (8 a tile either way) the same."""
        return max((d for d in range(2, most + 1) if n_outer % d == 0 and n_outer >= 2 * d), default=0)

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        outer = min(s.lane_map)
        return replace(s, tile=(outer, self._blocks(ctx.root.shape[outer] // s.lane_map[outer], ctx.options.tile_blocks)))

    def describe(self, s: Schedule) -> str:
        return f"axis {s.tile[0]}, {s.tile[1]} blocks per tile" if s.tile else ""


class Hoist(Pass):
    """Row fusion: after each output loop opens, the reductions whose index depends only on the
    loops open so far are rendered there, each in its own loop, before the loop over the row's
    outputs, instead of once per output element; later reductions reuse earlier ones (the
    variance reads the mean). Measured: softmax and layernorm of (4096, 1024) are one kernel that
    reads x once from DRAM instead of 3 kernels reading it 3 times. Applies to kernels without
    register lanes that have a reduction below the root (what the extractor fused under
    ``row_fusion``: softmax, layernorm, ``x - x.max(-1)``)."""
    name = "hoist"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        tops = roots_of(ctx.root)
        if not any(n.op in REDUCES and id(n) not in tops for n in ctx.root.walk()):
            return False
        return not s.lanes or (s.tile is None and row_lanes(ctx.root))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        # with lanes (on the last axis, row_lanes), the rows are the loops before it
        rows = row_reductions(ctx.root, ctx.has_reduce)
        big = sum(1 for n in ctx.root.shape if n > 1)
        return replace(s, hoist=tuple((k, ns) for k, ns in rows if not s.lanes or k < big))

    def describe(self, s: Schedule) -> str:
        return "; ".join(f"{len(ns)} reduction(s) {'after output loop ' + str(k) if k else 'first'}"
                         for k, ns in s.hoist) or "nothing to hoist"


def row_reductions(root: KNode, has_reduce: dict[int, bool]) -> tuple[tuple[int, tuple[KNode, ...]], ...]:
    """The hoist pass's entries: (k, reductions rendered once per row after the k-th output loop
    opens), from a dry run of the emitter's loop opening (``hoist_points``)."""
    entries: list[tuple[int, list[KNode]]] = []
    for k, n, _ in hoist_points(root, has_reduce):
        if entries and entries[-1][0] == k:
            entries[-1][1].append(n)
        else:
            entries.append((k, [n]))
    return tuple((k, tuple(dict.fromkeys(ns))) for k, ns in entries)


def hoist_points(root: KNode, has_reduce: dict[int, bool]) -> list[tuple[int, KNode, tuple[Lin, ...]]]:
    """(k, reduction, the index it is rendered at) for each reduction the hoist pass renders once
    per row after the k-th output loop opens, in order: a dry run of the emitter's loop opening
    (open loops are o<d>, the ones to come _o<d>)."""
    idx = [Lin.var(f"_o{d}", n) for d, n in enumerate(root.shape)]
    done: set = set()
    out: list[tuple[int, KNode, tuple[Lin, ...]]] = []

    def at(k: int) -> None:
        for n, ix in hoistable(root, tuple(idx), has_reduce):
            if (id(n), ix) not in done:
                done.add((id(n), ix))
                out.append((k, n, ix))
    loops = 0
    for d, n in enumerate(root.shape):
        if n <= 1:
            idx[d] = Lin.num(0)
            continue
        loops += 1
        idx[d] = Lin.var(f"o{d}", n)
        at(loops)
    if loops == 0:
        at(0)                   # e.g. a full variance: the mean before the sum of squares
    return out


def _elementwise_below(n: KNode) -> list[KNode]:
    """``n`` and the nodes below it reached through elementwise ops only (rendered at ``n``'s index)."""
    out, seen, todo = [], set(), [n]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        if x.op in ELEMENTWISE:
            todo.extend(x.src)
    return out


def _flops(n: KNode) -> int:
    """Op-table flops per element of ``n``'s elementwise part (a reduction below is a row value)."""
    return sum(OPS[x.op].flops for x in _elementwise_below(n) if x.op in ELEMENTWISE)


class Stash(Pass):
    """Row fusion's shared values: a value that a hoisted row reduction reads elementwise and the
    root reads elementwise at the same element -- softmax's ``exp2((x - max) * log2 e)``, summed for
    the denominator and then divided by it -- is stored into the output row by the reduction's loop
    and loaded back by the loop over the row's outputs, instead of computed twice. One value per
    kernel (two would overwrite each other in the output), of the output's shape and dtype, costing
    at least ``STASH_MIN_FLOPS`` per element (a transcendental; not layernorm's ``x - mean``, which
    a load costs as much as). The emitter stores and loads only where the reduction's loop covers
    exactly the row the output loops have not opened (it checks the indices); elsewhere the value
    is computed as before. Applies to row-fused kernels whose output is not one of their inputs."""
    name = "stash"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return bool(s.hoist) and not s.lanes and ctx.kernel.out not in ctx.kernel.inputs

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        root = ctx.root
        at_root = {id(x) for x in _elementwise_below(root) if x is not root}
        best, cost = None, STASH_MIN_FLOPS - 1
        for _, reds in s.hoist:
            for r in reds:
                if r.src[0].shape != root.shape:
                    continue
                for x in _elementwise_below(r.src[0]):
                    if id(x) in at_root and x.shape == root.shape and x.dtype == root.dtype:
                        f = _flops(x)
                        if f > cost:
                            best, cost = x, f
        return replace(s, stash=best)

    def describe(self, s: Schedule) -> str:
        return f"{s.stash.op} stored by its row's reduction" if s.stash is not None else "nothing to stash"


class RowStash(Pass):
    """Row fusion's costly values that several of a row's passes read: the scores ``q . k`` of
    ``softmax(q @ k.T) @ v`` as one kernel, which the row's max, its sum and the output's
    contraction each read (a reduction nested in the row's passes), and the ``exp2`` that the sum
    and the contraction read. The first hoisted reduction that computes such a value over the row
    stores it into a local array (loop IR ``DEFLOCAL``: each thread's or work-item's own, of the
    row's length, at most ``ROW_STASH_MAX`` elements), and the row's later passes load it, instead
    of computing it in each -- so the scores are computed once per element and never written to
    memory (the kernel's memory is its inputs and outputs: O(s d), not O(s^2)). Candidates are the
    values (not the root, not a hoisted reduction, no bool) that contain a reduction or cost at
    least ``STASH_MIN_FLOPS``, read by at least two of the row's passes; the emitter stores one
    only where the reduction's loop runs over exactly the value's varying axes (its index there is
    those loop variables, the rest the open row loops: ``Lowerer._stash_layout``), and loads it
    only at the same row after that loop. Applies to row-fused kernels with such a value."""
    name = "row stash"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return bool(s.hoist) and bool(self._candidates(ctx, s))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        return replace(s, row_stash=self._candidates(ctx, s))

    def describe(self, s: Schedule) -> str:
        return f"{len(s.row_stash)} value(s) ({' '.join(n.op for n in s.row_stash)}) kept per row in a local array"

    @staticmethod
    def _candidates(ctx: PassCtx, s: Schedule) -> tuple[KNode, ...]:
        root = ctx.root
        hoisted = [n for _, ns in s.hoist for n in ns]
        stop = {id(n) for n in hoisted} | {id(root)}

        def reads(top: KNode) -> set[int]:
            """The nodes a pass renders: below ``top``, not inside another hoisted reduction."""
            out, todo = set(), [top]
            while todo:
                n = todo.pop()
                for x in n.src:
                    if id(x) not in out and id(x) not in stop:
                        out.add(id(x))
                        todo.append(x)
            return out
        passes = [reads(r) for r in hoisted] + [reads(root)]
        out = []
        for n in root.walk():
            if id(n) in stop or n.dtype is bool_ or n.op in ("BUF", "CONST") or s.stash is n:
                continue
            if sum(id(n) in p for p in passes) < 2:
                continue
            if n.op in REDUCES or (n.op in ELEMENTWISE and _flops(n) >= STASH_MIN_FLOPS):
                out.append(n)
        return tuple(out)


class RowDots(Pass):
    """Attention's scores as register blocks, in a row-fused kernel with lanes: a row-stash value
    that is a sum of products (``q . k``, one per key of a row) and whose loads, along the axis the
    row's array keeps (the keys), either keep their index (the row's own operand, q) or step by one
    element (the operand the rows share, k^T -- packed so first by the device's stage where it is
    not: ``row_pack``) is computed before the row's first pass as a register block: in a loop over
    that axis in steps of the last axis's lane width ``w``, a reduction with one accumulator a
    (row, key) for ``rows`` rows at a time (the block's rows, fewer where ``w x rows`` would
    outgrow the register block of ``lanes_last x lanes_prev``), each row's ``w`` keys one vector,
    and stored into the arrays (``Lowerer._row_dots``). Before it, each score was a dot product along
    the head dim, horizontally summed, one a key and row. Measured (2-vCPU AMD EPYC, Zen 4, two
    threads, kernel time): attention as one kernel, b1 h4 s1024 d64, 9.8-12.4 -> 0.2 (k packed) +
    6.4 ms; with k^T given, where the scores read k a row apart without the pass, 54.8 -> 6.5 ms.
    Applies where the row stash keeps such a value and its axis is a multiple of ``w``."""
    name = "row dots"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        if s.row_stash:
            return bool(s.lanes) and bool(self._found(ctx, s))
        return bool(root_dots(ctx.root, s, ctx.options))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        if s.row_stash:
            found = self._found(ctx, s)
            # the values the kernel's own reduction reads along its loop over the row-stash values
            # and the hoisted reductions, once those are known (softmax(q k^T)'s p = e / sum of
            # p @ v): a loop over the row each, before that reduction's loop
            held = tuple(s.row_stash) + tuple(n for _, ns in s.hoist for n in ns)
            return replace(s, row_dots=found, root_rows=root_rows(ctx.root, s, held) if found else ())
        dots = root_dots(ctx.root, s, ctx.options)
        block = max((r for _, _, r in dots), default=1) if not s.lanes else 1
        return replace(s, root_dots=dots, root_rows=root_rows(ctx.root, s, tuple(x for x, _, _ in dots)),
                       root_block=block if block > 1 else 0)

    def describe(self, s: Schedule) -> str:
        if s.root_dots:
            return f"{len(s.root_dots)} value(s) ({' '.join(n.op for n, _, _ in s.root_dots)}) of the kernel's own " \
                   f"reduction computed as register blocks of {', '.join(f'{w} x {r}' for _, w, r in s.root_dots)} " \
                   f"(elements x rows)" \
                   + (f", {len(s.root_rows)} value(s) over them ({' '.join(n.op for n in s.root_rows)}) a row at a time"
                      if s.root_rows else "")
        return f"{len(s.row_dots)} value(s) ({' '.join(n.op for n, _ in s.row_dots)}) computed as register blocks " \
               f"of {', '.join(str(r) for _, r in s.row_dots)} row(s)" \
               + (f", {len(s.root_rows)} value(s) over them ({' '.join(n.op for n in s.root_rows)}) that the kernel's "
                  "own reduction reads, a row at a time before its loop" if s.root_rows else "")

    @staticmethod
    def _found(ctx: PassCtx, s: Schedule) -> tuple[tuple[KNode, int], ...]:
        root = ctx.root
        big = [d for d, n in enumerate(root.shape) if n > 1]
        up = s.lane_map
        w = up.get(big[-1], 1) if big else 1
        if w < 2:
            return ()
        rows = up.get(big[-2], 1) if len(big) > 1 else 1
        budget = max(ctx.options.lanes_last) * max(ctx.options.lanes_prev)
        per = next(g for g in range(rows, 0, -1) if rows % g == 0 and (g * w <= budget or g == 1))
        # (an axis whose size a trace holds as a symbol gets no blocks: its divisibility would pick them)
        return tuple((x, per) for x, steps, n in row_dot_steps(root, s, ctx.has_reduce)
                     if set(steps) <= {0, 1} and 1 in steps and isinstance(n, int) and n % w == 0)


def _row_dot_reads(root: KNode, s: Schedule, has_reduce: dict[int, bool]) -> Iterator[tuple[KNode, tuple[Lin, ...], int]]:
    """(value, the index its row's first hoisted reduction reads it at, the one axis that reduction
    keeps of it) for each sum of products without reductions below that the row stash keeps."""
    hoisted = {id(n) for _, ns in s.hoist for n in ns}
    points = [(n, ix) for _, n, ix in hoist_points(root, has_reduce) if id(n) in hoisted]
    for x in s.row_stash:
        if x.op != "RSUM" or any(n.op in REDUCES for n in x.src[0].walk()):
            continue
        for red, ix in points:
            found = stash_layout(red, ix, x)
            if found is None:
                continue
            if len(found[1]) == 1:
                yield x, found[0], found[1][0]
            break


def row_dot_steps(root: KNode, s: Schedule, has_reduce: dict[int, bool]) -> list[tuple[KNode, tuple[int | None, ...], int]]:
    """For each row-stash sum of products ``_row_dot_reads`` finds: the step along the axis its row
    keeps of each load below it (0: the row's own operand; 1: read in order; None: no constant
    step), and that axis's size."""
    return [(x, _steps_along(x, xi, a), x.shape[a]) for x, xi, a in _row_dot_reads(root, s, has_reduce)]


def _steps_along(x: KNode, xi: tuple[Lin, ...], a: int) -> tuple[int | None, ...]:
    """The step of each load below ``x`` (read at ``xi``) along its axis ``a`` (0: an operand that
    keeps its index there; 1: read in order; None: no constant step)."""
    t = xi[:a] + (Lin.var("_t", x.shape[a]),) + xi[a + 1:]
    return tuple(_step(flat_index(idx, n.shape), "_t") for n, idx, _ in _dry_loads(x, t, "_z", lambda n: True))


def own_reduction(root: KNode) -> tuple[KNode, tuple[Lin, ...]] | None:
    """(the reduction a one-root kernel is, through movement ops; the index it is rendered at, open
    output loops ``o<d>``), or None."""
    if root.op == GROUP:
        return None
    n, ix = root, tuple(Lin.var(f"o{d}", sz) if sz > 1 else Lin.num(0) for d, sz in enumerate(root.shape))
    while n.op in MOVES:
        (n, ix), = dry_sources(n, ix, "_m")
    return (n, ix) if n.op in REDUCES else None


def own_reductions(root: KNode) -> list[tuple[KNode, tuple[Lin, ...]]]:
    """``own_reduction`` of each root of a kernel: its one root, or each of a GROUP's (a kernel with
    several outputs, lower/merge.py); empty where one of them is not a reduction."""
    found = [own_reduction(r) for r in (root.src if root.op == GROUP else (root,))
             if root.op != GROUP or not row_output(r)]
    return [] if None in found else found


def _root_dot_reads(root: KNode) -> Iterator[tuple[KNode, tuple[Lin, ...], int, tuple[int | None, ...]]]:
    """(value, the index the kernel's own reduction reads it at, the one axis that reduction's loop
    runs along, the step of each load below it along that axis) for each sum of products without
    reductions below that the kernel's own reduction reads at one index -- in a kernel with several
    outputs, each root's, each value once (a row's statistics merged: the scores that the max, the
    sum and ``sum(p * dp)`` read)."""
    seen: set[int] = set()
    for red, ix in own_reductions(root):
        for x in red.src[0].walk():
            if id(x) in seen or x.op != "RSUM" or x.src[0].op != "MUL" or any(n.op in REDUCES for n in x.src[0].walk()):
                continue
            lay = stash_layout(red, ix, x)
            if lay is None or len(lay[1]) != 1:
                continue
            seen.add(id(x))
            xi, (a,) = lay
            yield x, xi, a, _steps_along(x, xi, a)


def root_dots(root: KNode, s: Schedule, o: LowerOptions) -> tuple[tuple[KNode, int, int], ...]:
    """RowDots's values in a kernel without hoists (``Schedule.root_dots``): the sums of products
    that the kernel's own reduction reads along its loop (attention's backward, the scores ``q . k``
    and ``g . v`` of each query row's statistics and of dq, dk, dv recomputed under a memory bound)
    whose loads along that loop keep their index (the row's own operand) or step by one element
    (the operand the rows share, packed so by the device's stage: ``row_pack``). Each is computed
    for a whole row before the reduction's loop -- a loop over the row in steps of ``w`` elements,
    one accumulator an element, each ``w`` elements' products a vector FMA of a shared broadcast --
    into a local array that the loop then loads: before, each was a dot product along the head dim,
    horizontally summed, one an element of the row. ``w``: the lanes of the last output axis where
    they cover it (the values are then the same for every lane), else the register block of
    ``lanes_last x lanes_prev`` accumulators shared by a block of rows of the last axis (a kernel
    without lanes, one value a row: ``Schedule.root_block``); a group of the lanes' row block
    (``row_block``) computes its rows' values together, the loads of the shared operand once for all.
    Only where the row's values change with the innermost output loop (computed once a row) and the
    device has register lanes. Measured: docs/lowering.md, ``row dots`` (a kernel's own reduction)."""
    if s.hoist or s.row_stash or s.tile is not None or s.dot or s.blocks or "lanes" in o.disabled \
            or max(o.lanes_last, default=1) <= 1:
        return ()
    # (the reads first: under a trace, lower/trace.py, a size compared below is a guard of the trace)
    reads = list(_root_dot_reads(root))
    if not reads:
        return ()
    up = s.lane_map
    loops = [d for d, n in enumerate(root.shape) if n > 1 and n // up.get(d, 1) > 1]
    big = [d for d, n in enumerate(root.shape) if n > 1]
    if not loops or any(d != big[-1] and (len(big) < 2 or d != big[-2]) for d in up) \
            or (up and root.shape[big[-1]] != up.get(big[-1])):
        return ()                     # (lanes on the last axis, covering it, and a row block's)
    lanes = up.get(big[-1], 1)
    rows = up.get(big[-2], 1) if len(big) > 1 else 1
    vec = max(o.lanes_last)
    budget = vec * max(o.lanes_prev)
    # (each value's local array, a row of the reduction's extent for each row of the block, within
    # ROW_STASH_MAX: a thread's stack)
    n0 = reads[0][0].shape[reads[0][2]]
    if not up:
        # without lanes the last output axis is the rows': a block of them (``Schedule.root_block``;
        # none where a trace holds their number as a symbol)
        nr = root.shape[big[-1]]
        rows = next((r for r in sorted(o.lanes_prev, reverse=True) if isinstance(nr, int) and r > 1
                     and nr % r == 0 and nr > r and isinstance(n0, int) and row_array_cap(n0) * r <= ROW_STASH_MAX), 1)
    inner, lane_var = f"o{loops[-1]}", f"o{big[-1]}"
    out = []
    for x, xi, a, steps in reads:
        n = x.shape[a]
        free = {v for l in xi for v in substitute_free(l)}
        if not isinstance(n, int) or (lanes > 1 and lane_var in free) or inner not in free \
                or not set(steps) <= {0, 1} or 1 not in steps or row_array_cap(n) * rows > ROW_STASH_MAX:
            continue
        w = lanes if lanes > 1 else next((k for k in range(budget // rows, vec - 1, -vec) if n % k == 0), 0)
        if w > 1 and n % w == 0:
            # the rows of a group of the row block whose accumulators fit the register block
            per = next(g for g in range(rows, 0, -1) if rows % g == 0 and (g * w <= budget or g == 1))
            out.append((x, w, per))
    return tuple(out)


def root_rows(root: KNode, s: Schedule, held: tuple[KNode, ...]) -> tuple[KNode, ...]:
    """``Schedule.root_rows``: in a kernel whose lanes cover its last axis, the largest values above
    the values ``held`` (its root dots; or, in a row-fused kernel, its row-stash values and
    hoisted reductions) that the kernel's own reduction reads at one index
    along its loop, the same in every lane (no lane's variable in their index), with no other
    reduction below -- attention's ds = p * (dp - D) of dq and dk, p of dv: computed per element of
    the row in the reduction's loop, they were scalar code (an exp2 a key) beside the lanes' vector
    FMAs; and the forward's p = e / sum of p @ v, a scalar multiply and a broadcast between
    registers per key and row (measured from the machine code, 2-vCPU Intel Xeon with AVX-512:
    the p @ v loop took 42 % of attention_t128's kernel, its q k^T loop of as many FMAs 28 %)."""
    if not held or not s.lanes:
        return ()
    kept = {id(x) for x in held}
    lane_vars = {f"o{max(d for d, _ in s.lanes)}"}
    out: list[KNode] = []
    # (each root's: a GROUP's dk reads ds, its dv p, which ds holds -- both kept, p first)
    for red, ix in own_reductions(root):
        ok: dict[int, bool] = {}                 # id -> no reduction below but row-dots values
        for n in red.src[0].walk():
            ok[id(n)] = id(n) in kept or (n.op not in REDUCES and all(ok[id(x)] for x in n.src))
        cands = []
        for n in red.src[0].walk():
            if not ok[id(n)] or id(n) in kept or n.op in MOVES or n.op in ("BUF", "CONST") or n.dtype is bool_ \
                    or not any(id(x) in kept for x in n.walk()):
                continue
            lay = stash_layout(red, ix, n)
            if lay is None or len(lay[1]) != 1 or {v for l in lay[0] for v in substitute_free(l)} & lane_vars:
                continue
            cands.append(n)
        inside = {id(x) for n in cands for x in n.walk()[:-1]}
        out += [n for n in cands if id(n) not in inside and all(n is not m for m in out)]
    # a value before the values that hold it: its array is stored first and their loops load it
    return tuple(sorted(out, key=lambda n: len(n.walk())))


def row_pack(root: KNode, o: LowerOptions) -> tuple[tuple[KNode, ...], KNode] | None:
    """``lane_pack``'s answer for a row-fused kernel: (the packs, each an operand of a row-stash sum
    of products that the row's array keeps along an axis it reads with a stride -- attention's k,
    read along the keys a head dim apart, and v for ``g . v`` in the gradient of q --, copied with
    that axis innermost; ``root`` reading pack i back from buffer -1 - i) where that lets the
    row-dots pass compute more of the sums as register blocks (``RowDots``, ``_row_pack``); for a
    kernel without hoists, the packs its own reduction's sums need (``_root_pack``); None
    otherwise. Only an operand that is a view of one buffer (a GEMM operand's movement ops), as
    ``lane_pack``."""
    if "row dots" in o.disabled or "lanes" in o.disabled or max(o.lanes_last, default=1) <= 1:
        return None
    # (the cheap conditions first: a sum below another reduction -- a resized plan's kernels, new
    # bodies at each step of a growing sequence, are asked at every step)
    if not _sum_in_reduction(root):
        return None
    if row_lanes(root):
        s = schedule_kernel(Kernel("row_pack", 0, root, root.buffers()), o)
        if s.row_stash:
            found = _row_pack(root, o, s)
            return found[:2] if found is not None else None
    return _root_pack(root, o)


def _root_pack(root: KNode, o: LowerOptions) -> tuple[tuple[KNode, ...], KNode] | None:
    """``row_pack`` for a kernel's own reduction (``root_dots``): ((the packs, each an operand that a
    sum of products the reduction reads along its loop reads there with a stride, copied with that
    axis innermost -- k^T and v^T for a query row's scores and ``g . v``, q^T and g^T for a key
    row's --, then what the values over them read across the row with a stride -- a causal mask
    (i, j), which a key row's dk and dv read along the queries --), ``root`` reading pack i back
    from buffer -1 - i) where that gives the row-dots pass more values than it had; None otherwise."""
    if not any(not set(st) <= {0, 1} for *_, st in _own_reads(root)):
        return None
    before = len(schedule_kernel(Kernel("row_pack", 0, root, root.buffers()), o).root_dots)
    packs: list[KNode] = []
    body = root
    for find in (_strided_operand, _strided_row_load):
        while True:
            # (the packs made so far move one buffer down: the next one reads from -1)
            shifted = _packs_moved_down(body) if packs else body
            nxt = find(shifted, o)
            if nxt is None:
                break
            pack, body = _packed(shifted, *nxt)
            packs.insert(0, pack)
        if find is _strided_operand and \
                (not packs or len(schedule_kernel(Kernel("row_pack", 0, body, body.buffers()), o).root_dots) <= before):
            return None
    return tuple(packs), body


def _strided_operand(body: KNode, o: LowerOptions) -> tuple[KNode, KNode, int, KNode] | None:
    """(factor, what a pack copies of it, axis, the sum of products) for an operand that a sum the
    kernel's own reduction reads along its loop reads there with a stride (only inside that sum:
    attention's dq reads k along the head dim as well), not packed yet; None where there is none."""
    return next(((f, u, a, x) for x, _, a, st in _root_dot_reads(body) if not set(st) <= {0, 1}
                 for f, u in _packable(x.src[0], a, o) if min(b.arg for b in u.walk() if b.op == "BUF") >= 0), None)


def _strided_row_load(body: KNode, o: LowerOptions) -> tuple[KNode, KNode, int, KNode] | None:
    """(a buffer, itself, its axis, a ``root_rows`` value that reads it -- not inside a reduction --
    with its index along the value's row on that axis alone, not the buffer's last) or None."""
    s = schedule_kernel(Kernel("row_pack", 0, body, body.buffers()), o)
    found = own_reduction(body)
    if not s.root_rows or found is None:
        return None
    red, ix = found
    for y in s.root_rows:
        lay = stash_layout(red, ix, y)
        if lay is None or len(lay[1]) != 1:
            continue
        (yi, (a,)) = lay
        t = Lin.var("_t", y.shape[a])
        for n, idx, _ in _dry_loads(y, yi[:a] + (t,) + yi[a + 1:], "_z", lambda n: n.op not in REDUCES):
            if n.arg < 0:
                continue
            axes = [d for d, l in enumerate(idx) if "_t" in substitute_free(l)]
            big = [d for d, sz in enumerate(n.shape) if sz > 1]
            if len(axes) == 1 and idx[axes[0]] == t and axes[0] != big[-1]:
                return n, n, axes[0], y
    return None


def _packs_moved_down(body: KNode) -> KNode:
    """``body`` reading each pack made so far one buffer further down (-1 -> -2, ...): the next pack
    is then read from -1 (``_root_pack``, ``_row_pack``)."""
    return body.replaced({id(n): KNode("BUF", (), n.arg - 1, n.shape, n.dtype) for n in body.walk()
                          if n.op == "BUF" and n.arg < 0})


def _row_pack(root: KNode, o: LowerOptions, s: Schedule) -> tuple[tuple[KNode, ...], KNode, Schedule] | None:
    """``row_pack`` for ``root`` under its schedule ``s``: (the packs, pack i read back from buffer
    -1 - i; the packed body; its schedule). One operand at a time, each pack kept where it gives the
    row-dots pass more values than it had, until none does: the gradient of q alone as one kernel
    keeps the scores ``q . k`` and ``g . v`` per row, and both k and v are read a head dim apart
    along the keys -- with k^T packed alone, ``g . v`` stayed a horizontal dot product a key."""
    if not s.row_stash:
        return None
    packs: list[KNode] = []
    body, sched = root, s
    while True:
        # (the packs made so far move one buffer down: the next one reads from -1)
        if packs:
            shifted = _packs_moved_down(body)
            at = schedule_kernel(Kernel("row_pack", 0, shifted, shifted.buffers()), o)
        else:
            shifted, at = body, sched
        have = {id(x) for x, _ in at.row_dots}
        found = None
        for x, _, a in _row_dot_reads(shifted, at, reduce_map(shifted)):
            if x.src[0].op != "MUL" or id(x) in have:
                continue
            for f, u in _packable(x.src[0], a, o):
                if min(b.arg for b in u.walk() if b.op == "BUF") < 0:
                    continue                      # (a pack of a pack: not a view of one buffer)
                # (only inside the sum: the kernel's own reduction may read the operand too, with
                # unit stride along its lanes -- dq reads k along the head dim)
                pack, nb = _packed(shifted, f, u, a, within=x)
                packed = schedule_kernel(Kernel("row_pack", 0, nb, nb.buffers()), o)
                if len(packed.row_dots) > len(at.row_dots):
                    found = pack, nb, packed
                    break
            if found is not None:
                break
        if found is None:
            break
        packs.insert(0, found[0])
        body, sched = found[1], found[2]
    return (tuple(packs), body, sched) if packs else None


class BlockedSums(Pass):
    """Accuracy, every device: a float sum of more than 1024 values is summed in levels, each with
    its own accumulator (per lane): innermost blocks of 1024, levels of 32, an outermost level of
    fewer than 1024 iterations (long enough to share between threads or work-items); the rest of
    n in that mixed radix is summed in pieces of the same form (``sums.sum_pieces``). One
    accumulator over 1e6 x 0.1f lost 2.2e-4 (LLVM), 1e7 x 0.1f 6e-3 (OPENCL), and 1e9 expanded
    ones stopped at 2**28; blocked, at most 2142 roundings for n <= 2**31 (measured ~1e-5 worst,
    on constant data), the bound docs/semantics.md states and ``sums.sum_depth`` reads back off
    the loop IR. Applies to float sums of more than ``sum_block`` values."""
    name = "blocked sums"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return bool(self._long(ctx))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        return replace(s, blocked=self._long(ctx), sum_block=ctx.options.sum_block, sum_radix=ctx.options.sum_radix)

    def describe(self, s: Schedule) -> str:
        return f"{len(s.blocked)} sum(s), blocks of {s.sum_block}, levels of {s.sum_radix}"

    @staticmethod
    def _long(ctx: PassCtx) -> tuple[KNode, ...]:
        return tuple(n for n in ctx.root.walk() if n.op == "RSUM" and n.dtype.is_float
                     and numel(tuple(n.src[0].shape[d] for d in n.arg)) > ctx.options.sum_block)


class CacheBlocks(Pass):
    """Transposes in cache-line blocks: a copy of one buffer through movement ops (a permute of NCHW
    to NHWC) that reads it a page or more apart along its last output axis (``PAGE``) and in order
    along another output axis loops over blocks of both axes, a cache line's elements each (64
    bytes: 16 float32s), and within a block over the other axis, then the last: each line read is used for a
    whole block before it leaves the cache, where a row of the output read one element of each of
    its lines, a page apart, so that they shared a few L1 sets and TLB entries and were gone before
    the next row came back. Measured (2-vCPU AMD EPYC, Zen 4, kernel time): (32, 64, 32, 32) to
    (0, 2, 3, 1) 3.29 -> 1.39 ms (torch 3.0), (4096, 4096) transposed 63.2 -> 26.3 ms; with shorter
    strides the blocks lost -- (32, 32, 32, 64) to (0, 3, 1, 2), 256 bytes apart, 0.70 -> 3.05 ms,
    the k^T pack of (32, 12, 128, 32), 128 bytes apart, 0.31 -> 0.43 ms -- and are not made.
    Not where the copy also computes (a CNN step's relu gradient permuted to NHWC: 273 -> 681 us in
    blocks). Applies to copies whose output is larger than a core's private cache. Where the
    device's threads keep local arrays (``LowerOptions.block_tile``), the emitter copies each block
    through one (lowering.py ``_block_tile``): 1024 x 1024 transposed 3.04 -> 0.39 ms on one thread,
    (4096, 4096) 48.3 -> 30.7 ms (docs/lowering.md)."""
    name = "cache blocks"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return not s.lanes and not s.hoist and bool(self._blocks(ctx.root, ctx.options))

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        return replace(s, blocks=self._blocks(ctx.root, ctx.options))

    def describe(self, s: Schedule) -> str:
        return ", ".join(f"axis {d} in blocks of {b}" for d, b in s.blocks)

    @staticmethod
    def _blocks(root: KNode, o: LowerOptions) -> tuple[tuple[int, int], ...]:
        big = [d for d, n in enumerate(root.shape) if n > 1]
        # (a copy: movement ops over one buffer -- with a compare and a select on top, a CNN step's
        # relu gradient permuted to NHWC ran 273 -> 681 us in blocks)
        if len(big) < 2 or any(n.op not in MOVES and n.op != "BUF" for n in root.walk()) or len(root.buffers()) != 1:
            return ()
        least = _private_cache() if o.block_bytes < 0 else o.block_bytes
        if not all(isinstance(n, int) for n in root.shape) or numel(root.shape) * root.dtype.itemsize <= least:
            return ()
        last = big[-1]
        line = max(1, CACHE_LINE // root.dtype.itemsize)
        for n, idx, _ in _output_loads(root):
            flat = flat_index(idx, n.shape)
            step = _step(flat, f"o{last}")
            if step is None or abs(step) * n.dtype.itemsize < o.block_stride:
                continue
            a = next((d for d in reversed(big[:-1]) if _step(flat, f"o{d}") == 1), None)
            if a is None:
                continue
            ta = max(w for w in range(1, line + 1) if root.shape[a] % w == 0)
            tb = max(w for w in range(1, line + 1) if root.shape[last] % w == 0)
            if ta > 1 and tb > 1:
                return ((a, ta), (last, tb))
        return ()


class Parallel(Pass):
    """The leading output loops whose iterations are independent (loop IR ``parallel``): every
    output loop, or in a row-fused kernel the loops before the first hoisted reduction (the rows),
    or in a copy whose cache blocks go through a local array the loops over the blocks.
    The LLVM device cuts the outermost of them into chunks that threads take in turn (four per
    thread: two contiguous halves made a row-fused layernorm of 4096 rows slower on two threads
    than on one, 2.1 vs 1.6 ms, chunks 0.84-0.94 ms); GPUs map them to work-items. Applies to
    kernels with an output loop."""
    name = "parallel"

    def applies(self, ctx: PassCtx, s: Schedule) -> bool:
        return output_loops(ctx.root.shape, s) > 0

    def run(self, ctx: PassCtx, s: Schedule) -> Schedule:
        first = min((k for k, _ in s.hoist if k >= 1), default=None)
        if first is None:
            first = output_loops(ctx.root.shape, s) - (2 if tiled_blocks(ctx.root.shape, s, ctx.options) else 0)
        return replace(s, parallel=first)

    def describe(self, s: Schedule) -> str:
        return f"{s.parallel} loop(s)"


PASSES: tuple[Pass, ...] = (SplitReductions(), Lanes(), DotLanes(), Tiling(), Hoist(), Stash(), RowStash(),
                            RowDots(), CacheBlocks(), BlockedSums(), Parallel())
PASS_NAMES: tuple[str, ...] = tuple(p.name for p in PASSES)


@dataclass(frozen=True)
class Step:
    """One pass run on one kernel: whether it applied (``off``: switched off) and the schedule after it."""
    name: str
    status: str                 # "applied" | "skipped" (its condition did not hold) | "off"
    schedule: Schedule
    detail: str = ""


def run_passes(kernel: Kernel, options: LowerOptions | None = None, stage: str = "kernel") -> list[Step]:
    """Run the passes of ``stage`` ("kernel" or "plan") on ``kernel`` in order; every step's schedule."""
    if stage not in ("kernel", "plan"):
        raise ValueError(f"run_passes: expected stage 'kernel' or 'plan', got {stage!r}")
    options = options or LowerOptions()
    ctx = PassCtx(kernel, options)
    s = Schedule()
    steps = []
    for p in PASSES:
        if p.stage != stage:
            continue
        if p.name in options.disabled:
            steps.append(Step(p.name, "off", s))
        elif p.applies(ctx, s):
            s = p.run(ctx, s)
            steps.append(Step(p.name, "applied", s, p.describe(s)))
        else:
            steps.append(Step(p.name, "skipped", s))
    return steps


def schedule_kernel(kernel: Kernel, options: LowerOptions | None = None) -> Schedule:
    """The schedule the kernel passes give ``kernel``."""
    steps = run_passes(kernel, options)
    return steps[-1].schedule if steps else Schedule()


def describe_steps(kernel: Kernel, steps: list[Step]) -> str:
    """The ``DEBUG>=5`` lines: which passes applied to a kernel, and what each decided."""
    lines = [f"--- passes {kernel.name}"]
    for st in steps:
        lines.append(f"  {st.name:<17}{st.status}{': ' + st.detail if st.detail else ''}")
    return "\n".join(lines)


# ------------------------------------------------------------------ helpers of the passes

def output_loops(shape: tuple[int, ...], s: Schedule) -> int:
    """How many output loops the emitter opens under ``s`` (an axis of 1 element, or one whose
    lanes cover it, has none; a tile adds its inner loop)."""
    up = s.lane_map
    n = sum(1 for d, sz in enumerate(shape) if sz > 1 and sz // up.get(d, 1) > 1)
    return n + (1 if s.tile is not None else 0) + sum(1 for d, b in s.blocks if 1 < b < shape[d])


def tiled_blocks(shape: tuple[int, ...], s: Schedule, o: LowerOptions) -> bool:
    """Whether the emitter copies each cache block (``CacheBlocks``) through a local array
    (``Lowerer._block_tile``): where the blocks split two axes and the device's threads keep local
    arrays (``LowerOptions.block_tile``). Its inner loops then do not enclose the copy's first
    loops, so they are not parallel loops (``Parallel``)."""
    return o.block_tile and sum(1 for d, b in s.blocks if 1 < b < shape[d]) == 2


def contiguous_under_reduce(root: KNode, axis: int) -> bool:
    """Does some buffer read inside a reduction step by exactly 1 along output ``axis``, and none
    by more? (A dry run of the index function, with symbolic output and reduce variables.) A load
    streamed with a larger step along the lane axis is a gather per lane: a sum over axes (0, 2, 3)
    of a (32, 32, 16, 16) relu mask times a (32, 32, 1, 1) broadcast got lanes along the channels
    (the broadcast steps by 1 there, the mask by 256) and ran in 233 us, predicted 18 at the
    contraction rate; the same sum of a contiguous tensor ran in 92."""
    target = f"o{axis}"
    unit = False
    for n, idx, under in _output_loads(root):
        if not under:
            continue
        flat = flat_index(idx, n.shape)
        # only a load streamed by the reduce loop counts (not a broadcast operand like a max)
        if any(isinstance(a, Var) and a.name.startswith("r") for a, _ in flat.terms):
            steps = [c for a, c in flat.terms if isinstance(a, Var) and a.name == target]
            if any(abs(c) > 1 for c in steps):
                return False
            unit = unit or 1 in steps
    return unit
