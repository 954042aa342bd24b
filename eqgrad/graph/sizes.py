"""Where a program's and a kernel body's sizes are, and their skeletons: the one place that
abstracts sizes (docs/engine.md: a new size reuses the plan; docs/lowering.md: traces, families).

Which attribute entries of an op are sizes is the op table's answer (``OpDef.attr_sizes``, read off
the shape rule: a reshape's or expand's target, a pad's or shrink's amounts; reduce axes,
permutations and flipped axes are structure). Three levels abstract them, each for what depends on
sizes there:

- a **program** (:func:`size_free_key`, :func:`program_sizes`): ``Program.key`` with every size other
  than 0 and 1 replaced by a marker. A size-1 axis stays: broadcasting, the extractor's
  row-invariance and rules such as ``expand-sum`` test it, so a plan's choices depend on which sizes
  are 1 and not on the others. Two programs with the same key differ only in sizes: the key of the
  cache of plans that graph/resize.py rewrites for new sizes.
- a **kernel body** (:func:`body_sizes`, :func:`with_sizes`): the body's structure with every size
  taken out, and the sizes in walk order. The lowering depends on these and nothing else of the
  plan: the pair keys the lowered-kernel memo (devices.kernel_structure), the skeleton keys the
  traced lowering (lower/trace.py: a body lowered once with its sizes as symbols) and the device's
  BLAS-or-generated choices (devices/cpustage.py), and graph/resize.py keeps a body whose sizes all
  stay as it is.
- a **loop kernel** (devices/sizeargs.py): the loop IR without its index constants and loop extents,
  the key of a family of kernels that compile once with their sizes as arguments; a loop kernel
  instantiated from a trace gets its positions from the trace's holes, not by comparing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from eqgrad.dtype import DTYPES, DType
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, NodeMemo, is_size
from eqgrad.graph.program import Program
from eqgrad.ops import OPS, Shape

# ------------------------------------------------------------------ a program's sizes

SIZE = "n"      # a size other than 0 and 1, in a size-free key

# where an op's sizes are: the op table's answer (OpDef.attr_sizes, read off its shape rule)
ELEMENTWISE = frozenset(n for n, o in OPS.items() if o.kind in ("unary", "binary", "ternary"))
BOUNDARY = frozenset(n for n, o in OPS.items() if o.kind == "boundary")
SHAPE_ARG = frozenset(n for n, o in OPS.items() if o.attr_sizes == "shape")    # the attribute is a shape
PAIR_ARG = frozenset(n for n, o in OPS.items() if o.attr_sizes == "pairs")     # (before, after) / (starts, ends)
SIZED_ARG = SHAPE_ARG | PAIR_ARG                                                  # either
AXES_ARG = frozenset(n for n, o in OPS.items() if o.kind in ("movement", "reduce") and not o.attr_sizes)


def known_op(op: str, arg: Any) -> bool:
    """Is this an op (and attribute form) whose sizes this module knows where to find?"""
    if op in ELEMENTWISE or op in BOUNDARY:
        return arg is None or isinstance(arg, DType)
    return op in SHAPE_ARG or op in PAIR_ARG or op in AXES_ARG


_ABSTRACT: dict[tuple, tuple] = {}       # shape -> its sizes abstracted (a program repeats its shapes)
# _ABSTRACT_MAX: docs/lowering.md, Constants
_ABSTRACT_MAX = 4096


class _Sizes:
    """A program's sizes in walk order, and their abstraction for the key."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def shape(self, s: Shape) -> tuple:
        self.values.extend(s)
        try:
            hit = _ABSTRACT.get(s)
        except TypeError:                  # a shape given as a list
            return tuple(d if d in (0, 1) else SIZE for d in s)
        if hit is None:
            if len(_ABSTRACT) >= _ABSTRACT_MAX:
                _ABSTRACT.clear()
            hit = _ABSTRACT[s] = tuple(d if d in (0, 1) else SIZE for d in s)
        return hit

    def arg(self, op: str, arg: Any) -> Any:
        if op in SHAPE_ARG:
            return self.shape(arg)
        if op in PAIR_ARG:
            return tuple(self.shape(p) for p in arg)
        return arg.name if isinstance(arg, DType) else arg


