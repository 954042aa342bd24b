"""Devices: where buffers live and kernels run. One module per device, found by name (``DEVICES``).

A device is one renderer plus one runtime (docs/devices.md). It provides:

- ``params``: its cost-model parameters;
- memory: ``alloc(shape, dtype)`` returns the device's handle for a new buffer (a NumPy array on the
  host devices, a ``cl.Buffer`` on OPENCL, a device allocation on CUDA), ``copyin(raw, array)``
  and ``copyout(raw, shape, dtype)`` move contents between it and the host;
- ``prepare(plan)``: compiles a :class:`KernelPlan` into a callable that runs it on a list of
  buffers (it may return before the kernels finish; ``synchronize()`` waits, and so does every
  copy back to the host);
- ``runtime_errors``: the exceptions its runtime raises when the device fails (lost, reset, out of
  memory). ``Buffer`` turns them into one :class:`DeviceError` naming the device and the operation
  (allocation, copy), and the device's ``run`` does the same naming the kernel (``Device.failed``).
  A failed realize leaves its tensors unrealized: no result of it is ever used, and a later
  realize (on this device once it works again, or on another) runs normally.

The base class implements memory for host devices (LLVM, NUMPY): buffers are contiguous NumPy
arrays, reachable without a copy through ``Buffer.data`` and ``Buffer.ptr``.

Host buffers of at least ``POOL_MIN_BYTES`` come from a pool (``pool``): when a pooled Buffer is
garbage-collected (an intermediate right after its plan ran, an output when no tensor holds it
any more) its memory goes back to the pool, and the next buffer of the same size and device
reuses it, so steady-state realizes do not page-fault fresh memory (first touch costs about
1.4 us per 4 KiB page). The pool keeps at most ``EQGRAD_POOL_BYTES``; ``clear_pool()`` empties it.
"""
from __future__ import annotations

import importlib
import math
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from eqgrad.dtype import DType
from eqgrad.errors import DeviceError, OutOfMemoryError
from eqgrad.ops import Shape, numel
from eqgrad.devices.hostmem import host_empty, host_memory_bytes
from eqgrad.config import DEVICE_ALIASES
from eqgrad import config
from eqgrad.config import POOL_BYTES
from eqgrad.dtype import to_dtype, to_storage
from eqgrad.cache import computed_once
from eqgrad.lower import lowering, trace
from eqgrad.lower.passes import LowerOptions
from eqgrad.graph.caps import CPU, Capabilities, record as record_caps
from eqgrad.graph.sizes import body_sizes
# imported here, not with the LLVM device at first use, for the order of the fork hooks (see
# _before_fork): 20 ms more of ``import eqgrad``, 20 ms less of the first Tensor's
from eqgrad.devices import llvm  # noqa: F401

# device name -> "module:class" inside this package (names and aliases: eqgrad/config.py)
DEVICES = {
    "LLVM": "cpu:LLVMDevice",
    "NUMPY": "numpy_device:NumpyDevice",
    "OPENCL": "opencl:OpenCLDevice",
    "CUDA": "cuda:CUDADevice",
}


POOL_MIN_BYTES = 64 << 10     # smaller host buffers come from np.empty (malloc reuses them cheaply; docs/lowering.md, Constants)


