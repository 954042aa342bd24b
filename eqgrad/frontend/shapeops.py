"""Scans, sorting, einsum, extra reductions and movement/construction ops composed from the primitives.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).

Scans and sorts work on the scanned axis moved last, ``(..., n)``, and compare every pair of its
elements in an ``(..., n, n)`` tensor (row ``i``, column ``j``): O(n^2) work, no data-dependent
control flow, and one fused reduction per result. Results are placed by one-hot selects, so a
value's gradient flows to exactly the element it was taken from (as torch's gather/scatter).
Indices they return are int32 (torch: int64); indices they take may be any integer dtype.
"""
from __future__ import annotations

import math
import re
from typing import Any, NamedTuple, Sequence

import numpy as np

from eqgrad.dtype import bool_, float32, int32, to_dtype
from eqgrad.errors import AxisError, DTypeError, ShapeError



class ValuesIndices(NamedTuple):
    """What ``sort``, ``topk``, ``cummax`` and ``cummin`` return (torch's ``return_types``)."""
    values: Any
    indices: Any


def _ints(args: tuple, op: str) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)): a tuple of Python ints."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for a in args:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise ShapeError(f"{op}: expected ints, got {args!r}")
    return tuple(int(a) for a in args)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch's table)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"calculate_gain(): negative_slope {slope!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain(): unsupported nonlinearity {nonlinearity!r}")


