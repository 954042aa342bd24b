"""A plan's new kernels compiled two at a time: here and in a compile worker process.

Once saturation and extraction are fast, LLVM's O3 and codegen are most of a cold compile (the
MLP training step: ~0.6 of 1.3 s; a LLaMA-shaped 30-layer step: 9 of 19 s), the cost is per
kernel (30 kernels in one module: 5.8 s against 5.1 s one by one), and llvmlite cannot compile
in two threads of one process (one global LLVM context). So when a plan needs two or more new
kernels and ``EQGRAD_THREADS`` is above 1, a ``Batch`` hands them out one at a time, largest
first, to this process and to a worker (llvm_worker.py, run as a script that imports only
llvmlite: ready in ~0.15 s, started on the first such plan and kept for the process, like the
saturation worker). The worker runs the same ``compile_object`` as this process, so its object
code is the same bytes; it is loaded like object code from the disk cache (llvm.py
``LLVMProgram``). Any failure of the worker -- it died, hangs, answered with an error -- only
means this process compiles those kernels itself, and a worker that failed is started afresh
on the next plan.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection     # (not in _start: see _after_fork_in_child)
from typing import Callable

from eqgrad.counters import GlobalCounters
from eqgrad.devices import llvm_worker

Job = tuple[str, str, str, bool]          # (LLVM IR, function name, symbol, nontemporal)
Result = tuple[bytes, int]                # (object code, vector stores made non-temporal)
JOB_TIMEOUT = 300.0                       # seconds the worker may take for one kernel before it is given up (docs/lowering.md, Constants)


class CompilePool:
    """One worker process and its channel. A batch never fails because of the worker."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._ready = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()          # one plan's compile at a time uses the worker

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        try:
            # -S (no site module: ~35 ms of its start), with this process's sys.path to find llvmlite
            proc = subprocess.Popen([sys.executable, "-S", llvm_worker.__file__, str(r1), str(w2), json.dumps(sys.path)],
                                    pass_fds=(r1, w2),
                                    stdin=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        except BaseException:
            for fd in (r1, w1, r2, w2):
                os.close(fd)
            raise
        os.close(r1)
        os.close(w2)
        self._proc, self._ready = proc, False
        self._send, self._recv = Connection(w1, readable=False), Connection(r2, writable=False)

    def _running(self) -> bool:
        """Whether a worker runs (started here when none did); the caller holds the lock."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            try:
                self._start()
            except OSError:
                return False
        return True

    def close(self) -> None:
        """End the worker (a later plan starts another)."""
        proc, conns = self._proc, (self._send, self._recv)
        self._proc = self._send = self._recv = None
        if proc is not None and proc.poll() is None:
            try:
                conns[0].send(None)
                proc.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        for c in conns:
            if c is not None:
                c.close()

    def forget(self) -> None:
        """In a forked child: the parent's worker is not ours (closed here, never signalled)."""
        for c in (self._send, self._recv):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        if self._proc is not None:
            self._proc.returncode = 0          # not our child: never wait for it, never kill it
        self._proc = self._send = self._recv = None
        self._lock = threading.Lock()

    def _reply(self, rid: int | str) -> tuple[bool, object]:
        """The worker's answer to ``rid`` (or its ready message); raises EOFError when it is gone
        or does not answer within JOB_TIMEOUT."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while time.monotonic() < deadline:
            if self._recv.poll(0.05):
                got, ok, value = self._recv.recv()
                if got == rid:
                    return ok, value
                continue                        # an answer to a job given up earlier
            if self._proc.poll() is not None:
                raise EOFError("the compile worker exited")
        raise EOFError(f"the compile worker did not answer in {JOB_TIMEOUT:.0f} s")

    def _wait_ready(self, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until the worker has started (its first message); False when it failed, or as soon
        as ``give_up()`` says the wait is no longer worth it (the worker then gets ready alone)."""
        try:
            while not self._ready:
                if self._recv.poll(0.01):
                    got, _, _ = self._recv.recv()
                    self._ready = got == "ready"
                elif self._proc.poll() is not None:
                    raise EOFError("the compile worker exited")
                elif give_up():
                    return False
            return True
        except (EOFError, OSError, ValueError):
            self.close()
            return False

    def _remote(self, target: tuple[str, str], job: Job) -> Result | None:
        """One job compiled by the worker, or None (then it is compiled here)."""
        if not self._wait_ready():
            return None
        try:
            rid = next(self._ids)
            self._send.send((rid, target, job))
            ok, value = self._reply(rid)
        except (EOFError, OSError, ValueError):
            self.close()
            return None
        return value if ok else None           # (an error there: here it raises with its context)

    def batch(self, target: tuple[str, str], local: Callable[[Job], Result | None], worker: bool = True) -> "Batch":
        """A Batch of jobs for ``target``; with ``worker``, the worker takes part from the first job
        on (started then if it does not run) unless another thread's batch is using it."""
        return Batch(self, target, local, worker)

    def prestart(self) -> None:
        """Start the worker now if none runs and no batch uses it, without waiting for it: its
        start (~0.1-0.15 s: Python, llvmlite, LLVM's set-up) then overlaps the caller's
        saturation and extraction instead of the first kernels' compile."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._running()
        finally:
            self._lock.release()

    def _join(self) -> bool:
        """Take the worker for one batch (started if it does not run); False if it is busy or fails."""
        if not self._lock.acquire(blocking=False):
            return False
        if not self._running():
            self._lock.release()
            return False
        return True

    def compile_all(self, target: tuple[str, str], jobs: list[Job], local: Callable[[Job], Result]) -> list[Result]:
        """The object code of every job, in order (a Batch of them all)."""
        b = self.batch(target, local, worker=len(jobs) >= 2)
        for j in jobs:
            b.add(j)
        return b.finish()


class Batch:
    """Jobs compiled as they are added: the worker, once it is ready, takes the largest waiting job
    whenever it is free, while the caller goes on adding (lowering and rendering the next
    kernels); ``finish`` compiles what is still waiting here, largest first, waits for the
    worker's last, and compiles here whatever the worker did not deliver."""

    def __init__(self, pool: CompilePool, target: tuple[str, str], local: Callable[[Job], Result | None],
                 worker: bool) -> None:
        self.pool, self.target, self.local = pool, target, local
        self.jobs: list[Job] = []
        self.out: dict[int, Result | None] = {}
        self.waiting: list[int] = []
        self.missed: list[int] = []
        self.remote = 0
        self.closed = False
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.worker = worker                  # still to be asked for (on the first job)

    def add(self, job: Job) -> None:
        with self.cond:
            self.waiting.append(len(self.jobs))
            self.jobs.append(job)
            self.cond.notify()
        if self.worker:
            self.worker = False
            if self.pool._join():
                self.thread = threading.Thread(target=self._helper, name="eqgrad-compile", daemon=True)
                self.thread.start()

    def _take(self) -> int:
        """The largest waiting job (the caller holds ``cond``)."""
        i = max(self.waiting, key=lambda j: len(self.jobs[j][0]))
        self.waiting.remove(i)
        return i

    def _helper(self) -> None:
        try:
            # a worker still starting is not waited for once nothing is left for it
            if not self.pool._wait_ready(lambda: self.closed and not self.waiting):
                return
            while True:
                with self.cond:
                    while not self.waiting and not self.closed:
                        self.cond.wait()
                    if not self.waiting:
                        return
                    i = self._take()
                r = self.pool._remote(self.target, self.jobs[i])
                if r is None:
                    self.missed.append(i)
                    return
                self.out[i] = r
                self.remote += 1
        finally:
            self.pool._lock.release()

    def cancel(self) -> None:
        """Drop the waiting jobs and wait for the worker's current one (after an error)."""
        with self.cond:
            self.waiting.clear()
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()

    def finish(self) -> list[Result | None]:
        """The object code of every job added, in order (None where ``local`` gave None)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        try:
            while True:
                with self.cond:
                    if not self.waiting:
                        break
                    i = self._take()
                self.out[i] = self.local(self.jobs[i])
        except BaseException:
            with self.cond:
                self.waiting.clear()             # the worker stops after its current job
            raise
        finally:
            if self.thread is not None:
                self.thread.join()
        for i in self.missed:
            self.out[i] = self.local(self.jobs[i])
        GlobalCounters.kernels_compiled += self.remote
        return [self.out[i] for i in range(len(self.jobs))]


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def pool() -> CompilePool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = CompilePool()
            atexit.register(_pool.close)
        return _pool


def _after_fork_in_child() -> None:
    # The locks are made anew: a parent thread may have held one (a batch holds the pool's for as
    # long as it compiles, too long to hold across a fork). This module imports nothing in a
    # function, since a thread inside a first import at the fork would leave the module's import
    # lock held in the child.
    global _pool_lock
    _pool_lock = threading.Lock()
    if _pool is not None:
        _pool.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
