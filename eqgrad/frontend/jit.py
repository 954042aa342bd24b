"""``@eqgrad.jit``: capture the kernels and buffer bindings of a step once, then replay them.

A jitted function runs normally on its first call for a given input signature (shapes, dtypes and
devices of its Tensor arguments, and the values of its other arguments): that compiles its plans.
The second call runs it again under a recorder that notes every plan that runs (through the
current session's ``capture_hooks``, which are per thread), which LazyBuffer each plan input came
from, which LazyBuffers the plan wrote, every ``assign`` committed and every host random draw. From the third call on, the function
is not called at all: the recorded plans run on the new inputs' buffers, with no Python graph
building, no plan-cache lookup and no validation.

Bindings at replay:
- a plan input that was a Tensor argument of the call reads the new argument's buffer;
- an input that read the current value of a tensor's storage (graphs read snapshots of storage,
  ``graph/lazy.py``) reads the *current* buffer of that storage (parameters and optimizer
  state, whose storage keeps its identity because ``assign`` re-points it in place; the learning
  rate a schedule writes between steps; constants made inside the function);
- an input that read a value an ``assign`` of the same call had already replaced (the loss of a
  step realized after ``opt.step()``) reads the buffer that assign replaces on the replay;
- a host random draw (``Tensor.rand``/``randn`` from the global generator, e.g. dropout masks) is
  drawn again before each replay;
- each plan writes fresh output buffers, re-points the LazyBuffers it wrote (so ``p.grad`` of a
  parameter reads the latest step's gradient) and commits the recorded assigns.

Guards: the function is not called on a replay, so the Python state it read must not have
changed. After a capture the JIT records the state reachable from the function -- its closure
cells, the globals its code names, its defaults and non-tensor arguments, and through them the
attributes of objects (modules, optimizers), lists, tuples and dicts -- Python scalars by value,
everything else (tensors, arrays, objects) by identity. Before each replay it checks them; when
one changed (a closure's ``scale``, ``model.weight = new_tensor``, ``opt.momentum``) the call
runs the function again under a new capture instead of replaying stale values.

Constraints (docs/training.md): the function's sequence of plans must not depend on tensor
values (it is not called again); it must not read tensors into Python (``numpy()``/``item()``/
``tolist()`` raise ``JitError`` while capturing); tensors it returns are new tensors on each
replay. A new input signature captures again.

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
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from eqgrad import engine
from eqgrad.devices import Buffer
from eqgrad.errors import JitError
from eqgrad.frontend import tensor as tensor_mod
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.frontend.tensor import Tensor, realize


@dataclass
class _Run:
    """One recorded plan: where its inputs come from and which LazyBuffers it writes."""
    run: Callable[[list[Buffer]], None]
    inputs: list[tuple[int, Any]]                 # (argument index, None), (-1, LazyBuffer) or (-2, slot)
    allocs: list[tuple[Any, Any, str]]            # (shape, dtype, device) of each buffer it writes
    scratch: dict[int, Buffer]                    # plan buffers that are not outputs: reused
    targets: list[tuple[LazyBuffer, int]]         # LazyBuffers re-pointed to plan buffers


@dataclass
class _Capture:
    actions: list[tuple[str, Any]] = field(default_factory=list)     # ("run", _Run) | ("commit", (dst, src, slot))
    random: list[tuple[LazyBuffer, Callable[[], Buffer]]] = field(default_factory=list)
    result: Any = None                                                # the return value, tensors as slots
    kernels: int = 0
    n_slots: int = 0                                                  # buffers replaced by commits, read later
    guards: "_Guards | None" = None                                   # the Python state the capture read


class _Recorder:
    """Collects what one call does; installed in the engine's and the Tensor module's hooks."""

    def __init__(self, args: list[Tensor], name: str):
        self.arg_of = {id(t.lazydata): i for i, t in enumerate(args)}
        self.cap = _Capture()
        self.name = name
        # (id(storage), id(buffer)) -> (buffer, slot): buffers that a commit of this call replaced
        self.retired: dict[tuple[int, int], tuple[Buffer, int]] = {}

    def binding(self, lb: LazyBuffer) -> tuple[int, Any]:
        """Where a replay finds the value that ``lb`` holds now."""
        i = self.arg_of.get(id(lb))
        if i is not None:
            return (i, None)
        base = lb.base() if lb.base is not None else None
        if base is None:
            return (-1, lb)
        if base.buffer is lb.buffer:                  # the storage's current value
            i = self.arg_of.get(id(base))
            return (i, None) if i is not None else (-1, base)
        r = self.retired.get((id(base), id(lb.buffer)))
        if r is not None:                             # a value this call's assign replaced
            return (-2, r[1])
        return (-1, lb)                               # a value older than the call: a constant

    def on_realize(self, cp: Any, inputs: list[LazyBuffer], targets: list[LazyBuffer], bufs: list[Buffer]) -> None:
        plan = cp.plan
        n_in = len(inputs)
        slots = [self.binding(lb) for lb in inputs]
        outs = set(plan.outputs)
        scratch = {i: bufs[i] for i in range(n_in, len(bufs)) if i not in outs}
        specs = [(shape, dt, b.device) for (shape, dt), b in zip(plan.buffers[n_in:], bufs[n_in:])]
        self.cap.actions.append(("run", _Run(cp.run, slots, specs, scratch, list(zip(targets, plan.outputs)))))
        # the kernels the device launches (its stage may run a plan kernel as several, or several as one)
        self.cap.kernels += getattr(cp.run, "launches", len(plan.kernels))

    def commit(self, dst: LazyBuffer, src: LazyBuffer, old: Buffer | None) -> None:
        slot = None
        if old is not None:
            slot = self.cap.n_slots
            self.cap.n_slots += 1
            self.retired[(id(dst), id(old))] = (old, slot)
        self.cap.actions.append(("commit", (dst, src, slot)))

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


class _Out:
    """A returned tensor in a capture's result template: where a replay finds its value."""
    __slots__ = ("binding",)

    def __init__(self, binding: tuple[int, Any]):
        self.binding = binding