def size_class(nbytes: int) -> int:
    """The bytes the pool allocates for a buffer of ``nbytes`` (from ``POOL_MIN_BYTES``): rounded up to
    one of ``SIZE_CLASSES`` sizes per power of two, at most 1/``SIZE_CLASSES`` more. A buffer that grows
    a little each step -- a KV cache extended by ``cat`` every token -- then reuses one freed a few
    steps before: kept by exact size, each freed cache was a size no later request asked for, and a
    decode loop filled the pool (1 GiB by default) with them (a 1-layer decoder step: RSS 200 -> 302
    MB over 300 tokens, 22 MB of it dead KV buffers after 150)."""
    if nbytes <= POOL_MIN_BYTES:
        return nbytes
    step = 1 << max(0, nbytes.bit_length() - SIZE_CLASSES.bit_length())     # (SIZE_CLASSES: a power of two)
    return -(-nbytes // step) * step


SIZE_CLASSES = 8              # pool sizes per power of two (size_class; docs/lowering.md, Constants)


class BufferPool:
    """Freed host memory by (device, size class): flat uint8 arrays of ``size_class`` bytes, at most
    EQGRAD_POOL_BYTES in all.

    A pooled array is handed out again only when nothing else references it: a view kept from
    ``Buffer.data`` (or any array derived from it) holds a reference to the flat array, and
    ``acquire`` drops such an array instead of reusing it.

    Threads: every method holds one lock (``acquire`` checks a list, then pops from it, and
    ``nbytes`` is read-modify-write: another thread may run in between; not seen failing under the
    GIL, but nothing promises it). Re-entrant, because garbage collection can run a Buffer's
    ``__del__`` -- a ``release`` -- on a thread that is inside ``acquire``."""

    def __init__(self) -> None:
        self.free: dict[tuple[str, int], list[np.ndarray]] = {}
        self.nbytes = 0           # bytes held in ``free``
        self.hits = 0             # buffers served from the pool
        self.misses = 0           # pool-sized buffers that needed fresh memory
        self._lock = threading.RLock()

    def acquire(self, device: str, nbytes: int) -> np.ndarray:
        """A flat array of ``size_class(nbytes)`` bytes (the caller views its first ``nbytes``)."""
        cls = size_class(nbytes)
        with self._lock:
            arrays = self.free.get((device, cls))
            while arrays:
                a = arrays.pop()
                self.nbytes -= cls
                if sys.getrefcount(a) == 2:       # only ``a`` and getrefcount's argument: unused
                    self.hits += 1
                    return a
            self.misses += 1
        return host_empty(cls)             # huge pages when large (hostmem.py)

    def release(self, device: str, a: np.ndarray) -> None:
        with self._lock:
            if self.nbytes + a.nbytes <= POOL_BYTES.value:
                self.free.setdefault((device, a.nbytes), []).append(a)
                self.nbytes += a.nbytes

    def clear(self) -> None:
        with self._lock:
            self.free.clear()
            self.nbytes = 0


pool = BufferPool()


def clear_pool() -> None:
    """Return the pooled host memory to the allocator."""
    pool.clear()


@dataclass(eq=False)
class Buffer:
    device: str
    shape: Shape
    dtype: DType
    raw: Any             # the device's handle (a contiguous NumPy array of ``shape`` on host devices)

    _pooled = None       # (device, flat array) when ``raw`` is a view of pooled memory

    @staticmethod
    def empty(shape: Shape, dtype: DType, device: str) -> "Buffer":
        if shape.__class__ is not tuple:
            shape = tuple(shape)
        dev = _devices.get(device) or get_device(device)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes >= POOL_MIN_BYTES and dev.host_memory:
            if nbytes > host_memory_bytes():
                # refused before NumPy or mmap try: past memory and swap it can never be backed
                raise OutOfMemoryError(f"{device}: a {dtype.name} buffer of shape {shape} needs {nbytes} bytes "
                                       f"({nbytes / 2**30:.1f} GiB); this machine has {host_memory_bytes()} "
                                       "bytes of memory and swap")
            try:
                flat = pool.acquire(dev.name, nbytes)
            except MemoryError as e:
                raise OutOfMemoryError(f"{device}: could not allocate a {dtype.name} buffer of shape {shape} "
                                       f"({nbytes} bytes): {e}") from e
            mem = flat[:nbytes] if flat.nbytes > nbytes else flat      # (its size class may be larger)
            buf = Buffer(device, shape, dtype, mem.view(dtype.np).reshape(shape))
            buf._pooled = (dev.name, flat)
            return buf
        try:
            raw = dev.alloc(shape, dtype)
        except dev.runtime_errors as e:
            raise dev.failed(f"allocating a {dtype.name} buffer of shape {shape} ({nbytes} bytes)", e) from e
        return Buffer(device, shape, dtype, raw)

    def __del__(self) -> None:
        if self._pooled is not None:
            try:
                pool.release(*self._pooled)
            except Exception:             # interpreter shutdown: module globals may be gone
                pass

    @staticmethod
    def scalar(value: Any, dtype: DType, device: str) -> "Buffer":
        """A new buffer of shape () holding ``value`` (already a value of ``dtype``): a plan's
        parameter, made on every realize that has one (on a host device without a copy)."""
        dev = _devices.get(device) or get_device(device)
        raw = to_storage(np.array(value, dtype=dtype.vnp), dtype)      # bfloat16: its bits
        if dev.host_memory:
            return Buffer(device, (), dtype, raw)
        return Buffer.from_numpy(raw, device, dtype)

    @staticmethod
    def from_numpy(a: np.ndarray, device: str, dtype: DType | None = None) -> "Buffer":
        """A new buffer holding a copy of ``a`` (later writes to ``a`` do not leak in). ``dtype``
        (default: ``a``'s) says what the host array holds: a bfloat16 buffer's is its bits (uint16)."""
        buf = Buffer.empty(a.shape, dtype or to_dtype(a.dtype), device)
        buf.copyin(a)
        return buf

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * self.dtype.itemsize

    def copyin(self, a: np.ndarray) -> None:
        """Overwrite the contents with ``a`` (same shape; converted to the buffer's dtype)."""
        dev = get_device(self.device)
        a = np.ascontiguousarray(a, dtype=self.dtype.np).reshape(self.shape)
        try:
            dev.copyin(self.raw, a)
        except dev.runtime_errors as e:
            raise dev.failed(f"copying a {self.dtype.name} buffer of shape {self.shape} from the host", e) from e

    def numpy(self) -> np.ndarray:
        """The contents as a new host array of ``shape`` (waits for pending kernels that write it)."""
        dev = get_device(self.device)
        try:
            return dev.copyout(self.raw, self.shape, self.dtype)
        except dev.runtime_errors as e:
            raise dev.failed(f"copying a {self.dtype.name} buffer of shape {self.shape} to the host", e) from e

    def to(self, device: str) -> "Buffer":
        """This buffer on ``device``: itself when already there, else a copy (through the host)."""
        return self if device == self.device else Buffer.from_numpy(self.numpy(), device)

    @property
    def data(self) -> np.ndarray:
        """The host array itself (no copy); only for buffers of host devices."""
        if not isinstance(self.raw, np.ndarray):
            raise DeviceError(f"a buffer on {self.device} lives in device memory; copy it with .numpy()")
        return self.raw

    @computed_once
    def ptr(self) -> int:
        """The address of the host array (computed once: ``raw`` never changes; launches ask for it)."""
        return self.data.ctypes.data


def kernel_structure(k: Any, plan: Any) -> tuple:
    """What lowering a kernel depends on: its body in topological order with each buffer named by
    its parameter position (the output 0, then the inputs), attributes with their sizes taken out
    and constants by ``repr`` (so -0.0, NaN and 0.0 stay apart), the shapes and dtypes of its
    parameters, and those sizes: ``graph.sizes.body_sizes``, which the traced lowering keys its traces by
    (one walk of the body for both; kept on the body's root node, for the buffers and parameter
    shapes it was worked out with)."""
    return body_sizes(k, plan)


class LoweredKernels:
    """Lowered kernels (loop IR) by structure, least recently used dropped past ``MAX_ENTRIES`` or
    ``MAX_INSTS`` loop-IR instructions in all: never compiled code or rendered text (a device
    keeps its compiled programs itself; a renderer's output depends on its own settings)."""
    MAX_ENTRIES = 2048
    MAX_INSTS = 2_000_000

    def __init__(self) -> None:
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._insts = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: tuple, lk: Any) -> None:
        with self._lock:
            if key in self._items:
                return
            self._items[key] = lk
            self._insts += len(lk.insts)
            while len(self._items) > self.MAX_ENTRIES or self._insts > self.MAX_INSTS:
                _, old = self._items.popitem(last=False)
                self._insts -= len(old.insts)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._insts = 0

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


