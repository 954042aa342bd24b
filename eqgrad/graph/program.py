"""The one walk over a lazy graph: a realize's program, read by every stage that needs its structure.

``linearize(targets)`` visits the unrealized subgraph once, in topological order, and gives a
``Program``: the computed nodes (sources first, each naming its sources by position), the realized
buffers it reads (``inputs``, numbered by first use) and the requested targets (``roots``). Three
consumers read it and nothing else, so they cannot drift apart:

- ``Program.key`` -- the structure key of the plan cache: ops, attributes, shapes, dtypes,
  constants and how the inputs are wired, never buffer contents;
- ``eqgrad.rules.ir.emit_program`` -- the egglog text that saturation starts from;
- ``eqgrad.extract.egraph.from_program`` -- the unsaturated e-graph (the fallback when saturation
  is off or fails).

Example::

    >>> from eqgrad import Tensor
    >>> a = Tensor([1.0, 2.0]).realize()
    >>> p = linearize([(a + 1).lazydata])
    >>> [n.op for n in p.nodes], p.roots, len(p.inputs)
    (['ADD'], [0], 1)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Union

from eqgrad.dtype import DType
from eqgrad.graph.lazy import LazyBuffer, toposort
from eqgrad.ops import Shape


@dataclass(frozen=True)
class Input:
    """A realized buffer the program reads; ``pos`` is its place in ``Program.inputs``."""
    pos: int
    shape: Shape
    dtype: DType


@dataclass(frozen=True)
class ConstLeaf:
    """A scalar broadcast to ``shape`` (the frontend's ``CONST``)."""
    value: Any
    shape: Shape
    dtype: DType


# a source of a node: the index of an earlier node, an input buffer, or a constant
Ref = Union[int, Input, ConstLeaf]


@dataclass(frozen=True)
class Node:
    op: str                 # op-table name
    arg: Any                # attribute as the frontend stores it (see ops.py)
    shape: Shape
    dtype: DType
    src: tuple[Ref, ...]


def is_node(r: Ref) -> bool:
    return isinstance(r, int)


@dataclass
class Program:
    nodes: list[Node]
    inputs: list[LazyBuffer]            # realized leaves, by first use (the plan's first buffers)
    roots: list[Ref]                    # one per requested target
    device: str = ""

    @cached_property
    def key(self) -> tuple:
        """Hashable structure: what changes the plan, nothing that only changes the numbers."""
        def ref(r: Ref) -> Any:
            if isinstance(r, int):
                return r
            if isinstance(r, Input):
                return ("B", r.pos, r.shape, r.dtype.name)
            return ("C", repr(r.value), r.shape, r.dtype.name)
        items: list[tuple] = [(self.device,)]
        for n in self.nodes:
            arg = n.arg.name if isinstance(n.arg, DType) else n.arg
            items.append((n.op, arg, n.shape, n.dtype.name, tuple(ref(s) for s in n.src)))
        items.append(tuple(ref(r) for r in self.roots))
        return tuple(items)


def linearize(targets: list[LazyBuffer], order: list[LazyBuffer] | None = None, device: str = "") -> Program:
    """The program computing ``targets``; ``order`` is ``toposort(targets)`` if already known."""
    if order is None:
        order = toposort(targets)
    index: dict[int, int] = {}
    pos: dict[int, int] = {}
    inputs: list[LazyBuffer] = []
    nodes: list[Node] = []

    def ref(lb: LazyBuffer) -> Ref:
        if lb.op == "CONST":
            return ConstLeaf(lb.arg, lb.shape, lb.dtype)
        if lb.op == "BUF":
            if id(lb) not in pos:
                pos[id(lb)] = len(inputs)
                inputs.append(lb)
            return Input(pos[id(lb)], lb.shape, lb.dtype)
        return index[id(lb)]

    for lb in order:
        if lb.op in ("BUF", "CONST"):
            continue
        srcs = tuple(ref(s) for s in lb.src)
        index[id(lb)] = len(nodes)
        nodes.append(Node(lb.op, lb.arg, lb.shape, lb.dtype, srcs))
    roots = [ref(t) for t in targets]
    return Program(nodes, inputs, roots, device)