class ShapeOps:
    __slots__ = ()

    # ------------------------------------------------------------------ helpers
    def _zero(self) -> Any:
        """A 0-d zero (False) of this tensor's dtype, to select against without promoting."""
        return type(self).full((), 0, self.dtype, self.device)

    def _pair_index(self, n: int) -> tuple[Any, Any]:
        """Row indices ``i`` of shape (n, 1) and column indices ``j`` of shape (1, n) (int32)."""
        r = type(self).arange(n, device=self.device)
        return r.reshape(n, 1), r.reshape(1, n)

    def _take_onehot(self, onehot: Any) -> Any:
        """``out[..., r] = self[..., j]`` where ``onehot[..., r, j]`` (one True per row) over the
        last axis of ``self``; the gradient flows to the selected element only."""
        x = self.unsqueeze(-2)
        if self.dtype is bool_:
            return (onehot & x).any(-1)
        return onehot.where(x, self._zero()).sum(-1, dtype=self.dtype)

    # ------------------------------------------------------------------ scans
    def cumsum(self, dim: int, dtype: Any = None) -> Any:
        """Inclusive prefix sums along ``dim``, by a triangular-mask sum (one reduction).
        bool sums in int32.

            >>> Tensor([1, 2, 3]).cumsum(0).tolist()
            [1, 3, 6]
        """
        d = self._axis(dim, "cumsum", max(self.ndim, 1))
        x = self.int() if self.dtype is bool_ else self
        x = x.cast(dtype) if dtype is not None else x
        xl = x.reshape(1) if x.ndim == 0 else x.movedim(d, -1)
        i, j = self._pair_index(xl.shape[-1])
        # NOTE: a select, not a multiply by the mask: inf * 0 would put NaN in the later sums
        out = (j <= i).where(xl.unsqueeze(-2), xl._zero()).sum(-1)
        return out.reshape(()) if x.ndim == 0 else out.movedim(-1, d)

    def _logstep_scan(self, dim: int, op: str, combine: Any, identity: Any) -> Any:
        """Inclusive scan along ``dim`` in ceil(log2 n) steps (Hillis-Steele): at step k every
        element combines with the one k before it (``identity`` before the start)."""
        d = self._axis(dim, op, max(self.ndim, 1))
        xl = self.reshape(1) if self.ndim == 0 else self.movedim(d, -1)
        n, k = xl.shape[-1], 1
        while k < n:
            lead = ((0, 0),) * (xl.ndim - 1)
            shifted = xl.pad(lead + ((k, 0),), value=identity).shrink((None,) * (xl.ndim - 1) + ((0, n),))
            xl = combine(xl, shifted)
            k *= 2
        return xl.reshape(()) if self.ndim == 0 else xl.movedim(-1, d)

    def cumprod(self, dim: int, dtype: Any = None) -> Any:
        """Inclusive prefix products along ``dim``, by a log-step scan of multiplies: exact signs
        and zeros, and the gradient of the products themselves (right with zeros, as torch's).

            >>> Tensor([2.0, -1.0, 0.0, 3.0]).cumprod(0).tolist()
            [2.0, -2.0, -0.0, -0.0]

        Integers narrower than 32 bits multiply in int32 (as ``cumsum``; torch: int64) unless ``dtype=``.
        """
        x = self.int() if self.dtype is bool_ or (dtype is None and self.dtype.is_int and self.dtype.itemsize < 4) else self
        x = x.cast(dtype) if dtype is not None else x
        return x._logstep_scan(dim, "cumprod", lambda a, b: a * b, 1)

    def _cum_extreme(self, dim: int, op: str, largest: bool) -> ValuesIndices:
        d = self._axis(dim, op, max(self.ndim, 1))
        # NOTE: compared with a max of itself: a computed float input is evaluated once (a plan that
        # inlined it into two kernels could round it two ways, and no element would equal its max)
        x = self.contiguous() if self.dtype.is_float else self
        xl = x.reshape(1) if self.ndim == 0 else x.movedim(d, -1)
        # order key: larger is "better"; min runs as max of an order-reversing key
        if self.dtype is bool_:
            key = xl.int() if largest else xl.logical_not().int()
        elif self.dtype.is_int:
            key = xl if largest else ~xl            # exact and order-reversing (-x is neither for all ints)
        else:
            key = xl if largest else -xl
        i, j = self._pair_index(xl.shape[-1])
        mask = j <= i                                   # (n, n): j is in the prefix of i
        kj = key.unsqueeze(-2)                          # (..., 1, n)
        if key.dtype.is_float:
            nan_j = kj != kj
            lowest = float("-inf")
            kj_num = nan_j.where(lowest, kj)
        else:
            nan_j, lowest, kj_num = None, key.dtype.min, kj
        m = mask.where(kj_num, lowest).amax(-1, keepdim=True)        # (..., n, 1) prefix max
        hit = mask & (kj_num == m)
        if nan_j is not None:
            # NOTE: as torch, a NaN is the extreme from where it appears on; the index is the last NaN
            has_nan = (mask & nan_j).any(-1, keepdim=True)
            hit = mask & has_nan.where(nan_j, kj_num == m)
        # NOTE: ties take the last index (torch compares with >= / <=)
        idx = hit.where(j, -1).amax(-1)                              # (..., n)
        vals = xl._take_onehot(j == idx.unsqueeze(-1))
        if self.ndim == 0:
            return ValuesIndices(vals.reshape(()), idx.reshape(()))
        return ValuesIndices(vals.movedim(-1, d), idx.movedim(-1, d))

    def cummax(self, dim: int) -> ValuesIndices:
        """Running maximum along ``dim`` and the index it was taken from (ties: the last index;
        a NaN stays the maximum from where it appears, as torch).

            >>> Tensor([1, 3, 2, 3]).cummax(0).indices.tolist()
            [0, 1, 1, 3]
        """
        return self._cum_extreme(dim, "cummax", True)

    def cummin(self, dim: int) -> ValuesIndices:
        """Running minimum along ``dim`` and its index (as ``cummax``).

            >>> Tensor([3, 1, 2]).cummin(0).values.tolist()
            [3, 1, 1]
        """
        return self._cum_extreme(dim, "cummin", False)

    def logcumsumexp(self, dim: int) -> Any:
        """``log(cumsum(exp(x)))`` along ``dim``, each prefix shifted by its own max (no underflow
        of early terms that are far below a later max).

            >>> round(Tensor([0.0, 0.0]).logcumsumexp(0).tolist()[1], 4)
            0.6931
        """
        d = self._axis(dim, "logcumsumexp", max(self.ndim, 1))
        x = self.float()
        xl = x.reshape(1) if x.ndim == 0 else x.movedim(d, -1)
        i, j = self._pair_index(xl.shape[-1])
        mask = j <= i
        xj = xl.unsqueeze(-2)
        m = mask.where(xj, float("-inf")).amax(-1, keepdim=True).detach()   # NOTE: detached, as softmax
        m = (m.abs() == float("inf")).where(0.0, m)     # all -inf (or an inf): shift by 0 instead
        out = mask.where((xj - m), float("-inf")).exp().sum(-1).log() + m.squeeze(-1)
        return out.reshape(()) if x.ndim == 0 else out.movedim(-1, d)

    # ------------------------------------------------------------------ sorting
    def _ranks(self, descending: bool) -> Any:
        """The stable sorted position of each element of the last axis (int32, a permutation):
        how many elements sort strictly before it, plus the equal ones at lower indices.
        NaN sorts as the largest value (torch)."""
        x = self.int() if self.dtype is bool_ else self
        a, b = x.unsqueeze(-1), x.unsqueeze(-2)        # a: element i (rows), b: element j (columns)
        before = b > a if descending else b < a
        eq = a == b
        if x.dtype.is_float:
            an, bn = a != a, b != b
            before = before | ((bn & ~an) if descending else (an & ~bn))
            eq = eq | (an & bn)
        i, j = self._pair_index(x.shape[-1])
        return (before | (eq & (j < i))).sum(-1)

    def _sort_first(self, dim: int, k: int, descending: bool, op: str) -> ValuesIndices:
        """The first ``k`` elements along ``dim`` in sorted order, with their indices."""
        d = self._axis(dim, op, max(self.ndim, 1))
        x = self.contiguous() if self.dtype.is_float else self     # NOTE: ranked against itself: one evaluation
        xl = x.reshape(1) if self.ndim == 0 else x.movedim(d, -1)
        n = xl.shape[-1]
        if not 0 <= k <= n:
            raise ShapeError(f"{op}(): k must be in [0, {n}] (the size of dim {dim} of shape {self.shape}), got {k}")
        rank = xl._ranks(descending)
        i, j = self._pair_index(n)
        onehot = rank.unsqueeze(-2) == type(self).arange(k, device=self.device).reshape(k, 1)   # (..., k, n)
        idx = onehot.where(j, 0).sum(-1)
        vals = xl._take_onehot(onehot)
        if self.ndim == 0:
            return ValuesIndices(vals.reshape(()), idx.reshape(()))
        return ValuesIndices(vals.movedim(-1, d), idx.movedim(-1, d))

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
        """Sorted values and their indices along ``dim``. Always stable (equal elements keep their
        order, also with ``descending``); NaN sorts as the largest value, as torch.

            >>> Tensor([3.0, 1.0, 2.0]).sort().indices.tolist()
            [1, 2, 0]
        """
        n = 1 if self.ndim == 0 else self.shape[self._axis(dim, "sort")]
        return self._sort_first(dim, n, descending, "sort")

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
        """The indices that sort ``dim`` (``sort(...).indices``).

            >>> Tensor([3, 1, 2]).argsort(descending=True).tolist()
            [0, 2, 1]
        """
        return self.sort(dim, descending, stable).indices

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """The ``k`` largest (``largest=False``: smallest) elements along ``dim`` and their indices,
        always in sorted order (also with ``sorted=False``, which torch leaves unspecified).

            >>> Tensor([1.0, 5.0, 3.0]).topk(2).values.tolist()
            [5.0, 3.0]
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise ShapeError(f"topk(): k must be an int, got {k!r}")
        return self._sort_first(dim, int(k), largest, "topk")

    # ------------------------------------------------------------------ einsum
    @classmethod
    def einsum(cls, equation: str, *operands: Any) -> Any:
        """Einstein summation (torch.einsum): subscripts per operand, ``...`` for broadcast
        dimensions, an optional ``->`` output (implicit: the labels seen once, sorted). Each
        operand is aligned to one label order, then multiplied (broadcasting) and summed over the
        labels not in the output (the ``...`` dimensions too when the output omits ``...``, as
        torch); a label repeated in one operand takes its diagonal.

            >>> Tensor.einsum("ij,j->i", Tensor([[1.0, 2.0], [3.0, 4.0]]), Tensor([1.0, 1.0])).tolist()
            [3.0, 7.0]
        """
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if not operands:
            raise ShapeError("einsum(): expected at least one operand")
        for t in operands:
            if not isinstance(t, cls):
                raise DTypeError(f"einsum(): operands must be Tensors, got {type(t).__name__}")
        eq = equation.replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        specs = lhs.split(",")
        if len(specs) != len(operands):
            raise ShapeError(f"einsum(): {equation!r} has {len(specs)} operand subscripts, got {len(operands)} operands")
        for s in specs + ([rhs] if arrow else []):
            if not re.fullmatch(r"[a-zA-Z]*(\.\.\.)?[a-zA-Z]*", s):
                raise ShapeError(f"einsum(): invalid subscripts {s!r} in {equation!r} (letters and at most one '...')")
        n_ell = []
        for k, (s, t) in enumerate(zip(specs, operands)):
            letters = len(s.replace("...", ""))
            e = t.ndim - letters if "..." in s else 0
            if e < 0 or ("..." not in s and letters != t.ndim):
                raise ShapeError(f"einsum(): operand {k} has {t.ndim} dimension(s) (shape {t.shape}), "
                                 f"subscripts {s!r} name {letters}")
            n_ell.append(e)
        E = max(n_ell)
        ell = [f"...{i}" for i in range(E)]

        def labels(s: str, e: int) -> list[str]:
            head, _, tail = s.partition("...")
            return list(head) + ell[E - e:] + list(tail) if "..." in s else list(s)

        in_labels = [labels(s, e) for s, e in zip(specs, n_ell)]
        if arrow:
            out = labels(rhs, E)
            if len(set(out)) != len(out):
                raise ShapeError(f"einsum(): output subscripts {rhs!r} repeat a label")
            seen = {lab for ls in in_labels for lab in ls}
            for lab in out:
                if lab not in seen:
                    raise ShapeError(f"einsum(): output label {lab!r} of {equation!r} is in no operand")
        else:
            counts: dict[str, int] = {}
            for s in specs:
                for c in s.replace("...", ""):
                    counts[c] = counts.get(c, 0) + 1
            out = ell + sorted(c for c, n in counts.items() if n == 1)
        # a label repeated within one operand: take that operand's diagonal over the two axes
        ts = []
        for t, ls in zip(operands, in_labels):
            ls = list(ls)
            while len(set(ls)) != len(ls):
                lab = next(c for c in ls if ls.count(c) > 1)
                p = ls.index(lab)
                q = ls.index(lab, p + 1)
                if t.shape[p] != t.shape[q]:
                    raise ShapeError(f"einsum(): label {lab!r} repeated in one operand has sizes {t.shape[p]} and {t.shape[q]}")
                t = t.diagonal(0, p, q)
                ls = [c for k, c in enumerate(ls) if k not in (p, q)] + [lab]
            ts.append((t, ls))
        sizes: dict[str, int] = {}
        for t, ls in ts:
            for c, s in zip(ls, t.shape):
                if sizes.get(c, 1) != 1 and s != 1 and sizes[c] != s:
                    raise ShapeError(f"einsum(): label {c!r} has sizes {sizes[c]} and {s} in {equation!r}")
                sizes[c] = s if sizes.get(c, 1) == 1 else sizes[c]
        order = list(out) + [c for c in sizes if c not in out]
        prod = None
        for t, ls in ts:
            mine = [c for c in order if c in ls]
            t = t.permute([ls.index(c) for c in mine]) if mine != ls else t
            t = t.reshape(tuple(t.shape[mine.index(c)] if c in mine else 1 for c in order))
            prod = t if prod is None else prod * t
        full = tuple(sizes[c] for c in order)
        if prod.shape != full:
            prod = prod.expand(full)
        if len(order) > len(out):
            prod = prod.sum(tuple(range(len(out), len(order))), dtype=prod.dtype)    # int8 stays int8 (torch)
        return prod

    # ------------------------------------------------------------------ reductions
    def prod(self, dim: int | None = None, keepdim: bool = False, dtype: Any = None) -> Any:
        """Product over ``dim`` (all elements when None), by a tree of multiplies: exact signs and
        zeros, and the product's own gradient (right with zeros). bool multiplies in int32.

            >>> Tensor([[1, 2], [3, 4]]).prod(1).tolist()
            [2, 12]

        Integers narrower than 32 bits multiply in int32 (as ``sum``; torch: int64) unless ``dtype=``.
        """
        x = self.int() if self.dtype is bool_ or (dtype is None and self.dtype.is_int and self.dtype.itemsize < 4) else self
        x = x.cast(dtype) if dtype is not None else x
        if dim is None:
            out = x.reshape(-1)._prod_last()
            return out.reshape((1,) * self.ndim) if keepdim else out
        d = self._axis(dim, "prod", max(self.ndim, 1))
        if self.ndim == 0:
            return x * 1
        out = x.movedim(d, -1)._prod_last()
        return out.unsqueeze(d) if keepdim else out

    def _prod_last(self) -> Any:
        """The product over the last axis, halving it at each step (padded with ones)."""
        x, n = self, self.shape[-1]
        lead = ((0, 0),) * (self.ndim - 1)
        if n == 0:
            x, n = x.pad(lead + ((0, 1),), value=1), 1       # the empty product, still on the graph
        while n > 1:
            if n % 2:
                x, n = x.pad(lead + ((0, 1),), value=1), n + 1
            x = x.reshape(x.shape[:-1] + (n // 2, 2))
            x = x[..., 0] * x[..., 1]
            n //= 2
        return x.reshape(x.shape[:-1])

    def var_mean(self, dim: Any = None, correction: int = 1, keepdim: bool = False) -> tuple[Any, Any]:
        """``(var, mean)`` over ``dim`` (torch.var_mean)."""
        return self.var(dim, keepdim, correction), self.mean(dim, keepdim)

    def std_mean(self, dim: Any = None, correction: int = 1, keepdim: bool = False) -> tuple[Any, Any]:
        """``(std, mean)`` over ``dim`` (torch.std_mean)."""
        return self.std(dim, keepdim, correction), self.mean(dim, keepdim)

    def norm(self, p: Any = 2, dim: Any = None, keepdim: bool = False) -> Any:
        """Vector p-norm over ``dim`` (all elements when None): p = 2 ('fro'), 1, inf, -inf, 0
        (the count of nonzeros) or any other number (``sum(|x|**p) ** (1/p)``).

            >>> Tensor([3.0, -4.0]).norm().item(), Tensor([3.0, -4.0]).norm(1).item()
            (5.0, 7.0)
        """
        if p == "fro":
            p = 2
        if isinstance(p, str) or not isinstance(p, (int, float)) or isinstance(p, bool):
            raise ValueError(f"norm(): p must be a number or 'fro', got {p!r} (matrix norms such as 'nuc' are not supported)")
        x = self.float()
        if p == float("inf"):
            return x.abs().amax(dim, keepdim)
        if p == float("-inf"):
            return x.abs().amin(dim, keepdim)
        if p == 0:
            return (x != 0).float().sum(dim, keepdim)
        if p == 1:
            # NOTE: x * sign(x), not abs(x): its gradient is sign(x), 0 at 0 (torch)
            return (x * x.sign()).sum(dim, keepdim)
        if p == 2:
            s = (x * x).sum(dim, keepdim)
            # NOTE: sqrt only of a nonzero sum: the gradient of the norm at 0 is then 0 (torch), not NaN
            zero = s == 0
            return zero.where(0.0, zero.where(1.0, s).sqrt())
        return x.abs().pow(float(p)).sum(dim, keepdim).pow(1.0 / p)

    # ------------------------------------------------------------------ movement
    def movedim(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Any:
        """Move the axes ``source`` to the positions ``destination`` (torch.movedim), the other
        axes keeping their order.

            >>> Tensor.zeros(2, 3, 4).movedim(0, -1).shape
            (3, 4, 2)
        """
        src = [source] if isinstance(source, (int, np.integer)) else list(source)
        dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
        if len(src) != len(dst):
            raise AxisError(f"movedim(): source {source} and destination {destination} have different lengths")
        src = [self._axis(a, "movedim") for a in src]
        dst = [self._axis(a, "movedim") for a in dst]
        if len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise AxisError(f"movedim(): repeated axis in source {source} or destination {destination}")
        order: list[int | None] = [None] * self.ndim
        for s, t in zip(src, dst):
            order[t] = s
        rest = iter(a for a in range(self.ndim) if a not in src)
        perm = [o if o is not None else next(rest) for o in order]
        return self if perm == list(range(self.ndim)) else self.permute(perm)

    moveaxis = movedim

    def swapaxes(self, axis0: int, axis1: int) -> Any:
        """Exchange two axes (torch.swapaxes / swapdims)."""
        a, b = self._axis(axis0, "swapaxes"), self._axis(axis1, "swapaxes")
        return self.transpose(a, b)

    swapdims = swapaxes

    def repeat(self, *sizes: Any) -> Any:
        """Tile the tensor ``sizes[i]`` times along axis i (torch.Tensor.repeat); extra leading
        sizes add axes.

            >>> Tensor([1, 2]).repeat(2, 2).tolist()
            [[1, 2, 1, 2], [1, 2, 1, 2]]
        """
        sizes = _ints(sizes, "repeat()")
        if len(sizes) < self.ndim:
            raise ShapeError(f"repeat(): {len(sizes)} repeat sizes {sizes} for a tensor of {self.ndim} "
                             f"dimensions (shape {self.shape}); expected at least {self.ndim}")
        if any(r < 0 for r in sizes):
            raise ShapeError(f"repeat(): negative repeat size in {sizes}")
        x = self.reshape((1,) * (len(sizes) - self.ndim) + self.shape)
        for a, r in enumerate(sizes):
            if r != 1:      # (.., s, ..) -> (.., 1, s, ..) -> (.., r, s, ..) -> (.., r*s, ..)
                s = x.shape[a]
                x = x.unsqueeze(a).expand(x.shape[:a] + (r, s) + x.shape[a + 1:]).reshape(
                    x.shape[:a] + (r * s,) + x.shape[a + 1:])
        return x

    def tile(self, *dims: Any) -> Any:
        """``repeat`` with fewer sizes than axes allowed (ones are prepended), as torch.tile.

            >>> Tensor([[1, 2]]).tile(2).tolist()
            [[1, 2, 1, 2]]
        """
        dims = _ints(dims, "tile()")
        return self.repeat((1,) * (self.ndim - len(dims)) + dims)

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Any, ...]:
        """Pieces along ``dim``: of ``split_size`` each (the last may be smaller), or of the
        given section sizes (torch.split).

            >>> [t.tolist() for t in Tensor([1, 2, 3]).split(2)]
            [[1, 2], [3]]
        """
        d = self._axis(dim, "split")
        n = self.shape[d]
        if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, bool):
            s = int(split_size_or_sections)
            if s < 0 or (s == 0 and n):
                raise ShapeError(f"split(): split_size must be positive, got {s} (dim {d} of shape {self.shape})")
            sizes = [s] * (n // s) + ([n % s] if n % s else []) if n else [0]
        else:
            sizes = list(_ints((split_size_or_sections,), "split()"))
            if sum(sizes) != n or any(s < 0 for s in sizes):
                raise ShapeError(f"split(): sections {sizes} must be non-negative and sum to {n}, "
                                 f"the size of dim {d} of shape {self.shape}")
        out, off = [], 0
        for s in sizes:
            rng = [None] * self.ndim
            rng[d] = (off, off + s)
            out.append(self.shrink(rng))
            off += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Any, ...]:
        """At most ``chunks`` pieces of ceil(n / chunks) along ``dim`` (torch.chunk).

            >>> len(Tensor([1, 2, 3, 4, 5, 6]).chunk(4))
            3
        """
        if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
            raise ShapeError(f"chunk(): chunks must be a positive int, got {chunks!r}")
        n = self.shape[self._axis(dim, "chunk")]
        if n == 0:
            return tuple(self for _ in range(chunks))
        return self.split(-(-n // chunks), dim)

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The slices along ``dim``, with that axis removed.

            >>> [t.tolist() for t in Tensor([[1, 2], [3, 4]]).unbind(1)]
            [[1, 3], [2, 4]]
        """
        d = self._axis(dim, "unbind")
        rest = self.shape[:d] + self.shape[d + 1:]
        return tuple(p.reshape(rest) for p in self.split(1, d)) if self.shape[d] else ()

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Any:
        """Rotate elements by ``shifts`` along ``dims`` (flattened when None), as torch.roll.

            >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
            [4, 1, 2, 3]
        """
        sh = [shifts] if isinstance(shifts, (int, np.integer)) else list(shifts)
        if dims is None:
            if len(sh) != 1:
                raise ShapeError(f"roll(): without dims, shifts must be one int, got {shifts!r}")
            return self.reshape(-1).roll(sh[0], 0).reshape(self.shape)
        ds = [dims] if isinstance(dims, (int, np.integer)) else list(dims)
        if len(sh) != len(ds):
            raise ShapeError(f"roll(): shifts {shifts!r} and dims {dims!r} have different lengths")
        x = self
        for s, d in zip(sh, ds):
            d = self._axis(d, "roll")
            n = x.shape[d]
            if n == 0 or int(s) % n == 0:
                continue
            s = int(s) % n
            x = x.split([n - s, s], d)[1].cat(x.split([n - s, s], d)[0], dim=d)
        return x

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Any:
        """Split axis ``dim`` into ``sizes`` (one may be -1).

            >>> Tensor.zeros(2, 6).unflatten(1, (2, -1)).shape
            (2, 2, 3)
        """
        d = self._axis(dim, "unflatten")
        sizes = _ints((sizes,), "unflatten()")
        n = self.shape[d]
        if sizes.count(-1) > 1 or any(s < -1 for s in sizes):
            raise ShapeError(f"unflatten(): invalid sizes {sizes}: at most one -1, others >= 0")
        if -1 in sizes:
            known = math.prod(s for s in sizes if s != -1)
            if known == 0 or n % known:
                raise ShapeError(f"unflatten(): sizes {sizes} do not divide dim {d} of size {n} (shape {self.shape})")
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        if math.prod(sizes) != n:
            raise ShapeError(f"unflatten(): sizes {sizes} have {math.prod(sizes)} elements, dim {d} of shape "
                             f"{self.shape} has {n}")
        return self.reshape(self.shape[:d] + sizes + self.shape[d + 1:])

    def unfold(self, dimension: int, size: int, step: int) -> Any:
        """Windows of ``size`` every ``step`` along ``dimension`` (torch.Tensor.unfold): that axis
        becomes the window count and a last axis of ``size`` is added.

            >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
            [[1, 2], [3, 4]]
        """
        d = self._axis(dimension, "unfold")
        n = self.shape[d]
        if size < 1 or size > n:
            raise ShapeError(f"unfold(): size must be in [1, {n}] (dim {d} of shape {self.shape}), got {size}")
        if step < 1:
            raise ShapeError(f"unfold(): step must be positive, got {step}")
        w = (n - size) // step + 1
        stack = type(self).stack
        if size <= w:           # one strided slice per offset inside the window
            parts = []
            for o in range(size):
                idx = [slice(None)] * self.ndim
                idx[d] = slice(o, o + step * (w - 1) + 1, step)
                parts.append(self[tuple(idx)])
            return stack(parts, dim=self.ndim)
        parts = []              # one slice per window
        for k in range(w):
            rng = [None] * self.ndim
            rng[d] = (k * step, k * step + size)
            parts.append(self.shrink(rng))
        return stack(parts, dim=d).movedim(d + 1, -1)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
        """The diagonal over ``dim1, dim2`` (``offset`` above it when positive), as a last axis.

            >>> Tensor([[1, 2], [3, 4]]).diagonal().tolist()
            [1, 4]
        """
        a, b = self._axis(dim1, "diagonal"), self._axis(dim2, "diagonal")
        if a == b:
            raise AxisError(f"diagonal(): dim1 and dim2 are the same axis ({dim1}, {dim2})")
        x = self.movedim((a, b), (-2, -1))
        r, c = x.shape[-2:]
        lead, keep = ((0, 0),) * (x.ndim - 2), (None,) * (x.ndim - 2)
        rows = (min(-offset, r), r) if offset < 0 else (0, r)
        cols = (min(offset, c), c) if offset > 0 else (0, c)
        L = min(rows[1] - rows[0], cols[1] - cols[0])
        x = x.shrink(keep + ((rows[0], rows[0] + L), (cols[0], cols[0] + L)))
        # (L, L) flattened and padded by L is (L, L + 1): its first column is the diagonal
        shape = x.shape[:-2]
        x = x.reshape(shape + (L * L,)).pad(lead + ((0, L),)).reshape(shape + (L, L + 1))
        return x.shrink(keep + ((0, L), (0, 1))).reshape(shape + (L,))

    def diag(self, diagonal: int = 0) -> Any:
        """1-D: a square matrix with the vector on diagonal ``diagonal``; 2-D: that diagonal.

            >>> Tensor([1, 2]).diag().tolist()
            [[1, 0], [0, 2]]
        """
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ShapeError(f"diag(): expected a 1-D or 2-D tensor, got shape {self.shape}")
        k, m = diagonal, self.shape[0] + abs(diagonal)
        i, j = self._pair_index(m)
        # element t sits at (t, t + k): row t when k >= 0, column t when k < 0
        v = self.pad(((0, abs(k)),))
        v = v.reshape(m, 1) if k >= 0 else v.reshape(1, m)
        return (j - i == k).where(v, self._zero())

    def _triangle(self, keep_upper: bool, diagonal: int, op: str) -> Any:
        if self.ndim < 2:
            raise ShapeError(f"{op}(): expected a tensor of at least 2 dimensions, got shape {self.shape}")
        r, c = self.shape[-2:]
        i = type(self).arange(r, device=self.device).reshape(r, 1)
        j = type(self).arange(c, device=self.device).reshape(1, c)
        mask = (j - i >= diagonal) if keep_upper else (j - i <= diagonal)
        return mask.where(self, self._zero())

    def tril(self, diagonal: int = 0) -> Any:
        """Zero above diagonal ``diagonal`` of the last two axes.

            >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
            [[1, 0], [3, 4]]
        """
        return self._triangle(False, diagonal, "tril")

    def triu(self, diagonal: int = 0) -> Any:
        """Zero below diagonal ``diagonal`` of the last two axes.

            >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
            [[1, 2], [0, 4]]
        """
        return self._triangle(True, diagonal, "triu")

    @classmethod
    def meshgrid(cls, *tensors: Any, indexing: str = "ij") -> tuple[Any, ...]:
        """Coordinate grids from 1-D (or 0-d) tensors; ``indexing='xy'`` swaps the first two axes.

            >>> [t.tolist() for t in Tensor.meshgrid(Tensor([1, 2]), Tensor([3]))]
            [[[1], [2]], [[3], [3]]]
        """
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid(): indexing must be 'ij' or 'xy', got {indexing!r}")
        for t in tensors:
            if t.ndim > 1:
                raise ShapeError(f"meshgrid(): expected 0-d or 1-D tensors, got shape {t.shape}")
        shape = [t.numel() for t in tensors]
        pos = list(range(len(tensors)))
        if indexing == "xy" and len(tensors) >= 2:
            shape[0], shape[1] = shape[1], shape[0]
            pos[0], pos[1] = 1, 0
        out = []
        for t, p in zip(tensors, pos):
            view = [1] * len(tensors)
            view[p] = t.numel()
            out.append(t.reshape(view).expand(tuple(shape)))
        return tuple(out)

    # ------------------------------------------------------------------ factories
    @classmethod
    def linspace(cls, start: float, end: float, steps: int, dtype: Any = float32, device: str | None = None) -> Any:
        """``steps`` evenly spaced values from ``start`` to ``end`` inclusive, computed as torch
        does (from the start for the first half, from the end for the second).

            >>> Tensor.linspace(0, 1, 5).tolist()
            [0.0, 0.25, 0.5, 0.75, 1.0]
        """
        if not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ShapeError(f"linspace(): steps must be a non-negative int, got {steps!r}")
        i = np.arange(steps, dtype=np.float64)
        step = (end - start) / (steps - 1) if steps > 1 else 0.0
        vals = np.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
        d = to_dtype(dtype)
        # computed in float64, rounded once to the dtype (float64 keeps every bit; integers truncate, as torch)
        return cls(vals if d.is_float else np.trunc(vals), dtype=d, device=device)

    @classmethod
    def empty(cls, *shape: Any, dtype: Any = float32, device: str | None = None) -> Any:
        """A tensor of ``shape``; eqgrad has no uninitialized memory, so it holds zeros."""
        return cls.zeros(*shape, dtype=dtype, device=device)

    @classmethod
    def randint(cls, *args: Any, size: Any = None, dtype: Any = int32, device: str | None = None,
                seed: int | None = None) -> Any:
        """Uniform integers in ``[low, high)``: ``randint(high, size)`` or ``randint(low, high, size)``
        (torch), from ``rand``'s float32 draws (so ``high - low`` is at most 2**24).

            >>> bool(((Tensor.randint(3, 7, (100,)) >= 3) & (Tensor.randint(3, 7, (100,)) < 7)).all().item())
            True
        """
        if size is None:
            if len(args) < 2:
                raise ShapeError(f"randint(): expected (high, size) or (low, high, size), got {args!r}")
            args, size = args[:-1], args[-1]
        if len(args) not in (1, 2):
            raise ShapeError(f"randint(): expected (high, size) or (low, high, size), got {args!r}")
        low, high = (0, args[0]) if len(args) == 1 else args
        low, high = int(low), int(high)
        if high <= low:
            raise ValueError(f"randint(): high ({high}) must be larger than low ({low})")
        r = high - low
        if r > 2 ** 24:
            raise ValueError(f"randint(): high - low is at most 2**24 (float32 draws), got {r}")
        u = cls.rand(*_ints((size,) if isinstance(size, int) else tuple(size), "randint()"), seed=seed, device=device)
        # NOTE: min(.., r - 1): a draw just below 1 times r can round up to r in float32
        return ((u * r).floor().minimum(r - 1).int() + low).cast(dtype)

    @classmethod
    def normal(cls, mean: float = 0.0, std: float = 1.0, size: Any = (), dtype: Any = float32,
               device: str | None = None, seed: int | None = None) -> Any:
        """Normal draws of ``size`` with ``mean`` and ``std`` (torch.normal with float arguments)."""
        if std < 0:
            raise ValueError(f"normal(): std must be >= 0, got {std}")
        shape = (size,) if isinstance(size, int) else tuple(size)
        return (cls.randn(*shape, seed=seed, device=device) * std + mean).cast(dtype)

    @classmethod
    def uniform(cls, low: float = 0.0, high: float = 1.0, size: Any = (), dtype: Any = float32,
                device: str | None = None, seed: int | None = None) -> Any:
        """Uniform draws of ``size`` in ``[low, high)`` (torch's ``uniform_(low, high)``)."""
        if high < low:
            raise ValueError(f"uniform(): low ({low}) must be <= high ({high})")
        shape = (size,) if isinstance(size, int) else tuple(size)
        return (cls.rand(*shape, seed=seed, device=device) * (high - low) + low).cast(dtype)

    @classmethod
    def _kaiming_std(cls, shape: tuple[int, ...], a: float, mode: str, nonlinearity: str, op: str) -> float:
        """torch.nn.init's std: gain(nonlinearity, a) / sqrt(fan), fan of a (out, in, *kernel) weight."""
        if len(shape) < 2:
            raise ShapeError(f"{op}(): fan in and fan out need a shape of at least 2 dimensions, got {shape}")
        if mode not in ("fan_in", "fan_out"):
            raise ValueError(f"{op}(): mode must be 'fan_in' or 'fan_out', got {mode!r}")
        receptive = math.prod(shape[2:])
        fan = shape[1] * receptive if mode == "fan_in" else shape[0] * receptive
        return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                        device: str | None = None, seed: int | None = None) -> Any:
        """He initialization (torch.nn.init.kaiming_uniform_): uniform in ``[-b, b]``,
        ``b = gain * sqrt(3 / fan)``."""
        shape = _ints(shape, "kaiming_uniform()")
        bound = math.sqrt(3.0) * cls._kaiming_std(shape, a, mode, nonlinearity, "kaiming_uniform")
        return cls.uniform(-bound, bound, shape, device=device, seed=seed)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                       device: str | None = None, seed: int | None = None) -> Any:
        """He initialization (torch.nn.init.kaiming_normal_): normal with ``std = gain / sqrt(fan)``."""
        shape = _ints(shape, "kaiming_normal()")
        std = cls._kaiming_std(shape, a, mode, nonlinearity, "kaiming_normal")
        return cls.normal(0.0, std, shape, device=device, seed=seed)

    def empty_like(self, dtype: Any = None) -> Any:
        """A tensor of this shape, dtype and device (zeros: see ``empty``)."""
        return type(self).full(self.shape, 0, dtype or self.dtype, self.device)

    def _float_like(self, dtype: Any, op: str) -> Any:
        d = to_dtype(dtype) if dtype is not None else self.dtype
        if not d.is_float:
            raise DTypeError(f"{op}(): needs a float dtype, the tensor is {self.dtype.name} (pass dtype=float32)")
        return d

    def rand_like(self, dtype: Any = None, seed: int | None = None) -> Any:
        """Uniform [0, 1) draws of this shape and device."""
        d = self._float_like(dtype, "rand_like")
        return type(self).rand(*self.shape, seed=seed, dtype=d, device=self.device)

    def randn_like(self, dtype: Any = None, seed: int | None = None) -> Any:
        """Standard normal draws of this shape and device."""
        d = self._float_like(dtype, "randn_like")
        return type(self).randn(*self.shape, seed=seed, dtype=d, device=self.device)

    def randint_like(self, *args: int, dtype: Any = None, seed: int | None = None) -> Any:
        """``randint(low, high)`` or ``randint(high)`` draws of this shape, dtype and device."""
        return type(self).randint(*args, size=self.shape, dtype=dtype or self.dtype, device=self.device, seed=seed)
