"""Neural-network functions composed from Tensor ops: convolution, pooling, normalization,
dropout, embedding lookups and losses. Their gradients come from the primitives' (ops.py).

Activations are Tensor methods (``x.relu()``, ``x.gelu()``, ...) and are re-exported here as
functions, so ``F.gelu(x)`` and ``x.gelu()`` are the same thing.

    >>> from eqgrad import Tensor
    >>> import eqgrad.nn.functional as F
    >>> x = Tensor.ones(1, 1, 4, 4)
    >>> F.avg_pool2d(x, 2).shape
    (1, 1, 2, 2)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from eqgrad.dtype import int32
from eqgrad.errors import DTypeError, ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.devices import get_device
from eqgrad.nn import interpolate as _interpolate

IntOr2 = int | Sequence[int]


def _pair(v: IntOr2, name: str, op: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise ShapeError(f"{op}(): {name} must be an int or a pair of ints, got {v!r}")
    return t  # type: ignore[return-value]


# ------------------------------------------------------------------ activations (Tensor methods)

def relu(x: Tensor) -> Tensor: return x.relu()
def sigmoid(x: Tensor) -> Tensor: return x.sigmoid()
def tanh(x: Tensor) -> Tensor: return x.tanh()
def gelu(x: Tensor, approximate: str = "none") -> Tensor: return x.gelu(approximate)
def silu(x: Tensor) -> Tensor: return x.silu()
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor: return x.leaky_relu(negative_slope)
def elu(x: Tensor, alpha: float = 1.0) -> Tensor: return x.elu(alpha)
def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor: return x.softplus(beta, threshold)
def logsigmoid(x: Tensor) -> Tensor: return x.logsigmoid()
def mish(x: Tensor) -> Tensor: return x.mish()
def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor: return x.hardtanh(min_val, max_val)
def relu6(x: Tensor) -> Tensor: return x.relu6()
def hardsigmoid(x: Tensor) -> Tensor: return x.hardsigmoid()
def hardswish(x: Tensor) -> Tensor: return x.hardswish()
def softmax(x: Tensor, dim: int = -1) -> Tensor: return x.softmax(dim)
def log_softmax(x: Tensor, dim: int = -1) -> Tensor: return x.log_softmax(dim)


# ------------------------------------------------------------------ linear, convolution, pooling

def interpolate(input: Tensor, size: int | Sequence[int] | None = None, scale_factor: float | Sequence[float] | None = None,
                mode: str = "nearest", align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """torch.nn.functional.interpolate (nn/interpolate.py); "area" is adaptive average pooling, as torch."""
    return _interpolate.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias,
                                    area_pool=lambda x, outs: _ADAPTIVE_AVG[x.ndim - 2](x, outs))


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """torch.nn.functional.pad: ``pad`` lists (before, after) amounts from the LAST axis backwards
    (``(left, right, top, bottom)`` pads W then H); modes "constant" (``value``, default 0),
    "reflect", "replicate", "circular" (``Tensor.pad``); negative amounts crop."""
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ShapeError(f"pad(): expected an even number of amounts for at most {input.ndim} axes, got {len(pad)}")
    if value is not None and mode != "constant":
        raise ValueError(f"pad(): value= is for mode='constant', got mode={mode!r}")
    k = len(pad) // 2
    pairs = [None] * (input.ndim - k) + [(pad[2 * j], pad[2 * j + 1]) for j in reversed(range(k))]
    return input.pad(pairs, 0 if value is None else value, mode=mode)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with torch's (out_features, in_features) weight layout."""
    out = x @ weight.T
    return out + bias if bias is not None else out


