"""Native worker threads for the LLVM device's split kernels: they poll for work instead of sleeping.

``LLVMDevice.launch`` cuts a large kernel's outermost loop into chunks that its threads run together
(cpu.py ``_split_run``). Handing a chunk to a Python pool thread that sleeps costs a wake-up of a
thread on another CPU, and on the 2-vCPU VMs eqgrad runs on that round trip measured 83-110 us
(the same CPU: 11-15 us; tests/test_spin.py's note) -- more than a 100 us kernel saves by running
on two cores, so a kernel that fits in the two cores' L2 caches together but not in one (a decode
step's 1536 x 576 matrix-vector product, 3.5 MB) ran at one core's L3 rate whatever the threads:
114 us on one thread, 150 split; OpenBLAS's sgemv, whose threads spin, 51 us.

Here the workers are native threads (``pthread_create``) running a loop compiled with llvmlite
once per process: each polls a generation counter (with ``pause``) for ``EQGRAD_SPIN_US``
microseconds after its last chunk, then sleeps on it (``futex``); ``run`` publishes a kernel (its
function pointer, buffer pointers and chunk bounds), wakes sleeping workers, runs chunks itself and
waits until every chunk has run -- all in native code, the GIL released for the whole run, so the
workers never touch Python. The same product: 33-36 us split.

Chunks: the caller's chunk ``c`` is in queue ``c % T`` (T threads, the caller thread 0); a thread
drains its own queue first, then takes what is left of the others'. A queue is one 64-bit word
(generation, count, next) claimed by compare-and-swap, so a worker that wakes late for a finished
generation finds nothing to claim, and a chunk is claimed exactly once; the kernel's description
is read only after a successful claim, while the caller still waits for that chunk. The same
thread takes the same chunks from run to run (its queue), so a kernel's working set stays in the
caches of the cores that ran it.

Linux on x86-64 only (``futex`` is system call 202 there, ``pause`` an x86 instruction); elsewhere
``available()`` is False and cpu.py keeps its Python pool. A kernel with more than ``MAX_ARGS``
pointer arguments, and the BLAS's programs, use that pool too. Workers exit at interpreter exit
(``atexit``: before the code they run is freed); a forked child starts its own on first use.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import platform
import sys
import threading
import time
from typing import Any

import llvmlite.binding as llvm

from eqgrad import config
from eqgrad.devices.llvm import COMPILE_LOCK

# the knob below: docs/lowering.md, Constants
MAX_ARGS = 64             # pointer arguments a kernel may take to run on the workers (buffers and the size array)
MAX_CHUNKS = 1 << 20      # chunks of one run: a queue word holds a count and an index of 20 bits each
JOIN_SECONDS = 10         # how long exit waits for a worker to stop (it takes microseconds) before leaving it
WORKER_STACK = 8 << 20    # bytes of each worker's stack: a kernel's row arrays (lower/indexing.py row_array_size) live there
_ATTR_BYTES = 64          # room for a pthread_attr_t (56 bytes on x86-64 glibc)

# context slots (int64): the generation (a 32-bit futex word in slot 0), chunks finished, the
# kernel (function, argument array, cuts array, argument count), sleeping workers, stop, the
# spin window (ns), threads; from slot 16 the queue words
_GEN, _FINISHED, _FN, _ARGS, _CUTS, _NARGS, _SLEEPERS, _STOP, _SPIN, _THREADS, _QUEUES = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16


def available() -> bool:
    """Whether this platform runs the native workers (Linux, x86-64)."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def _ir() -> str:
    """The workers' module: ``worker(arg)`` (arg: [context, thread index]) and ``run(context, m)``."""
    calls = []
    for n in range(1, MAX_ARGS + 1):
        loads = "\n".join(f"  %g{n}_{j} = getelementptr ptr, ptr %args, i64 {j}\n  %v{n}_{j} = load ptr, ptr %g{n}_{j}"
                          for j in range(n))
        params = ", ".join(f"ptr %v{n}_{j}" for j in range(n))
        calls.append(f"c{n}:\n{loads}\n  call void %fn({params}, i64 %lo, i64 %hi)\n  br label %done")
    cases = " ".join(f"i64 {n}, label %c{n}" for n in range(1, MAX_ARGS + 1))
    return f"""
declare i64 @syscall(i64, ...)
declare i32 @clock_gettime(i32, ptr)
declare void @llvm.x86.sse2.pause()

define internal i64 @now_ns() {{
  %ts = alloca [2 x i64]
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load i64, ptr %ts
  %p = getelementptr i64, ptr %ts, i64 1
  %n = load i64, ptr %p
  %m = mul i64 %s, 1000000000
  %t = add i64 %m, %n
  ret i64 %t
}}

define internal void @call_chunk(ptr %fn, ptr %args, i64 %n, i64 %lo, i64 %hi) {{
entry:
  switch i64 %n, label %done [ {cases} ]
{chr(10).join(calls)}
done:
  ret void
}}

; claim and run the chunks of queue %q (chunks q, q + T, q + 2T, ...) of generation %g
define internal void @drain(ptr %ctx, i64 %g, i64 %q, i64 %T) {{
entry:
  %qi = add i64 %q, {_QUEUES}
  %wp = getelementptr i64, ptr %ctx, i64 %qi
  %fp = getelementptr i64, ptr %ctx, i64 {_FINISHED}
  %gm = and i64 %g, 16777215
  br label %loop
loop:
  %w = load atomic i64, ptr %wp seq_cst, align 8
  %wg = lshr i64 %w, 40
  %same = icmp eq i64 %wg, %gm
  br i1 %same, label %chk, label %out
chk:
  %m0 = lshr i64 %w, 20
  %m = and i64 %m0, 1048575
  %k = and i64 %w, 1048575
  %more = icmp ult i64 %k, %m
  br i1 %more, label %claim, label %out
claim:
  %w1 = add i64 %w, 1
  %res = cmpxchg ptr %wp, i64 %w, i64 %w1 seq_cst seq_cst
  %ok = extractvalue {{ i64, i1 }} %res, 1
  br i1 %ok, label %run, label %loop
run:
  %kt = mul i64 %k, %T
  %c = add i64 %kt, %q
  %fnp = getelementptr i64, ptr %ctx, i64 {_FN}
  %fn = load ptr, ptr %fnp
  %ap = getelementptr i64, ptr %ctx, i64 {_ARGS}
  %args = load ptr, ptr %ap
  %cp = getelementptr i64, ptr %ctx, i64 {_CUTS}
  %cuts = load ptr, ptr %cp
  %np = getelementptr i64, ptr %ctx, i64 {_NARGS}
  %n = load i64, ptr %np
  %lop = getelementptr i64, ptr %cuts, i64 %c
  %lo = load i64, ptr %lop
  %c1 = add i64 %c, 1
  %hip = getelementptr i64, ptr %cuts, i64 %c1
  %hi = load i64, ptr %hip
  call void @call_chunk(ptr %fn, ptr %args, i64 %n, i64 %lo, i64 %hi)
  %x = atomicrmw add ptr %fp, i64 1 seq_cst
  br label %loop
out:
  ret void
}}

; thread %t's share of generation %g: its own queue, then the others'
define internal void @work(ptr %ctx, i64 %g, i64 %t) {{
entry:
  %Tp = getelementptr i64, ptr %ctx, i64 {_THREADS}
  %T = load i64, ptr %Tp
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %qt = add i64 %t, %i
  %q = urem i64 %qt, %T
  call void @drain(ptr %ctx, i64 %g, i64 %q, i64 %T)
  %i1 = add i64 %i, 1
  %again = icmp ult i64 %i1, %T
  br i1 %again, label %loop, label %out
out:
  ret void
}}

define void @worker(ptr %arg) {{
entry:
  %ctx = load ptr, ptr %arg
  %tp = getelementptr i64, ptr %arg, i64 1
  %t = load i64, ptr %tp
  ; generation 0, in which the workers are made: read from the context, a worker that started
  ; after its first run (or after stop) would wait for the one after it
  %seen0 = add i32 0, 0
  %sp = getelementptr i64, ptr %ctx, i64 {_SLEEPERS}
  %stp = getelementptr i64, ptr %ctx, i64 {_STOP}
  %snp = getelementptr i64, ptr %ctx, i64 {_SPIN}
  br label %wait
wait:
  %seen = phi i32 [ %seen0, %entry ], [ %g, %dowork ]
  %start = call i64 @now_ns()
  br label %spin
spin:
  %st = phi i64 [ %start, %wait ], [ %st, %pause ], [ %woke, %nosleep ]
  %cur = load atomic i32, ptr %ctx seq_cst, align 8
  %new = icmp ne i32 %cur, %seen
  br i1 %new, label %got, label %poll
poll:
  call void @llvm.x86.sse2.pause()
  call void @llvm.x86.sse2.pause()
  call void @llvm.x86.sse2.pause()
  call void @llvm.x86.sse2.pause()
  %now = call i64 @now_ns()
  %el = sub i64 %now, %st
  %lim = load atomic i64, ptr %snp seq_cst, align 8
  %over = icmp sge i64 %el, %lim
  br i1 %over, label %sleep, label %pause
pause:
  br label %spin
sleep:
  ; counted as sleeping before the generation is read again: a run that publishes after this
  ; read sees the count and wakes it; one that published before is seen here
  %s1 = atomicrmw add ptr %sp, i64 1 seq_cst
  %cur2 = load atomic i32, ptr %ctx seq_cst, align 8
  %still = icmp eq i32 %cur2, %seen
  br i1 %still, label %dosleep, label %nosleep
dosleep:
  %sv = zext i32 %seen to i64
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %ctx, i64 128, i64 %sv, ptr null, ptr null, i64 0)
  br label %nosleep
nosleep:
  %s2 = atomicrmw sub ptr %sp, i64 1 seq_cst
  %woke = call i64 @now_ns()
  br label %spin
got:
  %g = phi i32 [ %cur, %spin ]
  %stop = load atomic i64, ptr %stp seq_cst, align 8
  %halt = icmp ne i64 %stop, 0
  br i1 %halt, label %exit, label %dowork
dowork:
  %g64 = zext i32 %g to i64
  call void @work(ptr %ctx, i64 %g64, i64 %t)
  br label %wait
exit:
  ret void
}}

; ask the workers to exit: the stop flag, a new generation, every sleeper woken
define void @stop(ptr %ctx) {{
entry:
  %stp = getelementptr i64, ptr %ctx, i64 {_STOP}
  store atomic i64 1, ptr %stp seq_cst, align 8
  %g0 = load atomic i32, ptr %ctx seq_cst, align 8
  %g = add i32 %g0, 1
  store atomic i32 %g, ptr %ctx seq_cst, align 8
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %ctx, i64 129, i64 2147483647, ptr null, ptr null, i64 0)
  ret void
}}

; publish the kernel the caller wrote into the context as generation + 1 with %m chunks, run
; chunks on this thread too, and return when all %m have run
define void @run(ptr %ctx, i64 %m) {{
entry:
  %g0 = load atomic i32, ptr %ctx seq_cst, align 8
  %g = add i32 %g0, 1
  %fp = getelementptr i64, ptr %ctx, i64 {_FINISHED}
  store atomic i64 0, ptr %fp seq_cst, align 8
  %g64 = zext i32 %g to i64
  %gm = and i64 %g64, 16777215
  %th = shl i64 %gm, 40
  %Tp = getelementptr i64, ptr %ctx, i64 {_THREADS}
  %T = load i64, ptr %Tp
  br label %pub
pub:
  %q = phi i64 [ 0, %entry ], [ %q1, %pub ]
  %left = sub i64 %m, %q
  %left1 = add i64 %left, %T
  %left2 = sub i64 %left1, 1
  %mq = udiv i64 %left2, %T
  %mm = shl i64 %mq, 20
  %w = or i64 %th, %mm
  %qi = add i64 %q, {_QUEUES}
  %wp = getelementptr i64, ptr %ctx, i64 %qi
  store atomic i64 %w, ptr %wp seq_cst, align 8
  %q1 = add i64 %q, 1
  %more = icmp ult i64 %q1, %T
  br i1 %more, label %pub, label %publish
publish:
  store atomic i32 %g, ptr %ctx seq_cst, align 8
  %sp = getelementptr i64, ptr %ctx, i64 {_SLEEPERS}
  %sl = load atomic i64, ptr %sp seq_cst, align 8
  %any = icmp sgt i64 %sl, 0
  br i1 %any, label %wake, label %go
wake:
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %ctx, i64 129, i64 2147483647, ptr null, ptr null, i64 0)
  br label %go
go:
  call void @work(ptr %ctx, i64 %g64, i64 0)
  br label %waitdone
waitdone:
  %f = load atomic i64, ptr %fp seq_cst, align 8
  %all = icmp uge i64 %f, %m
  br i1 %all, label %out, label %p
p:
  call void @llvm.x86.sse2.pause()
  br label %waitdone
out:
  ret void
}}
"""


