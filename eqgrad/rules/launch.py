"""Starting the saturation worker (worker.py), as early as ``import eqgrad`` can.

A first realize waits for the worker: a Python process that loads egglog's extension and then
the IR and the rules. So ``import eqgrad`` starts it before anything else it imports (``prestart``,
from ``eqgrad/__init__.py``): the worker loads egglog while the parent imports the rest of eqgrad
(~0.1 s), and the first ``Saturator`` to need a worker adopts this one (``take``) and sends it the
texts to load. Until then the worker waits for them; a process that never saturates closes the
pipe when it ends, and the worker ends with it (and removes its directory).

This module imports only what ``eqgrad.config`` imports already, so that the start comes first.
"""
from __future__ import annotations

import os
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
        _discard(early)
        return None
    return early


def _discard(early: Started) -> None:
    proc, tmp, send, conn = early
    for c in (send, conn):
        c.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)


def _after_fork_in_child() -> None:
    """A forked child never adopts its parent's prestarted worker: it closes its copies of the
    pipe (so that the worker still ends with the parent) and starts its own on first use."""
    global _early
    early, _early = _early, None
    if early is not None:
        early[0].returncode = 0        # not our child: never wait for it, never kill it
        for c in early[2:]:
            try:
                c.close()
            except OSError:
                pass


os.register_at_fork(after_in_child=_after_fork_in_child)
