"""Indexing by tensors, lists and masks (gather), setitem, scatter and their relatives, composed from the primitives.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).

There is no gather primitive: reading ``x`` at an index tensor is a one-hot compare of the index
with ``arange(n)``, a ``where`` that keeps the matching element and a sum over ``n`` (one fused
kernel, ``n`` times the work of a true gather). The sum adds one element to zeros, so it is
exact (except that a gathered ``-0.0`` reads as ``+0.0``), and the gradient comes from ``where``
and ``sum``: a scatter-add of the upstream gradient, duplicates accumulating, as in torch.

Out-of-range indices: torch raises. Here an index given as a Python int, list or NumPy array is
checked when the index is built (``IndexError``); an index *tensor* is never read while the graph
is built (that would make indexing synchronous), so an out-of-range entry matches no element: it
reads as 0 (False) and a write through it is dropped. Tensor indices of ``x[...]`` may be negative
(they count from the end, as in NumPy); those of ``gather``/``scatter`` must be in ``[0, n)`` (torch
refuses negative ones; here they are out of range); ``take_along_dim``'s count from the end.

Index tensors may have any integer dtype (int8, uint8, int16, int32, uint32, int64; torch's default is
int64) with the same meaning: narrow ones are widened to int32, uint32 to int64 (both exact), and
int64 is compared in int64, so a value beyond the int32 range is out of range, never wrapped into
a valid index. Exception: ``x[uint8_tensor]`` is an error (torch reads a uint8 index as a
deprecated bool mask; say ``.bool()`` or ``.long()``). Float index tensors are errors.

Data-dependent shapes (a boolean mask ``x[mask]``, ``masked_select``, ``nonzero``) realize the
mask and read it on the host at the call, as torch does on a GPU.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from eqgrad.dtype import bool_, float32, int32, int64, uint8, uint32
from eqgrad.errors import AxisError, DeviceError, DTypeError, ShapeError

SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")
INDEX_DTYPES = "int8, uint8, int16, int32, uint32, int64"


def _wide_index(i: Any) -> Any:
    """An integer index tensor in a dtype whose index arithmetic (``i + n``, ``flat * n + i``)
    cannot wrap: int8/uint8/int16 -> int32 and uint32 -> int64 (exact casts); int32 and int64 as
    they are. Never narrows: an int64 index beyond int32 stays out of range instead of wrapping."""
    d = i.dtype
    if d is int32 or d is int64:
        return i
    return i.cast(int64 if d is uint32 else int32)


def _is_int(i: Any) -> bool:
    return isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))


def _is_index_array(i: Any) -> bool:
    """A host or tensor index array (anything but int, slice, None and ...)."""
    return not (i is None or i is Ellipsis or isinstance(i, slice) or _is_int(i))


class IndexingOps:
    __slots__ = ()

    # ------------------------------------------------------------------ x[idx]
    def _getitem(self, idx: Any) -> Any:
        """``x[idx]`` with NumPy's (and torch's) rules: ints, slices (any step), ``None``, ``...``,
        integer tensors, lists and NumPy int arrays (advanced indexing: several broadcast together;
        when they are not next to each other their axes come first) and bool masks. An int among
        arrays selects first, as in torch (NumPy counts it as an array: ``x[0, :, [1, 2]]`` has
        torch's shape, not NumPy's).

            >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
            >>> x[Tensor([1, 1, 0])].tolist(), x[:, [1]].tolist(), x[x > 2].tolist()
            ([[3.0, 4.0], [3.0, 4.0], [1.0, 2.0]], [[2.0], [4.0]], [3.0, 4.0])

        Ints and slices only move data (shrink, flip, pad, reshape: no kernel of their own); index
        arrays gather (module docstring: out-of-range tensor entries read as 0); a bool mask is
        realized and read on the host, since the result's shape depends on it.
        """
        idx = self._index_tuple(idx)
        if not any(_is_index_array(i) for i in idx):
            return self._basic_getitem(idx)
        y, basic, pos, arrays, front = self._advanced_parts(idx)
        flat_idx, bshape = self._linear_index(y, pos, arrays)
        rest = [a for a in range(y.ndim) if a not in pos]
        rows = y.permute(list(pos) + rest).reshape((math.prod(y.shape[a] for a in pos),) + tuple(y.shape[a] for a in rest))
        out = _take_rows(rows, flat_idx)
        return out if front else out.permute(_placement(len(bshape), len(rest), pos[0]))

    def __setitem__(self, idx: Any, value: Any) -> None:
        """``x[idx] = value``: an ``assign`` of ``where(selected, value, x)``, lazy as every assign.

        ``value`` (a number or tensor) is cast to ``x``'s dtype and broadcast to the shape of
        ``x[idx]``. The tensor and what shares its storage (``detach()``) read the new value; a
        tensor computed from ``x`` before the write keeps the old one (value semantics), and no
        gradient flows through the write (as ``assign``). A repeated index keeps the last write (as
        NumPy); an out-of-range index tensor entry writes nothing. ``x[mask] = v`` with a bool
        tensor mask and one value stays lazy; with a tensor of values it realizes the mask.

            >>> x = Tensor([1.0, 2.0, 3.0])
            >>> old = x * 1
            >>> x[Tensor([0, 2])] = 0.0
            >>> x.tolist(), old.tolist()
            ([0.0, 2.0, 0.0], [1.0, 2.0, 3.0])
        """
        self.assign(self._index_put(idx, value))

    def _index_put(self, idx: Any, value: Any) -> Any:
        """The value of ``self`` after ``self[idx] = value`` (a new lazy tensor; ``self`` is untouched)."""
        T = type(self)
        raw = idx if isinstance(idx, tuple) else (idx,)
        v = self._as_value(value, "setitem")
        if len(raw) == 1 and isinstance(raw[0], T) and raw[0].dtype is bool_ and v.numel() == 1:
            mask = raw[0]           # x[mask] = scalar: lazy, without reading the mask
            if mask.shape != self.shape[:mask.ndim]:
                raise AxisError(f"setitem: a mask of shape {mask.shape} does not match the tensor's shape {self.shape}")
            m = mask.reshape(mask.shape + (1,) * (self.ndim - mask.ndim))
            return m.where(v.reshape(()), self)
        idx = self._index_tuple(idx)
        if not any(_is_index_array(i) for i in idx):
            return self._basic_put(idx, _broadcast_value(v, self._basic_getitem(idx).shape))
        y, basic, pos, arrays, front = self._advanced_parts(idx)
        flat_idx, bshape = self._linear_index(y, pos, arrays)
        rest = [a for a in range(y.ndim) if a not in pos]
        rest_shape = tuple(y.shape[a] for a in rest)
        nb = len(bshape)
        res_shape = bshape + rest_shape if front else \
            rest_shape[:pos[0]] + bshape + rest_shape[pos[0]:]
        v = _broadcast_value(v, res_shape)
        if not front:               # back to (index dims, other dims), the order rows are in
            v = v.permute([int(i) for i in np.argsort(_placement(nb, len(rest), pos[0]))])
        order = list(pos) + rest
        rows = y.permute(order).reshape((math.prod(y.shape[a] for a in pos),) + rest_shape)
        new_rows = _put_rows(rows, flat_idx.reshape(-1), v.reshape((math.prod(bshape),) + rest_shape))
        new_y = new_rows.reshape(tuple(y.shape[a] for a in order)).permute([int(i) for i in np.argsort(order)])
        return self._basic_put(basic, new_y)

    # ------------------------------------------------------------------ parsing an index
    def _index_tuple(self, idx: Any) -> tuple:
        """``idx`` as a tuple with one real entry per axis (ellipsis expanded), ``None``s kept, lists
        as NumPy arrays, and bool masks replaced by the int arrays of their true positions."""
        T = type(self)
        if not isinstance(idx, tuple):
            idx = (idx,)
        if sum(1 for i in idx if i is Ellipsis) > 1:
            raise AxisError("an index can only have a single ellipsis ('...')")
        entries: list[Any] = []
        for i in idx:
            if isinstance(i, (list, tuple)):
                try:
                    i = np.asarray(i) if len(i) else np.zeros((0,), np.int32)
                except ValueError:
                    raise AxisError(f"index lists must be rectangular, got {i!r:.80}") from None
            if isinstance(i, (bool, np.bool_)) or (isinstance(i, (np.ndarray, T)) and i.ndim == 0
                                                   and (i.dtype is bool_ or getattr(i.dtype, "kind", "") == "b")):
                raise AxisError(f"a bool scalar index ({i!r}) is not supported; use None for a new axis")
            if isinstance(i, np.ndarray) and i.dtype.kind not in "biu":
                raise AxisError(f"index arrays must hold integers or bools, got NumPy dtype {i.dtype}")
            if isinstance(i, T):
                if i.device != self.device:
                    raise DeviceError(f"indexing: the index is on {i.device}, the tensor on {self.device}")
                if i.dtype is uint8:
                    raise AxisError("indexing with a uint8 tensor is ambiguous (torch reads it as a deprecated bool "
                                    "mask): use .bool() for a mask or .long()/.int() for indices")
                if not (i.dtype.is_int or i.dtype is bool_):
                    raise AxisError("tensors used as indices must be an integer (int8, int16, int32, uint32, int64) "
                                    f"or bool tensor, got {i.dtype.name}")
            elif not (i is None or i is Ellipsis or isinstance(i, (slice, np.ndarray)) or _is_int(i)):
                raise AxisError(f"unsupported index {i!r:.80} (expected int, slice, None, ..., a list, "
                                "a NumPy array or a tensor of ints or bools)")
            entries.append(i)
        consumed = sum(_mask_ndim(i) or (0 if i is None or i is Ellipsis else 1) for i in entries)
        if consumed > self.ndim:
            raise AxisError(f"too many indices for a tensor of shape {self.shape}: {consumed} given")
        if any(i is Ellipsis for i in entries):
            k = next(k for k, i in enumerate(entries) if i is Ellipsis)
            entries = entries[:k] + [slice(None)] * (self.ndim - consumed) + entries[k + 1:]
        else:
            entries += [slice(None)] * (self.ndim - consumed)
        out: list[Any] = []
        axis = 0
        for i in entries:
            k = _mask_ndim(i)
            if k:
                if self.shape[axis:axis + k] != tuple(i.shape):
                    raise AxisError(f"indexing: a bool mask of shape {tuple(i.shape)} does not match the indexed "
                                    f"axes {tuple(range(axis, axis + k))} of shape {self.shape}")
                # NOTE: data-dependent shape: a mask tensor is realized and read here
                out += list(np.nonzero(i if isinstance(i, np.ndarray) else i.numpy()))
                axis += k
                continue
            out.append(i)
            axis += i is not None
        return tuple(out)

    def _advanced_parts(self, idx: tuple) -> tuple[Any, tuple, list[int], list[Any], bool]:
        """Split an index with arrays into its basic part (arrays as full slices) applied to
        ``self``, the positions of the array axes in that view, the arrays, and whether their
        axes go first (arrays not next to each other once ints are applied).

        NOTE: an int next to arrays is a basic index (it selects, as torch does): NumPy counts it
        as an array, so ``x[0, :, [1, 2]]`` has shape (4, 2) here and in torch, (2, 4) in NumPy."""
        basic, pos, arrays, where_in_idx = [], [], [], []
        out_axis = 0
        for i in idx:
            if _is_index_array(i):
                basic.append(slice(None))
                pos.append(out_axis)
                arrays.append(i)
                where_in_idx.append(out_axis)
            else:
                basic.append(i)
            if not _is_int(i):
                out_axis += 1
        front = where_in_idx != list(range(where_in_idx[0], where_in_idx[0] + len(where_in_idx)))
        y = self._basic_getitem(tuple(basic))
        return y, tuple(basic), pos, arrays, front

    def _linear_index(self, y: Any, pos: list[int], arrays: list[Any]) -> tuple[Any, tuple[int, ...]]:
        """One int32 (int64 where an index tensor is uint32/int64) index into the axes ``pos`` of
        ``y`` flattened together: the row-major combination of the broadcast ``arrays``; -1 where
        any of them is out of range."""
        T = type(self)
        try:
            bshape = tuple(np.broadcast_shapes(*[np.shape(a) if not isinstance(a, T) else a.shape for a in arrays]))
        except ValueError:
            shapes = ", ".join(str(np.shape(a) if not isinstance(a, T) else a.shape) for a in arrays)
            raise AxisError(f"indexing: index arrays of shapes {shapes} do not broadcast together") from None
        flat, valid = None, None
        for p, a in zip(pos, arrays):
            n = y.shape[p]
            if isinstance(a, T):
                a = _wide_index(a)
                j = (a < 0).where(a + n, a)
                ok = (j >= 0) & (j < n)
                valid = ok if valid is None else valid & ok
            else:
                h = np.asarray(a, dtype=np.int64)
                bad = (h < -n) | (h >= n)
                if bad.any():
                    raise AxisError(f"index {int(h[bad].flat[0])} is out of bounds for axis {p} with size {n}")
                j = T(np.where(h < 0, h + n, h).astype(np.int32), device=self.device)
            flat = j if flat is None else flat * n + j
        if flat.shape != bshape:
            flat = flat._expand_to(bshape)
        if valid is not None:
            flat = valid._expand_to(bshape).where(flat, -1)
        return flat, bshape

    # ------------------------------------------------------------------ ints, slices, None
    def _basic_plan(self, idx: tuple) -> tuple[list, list[int], list[int], list[int]]:
        """For an index of ints, slices and ``None`` (one real entry per axis): the shrink range,
        the flipped axes, the step per axis, and the output shape."""
        shrink: list[tuple[int, int]] = []
        flips: list[int] = []
        steps: list[int] = []
        out_shape: list[int] = []
        axis = 0
        for i in idx:
            if i is None:
                out_shape.append(1)
                continue
            size = self.shape[axis]
            if _is_int(i):
                j = int(i)
                if not -size <= j < size:
                    raise AxisError(f"index {j} is out of bounds for axis {axis} with size {size}")
                j %= size
                shrink.append((j, j + 1))
                steps.append(1)
            elif isinstance(i, slice):
                start, stop, step = i.indices(size)
                if step > 0:
                    n = max(0, (stop - start + step - 1) // step)
                    shrink.append((start, start + max(0, (n - 1) * step + 1) if n else start))
                else:
                    n = max(0, (start - stop - step - 1) // -step)
                    lo = start - (n - 1) * -step if n else start
                    shrink.append((lo, start + 1) if n else (0, 0))
                    flips.append(axis)
                steps.append(abs(step))
                out_shape.append(n)
            else:
                raise AxisError(f"unsupported index {i!r} (expected int, slice, None or ...)")
            axis += 1
        return shrink, flips, steps, out_shape

    def _basic_getitem(self, idx: tuple) -> Any:
        shrink, flips, steps, out_shape = self._basic_plan(idx)
        x = self.shrink(shrink)
        if flips:
            x = x.flip(flips)
        if any(s > 1 for s in steps):
            # strided slices: pad each axis to a multiple of its step, split it, keep the first of each group
            pad, split, keep = [], [], []
            for s, st in zip(x.shape, steps):
                n = (s + st - 1) // st
                pad.append((0, n * st - s))
                split += [n, st]
                keep += [(0, n), (0, 1)]
            x = x.pad(pad).reshape(split).shrink(keep).reshape(tuple(split[0::2]))
        return x.reshape(tuple(out_shape))

    def _basic_put(self, idx: tuple, v: Any) -> Any:
        """``self`` with the view ``self[idx]`` (ints, slices, None) replaced by ``v`` (of its
        shape): the view's movement ops undone on ``v`` and on a mask of ones, then a ``where``."""
        shrink, flips, steps, out_shape = self._basic_plan(idx)
        counts = [(e - b + st - 1) // st if e > b else 0 for (b, e), st in zip(shrink, steps)]
        mask = v.ones_like().bool() if v.dtype is not bool_ else v.ones_like()

        def undo(x: Any) -> Any:
            x = x.reshape(tuple(counts))
            if any(s > 1 for s in steps):
                x = x.reshape(tuple(d for c in counts for d in (c, 1)))
                x = x.pad([p for st in steps for p in ((0, 0), (0, st - 1))])
                x = x.reshape(tuple(c * st for c, st in zip(counts, steps)))
                x = x.shrink([(0, e - b) for b, e in shrink])
            if flips:
                x = x.flip(flips)
            return x.pad([(b, s - e) for (b, e), s in zip(shrink, self.shape)])

        return undo(mask).where(undo(v), self)

    def _as_value(self, value: Any, op: str) -> Any:
        """``value`` (a number, list, array or tensor) as a tensor of ``self``'s dtype and device."""
        T = type(self)
        v = value if isinstance(value, T) else T(value, device=self.device)
        if v.device != self.device:
            raise DeviceError(f"{op}: the value is on {v.device}, the tensor on {self.device}")
        return v.cast(self.dtype)

    # ------------------------------------------------------------------ torch's gather family
    def gather(self, dim: int, index: Any) -> Any:
        """``out[i][j] = x[index[i][j]][j]`` for ``dim=0`` (torch.gather): ``index`` has ``x``'s
        number of dims and no axis longer than ``x``'s except along ``dim``.

            >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[0, 0], [1, 0]])).tolist()
            [[1, 1], [4, 3]]
        """
        index = self._check_index("gather", index)
        if self.ndim == 0:
            self._axis(dim, "gather", 1)
            return self.reshape(1).gather(0, index.reshape(-1)).reshape(index.shape)
        d = self._check_index_like("gather", dim, index, self.shape, skip_dim=True)
        x = self.shrink([None if k == d else (0, index.shape[k]) for k in range(self.ndim)])
        return _take_along(x, index, d)

    def take_along_dim(self, indices: Any, dim: int | None = None) -> Any:
        """torch.take_along_dim: ``gather`` along ``dim`` with ``x`` and ``indices`` broadcast
        on the other axes; without ``dim``, along the flattened tensor. Negative indices count from
        the end (as torch's).

            >>> Tensor([[10, 30, 20]]).take_along_dim(Tensor([[1, 2, 0]]), 1).tolist()
            [[30, 20, 10]]
        """
        if dim is None:
            return self.flatten().take_along_dim(self._check_index("take_along_dim", indices).flatten(), 0)
        idx = self._check_index("take_along_dim", indices)
        d = self._axis(dim, "take_along_dim")
        if idx.ndim != self.ndim:
            raise ShapeError(f"take_along_dim(): input {self.shape} and indices {idx.shape} must have the same "
                             "number of dimensions")
        other = [1 if k == d else s for k, s in enumerate(self.shape)]
        iother = [1 if k == d else s for k, s in enumerate(idx.shape)]
        try:
            b = np.broadcast_shapes(tuple(other), tuple(iother))
        except ValueError:
            raise ShapeError(f"take_along_dim(): input {self.shape} and indices {idx.shape} do not broadcast "
                             f"outside dim {d}") from None
        x = self._expand_to(tuple(self.shape[d] if k == d else s for k, s in enumerate(b)))
        idx = idx._expand_to(tuple(idx.shape[d] if k == d else s for k, s in enumerate(b)))
        return _take_along(x, (idx < 0).where(idx + self.shape[d], idx), d)

    def index_select(self, dim: int, index: Any) -> Any:
        """torch.index_select: the entries of ``x`` at a 1-D (or 0-d) integer ``index`` along ``dim``.

            >>> Tensor([[1, 2], [3, 4]]).index_select(1, Tensor([1, 1, 0])).tolist()
            [[2, 2, 1], [4, 4, 3]]
        """
        idx = self._check_index("index_select", index)
        if idx.ndim > 1:
            raise ShapeError(f"index_select(): index must be 1-D or 0-d, got shape {idx.shape}")
        if self.ndim == 0:
            return self.reshape(1)[idx.reshape(-1)].reshape(())
        d = self._axis(dim, "index_select")
        return self[(slice(None),) * d + (idx.reshape(-1),)]

    def masked_fill(self, mask: Any, value: Any) -> Any:
        """``value`` (a number or 0-d tensor, cast to ``x``'s dtype) where the bool ``mask``
        (broadcast to ``x``'s shape) is true, ``x`` elsewhere (torch.masked_fill); lazy.

            >>> Tensor([1.0, 2.0]).masked_fill(Tensor([True, False]), -1.0).tolist()
            [-1.0, 2.0]
        """
        m = self._check_mask_arg("masked_fill", mask)
        v = self._as_value(value, "masked_fill")
        if v.ndim != 0:
            raise ShapeError(f"masked_fill(): value must be a number or a 0-d tensor, got shape {v.shape}")
        return m._expand_to(self.shape).where(v._expand_to(self.shape), self)

    def masked_select(self, mask: Any) -> Any:
        """The elements of ``x`` where ``mask`` is true, as a 1-D tensor (``x`` and ``mask`` broadcast
        together; torch.masked_select). The result's length depends on the mask: it is realized and
        read on the host at the call.

            >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).masked_select(Tensor([False, True])).tolist()
            [2.0, 4.0]
        """
        m = self._check_mask_arg("masked_select", mask, broadcast_self=True)
        try:
            shape = tuple(np.broadcast_shapes(self.shape, m.shape))
        except ValueError:
            raise ShapeError(f"masked_select(): mask {m.shape} and tensor {self.shape} do not broadcast") from None
        x = self._expand_to(shape)
        host = np.broadcast_to(m.numpy(), shape)      # NOTE: data-dependent shape: reads the mask
        return x.reshape(-1)[np.flatnonzero(host)] if x.ndim else x.reshape(1)[np.flatnonzero(host)]

    def nonzero(self, as_tuple: bool = False) -> Any:
        """The indices of the nonzero elements (torch.nonzero): an int32 ``(count, ndim)`` tensor, or
        with ``as_tuple=True`` one 1-D tensor per axis. The count depends on the values: the tensor
        is realized and read on the host at the call.

            >>> Tensor([[0, 1], [2, 0]]).nonzero().tolist()
            [[0, 1], [1, 0]]
        """
        T = type(self)
        host = self.numpy()                           # NOTE: data-dependent shape
        if as_tuple:
            return tuple(T(a.astype(np.int32), device=self.device) for a in np.nonzero(np.atleast_1d(host)))
        return T(np.argwhere(host).astype(np.int32), device=self.device)

    def scatter(self, dim: int, index: Any, src: Any = None, value: Any = None, *, reduce: str | None = None) -> Any:
        """torch.scatter: ``out[index[i][j]][j] = src[i][j]`` for ``dim=0``, ``out`` = ``x`` elsewhere.
        ``src`` is a tensor (at least ``index``'s extent on every axis) or a number (also as
        ``value=``). A target written twice keeps the last write along ``dim`` (torch: undefined);
        ``reduce='add'``/``'multiply'`` accumulates instead (``scatter_reduce`` 'sum'/'prod').

            >>> Tensor.zeros(3).scatter(0, Tensor([2, 0]), Tensor([5.0, 7.0])).tolist()
            [7.0, 0.0, 5.0]
        """
        if reduce is not None:
            mode = {"add": "sum", "multiply": "prod"}.get(reduce)
            if mode is None:
                raise ValueError(f"scatter(): reduce must be 'add' or 'multiply', got {reduce!r}")
            return self.scatter_reduce(dim, index, self._scatter_src(index, src, value), mode)
        index = self._check_index("scatter", index)
        s = self._scatter_src(index, src, value)
        d = self._check_scatter("scatter", dim, index, s)
        m = index.shape[d] if index.ndim else 1
        if index.numel() == 0:
            return self
        hit, srcv, region = _scatter_one_hot(self, index, s, d)
        iota = type(self).arange(1, m + 1, device=self.device).reshape(_axis_shape(hit.ndim, d, m))
        last = hit.where(iota, 0).amax(d)                   # the last i writing each target, 0: none
        pick = iota == last.unsqueeze(d)
        vals = _sum_picked(pick, srcv, d)
        return _fill_region(self, last > 0, vals, region)

    def scatter_add(self, dim: int, index: Any, src: Any) -> Any:
        """torch.scatter_add: ``scatter_reduce(dim, index, src, 'sum')``."""
        return self.scatter_reduce(dim, index, src, "sum")

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True) -> Any:
        """torch.scatter_reduce: each target ``out[index[i][j]][j]`` (``dim=0``) reduces the ``src``
        values sent to it with ``reduce`` ('sum', 'prod', 'mean', 'amax', 'amin'), together with
        ``x``'s value there when ``include_self``; targets nothing is sent to keep ``x``. Integer
        'mean' rounds toward minus infinity (as torch). Gradients as torch's: 'amax'/'amin' share
        the gradient evenly between the values equal to the result. NOTE: with
        ``include_self=False`` torch still counts ``x``'s own value among the ties it shares with
        (and then gives it nothing, so the shares sum to less than the gradient); here the excluded
        value does not count.

            >>> Tensor([1.0, 1.0]).scatter_reduce(0, Tensor([0, 0, 1]), Tensor([2.0, 3.0, 4.0]), "sum").tolist()
            [6.0, 5.0]
        """
        if reduce not in SCATTER_REDUCES:
            raise ValueError(f"scatter_reduce(): reduce must be one of {SCATTER_REDUCES}, got {reduce!r}")
        if self.dtype is bool_:
            raise DTypeError("scatter_reduce(): bool tensors are not supported; cast to int32 or float32")
        T = type(self)
        s = src if isinstance(src, T) else None
        if s is None:
            raise DTypeError(f"scatter_reduce(): src must be a Tensor, got {type(src).__name__}")
        s = self._as_value(s, "scatter_reduce")
        index = self._check_index("scatter_reduce", index)
        d = self._check_scatter("scatter_reduce", dim, index, s)
        if reduce == "amin":
            flip = (lambda t: -t) if self.dtype.is_float else (lambda t: ~t)     # exact, order-reversing
            return flip(flip(self).scatter_reduce(dim, index, flip(s), "amax", include_self=include_self))
        if index.numel() == 0:
            return self
        hit, srcv, region = _scatter_one_hot(self, index, s, d)
        own = self.shrink(region)
        covered = hit.any(d)
        if reduce == "amax":
            low = float("-inf") if self.dtype.is_float else self.dtype.min
            vals = hit.where(srcv, low)
            if include_self:
                vals = own.unsqueeze(d).cat(vals, dim=d)
            return _fill_region(self, covered, vals.amax(d), region)
        if reduce == "prod":
            p = _prod(hit.where(srcv, 1), d)
            return _fill_region(self, covered, own * p if include_self else p, region)
        total = hit.where(srcv, 0).sum(d, dtype=self.dtype)      # wraps in the dtype, as torch
        if include_self:
            total = own + total
        if reduce == "sum":
            return _fill_region(self, covered, total, region)
        count = hit.sum(d) + (1 if include_self else 0)
        mean = total / count if self.dtype.is_float else total // count.maximum(1)
        return _fill_region(self, covered, mean, region)

    # ------------------------------------------------------------------ argument checks
    def _check_index(self, op: str, index: Any) -> Any:
        """``index`` (a tensor, NumPy array or list of any integer dtype) as an index tensor on
        ``self``'s device, widened by _wide_index; a float or bool index is a DTypeError."""
        T = type(self)
        # a NumPy array keeps its dtype, a list takes int32 (a value beyond int32 is an OverflowError)
        idx = index if isinstance(index, T) else T(index, device=self.device)
        if not idx.dtype.is_int:
            raise DTypeError(f"{op}(): index must be an int32 tensor or another integer dtype "
                             f"({INDEX_DTYPES}), got {idx.dtype.name}")
        if idx.device != self.device:
            raise DeviceError(f"{op}(): index is on {idx.device}, the tensor on {self.device}")
        return _wide_index(idx)

    def _check_index_like(self, op: str, dim: int, index: Any, limit: tuple[int, ...], skip_dim: bool) -> int:
        """The axis ``dim`` of a gather/scatter, after checking the shape of ``index`` (already
        through _check_index)."""
        d = self._axis(dim, op) if self.ndim else self._axis(dim, op, 1)
        if index.ndim != self.ndim:
            raise ShapeError(f"{op}(): index {index.shape} must have as many dimensions as the tensor {self.shape}")
        for k, (a, b) in enumerate(zip(index.shape, limit)):
            if a > b and not (skip_dim and k == d):
                raise ShapeError(f"{op}(): index {index.shape} is larger than {limit} at axis {k}")
        return d

    def _check_scatter(self, op: str, dim: int, index: Any, src: Any) -> int:
        d = self._check_index_like(op, dim, index, self.shape, skip_dim=True)
        if src.ndim != index.ndim or any(a > b for a, b in zip(index.shape, src.shape)):
            raise ShapeError(f"{op}(): src {src.shape} must have index's dimensions and be at least as large "
                             f"as index {index.shape} on every axis")
        return d

    def _scatter_src(self, index: Any, src: Any, value: Any) -> Any:
        T = type(self)
        if (src is None) == (value is None):
            raise ValueError("scatter(): give exactly one of src (a tensor or number) and value")
        v = src if src is not None else value
        if isinstance(v, T):
            return self._as_value(v, "scatter")
        return self._as_value(v, "scatter")._expand_to(self._check_index("scatter", index).shape)

    def _check_mask_arg(self, op: str, mask: Any, broadcast_self: bool = False) -> Any:
        T = type(self)
        m = mask if isinstance(mask, T) else T(np.asarray(mask), device=self.device)
        if m.dtype is not bool_:
            raise DTypeError(f"{op}(): mask must be a bool tensor, got {m.dtype.name}")
        if m.device != self.device:
            raise DeviceError(f"{op}(): mask is on {m.device}, the tensor on {self.device}")
        if not broadcast_self:
            try:
                ok = np.broadcast_shapes(self.shape, m.shape) == self.shape
            except ValueError:
                ok = False
            if not ok:
                raise ShapeError(f"{op}(): mask {m.shape} does not broadcast to the tensor's shape {self.shape}")
        return m


