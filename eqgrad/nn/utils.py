"""Gradient clipping, as torch.nn.utils: lazy like everything else, so the clipping is part of
the optimizer step's program (call it between ``backward()`` and ``opt.step()``).

    >>> from eqgrad import Tensor, nn
    >>> w = Tensor([3.0, 4.0], requires_grad=True)
    >>> (w * w).sum().backward()                      # grad [6, 8], norm 10
    >>> nn.utils.clip_grad_norm_([w], 5.0).item()
    10.0
    >>> [round(v, 4) for v in w.grad.tolist()]
    [3.0, 4.0]
"""
from __future__ import annotations

import math
from typing import Iterable

from eqgrad.frontend.autograd import no_grad
from eqgrad.frontend.tensor import Tensor


def _with_grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    ps = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p for p in ps if p.grad is not None]


def get_total_norm(tensors: Iterable[Tensor], norm_type: float = 2.0) -> Tensor:
    """The ``norm_type``-norm of all tensors together (the norm of their per-tensor norms)."""
    ts = list(tensors)
    if not ts:
        return Tensor(0.0)
    if norm_type == math.inf:
        return Tensor.stack([t.abs().max() for t in ts]).max()
    if norm_type == -math.inf:
        return Tensor.stack([t.abs().min() for t in ts]).min()
    return Tensor.stack([(t.abs() ** norm_type).sum() for t in ts]).sum() ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale the gradients so their total norm is at most ``max_norm`` (by max_norm / (norm + 1e-6)
    where that is below 1, as torch); returns the total norm before clipping (lazy).
    ``error_if_nonfinite`` realizes the norm to check it."""
    ps = _with_grads(parameters)
    if not ps:
        return Tensor(0.0)
    with no_grad():
        total = get_total_norm([p.grad for p in ps], float(norm_type))
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise RuntimeError(f"clip_grad_norm_(): the total norm of order {norm_type} of the gradients is "
                               f"{total.item()}, not finite")
        coef = (max_norm / (total + 1e-6)).minimum(1.0)
        for p in ps:
            p.grad = p.grad * coef
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient to [-clip_value, clip_value]."""
    with no_grad():
        for p in _with_grads(parameters):
            p.grad = p.grad.clip(-clip_value, clip_value)


__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm"]
