"""The code explains itself from inside the repository: no file of eqgrad/, docs/, tests/, bench/,
rulebooks/ or README.md points its reader at a text the repository does not hold (the design notes
and egglog notes kept next to the project, not in it) or at a tracker number. Such a place says what
it means where it stands, or links the docs/ page that says it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("eqgrad", "docs", "tests", "bench", "rulebooks", "README.md")
SUFFIXES = {".py", ".md", ".egg", ".txt", ".toml"}

# The patterns are built from pieces so that this file does not match them itself.
_OUTSIDE = "|".join((
    r"\b" + "DES" + r"IGN\b",                  # the design page outside the repository
    "sha" + "red/",                            # the folder next to the checkout it lives in
    "no" + r"tes/(egglog|fusion)",             # the notes on egglog and on the fusion prototype
    "egglog-13" + r"\.\d+\.md",
    "fusion-proto" + r"type\.md",
    r"\bQ[1-9][a-e]\b",                        # a question number of those notes
))
_TRACKER = r"\b[Ii]ssue" + r"s? #?\d+"         # a bare tracker number
PATTERNS = {
    "a file outside the repository": re.compile(_OUTSIDE),
    "a tracker number": re.compile(_TRACKER),
}

# Places not fixed yet, file -> how many lines still match: files other work was changing when
# this test was written. Remove an entry (or lower its count) as its places are fixed; a file
# matching more often than listed fails like any other.
PENDING: dict[str, int] = {}      # none left

# Byte-exact copies of an old commit's file (tests/test_rules_data.py checks the copy against git):
# history, not text anyone maintains.
VERBATIM = {"tests/golden/rules/fusion-2addb74.egg"}


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES
                          and "__pycache__" not in f.parts)
    return out


def _places() -> dict[str, list[str]]:
    """file (relative) -> 'file:line: what it points at: the line' for every matching line."""
    found: dict[str, list[str]] = {}
    for f in _files():
        rel = f.relative_to(ROOT).as_posix()
        if rel in VERBATIM:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for what, pat in PATTERNS.items():
                if pat.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{i}: {what}: {line.strip()[:120]}")
                    break
    return found


def test_the_scan_finds_what_it_looks_for():
    """The patterns match the references they are meant to catch (and ordinary text does not)."""
    hits = ["see " + "DES" + "IGN.md, \"Fusion\"", "/work/" + "sha" + "red/notes/x.md", "(" + "iss" + "ue 14)",
            "Iss" + "ue 38 item 5:", "iss" + "ues 16 and 17", "Q" + "1e"]
    misses = ["docs/rulebooks.md", "shared work once per kernel", "the issue: a loop", "Q4 block",
              "designed", "issue-free"]
    for s in hits:
        assert any(p.search(s) for p in PATTERNS.values()), s
    for s in misses:
        assert not any(p.search(s) for p in PATTERNS.values()), s


def test_no_reference_leaves_the_repository():
    found = _places()
    new = [line for rel, lines in sorted(found.items()) if len(lines) > PENDING.get(rel, 0) for line in lines]
    assert not new, ("say what these places mean where they stand, or link the docs/ page that says it:\n"
                     + "\n".join(new))


def test_the_pending_list_is_current():
    """An entry of PENDING whose file now matches less often than listed is removed or lowered, so
    the list only ever names places still to fix."""
    found = _places()
    stale = {rel: (n, len(found.get(rel, []))) for rel, n in PENDING.items() if len(found.get(rel, [])) < n}
    assert not stale, "PENDING lists more places than remain (file: (listed, found)): " + repr(stale)
