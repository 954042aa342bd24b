"""Rulebooks: loading, validation, and which ones are active.

A rulebook is a ``.egg`` file of rules only. Loading one checks, before egglog sees it:

- it contains only ``(ruleset ...)``, ``(rewrite ...)``, ``(birewrite ...)`` and ``(rule ...)``
  forms (no sorts, constructors, functions, lets or commands: the IR is eqgrad's);
- every rewrite/rule has a unique ``:name "..."`` and a ``:ruleset`` the file declares;
- every function it calls is an IR constructor, an analysis (``shape``, ``dtype``) or an egglog
  primitive;

then egglog itself loads it next to the IR (type errors come back with file:line).

Rulebooks and schedules are data: a form that makes egglog read or write a file (``output``,
``input``, ``include``, ``print-function ... :file``, ``print-stats :file``, at any depth) is
rejected in both, with file:line and the command. Each file is read ONCE, when it is activated;
the text that was validated is the text the worker loads (egglog never sees the path), so
changing or swapping the file afterwards has no effect until it is activated again.

Active rulebooks: the built-ins, plus user rulebooks added with :func:`use` / :func:`using` or the
``EQGRAD_RULEBOOKS`` environment variable (``path[@phase]`` items separated by ``:``; a directory
means every ``*.egg`` in it). A user rulebook's rulesets run in a phase of the schedule (default
``cleanup``, after fusion, where patterns can see across fused ops). ``EQGRAD_SCHEDULE`` or
:func:`use_schedule` replaces the schedule file.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..ops import OPS
from .sexpr import RulebookError, SExpr, SList, Str, Sym, keyword_args, parse, reject_file_commands, to_text

RULEBOOK_DIR = Path(__file__).resolve().parents[2] / "rulebooks"
BUILTIN_RULEBOOKS = ("movement.egg", "algebra.egg", "fusion.egg")
DEFAULT_SCHEDULE = RULEBOOK_DIR / "schedule.egg"
DEFAULT_PHASE = "cleanup"

ALLOWED_FORMS = {"ruleset", "rewrite", "birewrite", "rule"}
ANALYSES = {"shape", "dtype"}
PRIMITIVES = {
    "+", "-", "*", "/", "%", "neg", "max", "min", "abs", "<", ">", "<=", ">=", "=", "!=", "and", "or", "not",
    "xor", "<<", ">>", "log2", "to-f64", "to-i64", "vec-of", "vec-empty", "vec-get", "vec-set", "vec-length",
    "vec-push", "vec-pop", "vec-append", "vec-contains", "vec-not-contains", "vec-remove", "count-matches",
    "get-size!", "replace", "+", "bool-=", "bool-<", "bool->",
}
ACTIONS = {"union", "set", "delete", "subsume", "panic", "let"}


@dataclass
class Rule:
    name: str
    kind: str                    # rewrite | birewrite | rule
    ruleset: str
    lhs: SExpr                   # the matched pattern (for `rule`: the term bound to the union'd variable)
    rhs: SExpr | None            # what it is unioned with (None: an analysis rule that only sets facts)
    guards: list[SExpr]          # :when conditions (for `rule`: the other query facts)
    text: str                    # the whole form, as egglog text
    file: str
    line: int
    check: set[str] = field(default_factory=set)   # annotations from a ';; check: ...' comment

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Rulebook:
    path: Path
    rulesets: list[str]
    rules: list[Rule]
    digest: str
    text: str = ""               # the validated text: what the worker loads (the file is not read again)

    @property
    def name(self) -> str:
        return self.path.name


def _calls(e: SExpr, out: list[tuple[str, int]], line: int) -> None:
    if isinstance(e, SList):
        ln = e.line or line
        if e.items and isinstance(e.items[0], Sym):
            out.append((e.items[0].name, ln))
            for x in e.items[1:]:
                _calls(x, out, ln)
        else:
            for x in e.items:
                _calls(x, out, ln)


def _annotations(comments: list[str]) -> set[str]:
    out: set[str] = set()
    for c in comments:
        if c.lower().startswith("check:"):
            out |= {w.strip() for w in c.split(":", 1)[1].split(",") if w.strip()}
    return out


def parse_rulebook(text: str, filename: str) -> tuple[list[str], list[Rule]]:
    forms = parse(text, filename)
    reject_file_commands(forms, filename, "rulebook")
    constructors = {o.egg for o in OPS.values()}
    rulesets: list[str] = []
    rules: list[Rule] = []
    for f in forms:
        where = f"{filename}:{f.line}"
        if f.head not in ALLOWED_FORMS:
            raise RulebookError(f"{where}: ({f.head} ...) is not allowed in a rulebook; a rulebook holds only "
                                "(ruleset ...), (rewrite ...), (birewrite ...) and (rule ...) forms "
                                "-- the IR's sorts and constructors are declared by eqgrad")
        if f.head == "ruleset":
            if len(f) != 2 or not isinstance(f[1], Sym):
                raise RulebookError(f"{where}: expected (ruleset NAME)")
            rulesets.append(f[1].name)
            continue
        n_pos = 3 if f.head in ("rewrite", "birewrite", "rule") else 2
        kw = keyword_args(f, n_pos)
        name = kw.get(":name")
        if not isinstance(name, Str):
            raise RulebookError(f"{where}: every rule needs a name: add :name \"...\" to {to_text(f)[:60]}")
        rs = kw.get(":ruleset")
        if not isinstance(rs, Sym):
            raise RulebookError(f"{where}: rule {name.value!r} has no :ruleset (rules outside a ruleset never run)")
        if rs.name not in rulesets:
            raise RulebookError(f"{where}: rule {name.value!r} uses ruleset {rs.name!r}, which this file does not "
                                f"declare with (ruleset {rs.name}) before it")
        calls: list[tuple[str, int]] = []
        for x in f.items[1:n_pos] + [v for k, v in kw.items() if k == ":when"]:
            _calls(x, calls, f.line)
        for fn, ln in calls:
            if fn in constructors or fn in ANALYSES or fn in PRIMITIVES or fn in ACTIONS:
                continue
            raise RulebookError(f"{filename}:{ln}: rule {name.value!r} calls {fn!r}, which is neither an IR "
                                f"constructor ({', '.join(sorted(constructors)[:6])}, ...), an analysis "
                                "(shape, dtype) nor an egglog primitive")
        guards = list(kw[":when"].items) if isinstance(kw.get(":when"), SList) else []
        ann = _annotations(f.comments)
        if f.head in ("rewrite", "birewrite"):
            rules.append(Rule(name.value, f.head, rs.name, f[1], f[2], guards, to_text(f), filename, f.line, ann))
        else:
            query, actions = f[1], f[2]
            if not isinstance(query, SList) or not isinstance(actions, SList):
                raise RulebookError(f"{where}: expected (rule (QUERY...) (ACTIONS...) ...)")
            lhs, rhs, facts = None, None, []
            for act in actions.items:
                if isinstance(act, SList) and act.head == "union" and len(act) == 3 and isinstance(act[1], Sym):
                    var = act[1].name
                    for q in query.items:
                        if isinstance(q, SList) and q.head == "=" and len(q) == 3 and q[1] == Sym(var) \
                                and isinstance(q[2], SList) and q[2].head in constructors:
                            lhs, rhs = q[2], act[2]
            facts = [q for q in query.items if not (isinstance(q, SList) and lhs is not None and len(q) == 3
                                                   and q.head == "=" and q[2] is lhs)]
            rules.append(Rule(name.value, "rule", rs.name, lhs if lhs is not None else query, rhs,
                              facts, to_text(f), filename, f.line, ann))
    return rulesets, rules


def load_rulebook(path: str | Path) -> Rulebook:
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such rulebook file")
    text = p.read_text()
    rulesets, rules = parse_rulebook(text, str(p))
    return Rulebook(p.resolve(), rulesets, rules, hashlib.sha256(text.encode()).hexdigest()[:16], text)


def read_rulebook_text(path: str | Path) -> str:
    """A rulebook file's text, read once and checked for file-touching commands (the built-ins and
    fixed configurations; user rulebooks go through the full checks of :func:`load_rulebook`)."""
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such rulebook file")
    text = p.read_text()
    reject_file_commands(parse(text, str(p)), str(p), "rulebook")
    return text


def read_schedule_text(path: str | Path) -> str:
    """A schedule file's text, read once and validated (phases, no file-touching commands)."""
    from .saturate import split_schedule
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such schedule file")
    text = p.read_text()
    split_schedule(text, str(p))
    return text


