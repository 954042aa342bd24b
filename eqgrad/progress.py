"""Progress of long compiles: a compile that takes more than ``EQGRAD_PROGRESS`` seconds (2 by
default; 0 turns it off) says what it is doing -- the phase (saturating, extracting, compiling
kernels), its sizes (ops, e-nodes, e-classes, plan evaluations, kernels done) and the time so far.

On a terminal (stderr is a TTY) the status is one line that tqdm keeps up to date (a bar while
kernels compile); otherwise, or without tqdm, a log line on stderr every few seconds and one when
the compile ends. Nothing is shown for compiles shorter than the delay, so short programs and
the test suite stay quiet.

The stages report into the compile of the running thread without knowing who shows it::

    with progress.compiling(f"{len(prog.nodes)} ops"):   # the engine, around one compile
        progress.phase("saturating")
        ...
        progress.update(evaluations=n)                  # the extractor, as it goes

A thread (one per compile, started only when the delay is not 0) wakes twice a second; the
reporting calls only store numbers, so they cost nothing when no one is looking.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from typing import Any, Iterator

from eqgrad import config

LOG_EVERY = 5.0          # seconds between log lines when no terminal is attached


class Progress:
    """The state of one compile; shown by its ticker thread once ``delay`` seconds have passed."""

    def __init__(self, what: str, delay: float, stream: Any = None) -> None:
        self.what, self.delay = what, delay
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        self.phase_name = "starting"
        self.info: dict[str, Any] = {}
        self.total: int | None = None          # of the phase's counted work (kernels), for a bar
        self.done = 0
        self._stop = threading.Event()
        self._shown = False
        self._last_log = 0.0
        self._bar: Any = None
        self._thread = threading.Thread(target=self._tick, name="eqgrad-progress", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ what the stages call
    def phase(self, name: str, total: int | None = None, **info: Any) -> None:
        self.phase_name, self.total, self.done = name, total, 0
        self.info.update(info)

    def update(self, done: int | None = None, **info: Any) -> None:
        if done is not None:
            self.done = done
        self.info.update(info)

    # ------------------------------------------------------------------ showing it
    def status(self) -> str:
        parts = [f"{v:,} {_label(k)}" if isinstance(v, int) else f"{_label(k)} {v}" for k, v in self.info.items()]
        if self.total:
            parts.append(f"{self.done}/{self.total}")
        return (f"eqgrad: compiling {self.what}: {self.phase_name}"
                + (f" ({', '.join(parts)})" if parts else "") + f", {time.perf_counter() - self.t0:.1f} s")

    def _tty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def _show(self, final: bool = False) -> None:
        now = time.perf_counter() - self.t0
        if self._bar is None and self._tty():
            try:
                from tqdm import tqdm      # optional (the tune/examples extras): a plain line without it
                self._bar = tqdm(total=None, file=self.stream, bar_format="{desc}", leave=True)
            except ImportError:
                self._bar = False
        if self._bar is not None and self._bar is not False:      # (a tqdm without a total has no bool)
            self._bar.set_description_str(self.status(), refresh=True)
            if final:
                self._bar.close()
        elif final or now - self._last_log >= LOG_EVERY or not self._shown:
            print(self.status(), file=self.stream, flush=True)
            self._last_log = now
        self._shown = True

    def _tick(self) -> None:
        while not self._stop.wait(min(0.5, max(0.02, self.delay / 2))):
            if time.perf_counter() - self.t0 >= self.delay:
                self._show()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._shown:
            if self.total:
                self.info["kernels"], self.total = self.total, None
            self.phase_name = "done"
            self._show(final=True)


def _label(key: str) -> str:
    """``e_nodes`` -> "e-nodes", ``plan_evaluations`` -> "plan evaluations"."""
    return key.replace("e_", "e-", 1).replace("_", " ") if key.startswith("e_") else key.replace("_", " ")


_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("eqgrad_progress", default=None)


@contextlib.contextmanager
def compiling(what: str) -> Iterator[Progress | None]:
    """Track one compile in this thread (nested compiles -- the measured extractor timing its
    candidates -- report into the outer one)."""
    delay = config.PROGRESS.value
    if delay == 0 or _current.get() is not None:
        yield _current.get()
        return
    p = Progress(what, delay)
    token = _current.set(p)
    try:
        yield p
    finally:
        _current.reset(token)
        p.close()


def phase(name: str, total: int | None = None, **info: Any) -> None:
    """The running compile (if any) entered phase ``name``; ``total``: its count of work items."""
    p = _current.get()
    if p is not None:
        p.phase(name, total, **info)


def update(done: int | None = None, **info: Any) -> None:
    """Numbers of the running compile's current phase (work items done, sizes)."""
    p = _current.get()
    if p is not None:
        p.update(done, **info)
