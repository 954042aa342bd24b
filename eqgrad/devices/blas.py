"""A library GEMM for the LLVM device's contraction kernels: the OpenBLAS that SciPy ships.

``lower/contraction.py`` reads a kernel body as a (batched) ``C = X @ Y`` with element strides;
here that becomes calls of the BLAS's ``sgemm`` (``sgemv`` when one side is a single row or
column: a decode step's matrix-vector products), one per batch index, through the function
pointers ``scipy.linalg.cython_blas`` exports -- SciPy's public, stable interface to the BLAS it
is built with, so no library path or symbol name is guessed. Those are the Fortran entry points
(column-major, every argument by reference): row-major ``C = X Y`` is column-major
``C^T = Y^T X^T``, so Y is the first operand. OpenBLAS picks its kernels for the CPU it runs on
(DYNAMIC_ARCH: ``corename()`` names the one in use), so nothing here is tuned to one machine.

Threads: OpenBLAS's own pool runs a single large GEMM on ``EQGRAD_THREADS`` threads; a batched
contraction that the device splits across its threads (cpu.py ``launch``) runs each piece on one
OpenBLAS thread (``openblas_set_num_threads_local`` where the library has it), so the two pools
do not oversubscribe the cores.

``EQGRAD_BLAS=0`` (config.py) turns it off: every contraction is a generated kernel.
"""
from __future__ import annotations

import ctypes
import functools
import threading
import time
from typing import Any

import numpy as np

from eqgrad.cache import JsonCache
from eqgrad.lower.contraction import Gemm, lead

_VP = ctypes.c_void_p

# The smallest GEMM side (rows of C or its columns) given to the BLAS: a "contraction" with one
# output element per batch index (a row's sum of squares, a dot product per row) is a reduction,
# which the generated kernel streams with no call per element.
GEMM_MIN = 2
SPEED_N = 256          # the side of the GEMM ``speeds`` times (34 MFLOP: ~0.2 ms at 150 GFLOP/s)


def pays(g: Gemm, predicted: float, threads: int) -> bool | None:
    """Whether the BLAS runs contraction ``g`` rather than a generated kernel, from two numbers
    measured on this machine (``speeds``): the cost of a call and the BLAS's rate. True for one
    product (no batch) whose arithmetic at that rate takes at least as long as a call (a matmul of
    43^3 and up, a matrix-vector product of 1536 x 576: 2-3x faster than the generated kernels at
    every size measured, docs/lowering.md). False where the calls cost more than their arithmetic
    and, with it, more than the cost model's ``predicted`` seconds for the generated kernel (many
    small products: attention over 15 tokens, 384 GEMMs of 15 x 15 x 32, lose by 4x on the calls
    alone), and for a reduction (one output per batch index). None for a batch of products large
    enough to pay for their calls: which is faster depends on the layout (attention over 128
    tokens: the BLAS 2.4x faster for q @ k^T, the generated kernel 2x faster for p @ v), so the
    device times both (``LLVMDevice._measured``, cached per machine)."""
    if max(g.m, g.n) < GEMM_MIN or blas() is None:
        return False
    call, rate = speeds(threads)
    per_call = g.flops / g.batches / rate
    if per_call < call:
        return g.batches * (call + per_call) < predicted
    return True if g.batches == 1 else None


def _check_choice(v: object) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {v!r}"


CHOICES = JsonCache("gemm", 1, check=_check_choice)     # measured: BLAS (true) or generated, per contraction


@functools.lru_cache(maxsize=None)
def _blas() -> "Blas | None":
    try:
        return Blas()
    except Exception:           # no SciPy, or one without these exports: generated kernels only
        return None


def blas() -> "Blas | None":
    """The BLAS, or None where SciPy's cannot be loaded."""
    return _blas()


@functools.lru_cache(maxsize=None)
def speeds(threads: int) -> tuple[float, float]:
    """(seconds a call of a tiny GEMM costs through GemmProgram, FLOP/s of a SPEED_N-cubed GEMM on
    ``threads`` threads), measured once per process the first time a contraction is planned
    (~3 ms): the median of 7 runs of 64 calls, and the best of 5 runs of the large product."""
    lib = blas()
    out = []
    for n, calls, runs in ((2, 64, 7), (SPEED_N, 1, 5)):
        a, b, c = (np.ones((n, n), np.float32) for _ in range(3))
        g = Gemm(n, n, n, 1, 2, 0, 0, n, 1, n, 1, n, 1, ((calls, 0, 0, 0),) if calls > 1 else ())
        prg = GemmProgram("speed", g, (0, 1, 2), lib, threads)
        ptrs = (c.ctypes.data, a.ctypes.data, b.ctypes.data)
        prg(*ptrs, lo=0, hi=g.batches)
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            prg(*ptrs, lo=0, hi=g.batches)
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


def _symbol(lib: ctypes.CDLL | None, *names: str) -> Any:
    for n in names:
        f = getattr(lib, n, None) if lib is not None else None
        if f is not None:
            return f
    return None


