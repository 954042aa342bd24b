"""What the lowering does with a kernel, in the cost model's words.

The cost model (extract/evaluate.py) decides from the e-graph what kind of kernel it is costing --
row-fused, a root contraction at the contraction rate, a contraction left without register lanes
inside a row-fused kernel, masked pad reads in a reduction loop -- and records it as
``KernelCost.kind`` (``KERNEL_KINDS``, graph/plan.py). :func:`classify` answers the same question
from what the lowering actually decides (its passes' schedule for the device's capabilities, and
whether the device's stage hands the contraction to the BLAS), so the two can be compared kernel by
kernel (tests/test_classifier.py, ``bench/bench_model.py``): where they disagree, the model prices a
kernel the lowering does not build.
"""
from __future__ import annotations

from dataclasses import dataclass

from eqgrad.dtype import float32
from eqgrad.graph.caps import CPU, Capabilities
from eqgrad.graph.plan import Kernel, KNode, broadcast_product
from eqgrad.lower.contraction import candidate, find_contraction
from eqgrad.lower.indexing import REDUCES
from eqgrad.lower.passes import LowerOptions, lane_pack, output_loops, own_reduction, row_pack, run_passes


@dataclass(frozen=True)
class KernelClass:
    """The lowering's decisions about one kernel that the cost model prices."""
    lanes: tuple[tuple[int, int], ...]   # register lanes per output axis ((axis, width), ...)
    row_fused: bool                      # a reduction rendered once per row, before the innermost output loop
    contraction: str                     # "" | "lanes" | "blas" | "unlaned": the kernel's one sum of a product
    masked: bool                         # a pad read inside a reduction loop (masked loads there)
    hoisted: int                         # reductions the hoist pass renders ahead of their use

    @property
    def kinds(self) -> frozenset[str]:
        """In ``KERNEL_KINDS``' words (graph/plan.py), as the cost model's ``KernelCost.kind``."""
        out = set()
        if self.row_fused:
            out.add("row-fused")
        if self.contraction in ("lanes", "blas"):
            out.add("contraction")
        if self.contraction == "unlaned":
            out.add("unlaned")
        if self.masked:
            out.add("masked")
        return frozenset(out)


def _steps(n: KNode) -> int:
    """How many steps reduction ``n``'s loop takes."""
    src = n.src[0].shape
    out = 1
    for d in n.arg:
        out *= src[d]
    return out


def _under_reduce(root: KNode) -> set[int]:
    """The ids of the nodes evaluated inside some reduction's loop of more than one step."""
    out: set[int] = set()
    stack, seen = [(root, False)], set()
    while stack:
        n, under = stack.pop()
        if (id(n), under) in seen:
            continue
        seen.add((id(n), under))
        if under:
            out.add(id(n))
        under = under or (n.op in REDUCES and _steps(n) > 1)
        stack.extend((s, under) for s in n.src)
    return out


def _pad_under_reduce(root: KNode) -> bool:
    inside = _under_reduce(root)
    return any(n.op == "PAD" and id(n) in inside for n in root.walk())


def _own_sum(root: KNode) -> KNode | None:
    """The kernel's own reduction (``own_reduction``: the root through movement ops) where it is a
    float32 sum of a product: the root contraction of a kernel that has other reductions as well
    (attention as one kernel: ``p @ v`` over the row's max and sum, which ``candidate`` leaves out)."""
    found = own_reduction(root)
    n = found[0] if found is not None else None
    return n if n is not None and n.op == "RSUM" and n.dtype == float32 and n.src[0].op == "MUL" else None


def classify(kernel: Kernel, caps: Capabilities = CPU, blas: bool = False) -> KernelClass:
    """What the lowering does with ``kernel`` on a device with ``caps``; ``blas``: the device hands
    a contraction it can run as a GEMM to the BLAS (its stage, devices/cpu.py)."""
    steps = run_passes(kernel, LowerOptions.for_caps(caps))
    s = steps[-1].schedule if steps else None
    root = kernel.ast
    lanes = s.lanes if s else ()
    loops = output_loops(root.shape, s) if s else 0
    hoist = s.hoist if s else ()
    hoisted = {id(n) for _, ns in hoist for n in ns}
    # once per row: hoisted before the innermost output loop, or out of another reduction's loop
    # (a reduction over a broadcast of a reduction: the inner one is not recomputed per step)
    nested = _under_reduce(root)
    row_fused = any(ns and (k < loops or any(id(n) in nested for n in ns)) for k, ns in hoist)
    red = candidate(root) or _own_sum(root)
    contraction = ""
    # a contraction as the cost model calls one (graph/plan.py): a sum of squares has the shape
    # the BLAS or the lanes pass take, but no operand reuse to price at the contraction rate
    if red is not None and broadcast_product(red.src[0], lambda n: n.op, lambda n: n.src):
        if blas and find_contraction(root) is not None:
            contraction = "blas"
        elif lanes or lane_pack(root, o := LowerOptions.for_caps(caps)) is not None or row_pack(root, o) is not None:
            # (the device's stage packs an operand for them: a contraction's, or the one a row-fused
            # kernel's root contraction reads its lanes from -- attention as one kernel, k^T)
            contraction = "lanes"
        elif id(red) in hoisted and row_fused:
            contraction = "unlaned"
    return KernelClass(lanes, row_fused, contraction, _pad_under_reduce(root), len(hoisted))
