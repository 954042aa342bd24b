"""Provenance: which rule (or the input program) introduced each e-node.

egglog does not say which rule made an e-node, so a rule configuration is *instrumented*: for every
constructor ``C`` of the IR a function ``prov-of-C`` with ``C``'s argument sorts and a ``String``
value (``:merge old``: the first writer wins) is declared, and

- before any rule runs, a ``provenance`` phase tags every node of the inserted program ``"input"``;
- every rule that builds terms also sets ``prov-of-C`` of each constructor application it builds to
  its own name: a ``rewrite``/``birewrite`` gets a companion rule (``NAME~prov``, same pattern, same
  guards, same ruleset, so it fires on exactly the same matches) whose actions are those sets; a
  ``rule`` gets the sets appended to its actions.

An e-node's key in egglog is its constructor and its (canonical) argument classes, which is also
the key of its ``prov-of-C`` row, so the row names the e-node exactly (extract/egraph.py reads
them into ``EGraph.provenance``). The functions hold strings, never unions, so the classes and the
plan are those of the uninstrumented run -- except near the node limit, which counts the extra rows.
Used by ``explain()`` (a second, instrumented planning; docs/rulebooks.md) and ``rules try``.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from eqgrad.ops import OPS, PROVENANCE_PREFIX as PREFIX
from eqgrad.rules.book import REALIZE_SUFFIX, RuleConfig
from eqgrad.rules.ranks import base_name
from eqgrad.rules.sexpr import SExpr, SList, Str, Sym, keyword_args, parse, to_text

SUFFIX = "~prov"             # a rewrite's companion rule: NAME~prov (folded into NAME in reports)
INPUT = "input"              # the tag of the program's own nodes
PHASE = "provenance"         # the phase, before every other, that tags them


def declarations() -> str:
    """The provenance functions and the ruleset that tags the inserted program's nodes."""
    lines = ["(ruleset prov-input)"]
    for o in OPS.values():
        sorts = " T" * o.arity + "".join(" " + a for a in o.attrs)
        args = " ".join(f"a{i}" for i in range(o.arity + len(o.attrs)))
        lines.append(f"(function {PREFIX}{o.egg} ({sorts.strip()}) String :merge old)")
        lines.append(f'(rule ((= e ({o.egg} {args}))) ((set ({PREFIX}{o.egg} {args}) "{INPUT}")) '
                     f':ruleset prov-input :name "{PREFIX}{o.egg}")')
    return "\n".join(lines) + "\n"


def _constructors() -> dict[str, int]:
    return {o.egg: o.arity + len(o.attrs) for o in OPS.values()}


def _sets(term: SExpr, name: str, ctors: dict[str, int], out: list[str]) -> None:
    """Append a ``(set (prov-of-C args) "name")`` for each constructor application in ``term``."""
    if not isinstance(term, SList) or not term.items:
        return
    for x in term.items[1:]:
        _sets(x, name, ctors, out)
    head = term.head
    if head in ctors and len(term.items) == ctors[head] + 1:
        args = " ".join(to_text(x) for x in term.items[1:])
        out.append(f'(set ({PREFIX}{head} {args}) "{name}")')


def _action_terms(action: SExpr) -> list[SExpr]:
    """The terms an action builds (``union``'s sides, ``let``'s value, ``set``'s arguments)."""
    if not isinstance(action, SList) or not action.items:
        return []
    h = action.head
    if h == "union":
        return list(action.items[1:3])
    if h == "let" and len(action) == 3:
        return [action.items[2]]
    if h == "set" and len(action) == 3 and isinstance(action.items[1], SList):
        return list(action.items[1].items[1:]) + [action.items[2]]
    return []


def _name(form: SList, filename: str) -> str:
    kw = keyword_args(form, 3)
    n = kw.get(":name")
    return n.value if isinstance(n, Str) else f"{Path(filename).name}:{form.line}"


def _companion(lhs: SExpr, rhs: SExpr, form: SList, name: str, ctors: dict[str, int]) -> str | None:
    sets: list[str] = []
    _sets(rhs, name, ctors, sets)
    if not sets:
        return None
    kw = keyword_args(form, 3)
    when = kw.get(":when")
    facts = [f"(= __prov {to_text(lhs)})"] + ([to_text(f) for f in when.items] if isinstance(when, SList) else [])
    rs = kw.get(":ruleset")
    ruleset = f" :ruleset {rs.name}" if isinstance(rs, Sym) else ""
    return f'(rule ({" ".join(facts)}) ({" ".join(sets)}){ruleset} :name "{name}{SUFFIX}")'


def instrument_text(text: str, filename: str) -> str:
    """``text`` (a rulebook) with every term-building rule recording its name (module docstring)."""
    ctors = _constructors()
    out: list[str] = []
    for f in parse(text, filename):
        h = f.head
        if h in ("rewrite", "birewrite") and len(f) >= 3:
            name = _name(f, filename)
            out.append(to_text(f))
            pairs = [(f.items[1], f.items[2], name)]
            if h == "birewrite":
                pairs = [(f.items[1], f.items[2], name + "=>"), (f.items[2], f.items[1], name + "<=")]
            for lhs, rhs, n in pairs:
                c = _companion(lhs, rhs, f, n, ctors)
                if c:
                    out.append(c)
        elif h == "rule" and len(f) >= 3 and isinstance(f.items[2], SList):
            name = _name(f, filename)
            sets: list[str] = []
            for a in f.items[2].items:
                for t in _action_terms(a):
                    _sets(t, name, ctors, sets)
            if sets:
                actions = SList(list(f.items[2].items) + [parse(s)[0] for s in sets])
                f = SList([f.items[0], f.items[1], actions, *f.items[3:]], f.line)
            out.append(to_text(f))
        else:
            out.append(to_text(f))
    return "\n".join(out) + "\n"


def instrument(cfg: RuleConfig) -> RuleConfig:
    """``cfg`` with provenance recorded: the declarations first, every rulebook (and the generated
    families, which then travel as rulebooks) instrumented, and a first phase that tags the input."""
    names, texts = zip(*cfg.sources) if cfg.sources else ((), ())
    texts = tuple(instrument_text(t, n) for n, t in zip(names, texts))
    sched = cfg.schedule_text
    m = re.search(r"^\s*;;\s*phase\s", sched, re.M)
    at = m.start() if m else len(sched)
    sched = sched[:at] + f";; phase {PHASE}\n(run-schedule (saturate prov-input))\n\n" + sched[at:]
    return dataclasses.replace(cfg, rulebooks=("<provenance>", *names), texts=(declarations(), *texts),
                               schedule_text=sched, generated=False, key=cfg.key + SUFFIX)


def rule_of(tag: str) -> str:
    """The rule as its author named it: a birewrite's direction, a through-Realize variant and a
    rank expansion folded (ranks.base_name)."""
    tag = base_name(tag, REALIZE_SUFFIX)
    return tag[:-2] if tag.endswith(("=>", "<=")) else tag
