"""Scans, sorting, einsum, extra reductions, movement/construction ops and random factories
(frontend/shapeops.py) against torch and NumPy, forward and backward, on every device of
conftest.DEVICES.

Inputs are shared so that programs repeat; they cover 0-d, size-0, ties, zeros and negatives
(cumprod/prod), NaN (sort/cummax) and non-contiguous NumPy inputs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import eqgrad
from eqgrad import AxisError, ShapeError, Tensor
from conftest import compare, data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="compared with torch")

nan, inf = float("nan"), float("inf")
X34 = data((3, 4), seed=1)
X234 = data((2, 3, 4), seed=2)
X0 = np.array(1.25, dtype=np.float32)
X03 = np.zeros((0, 3), dtype=np.float32)
XT = data((4, 3), seed=5).T                           # non-contiguous (3, 4)
# zeros (one and several per row) and negatives, for products
XZ = np.array([[2.0, -1.0, 0.0, 3.0], [0.0, 0.5, 0.0, -2.0], [1.5, -0.5, 2.0, -3.0]], dtype=np.float32)
# ties within rows and columns, for cummax/sort
XTIE = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 0.0, 2.0], [-1.0, 3.0, 0.0, 0.0]], dtype=np.float32)
XNAN = np.array([[1.0, nan, 0.0, nan, 5.0], [3.0, -1.0, 3.0, nan, -inf]], dtype=np.float32)
M33 = data((3, 3), seed=3)
V4 = data((4,), seed=4)
I34 = data((3, 4), np.int32, seed=6, low=-3, high=3)
B34 = data((3, 4), bool, seed=7)

# name: (eqgrad fn, torch fn or None for the same code, inputs); forward and every float gradient
GRAD = {
    "cumsum_1": (lambda x: x.cumsum(1), None, [X34]),
    "cumsum_0_T": (lambda x: x.cumsum(0), None, [XT]),
    "cumsum_0d": (lambda x: x.cumsum(0), None, [X0]),
    "cumsum_empty": (lambda x: x.cumsum(0), None, [X03]),
    "cumsum_neg_dim": (lambda x: x.cumsum(-2), None, [X234]),
    "cumprod_zeros": (lambda x: x.cumprod(1), None, [XZ]),
    "cumprod_zeros_0": (lambda x: x.cumprod(0), None, [XZ]),
    "cumprod_T": (lambda x: x.cumprod(1), None, [XT]),
    "cumprod_0d": (lambda x: x.cumprod(0), None, [X0]),
    "cummax_ties": (lambda x: x.cummax(1).values, lambda x: x.cummax(1).values, [XTIE]),
    "cummin_ties": (lambda x: x.cummin(0).values, lambda x: x.cummin(0).values, [XTIE]),
    "cummax_T": (lambda x: x.cummax(1)[0], lambda x: x.cummax(1)[0], [XT]),
    "logcumsumexp": (lambda x: x.logcumsumexp(1), None, [X34]),
    "logcumsumexp_wide": (lambda x: x.logcumsumexp(0), None, [np.array([-200.0, 0.0, 50.0, 49.0], np.float32)]),
    "sort": (lambda x: x.sort(1).values, lambda x: x.sort(dim=1, stable=True).values, [XTIE]),
    "sort_desc_0": (lambda x: x.sort(0, descending=True)[0], lambda x: x.sort(dim=0, descending=True, stable=True)[0], [X34]),
    "sort_T": (lambda x: x.sort().values, lambda x: x.sort().values, [XT]),
    "topk": (lambda x: x.topk(2).values, lambda x: x.topk(2).values, [X34]),
    "topk_smallest_0": (lambda x: x.topk(2, 0, largest=False)[0], lambda x: x.topk(2, 0, largest=False)[0], [X34]),
    "einsum_matmul": (lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b), [X34, XT.T]),
    "einsum_batch": (lambda a: Tensor.einsum("bij,bkj->bik", a, a), lambda a: torch.einsum("bij,bkj->bik", a, a), [X234]),
    "einsum_trace": (lambda a: Tensor.einsum("ii", a), lambda a: torch.einsum("ii", a), [M33]),
    "einsum_diag": (lambda a: Tensor.einsum("ii->i", a), lambda a: torch.einsum("ii->i", a), [M33]),
    "einsum_ellipsis": (lambda a: Tensor.einsum("...ij->...ji", a), lambda a: torch.einsum("...ij->...ji", a), [X234]),
    "einsum_ell_bcast": (lambda a, v: Tensor.einsum("...j,j->...", a, v), lambda a, v: torch.einsum("...j,j->...", a, v), [X234, V4]),
    "einsum_outer_implicit": (lambda a, v: Tensor.einsum("i,j", a, v), lambda a, v: torch.einsum("i,j", a, v), [V4, V4[:3]]),
    "einsum_three": (lambda a, b, c: Tensor.einsum("ij,jk,k->i", a, b, c), lambda a, b, c: torch.einsum("ij,jk,k->i", a, b, c), [M33, X34, V4]),
    "prod_zeros": (lambda x: x.prod(1), None, [XZ]),
    "prod_keepdim_0": (lambda x: x.prod(0, keepdim=True), None, [XZ]),
    "prod_all": (lambda x: x.prod(), None, [X34 * 0.5]),
    "prod_empty": (lambda x: x.prod(0), None, [X03]),
    "amax_ties": (lambda x: x.amax(1), lambda x: x.amax(1), [XTIE]),
    "amin_tuple": (lambda x: x.amin((0, 2), keepdim=True), lambda x: x.amin((0, 2), keepdim=True), [X234]),
    "var_mean": (lambda x: x.var_mean(1)[0] + 2 * x.var_mean(1)[1], lambda x: torch.var_mean(x, 1)[0] + 2 * torch.var_mean(x, 1)[1], [X34]),
    "std_mean": (lambda x: x.std_mean(0, correction=0)[0] * x.std_mean(0, correction=0)[1],
                 lambda x: torch.std_mean(x, 0, correction=0)[0] * torch.std_mean(x, 0, correction=0)[1], [XT]),
    "norm2": (lambda x: x.norm(), lambda x: x.norm(), [X34]),
    "norm2_zero_row": (lambda x: x.norm(dim=1), lambda x: x.norm(dim=1), [np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)]),
    "norm1": (lambda x: x.norm(1, 1), lambda x: x.norm(1, 1), [X34]),
    "norm_inf": (lambda x: x.norm(inf, 0, keepdim=True), lambda x: x.norm(inf, 0, keepdim=True), [X34]),
    "norm_neg_inf": (lambda x: x.norm(-inf, 1), lambda x: x.norm(-inf, 1), [X34]),
    "norm_fro": (lambda x: x.norm("fro", (1, 2)), lambda x: x.norm("fro", (1, 2)), [X234]),
    "norm3": (lambda x: x.norm(3, 1), lambda x: x.norm(3, 1), [X34]),
    "repeat": (lambda x: x.repeat(2, 1, 2), None, [X34]),
    "repeat_0d": (lambda x: x.repeat(3), None, [X0]),
    "tile": (lambda x: x.tile(2), None, [XT]),
    "roll": (lambda x: x.roll((1, -5), (0, 1)), None, [X34]),
    "roll_flat": (lambda x: x.roll(5), None, [XT]),
    "unfold": (lambda x: x.unfold(1, 2, 1), None, [X34]),
    "unfold_wide": (lambda x: x.unfold(0, 3, 2), None, [data((7, 2), seed=8)]),
    "unflatten": (lambda x: x.unflatten(1, (2, -1)), None, [X34]),
    "movedim": (lambda x: x.movedim((0, 1), (2, 0)), None, [X234]),
    "swapaxes": (lambda x: x.swapaxes(0, 2), None, [X234]),
    "diag_vec": (lambda x: x.diag(1), None, [V4]),
    "diag_vec_neg": (lambda x: x.diag(-2), None, [V4]),
    "diag_mat": (lambda x: x.diag(-1), None, [XT]),
    "diagonal_3d": (lambda x: x.diagonal(1, 2, 0), None, [X234]),
    "tril": (lambda x: x.tril(), None, [X34]),
    "triu_k": (lambda x: x.triu(1), None, [X234]),
    "tril_neg": (lambda x: x.tril(-1), None, [XT]),
    "split_sections": (lambda x: x.split([1, 3], 1)[1], None, [X34]),
    "chunk": (lambda x: x.chunk(2, 0)[1], None, [X34]),
    "unbind": (lambda x: x.unbind(1)[2], None, [X34]),
}


@pytest.mark.parametrize("name", list(GRAD))
def test_grad_against_torch(device, name):
    fn, tfn, inputs = GRAD[name]
    check_fwd_bwd(fn, inputs, tfn or fn, rtol=1e-4, atol=1e-5, device=device)


def _torch(x: np.ndarray):
    return torch.tensor(np.array(x))


# ----------------------------------------------------------------------------- values and indices

@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("x, dim", [(XTIE, 1), (XTIE, 0), (XNAN, 1), (I34, 1), (B34, 0), (X0, 0)],
                         ids=["ties1", "ties0", "nan", "int", "bool", "0d"])
def test_cum_extreme_indices(device, op, x, dim):
    got = getattr(Tensor(x, device=device), op)(dim)
    want = getattr(_torch(x), op)(dim)
    compare(got.values, want.values.numpy(), device)
    compare(got.indices, want.indices.numpy(), device)


@pytest.mark.parametrize("x, dim, descending", [(XTIE, 1, False), (XTIE, 0, True), (XNAN, 1, False),
                                                (XNAN, 1, True), (I34, 1, True), (B34, 1, False), (X0, 0, False),
                                                (X03, 0, False)],
                         ids=["ties", "ties_desc", "nan", "nan_desc", "int", "bool", "0d", "empty"])
def test_sort_indices_stable(device, x, dim, descending):
    t = Tensor(x, device=device)
    want = _torch(x).sort(dim=dim, descending=descending, stable=True)
    got = t.sort(dim, descending=descending)
    compare(got.values, want.values.numpy(), device)
    compare(got.indices, want.indices.numpy(), device)
    compare(t.argsort(dim, descending=descending), want.indices.numpy(), device)


def test_topk_indices(device):
    x = data((3, 6), seed=11)
    for k, dim, largest in [(3, 1, True), (2, 0, False), (0, 1, True), (6, 1, False)]:
        got, want = Tensor(x, device=device).topk(k, dim, largest), _torch(x).topk(k, dim, largest)
        compare(got.values, want.values.numpy(), device)
        compare(got.indices, want.indices.numpy(), device)


@pytest.mark.parametrize("x", [I34, B34], ids=["int", "bool"])
def test_int_bool_scans_and_prod(device, x):
    t, tt = Tensor(x, device=device), _torch(x)
    compare(t.cumsum(1), tt.cumsum(1).numpy(), device)
    compare(t.cumprod(0), tt.cumprod(0).numpy(), device)
    compare(t.prod(1), tt.prod(1).numpy(), device)
    compare(t.cumsum(0, dtype=eqgrad.float32), np.cumsum(x, 0).astype(np.float32), device)


def test_scans_special_values(device):
    x = np.array([[1.0, inf, -2.0, 3.0], [-inf, -inf, 0.0, 1.0], [nan, 1.0, 2.0, 0.0]], np.float32)
    t, tt = Tensor(x, device=device), _torch(x)
    compare(t.cumsum(1), tt.cumsum(1).numpy(), device)
    compare(t.cumprod(1), tt.cumprod(1).numpy(), device)
    compare(t.logcumsumexp(1), tt.logcumsumexp(1).numpy(), device, rtol=1e-5, atol=1e-5)


def test_einsum_against_numpy(device):
    a, b = data((2, 3, 4), seed=12), data((4, 5), seed=13)
    for eq, ops in [("bij,jk->bki", (a, b)), ("ijk->", (a,)), ("i...,...->i...", (a, b[:, 0])),
                    ("ij,ij->ij", (b, b)), ("ji->", (b,))]:
        got = Tensor.einsum(eq, *[Tensor(o, device=device) for o in ops])
        compare(got, np.einsum(eq, *ops), device, rtol=1e-5, atol=1e-5)
    # torch (not NumPy) sums the '...' dimensions that the output leaves out
    got = Tensor.einsum("i...,...->i", Tensor(a, device=device), Tensor(b[:, 0], device=device))
    compare(got, torch.einsum("i...,...->i", _torch(a), _torch(b[:, 0])).numpy(), device, rtol=1e-5, atol=1e-5)
    compare(Tensor.einsum("ij,jk", [Tensor(b.T.copy(), device=device), Tensor(b, device=device)]),
            b.T @ b, device, rtol=1e-5, atol=1e-5)
    ia = data((3, 3), np.int32, seed=14)
    compare(Tensor.einsum("ij,jk->ik", Tensor(ia, device=device), Tensor(ia, device=device)), ia @ ia, device)


def test_split_chunk_unbind(device):
    t = Tensor(X34, device=device)
    for got, want in [(t.split(3, 1), _torch(X34).split(3, 1)), (t.split([2, 0, 2], 1), _torch(X34).split([2, 0, 2], 1)),
                      (t.chunk(3, 1), _torch(X34).chunk(3, 1)), (t.unbind(0), _torch(X34).unbind(0)),
                      (Tensor(X03, device=device).chunk(2), torch.zeros(0, 3).chunk(2)),
                      (Tensor(X03, device=device).split(2), torch.zeros(0, 3).split(2))]:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            compare(g, w.numpy(), device)


def test_movement_int_bool_and_empty(device):
    for x in (I34, B34):
        t, tt = Tensor(x, device=device), _torch(x)
        compare(t.tril(1), tt.tril(1).numpy(), device)
        compare(t.triu(-1), tt.triu(-1).numpy(), device)
        compare(t.diagonal(1), tt.diagonal(1).numpy(), device)
        compare(t[0].diag(), tt[0].diag().numpy(), device)
        compare(t.roll(-1, 1), tt.roll(-1, 1).numpy(), device)
    e = Tensor(X03, device=device)
    compare(e.repeat(2, 2), np.zeros((0, 6)), device)
    compare(e.roll(1, 0), X03, device)
    compare(e.diagonal(), np.zeros((0,)), device)
    compare(e.movedim(0, 1), np.zeros((3, 0)), device)
    compare(Tensor(X34, device=device).repeat(0, 1), np.zeros((0, 4)), device)


def test_meshgrid_linspace(device):
    a, b = np.arange(3, dtype=np.int32), np.array([0.5, 1.5], np.float32)
    for indexing in ("ij", "xy"):
        got = Tensor.meshgrid(Tensor(a, device=device), Tensor(b, device=device), indexing=indexing)
        for g, w in zip(got, np.meshgrid(a, b, indexing=indexing)):
            compare(g, w, device)
    for args in [(0, 1, 5), (-3.5, 7.25, 11), (2, 2, 1), (0, 1, 0), (10, -10, 8)]:
        compare(Tensor.linspace(*args, device=device), torch.linspace(*args).numpy(), device, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- random factories

def test_random_factories_statistics(device):
    eqgrad.manual_seed(3)
    n = 20000
    u = Tensor.uniform(-2.0, 4.0, (n,), device=device).numpy()
    assert u.min() >= -2.0 and u.max() < 4.0 and abs(u.mean() - 1.0) < 0.05 and abs(u.std() - 6 / math.sqrt(12)) < 0.05
    g = Tensor.normal(3.0, 0.5, (n,), device=device).numpy()
    assert abs(g.mean() - 3.0) < 0.02 and abs(g.std() - 0.5) < 0.02
    r = Tensor.randint(-3, 4, (n,), device=device)
    assert r.dtype is eqgrad.int32 and r.device == device
    counts = np.bincount(r.numpy() + 3, minlength=7)
    assert counts.sum() == n and counts.min() > n / 7 * 0.9 and counts.max() < n / 7 * 1.1
    assert Tensor.randint(5, (3, 2), device=device).shape == (3, 2)
    # torch.nn.init formulas: std = gain / sqrt(fan)
    ku = Tensor.kaiming_uniform(64, 32, 3, 3, a=math.sqrt(5), device=device).numpy()
    bound = math.sqrt(3.0) * math.sqrt(2.0 / 6.0) / math.sqrt(32 * 9)
    assert np.abs(ku).max() <= bound and abs(ku.std() - bound / math.sqrt(3)) < 0.03 * bound
    kn = Tensor.kaiming_normal(200, 100, mode="fan_out", nonlinearity="relu", device=device).numpy()
    assert abs(kn.std() - math.sqrt(2.0) / math.sqrt(200)) < 0.03 * math.sqrt(2.0 / 200)
    # a seed gives a reproducible draw
    np.testing.assert_array_equal(Tensor.randint(0, 10, (50,), seed=4).numpy(), Tensor.randint(0, 10, (50,), seed=4).numpy())


def test_like_factories(device):
    t = Tensor(X34, device=device)
    for out, dtype in [(t.rand_like(), eqgrad.float32), (t.randn_like(), eqgrad.float32),
                       (t.empty_like(), eqgrad.float32), (Tensor(I34, device=device).randint_like(2, 5), eqgrad.int32),
                       (t.randint_like(7), eqgrad.float32), (Tensor(I34, device=device).rand_like(dtype=eqgrad.float32), eqgrad.float32)]:
        assert out.shape == (3, 4) and out.dtype is dtype and out.device == device
    assert ((t.rand_like().numpy() >= 0) & (t.rand_like().numpy() < 1)).all()
    v = Tensor(I34, device=device).randint_like(2, 5).numpy()
    assert v.min() >= 2 and v.max() < 5
    np.testing.assert_array_equal(Tensor.empty(2, 0, device=device).numpy(), np.zeros((2, 0), np.float32))


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("fn, err, match", [
    (lambda t: t.cumsum(2), AxisError, "cumsum.*axis 2 is out of range"),
    (lambda t: t.topk(5), ShapeError, r"topk\(\): k must be in \[0, 4\].*got 5"),
    (lambda t: t.repeat(2), ShapeError, r"repeat\(\): 1 repeat sizes.*expected at least 2"),
    (lambda t: t.split([1, 2], 1), ShapeError, r"sum to 4"),
    (lambda t: t.unflatten(1, (3, -1)), ShapeError, "do not divide"),
    (lambda t: t.unfold(1, 5, 1), ShapeError, r"size must be in \[1, 4\]"),
    (lambda t: t.diagonal(0, 1, -1), AxisError, "same axis"),
    (lambda t: t[0].tril(), ShapeError, "at least 2 dimensions"),
    (lambda t: t.reshape(3, 2, 2).diag(), ShapeError, "1-D or 2-D"),
    (lambda t: t.movedim((0, 1), 0), AxisError, "different lengths"),
    (lambda t: t.roll((1, 2), 0), ShapeError, "different lengths"),
    (lambda t: t.norm("nuc"), ValueError, "'nuc'"),
    (lambda t: Tensor.einsum("ij,jk->ik", t), ShapeError, "2 operand subscripts, got 1"),
    (lambda t: Tensor.einsum("ijk->i", t), ShapeError, "operand 0 has 2 dimension"),
    (lambda t: Tensor.einsum("ij,ij->i", t, t.T), ShapeError, "label 'i' has sizes 3 and 4"),
    (lambda t: Tensor.einsum("ij->k", t), ShapeError, "output label 'k'"),
    (lambda t: Tensor.randint(3, 3, (2,)), ValueError, "must be larger"),
    (lambda t: Tensor.kaiming_uniform(5), ShapeError, "at least 2 dimensions"),
    (lambda t: Tensor(I34).rand_like(), eqgrad.DTypeError, "float dtype"),
])
def test_errors(fn, err, match):
    with pytest.raises(err, match=match):
        fn(Tensor(X34))


def test_docstring_examples_run():
    import doctest
    from eqgrad.frontend import shapeops
    assert doctest.testmod(shapeops, extraglobs={"Tensor": Tensor}).failed == 0
