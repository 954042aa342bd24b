"""``@eqgrad.jit``: capture the kernels and buffer bindings of a step once, then replay them.

A jitted function runs normally on its first call for a given input signature (shapes, dtypes and
devices of its Tensor arguments, and the values of its other arguments): that compiles its plans.
The second call runs it again under a recorder that notes every plan that runs (through
``engine.capture_hooks``), which LazyBuffer each plan input came from, which LazyBuffers the plan
wrote, every ``assign`` committed and every host random draw. From the third call on, the function
is not called at all: the recorded plans run on the new inputs' buffers, with no Python graph
building, no plan-cache lookup and no validation.

Bindings at replay:
- a plan input that was a Tensor argument of the call reads the new argument's buffer;
- any other input reads the *current* buffer of the same LazyBuffer (parameters and optimizer
  state, whose LazyBuffers keep their identity because ``assign`` re-points them in place; the
  learning rate a schedule writes between steps; constants made inside the function);
- a host random draw (``Tensor.rand``/``randn`` from the global generator, e.g. dropout masks) is
  drawn again before each replay;
- each plan writes fresh output buffers, re-points the LazyBuffers it wrote (so ``p.grad`` of a
  parameter reads the latest step's gradient) and commits the recorded assigns.

Constraints (docs/training.md): the function's sequence of plans must not depend on tensor
values or on Python state other than its arguments (it is not called again); it must not read
tensors into Python (``numpy()``/``item()``/``tolist()`` raise ``JitError`` while capturing);
tensors it returns are new tensors on each replay. A new input signature captures again.

    >>> import numpy as np
    >>> from eqgrad import Tensor, jit
    >>> @jit
    ... def double(x): return (x * 2).realize()
    >>> [double(Tensor(np.full(2, i, np.float32))).tolist() for i in range(4)]
    [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
    >>> double.replays
    2
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import engine
from ..devices import Buffer
from ..errors import JitError
from . import tensor as tensor_mod
from .lazy import LazyBuffer
from .tensor import Tensor, realize


@dataclass
class _Run:
    """One recorded plan: where its inputs come from and which LazyBuffers it writes."""
    run: Callable[[list[Buffer]], None]
    inputs: list[tuple[int, Any]]                 # (argument index, None) or (-1, LazyBuffer)
    allocs: list[tuple[Any, Any, str]]            # (shape, dtype, device) of each buffer it writes
    scratch: dict[int, Buffer]                    # plan buffers that are not outputs: reused
    targets: list[tuple[LazyBuffer, int]]         # LazyBuffers re-pointed to plan buffers


@dataclass
class _Capture:
    actions: list[tuple[str, Any]] = field(default_factory=list)     # ("run", _Run) | ("commit", (dst, src))
    random: list[tuple[LazyBuffer, Callable[[], Buffer]]] = field(default_factory=list)
    result: Any = None                                                # the return value, tensors as slots
    kernels: int = 0


class _Recorder:
    """Collects what one call does; installed in the engine's and the Tensor module's hooks."""

    def __init__(self, args: list[Tensor], name: str):
        self.arg_of = {id(t.lazydata): i for i, t in enumerate(args)}
        self.cap = _Capture()
        self.name = name

    def on_realize(self, cp: Any, inputs: list[LazyBuffer], targets: list[LazyBuffer], bufs: list[Buffer]) -> None:
        plan = cp.plan
        n_in = len(inputs)
        slots = [(self.arg_of[id(lb)], None) if id(lb) in self.arg_of else (-1, lb) for lb in inputs]
        outs = set(plan.outputs)
        scratch = {i: bufs[i] for i in range(n_in, len(bufs)) if i not in outs}
        specs = [(shape, dt, b.device) for (shape, dt), b in zip(plan.buffers[n_in:], bufs[n_in:])]
        self.cap.actions.append(("run", _Run(cp.run, slots, specs, scratch, list(zip(targets, plan.outputs)))))
        self.cap.kernels += len(plan.kernels)

    def commit(self, dst: LazyBuffer, src: LazyBuffer) -> None:
        self.cap.actions.append(("commit", (dst, src)))

    def random(self, lb: LazyBuffer, redraw: Callable[[], Buffer]) -> None:
        self.cap.random.append((lb, redraw))

    def host_read(self, t: Tensor) -> None:
        raise JitError(f"{self.name}: reading a tensor into Python (numpy()/item()/tolist()) inside a jitted "
                       "function cannot be replayed; return the tensor and read it after the call")


def _tensors_in(result: Any) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [t for r in result for t in _tensors_in(r)]
    if isinstance(result, dict):
        return [t for r in result.values() for t in _tensors_in(r)]
    return []


def _template(result: Any, arg_of: dict[int, int]) -> Any:
    """The return value with each tensor replaced by where a replay finds it."""
    if isinstance(result, Tensor):
        i = arg_of.get(id(result.lazydata))
        return ("__arg__", i) if i is not None else ("__lb__", result.lazydata)
    if isinstance(result, (list, tuple)):
        return type(result)(_template(r, arg_of) for r in result)
    if isinstance(result, dict):
        return {k: _template(v, arg_of) for k, v in result.items()}
    return result


def _fill(tmpl: Any, args: list[Tensor]) -> Any:
    if isinstance(tmpl, tuple) and len(tmpl) == 2 and tmpl[0] in ("__arg__", "__lb__"):
        if tmpl[0] == "__arg__":
            return args[tmpl[1]]
        return Tensor(LazyBuffer.from_buffer(tmpl[1].buffer))
    if isinstance(tmpl, (list, tuple)):
        return type(tmpl)(_fill(t, args) for t in tmpl)
    if isinstance(tmpl, dict):
        return {k: _fill(v, args) for k, v in tmpl.items()}
    return tmpl


class Jit:
    """The object ``@eqgrad.jit`` returns; call it like the function."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name = getattr(fn, "__name__", "jit")
        self._seen: dict[Any, int] = {}
        self._captures: dict[Any, _Capture] = {}
        self.replays = 0          # calls answered by a replay
        self.captures = 0         # signatures captured (a new signature captures again)
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    @staticmethod
    def _signature(args: tuple, kwargs: dict) -> tuple[Any, list[Tensor]]:
        tensors: list[Tensor] = []
        key: list[Any] = []
        for a in list(args) + [kwargs[k] for k in sorted(kwargs)]:
            if isinstance(a, Tensor):
                tensors.append(a)
                key.append(("T", a.shape, a.dtype.name, a.device))
            else:
                try:
                    hash(a)
                except TypeError:
                    key.append(("id", id(a)))         # e.g. a model: the same object must come back
                else:
                    key.append(("v", type(a).__name__, a))
        return (tuple(sorted(kwargs)), tuple(key)), tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, tensors = self._signature(args, kwargs)
        realize(*tensors)                      # inputs are plan inputs: they must be buffers
        cap = self._captures.get(key)
        if cap is not None:
            return self._replay(cap, tensors)
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        if n == 0:                             # first call: run (and compile) normally
            return self.fn(*args, **kwargs)
        return self._capture(key, tensors, args, kwargs)

    def _capture(self, key: Any, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        rec = _Recorder(tensors, f"jit({self.name})")
        engine.capture_hooks.append(rec.on_realize)
        tensor_mod._capture.append(rec)
        try:
            result = self.fn(*args, **kwargs)
            realize(*_tensors_in(result))       # returned tensors are outputs of the capture too
        finally:
            engine.capture_hooks.remove(rec.on_realize)
            tensor_mod._capture.remove(rec)
        rec.cap.result = _template(result, rec.arg_of)
        # the tensors returned now must not follow later replays (those re-point the recorded targets)
        written = {id(lb) for kind, r in rec.cap.actions if kind == "run" for lb, _ in r.targets}
        for t in _tensors_in(result):
            if id(t.lazydata) in written:
                t.lazydata = LazyBuffer.from_buffer(t.lazydata.buffer)
        self._captures[key] = rec.cap
        self.captures += 1
        return result

    def _replay(self, cap: _Capture, args: list[Tensor]) -> Any:
        for lb, redraw in cap.random:
            lb.buffer = redraw()
        arg_bufs = [t.lazydata.buffer for t in args]
        for kind, what in cap.actions:
            if kind == "commit":
                dst, src = what
                dst.buffer = src.buffer
                continue
            r: _Run = what
            bufs = [arg_bufs[i] if i >= 0 else lb.buffer for i, lb in r.inputs]
            n_in = len(bufs)
            for j, (shape, dt, dev) in enumerate(r.allocs):
                s = r.scratch.get(n_in + j)
                bufs.append(s if s is not None else Buffer.empty(shape, dt, dev))
            r.run(bufs)
            for lb, o in r.targets:
                lb.buffer = bufs[o]
        self.replays += 1
        return _fill(cap.result, args)

    def kernels_per_call(self) -> int:
        """Kernels one replay launches (of the first signature captured)."""
        return next(iter(self._captures.values())).kernels if self._captures else 0

    def reset(self) -> None:
        """Forget every capture (the next calls warm up and capture again)."""
        self._seen.clear()
        self._captures.clear()


def jit(fn: Callable[..., Any]) -> Jit:
    """Decorate a step function: its kernels are captured once and replayed on later calls."""
    return Jit(fn)
