"""Rulebooks as data: reading and checking ``.egg`` files and schedules, and ``RuleConfig`` (what one
saturation runs). Which rulebooks are active, and validating them in egglog, is ``rulebook.py``.

A rulebook is a ``.egg`` file of rules only. Loading one checks, before egglog sees it:

- it contains only ``(ruleset ...)``, ``(rewrite ...)``, ``(birewrite ...)`` and ``(rule ...)``
  forms (no sorts, constructors, functions, lets or commands: the IR is eqgrad's);
- every rewrite/rule has a unique ``:name "..."`` and a ``:ruleset`` the file declares;
- every function it calls is an IR constructor, an analysis (``shape``, ``dtype``) or an egglog
  primitive.

A schedule is phases (``;; phase NAME`` lines) of egglog commands; a number that would duplicate a
flag is written ``{EGRAPH_NODES}`` and substituted with the flag's value whenever the schedule is
split into phases (SCHEDULE_FLAGS). The rule families generated from the op table
(``families.py``) run before every configuration's rulebooks unless ``RuleConfig.generated`` is
False (a ``rules dump`` holds them as rulebooks).

Rulebooks and schedules are data: a form that makes egglog read or write a file (``output``,
``input``, ``include``, ``print-function ... :file``, ``print-stats :file``, at any depth) is
rejected in both, with file:line and the command. Each file is read ONCE; the text that was
validated is the text the worker loads (egglog never sees the path).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import importlib.resources
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eqgrad import config
from eqgrad.cache import computed_once
from eqgrad.ops import OPS
from eqgrad.rules.families import families
from eqgrad.rules.ranks import base_name, expand as expand_ranks, share_annotations
from eqgrad.rules.sexpr import (RulebookError, SExpr, SList, Str, Sym, keyword_args, parse,
                                reject_file_commands, to_text)

# an egglog f64 literal (a dot or an exponent makes it one: i64 sizes have neither), and a comment
_FLOAT_LITERAL = re.compile(r"(?<![\w.\"-])(-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+))(?![\w.])")
_COMMENT = re.compile(r";[^\n]*")


def _rulebook_dir() -> Path:
    """The folder of the built-in rulebooks. pyproject.toml ships the top-level ``rulebooks/`` as the
    package ``eqgrad.rulebooks``, so an installed wheel and an editable install find it with
    ``importlib.resources``; a plain checkout on PYTHONPATH has no such package, and its
    ``rulebooks/`` sits next to ``eqgrad/``. The files are read by path (their paths name them in
    error messages), so a zipped install is not supported.

    The checkout's own folder comes first: with one checkout installed editable, another one run
    from PYTHONPATH (an old worktree, for a before/after benchmark) found the *installed* package's
    rulebooks through ``importlib.resources`` and ran its own code against newer rules."""
    sibling = Path(__file__).resolve().parents[2] / "rulebooks"
    if (sibling / "schedule.egg").is_file():
        return sibling
    try:
        schedule = importlib.resources.files("eqgrad.rulebooks").joinpath("schedule.egg")
    except ModuleNotFoundError:
        schedule = None
    if isinstance(schedule, Path) and schedule.is_file():
        return schedule.parent.resolve()
    return sibling


RULEBOOK_DIR = _rulebook_dir()
BUILTIN_RULEBOOKS = ("movement.egg", "algebra.egg", "fusion.egg", "contraction.egg")
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


_ATTR_WORDS = {"IVec": "an integer vector (IVec: (vec-of 0 1) or (vec-empty))", "String": "a dtype string (\"float32\")",
               "i64": "an integer (i64)", "f64": "a number (f64)"}


def signature(o: Any) -> str:
    """What an IR constructor takes, in words: ``Sum takes a tensor and an integer vector ...``."""
    parts = (["a tensor"] if o.arity == 1 else [f"{o.arity} tensors"] if o.arity else []) + \
        [_ATTR_WORDS.get(a, a) for a in o.attrs]
    words = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1] if parts else "nothing"
    example = " ".join([o.egg] + [f"x{i}" if o.arity > 1 else "x" for i in range(o.arity)] +
                       [{"IVec": "axes", "String": "dtype", "i64": "n", "f64": "v"}.get(a, a) for a in o.attrs])
    return f"{o.egg} takes {words}: ({example})"


def check_terms(e: SExpr, where: str, rule: str, constructors: dict[str, Any]) -> None:
    """Constructor arities and argument kinds in a rule's term ``e``, checked before egglog sees it
    (whose errors name its own internal terms): a constructor with the wrong number of arguments,
    or an egglog number function (``neg``, ``max``, a literal) where a tensor is expected, is a
    RulebookError at the rule's file:line that shows the user's own term."""
    if not isinstance(e, SList) or not e.items:
        return
    head = e.items[0]
    args = e.items[1:]
    ln = f"{where.rsplit(':', 1)[0]}:{e.line}" if e.line else where
    if isinstance(head, Sym) and head.name in constructors:
        o = constructors[head.name]
        if len(args) != o.arity + len(o.attrs):
            raise RulebookError(f"{ln}: rule {rule!r}: {to_text(e)} -- {signature(o)}; got {len(args)} "
                                f"argument{'s' if len(args) != 1 else ''}")
        for a in args[:o.arity]:
            if isinstance(a, SList) and a.items and isinstance(a.items[0], Sym) and a.items[0].name not in constructors:
                fn = a.items[0].name
                twin = next((c for c in constructors if c.lower() == fn.lower()), None)
                hint = f"; the IR's tensor op is {twin} (constructors are capitalized)" if twin else ""
                raise RulebookError(f"{ln}: rule {rule!r}: {to_text(a)} is a tensor argument of {head.name}, but "
                                    f"{fn!r} is not an IR constructor (an egglog number function or analysis){hint}")
            if not isinstance(a, (SList, Sym)):
                raise RulebookError(f"{ln}: rule {rule!r}: {to_text(a)} is a tensor argument of {head.name}: a "
                                    f"constant tensor is (Const VALUE \"dtype\" SHAPE)")
    elif isinstance(head, Sym):
        twin = next((c for c in constructors if c.lower() == head.name.lower() and c != head.name), None)
        if twin and any(isinstance(a, SList) and a.items and isinstance(a.items[0], Sym)
                        and a.items[0].name in constructors for a in args):
            raise RulebookError(f"{ln}: rule {rule!r}: {to_text(e)} applies egglog's number function "
                                f"{head.name!r} to a tensor; the IR's tensor op is {twin}")
    for a in args if isinstance(head, Sym) else e.items:
        check_terms(a, ln, rule, constructors)


REALIZE_VARIANTS_MAX = 15      # through-Realize variants generated per rewrite direction (below)
REALIZE_SUFFIX = "~realize"    # their names: the user's rule name, this, a number


def _wrap_paths(e: SExpr, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths of the constructor calls nested in tensor argument slots of ``e`` (not inside or at
    a Realize/Contiguous): the children a program inserted unfused wraps in ``Realize``."""
    if not isinstance(e, SList) or not e.items or not isinstance(e.items[0], Sym):
        return []
    o = next((o for o in OPS.values() if o.egg == e.items[0].name), None)
    if o is None or o.kind == "boundary":
        return []
    out = []
    for i, a in enumerate(e.items[1:1 + o.arity], start=1):
        if isinstance(a, SList) and a.items and isinstance(a.items[0], Sym) and a.items[0].name in \
                {p.egg for p in OPS.values() if p.kind != "boundary"}:
            out.append(path + (i,))
            out += _wrap_paths(a, path + (i,))
    return out


