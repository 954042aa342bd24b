"""The saturation worker: a process that runs egglog on the requests of a ``Saturator``
(saturate.py, which has the protocol and why a worker exists).

It is started as a *script* (``python .../eqgrad/rules/worker.py``), not as a module of the
package, and imports nothing from eqgrad: importing eqgrad (numpy, llvmlite, the whole framework)
and the ``egglog`` package's Python API took ~1 s of a fresh process's first realize, and the
worker needs neither -- the parent sends it the texts it needs (the IR declarations and the
generated rule families) once it has them, and it loads egglog's Rust extension by itself
(``load_bindings``) before that, while the parent still imports eqgrad (launch.py starts it first
thing). Started so, and with a channel of its own (``Channel``), it has egglog loaded ~45 ms after
its start and is ready ~0.1 s after that (a first realize's worker: ready ~0.33 s into a fresh
process, where it was ~0.45 s with the start after half of the import and multiprocessing's
channel).
"""
from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    del sys.path[0]        # a script's folder goes first on sys.path: eqgrad/rules must not shadow anything

import marshal
import os
import time

# Only modules Python has loaded already at start-up, and marshal: the worker's start is on a first
# realize's path, and multiprocessing.connection, pathlib, shutil and re were ~60 ms of it


class Channel:
    """One direction of the pipe between the parent (saturate.py) and the worker: each message is
    a ``marshal``'d value (None, bool, numbers, str, lists, tuples, dicts) sent as its length (8
    bytes, little-endian) and its bytes. Both ends run the same Python, so marshal's format is
    theirs; it is not multiprocessing's pickle channel because importing that took ~30 ms of the
    worker's start. Blocking; ``poll`` waits with a timeout (the parent's)."""
    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def send(self, obj) -> None:
        data = marshal.dumps(obj)
        for chunk in (len(data).to_bytes(8, "little"), data):
            view = memoryview(chunk)
            while view:
                view = view[os.write(self.fd, view):]

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = os.readv(self.fd, [view[got:]])
            if k == 0:
                raise EOFError("the other end of the worker's channel closed")
            got += k
        return buf

    def recv(self):
        return marshal.loads(self._read(int.from_bytes(self._read(8), "little")))

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Is a message (or the end of the channel) there to read, waiting up to ``timeout`` seconds
        (None: for ever)?"""
        import select                       # the parent's side only
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _rule_name(key: str) -> str:
    import re                  # loaded by egglog's extension already
    m = re.search(r':name\s+"([^"]+)"', key)
    return m.group(1) if m else " ".join(key.split())[:60]


def _size(eg, bindings) -> int:
    """Number of e-nodes of sort T (analysis rows excluded)."""
    (out,) = eg.run_program(*eg.parse_program("(print-size)"))
    return sum(n for f, n in out.sizes if f not in ("shape", "dtype"))


def main() -> None:
    """Entry point of the worker process, run as a script (launch.py) with two pipe fds, the
    temporary directory it may use (removed when it ends) and the parent's ``sys.path`` (started
    with -S, no site module: ~35 ms of a start; the parent's path finds egglog). egglog's extension
    loads first, while the parent is still importing eqgrad; then the parent's first message
    brings the texts to load."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tmp = sys.argv[3]
    sys.path += [p for p in sys.argv[4:] if p not in sys.path]
    try:
        conn_in, conn_out = Channel(int(sys.argv[1])), Channel(int(sys.argv[2]))
        try:
            bindings = load_bindings()
        except Exception as e:           # egglog missing or broken: the parent's report says so
            conn_out.send(dict(failed=f"the worker cannot load egglog ({type(e).__name__}: {e}; "
                                      f"Python {sys.executable})"))
            return
        mem_limit, declarations, generated, books = conn_in.recv()
        _worker_main(bindings, conn_in, conn_out, mem_limit, tmp, declarations, generated, books)
    except (EOFError, OSError):          # the parent went away
        pass
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def load_bindings():
    """egglog's Rust extension module, loaded by itself: ``from egglog import bindings`` first runs
    the ``egglog`` package's ``__init__`` (its whole Python API, ~0.45-0.6 s here), which the worker
    never uses; the extension alone loads in ~30 ms. Falls back to the package import when the
    extension cannot be found or loaded that way."""
    try:
        from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
        for entry in sys.path:
            folder = os.path.join(entry or ".", "egglog")
            if not os.path.isfile(os.path.join(folder, "__init__.py")):
                continue
            for name in sorted(os.listdir(folder)):
                if name.startswith("bindings.") and any(name.endswith(x) for x in EXTENSION_SUFFIXES):
                    path = os.path.join(folder, name)
                    loader = ExtensionFileLoader("egglog.bindings", path)
                    mod = loader.create_module(ModuleSpec("egglog.bindings", loader, origin=path))
                    loader.exec_module(mod)
                    return mod
            break                        # the first egglog on the path is the one an import finds
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


