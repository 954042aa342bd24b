"""The op table is complete: every primitive has every piece that the layers need."""
import re
from pathlib import Path

import numpy as np
import pytest

from eqgrad.devices.cstyle import CSTYLE_OPS
from eqgrad.devices.llvm import LLVM_OPS
from eqgrad.graph.loopir import LOOP_ALU_OPS
from eqgrad.lower.decomp import DECOMPOSITIONS
from eqgrad.dtype import bool_, float32, int32
from eqgrad.ops import ALU_OPS, MOVEMENT_OPS, OPS, REDUCE_OPS, RETYPES, NoGrad, attr_error
from eqgrad.rules.families import fusion_family, generated_rulebooks
from eqgrad.rules.ir import declarations

RULEBOOKS = Path(__file__).resolve().parents[1] / "rulebooks"


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_every_piece(name):
    o = OPS[name]
    assert o.egg and re.fullmatch(r"[A-Z][A-Za-z0-9]*", o.egg), "egglog constructor name"
    assert f"({o.egg}" in declarations(), "egglog declaration"
    assert o.shape_rule is not None and o.dtype_rule is not None
    if o.kind != "leaf":
        assert o.ref is not None, "NumPy reference"
        assert f'"shape-{o.egg.lower()}' in generated_rulebooks(), "shape analysis rule"
    if name in ALU_OPS:
        # a rule in the renderer's op table, or a loop-IR decomposition (tests/test_renderers.py checks more)
        assert name in LLVM_OPS or name in DECOMPOSITIONS, "LLVM renderer rule"
        assert name in CSTYLE_OPS, "C-style (OpenCL, CUDA) renderer rule"


def test_renderer_has_no_extra_ops():
    known = set(ALU_OPS) | set(LOOP_ALU_OPS)
    assert set(LLVM_OPS) <= known, set(LLVM_OPS) - known
    assert set(CSTYLE_OPS) <= known, set(CSTYLE_OPS) - known


def test_fusion_rulebook_covers_every_argument_position():
    # the fusion rules that run: generated from OpDef.fuse, and any hand-written ones in fusion.egg
    text = (RULEBOOKS / "fusion.egg").read_text() + fusion_family().text
    for o in OPS.values():
        if o.kind in ("leaf",) or o.name == "REALIZE":
            continue
        for pos in range(o.arity):
            args = [r"\w+"] * o.arity
            args[pos] = r"\(Realize \w+\)"
            pat = r"\(rewrite \(" + o.egg + " " + " ".join(args)
            assert re.search(pat, text), f"no fusion rule for {o.egg} argument {pos}"


def _sample(dt, shape=(2, 3)):
    rng = np.random.default_rng(1)
    if dt is float32:
        return (rng.standard_normal(shape) * 2).astype(np.float32)
    if dt is int32:
        return rng.integers(-5, 6, shape).astype(np.int32)
    return rng.random(shape) > 0.5


def test_retype_references_take_their_target():
    """CAST and BITCAST read their target dtype from the attribute (RETYPES)."""
    assert RETYPES == {"CAST", "BITCAST"}
    x = _sample(float32)
    assert OPS["CAST"].ref([x], int32, int32).dtype == np.int32
    out = OPS["BITCAST"].ref([x], int32, int32)
    assert out.dtype == np.int32 and np.array_equal(out, x.view(np.int32))


@pytest.mark.parametrize("name", sorted(set(ALU_OPS) - RETYPES))
def test_reference_semantics_are_total(name):
    """Each ALU reference runs on every dtype it accepts and returns its declared shape and dtype."""
    o = OPS[name]
    kinds = {"f": float32, "i": int32, "b": bool_}
    for k in o.dtypes:
        dt = kinds[k]
        srcs = [_sample(dt) for _ in range(o.arity)]
        dts = [dt] * o.arity
        if name == "WHERE":
            srcs[0], dts[0] = _sample(bool_), bool_
        out_dt = o.dtype_rule(dts, None)
        out = o.ref(srcs, None, out_dt)
        assert out.shape == (2, 3) and out.dtype == out_dt.np


