"""Run the rulebook schedule on a program, bounded, in a worker process.

egglog 13.2.0 has no timeout, cannot be interrupted, and aborts the whole process when an
allocation fails (docs/rulebooks.md, "The schedule"). So every saturation runs in a long-lived
worker process (spawned once, reused) with an address-space rlimit; the parent waits with a
wall-clock timeout and kills the worker when it is exceeded. Phases of the schedule run one at a
time; after each, the worker checks the e-graph size against the node limit and stops early if it
is exceeded. The e-graph of the last finished phase is always a valid e-graph of the program, so
an early stop still gives correct (less optimized) plans. When the worker dies or times out the
caller falls back to the unoptimized plan and warns. The timeout (EQGRAD_SATURATION_TIMEOUT) counts
from when the worker is ready: a new worker's start (every process's first, and the one after a
kill) is bounded on its own by STARTUP_LIMIT and reported as ``SaturationReport.startup``.

The channel: every request carries an id that its reply echoes; a reply to an earlier request is
discarded. A request that is interrupted on the parent side (Ctrl-C, a signal handler raising)
ends the worker: it may still be saturating the abandoned request and the pipe may hold half a
message, so the next request starts a fresh worker on a clean channel. The worker ignores SIGINT
(a terminal's Ctrl-C reaches the whole process group): its lifetime is the parent's business.
Rulebooks and schedule phases are sent as text (validated by the parent, checked again here
against egglog's own parse: no command that reads or writes a file). The worker's temporary
directory is made by the parent and removed by whichever of the two ends last (a killed worker's
by the parent). After ``os.fork()`` the child forgets the parent's worker (without touching it)
and starts its own on first use.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import subprocess
import sys
import threading
import weakref
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eqgrad import config
from eqgrad.rules.book import BUILTIN_RULEBOOKS, REALIZE_SUFFIX, RULEBOOK_DIR, base_name, RuleConfig, builtin_config, split_schedule
from eqgrad.rules.families import generated_rulebooks
from eqgrad.rules.ir import declarations
from eqgrad.rules import launch
from eqgrad.rules.worker import Channel

SCHEDULE = "schedule.egg"

# Seconds a new worker may take, from the request that waits for it, to be ready (its Python start,
# egglog's extension, the IR and the rules: ~0.15-0.35 s here, more on a loaded machine or a cold
# disk). Not part of EQGRAD_SATURATION_TIMEOUT, which covers the saturation alone and starts when the
# worker is ready: a request waits at most STARTUP_LIMIT + EQGRAD_SATURATION_TIMEOUT (docs/env.md).
STARTUP_LIMIT = 10.0

# The bytes (program text and e-graph JSON, as characters) of the saturations a Saturator keeps for
# ``run(memo=True)``, least recently used dropped first. A bound on memory, not a tuning knob: the
# test suite's op files saturate ~900 distinct programs a process at 1-60 KB of JSON each (the same
# programs again on NUMPY, LLVM and OPENCL: 56 % of their saturations); a 30-layer decoder's whole
# program is a few MB.
SATURATED_BYTES = 64 << 20


@dataclass
class IterationStats:
    """One egglog iteration of a phase (one ruleset run once): what each rule matched (the rules
    that matched only), the search-and-apply, merge and rebuild seconds, whether it changed the
    e-graph (egglog 13.2's bindings report every time as 0). In trace mode (``Saturator.run(trace=True)``,
    DEBUG>=4) also the ruleset, the e-nodes after it and ``wall``, the seconds its run took; ``whole``:
    it ran inside a ``run-schedule`` that trace mode could not split (one that uses ``let-scheduler``),
    whose size and time are known after its last iteration only."""
    matches: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    rebuild: float = 0.0
    merge: float = 0.0
    changed: bool = True
    ruleset: str = ""
    enodes: int | None = None
    whole: bool = False
    wall: float | None = None


@dataclass
class PhaseReport:
    name: str
    seconds: float
    iterations: int
    enodes: int
    matches: dict[str, int] = field(default_factory=dict)
    rule_seconds: dict[str, float] = field(default_factory=dict)
    per_iteration: list[IterationStats] = field(default_factory=list)
    traced: bool = False             # run step by step, e-nodes measured per iteration (IterationStats)

    def __post_init__(self):
        # from the worker (and the disk cache: dataclasses.asdict) the iterations come as dicts;
        # a malformed one raises TypeError, which the disk cache takes for a bad file
        self.per_iteration = [s if isinstance(s, IterationStats) else IterationStats(**s)
                              for s in self.per_iteration]


@dataclass
class SaturationReport:
    stop_reason: str                 # "completed", "node limit", "timeout", "worker died", "error", "cached"
    phases: list[PhaseReport] = field(default_factory=list)
    enodes_before: int = 0
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0             # the whole request, start-up included
    detail: str = ""
    startup: float = 0.0             # of ``seconds``, the wait for a new worker to be ready (STARTUP_LIMIT)
    reused: bool = False             # the answer of an earlier run of the same request (run(memo=True))

    @property
    def ok(self) -> bool:
        return self.stop_reason in ("completed", "node limit")

    @property
    def matches(self) -> dict[str, int]:
        """Matches per rule name, over all phases (a user rule's through-Realize variants,
        ``NAME~realizeK``, and the rank expansions of a rank-generic rule, ``NAME@rankR``, count as NAME:
        rulebook.through_realize, ranks.py)."""
        out: dict[str, int] = {}
        for p in self.phases:
            for k, v in p.matches.items():
                k = base_name(k, REALIZE_SUFFIX)
                out[k] = out.get(k, 0) + v
        return out

    @property
    def rule_matches(self) -> dict[str, int]:
        """Matches per rule as its author named it: ``matches`` with a birewrite's two directions
        (egglog's ``NAME=>`` and ``NAME<=``) added into NAME (the soundness checker reads them apart)."""
        out: dict[str, int] = {}
        for k, v in self.matches.items():
            k = k[:-2] if k.endswith(("=>", "<=")) else k
            out[k] = out.get(k, 0) + v
        return out

    @property
    def rule_seconds(self) -> dict[str, float]:
        """Search-and-apply time per rule name, over all phases (variants as in ``matches``)."""
        out: dict[str, float] = {}
        for p in self.phases:
            for k, v in p.rule_seconds.items():
                k = base_name(k, REALIZE_SUFFIX)
                out[k] = out.get(k, 0.0) + v
        return out

    def __str__(self) -> str:
        lines = [f"saturation: {self.stop_reason}{' (' + self.detail + ')' if self.detail else ''}; "
                 f"{self.enodes_before} -> {self.enodes} e-nodes, {self.eclasses} e-classes, {self.seconds*1e3:.1f} ms"
                 + (f" ({self.startup*1e3:.1f} ms of it starting the worker)" if self.startup else "")
                 + ("; reused: the same program saturated earlier in this process" if self.reused else "")]
        for p in self.phases:
            lines.append(f"  phase {p.name:<9} {p.seconds*1e3:8.2f} ms  {p.iterations:3d} iterations  {p.enodes:7d} e-nodes")
        fired = sorted(((v, k) for k, v in self.matches.items() if v), reverse=True)
        if fired:
            lines.append("  matches: " + ", ".join(f"{k}={v}" for v, k in fired[:24]) + (" ..." if len(fired) > 24 else ""))
        return "\n".join(lines)

    @property
    def traced(self) -> bool:
        return any(p.traced for p in self.phases)

    def growth_rows(self) -> list[dict]:
        """The e-graph's growth, one row per egglog iteration of every phase: phase, iteration (from
        1 in its phase), ruleset and e-nodes after it (trace mode; None otherwise, and for the
        iterations inside a run-schedule trace mode ran whole but its last), delta (e-nodes since the
        last measured size: the phase's start, the previous phase's end), matches (its total),
        top (its rules that matched, most first), changed, whole, seconds (trace mode: the run's wall
        time, which for ``whole`` rows is the unsplit command's, on its last row; otherwise egglog's own,
        None while it reports 0).
        After each phase's iterations, a row with iteration None: the phase's end (e-nodes after it)."""
        rows: list[dict] = []
        prev = self.enodes_before
        for p in self.phases:
            for i, it in enumerate(p.per_iteration, 1):
                delta = None if it.enodes is None else it.enodes - prev
                prev = prev if it.enodes is None else it.enodes
                rows.append(dict(phase=p.name, iteration=i, ruleset=it.ruleset, enodes=it.enodes, delta=delta,
                                 matches=sum(it.matches.values()), changed=it.changed, whole=it.whole,
                                 top=sorted(((k, v) for k, v in it.matches.items() if v), key=lambda kv: (-kv[1], kv[0])),
                                 seconds=it.wall if it.wall is not None else (it.seconds + it.merge + it.rebuild) or None))
            rows.append(dict(phase=p.name, iteration=None, ruleset="", enodes=p.enodes, delta=p.enodes - prev,
                             matches=sum(p.matches.values()), changed=None, whole=False,
                             top=sorted(((k, v) for k, v in p.matches.items() if v), key=lambda kv: (-kv[1], kv[0])),
                             seconds=p.seconds))
            prev = p.enodes
        return rows

    def growth(self, top: int = 3, quiet: bool = False) -> str:
        """``growth_rows`` as a table: per phase, its iterations (e-nodes and delta where traced),
        the top ``top`` rules by matches of each, and the phase's end; runs of iterations that matched
        nothing are folded into one line unless ``quiet``. Where trace mode ran a run-schedule
        whole (let-scheduler), its iterations have no sizes: the note says so."""
        def num(v, signed=False):
            return "" if v is None else (f"{v:+,d}" if signed else f"{v:,d}")

        head = f"  {'phase':<10} {'iter':>5} {'ruleset':<12} {'e-nodes':>11} {'delta':>11} {'matches':>9} {'ms':>8}  top rules"
        lines = [f"e-graph growth per iteration ({'traced: e-nodes after each iteration' if self.traced else 'e-nodes per phase only; trace mode (DEBUG>=4, Saturator.run(trace=True)) measures each iteration'}); "
                 f"{self.enodes_before:,d} e-nodes before", head]
        idle = 0

        def flush():
            nonlocal idle
            if idle:
                lines.append(f"  {'':<10} {'':>5} ... {idle} iteration{'s' if idle > 1 else ''} without matches")
            idle = 0

        unsplit: set[str] = set()
        for r in self.growth_rows():
            if r["iteration"] is not None and not quiet and r["matches"] == 0 and not r["delta"] \
                    and not (r["whole"] and r["enodes"] is not None):
                idle += 1
                continue
            flush()
            tops = ", ".join(f"{k}={v:,d}" for k, v in r["top"][:top]) + (" ..." if len(r["top"]) > top else "")
            ms = "" if r["seconds"] is None else f"{r['seconds']*1e3:.2f}"
            if r["iteration"] is None:
                lines.append(f"  {r['phase']:<10} {'end':>5} {'':<12} {num(r['enodes']):>11} {num(r['delta'], True):>11} "
                             f"{r['matches']:>9,d} {ms:>8}  {tops}")
                continue
            if r["whole"]:
                unsplit.add(r["phase"])
            ruleset = "(unsplit)" if r["whole"] else r["ruleset"][:12]
            lines.append(f"  {r['phase']:<10} {r['iteration']:>5} {ruleset:<12} {num(r['enodes']):>11} "
                         f"{num(r['delta'], True):>11} {r['matches']:>9,d} {ms:>8}  {tops}")
        flush()
        if unsplit:
            lines.append(f"  phases {', '.join(sorted(unsplit))}: a run-schedule with a scheduler (let-scheduler) runs "
                         "whole in trace mode (its state lives in one command): e-nodes after its last iteration only")
        if self.stop_reason == "node limit":
            lines.append(f"  stopped: {self.detail}")
        return "\n".join(lines)


# ------------------------------------------------------------------ parent side

class Saturator:
    """Owns one worker process; ``run`` is synchronous and always returns within the timeout.
    Safe to share between threads (one request at a time) and across ``os.fork()``."""

    def __init__(self, rulebooks: list[Path] | None = None, schedule: Path | None = None):
        """By default each run uses the built-in rules (``book.builtin_config``; the engine passes its active ones);
        ``rulebooks``/``schedule`` pin a fixed one instead (tests, the soundness checker): the files
        are read once, here."""
        self.fixed = None
        if rulebooks is not None or schedule is not None:
            self.fixed = RuleConfig(tuple(str(p) for p in (rulebooks or [RULEBOOK_DIR / r for r in BUILTIN_RULEBOOKS])),
                                    str(schedule or RULEBOOK_DIR / SCHEDULE))
        self._proc: subprocess.Popen | None = None
        self._conn: Channel | None = None
        self._send: Channel | None = None
        self._tmp: str | None = None              # the worker's temporary directory
        self._mem: int | None = None              # the memory limit the worker was started with
        self._unanswered = False                  # started, and no reply yet: still importing egglog
        self._idle = False                        # a request's idle callback is running (working())
        self._lock = threading.Lock()             # one request at a time on the channel
        self._ids = itertools.count(1)
        # run(memo=True)'s answers: request -> (JSON, report), least recently used first; their bytes
        self._saturated: dict[tuple, tuple[str, SaturationReport]] = {}
        self._saturated_bytes = 0
        self._memo_lock = threading.Lock()
        _instances.add(self)

    @property
    def pid(self) -> int | None:
        """The worker's process id (None while no worker runs)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        # the worker ``import eqgrad`` started (launch.py), or a new one; either is loading egglog
        # and waits for the texts it is to load
        proc, tmp, send, conn = launch.take() or launch.start()
        self._proc, self._tmp, self._send, self._conn = proc, tmp, send, conn
        self._mem = config.EGRAPH_MEMORY.value     # the worker's rlimit is set once, at its start
        self._send.send((self._mem, declarations(), generated_rulebooks(),
                         tuple(map(tuple, (self.fixed or builtin_config()).books))))
        self._unanswered = True

    def close(self) -> None:
        """End the worker (it is started again on the next request)."""
        with self._lock:
            self._close_unlocked()

    def _close_unlocked(self) -> None:
        if self._proc is not None and not self._unanswered:      # still starting: nothing to finish
            try:
                self._send.send(None)
                self._proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def _kill(self) -> None:
        """Kill the worker (if any), close the channel and remove the worker's directory. The state
        is cleared first, so an interrupt in here still leaves a clean start for the next request."""
        started = (self._proc, self._tmp, self._send, self._conn)
        self._proc = self._conn = self._send = self._tmp = None
        launch.end(started)

    def _forget(self) -> None:
        """In a forked child: drop the parent's worker without touching it (launch.forget); the
        child starts its own worker on first use."""
        launch.forget((self._proc, self._tmp, self._send, self._conn))
        self._proc = self._conn = self._send = self._tmp = None
        self._lock = threading.Lock()      # a parent thread may have held it at the fork
        self._memo_lock = threading.Lock()

    def _request(self, kind: str, args: tuple, timeout: float,
                 idle: Callable[[], None] | None = None) -> dict | SaturationReport:
        with self._lock:
            rid = next(self._ids)
            t0 = time.perf_counter()
            try:
                if self._proc is not None and self._mem != config.EGRAPH_MEMORY.value:
                    self._close_unlocked()      # EQGRAD_EGRAPH_MEMORY changed: a worker with the new limit
                dead = self._proc is None or self._proc.poll() is not None
                if dead:
                    self._kill()               # a dead worker's pipes and directory
                    self._start()
                sent = time.monotonic()
                self._send.send((kind, rid, *args))
                if idle is not None:           # the caller's work that overlaps the worker's
                    self._idle = True
                    try:
                        idle()
                    except Exception:
                        pass
                    finally:
                        self._idle = False
                return self._reply(rid, sent, timeout, t0)
            except (EOFError, OSError) as e:
                code = self._proc.poll() if self._proc is not None else None
                self._kill()
                return SaturationReport("worker died", seconds=time.perf_counter() - t0,
                                        detail=f"exit code {code}; memory limit "
                                               f"{config.EGRAPH_MEMORY.value >> 20} MiB (EQGRAD_EGRAPH_MEMORY)? {e!r}")
            except BaseException:
                # interrupted (KeyboardInterrupt, an exception from a signal handler) with the request
                # in flight: the worker may still be saturating it and the pipe may hold half a message
                self._kill()
                raise

    def _reply(self, rid: int, sent: float, timeout: float, t0: float) -> dict | SaturationReport:
        """Wait for the reply to request ``rid`` (sent at ``sent``, ``time.monotonic()``): a worker
        still starting has ``STARTUP_LIMIT`` seconds from the send to say it is ready, and the
        request then ``timeout`` seconds from when it was (so the limit covers the saturation, and
        a request never waits more than ``STARTUP_LIMIT + timeout``). Past either it kills the
        worker. The reply dict gets ``startup``: the seconds the request waited for the start."""
        starting, began = self._unanswered, sent
        deadline = sent + (STARTUP_LIMIT if starting else timeout)
        while True:
            if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                self._kill()
                detail = (f"the new worker was not ready within {STARTUP_LIMIT:g}s of start-up (STARTUP_LIMIT: "
                          "loading egglog); no saturation ran" if starting
                          else f"wall-clock limit {timeout:g}s (EQGRAD_SATURATION_TIMEOUT)")
                return SaturationReport("timeout", seconds=time.perf_counter() - t0, detail=detail,
                                        startup=(time.monotonic() if starting else began) - sent)
            res = self._conn.recv()
            if isinstance(res, dict) and "failed" in res:     # the worker could not start; it has ended
                self._kill()
                return SaturationReport("worker died", seconds=time.perf_counter() - t0, detail=res["failed"],
                                        startup=time.monotonic() - sent)
            if isinstance(res, dict) and res.get("ready"):
                # the worker stamps when it was ready (one system-wide monotonic clock); kept between
                # the send and now, so a stamp from a different clock cannot stretch the limit
                began = min(max(sent, res.get("at", sent)), time.monotonic())
                starting, self._unanswered = False, False
                deadline = began + timeout
                continue
            self._unanswered = False
            if isinstance(res, dict) and res.get("id") == rid:
                res["startup"] = began - sent
                return res
            # a reply to an earlier request: never taken for this one's

    def working(self) -> bool:
        """Called by a request's ``idle`` (run(idle=...)): is the worker still on that request (no
        reply has arrived yet)? False outside one."""
        try:
            return self._idle and self._conn is not None and not self._conn.poll(0)
        except (OSError, ValueError):
            return False

    def ready(self) -> bool:
        """Is a worker running and done starting (it says so once it has loaded egglog), so that a
        request now is answered without waiting for a start? Never blocks: False while a request
        is in flight on the channel."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._proc is None or self._proc.poll() is not None:
                return False
            while self._unanswered and self._conn.poll(0):
                msg = self._conn.recv()
                if isinstance(msg, dict) and msg.get("ready"):
                    self._unanswered = False
            return not self._unanswered
        except (EOFError, OSError):
            return False
        finally:
            self._lock.release()

    def warm(self) -> None:
        """Start the worker now, without waiting for it, if it is not running and nobody is using
        the channel. Its start-up (a Python process importing egglog: ~0.5 s of the 0.8-1.1 s first
        realize) then overlaps the caller's graph building instead of the first saturation."""
        if not self._lock.acquire(blocking=False):
            return                             # a request is in flight: the worker is running
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._start()
        finally:
            self._lock.release()

    def validate(self, books: list[tuple[str, str]], generated: bool = True) -> str | None:
        """Load rulebooks ((name, text) pairs) into a fresh e-graph next to the IR (and the
        generated families unless ``generated`` is False); the egglog error (with file:line) or None."""
        res = self._request("validate", (list(books), generated), 60.0)
        if isinstance(res, SaturationReport):
            return f"validating rulebooks failed: {res.stop_reason} ({res.detail})"
        return None if res["ok"] else res["error"]

    def run(self, program: str, timeout: float | None = None, node_limit: int | None = None,
            rules=None, idle: Callable[[], None] | None = None,
            trace: bool | None = None, memo: bool = False) -> tuple[str | None, SaturationReport]:
        """Saturate ``program`` (egglog text) with ``rules`` (default: the built-in books); returns
        (the e-graph as JSON or None, the report). ``idle``: called once the request is sent, to
        do work of the caller's while the worker saturates (its exceptions are dropped).
        ``trace`` (default: DEBUG>=4): run each phase step by step and measure the e-graph after every
        iteration (``PhaseReport.per_iteration``, ``SaturationReport.growth``); the same e-graph
        as without, slower (a size count per iteration). A run-schedule with ``let-scheduler`` still
        runs whole: sizes after it only (worker._Tracer).
        ``memo``: answer a request this Saturator has run before -- the same program, rulebook texts,
        phases, node limit and trace mode -- with that run's e-graph (its report marked ``reused``,
        ``seconds`` the lookup's), where it completed or stopped at the node limit: both are functions
        of the request alone (a timeout, a dead worker or an error is not kept). The engine asks for
        it: one program planned for several devices or under several extraction settings (a tuning
        sweep) is saturated once. Bounded by SATURATED_BYTES."""
        trace = config.DEBUG.value >= 4 if trace is None else bool(trace)
        timeout = config.SATURATION_TIMEOUT.value if timeout is None else timeout
        node_limit = config.EGRAPH_NODES.value if node_limit is None else node_limit
        cfg = rules or self.fixed or builtin_config()      # the engine passes the session's active rules
        phases = schedule_phases(cfg)
        t0 = time.perf_counter()
        args = (program, node_limit, cfg.books, phases, cfg.generated, trace)
        key = (program, node_limit, tuple(cfg.books), tuple(phases), cfg.generated, trace) if memo else None
        if key is not None and (hit := self._recall(key)) is not None:
            return hit[0], dataclasses.replace(hit[1], seconds=time.perf_counter() - t0, startup=0.0, reused=True)
        res = self._request("run", args, timeout, idle)
        if isinstance(res, SaturationReport):
            return None, res
        if not res["ok"]:
            return None, SaturationReport("error", seconds=res["seconds"], detail=res["error"], startup=res["startup"])
        phases_r = [PhaseReport(**p) for p in res["phases"]]
        rep = SaturationReport(res["stop"], phases_r, res["before"], phases_r[-1].enodes if phases_r else res["before"],
                               seconds=time.perf_counter() - t0, startup=res["startup"])
        if rep.stop_reason == "node limit":
            rep.detail = f"{rep.enodes} > {node_limit} e-nodes after phase {phases_r[-1].name} (EQGRAD_EGRAPH_NODES)"
        if key is not None and rep.ok:
            self._keep(key, res["json"], rep)
        return res["json"], rep

    def _recall(self, key: tuple) -> tuple[str, SaturationReport] | None:
        with self._memo_lock:
            hit = self._saturated.pop(key, None)
            if hit is not None:
                self._saturated[key] = hit           # the most recently used last
            return hit

    def _keep(self, key: tuple, js: str, rep: SaturationReport) -> None:
        size = len(key[0]) + len(js)
        if size > SATURATED_BYTES:
            return
        with self._memo_lock:
            old = self._saturated.pop(key, None)
            if old is not None:
                self._saturated_bytes -= len(key[0]) + len(old[0])
            self._saturated[key] = (js, dataclasses.replace(rep))    # the caller's copy may be changed
            self._saturated_bytes += size
            while self._saturated_bytes > SATURATED_BYTES:
                k, (j, _) = next(iter(self._saturated.items()))
                del self._saturated[k]
                self._saturated_bytes -= len(k[0]) + len(j)


