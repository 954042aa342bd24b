"""Forward and backward of eqgrad functions against torch 2.13.0 (CPU), or against central
finite differences when torch is not installed (then only gradients are checked: test_ops.py
checks every forward against NumPy).

One check is one program: the output and every input's gradient are realized together.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import eqgrad
from eqgrad import Tensor

try:
    import torch
    HAVE_TORCH = True
except ImportError:          # pragma: no cover - CI installs torch with the dev extra
    torch = None
    HAVE_TORCH = False


def upstream(shape: tuple[int, ...], seed: int = 7) -> np.ndarray:
    """A fixed random upstream gradient, so every output element matters and none cancel."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape).astype(np.float32)


def eqgrad_fwd_bwd(fn: Callable[..., Tensor], inputs: Sequence[np.ndarray],
                   device: str | None = None) -> tuple[np.ndarray, list[np.ndarray | None]]:
    xs = [Tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in inputs]
    out = fn(*xs)
    grads: list[Tensor] = []
    if out.requires_grad:
        (out * Tensor(upstream(out.shape), device=out.device)).sum().backward()
        grads = [x.grad for x in xs if x.grad is not None]
    eqgrad.realize(out, *grads)
    return out.numpy(), [None if x.grad is None else x.grad.numpy() for x in xs]


def torch_fwd_bwd(fn: Callable[..., Any], inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray | None]]:
    xs = [torch.tensor(np.array(a), requires_grad=a.dtype.kind == "f") for a in inputs]
    out = fn(*xs)
    if out.requires_grad:
        (out * torch.tensor(upstream(tuple(out.shape)))).sum().backward()
    return out.detach().numpy(), [None if x.grad is None else x.grad.numpy() for x in xs]


def fd_grads(fn: Callable[..., Tensor], inputs: Sequence[np.ndarray], eps: float = 1e-3) -> list[np.ndarray | None]:
    """Central differences of sum(fn(inputs) * upstream) in each float input element."""
    def value(arrs: list[np.ndarray]) -> float:
        with eqgrad.no_grad():
            out = fn(*[Tensor(a) for a in arrs]).numpy().astype(np.float64)
        return float((out * upstream(out.shape)).sum())

    grads: list[np.ndarray | None] = []
    for i, a in enumerate(inputs):
        if a.dtype.kind != "f":
            grads.append(None)
            continue
        g = np.zeros(a.shape, np.float64)
        for j in np.ndindex(a.shape):
            arrs = [np.array(x) for x in inputs]
            arrs[i][j] += eps
            hi = value(arrs)
            arrs[i][j] -= 2 * eps
            g[j] = (hi - value(arrs)) / (2 * eps)
        grads.append(g)
    return grads


def check_fwd_bwd(fn: Callable[..., Tensor], inputs: Sequence[np.ndarray], torch_fn: Callable[..., Any] | None = None,
                  rtol: float = 1e-4, atol: float = 1e-5, use_fd: bool | None = None,
                  device: str | None = None) -> None:
    """``fn`` on eqgrad Tensors (on ``device``, default the default device) vs ``torch_fn``
    (default: ``fn``) on torch tensors: forward values and the gradient of every float input.
    Without torch: gradients vs finite differences."""
    out, grads = eqgrad_fwd_bwd(fn, inputs, device)
    if use_fd or (use_fd is None and not HAVE_TORCH):
        for i, (g, want) in enumerate(zip(grads, fd_grads(fn, inputs))):
            if want is None:
                continue
            got = np.zeros(inputs[i].shape) if g is None else g
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2, err_msg=f"gradient of input {i} (finite differences)")
        return
    want_out, want_grads = torch_fwd_bwd(torch_fn or fn, inputs)
    assert out.shape == want_out.shape, f"forward shape {out.shape}, torch {want_out.shape}"
    np.testing.assert_allclose(out, want_out, rtol=rtol, atol=atol, equal_nan=True, err_msg="forward")
    for i, (g, want) in enumerate(zip(grads, want_grads)):
        if inputs[i].dtype.kind != "f":
            continue
        want = np.zeros(inputs[i].shape, np.float32) if want is None else want
        got = np.zeros(inputs[i].shape, np.float32) if g is None else g
        assert got.shape == want.shape, f"gradient {i} shape {got.shape}, torch {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"gradient of input {i}")