def _iteration(it, names: dict[str, str], ruleset: str = "", enodes: int | None = None,
               whole: bool = False, wall: float | None = None) -> dict:
    """One egglog ``IterationReport`` as a plain dict (marshal'able): the matches per rule (rule
    names as ``_rule_name`` gives them, the rules that matched only), the search-and-apply, merge and
    rebuild seconds egglog reports (all 0 from egglog 13.2's bindings), whether the ruleset changed
    the e-graph; ``ruleset``, ``enodes`` (after it), ``whole`` and ``wall`` (the seconds its run took,
    measured here) are known in trace mode only (``_Tracer``). ``names``: the rule-key cache."""
    rs = it.rule_set_report
    matches: dict[str, int] = {}
    for k, reps in rs.rule_reports.items():
        n = sum(r.num_matches for r in reps)
        if n:
            name = names.get(k)
            if name is None:
                name = names[k] = _rule_name(k)
            matches[name] = matches.get(name, 0) + n
    return dict(ruleset=ruleset, matches=matches, seconds=rs.search_and_apply_time.total_seconds(),
                merge=rs.merge_time.total_seconds(), rebuild=it.rebuild_time.total_seconds(),
                changed=bool(rs.changed), enodes=enodes, whole=whole, wall=wall)


def _iterations(rep, names: dict[str, str], **kw) -> list[dict]:
    """The iterations of one ``RunReport`` (``_iteration``, ``kw`` passed on). A step of a scheduler
    (``run-with``) comes as two IterationReports, its search (unchanged, matches per query) and its
    application, of which egglog's totals (``num_matches_per_rule``) count the application only:
    where the iterations' matches do not add up to the totals, an unchanged iteration whose
    matches the next one repeats is taken for such a search and left out."""
    its = list(rep.iterations)
    sums = [{k: sum(r.num_matches for r in v) for k, v in it.rule_set_report.rule_reports.items()} for it in its]

    def total(keep):
        out: dict[str, int] = {}
        for i in keep:
            for k, v in sums[i].items():
                out[k] = out.get(k, 0) + v
        return {k: v for k, v in out.items() if v}

    want = {k: v for k, v in rep.num_matches_per_rule.items() if v}
    keep = list(range(len(its)))
    if total(keep) != want:
        paired = [i for i in keep if not (i + 1 < len(its) and not its[i].rule_set_report.changed
                                          and {k: v for k, v in sums[i].items() if v}
                                          == {k: v for k, v in sums[i + 1].items() if v})]
        if total(paired) == want:
            keep = paired
    return [_iteration(its[i], names, **kw) for i in keep]


