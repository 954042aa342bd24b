"""A small S-expression reader for rulebooks, keeping line numbers for error messages.

egglog parses rulebooks itself; eqgrad reads them too, to validate what a rulebook may contain,
to find each rule's name, pattern and guards for the soundness checker, and to read the
``;; check:`` annotations that precede a rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


class RulebookError(ValueError):
    """A rulebook that cannot be loaded; the message starts with file:line."""


@dataclass(frozen=True)
class Sym:
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Str:
    value: str

    def __repr__(self) -> str:
        return f'"{self.value}"'


Atom = Union[Sym, Str, int, float]


@dataclass
class SList:
    items: list["SExpr"]
    line: int = 0
    comments: list[str] = field(default_factory=list)   # ';;' lines right before a top-level form

    def __repr__(self) -> str:
        return "(" + " ".join(map(repr, self.items)) + ")"

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    @property
    def head(self) -> str | None:
        return self.items[0].name if self.items and isinstance(self.items[0], Sym) else None


SExpr = Union[SList, Atom]


def _atom(tok: str) -> Atom:
    try:
        return int(tok)
    except ValueError:
        pass
    if tok in ("NaN", "inf", "-inf"):
        return float(tok.lower())
    try:
        if any(c in tok for c in ".eE") and tok[0] in "-+.0123456789":
            return float(tok)
    except ValueError:
        pass
    return Sym(tok)


def parse(text: str, filename: str = "<text>") -> list[SList]:
    """Top-level forms of ``text``; raises RulebookError with file:line on unbalanced input."""
    forms: list[SList] = []
    stack: list[SList] = []
    pending: list[str] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            j = i
            while j < n and text[j] in " \t\r":
                j += 1
            if not stack and (j >= n or text[j] == "\n"):
                pending = []      # a blank line separates a comment block from the next form
        elif c.isspace():
            i += 1
        elif c == ";":
            j = text.find("\n", i)
            j = n if j < 0 else j
            if not stack:
                pending.append(text[i:j].lstrip(";").strip())
            i = j
        elif c == "(":
            lst = SList([], line)
            if not stack:
                lst.comments, pending = pending, []
            stack.append(lst)
            i += 1
        elif c == ")":
            if not stack:
                raise RulebookError(f"{filename}:{line}: unbalanced ')'")
            done = stack.pop()
            if stack:
                stack[-1].items.append(done)
            else:
                forms.append(done)
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise RulebookError(f"{filename}:{line}: unterminated string")
            tok: SExpr = Str(text[i + 1:j])
            if not stack:
                raise RulebookError(f"{filename}:{line}: a value outside any form")
            stack[-1].items.append(tok)
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "();\"":
                j += 1
            if not stack:
                raise RulebookError(f"{filename}:{line}: {text[i:j]!r} outside any form")
            stack[-1].items.append(_atom(text[i:j]))
            i = j
    if stack:
        raise RulebookError(f"{filename}:{stack[-1].line}: unbalanced '(' (form never closed)")
    return forms


# egglog 13.2.0 commands that read or write files (its grammar: `output`, `input`, `include`,
# `print-function ... :file`, `print-stats :file`); `fail` wraps a command, so nested forms count too
FILE_COMMANDS = ("output", "input", "include")
FILE_KEYWORD = ":file"


def _file_touching(e: SExpr) -> SList | None:
    """The first form in ``e`` (itself or nested at any depth) that makes egglog touch a file."""
    if not isinstance(e, SList):
        return None
    if e.head in FILE_COMMANDS or any(isinstance(x, Sym) and x.name == FILE_KEYWORD for x in e.items):
        return e
    for x in e.items:
        found = _file_touching(x)
        if found is not None:
            return found
    return None


def reject_file_commands(forms: list[SList], filename: str, what: str) -> None:
    """Raise RulebookError (file:line and the command) if any form would read or write a file.
    Rulebooks and schedules are data: egglog's file commands would let one overwrite or read an
    arbitrary file of the user who runs eqgrad."""
    for f in forms:
        bad = _file_touching(f)
        if bad is not None:
            cmd = bad.head if bad.head in FILE_COMMANDS else f"{bad.head} ... {FILE_KEYWORD}"
            raise RulebookError(f"{filename}:{bad.line or f.line}: ({cmd} ...) reads or writes a file, which is not "
                                f"allowed in a {what} (egglog's output, input, include, print-function :file and "
                                f"print-stats :file are rejected): {to_text(bad)[:80]}")


def keyword_args(form: SList, start: int) -> dict[str, SExpr]:
    """``:name "x" :when (...)`` style options from position ``start`` on."""
    out: dict[str, SExpr] = {}
    items = form.items
    k = start
    while k < len(items):
        it = items[k]
        if isinstance(it, Sym) and it.name.startswith(":") and k + 1 < len(items):
            out[it.name] = items[k + 1]
            k += 2
        else:
            k += 1
    return out


def to_text(e: SExpr) -> str:
    if isinstance(e, SList):
        return "(" + " ".join(to_text(x) for x in e.items) + ")"
    if isinstance(e, Str):
        return f'"{e.value}"'
    if isinstance(e, float):
        return "NaN" if e != e else ("inf" if e == float("inf") else "-inf" if e == float("-inf") else repr(e))
    return str(e) if not isinstance(e, Sym) else e.name
