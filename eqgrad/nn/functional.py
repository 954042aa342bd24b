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

from typing import Sequence

from eqgrad.dtype import int32
from eqgrad.errors import DTypeError, ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.lower.passes import LANES_LAST

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


def _lane_room(c: int) -> int:
    """How well ``c`` channels fill register lanes: the largest of the lowering's widths dividing it."""
    return next((w for w in LANES_LAST if c % w == 0), 1)


def _swapped(weight: Tensor, groups: int) -> Tensor:
    """(C_out, C_in/g, kh, kw) -> (C_in, C_out/g, kh, kw) flipped in (kh, kw): the weights of the
    convolution that is the input gradient's."""
    cout, wcin, kh, kw = weight.shape
    rc = cout // groups
    return weight.reshape(groups, rc, wcin, kh, kw).permute(0, 2, 1, 3, 4).reshape(groups * wcin, rc, kh, kw).flip((2, 3))


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
    co_last = _lane_room(rc) > _lane_room(wcin)
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


def max_pool2d(x: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               dilation: IntOr2 = 1) -> Tensor:
    """Max over windows (padding counts as -inf), as torch.nn.functional.max_pool2d.

        >>> max_pool2d(Tensor.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
        [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    _check_nchw(x, "max_pool2d")
    k = _pair(kernel_size, "kernel_size", "max_pool2d")
    s = k if stride is None else _pair(stride, "stride", "max_pool2d")
    p, d = _pair(padding, "padding", "max_pool2d"), _pair(dilation, "dilation", "max_pool2d")
    if any(2 * pp > kk for pp, kk in zip(p, k)):
        raise ShapeError(f"max_pool2d(): padding {p} must be at most half the kernel size {k}")
    xp = x.pad(((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), value=float("-inf")) if any(p) else x
    return _pool(xp, k, s, d).max((-2, -1))


def avg_pool2d(x: Tensor, kernel_size: IntOr2, stride: IntOr2 | None = None, padding: IntOr2 = 0,
               count_include_pad: bool = True) -> Tensor:
    """Mean over windows, as torch.nn.functional.avg_pool2d.

        >>> avg_pool2d(Tensor.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
        [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    _check_nchw(x, "avg_pool2d")
    k = _pair(kernel_size, "kernel_size", "avg_pool2d")
    s = k if stride is None else _pair(stride, "stride", "avg_pool2d")
    p = _pair(padding, "padding", "avg_pool2d")
    if any(2 * pp > kk for pp, kk in zip(p, k)):
        raise ShapeError(f"avg_pool2d(): padding {p} must be at most half the kernel size {k}")
    pads = ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]))
    sums = _pool(x.pad(pads), k, s, (1, 1)).sum((-2, -1))
    if count_include_pad or not any(p):
        return sums * (1.0 / (k[0] * k[1]))
    counts = _pool(Tensor.ones(1, 1, *x.shape[2:], device=x.device).pad(pads), k, s, (1, 1)).sum((-2, -1))
    return sums / counts


# ------------------------------------------------------------------ normalization, dropout, embedding