class _Tracer:
    """Trace mode (``Saturator.run(trace=True)``, DEBUG>=4): a phase's ``run-schedule`` commands
    interpreted here, step by step, as egglog-experimental's ``run-schedule`` runs them (``seq``: each
    in turn; ``repeat N``: N rounds; ``saturate``: rounds until one updates nothing, that last round
    left out of the report as egglog leaves it out), every leaf -- ``(run R)``, ``(run R :until ...)``,
    a bare ruleset -- run as a ``run-schedule`` of its own, one egglog iteration, and the e-graph
    measured after it: the e-nodes per iteration egglog does not report. The e-graph is the one a
    whole run gives (same leaves, same order, same ``:until`` checks). A ``run-schedule`` that uses
    a scheduler (``let-scheduler``/``run-with``: its state lives inside one command) and any other
    command run whole, measured after."""

    SPLIT = ("run", "seq", "repeat", "saturate")

    def __init__(self, eg, bindings, names: dict[str, str]):
        self.eg, self.b, self.names = eg, bindings, names
        self.parsed: dict[str, list] = {}
        self.records: list[dict] = []          # per iteration (``_iteration``)
        self.reports: list = []                # the RunReports they came from

    def splittable(self, cmd) -> bool:
        if not (isinstance(cmd, self.b.UserDefined) and cmd.name == "run-schedule"):
            return False
        todo = list(cmd.args)
        while todo:
            e = todo.pop()
            if isinstance(e, self.b.Call):
                if e.name not in self.SPLIT:
                    return False
                if e.name == "repeat" and not (e.args and isinstance(e.args[0], self.b.Lit)
                                               and isinstance(e.args[0].value, self.b.Int)):
                    return False
                if e.name != "run":          # a run's arguments are a ruleset and an :until fact
                    todo += e.args[1:] if e.name == "repeat" else e.args
            elif not isinstance(e, self.b.Var):
                return False
        return True

    def command(self, cmd) -> None:
        """Run one command of the phase, step by step where it can be split."""
        if self.splittable(cmd):
            self.seq(cmd.args)
            return
        t0 = time.perf_counter()
        outs = self.eg.run_program(cmd)
        wall = time.perf_counter() - t0
        size = _size(self.eg, self.b)
        for o in outs:
            rep = getattr(o, "report", None)
            if rep is not None:
                self.reports.append(rep)
                self.records += _iterations(rep, self.names, whole=True)
        if self.records and self.records[-1]["whole"]:
            self.records[-1].update(enodes=size, wall=wall)   # known after the unsplit command only

    def seq(self, exprs) -> bool:
        updated = False
        for e in exprs:
            updated |= self.step(e)
        return updated

    def step(self, e) -> bool:
        if isinstance(e, self.b.Var) or e.name == "run":
            text = f"(run-schedule {e})"
            cmds = self.parsed.get(text)
            if cmds is None:
                cmds = self.parsed[text] = self.eg.parse_program(text)
            t0 = time.perf_counter()
            (out,) = self.eg.run_program(*cmds)
            wall = time.perf_counter() - t0
            rep = out.report
            if rep.iterations:
                self.reports.append(rep)
                ruleset = e.name if isinstance(e, self.b.Var) else next(
                    (a.name for a in e.args[:1] if isinstance(a, self.b.Var) and a.name != ":until"), "")
                size = _size(self.eg, self.b)
                self.records += _iterations(rep, self.names, ruleset=ruleset, enodes=size, wall=wall)
            return bool(rep.updated)
        if e.name == "seq":
            return self.seq(e.args)
        if e.name == "repeat":
            updated = False
            for _ in range(e.args[0].value.value):
                updated |= self.seq(e.args[1:])
            return updated
        # saturate: a round that updates nothing ends it and is not part of egglog's report
        updated = False
        while True:
            mark, rmark = len(self.records), len(self.reports)
            if not self.seq(e.args):
                del self.records[mark:], self.reports[rmark:]
                return updated
            updated = True


