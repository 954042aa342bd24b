"""Layers: a small torch-like ``Module`` base and the usual layers, composed from Tensor ops.

    >>> import eqgrad
    >>> from eqgrad import Tensor, nn
    >>> model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 2))
    >>> model(Tensor.ones(3, 4)).shape
    (3, 2)
    >>> [name for name, _ in model.named_parameters()]
    ['0.weight', '0.bias', '2.weight', '2.bias']

Parameters are tensors with ``requires_grad=True``; buffers (BatchNorm's running statistics) are
tensors without. ``nn.state.get_parameters(model)`` returns both -- give that to an optimizer so
buffers written during a training step are realized with it (docs/training.md).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from eqgrad.errors import ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.nn import functional, state
from eqgrad.nn import functional as F
from eqgrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from eqgrad.frontend import tensor as _t
from eqgrad.nn.module import Linear, Module, _uniform


class Sequential(Module):
    """Calls its layers in order; a layer is a Module or any callable (``Tensor.relu``). Each layer
    is an attribute named by its position (or by its key, given an ``OrderedDict`` as torch's), so
    tensors are named as torch's: ``0.weight``, ``2.bias``, nested ``1.0.weight``."""

    def __init__(self, *layers: Callable[[Tensor], Tensor]):
        named = list(layers[0].items()) if len(layers) == 1 and isinstance(layers[0], dict) \
            and not isinstance(layers[0], Module) else \
            [(str(i), layer) for i, layer in enumerate(layers)]
        self._names: list[str] = []
        for name, layer in named:
            self._add(name, layer)

    def _add(self, name: str, layer: Any) -> None:
        name = str(name)
        if not name or name.startswith("_") or "." in name or name in vars(self) or hasattr(type(self), name):
            raise ValueError(f"Sequential: a layer name must be new, non-empty, without '.' and not start with '_', got {name!r}")
        setattr(self, name, layer)
        self._names.append(name)

    @property
    def layers(self) -> list[Any]:
        """The layers in order (a new list: ``append`` adds one)."""
        return [vars(self)[name] for name in self._names]

    def append(self, layer: Callable[[Tensor], Tensor]) -> "Sequential":
        """Add ``layer`` at the end, named by its position (as torch)."""
        self._add(str(len(self._names)), layer)
        return self

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):                     # a Sequential of those layers, their names kept (torch)
            return Sequential(dict(zip(self._names[i], self.layers[i])))
        return self.layers[i]

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.layers)


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


class _BatchNorm(Module):
    """Batch normalization per channel (axis 1) over every other axis. Training normalizes with
    the batch statistics (biased variance) and updates the running ones (unbiased variance,
    ``momentum``; ``momentum=None`` is the cumulative average) by ``assign``; evaluation uses the
    running statistics."""
    ndims: tuple[int, ...] = ()
    layout = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Tensor(np.ones(num_features, np.float32), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(num_features, np.float32), requires_grad=True) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.running_mean = Tensor(np.zeros(num_features, np.float32))
            self.running_var = Tensor(np.ones(num_features, np.float32))
            self.num_batches_tracked = Tensor(np.zeros((), np.int32))

    def forward(self, x: Tensor) -> Tensor:
        name = type(self).__name__
        if x.ndim not in self.ndims:
            raise ShapeError(f"{name}: expected a {' or '.join(f'{d}-D' for d in self.ndims)} input {self.layout}, got shape {x.shape}")
        if x.shape[1] != self.num_features:
            raise ShapeError(f"{name}: expected {self.num_features} channels (axis 1), got shape {x.shape}")
        if self.training or not self.track_running_stats:
            axes = (0, *range(2, x.ndim))
            n = x.numel() // x.shape[1]
            mean = x.mean(axes)
            var = ((x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))) ** 2).mean(axes)
            if self.training and self.track_running_stats:
                nbt = self.num_batches_tracked.assign(self.num_batches_tracked + 1)
                m: float | Tensor = 1.0 / nbt.float() if self.momentum is None else self.momentum
                unbiased = var.detach() * (n / max(n - 1, 1))
                self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
                self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
        else:
            mean, var = self.running_mean, self.running_var
        return F.batch_norm(x, mean, var, self.weight, self.bias, self.eps)