def schedule_phases(cfg) -> list[tuple[str, str]]:
    """The schedule's phases, with the extra commands of user rulebooks appended to their phase."""
    out = []
    for name, text in split_schedule(cfg.schedule_text, cfg.schedule):
        extra = [cmd for ph, cmd in cfg.extra if ph == name]
        out.append((name, "\n".join([text, *extra])))
    return out


_default: Saturator | None = None
_instances: "weakref.WeakSet[Saturator]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()           # a parent thread may have held it at the fork
    for sat in list(_instances):
        sat._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


_default_lock = threading.Lock()


def default_saturator() -> Saturator:
    global _default
    if _default is None:
        with _default_lock:                    # two threads' first realizes make one worker
            if _default is None:
                _default = Saturator()
                atexit.register(reset_saturator)      # end the worker with the process
    return _default


def prestart() -> None:
    """Called by ``import eqgrad`` as soon as this module is imported: the default saturator adopts
    the worker that ``launch.prestart`` started at the beginning of the import and sends
    it the IR and the rules to load, so that it is ready by the first realize. Never raises: a
    worker that failed is reported at the first saturation, as without a prestart."""
    try:
        if launch.prestarted():
            default_saturator().warm()
    except Exception:
        pass


def reset_saturator() -> None:
    global _default
    if _default is not None:
        _default.close()
    _default = None

