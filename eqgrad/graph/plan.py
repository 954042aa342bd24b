"""The kernel plan: what runs. Shared by extraction (which builds it), lowering and the devices.

A kernel is a root of the program or a chosen ``Realize``; its body (a DAG of ``KNode``) is made of
the chosen nodes reachable from it without crossing a ``Realize``/``Buf``/``Const`` (those become
loads and constants). Buffers are numbered: the realize's inputs first, then one per kernel.
"""
from __future__ import annotations

import json
import math
import re
import struct
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from eqgrad.dtype import DTYPES, DType
from eqgrad.graph.walk import topological
from eqgrad.ops import MOVEMENT_OPS, OPS, Shape

_BASE = re.compile(r"k\d+")


def plan_kernel_name(name: str) -> str:
    """The plan kernel a device runs a kernel named ``name`` for: its pieces ("k4g" the BLAS call,
    "k4p0" a packed operand, "k4a" a split reduction's partials) are k4's, a merge of siblings
    ("k3+k4") is the first's; any other name is its own."""
    m = _BASE.match(name)
    return m.group(0) if m else name


# the launch after a stream (extract/cost.py) turns cold over a range of the streaming kernel's
# bytes, not at one size: a one-element kernel after a copy of 0.12-0.75 MiB ran 2.7-3.3 us (2.3 in a
# tight loop), after 1, 1.5, 2 and 3 MiB 4.6, 9.7, 12.5 and 18.7, and after 4-32 MiB 18-23 (2-vCPU
# Intel Xeon, Rocket Lake, 2 MiB of L2 a core; with one thread 3.1, 4.0, 13.3, 16.8): the
# interpreter's working set is evicted bit by bit as the stream outgrows what the L2 keeps beside
# it. So the share of ``cold`` a kernel charges rises linearly from STREAM_FROM to STREAM_TO times
# ``stream_bytes`` (the L2). Against the step at the L2 it replaced, bench/bench_model.py's kernels
# within 2x went from 144 to 147 of 158 (defaults) and 147 to 151 (calibrated), the training steps'
# small kernels after 0.7-1.7 MB kernels (10-24 us against 3-6 alone) no longer missed.
STREAM_FROM = 0.5          # docs/lowering.md, Constants
STREAM_TO = 1.5            # docs/lowering.md, Constants


def stream_share(nbytes: float, stream_bytes: int) -> float:
    """The share (0 to 1) of the ``cold`` term (extract/cost.py, launch after a stream) a kernel that
    moves ``nbytes`` makes the launch after it pay: 0 up to ``STREAM_FROM * stream_bytes``, 1 from
    ``STREAM_TO * stream_bytes``, linear between (``stream_bytes`` 0: no kernel does). The one rule
    the cost model, the devices' per-kernel predictions and calibration read."""
    if stream_bytes <= 0:
        return 0.0
    x = (nbytes - STREAM_FROM * stream_bytes) / ((STREAM_TO - STREAM_FROM) * stream_bytes)
    return 0.0 if x <= 0 else (1.0 if x >= 1 else x)


def cold_words(cold: float, stream_bytes: int) -> str:
    """The launch-after-a-stream term in words (explain(), calibration, bench/bench_model.py)."""
    mib = stream_bytes / 2 ** 20
    return (f"up to {cold * 1e6:.1f} us more a launch after a kernel of more than {STREAM_FROM * mib:g} MiB "
            f"(all of it from {STREAM_TO * mib:g} MiB)")


def lru_entry(entries: Any, key: Any, make: Callable[[], Any], limit: int) -> Any:
    """The entry of ``key`` in the OrderedDict ``entries``, made by ``make()`` if new, now the most
    recently used; the least recently used are dropped past ``limit`` (the caller holds any lock)."""
    entry = entries.get(key)
    if entry is None:
        entry = entries[key] = make()
        while len(entries) > limit:
            entries.popitem(last=False)
    entries.move_to_end(key)
    return entry


class NodeMemo:
    """What is worked out once per plan node (a body is immutable), kept beside the node and never
    written onto it: keyed by the node (``KNode`` hashes and compares by identity, in C) and
    bounded twice over. The key is weak, so an entry goes when its node does -- a long-running
    process that plans thousands of programs keeps only the entries of the bodies still alive --
    and the memo is emptied at ``limit`` entries, the guard for a value that holds its own node
    (a weak key cannot free that entry: its value keeps the node alive). So a value must not hold
    its node: ``walk`` keeps a node's sources, not the node. A memo that depends on more than the
    node (a device's settings) keeps that in its value and checks it, as before."""
    __slots__ = ("_data", "limit")

    def __init__(self, limit: int = 1 << 16) -> None:
        self._data: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.limit = limit

    def get(self, node: Any) -> Any:
        """The value kept for ``node``, or None."""
        return self._data.get(node)

    def put(self, node: Any, value: Any) -> Any:
        """Keep ``value`` for ``node`` (emptying the memo first when it is full); returns it."""
        if len(self._data) >= self.limit:
            self._data.clear()
        self._data[node] = value
        return value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()


