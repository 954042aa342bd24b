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
next region's kernels), and no kernel fuses across it. So a single-tensor point is cut only where
that tensor is read by or after a contraction (``worth_cutting``): inside a layer norm or a
softmax, one tensor flows on too, and a cut there splits one row-fused kernel into two or three.
For a transformer's residual stream that is the plan one wants anyway (the monolithic
extraction of a 30-layer decoder recomputed the sum of every earlier residual branch in each
layer's kernels: 50 distinct kernels where 16 repeat).
Training steps have no such cuts (the backward pass reads the forward's activations); for them
``periodic`` finds the repeats in the program's order instead (each layer's forward, backward and
update) and cuts those, never materializing a view or a broadcast across a cut (``views``: a later
region recomputes them). A chain without reductions is cut only where it is longer than a kernel
body may be (``max_nodes``), every largest multiple of its period that fits one; a shorter one
plans whole. ``split`` returns None unless some
region repeats and the repeats hold at least ``MIN_SAVED_NODES`` nodes: below that, planning the
program whole costs little and keeps every fusion. docs/engine.md has what the cuts cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from eqgrad.dtype import DType
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, broadcast_product
from eqgrad.graph.program import ConstLeaf, Input, Node, ParamLeaf, Program, Ref, is_node
from eqgrad.ops import MOVEMENT_OPS, OPS, Shape, numel

_MOVEMENT = frozenset(MOVEMENT_OPS)

# the measurement behind each of these values: docs/lowering.md, Constants
MIN_SAVED_NODES = 128      # nodes that repeated regions must spare from planning before the program is cut
PERIOD_REDUCTIONS = 4      # a repeat's length is looked for up to this many reductions ahead (periodic)
CHAIN_PERIOD_MAX = 256     # ... and in a stretch without reductions, up to this many nodes ahead
CHAIN_SAMPLES = 64         # nodes of a program whose next occurrences suggest such lengths (bounds the work)
CHAIN_PHASES = 4           # phases of a chain's repeat tried, cheapest cut first, for repeats of equal programs
MIN_STRETCH_NODES = 32     # nodes a stretch of repeats must spare to be cut out (periodic; the whole: MIN_SAVED_NODES)


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


def _cut_points(prog: Program) -> list[tuple[int, int, int]]:
    """(p, the node, its last reader) for each position p (0 < p < len(nodes)) where exactly one
    node before p is read at or after p, and that node has no more elements than the data it is made of
    (``_data``): a cut materializes the tensor that flows across it, and a broadcast materialized
    there -- a product before its sum: a first attention layer, whose input is a realized buffer,
    has such a point between q k^T's product and its sum -- is written at many times its data's size
    and no longer fuses into the sum (BERT's first layer: 1.5 + 0.7 ms measured for the materialized
    product and its sum, where the fused contraction is predicted at 0.3 ms)."""
    n = len(prog.nodes)
    last = [-1] * n
    for j, nd in enumerate(prog.nodes):
        for s in nd.src:
            if is_node(s):
                last[s] = j
    delta = [0] * (n + 1)
    xor = [0] * (n + 1)                # the xor of the nodes live at p: the live node where one is
    for i, l in enumerate(last):
        if l > i:
            delta[i + 1] += 1
            delta[l + 1] -= 1
            xor[i + 1] ^= i
            xor[l + 1] ^= i
    data = _data(prog)
    out, live, which = [], 0, 0
    for p in range(1, n):
        live += delta[p]
        which ^= xor[p]
        if live == 1 and numel(prog.nodes[which].shape) <= data[which]:
            out.append((p, which, last[which]))
    return out


def cuts(prog: Program) -> list[int]:
    """Positions p (0 < p < len(nodes)) where exactly one node before p is read at or after p, and
    that node has no more elements than the data it is made of (``_cut_points``)."""
    return [p for p, _, _ in _cut_points(prog)]