def _wrapped(e: SExpr, paths: set[tuple[int, ...]], path: tuple[int, ...] = ()) -> SExpr:
    if not isinstance(e, SList):
        return e
    items = [_wrapped(a, paths, path + (i,)) if i else a for i, a in enumerate(e.items)]
    out = SList(items, e.line)
    return SList([Sym("Realize"), out], e.line) if path in paths else out


def through_realize(rules: list[Rule]) -> str:
    """Rewrites that let a user's rules match the program as it is inserted (docs/rulebooks.md,
    "Phases"): every argument of every op is wrapped in ``Realize`` until the fusion phase, so a
    pattern ``(Mul (Exp2 a) (Exp2 b))`` matches nothing in the movement and algebra phases. For
    each rewrite (both directions of a birewrite) this adds the variants whose nested constructor
    calls are wrapped in ``Realize`` (every non-empty subset, at most REALIZE_VARIANTS_MAX), with
    the same right side and guards, named ``NAME~realize1``, .... They are sound when the rule is:
    ``Realize`` is the identity on values. ``rule`` forms are left as written."""
    out = []
    for r in rules:
        if r.kind not in ("rewrite", "birewrite") or r.rhs is None:
            continue
        when = f" :when ({' '.join(to_text(g) for g in r.guards)})" if r.guards else ""
        k = 0
        for lhs, rhs in [(r.lhs, r.rhs)] + ([(r.rhs, r.lhs)] if r.kind == "birewrite" else []):
            paths = _wrap_paths(lhs)
            subsets = [s for n in range(1, len(paths) + 1) for s in itertools.combinations(paths, n)]
            if len(subsets) > REALIZE_VARIANTS_MAX:      # the all-wrapped form and each single wrap
                subsets = [tuple(paths)] + [(p,) for p in paths][:REALIZE_VARIANTS_MAX - 1]
            for s in subsets:
                k += 1
                out.append(f"(rewrite {to_text(_wrapped(lhs, set(s)))} {to_text(rhs)}{when} "
                           f":ruleset {r.ruleset} :name \"{r.name}{REALIZE_SUFFIX}{k}\")")
    return "\n".join(out)


