"""The lazy graph: one :class:`LazyBuffer` per primitive op application.

A LazyBuffer is either realized (``op == "BUF"``, it owns a device buffer) or a pending op over
other LazyBuffers. ``Tensor`` methods build these; ``realize`` hands the pending subgraph to the
engine, after which the LazyBuffer turns into a ``BUF`` and forgets its sources, so old graphs
can be freed.

Value semantics of in-place writes (``Tensor.assign``): a realized LazyBuffer is *storage* -- the
tensor that owns it and its aliases (``detach()``) hold it, and a committed assign re-points it to
the new value's buffer. A graph node never reads storage directly: when a node is built over a
realized source it reads a **snapshot** of it instead (:meth:`LazyBuffer.snapshot`: a ``BUF`` with
the same buffer, frozen, cached per version), so a later assign to the storage does not change a
value that was built from the old one (copy-on-write: the old buffer lives as long as a graph
reads it). A node that was read by other nodes while it was still pending is marked ``read``;
it must not change its buffer after it is realized either, so an assign to a tensor holding
such a node moves the tensor to new storage instead (``Tensor._commit_assign``).

Constructors here validate with the op table and raise :class:`eqgrad.ops.OpError`; the Tensor
layer validates user input first and words errors for the user.
"""
from __future__ import annotations

import threading
from typing import Any

import weakref

import numpy as np

from eqgrad.dtype import DType, bool_, cast_scalar
from eqgrad.graph.walk import topological
from eqgrad.ops import MAX_RANK, MOVEMENT_OPS, OPS, OpError, Shape, RETYPES, check_dtypes, numel

# Held while a realize walks or updates the pending graph (engine/session.py) and while
# ``one_value`` turns a pending node into a materialization: a walk never sees a half-changed node.
# Re-created in a forked child (engine/session.py ``_after_fork_in_child``).
GRAPH_LOCK = threading.Lock()

# ops whose output holds its source's bits unchanged (or constants): what ``_compared_value`` steps
# through to find the value a comparison reads
_SAME_BITS = frozenset(MOVEMENT_OPS) | {"NEG"}


class LazyBuffer:
    __slots__ = ("op", "src", "arg", "shape", "dtype", "device", "buffer", "base", "read", "_snap", "__weakref__")

    def __init__(self, op: str, src: tuple["LazyBuffer", ...], arg: Any, shape: Shape, dtype: DType,
                 device: str, buffer: Any = None):
        if len(shape) > MAX_RANK:
            raise OpError(f"{op.lower()}: tensors have at most {MAX_RANK} dimensions, got shape {shape}")
        if src:
            src = tuple([freeze(s) for s in src])
        self.op, self.src, self.arg, self.shape, self.dtype, self.device = op, src, arg, shape, dtype, device
        self.buffer = buffer
        self.base: "weakref.ref[LazyBuffer] | None" = None   # a snapshot: the storage it froze
        self.read = False                                      # a node read it while it was pending
        self._snap: LazyBuffer | None = None                   # the snapshot of the current buffer

    def __repr__(self) -> str:
        return f"<LB {self.op} {self.shape} {self.dtype.name} {self.device}>"

    @property
    def realized(self) -> bool:
        return self.op == "BUF"

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def is_snapshot(self) -> bool:
        return self.base is not None

    def snapshot(self) -> "LazyBuffer":
        """This realized buffer's current value, frozen: a later ``set_buffer`` (a committed
        assign) does not change what the snapshot reads. One snapshot per buffer version, so a
        graph that reads a tensor twice has one input."""
        if self.base is not None:
            return self
        snap = self._snap
        if snap is None or snap.buffer is not self.buffer:
            snap = LazyBuffer("BUF", (), None, self.shape, self.dtype, self.device, self.buffer)
            snap.base = weakref.ref(self)
            self._snap = snap
        return snap

    def set_buffer(self, buffer: Any) -> None:
        """Re-point realized storage to a new buffer (a committed assign, a JIT replay). Graphs
        built before read snapshots and keep the old buffer."""
        if self.base is not None:
            raise AssertionError("internal: a snapshot's buffer never changes")
        self.buffer, self._snap = buffer, None

    # ------------------------------------------------------------------ creation
    @staticmethod
    def from_buffer(buffer: Any) -> "LazyBuffer":
        return LazyBuffer("BUF", (), None, tuple(buffer.shape), buffer.dtype, buffer.device, buffer)

    @staticmethod
    def const(value: Any, shape: Shape, dtype: DType, device: str) -> "LazyBuffer":
        return LazyBuffer("CONST", (), cast_scalar(value, dtype), tuple(shape), dtype, device)

    def const_like(self, value: Any, dtype: DType | None = None) -> "LazyBuffer":
        return LazyBuffer.const(value, self.shape, dtype or self.dtype, self.device)

    # ------------------------------------------------------------------ ops
    def contiguous(self) -> "LazyBuffer":
        """A CONTIGUOUS boundary: the value is computed once, into a buffer of its own."""
        return self if self.realized else LazyBuffer("CONTIGUOUS", (self,), None, self.shape, self.dtype, self.device)

    def alu(self, op: str, *others: "LazyBuffer", arg: Any = None) -> "LazyBuffer":
        srcs = (self, *others)
        d = OPS[op]
        if len(srcs) != d.arity:
            raise OpError(f"{op.lower()} takes {d.arity} sources, got {len(srcs)}")
        shape, device, dt0 = self.shape, self.device, self.dtype
        for o in others:
            if o.shape != shape:
                raise OpError(f"{op.lower()}: source shapes must match, got {[s.shape for s in srcs]}")
            if o.device != device:
                raise OpError(f"{op.lower()}: sources are on different devices {sorted({s.device for s in srcs})}")
        dts = [s.dtype for s in srcs]
        if op == "WHERE":
            if dts[1] != dts[2]:
                raise OpError(f"where: both branches must have one dtype, got {dts[1].name} and {dts[2].name}")
        elif op == "BITCAST":
            check_dtypes(d, dts)
            if not isinstance(arg, DType) or arg is bool_ or arg.itemsize != dts[0].itemsize:
                raise OpError(f"bitcast: needs a non-bool dtype of {dts[0].name}'s width ({dts[0].itemsize} bytes), got {arg}")
        elif op not in RETYPES:
            for t in dts:
                if t is not dt0 and t != dt0:
                    raise OpError(f"{op.lower()}: source dtypes must match, got {[t.name for t in dts]}")
            check_dtypes(d, dts[:1])
        out_dtype = d.dtype_rule(dts, arg)
        if op == "CAST" and arg == self.dtype:
            return self
        if all(s.op == "CONST" for s in srcs) and d.ref is not None and op != "BITCAST":
            # (a bitcast is not folded: a CONST holds its value as a double, not its bits -- NaN payloads)
            # constant folding in the frontend keeps graphs small; egglog folds what appears later
            vals = [np.array(s.arg, dtype=s.dtype.vnp) for s in srcs]
            return LazyBuffer.const(d.ref(vals, arg, out_dtype).item(), self.shape, out_dtype, self.device)
        if (op == "CMPEQ" or op == "CMPLT") and dt0.is_float:
            one_value(self, others[0])
        return LazyBuffer(op, srcs, arg, self.shape, out_dtype, self.device)

    def reduce(self, op: str, axes: tuple[int, ...]) -> "LazyBuffer":
        axes = tuple(sorted(set(axes)))
        if any(not 0 <= a < len(self.shape) for a in axes):
            raise OpError(f"{op.lower()}: axes {axes} out of range for shape {self.shape}")
        if not axes:
            return self
        check_dtypes(OPS[op], [self.dtype])
        new_shape = OPS[op].shape_rule([self.shape], axes)
        return LazyBuffer(op, (self,), axes, new_shape, self.dtype, self.device)

    def movement(self, op: str, arg: Any) -> "LazyBuffer":
        shape = self.shape
        new_shape = tuple(map(int, OPS[op].shape_rule([shape], arg)))
        same = op == "RESHAPE" or op == "EXPAND"
        if same:
            if new_shape == shape:
                return self
        elif op == "PERMUTE":
            if tuple(arg) == tuple(range(len(shape))):
                return self
        elif op == "PAD" or op == "SHRINK":
            if new_shape == shape and not any(arg[0]):
                return self
        elif op == "FLIP" and not arg:
            return self
        if self.op == "CONST" and op != "PAD":
            return LazyBuffer.const(self.arg, new_shape, self.dtype, self.device)
        if same and self.op == op:
            return self.src[0].movement(op, arg)
        return LazyBuffer(op, (self,), arg, new_shape, self.dtype, self.device)


