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
from pathlib import Path
from typing import Iterator

from eqgrad import config
from eqgrad.rules.book import (BUILTIN_RULEBOOKS, DEFAULT_PHASE, DEFAULT_SCHEDULE, RULEBOOK_DIR, Rule,
                               Rulebook, RuleConfig, builtin_config, builtin_paths, load_rulebook,
                               parse_rulebook, read_rulebook_text, read_schedule, read_schedule_text,
                               split_schedule, without_rule)
from eqgrad.rules.ir import generated_rulebooks
from eqgrad.rules.saturate import default_saturator
from eqgrad.rules.sexpr import RulebookError

__all__ = ["BUILTIN_RULEBOOKS", "DEFAULT_PHASE", "DEFAULT_SCHEDULE", "RULEBOOK_DIR", "Rule", "Rulebook", "RuleConfig",
           "RulebookError", "active_config", "all_rules", "builtin_config", "load_rulebook", "parse_rulebook",
           "read_rulebook_text", "read_schedule", "read_schedule_text", "reset", "split_schedule", "use",
           "use_schedule", "using", "unuse", "validate", "without_rule"]


_user: list[tuple[Rulebook, str, int]] = []
_schedule: tuple[Path, str] | None = None          # (path, validated text) from use_schedule


def phase_commands(rulesets: list[str], iterations: int = 4) -> str:
    """Commands that run a user rulebook's rulesets inside a phase: bounded repeats, each run
    stopping early once the e-graph reaches the node limit (checked between iterations)."""
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
    state = (tuple((str(rb.path), rb.digest, ph, it) for rb, ph, it in _user), _schedule,
             os.environ.get("EQGRAD_RULEBOOKS", ""), os.environ.get("EQGRAD_SCHEDULE", ""),
             config.EGRAPH_NODES.value)
    if state not in _config_memo:
        _config_memo.clear()
        _config_memo[state] = _make_config()
    return _config_memo[state]


def _make_config() -> RuleConfig:
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
    paths = [str(p) for p in builtin_paths()] + [str(rb.path) for rb, _, _ in user]
    texts = [read_rulebook_text(p) for p in builtin_paths()] + [rb.text for rb, _, _ in user]
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
    cfg = config or active_config()
    out = parse_rulebook(generated_rulebooks(), "<generated>")[1]
    for name, text in cfg.books:
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
        raise RulebookError(err)
