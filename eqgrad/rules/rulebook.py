"""Which rulebooks are active, and checking user rulebooks in egglog before they are.

Active rulebooks: the built-ins, plus user rulebooks added with :func:`use` / :func:`using` or the
``EQGRAD_RULEBOOKS`` environment variable (``path[@phase]`` items separated by ``:``; a directory
means every ``*.egg`` in it). A user rulebook's rulesets run in a phase of the schedule (default
``cleanup``, after fusion, where patterns can see across fused ops). ``EQGRAD_SCHEDULE`` or
:func:`use_schedule` replaces the schedule file. A rulebook file is read once, when it is
activated: changing or swapping the file afterwards has no effect until it is activated again.

Reading and checking one file is ``book.py`` (re-exported here).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Iterator

from eqgrad import config
from eqgrad.rules.book import (BUILTIN_RULEBOOKS, DEFAULT_PHASE, DEFAULT_SCHEDULE, RULEBOOK_DIR, Rule,
                               Rulebook, RuleConfig, builtin_config, builtin_paths, load_rulebook,
                               parse_rulebook, read_rulebook_text, read_schedule, read_schedule_text,
                               resolve_schedule, split_schedule, through_realize, without_rule)
from eqgrad.rules.ranks import base_name
from eqgrad.rules.families import generated_rulebooks
from eqgrad.rules.saturate import default_saturator
from eqgrad.rules.sexpr import RulebookError

__all__ = ["BUILTIN_RULEBOOKS", "DEFAULT_PHASE", "DEFAULT_SCHEDULE", "RULEBOOK_DIR", "Rule", "Rulebook", "RuleConfig",
           "RulebookError", "active_config", "all_rules", "builtin_config", "load_rulebook", "parse_rulebook",
           "read_rulebook_text", "read_schedule", "read_schedule_text", "reset", "RuleState", "split_schedule", "use",
           "use_schedule", "using", "unuse", "validate", "without_rule"]


def phase_commands(rulesets: list[str], iterations: int = 4, rerun: list[str] = ()) -> str:
    """Commands that run a user rulebook's rulesets inside a phase: bounded repeats, each run
    stopping early once the e-graph reaches the node limit (checked between iterations). After the
    user's rulesets, each round re-runs ``rerun`` -- the built-in rulesets of the schedule's phases
    up to this one (``schedule_rulesets``) -- over what they added, so a user rule's output is
    simplified, moved and fused as the program's own terms were (fusion to saturation)."""
    limit = config.EGRAPH_NODES.value
    until = f":until (>= (get-size!) {limit})"
    runs = " ".join(f"(run {r} {until})" for r in rulesets)
    again = " ".join(f"(run {r} {until})" for r in rerun if r != "fusion")
    fuse = " (saturate (seq (run fusion) (saturate analysis)))" if "fusion" in rerun else ""
    return f"(run-schedule (repeat {iterations} (seq {runs} (saturate analysis) {again} (saturate analysis){fuse})))"


_RUN = re.compile(r"\(run(?:-with\s+\S+)?\s+([\w-]+)")


def schedule_rulesets(phases: list[tuple[str, str]], phase: str) -> list[str]:
    """The rulesets the schedule runs in its phases up to and including ``phase`` (not analysis,
    which every round saturates), in first-run order."""
    out: list[str] = []
    for name, text in phases:
        out += [r for r in _RUN.findall(text) if r not in out and r != "analysis"]
        if name == phase:
            break
    return out


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
    if out:
        # NOTE: validated as use() validates: a rulebook egglog rejects is a RulebookError at the next
        # realize (it was a warning on every realize and the unoptimized plan)
        try:
            validate([rb for rb, _, _ in out])
        except RulebookError as e:
            raise RulebookError(f"EQGRAD_RULEBOOKS={raw!r}: {e}") from None
    return out


MEMO_SIZE = 8       # configurations memoized per RuleState (EGRAPH_NODES may differ per thread)


