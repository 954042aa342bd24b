"""The kernel plan: what runs. Shared by extraction (which builds it), lowering and the devices.

A kernel is a root of the program or a chosen ``Realize``; its body (a DAG of ``KNode``) is made of
the chosen nodes reachable from it without crossing a ``Realize``/``Buf``/``Const`` (those become
loads and constants). Buffers are numbered: the realize's inputs first, then one per kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eqgrad.dtype import DType
from eqgrad.graph.walk import topological
from eqgrad.ops import OPS, Shape


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
        return topological([self], lambda n: n.src)

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
