"""The lazy graph: one :class:`LazyBuffer` per primitive op application.

A LazyBuffer is either realized (``op == "BUF"``, it owns a device buffer) or a pending op over
other LazyBuffers. ``Tensor`` methods build these; ``realize`` hands the pending subgraph to the
engine, after which the LazyBuffer turns into a ``BUF`` and forgets its sources, so old graphs
can be freed.

Constructors here validate with the op table and raise :class:`eqgrad.ops.OpError`; the Tensor
layer validates user input first and words errors for the user.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..dtype import DType, cast_scalar
from ..ops import MAX_RANK, OPS, OpError, Shape, check_dtypes, numel


class LazyBuffer:
    __slots__ = ("op", "src", "arg", "shape", "dtype", "device", "buffer", "__weakref__")

    def __init__(self, op: str, src: tuple["LazyBuffer", ...], arg: Any, shape: Shape, dtype: DType,
                 device: str, buffer: Any = None):
        if len(shape) > MAX_RANK:
            raise OpError(f"{op.lower()}: tensors have at most {MAX_RANK} dimensions, got shape {shape}")
        self.op, self.src, self.arg, self.shape, self.dtype, self.device = op, src, arg, shape, dtype, device
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"<LB {self.op} {self.shape} {self.dtype.name} {self.device}>"

    @property
    def realized(self) -> bool:
        return self.op == "BUF"

    @property
    def numel(self) -> int:
        return numel(self.shape)

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
        shapes = [s.shape for s in srcs]
        if any(s != shapes[0] for s in shapes):
            raise OpError(f"{op.lower()}: source shapes must match, got {shapes}")
        devices = {s.device for s in srcs}
        if len(devices) != 1:
            raise OpError(f"{op.lower()}: sources are on different devices {sorted(devices)}")
        dts = [s.dtype for s in srcs]
        if op == "WHERE":
            if dts[1] != dts[2]:
                raise OpError(f"where: both branches must have one dtype, got {dts[1].name} and {dts[2].name}")
        elif op != "CAST":
            if any(t != dts[0] for t in dts):
                raise OpError(f"{op.lower()}: source dtypes must match, got {[t.name for t in dts]}")
            check_dtypes(d, dts[:1])
        out_dtype = d.dtype_rule(dts, arg)
        if op == "CAST" and arg == self.dtype:
            return self
        if all(s.op == "CONST" for s in srcs) and d.ref is not None:
            # constant folding in the frontend keeps graphs small; egglog folds what appears later
            vals = [np.array(s.arg, dtype=s.dtype.np) for s in srcs]
            return LazyBuffer.const(d.ref(vals, arg, out_dtype).item(), self.shape, out_dtype, self.device)
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
        new_shape = tuple(int(s) for s in OPS[op].shape_rule([self.shape], arg))
        if op in ("RESHAPE", "EXPAND") and new_shape == self.shape:
            return self
        if op == "PERMUTE" and tuple(arg) == tuple(range(len(self.shape))):
            return self
        if op in ("PAD", "SHRINK") and new_shape == self.shape and not any(arg[0]):
            return self
        if op == "FLIP" and not arg:
            return self
        if self.op == "CONST" and op != "PAD":
            return LazyBuffer.const(self.arg, new_shape, self.dtype, self.device)
        if self.op == op and op in ("RESHAPE", "EXPAND"):
            return self.src[0].movement(op, arg)
        return LazyBuffer(op, (self,), arg, new_shape, self.dtype, self.device)


def toposort(roots: list[LazyBuffer]) -> list[LazyBuffer]:
    """Unrealized nodes reachable from ``roots`` plus their leaves, sources before users."""
    order: list[LazyBuffer] = []
    seen: set[int] = set()
    stack: list[tuple[LazyBuffer, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for s in reversed(node.src):
            if id(s) not in seen:
                stack.append((s, False))
    return order
