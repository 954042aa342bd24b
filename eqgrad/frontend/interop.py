"""PyTorch spelling and interop: ``repr`` with values, Python number conversions, NumPy's
``__array__``, DLPack both ways, in-place ``_`` methods as assigns, and ``dim=`` for ``axis=``.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``cls`` (this module cannot import tensor.py, which imports it).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from eqgrad.errors import DTypeError, ShapeError

# a realized tensor shows its values in repr; past this many elements NumPy summarizes them (as torch)
REPR_THRESHOLD = 1000

# the out-of-place methods whose in-place form ``name_`` is ``self.assign(self.name(...))``
INPLACE = ("add", "sub", "mul", "div", "pow", "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh",
           "sigmoid", "relu", "clip", "clamp", "floor", "ceil", "round", "trunc", "lerp", "masked_fill",
           "maximum", "minimum", "square", "reciprocal", "sign", "log2", "exp2", "fmod", "remainder")


class InteropOps:
    __slots__ = ()

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        """A realized tensor shows its values (NumPy's layout, summarized past ``REPR_THRESHOLD``
        elements); a lazy one says so, without computing it."""
        lb = self.lazydata
        if not lb.realized:
            return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device} lazy {lb.op}>"
        vals = np.array2string(lb.buffer.numpy().reshape(self.shape), separator=", ", prefix="Tensor(",
                               threshold=REPR_THRESHOLD)
        return f"Tensor({vals}, dtype={self.dtype.name}, device={self.device})"

    def __format__(self, spec: str) -> str:
        """``f"{t:.3f}"`` formats a one-element tensor's value; other tensors take no format spec."""
        if self.numel() == 1:
            return format(self.item(), spec)
        if spec:
            raise TypeError(f"unsupported format string {spec!r} for a tensor of shape {self.shape}; "
                            "only one-element tensors take a format spec")
        return repr(self)

    # ------------------------------------------------------------------ Python numbers
    def __float__(self) -> float:
        return float(self._one("float()"))

    def __int__(self) -> int:
        return int(self._one("int()"))

    def __index__(self) -> int:
        """An integer or bool one-element tensor as an index (``range(t)``, ``lst[t]``), as torch."""
        if self.dtype.is_float:
            raise DTypeError(f"only integer tensors of a single element can be converted to an index, got {self.dtype.name}")
        return int(self._one("__index__"))

    def _one(self, op: str) -> Any:
        if self.numel() != 1:
            raise ShapeError(f"{op}: only a tensor with one element can be converted to a Python number, "
                             f"got shape {self.shape}")
        return self.item()

    # ------------------------------------------------------------------ NumPy and DLPack
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(t)``: the values (realizing the tensor); always a new array."""
        if copy is False:
            raise ValueError("an eqgrad Tensor cannot be viewed as a NumPy array without a copy (np.asarray copies)")
        a = np.array(self.numpy(), copy=True)
        return a if dtype is None else a.astype(dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """DLPack export (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``) of a host copy of the values.

        NOTE: a copy, not a view: eqgrad reuses a buffer's memory once no tensor holds it (the host
        pool, devices/__init__.py), which a consumer's view would not keep alive."""
        if copy is False:
            raise BufferError("an eqgrad Tensor is exported through a copy (copy=False cannot be honoured)")
        a = np.array(self.numpy(), copy=True)
        if max_version is None:
            return a.__dlpack__()
        return a.__dlpack__(max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)                        # kDLCPU: the export is a host copy

    @classmethod
    def from_dlpack(cls, x: Any, device: str | None = None) -> Any:
        """A Tensor holding a copy of a DLPack-exporting array (a torch tensor, a NumPy array, ...)."""
        try:
            a = np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as e:
            raise DTypeError(f"from_dlpack(): could not import a {type(x).__name__}: {e}") from e
        return cls(np.array(a, copy=True), device=device)

    # ------------------------------------------------------------------ in-place (assigns)
    def zero_(self) -> Any:
        """Set every element to 0 in place (an assign)."""
        return self.assign(self.zeros_like())

    def fill_(self, value: Any) -> Any:
        """Set every element to ``value`` in place (an assign)."""
        return self.assign(self.full_like(value))

    def copy_(self, src: Any) -> Any:
        """Write ``src`` (broadcast to this tensor's shape, cast to its dtype) in place (an assign)."""
        return self.assign(src)


def inplace(name: str) -> Callable[..., Any]:
    """``name_``: ``self.name(...)`` written into ``self`` (``Tensor.assign``: lazy, seen by the
    tensor and what shares its storage, never by a tensor computed from the old value; no gradient
    flows through it, as torch's in-place updates under ``no_grad``)."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.assign(getattr(self, name)(*args, **kwargs))
    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"In-place ``{name}``: ``self.assign(self.{name}(...))``."
    return method


def accept_dim(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking PyTorch's ``dim=`` as well as its ``axis=`` (not both)."""
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "dim" in kwargs:
            if "axis" in kwargs:
                raise TypeError(f"{fn.__name__}(): got both axis= and dim=; pass one")
            kwargs["axis"] = kwargs.pop("dim")
        return fn(self, *args, **kwargs)
    return method


def install(cls: type, dim_methods: tuple[str, ...]) -> None:
    """Add ``name_`` for each out-of-place method of ``INPLACE`` that ``cls`` has, and ``dim=`` to
    each of ``dim_methods`` (called once, after the class and its mixins are defined)."""
    for name in INPLACE:
        if hasattr(cls, name) and not hasattr(cls, name + "_"):
            setattr(cls, name + "_", inplace(name))
    for name in dim_methods:
        setattr(cls, name, accept_dim(getattr(cls, name)))