def _pool(x: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(k) axes, with movement ops only (no data is copied):
    (..., i1, i2) -> (..., o1, o2, k1, k2), window element [o, kk] = x[o*stride + kk*dilation].

    NOTE: the trick (as tinygrad's _pool): repeat each axis so that one reshape lines the windows
    up -- in the repeated axis of length k*(i*f + d), element kk*(i*f + d) + o*s is
    x[(kk*d + o*s) mod i] = x[o*s + kk*d] -- then keep every s-th position with a shrink. The
    gradient of the repeat (an expand) sums the overlapping windows: that is col2im, for free."""
    n = len(k)
    lead, ins = x.shape[:-n], x.shape[-n:]
    nl = len(lead)
    outs = [(i - d * (kk - 1) - 1) // s + 1 for i, d, kk, s in zip(ins, dilation, k, stride)]
    if any(o <= 0 for o in outs):
        raise ShapeError(f"pooling: a window of {k} (dilation {dilation}) does not fit the input {ins}")
    if all(kk <= s for kk, s in zip(k, stride)) and all(d == 1 for d in dilation):
        # windows do not overlap: crop (or pad) each axis to o*s, split it into (o, s), keep k of each s
        x = x.pad([None] * nl + [(0, o * s - i) for o, s, i in zip(outs, stride, ins)])
        x = x.reshape(*lead, *[v for o, s in zip(outs, stride) for v in (o, s)])
        x = x.shrink([None] * nl + [p for o, kk in zip(outs, k) for p in ((0, o), (0, kk))])
        return x.permute(*range(nl), *[nl + 2 * j for j in range(n)], *[nl + 2 * j + 1 for j in range(n)])
    f = [1 + int(o * s > i - d * (kk - 1)) for o, s, i, d, kk in zip(outs, stride, ins, dilation, k)]
    reps = [-(-kk * (i * ff + d) // i) for kk, i, d, ff in zip(k, ins, dilation, f)]
    # repeat: (..., i) -> (..., 1, i) -> (..., r, i) -> (..., r*i)
    x = x.reshape(*lead, *[v for i in ins for v in (1, i)])
    x = x.expand(*lead, *[v for r, i in zip(reps, ins) for v in (r, i)])
    x = x.reshape(*lead, *[r * i for r, i in zip(reps, ins)])
    # dilation: keep k*(i*f + d), split into (k, i*f + d)
    x = x.shrink([None] * nl + [(0, kk * (i * ff + d)) for kk, i, d, ff in zip(k, ins, dilation, f)])
    x = x.reshape(*lead, *[v for kk, i, d, ff in zip(k, ins, dilation, f) for v in (kk, i * ff + d)])
    # stride: keep o*s of each row, split into (o, s), keep the first of each s
    x = x.shrink([None] * nl + [p for kk, o, s in zip(k, outs, stride) for p in ((0, kk), (0, o * s))])
    x = x.reshape(*lead, *[v for kk, o, s in zip(k, outs, stride) for v in (kk, o, s)])
    x = x.shrink([None] * nl + [p for kk, o in zip(k, outs) for p in ((0, kk), (0, o), (0, 1))])
    x = x.reshape(*lead, *[v for kk, o in zip(k, outs) for v in (kk, o)])
    # (..., k1, o1, k2, o2) -> (..., o1, o2, k1, k2)
    return x.permute(*range(nl), *[nl + 2 * j + 1 for j in range(n)], *[nl + 2 * j for j in range(n)])


def _check_nchw(x: Tensor, op: str) -> None:
    if x.ndim != 4:
        raise ShapeError(f"{op}(): expected a 4-D input (N, C, H, W), got shape {x.shape}")
    if not x.dtype.is_float:
        raise DTypeError(f"{op}(): expected a float32 input, got {x.dtype.name}")


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1, padding: IntOr2 = 0,
           dilation: IntOr2 = 1, groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation, as torch): x (N, C_in, H, W), weight
    (C_out, C_in/groups, kH, kW) -> (N, C_out, H_out, W_out). One multiply and one sum over
    windows made by movement ops (``_pool``); the compiler fuses it into one kernel.

        >>> x = Tensor.ones(1, 2, 5, 5)
        >>> conv2d(x, Tensor.ones(4, 1, 3, 3), stride=2, padding=1, groups=2).shape
        (1, 4, 3, 3)
    """
    _check_nchw(x, "conv2d")
    if weight.ndim != 4:
        raise ShapeError(f"conv2d(): expected a 4-D weight (C_out, C_in/groups, kH, kW), got shape {weight.shape}")
    n, cin, _, _ = x.shape
    cout, wcin, kh, kw = weight.shape
    if groups < 1 or cin % groups or cout % groups:
        raise ShapeError(f"conv2d(): groups={groups} must divide the input channels {cin} and output channels {cout}")
    if wcin * groups != cin:
        raise ShapeError(f"conv2d(): weight {weight.shape} expects {wcin * groups} input channels "
                         f"({wcin} per group x {groups} groups), the input has {cin} (shape {x.shape})")
    if bias is not None and bias.shape != (cout,):
        raise ShapeError(f"conv2d(): bias shape {bias.shape} != ({cout},)")
    s, p, d = _pair(stride, "stride", "conv2d"), _pair(padding, "padding", "conv2d"), _pair(dilation, "dilation", "conv2d")
    if min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ShapeError(f"conv2d(): stride and dilation must be >= 1 and padding >= 0, got {s}, {d}, {p}")
    oh, ow = ((i + 2 * pp - dd * (k - 1) - 1) // ss + 1 for i, pp, dd, k, ss in zip(x.shape[2:], p, d, (kh, kw), s))
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"conv2d(): a {kh}x{kw} window (dilation {d}) does not fit the input {x.shape[2:]} "
                         f"padded by {p}")
    out = Tensor._composite("CONV2D", lambda a, b: _conv(a, b, s, p, d, groups),
                            lambda g, _, srcs: _conv_grad(g, srcs, s, p, d, groups), x, weight)
    return out + bias.reshape(1, cout, 1, 1) if bias is not None else out


def _conv(x: Tensor, weight: Tensor, s: tuple[int, int], p: tuple[int, int], d: tuple[int, int],
          groups: int) -> Tensor:
    """The convolution as one multiply and one sum over windows (movement ops only)."""
    n, cout, (kh, kw) = x.shape[0], weight.shape[0], weight.shape[2:]
    wcin = weight.shape[1]
    xp = x.pad(((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    w = _pool(xp, (kh, kw), s, d)                                    # (n, cin, oh, ow, kh, kw)
    oh, ow = w.shape[2:4]
    g, rc = groups, cout // groups
    if s == (1, 1):
        w = w.reshape(n, g, wcin, 1, oh, ow, kh, kw).expand(n, g, wcin, rc, oh, ow, kh, kw)
        w = w.permute(0, 1, 3, 4, 5, 2, 6, 7)                        # (n, g, rc, oh, ow, wcin, kh, kw)
    else:
        # strided windows are no view with a unit stride along the output row, so the plan
        # materializes them (an im2col); built in (n, oh, ow, channel, kh, kw) order, that copy is
        # a GEMM operand with one contiguous reduce axis (the BLAS runs it) instead of one whose
        # channel axis is strided (stride 2, 32 -> 64 channels, 32x32, batch 32: 63 -> 2.8 ms)
        w = w.permute(0, 2, 3, 1, 4, 5).reshape(n, 1, oh, ow, g, wcin, kh, kw)
        w = w.expand(n, rc, oh, ow, g, wcin, kh, kw).permute(0, 4, 1, 2, 3, 5, 6, 7)
    return (w * weight.reshape(1, g, rc, 1, 1, wcin, kh, kw)).sum((5, 6, 7)).reshape(n, cout, oh, ow)


def _lane_room(c: int, device: str) -> int:
    """How well ``c`` channels fill ``device``'s register lanes (its capabilities, graph/caps.py)."""
    return get_device(device).caps.lane_room(c)


def _swapped(weight: Tensor, groups: int) -> Tensor:
    """(C_out, C_in/g, *k) -> (C_in, C_out/g, *k) flipped in every kernel axis: the weights of the
    convolution that is the input gradient's (and a transposed convolution's)."""
    cout, wcin, *k = weight.shape
    rc, sp = cout // groups, tuple(range(3, 3 + len(k)))
    return weight.reshape(groups, rc, wcin, *k).permute(0, 2, 1, *sp).reshape(groups * wcin, rc, *k).flip(tuple(range(2, 2 + len(k))))


def _dilated_input_grad(gt: Tensor, weight: Tensor, size: tuple[int, int], s: tuple[int, int],
                        p: tuple[int, int], d: tuple[int, int], groups: int) -> Tensor:
    """The input gradient as one convolution of the output gradient, zero-inserted by the stride
    and padded by the window's reach (k-1)*d less the forward padding (``pad`` crops where negative)."""
    n, cout, oh, ow = gt.shape
    kh, kw = weight.shape[2:]
    z = gt
    if s != (1, 1):
        z = z.reshape(n, cout, oh, 1, ow, 1).pad(((0, 0), (0, 0), (0, 0), (0, s[0] - 1), (0, 0), (0, s[1] - 1)))
        z = z.reshape(n, cout, oh * s[0], ow * s[1]).shrink((None, None, (0, (oh - 1) * s[0] + 1), (0, (ow - 1) * s[1] + 1)))
    reach = ((kh - 1) * d[0], (kw - 1) * d[1])
    edges = [(r - pp, n_ + r - (r - pp) - length) for r, pp, n_, length in zip(reach, p, size, z.shape[2:])]
    return _conv(z.pad(((0, 0), (0, 0), *edges)), _swapped(weight, groups), (1, 1), (0, 0), d, groups)


def _conv_grad(g: LazyBuffer, srcs: tuple[LazyBuffer, ...], s: tuple[int, int], p: tuple[int, int],
               d: tuple[int, int], groups: int) -> tuple[LazyBuffer, LazyBuffer]:
    """The gradients of ``_conv``, each written as a contraction the lowering vectorizes like the
    forward one (the primitives' gradients give a col2im sum of windows and a weight gradient
    whose output axis is the 3-wide kernel column: CNN step 46 -> 12 ms, docs/lowering.md).

    Input: a convolution of the output gradient, zero-inserted by the stride and padded by the
    window's reach, with the weights flipped and their channels swapped. Weight: the sum over
    (batch, rows, columns) of the output gradient times the input's windows, computed in a
    (kh, kw, group, ., .) layout whose last axis is a channel axis (lanes), from a channels-last
    copy of the padded input (or of the gradient, when its channels fill lanes better)."""
    x, weight, gt = Tensor(srcs[0]), Tensor(srcs[1]), Tensor(g)
    n, _, h, wd = x.shape
    cout, wcin, kh, kw = weight.shape
    oh, ow = gt.shape[2:]
    G, rc = groups, cout // groups
    # NOTE: a strided convolution's input gradient does s*s times the useful work here (the
    # inserted zeros). Computing it by phases (s*s stride-1 convolutions with the taps that reach
    # each residue of the input rows, interleaved) measured no faster: stride 2, 32 -> 64 channels,
    # 32x32, batch 32: 7.8 against 8.1 ms, its phase kernels at 12-166 GFLOP/s
    dx = _dilated_input_grad(gt, weight, (h, wd), s, p, d, groups)
    # d weight: (kh, kw, G, rows, cols) with the lane-friendlier channel axis last
    xp = x.pad(((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    co_last = _lane_room(rc, x.device) > _lane_room(wcin, x.device)
    if co_last:
        gt = gt.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    else:
        xp = xp.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    win = _pool(xp, (kh, kw), s, d)                                  # (n, cin, oh, ow, kh, kw)
    win = win.reshape(n, G, wcin, oh, ow, kh, kw).permute(5, 6, 1, 0, 3, 4, 2)   # (kh, kw, G, n, oh, ow, wcin)
    gg = gt.reshape(n, G, rc, oh, ow).permute(1, 2, 0, 3, 4)                     # (G, rc, n, oh, ow)
    if co_last:
        prod = win.permute(0, 1, 2, 6, 3, 4, 5).reshape(kh, kw, G, wcin, n, oh, ow, 1) * \
            gg.permute(0, 2, 3, 4, 1).reshape(1, 1, G, 1, n, oh, ow, rc)
        dw = prod.sum((4, 5, 6)).contiguous().permute(2, 4, 3, 0, 1)            # (G, rc, wcin, kh, kw)
    else:
        prod = win.reshape(kh, kw, G, 1, n, oh, ow, wcin) * gg.reshape(1, 1, G, rc, n, oh, ow, 1)
        dw = prod.sum((4, 5, 6)).contiguous().permute(2, 3, 4, 0, 1)            # (G, rc, wcin, kh, kw)
    return dx.lazydata, dw.reshape(cout, wcin, kh, kw).lazydata


def _tuple(v: int | Sequence[int], n: int, name: str, op: str) -> tuple[int, ...]:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n or not all(isinstance(i, int) for i in t):
        raise ShapeError(f"{op}(): {name} must be an int or {n} ints, got {v!r}")
    return t


def _windows(x: Tensor, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...]) -> Tensor:
    """(N, C, *in) -> (N, C, *out, *k): ``_pool`` for 1-2 spatial axes; 3 go one axis at a time
    (a 3-axis ``_pool`` reshapes through 11 axes, past MAX_RANK)."""
    if len(k) <= 2:
        return _pool(x, k, s, d)
    n, c = x.shape[:2]
    y = x.reshape(n * c, *x.shape[2:])                                    # (B, D, H, W)
    y = _pool(y, k[2:], s[2:], d[2:]).permute(0, 3, 4, 1, 2)               # (B, ow, kw, D, H)
    y = _pool(y, k[1:2], s[1:2], d[1:2]).permute(0, 1, 2, 4, 5, 3)         # (B, ow, kw, oh, kh, D)
    y = _pool(y, k[:1], s[:1], d[:1])                                     # (B, ow, kw, oh, kh, od, kd)
    return y.permute(0, 5, 3, 1, 6, 4, 2).reshape(n, c, *y.shape[5:6], *y.shape[3:4], *y.shape[1:2], *k)


def _check_spatial(x: Tensor, n: int, op: str) -> None:
    if x.ndim != n + 2:
        raise ShapeError(f"{op}(): expected a {n + 2}-D input (N, C, {n} spatial axes), got shape {x.shape}")
    if not x.dtype.is_float:
        raise DTypeError(f"{op}(): expected a float32 input, got {x.dtype.name}")


def _pool_args(x: Tensor, n: int, op: str, kernel_size: IntOr2, stride: IntOr2 | None, padding: IntOr2,
               dilation: IntOr2, ceil_mode: bool) -> tuple[tuple[int, ...], ...]:
    """Kernel, stride, padding, dilation and the extra right padding that ``ceil_mode`` needs (a
    last window may start in the input or the left padding, never in the right padding), as torch."""
    _check_spatial(x, n, op)
    k = _tuple(kernel_size, n, "kernel_size", op)
    st = k if stride is None or stride == [] else _tuple(stride, n, "stride", op)
    p, d = _tuple(padding, n, "padding", op), _tuple(dilation, n, "dilation", op)
    if any(2 * pp > kk for pp, kk in zip(p, k)):
        raise ShapeError(f"{op}(): padding {p} must be at most half the kernel size {k}")
    extra = []
    for i, kk, ss, pp, dd in zip(x.shape[2:], k, st, p, d):
        span = i + 2 * pp - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= i + pp:
            o -= 1
        if o <= 0:
            raise ShapeError(f"{op}(): a window of {k} (dilation {d}) does not fit the input {x.shape[2:]} padded by {p}")
        extra.append(max(0, (o - 1) * ss + dd * (kk - 1) + 1 - (i + 2 * pp)))
    return k, st, p, d, tuple(extra)


def _max_pool(x: Tensor, n: int, op: str, kernel_size: IntOr2, stride: IntOr2 | None, padding: IntOr2,
              dilation: IntOr2, ceil_mode: bool, return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    k, st, p, d, extra = _pool_args(x, n, op, kernel_size, stride, padding, dilation, ceil_mode)
    pads = ((0, 0), (0, 0), *[(pp, pp + e) for pp, e in zip(p, extra)])
    xp = x.pad(pads, value=float("-inf")) if any(p) or any(extra) else x
    win = _windows(xp, k, st, d)
    out = win.max(tuple(range(-n, 0)))
    if not return_indices:
        return out
    # the flat index (within each channel's input) of each window's first maximum, as torch
    ins = x.shape[2:]
    idx = Tensor.arange(math.prod(ins), device=x.device).reshape(1, 1, *ins).pad(pads, value=-1)
    kk = math.prod(k)
    flat = win.reshape(*win.shape[:2 + n], kk)
    first = (flat.argmax(-1).unsqueeze(-1) == Tensor.arange(kk, device=x.device))
    return out, first.where(_windows(idx, k, st, d).reshape(1, 1, *win.shape[2:2 + n], kk), 0).sum(-1)


def _avg_pool(x: Tensor, n: int, op: str, kernel_size: IntOr2, stride: IntOr2 | None, padding: IntOr2,
              ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Tensor:
    k, st, p, d, extra = _pool_args(x, n, op, kernel_size, stride, padding, 1, ceil_mode)
    pads = ((0, 0), (0, 0), *[(pp, pp + e) for pp, e in zip(p, extra)])
    sums = _windows(x.pad(pads), k, st, d).sum(tuple(range(-n, 0)))
    if divisor_override:
        return sums * (1.0 / divisor_override)
    if (count_include_pad or not any(p)) and not any(extra):
        return sums * (1.0 / math.prod(k))
    # the divisor counts the window's cells inside the input (and its padding, with
    # count_include_pad), never those past it that ceil_mode adds
    ins = x.shape[2:]
    if count_include_pad:
        ones = Tensor.ones(1, 1, *[i + 2 * pp for i, pp in zip(ins, p)], device=x.device)
        ones = ones.pad(((0, 0), (0, 0), *[(0, e) for e in extra]))
    else:
        ones = Tensor.ones(1, 1, *ins, device=x.device).pad(pads)
    return sums / _windows(ones, k, st, d).sum(tuple(range(-n, 0)))


def max_pool1d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               dilation: IntOr2 = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    return _max_pool(input, 1, "max_pool1d", kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               dilation: IntOr2 = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows (padding counts as -inf), as torch.nn.functional.max_pool2d; with
    ``return_indices`` also the flat index of each maximum in its channel (for ``max_unpool2d``).

        >>> max_pool2d(Tensor.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
        [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    return _max_pool(input, 2, "max_pool2d", kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               dilation: IntOr2 = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    return _max_pool(input, 3, "max_pool3d", kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    return _avg_pool(input, 1, "avg_pool1d", kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over windows, as torch.nn.functional.avg_pool2d.

        >>> avg_pool2d(Tensor.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
        [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    return _avg_pool(input, 2, "avg_pool2d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(input: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    return _avg_pool(input, 3, "avg_pool3d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _max_unpool(input: Tensor, indices: Tensor, n: int, op: str, kernel_size: IntOr2, stride: IntOr2 | None,
                padding: IntOr2, output_size: Sequence[int] | None) -> Tensor:
    """The inverse of ``max_pool{n}d(..., return_indices=True)``: each value written at its flat
    index (within its channel) in a zero (N, C, *output_size) output (a one-hot contraction, so the
    gradient gathers back). The output size is (i - 1) * stride - 2 * padding + kernel_size unless
    ``output_size`` (spatial, or with N and C first) is given, within stride of it, as torch."""
    _check_spatial(input, n, op)
    if indices.shape != input.shape or not indices.dtype.is_int:
        raise ShapeError(f"{op}(): indices must be an integer tensor (int32, int64, ...) of the input's "
                         f"shape {input.shape}, got {indices.dtype.name} {indices.shape}")
    k = _tuple(kernel_size, n, "kernel_size", op)
    st = k if stride is None else _tuple(stride, n, "stride", op)
    p = _tuple(padding, n, "padding", op)
    size = tuple((i - 1) * ss - 2 * pp + kk for i, ss, pp, kk in zip(input.shape[2:], st, p, k))
    if output_size is not None:
        given = tuple(output_size)
        if len(given) not in (n, n + 2):
            raise ShapeError(f"{op}(): output_size must have {n} or {n + 2} sizes, got {given}")
        given = given[-n:]
        if any(not (d - ss < g < d + ss) for g, d, ss in zip(given, size, st)):
            raise ShapeError(f"{op}(): output_size {given} must be within stride {st} of the default {size} "
                             f"(exclusive), as torch")
        size = given
    b, c = input.shape[:2]

    def one_hot(idx: Tensor) -> Tensor:                          # (b, c, inputs, outputs)
        return idx.reshape(b, c, -1, 1) == Tensor.arange(math.prod(size), device=input.device)

    if all(kk <= ss for kk, ss in zip(k, st)):    # windows do not overlap: each index once, a plain sum
        return one_hot(indices).where(input.reshape(b, c, -1, 1), 0.0).sum(2).reshape(b, c, *size)

    # overlapping windows can pick one element twice (the same value): it is written once, and its
    # gradient reaches every input that wrote it (torch's scatter and gather)
    def forward(x: Tensor, idx: Tensor) -> Tensor:
        hot = one_hot(idx)
        count = hot.where(1.0, 0.0).sum(2).maximum(1.0)
        return (hot.where(x.reshape(b, c, -1, 1), 0.0).sum(2) / count).reshape(b, c, *size)

    def grad(g: LazyBuffer, _: LazyBuffer, srcs: tuple[LazyBuffer, ...]) -> tuple[LazyBuffer, None]:
        gathered = one_hot(Tensor(srcs[1])).where(Tensor(g).reshape(b, c, 1, -1), 0.0).sum(3)
        return gathered.reshape(input.shape).lazydata, None

    return Tensor._composite("MAX_UNPOOL", forward, grad, input, indices)


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None,
                 padding: IntOr2 = 0, output_size: Sequence[int] | None = None) -> Tensor:
    """The inverse of ``max_pool1d(..., return_indices=True)`` (``_max_unpool``)."""
    return _max_unpool(input, indices, 1, "max_unpool1d", kernel_size, stride, padding, output_size)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None,
                 padding: IntOr2 = 0, output_size: Sequence[int] | None = None) -> Tensor:
    """The inverse of ``max_pool2d(..., return_indices=True)``: each value written at its index in
    a zero (N, C, H, W) output (``_max_unpool``).

        >>> y, i = max_pool2d(Tensor.arange(16.0).reshape(1, 1, 4, 4), 2, return_indices=True)
        >>> max_unpool2d(y, i, 2).tolist()[0][0][1]
        [0.0, 5.0, 0.0, 7.0]
    """
    return _max_unpool(input, indices, 2, "max_unpool2d", kernel_size, stride, padding, output_size)


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None,
                 padding: IntOr2 = 0, output_size: Sequence[int] | None = None) -> Tensor:
    """The inverse of ``max_pool3d(..., return_indices=True)`` (``_max_unpool``)."""
    return _max_unpool(input, indices, 3, "max_unpool3d", kernel_size, stride, padding, output_size)


def _adaptive(x: Tensor, n: int, output_size: int | Sequence[int | None], op: str, reduce: str) -> Tensor:
    """Window j of an axis of length i into o: [floor(j*i/o), ceil((j+1)*i/o)), as torch. Mean and
    max over a box are the mean (max) along one axis after another, so each axis is pooled alone."""
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(f"{op}(): expected a {n + 1}-D or {n + 2}-D input, got shape {x.shape}")
    outs = (output_size,) * n if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(outs) != n:
        raise ShapeError(f"{op}(): output_size must be an int or {n} sizes, got {output_size!r}")
    for j, o in enumerate(outs):
        ax = x.ndim - n + j
        i = x.shape[ax]
        o = i if o is None else o
        if i % o == 0:
            y = x.reshape(*x.shape[:ax], o, i // o, *x.shape[ax + 1:])
            x = y.mean(ax + 1) if reduce == "mean" else y.amax(ax + 1)
            continue
        parts = []
        for w in range(o):
            lo, hi = (w * i) // o, -(-((w + 1) * i) // o)
            piece = x.shrink([None] * ax + [(lo, hi)] + [None] * (x.ndim - ax - 1))
            parts.append(piece.mean(ax, keepdim=True) if reduce == "mean" else piece.amax(ax, keepdim=True))
        x = parts[0].cat(*parts[1:], dim=ax)
    return x


def adaptive_avg_pool1d(input: Tensor, output_size: int | Sequence[int]) -> Tensor:
    return _adaptive(input, 1, output_size, "adaptive_avg_pool1d", "mean")


def adaptive_avg_pool2d(input: Tensor, output_size: int | Sequence[int | None]) -> Tensor:
    return _adaptive(input, 2, output_size, "adaptive_avg_pool2d", "mean")


def adaptive_avg_pool3d(input: Tensor, output_size: int | Sequence[int | None]) -> Tensor:
    return _adaptive(input, 3, output_size, "adaptive_avg_pool3d", "mean")


_ADAPTIVE_AVG = {1: adaptive_avg_pool1d, 2: adaptive_avg_pool2d, 3: adaptive_avg_pool3d}


def adaptive_max_pool1d(input: Tensor, output_size: int | Sequence[int], return_indices: bool = False) -> Tensor:
    if return_indices:
        raise NotImplementedError("adaptive_max_pool1d(): return_indices is not supported")
    return _adaptive(input, 1, output_size, "adaptive_max_pool1d", "max")


def adaptive_max_pool2d(input: Tensor, output_size: int | Sequence[int | None], return_indices: bool = False) -> Tensor:
    if return_indices:
        raise NotImplementedError("adaptive_max_pool2d(): return_indices is not supported")
    return _adaptive(input, 2, output_size, "adaptive_max_pool2d", "max")


def adaptive_max_pool3d(input: Tensor, output_size: int | Sequence[int | None], return_indices: bool = False) -> Tensor:
    if return_indices:
        raise NotImplementedError("adaptive_max_pool3d(): return_indices is not supported")
    return _adaptive(input, 3, output_size, "adaptive_max_pool3d", "max")


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1, padding: IntOr2 = 0,
           dilation: IntOr2 = 1, groups: int = 1) -> Tensor:
    """1-D convolution: ``conv2d`` over a height-1 input (x (N, C_in, L), weight (C_out, C_in/groups, k))."""
    _check_spatial(input, 1, "conv1d")
    if weight.ndim != 3:
        raise ShapeError(f"conv1d(): expected a 3-D weight (C_out, C_in/groups, k), got shape {weight.shape}")
    s, p, d = (_tuple(v, 1, nm, "conv1d")[0] for v, nm in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    return conv2d(input.unsqueeze(2), weight.unsqueeze(2), bias, (1, s), (0, p), (1, d), groups).squeeze(2)


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1, padding: IntOr2 = 0,
           dilation: IntOr2 = 1, groups: int = 1) -> Tensor:
    """3-D convolution (x (N, C_in, D, H, W), weight (C_out, C_in/groups, kD, kH, kW)): one multiply
    and one sum over windows; its gradients are the primitives' (no hand-written one as conv2d's)."""
    _check_spatial(input, 3, "conv3d")
    if weight.ndim != 5:
        raise ShapeError(f"conv3d(): expected a 5-D weight (C_out, C_in/groups, kD, kH, kW), got shape {weight.shape}")
    n, cin = input.shape[:2]
    cout, wcin, k = weight.shape[0], weight.shape[1], weight.shape[2:]
    if groups < 1 or cin % groups or cout % groups or wcin * groups != cin:
        raise ShapeError(f"conv3d(): weight {weight.shape} with groups={groups} does not fit the input's {cin} channels")
    s, p, d = (_tuple(v, 3, nm, "conv3d") for v, nm in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    win = _windows(input.pad(((0, 0), (0, 0), *[(pp, pp) for pp in p])), k, s, d)   # (n, cin, *o, *k)
    outs = win.shape[2:5]
    g, rc, no, nk = groups, cout // groups, math.prod(win.shape[2:5]), math.prod(k)
    win = win.reshape(n, g, 1, wcin, no, nk)
    out = (win * weight.reshape(1, g, rc, wcin, 1, nk)).sum((3, 5)).reshape(n, cout, *outs)
    return out + bias.reshape(1, cout, 1, 1, 1) if bias is not None else out


def _conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None, n: int, op: str, stride: IntOr2,
                    padding: IntOr2, output_padding: IntOr2, groups: int, dilation: IntOr2) -> Tensor:
    """Transposed convolution over n = 2 or 3 spatial axes (the gradient of ``conv{n}d`` w.r.t.
    its input), weight (C_in, C_out/groups, *k), as torch: the input zero-inserted by the stride,
    padded by dilation * (k - 1) - padding (plus ``output_padding`` after), convolved at stride 1
    with the weights flipped and their channel axes swapped (``_swapped``)."""
    _check_spatial(input, n, op)
    if weight.ndim != n + 2 or weight.shape[0] != input.shape[1] or groups < 1 or input.shape[1] % groups:
        raise ShapeError(f"{op}(): expected a weight (C_in={input.shape[1]}, C_out/groups, {n} kernel sizes) "
                         f"with groups={groups} dividing C_in, got shape {weight.shape}")
    s, p, op_, d = (_tuple(v, n, nm, op) for v, nm in
                    ((stride, "stride"), (padding, "padding"), (output_padding, "output_padding"), (dilation, "dilation")))
    if min(s) < 1 or min(d) < 1 or min(p) < 0 or min(op_) < 0:
        raise ShapeError(f"{op}(): stride and dilation must be >= 1, padding and output_padding >= 0, "
                         f"got {s}, {d}, {p}, {op_}")
    if any(o >= max(ss, dd) for o, ss, dd in zip(op_, s, d)):
        raise ShapeError(f"{op}(): output_padding {op_} must be smaller than stride {s} or dilation {d}")
    b, cin, *ins = input.shape
    z = input
    if any(ss != 1 for ss in s):                 # zero-insert: (b, c, i, 1, ...) padded to (b, c, i, s, ...)
        z = z.reshape(b, cin, *[v for i in ins for v in (i, 1)])
        z = z.pad(((0, 0), (0, 0), *[e for ss in s for e in ((0, 0), (0, ss - 1))]))
        z = z.reshape(b, cin, *[i * ss for i, ss in zip(ins, s)]).shrink((None, None, *[(0, (i - 1) * ss + 1) for i, ss in zip(ins, s)]))
    reach = [dd * (k - 1) - pp for dd, k, pp in zip(d, weight.shape[2:], p)]
    z = z.pad(((0, 0), (0, 0), *[(r, r + o) for r, o in zip(reach, op_)]))
    return (conv2d if n == 2 else conv3d)(z, _swapped(weight, groups), bias, 1, 0, d, groups)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1,
                     padding: IntOr2 = 0, output_padding: IntOr2 = 0, groups: int = 1, dilation: IntOr2 = 1) -> Tensor:
    """Transposed 2-D convolution (the gradient of conv2d w.r.t. its input), weight
    (C_in, C_out/groups, kH, kW), as torch (``_conv_transpose``).

        >>> conv_transpose2d(Tensor.ones(1, 2, 3, 3), Tensor.ones(2, 4, 3, 3), stride=2, padding=1, output_padding=1).shape
        (1, 4, 6, 6)
    """
    return _conv_transpose(input, weight, bias, 2, "conv_transpose2d", stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1,
                     padding: IntOr2 = 0, output_padding: IntOr2 = 0, groups: int = 1, dilation: IntOr2 = 1) -> Tensor:
    """Transposed 3-D convolution, weight (C_in, C_out/groups, kD, kH, kW), as torch
    (``_conv_transpose`` over ``conv3d``).

        >>> conv_transpose3d(Tensor.ones(1, 2, 2, 3, 3), Tensor.ones(2, 4, 2, 3, 3), stride=2).shape
        (1, 4, 4, 7, 7)
    """
    return _conv_transpose(input, weight, bias, 3, "conv_transpose3d", stride, padding, output_padding, groups, dilation)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOr2 = 1,
                     padding: IntOr2 = 0, output_padding: IntOr2 = 0, groups: int = 1, dilation: IntOr2 = 1) -> Tensor:
    """Transposed 1-D convolution: ``conv_transpose2d`` over a height-1 input."""
    _check_spatial(input, 1, "conv_transpose1d")
    one = [_tuple(v, 1, nm, "conv_transpose1d")[0] for v, nm in
           ((stride, "stride"), (padding, "padding"), (output_padding, "output_padding"), (dilation, "dilation"))]
    s, p, op, d = ((1, v) if i != 1 and i != 2 else (0, v) for i, v in enumerate(one))
    return conv_transpose2d(input.unsqueeze(2), weight.unsqueeze(2), bias, s, p, op, groups, d).squeeze(2)


# ------------------------------------------------------------------ normalization, dropout, embedding

def batch_norm(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over channel axis 1 with the given per-channel statistics."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(shape)) * (var.reshape(shape) + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    return out + bias.reshape(shape) if bias is not None else out


def _normalized_shape(v, op: str) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple: an int or a tuple/list of ints, nothing else (a Tensor --
    the weight passed first, say -- would iterate into scalars)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,)
    if isinstance(v, (tuple, list)) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return tuple(v)
    got = f"a Tensor of shape {v.shape}" if isinstance(v, Tensor) else repr(v)
    raise TypeError(f"{op}(): normalized_shape must be an int or a tuple of ints, got {got}")


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` axes (biased variance, as torch)."""
    ns = _normalized_shape(normalized_shape, "layer_norm")
    if x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"layer_norm(): the input's last axes {x.shape} do not match normalized_shape {ns}")
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    mean = x.mean(axes, keepdim=True)
    c = x - mean
    out = c * ((c * c).mean(axes, keepdim=True) + eps).rsqrt()
    if weight is not None:
        out = out * weight
    return out + bias if bias is not None else out


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize (N, C, ...) over each group of C/num_groups channels and the spatial axes (biased
    variance), then scale and shift per channel, as torch.nn.functional.group_norm."""
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise ShapeError(f"group_norm(): num_groups={num_groups} must divide the channels of an (N, C, ...) input, got {x.shape}")
    g = x.reshape(x.shape[0], num_groups, -1)
    c = g - g.mean(2, keepdim=True)
    out = (c * ((c * c).mean(2, keepdim=True) + eps).rsqrt()).reshape(x.shape)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    return out + bias.reshape(shape) if bias is not None else out


def rms_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last ``len(normalized_shape)`` axes, times ``weight``;
    ``eps`` None is float32's machine epsilon, as torch.nn.functional.rms_norm."""
    ns = _normalized_shape(normalized_shape, "rms_norm")
    if x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"rms_norm(): the input's last axes {x.shape} do not match normalized_shape {ns}")
    eps = float(np.finfo(np.float32).eps) if eps is None else eps
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    out = x * ((x * x).mean(axes, keepdim=True) + eps).rsqrt()
    return out * weight if weight is not None else out


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p) (in training).
    The mask is drawn on the host (``Tensor.rand``); a jitted step draws a new one every call."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout(): p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = Tensor.rand(*x.shape, device=x.device) >= p
    return keep.where(x * (1.0 / (1.0 - p)), 0.0)


_INDEX_DTYPES = "int8, uint8, int16, int32, uint32, int64"


def _check_int_index(t: Tensor, op: str, what: str = "indices") -> None:
    """Class indices/embedding indices may have any integer dtype (torch's default is int64). The
    compares below with an int32 ``arange`` promote (int64 and uint32 compare in int64), so a value
    beyond int32 matches no class and is never wrapped into one."""
    if not t.dtype.is_int:
        raise DTypeError(f"{op}(): expected int32 {what} or another integer dtype ({_INDEX_DTYPES}), "
                         f"got {t.dtype.name}")


def one_hot(indices: Tensor, num_classes: int) -> Tensor:
    """Integer indices of any integer dtype (any shape) -> (..., num_classes) int32 one-hot (torch:
    int64); an index outside [0, num_classes) gives a row of zeros (torch raises).

        >>> one_hot(Tensor([2, 0]), 3).tolist()
        [[0, 0, 1], [1, 0, 0]]
    """
    _check_int_index(indices, "one_hot")
    classes = Tensor.arange(num_classes, device=indices.device)
    return (indices.unsqueeze(-1) == classes).int()


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num, dim) at ``indices`` of any integer dtype (any shape) -> (..., dim);
    a one-hot matmul, so the gradient w.r.t. ``weight`` is a sum of one-hot rows. An index outside
    [0, num) reads a row of zeros (torch raises)."""
    _check_int_index(indices, "embedding")
    oh = (indices.unsqueeze(-1) == Tensor.arange(weight.shape[0], device=indices.device)).float()
    return oh @ weight


# ------------------------------------------------------------------ attention

def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E), (..., S, E), (..., S, Ev), as torch:
    a bool ``attn_mask`` keeps where True, a float one is added; ``is_causal`` keeps the lower
    triangle; ``enable_gqa`` shares each key/value head among query heads (axis -3)."""
    if query.ndim < 2 or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ShapeError(f"scaled_dot_product_attention(): q, k, v need one rank >= 2, got {query.shape}, {key.shape}, {value.shape}")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention(): give attn_mask or is_causal, not both")
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        if query.shape[-3] % key.shape[-3]:
            raise ShapeError(f"scaled_dot_product_attention(): {query.shape[-3]} query heads are no multiple of {key.shape[-3]} key heads")
        r = query.shape[-3] // key.shape[-3]

        def rep(t: Tensor) -> Tensor:
            e = t.unsqueeze(-3).expand(*t.shape[:-2], r, *t.shape[-2:])
            return e.reshape(*t.shape[:-3], t.shape[-3] * r, *t.shape[-2:])
        key, value = rep(key), rep(value)
    L, S = query.shape[-2], key.shape[-2]
    scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    if is_causal:
        attn_mask = Tensor.arange(L, device=query.device).reshape(L, 1) >= Tensor.arange(S, device=query.device)
    if attn_mask is not None:
        scores = attn_mask.where(scores, float("-inf")) if attn_mask.dtype.name == "bool" else scores + attn_mask
    weights = scores.softmax(-1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ value


# ------------------------------------------------------------------ losses

def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}(): reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """torch's deprecated ``size_average``/``reduce`` arguments, when given, decide the reduction."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


def _check_target(target: Tensor, x: Tensor, op: str, what: str) -> None:
    _check_int_index(target, op, "class indices")
    if target.shape != (x.shape[0],) + x.shape[2:]:
        raise ShapeError(f"{op}(): target shape {target.shape} does not fit {what} {x.shape} "
                         f"(expected {(x.shape[0],) + x.shape[2:]})")


def _class_hot(target: Tensor, logits: Tensor, op: str) -> Tensor:
    """Integer class indices (N, d...) -> float32 one-hot (N, C, d...) lined up with ``logits``."""
    _check_target(target, logits, op, "input")
    c = logits.shape[1]
    classes = Tensor.arange(c, device=logits.device).reshape((c,) + (1,) * (logits.ndim - 2))
    return (target.unsqueeze(1) == classes).float()


def _class_weight(weight: Tensor | None, x: Tensor, op: str) -> Tensor | None:
    """A (C,) class weight reshaped to broadcast along axis 1 of ``x``."""
    if weight is None:
        return None
    if weight.shape != (x.shape[1],):
        raise ShapeError(f"{op}(): weight must have shape ({x.shape[1]},) (one per class), got {weight.shape}")
    return weight.reshape((x.shape[1],) + (1,) * (x.ndim - 2))


def _batched(x: Tensor, target: Tensor, op: str) -> tuple[Tensor, Tensor, bool]:
    """An unbatched (C,) input with a () target becomes a batch of one (as torch accepts)."""
    if x.ndim == 1:
        return x.unsqueeze(0), target.reshape(1) if target.dtype.is_int else target.unsqueeze(0), True
    if x.ndim < 2:
        raise ShapeError(f"{op}(): expected an input of shape (C,), (N, C) or (N, C, d...), got {x.shape}")
    return x, target, False


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: bool | None = None,
             ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C) or (N, C, d...) at class indices of any
    integer dtype (N) or (N, d...), as torch.nn.functional.nll_loss: each term is -weight[y] * input[y]; targets
    equal to ``ignore_index`` count for nothing, and the mean divides by the sum of the weights of
    the kept targets.

        >>> nll_loss(Tensor([[-1.0, -2.0], [-3.0, -4.0]]), Tensor([1, 0]), weight=Tensor([1.0, 3.0])).item()
        2.25
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    logp, target, unbatched = _batched(input, target, "nll_loss")
    w = _class_hot(target, logp, "nll_loss")
    cw = _class_weight(weight, logp, "nll_loss")
    if cw is not None:
        w = w * cw
    keep = target != ignore_index
    loss = keep.where(-(logp * w).sum(1), 0.0)
    if reduction == "mean":
        return loss.sum() / keep.where(w.sum(1), 0.0).sum()
    loss = loss.reshape(()) if unbatched and reduction == "none" else loss
    return _reduce(loss, reduction, "nll_loss")


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: bool | None = None,
                  ignore_index: int = -100, reduce: bool | None = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits (C), (N, C) or (N, C, d...) against integer class indices or class
    probabilities (the logits' shape), as torch.nn.functional.cross_entropy, with its ``weight``,
    ``ignore_index`` and ``label_smoothing`` (the target becomes (1 - e) * target + e / C).

        >>> logits = Tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
        >>> round(cross_entropy(logits, Tensor([0, 2])).item(), 4)
        0.2395
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy(): reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy(): label_smoothing must be in [0, 1], got {label_smoothing}")
    logits, target, unbatched = _batched(input, target, "cross_entropy")
    c = logits.shape[1]
    logp = logits.log_softmax(1)
    cw = _class_weight(weight, logits, "cross_entropy")
    wlogp = logp * cw if cw is not None else logp
    if target.dtype.is_float:                       # class probabilities
        if target.shape != logits.shape:
            raise ShapeError(f"cross_entropy(): probability targets need the logits' shape {logits.shape}, got {target.shape}")
        t = target * (1.0 - label_smoothing) + label_smoothing / c if label_smoothing else target
        loss = -(wlogp * t).sum(1)
        # NOTE: torch's mean divides by the number of positions, not by a sum of weights
        return _reduce(loss.reshape(()) if unbatched else loss, reduction, "cross_entropy")
    if not target.dtype.is_int:
        raise DTypeError(f"cross_entropy(): expected int32 class indices or float32 probabilities (indices of any "
                         f"integer dtype: {_INDEX_DTYPES}; probabilities of any float dtype), got {target.dtype.name}")
    _check_target(target, logits, "cross_entropy", "logits")
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if not label_smoothing:
        return nll.reshape(()) if unbatched and reduction == "none" else nll
    # torch: (1 - e) * nll + e / C * smooth, smooth = -sum_c weight[c] * logp[c], normalized as nll
    keep = target != ignore_index
    smooth = keep.where(-wlogp.sum(1), 0.0)
    if reduction == "mean":
        wt = _class_hot(target, logp, "cross_entropy")
        wt = (wt * cw).sum(1) if cw is not None else wt.sum(1)
        smooth = smooth.sum() / keep.where(wt, 0.0).sum()
    else:
        smooth = _reduce(smooth, reduction, "cross_entropy")
    out = nll * (1.0 - label_smoothing) + smooth * (label_smoothing / c)
    return out.reshape(()) if unbatched and reduction == "none" else out


def _weighted(loss: Tensor, weight: Tensor | None) -> Tensor:
    return loss * weight if weight is not None else loss


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: bool | None = None,
                         reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """-weight * (y log p + (1 - y) log(1 - p)) with the logs clamped at -100, as torch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if input.shape != target.shape:
        raise ShapeError(f"binary_cross_entropy(): input {input.shape} and target {target.shape} differ in shape")
    y = target.float()
    loss = -(y * input.log().maximum(-100.0) + (1.0 - y) * (1.0 - input).log().maximum(-100.0))
    return _reduce(_weighted(loss, weight), reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average: bool | None = None, reduce: bool | None = None,
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy(sigmoid(x), y) computed stably, as torch:
    (1 - y) * x + (1 + (pos_weight - 1) * y) * softplus(-x), times ``weight``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if input.shape != target.shape:
        raise ShapeError(f"binary_cross_entropy_with_logits(): input {input.shape} and target {target.shape} differ in shape")
    y = target.float()
    if pos_weight is None:
        loss = input.softplus() - input * y
    else:
        loss = (1.0 - y) * input + (1.0 + (pos_weight - 1.0) * y) * (-input).softplus()
    return _reduce(_weighted(loss, weight), reduction, "binary_cross_entropy_with_logits")


def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
             reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    """Mean squared error.

        >>> mse_loss(Tensor([1.0, 2.0]), Tensor([0.0, 0.0])).item()
        2.5
    """
    d = input - target
    return _reduce(_weighted(d * d, weight), _legacy_reduction(size_average, reduce, reduction), "mse_loss")


def l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
            reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    return _reduce(_weighted((input - target).abs(), weight), _legacy_reduction(size_average, reduce, reduction), "l1_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (the L1 loss when beta is 0), as torch.

        >>> smooth_l1_loss(Tensor([0.5, 3.0]), Tensor([0.0, 0.0]), reduction="none").tolist()
        [0.125, 2.5]
    """
    if beta < 0:
        raise ValueError(f"smooth_l1_loss(): beta must be >= 0, got {beta}")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    d = (input - target).abs()
    if beta == 0.0:
        return _reduce(d, reduction, "smooth_l1_loss")
    return _reduce((d < beta).where(d * d * (0.5 / beta), d - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta * (|d| - 0.5 delta), as torch (= delta * smooth_l1 with beta delta)."""
    if delta <= 0:
        raise ValueError(f"huber_loss(): delta must be > 0, got {delta}")
    d = (input - target).abs()
    loss = (d < delta).where(d * d * 0.5, (d - 0.5 * delta) * delta)
    return _reduce(_weighted(loss, weight), reduction, "huber_loss")


def kl_div(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """KL(target || exp(input)) pointwise, for log-probabilities ``input``: target * (log target -
    input) (0 where target is 0), or exp(t) * (t - input) with ``log_target``. ``reduction``
    "batchmean" divides the sum by the batch size (the mathematically right KL; torch's "mean"
    divides by every element)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        # NOTE: xlogy: where target is 0 the term is 0, and so is its gradient (log 0 is never used)
        pos = target > 0
        loss = pos.where(target * (pos.where(target, 1.0).log() - input), 0.0)
    if reduction == "batchmean":
        return loss.sum() * (1.0 / input.shape[0]) if input.ndim else loss.sum()
    return _reduce(loss, reduction, "kl_div")


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "math", "np", "Sequence", "Tensor", "LazyBuffer", "get_device",
                                                                   "float32", "int32", "DTypeError", "ShapeError",
                                                                   "IntOr2")]