# ------------------------------------------------------------------ active configuration

@dataclass(frozen=True)
class RuleConfig:
    """What a saturation runs: rulebooks, the schedule, and extra phase commands.

    ``texts`` and ``schedule_text`` are what the worker loads; given only the paths, the files are
    read (and checked for file-touching commands) once, here."""
    rulebooks: tuple[str, ...]                      # rulebook paths (names in messages)
    schedule: str                                   # path of the schedule file ("" for none)
    extra: tuple[tuple[str, str], ...] = ()         # (phase, egglog commands) run after that phase
    key: str = ""                                   # content hash: part of the plan cache key
    texts: tuple[str, ...] = ()                     # each rulebook's validated text
    schedule_text: str = ""                         # the schedule's validated text

    def __post_init__(self) -> None:
        if self.rulebooks and not self.texts:
            object.__setattr__(self, "texts", tuple(read_rulebook_text(p) for p in self.rulebooks))
        if self.schedule and not self.schedule_text:
            object.__setattr__(self, "schedule_text", read_schedule_text(self.schedule))
        if len(self.texts) != len(self.rulebooks):
            raise ValueError(f"RuleConfig: {len(self.rulebooks)} rulebooks but {len(self.texts)} texts")

    @property
    def books(self) -> list[tuple[str, str]]:
        """(name, text) of each rulebook, as the worker loads them."""
        return list(zip(self.rulebooks, self.texts))


