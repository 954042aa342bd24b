"""A library GEMM for the LLVM device's contraction kernels: the OpenBLAS that SciPy ships.

``lower/contraction.py`` reads a kernel body as a (batched) ``C = X @ Y`` with element strides;
here that becomes calls of the BLAS's ``sgemm`` (``sgemv`` when one side is a single row or
column: a decode step's matrix-vector products), one per batch index, through the functions of the
OpenBLAS library a SciPy wheel ships (``scipy.libs``, opened directly: importing ``scipy.linalg``
costs ~0.19 s), or, for a SciPy built against another BLAS, through the pointers
``scipy.linalg.cython_blas`` exports. Those are the Fortran entry points
(column-major, every argument by reference): row-major ``C = X Y`` is column-major
``C^T = Y^T X^T``, so Y is the first operand. OpenBLAS picks its kernels for the CPU it runs on
(DYNAMIC_ARCH: ``corename()`` names the one in use), so nothing here is tuned to one machine.

Threads (``openblas_set_num_threads_local`` per call, restored after it, so a user's own SciPy
calls keep their setting): a batch of products is shared by the device's threads as a generated
kernel's loop is (cpu.py ``launch``), one OpenBLAS thread per call. A single product runs on
``EQGRAD_THREADS`` OpenBLAS threads where eqgrad loaded the library itself with
``OPENBLAS_THREAD_TIMEOUT`` set (``Blas.quiet``); OpenBLAS's workers otherwise spin for ~0.1 s after
each call, and on two cores a CNN step whose one GEMM ran on them took 90-114 ms against 48-68 ms,
every generated kernel after the GEMM running slower, a plain sum 10x. Where SciPy had loaded it
first, a single product is cut into one block per device thread instead (which reached only
100-130 GFLOP/s for 1024^2 on two threads, against ~210 on OpenBLAS's). NumPy's own OpenBLAS (a separate copy) spins the same way after
NumPy's products, and slows eqgrad's kernels that run within ~0.1 s of one.

``EQGRAD_BLAS=0`` (config.py) turns it off: every contraction is a generated kernel.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import math
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from eqgrad.cache import JsonCache, machine_id
from eqgrad.graph.caps import library_seconds
from eqgrad.lower.contraction import Gemm, lead
from eqgrad.devices import spin

_VP = ctypes.c_void_p

# The smallest GEMM side (rows of C or its columns) given to the BLAS: a "contraction" with one
# output element per batch index (a row's sum of squares, a dot product per row) is a reduction,
# which the generated kernel streams with no call per element.
GEMM_MIN = 2           # docs/lowering.md, Constants
SPEED_N = 256          # the side of the GEMM ``speeds`` times (34 MFLOP: ~0.2 ms at 150 GFLOP/s; docs/lowering.md, Constants)


def pays(g: Gemm, predicted: float, threads: int) -> bool | None:
    """Whether the BLAS runs contraction ``g`` rather than a generated kernel: False for a
    reduction (one output per batch index), and for products whose calls cost more than their
    arithmetic (``speeds``: the cost of a call and the BLAS's rate, measured on this machine) where
    even the BLAS's best case -- every call at that cost, the arithmetic at that rate, shared
    evenly by ``threads`` -- comes in above the cost model's ``predicted`` seconds for the
    generated kernel (attention over 15 tokens: 384 products of 15 x 15 x 32 at 4.9 us a call lose
    to one generated kernel by 4x on the calls alone). True for one such product that comes in
    below: its one call costs what was measured. Never True unmeasured for a batch: there the best
    case is a bound, not a prediction -- at 1.0 us a call the same 384 products came to 0.21 ms
    with the calls shared by two threads, under the generated kernel's 0.30 predicted, and ran at
    0.65 ms (1.7 us a call of that shape; shared by two threads, 1.6 ms) against the generated
    kernel's 0.21. None otherwise: which is faster then depends on the shape and layout (attention over 128 tokens: the
    BLAS 2.5x faster for q @ k^T, the generated kernel 1.6x faster for p @ v; a Linear's input
    gradient with k = 10: the generated kernel 7x faster with the ops after it fused; a rule by
    arithmetic intensity would need the DRAM bandwidth, whose measurement cost 0.4 s of page
    faults), so the device times both
    (``cpustage.CPUStage._measured``, cached per machine)."""
    if max(g.m, g.n) < GEMM_MIN or blas() is None:
        return False
    call, rate = speeds()
    if g.flops / g.batches / rate < call:
        if library_seconds(call, rate, g.flops, g.batches, threads, threaded=False) >= predicted:
            return False
        if g.batches == 1:           # one call: its cost is what was measured (a tiny product's)
            return True
    return None


def _check_choice(v: object) -> str | None:
    def seconds(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    def dims(x: object) -> bool:
        return isinstance(x, list) and len(x) == 4 and all(type(d) is int and d > 0 for d in x)
    if isinstance(v, list) and all(isinstance(e, list) and len(e) == 5 and type(e[0]) is int and e[0] > 0
                                   and seconds(e[1]) and seconds(e[2]) and type(e[3]) is int and e[3] > 0
                                   and dims(e[4]) for e in v):
        return None
    return ("expected a list of [flops, generated seconds, BLAS seconds, processes, [batches, m, n, k]], "
            f"got {v!r}")


# measured: [[flops, generated seconds, BLAS seconds, processes that timed it, [batches, m, n, k]]]
# per structure (cpustage.CPUStage._measured; each side its fastest over the processes; version 4:
# the dimensions, cpustage.near_choice)
CHOICES = JsonCache("gemm", 4, check=_check_choice)


def _check_speed(v: object) -> str | None:
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) and x > 0 for x in v):
        return None
    return f"expected [seconds a call, FLOP/s], two finite numbers > 0, got {v!r}"


# the best ``speeds`` measured on this machine, over processes: [seconds a call, FLOP/s]
SPEEDS = JsonCache("blas_speed", 1, check=_check_speed)


_threads_lock = threading.Lock()        # Blas.one_thread's setting of the library's thread count


def _after_fork_in_child() -> None:
    global _threads_lock
    _threads_lock = threading.Lock()    # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.lru_cache(maxsize=None)
def blas() -> "Blas | None":
    """The BLAS, or None where SciPy's cannot be loaded (generated kernels only)."""
    try:
        return Blas()
    except Exception:           # no SciPy, or one without these exports
        return None


