"""Layers: a small torch-like ``Module`` base and the usual layers, composed from Tensor ops.

    >>> import eqgrad
    >>> from eqgrad import Tensor, nn
    >>> model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 2))
    >>> model(Tensor.ones(3, 4)).shape
    (3, 2)
    >>> [name for name, _ in model.named_parameters()]
    ['layers.0.weight', 'layers.0.bias', 'layers.2.weight', 'layers.2.bias']

Parameters are tensors with ``requires_grad=True``; buffers (BatchNorm's running statistics) are
tensors without. ``nn.state.get_parameters(model)`` returns both -- give that to an optimizer so
buffers written during a training step are realized with it (docs/training.md).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from eqgrad.errors import ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.nn import functional, state
from eqgrad.nn import functional as F
from eqgrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from eqgrad.frontend import tensor as _t

def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    return Tensor(_t._rng.uniform(-bound, bound, size=shape).astype(np.float32), requires_grad=True)


class Module:
    """Base class: ``__call__`` runs ``forward``; tensors, modules, and lists/dicts of them held as
    attributes are found by ``state_dict``/``parameters``; ``train()``/``eval()`` set ``training``
    on the module and everything under it."""
    training: bool = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def modules(self) -> Iterator["Module"]:
        """This module and every module under it, each once."""
        seen: set[int] = set()
        stack: list[Any] = [self]
        while stack:
            o = stack.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, Module):
                yield o
                stack.extend(reversed([v for k, v in vars(o).items() if not k.startswith("_")]))
            elif isinstance(o, (list, tuple)):
                stack.extend(reversed(o))
            elif isinstance(o, dict):
                stack.extend(reversed(list(o.values())))

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def state_dict(self) -> dict[str, Tensor]:
        return get_state_dict(self)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        load_state_dict(self, state, strict)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return [(k, v) for k, v in self.state_dict().items() if v.requires_grad]

    def parameters(self) -> list[Tensor]:
        """The trainable tensors (as torch). For an optimizer prefer ``nn.state.get_parameters``,
        which also includes buffers such as BatchNorm's running statistics."""
        return [v for _, v in self.named_parameters()]

    def buffers(self) -> list[Tensor]:
        return [v for v in self.state_dict().values() if not v.requires_grad]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None


class Sequential(Module):
    """Calls its layers in order; a layer is a Module or any callable (``Tensor.relu``)."""

    def __init__(self, *layers: Callable[[Tensor], Tensor]):
        self.layers = list(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i: int) -> Any:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)


class Linear(Module):
    """``x @ weight.T + bias``; weight (out, in) initialized U(-1/sqrt(in), 1/sqrt(in)) as torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Conv2d(Module):
    """2-D convolution; weight (out, in/groups, kH, kW) initialized as torch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv2d: groups={groups} must divide in_channels {in_channels} and out_channels {out_channels}")
        k = F._pair(kernel_size, "kernel_size", "Conv2d")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        bound = 1.0 / math.sqrt(in_channels // groups * k[0] * k[1])
        self.weight = _uniform((out_channels, in_channels // groups, *k), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class BatchNorm2d(Module):
    """Batch normalization over (N, H, W) per channel. Training normalizes with the batch
    statistics (biased variance) and updates the running ones (unbiased variance, ``momentum``)
    by ``assign``; evaluation uses the running statistics."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        self.eps, self.momentum = eps, momentum
        self.weight = Tensor(np.ones(num_features, np.float32), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(num_features, np.float32), requires_grad=True) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.running_mean = Tensor(np.zeros(num_features, np.float32))
            self.running_var = Tensor(np.ones(num_features, np.float32))
            self.num_batches_tracked = Tensor(np.zeros((), np.int32))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ShapeError(f"BatchNorm2d: expected a 4-D input (N, C, H, W), got shape {x.shape}")
        if self.training or not self.track_running_stats:
            axes = (0, 2, 3)
            n = x.shape[0] * x.shape[2] * x.shape[3]
            mean = x.mean(axes)
            var = ((x - mean.reshape(1, -1, 1, 1)) ** 2).mean(axes)
            if self.training and self.track_running_stats:
                m = self.momentum
                unbiased = var.detach() * (n / max(n - 1, 1))
                self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
                self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            mean, var = self.running_mean, self.running_var
        return F.batch_norm(x, mean, var, self.weight, self.bias, self.eps)


class LayerNorm(Module):
    """Normalization over the last axes (``normalized_shape``), with an optional affine map."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Tensor(np.ones(self.normalized_shape, np.float32), requires_grad=True) if elementwise_affine else None
        self.bias = Tensor(np.zeros(self.normalized_shape, np.float32), requires_grad=True) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table at int32 indices; weight ~ N(0, 1) as torch."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.weight = Tensor(_t._rng.standard_normal((num_embeddings, embedding_dim)).astype(np.float32),
                             requires_grad=True)

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.weight)


class Dropout(Module):
    """Zeroes elements with probability ``p`` while training (see ``functional.dropout``)."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


__all__ = ["Module", "Sequential", "Linear", "Conv2d", "BatchNorm2d", "LayerNorm", "Embedding", "Dropout",
           "Flatten", "functional", "F", "state", "get_parameters", "get_state_dict", "load_state_dict",
           "safe_save", "safe_load"]