def _annotations(comments: list[str]) -> set[str]:
    out: set[str] = set()
    for c in comments:
        if c.lower().startswith("check:"):
            out |= {w.strip() for w in c.split(":", 1)[1].split(",") if w.strip()}
    return out


def parse_rulebook(text: str, filename: str) -> tuple[list[str], list[Rule]]:
    text = expand_ranks(text, filename)     # rank-generic templates (ranks.py): one rule per rank
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
        ctor_ops = {o.egg: o for o in OPS.values()}
        for x in f.items[1:n_pos] + guards:
            check_terms(x, where, name.value, ctor_ops)
        if f.head in ("rewrite", "birewrite"):
            for side in f.items[1:3]:
                if not (isinstance(side, Sym) or (isinstance(side, SList) and side.head in constructors)):
                    raise RulebookError(f"{where}: rule {name.value!r}: {to_text(side)} -- both sides of a "
                                        f"{f.head} are IR terms: a constructor ({', '.join(sorted(constructors)[:6])}, "
                                        "...) or a variable")
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
    share_annotations(rules)
    return rulesets, rules


def load_rulebook(path: str | Path) -> Rulebook:
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such rulebook file")
    text = expand_ranks(p.read_text(), str(p))     # the text loaded: rank-generic rules expanded
    rulesets, rules = parse_rulebook(text, str(p))
    return Rulebook(p.resolve(), rulesets, rules, hashlib.sha256(text.encode()).hexdigest()[:16], text)


def read_rulebook_text(path: str | Path) -> str:
    """A rulebook file's text, read once and checked for file-touching commands (the built-ins and
    fixed configurations; user rulebooks go through the full checks of :func:`load_rulebook`)."""
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such rulebook file")
    text = expand_ranks(p.read_text(), str(p))
    reject_file_commands(parse(text, str(p)), str(p), "rulebook")
    return text


def read_schedule_text(path: str | Path) -> str:
    """A schedule file's text, read once and validated (phases, no file-touching commands)."""
    p = Path(path)
    if not p.is_file():
        raise RulebookError(f"{p}: no such schedule file")
    text = p.read_text()
    split_schedule(text, str(p))
    return text


def read_schedule(path: Path) -> list[tuple[str, str]]:
    """Split a schedule file into (phase name, egglog commands) at ';; phase NAME' lines."""
    return split_schedule(Path(path).read_text(), str(path))


# Flags a schedule may name as ``{NAME}``: the numbers that would otherwise duplicate them (the
# algebra phase's size guard is the e-graph node limit). Substituted with the flag's value whenever
# the schedule is split into phases, so a run, its plan-cache key and ``rules dump`` see one value.
SCHEDULE_FLAGS: dict[str, config.Flag] = {"EGRAPH_NODES": config.EGRAPH_NODES}


def resolve_schedule(text: str, filename: str) -> str:
    """``text`` with each ``{NAME}`` of SCHEDULE_FLAGS replaced by the flag's current value."""
    def sub(m: re.Match) -> str:
        flag = SCHEDULE_FLAGS.get(m.group(1))
        if flag is None:
            line = text.count("\n", 0, m.start()) + 1
            raise RulebookError(f"{filename}:{line}: unknown placeholder {m.group(0)} in a schedule; a schedule may "
                                f"name {', '.join('{' + k + '}' for k in SCHEDULE_FLAGS)} (substituted with the "
                                "flag's value)")
        return str(flag.value)
    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, text)