@functools.lru_cache(maxsize=None)
def speeds() -> tuple[float, float]:
    """(seconds a call of a tiny GEMM costs through GemmProgram, FLOP/s of a SPEED_N-cubed GEMM on
    one thread): measured once per process the first time a contraction is planned (~3 ms; the
    median of 7 runs of 64 calls, and the best of 5 runs of the large product), and the best of that
    and what earlier processes measured on this machine (``blas_speed.json`` in the cache
    directory), which it keeps. Measured alone, a process that started in a slow minute of a shared
    2-vCPU Xeon took a 27 % slower rate and priced every library GEMM of its life by it: bench_model's
    matmul512 and BERT predicted 0.95 and 45.4 ms where other runs predicted 0.75 and 37.8."""
    call, rate = _measured_speeds()
    key = machine_id()
    seen = SPEEDS.get(key)
    best = (min(call, seen[0]), max(rate, seen[1])) if seen else (call, rate)
    if seen is None or tuple(seen) != best:
        SPEEDS.put(key, list(best))
    return best


def _measured_speeds() -> tuple[float, float]:
    lib = blas()
    out = []
    for n, calls, runs in ((2, 64, 7), (SPEED_N, 1, 5)):
        a, b, c = (np.ones((n, n), np.float32) for _ in range(3))
        g = Gemm(n, n, n, 1, 2, 0, 0, n, 1, n, 1, n, 1, ((calls, 0, 0, 0),) if calls > 1 else ())
        prg = GemmProgram("speed", g, (0, 1, 2), lib, 1)
        ptrs = (c.ctypes.data, a.ctypes.data, b.ctypes.data)
        prg(*ptrs, lo=0, hi=prg.units)
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            prg(*ptrs, lo=0, hi=prg.units)
            ts.append(time.perf_counter() - t0)
        out.append(sorted(ts)[runs // 2] / calls if calls > 1 else min(ts))
    return out[0], 2 * SPEED_N ** 3 / max(out[1], 1e-9)


def _capsule(cap: Any) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(cap, get_name(cap))


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", _VP), ("dli_sname", ctypes.c_char_p), ("dli_saddr", _VP)]


def _library_of(addr: int) -> ctypes.CDLL | None:
    """The shared library that holds ``addr`` (dladdr), opened again by its path."""
    try:
        libc = ctypes.CDLL(None)
        info = _DlInfo()
        libc.dladdr.argtypes = [_VP, ctypes.POINTER(_DlInfo)]
        if not libc.dladdr(_VP(addr), ctypes.byref(info)) or not info.dli_fname:
            return None
        return ctypes.CDLL(info.dli_fname.decode())
    except (OSError, AttributeError):
        return None


QUIET_TIMEOUT = "4"     # OPENBLAS_THREAD_TIMEOUT while eqgrad loads the library: workers sleep after 2^4 cycles


def _wheel_library() -> tuple[ctypes.CDLL | None, bool]:
    """The OpenBLAS a SciPy wheel ships (``scipy.libs/libscipy_openblas*.so`` beside the package),
    opened without importing SciPy (``scipy.linalg`` takes ~0.19 s to import, paid by every
    process that plans a contraction), and whether its threads sleep right after a call: where
    eqgrad is the first to load it, it does so with ``OPENBLAS_THREAD_TIMEOUT`` set (the library
    reads it once, when it is loaded; the variable is removed again), so that OpenBLAS's workers do
    not spin for ~0.1 s after each product on cores eqgrad's next kernels need. (None, False) where
    it is not there (SciPy from conda or a distribution links the system's BLAS, found through
    cython_blas instead)."""
    spec = importlib.util.find_spec("scipy")        # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None, False
    root = os.path.dirname(list(spec.submodule_search_locations)[0])
    first = "scipy.linalg" not in sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    for path in sorted(glob.glob(os.path.join(root, "scipy.libs", "libscipy_openblas*.so*"))):
        try:
            if first:
                os.environ["OPENBLAS_THREAD_TIMEOUT"] = QUIET_TIMEOUT
            try:
                return ctypes.CDLL(path), first
            finally:
                if first:
                    del os.environ["OPENBLAS_THREAD_TIMEOUT"]
        except OSError:
            continue
    return None, False


def _symbol(lib: ctypes.CDLL | None, *names: str) -> Any:
    for n in names:
        f = getattr(lib, n, None) if lib is not None else None
        if f is not None:
            return f
    return None


class Blas:
    """The BLAS SciPy is built with: sgemm and sgemv, and its thread controls where it has them."""

    def __init__(self) -> None:
        lib, self.quiet = _wheel_library()
        gemm, gemv = _symbol(lib, "scipy_sgemm_", "sgemm_"), _symbol(lib, "scipy_sgemv_", "sgemv_")
        if gemm is not None and gemv is not None:
            addr_gemm = ctypes.cast(gemm, _VP).value
            addr_gemv = ctypes.cast(gemv, _VP).value
        else:                   # a SciPy built against another BLAS: the one cython_blas names
            from scipy.linalg import cython_blas
            caps = cython_blas.__pyx_capi__
            addr_gemm, addr_gemv = _capsule(caps["sgemm"]), _capsule(caps["sgemv"])
            lib, self.quiet = _library_of(addr_gemm), False
        self.sgemm = ctypes.CFUNCTYPE(None, *([_VP] * 13))(addr_gemm)
        self.sgemv = ctypes.CFUNCTYPE(None, *([_VP] * 11))(addr_gemv)
        self._set_threads = _symbol(lib, "scipy_openblas_set_num_threads", "openblas_set_num_threads",
                                    "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_")
        self._set_local = _symbol(lib, "openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local")
        if self._set_local is not None:
            self._set_local.restype, self._set_local.argtypes = ctypes.c_int, [ctypes.c_int]
        corename = _symbol(lib, "scipy_openblas_get_corename", "openblas_get_corename")
        if corename is not None:
            corename.restype = ctypes.c_char_p
        self._corename = corename
        self._threads = 0

    def corename(self) -> str:
        """The name of the kernel set the library chose for this CPU (OpenBLAS), or ``unknown``."""
        return self._corename().decode() if self._corename is not None else "unknown"

    def one_thread(self, n: int = 1) -> int | None:
        """Make this thread's calls run on ``n`` OpenBLAS threads (1: the device's threads share
        the calls); returns what to restore (None: nothing). A library without a per-thread setting
        is set to one thread for all."""
        if self._set_local is not None:
            return self._set_local(n)
        if self._set_threads is not None and not self._threads:
            with _threads_lock:
                self._set_threads(ctypes.c_int(1))
                self._threads = 1
        return None

    def restore(self, prev: int | None) -> None:
        if prev is not None:
            self._set_local(prev)


class _Ref:
    """Arguments passed by reference, kept alive with their addresses."""

    def __init__(self) -> None:
        self.keep: list = []

    def int(self, v: int) -> int:
        c = ctypes.c_int(int(v))
        self.keep.append(c)
        return ctypes.addressof(c)

    def f32(self, v: float) -> int:
        c = ctypes.c_float(v)
        self.keep.append(c)
        return ctypes.addressof(c)

    def char(self, ch: str) -> int:
        c = ctypes.create_string_buffer(ch.encode())
        self.keep.append(c)
        return ctypes.addressof(c)


class GemmProgram:
    """A contraction kernel run by the BLAS: called as an LLVMProgram is, with the kernel's
    buffer pointers (its output first) and a range [lo, hi) of its ``units`` -- the calls: one per
    batch index, or, for fewer batch indices than ``threads``, one per block of rows (columns,
    where there are more of those) of each product, ``threads`` blocks, so the device's threads
    share a single product."""
    nontemporal = False
    nontemporal_stores = 0

    def __init__(self, name: str, g: Gemm, params: tuple[int, ...], lib: Blas, threads: int) -> None:
        self.name, self.gemm, self.lib = name, g, lib
        pos = (0, params.index(g.x), params.index(g.y))
        self.pos = pos
        offs = np.zeros((g.batches, 3), np.int64)
        if g.batch:
            idx = np.indices([e for e, *_ in g.batch]).reshape(len(g.batch), -1).T
            offs = idx @ np.array([[c, x, y] for _, c, x, y in g.batch], np.int64)
        offs[:, 1] += g.x_off
        offs[:, 2] += g.y_off
        self._ref = _Ref()
        self.ldc = g.sc_m if g.m > 1 else max(1, g.n)
        # blocks of the larger side, for the threads to share one product
        side = "m" if g.m >= g.n else "n"
        size = g.m if side == "m" else g.n
        # a single product: on the BLAS's threads where they sleep after a call (``Blas.quiet``),
        # else cut into blocks that the device's threads share (slower: 1024^2 100-130 GFLOP/s on
        # two threads against ~210)
        self.blas_threads = threads if g.batches < threads and lib.quiet else 1
        blocks = threads if g.batches < threads and size >= 2 * threads and not lib.quiet else 1
        cuts = [size * i // blocks for i in range(blocks + 1)]
        templates: dict[int, tuple] = {}
        units = []
        for b0, (oc, ox, oy) in enumerate(offs.tolist()):
            for lo, hi in zip(cuts, cuts[1:]):
                if side == "m":
                    d = (lo * self.ldc, lo * g.sx_m, 0)
                    shape = (hi - lo, g.n)
                else:
                    d = (lo, 0, lo * g.sy_n)
                    shape = (g.m, hi - lo)
                t = templates.get(shape[0] * 1_000_003 + shape[1])
                if t is None:
                    t = templates[shape[0] * 1_000_003 + shape[1]] = self._template(g, *shape)
                units.append((4 * (oc + d[0]), 4 * (ox + d[1]), 4 * (oy + d[2]), t))
        self._units = units
        self.units = len(units)
        self.kind = units[0][3][0] if units else "gemm"

    def _template(self, g: Gemm, M: int, N: int) -> tuple:
        """(kind, function, arguments with None where the pointers go, the slots of X, Y and C)."""
        r = self._ref
        one, zero = r.f32(1.0), r.f32(0.0)
        K = g.k
        if g.n == 1 or g.m == 1:
            # sgemv: y := op(A) x, A the matrix operand, x the vector one; op(A)[i, k] with A
            # stored column-major
            if g.n == 1:       # C[m] = X[m, :] . Y[:]
                rows, s_row, s_k, inc_v, inc_out, slots = M, g.sx_m, g.sx_k, g.sy_k, self.ldc, (4, 6, 9)
            else:              # C[n] = Y[:, n] . X[:]
                rows, s_row, s_k, inc_v, inc_out, slots = N, g.sy_n, g.sy_k, g.sx_k, 1, (6, 4, 9)
            how = lead(rows, K, s_row, s_k)
            assert how is not None, "match_contraction only gives operands with a unit stride"
            trans, lda = how
            m_, n_ = (rows, K) if trans == "N" else (K, rows)
            args = [r.char(trans), r.int(m_), r.int(n_), one, None, r.int(lda), None, r.int(max(1, inc_v)),
                    zero, None, r.int(max(1, inc_out))]
            return "gemv", self.lib.sgemv, args, slots
        a = lead(N, K, g.sy_n, g.sy_k)            # op(A) = Y^T: N x K
        b = lead(K, M, g.sx_k, g.sx_m)            # op(B) = X^T: K x M
        assert a is not None and b is not None, "match_contraction only gives operands with a unit stride"
        args = [r.char(a[0]), r.char(b[0]), r.int(N), r.int(M), r.int(K), one, None, r.int(a[1]), None,
                r.int(b[1]), zero, None, r.int(self.ldc)]
        return "gemm", self.lib.sgemm, args, (8, 6, 11)

    def __call__(self, *ptrs: int, lo: int, hi: int) -> None:
        pc, px, py = ptrs[self.pos[0]], ptrs[self.pos[1]], ptrs[self.pos[2]]
        if self.blas_threads > 1:
            spin.park()              # (the device's polling workers would take a core from the BLAS's)
        prev = self.lib.one_thread(self.blas_threads)
        try:
            for oc, ox, oy, (_, fn, tmpl, (sx, sy, sc)) in self._units[lo:hi]:
                args = list(tmpl)          # (a copy per call: the device's threads share the units)
                args[sx], args[sy], args[sc] = px + ox, py + oy, pc + oc
                fn(*args)
        finally:
            self.lib.restore(prev)