def worth_cutting(prog: Program) -> list[int]:
    """The cuts ``_split_at_cuts`` takes: those where the tensor flowing on is an operand of a
    contraction (a sum of a product with a broadcast factor, graph/plan.py ``broadcast_product``:
    a matmul, a convolution) or is still read after one that follows the cut -- a layer's output,
    read by the next layer's projections; the residual stream, read by them and again by the
    residual sum after them. Where every read of it comes before the next contraction, planned
    whole its readers fuse with its producer (a layer norm's ``x - mean``, read by the variance and
    by the output: one row-fused kernel), and a cut there split them: BERT's encoder ran each layer
    norm as 3 kernels and each softmax as 2 (docs/engine.md)."""
    nodes = prog.nodes
    op = lambda h: nodes[h].op if is_node(h) else None
    srcs = lambda h: nodes[h].src if is_node(h) else ()
    before = [0]                          # contractions among the nodes before each position
    reach = list(range(len(nodes)))       # a contraction's factors (through views): its position
    for c, nd in enumerate(nodes):
        hit = nd.op == "RSUM" and is_node(nd.src[0]) and broadcast_product(nd.src[0], op, srcs)
        before.append(before[-1] + hit)
        if hit:
            reach[nd.src[0]] = c
            for f in nodes[nd.src[0]].src:
                while is_node(f) and (nodes[f].op == "EXPAND" or nodes[f].op in _MOVEMENT):
                    reach[f] = c
                    f = nodes[f].src[0]
    readers: list[list[int]] = [[] for _ in nodes]
    for j, nd in enumerate(nodes):
        for q in nd.src:
            if is_node(q):
                readers[q].append(j)
    return [p for p, t, _ in _cut_points(prog)
            if before[max(reach[r] for r in readers[t]) + 1] > before[p]]


def _region(prog: Program, start: int, end: int, later: set[int], inline: list[bool] | None = None) -> Region:
    """The nodes [start, end) as a program; ``later``: nodes read after ``end`` or requested.
    ``inline``: per program node, whether a read of it from an earlier region copies it (and, the
    same way, its sources) into this one instead of reading it as an input (``periodic``)."""
    inputs: list[Ref] = []
    in_pos: dict[object, int] = {}
    params: list[int] = []
    par_pos: dict[int, int] = {}
    nodes: list[Node] = []
    local: dict[int, int] = {}             # program node -> its index in ``nodes``

    def ref(r: Ref) -> Ref:
        if is_node(r) and r in local:
            return local[r]
        if isinstance(r, ConstLeaf):
            return r
        if isinstance(r, ParamLeaf):
            if r.index not in par_pos:
                par_pos[r.index] = len(params)
                params.append(r.index)
            return ParamLeaf(par_pos[r.index], r.shape, r.dtype)
        if is_node(r) and inline is not None and inline[r]:
            return add(r)                   # a view or broadcast of earlier data: recomputed here
        key = ("n", r) if is_node(r) else ("b", r.pos)
        if key not in in_pos:
            in_pos[key] = len(inputs)
            inputs.append(r)
        shape, dtype = (prog.nodes[r].shape, prog.nodes[r].dtype) if is_node(r) else (r.shape, r.dtype)
        return Input(in_pos[key], shape, dtype)

    def add(i: int) -> int:
        nd = prog.nodes[i]
        src = tuple(ref(q) for q in nd.src)
        nodes.append(Node(nd.op, nd.arg, nd.shape, nd.dtype, src))
        local[i] = len(nodes) - 1
        return local[i]

    for i in range(start, end):
        add(i)
    roots = [i for i in range(start, end) if i in later]
    specs = [Spec(prog.nodes[r].shape, prog.nodes[r].dtype) if is_node(r) else Spec(r.shape, r.dtype) for r in inputs]
    sub = Program(nodes, specs, [local[i] for i in roots], prog.device,    # type: ignore[arg-type]
                  [prog.params[i] for i in params])
    return Region(start, end, inputs, params, roots, sub)


def _leaf_sig(r: Ref) -> tuple:
    """What two leaves must share to sit at the same place of two repeats of a layer."""
    if isinstance(r, ConstLeaf):
        return ("C", repr(r.value), r.shape, r.dtype.name)
    return ("I" if isinstance(r, Input) else "P", r.shape, r.dtype.name)


def _periods(prog: Program) -> list[int]:
    """Candidate lengths of a repeated segment: the distances between a reduction and the next
    few reductions of the same op and shape (a layer's matmul and the next layer's)."""
    red = [i for i, nd in enumerate(prog.nodes) if _is_reduce(nd.op)]
    out: set[int] = set()
    for j, a in enumerate(red):
        na = prog.nodes[a]
        for b in red[j + 1:j + 1 + PERIOD_REDUCTIONS]:
            nb = prog.nodes[b]
            if (nb.op, nb.arg, nb.shape) == (na.op, na.arg, na.shape) and b - a >= 2:
                out.add(b - a)
    return sorted(out)