@dataclass(frozen=True)
class ProgramSizes:
    """What resizing needs of a program, and nothing that holds its buffers (a ``Program`` keeps
    its realized inputs alive): keep one next to a cached plan instead of the program."""
    key: tuple                                   # size_free_key
    values: tuple[int, ...]                      # its sizes, in the order the key abstracted them
    input_specs: tuple[tuple[Shape, DType], ...]  # the plan's input buffers (Program.input_specs)
    roots: tuple[tuple[Shape, DType, int | None], ...]  # each root's shape, dtype, input position if an input
    consts: frozenset[float]                     # its constants' values and their negations
    unknown: str = ""    # why resizing cannot handle it ("" if it can)


def program_sizes(prog: Program) -> ProgramSizes:
    """The sizes of ``prog`` and its size-free key, in one walk of its structure key."""
    return structure_sizes(prog.key, prog.input_specs, len(prog.inputs))


def _node_sizes(node: tuple) -> tuple[tuple, tuple[int, ...], frozenset[float], str]:
    """One node of a structure key abstracted: (its item in the size-free key, its sizes in walk
    order, the values of the constants it reads, why resize cannot handle it or "")."""
    op, arg, shape, dtname, srcs = node
    sz = _Sizes()
    consts: set[float] = set()
    unknown = ""
    if isinstance(arg, str) and arg in DTYPES and (op in ELEMENTWISE or op in BOUNDARY):
        pass                                   # a cast's dtype, by name in the key
    elif known_op(op, arg):
        arg = sz.arg(op, arg)
    else:
        unknown = f"op {op} (attribute {arg!r}), whose sizes resize does not know"
    shape = sz.shape(shape)
    return (op, arg, shape, dtname, _refs(srcs, sz, consts)), tuple(sz.values), frozenset(consts), unknown


def _refs(refs: tuple, sz: _Sizes, consts: set[float]) -> tuple:
    """A node's sources (or the roots) abstracted: a node's index stays, a leaf's shape loses its
    sizes (into ``sz``), a constant's value goes into ``consts``."""
    out = []
    for r in refs:
        if r.__class__ is not int:
            if r[0] == "C" and r[3] != "bool":
                consts.add(float(r[1]))
            r = (r[0], r[1], sz.shape(r[2]), r[3])
        out.append(r)
    return tuple(out)


# a structure key's node -> _node_sizes' answer: consecutive programs of a model share most nodes
# (a growing sequence's step changes the few whose shapes hold its length), so a realize that
# resizes abstracts only those (_NODES_MAX: docs/lowering.md, Constants)
_NODES: dict[tuple, tuple] = {}
_NODES_MAX = 16384


def structure_sizes(key: tuple, input_specs: list[tuple[Shape, DType]], n_inputs: int) -> ProgramSizes:
    """The sizes of a program and its size-free key, from its structure key (``Program.key``, or
    ``graph.program.structure``'s: the same tuple) and its input specs (the realized inputs first,
    then the parameters): a realize that resizes a cached plan never builds the Program."""
    values: list[int] = []
    consts: set[float] = set()
    unknown = ""
    nodes = key[1:-1]
    items: list[tuple] = [(key[0][0], n_inputs, tuple(d.name for _, d in input_specs[n_inputs:]))]
    memo = _NODES
    for node in nodes:
        try:
            hit = memo.get(node)
        except TypeError:                      # an attribute given as a list
            hit = _node_sizes(node)
        if hit is None:
            if len(memo) >= _NODES_MAX:
                memo.clear()
            hit = memo[node] = _node_sizes(node)
        items.append(hit[0])
        values.extend(hit[1])
        if hit[2]:
            consts |= hit[2]
        unknown = unknown or hit[3]
    roots = key[-1]
    sz = _Sizes()
    items.append(_refs(roots, sz, consts))
    values += sz.values
    root_info = tuple((tuple(nodes[r][2]), DTYPES[nodes[r][3]], None) if isinstance(r, int) else
                      (tuple(r[2]), DTYPES[r[3]], r[1] if r[0] == "B" else None) for r in roots)
    return ProgramSizes(tuple(items), tuple(values), tuple((tuple(sh), d) for sh, d in input_specs), root_info,
                        frozenset(consts | {-v for v in consts}), unknown)


