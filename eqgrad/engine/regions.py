"""Repeated layers plan once: a program is cut where a single tensor flows on, and regions of the
same structure share one saturation and extraction.

A model's layers repeat, and the cost of planning a program grows faster than the program. So
``split`` looks for **cuts**: points of the program's topological order where exactly one
computed tensor is still needed later -- the residual stream between two transformer blocks, the
activation between two layers of a forward pass (a program's outputs that nothing later reads
do not count). Between two cuts lies a *segment*; segments without a reduction are merged into
the next (an elementwise tail is planned with the reduction that follows it), so every
**region** holds at least one reduction. A region is a program of its own: the tensor flowing in
and the realized buffers it reads become its inputs (numbered by first use), its float parameters
its parameters, and what flows out and the outputs it computes its roots. Its ``Program.key`` is
its structure modulo which buffers it reads, so two layers of the same shapes have the same key:
the engine plans each distinct region once (core.py, ``_compile_regions``) and ``stitch``es the
regions' plans into the program's plan, each region's buffers renumbered into the whole.

The boundaries cost what the cut tensor costs: it is materialized (written once, read by the
next region's kernels), and no kernel fuses across it. For a transformer's residual stream that
is the plan one wants anyway (the monolithic extraction of a 30-layer decoder recomputed the sum
of every earlier residual branch in each layer's kernels: 50 distinct kernels where 16 repeat).
Training steps have no cuts (the backward pass reads the forward's activations), nor do chains
without reductions, so they plan whole. ``split`` returns None unless some region repeats and the
repeats hold at least ``MIN_SAVED_NODES`` nodes: below that, planning the program whole costs
little and keeps every fusion.
"""
from __future__ import annotations

from dataclasses import dataclass

from eqgrad.dtype import DType
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.graph.program import ConstLeaf, Input, Node, ParamLeaf, Program, Ref, is_node
from eqgrad.ops import OPS, Shape

MIN_SAVED_NODES = 128      # nodes that repeated regions must spare from planning before the program is cut


@dataclass(frozen=True)
class Spec:
    """A region's input as its program sees it: a realized buffer of this shape and dtype."""
    shape: Shape
    dtype: DType


@dataclass
class Region:
    start: int                           # the program's nodes [start, end) are this region's
    end: int
    inputs: list[Ref]                    # the program's refs that feed the region's inputs, in order
    params: list[int]                    # the program's parameter index of each region parameter
    roots: list[int]                     # the program's nodes the region outputs, in order
    program: Program                     # the region as a program of its own


def _is_reduce(op: str) -> bool:
    return OPS[op].kind == "reduce"


def cuts(prog: Program) -> list[int]:
    """Positions p (0 < p < len(nodes)) where exactly one node before p is read at or after p."""
    n = len(prog.nodes)
    last = [-1] * n
    for j, nd in enumerate(prog.nodes):
        for s in nd.src:
            if is_node(s):
                last[s] = j
    delta = [0] * (n + 1)
    for i, l in enumerate(last):
        if l > i:
            delta[i + 1] += 1
            delta[l + 1] -= 1
    out, live = [], 0
    for p in range(1, n):
        live += delta[p]
        if live == 1:
            out.append(p)
    return out


def _region(prog: Program, start: int, end: int, later: set[int]) -> Region:
    """The nodes [start, end) as a program; ``later``: nodes read after ``end`` or requested."""
    inputs: list[Ref] = []
    in_pos: dict[object, int] = {}
    params: list[int] = []
    par_pos: dict[int, int] = {}
    nodes: list[Node] = []

    def ref(r: Ref) -> Ref:
        if is_node(r) and r >= start:
            return r - start
        if isinstance(r, ConstLeaf):
            return r
        if isinstance(r, ParamLeaf):
            if r.index not in par_pos:
                par_pos[r.index] = len(params)
                params.append(r.index)
            return ParamLeaf(par_pos[r.index], r.shape, r.dtype)
        key = ("n", r) if is_node(r) else ("b", r.pos)
        if key not in in_pos:
            in_pos[key] = len(inputs)
            inputs.append(r)
        shape, dtype = (prog.nodes[r].shape, prog.nodes[r].dtype) if is_node(r) else (r.shape, r.dtype)
        return Input(in_pos[key], shape, dtype)

    for nd in prog.nodes[start:end]:
        nodes.append(Node(nd.op, nd.arg, nd.shape, nd.dtype, tuple(ref(s) for s in nd.src)))
    roots = [i for i in range(start, end) if i in later]
    specs = [Spec(prog.nodes[r].shape, prog.nodes[r].dtype) if is_node(r) else Spec(r.shape, r.dtype) for r in inputs]
    sub = Program(nodes, specs, [i - start for i in roots], prog.device,    # type: ignore[arg-type]
                  [prog.params[i] for i in params])
    return Region(start, end, inputs, params, roots, sub)


