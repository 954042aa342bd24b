"""Every numeric knob of the compiler is named in docs/lowering.md's constants section.

The section ("Constants and the measurement behind each") gives each knob's value, what it bounds
and the measurement behind it (or what it is derived from). This test collects the module-level
UPPER_CASE numeric constants of the compiler's packages -- int or float literals, or arithmetic of
literals such as ``4 << 20`` -- and ``DeviceParams``' numeric defaults, and fails for any that the
section does not name in backticks. Constants that are not knobs are listed below with the reason.
Pure ``ast``: nothing is imported, so it runs in milliseconds.
"""
from __future__ import annotations

import ast
import functools
import operator
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lower", "devices", "extract", "engine", "graph")
SECTION = "## Constants and the measurement behind each"

# (file relative to eqgrad/, name) -> why it is not a tuning knob
NOT_KNOBS = {
    ("lower/decomp.py", "EXP2_MAGIC"): "a bit pattern of the exp2 decomposition (1.5 * 2**23 + 127), not a choice",
    ("lower/decomp.py", "SQRT2_F32"): "the float32 nearest sqrt(2)",
    ("lower/decomp.py", "TWO_OVER_PI_BITS"): "bits of 2/pi the sin/cos range reduction needs for float32's range",
    ("lower/decomp.py", "SIN_ABS_ERR"): "an accuracy bound the tests check (docs/semantics.md), not a knob",
    ("lower/decomp.py", "SIN_REL_ERR"): "an accuracy bound the tests check (docs/semantics.md), not a knob",
    ("lower/decomp.py", "ERF_ULP"): "an accuracy bound the tests check (docs/semantics.md), not a knob",
    ("extract/evaluate.py", "_ULPS"): "2**1074: the scale of float64's smallest subnormal, for exact sums",
    ("devices/kernelcache.py", "FORMAT"): "an on-disk format version",
    ("engine/diskcache.py", "FORMAT"): "an on-disk format version",
    ("devices/search.py", "CACHE_VERSION"): "an on-disk format version",
    ("extract/measured.py", "CACHE_VERSION"): "an on-disk format version",
    ("extract/cost.py", "CALIBRATION_VERSION"): "an on-disk format version",
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.LShift: operator.lshift,
        ast.RShift: operator.rshift}


def _number(node: ast.AST) -> int | float | None:
    """The value of a numeric literal or of arithmetic of literals; None for anything else."""
    if isinstance(node, ast.Constant):
        v = node.value
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _number(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _number(node.left), _number(node.right)
        return None if a is None or b is None else _OPS[type(node.op)](a, b)
    return None


@functools.lru_cache(maxsize=None)
def module_constants() -> dict[tuple[str, str], int | float]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / "eqgrad" / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT / "eqgrad").as_posix()
            for node in ast.parse(f.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", target.id):
                    v = _number(value)
                    if v is not None:
                        out[(rel, target.id)] = v
    return out


def device_params_fields() -> dict[str, int | float]:
    tree = ast.parse((ROOT / "eqgrad" / "extract" / "cost.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeviceParams")
    return {n.target.id: _number(n.value) for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None
            and _number(n.value) is not None}


def constants_section() -> str:
    text = (ROOT / "docs" / "lowering.md").read_text(encoding="utf-8")
    start = text.find(SECTION)
    assert start >= 0, f"docs/lowering.md has no section {SECTION!r}"
    end = text.find("\n## ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end]


def test_every_constant_is_named_in_the_constants_section():
    section = constants_section()
    consts = module_constants()
    assert len(consts) > 30, "the collector found too few constants: is the source layout different?"
    missing = [f"eqgrad/{f}: {name} = {v!r}" for (f, name), v in sorted(consts.items())
               if (f, name) not in NOT_KNOBS and f"`{name}`" not in section]
    missing += [f"eqgrad/extract/cost.py: DeviceParams.{name} = {v!r}" for name, v in device_params_fields().items()
                if f"`{name}`" not in section]
    assert not missing, ("constants not named (in backticks) in docs/lowering.md's constants section; add a row "
                         "with the measurement behind each, or list a non-knob in NOT_KNOBS with the reason:\n  "
                         + "\n  ".join(missing))


def test_not_knobs_are_still_there():
    # a stale exclusion would silently exempt a new knob of the same name
    consts = module_constants()
    assert not [k for k in NOT_KNOBS if k not in consts], [k for k in NOT_KNOBS if k not in consts]


def test_device_params_fields_are_found():
    assert {"launch", "bandwidth", "peak", "max_nodes", "masked_read", "unlaned"} <= set(device_params_fields())
