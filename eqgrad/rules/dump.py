"""Every rule that runs, as ``.egg`` files (``python -m eqgrad rules dump [DIR]``).

A dump of a configuration (the active one by default) is one file per generated family, built-in
rulebook and user rulebook, named so that sorting the names gives the load order
(``00-gen-analysis.egg``, ..., ``03-movement.egg``, ..., ``06-user-mine.egg``), plus
``schedule.egg``: the schedule as it runs, with its ``{FLAG}`` placeholders substituted and each
user rulebook's runs appended to its phase. Every file loads with the ordinary loader:
``python -m eqgrad rules check DIR/*.egg`` checks the dump as a whole configuration, and
:func:`load_dump` gives the :class:`RuleConfig` that runs exactly these files (and nothing
generated besides them).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from eqgrad.rules.book import (SCHEDULE_FLAGS, Rulebook, RuleConfig, builtin_paths, load_rulebook, parse_rulebook,
                               read_schedule_text, resolve_schedule)
from eqgrad.rules.rulebook import active_config, validate
from eqgrad.rules.saturate import default_saturator, schedule_phases
from eqgrad.rules.sexpr import RulebookError, SList, Sym, parse

SCHEDULE_FILE = "schedule.egg"


@dataclass(frozen=True)
class DumpFile:
    family: str        # the generated family's name, or the rulebook's file stem; "schedule"
    kind: str          # generated | built-in | user | schedule
    filename: str      # its name in the dump directory
    source: str        # where it comes from: <generated:NAME> or a path
    count: int         # rules (phases, for the schedule)
    text: str


def source_kind(name: str) -> str:
    """generated, built-in or user, for a (name, text) of ``RuleConfig.sources``."""
    if name.startswith("<generated:"):
        return "generated"
    return "built-in" if Path(name).resolve() in {p.resolve() for p in builtin_paths()} else "user"


def source_label(name: str) -> str:
    """A source as reports name it: ``fusion (generated)``, ``algebra.egg``, a user rulebook's path."""
    if name.startswith("<generated:"):
        return f"{name[len('<generated:'):-1]} (generated)"
    return Path(name).name if source_kind(name) == "built-in" else name


def schedule_used(cfg: RuleConfig) -> str:
    """The schedule exactly as ``cfg`` runs it, as one loadable schedule text."""
    flags = ", ".join(f"{k}={v.value}" for k, v in SCHEDULE_FLAGS.items())
    head = [f";; {SCHEDULE_FILE} -- the schedule used (from {cfg.schedule or 'no file'}), written by",
            f";; `python -m eqgrad rules dump`: flag placeholders substituted ({flags}); each user rulebook's",
            ";; runs appended to its phase."]
    body = [f";; phase {name}\n{text.strip()}\n" for name, text in schedule_phases(cfg)]
    return "\n".join(head) + "\n\n" + "\n".join(body)


def dump_files(cfg: RuleConfig | None = None) -> list[DumpFile]:
    """The files of a dump of ``cfg`` (the active configuration by default), not written."""
    cfg = cfg or active_config()
    out = []
    for i, (name, text) in enumerate(cfg.sources):
        kind = source_kind(name)
        family = name[len("<generated:"):-1] if kind == "generated" else Path(name).stem
        stem = {"generated": f"gen-{family}", "built-in": family, "user": f"user-{family}"}[kind]
        out.append(DumpFile(family, kind, f"{i:02d}-{stem}.egg", name, len(parse_rulebook(text, name)[1]), text))
    phases = schedule_phases(cfg)
    out.append(DumpFile("schedule", "schedule", SCHEDULE_FILE, cfg.schedule, len(phases), schedule_used(cfg)))
    return out


def write_dump(directory: str | Path, cfg: RuleConfig | None = None) -> list[DumpFile]:
    """Write a dump of ``cfg`` into ``directory`` (made if missing; it must hold no other ``.egg``
    files, which ``rules check DIR/*.egg`` would take for part of the dump)."""
    d = Path(directory)
    files = dump_files(cfg)
    d.mkdir(parents=True, exist_ok=True)
    stray = sorted(p.name for p in d.glob("*.egg") if p.name not in {f.filename for f in files})
    if stray:
        raise RulebookError(f"{d}: already holds other .egg files ({', '.join(stray[:5])}); dump into an empty "
                            "directory")
    for f in files:
        (d / f.filename).write_text(f.text)
    return files