def size_free_key(prog: Program) -> tuple:
    """``Program.key`` with every size other than 0 and 1 abstracted (see the module docstring).

    Example::

        >>> from eqgrad import Tensor
        >>> from eqgrad.graph.program import linearize
        >>> def prog(n): return linearize([(Tensor.ones(n, 4).realize() * 2).sum(1).lazydata])
        >>> size_free_key(prog(3)) == size_free_key(prog(5)), size_free_key(prog(3)) == size_free_key(prog(1))
        (True, False)
    """
    return program_sizes(prog).key


# ------------------------------------------------------------------ a kernel body's sizes

class _Hole:
    """Where ``_flat`` took ints out: one int, or a run of ``n`` (a shape)."""
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"_{self.n}"


_HOLE = _Hole(-1)                          # one int
_RUNS = [_Hole(n) for n in range(16)]      # a tuple of n ints
_LIST = _Hole(-2)                          # (_LIST, items): a list
_INT = {int}


class _Exact:
    """A float of a node's attribute in a skeleton: equal only to the same float, bit for bit as
    ``repr`` tells (0.0 and -0.0 are different bodies; a NaN equals itself)."""
    __slots__ = ("v", "r")

    def __init__(self, v: float) -> None:
        self.v, self.r = v, repr(v)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Exact and other.r == self.r

    def __hash__(self) -> int:
        return hash(self.r)

    def __repr__(self) -> str:
        return self.r


def _flat(x: Any, out: list[int]) -> Any:
    """``x``'s structure with every int put in ``out`` (a ``_Hole`` in its place)."""
    t = type(x)
    if t is int:
        out.append(x)
        return _HOLE
    if t is tuple:
        if len(x) < 16 and set(map(type, x)) <= _INT:
            out.extend(x)
            return _RUNS[len(x)]
        return tuple(_flat(y, out) for y in x)
    if t is list:
        return (_LIST, tuple(_flat(y, out) for y in x))
    if t is float:
        return _Exact(x)
    return x


def _fill(skel: Any, it) -> Any:
    t = type(skel)
    if t is _Hole:
        return next(it) if skel is _HOLE else tuple(islice(it, skel.n))
    if t is _Exact:
        return skel.v
    if t is tuple:
        if skel and skel[0] is _LIST:
            return [_fill(s, it) for s in skel[1]]
        return tuple(_fill(s, it) for s in skel)
    return skel


_SIZES = NodeMemo()       # body -> (its buffer ids, their (shape, dtype)s, body_sizes' answer for them)


def body_sizes(k: Kernel, plan: KernelPlan) -> tuple[tuple, tuple[int, ...]]:
    """(structure with its sizes left out, the sizes): every int of its nodes' shapes, of the
    attributes that hold sizes (``OpDef.attr_sizes``: reshape and expand targets, pad and shrink
    amounts; axes and permutations are structure) and of its buffers' shapes. A kernel's lowering depends on these and nothing else
    of the plan: the pair is the lowering's memo key too (devices.kernel_structure), so a body is
    walked once for both. Buffers are named by parameter position (``Kernel.params``: the outputs,
    then the inputs), constants by ``repr`` (so -0.0, NaN and 0.0 stay apart), as are floats elsewhere."""
    ast, bufs = k.ast, k.params
    specs = tuple(plan.buffers[b] for b in bufs)
    hit = _SIZES.get(ast)
    if hit is not None and hit[0] == bufs and hit[1] == specs:
        return hit[2]
    pos = {b: i for i, b in enumerate(bufs)}
    order = ast.walk()
    index = {id(n): i for i, n in enumerate(order)}
    items, sizes = [], []
    add, sized = items.append, SIZED_ARG
    for n in order:
        op = n.op
        if op == "BUF":
            arg = ("buf", pos[n.arg])
        elif op == "CONST":
            # (a constant that is a size of the program, ``size_value``, prints as its float but
            # is another body: resize maps it to the new size, a plain constant it keeps -- one
            # skeleton for both gave a Size body the builder of a plain one, which kept the size)
            arg = ("size" if is_size(n.arg) else "const", repr(n.arg))
        elif op in sized:                   # (a GROUP root is not an op of the table)
            arg = _flat(n.arg, sizes)
        else:                           # axes, a permutation, a dtype: structure, not sizes
            arg = n.arg
        add((op, arg, _flat(n.shape, sizes), n.dtype.name, tuple([index[id(x)] for x in n.src])))
    params = tuple((_flat(tuple(shp), sizes), dt.name) for shp, dt in specs)
    out = ((tuple(items), params), tuple(sizes))
    _SIZES.put(ast, (bufs, specs, out))
    return out