def _chain_periods(prog: Program, max_nodes: int) -> set[int]:
    """Repeat lengths for the stretches of a program without reductions: a multiple of a period
    of the stretch's ops (the distance from a node to the next few nodes of the same op, attribute,
    shape and dtype), the largest that fits a kernel body (``max_nodes``, the cost model's cap:
    an elementwise chain longer than that is cut by the extractor anyway, so cutting it every
    that-many nodes costs at most one cut in ``max_nodes // period``)."""
    nodes, n = prog.nodes, len(prog.nodes)
    sig = [(nd.op, nd.arg, nd.shape, nd.dtype) for nd in nodes]
    out: set[int] = set()
    for i in range(0, n, max(1, n // CHAIN_SAMPLES)):
        if _is_reduce(nodes[i].op):
            continue
        found: list[int] = []
        for j in range(i + 1, min(n, i + 1 + CHAIN_PERIOD_MAX)):
            if _is_reduce(nodes[j].op):
                break
            if sig[j] == sig[i]:
                L = j - i
                # (a multiple of a shorter distance gives a shorter repeat of the same period)
                if L <= max_nodes and not any(L % f == 0 for f in found):
                    out.add(max_nodes // L * L)
                found.append(L)
                if len(found) == PERIOD_REDUCTIONS:
                    break
    return out


def _runs(prog: Program, L: int, chain: bool = False) -> list[tuple[int, int]]:
    """Maximal [a, e) where every node i matches node i + L: the same op, attribute, shape and
    dtype, and sources that are both nodes (wherever they are: a layer's backward reads its own
    forward's activation, a different distance back for each layer) or leaves alike. A cheap
    filter: the repeats it suggests are kept only where their region programs' keys agree
    (``periodic``), which compares the sources exactly. ``chain``: a realized input of node i also
    matches a node read by node i + L (a chain's first op reads the input where its repeats read
    the op before them: a cut makes that an input of their region too)."""
    nodes, n = prog.nodes, len(prog.nodes)
    runs, start = [], None
    for i in range(n - L):
        x, y = nodes[i], nodes[i + L]
        ok = (x.op, x.arg, x.shape, x.dtype) == (y.op, y.arg, y.shape, y.dtype) and len(x.src) == len(y.src)
        if ok:
            for u, v in zip(x.src, y.src):
                if chain and isinstance(u, Input) and is_node(v):
                    continue
                if is_node(u) != is_node(v) or (not is_node(u) and _leaf_sig(u) != _leaf_sig(v)):
                    ok = False
                    break
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, n - L))
    return [(a, e) for a, e in runs if e - a >= L]


def views(prog: Program) -> list[bool]:
    """Per node: a view or a broadcast -- a movement op, or an elementwise op with more elements
    than the data it is made of (a weight gradient's (batch, out, in) outer product before its
    sum). Planned whole, these fuse into their consumers; so a region that reads one from an
    earlier region recomputes it from that data (``_region``'s ``inline``) rather than have a cut
    materialize it -- the linearized order puts an activation's broadcast next to the activation,
    and its use, the weight gradient, in the update, many layers later."""
    data = _data(prog)
    out = [OPS[nd.op].kind == "movement" or (OPS[nd.op].kind in ("unary", "binary", "ternary") and numel(nd.shape) > d)
           for nd, d in zip(prog.nodes, data)]
    # and an elementwise op of values that would be materialized anyway (two or more readers, seen
    # through the views they are read by: a matmul's sum is read reshaped): a relu mask of a
    # pre-activation is recomputed by the backward that reads it, and the relu itself (the mask and
    # the pre-activation each have two readers) by the next layer, as a whole plan does. Until the
    # views were seen through, a ReLU MLP step's forward regions wrote the mask and the relu, each
    # recomputing the layer's product: 83 kernels and 442 us predicted against 70 and 377 us planned
    # whole (tests/test_regions.py)
    readers = _readers(prog, out)
    view = list(out)

    def data_of(q: int) -> int:
        """The node a view reads its data from (through movement ops: a matmul's reshaped sum)."""
        while view[q] and OPS[prog.nodes[q].op].kind == "movement" and is_node(prog.nodes[q].src[0]):
            q = prog.nodes[q].src[0]
        return q
    for i, nd in enumerate(prog.nodes):
        if not out[i] and OPS[nd.op].kind in ("unary", "binary", "ternary") and any(is_node(q) for q in nd.src) \
                and all(not is_node(q) or (not view[d] and len(readers[d]) >= 2)
                        for q in nd.src for d in ((data_of(q),) if is_node(q) else ())):
            out[i] = True
    return out


def _data(prog: Program) -> list[int]:
    """Per node: the elements of the data it is made of -- its own for a reduction or a leaf's
    reader, else its largest source's (an expand of a vector is made of the vector)."""
    data: list[int] = []
    for nd in prog.nodes:
        srcs = [data[q] if is_node(q) else (numel(q.shape) if isinstance(q, Input) else 1) for q in nd.src]
        data.append(numel(nd.shape) if OPS[nd.op].kind == "reduce" or not srcs else max(srcs))
    return data


def _readers(prog: Program, inline: list[bool]) -> list[set[int]]:
    """Per node: the nodes that read it where it is materialized (through views, which are
    recomputed where they are read; a program output is materialized where it is)."""
    n = len(prog.nodes)
    roots = {r for r in prog.roots if is_node(r)}
    readers: list[set[int]] = [set() for _ in range(n)]
    for j in range(n - 1, -1, -1):
        through = inline[j] and j not in roots
        for q in prog.nodes[j].src:
            if is_node(q):
                readers[q] |= readers[j] if through else {j}
    return readers


def _materialized_uses(prog: Program, readers: list[set[int]]) -> list[int]:
    """Per node: the last of its materialized readers (``_readers``); a program output: past the end."""
    n = len(prog.nodes)
    roots = {r for r in prog.roots if is_node(r)}
    return [n if i in roots else max(rs, default=-1) for i, rs in enumerate(readers)]


def _outputs(lo: int, hi: int, inline: list[bool], mlu: list[int], roots: set) -> set[int]:
    """A region's outputs: what later regions read (views only when the program outputs them)."""
    return {i for i in range(lo, hi) if (mlu[i] >= hi and not inline[i]) or i in roots}


def periodic(prog: Program, max_nodes: int | None = None) -> tuple[list[int], list[bool]] | None:
    """Region bounds that cut each run of a repeated segment once per repeat (and the views the
    regions recompute, ``views``), or None.

    A training step has no single-tensor cuts (``cuts``: the backward pass reads the forward's
    activations), but its layers still repeat in the program's order: the forward of each hidden
    layer, then the backward of each, then each parameter's update. For each candidate length
    (``_periods``) the runs of nodes that match the node that length later (``_runs``) suggest
    repeats of one segment. A repeat is cut where it materializes the fewest elements (its values
    read after it, views excepted: a layer's activation, which its backward reads anyway); it must
    hold a reduction; and only stretches of at least two consecutive repeats whose region programs
    have equal keys are kept. The rest of the program -- the input layer, the loss, what lies
    between stretches -- is one region per gap. Candidates are taken largest saving first, without
    overlaps."""
    n = len(prog.nodes)
    inline = views(prog)
    # a value with two or more materialized readers (a pre-activation: its relu and its backward)
    # is materialized anyway, planned whole; one with a single reader (a matmul's sum before its
    # bias) would fuse into it
    readers = _readers(prog, inline)
    mlu = _materialized_uses(prog, readers)
    roots = set(prog.roots)

    def crossing(lo: int, hi: int) -> int:
        """Elements a cut after [lo, hi) materializes that a whole plan would not: its values read
        after it by a single reader (the program's outputs are materialized wherever cuts fall)."""
        return sum(numel(prog.nodes[i].shape) for i in _outputs(lo, hi, inline, mlu, roots)
                   if i not in roots and len(readers[i]) < 2)

    cands = []
    chain = _chain_periods(prog, max_nodes) if max_nodes else set()
    for L in sorted(set(_periods(prog)) | chain):
        for a, e in _runs(prog, L, L in chain):
            cands.append(((e - a) // L * L, L, a, e))
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    taken: list[tuple[int, int]] = []
    stretches: list[tuple[int, int, int]] = []     # (start, period, repeats)
    for saved, L, a, e in cands:
        if saved < MIN_STRETCH_NODES:
            break
        phases = []
        for o in range(L):
            reps = (e - a - o) // L + 1
            if reps < 2:
                break
            if L not in chain and not any(_is_reduce(prog.nodes[i].op) for i in range(a + o, a + o + L)):
                continue
            phases.append((crossing(a + o, a + o + L), o, reps))
        if not phases:
            continue
        # the phase that materializes the least; for a chain, the next cheapest ones too while its
        # repeats' programs differ (a cut after a view: the next repeat recomputes the view)
        phases.sort(key=lambda t: t[:2])
        for _, o, reps in phases[:CHAIN_PHASES if L in chain else 1]:
            start = a + o
            keys = [_region(prog, start + j * L, start + (j + 1) * L,
                            _outputs(start + j * L, start + (j + 1) * L, inline, mlu, roots), inline).program.key
                    for j in range(reps)]
            if keys[0] == keys[1]:
                break
        j = 0
        while j < reps:                          # stretches of equal consecutive keys
            m = j
            while m + 1 < reps and keys[m + 1] == keys[j]:
                m += 1
            lo, hi = start + j * L, start + (m + 1) * L
            if m > j and (m - j) * L >= MIN_STRETCH_NODES and all(hi <= t0 or lo >= t1 for t0, t1 in taken):
                taken.append((lo, hi))
                stretches.append((lo, L, m - j + 1))
            j = m + 1
    if not stretches:
        return None
    bounds = {0, n}
    for lo, L, reps in stretches:
        bounds.update(lo + j * L for j in range(reps + 1))
    for lo, L, reps in stretches:
        if L not in chain:
            continue
        # a chain's gap that fits one kernel with the repeat next to it joins that repeat (a region
        # of its own would be a kernel of its own; the joined repeat is planned apart, once)
        hi = lo + reps * L
        before = max((b for b in bounds if b < lo), default=None)
        if before is not None and lo - before + L <= max_nodes:
            bounds.discard(lo)
        after = min((b for b in bounds if b > hi), default=None)
        if after is not None and after - hi + L <= max_nodes:
            bounds.discard(hi)
    return sorted(bounds), inline


def _periodic_regions(prog: Program, bounds: list[int], inline: list[bool]) -> list[Region]:
    mlu = _materialized_uses(prog, _readers(prog, inline))
    roots = set(prog.roots)
    return [_region(prog, a, b, _outputs(a, b, inline, mlu, roots), inline) for a, b in zip(bounds, bounds[1:])]


def _saved(regions: list[Region]) -> int:
    """Nodes that planning each distinct region once spares: those of every repeat after the first."""
    seen: set[tuple] = set()
    saved = 0
    for r in regions:
        k = r.program.key
        if k in seen:
            saved += r.end - r.start
        seen.add(k)
    return saved


def split(prog: Program, max_nodes: int | None = None) -> list[Region] | None:
    """The program's regions, or None when planning it whole is the better deal (see above).
    ``max_nodes``: the largest kernel body the extractor forms (DeviceParams.max_nodes), which
    lets a long elementwise chain be cut (``periodic``); None: such chains plan whole."""
    if not prog.nodes or not all(is_node(r) for r in prog.roots):
        return None
    regs = _split_at_cuts(prog)
    if regs is None and (found := periodic(prog, max_nodes)) is not None:
        regs = _periodic_regions(prog, *found)
    return regs if regs is not None and _saved(regs) >= MIN_SAVED_NODES else None


def _split_at_cuts(prog: Program) -> list[Region] | None:
    bounds = [0]
    has_reduce = False
    cut_at = set(worth_cutting(prog))
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
    return regions if _saved(regions) >= MIN_SAVED_NODES else None


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
    notes = [f"{STITCHED} {len(regions)} regions, {distinct} distinct (engine/regions.py)"]
    return KernelPlan(buffers, len(prog.input_specs), kernels, outputs, predicted, notes,
                      max((p.launch for p in plans), default=0.0), max((p.cold for p in plans), default=0.0),
                      max((p.stream_bytes for p in plans), default=0))


STITCHED = "planned by regions:"        # the first note of a plan stitch() made


def stitched(plan: KernelPlan) -> bool:
    """Was ``plan`` stitched from separately planned regions (``stitch``; also when read back from
    the disk cache)? Such a plan has no e-graph of the whole program."""
    return bool(plan.notes) and plan.notes[0].startswith(STITCHED)


def _renumbered(k: Kernel, m: dict[int, int], name: str) -> Kernel:
    memo: dict[int, KNode] = {}
    for n in k.ast.walk():
        arg = m[n.arg] if n.op == "BUF" else n.arg
        memo[id(n)] = KNode(n.op, tuple(memo[id(s)] for s in n.src), arg, n.shape, n.dtype)
    return Kernel(name, m[k.out], memo[id(k.ast)], tuple(m[b] for b in k.inputs), k.predicted, k.nbytes, k.flops,
                  k.kind, k.stats)
