"""Convolution and pooling modules beyond ``Conv2d``, each over its ``functional``
counterpart with torch's constructor arguments and parameter layout.

    >>> from eqgrad import Tensor, nn
    >>> nn.ConvTranspose2d(3, 4, 3, stride=2)(Tensor.ones(1, 3, 5, 5)).shape
    (1, 4, 11, 11)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from eqgrad.errors import ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.nn.module import Module, _uniform
from eqgrad.nn import functional as F


class _ConvNd(Module):
    n = 0
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True, output_padding: Any = 0):
        name = type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"{name}: groups={groups} must divide in_channels {in_channels} and out_channels {out_channels}")
        k = F._tuple(kernel_size, self.n, "kernel_size", name)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = output_padding
        # torch: weight (out, in/g, *k) or, transposed, (in, out/g, *k); U(-b, b), b = 1/sqrt(fan_in)
        # with fan_in = weight.shape[1] * prod(k)
        shape = (in_channels, out_channels // groups, *k) if self.transposed else (out_channels, in_channels // groups, *k)
        bound = 1.0 / math.sqrt(shape[1] * math.prod(k))
        self.weight = _uniform(shape, bound)
        self.bias = _uniform((out_channels,), bound) if bias else None


class Conv1d(_ConvNd):
    n = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv3d(_ConvNd):
    n = 3

    def forward(self, x: Tensor) -> Tensor:
        return F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose1d(_ConvNd):
    n, transposed = 1, True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, output_padding)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class ConvTranspose2d(ConvTranspose1d):
    n = 2

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class ConvTranspose3d(ConvTranspose1d):
    n = 3

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose3d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class _MaxPoolNd(Module):
    n = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False):
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor) -> Any:
        return F._max_pool(x, self.n, type(self).__name__, self.kernel_size, self.stride, self.padding,
                           self.dilation, self.ceil_mode, self.return_indices)


class MaxPool1d(_MaxPoolNd):
    n = 1


class MaxPool2d(_MaxPoolNd):
    n = 2


class MaxPool3d(_MaxPoolNd):
    n = 3


class _AvgPoolNd(Module):
    n = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return F._avg_pool(x, self.n, type(self).__name__, self.kernel_size, self.stride, self.padding,
                           self.ceil_mode, self.count_include_pad, self.divisor_override)


class AvgPool1d(_AvgPoolNd):
    n = 1


class AvgPool2d(_AvgPoolNd):
    n = 2


class AvgPool3d(_AvgPoolNd):
    n = 3


class _MaxUnpoolNd(Module):
    n = 0

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: Tensor, indices: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        return F._max_unpool(x, indices, self.n, type(self).__name__, self.kernel_size, self.stride, self.padding,
                             output_size)


class MaxUnpool1d(_MaxUnpoolNd):
    n = 1


class MaxUnpool2d(_MaxUnpoolNd):
    n = 2


class MaxUnpool3d(_MaxUnpoolNd):
    n = 3


class _Adaptive(Module):
    n, reduce = 0, "mean"

    def __init__(self, output_size: Any):
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return F._adaptive(x, self.n, self.output_size, type(self).__name__, self.reduce)


class AdaptiveAvgPool1d(_Adaptive):
    n = 1


class AdaptiveAvgPool2d(_Adaptive):
    n = 2


class AdaptiveAvgPool3d(_Adaptive):
    n = 3


class AdaptiveMaxPool1d(_Adaptive):
    n, reduce = 1, "max"


class AdaptiveMaxPool2d(_Adaptive):
    n, reduce = 2, "max"


class AdaptiveMaxPool3d(_Adaptive):
    n, reduce = 3, "max"


__all__ = ["Conv1d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "MaxPool1d", "MaxPool2d",
           "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
           "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
           "AdaptiveMaxPool3d"]