class Workers:
    """``threads - 1`` native worker threads and the caller: ``run`` runs a compiled kernel's chunks
    on all of them. One run at a time (``try_run`` says False while another thread's run holds them)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        with COMPILE_LOCK:
            # (unoptimized: 18 ms to compile against 60 at -O2; it polls and hands out chunks, the
            # kernels it calls are optimized)
            target = llvm.Target.from_default_triple().create_target_machine(opt=0)
            mod = llvm.parse_assembly(_ir())
            mod.verify()
            self._engine = llvm.create_mcjit_compiler(mod, target)
            self._engine.finalize_object()
        self._ctx = (ctypes.c_int64 * (_QUEUES + threads))()
        self._ctx[_THREADS] = threads
        self.spin(config.SPIN_US.value)
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(self._engine.get_function_address("run"))
        self._stop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._engine.get_function_address("stop"))
        self._args = (ctypes.c_void_p * MAX_ARGS)()
        self._cuts = (ctypes.c_int64 * 1)()
        self._lock = threading.Lock()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._libc.pthread_timedjoin_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p]
        self._libc.pthread_attr_setstacksize.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        worker = self._engine.get_function_address("worker")
        # each worker's stack set, not the C library's default (glibc's follows RLIMIT_STACK, musl's is
        # 128 KB): a CPU kernel keeps its row arrays there, up to ROW_STASH_MAX floats each
        attr = (ctypes.c_char * _ATTR_BYTES)()
        err = self._libc.pthread_attr_init(attr)
        if not err:
            err = self._libc.pthread_attr_setstacksize(attr, WORKER_STACK)
            if err:
                self._libc.pthread_attr_destroy(attr)
        if err:
            raise OSError(err, f"pthread_attr: {os.strerror(err)}")
        self._pid = os.getpid()              # (close() below, on a failed start, reads it)
        self._threads: list[ctypes.c_ulong] = []
        self._worker_args = []
        for t in range(1, threads):
            arg = (ctypes.c_int64 * 2)(ctypes.addressof(self._ctx), t)
            tid = ctypes.c_ulong()
            err = self._libc.pthread_create(ctypes.byref(tid), attr, worker, ctypes.addressof(arg))
            if err:
                self._libc.pthread_attr_destroy(attr)
                self.close()
                raise OSError(err, f"pthread_create: {os.strerror(err)}")
            self._worker_args.append(arg)
            self._threads.append(tid)
        self._libc.pthread_attr_destroy(attr)

    def spin(self, us: int) -> None:
        """Poll for ``us`` microseconds after a chunk before sleeping (0: sleep at once)."""
        self._ctx[_SPIN] = int(us) * 1000

    def try_run(self, fn: int, ptrs: list[int] | tuple[int, ...], cuts: list[int]) -> bool:
        """Run the kernel at address ``fn`` (``fn(*ptrs, lo, hi)``) over chunks [cuts[c], cuts[c + 1])
        on the workers and this thread; False (nothing run) while another run holds them."""
        m = len(cuts) - 1
        if not 0 < m < MAX_CHUNKS or len(ptrs) > MAX_ARGS or not ptrs:
            raise ValueError(f"Workers.run: 1 to {MAX_CHUNKS - 1} chunks and 1 to {MAX_ARGS} pointers, "
                             f"got {m} and {len(ptrs)}")
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if len(self._cuts) < m + 1:
                self._cuts = (ctypes.c_int64 * (m + 1))()
            self._cuts[:m + 1] = cuts
            self._args[:len(ptrs)] = ptrs
            self.spin(config.SPIN_US.value)        # (the flag as it is now; undoes a park)
            ctx = self._ctx
            ctx[_FN], ctx[_ARGS], ctx[_CUTS], ctx[_NARGS] = (fn, ctypes.addressof(self._args),
                                                             ctypes.addressof(self._cuts), len(ptrs))
            self._run(ctypes.addressof(ctx), m)          # (the GIL released while it runs)
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the workers and wait for them (before the code they run is freed)."""
        if not self._threads or self._pid != os.getpid():
            self._threads = []
            return
        with self._lock:
            self._stop(ctypes.addressof(self._ctx))
            deadline = _Timespec(int(time.clock_gettime(time.CLOCK_REALTIME)) + JOIN_SECONDS, 0)
            for tid in self._threads:
                if self._libc.pthread_timedjoin_np(tid.value, None, ctypes.byref(deadline)):
                    _LEFT_RUNNING.append(self)    # (never freed: its code may still run)
            self._threads = []


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_WORKERS: Workers | None = None
_LEFT_RUNNING: list[Workers] = []
_FAILED: str | None = None
_MAKE_LOCK = threading.Lock()