# ------------------------------------------------------------------ compositions

def _mask_ndim(i: Any) -> int:
    """How many axes a bool mask index covers (0 for anything else)."""
    if isinstance(i, np.ndarray):
        return i.ndim if i.dtype.kind == "b" else 0
    return i.ndim if getattr(i, "dtype", None) is bool_ else 0


def _axis_shape(ndim: int, axis: int, n: int) -> tuple[int, ...]:
    """(1, ..., n, ..., 1): ``n`` at ``axis`` of ``ndim`` axes."""
    return tuple(n if k == axis else 1 for k in range(ndim))


def _placement(nb: int, nr: int, p0: int) -> list[int]:
    """The permutation taking (index dims, other dims) to the other dims with the index dims at ``p0``."""
    return list(range(nb, nb + p0)) + list(range(nb)) + list(range(nb + p0, nb + nr))


def _take_rows(rows: Any, flat_idx: Any) -> Any:
    """``rows[flat_idx]`` for ``rows`` of shape (n, ...) and int32/int64 ``flat_idx`` of any shape; an
    entry outside [0, n) reads 0. A one-hot compare, a where and a sum over n."""
    T = type(rows)
    nb, n, rest = flat_idx.ndim, rows.shape[0], rows.shape[1:]
    hot = flat_idx.reshape(flat_idx.shape + (1,)) == T.arange(n, device=rows.device)
    hot = hot.reshape(hot.shape + (1,) * len(rest))
    return _sum_picked(hot, rows.reshape((1,) * nb + rows.shape), nb)


