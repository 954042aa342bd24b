"""Elementwise kernels over whole contiguous buffers are lowered as one flat loop.

A kernel whose body is elementwise ops over buffers of its own shape (and over scalars broadcast to
it) computes element ``i`` of its output from element ``i`` of each input, in row-major order, so
its loops can be one: a (128, 64) Adam update and a (10, 128) one become the same loop over
``numel`` elements, whose extent is the launch's (the split loop's ``[lo, hi)``). Their loop IR,
their LLVM IR and their compiled code are then one -- an optimizer step over many parameters
compiles each update once, not once per parameter shape -- and the one loop is as long as the
output, which suits the vectorizer and the thread split better than a short inner axis.

``collapse`` returns the kernel with its body rewritten over ``(numel,)``, or the kernel itself
when anything in the body reads across elements: a reduction, a permute, a pad or shrink, an
expand that is not of a one-element value, a reshape that is not of a whole buffer. Buffers are
dense row-major (graph/plan.py), so reading ``b`` as ``(numel,)`` is reading it.
"""
from __future__ import annotations

from eqgrad.graph.plan import Kernel, KNode
from eqgrad.ops import OPS, numel

_ELEMENTWISE = ("unary", "binary", "ternary")


class _Keep(Exception):
    """The body reads across elements: lowered as it is."""


def collapse(kernel: Kernel) -> Kernel:
    root = kernel.ast
    shape = root.shape
    if len(shape) < 2:
        return kernel
    n = numel(shape)
    flat = (n,)
    memo: dict[int, KNode] = {}

    def one_element(x: KNode) -> KNode | None:
        """The one-element value a chain of reshapes and expands broadcasts (any body: a scalar
        computed in the kernel, such as Adam's bias correction), or None."""
        while x.op in ("RESHAPE", "EXPAND") and numel(x.shape) != 1:
            x = x.src[0]
        return x if numel(x.shape) == 1 else None

    def go(x: KNode) -> KNode:
        hit = memo.get(id(x))
        if hit is not None:
            return hit
        if x.shape != shape:
            raise _Keep
        if x.op in ("BUF", "CONST"):
            out = KNode(x.op, (), x.arg, flat, x.dtype)
        elif x.op in ("RESHAPE", "EXPAND"):
            base = one_element(x)
            src = x.src[0]
            if base is not None:           # a scalar broadcast to every element
                one = base if base.shape == (1,) else KNode("RESHAPE", (base,), (1,), (1,), base.dtype)
                out = KNode("EXPAND", (one,), flat, flat, x.dtype)
            elif x.op == "RESHAPE" and src.op == "BUF" and numel(src.shape) == n:
                out = KNode("BUF", (), src.arg, flat, x.dtype)      # a whole buffer, read in order
            else:
                raise _Keep
        elif OPS[x.op].kind in _ELEMENTWISE:
            out = KNode(x.op, tuple(go(s) for s in x.src), x.arg, flat, x.dtype)
        else:
            raise _Keep
        memo[id(x)] = out
        return out

    try:
        body = go(root)
    except _Keep:
        return kernel
    return Kernel(kernel.name, kernel.out, body, kernel.inputs, kernel.predicted, kernel.nbytes, kernel.flops)