def workers(threads: int) -> Workers | None:
    """This process's workers for ``threads`` threads (made on first use; None where the platform
    has none or making them failed, which cpu.py answers with its Python pool)."""
    global _WORKERS, _FAILED
    w = _WORKERS
    if w is not None and w.threads == threads and w._pid == os.getpid():
        return w
    if threads < 2 or _FAILED is not None or not available():
        return None
    with _MAKE_LOCK:
        w = _WORKERS
        if w is not None and w.threads == threads and w._pid == os.getpid():
            return w
        if w is not None:
            w.close()
            _WORKERS = None
        try:
            _WORKERS = Workers(threads)
        except Exception as e:                # (an llvmlite or libc without what it needs)
            _FAILED = f"{type(e).__name__}: {e}"
            return None
        return _WORKERS


def asleep() -> bool:
    """Whether a worker of this process is asleep now (past its polling window, or parked): the next
    split run wakes it, which on a VM costs a wake-up of the other CPU (cpu.py ``launch`` decides
    between one thread and the split separately for runs that find the workers so)."""
    w = _WORKERS
    return w is not None and w._pid == os.getpid() and w._ctx[_SLEEPERS] > 0


def park() -> None:
    """Let the workers sleep now instead of polling (before work that wants every core: the
    BLAS's own threads; the next run wakes them)."""
    w = _WORKERS
    if w is not None:
        w._ctx[_SPIN] = 0


def _close_at_exit() -> None:
    global _WORKERS
    if _WORKERS is not None:
        _WORKERS.close()
        _WORKERS = None


def _after_fork_in_child() -> None:
    # the parent's workers do not exist here; their context and code stay allocated (the parent's
    # memory, copied), never run, and new workers are made on first use
    global _WORKERS
    if _WORKERS is not None:
        _WORKERS._threads = []
        _LEFT_IN_CHILD.append(_WORKERS)
    _WORKERS = None


_LEFT_IN_CHILD: list[Any] = []
atexit.register(_close_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