class _Sized:
    """What SizeFloat and SizeInt share: the value, remembering the program's ``size`` it was made
    from, through construction and pickling."""
    __slots__ = ()
    _base: type = float

    def __new__(cls, value: float | int, size: int):
        x = super().__new__(cls, value)
        x.size = int(size)
        return x

    def __reduce__(self):
        return (type(self), (self._base(self), self.size))


class SizeFloat(_Sized, float):
    """A CONST's value that is a size of the program (a ``Size`` e-node that extraction made a CONST:
    expand-sum's ``x * n``): the float it is, remembering ``size``, the program's size it was made
    from, so that a plan resized for new sizes (graph/resize.py) gives it the new size. It compares,
    hashes, prints and computes as the float; only ``is_size`` and the plan's JSON tell it apart."""
    __slots__ = ("size",)


class SizeInt(_Sized, int):
    """``SizeFloat`` for an integer dtype's CONST (an int subclass cannot have slots)."""
    _base = int


def size_value(value: float | int, size: int) -> "SizeFloat | SizeInt":
    """A CONST's value ``value`` (already in its dtype) that is the program's size ``size``."""
    return SizeInt(value, size) if isinstance(value, int) else SizeFloat(value, size)


def is_size(v: Any) -> bool:
    """Is the CONST value ``v`` a size of the program (``size_value``)?"""
    return isinstance(v, (SizeFloat, SizeInt))


_WALKS = NodeMemo()       # node -> its walk without itself (the node is the walk's last)


@dataclass(frozen=True, eq=False)
class KNode:
    """A node of a kernel body. ``BUF``'s arg is a plan buffer id; ``CONST``'s is its scalar."""
    op: str
    src: tuple["KNode", ...]
    arg: Any
    shape: Shape
    dtype: DType

    def __init__(self, op: str, src: tuple["KNode", ...], arg: Any, shape: Shape, dtype: DType) -> None:
        # the fields written straight into the instance's dict: a frozen dataclass's generated
        # __init__ sets each through object.__setattr__ (620 against 290 ns a node; resizing,
        # lowering and the device's rewrites build thousands of nodes a plan)
        d = self.__dict__
        d["op"], d["src"], d["arg"], d["shape"], d["dtype"] = op, src, arg, shape, dtype

    def walk(self) -> list["KNode"]:
        """Topological order (sources first), each node once. Worked out once per node (a body is
        immutable; resizing, lowering, its passes and the checks each walk a kernel's body: 1,300
        walks to lower a 300-kernel corpus), kept in ``_WALKS`` without the node itself (the
        walk's last: a memo's value must not hold its key); a new list each call."""
        order = _WALKS.get(self)
        if order is None:
            order = _WALKS.put(self, topological([self], lambda n: n.src)[:-1])
        return [*order, self]

    def known_walk(self, order: list["KNode"]) -> None:
        """Keep ``order`` (this node last) as this node's walk: a body built node for node from
        another body of the same structure (graph/resize.py) has that body's walk, mapped --
        ``topological`` depends on the structure only -- so its first walk is not worked out again."""
        if order and order[-1] is self and self.src and _WALKS.get(self) is None:
            _WALKS.put(self, order[:-1])

    def replaced(self, by: dict[int, "KNode"]) -> "KNode":
        """This body with each node whose id is in ``by`` replaced by its value (the nodes above
        rebuilt, the rest shared)."""
        memo = dict(by)
        for n in self.walk():
            if id(n) not in memo:
                srcs = tuple(memo[id(s)] for s in n.src)
                memo[id(n)] = n if srcs == n.src else KNode(n.op, srcs, n.arg, n.shape, n.dtype)
        return memo[id(self)]

    def buffers(self) -> tuple[int, ...]:
        """The plan buffers this body reads, in first-use order (a kernel's ``inputs``)."""
        return tuple(dict.fromkeys(n.arg for n in self.walk() if n.op == "BUF"))

    def render(self) -> str:
        """A readable one-line form, e.g. ``MUL(ADD(b0, b1), 2.0)``. A computed node read more than
        once in the body is written once, as ``t0`` after ``where``: ``MUL(t0, t0) where t0 =
        ADD(b0, b1)`` -- written out at every use, square-and-multiply's 31 squarings (``x ** y``
        of integers) made a string of 2**31 leaves and DEBUG=2 ran for minutes."""
        order = self.walk()
        uses: dict[int, int] = {}
        for n in order:
            for s in n.src:
                uses[id(s)] = uses.get(id(s), 0) + 1
        memo: dict[int, str] = {}
        lets: list[str] = []
        for n in order:
            if n.op == "BUF":
                memo[id(n)] = f"b{n.arg}"
            elif n.op == "CONST":
                memo[id(n)] = repr(n.arg)
            else:
                a = "" if n.arg is None else f", {n.arg.name if isinstance(n.arg, DType) else n.arg}"
                text = f"{n.op}({', '.join(memo[id(s)] for s in n.src)}{a})"
                if uses.get(id(n), 0) > 1:
                    lets.append(f"t{len(lets)} = {text}")
                    text = f"t{len(lets) - 1}"
                memo[id(n)] = text
        return memo[id(self)] + (f" where {'; '.join(lets)}" if lets else "")


