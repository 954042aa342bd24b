"""Run the rulebook schedule on a program, bounded, in a worker process.

egglog 13.2.0 has no timeout, cannot be interrupted, and aborts the whole process when an
allocation fails (shared/notes/egglog-13.2.md, Q1e). So every saturation runs in a long-lived
worker process (spawned once, reused) with an address-space rlimit; the parent waits with a
wall-clock timeout and kills the worker when it is exceeded. Phases of the schedule run one at a
time; after each, the worker checks the e-graph size against the node limit and stops early if it
is exceeded. The e-graph of the last finished phase is always a valid e-graph of the program, so
an early stop still gives correct (less optimized) plans. When the worker dies or times out the
caller falls back to the unoptimized plan and warns.
"""
from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.connection import Connection
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from .ir import declarations, generated_rulebooks

RULEBOOK_DIR = Path(__file__).resolve().parents[2] / "rulebooks"
BUILTIN_RULEBOOKS = ("movement.egg", "algebra.egg", "fusion.egg")
SCHEDULE = "schedule.egg"


@dataclass
class PhaseReport:
    name: str
    seconds: float
    iterations: int
    enodes: int
    matches: dict[str, int] = field(default_factory=dict)


@dataclass
class SaturationReport:
    stop_reason: str                 # "completed", "node limit", "timeout", "worker died", "error", "cached"
    phases: list[PhaseReport] = field(default_factory=list)
    enodes_before: int = 0
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.stop_reason in ("completed", "node limit")

    @property
    def matches(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.phases:
            for k, v in p.matches.items():
                out[k] = out.get(k, 0) + v
        return out

    def __str__(self) -> str:
        lines = [f"saturation: {self.stop_reason}{' (' + self.detail + ')' if self.detail else ''}; "
                 f"{self.enodes_before} -> {self.enodes} e-nodes, {self.eclasses} e-classes, {self.seconds*1e3:.1f} ms"]
        for p in self.phases:
            lines.append(f"  phase {p.name:<9} {p.seconds*1e3:8.2f} ms  {p.iterations:3d} iterations  {p.enodes:7d} e-nodes")
        fired = sorted(((v, k) for k, v in self.matches.items() if v), reverse=True)
        if fired:
            lines.append("  matches: " + ", ".join(f"{k}={v}" for v, k in fired[:24]) + (" ..." if len(fired) > 24 else ""))
        return "\n".join(lines)


def read_schedule(path: Path) -> list[tuple[str, str]]:
    """Split a schedule file into (phase name, egglog commands) at ';; phase NAME' lines."""
    phases: list[tuple[str, str]] = []
    name, buf = None, []
    for line in path.read_text().splitlines():
        m = re.match(r"\s*;;\s*phase\s+(\S+)", line)
        if m:
            if name is not None:
                phases.append((name, "\n".join(buf)))
            name, buf = m.group(1), []
        elif name is not None:
            buf.append(line)
    if name is not None:
        phases.append((name, "\n".join(buf)))
    if not phases:
        raise ValueError(f"{path}: no ';; phase NAME' sections found")
    return phases


# ------------------------------------------------------------------ worker side

def _rule_name(key: str) -> str:
    m = re.search(r':name\s+"([^"]+)"', key)
    return m.group(1) if m else " ".join(key.split())[:60]


def _size(eg, bindings) -> int:
    """Number of e-nodes of sort T (analysis rows excluded)."""
    (out,) = eg.run_program(*eg.parse_program("(print-size)"))
    return sum(n for f, n in out.sizes if f not in ("shape", "dtype"))


def _worker_entry() -> None:
    """Entry point of the worker process (started by :class:`Saturator` with two pipe fds)."""
    conn_in = Connection(int(sys.argv[1]), writable=False)
    conn_out = Connection(int(sys.argv[2]), readable=False)
    rulebooks, schedule, mem_limit = conn_in.recv()
    _worker_main(conn_in, conn_out, rulebooks, schedule, mem_limit)


def _worker_main(conn_in, conn, rulebooks: list[str], schedule: str, mem_limit: int) -> None:
    if mem_limit > 0:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    from egglog import bindings
    tmp = Path(tempfile.mkdtemp(prefix="eqgrad-egg-"))
    gen = tmp / "generated.egg"
    gen.write_text(declarations() + generated_rulebooks())
    phases = read_schedule(Path(schedule))
    span = bindings.RustSpan("", 0, 0)
    while True:
        try:
            req = conn_in.recv()
        except EOFError:
            return
        if req is None:
            return
        program, node_limit = req
        t0 = time.perf_counter()
        try:
            eg = bindings.EGraph()
            for path in [str(gen), *rulebooks]:
                eg.run_program(bindings.Include(span, path))
            prog = tmp / "program.egg"
            prog.write_text(program)
            eg.run_program(bindings.Include(span, str(prog)))
            before = _size(eg, bindings)
            reports, stop = [], "completed"
            for name, text in phases:
                p0 = time.perf_counter()
                outs = eg.run_program(*eg.parse_program(text))
                matches: dict[str, int] = {}
                iters = 0
                for o in outs:
                    rep = getattr(o, "report", None)
                    if rep is None:
                        continue
                    iters += len(rep.iterations)
                    for k, v in rep.num_matches_per_rule.items():
                        matches[_rule_name(k)] = matches.get(_rule_name(k), 0) + v
                size = _size(eg, bindings)
                reports.append(dict(name=name, seconds=time.perf_counter() - p0, iterations=iters,
                                    enodes=size, matches=matches))
                if size > node_limit:
                    stop = "node limit"
                    break
            js = eg.serialize([]).to_json()
            conn.send(dict(ok=True, json=js, stop=stop, phases=reports, before=before,
                           seconds=time.perf_counter() - t0))
        except Exception as e:  # egglog errors (bad rulebook, ...) come back as a report
            conn.send(dict(ok=False, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0))
        except BaseException as e:  # pyo3 PanicException is a BaseException
            conn.send(dict(ok=False, error=f"egglog panic: {e}", seconds=time.perf_counter() - t0))


# ------------------------------------------------------------------ parent side

class Saturator:
    """Owns one worker process; ``run`` is synchronous and always returns within the timeout."""

    def __init__(self, rulebooks: list[Path] | None = None, schedule: Path | None = None):
        self.rulebooks = [str(p) for p in (rulebooks or [RULEBOOK_DIR / r for r in BUILTIN_RULEBOOKS])]
        self.schedule = str(schedule or RULEBOOK_DIR / SCHEDULE)
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._send: Connection | None = None

    def _start(self) -> None:
        # A plain subprocess, not multiprocessing: spawn/forkserver would re-import the user's
        # __main__ in the worker, and fork would copy LLVM's and the caller's threads.
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        env = dict(os.environ)
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from eqgrad.rules.saturate import _worker_entry; _worker_entry()", str(r1), str(w2)],
            pass_fds=(r1, w2), env=env, stdin=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self._send = Connection(w1, readable=False)
        self._conn = Connection(r2, writable=False)
        self._send.send((self.rulebooks, self.schedule, config.EGRAPH_MEMORY.value))

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._send.send(None)
                self._proc.wait(timeout=2)
            except (OSError, BrokenPipeError, subprocess.TimeoutExpired):
                self._proc.kill()
            self._close_pipes()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for c in (self._send, self._conn):
            if c is not None:
                c.close()
        self._proc = self._conn = self._send = None

    def run(self, program: str, timeout: float | None = None, node_limit: int | None = None
            ) -> tuple[str | None, SaturationReport]:
        timeout = config.SATURATION_TIMEOUT.value if timeout is None else timeout
        node_limit = config.EGRAPH_NODES.value if node_limit is None else node_limit
        t0 = time.perf_counter()
        fresh = self._proc is None or self._proc.poll() is not None
        if fresh:
            self._start()
        try:
            self._send.send((program, node_limit))
            # a fresh worker first imports egglog: that start-up is not the program's fault
            ready = self._conn.poll(timeout + (10.0 if fresh else 0.0))
            if not ready:
                self._kill()
                return None, SaturationReport("timeout", seconds=time.perf_counter() - t0,
                                              detail=f"wall-clock limit {timeout:g}s (EQGRAD_SATURATION_TIMEOUT)")
            res = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            code = self._proc.poll() if self._proc is not None else None
            self._kill()
            return None, SaturationReport("worker died", seconds=time.perf_counter() - t0,
                                          detail=f"exit code {code}; memory limit "
                                                 f"{config.EGRAPH_MEMORY.value >> 20} MiB (EQGRAD_EGRAPH_MEMORY)? {e!r}")
        if not res["ok"]:
            return None, SaturationReport("error", seconds=res["seconds"], detail=res["error"])
        phases = [PhaseReport(**p) for p in res["phases"]]
        rep = SaturationReport(res["stop"], phases, res["before"], phases[-1].enodes if phases else res["before"],
                               seconds=time.perf_counter() - t0)
        if rep.stop_reason == "node limit":
            rep.detail = f"{rep.enodes} > {node_limit} e-nodes after phase {phases[-1].name} (EQGRAD_EGRAPH_NODES)"
        return res["json"], rep


_default: Saturator | None = None


def default_saturator() -> Saturator:
    global _default
    if _default is None:
        _default = Saturator()
    return _default


def reset_saturator() -> None:
    global _default
    if _default is not None:
        _default.close()
    _default = None