def _run_phases(eg, bindings, phases: list[tuple[str, str]], node_limit: int,
                trace: bool = False) -> tuple[list[dict], str]:
    """Run the schedule's phases in turn, stopping after the first that leaves more than
    ``node_limit`` e-nodes. Each phase's report has its iterations (``_iteration``: matches per rule
    and times; with ``trace``, run step by step by ``_Tracer`` and the e-nodes after each)."""
    reports, stop = [], "completed"
    names: dict[str, str] = {}
    for name, text in phases:
        p0 = time.perf_counter()
        cmds = _checked(eg, bindings, text, f"schedule phase {name}")
        if trace:
            tracer = _Tracer(eg, bindings, names)
            for c in cmds:
                tracer.command(c)
            per_iter, run_reports = tracer.records, tracer.reports
        else:
            run_reports = [r for r in (getattr(o, "report", None) for o in eg.run_program(*cmds)) if r is not None]
            per_iter = [d for r in run_reports for d in _iterations(r, names)]
        matches: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for rep in run_reports:
            for k, v in rep.num_matches_per_rule.items():
                matches[_rule_name(k)] = matches.get(_rule_name(k), 0) + v
            for k, v in rep.search_and_apply_time_per_rule.items():
                seconds[_rule_name(k)] = seconds.get(_rule_name(k), 0.0) + v.total_seconds()
        size = _size(eg, bindings)
        reports.append(dict(name=name, seconds=time.perf_counter() - p0, iterations=len(per_iter),
                            enodes=size, matches=matches, rule_seconds=seconds, per_iteration=per_iter,
                            traced=trace))
        if size > node_limit:
            stop = "node limit"
            break
    return reports, stop


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _worker_main(bindings, conn_in, conn, mem_limit: int, tmp: str, declarations: str, generated: str,
                 books: list[tuple[str, str]]) -> None:
    """Serve requests until the parent sends None. ``books``: the rulebooks the first run will most
    likely use (the built-in ones), loaded before the worker says it is ready."""
    if mem_limit > 0:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    # eqgrad's own texts are loaded with Include: the fast path for big programs (docs/rulebooks.md),
    # and for the generated families 25 ms a request where parse_program takes 75 ms
    decl, gen = os.path.join(tmp, "declarations.egg"), os.path.join(tmp, "generated.egg")
    _write(decl, declarations)
    _write(gen, generated)
    prog = os.path.join(tmp, "program.egg")
    span = bindings.RustSpan("", 0, 0)
    # The e-graph holding the declarations and the rules of the last run, saved with (push) before a
    # program is inserted and restored with (pop) after: building it took ~120 ms of a one-op
    # program's ~150 ms request (loading the generated families ~75-90 ms, the rulebooks ~20-30 ms),
    # the run itself ~30 ms. Kept for the next run with the same rules (the usual case); dropped on
    # any error, when its state is not known. The pop and the next run's push happen after the
    # reply is sent, while the parent extracts: each copies the whole e-graph of rules (~1.5 ms
    # apiece, ~3 of a small program's ~7 ms request), so the next request finds it saved already.
    base, base_key = None, None

    def fresh(generated: bool):
        eg = bindings.EGraph()
        eg.run_program(bindings.Include(span, decl))
        if generated:
            eg.run_program(bindings.Include(span, gen))
        return eg

    push, pop = bindings.Push(1), bindings.Pop(span, 1)
    try:
        base, base_key = fresh(True), (True, tuple(map(tuple, books)))
        _load(base, bindings, books)
        base.run_program(push)
    except Exception:                    # reported by the first request that loads them
        base = base_key = None
    # requests are answered from now on (Saturator.ready); ``at``: when, on the system-wide monotonic
    # clock, from which the parent counts the saturation's time limit (Saturator._reply)
    conn.send(dict(ready=True, at=time.monotonic()))
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
        trace = kind == "run" and len(req) > 3 + n_args and bool(req[3 + n_args])   # then: trace mode
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
                eg.run_program(push)
                base, base_key = eg, key
            eg, base, base_key = base, None, None     # saved (pushed); in use until restored below
            _write(prog, program)
            eg.run_program(bindings.Include(span, prog))
            before = _size(eg, bindings)
            reports, stop = _run_phases(eg, bindings, phases, node_limit, trace)
            js = eg.serialize([]).to_json()
            conn.send(dict(id=rid, ok=True, json=js, stop=stop, phases=reports, before=before,
                           seconds=time.perf_counter() - t0))
        except Exception as e:  # egglog errors (bad rulebook, ...) come back as a report
            base = base_key = None
            conn.send(dict(id=rid, ok=False, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0))
            continue
        except BaseException as e:  # pyo3 PanicException is a BaseException
            base = base_key = None
            conn.send(dict(id=rid, ok=False, error=f"egglog panic: {e}", seconds=time.perf_counter() - t0))
            continue
        js = reports = None
        try:                               # the rules' e-graph again, saved again for the next run
            eg.run_program(pop)
            eg.run_program(push)
            base, base_key = eg, key
        except BaseException:              # the next run builds it afresh (the reply is sent already)
            base = base_key = None


if __name__ == "__main__":
    main()