_SIZE_SETS = NodeMemo()   # body -> (body_sizes' sizes, their distinct values)


def body_size_set(k: Kernel, plan: KernelPlan) -> frozenset[int]:
    """The distinct values of ``body_sizes(k, plan)[1]``, kept per body: graph/resize.py asks it of
    every kernel of a plan it resizes (whether all of a body's sizes stay), and a decoder's body
    holds ~100 sizes of ~5 values."""
    sizes = body_sizes(k, plan)[1]
    hit = _SIZE_SETS.get(k.ast)
    if hit is None or hit[0] is not sizes:
        hit = _SIZE_SETS.put(k.ast, (sizes, frozenset(sizes)))
    return hit[1]


# body skeleton -> ``body_builder``'s function (None: not one it builds)
_BUILDERS: dict[tuple, Any] = {}
# _BUILDERS_MAX: docs/lowering.md, Constants
_BUILDERS_MAX = 512


def body_builder(k: Kernel, plan: KernelPlan) -> Any:
    """A function ``build(v, old, moved)`` that makes the body of ``k``'s structure (its
    ``body_sizes`` skeleton) with the sizes ``v`` (in ``body_sizes`` order) from ``old``, ``k``'s
    body's ``walk()``: the new nodes in the same order, each ``old``'s node where no size of its
    subtree is at a position of ``moved`` (a set of indices into ``v``). Generated once per
    structure (graph/resize.py's direct walk makes a growing sequence's changed bodies with it: the
    generic walk, which checks and works out each node's shape, took ~4 us a node, 0.3 ms of a
    decode step); it checks nothing -- resize's ``verify`` checks every node it makes. None for a
    body with an op whose sizes this module does not know, or a constant that is a size."""
    skel = body_sizes(k, plan)[0]
    hit = _BUILDERS.get(skel, _NO_BUILDER)
    if hit is _NO_BUILDER:
        if len(_BUILDERS) >= _BUILDERS_MAX:
            _BUILDERS.clear()
        hit = _BUILDERS[skel] = _make_builder(skel, k.ast.walk())
    return hit


_NO_BUILDER = object()


def _make_builder(skel: tuple, order: list[KNode]) -> Any:
    """``body_builder``'s function for skeleton ``skel`` (``order``: a body of it, walked), or None."""
    items = skel[0]
    consts: list[Any] = []
    subtree: list[frozenset[int]] = []
    lines = []
    pos = 0
    for i, ((op, arg, shape, _, src), n) in enumerate(zip(items, order)):
        if op == "CONST":
            if is_size(n.arg):
                return None
        elif op != "BUF" and not known_op(n.op, n.arg):
            return None
        start = pos
        if op in SIZED_ARG:
            arg_e, pos = _expr(arg, pos, consts)
        else:                           # a buffer id, a constant, axes: the old node's
            arg_e = f"o[{i}].arg"
        shape_e, pos = _expr(shape, pos, consts)
        mine = set(range(start, pos))
        for j in src:
            mine |= subtree[j]
        subtree.append(frozenset(mine))
        srcs = "(" + "".join(f"n{j}, " for j in src) + ")"
        lines.append(f" n{i} = o[{i}] if ch.isdisjoint(S[{i}]) else "
                     f"K({op!r}, {srcs}, {arg_e}, {shape_e}, o[{i}].dtype)\n")
    made = ", ".join(f"n{i}" for i in range(len(items)))
    code = "def build(v, o, ch):\n" + "".join(lines) + f" return [{made}]\n"
    scope: dict[str, Any] = {"K": KNode, "S": subtree, "C": consts}
    exec(compile(code, "<eqgrad body builder>", "exec"), scope)      # noqa: S102 (our own code)
    return scope["build"]


def _expr(sk: Any, pos: int, consts: list[Any]) -> tuple[str, int]:
    """The Python expression that rebuilds ``_flat``'s structure ``sk`` from the sizes ``v`` at
    ``pos`` on (and the position after it); other values from ``consts`` (``C``)."""
    t = type(sk)
    if t is _Hole:
        if sk.n < 0:                       # (_HOLE: one int; _LIST only heads a tuple)
            return f"v[{pos}]", pos + 1
        return "(" + "".join(f"v[{pos + j}], " for j in range(sk.n)) + ")", pos + sk.n
    if t is tuple:
        items = sk[1] if sk and sk[0] is _LIST else sk
        parts = []
        for y in items:
            e, pos = _expr(y, pos, consts)
            parts.append(e)
        if sk and sk[0] is _LIST:
            return "[" + ", ".join(parts) + "]", pos
        return "(" + "".join(p + ", " for p in parts) + ")", pos
    consts.append(sk.v if t is _Exact else sk)
    return f"C[{len(consts) - 1}]", pos


