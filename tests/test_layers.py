"""The floors of the house (docs/layout.md): imports go downward only, with no cycles.

The imports are read from the source (``ast``), not by importing anything, so this runs in well under
a second and needs no egglog. Imports under ``if TYPE_CHECKING:`` are annotations only and are not
edges.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "eqgrad"

# lowest first; a module may import its own floor and the floors below it
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("eqgrad.ops", "eqgrad.dtype", "eqgrad.errors", "eqgrad.config", "eqgrad.cache",
                "eqgrad.counters", "eqgrad.progress")),
    ("graph", ("eqgrad.graph",)),
    ("stages", ("eqgrad.rules", "eqgrad.extract", "eqgrad.lower", "eqgrad.devices")),
    ("engine", ("eqgrad.engine",)),
    ("frontend", ("eqgrad.frontend", "eqgrad.nn", "eqgrad.optim")),
    ("tools", ("eqgrad.tools",)),
    ("facade", ("eqgrad", "eqgrad.__main__")),
]
# stages are siblings: each may import only these other stages
STAGE_ALLOWED = {"eqgrad.rules": set(), "eqgrad.extract": set(), "eqgrad.lower": set(),
                 "eqgrad.devices": {"eqgrad.lower"}}
# function-local imports of eqgrad modules hide dependencies; only the CLI keeps them, so that
# `python -m eqgrad --help` does not load every stage
LOCAL_IMPORTS_ALLOWED = {"eqgrad.tools.cli"}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for n in ast.walk(node))
    return out


def _target(mod: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    """The eqgrad modules an import statement loads (a name imported from a package counts as
    its submodule when there is one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in MODULES else pkg for a in node.names]
    out = []
    for n in names:
        while n and n not in MODULES:
            n = n.rpartition(".")[0]
        if n:
            out.append(n)
    return out


def _imports() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    local: list[str] = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            targets = [t for t in _target(mod, node, path.name == "__init__.py") if t != mod]
            if not targets:
                continue
            edges[mod].update(targets)
            if id(node) not in top and mod not in LOCAL_IMPORTS_ALLOWED:
                local.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    return edges, local


EDGES, LOCAL = _imports()


def floor_of(mod: str) -> tuple[int, str, str]:
    """(floor index, floor name, the package of the floor the module belongs to)."""
    best = None
    for i, (name, pkgs) in enumerate(FLOORS):
        for pkg in pkgs:
            if (mod == pkg or mod.startswith(pkg + ".")) and (best is None or len(pkg) > len(best[2])):
                best = (i, name, pkg)
    if best is None:
        raise AssertionError(f"{mod} is on no floor: add it to FLOORS in tests/test_layers.py and docs/layout.md")
    return best


def test_every_module_is_on_a_floor():
    for mod in MODULES:
        floor_of(mod)


def test_imports_go_downward():
    bad = []
    for mod, targets in EDGES.items():
        fi, fname, fpkg = floor_of(mod)
        for t in sorted(targets):
            ti, tname, tpkg = floor_of(t)
            if ti > fi:
                bad.append(f"{mod} ({fname}) imports {t} ({tname}), a floor above it")
            elif fname == "stages" and tname == "stages" and tpkg != fpkg and tpkg not in STAGE_ALLOWED[fpkg]:
                bad.append(f"{mod} imports {t}: the stage {fpkg} may not import the stage {tpkg}")
    assert not bad, "imports that go up or sideways:\n  " + "\n  ".join(bad)


def test_no_import_cycles():
    """No cycle between modules, counting function-local imports too (they hide cycles, not break them)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:       # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not cycles, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_no_function_local_imports_of_eqgrad():
    assert not LOCAL, ("imports of eqgrad inside functions (move them to the top of the module; if that "
                       "makes a cycle, a module is on the wrong floor):\n  " + "\n  ".join(LOCAL))


@pytest.mark.parametrize("stage", sorted(STAGE_ALLOWED))
def test_no_stage_imports_engine_frontend_or_tools(stage):
    above = {"engine", "frontend", "tools", "facade"}
    bad = [f"{m} -> {t}" for m, ts in EDGES.items() if floor_of(m)[2] == stage
           for t in ts if floor_of(t)[1] in above]
    assert not bad, bad


def test_the_checker_sees_a_cycle():
    """The cycle finder itself: a made-up graph with one cycle is reported."""
    saved = dict(EDGES)
    try:
        EDGES["eqgrad.ops"] = EDGES["eqgrad.ops"] | {"eqgrad.dtype"}
        EDGES["eqgrad.dtype"] = EDGES["eqgrad.dtype"] | {"eqgrad.ops"}
        with pytest.raises(AssertionError, match="eqgrad.dtype <-> eqgrad.ops"):
            test_no_import_cycles()
    finally:
        EDGES.clear()
        EDGES.update(saved)
