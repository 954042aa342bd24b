"""Rank-generic rules: one rule written for every rank, expanded when the rulebook is loaded.

egglog has no elementwise vector arithmetic and cannot match ``(vec-of a b)`` against a vector
(its variables stay ungrounded), so a movement rule about each axis had to be written once per
rank. A ``;; for-rank`` comment before a rule makes it a *template* (docs/rulebooks.md,
"Rank-generic rules")::

    ;; for-rank 1..5
    (rewrite (Shrink (Pad x (vec-of p*) (vec-of q*)) (vec-of p*) (vec-of e*)) x
             :when ((= (shape x) (vec-of n*)) (= e* (+ p* n*))) :ruleset mine :name "shrink-of-pad")

Grammar (R is the rank of one expansion):

- ``;; for-rank A..B`` or ``;; for-rank N`` (0 <= A <= B <= MAX_RANK) in the comment block right
  before a rule (no blank line between): one rule per rank, named ``NAME@rankR``;
- a *starred variable* ``NAME*`` (NAME a variable name) inside ``(vec-of ...)`` stands for the R
  variables ``NAME0 ... NAME{R-1}``; ``#*`` inside ``(vec-of ...)`` for the R indices ``0 ... R-1``;
  a ``(vec-of)`` left empty (rank 0) is ``(vec-empty)``;
- on the matching side (a rewrite's left side and ``:when`` facts; a ``rule``'s query), a
  ``(vec-of ...)`` holding a starred variable is *matched*: it becomes a vector variable (``NAME*``
  for ``(vec-of NAME*)``, ``vec*K`` otherwise) with the facts ``(= (vec-length V) LENGTH)`` and
  ``(= ELEMENT (vec-get V J))`` for each element (egglog grounds the elements through them);
  elsewhere (a right side, actions) it is built: ``(vec-of NAME0 ... NAME{R-1})``;
- a ``:when`` fact, a ``rule`` query fact or an action that holds a starred variable or ``#*``
  outside ``(vec-of ...)`` is *replicated*: once per K in 0..R-1, with ``NAME*`` as ``NAMEK`` and
  ``#*`` as ``K`` (none at rank 0).

Errors (RulebookError, file:line): a bad range, a directive that is not right before a rule or a
second one, a template with no starred variable, a starred variable outside ``(vec-of ...)`` in a
rewrite's sides or in a keyword other than ``:when``, a starred variable next to a plain variable
of its expansion (``p*`` and ``p1``: one rule has one rank), a starred variable in a
``(vec-of ...)`` of a rule without a directive, a ``birewrite`` template (write its two rewrites).

The expansions replace the template in the text that is validated and loaded, all on the
template's first line (the lines after it keep their numbers), so every message and ``Rule.where``
names the template's file:line; the directive line becomes ``;; (expanded) for-rank ...``, so the
text expands to itself again. Reports count the expansions' matches as NAME's (:func:`base_name`).
"""
from __future__ import annotations

import re

from eqgrad.rules.sexpr import RulebookError, SExpr, SList, Str, Sym, keyword_args, parse, to_text

MAX_RANK = 8
RANK_SUFFIX = "@rank"            # an expansion's name: the template's name, this, the rank
DIRECTIVE = re.compile(r"^(\s*;+\s*)(for-rank\b[^\n]*)$", re.M)
INDEX = "#*"
_STAR = re.compile(r"^(#|[A-Za-z_][A-Za-z0-9_\-]*)\*$")
_MAYBE_STAR = re.compile(r"[\w#]\*[\s)]")
_RANK_NAME = re.compile(re.escape(RANK_SUFFIX) + r"\d+")


def base_name(name: str, realize_suffix: str = "~realize") -> str:
    """The rule name reports use: through-Realize variants (``NAME~realizeK``) and rank expansions
    (``NAME@rankR``, a birewrite direction's ``=>``/``<=`` kept) count as the rule they come from."""
    return _RANK_NAME.sub("", name.split(realize_suffix)[0])


