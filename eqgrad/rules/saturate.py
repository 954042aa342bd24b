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

import atexit
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
SCHEDULE = "schedule.egg"


@dataclass
class PhaseReport:
    name: str
    seconds: float
    iterations: int
    enodes: int
    matches: dict[str, int] = field(default_factory=dict)
    rule_seconds: dict[str, float] = field(default_factory=dict)


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
        """Matches per rule name, over all phases."""
        out: dict[str, int] = {}
        for p in self.phases:
            for k, v in p.matches.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def rule_seconds(self) -> dict[str, float]:
        """Search-and-apply time per rule name, over all phases."""
        out: dict[str, float] = {}
        for p in self.phases:
            for k, v in p.rule_seconds.items():
                out[k] = out.get(k, 0.0) + v
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
    mem_limit = conn_in.recv()
    _worker_main(conn_in, conn_out, mem_limit)


def _load(eg, bindings, span, paths: list[str]) -> None:
    for path in paths:
        eg.run_program(bindings.Include(span, path))


def _run_phases(eg, bindings, phases: list[tuple[str, str]], node_limit: int) -> tuple[list[dict], str]:
    reports, stop = [], "completed"
    for name, text in phases:
        p0 = time.perf_counter()
        outs = eg.run_program(*eg.parse_program(text))
        matches: dict[str, int] = {}
        seconds: dict[str, float] = {}
        iters = 0
        for o in outs:
            rep = getattr(o, "report", None)
            if rep is None:
                continue
            iters += len(rep.iterations)
            for k, v in rep.num_matches_per_rule.items():
                matches[_rule_name(k)] = matches.get(_rule_name(k), 0) + v
            for k, v in rep.search_and_apply_time_per_rule.items():
                seconds[_rule_name(k)] = seconds.get(_rule_name(k), 0.0) + v.total_seconds()
        size = _size(eg, bindings)
        reports.append(dict(name=name, seconds=time.perf_counter() - p0, iterations=iters,
                            enodes=size, matches=matches, rule_seconds=seconds))
        if size > node_limit:
            stop = "node limit"
            break
    return reports, stop


def _worker_main(conn_in, conn, mem_limit: int) -> None:
    if mem_limit > 0:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    from egglog import bindings
    tmp = Path(tempfile.mkdtemp(prefix="eqgrad-egg-"))
    gen = tmp / "generated.egg"
    gen.write_text(declarations() + generated_rulebooks())
    span = bindings.RustSpan("", 0, 0)
    while True:
        try:
            req = conn_in.recv()
        except EOFError:
            return
        if req is None:
            return
        t0 = time.perf_counter()
        try:
            eg = bindings.EGraph()
            if req[0] == "validate":          # load rulebooks next to the IR; report the first error
                _load(eg, bindings, span, [str(gen), *req[1]])
                conn.send(dict(ok=True, seconds=time.perf_counter() - t0))
                continue
            _, program, node_limit, rulebooks, phases = req
            _load(eg, bindings, span, [str(gen), *rulebooks])
            prog = tmp / "program.egg"
            prog.write_text(program)
            eg.run_program(bindings.Include(span, str(prog)))
            before = _size(eg, bindings)
            reports, stop = _run_phases(eg, bindings, phases, node_limit)
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
        """By default each run uses the active rule configuration (``rulebook.active_config``);
        ``rulebooks``/``schedule`` pin a fixed one instead (tests, the soundness checker)."""
        self.fixed = None
        if rulebooks is not None or schedule is not None:
            from .rulebook import BUILTIN_RULEBOOKS as B, RuleConfig
            self.fixed = RuleConfig(tuple(str(p) for p in (rulebooks or [RULEBOOK_DIR / r for r in B])),
                                    str(schedule or RULEBOOK_DIR / SCHEDULE))
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
        self._send.send(config.EGRAPH_MEMORY.value)

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

    def _request(self, req: tuple, timeout: float) -> dict | SaturationReport:
        t0 = time.perf_counter()
        fresh = self._proc is None or self._proc.poll() is not None
        if fresh:
            self._start()
        try:
            self._send.send(req)
            # a fresh worker first imports egglog: that start-up is not the program's fault
            if not self._conn.poll(timeout + (10.0 if fresh else 0.0)):
                self._kill()
                return SaturationReport("timeout", seconds=time.perf_counter() - t0,
                                        detail=f"wall-clock limit {timeout:g}s (EQGRAD_SATURATION_TIMEOUT)")
            return self._conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            code = self._proc.poll() if self._proc is not None else None
            self._kill()
            return SaturationReport("worker died", seconds=time.perf_counter() - t0,
                                    detail=f"exit code {code}; memory limit "
                                           f"{config.EGRAPH_MEMORY.value >> 20} MiB (EQGRAD_EGRAPH_MEMORY)? {e!r}")

    def validate(self, rulebooks: list[str]) -> str | None:
        """Load rulebooks into a fresh e-graph next to the IR; the egglog error (with file:line) or None."""
        res = self._request(("validate", list(rulebooks)), 60.0)
        if isinstance(res, SaturationReport):
            return f"validating rulebooks failed: {res.stop_reason} ({res.detail})"
        return None if res["ok"] else res["error"]

    def run(self, program: str, timeout: float | None = None, node_limit: int | None = None,
            rules=None) -> tuple[str | None, SaturationReport]:
        from .rulebook import active_config
        timeout = config.SATURATION_TIMEOUT.value if timeout is None else timeout
        node_limit = config.EGRAPH_NODES.value if node_limit is None else node_limit
        cfg = rules or self.fixed or active_config()
        phases = schedule_phases(cfg)
        t0 = time.perf_counter()
        res = self._request(("run", program, node_limit, list(cfg.rulebooks), phases), timeout)
        if isinstance(res, SaturationReport):
            return None, res
        if not res["ok"]:
            return None, SaturationReport("error", seconds=res["seconds"], detail=res["error"])
        phases_r = [PhaseReport(**p) for p in res["phases"]]
        rep = SaturationReport(res["stop"], phases_r, res["before"], phases_r[-1].enodes if phases_r else res["before"],
                               seconds=time.perf_counter() - t0)
        if rep.stop_reason == "node limit":
            rep.detail = f"{rep.enodes} > {node_limit} e-nodes after phase {phases_r[-1].name} (EQGRAD_EGRAPH_NODES)"
        return res["json"], rep


def schedule_phases(cfg) -> list[tuple[str, str]]:
    """The schedule's phases, with the extra commands of user rulebooks appended to their phase."""
    out = []
    for name, text in read_schedule(Path(cfg.schedule)):
        extra = [cmd for ph, cmd in cfg.extra if ph == name]
        out.append((name, "\n".join([text, *extra])))
    return out


_default: Saturator | None = None


def default_saturator() -> Saturator:
    global _default
    if _default is None:
        _default = Saturator()
        atexit.register(reset_saturator)      # end the worker with the process
    return _default


def reset_saturator() -> None:
    global _default
    if _default is not None:
        _default.close()
    _default = None