def _ints(x: Any, out: list[int]) -> None:
    """The ints of ``x`` into ``out``, in ``_flat``'s order (its skeleton not built)."""
    t = type(x)
    if t is int:
        out.append(x)
    elif t is tuple or t is list:
        for y in x:
            if type(y) is int:
                out.append(y)
            else:
                _ints(y, out)


def carry_sizes(old: Kernel, old_plan: KernelPlan, old_order: list[KNode], new: Kernel, new_plan: KernelPlan,
                new_order: list[KNode]) -> None:
    """Keep ``body_sizes`` of ``new``, whose body was made node for node from ``old``'s (graph/resize.py's
    direct walk: the same ops, sources, buffers, dtypes and attributes other than sizes, in the same
    walk order ``new_order``, shapes of the same ranks), from ``old``'s structure and ``new``'s sizes
    only: a changed kernel of a growing sequence's step is looked up by its sizes in every stage
    after (the device's BLAS choice, its disk lookup, its trace), and walking its body for the
    structure again cost ~28 us of ~30. Nothing is kept where ``old``'s answer is not known, or a
    constant of the two bodies differs (constants are structure)."""
    hit = _SIZES.get(old.ast)
    if hit is None or hit[0] != old.params or new.params != old.params:
        return
    specs = tuple(old_plan.buffers[b] for b in old.params)
    if hit[1] != specs:
        return
    sizes: list[int] = []
    sized = SIZED_ARG
    for o, n in zip(old_order, new_order):
        op = n.op
        if op == "CONST":
            if o.arg is not n.arg and repr(o.arg) != repr(n.arg):
                return
        elif op in sized:
            _ints(n.arg, sizes)
        _ints(n.shape, sizes)
    new_specs = tuple(new_plan.buffers[b] for b in new.params)
    for (_, dt_old), (shp, dt) in zip(specs, new_specs):
        if dt != dt_old:
            return
        _ints(tuple(shp), sizes)
    _SIZES.put(new.ast, (new.params, new_specs, (hit[2][0], tuple(sizes))))


def keep_sizes(old: Kernel, new: Kernel, new_plan: KernelPlan, sizes: list[int]) -> None:
    """Keep ``body_sizes`` of ``new``, whose body ``body_builder`` made from ``old``'s with ``sizes``
    (the caller mapped ``body_sizes`` of ``old`` in its plan to them): ``old``'s structure and those
    sizes, where its buffers are those sizes say (``carry_sizes`` without the walk of the body)."""
    hit = _SIZES.get(old.ast)
    if hit is None or hit[0] != old.params or new.params != old.params:
        return
    new_specs = tuple(new_plan.buffers[b] for b in new.params)
    tail: list[int] = []
    for (_, dt_old), (shp, dt) in zip(hit[1], new_specs):
        if dt != dt_old:
            return
        _ints(tuple(shp), tail)
    if tail and list(sizes[-len(tail):]) != tail:
        return
    _SIZES.put(new.ast, (new.params, new_specs, (hit[2][0], tuple(sizes))))


def with_sizes(k: Kernel, plan: KernelPlan, values: list[Any]) -> tuple[Kernel, KernelPlan]:
    """``k`` and ``plan`` with the body's sizes (``body_sizes`` order) replaced by ``values``."""
    it = iter(values)
    new: dict[int, KNode] = {}
    for n in k.ast.walk():
        arg = _fill(_flat(n.arg, []), it) if n.op in SIZED_ARG else n.arg
        shape = _fill(_flat(n.shape, []), it)
        new[id(n)] = KNode(n.op, tuple(new[id(s)] for s in n.src), arg, shape, n.dtype)
    buffers = list(plan.buffers)
    for b in k.params:
        shp, dt = plan.buffers[b]
        buffers[b] = (_fill(_flat(tuple(shp), []), it), dt)
    return replace(k, ast=new[id(k.ast)]), replace(plan, buffers=buffers, kernels=[])