@dataclass(frozen=True)
class KernelStats:
    """What the cost function sees of one kernel (extract/cost.py: its form and units): the bytes it
    moves, its FLOPs, its body's nodes, of those FLOPs the root contraction's (``cflops``), and that
    contraction's rate as a share of a register-blocked one's (``fill``; above 1 where the device's
    library GEMM runs it faster, whose FLOP/s are then ``library``, else 0). A plan kernel keeps the
    stats it was priced from (``Kernel.stats``), so calibration fits the cost function itself.
    ``passes``: the loops a row-fused kernel runs over its rows -- each of its rows' reductions
    once per row, and the output once per row (extract/cost.py, row passes); 0 for any other.
    ``hot``: of ``nbytes``, the bytes it reads that the kernels just before it in its plan left in
    the cache (``KernelPlan.cache_reads``; extract/cost.py, reads from cache): 0 in extraction, which
    does not know the order kernels run in; set on a plan's kernels by ``cost.in_order``.
    ``strided``: of ``nbytes``, the bytes it reads a cache line or more apart along its innermost
    output loop (graph/caps.py ``strided_loads``; extract/cost.py, strided reads), never from cache."""
    nbytes: float
    flops: float
    nodes: int
    cflops: float = 0.0
    fill: float = 1.0
    library: float = 0.0
    passes: float = 0.0
    hot: float = 0.0
    strided: float = 0.0


@dataclass
class Kernel:
    name: str
    out: int                      # buffer id written
    ast: KNode
    inputs: tuple[int, ...]       # buffer ids read, in first-use order
    predicted: float = 0.0        # cost model seconds
    nbytes: int = 0
    flops: int = 0
    kind: tuple[str, ...] = ()    # what the cost model took the lowering to do (KERNEL_KINDS), sorted
    # what the cost function priced the plan kernel from (None: not priced, e.g. built by hand); the
    # pieces the device runs a plan kernel as (its GEMM, a split reduction's partials) keep it
    stats: KernelStats | None = None
    # the seconds its prediction is less where it runs, in its plan's order, for its reads from cache
    # (``stats.hot``; extract/cost.py ``in_order``): ``KernelPlan.in_context`` takes them off
    warm: float = 0.0
    # more buffers written, by a kernel whose body is a GROUP of roots (one per output: ``out`` the
    # first root's, these the others', in order) that share the output loops (a device's stage
    # merges sibling kernels so, lower/merge.py)
    also: tuple[int, ...] = ()

    @property
    def params(self) -> tuple[int, ...]:
        """The buffers its code takes, in parameter order: those it writes (``out``, then ``also``),
        then those it reads (``inputs``)."""
        return (self.out, *self.also, *self.inputs) if self.also else (self.out, *self.inputs)

    @property
    def outs(self) -> tuple[int, ...]:
        return (self.out, *self.also)


# The root of a kernel with several outputs: its sources are the roots, one per output buffer, all of
# one shape (the GROUP's); it is not an op of the table (ops.py) and never in a program or an e-graph
GROUP = "GROUP"


# The kinds of kernel the cost model tells apart (extract/evaluate.py records them as
# ``KernelCost.kind``; lower/classify.py says which the lowering builds): "row-fused" (a reduction
# rendered once per row before the innermost output loop), "contraction" (a root contraction at the
# contraction rate: register lanes or the BLAS), "unlaned" (a contraction inside a row-fused kernel's
# passes, charged ``unlaned``), "masked" (a pad read inside a reduction loop, charged ``masked_read``)
KERNEL_KINDS = ("row-fused", "contraction", "unlaned", "masked")

