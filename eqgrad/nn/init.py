"""Parameter initialization, as torch.nn.init: each function draws new values on the host (from
the session's generator, ``eqgrad.manual_seed``), writes them into the tensor in place (``assign``,
realized at once, so optimizers and jitted steps holding it see them) and returns the tensor.

    >>> from eqgrad import Tensor, nn
    >>> w = Tensor.zeros(3, 4)
    >>> nn.init.constant_(w, 0.5).tolist()[0]
    [0.5, 0.5, 0.5, 0.5]
    >>> round(nn.init.calculate_gain("leaky_relu", 0.2), 4)
    1.3868
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from eqgrad.frontend.autograd import no_grad
from eqgrad.frontend.shapeops import calculate_gain  # noqa: F401  (one gain table: torch.nn.init.calculate_gain)
from eqgrad.frontend.tensor import Tensor
from eqgrad.frontend import tensor as _t


def _write(tensor: Tensor, values: np.ndarray) -> Tensor:
    with no_grad():
        tensor.assign(Tensor(values.astype(tensor.dtype.np), device=tensor.device)).realize()
    return tensor


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field (torch's layout:
    (out, in, *kernel))."""
    if tensor.ndim < 2:
        raise ValueError(f"fan in and fan out need a tensor of at least 2 dimensions, got shape {tensor.shape}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    return _write(tensor, _t._rng.uniform(a, b, size=tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    return _write(tensor, _t._rng.normal(mean, std, size=tensor.shape))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Tensor:
    """N(mean, std) redrawn until inside [a, b] (rejection: the same distribution as torch's)."""
    out = _t._rng.normal(mean, std, size=tensor.shape)
    bad = (out < a) | (out > b)
    while bad.any():
        out[bad] = _t._rng.normal(mean, std, size=int(bad.sum()))
        bad = (out < a) | (out > b)
    return _write(tensor, out)


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, np.full(tensor.shape, val))


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError(f"eye_(): expected a 2-D tensor, got shape {tensor.shape}")
    return _write(tensor, np.eye(*tensor.shape))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """N(0, std), std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Tensor:
    """U(-b, b), b = gain(nonlinearity, a) * sqrt(3 / fan) (He et al.)."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Tensor:
    """N(0, std), std = gain(nonlinearity, a) / sqrt(fan) (He et al.)."""
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_", "eye_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]
