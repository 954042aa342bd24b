"""``interpolate`` (torch.nn.functional.interpolate) and the ``Upsample`` module: nearest,
nearest-exact, (bi/tri)linear and area resampling of the spatial axes of an (N, C, ...) tensor,
composed from Tensor ops (no primitive of its own), so gradients come from those ops.

    >>> from eqgrad import Tensor
    >>> interpolate(Tensor.ones(1, 1, 2, 3), scale_factor=2).shape
    (1, 1, 4, 6)

Which source elements an output element reads, and with what weights, depends only on the shapes:
it is computed on the host with NumPy, in the arithmetic torch's CPU kernels use (their results
are matched index for index), then each spatial axis is resampled alone (the modes are separable),
the last axis first as torch's kernels nest them. An axis is a movement op where its indices have
a regular form (a copy, a repeat, a strided slice, a repeat of the edge-padded axis) and a gather
(``index_select``) otherwise; the linear modes add ``x0 * w0 + x1 * w1`` with the weights as a
constant tensor broadcast along the axis.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from eqgrad.dtype import float32, float64
from eqgrad.errors import DTypeError, ShapeError
from eqgrad.frontend.tensor import Tensor

MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area")
_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}
_LAYOUT = {1: "(N, C, W)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


# ------------------------------------------------------------------ sizes and scales

def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _output_size(x: Tensor, size: Any, scale_factor: Any, recompute_scale_factor: bool | None
                 ) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
    """The output's spatial sizes and the scale factor of each axis (None: from the sizes), as
    torch: ``floor(in * scale_factor)`` in double precision, and the kernels then map output to
    input positions by ``1 / scale_factor`` unless ``recompute_scale_factor`` (then in / out)."""
    n = x.ndim - 2
    spatial = list(x.shape[2:])
    if size is not None and scale_factor is not None:
        raise ValueError("interpolate(): give only one of size and scale_factor, got both")
    if size is None and scale_factor is None:
        raise ValueError("interpolate(): give either size or scale_factor, got neither")
    if recompute_scale_factor and size is not None:
        raise ValueError("interpolate(): recompute_scale_factor is not meaningful with an explicit size")
    if size is not None:
        sizes = tuple(size) if isinstance(size, (list, tuple)) else (size,) * n
        if len(sizes) != n:
            raise ShapeError(f"interpolate(): size must be an int or {n} ints for an input with spatial dimensions "
                             f"{spatial}, got size {size!r}")
        if not all(_is_int(s) for s in sizes):
            raise TypeError(f"interpolate(): size must be an int or a tuple of ints, got {size!r}")
        outs, scales = tuple(int(s) for s in sizes), (None,) * n
    else:
        sf = tuple(scale_factor) if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * n
        if len(sf) != n:
            raise ShapeError(f"interpolate(): scale_factor must be a number or {n} numbers for an input with spatial "
                             f"dimensions {spatial}, got scale_factor {scale_factor!r}")
        if not all(isinstance(s, (int, float, np.integer, np.floating)) and not isinstance(s, (bool, np.bool_))
                   for s in sf):
            raise TypeError(f"interpolate(): scale_factor must be a number or a tuple of numbers, got {scale_factor!r}")
        sf = tuple(float(s) for s in sf)
        if not all(math.isfinite(s) for s in sf):
            raise ValueError(f"interpolate(): scale_factor must be finite, got {scale_factor!r}")
        outs = tuple(math.floor(i * s) for i, s in zip(spatial, sf))
        scales = (None,) * n if recompute_scale_factor else sf
    if any(o <= 0 for o in outs) or any(i <= 0 for i in spatial):
        names = "DHW"[3 - n:]
        raise ShapeError("interpolate(): input and output sizes should be greater than 0, but got input ("
                         + ", ".join(f"{a}: {i}" for a, i in zip(names, spatial)) + ") and output ("
                         + ", ".join(f"{a}: {o}" for a, o in zip(names, outs)) + ")")
    return outs, scales


def _scale(n: int, o: int, sf: float | None, ft: type) -> Any:
    """torch's compute_scales_value: ``1 / scale_factor`` when one was given, else in / out, in
    ``ft`` (float32, or float64 for a float64 input: torch's opmath type)."""
    if sf is not None and sf > 0:
        return ft(1.0 / sf)
    return ft(ft(n) / ft(o))


def _floorf(v: np.ndarray) -> np.ndarray:
    """C's ``floorf``: torch's kernels floor source positions as float32, also in float64."""
    return np.floor(v.astype(np.float32)).astype(np.int64)


def _half_pixel(s: Any, o: int, ft: type) -> np.ndarray:
    """``s * (j + 0.5) - 0.5`` for j < o, rounded once (as the fused multiply-add torch's compiled
    kernels use; in float64 the product is what float64 gives)."""
    j = np.arange(o, dtype=np.float64)
    if ft is np.float32:
        return (np.float64(s) * (j + 0.5) - 0.5).astype(np.float32)
    return s * (j + 0.5) - 0.5


def _nearest_index(n: int, o: int, sf: float | None, exact: bool, ft: type) -> np.ndarray:
    """Source index of each of the ``o`` outputs of an axis of ``n``: ``floor(j * scale)`` (torch's
    legacy "nearest") or ``floor((j + 0.5) * scale)`` ("nearest-exact"), at most n - 1."""
    s = _scale(n, o, sf, ft)
    if exact:
        src = _half_pixel(s, o, ft)
        src = np.where(src < 0, ft(0), src).astype(np.float64) + 0.5
    else:
        src = np.arange(o).astype(ft) * s
    return np.minimum(_floorf(src), n - 1)


def _linear_index(n: int, o: int, sf: float | None, align_corners: bool, ft: type
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The two source indices and their weights for each output of an axis (torch's
    compute_source_index_and_lambda): i0 = floor(src), i1 = i0 + 1 (i0 at the last element),
    w1 = src - i0, w0 = 1 - w1, where src = j * (n - 1) / (o - 1) with ``align_corners`` and
    ``(j + 0.5) * scale - 0.5`` (at least 0) without."""
    if align_corners:
        s = ft(ft(n - 1) / ft(o - 1)) if o > 1 else ft(0)
        src = np.arange(o).astype(ft) * s
    else:
        src = _half_pixel(_scale(n, o, sf, ft), o, ft)
        src = np.where(src < 0, ft(0), src)
    i0 = np.minimum(_floorf(src), n - 1)
    w1 = np.minimum(np.maximum(src - i0.astype(ft), ft(0)), ft(1)).astype(ft)
    i1 = i0 + (i0 < n - 1)
    return i0, i1, (ft(1) - w1).astype(ft), w1


# ------------------------------------------------------------------ resampling one axis

def _strided(idx: np.ndarray, care: np.ndarray, n: int) -> tuple[int, int] | None:
    """(start, step) with idx[j] == start + step * j wherever ``care`` and every such position
    inside [0, n); None if there is none."""
    js = np.flatnonzero(care)
    if len(js) == 0:
        return None
    if len(js) == 1:
        start, step = int(idx[js[0]]) - int(js[0]), 1
    else:
        dj, di = int(js[1] - js[0]), int(idx[js[1]] - idx[js[0]])
        if di <= 0 or di % dj:
            return None
        step = di // dj
        start = int(idx[js[0]]) - step * int(js[0])
    o = len(idx)
    if start < 0 or start + step * (o - 1) >= n:
        return None
    if not np.array_equal(idx[care], start + step * np.arange(o)[care]):
        return None
    return start, step


def _repeated(idx: np.ndarray, care: np.ndarray, n: int) -> tuple[int, int] | None:
    """(k, c) with idx[j] == clip((j + c) // k, 0, n - 1) wherever ``care`` (k >= 2, -k <= c < k):
    each element repeated k times, the ends repeated as needed; None if there is none."""
    runs = np.diff(np.flatnonzero(np.diff(idx) != 0))
    if len(runs) == 0:
        return None
    k = int(np.bincount(runs).argmax())
    if k < 2:
        return None
    j = np.arange(len(idx))
    for c in range(-k, k):
        if np.array_equal(np.clip((j + c) // k, 0, n - 1)[care], idx[care]):
            return k, c
    return None


def _take(x: Tensor, axis: int, idx: np.ndarray, care: np.ndarray | None = None) -> Tensor:
    """``x`` at the indices ``idx`` along ``axis`` (``x.index_select(axis, idx)``); positions
    outside ``care`` may read any element (their weight is 0). Movement ops where the indices
    have a regular form, a gather otherwise."""
    n, o = x.shape[axis], len(idx)
    care = np.ones(o, bool) if care is None else care
    before, after = x.shape[:axis], x.shape[axis + 1:]
    if (st := _strided(idx, care, n)) is not None:
        start, step = st
        if step == 1:
            return x if o == n else x.shrink([None] * axis + [(start, start + o)] + [None] * len(after))
        end = start + step * o                       # o rows of step, the first of each kept
        if end > n:
            x = x.pad([None] * axis + [(0, end - n)] + [None] * len(after))
        x = x.shrink([None] * axis + [(start, end)] + [None] * len(after)).reshape(*before, o, step, *after)
        return x.shrink([None] * (axis + 1) + [(0, 1)] + [None] * len(after)).reshape(*before, o, *after)
    if (rc := _repeated(idx, care, n)) is not None:
        k, c = rc
        lo = 1 if c < 0 else 0                       # the first element once more on the left
        hi = max(0, -(-(c + o) // k) - n)            # and the last on the right
        if lo or hi:
            x = x.pad([None] * axis + [(lo, hi)] + [None] * len(after), mode="replicate")
        m = x.shape[axis]
        x = x.reshape(*before, m, 1, *after).expand(*before, m, k, *after).reshape(*before, m * k, *after)
        return x.shrink([None] * axis + [(c + lo * k, c + lo * k + o)] + [None] * len(after))
    return x.index_select(axis, Tensor(idx.astype(np.int32), device=x.device))


def _along(w: np.ndarray, axis: int, ndim: int, x: Tensor) -> Tensor:
    return Tensor(w.reshape((-1,) + (1,) * (ndim - axis - 1)), device=x.device)


def _resample(x: Tensor, axis: int, o: int, sf: float | None, mode: str, align_corners: bool, ft: type) -> Tensor:
    n = x.shape[axis]
    if mode in ("nearest", "nearest-exact"):
        return _take(x, axis, _nearest_index(n, o, sf, mode == "nearest-exact", ft))
    if o == n:                                       # torch copies an axis whose size does not change
        return x
    i0, i1, w0, w1 = _linear_index(n, o, sf, align_corners, ft)
    x0 = _take(x, axis, i0, w0 != 0)
    if not w1.any():                                 # every output on an input element (w0 == 1)
        return x0
    x1 = _take(x, axis, i1, w1 != 0)
    return x0 * _along(w0, axis, x.ndim, x) + x1 * _along(w1, axis, x.ndim, x)


# ------------------------------------------------------------------ interpolate, Upsample

def interpolate(input: Tensor, size: int | Sequence[int] | None = None,
                scale_factor: float | Sequence[float] | None = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False, area_pool: Any = None) -> Tensor:
    """torch.nn.functional.interpolate over the spatial axes of an (N, C, W), (N, C, H, W) or
    (N, C, D, H, W) input: exactly one of ``size`` (an int or one per spatial axis) and
    ``scale_factor`` (output = floor(input * scale_factor)); ``mode`` "nearest" (torch's legacy
    ``floor(j * in / out)``), "nearest-exact", "linear" (3-D), "bilinear" (4-D), "trilinear"
    (5-D), with ``align_corners`` (linear modes only; default False), or "area" (adaptive average
    pooling). Floating inputs keep their dtype (float16/bfloat16 are computed in float32, as
    torch's CPU kernels); the nearest modes also take integer and bool inputs."""
    if not isinstance(input, Tensor):
        raise TypeError(f"interpolate(): expected a Tensor input, got {type(input).__name__}")
    if antialias:
        raise NotImplementedError("interpolate(): antialias=True is not supported")
    if mode not in MODES:
        raise NotImplementedError(f"interpolate(): mode must be one of {' | '.join(MODES)}, got {mode!r} "
                                  "(bicubic is not supported)")
    if mode in _LINEAR:
        align_corners = bool(align_corners)
    elif align_corners is not None:
        raise ValueError(f"interpolate(): align_corners can only be set with the interpolating modes linear | "
                         f"bilinear | trilinear, got align_corners={align_corners!r} with mode={mode!r}")
    if input.ndim not in (3, 4, 5):
        raise ShapeError(f"interpolate(): expected a 3-D, 4-D or 5-D input (N, C, spatial...) for mode {mode!r}, "
                         f"got shape {input.shape}")
    n = input.ndim - 2
    if mode in _LINEAR and _LINEAR[mode] != n:
        want = _LINEAR[mode]
        other = {1: "linear", 2: "bilinear", 3: "trilinear"}[n]
        raise ShapeError(f"interpolate(): mode {mode!r} needs a {want + 2}-D input {_LAYOUT[want]}, got a "
                         f"{input.ndim}-D input of shape {input.shape} (use mode {other!r} for it)")
    outs, scales = _output_size(input, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        # adaptive average pooling, as torch: functional.interpolate passes its pools (this module is
        # a floor below functional.py, which imports it)
        if area_pool is None:
            raise NotImplementedError("interpolate(): mode 'area' is eqgrad.nn.functional.interpolate's")
        return area_pool(input, outs)
    dtype = input.dtype
    if mode in _LINEAR and not dtype.is_float:
        raise DTypeError(f"interpolate(): mode {mode!r} needs a floating-point input, got {dtype.name} "
                         "(the nearest modes take integers)")
    ft = np.float64 if dtype == float64 else np.float32
    x = input.cast(float32) if dtype.is_float and dtype.itemsize < 4 else input
    for j in reversed(range(n)):                     # the last axis first: torch's nesting order
        x = _resample(x, 2 + j, outs[j], scales[j], mode, align_corners, ft)
    return x.cast(dtype)


__all__ = ["interpolate"]