_lowered = LoweredKernels()


@dataclass
class DevicePlan:
    """A plan as a device runs it: the device's stage after extraction (``Device.rewrite``). The
    LLVM device splits large full reductions into parallel partials and hands contractions to the
    BLAS (packing operands, splitting the ops after a contraction into their own kernel); the
    scratch buffers those rewrites add are ``scratch`` ((shape, dtype), buffer ids after the
    plan's). ``notes``: one line per rewrite, shown by explain() and DEBUG=3."""
    plan: Any
    scratch: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self, device: str) -> str:
        if not self.notes:
            return f"device stage ({device}): the plan as extracted"
        return "\n".join([f"device stage ({device}): {len(self.notes)} rewrite(s), "
                          f"{len(self.plan.kernels)} kernel(s) run"] + [f"  {n}" for n in self.notes])


class Device:
    name = "?"
    host_memory = True       # buffers are NumPy arrays (base-class memory below); pooled by Buffer.empty
    # what the lowering may do for this device (graph/caps.py): the CPU's register blocks unless a
    # device says otherwise; part of the lowered-kernel cache key
    caps: Capabilities = CPU
    # the exceptions of the device's runtime that mean the device failed (lost, reset, out of memory)
    runtime_errors: tuple[type[BaseException], ...] = ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def failed(self, what: str, e: BaseException) -> DeviceError:
        """The one error a runtime failure of this device becomes: names the device, what it was
        doing (the kernel, the allocation or copy) and the runtime's own message."""
        return DeviceError(f"{self.name} device failed {what}: {type(e).__name__}: {e}. The device may "
                           f"have been lost or run out of memory; no result of this operation was used")

    def prepare(self, plan: Any) -> Callable[[list[Buffer]], None]:
        raise NotImplementedError

    def rewrite(self, plan: Any) -> DevicePlan:
        """The device's rewrites of an extracted plan before it is lowered (a named stage: what the
        device runs differs from what the extractor chose). None here."""
        return DevicePlan(plan)

    def warm(self, nodes: int = 0, waiting: Callable[[], bool] | None = None) -> None:
        """Set up what the first compile waits for (LLVM: its compiler), ahead of it: the engine
        calls this while the saturation worker works on a program of ``nodes`` nodes (never
        raises; what is set up once is not set up again). ``waiting()``: is the worker still at
        it? Set-up that pays only while waiting -- it moves work off the first compile but costs
        more than it moves -- is skipped once it says no (None: do it all)."""

    def render_kernel(self, k: Any, plan: Any, render: Callable[[Any], str], language: str,
                      upcast: Any = None) -> tuple[Any, str]:
        """Lower one kernel to loop IR and render it (``DEBUG>=5`` prints the loop IR, ``>=4`` the
        source). Every kernel's function is named ``eqk``: the same body gives the same source, so
        it is compiled once across plans.

        Lowering is a function of the kernel's structure alone (its body with buffers numbered as
        its parameters, the parameters' shapes and dtypes, the lanes), so the result is kept by
        that structure (``LoweredKernels``): the repeated layers of a model lower once (a
        LLaMA-shaped 30-layer step: 394 kernels, 50 distinct bodies), and so do the kernels a
        resized plan did not change."""
        lk = self.lowered_kernel(k, plan, upcast)
        # rendering is not kept: a renderer has settings of its own (OpenCL's reduce_group), and it
        # is the cheap part (41-60 ms of a 4-layer MLP step's 0.35-0.44 s of lowering and rendering)
        src = render(lk)
        if config.DEBUG.value >= 5:
            print(f"--- loop IR {k.name}\n{lk}")
        if config.DEBUG.value >= 4:
            print(f"--- {language} {k.name}\n{src}")
        return lk, src

    def has_lowered(self, k: Any, plan: Any, upcast: Any = None, structure: Any = None) -> bool:
        """Whether this process keeps the kernel's loop IR (``lowered_kernel`` would not lower);
        ``structure``: ``kernel_structure(k, plan)`` when the caller has it already."""
        structure = self.structure(k, plan) if structure is None else structure
        return _lowered.get((structure, upcast, lowering.lower_kernel, self.caps)) is not None

    # a device that prepares a plan's kernels in several passes sets a dict here for the duration
    # of a prepare (LLVM: prefetch, then build), so each kernel's structure is worked out once
    _structures: dict | None = None

    def structure(self, k: Any, plan: Any) -> tuple:
        """``kernel_structure(k, plan)``, remembered for this prepare where the device keeps a memo."""
        memo = self._structures
        if memo is None:
            return kernel_structure(k, plan)
        hit = memo.get(id(k))
        if hit is not None and hit[0] is k and hit[1] is plan:
            return hit[2]
        s = kernel_structure(k, plan)
        memo[id(k)] = (k, plan, s)
        return s

    @property
    def trace_key(self) -> Any:
        """What this device's traced lowerings are kept under besides a body's structure
        (lower/trace.py ``Traces``' ``key``): its capabilities, None for ``CPU``'s."""
        caps = self.caps
        return None if caps == CPU else caps

    def lowered_kernel(self, k: Any, plan: Any, upcast: Any = None) -> Any:
        """One kernel's loop IR, named ``eqk``, lowered once per structure and device capabilities
        (``render_kernel``)."""
        lower = lowering.lower_kernel               # looked up at call time (tests patch it)
        caps = self.caps
        key = (self.structure(k, plan), upcast, lower, caps)
        lk = _lowered.get(key)
        if lk is None:
            # the device's own choices (an OpenCL GPU, CUDA: no CPU register blocks)
            options = LowerOptions.for_caps(caps) if caps != CPU else None
            if upcast is None and lower is lowering.lower_kernel and config.SIZE_ARGS.value:
                # a body whose sizes keep changing lowers once (lower/trace.py), per device capabilities
                lk = trace.TRACES.lower(k, plan, lower) if options is None else \
                    trace.TRACES.lower(k, plan, lambda k, plan: lower(k, plan, None, options=options), caps)
            elif options is not None:
                lk = lower(k, plan, upcast, options=options)
            else:
                lk = lower(k, plan, upcast)
            lk.name = "eqk"
            _lowered.put(key, lk)
        return lk

    # ------------------------------------------------------------------ memory (host devices)
    def alloc(self, shape: Shape, dtype: DType) -> Any:
        return np.empty(shape, dtype=dtype.np)

    def copyin(self, raw: Any, a: np.ndarray) -> None:
        np.copyto(raw, a)

    def copyout(self, raw: Any, shape: Shape, dtype: DType) -> np.ndarray:
        return raw.copy()

    def synchronize(self) -> None:
        """Wait until every kernel launched so far has finished."""

    def after_fork_in_child(self) -> bool:
        """Called in the child after ``os.fork()``: re-create what the child cannot inherit
        (threads, driver state). False drops the device object; the next use creates a new one.
        A device with its own runtime (OPENCL, CUDA) is dropped by default: a driver's threads do
        not survive a fork."""
        return self.host_memory


