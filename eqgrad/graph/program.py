"""The one walk over a lazy graph: a realize's program, read by every stage that needs its structure.

``linearize(targets)`` visits the unrealized subgraph once, in topological order, and gives a
``Program``: the computed nodes (sources first, each naming its sources by position), the realized
buffers it reads (``inputs``, numbered in walk order) and the requested targets (``roots``). Three
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
from typing import Any, Union

from eqgrad.cache import computed_once
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
    inputs: list[LazyBuffer]            # realized leaves, in walk order (the plan's first buffers)
    roots: list[Ref]                    # one per requested target
    device: str = ""
    # (value, dtype) of each ParamLeaf, by index: the plan's input buffers after ``inputs`` (each
    # holds one element, of shape ())
    params: list[tuple[Any, DType]] = field(default_factory=list)

    @property
    def input_specs(self) -> list[tuple[Shape, DType]]:
        """(shape, dtype) of the plan's input buffers: the realized inputs, then the parameters."""
        return [(lb.shape, lb.dtype) for lb in self.inputs] + [((), dt) for _, dt in self.params]

    @computed_once
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
    index: dict[int, Ref] = {}          # id -> the ref of every leaf and node in ``order``
    inputs: list[LazyBuffer] = []
    nodes: list[Node] = []
    params: list[tuple[Any, DType]] = []
    # leaves are numbered in walk order, as ``structure`` numbers them; a constant node that no
    # rule inspects is one parameter (one per node, not per value: the structure must not depend
    # on which values happen to be equal)
    for lb in order:
        op = lb.op
        if op == "BUF":
            index[id(lb)] = Input(len(inputs), lb.shape, lb.dtype)
            inputs.append(lb)
        elif op == "CONST":
            if is_structural(lb.arg, lb.dtype, inspected):
                index[id(lb)] = ConstLeaf(lb.arg, lb.shape, lb.dtype)
            else:
                index[id(lb)] = ParamLeaf(len(params), lb.shape, lb.dtype)
                params.append((lb.arg, lb.dtype))
        else:
            index[id(lb)] = len(nodes)
            nodes.append(Node(op, lb.arg, lb.shape, lb.dtype, tuple([index[id(s)] for s in lb.src])))
    roots = [index[id(t)] for t in targets]
    return Program(nodes, inputs, roots, device, params)


def structure(targets: list[LazyBuffer], device: str = "", inspected: frozenset[float] | None = None
              ) -> tuple[tuple, list[LazyBuffer], list[tuple[Any, DType]], list[LazyBuffer]]:
    """``(linearize(...).key, .inputs, .params, toposort(targets))`` in one walk, without building
    the Program: what a realize needs when its plan is cached. On a miss the Program is built from
    the returned order (``linearize(targets, order)``, no second walk). The walk is ``toposort``'s
    (post-order, sources left to right) and refs are numbered as ``linearize`` numbers them, so the
    key is the same tuple (tests/test_program.py checks it on every program of its corpus).

    Every realize runs this, so it is written for speed (it was ~2.5 us a node): each node's ref is
    worked out once, when the walk reaches it (a leaf's at once, a computed node's after its
    sources), and kept in one dict that also marks what was visited; sources are then dict reads."""
    refs: dict[int, Any] = {}            # id -> the ref (a leaf's key tuple, or a node's index); None: on the stack
    inputs: list[LazyBuffer] = []
    params: list[tuple[Any, DType]] = []
    order: list[LazyBuffer] = []
    items: list[tuple] = [(device,)]
    get, emit, add = refs.get, order.append, items.append
    stack: list[Any] = list(reversed(targets))
    pop, push = stack.pop, stack.append
    while stack:
        lb = pop()
        if lb.__class__ is tuple:                    # (node,): its sources are done
            lb = lb[0]
            emit(lb)
            arg = lb.arg
            if arg.__class__ is DType:
                arg = arg.name
            refs[id(lb)] = len(items) - 1
            add((lb.op, arg, lb.shape, lb.dtype.name, tuple([refs[id(x)] for x in lb.src])))
            continue
        i = id(lb)
        if i in refs:
            continue
        op = lb.op
        if op == "BUF":
            refs[i] = ("B", len(inputs), lb.shape, lb.dtype.name)
            inputs.append(lb)
            emit(lb)
        elif op == "CONST":
            if is_structural(lb.arg, lb.dtype, inspected):
                refs[i] = ("C", repr(lb.arg), lb.shape, lb.dtype.name)
            else:                                    # one parameter per constant node
                refs[i] = ("P", len(params), lb.shape, lb.dtype.name)
                params.append((lb.arg, lb.dtype))
            emit(lb)
        else:
            refs[i] = None
            push((lb,))
            src = lb.src
            for k in range(len(src) - 1, -1, -1):
                x = src[k]
                if id(x) not in refs:
                    push(x)
    add(tuple([refs[id(t)] for t in targets]))
    return tuple(items), inputs, params, order
