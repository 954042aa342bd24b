"""Reverse-mode autodiff over the primitive ops.

Every primitive a Tensor method applies goes through ``Tensor._apply``; when one of its sources
requires a gradient (and gradients are enabled), the result remembers a :class:`Ctx`: the op, its
attribute, the source tensors and the LazyBuffers it was computed from. ``backward`` walks these
records from the output back to the leaves and applies each primitive's gradient rule from the op
table (``OpDef.grad`` in ``eqgrad/ops.py``), so every composite op gets its gradient for free.

A few composite functions give their gradient as a whole instead (:class:`Composite`, as a
``torch.autograd.Function``): where the primitives' gradients are right but compile to a poor
program. Convolution is the one today (``nn/functional.py``): the gradient of its windows is a
sum of overlapping windows (col2im), a movement-heavy kernel the lowering cannot vectorize, while
the same input gradient written as a convolution of the padded output gradient is a contraction
like the forward one (CNN step, LLVM, two Zen 5 cores: the input gradient 22 -> 2.1 ms).

The records are kept apart from the lazy graph on purpose: ``realize`` turns LazyBuffers into
buffers and forgets their sources, and a loss that was printed (realized) must still be
differentiable. Gradients are lazy like everything else: ``backward`` builds graphs and runs
nothing; an optimizer step realizes them together with the update, as one program.

    >>> from eqgrad import Tensor
    >>> x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0, 6.0]
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from eqgrad.errors import AutogradError
from eqgrad.ops import OPS, NoGrad
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.walk import topological

if TYPE_CHECKING:
    from eqgrad.frontend.tensor import Tensor


@dataclass(frozen=True, slots=True)
class Ctx:
    """How a tensor was computed: one primitive op application."""
    op: str
    arg: Any
    parents: tuple["Tensor", ...]          # the source tensors (where gradients flow)
    srcs: tuple[LazyBuffer, ...]           # their values at the time (snapshots: a later assign does not change them)
    out: LazyBuffer | None
    freed: bool = False                    # a backward() without retain_graph went through it: released


@dataclass(frozen=True, slots=True)
class Composite:
    """The gradient rule of a composite function, recorded in its :class:`Ctx` as ``arg`` (the
    ``op`` is the function's name). ``grad(g, out, srcs)`` gets the output gradient, the output and
    the inputs (LazyBuffers) and returns one gradient per input (None: none flows there); it is
    checked like a primitive's (one gradient per input, of its shape)."""
    grad: Callable[[LazyBuffer, LazyBuffer, tuple[LazyBuffer, ...]], tuple[LazyBuffer | None, ...]]


class _GradMode:
    enabled = True


def is_grad_enabled() -> bool:
    return _GradMode.enabled


@contextlib.contextmanager
def set_grad_enabled(mode: bool) -> Iterator[None]:
    old = _GradMode.enabled
    _GradMode.enabled = bool(mode)
    try:
        yield
    finally:
        _GradMode.enabled = old


def no_grad() -> contextlib.AbstractContextManager:
    """Inside ``with eqgrad.no_grad():`` no op records how it was computed (evaluation, updates).

        >>> import eqgrad
        >>> w = eqgrad.Tensor([1.0], requires_grad=True)
        >>> with eqgrad.no_grad():
        ...     (w * 2).requires_grad
        False
    """
    return set_grad_enabled(False)


def enable_grad() -> contextlib.AbstractContextManager:
    return set_grad_enabled(True)


def _graph(root: "Tensor") -> list["Tensor"]:
    """Tensors reachable from ``root`` through Ctx records that require a gradient, sources first.
    Raises when a record was released by an earlier ``backward()`` (as torch does)."""
    def parents(t: "Tensor") -> list["Tensor"]:
        if t._ctx is None:
            return []
        if t._ctx.freed:
            raise AutogradError(
                f"backward(): trying to backward through the graph a second time (through a "
                f"{t._ctx.op.lower()} whose record the first backward() released); pass "
                "retain_graph=True to the first backward() to backward through the graph again")
        # visited last parent first: the order gradients have always been accumulated in
        return [p for p in reversed(t._ctx.parents) if p.requires_grad]
    return topological([root], parents)


def backward(root: "Tensor", gradient: LazyBuffer, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) * gradient into ``.grad`` of every leaf that requires it.

    Without ``retain_graph`` the records it went through are released afterwards (as torch frees
    the graph): a second backward through any of them raises instead of accumulating again.
    """
    Tensor = type(root)                     # the frontend's Tensor (autograd sits below it)
    grads: dict[int, LazyBuffer] = {id(root): gradient}
    graph = _graph(root)
    for t in reversed(graph):
        g = grads.pop(id(t), None)
        if g is None:
            continue
        ctx = t._ctx
        if ctx is None:                                   # a leaf: accumulate
            t.grad = Tensor(g) if t.grad is None else Tensor(t.grad.lazydata.alu("ADD", g))
            continue
        if isinstance(ctx.arg, Composite):
            src_grads = ctx.arg.grad(g, ctx.out, ctx.srcs)
            if len(src_grads) != len(ctx.parents):
                raise AutogradError(f"internal: the gradient of {ctx.op.lower()} gave {len(src_grads)} "
                                    f"gradients for {len(ctx.parents)} inputs")
        else:
            rule = OPS[ctx.op].grad
            if isinstance(rule, NoGrad):
                continue
            src_grads = rule(g, ctx.out, ctx.srcs, ctx.arg)
        for p, sg in zip(ctx.parents, src_grads):
            if sg is None or not p.requires_grad:
                continue
            if sg.shape != p.shape:
                raise AutogradError(f"internal: gradient of {ctx.op.lower()} has shape {sg.shape}, "
                                    f"its source has {p.shape}")
            prev = grads.get(id(p))
            grads[id(p)] = sg if prev is None else prev.alu("ADD", sg)
    if not retain_graph:
        for t in graph:
            ctx = t._ctx
            if ctx is not None:
                t._ctx = Ctx(ctx.op, ctx.arg, (), (), None, freed=True)