def batch_norm(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over channel axis 1 with the given per-channel statistics."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(shape)) * (var.reshape(shape) + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    return out + bias.reshape(shape) if bias is not None else out


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` axes (biased variance, as torch)."""
    ns = tuple(normalized_shape)
    if x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"layer_norm(): the input's last axes {x.shape} do not match normalized_shape {ns}")
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    mean = x.mean(axes, keepdim=True)
    c = x - mean
    out = c * ((c * c).mean(axes, keepdim=True) + eps).rsqrt()
    if weight is not None:
        out = out * weight
    return out + bias if bias is not None else out


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


def one_hot(indices: Tensor, num_classes: int) -> Tensor:
    """int32 indices (any shape) -> (..., num_classes) int32 one-hot.

        >>> one_hot(Tensor([2, 0]), 3).tolist()
        [[0, 0, 1], [1, 0, 0]]
    """
    if indices.dtype is not int32:
        raise DTypeError(f"one_hot(): expected int32 indices, got {indices.dtype.name}")
    classes = Tensor.arange(num_classes, device=indices.device)
    return (indices.unsqueeze(-1) == classes).int()


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num, dim) at int32 ``indices`` (any shape) -> (..., dim); a one-hot
    matmul, so the gradient w.r.t. ``weight`` is a sum of one-hot rows."""
    if indices.dtype is not int32:
        raise DTypeError(f"embedding(): expected int32 indices, got {indices.dtype.name}")
    oh = (indices.unsqueeze(-1) == Tensor.arange(weight.shape[0], device=indices.device)).float()
    return oh @ weight


# ------------------------------------------------------------------ losses

def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}(): reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
    """Cross-entropy of ``logits`` (N, C) or (N, C, d...) against int32 class indices (N) /
    (N, d...) or class probabilities (the logits' shape), as torch.nn.functional.cross_entropy.
    With ``label_smoothing`` e the target is (1 - e) * target + e / C.

        >>> logits = Tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
        >>> round(cross_entropy(logits, Tensor([0, 2])).item(), 4)
        0.2395
    """
    if logits.ndim < 2:
        raise ShapeError(f"cross_entropy(): expected logits of shape (N, C) or (N, C, d...), got {logits.shape}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy(): label_smoothing must be in [0, 1], got {label_smoothing}")
    c = logits.shape[1]
    logp = logits.log_softmax(1)
    if target.dtype.is_float:                       # class probabilities
        if target.shape != logits.shape:
            raise ShapeError(f"cross_entropy(): probability targets need the logits' shape {logits.shape}, got {target.shape}")
        t = target * (1.0 - label_smoothing) + label_smoothing / c if label_smoothing else target
        return _reduce(-(logp * t).sum(1), reduction, "cross_entropy")
    if target.dtype is not int32:
        raise DTypeError(f"cross_entropy(): expected int32 class indices or float32 probabilities, got {target.dtype.name}")
    if target.shape != (logits.shape[0],) + logits.shape[2:]:
        raise ShapeError(f"cross_entropy(): target shape {target.shape} does not fit logits {logits.shape} "
                         f"(expected {(logits.shape[0],) + logits.shape[2:]})")
    classes = Tensor.arange(c, device=logits.device).reshape((c,) + (1,) * (logits.ndim - 2))
    hot = (target.unsqueeze(1) == classes).float()
    loss = -(logp * hot).sum(1)
    if label_smoothing:
        loss = loss * (1.0 - label_smoothing) - logp.mean(1) * label_smoothing
    keep = target != ignore_index
    loss = keep.where(loss, 0.0)
    if reduction == "mean":
        return loss.sum() / keep.float().sum()
    return _reduce(loss, reduction, "cross_entropy")


def nll_loss(logp: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C) at int32 targets (N)."""
    if logp.ndim != 2 or target.shape != (logp.shape[0],):
        raise ShapeError(f"nll_loss(): expected (N, C) log-probabilities and (N,) targets, got {logp.shape} and {target.shape}")
    hot = one_hot(target, logp.shape[1]).float()
    return _reduce(-(logp * hot).sum(1), reduction, "nll_loss")


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-(y log p + (1 - y) log(1 - p)) with the logs clamped at -100, as torch."""
    if p.shape != target.shape:
        raise ShapeError(f"binary_cross_entropy(): input {p.shape} and target {target.shape} differ in shape")
    y = target.float()
    loss = -(y * p.log().maximum(-100.0) + (1.0 - y) * (1.0 - p).log().maximum(-100.0))
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """binary_cross_entropy(sigmoid(x), target), computed stably as softplus(x) - x * y."""
    if x.shape != target.shape:
        raise ShapeError(f"binary_cross_entropy_with_logits(): input {x.shape} and target {target.shape} differ in shape")
    return _reduce(x.softplus() - x * target.float(), reduction, "binary_cross_entropy_with_logits")


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error.

        >>> mse_loss(Tensor([1.0, 2.0]), Tensor([0.0, 0.0])).item()
        2.5
    """
    d = x - target
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).abs(), reduction, "l1_loss")


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "math", "Sequence", "Tensor",
                                                                   "float32", "int32", "DTypeError", "ShapeError",
                                                                   "IntOr2")]