def _sum_picked(hot: Any, x: Any, axis: int) -> Any:
    """Sum over ``axis`` of ``x`` where ``hot`` (at most one true along ``axis``: exact); bool: any."""
    if x.dtype is bool_:
        return hot.where(x, False).any(axis)
    # NOTE: where, not hot * x: 0 * inf is NaN, and an element that is not picked must not matter
    return hot.where(x, 0).sum(axis, dtype=x.dtype)          # one term: x's own dtype


def _take_along(x: Any, index: Any, d: int) -> Any:
    """``x`` gathered along ``d`` at ``index`` (equal shapes but at ``d``): torch.gather's core."""
    T = type(x)
    n = x.shape[d]
    hot = index.unsqueeze(d + 1) == T.arange(n, device=x.device).reshape(_axis_shape(index.ndim + 1, d + 1, n))
    return _sum_picked(hot, x.unsqueeze(d), d + 1)


def _put_rows(rows: Any, flat_idx: Any, v: Any) -> Any:
    """``rows`` (n, ...) with row ``flat_idx[i]`` replaced by ``v[i]`` (the last i for a repeated
    row, as NumPy; an index outside [0, n) writes nothing)."""
    T = type(rows)
    m, n, rest = flat_idx.shape[0], rows.shape[0], rows.shape[1:]
    if m == 0:
        return rows
    hot = flat_idx.reshape(m, 1) == T.arange(n, device=rows.device)                    # (m, n)
    iota = T.arange(1, m + 1, device=rows.device).reshape(m, 1)
    last = hot.where(iota, 0).amax(0)                                                    # (n,), 0: none
    pick = (iota == last).reshape((m, n) + (1,) * len(rest))
    vals = _sum_picked(pick, v.reshape((m, 1) + rest), 0)
    return (last > 0).reshape((n,) + (1,) * len(rest)).where(vals, rows)