_devices: dict[str, Device] = {}
# one device object per name, also when threads ask at once: two OPENCL objects are two contexts,
# and a buffer of one is INVALID_CONTEXT on the other's queue (re-entrant: a device's constructor
# may look up another device)
_devices_lock = threading.RLock()


# _devices_lock is held across os.fork() (a fork during a device's first import used to hang the child): get_device imports a device's module under
# it, and a thread inside that first import at the fork would leave the module half run and its
# import lock held in the child for good (the child's first Tensor then waited forever). So the
# fork waits for the import and the device's constructor instead (LLVM: ~15 ms, once). The order
# is _devices_lock, then llvm.py's COMPILE_LOCK and llvmlite's lock, which a device's import or
# constructor may take under _devices_lock (never the other way round). A process's fork hooks
# run last registered first, so llvm.py is imported above, before this module registers its own.
# (Imported by get_device, under _devices_lock, its hooks took LLVM's locks first: a fork between
# their registration and its import's own call into LLVM deadlocked; and a fork waiting here while
# they were registered ran their releases without their acquires.) Re-entrant: a thread inside
# get_device may fork.
def _before_fork() -> None:
    _devices_lock.acquire()


def _after_fork_in_parent() -> None:
    _devices_lock.release()


def _after_fork_in_child() -> None:
    _devices_lock.release()
    pool._lock = threading.RLock()        # a parent thread may have held these at the fork
    _lowered.after_fork_in_child()
    for name, dev in list(_devices.items()):
        if not dev.after_fork_in_child():
            del _devices[name]


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _unknown(name: str) -> DeviceError:
    return DeviceError(f"unknown device {name!r}: expected one of {', '.join(DEVICES)}")


def get_device(name: str) -> Device:
    """The device object (created on first use). Raises DeviceError naming what is missing when
    the device cannot run here (no driver, no package)."""
    name = DEVICE_ALIASES.get(name.upper(), name.upper())
    dev = _devices.get(name)
    if dev is not None:
        return dev
    with _devices_lock:
        if name not in _devices:
            if name not in DEVICES:
                raise _unknown(name)
            module, cls = DEVICES[name].split(":")
            dev = getattr(importlib.import_module(f".{module}", __name__), cls)()
            record_caps(name, dev)               # the cost model reads its caps (graph/caps.py)
            _devices[name] = dev
        return _devices[name]


def canonical_device(name: str | None) -> str:
    """The canonical name of a device given by the user (or EQGRAD_DEVICE when None); raises
    DeviceError at once if it is unknown or cannot run here."""
    name = (name or config.DEVICE.value).upper()
    name = config.DEVICE_ALIASES.get(name, name)
    if name not in DEVICES:
        raise _unknown(name)
    return get_device(name).name
