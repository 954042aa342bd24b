"""Starting the saturation worker (worker.py), as early as ``import eqgrad`` can.

A first realize waits for the worker: a Python process that loads egglog's extension and then
the IR and the rules. So ``import eqgrad`` starts it before anything else it imports (``prestart``,
from ``eqgrad/__init__.py``): the worker loads egglog while the parent imports the rest of eqgrad
(~0.1 s), and the first ``Saturator`` to need a worker adopts this one (``take``) and sends it the
texts to load. Until then the worker waits for them; a process that never saturates closes the
pipe when it ends, and the worker ends with it (and removes its directory).

This module imports only config and the standard modules config loads (and tempfile, which brings
shutil), so that the start comes first.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from eqgrad import config
from eqgrad.rules.worker import Channel

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")

Started = tuple  # (subprocess.Popen, temporary directory, Channel to the worker, Channel from it)


def start() -> Started:
    """A new worker process and its channel.

    A plain subprocess, not multiprocessing: spawn/forkserver would re-import the user's __main__
    in the worker, and fork would copy LLVM's and the caller's threads. The worker is a script that
    imports nothing of eqgrad, started with -S (no site module: the venv's .pth files, the
    editable install's finder) and the parent's sys.path, in its own temporary directory, so that
    nothing in the caller's working directory can shadow what it imports."""
    tmp = tempfile.mkdtemp(prefix="eqgrad-egg-")
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-S", WORKER, str(r1), str(w2), tmp, *sys.path],
                                pass_fds=(r1, w2), stdin=subprocess.DEVNULL, cwd=tmp)
    except BaseException:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
        os.rmdir(tmp)
        raise
    os.close(r1)
    os.close(w2)
    return proc, tmp, Channel(w1), Channel(r2)


_early: Started | None = None


def prestart() -> None:
    """Called first by ``import eqgrad``: start a worker for the first saturation to adopt. Not
    with EQGRAD_PRESTART=0 or EQGRAD_OPT=0, and not in a ``multiprocessing`` child, where a pool
    of workers that import eqgrad would each start one (the child imported multiprocessing before
    eqgrad, so that check costs no import). Never raises: a worker that cannot start now (or a
    flag that does not parse) is reported at the first saturation, as without a prestart."""
    global _early
    try:
        mp = sys.modules.get("multiprocessing")
        if _early is None and config.PRESTART.value and config.OPT.value \
                and (mp is None or mp.parent_process() is None):
            _early = start()
    except Exception:
        pass


def prestarted() -> bool:
    return _early is not None


def take() -> Started | None:
    """The prestarted worker, once (None if there is none or it has died)."""
    global _early
    early, _early = _early, None
    if early is not None and early[0].poll() is not None:
        end(early)
        return None
    return early


def end(started: Started) -> None:
    """Kill the worker if it still runs, close its channel and remove its directory (a part that
    is None is skipped)."""
    proc, tmp, send, conn = started
    try:
        for c in (send, conn):
            if c is not None:
                c.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def forget(started: Started) -> None:
    """In a forked child: drop the parent's worker without touching it (no message, no kill, its
    directory stays): the child's copies of the pipe ends are closed, so the worker still ends
    with the parent."""
    proc, _, send, conn = started
    for c in (send, conn):
        if c is not None:
            try:
                c.close()
            except OSError:
                pass
    if proc is not None:
        proc.returncode = 0        # not our child: never wait for it, never kill it


def _after_fork_in_child() -> None:
    """A forked child never adopts its parent's prestarted worker; it starts its own on first use."""
    global _early
    early, _early = _early, None
    if early is not None:
        forget(early)


os.register_at_fork(after_in_child=_after_fork_in_child)