def split(prog: Program) -> list[Region] | None:
    """The program's regions, or None when planning it whole is the better deal (see above)."""
    if not prog.nodes or not all(is_node(r) for r in prog.roots):
        return None
    bounds = [0]
    has_reduce = False
    cut_at = set(cuts(prog))
    for p, nd in enumerate(prog.nodes):
        if p in cut_at and has_reduce:
            bounds.append(p)
            has_reduce = False
        has_reduce = has_reduce or _is_reduce(nd.op)
    if len(bounds) < 3:
        return None
    bounds.append(len(prog.nodes))
    if not has_reduce:                     # a trailing elementwise segment joins the region before it
        bounds.pop(-2)
    roots = set(prog.roots)
    last_use: dict[int, int] = {}          # node -> the last node that reads it
    for j, nd in enumerate(prog.nodes):
        for s in nd.src:
            if is_node(s):
                last_use[s] = j
    regions = []
    for a, b in zip(bounds, bounds[1:]):
        # a region outputs its nodes that a later region reads, and the requested ones
        out = {i for i in range(a, b) if last_use.get(i, -1) >= b or i in roots}
        regions.append(_region(prog, a, b, out))
    seen: dict[tuple, int] = {}
    saved = 0
    for r in regions:
        k = r.program.key
        if k in seen:
            saved += r.end - r.start
        seen[k] = seen.get(k, 0) + 1
    if saved < MIN_SAVED_NODES:
        return None
    return regions


def stitch(prog: Program, regions: list[Region], plans: list[KernelPlan]) -> KernelPlan:
    """The program's plan from its regions' plans: the program's inputs and parameters first, then
    every region's own buffers; each region reads the buffers its inputs name."""
    n_real = len(prog.inputs)
    buffers = list(prog.input_specs)
    of_node: dict[int, int] = {}
    kernels: list[Kernel] = []
    for reg, plan in zip(regions, plans):
        m: dict[int, int] = {}
        for j, r in enumerate(reg.inputs):
            m[j] = of_node[r] if is_node(r) else r.pos            # type: ignore[union-attr]
        for j, p in enumerate(reg.params):
            m[len(reg.inputs) + j] = n_real + p
        assert plan.n_inputs == len(reg.inputs) + len(reg.params), (plan.n_inputs, len(reg.inputs), len(reg.params))
        for b in range(plan.n_inputs, len(plan.buffers)):
            m[b] = len(buffers)
            buffers.append(plan.buffers[b])
        for k in plan.kernels:
            kernels.append(_renumbered(k, m, f"k{len(kernels)}"))
        for node, o in zip(reg.roots, plan.outputs):
            of_node[node] = m[o]
    outputs = [of_node[r] for r in prog.roots]                    # type: ignore[index]
    predicted = sum(k.predicted for k in kernels)
    distinct = len({r.program.key for r in regions})
    notes = [f"planned by regions: {len(regions)} regions, {distinct} distinct (engine/regions.py)"]
    return KernelPlan(buffers, len(prog.input_specs), kernels, outputs, predicted, notes)


def _renumbered(k: Kernel, m: dict[int, int], name: str) -> Kernel:
    memo: dict[int, KNode] = {}
    for n in k.ast.walk():
        arg = m[n.arg] if n.op == "BUF" else n.arg
        memo[id(n)] = KNode(n.op, tuple(memo[id(s)] for s in n.src), arg, n.shape, n.dtype)
    return Kernel(name, m[k.out], memo[id(k.ast)], tuple(m[b] for b in k.inputs), k.predicted, k.nbytes, k.flops)