def rank_of(name: str) -> int | None:
    """The rank of an expansion ``NAME@rankR`` (None for any other rule)."""
    m = re.search(re.escape(RANK_SUFFIX) + r"(\d+)(?:$|=>|<=|~)", name)
    return int(m.group(1)) if m else None


def _star(e: SExpr) -> str | None:
    """The base name of a starred symbol (``p`` for ``p*``, ``#`` for ``#*``), else None."""
    if isinstance(e, Sym) and e.name != "*":
        m = _STAR.match(e.name)
        if m:
            return m.group(1)
    return None


def _syms(e: SExpr, out: set[str]) -> set[str]:
    if isinstance(e, Sym):
        out.add(e.name)
    elif isinstance(e, SList):
        for x in e.items:
            _syms(x, out)
    return out


def _stars_outside_vec(e: SExpr) -> list[str]:
    """Starred symbols of ``e`` that are not elements of a ``(vec-of ...)``."""
    if _star(e):
        return [e.name]
    if isinstance(e, SList) and e.head != "vec-of":
        return [s for x in e.items for s in _stars_outside_vec(x)]
    return []


def _stars_in_vec(e: SExpr) -> list[str]:
    if isinstance(e, SList):
        if e.head == "vec-of":
            return [x.name for x in e.items[1:] if _star(x)]
        return [s for x in e.items for s in _stars_in_vec(x)]
    return []


class _Expander:
    def __init__(self, rank: int, where: str, rule: str):
        self.rank, self.where, self.rule = rank, where, rule
        self.facts: list[SExpr] = []           # element facts of the matched vectors
        self.vecs: dict[str, str] = {}          # a matched (vec-of ...)'s text -> its vector variable

    def elements(self, items: list[SExpr]) -> list[SExpr]:
        out: list[SExpr] = []
        for x in items:
            b = _star(x)
            if b == "#":
                out += list(range(self.rank))
            elif b is not None:
                out += [Sym(f"{b}{k}") for k in range(self.rank)]
            else:
                out.append(x)
        return out

    def index(self, e: SExpr, k: int) -> SExpr:
        """``e`` with its starred symbols outside (vec-of ...) as the K-th element."""
        b = _star(e)
        if b == "#":
            return k
        if b is not None:
            return Sym(f"{b}{k}")
        if isinstance(e, SList) and e.head != "vec-of":
            return SList([self.index(x, k) for x in e.items], e.line)
        return e

    def build(self, e: SExpr) -> SExpr:
        """A term that is computed: each (vec-of ...) with its stars spelled out."""
        if not isinstance(e, SList):
            return e
        if e.head == "vec-of":
            els = self.elements(e.items[1:])
            return SList([Sym("vec-of")] + els, e.line) if els else SList([Sym("vec-empty")], e.line)
        return SList([self.build(x) for x in e.items], e.line)

    def match(self, e: SExpr) -> SExpr:
        """A term that is matched: each (vec-of ...) holding a starred variable becomes a vector
        variable whose elements are ground by vec-get facts."""
        if not isinstance(e, SList):
            return e
        if e.head == "vec-of" and any(_star(x) not in (None, "#") for x in e.items[1:]):
            key = to_text(e)
            var = self.vecs.get(key)
            if var is None:
                single = len(e.items) == 2 and _star(e.items[1])
                var = f"{single}*" if single else f"vec*{len(self.vecs)}"
                self.vecs[key] = var
                els = self.elements(e.items[1:])
                self.facts.append(SList([Sym("="), SList([Sym("vec-length"), Sym(var)]), len(els)]))
                self.facts += [SList([Sym("="), x, SList([Sym("vec-get"), Sym(var), j])]) for j, x in enumerate(els)]
            return Sym(var)
        return self.build(e) if e.head == "vec-of" else SList([self.match(x) for x in e.items], e.line)

    def replicate(self, fact: SExpr, matched: bool) -> list[SExpr]:
        one = self.match if matched else self.build
        if _stars_outside_vec(fact):
            return [one(self.index(fact, k)) for k in range(self.rank)]
        return [one(fact)]

    def no_stars(self, e: SExpr, what: str) -> None:
        bad = _stars_outside_vec(e)
        if bad:
            raise RulebookError(f"{self.where}: rule {self.rule!r}: starred variable {bad[0]} outside (vec-of ...) "
                                f"in {what}: {to_text(e)[:80]} -- in a pattern or right side a starred variable "
                                "is an element of (vec-of ...); only a :when fact, a query fact or an action that "
                                "holds one is replicated per axis")


