"""Contraction order (rulebooks/contraction.egg): a product of products is planned in the order
the cost model prefers, not the order it was written in. Values against NumPy in float64, forward
and backward; the rule that reordered is named by explain(); a plan that reorders writes no
intermediate as large as the product it avoided."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from conftest import data


def _plan(y: Tensor):
    ex = eqgrad.explain(y, provenance=True)
    p = ex.plan
    largest = max((int(np.prod(sh)) for sh, _ in p.buffers[p.n_inputs:]), default=0)
    return ex.rules_used(), largest


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_matrix_times_matrix_times_vector_is_two_matrix_vector_products():
    n = 96
    a, b, x = data((n, n), seed=1), data((n, n), seed=2), data((n,), seed=3)
    y = (Tensor(a) @ Tensor(b)) @ Tensor(x)
    rules, largest = _plan(y)
    assert rules.get("matvec-assoc-right", 0) > 0, rules
    assert largest < n * n                  # the n x n product a @ b is never written
    # two matrix-vector products and nothing else: no kernel copying x's transposed view (the rule
    # reads its operands through the broadcasts it matched, so the match through x's Realize and
    # the one through its fused form build one product, not a copy-kernel variant greedy picked)
    assert len(eqgrad.explain(y, provenance=False).plan.kernels) == 2
    _close(y.numpy(), (a.astype(np.float64) @ b) @ x)


def test_a_narrow_right_factor_is_multiplied_first():
    a, b, c = data((64, 48), seed=4), data((48, 80), seed=5), data((80, 3), seed=6)
    y = (Tensor(a) @ Tensor(b)) @ Tensor(c)
    rules, largest = _plan(y)
    assert rules.get("matmul-assoc-right", 0) > 0, rules
    assert largest < 64 * 80
    _close(y.numpy(), (a.astype(np.float64) @ b) @ c)


def test_the_written_order_is_kept_where_it_is_cheaper():
    """(a @ b) @ c with a narrow a: a @ b is 2 x 80, the other order would compute b @ c, 48 x 96."""
    a, b, c = data((2, 48), seed=7), data((48, 80), seed=8), data((80, 96), seed=9)
    y = (Tensor(a) @ Tensor(b)) @ Tensor(c)
    rules, _ = _plan(y)
    assert "matmul-assoc-right" not in rules, rules
    _close(y.numpy(), (a.astype(np.float64) @ b) @ c)
    # and a @ (b @ c) with a narrow c: b @ c is 48 x 3
    a, b, c = data((64, 48), seed=24), data((48, 80), seed=25), data((80, 3), seed=26)
    y = Tensor(a) @ (Tensor(b) @ Tensor(c))
    rules, _ = _plan(y)
    assert "matmul-assoc-left" not in rules, rules
    _close(y.numpy(), a.astype(np.float64) @ (b.astype(np.float64) @ c))


def test_a_narrow_left_factor_is_multiplied_first():
    """a @ (b @ c) with a 2 x 48: (a @ b) @ c is 2 x 80 then 2 x 96, where b @ c is 48 x 96."""
    a, b, c = data((2, 48), seed=21), data((48, 80), seed=22), data((80, 96), seed=23)
    y = Tensor(a) @ (Tensor(b) @ Tensor(c))
    rules, largest = _plan(y)
    assert rules.get("matmul-assoc-left", 0) > 0, rules
    assert largest < 48 * 96
    _close(y.numpy(), a.astype(np.float64) @ (b.astype(np.float64) @ c))


def test_a_chain_of_four_is_planned_by_its_cost():
    """((a @ b) @ c) @ x: every association is reachable from the written one; the plan never
    forms a 64 x 64 product."""
    a, b, c = (data((64, 64), seed=s) for s in (10, 11, 12))
    x = data((64,), seed=13)
    y = ((Tensor(a) @ Tensor(b)) @ Tensor(c)) @ Tensor(x)
    rules, largest = _plan(y)
    assert largest < 64 * 64, (rules, largest)
    _close(y.numpy(), ((a.astype(np.float64) @ b) @ c) @ x)


def test_gradients_through_a_reordered_chain():
    n = 40
    a, b, x = data((n, n), seed=14), data((n, n), seed=15), data((n,), seed=16)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    g = data((n,), seed=17)
    (((ta @ tb) @ Tensor(x)) * Tensor(g)).sum().backward()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # d/da sum(g * (a b x)) = g (b x)^T ; d/db = a^T g x^T
    _close(ta.grad.numpy(), np.outer(g, b64 @ x))
    _close(tb.grad.numpy(), np.outer(a64.T @ g, x))


@pytest.mark.parametrize("device", ["NUMPY", "LLVM"])
def test_reordered_chain_on_each_device(device):
    a, b, x = data((32, 24), seed=18), data((24, 16), seed=19), data((16,), seed=20)
    y = (Tensor(a, device=device) @ Tensor(b, device=device)) @ Tensor(x, device=device)
    _close(y.numpy(), (a.astype(np.float64) @ b) @ x)


@pytest.mark.parametrize("seed", range(6))
def test_the_written_association_does_not_change_the_plan(seed):
    """(a @ b) @ c and a @ (b @ c) hold both orders in one e-graph: planned the same (the same
    predicted time), whichever the cheaper one is, with the values of either."""
    rng = np.random.default_rng(seed)
    n, k, m, p = (int(x) for x in rng.choice([2, 3, 8, 24, 64, 96], 4))
    a, b, c = data((n, k), seed=3 * seed), data((k, m), seed=3 * seed + 1), data((m, p), seed=3 * seed + 2)
    left, right = (Tensor(a) @ Tensor(b)) @ Tensor(c), Tensor(a) @ (Tensor(b) @ Tensor(c))
    pl, pr = eqgrad.explain(left).plan.predicted, eqgrad.explain(right).plan.predicted
    assert pl == pytest.approx(pr, rel=1e-9), ((n, k, m, p), pl, pr)
    want = (a.astype(np.float64) @ b) @ c
    _close(left.numpy(), want)
    _close(right.numpy(), want)