_MOVEMENT = frozenset(MOVEMENT_OPS)


def broadcast_product(prod: Any, op: Callable[[Any], "str | None"], srcs: Callable[[Any], tuple]) -> bool:
    """Is ``prod`` a product one of whose factors is a broadcast (an Expand under movement ops only)?
    A sum of such a product is what both the cost model (extract/evaluate.py) and the lowering's
    classifier (lower/classify.py) call a *contraction* -- a matmul, a convolution: an operand
    reused along an axis the other one spans -- and price at the contraction rate (register lanes or
    the BLAS). A sum of a product without one (``sum(x * x)``) is a plain reduction, streamed. The
    one definition for both: nodes are handles, ``op(h)`` their op (None: not known here, e.g. a
    buffer) and ``srcs(h)`` their sources, so the e-graph's classes and a kernel's KNodes both work."""
    if op(prod) != "MUL":
        return False
    for f in srcs(prod):
        while True:
            o = op(f)
            if o == "EXPAND":
                return True
            if o not in _MOVEMENT:
                break
            f = srcs(f)[0]
    return False


def lanes_axis(root: Any, op: Callable[[Any], "str | None"], arg: Callable[[Any], Any], srcs: Callable[[Any], tuple],
               shape: Callable[[Any], tuple[int, ...]]) -> "tuple[Any, int] | None":
    """The sum a kernel's root reaches through reshapes and permutes, and which axis of it (of its
    source: a sum keeps its reduced axes, as ones) the root's last axis with more than one element
    -- the axis register lanes run along -- is; None where the root reaches no sum so, or a
    reshape does more than add or drop axes of one element. The one mapping for the cost model
    (extract/evaluate.py, on the e-graph's classes) and the lowering (lower/passes.py
    ``lane_shared``, on KNodes); handles as in :func:`broadcast_product`, ``arg(h)`` a node's
    attribute (a permute's order)."""
    s = shape(root)
    big = [d for d, n in enumerate(s) if n > 1]
    if not big:
        return None
    n, axis = root, big[-1]
    while op(n) in ("RESHAPE", "PERMUTE"):
        src = srcs(n)[0]
        if op(n) == "PERMUTE":
            axis = arg(n)[axis]
        else:
            s_out, s_in = shape(n), shape(src)
            if [a for a in s_in if a != 1] != [b for b in s_out if b != 1] or s_out[axis] == 1:
                return None
            axis = [d for d, a in enumerate(s_in) if a != 1][[d for d, b in enumerate(s_out) if b != 1].index(axis)]
        n = src
    return (n, axis) if op(n) == "RSUM" else None


def shared_factor(prod: Any, reduced: tuple[int, ...], op: Callable[[Any], "str | None"], srcs: Callable[[Any], tuple],
                  shape: Callable[[Any], tuple[int, ...]]) -> bool:
    """Is a factor of contraction product ``prod`` (reduced along ``reduced``) the same in every row
    -- an Expand whose source has one element along each kept axis but the last (a Linear layer's
    weight, broadcast over the batch)? Such a contraction is one GEMM over all the rows, which the
    BLAS runs at its full rate whatever the register block (devices/cpustage.py times the two);
    a batched product (attention's) is many small ones. Handles as in :func:`broadcast_product`."""
    full = shape(prod)
    kept = [d for d, n in enumerate(full) if d not in reduced and n > 1]
    if op(prod) != "MUL" or len(kept) < 2:
        return False
    for f in srcs(prod):
        if op(f) == "EXPAND":
            src = shape(srcs(f)[0])
            if len(src) == len(full) and all(src[d] == 1 for d in kept[:-1]):
                return True
    return False