def expand_rule(f: SList, rank: int, filename: str) -> SList:
    """The expansion of the template rule ``f`` at ``rank``."""
    where = f"{filename}:{f.line}"
    kw = keyword_args(f, 3)
    name = kw[":name"].value
    x = _Expander(rank, where, name)
    items = f.items
    if f.head == "rewrite":
        x.no_stars(items[1], "the left side")
        x.no_stars(items[2], "the right side")
        lhs = x.match(items[1])
        rhs = x.build(items[2])
        guards = [g for w in (kw[":when"].items if isinstance(kw.get(":when"), SList) else []) for g in x.replicate(w, True)]
        head = [items[0], lhs, rhs]
        rest = items[3:]
    else:          # rule: (rule (QUERY...) (ACTIONS...) ...)
        if not (isinstance(items[1], SList) and isinstance(items[2], SList)):
            raise RulebookError(f"{where}: expected (rule (QUERY...) (ACTIONS...) ...)")
        query = [g for q in items[1].items for g in x.replicate(q, True)]
        actions = [a for act in items[2].items for a in x.replicate(act, False)]
        guards = []
        head = [items[0], SList(query + x.facts, items[1].line), SList(actions, items[2].line)]
        x.facts = []
        rest = items[3:]
    out: list[SExpr] = []
    k = 0
    while k < len(rest):
        it = rest[k]
        if isinstance(it, Sym) and it.name.startswith(":") and k + 1 < len(rest):
            val = rest[k + 1]
            if it.name == ":name":
                out += [it, Str(f"{name}{RANK_SUFFIX}{rank}")]
            elif it.name == ":when":
                pass        # below, with the element facts
            else:
                x.no_stars(val, it.name)
                if _stars_in_vec(val):
                    raise RulebookError(f"{where}: rule {name!r}: a starred variable in {it.name} {to_text(val)}")
                out += [it, val]
            k += 2
        else:
            x.no_stars(it, "the rule")
            out.append(it)
            k += 1
    when = x.facts + guards
    if when:
        out = [Sym(":when"), SList(when)] + out
    return SList(head + out, f.line)