_user: list[tuple[Rulebook, str, int]] = []
_schedule: tuple[Path, str] | None = None          # (path, validated text) from use_schedule


def _builtin_paths() -> list[Path]:
    return [RULEBOOK_DIR / r for r in BUILTIN_RULEBOOKS]


def phase_commands(rulesets: list[str], iterations: int = 4) -> str:
    """Commands that run a user rulebook's rulesets inside a phase: bounded repeats, each run
    stopping early once the e-graph reaches the node limit (checked between iterations)."""
    from .. import config
    limit = config.EGRAPH_NODES.value
    runs = " ".join(f"(run {r} :until (>= (get-size!) {limit}))" for r in rulesets)
    return f"(run-schedule (repeat {iterations} (seq {runs} (saturate analysis))))"


def _env_rulebooks() -> list[tuple[Rulebook, str]]:
    raw = os.environ.get("EQGRAD_RULEBOOKS", "")
    out = []
    for item in [x for x in raw.split(os.pathsep) if x.strip()]:
        path, _, phase = item.partition("@")
        p = Path(path)
        files = sorted(p.glob("*.egg")) if p.is_dir() else [p]
        if not files:
            raise RulebookError(f"EQGRAD_RULEBOOKS: {path!r} is neither a .egg file nor a directory with .egg files")
        out += [(load_rulebook(f), phase or DEFAULT_PHASE, 4) for f in files]
    return out


_config_memo: dict[tuple, RuleConfig] = {}


def active_config() -> RuleConfig:
    """The active configuration (memoized on the API state and the environment variables)."""
    from .. import config
    state = (tuple((str(rb.path), rb.digest, ph, it) for rb, ph, it in _user), _schedule,
             os.environ.get("EQGRAD_RULEBOOKS", ""), os.environ.get("EQGRAD_SCHEDULE", ""),
             config.EGRAPH_NODES.value)
    if state not in _config_memo:
        _config_memo.clear()
        _config_memo[state] = _make_config()
    return _config_memo[state]