def _template(result: Any, rec: _Recorder) -> Any:
    """The return value with each tensor replaced by where a replay finds it."""
    if isinstance(result, Tensor):
        return _Out(rec.binding(result.lazydata))
    if isinstance(result, (list, tuple)):
        return type(result)(_template(r, rec) for r in result)
    if isinstance(result, dict):
        return {k: _template(v, rec) for k, v in result.items()}
    return result


def _fill(tmpl: Any, args: list[Tensor], slots: list[Any]) -> Any:
    if isinstance(tmpl, _Out):
        i, what = tmpl.binding
        if i >= 0:
            return args[i]
        return Tensor(LazyBuffer.from_buffer(what.buffer if i == -1 else slots[what]))
    if isinstance(tmpl, (list, tuple)):
        return type(tmpl)(_fill(t, args, slots) for t in tmpl)
    if isinstance(tmpl, dict):
        return {k: _fill(v, args, slots) for k, v in tmpl.items()}
    return tmpl


# ------------------------------------------------------------------ guards on Python state

_SCALARS = (int, float, complex, bool, str, bytes, type(None), np.generic)
_OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType, np.ndarray,
           np.dtype, Tensor, LazyBuffer, Buffer)
MAX_GUARDS = 20_000          # guards per capture
MAX_ITEMS = 1_024            # elements guarded per list/tuple/dict (beyond: its length and identity)
_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(b, _SCALARS) and type(a) is type(b):
        try:
            return bool(a == b) or (a != a and b != b)      # NaN equals NaN here
        except Exception:
            return False
    return False


class _Guards:
    """The Python state a capture read, reachable from the function: ``(getter, place, key,
    expected)`` checks, cheap to run before each replay (one lookup and one compare each)."""

    def __init__(self) -> None:
        self.checks: list[tuple[Callable[[Any, Any], Any], Any, Any, Any, str]] = []
        self._seen: set[int] = set()

    @staticmethod
    def _dict_get(d: Any, k: Any) -> Any:
        return d.get(k, _MISSING)

    @staticmethod
    def _len(c: Any, _: Any) -> Any:
        return len(c)

    @staticmethod
    def _item(c: Any, i: Any) -> Any:
        return c[i] if i < len(c) else _MISSING

    @staticmethod
    def _cell(c: Any, _: Any) -> Any:
        try:
            return c.cell_contents
        except ValueError:
            return _MISSING

    def add(self, get: Callable[[Any, Any], Any], place: Any, key: Any, value: Any, what: str) -> None:
        if len(self.checks) >= MAX_GUARDS:
            return
        self.checks.append((get, place, key, value, what))
        self.walk(value, what)

    def walk(self, v: Any, what: str) -> None:
        """Guard what ``v`` contains (``v`` itself is guarded by its container)."""
        if isinstance(v, _SCALARS) or isinstance(v, _OPAQUE) or isinstance(v, Jit) or id(v) in self._seen:
            return
        self._seen.add(id(v))
        if isinstance(v, (list, tuple)):
            if isinstance(v, list):
                self.checks.append((self._len, v, None, len(v), f"len({what})"))
            for i, x in enumerate(v[:MAX_ITEMS]):
                self.add(self._item, v, i, x, f"{what}[{i}]")
        elif isinstance(v, dict):
            self.checks.append((self._len, v, None, len(v), f"len({what})"))
            live = getattr(v, "jit_live_keys", ())       # values a replay reads from a tensor
            for k in list(v)[:MAX_ITEMS]:
                if k not in live:
                    self.add(self._dict_get, v, k, v[k], f"{what}[{k!r}]")
        elif isinstance(v, types.FunctionType):
            self.function(v, what)
        elif isinstance(v, types.MethodType):
            self.walk(v.__self__, f"{what}.__self__")
            self.walk(v.__func__, what)
        elif isinstance(v, functools.partial):
            self.walk(v.func, what)
            self.walk(v.args, f"{what}.args")
            self.walk(v.keywords, f"{what}.keywords")
        elif isinstance(getattr(v, "__dict__", None), dict):
            d = vars(v)
            self.checks.append((self._len, d, None, len(d), f"attributes of {what}"))
            for k in list(d)[:MAX_ITEMS]:
                self.add(self._dict_get, d, k, d[k], f"{what}.{k}")
            cls = type(v)
            if not cls.__module__.startswith(("eqgrad.", "builtins")):
                for k, f in vars(cls).items():                 # a user class's methods read globals
                    if isinstance(f, types.FunctionType):
                        self.function(f, f"{cls.__name__}.{k}")

    def function(self, f: types.FunctionType, what: str, root: bool = False) -> None:
        if not root and (f.__module__ or "").startswith("eqgrad."):
            return                       # eqgrad's own functions: their state is not the user's
        self._seen.add(id(f))
        if f.__closure__:
            for name, cell in zip(f.__code__.co_freevars, f.__closure__):
                self.add(self._cell, cell, None, self._cell(cell, None), f"{f.__name__}: {name}")
        if f.__defaults__:
            self.walk(f.__defaults__, f"{f.__name__} defaults")
        if f.__kwdefaults__:
            self.walk(f.__kwdefaults__, f"{f.__name__} defaults")
        g = f.__globals__
        for name in sorted(_code_names(f.__code__)):
            if name in g:
                self.add(self._dict_get, g, name, g[name], f"global {name}")

    def failed(self) -> str | None:
        """The first guard that no longer holds (None when all hold)."""
        for get, place, key, value, what in self.checks:
            v = get(place, key)
            if v is not value and not _same(v, value):
                return what
        return None


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