class Blas:
    """The BLAS SciPy is built with: sgemm and sgemv, and its thread controls where it has them."""

    def __init__(self) -> None:
        from scipy.linalg import cython_blas
        caps = cython_blas.__pyx_capi__
        self.sgemm = ctypes.CFUNCTYPE(None, *([_VP] * 13))(_capsule(caps["sgemm"]))
        self.sgemv = ctypes.CFUNCTYPE(None, *([_VP] * 11))(_capsule(caps["sgemv"]))
        lib = _library_of(_capsule(caps["sgemm"]))
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
        self._lock = threading.Lock()
        self._local = threading.local()

    def corename(self) -> str:
        """The name of the kernel set the library chose for this CPU (OpenBLAS), or ``unknown``."""
        return self._corename().decode() if self._corename is not None else "unknown"

    def threads(self, n: int) -> None:
        """Use ``n`` threads for one call (a no-op where the library has no thread control)."""
        if n != self._threads and self._set_threads is not None:
            with self._lock:
                self._set_threads(ctypes.c_int(n))
                self._threads = n

    def local_threads(self, n: int) -> None:
        """Threads for the calls of this thread only (a piece of a split batch: 1)."""
        if self._set_local is not None and getattr(self._local, "n", None) != n:
            self._set_local(n)
            self._local.n = n


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
    buffer pointers (its output first) and a range [lo, hi) of batch indices."""
    nontemporal = False
    nontemporal_stores = 0

    def __init__(self, name: str, g: Gemm, params: tuple[int, ...], lib: Blas, threads: int) -> None:
        self.name, self.gemm, self.lib, self.threads = name, g, lib, threads
        self.batches = g.batches
        self.pos = (0, params.index(g.x), params.index(g.y))
        offs = np.zeros((self.batches, 3), np.int64)
        if g.batch:
            idx = np.indices([e for e, *_ in g.batch]).reshape(len(g.batch), -1).T
            offs = idx @ np.array([[c, x, y] for _, c, x, y in g.batch], np.int64)
        offs[:, 1] += g.x_off
        offs[:, 2] += g.y_off
        self.offs = (offs * 4).tolist()           # bytes (float32)
        r = self._ref = _Ref()
        one, zero = r.f32(1.0), r.f32(0.0)
        M, N, K = g.m, g.n, g.k
        ldc = g.sc_m if M > 1 else max(1, N)
        if N == 1 or M == 1:
            # sgemv: y := op(A) x, A the matrix operand, x the vector one
            if N == 1:       # C[m] = X[m, :] . Y[:]
                mat, vec, rows, s_row, s_k, inc_v, inc_out = 1, 2, M, g.sx_m, g.sx_k, g.sy_k, ldc
            else:            # C[n] = Y[:, n] . X[:]
                mat, vec, rows, s_row, s_k, inc_v, inc_out = 2, 1, N, g.sy_n, g.sy_k, g.sx_k, 1
            # op(A)[i, k] with A stored column-major
            how = lead(rows, K, s_row, s_k)
            assert how is not None, "match_contraction only gives operands with a unit stride"
            trans, lda = how
            m_, n_ = (rows, K) if trans == "N" else (K, rows)
            self.kind = "gemv"
            self.order = (mat, vec)
            self.args = [r.char(trans), r.int(m_), r.int(n_), one, None, r.int(lda), None, r.int(max(1, inc_v)),
                         zero, None, r.int(max(1, inc_out))]
            self.fn = lib.sgemv
        else:
            a = lead(N, K, g.sy_n, g.sy_k)            # op(A) = Y^T: N x K
            b = lead(K, M, g.sx_k, g.sx_m)            # op(B) = X^T: K x M
            assert a is not None and b is not None, "match_contraction only gives operands with a unit stride"
            self.kind = "gemm"
            self.args = [r.char(a[0]), r.char(b[0]), r.int(N), r.int(M), r.int(K), one, None, r.int(a[1]), None,
                         r.int(b[1]), zero, None, r.int(ldc)]
            self.fn = lib.sgemm

    def __call__(self, *ptrs: int, lo: int, hi: int) -> None:
        lib, args, fn, offs = self.lib, self.args, self.fn, self.offs
        if hi - lo < self.batches:
            lib.local_threads(1)                  # a piece of a batch split across the device's threads
        else:
            lib.local_threads(self.threads)
            lib.threads(self.threads)
        pc, px, py = ptrs[self.pos[0]], ptrs[self.pos[1]], ptrs[self.pos[2]]
        if self.kind == "gemm":
            for b in range(lo, hi):
                oc, ox, oy = offs[b]
                args[6], args[8], args[11] = py + oy, px + ox, pc + oc
                fn(*args)
        else:
            mat_is_x = self.order[0] == 1
            for b in range(lo, hi):
                oc, ox, oy = offs[b]
                pm, pv = (px + ox, py + oy) if mat_is_x else (py + oy, px + ox)
                args[4], args[6], args[9] = pm, pv, pc + oc
                fn(*args)
