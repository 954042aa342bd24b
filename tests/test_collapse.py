"""Elementwise kernels over whole buffers lower to one flat loop (eqgrad/lower/collapse.py): the
same numbers as the kernel as written, one source for every shape of the same body, and every
kernel that reads across elements keeps its loops."""
from __future__ import annotations

import numpy as np
import pytest

from eqgrad.devices import get_device
from eqgrad.devices.llvm import render_llvm
from eqgrad.dtype import bool_, float32
from eqgrad.graph.interp import run_kernel
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.lower.collapse import collapse
from eqgrad.lower.lowering import lower_kernel


def buf(i: int, shape, dt=float32) -> KNode:
    return KNode("BUF", (), i, tuple(shape), dt)


def update_kernel(shape) -> KernelPlan:
    """An Adam-like update: p - s * m / (sqrt(v) + eps), with s computed from a scalar in the
    kernel and broadcast, eps a constant; p, m, v of ``shape``, the scalar of shape ()."""
    p, m, v, t = buf(0, shape), buf(1, shape), buf(2, shape), buf(3, ())
    ones = (1,) * len(shape)
    s = KNode("RECIP", (KNode("ADD", (KNode("CONST", (), 1.0, (), float32), t), None, (), float32),), None, (), float32)
    s = KNode("EXPAND", (KNode("RESHAPE", (s,), ones, ones, float32),), tuple(shape), tuple(shape), float32)
    eps = KNode("CONST", (), 1e-8, tuple(shape), float32)
    den = KNode("ADD", (KNode("SQRT", (v,), None, tuple(shape), float32), eps), None, tuple(shape), float32)
    step = KNode("MUL", (KNode("MUL", (s, m), None, tuple(shape), float32), KNode("RECIP", (den,), None, tuple(shape), float32)),
                 None, tuple(shape), float32)
    ast = KNode("ADD", (p, KNode("NEG", (step,), None, tuple(shape), float32)), None, tuple(shape), float32)
    return KernelPlan([(tuple(shape), float32)] * 3 + [((), float32), (tuple(shape), float32)], 4,
                      [Kernel("k0", 4, ast, (0, 1, 2, 3))], [4])


def inputs(plan: KernelPlan, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(s).astype(np.float32) for s, _ in plan.buffers[:plan.n_inputs]]
    out[2] = np.abs(out[2])                   # v >= 0
    return out


def run_llvm(plan: KernelPlan, arrays: list[np.ndarray]) -> np.ndarray:
    from eqgrad.devices import Buffer
    run = get_device("LLVM").prepare(plan)
    bufs = [Buffer.from_numpy(a, "LLVM") for a in arrays] + [Buffer.empty(s, d, "LLVM") for s, d in plan.buffers[plan.n_inputs:]]
    run(bufs)
    return bufs[plan.outputs[0]].numpy()


@pytest.mark.parametrize("shape", [(128, 64), (10, 128), (3, 5, 7), (1, 1, 9)])
def test_an_update_lowers_to_one_loop_with_the_numbers_of_the_kernel_as_written(shape):
    plan = update_kernel(shape)
    k = plan.kernels[0]
    lk = lower_kernel(k, plan)
    assert collapse(k).ast.shape == (int(np.prod(shape)),)
    assert sum(x.op == "RANGE" for x in lk.insts) == 1
    arrays = inputs(plan)
    want = run_kernel(k, list(arrays) + [None])
    np.testing.assert_allclose(run_llvm(plan, arrays), np.asarray(want).reshape(shape), rtol=1e-6, atol=1e-6)


def test_shapes_of_one_body_share_one_source():
    srcs = set()
    for shape in [(128, 64), (64, 128), (32, 16, 16), (8192,)]:
        plan = update_kernel(shape)
        srcs.add(render_llvm(lower_kernel(plan.kernels[0], plan)))
    assert len(srcs) == 1


