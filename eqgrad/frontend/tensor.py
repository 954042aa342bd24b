"""The Tensor: a lazy, PyTorch-like array. Nothing computes until ``realize()``/``numpy()``/``item()``.

Every method is composed from the primitive ops of the op table, applied through ``Tensor._apply``,
which also records how a tensor was computed when a gradient is needed (``frontend/autograd.py``).
User mistakes (shapes, dtypes, axes, devices) raise here, at the call, with a message naming the op,
what it expected and what it got.
"""
from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from eqgrad import dtype as dt
from eqgrad.devices import Buffer, canonical_device
from eqgrad.dtype import DType, bool_, float32, float64, int32
from eqgrad.errors import AutogradError, AxisError, DeviceError, DTypeError, ShapeError
from eqgrad.ops import MAX_RANK, OPS
from eqgrad.frontend import autograd
from eqgrad.frontend.elementwise import ElementwiseOps, float_math
from eqgrad.frontend.indexing import IndexingOps
from eqgrad.frontend import interop
from eqgrad.frontend.interop import InteropOps
from eqgrad.frontend.shapeops import ShapeOps, ValuesIndices
from eqgrad.graph.lazy import LazyBuffer, freeze
from eqgrad.engine import current_session, realize as realize_lazy

Scalar = int | float | bool
LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
PAD_MODES = ("constant", "reflect", "replicate", "circular")
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10     # ln 2 = HI + LO, n * HI exact for |n| < 2**11


class _Recorders(threading.local):
    """Recorders of the JIT captures in progress in the running thread (eqgrad/jit.py): told about
    host random draws (redrawn on replay), host reads (which a replay could not repeat) and
    committed assigns. Per thread: a capture records what its own call does, never what another
    thread does meanwhile."""

    def __init__(self) -> None:
        self.active: list[Any] = []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.active)

    def append(self, rec: Any) -> None:
        self.active.append(rec)

    def remove(self, rec: Any) -> None:
        self.active.remove(rec)


_capture = _Recorders()


class _SessionGenerator:
    """The generator of ``Tensor.rand``/``randn`` and of layer initializations (nn): every attribute
    is the current session's generator's (engine/session.py), looked up at each draw. NumPy's
    generators lock their state, so threads may draw from one; the order of their draws is the
    order they happen to run in (a thread that wants its own sequence uses its own Session)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current_session().rng, name)


_rng = _SessionGenerator()


def manual_seed(seed: int) -> None:
    """Seed the generator behind ``Tensor.rand``/``randn`` (the current session's)."""
    current_session().manual_seed(seed)


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3))."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:             # the common case, Python ints, as given (graph building is per op)
        if s.__class__ is not int:
            break
    else:
        return shape
    out = []
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise ShapeError(f"shape entries must be ints, got {shape!r}")
        out.append(int(s))
    return tuple(out)


# The largest tensor eqgrad makes: its bytes must stay below 2**63, the byte offsets NumPy and the
# kernels compute in int64 -- counting each empty axis as size 1, since the strides over it are
# computed all the same (Tensor.zeros(0, 2**62, 4) would overflow them). torch's bound is alike
# (numel in int64). What fits this bound but not in memory fails when its buffer is allocated.
MAX_BYTES = 1 << 63


def _check_addressable(op: str, shape: tuple[int, ...], d: DType) -> None:
    """ShapeError naming the op, the shape and the axis whose size takes ``shape`` of dtype ``d``
    to ``MAX_BYTES`` or beyond (``shape`` has no negative sizes)."""
    span = d.itemsize
    for i, s in enumerate(shape):
        span *= s or 1
        if span >= MAX_BYTES:
            total = math.prod([s or 1 for s in shape]) * d.itemsize
            raise ShapeError(f"{op}: shape {shape} of {d.name} is too large to address: {total} bytes "
                             f"(about 2**{round(math.log2(total))}); a tensor has at most 2**63 - 1 (int64 "
                             f"byte offsets), passed at axis {i} (size {s})")


_warmed = False


def _warm_once() -> None:
    """At the first Tensor made from data, start the saturation worker in the background: its start
    (importing egglog) then overlaps building the graph instead of delaying the first realize."""
    global _warmed
    if not _warmed:
        _warmed = True
        current_session().warm()


