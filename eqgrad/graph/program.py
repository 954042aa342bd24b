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

import math
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class ParamLeaf:
    """A float scalar broadcast to ``shape`` whose value is a runtime argument of the plan, not part
    of its structure: ``Program.params[index]`` holds the value. A frontend ``CONST`` becomes one
    when no active rule inspects its value (``linearize``'s ``structural``), so a new value (a
    learning rate, a new ``s`` in ``x * s + 1``) runs the cached plan instead of compiling again."""
    index: int
    shape: Shape
    dtype: DType


# a source of a node: the index of an earlier node, an input buffer, a constant or a parameter
Ref = Union[int, Input, ConstLeaf, ParamLeaf]


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
    # (value, dtype) of each ParamLeaf, by index: the plan's input buffers after ``inputs`` (each
    # holds one element, of shape ())
    params: list[tuple[Any, DType]] = field(default_factory=list)

    @property
    def input_specs(self) -> list[tuple[Shape, DType]]:
        """(shape, dtype) of the plan's input buffers: the realized inputs, then the parameters."""
        return [(lb.shape, lb.dtype) for lb in self.inputs] + [((), dt) for _, dt in self.params]

    @cached_property
    def key(self) -> tuple:
        """Hashable structure: what changes the plan, nothing that only changes the numbers (buffer
        contents, parameter values)."""
        def ref(r: Ref) -> Any:
            if isinstance(r, int):
                return r
            if isinstance(r, Input):
                return ("B", r.pos, r.shape, r.dtype.name)
            if isinstance(r, ParamLeaf):
                return ("P", r.index, r.shape, r.dtype.name)
            return ("C", repr(r.value), r.shape, r.dtype.name)
        items: list[tuple] = [(self.device,)]
        for n in self.nodes:
            arg = n.arg.name if isinstance(n.arg, DType) else n.arg
            items.append((n.op, arg, n.shape, n.dtype.name, tuple(ref(s) for s in n.src)))
        items.append(tuple(ref(r) for r in self.roots))
        return tuple(items)


def is_structural(value: Any, dtype: DType, inspected: frozenset[float] | None) -> bool:
    """Does a constant stay part of the program's structure (a ``ConstLeaf``) rather than become a
    runtime parameter? ``inspected``: the float values the active rules name (``RuleConfig.
    inspected_constants``); None keeps every constant structural (no parameters). Integer and bool
    constants always stay: index arithmetic and exact integer ops are lowered with their values.
    A float stays when a rule names it (0.0 -- which is also -0.0 --, 1.0, ...) or it is not finite
    (inf, NaN: the lowering's identities and masks)."""
    if inspected is None or not dtype.is_float:
        return True
    v = float(value)
    return v in inspected or not math.isfinite(v)


def linearize(targets: list[LazyBuffer], order: list[LazyBuffer] | None = None, device: str = "",
              inspected: frozenset[float] | None = None) -> Program:
    """The program computing ``targets``; ``order`` is ``toposort(targets)`` if already known.
    ``inspected``: the constant values rules inspect; every other float constant becomes a
    ``ParamLeaf`` (None: none does -- the tools that emit programs for a fixed rule set)."""
    if order is None:
        order = toposort(targets)
    index: dict[int, int] = {}
    pos: dict[int, int] = {}
    inputs: list[LazyBuffer] = []
    nodes: list[Node] = []
    params: list[tuple[Any, DType]] = []
    param_of: dict[int, int] = {}       # id(CONST LazyBuffer) -> its parameter's index

    def ref(lb: LazyBuffer) -> Ref:
        if lb.op == "CONST":
            if is_structural(lb.arg, lb.dtype, inspected):
                return ConstLeaf(lb.arg, lb.shape, lb.dtype)
            # one parameter per constant node (not per value: the structure must not depend on
            # which values happen to be equal)
            if id(lb) not in param_of:
                param_of[id(lb)] = len(params)
                params.append((lb.arg, lb.dtype))
            return ParamLeaf(param_of[id(lb)], lb.shape, lb.dtype)
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
    return Program(nodes, inputs, roots, device, params)


def structure(targets: list[LazyBuffer], device: str = "", inspected: frozenset[float] | None = None
              ) -> tuple[tuple, list[LazyBuffer], list[tuple[Any, DType]], list[LazyBuffer]]:
    """``(linearize(...).key, .inputs, .params, toposort(targets))`` in one walk, without building
    the Program: what a realize needs when its plan is cached. On a miss the Program is built from
    the returned order (``linearize(targets, order)``, no second walk). The walk is ``toposort``'s
    (post-order, sources left to right) and refs are numbered as ``linearize`` numbers them, so the
    key is the same tuple (tests/test_program.py checks it on every program of its corpus)."""
    index: dict[int, int] = {}
    pos: dict[int, int] = {}
    inputs: list[LazyBuffer] = []
    params: list[tuple[Any, DType]] = []
    param_of: dict[int, int] = {}
    items: list[tuple] = [(device,)]

    def ref(lb: LazyBuffer) -> Any:
        op = lb.op
        if op == "CONST":
            if is_structural(lb.arg, lb.dtype, inspected):
                return ("C", repr(lb.arg), lb.shape, lb.dtype.name)
            k = param_of.get(id(lb))
            if k is None:
                k = param_of[id(lb)] = len(params)
                params.append((lb.arg, lb.dtype))
            return ("P", k, lb.shape, lb.dtype.name)
        if op == "BUF":
            k = pos.get(id(lb))
            if k is None:
                k = pos[id(lb)] = len(inputs)
                inputs.append(lb)
            return ("B", k, lb.shape, lb.dtype.name)
        return index[id(lb)]

    seen: set[int] = set()
    order: list[LazyBuffer] = []
    stack: list[tuple[LazyBuffer, bool]] = [(r, False) for r in reversed(targets)]
    pop, push, emit, add = stack.pop, stack.append, order.append, items.append
    while stack:
        lb, done = pop()
        if done:
            emit(lb)
            op = lb.op
            if op != "BUF" and op != "CONST":
                index[id(lb)] = len(items) - 1
                arg = lb.arg
                if arg.__class__ is DType:
                    arg = arg.name
                add((op, arg, lb.shape, lb.dtype.name, tuple([ref(x) for x in lb.src])))
            continue
        i = id(lb)
        if i in seen:
            continue
        seen.add(i)
        push((lb, True))
        src = lb.src
        for k in range(len(src) - 1, -1, -1):
            x = src[k]
            if id(x) not in seen:
                push((x, False))
    items.append(tuple(ref(t) for t in targets))
    return tuple(items), inputs, params, order