def split_schedule(text: str, filename: str) -> list[tuple[str, str]]:
    """Split a schedule's text into (phase name, egglog commands) at ';; phase NAME' lines, with its
    ``{FLAG}`` placeholders substituted (:func:`resolve_schedule`); raises RulebookError
    (file:line) on unbalanced forms, an unknown placeholder or a command that reads or writes a file."""
    text = resolve_schedule(text, filename)
    reject_file_commands(parse(text, filename), filename, "schedule")
    phases: list[tuple[str, str]] = []
    name, buf = None, []
    for line in text.splitlines():
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
        raise RulebookError(f"{filename}: no ';; phase NAME' sections found")
    return phases


# ------------------------------------------------------------------ worker side


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
    schedule_text: str = ""                         # the schedule's validated text (placeholders unresolved)
    generated: bool = True                          # the generated families (families.py) load first;
                                                    # False: the rulebooks hold them (a `rules dump`)
    user_rules: tuple[tuple[str, str, str], ...] = ()   # (name, phase, file:line) of the user's rules

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

    @property
    def sources(self) -> list[tuple[str, str]]:
        """(name, text) of everything that runs: the generated families (named ``<generated:NAME>``;
        the worker loads its own copy of them, see saturate.py) and then the rulebooks."""
        return ([(f.source, f.text) for f in families()] if self.generated else []) + self.books

    @computed_once
    def inspected_constants(self) -> frozenset[float]:
        """Every float literal in what runs (the generated families, the rulebooks, the extra
        commands), and its negation: the constant values a rule can match on (``(Const 0.0 ..)``)
        or test (``:when ((= a 2.0))``). A float constant of a program whose value is not here is
        a runtime parameter (graph/program.py ``ParamLeaf``): no rule can tell it from another
        value, so it need not be part of the plan's structure. A superset is always sound: a
        parameter is an opaque leaf, so the price of missing a value is a lost rewrite, never a
        wrong one. (The built-in rules name 0.0 and 1.0 only.)"""
        text = "\n".join([t for _, t in self.sources] + [c for _, c in self.extra])
        vals = {float(m) for m in _FLOAT_LITERAL.findall(_COMMENT.sub("", text))}
        return frozenset(vals | {-v for v in vals})


    @computed_once
    def constant_writers(self) -> tuple[str, ...]:
        """The rules in what runs, other than ``RESIZE_EXPLAINED``, that write a value graph/resize.py
        cannot account for: a ``Const`` computed from a size (its value converts an integer,
        ``(Const (to-f64 ..) ..)``: sizes are the only integers a rule reads) or a ``Size`` that is
        not one size of a shape (``(Size (* a b) ..)``, a literal). While one runs, a plan constant
        that is neither the program's nor a size may depend on sizes in ways resize cannot see, and
        refuses the resize (graph/resize.py ``rule_writers``). A literal or a value
        computed from matched constants is the same at every size: resize keeps it. (A rule that
        only matches such a value is counted too: that costs a resize, never a wrong answer.)"""
        out: list[str] = []
        for path, text in self.sources:
            out += _constant_writers_of(path, text)
        return tuple(dict.fromkeys(out))


_WRITERS: dict[tuple[str, str], tuple[str, ...]] = {}     # (path, text) -> its constant writers


def _constant_writers_of(path: str, text: str) -> tuple[str, ...]:
    """``RuleConfig.constant_writers`` of one rulebook's text, worked out once per process: every
    RuleConfig (a session's rules, a Context's) asked it again at its first resize, by parsing all
    ~230 built-in rules twice -- 60-70 % of a jitted step's cost at a new batch size. A text that
    mentions neither ``to-f64`` nor ``Size`` writes no such value and is not parsed."""
    hit = _WRITERS.get((path, text))
    if hit is not None:
        return hit
    out: list[str] = []
    code = _candidate_forms(_COMMENT.sub("", text))
    if code.strip():
        for f in parse(code, path):
            if f.head == "ruleset" or not _writes_constant(f):
                continue
            kw = keyword_args(f, 3)
            name = kw[":name"].value if isinstance(kw.get(":name"), Str) else f"{path}:{f.line}"
            if base_name(name.split(REALIZE_SUFFIX)[0]) not in RESIZE_EXPLAINED:
                out.append(name)
    if len(_WRITERS) > 256:
        _WRITERS.clear()
    hit = _WRITERS[(path, text)] = tuple(out)
    return hit