class RuleState:
    """Which user rulebooks and schedule are active: the state behind :func:`use`, :func:`unuse`,
    :func:`using`, :func:`use_schedule`, :func:`reset` and :func:`active_config`, which act on
    ``DEFAULT``, the default session's. Each ``eqgrad.engine.Session`` holds one (its ``rules``),
    with the same methods.

    Threads may share one: every read and change holds its lock (before, ``active_config`` could
    clear the memo between another thread's check and its read: KeyError). A change applies to
    every thread that realizes with this state; for rules of one thread only, give the thread its
    own Session."""

    def __init__(self) -> None:
        self.user: list[tuple[Rulebook, str, int]] = []
        self.schedule: tuple[Path, str] | None = None      # (path, validated text) from use_schedule
        self._memo: dict[tuple, RuleConfig] = {}
        self._lock = threading.RLock()

    def config(self) -> RuleConfig:
        """The active configuration (memoized on this state and the environment variables)."""
        with self._lock:
            key = (tuple((str(rb.path), rb.digest, ph, it) for rb, ph, it in self.user), self.schedule,
                   config.raw_env("EQGRAD_RULEBOOKS"), config.raw_env("EQGRAD_SCHEDULE"),
                   config.EGRAPH_NODES.value)
            cfg = self._memo.get(key)
            if cfg is None:
                cfg = _make_config(self.user, self.schedule)
                if len(self._memo) >= MEMO_SIZE:
                    self._memo.clear()
                self._memo[key] = cfg
            return cfg

    def use(self, path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> Rulebook:
        """Activate a user rulebook: validated now (file:line errors); its rulesets run for
        ``iterations`` rounds at the end of ``phase`` from the next realize on. The plan cache is
        keyed by the active rules, so every program is planned again under the new rules."""
        rb = load_rulebook(path)
        validate([rb])
        with self._lock:
            self.user.append((rb, phase, iterations))
            try:
                self.config()
            except RulebookError:
                self.user.pop()
                raise
        return rb

    def unuse(self, path: str | Path) -> None:
        p = Path(path).resolve()
        with self._lock:
            kept = [u for u in self.user if u[0].path != p]
            if len(kept) == len(self.user):
                raise ValueError(f"rulebook {path} is not in use (active: {[str(u[0].path) for u in self.user]})")
            self.user[:] = kept

    @contextlib.contextmanager
    def using(self, path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> Iterator[Rulebook]:
        rb = self.use(path, phase, iterations)
        try:
            yield rb
        finally:
            self.unuse(rb.path)

    def use_schedule(self, path: str | Path | None) -> None:
        """Replace the schedule file (None restores the built-in one). The file is read and
        validated now, once: later changes to it are not seen until ``use_schedule`` is called again."""
        sched = (Path(path), read_schedule_text(path)) if path is not None else None
        with self._lock:
            self.schedule = sched

    def reset(self) -> None:
        """Back to the built-in rulebooks and schedule."""
        with self._lock:
            self.user.clear()
            self.schedule = None

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()      # a parent thread may have held it at the fork


DEFAULT = RuleState()       # the default session's rules (eqgrad.engine.default_session().rules)


def active_config() -> RuleConfig:
    """The active configuration of the default session's rules (``RuleState.config``)."""
    return DEFAULT.config()


def _make_config(api_user: list[tuple[Rulebook, str, int]], schedule: tuple[Path, str] | None) -> RuleConfig:
    if schedule is not None:
        sched, sched_text = schedule
    else:
        sched = Path(os.environ.get("EQGRAD_SCHEDULE") or DEFAULT_SCHEDULE)
        sched_text = read_schedule_text(sched)
    user = _env_rulebooks() + list(api_user)
    split = split_schedule(resolve_schedule(sched_text, str(sched)), str(sched))
    phases = {n for n, _ in split}
    extra = []
    for rb, phase, iterations in user:
        if phase not in phases:
            raise RulebookError(f"{rb.path}: phase {phase!r} is not in the schedule {sched} (phases: {sorted(phases)})")
        extra.append((phase, phase_commands(rb.rulesets, iterations, schedule_rulesets(split, phase))))
    paths = [str(p) for p in builtin_paths()] + [str(rb.path) for rb, _, _ in user]
    # a user rulebook runs with its through-Realize variants (book.through_realize), so its patterns
    # match the program as inserted, before fusion as well as after
    texts = [read_rulebook_text(p) for p in builtin_paths()] + \
        [rb.text + "\n;; generated: the rules above, matching through Realize\n" + through_realize(rb.rules)
         for rb, _, _ in user]
    # a rank-generic rule's expansions (NAME@rankR, ranks.py) are reported once, as NAME
    user_rules = tuple(dict.fromkeys((base_name(r.name), phase, r.where) for rb, phase, _ in user for r in rb.rules))
    h = hashlib.sha256()
    # the texts the worker loads, each read once; the schedule as run (its {FLAG}s substituted)
    for t in [generated_rulebooks()] + texts + [resolve_schedule(sched_text, str(sched))]:
        h.update(hashlib.sha256(t.encode()).digest())
    for ph, cmd in extra:
        h.update((ph + cmd).encode())
    return RuleConfig(tuple(paths), str(sched), tuple(extra), h.hexdigest()[:16], tuple(texts), sched_text,
                      user_rules=user_rules)


def use(path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> Rulebook:
    """Activate a user rulebook in the default session's rules (``RuleState.use``)."""
    return DEFAULT.use(path, phase, iterations)


def unuse(path: str | Path) -> None:
    DEFAULT.unuse(path)


def using(path: str | Path, phase: str = DEFAULT_PHASE, iterations: int = 4) -> contextlib.AbstractContextManager[Rulebook]:
    """A user rulebook active in the default session's rules for a block (``RuleState.using``)."""
    return DEFAULT.using(path, phase, iterations)


def use_schedule(path: str | Path | None) -> None:
    """Replace the default session's schedule file (``RuleState.use_schedule``)."""
    DEFAULT.use_schedule(path)


def reset() -> None:
    """The default session's rules back to the built-in rulebooks and schedule."""
    DEFAULT.reset()


def all_rules(config: RuleConfig | None = None) -> list[Rule]:
    """Every rule of the active (or given) configuration: generated families, built-in, user."""
    cfg = config or active_config()
    out: list[Rule] = []
    for name, text in cfg.sources:
        out += parse_rulebook(text, name)[1]
    return out


def validate(rulebooks: list[Rulebook]) -> None:
    """Load the rulebooks into egglog next to the IR and built-ins; raise RulebookError on failure."""
    builtin = RuleConfig(tuple(map(str, builtin_paths())), "")
    names: dict[str, str] = {r.name: r.where for r in all_rules(builtin)}
    for rb in rulebooks:
        for r in rb.rules:
            if r.name in names:
                raise RulebookError(f"{r.where}: rule name {r.name!r} is already used at {names[r.name]}")
            names[r.name] = r.where
    err = default_saturator().validate(builtin.books + [(str(rb.path), rb.text) for rb in rulebooks])
    if err:
        raise RulebookError(egg_error(err, rulebooks))


_EGG_WHERE = re.compile(r"In (\d+):\d+(?:-\d+)? of ([^:\s]+)")


def egg_error(err: str, rulebooks: list[Rulebook]) -> str:
    """egglog's error in the user's terms: its ``In LINE:COL of FILE`` (a basename) becomes the
    rulebook's path, line and the rule there, with the rule's text as written, before egglog's own
    words (which name internal terms such as ``@Neg28``)."""
    m = _EGG_WHERE.search(err)
    if not m:
        return err
    line, base = int(m.group(1)), m.group(2)
    for rb in rulebooks:
        if rb.path.name != base:
            continue
        starts = [r for r in rb.rules if r.line <= line]
        if not starts:
            return f"{rb.path}:{line}: {err}"
        r = max(starts, key=lambda r: r.line)
        return f"{rb.path}:{line}: rule {r.name!r}: {r.text.strip()}\n  egglog: {err.strip()}"
    return err