def test_movement_and_reduce_references():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert OPS["PERMUTE"].ref([x], (2, 0, 1), float32).shape == OPS["PERMUTE"].shape_rule([x.shape], (2, 0, 1))
    assert OPS["PAD"].ref([x], ((1, 0, 0), (0, 2, 0)), float32).shape == (3, 5, 4)
    assert OPS["SHRINK"].ref([x], ((0, 1, 1), (2, 3, 3)), float32).shape == (2, 2, 2)
    for r in REDUCE_OPS:
        assert OPS[r].ref([x], (0, 2), float32).shape == (1, 3, 1)
    assert set(MOVEMENT_OPS) == {"RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP"}


def test_integer_division_semantics():
    a = np.array([7, -7, 7, -7, 5, -2147483648], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1], np.int32)
    assert OPS["IDIV"].ref([a, b], None, int32).tolist() == [3, -3, -3, 3, 0, -2147483648]
    assert OPS["MOD"].ref([a, b], None, int32).tolist() == [1, -1, 1, -1, 0, 0]


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_a_gradient_or_says_why_not(name):
    """Every op defines its gradient once in the table, or is marked not differentiable with a reason."""
    g = OPS[name].grad
    assert g is not None, f"{name} has no gradient: give it a rule (ops.py, 'gradients') or NoGrad(reason)"
    assert callable(g) or (isinstance(g, NoGrad) and g.reason), f"{name}: grad must be a rule or NoGrad(reason)"
    if OPS[name].kind in ("unary", "binary", "ternary", "reduce", "movement", "boundary") and "f" in OPS[name].dtypes \
            and OPS[name].dtype_rule([float32] * max(OPS[name].arity, 1), None if name != "CAST" else float32) is float32:
        # an op that maps floats to floats is differentiable unless it says otherwise
        assert callable(g) or name == "TRUNC", f"{name} maps float32 to float32 but has no gradient rule"


# where sizes are, and which attributes are valid: the op table's answers, which graph/resize.py
# (the resizer, its check) and lower/trace.py (a body's sizes) read instead of keeping their own
_VALID = {"RSUM": (1,), "RMAX": (0, 1), "FLIP": (1,), "PERMUTE": (1, 0), "RESHAPE": (6,), "EXPAND": (2, 3),
          "PAD": ((0, 1), (2, 0)), "SHRINK": ((0, 1), (2, 3))}
_INVALID = {"RSUM": (2,), "RMAX": (-1,), "FLIP": (5,), "PERMUTE": (0, 0), "RESHAPE": (4,), "EXPAND": (4, 4),
            "PAD": ((0, -1), (0, 0)), "SHRINK": ((0, 2), (2, 1))}


def test_attribute_sizes_follow_the_shape_rule():
    assert {n for n, o in OPS.items() if o.attr_sizes == "shape"} == {"RESHAPE", "EXPAND"}
    assert {n for n, o in OPS.items() if o.attr_sizes == "pairs"} == {"PAD", "SHRINK"}
    assert not any(OPS[n].attr_sizes for n in ALU_OPS + REDUCE_OPS + ("PERMUTE", "FLIP", "BUF", "CONST"))


@pytest.mark.parametrize("name", MOVEMENT_OPS + REDUCE_OPS)
def test_attr_error_agrees_with_the_reference(name):
    """A valid attribute runs the NumPy reference to the shape rule's shape; an invalid one is
    named (every movement and reduce op has its check: the default is the elementwise one)."""
    src = (2, 3) if name != "EXPAND" else (1, 3)
    x = np.arange(np.prod(src), dtype=np.float32).reshape(src)
    ok = _VALID[name]
    assert attr_error(name, [src], ok) == ""
    out = OPS[name].ref([x], ok, float32)
    assert out.shape == tuple(OPS[name].shape_rule([src], ok))
    assert attr_error(name, [src], _INVALID[name]) != ""


def test_attr_error_elementwise_sources_share_a_shape():
    assert attr_error("ADD", [(2, 3), (2, 3)], None) == ""
    assert "sources of shapes" in attr_error("ADD", [(2, 3), (3, 2)], None)