@dataclass
class KernelPlan:
    buffers: list[tuple[Shape, DType]]
    n_inputs: int
    kernels: list[Kernel]
    outputs: list[int]            # buffer id of each requested target
    predicted: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the seconds a kernel launch costs in the parameters the plan was priced with (0: unknown): a
    # device stage that runs several kernels as one (lower/merge.py) predicts the one kernel with one
    # launch, not the sum of its members' (a merged "k43+k44+k45" was predicted 10.8 us, ran 3.9)
    launch: float = 0.0
    # the launch after a stream in those parameters (extract/cost.py ``after_stream``): a kernel that
    # moves more than about ``stream_bytes`` makes the launch after it up to ``cold`` seconds slower
    # (``stream_share``; 0: no term)
    cold: float = 0.0
    stream_bytes: int = 0

    def in_context(self, run: list["Kernel"]) -> list[float]:
        """The predicted seconds of each kernel of ``run`` (this plan's kernels, or the pieces and
        merges a device stage runs them as, in the order they run) where it runs: its prediction less
        the launch-after-a-stream term it carries for the launch after it (extraction charges that to
        the stream: it does not know the order), plus the term of the plan kernel that ran before it,
        less what its reads from cache save (``Kernel.warm``, priced in plan order by cost.in_order:
        a merged kernel's own, lower/merge.py; a piece's, its plan kernel's).
        The pieces of one plan kernel ("k4g", "k4p0", "k4a", "k4": the device's split; a merged
        "k3+k4" is k3's) share its prediction and its place: what DEBUG=2 and
        ``GlobalCounters.kernel_log`` show."""
        out: list[float] = []
        before = after = 0.0
        base_prev = None
        warm = {k.name: k.warm for k in self.kernels if k.warm}
        for k in run:
            base = plan_kernel_name(k.name)
            nbytes = k.stats.nbytes if k.stats is not None else k.nbytes
            own = self.cold * stream_share(nbytes, self.stream_bytes)
            if base != base_prev:
                before, after, base_prev = after, own, base
            out.append(k.predicted - own + before - (k.warm or warm.get(base, 0.0)))
        return out

    def cache_reads(self, cache_bytes: int) -> list[float]:
        """For each kernel, in plan order (the order a device runs them), the bytes of the buffers it
        reads that an earlier kernel wrote or read with at most ``cache_bytes`` moved since, counting the
        buffer itself: its reuse distance (what bench/bench_model.py --json ``reads`` shows for a run).
        Each kernel moves each buffer it takes once (``traffic``); at most the kernel's priced bytes
        (``stats.nbytes``: a slice reads part of its buffer). The plan's inputs are cold on their first
        read (what ran before the plan is not known)."""
        size: dict[int, int] = {}
        last: dict[int, float] = {}
        moved = 0.0
        out: list[float] = []
        for k in self.kernels:
            touched = set(k.params)
            hot = step = 0
            for b in touched:
                n = size.get(b)
                if n is None:
                    shp, dt = self.buffers[b]
                    n = size[b] = math.prod(shp) * dt.itemsize
                step += n
                if b in last and b != k.out and b not in k.also and moved - last[b] + n <= cache_bytes:
                    hot += n
            out.append(min(hot, k.stats.nbytes) if k.stats is not None else min(hot, k.nbytes))
            moved += step
            for b in touched:
                last[b] = moved
        return out

    def traffic(self, k: Kernel) -> int:
        """The bytes of the buffers kernel ``k`` writes and reads, each once (``Kernel.params``)."""
        return sum(math.prod(self.buffers[b][0]) * self.buffers[b][1].itemsize for b in k.params)

    def describe(self) -> str:
        lines = [f"plan: {len(self.kernels)} kernel(s), predicted {self.predicted*1e6:.1f} us"]
        for k in self.kernels:
            shp, dt = self.buffers[k.out]
            lines.append(f"  {k.name}: b{k.out}{list(shp)} {dt.name} = {k.ast.render()}"
                         f"    [{k.nbytes/1e6:.3g} MB, {k.flops/1e6:.3g} MFLOP, {k.predicted*1e6:.1f} us]")
        lines.append(f"  outputs: {', '.join(f'b{o}' for o in self.outputs)}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def check_plan(plan: KernelPlan, orders: list[list[KNode]] | None = None) -> None:
    """Structural invariants every plan must meet (used by tests and on validation). ``orders``:
    the nodes of each kernel's body to check the ops of (default: every node, ``walk()``)."""
    written = set(range(plan.n_inputs))
    for i, k in enumerate(plan.kernels):
        for b in k.inputs:
            if b not in written:
                raise AssertionError(f"{k.name} reads b{b} before it is written")
        if k.out in written:
            raise AssertionError(f"{k.name} writes b{k.out} twice")
        written.add(k.out)
        shp, dt = plan.buffers[k.out]
        if k.ast.shape != shp or k.ast.dtype != dt:
            raise AssertionError(f"{k.name}: body {k.ast.shape} {k.ast.dtype} != buffer {shp} {dt}")
        for n in (orders[i] if orders is not None else k.ast.walk()):
            if n.op not in OPS:
                raise AssertionError(f"{k.name}: unknown op {n.op}")


def shared_memory(buffers: list[tuple[tuple[int, ...], Any]], n_inputs: int, outputs: list[int],
                  io: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> dict[int, int]:
    """Which intermediate buffers of a plan may live in another's memory: buffer id -> the id whose
    memory it takes. ``io``: per launch, in the order a device runs them, (the ids it reads, the ids
    it writes). An intermediate is given the memory of one of the same size that no launch uses
    any more, the one freed last first (the most likely still in cache); inputs, outputs and the
    ids past ``buffers`` (a device's scratch) keep their own. A kernel writes into memory whose last
    reader has finished: every id's last use is a launch before the one that first writes its
    successor."""
    nbytes = lambda b: math.prod(buffers[b][0]) * buffers[b][1].itemsize
    last: dict[int, int] = {}
    for j, (reads, writes) in enumerate(io):
        for b in (*reads, *writes):
            last[b] = j
    own = set(range(n_inputs)) | set(outputs)
    free: dict[int, list[int]] = {}
    owner: dict[int, int] = {}
    started: set[int] = set()
    for j, (reads, writes) in enumerate(io):
        for b in writes:
            if b in started or b in own or b >= len(buffers):
                continue
            started.add(b)
            got = free.get(nbytes(b))
            if got:
                owner[b] = got.pop()
        for b in {*reads, *writes}:
            if last[b] == j and b in started:
                free.setdefault(nbytes(b), []).append(owner.get(b, b))
    return owner


# ------------------------------------------------------------------ JSON: plans kept on disk
# (eqgrad/engine/diskcache.py). Every value is written with a tag where JSON would lose its type,
# so a plan read back is the plan written, field for field and type for type:
#   None, bool, int, str       as themselves (JSON keeps bool apart from int)
#   float                      {"float": float.hex(x)} -- exact, with -0.0 and +-inf; a NaN as
#                              {"float": "nan:<its 64 bits in hex>"}, so its sign and payload stay
#   a CONST value that is a size (``size_value``)   {"size": [the value, the size]}
#   tuple                      {"tuple": [...]}  (a list stays a JSON list)
#   DType                      {"dtype": "float32"}
#   KNode                      {"dag": [node, ...]}: the body's nodes in ``walk()`` order (sources
#                              first, the kernel's root last), each {"op", "src": [indices], "arg",
#                              "shape", "dtype"}: a node shared inside the body stays shared
#   Kernel                     {"kernel": {field: value, ...}}
#   KernelStats                {"stats": {field: value, ...}}
# A plan is {field: value} over KernelPlan's fields. Fields are read from the dataclasses, so a
# field added to Kernel or KernelPlan is written and read without a change here (its values must
# be of the kinds above: anything else is a TypeError naming it).

def _float_text(x: float) -> str:
    if math.isnan(x):
        return "nan:" + struct.pack(">d", x).hex()
    return x.hex()


def _float_of(s: str) -> float:
    if s.startswith("nan:"):
        return struct.unpack(">d", bytes.fromhex(s[4:]))[0]
    return float.fromhex(s)


def _enc(v: Any, where: str) -> Any:
    t = type(v)                           # (exact types first: most values of a plan; sizes subclass int/float)
    if t is int or t is str or t is bool or v is None:
        return v
    if t is tuple:
        return {"tuple": [_enc(x, where) for x in v]}
    if t is float:
        return {"float": _float_text(v)}
    if isinstance(v, np.generic):         # a NumPy scalar is written as the Python one it equals
        return _enc(v.item(), where)
    if is_size(v):
        return {"size": [_enc(float(v) if isinstance(v, float) else int(v), where), v.size]}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"float": _float_text(v)}
    if isinstance(v, DType):
        return {"dtype": v.name}
    if isinstance(v, tuple):
        return {"tuple": [_enc(x, where) for x in v]}
    if isinstance(v, list):
        return [_enc(x, where) for x in v]
    if isinstance(v, KNode):
        nodes = v.walk()
        index = {id(n): i for i, n in enumerate(nodes)}
        return {"dag": [{"op": n.op, "src": [index[id(s)] for s in n.src], "arg": _enc(n.arg, f"{where} {n.op}"),
                         "shape": _enc(n.shape, where), "dtype": _enc(n.dtype, where)} for n in nodes]}
    if isinstance(v, Kernel):
        # (``also`` only where a kernel has more outputs: a device's stage writes it, never extraction)
        return {"kernel": {f.name: _enc(getattr(v, f.name), f"{where} {v.name}.{f.name}") for f in fields(Kernel)
                           if f.name != "also" or v.also}}
    if isinstance(v, KernelStats):
        return {"stats": {f.name: _enc(getattr(v, f.name), where) for f in fields(KernelStats)}}
    raise TypeError(f"plan_to_json: {where}: expected None, bool, int, float, str, tuple, list, DType, KNode, "
                    f"Kernel or KernelStats, got {type(v).__name__} {v!r}")


def _dec(v: Any) -> Any:
    t = type(v)
    if t is int or t is str or t is bool or v is None:
        return v
    if t is dict and len(v) == 1:         # (the tagged values most of a plan is: a tuple, a float)
        x = v.get("tuple")
        if x is not None and type(x) is list:
            return tuple([_dec(e) for e in x])
        x = v.get("float")
        if x is not None and type(x) is str:
            return _float_of(x)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict) or len(v) != 1:
        raise ValueError(f"expected a JSON scalar, list or one-key tagged object, got {str(v)[:80]}")
    (tag, x), = v.items()
    if tag == "float" and isinstance(x, str):
        return _float_of(x)
    if tag == "size" and isinstance(x, list) and len(x) == 2 and isinstance(x[1], int) and not isinstance(x[1], bool):
        value = _dec(x[0])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return size_value(value, x[1])
    if tag == "tuple" and isinstance(x, list):
        return tuple(_dec(e) for e in x)
    if tag == "dtype" and x in DTYPES:
        return DTYPES[x]
    if tag == "kernel" and isinstance(x, dict):
        return Kernel(**{k: _dec(e) for k, e in x.items()})
    if tag == "stats" and isinstance(x, dict):
        return KernelStats(**{k: _dec(e) for k, e in x.items()})
    if tag == "dag" and isinstance(x, list) and x:
        built: list[KNode] = []
        for n in x:
            src = tuple(built[i] for i in n["src"] if isinstance(i, int) and 0 <= i < len(built))
            if len(src) != len(n["src"]):
                raise ValueError(f"a node's sources must be earlier nodes, got {n['src']}")
            built.append(KNode(n["op"], src, _dec(n["arg"]), _dec(n["shape"]), _dec(n["dtype"])))
        return built[-1]
    raise ValueError(f"unknown tag {tag!r} or a malformed value {str(x)[:80]}")


