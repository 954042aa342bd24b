"""The saturated e-graph as eqgrad's extractors see it.

Read from egglog's serialized JSON (egraph-serialize format), or built directly from a program (eqgrad.graph.program)
when saturation was skipped or failed (the unoptimized e-graph: one node per class, every non-leaf
argument behind a ``Realize``). Analysis rows (``shape``, ``dtype``) are not choices; shapes and
dtypes are recomputed here from the op table, so the extractor never depends on the analysis
having saturated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from eqgrad.dtype import DTYPES, DType
from eqgrad.graph.program import ConstLeaf, Input, ParamLeaf, Program, is_node
from eqgrad.ops import EGG_TO_OP, OPS, PROVENANCE_PREFIX as PROV_PREFIX, RETYPES, OpDef, Shape


@dataclass(frozen=True)
class ENode:
    op: str                      # op-table name, e.g. "ADD"
    children: tuple[int, ...]    # e-class ids of the tensor arguments
    arg: Any                     # attribute in the frontend's representation (see ops.py)

    @property
    def d(self) -> OpDef:
        return OPS[self.op]


@dataclass
class EGraph:
    classes: list[list[ENode]] = field(default_factory=list)
    shapes: list[Shape | None] = field(default_factory=list)
    dtypes: list[DType | None] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    # the rule (or "input") that introduced each e-node: filled only from an instrumented saturation
    # (rules/provenance.py), else empty
    provenance: dict[ENode, str] = field(default_factory=dict)

    def add_class(self, nodes: list[ENode]) -> int:
        self.classes.append(nodes)
        self.shapes.append(None)
        self.dtypes.append(None)
        return len(self.classes) - 1

    @property
    def n_nodes(self) -> int:
        return sum(len(c) for c in self.classes)

    def infer(self) -> None:
        """Shapes and dtypes of every class from the op table: a class gets the type of its first
        node whose children all have theirs. A worklist over the nodes waiting on each class, so
        linear in the e-graph's edges: the fixpoint over all classes it replaced made a pass per
        level of a deep graph when classes came in a bad order (5.3 s of from_json for a 16-layer
        decoder step's 8,700 e-nodes)."""
        waiting: dict[int, list[tuple[int, ENode]]] = {}     # class -> (class, node) waiting on it
        missing_kids: dict[tuple[int, int], int] = {}
        ready: list[tuple[int, ENode]] = []
        for c, nodes in enumerate(self.classes):
            if self.shapes[c] is not None:
                continue
            for j, n in enumerate(nodes):
                kids = {k for k in n.children if self.shapes[k] is None}
                if not kids:
                    ready.append((c, n))
                    continue
                missing_kids[(c, j)] = len(kids)
                for k in kids:
                    waiting.setdefault(k, []).append((c, j))
        while ready:
            c, n = ready.pop()
            if self.shapes[c] is not None:
                continue
            r = self.node_type(n)
            if r is None:
                continue
            self.shapes[c], self.dtypes[c] = r
            for c2, j in waiting.pop(c, ()):
                left = missing_kids[(c2, j)] - 1
                missing_kids[(c2, j)] = left
                if left == 0 and self.shapes[c2] is None:
                    ready.append((c2, self.classes[c2][j]))
        missing = [c for c, s in enumerate(self.shapes) if s is None]
        if missing:
            raise RuntimeError(f"e-graph: no shape for classes {missing[:10]}")

    def node_type(self, n: ENode) -> tuple[Shape, DType] | None:
        if n.op == "BUF":
            return n.arg[1], n.arg[2]
        if n.op in ("CONST", "PARAM", "SIZE"):
            return n.arg[2], n.arg[1]
        if any(self.shapes[k] is None for k in n.children):
            return None
        d = n.d
        shape = d.shape_rule([self.shapes[k] for k in n.children], n.arg)
        return tuple(shape), d.dtype_rule([self.dtypes[k] for k in n.children], n.arg)


def _decode_arg(d: OpDef, prims: list[Any]) -> Any:
    if d.name == "BUF":
        return (int(prims[0]), tuple(prims[1]), DTYPES[prims[2]])
    if d.name == "CONST":
        return (float(prims[0]), DTYPES[prims[1]], tuple(prims[2]))
    if d.name in ("PARAM", "SIZE"):
        return (int(prims[0]), DTYPES[prims[1]], tuple(prims[2]))
    if d.name in RETYPES:
        return DTYPES[prims[0]]
    if d.name in ("PAD", "SHRINK"):
        return (tuple(prims[0]), tuple(prims[1]))
    if d.attrs == ("IVec",):
        return tuple(prims[0])
    return None


def _prim(nodes: dict, nid: str) -> Any:
    n = nodes[nid]
    op = n["op"]
    if op in ("vec-of", "vec-empty"):
        return [int(nodes[c]["op"]) for c in n["children"]]
    if op.startswith('"'):
        return json.loads(op)
    if op in ("NaN", "inf", "-inf"):
        return float(op.lower())
    return float(op) if any(ch in op for ch in ".eE") else int(op)


def from_json(js: str, root_lets: list[str]) -> EGraph:
    data = json.loads(js)
    nodes = data["nodes"]
    class_of: dict[str, int] = {}
    g = EGraph()
    t_classes = [cid for cid, cd in data["class_data"].items() if cd.get("type") == "T"]
    for cid in t_classes:
        class_of[cid] = g.add_class([])
    tags: list[tuple[ENode, str]] = []
    strings = {n["eclass"]: n["op"] for n in nodes.values() if n["op"].startswith('"')}
    for nid, n in nodes.items():
        op = n["op"]
        tag = op.startswith(PROV_PREFIX)
        d = EGG_TO_OP.get(op[len(PROV_PREFIX):] if tag else op)
        if d is None or n.get("subsumed") or (not tag and n["eclass"] not in class_of):
            continue
        kids = [c for c in n["children"]]
        tensor_kids = tuple(class_of[nodes[c]["eclass"]] for c in kids[:d.arity])
        prims = [_prim(nodes, c) for c in kids[d.arity:]]
        node = ENode(d.name, tensor_kids, _decode_arg(d, prims))
        if tag:
            if n["eclass"] in strings:
                tags.append((node, json.loads(strings[n["eclass"]])))
            continue
        g.classes[class_of[n["eclass"]]].append(node)
    g.provenance = dict(tags)
    let_class: dict[str, int] = {}
    for cid, cd in data["class_data"].items():
        for name in (cd.get("let") or "").split(","):
            if name.strip():
                let_class[name.strip()] = class_of[cid]
    g.roots = [let_class[r] for r in root_lets]
    # dedupe nodes (the same node can be listed under several table rows)
    g.classes = [list(dict.fromkeys(c)) for c in g.classes]
    _split_self_realize(g)
    g.infer()
    return g


def _split_self_realize(g: EGraph) -> None:
    """Give back each class that holds its own materialization its "x, or x from a buffer" form.

    A rule that returns one of its arguments (``max(x, x) -> x``, ``x * 1 -> x``), applied in the
    cleanup phase to a fused form, unions ``x`` with ``Realize(x)``: the fused ``Max(x, x)`` sits in
    the class of ``Max(Realize x, Realize x)``, which the rule had already made the class of
    ``Realize(x)``. A class containing ``Realize(itself)`` cannot be materialized by a one-node-per-
    class plan (its consumers could only inline it: a reduction recomputed under a broadcast), so
    the class is split: its value nodes are copied to a new class ``v`` and ``Realize(self)``
    becomes ``Realize(v)``. Every node still computes the class's value; found by the fuzzer
    (``max(x, x)`` and ``x + expand(x)`` of one reduction ``x``)."""
    for c in range(len(g.classes)):
        nodes = g.classes[c]
        selfs = [n for n in nodes if n.op == "REALIZE" and n.children == (c,)]
        if not selfs:
            continue
        v = g.add_class([n for n in nodes if n not in selfs])
        g.classes[c] = [ENode("REALIZE", (v,), n.arg) if n in selfs else n for n in nodes]


def from_program(prog: Program) -> EGraph:
    """The unsaturated e-graph of a program, exactly as ``rules.ir.emit_program`` inserts it."""
    g = EGraph()
    consts: dict[tuple, int] = {}
    bufs: dict[int, int] = {}

    def leaf(r: Input | ConstLeaf | ParamLeaf) -> int:
        if isinstance(r, ParamLeaf):
            key = ("P", r.index, r.shape)
            if key not in consts:
                consts[key] = g.add_class([ENode("PARAM", (), (r.index, r.dtype, r.shape))])
            return consts[key]
        if isinstance(r, ConstLeaf):
            key = (float(r.value), r.dtype.name, r.shape)
            if key not in consts:
                consts[key] = g.add_class([ENode("CONST", (), (float(r.value), r.dtype, r.shape))])
            return consts[key]
        if r.pos not in bufs:
            bufs[r.pos] = g.add_class([ENode("BUF", (), (r.pos, r.shape, r.dtype))])
        return bufs[r.pos]

    cls: list[int] = []
    realize: dict[int, int] = {}
    for n in prog.nodes:
        kids = []
        for s in n.src:
            if not is_node(s):
                kids.append(leaf(s))
                continue
            if cls[s] not in realize:
                realize[cls[s]] = g.add_class([ENode("REALIZE", (cls[s],), None)])
            kids.append(realize[cls[s]])
        cls.append(g.add_class([ENode(n.op, tuple(kids), n.arg)]))
    g.roots = [cls[r] if is_node(r) else leaf(r) for r in prog.roots]
    g.infer()
    return g