def _parse_ranks(spec: str, where: str) -> list[int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", spec)
    if not m:
        raise RulebookError(f"{where}: bad ;; for-rank range {spec.strip()!r}: expected A..B or N "
                            f"(ranks 0 to {MAX_RANK}), as in ;; for-rank 1..5")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a
    if a > b or b > MAX_RANK:
        raise RulebookError(f"{where}: bad ;; for-rank range {spec.strip()!r}: expected A..B with "
                            f"0 <= A <= B <= {MAX_RANK}")
    return list(range(a, b + 1))


def _spans(text: str) -> list[tuple[int, int, int, int]]:
    """(start offset, end offset, first line, last line) of each top-level form of ``text``
    (parse() has validated its balance)."""
    out = []
    depth, i, n, line = 0, 0, len(text), 1
    start = sline = 0
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == ";":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j
        elif c == "(":
            if depth == 0:
                start, sline = i, line
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append((start, i + 1, sline, line))
        i += 1
    return out


def expand(text: str, filename: str) -> str:
    """``text`` with every ``;; for-rank`` template replaced by its expansions (module doc); a text
    without templates is returned as it is."""
    directives = [(text.count("\n", 0, m.start()) + 1, m) for m in DIRECTIVE.finditer(text)]
    if not directives and not _MAYBE_STAR.search(text):
        return text
    forms = parse(text, filename)
    if not directives:
        for f in forms:
            if f.head in ("rewrite", "birewrite", "rule"):
                bad = _stars_in_vec(f)
                if bad:
                    raise RulebookError(f"{filename}:{f.line}: starred variable {bad[0]} in a rule without a "
                                        "';; for-rank A..B' line before it (rank-generic rules: docs/rulebooks.md)")
        return text
    spans = _spans(text)
    lines = text.split("\n")
    templates: dict[int, list[int]] = {}       # form index -> ranks
    for ln, m in directives:
        where = f"{filename}:{ln}"
        nxt = next((k for k, s in enumerate(spans) if s[2] > ln or s[2] <= ln <= s[3]), None)
        if nxt is None or spans[nxt][2] <= ln or \
                any(not lines[j - 1].strip().startswith(";") for j in range(ln + 1, spans[nxt][2])):
            raise RulebookError(f"{where}: ;; for-rank must be in the comments right before a rule (no blank line "
                                "between)")
        f = forms[nxt]
        if f.head not in ("rewrite", "rule"):
            what = "a birewrite (write its two directions as rewrites)" if f.head == "birewrite" else f"({f.head} ...)"
            raise RulebookError(f"{where}: ;; for-rank before {what}: only a rewrite or a rule can be rank-generic")
        if nxt in templates:
            raise RulebookError(f"{where}: a second ;; for-rank line for the rule at line {f.line}: one rule has one "
                                "range of ranks")
        templates[nxt] = _parse_ranks(m.group(2)[len("for-rank"):], where)
    for k, f in enumerate(forms):
        if k not in templates and f.head in ("rewrite", "birewrite", "rule") and _stars_in_vec(f):
            raise RulebookError(f"{filename}:{f.line}: starred variable {_stars_in_vec(f)[0]} in a rule without a "
                                "';; for-rank A..B' line before it")
    out, pos = [], 0
    for k, (a, b, l0, l1) in enumerate(spans):
        if k not in templates:
            continue
        f = forms[k]
        where = f"{filename}:{f.line}"
        kw = keyword_args(f, 3)
        name = kw[":name"].value if isinstance(kw.get(":name"), Str) else "?"
        if not isinstance(kw.get(":name"), Str):
            raise RulebookError(f"{where}: every rule needs a name: add :name \"...\" to {to_text(f)[:60]}")
        names = _syms(f, set())
        stars = {s[:-1] for s in names if _star(Sym(s)) is not None}
        if not stars:
            raise RulebookError(f"{where}: rule {name!r} has a ;; for-rank line but no starred variable (p* in "
                                "(vec-of p*), #*): its expansions would be the same rule")
        for s in names:
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_\-]*?)(\d+)", s)
            if m and m.group(1) in stars:
                raise RulebookError(f"{where}: rule {name!r} mixes {m.group(1)}* with {s}: {s} is an element of "
                                    f"{m.group(1)}*'s expansion (rename it)")
        exp = [to_text(expand_rule(f, r, filename)) for r in templates[k]]
        out += [text[pos:a], " ".join(exp), "\n" * (l1 - l0)]
        pos = b
    out.append(text[pos:])
    res = "".join(out)
    return DIRECTIVE.sub(lambda m: f"{m.group(1)}(expanded) {m.group(2)}", res)


def share_annotations(rules: list) -> None:
    """The expansions of a template share its ``;; check:`` annotations (the comment block precedes
    the first expansion only: they all stand on the template's line)."""
    ann: dict[tuple[str, str], set[str]] = {}
    for r in rules:
        if rank_of(r.name) is not None:
            ann.setdefault((base_name(r.name), r.where), set()).update(r.check)
    for r in rules:
        if rank_of(r.name) is not None:
            r.check = set(ann[(base_name(r.name), r.where)])