def _compared_value(lb: LazyBuffer) -> LazyBuffer:
    """The node whose bits ``lb`` shows: ``lb`` with movement ops and negations stepped through."""
    while lb.op in _SAME_BITS:
        lb = lb.src[0]
    return lb


def one_value(a: LazyBuffer, b: LazyBuffer) -> None:
    """Before ``a`` and ``b`` are compared: when one reads a float value ``x`` and the other a max of
    that same ``x`` (``x == x.amax(1, keepdim=True)``: argmax, argmin, user code), ``x`` is
    materialized in place (it becomes ``Contiguous`` of its computation), so every consumer --
    those built already and those built later -- reads one buffer.

    NOTE: a plan may otherwise inline ``x`` into two kernels, and two evaluations of one expression
    can round differently (summation order, FMA contraction, lane width): then no element equals the
    max and argmax returns the axis length. A value has one value wherever it is used (docs/semantics.md);
    where its consumers compare bits, that takes one evaluation. Leaves, constants and boundaries
    already have one value and are left as they are."""
    for v, r in ((a, b), (b, a)):
        r = _compared_value(r)
        if r.op != "RMAX":
            continue
        x = _compared_value(r.src[0])
        if x is not _compared_value(v) or x.src == () or OPS[x.op].kind == "boundary":
            continue
        with GRAPH_LOCK:
            if x.op == "BUF" or OPS[x.op].kind == "boundary":      # realized, or done by another thread
                return
            inner = LazyBuffer(x.op, x.src, x.arg, x.shape, x.dtype, x.device)
            inner.read = True
            # the op last: graph building in another thread (no lock) reads only a node's op, and x's
            # is never one it looks further into (a movement or a constant)
            x.src, x.arg = (inner,), None
            x.op = "CONTIGUOUS"
        return


def freeze(src: LazyBuffer) -> LazyBuffer:
    """What a node built now over ``src`` reads: a snapshot of realized storage (its current
    value); a pending node is marked ``read`` (its identity is now part of a graph)."""
    if src.op == "BUF":
        return src.snapshot()
    src.read = True
    return src


def toposort(roots: list[LazyBuffer]) -> list[LazyBuffer]:
    """Unrealized nodes reachable from ``roots`` plus their leaves, sources before users."""
    return topological(roots, lambda n: n.src)