class Tensor(ElementwiseOps, ShapeOps, IndexingOps, InteropOps):
    __slots__ = ("lazydata", "requires_grad", "grad", "_ctx", "_assign_dst", "__weakref__")
    __array_priority__ = 1000     # numpy_array + tensor -> Tensor.__radd__

    def __init__(self, data: Any, dtype: Any = None, device: str | None = None, requires_grad: bool = False):
        self.requires_grad, self.grad = False, None
        self._ctx: autograd.Ctx | None = None         # how this tensor was computed (autograd)
        self._assign_dst: LazyBuffer | None = None    # the buffer a pending assign() writes into
        if isinstance(data, LazyBuffer):
            self.lazydata = data
            if requires_grad:
                self.requires_grad_()
            return
        device = canonical_device(device)
        _warm_once()
        if isinstance(data, Tensor):
            data = data.numpy()
        want = dt.to_dtype(dtype) if dtype is not None else None
        if isinstance(data, (bool, int, float, np.bool_, np.integer, np.floating)) and not isinstance(data, np.ndarray):
            d = want or dt.scalar_dtype(data)
            data = dt.convert_scalar(data, d, "Tensor()")     # exact, float32-rounded, or an error
            if not requires_grad:       # a parameter needs a buffer of its own (optimizers assign to it)
                self.lazydata = LazyBuffer.const(data, (), d, device)
                return
            data = np.array(data, dtype=d.np)
        if isinstance(data, (list, tuple)):
            try:
                arr = np.array(data)
            except ValueError:
                raise ShapeError(f"Tensor(): nested lists must be rectangular, got {data!r:.80}") from None
            if arr.dtype == object:     # NumPy keeps ints beyond int64 as objects
                arr = dt.numbers_from_objects(arr, want, "Tensor()")
            if arr is None:
                raise ShapeError(f"Tensor(): nested lists must be rectangular, got {data!r:.80}")
            if arr.size == 0 and want is None:
                arr = arr.astype(np.float32)
        elif isinstance(data, np.ndarray):
            arr = data
        elif hasattr(data, "__dlpack__") or hasattr(data, "__array__"):
            arr, hint = _foreign_array(data)    # a torch tensor, a JAX or CuPy array, ...: a copy
            want = want or hint
        else:
            raise DTypeError(f"Tensor(): expected a number, list, tuple, NumPy array, Tensor or an array "
                             f"exporting DLPack, got {type(data).__name__}")
        if arr.dtype.kind not in "biuf":
            raise DTypeError(f"Tensor(): unsupported NumPy dtype {arr.dtype}; expected bool, integer or float")
        # a NumPy array keeps its dtype; Python lists take the defaults of their kind (bool, int32, float32)
        d = want or (dt.to_dtype({"b": bool, "i": int, "u": int, "f": float}[arr.dtype.kind])
                     if isinstance(data, (list, tuple)) else dt.to_dtype(arr.dtype))
        if arr.ndim > MAX_RANK:
            raise ShapeError(f"Tensor(): at most {MAX_RANK} dimensions, got shape {arr.shape}")
        source = "Python list" if isinstance(data, (list, tuple)) else ""
        # a NumPy array that loses precision without an explicit dtype= warns once (ConversionWarning);
        # Python numbers round to float32 silently, as weak scalars do in NumPy and torch
        warn = want is None and isinstance(data, np.ndarray)
        self.lazydata = LazyBuffer.from_buffer(Buffer.from_numpy(dt.convert_array(arr, d, "Tensor()", source, warn), device, d))
        if requires_grad:
            self.requires_grad_()

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        return self.lazydata.shape

    @property
    def dtype(self) -> DType:
        return self.lazydata.dtype

    @property
    def device(self) -> str:
        return self.lazydata.device

    @property
    def ndim(self) -> int:
        return len(self.lazydata.shape)

    def numel(self) -> int:
        return math.prod(self.lazydata.shape)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[self._axis(dim, "size")]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ------------------------------------------------------------------ realization
    def realize(self, *others: "Tensor") -> "Tensor":
        """Compute this tensor (and ``others``, in the same program) and commit pending assigns."""
        realize(self, *others)
        return self

    def numpy(self) -> np.ndarray:
        for rec in _capture:
            rec.host_read(self)
        self.realize()
        # NOTE: NumPy has no bfloat16: a bfloat16 tensor's array is float32 (exact: every bfloat16 is one)
        return dt.from_storage(self.lazydata.buffer.numpy(), self.dtype).reshape(self.shape)

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"item(): only a tensor with one element can be converted, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: str) -> "Tensor":
        device = canonical_device(device)
        if device == self.device:
            return self
        self.realize()
        return Tensor(LazyBuffer.from_buffer(self.lazydata.buffer.to(device)))

    def contiguous(self) -> "Tensor":
        """Force a kernel boundary: this value is materialized in its own buffer."""
        return self._apply("CONTIGUOUS")

    def clone(self) -> "Tensor":
        """A copy in a buffer of its own (torch's clone): gradients flow through it, and in-place
        ops on either tensor leave the other alone.

            >>> x = Tensor([1.0, 2.0]); c = x.clone(); _ = x.add_(1); c.tolist()
            [1.0, 2.0]
        """
        return self.contiguous()

    def detach(self) -> "Tensor":
        """The same value, cut from the autograd graph (shares the buffer, as torch's detach)."""
        return Tensor(self.lazydata)

    def assign(self, value: Any) -> "Tensor":
        """Write ``value`` into this tensor in place (broadcast and cast to its shape and dtype).

        Lazy like everything else: the tensor reads as ``value`` at once, and the write happens when
        it is realized (an optimizer step realizes all its parameters, and every other pending
        assign, in one program). The new value is computed into a fresh buffer, and the tensor's
        realized storage is re-pointed to that buffer, so what shares it (``detach()``, the JIT's
        bindings) sees the new value. A tensor computed from the old value keeps the old value,
        even when it is realized after the write (graphs read snapshots: ``graph/lazy.py``).
        No gradient flows through an assign (as torch's in-place updates under ``no_grad``). See
        docs/training.md.

            >>> w = Tensor([1.0, 2.0])
            >>> old = w * 10
            >>> w.assign(w * 10).tolist(), old.tolist()
            ([10.0, 20.0], [10.0, 20.0])
            >>> w.assign(w + 1).tolist(), old.tolist()
            ([11.0, 21.0], [10.0, 20.0])
        """
        v = value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype, device=self.device)
        if v.device != self.device:
            raise DeviceError(f"assign: value is on {v.device}, the tensor on {self.device}")
        if v.shape != self.shape:
            try:
                v = v._expand_to(_broadcast_shape(self.shape, v.shape, "assign"))
            except ShapeError:
                v = None
            if v is None or v.shape != self.shape:
                raise ShapeError(f"assign: a value of shape {value.shape if isinstance(value, Tensor) else np.shape(value)} "
                                 f"does not broadcast to the tensor's shape {self.shape}")
        if v.dtype != self.dtype:
            v = v.cast(self.dtype)
        if self._assign_dst is not None and _pending_assigns.chain(self) >= MAX_PENDING_ASSIGNS:
            realize(self)          # bound the graph of state written again and again before a realize
        if self._assign_dst is None and self.lazydata.realized and not self.lazydata.is_snapshot:
            self._assign_dst = self.lazydata
        self.lazydata, self._ctx = v.lazydata, None
        if self._assign_dst is not None:
            _pending_assigns.add(self)
        return self

    def _commit_assign(self) -> None:
        """After realize: re-point the assigned storage to the buffer of the new value."""
        dst, src = self._assign_dst, self.lazydata
        self._assign_dst = None
        _pending_assigns.discard(self)
        if dst is src:
            return
        if dst.read:
            # graphs built while ``dst`` was still pending read it directly (not a snapshot): its
            # buffer must not change, so this tensor moves to new storage instead (copy-on-write)
            dst, old = LazyBuffer.from_buffer(src.buffer), None
        else:
            old = dst.buffer
            dst.set_buffer(src.buffer)
        self.lazydata = dst
        for rec in _capture:
            rec.commit(dst, src, old)

    # ------------------------------------------------------------------ autograd
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Mark a tensor as a leaf whose gradient ``backward`` accumulates into ``.grad``."""
        if requires_grad and not self.dtype.is_float:
            raise DTypeError(f"requires_grad: only float32 tensors can require a gradient, got {self.dtype.name}")
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Accumulate the gradient of this tensor into ``.grad`` of every leaf that requires one.

        Without ``gradient`` the tensor must have one element (a loss); otherwise ``gradient`` has
        this tensor's shape (the vector of a vector-Jacobian product). Nothing is computed here:
        the gradients are lazy tensors, realized by an optimizer step or ``.numpy()``. As in torch,
        the graph is released afterwards: a second ``backward()`` through it raises, unless the
        first one was given ``retain_graph=True`` (then the second accumulates).

            >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
            >>> (x.sum(axis=1) * Tensor([1.0, -1.0])).sum().backward()
            >>> x.grad.tolist()
            [[1.0, 1.0], [-1.0, -1.0]]
        """
        if not self.requires_grad:
            raise AutogradError("backward(): this tensor does not require a gradient: no input of the "
                                "ops that computed it has requires_grad=True (or it was computed under no_grad)")
        gdt = self.dtype if self.dtype.is_float else float32      # the gradient has the output's float dtype
        if gradient is None:
            if self.numel() != 1:
                raise ShapeError(f"backward(): a gradient can be created implicitly only for a tensor with one "
                                 f"element, got shape {self.shape}; pass gradient=")
            g = LazyBuffer.const(1.0, self.shape, gdt, self.device)
        else:
            gt = gradient if isinstance(gradient, Tensor) else Tensor(gradient, dtype=gdt, device=self.device)
            if gt.shape != self.shape:
                raise ShapeError(f"backward(): gradient shape {gt.shape} != tensor shape {self.shape}")
            g = gt.cast(gdt).lazydata
        autograd.backward(self, g, retain_graph=bool(retain_graph))

    def _apply(self, op: str, *srcs: "Tensor", arg: Any = None) -> "Tensor":
        """Apply one primitive op (the only way Tensor methods build graphs) and record it for autograd."""
        kind = OPS[op].kind
        lb = self.lazydata
        if kind == "movement":
            out = lb.movement(op, arg)
        elif kind == "reduce":
            out = lb.reduce(op, arg)
        elif kind == "boundary":
            out = LazyBuffer(op, (lb,), None, lb.shape, lb.dtype, lb.device)
        else:
            out = lb.alu(op, *[s.lazydata for s in srcs], arg=arg)
        t = Tensor(out)
        grad = self.requires_grad
        if not grad:
            for s in srcs:
                if s.requires_grad:
                    grad = True
                    break
        if grad and autograd._GradMode.enabled and out.dtype.is_float:
            t.requires_grad = True
            t._ctx = autograd.Ctx(op, arg, (self, *srcs), tuple(freeze(x) for x in (lb, *[s.lazydata for s in srcs])), out)
        return t

    @staticmethod
    def _composite(name: str, forward: Callable[..., "Tensor"], grad: Callable, *inputs: "Tensor") -> "Tensor":
        """``forward(*inputs)``, recorded for autograd as one step whose gradient is ``grad``
        (``autograd.Composite``) instead of the primitives ``forward`` applies."""
        with autograd.no_grad():
            out = forward(*inputs)
        t = Tensor(out.lazydata)
        if autograd._GradMode.enabled and out.dtype.is_float and any(i.requires_grad for i in inputs):
            t.requires_grad = True
            t._ctx = autograd.Ctx(name, autograd.Composite(grad), inputs,
                                  tuple(freeze(i.lazydata) for i in inputs), out.lazydata)
        return t

    # ------------------------------------------------------------------ creation
    @staticmethod
    def full(shape: Sequence[int] | int, fill_value: Scalar, dtype: Any = None, device: str | None = None,
             requires_grad: bool = False) -> "Tensor":
        shape = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        if any(s < 0 for s in shape):
            raise ShapeError(f"full(): negative dimension in shape {shape}")
        d = dt.to_dtype(dtype) if dtype is not None else dt.scalar_dtype(fill_value)
        _check_addressable("full()", shape, d)
        fill_value = dt.convert_scalar(fill_value, d, "full()")
        return _grad_leaf(Tensor(LazyBuffer.const(fill_value, shape, d, canonical_device(device))), requires_grad)

    @staticmethod
    def zeros(*shape: Any, dtype: Any = float32, device: str | None = None, requires_grad: bool = False) -> "Tensor":
        return Tensor.full(_shape_arg(shape), 0, dtype, device, requires_grad)

    @staticmethod
    def ones(*shape: Any, dtype: Any = float32, device: str | None = None, requires_grad: bool = False) -> "Tensor":
        return Tensor.full(_shape_arg(shape), 1, dtype, device, requires_grad)

    def zeros_like(self) -> "Tensor":
        return Tensor.full(self.shape, 0, self.dtype, self.device)

    def ones_like(self) -> "Tensor":
        return Tensor.full(self.shape, 1, self.dtype, self.device)

    def full_like(self, v: Scalar) -> "Tensor":
        return Tensor.full(self.shape, v, self.dtype, self.device)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None,
               device: str | None = None, requires_grad: bool = False) -> "Tensor":
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange(): step must not be zero")
        d = dt.to_dtype(dtype) if dtype is not None else \
            (float32 if any(isinstance(v, float) for v in (start, stop, step)) else int32)
        if d is int32 and all(isinstance(v, (int, np.integer)) for v in (start, stop, step)):
            r = range(int(start), int(stop), int(step))    # check the ends before NumPy makes int64s
            for v in (r[0], r[-1]) if len(r) else ():
                dt.convert_scalar(v, d, "arange()")
        return Tensor(np.arange(start, stop, step), dtype=d, device=device, requires_grad=requires_grad)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: Any = float32, device: str | None = None,
            requires_grad: bool = False) -> "Tensor":
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ShapeError(f"eye(): sizes must be non-negative, got {n}, {m}")
        _check_addressable("eye()", (n, m), dt.to_dtype(dtype))
        i = Tensor.arange(n, device=device).reshape(n, 1)
        j = Tensor.arange(m, device=device).reshape(1, m)
        return _grad_leaf((i == j).cast(dtype), requires_grad)

    @staticmethod
    def rand(*shape: Any, seed: int | None = None, dtype: Any = float32, device: str | None = None,
             requires_grad: bool = False) -> "Tensor":
        """Uniform [0, 1). ``seed`` gives a reproducible draw; otherwise the global generator
        (``eqgrad.manual_seed``) is used."""
        shape = _random_shape("rand()", shape)
        if seed is not None:
            return Tensor(np.random.default_rng(seed).random(shape, dtype=np.float32), dtype=dtype, device=device,
                          requires_grad=requires_grad)
        return _grad_leaf(_host_random(lambda: _rng.random(shape, dtype=np.float32), dtype, device), requires_grad)

    @staticmethod
    def randn(*shape: Any, seed: int | None = None, dtype: Any = float32, device: str | None = None,
              requires_grad: bool = False) -> "Tensor":
        """Standard normal, reproducible as ``rand``."""
        shape = _random_shape("randn()", shape)
        if seed is not None:
            return Tensor(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32), dtype=dtype,
                          device=device, requires_grad=requires_grad)
        return _grad_leaf(_host_random(lambda: _rng.standard_normal(shape, dtype=np.float32), dtype, device),
                          requires_grad)

    # ------------------------------------------------------------------ helpers
    def _axis(self, axis: int, op: str, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise AxisError(f"{op}(): axis must be an int, got {axis!r}")
        if not -n <= axis < n:
            raise AxisError(f"{op}(): axis {axis} is out of range for a tensor of {n} dimension(s) (shape {self.shape})")
        return int(axis) % n

    def _axes(self, axis: int | Sequence[int] | None, op: str) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
            axes = [axis]
        elif isinstance(axis, (tuple, list)):
            axes = list(axis)
        else:
            raise AxisError(f"{op}(): axis must be an int or a tuple of ints, got {axis!r}")
        out = tuple(self._axis(a, op) for a in axes)
        if len(set(out)) != len(out):
            raise AxisError(f"{op}(): repeated axis in {tuple(axes)}")
        return out

    def _const(self, v: Scalar, d: DType | None = None) -> "Tensor":
        return Tensor(self.lazydata.const_like(v, d or self.dtype))

    def cast(self, dtype: Any) -> "Tensor":
        d = dt.to_dtype(dtype)
        return self if d == self.dtype else self._apply("CAST", arg=d)

    def bitcast(self, dtype: Any) -> "Tensor":
        """The same bits read as ``dtype``, which must have this dtype's width (torch's
        ``view(dtype)`` for equal widths, tinygrad's ``bitcast``): ``float32`` <-> ``int32``/``uint32``,
        ``float16``/``bfloat16`` <-> ``int16``, ``float64`` <-> ``int64``, ``int8`` <-> ``uint8``. NaN
        payloads and -0.0 keep their bits. Not differentiable (the result does not require a
        gradient); bool is neither a source nor a target.

            >>> Tensor([1.0]).bitcast("int32").item() == 0x3F800000
            True
        """
        d = dt.to_dtype(dtype)
        if self.dtype is bool_ or d is bool_ or d.itemsize != self.dtype.itemsize:
            same = sorted(x.name for x in dt.ALL_DTYPES if x.itemsize == self.dtype.itemsize and x is not bool_)
            raise DTypeError(f"bitcast(): needs a dtype of {self.dtype.name}'s width ({self.dtype.itemsize} bytes), "
                             f"not bool ({', '.join(same) or 'none for bool'}), got {d.name}")
        return self if d == self.dtype else self.detach()._apply("BITCAST", arg=d)

    def float(self) -> "Tensor":
        return self.cast(float32)

    def int(self) -> "Tensor":
        return self.cast(int32)

    def half(self) -> "Tensor":
        return self.cast(dt.float16)

    def bfloat16(self) -> "Tensor":
        return self.cast(dt.bfloat16)

    def double(self) -> "Tensor":
        return self.cast(dt.float64)

    def long(self) -> "Tensor":
        return self.cast(dt.int64)

    def bool(self) -> "Tensor":
        return self.cast(bool_)

    def _operands(self, other: Any, op: str, reverse: bool = False) -> tuple["Tensor", "Tensor"]:
        """Promote dtypes (NumPy rules, weak Python scalars) and broadcast shapes."""
        if isinstance(other, Tensor):
            if other.device != self.device:
                raise DeviceError(f"{op}: tensors are on different devices ({self.device} and {other.device}); "
                                  "move one with .to(device)")
            d0, d1 = self.lazydata.dtype, other.lazydata.dtype
            if d0 is d1:
                a, b = self, other
            else:
                d = dt.promote(d0, d1)
                a, b = self.cast(d), other.cast(d)
        elif isinstance(other, (bool, int, float, np.bool_, np.integer, np.floating)):
            d = dt.result_with_scalar(self.dtype, other)
            if isinstance(other, float) and not math.isfinite(other) and not d.is_float:
                raise DTypeError(f"{op}: cannot use non-finite {other} with a {self.dtype.name} tensor")
            a = self.cast(d)
            b = Tensor(LazyBuffer.const(dt.convert_scalar(other, d, op), self.shape, d, self.device))
        elif isinstance(other, (list, np.ndarray)):
            return self._operands(Tensor(other, device=self.device), op, reverse)
        else:
            raise DTypeError(f"{op}: unsupported operand type {type(other).__name__}")
        a, b = _broadcast_pair(a, b, op)
        return (b, a) if reverse else (a, b)

    def _alu(self, op: str, *srcs: "Tensor") -> "Tensor":
        return self._apply(op, *srcs)

    # ------------------------------------------------------------------ elementwise
    def add(self, other: Any, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, "add", reverse)
        return a._alu("ADD", b)

    def mul(self, other: Any, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, "mul", reverse)
        return a._alu("MUL", b)

    def sub(self, other: Any, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, "sub", reverse)
        if a.dtype is bool_:
            raise DTypeError("sub: subtracting bool tensors is not supported (as in NumPy); use ^ or logical ops")
        return a._alu("ADD", -b)

    def div(self, other: Any, reverse: bool = False, *, rounding_mode: str | None = None) -> "Tensor":
        """True division; the result is the operands' float dtype, float32 for integer inputs.
        ``rounding_mode="trunc"|"floor"`` rounds the quotient as torch.div (``divide``)."""
        if rounding_mode is not None:
            return (type(self)(other, device=self.device) if reverse else self).divide(
                self if reverse else other, rounding_mode=rounding_mode)
        a, b = self._operands(other, "div", reverse)
        a, b = a._float_unary("div"), b._float_unary("div")
        return a._alu("MUL", b.reciprocal())

    def floordiv(self, other: Any, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, "floordiv", reverse)
        if a.dtype is bool_:
            a, b = a.int(), b.int()
        if a.dtype.is_float:
            return (a / b).floor()
        q = a._alu("IDIV", b)
        r = a._alu("MOD", b)
        # C truncation -> floor: subtract one when the remainder is nonzero and the signs differ
        adjust = (r != 0) & ((r < 0) ^ (b < 0))
        return q - adjust.cast(q.dtype)

    def mod(self, other: Any, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, "mod", reverse)
        if a.dtype is bool_:
            a, b = a.int(), b.int()
        if a.dtype.is_float:
            return a - (a / b).floor() * b
        r = a._alu("MOD", b)
        adjust = (r != 0) & ((r < 0) ^ (b < 0))
        return r + adjust.where(b, 0)

    def pow(self, other: Any, reverse: bool = False) -> "Tensor":
        if not reverse and (self.dtype.is_int or self.dtype is bool_) and isinstance(other, (int, np.integer)) \
                and not isinstance(other, bool):
            if other < 0:
                raise ValueError(f"pow: integers to negative integer powers are not allowed (got {other})")
            base = self.int() if self.dtype is bool_ else self
            return base._int_pow_const(int(dt.convert_scalar(other, int32, "pow")))
        small = not reverse and isinstance(other, (int, np.integer)) and not isinstance(other, bool) and abs(other) <= 4
        if small and self.dtype is bool_:
            return self.int().pow(other)
        if small and other == 0:
            return self.ones_like()
        a, b = self._operands(other, "pow", reverse)
        if a.dtype.is_int:
            return a._int_pow(b)
        if a.dtype.is_narrow_float:          # in float32, rounded once (as the other float composites)
            return a.float().pow(b.float()).cast(a.dtype)
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        # NOTE: the gradients are torch's formulas, b * a**(b-1) (0 where b == 0) and a**b * log(a)
        # (0 where a == 0 and b >= 0): differentiating the selects below would multiply the zero
        # gradient of a dropped branch by its inf (0 * inf = NaN at a == 0 and for negative a)
        fwd = (lambda x, e: x._small_int_pow(int(other))) if small else (lambda x, e: x._float_pow(e))
        return a._custom_grad("POW", fwd, lambda g, out, x, e: (
            (e == 0).where(0.0, g * (e * x._float_pow(e - 1))),
            g * ((x == 0) & (e >= 0)).where(0.0, out * x.log())), b)

    def _small_int_pow(self, n: int) -> "Tensor":
        """``x ** n`` for 0 < |n| <= 4 by repeated multiplication: exact, and right for negative bases."""
        out = self
        for _ in range(abs(n) - 1):
            out = out * self
        return out if n > 0 else out.reciprocal()

    def _float_pow(self, b: "Tensor") -> "Tensor":
        """float32 ``a ** b`` with C's pow for the special values: 1 for b == 0 and for a == 1 (NaN
        included), 1 for (-1) ** +-inf, -0.0 and -inf bases keep the sign for odd integer b, NaN for
        a finite negative base and a non-integer b."""
        a = self
        mag = (b * a.abs().log2()).exp2()
        b_int = b.floor() == b
        b_odd = b_int & ((b.abs() % 2) == 1)
        neg = a._sign_bit()
        out = (neg & b_odd).where(-mag, mag)
        out = ((a < 0) & a.isfinite() & ~b_int).where(float("nan"), out)
        one = (b == 0) | (a == 1) | ((a == -1) & b.isinf())
        return one.where(1.0, out)

    def _int_pow_const(self, n: int) -> "Tensor":
        """integer ``x ** n`` for a Python int ``n >= 0``: square-and-multiply over n's bits (its bit
        length in squarings; the 31 steps of ``_int_pow`` made ``x ** 5`` a 150-op program that took
        0.85 s to extract). Products wrap around like NumPy's, and wrapped products are the same in
        any order."""
        out, base = None, self
        while n:
            if n & 1:
                out = base if out is None else out * base
            n >>= 1
            if n:
                base = base * base
        return self.ones_like() if out is None else out

    def _int_pow(self, e: "Tensor") -> "Tensor":
        """integer ** integer by binary exponentiation in the base's dtype (wraps around like NumPy);
        a negative exponent gives 0 except for bases 1 and -1 (NumPy raises for those, elementwise
        raising is not lazy). ``e`` may be wider than the base (an int32 exponent of an int8 base)."""
        base, out = self, self.ones_like()
        e = e.maximum(-1)
        bits = (e < 0).where(0, e)
        for bit in range(31):
            out = ((bits & (1 << bit)) != 0).where(out * base, out)
            if bit < 30:
                base = base * base
        neg = e < 0
        if self.dtype.name.startswith("u"):
            inv = (self == 1).where(1, 0).cast(self.dtype)
        else:
            inv = (self == 1).where(1, (self == -1).where(1 - 2 * (e.abs() % 2), 0)).cast(self.dtype)
        return neg.where(inv, out)

    def neg(self) -> "Tensor":
        if self.dtype is bool_:
            raise DTypeError("neg: negating a bool tensor is not supported (as in NumPy); use ~ (logical not)")
        return self._alu("NEG")

    def logical_not(self) -> "Tensor":
        return self.bool()._alu("NEG")

    def reciprocal(self) -> "Tensor":
        return self._float_unary("reciprocal")._alu("RECIP")

    def maximum(self, other: Any) -> "Tensor":
        a, b = self._operands(other, "maximum")
        return a._alu("MAX", b)

    def minimum(self, other: Any) -> "Tensor":
        a, b = self._operands(other, "minimum")
        if a.dtype is bool_:
            return a._alu("AND", b)
        if a.dtype.is_int:         # ~ reverses every integer order exactly (-x overflows, and is no order on unsigned)
            return ~((~a)._alu("MAX", ~b))
        return -((-a)._alu("MAX", -b))

    def where(self, x: Any, y: Any) -> "Tensor":
        """``cond.where(x, y)``: x where cond is true, else y (NumPy's ``where(cond, x, y)``)."""
        cond = self.bool()
        if isinstance(x, Tensor):
            x, y = x._operands(y, "where")
        elif isinstance(y, Tensor):
            y, x = y._operands(x, "where")
        else:
            d = dt.promote(dt.scalar_dtype(x), dt.scalar_dtype(y))
            x, y = (Tensor.full(cond.shape, dt.convert_scalar(v, d, "where"), d, cond.device) for v in (x, y))
        shape = _broadcast_shape(_broadcast_shape(cond.shape, x.shape, "where"), y.shape, "where")
        if shape != x.shape:
            _check_addressable("where", shape, x.dtype)
        cond, x, y = cond._expand_to(shape), x._expand_to(shape), y._expand_to(shape)
        return cond._apply("WHERE", x, y)

    def clip(self, min_: Any = None, max_: Any = None, **bounds: Any) -> "Tensor":
        """Clamp to ``[min_, max_]`` (either may be None); torch's ``clip(min=, max=)`` keywords too."""
        if bounds:
            extra = set(bounds) - {"min", "max"}
            if extra:
                raise TypeError(f"clip(): unexpected keyword arguments {sorted(extra)}; expected min= and max=")
            if ("min" in bounds and min_ is not None) or ("max" in bounds and max_ is not None):
                raise TypeError("clip(): a bound given both by position and by keyword")
            min_, max_ = bounds.get("min", min_), bounds.get("max", max_)
        out = self
        # NOTE: a scalar bound beyond the dtype's range on the side where it cannot bind (an int32
        # clipped to 2**40) leaves the values as they are, as NumPy 2; on the other side it raises.
        if isinstance(min_, dt.PY_SCALARS) and dt.beyond_range(min_, dt.result_with_scalar(out.dtype, min_)) < 0:
            out, min_ = out.cast(dt.result_with_scalar(out.dtype, min_)), None
        if isinstance(max_, dt.PY_SCALARS) and dt.beyond_range(max_, dt.result_with_scalar(out.dtype, max_)) > 0:
            out, max_ = out.cast(dt.result_with_scalar(out.dtype, max_)), None
        if out.dtype is bool_:
            if min_ is not None:
                out = out.maximum(min_)
            return out.minimum(max_) if max_ is not None else out
        # NOTE: selects, not maximum/minimum (which split the gradient at a tie): as torch.clamp,
        # x's gradient is 1 where min <= x <= max (bounds included) and 0 elsewhere and at NaN; a
        # bound's gradient is where it binds; min > max gives max; a NaN bound gives NaN (no gradient)
        if out.dtype.is_float:
            out = out.isnan().where(out.detach(), out)
        for bound, binds in ((min_, Tensor.__lt__), (max_, Tensor.__gt__)):
            if bound is None:
                continue
            out = binds(out, bound).where(bound, out)
            if isinstance(bound, Tensor) and bound.dtype.is_float:
                out = bound.isnan().where(bound.detach(), out)
            elif isinstance(bound, float) and math.isnan(bound):
                out = out.full_like(bound)
        return out

    clamp = clip

    def _float_unary(self, name: str) -> "Tensor":
        return self if self.dtype.is_float else self.float()

    def exp2(self) -> "Tensor":
        return self._float_unary("exp2")._alu("EXP2")

    def log2(self) -> "Tensor":
        return self._float_unary("log2")._alu("LOG2")

    @float_math           # NOTE: float16 in float32, rounded once (x * log2 e rounded to float16 is 0.4% off)
    def exp(self) -> "Tensor":
        if self.dtype is float64:
            # NOTE: x * log2 e rounded is off by |x| * 1.1e-16 relative (8e-14 at 700): as
            # 2**(n-1) * 2 * 2**(r log2 e) with n = round(x log2 e) and r = x - n ln 2 in two parts
            # (Cody-Waite), the only rounding amplified is r's (|r| <= 0.35)
            # (n - 1 keeps 2**n finite for x up to 709.78); beyond |x| = 746 exp is inf or 0 anyway
            big = self.abs() > 746.0
            xs = big.where(0.0, self)            # a select: the dropped branch stays finite
            n = (xs * LOG2_E + 0.5).floor().detach()     # any nearby integer: |r| <= ln 2
            r = (xs - n * LN2_HI) - n * LN2_LO
            return big.where((self * LOG2_E).exp2(), (n - 1.0).exp2() * ((r * LOG2_E).exp2() * 2.0))
        return (self * LOG2_E).exp2()

    @float_math
    def log(self) -> "Tensor":
        return self.log2() * LN_2

    def sqrt(self) -> "Tensor":
        return self._float_unary("sqrt")._alu("SQRT")

    def rsqrt(self) -> "Tensor":
        return self.sqrt().reciprocal()

    def sin(self) -> "Tensor":
        return self._float_unary("sin")._alu("SIN")

    @float_math           # NOTE: pi/2 - x rounded to float16 would lose cos near its zeros
    def cos(self) -> "Tensor":
        return (math.pi / 2 - self).sin()

    @float_math
    def tan(self) -> "Tensor":
        return self.sin() / self.cos()

    def abs(self) -> "Tensor":
        """``|x|``; the gradient at 0 is 0 (torch: ``sign(x)``), and ``abs(-0.0)`` is ``0.0``.

            >>> Tensor([-2.0, 0.0, 3.0]).abs().tolist()
            [2.0, 0.0, 3.0]
        """
        if self.dtype is bool_:
            return self
        # NOTE: the constant branch at 0 gives the gradient 0 there and +0.0 for -0.0; NaN stays NaN
        # with the gradient 0 (torch's sign(NaN) is 0), through the detached branch
        return (self < 0).where(-self, (self > 0).where(self, (self == 0).where(0, self.detach())))

    def sign(self) -> "Tensor":
        return (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)

    def trunc(self) -> "Tensor":
        return self._alu("TRUNC") if self.dtype.is_float else self

    def floor(self) -> "Tensor":
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> "Tensor":
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def relu(self) -> "Tensor":
        # NOTE: written as a select, not maximum(x, 0): the gradient at 0 is then 0, as in PyTorch.
        # relu(NaN) is 0 (torch: NaN): the NaN-keeping select, where(x <= 0, 0, x), compiled every
        # MLP step 0.07-0.09 s slower (bench_compile mlp_adam 0.26 -> 0.35 s of LLVM compile)
        return (self > 0).where(self, 0)

    @float_math
    def sigmoid(self) -> "Tensor":
        """``1 / (1 + exp(-x))``.

            >>> Tensor([0.0]).sigmoid().tolist()
            [0.5]
        """
        # NOTE: e = exp(-|x|) <= 1, through a select (its gradient is -+1 at 0, as |x|'s is not):
        # 1/(1+e) or e/(1+e), so no inf appears and the gradient stays finite for any |x|
        x = self
        pos = x >= 0
        e = pos.where(-x, x).exp()
        return pos.where((1 + e).reciprocal(), e / (1 + e))

    @float_math
    def tanh(self) -> "Tensor":
        x = self
        ax = x.abs()
        if x.dtype is float64:
            # NOTE: -expm1(-2|x|) / (2 + expm1(-2|x|)) with x's sign: accurate everywhere (the
            # float32 series below stops at x^9, a relative 8e-9 at 0.25)
            m = (ax * -2.0).expm1()
            return (-m / (m + 2.0)).copysign(x)
        # NOTE: (1 - e) / (1 + e) with e = exp(-2|x|) cancels near 0, so small |x| uses the series
        e = (ax * -2.0).exp()
        big = ((1.0 - e) / (1.0 + e)) * (x < 0).where(-1.0, 1.0)
        x2 = x * x
        small = x * (1.0 + x2 * (-1 / 3 + x2 * (2 / 15 + x2 * (-17 / 315 + x2 * (62 / 2835)))))
        return (ax < 0.25).where(small, big)

    def square(self) -> "Tensor":
        return self * self

    # activations (composites; their gradients come from the primitives')
    def leaky_relu(self, negative_slope: float = 0.01) -> "Tensor":
        """``x`` where ``x > 0``, else ``negative_slope * x``.

            >>> Tensor([-2.0, 3.0]).leaky_relu(0.5).tolist()
            [-1.0, 3.0]
        """
        return (self > 0).where(self, self * negative_slope)

    @float_math
    def elu(self, alpha: float = 1.0) -> "Tensor":
        """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``.

            >>> round(Tensor([-1.0]).elu().item(), 4)
            -0.6321
        """
        # NOTE: exp of a select of x or 0 (not minimum(x, 0), whose gradient splits at 0): exp(x) of
        # a large x is inf, and inf times the zero gradient of the branch that where() drops would
        # be NaN. 0 and NaN take the exp branch, as torch: gradient alpha at 0, NaN at NaN
        pos = self > 0
        return pos.where(self, (pos.where(0, self).exp() - 1) * alpha)

    @float_math
    def silu(self) -> "Tensor":
        """``x * sigmoid(x)`` (swish).

            >>> round(Tensor([1.0]).silu().item(), 4)
            0.7311
        """
        return self * self.sigmoid()

    swish = silu

    def erf(self) -> "Tensor":
        """The error function, a primitive (``ERF``): within 4 ulp of float64 erf for every float32
        (docs/semantics.md), relative accuracy kept near 0 (``erf(1e-11)`` is ``1.128e-11``).

            >>> round(Tensor([0.5]).erf().item(), 5)
            0.5205
        """
        return self._float_unary("erf")._alu("ERF")

    @float_math
    def gelu(self, approximate: str = "none") -> "Tensor":
        """``x * Phi(x)``: exact (with ``erf``) by default, or the tanh approximation
        (``approximate="tanh"``), as torch.nn.functional.gelu.

            >>> round(Tensor([1.0]).gelu().item(), 4)
            0.8413
        """
        if approximate == "tanh":
            # NOTE: 0.5 (1 + tanh(u)) = sigmoid(2u): no cancellation for negative x, and a gradient
            # that stays finite for |x| in the hundreds
            return self * ((2.0 * math.sqrt(2.0 / math.pi)) * (self + 0.044715 * self * self * self)).sigmoid()
        if approximate != "none":
            raise ValueError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")
        return 0.5 * self * (1.0 + (self * (1.0 / math.sqrt(2.0))).erf())

    @float_math
    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> "Tensor":
        """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold`` (as torch).

            >>> round(Tensor([0.0]).softplus().item(), 4)
            0.6931
        """
        bx = self * beta
        # NOTE: exp of min(bx, threshold) keeps the dropped branch finite (see elu)
        return (bx > threshold).where(self, (1.0 + bx.minimum(threshold).exp()).log() * (1.0 / beta))

    def logsigmoid(self) -> "Tensor":
        """``log(sigmoid(x)) = -softplus(-x)``.

            >>> round(Tensor([0.0]).logsigmoid().item(), 4)
            -0.6931
        """
        return -(-self).softplus()

    @float_math
    def mish(self) -> "Tensor":
        """``x * tanh(softplus(x))``.

            >>> round(Tensor([1.0]).mish().item(), 4)
            0.8651
        """
        # NOTE: torch's gradient tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2): the composition's is NaN
        # for |x| ~ 1e30 (inf * 0 inside softplus' select)
        def grad(g: "Tensor", out: "Tensor", x: "Tensor") -> tuple:
            t = x.softplus().tanh()
            return (g * (t + x * x.sigmoid() * (1 - t * t)),)

        return self._custom_grad("MISH", lambda x: x * x.softplus().tanh(), grad)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> "Tensor":
        """``x`` clipped to ``[min_val, max_val]``; the gradient is 1 strictly inside, 0 outside.

            >>> Tensor([-2.0, 0.5, 2.0]).hardtanh().tolist()
            [-1.0, 0.5, 1.0]
        """
        # NOTE: selects, not clip(): maximum/minimum split the gradient at the bounds
        return (self < min_val).where(min_val, (self > max_val).where(max_val, self))

    def relu6(self) -> "Tensor":
        """``min(max(x, 0), 6)``.

            >>> Tensor([-1.0, 3.0, 7.0]).relu6().tolist()
            [0.0, 3.0, 6.0]
        """
        return self.hardtanh(0.0, 6.0)

    def hardsigmoid(self) -> "Tensor":
        """``relu6(x + 3) / 6``.

            >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
            [0.0, 0.5, 1.0]
        """
        return (self + 3.0).relu6() * (1.0 / 6.0)

    def hardswish(self) -> "Tensor":
        """``x * relu6(x + 3) / 6``.

            >>> Tensor([-4.0, 1.0, 4.0]).hardswish().tolist()
            [-0.0, 0.6666666865348816, 4.0]
        """
        # NOTE: torch's gradient: 0 up to -3, x / 3 + 0.5 in (-3, 3) (and NaN), 1 from 3 (the
        # product's splits its ties at +-3)
        return self._custom_grad("HARDSWISH", lambda x: x * x.hardsigmoid(),
                                 lambda g, out, x: ((x >= 3).where(1.0, (x <= -3).where(0.0, x * (1 / 3) + 0.5)) * g,))

    # comparisons (NaN compares false except !=, as in NumPy)
    def _compare_beyond_range(self, other: Any, op: str) -> "Tensor | None":
        """``x <op> v`` for a Python scalar v beyond every finite value of the dtype the comparison
        runs in (``int32_x < 2**40``): the exact answer, as NumPy 2 gives, instead of comparing
        with a wrapped or overflowed v. Such a v compares like "just past the largest (smallest)
        finite value": ``x < 2**40`` is ``x <= INT32_MAX`` (all true), ``f32_x > 1e300`` is
        ``x > FLOAT32_MAX`` (only +inf), and ``==`` is all false. None for any other operand.

            >>> (Tensor([1, -5]) < 2**40).tolist(), (Tensor([1, -5]) == -2**40).tolist()
            ([True, True], [False, False])
        """
        if not isinstance(other, dt.PY_SCALARS):
            return None
        d = dt.result_with_scalar(self.dtype, other)
        side = dt.beyond_range(other, d)
        if not side:
            return None
        if op == "eq":
            return Tensor.full(self.shape, False, bool_, self.device)
        x, (lo, hi) = self.cast(d), dt.finite_range(d)
        if op in ("lt", "le"):
            return x <= hi if side > 0 else x < lo
        return x > hi if side > 0 else x >= lo

    def __lt__(self, other: Any) -> "Tensor":
        if (folded := self._compare_beyond_range(other, "lt")) is not None:
            return folded
        a, b = self._operands(other, "lt")
        return a._alu("CMPLT", b)

    def __gt__(self, other: Any) -> "Tensor":
        if (folded := self._compare_beyond_range(other, "gt")) is not None:
            return folded
        a, b = self._operands(other, "gt")
        return b._alu("CMPLT", a)

    def __le__(self, other: Any) -> "Tensor":
        if (folded := self._compare_beyond_range(other, "le")) is not None:
            return folded
        a, b = self._operands(other, "le")
        return a._alu("CMPLT", b) | a._alu("CMPEQ", b)

    def __ge__(self, other: Any) -> "Tensor":
        if (folded := self._compare_beyond_range(other, "ge")) is not None:
            return folded
        a, b = self._operands(other, "ge")
        return b._alu("CMPLT", a) | a._alu("CMPEQ", b)

    def __eq__(self, other: Any) -> "Tensor":  # type: ignore[override]
        if (folded := self._compare_beyond_range(other, "eq")) is not None:
            return folded
        a, b = self._operands(other, "eq")
        return a._alu("CMPEQ", b)

    def __ne__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return (self == other).logical_not()

    __hash__ = object.__hash__

    def _bitwise(self, other: Any, op: str, reverse: bool = False) -> "Tensor":
        a, b = self._operands(other, op.lower(), reverse)
        if a.dtype.is_float:
            raise DTypeError(f"{op.lower()}: bitwise ops need integer or bool tensors, got {a.dtype.name}")
        return a._alu(op, b)

    def __and__(self, o: Any) -> "Tensor": return self._bitwise(o, "AND")
    def __or__(self, o: Any) -> "Tensor": return self._bitwise(o, "OR")
    def __xor__(self, o: Any) -> "Tensor": return self._bitwise(o, "XOR")
    def __rand__(self, o: Any) -> "Tensor": return self._bitwise(o, "AND", True)
    def __ror__(self, o: Any) -> "Tensor": return self._bitwise(o, "OR", True)
    def __rxor__(self, o: Any) -> "Tensor": return self._bitwise(o, "XOR", True)

    def __invert__(self) -> "Tensor":
        if self.dtype is bool_:
            return self.logical_not()
        if self.dtype.is_int:         # every bit set: -1, or the unsigned type's maximum
            return self._alu("XOR", self._const(self.dtype.max if self.dtype.name.startswith("u") else -1))
        raise DTypeError(f"invert (~): needs an integer or bool tensor, got {self.dtype.name}")

    def __add__(self, o: Any) -> "Tensor": return self.add(o)
    def __radd__(self, o: Any) -> "Tensor": return self.add(o, True)
    def __sub__(self, o: Any) -> "Tensor": return self.sub(o)
    def __rsub__(self, o: Any) -> "Tensor": return self.sub(o, True)
    def __mul__(self, o: Any) -> "Tensor": return self.mul(o)
    def __rmul__(self, o: Any) -> "Tensor": return self.mul(o, True)
    def __truediv__(self, o: Any) -> "Tensor": return self.div(o)
    def __rtruediv__(self, o: Any) -> "Tensor": return self.div(o, True)
    def __floordiv__(self, o: Any) -> "Tensor": return self.floordiv(o)
    def __rfloordiv__(self, o: Any) -> "Tensor": return self.floordiv(o, True)
    def __mod__(self, o: Any) -> "Tensor": return self.mod(o)
    def __rmod__(self, o: Any) -> "Tensor": return self.mod(o, True)
    def __pow__(self, o: Any) -> "Tensor": return self.pow(o)
    def __rpow__(self, o: Any) -> "Tensor": return self.pow(o, True)
    def __neg__(self) -> "Tensor": return self.neg()
    def __pos__(self) -> "Tensor": return self
    def __abs__(self) -> "Tensor": return self.abs()
    def __matmul__(self, o: "Tensor") -> "Tensor": return self.matmul(o)
    def __rmatmul__(self, o: Any) -> "Tensor": return Tensor(o, device=self.device).matmul(self)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ValueError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; "
                             "use .any() or .all()")
        return bool(self.item())

    # ------------------------------------------------------------------ reductions
    def _reduce(self, op: str, axis: Any, keepdim: bool, name: str) -> "Tensor":
        axes = self._axes(axis, name)
        out = self._apply(op, arg=axes)
        if keepdim:
            return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Tensor":
        """Sum over ``axis`` (None: all; an int or a tuple). bool and integers narrower than 32 bits
        sum in int32 (as NumPy and torch widen them; they give int64), float16/bfloat16 accumulate in
        float32 and round the sum once (as torch); ``dtype=`` casts the input first and sums in that
        dtype (an int8 ``dtype=`` wraps, as torch's)."""
        x = self if dtype is None else self.cast(dtype)
        if x.dtype is bool_ or (dtype is None and x.dtype.is_int and x.dtype.itemsize < 4):
            x = x.int()
        elif x.dtype.is_narrow_float:
            return x.float()._reduce("RSUM", axis, keepdim, "sum").cast(x.dtype)
        return x._reduce("RSUM", axis, keepdim, "sum")

    def amax(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
        """Maximum over ``axis`` (None: all; an int or a tuple); ties share the gradient evenly
        (torch.amax)."""
        self._check_nonempty_reduce(axis, "amax")
        return self._reduce("RMAX", axis, keepdim, "amax")

    def amin(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
        """Minimum over ``axis`` (None: all; an int or a tuple); ties share the gradient evenly
        (torch.amin)."""
        self._check_nonempty_reduce(axis, "amin")
        if self.dtype is bool_:
            return self.logical_not().amax(axis, keepdim).logical_not()
        if not self.dtype.is_float:
            return ~((~self).amax(axis, keepdim))          # exact for every integer (~x = -1 - x)
        return -((-self).amax(axis, keepdim))

    def max(self, axis: Any = None, keepdim: bool = False) -> Any:
        """As torch: ``max()`` the largest element; ``max(dim, keepdim=False)`` the named tuple
        ``(values, indices)`` (the first maximum's index; the gradient goes to it alone, as torch);
        ``max(other)`` the elementwise maximum. A tuple of axes gives the values only (``amax``).

            >>> t = Tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 7.0]])
            >>> t.max().item(), t.max(1).values.tolist(), t.max(1).indices.tolist()
            (7.0, [5.0, 7.0], [1, 0])
        """
        if isinstance(axis, Tensor):
            return self.maximum(axis)
        if axis is None or isinstance(axis, (tuple, list)):
            return self.amax(axis, keepdim)
        return self._extreme_with_index(axis, keepdim, "max")

    def min(self, axis: Any = None, keepdim: bool = False) -> Any:
        """As ``max``, for the smallest: ``min()``, ``min(dim)`` -> ``(values, indices)``, ``min(other)``."""
        if isinstance(axis, Tensor):
            return self.minimum(axis)
        if axis is None or isinstance(axis, (tuple, list)):
            return self.amin(axis, keepdim)
        return self._extreme_with_index(axis, keepdim, "min")

    def _extreme_with_index(self, axis: int, keepdim: bool, op: str) -> Any:
        ax = self._axis(axis, op)
        self._check_nonempty_reduce(ax, op)
        idx = self.argmax(ax, keepdim=True) if op == "max" else self.argmin(ax, keepdim=True)
        shape = [1] * self.ndim
        shape[ax] = self.shape[ax]
        hot = Tensor.arange(self.shape[ax], device=self.device).reshape(shape) == idx

        def grad(g: "Tensor", out: "Tensor", x: "Tensor") -> tuple:
            # NOTE: torch routes max(dim)'s gradient to the returned index only (amax shares it)
            return (hot.where(g.expand(x.shape), 0.0),)
        reduce = (lambda x: x.amax(ax, keepdim=True)) if op == "max" else (lambda x: x.amin(ax, keepdim=True))
        vals = self._custom_grad(op.upper(), reduce, grad) if self.dtype.is_float else reduce(self)
        if not keepdim:
            vals, idx = vals.squeeze(ax), idx.squeeze(ax)
        return ValuesIndices(vals, idx)

    def _check_nonempty_reduce(self, axis: Any, name: str) -> None:
        axes = self._axes(axis, name)
        if any(self.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name}(): zero-size reduction over axes {axes} of shape {self.shape} has no identity")

    def any(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
        return self.bool()._reduce("RSUM", axis, keepdim, "any")

    def all(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
        return self.logical_not().any(axis, keepdim).logical_not()

    @float_math
    def mean(self, axis: Any = None, keepdim: bool = False) -> "Tensor":
        axes = self._axes(axis, "mean")
        n = math.prod(self.shape[a] for a in axes)
        return self.sum(axis, keepdim) * (1.0 / n if n else float("nan"))

    @float_math
    def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        """Variance with ``correction`` (1: unbiased, as PyTorch's default; 0: NumPy's default)."""
        axes = self._axes(axis, "var")
        n = math.prod(self.shape[a] for a in axes)
        x = self
        d = x - x.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) * (1.0 / max(n - correction, 0) if n - correction > 0 else float("nan"))

    @float_math
    def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        self._axes(axis, "std")
        return self.var(axis, keepdim, correction).sqrt()

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> "Tensor":
        """Index of the first maximum (int32), as NumPy."""
        if axis is None:
            out = self.flatten().argmax(0)
            return out.reshape((1,) * self.ndim) if keepdim else out
        ax = self._axis(axis, "argmax")
        n = self.shape[ax]
        if n == 0:
            raise ShapeError(f"argmax(): axis {ax} of shape {self.shape} is empty")
        is_max = (self == self.amax(ax, keepdim=True)) | (self != self)     # NaN: the first NaN wins
        shape = [1] * self.ndim
        shape[ax] = n
        rev = Tensor.arange(n, 0, -1, device=self.device).reshape(shape)   # n, n-1, ..., 1
        return (n - (is_max.where(rev, 0)).amax(ax, keepdim)).cast(int32)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> "Tensor":
        if axis is not None:
            self._axis(axis, "argmin")
        # an order-reversing map that is exact: ~x for integers (-x overflows at the minimum and
        # does not reverse unsigned ones), -x for floats, not for bool
        rev = self.logical_not() if self.dtype is bool_ else ~self if self.dtype.is_int else -self
        return rev.argmax(axis, keepdim)

    @float_math
    def softmax(self, axis: int = -1) -> "Tensor":
        """``exp(x) / exp(x).sum(axis)``, computed shifted by the max for range.

        >>> Tensor([[0.0, 0.0], [1.0, 1.0]]).softmax().tolist()
        [[0.5, 0.5], [0.5, 0.5]]
        >>> Tensor.zeros(2, 0).softmax().shape          # an empty axis: an empty result, as torch
        (2, 0)
        """
        x = self
        if self.shape[self._axis(axis, "softmax")] == 0:
            # NOTE: an empty axis has nothing to normalize and no max to shift by: the result is as
            # empty as the input (torch), still on the graph so that backward gives an empty gradient
            return x * 1.0
        # NOTE: the max is detached: softmax does not change under a shift, so the gradient through
        # the max is zero in exact arithmetic -- detaching it saves computing that zero
        e = (x - x.amax(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    @float_math
    def log_softmax(self, axis: int = -1) -> "Tensor":
        x = self
        if self.shape[self._axis(axis, "log_softmax")] == 0:
            return x * 1.0                               # NOTE: empty, as in softmax
        m = x - x.amax(axis, keepdim=True).detach()      # NOTE: detached, as in softmax
        return m - m.exp().sum(axis, keepdim=True).log()

    @float_math
    def logsumexp(self, axis: int = -1, keepdim: bool = False) -> "Tensor":
        if self.shape[self._axis(axis, "logsumexp")] == 0:
            # NOTE: the log of an empty sum: -inf (torch), with the input's (empty) gradient
            return self.sum(axis, keepdim) + float("-inf")
        m = self.amax(axis, keepdim=True).detach()  # NOTE: detached, as in softmax
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze(self._axis(axis, "logsumexp"))

    # ------------------------------------------------------------------ movement
    def reshape(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        if shape and min(shape) < 0:
            shape = self._inferred_reshape(shape)
        if len(shape) > MAX_RANK:
            raise ShapeError(f"reshape(): tensors have at most {MAX_RANK} dimensions, got shape {shape}")
        if math.prod(shape) != self.numel():
            raise ShapeError(f"reshape(): cannot reshape {self.shape} ({self.numel()} elements) into {shape} "
                             f"({math.prod(shape)} elements)")
        if 0 in shape:          # otherwise as many bytes as this tensor's, which is addressable
            _check_addressable("reshape()", shape, self.dtype)
        return self._apply("RESHAPE", arg=shape)

    def _inferred_reshape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` with its -1 (at most one) replaced by the size that keeps the element count."""
        if sum(1 for s in shape if s == -1) > 1:
            raise ShapeError(f"reshape(): only one dimension can be -1, got {shape}")
        if any(s < -1 for s in shape):
            raise ShapeError(f"reshape(): invalid size in {shape}")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.numel() % known:
                raise ShapeError(f"reshape(): cannot reshape {self.shape} ({self.numel()} elements) into {shape}")
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        return shape

    view = reshape

    def permute(self, *order: Any) -> "Tensor":
        order = _shape_arg(order)
        n = len(self.lazydata.shape)
        norm = tuple([o + n if -n <= o < 0 else o for o in order])
        if sorted(norm) != list(range(n)):
            raise AxisError(f"permute(): {order} is not a permutation of the {n} axes of shape {self.shape}")
        return self._apply("PERMUTE", arg=norm)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> "Tensor":
        if self.ndim < 2 and (dim0, dim1) == (-2, -1):
            return self
        a, b = self._axis(dim0, "transpose"), self._axis(dim1, "transpose")
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":
        return self.permute(tuple(reversed(range(self.ndim))))

    def expand(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(shape)
        if len(shape) > MAX_RANK:
            raise ShapeError(f"expand(): tensors have at most {MAX_RANK} dimensions, got shape {shape}")
        if len(shape) < self.ndim:
            raise ShapeError(f"expand(): target {shape} has fewer dimensions than {self.shape}")
        lead = len(shape) - self.ndim
        for i, t in enumerate(shape):
            if t < -1 or (t == -1 and i < lead):
                raise ShapeError(f"expand(): invalid size {t} at axis {i} of {shape} (expanding {self.shape}): "
                                 "sizes are >= 0, or -1 to keep an existing axis's size")
        src = (1,) * lead + self.shape
        new = tuple(s if t == -1 else t for s, t in zip(src, shape))
        for s, t in zip(src, new):
            if s != t and s != 1:
                raise ShapeError(f"expand(): cannot expand {self.shape} to {shape}: only size-1 axes can grow")
        _check_addressable("expand()", new, self.dtype)
        return self.reshape(src)._expand_to(new)

    def _expand_to(self, shape: tuple[int, ...]) -> "Tensor":
        x = self
        if len(shape) > x.ndim:
            x = x.reshape((1,) * (len(shape) - x.ndim) + x.shape)
        return x._apply("EXPAND", arg=tuple(shape))

    def pad(self, padding: Sequence[Any], value: Scalar = 0, mode: str = "constant") -> "Tensor":
        """Pad per axis with ``((before, after), ...)`` (one pair or None per axis, as NumPy).
        Negative amounts crop. ``mode`` as torch's F.pad: ``"constant"`` (``value``), ``"reflect"``
        (mirrored without the edge: pads below the axis size), ``"replicate"`` (the edge repeated),
        ``"circular"`` (wrapped around: pads at most the axis size); the other modes are movement
        ops and a concatenation, so gradients flow back to the elements they copy.

            >>> Tensor([1.0, 2.0, 3.0]).pad([(2, 1)], mode="reflect").tolist()
            [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]
        """
        if mode not in PAD_MODES:
            raise ValueError(f"pad(): mode must be one of {PAD_MODES}, got {mode!r}")
        if len(padding) != self.ndim:
            raise ShapeError(f"pad(): expected one (before, after) pair per axis ({self.ndim}), got {len(padding)}")
        for p in padding:
            if p is not None and not (isinstance(p, (tuple, list)) and len(p) == 2
                                      and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in p)):
                raise TypeError(f"pad(): expected one (before, after) pair of ints or None per axis, got {p!r} in "
                                f"{tuple(padding)!r}; for torch's flat amounts (last axis first) use "
                                "eqgrad.nn.functional.pad")
        pairs = [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]
        crop = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
        if any(e < b for b, e in crop):
            raise ShapeError(f"pad(): negative padding {pairs} crops more than shape {self.shape}")
        x = self.shrink(crop)
        pos = tuple(max(0, b) for b, _ in pairs), tuple(max(0, a) for _, a in pairs)
        if not any(pos[0]) and not any(pos[1]):
            return x
        if mode != "constant":
            for ax, (b, a) in enumerate(zip(*pos)):
                if b or a:
                    x = x._pad_copies(ax, b, a, mode)
            return x
        out = x._apply("PAD", arg=pos)
        if value == 0:
            return out
        mask = Tensor(x.ones_like().bool().lazydata.movement("PAD", pos))
        return mask.where(out, value)

    def _pad_copies(self, ax: int, before: int, after: int, mode: str) -> "Tensor":
        """Axis ``ax`` padded with copies of its own elements (``pad``'s non-constant modes)."""
        n = self.shape[ax]
        limit = {"reflect": n - 1, "circular": n, "replicate": None}[mode]
        if n == 0 or (limit is not None and max(before, after) > limit):
            raise ShapeError(f"pad(): {mode} padding ({before}, {after}) of axis {ax} needs "
                             f"{'amounts below' if mode == 'reflect' else 'amounts at most'} its size {n} "
                             f"(shape {self.shape})" if n else f"pad(): {mode} padding of an empty axis {ax} (shape {self.shape})")

        def part(lo: int, hi: int, flip: bool = False) -> "Tensor":
            t = self.shrink([(lo, hi) if i == ax else None for i in range(self.ndim)])
            return t.flip(ax) if flip else t

        def edge(at: int, k: int) -> "Tensor":
            e = part(at, at + 1)
            return e.expand(tuple(k if i == ax else s for i, s in enumerate(e.shape)))

        left = {"reflect": lambda: part(1, before + 1, True), "circular": lambda: part(n - before, n),
                "replicate": lambda: edge(0, before)}[mode]
        right = {"reflect": lambda: part(n - 1 - after, n - 1, True), "circular": lambda: part(0, after),
                 "replicate": lambda: edge(n - 1, after)}[mode]
        parts = ([left()] if before else []) + [self] + ([right()] if after else [])
        return parts[0].cat(*parts[1:], dim=ax)

    def shrink(self, arg: Sequence[Any]) -> "Tensor":
        """Keep ``[start, end)`` per axis (None keeps the whole axis)."""
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink(): expected one (start, end) pair per axis ({self.ndim}), got {len(arg)}")
        pairs = tuple((0, s) if p is None else (int(p[0]), int(p[1])) for p, s in zip(arg, self.shape))
        for (b, e), s in zip(pairs, self.shape):
            if not 0 <= b <= e <= s:
                raise ShapeError(f"shrink(): range [{b}, {e}) is not inside an axis of size {s} (shape {self.shape})")
        if all(p == (0, s) for p, s in zip(pairs, self.shape)):
            return self
        return self._apply("SHRINK", arg=(tuple(b for b, _ in pairs), tuple(e for _, e in pairs)))

    def flip(self, axis: Any = None) -> "Tensor":
        axes = tuple(sorted(self._axes(axis, "flip")))
        axes = tuple(a for a in axes if self.shape[a] > 1)
        return self._apply("FLIP", arg=axes)

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = self._axis(dim, "squeeze")
        if self.ndim == 0 or self.shape[d] != 1:
            return self
        return self.reshape(self.shape[:d] + self.shape[d + 1:])

    def unsqueeze(self, dim: int) -> "Tensor":
        d = self._axis(dim, "unsqueeze", self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim, "flatten"), self._axis(end_dim, "flatten")
        if e < s:
            raise AxisError(f"flatten(): start_dim {start_dim} comes after end_dim {end_dim}")
        return self.reshape(self.shape[:s] + (math.prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def cat(self, *others: "Tensor", dim: int = 0) -> "Tensor":
        """``a.cat(b, c, dim=1)``, or torch's ``Tensor.cat([a, b, c], dim=1)``."""
        if not isinstance(self, Tensor):            # Tensor.cat([...]): the class's form
            if others or not isinstance(self, (list, tuple)) or not self:
                raise ShapeError("cat(): expected Tensor.cat([t, ...], dim=) or t.cat(t2, ..., dim=)")
            self, others = self[0], tuple(self[1:])
            if not isinstance(self, Tensor):
                raise DTypeError(f"cat(): expected Tensors, got {type(self).__name__}")
        ts = [self, *others]
        d = self._axis(dim, "cat")
        for t in ts[1:]:
            if not isinstance(t, Tensor):
                raise DTypeError(f"cat(): expected Tensors, got {type(t).__name__}")
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise ShapeError(f"cat(): shapes {self.shape} and {t.shape} differ outside dim {d}")
        dtype = ts[0].dtype
        for t in ts[1:]:
            dtype = dt.promote(dtype, t.dtype)
        total = sum(t.shape[d] for t in ts)
        out, off = None, 0
        for t in ts:
            pad = [(0, 0)] * self.ndim
            pad[d] = (off, total - off - t.shape[d])
            off += t.shape[d]
            p = t.cast(dtype).pad(pad)
            out = p if out is None else (out | p if dtype is bool_ else out + p)
        return out

    def stack(self, *others: Any, dim: int = 0) -> "Tensor":
        """``Tensor.stack([a, b], dim=0)`` (torch's form), or ``a.stack(b, c, dim=0)``."""
        if isinstance(self, Tensor):
            ts = [self, *others]
        else:
            if len(others) > 1:
                raise ShapeError("stack(): expected Tensor.stack([t, ...], dim=) or t.stack(t2, ..., dim=)")
            if others:                                 # Tensor.stack([...], 0): dim positionally
                dim = others[0]
            ts = list(self)
        for t in ts:
            if not isinstance(t, Tensor):
                raise DTypeError(f"stack(): expected Tensors, got {type(t).__name__}")
        if not ts:
            raise ShapeError("stack(): expected at least one tensor")
        for t in ts[1:]:
            if t.shape != ts[0].shape:
                raise ShapeError(f"stack(): all tensors need one shape, got {ts[0].shape} and {t.shape}")
        d = ts[0]._axis(dim, "stack", ts[0].ndim + 1)
        return ts[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in ts[1:]], dim=d)

    def __getitem__(self, idx: Any) -> "Tensor":
        return self._getitem(idx)        # frontend/indexing.py (setitem too)

    # ------------------------------------------------------------------ linear algebra
    def matmul(self, other: "Tensor") -> "Tensor":
        """Matrix product with NumPy's rules for 1-D operands and batch broadcasting.
        Composed from reshape/expand/mul/sum (as tinygrad does); the optimizer fuses it to one kernel."""
        if not isinstance(other, Tensor):
            other = Tensor(other, device=self.device)
        if self.ndim == 0 or other.ndim == 0:
            raise ShapeError(f"matmul: both operands need at least 1 dimension, got {self.shape} and {other.shape}")
        a, b = self, other
        k1 = a.shape[-1]
        k2 = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k1 != k2:
            raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({k1} != {k2})")
        a2 = a.reshape(1, k1) if a.ndim == 1 else a
        b2 = b.reshape(k2, 1) if b.ndim == 1 else b
        try:
            _broadcast_shape(a2.shape[:-2], b2.shape[:-2], "matmul")
        except ShapeError:
            raise ShapeError(f"matmul: batch dimensions of {a.shape} @ {b.shape} do not broadcast "
                             f"({a2.shape[:-2]} and {b2.shape[:-2]})") from None
        # (..., n, k) x (..., k, m) -> (..., n, 1, k) * (..., 1, m, k) -> sum over k
        x = a2.reshape(a2.shape[:-1] + (1, k1))
        y = b2.transpose(-1, -2).reshape(b2.shape[:-2] + (1, b2.shape[-1], k2))
        out = (x * y).sum(-1)
        if a.ndim == 1:
            out = out.squeeze(-2)
        if b.ndim == 1:
            out = out.squeeze(-1)
        return out

    dot = matmul

    def linear(self, weight: "Tensor", bias: "Tensor | None" = None) -> "Tensor":
        out = self @ weight
        return out + bias if bias is not None else out


def _random_shape(op: str, shape: tuple) -> tuple[int, ...]:
    """The shape of a ``rand``/``randn`` draw, checked before NumPy draws it (in float32)."""
    shape = _shape_arg(shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    _check_addressable(op, shape, float32)
    return shape


def _host_random(draw: Any, dtype: Any, device: str | None) -> Tensor:
    """A tensor of random numbers drawn on the host from the global generator; a JIT capture
    records the draw so that every replay draws anew."""
    t = Tensor(draw(), dtype=dtype, device=device)
    for rec in _capture:
        rec.random(t.lazydata, lambda: Tensor(draw(), dtype=dtype, device=device).lazydata.buffer)
    return t


class _PendingAssigns:
    """The live tensors with an ``assign`` to realized storage that is not committed yet, and how
    many assigns each has chained since its last commit. An optimizer step realizes them all, so
    state written in a forward pass (BatchNorm's running statistics) is committed with the step
    even when the optimizer was not given it; ``assign`` realizes a chain that grows too long."""

    def __init__(self) -> None:
        self._d: dict[int, tuple["weakref.ref[Tensor]", int]] = {}

    def _drop(self, key: int, ref: "weakref.ref[Tensor]") -> None:
        e = self._d.get(key)
        if e is not None and e[0] is ref:
            del self._d[key]

    def chain(self, t: Tensor) -> int:
        e = self._d.get(id(t))
        return e[1] if e is not None and e[0]() is t else 0

    def add(self, t: Tensor) -> None:
        key = id(t)
        e = self._d.get(key)
        if e is not None and e[0]() is t:
            self._d[key] = (e[0], e[1] + 1)
        else:
            self._d[key] = (weakref.ref(t, lambda r, k=key: self._drop(k, r)), 1)

    def discard(self, t: Tensor) -> None:
        e = self._d.get(id(t))
        if e is not None and e[0]() is t:
            del self._d[id(t)]

    def tensors(self) -> list[Tensor]:
        return [t for t in (ref() for ref, _ in list(self._d.values())) if t is not None]


_pending_assigns = _PendingAssigns()
MAX_PENDING_ASSIGNS = 16     # assigns chained onto one tensor before ``assign`` realizes the chain


def pending_assigns() -> list[Tensor]:
    """Tensors whose ``assign`` is not committed yet (realize them to commit the writes)."""
    return _pending_assigns.tensors()


def realize(*tensors: Tensor) -> None:
    """Compute several tensors in one program, then commit their pending ``assign``s.

        >>> a = Tensor([1.0, 2.0])
        >>> b, c = a + 1, a * 2
        >>> realize(b, c)           # one plan computes both
        >>> b.tolist(), c.tolist()
        ([2.0, 3.0], [2.0, 4.0])
    """
    for t in tensors:
        if not isinstance(t, Tensor):
            raise DTypeError(f"realize(): expected Tensors, got {type(t).__name__}")
    realize_lazy([t.lazydata for t in tensors])
    for t in tensors:
        if t._assign_dst is not None:
            t._commit_assign()


def _grad_leaf(t: Tensor, requires_grad: bool) -> Tensor:
    """A factory's tensor as a leaf that requires grad (``requires_grad=True``): a buffer of its own,
    which an optimizer's assign can write (a constant has none)."""
    if not requires_grad:
        return t
    t = t.contiguous().realize()
    t.requires_grad_()
    return t


def _foreign_array(data: Any) -> tuple[np.ndarray, DType | None]:
    """A copy of another library's array as NumPy, and the dtype it must keep when NumPy has none
    for it: a torch tensor (detached, on the CPU; bfloat16 read exactly through float32), or any
    object exporting DLPack or ``__array__``."""
    detach = getattr(data, "detach", None)
    if callable(detach) and type(data).__module__.startswith("torch"):
        data = detach().cpu()
        if str(data.dtype) == "torch.bfloat16":
            return np.array(data.float().numpy(), copy=True), dt.bfloat16
        return np.array(data.numpy(), copy=True), None
    if hasattr(data, "__dlpack__"):
        try:
            return np.array(np.from_dlpack(data), copy=True), None
        except (TypeError, BufferError, RuntimeError, ValueError):
            pass                                   # e.g. on a device NumPy cannot read: try __array__
    try:
        return np.array(np.asarray(data), copy=True), None
    except (TypeError, ValueError, RuntimeError) as e:
        raise DTypeError(f"Tensor(): could not read a {type(data).__name__} as an array: {e}") from e


# ------------------------------------------------------------------ broadcasting

def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...], op: str) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"{op}: shapes {a} and {b} do not broadcast: axis {i - n} has sizes {x} and {y} "
                             "(sizes must match or one must be 1)")
        out.append(y if x == 1 else x)
    return tuple(out)


def _broadcast_pair(a: Tensor, b: Tensor, op: str) -> tuple[Tensor, Tensor]:
    if a.shape == b.shape:
        return a, b
    shape = _broadcast_shape(a.shape, b.shape, op)
    if shape != a.shape and shape != b.shape:      # grown past both: (n, 1) + (1, m)
        _check_addressable(op, shape, a.dtype if a.dtype.itemsize >= b.dtype.itemsize else b.dtype)
    return a._expand_to(shape), b._expand_to(shape)


def _is_tensor_list(xs: Iterable[Any]) -> bool:
    return all(isinstance(x, Tensor) for x in xs)


# PyTorch spelling: in-place ``name_`` methods (assigns) and ``dim=`` for ``axis=`` (frontend/interop.py)
interop.install(Tensor, ("sum", "max", "min", "amax", "amin", "any", "all", "mean", "var", "std", "argmax", "argmin", "softmax",
                         "log_softmax", "logsumexp", "flip"))
