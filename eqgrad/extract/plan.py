"""KernelPlan: what runs. Built from an extraction choice (one e-node per e-class).

A kernel is a root of the program or a chosen ``Realize``; its body is the DAG of chosen nodes
reachable from it without crossing a ``Realize``/``Buf``/``Const`` (those become loads and
constants). Buffers are numbered: the realize's inputs first, then one per kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dtype import DType, cast_scalar
from ..ops import OPS, Shape, numel
from .egraph import EGraph, ENode


@dataclass(frozen=True, eq=False)
class KNode:
    """A node of a kernel body. ``BUF``'s arg is a plan buffer id; ``CONST``'s is its scalar."""
    op: str
    src: tuple["KNode", ...]
    arg: Any
    shape: Shape
    dtype: DType

    def walk(self) -> list["KNode"]:
        """Topological order (sources first), each node once."""
        out: list[KNode] = []
        seen: set[int] = set()
        stack: list[tuple[KNode, bool]] = [(self, False)]
        while stack:
            n, done = stack.pop()
            if done:
                out.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            stack.extend((s, False) for s in reversed(n.src) if id(s) not in seen)
        return out

    def buffers(self) -> tuple[int, ...]:
        """The plan buffers this body reads, in first-use order (a kernel's ``inputs``)."""
        return tuple(dict.fromkeys(n.arg for n in self.walk() if n.op == "BUF"))

    def render(self) -> str:
        """A readable one-line form, e.g. ``MUL(ADD(b0, b1), 2.0)``."""
        memo: dict[int, str] = {}
        for n in self.walk():
            if n.op == "BUF":
                memo[id(n)] = f"b{n.arg}"
            elif n.op == "CONST":
                memo[id(n)] = repr(n.arg)
            else:
                a = "" if n.arg is None else f", {n.arg.name if isinstance(n.arg, DType) else n.arg}"
                memo[id(n)] = f"{n.op}({', '.join(memo[id(s)] for s in n.src)}{a})"
        return memo[id(self)]


@dataclass
class Kernel:
    name: str
    out: int                      # buffer id written
    ast: KNode
    inputs: tuple[int, ...]       # buffer ids read, in first-use order
    predicted: float = 0.0        # cost model seconds
    nbytes: int = 0
    flops: int = 0


@dataclass
class KernelPlan:
    buffers: list[tuple[Shape, DType]]
    n_inputs: int
    kernels: list[Kernel]
    outputs: list[int]            # buffer id of each requested target
    predicted: float = 0.0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"plan: {len(self.kernels)} kernel(s), predicted {self.predicted*1e6:.1f} us"]
        for k in self.kernels:
            shp, dt = self.buffers[k.out]
            lines.append(f"  {k.name}: b{k.out}{list(shp)} {dt.name} = {k.ast.render()}"
                         f"    [{k.nbytes/1e6:.3g} MB, {k.flops/1e6:.3g} MFLOP, {k.predicted*1e6:.1f} us]")
        lines.append(f"  outputs: {', '.join(f'b{o}' for o in self.outputs)}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def build_plan(g: EGraph, choice: dict[int, ENode], input_specs: list[tuple[Shape, DType]],
               costs: dict[int, Any] | None = None) -> KernelPlan:
    buffers = list(input_specs)
    kernels: list[Kernel] = []
    buffer_of: dict[int, int] = {}

    def leaf_node(c: int) -> KNode | None:
        n = choice[c]
        if n.op == "BUF":
            return KNode("BUF", (), n.arg[0], g.shapes[c], g.dtypes[c])
        if n.op == "CONST":
            return KNode("CONST", (), cast_scalar(n.arg[0], g.dtypes[c]), g.shapes[c], g.dtypes[c])
        return None

    def kernel_for(k: int) -> int:
        """Emit (once) the kernel computing class k; returns its buffer id. Iterative DFS."""
        if k in buffer_of:
            return buffer_of[k]
        # collect kernel dependencies first (post-order), so producers come before consumers
        stack: list[tuple[int, bool]] = [(k, False)]
        while stack:
            c, done = stack.pop()
            if c in buffer_of:
                continue
            if done:
                _emit(c)
                continue
            stack.append((c, True))
            for dep in _deps(c):
                if dep not in buffer_of:
                    stack.append((dep, False))
        return buffer_of[k]

    def _body_classes(k: int) -> list[int]:
        out, seen, stack = [], set(), [k]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            out.append(c)
            n = choice[c]
            if n.op in ("BUF", "CONST") or (n.op == "REALIZE" and c != k):
                continue
            stack.extend(n.children)
        return out

    def _deps(k: int) -> list[int]:
        deps = []
        for c in _body_classes(k):
            n = choice[c]
            if n.op == "REALIZE" and leaf_node(n.children[0]) is None:
                deps.append(n.children[0])
        return deps

    def _emit(k: int) -> None:
        memo: dict[int, KNode] = {}

        def build(c: int) -> KNode:
            # iterative post-order build of the body DAG
            stack: list[tuple[int, bool]] = [(c, False)]
            while stack:
                x, done = stack.pop()
                if x in memo:
                    continue
                n = choice[x]
                lf = leaf_node(x)
                if lf is not None:
                    memo[x] = lf
                    continue
                if n.op == "REALIZE" and x != k:
                    inner = n.children[0]
                    lf = leaf_node(inner)
                    memo[x] = lf if lf is not None else KNode("BUF", (), buffer_of[inner], g.shapes[x], g.dtypes[x])
                    continue
                if not done:
                    stack.append((x, True))
                    stack.extend((ch, False) for ch in n.children if ch not in memo)
                    continue
                if n.op in ("CONTIGUOUS", "REALIZE"):
                    memo[x] = memo[n.children[0]]
                else:
                    memo[x] = KNode(n.op, tuple(memo[ch] for ch in n.children), n.arg, g.shapes[x], g.dtypes[x])
            return memo[c]

        ast = build(k)
        bid = len(buffers)
        buffers.append((g.shapes[k], g.dtypes[k]))
        buffer_of[k] = bid
        ins = ast.buffers()
        kc = costs.get(k) if costs else None
        kernels.append(Kernel(f"k{len(kernels)}", bid, ast, ins,
                              kc.seconds if kc else 0.0, kc.bytes if kc else 0, kc.flops if kc else 0))

    outputs = []
    for r in g.roots:
        n = choice[r]
        if n.op == "BUF" and g.shapes[r] == input_specs[n.arg[0]][0]:
            outputs.append(n.arg[0])            # nothing to compute: alias the input buffer
        else:
            outputs.append(kernel_for(r))
    plan = KernelPlan(buffers, len(input_specs), kernels, outputs)
    plan.predicted = sum(k.predicted for k in kernels)
    return plan


def check_plan(plan: KernelPlan) -> None:
    """Structural invariants every plan must meet (used by tests and on validation)."""
    written = set(range(plan.n_inputs))
    for k in plan.kernels:
        for b in k.inputs:
            if b not in written:
                raise AssertionError(f"{k.name} reads b{b} before it is written")
        if k.out in written:
            raise AssertionError(f"{k.name} writes b{k.out} twice")
        written.add(k.out)
        shp, dt = plan.buffers[k.out]
        if k.ast.shape != shp or k.ast.dtype != dt:
            raise AssertionError(f"{k.name}: body {k.ast.shape} {k.ast.dtype} != buffer {shp} {dt}")
        for n in k.ast.walk():
            if n.op not in OPS:
                raise AssertionError(f"{k.name}: unknown op {n.op}")
    _ = numel