def test_kernels_that_read_across_elements_keep_their_loops():
    x, y = buf(0, (4, 6)), buf(1, (6, 4))
    cases = [
        KNode("ADD", (x, KNode("PERMUTE", (y,), (1, 0), (4, 6), float32)), None, (4, 6), float32),
        KNode("ADD", (x, KNode("EXPAND", (buf(1, (1, 6)),), (4, 6), (4, 6), float32)), None, (4, 6), float32),
        KNode("EXP2", (KNode("PAD", (buf(0, (3, 5)),), ((1, 0), (0, 1)), (4, 6), float32),), None, (4, 6), float32),
        KNode("RSUM", (buf(0, (4, 6, 3)),), (2,), (4, 6, 1), float32),
    ]
    for ast in cases:
        k = Kernel("k0", 2, ast, ast.buffers())
        assert collapse(k) is k, ast.render()


# ------------------------------------------------------------------ merge_axes: groups of axes

def _expand(node: KNode, shape) -> KNode:
    return KNode("EXPAND", (node,), tuple(shape), tuple(shape), node.dtype)


def _one_kernel(ast: KNode, n_in: int, in_shapes) -> KernelPlan:
    return KernelPlan([(tuple(s), float32) for s in in_shapes] + [(ast.shape, float32)], n_in,
                      [Kernel("k0", n_in, ast, ast.buffers())], [n_in])


def _loops(lk) -> list[int]:
    return [x.arg for x in lk.insts if x.op == "RANGE"]


def _merge_cases():
    """(name, ast, input shapes, the loop extents merge_axes leaves)."""
    s = (4, 6, 5, 7)
    x, b = buf(0, s), buf(1, (1, 6, 1, 1))
    bias = KNode("ADD", (x, _expand(b, s)), None, s, float32)
    # a permute that keeps the last two axes together: (A, B, C, D) -> (A, C, D, B)
    y = buf(0, (4, 6, 5, 7))
    perm = KNode("EXP2", (KNode("PERMUTE", (y,), (0, 2, 3, 1), (4, 5, 7, 6), float32),), None, (4, 5, 7, 6), float32)
    # a row broadcast over the leading two axes: (1, 1, 35) read over (4, 6, 35)
    r = buf(1, (1, 1, 35))
    rows = KNode("MUL", (buf(0, (4, 6, 35)), _expand(r, (4, 6, 35))), None, (4, 6, 35), float32)
    # a shrink of the last axis, (4, 6, 9)[:, :, 1:8]: the rows stay apart from the window, the two
    # leading axes (strides 54 and 9) merge
    w = KNode("SHRINK", (buf(0, (4, 6, 9)),), ((0, 0, 1), (4, 6, 8)), (4, 6, 7), float32)
    shrink = KNode("NEG", (w,), None, (4, 6, 7), float32)
    return [("bias", bias, [s, (1, 6, 1, 1)], [4, 6, 35]),
            ("permute", perm, [(4, 6, 5, 7)], [4, 35, 6]),
            ("rows", rows, [(4, 6, 35), (1, 1, 35)], [24, 35]),
            ("shrink", shrink, [(4, 6, 9)], [24, 7])]


@pytest.mark.parametrize("name,ast,shapes,loops", _merge_cases(), ids=[c[0] for c in _merge_cases()])
def test_merged_axes_loop_as_one_with_linear_reads_and_the_same_numbers(name, ast, shapes, loops):
    plan = _one_kernel(ast, len(shapes), shapes)
    k = plan.kernels[0]
    lk = lower_kernel(k, plan)
    assert _loops(lk) == loops
    # every read folds back to a linear index: no division or modulo left in the loop IR
    assert not any(x.op in ("IDIV", "MOD") for x in lk.insts), str(lk)
    _same_numbers(plan, shapes, seed=1, tol=1e-6)


def _same_numbers(plan: KernelPlan, shapes, seed: int, tol: float) -> None:
    """The LLVM device's result of ``plan``'s one kernel equals the reference interpreter's."""
    k = plan.kernels[0]
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.asarray(run_kernel(k, list(arrays) + [None]))
    np.testing.assert_allclose(run_llvm(plan, arrays), want.reshape(k.ast.shape), rtol=tol, atol=tol)


