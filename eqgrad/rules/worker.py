"""The saturation worker: a process that runs egglog on the requests of a ``Saturator``
(saturate.py, which has the protocol and why a worker exists).

It is started as a *script* (``python .../eqgrad/rules/worker.py``), not as a module of the
package, and imports nothing from eqgrad: importing eqgrad (numpy, llvmlite, the whole framework)
and the ``egglog`` package's Python API took ~1 s of a fresh process's first realize, and the
worker needs neither -- the parent sends it the texts it needs (the IR declarations and the
generated rule families) at its start, and it loads egglog's Rust extension by itself
(``load_bindings``). Started so, it is ready in ~0.1 s.
"""
from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    del sys.path[0]        # a script's folder goes first on sys.path: eqgrad/rules must not shadow anything

import importlib.util
import re
import shutil
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path


def _rule_name(key: str) -> str:
    m = re.search(r':name\s+"([^"]+)"', key)
    return m.group(1) if m else " ".join(key.split())[:60]


def _size(eg, bindings) -> int:
    """Number of e-nodes of sort T (analysis rows excluded)."""
    (out,) = eg.run_program(*eg.parse_program("(print-size)"))
    return sum(n for f, n in out.sizes if f not in ("shape", "dtype"))


def main() -> None:
    """Entry point of the worker process (run as a script by ``Saturator``, with two pipe fds and the
    temporary directory it may use, which it removes when it ends)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tmp = Path(sys.argv[3])
    try:
        conn_in = Connection(int(sys.argv[1]), writable=False)
        conn_out = Connection(int(sys.argv[2]), readable=False)
        mem_limit, declarations, generated, books, *rest = conn_in.recv()
        if rest:      # started with -S (no site: ~35 ms of a start): the parent's path finds egglog
            sys.path += [p for p in rest[0] if p not in sys.path]
        _worker_main(conn_in, conn_out, mem_limit, tmp, declarations, generated, books)
    except (EOFError, OSError):          # the parent went away
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_bindings():
    """egglog's Rust extension module, loaded by itself: ``from egglog import bindings`` first runs
    the ``egglog`` package's ``__init__`` (its whole Python API, ~0.45-0.6 s here), which the worker
    never uses; the extension alone loads in ~30 ms. Falls back to the package import when the
    extension cannot be found or loaded that way."""
    try:
        spec = importlib.util.find_spec("egglog")          # locates the package without importing it
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for f in sorted(Path(folder).glob("bindings*.so")) + sorted(Path(folder).glob("bindings*.pyd")):
                ext = importlib.util.spec_from_file_location("egglog.bindings", f)
                mod = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(mod)
                return mod
    except Exception:        # any surprise: the ordinary import below
        pass
    from egglog import bindings
    return bindings


def _checked(eg, bindings, text: str, filename: str) -> list:
    """egglog's parse of ``text``, refusing commands that read or write files (the parent checked
    the text already; this checks what egglog itself makes of it)."""
    cmds = eg.parse_program(text, filename=filename)
    todo = list(cmds)
    while todo:
        c = todo.pop()
        if isinstance(c, bindings.Fail):
            todo.append(c.command)
        elif isinstance(c, (bindings.Output, bindings.Input, bindings.Include)) \
                or (isinstance(c, bindings.PrintFunction) and c.filename is not None) \
                or (isinstance(c, bindings.PrintOverallStatistics) and c.file is not None):
            raise ValueError(f"{filename}: {type(c).__name__} reads or writes a file, which a rulebook or "
                             "schedule may not do")
    return cmds


def _load(eg, bindings, books: list[tuple[str, str]]) -> None:
    for name, text in books:
        eg.run_program(*_checked(eg, bindings, text, name))


def _run_phases(eg, bindings, phases: list[tuple[str, str]], node_limit: int) -> tuple[list[dict], str]:
    reports, stop = [], "completed"
    for name, text in phases:
        p0 = time.perf_counter()
        outs = eg.run_program(*_checked(eg, bindings, text, f"schedule phase {name}"))
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


def _worker_main(conn_in, conn, mem_limit: int, tmp: Path, declarations: str, generated: str,
                 books: list[tuple[str, str]]) -> None:
    """Serve requests until the parent sends None. ``books``: the rulebooks the first run will most
    likely use (the built-in ones), loaded before the worker says it is ready."""
    if mem_limit > 0:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    bindings = load_bindings()
    # eqgrad's own texts are loaded with Include: the fast path for big programs (DESIGN.md), and for
    # the generated families 25 ms a request where parse_program takes 75 ms
    decl, gen = tmp / "declarations.egg", tmp / "generated.egg"
    decl.write_text(declarations)
    gen.write_text(generated)
    prog = tmp / "program.egg"
    span = bindings.RustSpan("", 0, 0)
    # The e-graph holding the declarations and the rules of the last run, saved with (push) before a
    # program is inserted and restored with (pop) after: building it took ~120 ms of a one-op
    # program's ~150 ms request (loading the generated families ~75-90 ms, the rulebooks ~20-30 ms),
    # the run itself ~30 ms. Kept for the next run with the same rules (the usual case); dropped on
    # any error, when its state is not known.
    base, base_key = None, None

    def fresh(generated: bool):
        eg = bindings.EGraph()
        eg.run_program(bindings.Include(span, str(decl)))
        if generated:
            eg.run_program(bindings.Include(span, str(gen)))
        return eg

    push, pop = bindings.Push(1), bindings.Pop(span, 1)
    try:
        base, base_key = fresh(True), (True, tuple(map(tuple, books)))
        _load(base, bindings, books)
    except Exception:                    # reported by the first request that loads them
        base = base_key = None
    conn.send(dict(ready=True))          # Saturator.ready(): requests are answered from now on
    while True:
        req = conn_in.recv()
        if req is None:
            return
        kind, rid = req[0], req[1]
        t0 = time.perf_counter()
        # after the arguments (4 for a run, 1 for a validate), optionally: whether the generated
        # families load first (False: the rulebooks hold them, as a `rules dump` does)
        n_args = 4 if kind == "run" else 1
        generated = len(req) <= 2 + n_args or bool(req[2 + n_args])
        try:
            if kind == "validate":          # load rulebooks next to the IR; report the first error
                _load(fresh(generated), bindings, req[2])
                conn.send(dict(id=rid, ok=True, seconds=time.perf_counter() - t0))
                continue
            program, node_limit, books, phases = req[2:6]
            key = (generated, tuple(map(tuple, books)))
            if base is None or base_key != key:
                base, base_key = None, None
                eg = fresh(generated)
                _load(eg, bindings, books)
                base, base_key = eg, key
            eg = base
            eg.run_program(push)
            try:
                prog.write_text(program)
                eg.run_program(bindings.Include(span, str(prog)))
                before = _size(eg, bindings)
                reports, stop = _run_phases(eg, bindings, phases, node_limit)
                js = eg.serialize([]).to_json()
            finally:
                eg.run_program(pop)
            conn.send(dict(id=rid, ok=True, json=js, stop=stop, phases=reports, before=before,
                           seconds=time.perf_counter() - t0))
        except Exception as e:  # egglog errors (bad rulebook, ...) come back as a report
            base = base_key = None
            conn.send(dict(id=rid, ok=False, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0))
        except BaseException as e:  # pyo3 PanicException is a BaseException
            base = base_key = None
            conn.send(dict(id=rid, ok=False, error=f"egglog panic: {e}", seconds=time.perf_counter() - t0))

if __name__ == "__main__":
    main()