def _make_config() -> RuleConfig:
    from .saturate import split_schedule
    if _schedule is not None:
        sched, sched_text = _schedule
    else:
        sched = Path(os.environ.get("EQGRAD_SCHEDULE") or DEFAULT_SCHEDULE)
        sched_text = read_schedule_text(sched)
    user = _env_rulebooks() + _user
    phases = {n for n, _ in split_schedule(sched_text, str(sched))}
    extra = []
    for rb, phase, iterations in user:
        if phase not in phases:
            raise RulebookError(f"{rb.path}: phase {phase!r} is not in the schedule {sched} (phases: {sorted(phases)})")
        extra.append((phase, phase_commands(rb.rulesets, iterations)))
    paths = [str(p) for p in _builtin_paths()] + [str(rb.path) for rb, _, _ in user]
    texts = [read_rulebook_text(p) for p in _builtin_paths()] + [rb.text for rb, _, _ in user]
    h = hashlib.sha256()
    for t in texts + [sched_text]:          # the texts the worker loads, each read once
        h.update(hashlib.sha256(t.encode()).digest())
    for ph, cmd in extra:
        h.update((ph + cmd).encode())
    return RuleConfig(tuple(paths), str(sched), tuple(extra), h.hexdigest()[:16], tuple(texts), sched_text)


def use(path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> Rulebook:
    """Activate a user rulebook: validated now (file:line errors); its rulesets run for
    ``iterations`` rounds at the end of ``phase`` from the next realize on. The plan cache is keyed
    by the active rules, so every program is planned again under the new rules."""
    rb = load_rulebook(path)
    validate([rb])
    _user.append((rb, phase, iterations))
    try:
        active_config()
    except RulebookError:
        _user.pop()
        raise
    return rb


def unuse(path: str | Path) -> None:
    p = Path(path).resolve()
    before = len(_user)
    _user[:] = [u for u in _user if u[0].path != p]
    if len(_user) == before:
        raise ValueError(f"rulebook {path} is not in use (active: {[str(u[0].path) for u in _user]})")


@contextlib.contextmanager
def using(path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> Iterator[Rulebook]:
    rb = use(path, phase, iterations)
    try:
        yield rb
    finally:
        unuse(rb.path)


def use_schedule(path: str | Path | None) -> None:
    """Replace the schedule file (None restores the built-in one). The file is read and validated
    now, once: later changes to it are not seen until ``use_schedule`` is called again."""
    global _schedule
    _schedule = (Path(path), read_schedule_text(path)) if path is not None else None


def reset() -> None:
    """Back to the built-in rulebooks and schedule."""
    global _schedule
    _user.clear()
    _schedule = None


def all_rules(config: RuleConfig | None = None) -> list[Rule]:
    """Every rule of the active (or given) rulebooks, built-in first."""
    from .ir import generated_rulebooks
    cfg = config or active_config()
    out = parse_rulebook(generated_rulebooks(), "<generated>")[1]
    for name, text in cfg.books:
        out += parse_rulebook(text, name)[1]
    return out


def validate(rulebooks: list[Rulebook]) -> None:
    """Load the rulebooks into egglog next to the IR and built-ins; raise RulebookError on failure."""
    from .saturate import default_saturator
    builtin = RuleConfig(tuple(map(str, _builtin_paths())), "")
    names: dict[str, str] = {r.name: r.where for r in all_rules(builtin)}
    for rb in rulebooks:
        for r in rb.rules:
            if r.name in names:
                raise RulebookError(f"{r.where}: rule name {r.name!r} is already used at {names[r.name]}")
            names[r.name] = r.where
    err = default_saturator().validate(builtin.books + [(str(rb.path), rb.text) for rb in rulebooks])
    if err:
        raise RulebookError(err)


def without_rule(cfg: RuleConfig, name: str) -> tuple[RuleConfig | None, str]:
    """``cfg`` with rule ``name`` removed from its rulebook's text, and where it was."""
    for i, (path, text) in enumerate(cfg.books):
        forms = parse(text, path)
        keep = []
        where = ""
        for f in forms:
            kw = keyword_args(f, 3) if f.head != "ruleset" else {}
            if isinstance(kw.get(":name"), Str) and kw[":name"].value == name:
                where = f"{path}:{f.line}"
                continue
            keep.append(to_text(f))
        if where:
            texts = list(cfg.texts)
            texts[i] = "\n".join(keep) + "\n"
            return dataclasses.replace(cfg, texts=tuple(texts), key=cfg.key + "-" + name), where
    return None, ""