def _scatter_one_hot(x: Any, index: Any, src: Any, d: int) -> tuple[Any, Any, list]:
    """For scatter along ``d``: ``hit`` (index's shape with x's axis ``d`` inserted after ``d``:
    hit[.., i, t, ..] = index[.., i, ..] == t), ``src`` cut to index's extent with that axis as 1,
    and the region of ``x`` that index's extent covers (a shrink argument)."""
    T = type(x)
    n = x.shape[d]
    s = src.shrink([(0, e) for e in index.shape])
    hit = index.unsqueeze(d + 1) == T.arange(n, device=x.device).reshape(_axis_shape(index.ndim + 1, d + 1, n))
    region = [(0, n) if k == d else (0, e) for k, e in enumerate(index.shape)]
    return hit, s.unsqueeze(d + 1), region


def _fill_region(x: Any, covered: Any, vals: Any, region: list) -> Any:
    """``x`` with ``vals`` where ``covered``, both given over ``region`` of ``x`` (padded out)."""
    pads = [(b, s - e) for (b, e), s in zip(region, x.shape)]
    return covered.pad(pads).where(vals.cast(x.dtype).pad(pads), x)


def _prod(x: Any, axis: int) -> Any:
    """The product over ``axis`` (removed) by a tree of halvings: exact multiplications only, so
    its gradient through the muls is right with zeros too (no division)."""
    n = x.shape[axis]
    if n == 0:
        return x.sum(axis) + 1
    while n > 1:
        if n % 2:
            x = x.pad([(0, 1) if k == axis else None for k in range(x.ndim)], value=1)
            n += 1
        half = [None] * x.ndim
        half[axis] = (0, n // 2)
        lo = x.shrink(half)
        half[axis] = (n // 2, n)
        x = lo * x.shrink(half)
        n //= 2
    return x.squeeze(axis)


def _broadcast_value(v: Any, shape: tuple[int, ...]) -> Any:
    """A setitem value broadcast to the indexed shape (leading size-1 axes beyond it dropped, as NumPy)."""
    while v.ndim > len(shape) and v.shape[0] == 1:
        v = v.reshape(v.shape[1:])
    try:
        ok = v.ndim <= len(shape) and np.broadcast_shapes(v.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"setitem: a value of shape {v.shape} does not broadcast to the indexed shape {tuple(shape)}")
    return v._expand_to(tuple(shape))