def plan_to_data(plan: KernelPlan) -> dict[str, Any]:
    """``plan`` as JSON-ready data (the encoding above); TypeError names a value it cannot write."""
    return {f.name: _enc(getattr(plan, f.name), f"plan.{f.name}") for f in fields(KernelPlan)}


def plan_from_data(data: Any) -> KernelPlan:
    """The plan ``plan_to_data`` wrote, checked as untrusted input: ValueError says what is wrong
    (a malformed value, an unknown op or dtype, a node whose shape or dtype its op's rules do not
    give, a kernel that reads a buffer before it is written -- ``check_plan``)."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a plan object, got {type(data).__name__}")
    try:
        plan = KernelPlan(**{k: _dec(v) for k, v in data.items()})
        _check_decoded(plan)
        check_plan(plan)
    except ValueError:
        raise
    except Exception as e:          # TypeError, KeyError, a shape rule's ShapeError, check_plan's AssertionError
        raise ValueError(f"{type(e).__name__}: {e}") from None
    return plan


def plan_to_json(plan: KernelPlan) -> str:
    return json.dumps(plan_to_data(plan), separators=(",", ":"))


def plan_from_json(text: str) -> KernelPlan:
    return plan_from_data(json.loads(text))


def _is_shape(s: Any) -> bool:
    return isinstance(s, tuple) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s)


def _check_decoded(plan: KernelPlan) -> None:
    """What ``check_plan`` takes for granted of a plan that extraction built: the types of every
    field, and each node's shape and dtype as its op's rules give them (ops.py)."""
    if not isinstance(plan.buffers, list) or not all(
            isinstance(b, tuple) and len(b) == 2 and _is_shape(b[0]) and isinstance(b[1], DType) for b in plan.buffers):
        raise ValueError("buffers: expected a list of (shape, dtype) pairs")
    n = len(plan.buffers)
    if not isinstance(plan.n_inputs, int) or not 0 <= plan.n_inputs <= n:
        raise ValueError(f"n_inputs: expected an integer from 0 to {n}, got {plan.n_inputs!r}")
    if not isinstance(plan.outputs, list) or not all(isinstance(o, int) and 0 <= o < n for o in plan.outputs):
        raise ValueError(f"outputs: expected buffer ids below {n}, got {plan.outputs!r}")
    if not isinstance(plan.kernels, list) or not all(isinstance(k, Kernel) for k in plan.kernels):
        raise ValueError("kernels: expected a list of kernels")
    for k in plan.kernels:
        if not isinstance(k.out, int) or not 0 <= k.out < n or not isinstance(k.ast, KNode):
            raise ValueError(f"{k.name}: expected an output buffer id below {n} and a body")
        nodes = k.ast.walk()
        for x in nodes:
            if x.op not in OPS or not _is_shape(x.shape) or not isinstance(x.dtype, DType):
                raise ValueError(f"{k.name}: a node {x.op!r} with an unknown op, or a shape or dtype of the wrong type")
            d = OPS[x.op]
            if d.kind == "leaf":
                if x.src:
                    raise ValueError(f"{k.name}: leaf {x.op} with sources")
                if x.op == "BUF" and not (isinstance(x.arg, int) and 0 <= x.arg < n and plan.buffers[x.arg][1] == x.dtype):
                    raise ValueError(f"{k.name}: BUF of buffer {x.arg!r}: expected a buffer id below {n} of dtype {x.dtype.name}")
                continue
            if len(x.src) != d.arity:
                raise ValueError(f"{k.name}: {x.op} with {len(x.src)} sources, expected {d.arity}")
            shape = tuple(d.shape_rule([s.shape for s in x.src], x.arg))
            dtype = d.dtype_rule([s.dtype for s in x.src], x.arg)
            if shape != x.shape or dtype != x.dtype:
                raise ValueError(f"{k.name}: {x.op} gives {shape} {dtype.name}, the file says {x.shape} {x.dtype.name}")
        reads = tuple(dict.fromkeys(x.arg for x in nodes if x.op == "BUF"))      # KNode.buffers(), walked once
        if not isinstance(k.inputs, tuple) or k.inputs != reads:
            raise ValueError(f"{k.name}: inputs {k.inputs} are not the buffers its body reads {reads}")


def plan_difference(a: KernelPlan, b: KernelPlan) -> str | None:
    """Where two plans differ structurally (None: they do not): every field of the plan and its
    kernels, values of the same type (1 is not 1.0, a tuple is not a list), floats bit for bit
    (-0.0 is not 0.0; a NaN equals a NaN of the same bits), kernel bodies node for node, with
    the same sharing (a node used twice in one body is one node in the other too)."""
    pairs: dict[int, int] = {}              # id(a's node) -> id(b's node), both ways below
    back: dict[int, int] = {}
    knode_fields = [f.name for f in fields(KNode) if f.name != "src"]
    kernel_fields = [f.name for f in fields(Kernel)]
    exact = (int, str, bool, type(None), DType)

    # ``same`` answers None (equal) or where they differ as the parts of the message, innermost
    # first, each level adding its place on the way out: the places are written only for a
    # difference (EQGRAD_VERIFY compares every plan the test suite compiles)
    def same(x: Any, y: Any) -> list[str] | None:
        tx = type(x)
        if tx is not type(y):
            if isinstance(x, np.generic) or isinstance(y, np.generic):     # as plan_to_data writes them
                x, y = (v.item() if isinstance(v, np.generic) else v for v in (x, y))
                return same(x, y)
            return [f": {tx.__name__} {x!r} != {type(y).__name__} {y!r}"]
        if tx in exact:
            return None if x == y else [f": {x!r} != {y!r}"]
        if tx is float:
            return None if struct.pack(">d", x) == struct.pack(">d", y) else [f": {x!r} != {y!r}"]
        if tx is tuple or tx is list:
            if len(x) != len(y):
                return [f": length {len(x)} != {len(y)}"]
            for i, (p, q) in enumerate(zip(x, y)):
                if (d := same(p, q)) is not None:
                    d.append(f"[{i}]")
                    return d
            return None
        if isinstance(x, np.generic):
            return same(x.item(), y.item())
        if isinstance(x, KNode):
            xs, ys = x.walk(), y.walk()
            if len(xs) != len(ys):
                return [f": {len(xs)} nodes != {len(ys)}"]
            for i, (p, q) in enumerate(zip(xs, ys)):
                if pairs.setdefault(id(p), id(q)) != id(q) or back.setdefault(id(q), id(p)) != id(p):
                    return [f": node {i} ({p.op}) is shared differently"]
                if [pairs.get(id(s)) for s in p.src] != [id(s) for s in q.src]:
                    return [f": node {i} ({p.op}) has other sources"]
                for name in knode_fields:
                    if (d := same(getattr(p, name), getattr(q, name))) is not None:
                        d.append(f" node {i} ({p.op}).{name}")
                        return d
            return None
        if isinstance(x, Kernel):
            for name in kernel_fields:
                if (d := same(getattr(x, name), getattr(y, name))) is not None:
                    d.append(f".{name}")
                    return d
            return None
        return None if x == y else [f": {x!r} != {y!r}"]

    for f in fields(KernelPlan):
        if (d := same(getattr(a, f.name), getattr(b, f.name))) is not None:
            d.append(f"plan.{f.name}")
            return "".join(reversed(d))
    return None