_PAREN_OR_STRING = re.compile(r'"(?:\\.|[^"\\])*"|[()]')


def _candidate_forms(code: str) -> str:
    """``code`` (comments removed) with only its top-level forms that mention ``to-f64`` or ``Size``
    kept, the others replaced by their newlines (the kept forms keep their line numbers): the
    generated analysis rules (18 KB, one ``Size`` among 71 rules) took 10 ms to parse whole, on
    the path of a jitted step's first call at a new batch size."""
    if "to-f64" not in code and "Size" not in code:
        return ""
    out, depth, start, last = [], 0, 0, 0
    for m in _PAREN_OR_STRING.finditer(code):
        t = m.group()
        if t == "(":
            if depth == 0:
                start = m.start()
            depth += 1
        elif t == ")" and depth > 0:
            depth -= 1
            if depth == 0:
                form = code[start:m.end()]
                out.append("\n" * code.count("\n", last, start))
                out.append(form if "to-f64" in form or "Size" in form else "\n" * form.count("\n"))
                last = m.end()
    out.append(code[last:])      # an unclosed form: parse reports it
    return "".join(out)


# The built-in rules that write a size: expand-sum, as ``(Size (vec-get s a) ..)``, which resize
# gives its new size (tests/test_resize.py checks that no other built-in rule writes one).
RESIZE_EXPLAINED = frozenset({"expand-sum"})


def _writes_constant(rule: str | SExpr) -> bool:
    """Does the rule (its text, or parsed) write a ``Const`` computed from a size (its value holds
    ``to-f64``), or a ``Size`` that is not one size of a shape (``(vec-get s a)``) or a matched
    ``Size``'s value?"""
    def bad(e: SExpr) -> bool:
        if not isinstance(e, SList):
            return False
        if e.head == "Const" and len(e) > 1 and _mentions(e[1], "to-f64"):
            return True
        if e.head == "Size" and len(e) > 1 and not (isinstance(e[1], Sym) or
                                                   (isinstance(e[1], SList) and e[1].head == "vec-get")):
            return True
        return any(bad(x) for x in e.items)
    return any(bad(f) for f in (parse(rule) if isinstance(rule, str) else [rule]))


def _mentions(e: SExpr, name: str) -> bool:
    if isinstance(e, Sym):
        return e.name == name
    return isinstance(e, SList) and any(_mentions(x, name) for x in e.items)


def builtin_paths() -> list[Path]:
    return [RULEBOOK_DIR / r for r in BUILTIN_RULEBOOKS]


_builtin: list[RuleConfig] = []


def builtin_config() -> RuleConfig:
    """The built-in rulebooks under the built-in schedule (read once per process)."""
    if not _builtin:
        _builtin.append(RuleConfig(tuple(map(str, builtin_paths())), str(DEFAULT_SCHEDULE)))
    return _builtin[0]


def without_rule(cfg: RuleConfig, name: str) -> tuple[RuleConfig | None, str]:
    """``cfg`` with rule ``name`` removed from its rulebook's text, and where it was. A generated
    rule is removed from its family's text, which then travels as a rulebook (``generated=False``)."""
    n_gen = len(cfg.sources) - len(cfg.books)
    for i, (path, text) in enumerate(cfg.sources):
        forms = parse(text, path)
        keep = []
        where = ""
        for f in forms:
            kw = keyword_args(f, 3) if f.head != "ruleset" else {}
            if isinstance(kw.get(":name"), Str) and (kw[":name"].value == name or
                                                     kw[":name"].value.startswith(name + REALIZE_SUFFIX) or
                                                     base_name(kw[":name"].value) == name):
                where = where or f"{path}:{f.line}"          # the rule itself (its variants follow it)
                continue
            keep.append(to_text(f))
        if where:
            names, texts = zip(*cfg.sources)
            texts = list(texts)
            texts[i] = "\n".join(keep) + "\n"
            if i >= n_gen:              # a rulebook's rule: the generated families stay the worker's
                names, texts = names[n_gen:], texts[n_gen:]
            return dataclasses.replace(cfg, rulebooks=tuple(names), texts=tuple(texts), key=cfg.key + "-" + name,
                                       generated=cfg.generated and i >= n_gen), where
    return None, ""