RECAPTURE_WARNING = 8        # captures for changed state after which a Jit warns (once)


class JitWarning(UserWarning):
    """A jitted function keeps capturing again because Python state it reads keeps changing."""


class Jit:
    """The object ``@eqgrad.jit`` returns; call it like the function."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name = getattr(fn, "__name__", "jit")
        self._seen: dict[Any, int] = {}
        self._captures: dict[Any, _Capture] = {}
        self.replays = 0          # calls answered by a replay
        self.captures = 0         # captures (a new signature, or changed Python state, captures again)
        self.recaptures = 0       # captures because Python state the previous capture read changed
        self.last_recapture: str | None = None      # what changed, e.g. "f: scale" or "global w"
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
            changed = cap.guards.failed() if cap.guards is not None else None
            if changed is None:
                return self._replay(cap, tensors)
            # Python state the capture read has changed: replaying would give stale values
            self.recaptures += 1
            self.last_recapture = changed
            if self.recaptures == RECAPTURE_WARNING:
                warnings.warn(f"jit({self.name}): Python state it reads changed {self.recaptures} times ({changed}); "
                              "each change runs and captures the function again -- pass a value that changes "
                              "every call as a tensor argument", JitWarning, stacklevel=2)
            return self._capture(key, tensors, args, kwargs)
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        if n == 0:                             # first call: run (and compile) normally
            return self.fn(*args, **kwargs)
        return self._capture(key, tensors, args, kwargs)

    def _guards(self, args: tuple, kwargs: dict) -> _Guards:
        g = _Guards()
        g.function(self.fn, self.name, root=True)
        for i, a in enumerate(list(args) + [kwargs[k] for k in sorted(kwargs)]):
            if not isinstance(a, Tensor):
                g.walk(a, f"argument {i}")
        return g

    def _capture(self, key: Any, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        rec = _Recorder(tensors, f"jit({self.name})")
        # the hooks of the current session in this thread: plans that other threads run meanwhile
        # are not this call's
        hooks = engine.current_session().capture_hooks
        hooks.append(rec.on_realize)
        tensor_mod._capture.append(rec)
        try:
            result = self.fn(*args, **kwargs)
            realize(*_tensors_in(result))       # returned tensors are outputs of the capture too
        finally:
            hooks.remove(rec.on_realize)
            tensor_mod._capture.remove(rec)
        rec.cap.result = _template(result, rec)
        rec.cap.guards = self._guards(args, kwargs)       # the state after the call: what replays assume
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
            lb.set_buffer(redraw())
        arg_bufs = [t.lazydata.buffer for t in args]
        slots: list[Any] = [None] * cap.n_slots
        for kind, what in cap.actions:
            if kind == "commit":
                dst, src, slot = what
                if slot is not None:
                    slots[slot] = dst.buffer
                dst.set_buffer(src.buffer)
                continue
            r: _Run = what
            bufs = [arg_bufs[i] if i >= 0 else lb.buffer if i == -1 else slots[lb] for i, lb in r.inputs]
            n_in = len(bufs)
            for j, (shape, dt, dev) in enumerate(r.allocs):
                s = r.scratch.get(n_in + j)
                bufs.append(s if s is not None else Buffer.empty(shape, dt, dev))
            r.run(bufs)
            for lb, o in r.targets:
                lb.set_buffer(bufs[o])
        self.replays += 1
        return _fill(cap.result, args, slots)

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