def load_dump(directory: str | Path) -> RuleConfig:
    """The configuration a dump directory describes: its rulebooks (each fully validated, in file-name
    order) as the only rules, under its schedule."""
    d = Path(directory)
    sched = d / SCHEDULE_FILE
    books = [load_rulebook(p) for p in sorted(d.glob("*.egg")) if p.name != SCHEDULE_FILE]
    if not books or not sched.is_file():
        raise RulebookError(f"{d}: not a rules dump (expected NN-*.egg rulebooks and {SCHEDULE_FILE})")
    sched_text = read_schedule_text(sched)
    h = hashlib.sha256()
    for t in [rb.text for rb in books] + [sched_text]:
        h.update(hashlib.sha256(t.encode()).digest())
    return RuleConfig(tuple(str(rb.path) for rb in books), str(sched), key="dump-" + h.hexdigest()[:16],
                      texts=tuple(rb.text for rb in books), schedule_text=sched_text, generated=False)


# ------------------------------------------------------------------ checking files as a whole


def is_schedule(path: str | Path) -> bool:
    """Whether a file is a schedule (it has ';; phase NAME' lines) rather than a rulebook."""
    return re.search(r"(?m)^\s*;;\s*phase\s+\S+", Path(path).read_text()) is not None


def validate_whole(rulebooks: list[Rulebook], schedule: str | Path) -> None:
    """Check rulebooks that are a whole configuration (a dump): rule names unique among them, each
    loaded next to the IR only (nothing generated besides them), and the schedule run over them on
    an empty program (it may name only rulesets they declare). Raises RulebookError."""
    names: dict[str, str] = {}
    for rb in rulebooks:
        for r in rb.rules:
            if r.name in names:
                raise RulebookError(f"{r.where}: rule name {r.name!r} is already used at {names[r.name]}")
            names[r.name] = r.where
    sched_text = read_schedule_text(schedule)
    declared = {rs for rb in rulebooks for rs in rb.rulesets}
    for ruleset, line in _rulesets_run(parse(resolve_schedule(sched_text, str(schedule)), str(schedule))):
        if ruleset not in declared:      # egglog itself only panics ("no entry found for key")
            raise RulebookError(f"{schedule}:{line}: the schedule runs ruleset {ruleset!r}, which none of the "
                                f"{len(rulebooks)} rulebooks declares (they declare: {', '.join(sorted(declared))})")
    cfg = RuleConfig(tuple(str(rb.path) for rb in rulebooks), str(schedule), texts=tuple(rb.text for rb in rulebooks),
                     schedule_text=sched_text, generated=False)
    js, rep = default_saturator().run("", rules=cfg)
    if js is None:
        raise RulebookError(f"{schedule}: the schedule does not run over these {len(rulebooks)} rulebooks: "
                            f"{rep.stop_reason} ({rep.detail})")


def _rulesets_run(forms: list, line: int = 0) -> list[tuple[str, int]]:
    """The rulesets that ``(run NAME ...)`` and ``(run-with SCHEDULER NAME ...)`` name, with lines."""
    out = []
    for f in forms:
        if not isinstance(f, SList):
            continue
        ln = f.line or line
        pos = {"run": 1, "run-with": 2}.get(f.head or "")
        if pos is not None and len(f) > pos and isinstance(f[pos], Sym):
            out.append((f[pos].name, ln))
        out += _rulesets_run(f.items, ln)
    return out


def load_files(paths: list[str | Path]) -> tuple[list[Rulebook], Path | None]:
    """Rulebook files (``rules check FILES``), loaded and validated: as user rulebooks next to the
    built-ins, or, when one of the files is a schedule, as a whole configuration under it
    (``rules check DIR/*.egg`` on a dump). Returns the rulebooks and the schedule (or None)."""
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise RulebookError(f"{missing[0]}: no such rulebook file")
    schedules = [Path(p) for p in paths if is_schedule(p)]
    if len(schedules) > 1:
        raise RulebookError(f"expected at most one schedule among the files, got {', '.join(map(str, schedules))}")
    books = [load_rulebook(p) for p in paths if Path(p) not in schedules]
    if schedules:
        validate_whole(books, schedules[0])
    else:
        # a built-in rulebook named on the command line (`rules check rulebooks/movement.egg`) is
        # checked as itself, not validated as a user rulebook next to itself ("already used")
        builtin = {p.resolve() for p in builtin_paths()}
        validate([b for b in books if Path(b.path).resolve() not in builtin])
    return books, (schedules[0] if schedules else None)