def test_kernels_with_reductions_or_pads_keep_their_axes():
    from eqgrad.lower.collapse import merge_axes
    red = KNode("RSUM", (buf(0, (4, 6, 8)),), (1,), (4, 1, 8), float32)
    pad = KNode("EXP2", (KNode("PAD", (buf(0, (3, 5, 7)),), ((1, 0), (0, 1), (0, 0)), (4, 6, 7), float32),), None,
                (4, 6, 7), float32)
    for ast in (red, pad):
        k = Kernel("k0", 1, ast, ast.buffers())
        assert merge_axes(k) is k, ast.render()


def _lin_value(e, env: dict) -> int:
    """An index expression's value at ``env`` (variable name -> value), floor semantics."""
    from eqgrad.lower.symbolic import Div, Var
    total = e.const
    for a, c in e.terms:
        if isinstance(a, Var):
            v = env[a.name]
        elif isinstance(a, Div):
            v = _lin_value(a.x, env) // a.d
        else:
            v = _lin_value(a.x, env) % a.d
        total += c * v
    return total


def test_division_and_modulo_of_one_value_fold_back_into_it():
    """k*d*(x // d) + k*(x % d) == k*x, nested groups too, for every value of the variables (floor
    semantics, negative offsets included)."""
    from eqgrad.lower.symbolic import Lin
    value = _lin_value

    r, j = Lin.var("r", 210), Lin.var("j", 5)
    x = r * 3 + j - 7                         # negative for small r
    exprs = [
        (x // 6) * 6 + x % 6,
        (r // 35) * 35 * 4 + ((r // 5) % 7) * 5 * 4 + (r % 5) * 4 + 1,      # (6, 7, 5) read as one axis
        (x // 10) * 20 + (x % 10) * 2 - (x // 10) * 20,
        (r // 5) * 3 + r % 5,                   # not foldable: stays, and stays right
    ]
    assert exprs[0] == x and exprs[1] == r * 4 + 1
    for e in exprs:
        for rv in range(210):
            for jv in (0, 4):
                env = {"r": rv, "j": jv}
                xv = 3 * rv + jv - 7
                ref = [(xv // 6) * 6 + xv % 6, 4 * rv + 1, 2 * (xv % 10), (rv // 5) * 3 + rv % 5][exprs.index(e)]
                assert value(e, env) == ref



def test_a_division_and_a_modulo_of_congruent_values_fold_back():
    """d*(x // d) + (y % d) == x when x - y is a multiple of d: a sum blocked over a merged axis
    reads a (480, 384) operand at 384*((1024*b + r)//384) + (1024*b + r) % 384, whose modulo the
    index arithmetic reduces to (256*b + r) % 384 -- and it still folds to 1024*b + r. A pair whose
    difference is not a multiple of d stays as it is, and keeps its value."""
    from eqgrad.lower.symbolic import Div, Lin, Mod
    b, r = Lin.var("b", 180), Lin.var("r", 1024)
    x = b * 1024 + r
    assert (x // 384) * 384 + x % 384 == x
    assert any(type(a) is Mod and a.x != x for a, _ in (x % 384).terms)   # the modulo's own form differs
    y = b * 1024 + r + 5                  # x - y = -5: not a multiple of 384
    kept = (x // 384) * 384 + y % 384
    assert any(type(a) is Div for a, _ in kept.terms) and any(type(a) is Mod for a, _ in kept.terms)
    for bv in (0, 1, 7, 179):
        for rv in (0, 5, 383, 384, 1023):
            xv = 1024 * bv + rv
            assert _lin_value(kept, {"b": bv, "r": rv}) == (xv // 384) * 384 + (xv + 5) % 384


# ------------------------------------------------------------------ merge_reduced: reduced axes

def _reduce(op: str, src: KNode, axes) -> KNode:
    shape = tuple(1 if d in axes else e for d, e in enumerate(src.shape))
    return KNode(op, (src,), tuple(axes), shape, src.dtype)


def _reduce_cases():
    """(name, ast, input shapes, the run of reduced axes merged into one loop of this extent)."""
    s = (4, 6, 5, 7)
    x = buf(0, s)
    # a channel's sum over (N, H, W): H and W one loop of 35
    chan = KNode("RESHAPE", (_reduce("RSUM", x, (0, 2, 3)),), (6,), (6,), float32)
    # a mask times a per-(N, C) value broadcast over H and W (max-pool's mean-gradient shape)
    g = _expand(buf(1, (4, 6, 1, 1)), s)
    masked = _reduce("RSUM", KNode("WHERE", (KNode("CMPLT", (KNode("CONST", (), 0.0, s, float32), x), None, s,
                                                         bool_), g, KNode("CONST", (), 0.0, s, float32)),
                                   None, s, float32), (0, 2, 3))
    # a max over the two leading axes (a column max): one loop of 24
    cmax = _reduce("RMAX", KNode("EXP2", (x,), None, s, float32), (0, 1))
    # a sum of squares over every axis: one loop of 840
    sq = _reduce("RSUM", KNode("MUL", (x, x), None, s, float32), (0, 1, 2, 3))
    # a sum over the two halves of a row read as (4, 5, 6): a reshape that splits an axis of a
    # buffer reads it linearly, so the halves are one loop of 30 again
    split = _reduce("RSUM", KNode("RESHAPE", (buf(0, (4, 30)),), (4, 5, 6), (4, 5, 6), float32), (1, 2))
    return [("channel", chan, [s], 35), ("masked", masked, [s, (4, 6, 1, 1)], 35),
            ("column_max", cmax, [s], 24), ("squares", sq, [s], 840), ("split", split, [(4, 30)], 30)]


@pytest.mark.parametrize("name,ast,shapes,extent", _reduce_cases(), ids=[c[0] for c in _reduce_cases()])
def test_reduced_axes_read_as_one_loop_as_one_with_linear_reads_and_the_same_numbers(name, ast, shapes, extent):
    from eqgrad.lower.collapse import merge_reduced
    plan = _one_kernel(ast, len(shapes), shapes)
    k = plan.kernels[0]
    assert merge_reduced(k) is not k
    lk = lower_kernel(k, plan)
    assert extent in _loops(lk), (_loops(lk), str(lk))
    assert not any(x.op in ("IDIV", "MOD") for x in lk.insts), str(lk)
    _same_numbers(plan, shapes, seed=2, tol=1e-5)


def test_reductions_whose_axes_do_not_read_as_one_keep_them():
    """A 2x2 pooling window (its rows 2*W apart, not 2), a pad under the sum (a per-axis mask), a
    sum over a transpose's two axes (the inner one steps 7 apart, the outer one 1), and a
    contraction (the lanes pass and the BLAS read its axes as they are) keep their reduced axes."""
    from eqgrad.lower.collapse import merge_reduced
    win = KNode("RESHAPE", (buf(0, (2, 3, 8, 8)),), (2, 3, 4, 2, 4, 2), (2, 3, 4, 2, 4, 2), float32)
    win = KNode("PERMUTE", (win,), (0, 1, 2, 4, 3, 5), (2, 3, 4, 4, 2, 2), float32)
    pool = _reduce("RMAX", win, (4, 5))
    pad = _reduce("RSUM", KNode("PAD", (buf(0, (3, 5, 7)),), ((0, 0), (1, 1), (0, 1)), (3, 7, 8), float32), (1, 2))
    tr = _reduce("RSUM", KNode("PERMUTE", (buf(0, (4, 5, 7)),), (0, 2, 1), (4, 7, 5), float32), (1, 2))
    a = _expand(KNode("RESHAPE", (buf(0, (8, 6, 5)),), (8, 1, 6, 5), (8, 1, 6, 5), float32), (8, 4, 6, 5))
    b = _expand(KNode("RESHAPE", (buf(1, (4, 6, 5)),), (1, 4, 6, 5), (1, 4, 6, 5), float32), (8, 4, 6, 5))
    conv = _reduce("RSUM", KNode("MUL", (a, b), None, (8, 4, 6, 5), float32), (2, 3))
    for ast in (pool, pad, tr, conv):
        k = Kernel("k0", 1, ast, ast.buffers())
        assert merge_reduced(k) is k, ast.render()
