"""Indexing: advanced indexing (index tensors, lists, NumPy arrays, bool masks), setitem,
and torch's gather family, forward against NumPy/torch and backward against torch, on every device."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from eqgrad.errors import AxisError, ShapeError
from conftest import compare, data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

X = data((3, 4, 5), seed=1)
I2 = np.array([[2, 0], [1, 2]], np.int32)

# index -> (index for eqgrad: Tensor entries as int32 arrays, made on the device in the test)
ADVANCED = {
    "tensor": (I2,),
    "neg_tensor": (np.array([-1, 0, -3], np.int32),),
    "list": ([2, 0, 2],),
    "list_neg": ([-1, 1],),
    "nested_list": ([[0], [2]],),
    "second_axis": (slice(None), np.array([3, 0, 3], np.int32)),
    "two_broadcast": (np.array([[0], [2]], np.int32), np.array([1, 3, 0], np.int32)),
    "three": ([0, 2], [1, 3], [4, 0]),
    "int_and_array": (slice(None), 1, [1, 4]),
    "ints_between_arrays": ([0, 2], 1, [1, 4]),
    "apart": ([0, 2], slice(None), [1, 4]),                   # not adjacent: the index dims come first
    "none_between": ([0, 1], None, [1, 2]),
    "ellipsis": (Ellipsis, [4, 0]),
    "slices_around": (slice(1, None), [3, 1], slice(None, None, 2)),
    "empty_index": (np.zeros((0,), np.int32),),
    "bool_mask_np": (X[:, :, 0] > 0,),
    "bool_mask_axis": (slice(None), np.array([True, False, True, False])),
}


def _eq_index(idx, device):
    return tuple(Tensor(i, device=device) if isinstance(i, np.ndarray) and i.dtype == np.int32 else i for i in idx)


def _torch_index(idx):
    return tuple(torch.tensor(i).long() if isinstance(i, np.ndarray) and i.dtype == np.int32
                 else torch.tensor(i) if isinstance(i, np.ndarray) else i for i in idx)


@needs_torch
@pytest.mark.parametrize("name", list(ADVANCED))
def test_advanced_getitem(device, name):
    idx = ADVANCED[name]
    compare(Tensor(X, device=device)[_eq_index(idx, device)], X[idx], device)
    check_fwd_bwd(lambda x: x[_eq_index(idx, device)], [X], lambda x: x[_torch_index(idx)], device=device)


@needs_torch
def test_getitem_small_shapes_and_views(device):
    x0 = np.array(2.5, np.float32)
    check_fwd_bwd(lambda x: x[None][Tensor([0, 0], device=device)], [x0], lambda x: x[None][[0, 0]], device=device)
    e = data((0, 3), seed=2)
    compare(Tensor(e, device=device)[:, [2, 0]], e[:, [2, 0]], device)
    # a view of a view (transpose, flip) indexed by a tensor; a non-contiguous NumPy input
    check_fwd_bwd(lambda x: x.T[Tensor([1, 1, 0], device=device), ::-1], [X[:, :, 0]],
                  lambda x: x.T[torch.tensor([1, 1, 0]), :].flip(1), device=device)
    check_fwd_bwd(lambda x: x[[0, 2], 1:], [X[:, :, 1].T], device=device)


@needs_torch
def test_int_among_arrays_selects_first_as_torch(device):
    """NumPy counts an int among index arrays as an array (x[0, :, [1, 4]] has shape (2, 4) there);
    torch, and eqgrad, select with it first: shape (4, 2)."""
    check_fwd_bwd(lambda x: x[0, :, [1, 4]], [X], device=device)
    check_fwd_bwd(lambda x: x[1, [0, 3], :, None], [X], device=device)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_getitem_int_and_bool_values(device, dtype):
    a = data((4, 3), dtype=dtype, seed=3)
    compare(Tensor(a, device=device)[[3, 0, 3], [2, 2, 0]], a[[3, 0, 3], [2, 2, 0]], device)
    compare(Tensor(a, device=device)[Tensor([[1], [0]], device=device)], a[[[1], [0]]], device)


def test_bool_mask_tensor(device):
    x = Tensor(X, device=device)
    compare(x[x > 0], X[X > 0], device)
    compare(x[:, Tensor(np.array([True, False, False, True]), device=device)], X[:, [True, False, False, True]], device)
    compare(x[x[:, :, 0] > 5], X[X[:, :, 0] > 5], device)       # nothing selected: shape (0, 5)


def test_out_of_range(device):
    x = Tensor(X, device=device)
    with pytest.raises(AxisError, match="index 3 is out of bounds for axis 0 with size 3"):
        x[[0, 3]]
    with pytest.raises(IndexError, match="out of bounds"):
        x[:, np.array([-5])]
    with pytest.raises(AxisError, match="do not broadcast"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(AxisError, match="bool mask of shape"):
        x[np.array([True, False])]
    # an index tensor is not read while the graph is built: out-of-range entries read as 0
    got = x[Tensor([1, 3, -4], device=device)].numpy()
    np.testing.assert_array_equal(got[0], X[1])
    assert not got[1:].any()


# ---------------------------------------------------------------------------- setitem

SETS = {
    "int": ((1,), 5.0),
    "slice_step": ((slice(None, None, 2), slice(3, 0, -2)), np.arange(4, dtype=np.float32).reshape(2, 2, 1) + 0.5),
    "ellipsis_none": ((Ellipsis, None, 2), -1.0),
    "tensor": ((np.array([2, 0], np.int32),), data((2, 4, 5), seed=5)),
    "two_tensors": ((np.array([0, 2], np.int32), slice(None), np.array([4, 1], np.int32)), data((2, 4), seed=6)),
    "apart": (([0, 2], slice(1, 3), [1, 4]), data((2, 2), seed=7)),
    "repeated_last_wins": (([1, 1, 0],), data((3, 1, 5), seed=8)),
    "bool_np": ((X > 1,), 0.0),
    "empty": (([],), 3.0),
}


@pytest.mark.parametrize("name", list(SETS))
def test_setitem(device, name):
    idx, v = SETS[name]
    want = X.copy()
    want[idx] = v
    t = Tensor(X, device=device)
    t[_eq_index(idx, device)] = Tensor(v, device=device) if isinstance(v, np.ndarray) else v
    compare(t, want, device)


def test_setitem_masks_and_dtypes(device):
    t, want = Tensor(X, device=device), X.copy()
    t[t < 0] = 0.0                                           # lazy: the mask is not read
    want[want < 0] = 0
    compare(t, want, device)
    t[t > 1] = Tensor(np.arange((want > 1).sum(), dtype=np.float32), device=device)   # realizes the mask
    want[want > 1] = np.arange((want > 1).sum())
    compare(t, want, device)
    a = data((3, 4), dtype=np.int32, seed=9)
    ti = Tensor(a, device=device)
    ti[1:, [0, 3]] = 2.7                                     # cast to the tensor's dtype, as torch
    a[1:, [0, 3]] = 2
    compare(ti, a, device)
    b = np.zeros((2, 3), bool)
    tb = Tensor(b, device=device)
    tb[:, Tensor([2, 0], device=device)] = True
    b[:, [2, 0]] = True
    compare(tb, b, device)
    with pytest.raises(ShapeError, match="does not broadcast"):
        t[0] = Tensor(np.zeros((3,), np.float32), device=device)


def test_setitem_value_semantics(device):
    """A tensor computed before the write keeps the old value; what shares the storage sees it."""
    w = Tensor(X, device=device).realize()
    alias = w.detach()
    before = w[0] * 10                                       # computed from the old value, still lazy
    row = w[Tensor([1], device=device)]                      # a gather of the old value
    w[0, 1:3] = 0.0
    w[Tensor([1, 1], device=device)] = -1.0
    want = X.copy()
    want[0, 1:3] = 0
    want[1] = -1
    compare(w, want, device)
    compare(alias, want, device)
    compare(before, X[0] * 10, device)
    compare(row, X[[1]], device)
    after = w * 1
    w[...] = 2.0
    w.realize()                                              # commits the write (as assign)
    compare(after, want, device)
    compare(alias, np.full_like(X, 2.0), device)


# ---------------------------------------------------------------------------- gather family

G = data((3, 4), seed=10)
GI = np.array([[2, 0, 1, 1], [0, 0, 2, 1]], np.int32)      # into axis 0 of G; smaller on axis 0
GJ = np.array([[3, 0], [1, 1], [0, 2]], np.int32)          # into axis 1 of G


def _long(f):
    return lambda x, i: f(x, i.long())


@needs_torch
@pytest.mark.parametrize("dim, idx", [(0, GI), (1, GJ), (-1, GJ[:2, :1]), (1, np.zeros((3, 0), np.int32))],
                         ids=["dim0", "dim1", "neg_dim_smaller", "empty"])
def test_gather(device, dim, idx):
    check_fwd_bwd(lambda x, i: x.gather(dim, i), [G, idx], _long(lambda x, i: x.gather(dim, i)), device=device)


@needs_torch
def test_gather_small_and_views(device):
    x0, i0 = np.array(1.5, np.float32), np.array(0, np.int32)
    check_fwd_bwd(lambda x, i: x.gather(0, i), [x0, i0], _long(lambda x, i: x.gather(0, i)), device=device)
    check_fwd_bwd(lambda x, i: x.T.gather(0, i), [G, GJ.T.copy()], _long(lambda x, i: x.T.gather(0, i)), device=device)
    a = data((3, 4), dtype=np.int32, seed=11)
    compare(Tensor(a, device=device).gather(1, Tensor(GJ, device=device)), np.take_along_axis(a, GJ, 1), device)


@needs_torch
def test_take_along_dim_and_index_select(device):
    ti = np.array([[1], [-1], [0]], np.int32)                  # broadcast over axis 1; negative wraps (torch)
    check_fwd_bwd(lambda x, i: x.take_along_dim(i, 0), [G, ti[:1].reshape(1, 1)],
                  _long(lambda x, i: torch.take_along_dim(x, i, 0)), device=device)
    check_fwd_bwd(lambda x, i: x.take_along_dim(i, 1), [G, ti], _long(lambda x, i: torch.take_along_dim(x, i, 1)),
                  device=device)
    check_fwd_bwd(lambda x, i: x.take_along_dim(i), [G, GI], _long(lambda x, i: torch.take_along_dim(x, i)),
                  device=device)
    check_fwd_bwd(lambda x, i: x.index_select(1, i), [G, np.array([3, 3, 0], np.int32)],
                  _long(lambda x, i: x.index_select(1, i)), device=device)
    check_fwd_bwd(lambda x, i: x.index_select(0, i), [G, np.array(2, np.int32)],
                  _long(lambda x, i: x.index_select(0, i)), device=device)


@needs_torch
def test_masked_fill_select_nonzero(device):
    m = G > 0.5
    check_fwd_bwd(lambda x: x.masked_fill(Tensor(m[0], device=device), -2.0), [G],
                  lambda x: x.masked_fill(torch.tensor(m[0]), -2.0), device=device)
    check_fwd_bwd(lambda x, v: x.masked_fill(Tensor(m, device=device), v), [G, np.array(3.0, np.float32)],
                  lambda x, v: x.masked_fill(torch.tensor(m), v), device=device)
    check_fwd_bwd(lambda x: x.masked_select(Tensor(m[:, :1], device=device)), [G],
                  lambda x: x.masked_select(torch.tensor(m[:, :1])), device=device)
    t = Tensor(G, device=device)
    compare(t.nonzero(), np.argwhere(G), device)
    compare((t > 0.5).nonzero(), np.argwhere(m), device)
    for got, want in zip((t > 0.5).nonzero(as_tuple=True), np.nonzero(m)):
        compare(got, want, device)
    compare(Tensor(np.zeros((2, 0), np.int32), device=device).nonzero(), np.zeros((0, 2)).astype(np.int32), device)
    compare(Tensor(np.array(3.0, np.float32), device=device).nonzero(), np.zeros((1, 0), np.int32), device)


SI = np.array([[2, 0, 1, 1], [0, 1, 2, 0]], np.int32)      # distinct targets per column
SD = np.array([[2, 0, 0, 1], [2, 1, 2, 0]], np.int32)      # repeated targets (reductions)
S = data((2, 4), seed=12)


@needs_torch
def test_scatter(device):
    check_fwd_bwd(lambda x, s, i: x.scatter(0, i, s), [G, S, SI], lambda x, s, i: x.scatter(0, i.long(), s),
                  device=device)
    want = G.copy()
    np.put_along_axis(want, GJ[:, :1], 7.0, 1)
    compare(Tensor(G, device=device).scatter(1, Tensor(GJ[:, :1], device=device), 7.0), want, device)
    compare(Tensor(G, device=device).scatter(1, Tensor(GJ[:, :1], device=device), value=7), want, device)
    # torch has no gradient for scatter(reduce=...): its forward, and scatter_reduce's gradient
    want = torch.tensor(G).scatter(0, torch.tensor(SD).long(), torch.tensor(S), reduce="multiply").numpy()
    compare(Tensor(G, device=device).scatter(0, Tensor(SD, device=device), Tensor(S, device=device),
                                             reduce="multiply"), want, device)
    check_fwd_bwd(lambda x, s, i: x.scatter_add(0, i, s), [G, S, SD],
                  lambda x, s, i: x.scatter_add(0, i.long(), s), device=device)
    # a repeated target keeps the last write (torch leaves it undefined; NumPy's setitem is last-wins)
    got = Tensor(np.zeros(3, np.float32), device=device).scatter(0, Tensor([1, 1, 0], device=device),
                                                                  Tensor([1.0, 2.0, 3.0], device=device))
    compare(got, [3.0, 2.0, 0.0], device)


@needs_torch
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(device, reduce, include_self):
    check_fwd_bwd(lambda x, s, i: x.scatter_reduce(0, i, s, reduce, include_self=include_self), [G, S, SD],
                  lambda x, s, i: x.scatter_reduce(0, i.long(), s, reduce, include_self=include_self), device=device)


@needs_torch
@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_ties_share_the_gradient(device, reduce):
    x, s, i = np.array([1.0, 2.0, 0.5], np.float32), np.array([1.0, 1.0, 2.0, 0.5], np.float32), np.array([0, 0, 1, 2], np.int32)
    check_fwd_bwd(lambda a, b, j: a.scatter_reduce(0, j, b, reduce), [x, s, i],
                  lambda a, b, j: a.scatter_reduce(0, j.long(), b, reduce), device=device)


def test_scatter_reduce_int(device):
    a = np.array([5, -7, 3], np.int32)
    i, s = np.array([0, 0, 1, 1], np.int32), np.array([-2, 0, -3, -3], np.int32)
    want = {"sum": [3, -13, 3], "prod": [0, -63, 3], "mean": [1, -5, 3], "amax": [5, -3, 3], "amin": [-2, -7, 3]}
    for reduce, w in want.items():
        got = Tensor(a, device=device).scatter_reduce(0, Tensor(i, device=device), Tensor(s, device=device), reduce)
        compare(got, np.array(w, np.int32), device)


def test_errors():
    x = Tensor(G)
    with pytest.raises(eqgrad.DTypeError, match="gather\\(\\): index must be an int32 tensor"):
        x.gather(0, Tensor(GI.astype(np.float32)))
    with pytest.raises(ShapeError, match="as many dimensions"):
        x.gather(0, Tensor(GI[0]))
    with pytest.raises(ValueError, match="reduce must be one of"):
        x.scatter_reduce(0, Tensor(SD), Tensor(S), "max")
    with pytest.raises(ShapeError, match="masked_fill\\(\\): mask"):
        x.masked_fill(Tensor(np.ones((2, 4), bool)), 0.0)


def test_docstring_examples_run():
    import doctest
    import eqgrad.frontend.indexing as indexing
    assert doctest.testmod(indexing, extraglobs={"Tensor": Tensor}).failed == 0