class BatchNorm1d(_BatchNorm):
    ndims, layout = (2, 3), "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    ndims, layout = (4,), "(N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    ndims, layout = (5,), "(N, C, D, H, W)"


class GroupNorm(Module):
    """Normalization over groups of channels (and the spatial axes), affine per channel, as torch."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor(np.ones(num_channels, np.float32), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(num_channels, np.float32), requires_grad=True) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """Root-mean-square normalization over the last axes with a scale (no shift), as torch."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None, elementwise_affine: bool = True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Tensor(np.ones(self.normalized_shape, np.float32), requires_grad=True) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


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
    """Rows of a (num_embeddings, embedding_dim) table at integer indices (any integer dtype); weight ~ N(0, 1) as torch."""

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


class Identity(Module):
    """Returns its input (arguments are accepted and ignored, as torch)."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def forward(self, x: Tensor) -> Tensor:
        return x


class ModuleList(Module, list):
    """A list of modules whose tensors are named by position (``layers.0.weight``), as torch's:
    it *is* a list, so ``nn.state`` walks it as one."""

    def __init__(self, modules: Iterable[Any] | None = None):
        list.__init__(self, modules if modules is not None else [])

    def __repr__(self) -> str:
        return f"ModuleList({list.__repr__(self)})"

    __hash__ = object.__hash__                   # a list is unhashable; a module is hashed by identity


class ModuleDict(Module, dict):
    """A dict of modules whose tensors are named by key (``blocks.encoder.weight``), as torch's."""

    def __init__(self, modules: Any = None):
        dict.__init__(self, modules if modules is not None else {})

    def __repr__(self) -> str:
        return f"ModuleDict({dict.__repr__(self)})"

    __hash__ = object.__hash__


# ------------------------------------------------------------------ activation modules

class _Activation(Module):
    """A module calling one activation with fixed arguments (``inplace`` is accepted and ignored:
    eqgrad's tensors are values)."""

    def __init__(self, inplace: bool = False):
        pass


class ReLU(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.relu()


class ReLU6(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.relu6()


class SiLU(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.silu()


class Mish(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.mish()


class Hardsigmoid(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.hardsigmoid()


class Hardswish(_Activation):
    def forward(self, x: Tensor) -> Tensor: return x.hardswish()


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor: return x.sigmoid()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor: return x.tanh()


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor: return x.logsigmoid()


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor: return x.gelu(self.approximate)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor: return x.leaky_relu(self.negative_slope)


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor: return x.elu(self.alpha)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor: return x.softplus(self.beta, self.threshold)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor: return x.hardtanh(self.min_val, self.max_val)


def _legacy_softmax_dim(ndim: int) -> int:
    # NOTE: torch's Softmax(dim=None) picks axis 0 for 0-, 1- and 3-D inputs and axis 1 otherwise
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    def __init__(self, dim: int | None = None):
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return x.softmax(_legacy_softmax_dim(x.ndim) if self.dim is None else self.dim)


class LogSoftmax(Module):
    def __init__(self, dim: int | None = None):
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return x.log_softmax(_legacy_softmax_dim(x.ndim) if self.dim is None else self.dim)


__all__ = ["Module", "Sequential", "ModuleList", "ModuleDict", "Identity", "Linear", "Conv2d", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "GroupNorm", "RMSNorm", "LayerNorm", "Embedding", "Dropout", "Flatten",
           "ReLU", "ReLU6", "SiLU", "Mish", "Hardsigmoid", "Hardswish", "Sigmoid", "Tanh", "LogSigmoid", "GELU",
           "LeakyReLU", "ELU", "Softplus", "Hardtanh", "Softmax", "LogSoftmax", "init", "utils", "functional", "F", "state", "get_parameters", "get_state_dict", "load_state_dict",
           "safe_save", "safe_load"]

from eqgrad.nn import init, utils  # noqa: E402  (they import nothing from here)
from eqgrad.nn.conv import *  # noqa: E402,F401,F403  (conv.py builds on Module above)
from eqgrad.nn import conv  # noqa: E402
__all__ += conv.__all__
from eqgrad.nn.attention import MultiheadAttention  # noqa: E402
__all__ += ["MultiheadAttention"]


class Upsample(Module):
    """torch.nn.Upsample: ``F.interpolate`` with fixed ``size`` or ``scale_factor``, ``mode`` and
    ``align_corners``."""

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None, recompute_scale_factor: bool | None = None):
        self.size, self.mode, self.align_corners = size, mode, align_corners
        self.scale_factor = (tuple(float(s) for s in scale_factor) if isinstance(scale_factor, (list, tuple))
                             else None if scale_factor is None else float(scale_factor))
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor)

    def __repr__(self) -> str:
        what = f"size={self.size!r}" if self.scale_factor is None else f"scale_factor={self.scale_factor!r}"
        return f"Upsample({what}, mode={self.mode!r})"


__all__ += ["Upsample"]
