"""Index tensors of every integer dtype (int8, uint8, int16, int32, uint32, int64) in everything that
takes indices: ``x[i]``, ``x[i] = v``, index_select, gather, take_along_dim, scatter/scatter_add/
scatter_reduce, F.one_hot, F.embedding/nn.Embedding, F.nll_loss, F.cross_entropy. Forward (and the
gradient of the data argument) against torch with the same indices as int64, torch's default; 0-d,
empty, negative and non-contiguous (transposed) index tensors.

Choices (eqgrad/frontend/indexing.py's docstring):
- every integer dtype means what int32 means; ``x[uint8_tensor]`` (and setitem) is an AxisError:
  torch 2.13 reads a uint8 index as a deprecated bool mask, NumPy as integers, so eqgrad asks for
  ``.bool()`` or ``.long()``; the other ops take uint8 as integers (torch's nll_loss does too);
- an index out of range is what it is for int32 today: it matches nothing (reads 0, writes nothing,
  a one-hot row of zeros, a loss term of 0), where torch raises. An int64 value beyond int32
  (``2**32 + 1``) is out of range in the same way: never wrapped into a valid index (it would be 1
  after a cast to int32), and a uint32 ``2**32 - 1`` is never -1;
- float (and bool, where a mask makes no sense) index tensors are errors naming the dtypes taken.
"""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
import eqgrad.nn as nn
import eqgrad.nn.functional as F
from eqgrad import Tensor
from eqgrad.errors import AxisError, DTypeError
from conftest import data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

INT_DTYPES = ["int8", "uint8", "int16", "int32", "uint32", "int64"]
SIGNED = {"int8", "int16", "int32", "int64"}

X = data((3, 4), seed=1)
G = data((3, 4), seed=2)
S = data((2, 4), seed=3)


def skip_unsupported(device: str, dt: str) -> None:
    # the index dtype's path is the frontend's (widening, one-hot compares), the same on every device:
    # LLVM runs every dtype, the other devices int8 (widened), int32 and int64 (the suite's time)
    if device != "LLVM" and dt not in ("int8", "int32", "int64"):
        pytest.skip(f"{dt} indices run on LLVM (device-independent frontend path)")
    if device == "CUDA" and dt != "int32":
        pytest.skip(f"{dt} tensors are not realized on {device} (docs/semantics.md, Dtypes)")


@pytest.fixture(params=INT_DTYPES)
def dt(request, device):
    skip_unsupported(device, request.param)
    return request.param


def ix(a, dt: str) -> np.ndarray:
    """``a`` as a NumPy index array of dtype ``dt`` (each value must fit)."""
    a = np.asarray(a)
    out = a.astype(dt)
    assert np.array_equal(out.astype(np.int64), a.astype(np.int64)), f"{a} does not fit {dt}"
    return out


def _long(f):
    """A torch function of (data..., index) taking the index as int64."""
    return lambda *a: f(*a[:-1], a[-1].long())


def _on(device):
    return lambda a: Tensor(a, device=device)


# ------------------------------------------------------------------ x[i], x[i] = v

GETITEM = {
    "1d": lambda x, i: x[i],
    "2d": lambda x, i: x[i],
    "0d": lambda x, i: x[i],
    "empty": lambda x, i: x[i],
    "second_axis": lambda x, i: x[:, i],
    "transposed": lambda x, i: x[i.T],
    "sliced": lambda x, i: x[:, i[::2]],
    "with_int32_array": lambda x, i: x[i, [1, 3, 0]],
}
GETITEM_IDX = {
    "1d": [2, 0, 2], "2d": [[2, 0], [1, 2]], "0d": 1, "empty": np.zeros((0,), np.int64),
    "second_axis": [3, 0, 3], "transposed": [[0, 1, 2], [2, 2, 0]], "sliced": [3, 1, 2, 0, 1],
    "with_int32_array": [[0], [2]],
}


@pytest.mark.parametrize("case", list(GETITEM))
def test_getitem(device, dt, case):
    f, i = GETITEM[case], ix(GETITEM_IDX[case], dt)
    if dt == "uint8":
        with pytest.raises(AxisError, match=r"uint8 tensor.*\.bool\(\).*\.long\(\)"):
            f(Tensor(X, device=device), Tensor(i, device=device))
        return
    tf = _long(lambda x, i: f(x, i) if case != "with_int32_array" else x[i, torch.tensor([1, 3, 0])])
    check_fwd_bwd(f, [X, i], tf, device=device)


@pytest.mark.parametrize("dt_", sorted(SIGNED))
def test_getitem_negative(device, dt_):
    skip_unsupported(device, dt_)
    i = ix([[-1, 0], [-3, 2]], dt_)
    check_fwd_bwd(lambda x, i: x[i], [X, i], _long(lambda x, i: x[i]), device=device)
    check_fwd_bwd(lambda x, i: x[:, i.T], [X, i], _long(lambda x, i: x[:, i.T]), device=device)
    check_fwd_bwd(lambda x, i: x[i[0, 0]], [X, i], _long(lambda x, i: x[i[0, 0]]), device=device)   # 0-d view


def test_getitem_narrow_negative_wide_axis(device):
    """i + n in the index's own dtype would overflow int8 (-1 + 300): widened to int32 first."""
    skip_unsupported(device, "int8")
    z = np.arange(300, dtype=np.float32)
    for dt_ in ("int8", "int16"):
        got = Tensor(z, device=device)[Tensor(ix([-1, -128, 127], dt_), device=device)].numpy()
        np.testing.assert_array_equal(got, z[[-1, -128, 127]])


@pytest.mark.parametrize("case", ["1d", "2d", "0d", "empty", "transposed", "negative"])
def test_setitem(device, dt, case):
    idx = {"1d": [2, 0], "2d": [[2], [0]], "0d": 1, "empty": np.zeros((0,), np.int64),
           "transposed": [[0], [2]], "negative": [-1, -3]}[case]
    if case == "negative" and dt not in SIGNED:
        pytest.skip("no negative values in an unsigned dtype")
    i = ix(idx, dt)
    t = Tensor(X, device=device)
    ti = Tensor(i, device=device)
    if case == "transposed":
        ti, i = ti.T, i.T
    if dt == "uint8":
        with pytest.raises(AxisError, match="uint8 tensor"):
            t[ti] = 5.0
        return
    t[ti] = 5.0
    want = torch.tensor(X)
    want[torch.tensor(i.astype(np.int64))] = 5.0
    np.testing.assert_array_equal(t.numpy(), want.numpy())
    t2 = Tensor(X, device=device)
    t2[:, ti] = Tensor(np.float32(-2.0), device=device)
    want2 = torch.tensor(X)
    want2[:, torch.tensor(i.astype(np.int64))] = -2.0
    np.testing.assert_array_equal(t2.numpy(), want2.numpy())


# ------------------------------------------------------------------ torch's gather family

@pytest.mark.parametrize("case", ["1d", "0d", "empty", "sliced"])
def test_index_select(device, dt, case):
    i = ix({"1d": [3, 3, 0], "0d": 2, "empty": np.zeros((0,), np.int64), "sliced": [3, 9, 0, 9, 1]}[case], dt)
    f = (lambda x, i: x.index_select(1, i[::2])) if case == "sliced" else (lambda x, i: x.index_select(1, i))
    check_fwd_bwd(f, [X, i], _long(f), device=device)


GI = np.array([[2, 0, 1, 1], [0, 0, 2, 1]])       # into axis 0 of G
GJ = np.array([[3, 0], [1, 1], [0, 2]])           # into axis 1 of G


@pytest.mark.parametrize("case", ["dim0", "dim1", "empty", "transposed", "0d"])
def test_gather(device, dt, case):
    if case == "0d":
        check_fwd_bwd(lambda x, i: x.gather(0, i), [np.array(1.5, np.float32), ix(0, dt)],
                      _long(lambda x, i: x.gather(0, i)), device=device)
        return
    dim, idx, f = {"dim0": (0, GI, lambda x, i: x.gather(0, i)),
                   "dim1": (1, GJ, lambda x, i: x.gather(1, i)),
                   "empty": (1, np.zeros((3, 0), np.int64), lambda x, i: x.gather(1, i)),
                   "transposed": (0, GI.T.copy(), lambda x, i: x.gather(0, i.T))}[case]
    i = ix(idx, dt)
    check_fwd_bwd(f, [G, i], _long(f), device=device)


@pytest.mark.parametrize("case", ["dim1", "flat", "transposed", "negative"])
def test_take_along_dim(device, dt, case):
    if case == "negative" and dt not in SIGNED:
        pytest.skip("no negative values in an unsigned dtype")
    idx, f = {"dim1": ([[1], [3], [0]], lambda x, i: x.take_along_dim(i, 1)),      # same API in both
              "flat": (GI, lambda x, i: x.take_along_dim(i)),
              "transposed": ([[0, 1, 2]], lambda x, i: x.take_along_dim(i.T, 1)),
              "negative": ([[-1], [0], [-4]], lambda x, i: x.take_along_dim(i, 1))}[case]
    check_fwd_bwd(f, [G, ix(idx, dt)], _long(f), device=device)


SI = np.array([[2, 0, 1, 1], [0, 1, 2, 0]])       # distinct targets per column
SD = np.array([[2, 0, 0, 1], [2, 1, 2, 0]])       # repeated targets


@pytest.mark.parametrize("case", ["scatter", "scatter_value", "scatter_add", "sum", "amax", "transposed", "empty"])
def test_scatter_family(device, dt, case):
    f, idx = {
        "scatter": (lambda x, s, i: x.scatter(0, i, s), SI),
        "scatter_value": (lambda x, s, i: x.scatter(1, i, 7.0) + s.sum(), SI),
        "scatter_add": (lambda x, s, i: x.scatter_add(0, i, s), SD),
        "sum": (lambda x, s, i: x.scatter_reduce(0, i, s, "sum", include_self=False), SD),
        "amax": (lambda x, s, i: x.scatter_reduce(0, i, s, "amax"), SD),
        "transposed": (lambda x, s, i: x.scatter_add(0, i.T, s), SD.T.copy()),
        # torch's backward fails for an empty index with a larger src: src empty too
        "empty": (lambda x, s, i: x.scatter_add(0, i, s[:0]), np.zeros((0, 4), np.int64)),
    }[case]
    check_fwd_bwd(f, [G, S, ix(idx, dt)], _long(f), device=device)


# ------------------------------------------------------------------ nn.functional

W = data((5, 3), seed=4)


@pytest.mark.parametrize("case", ["2d", "0d", "empty", "transposed"])
def test_embedding_and_one_hot(device, dt, case):
    idx = {"2d": [[1, 4, 1], [0, 3, 2]], "0d": 3, "empty": np.zeros((0, 2), np.int64),
           "transposed": [[1, 4, 1], [0, 3, 2]]}[case]
    tr = (lambda i: i.T) if case == "transposed" else (lambda i: i)
    i = ix(idx, dt)
    check_fwd_bwd(lambda w, i: F.embedding(tr(i), w), [W, i],
                  _long(lambda w, i: torch.nn.functional.embedding(tr(i), w)), device=device)
    oh = F.one_hot(tr(Tensor(i, device=device)), 5)
    assert oh.dtype is eqgrad.int32                      # torch: int64 (eqgrad's one-hots are int32)
    want = torch.nn.functional.one_hot(tr(torch.tensor(i.astype(np.int64))), 5)
    np.testing.assert_array_equal(oh.numpy(), want.numpy())


def test_nn_embedding(device, dt):
    emb = nn.Embedding(5, 3)
    emb.weight = Tensor(W, device=device, requires_grad=True)
    i = ix([[4, 0], [4, 2]], dt)
    out = emb(Tensor(i, device=device))
    out.sum().backward()
    temb = torch.nn.Embedding(5, 3)
    temb.weight.data = torch.tensor(W)
    tout = temb(torch.tensor(i.astype(np.int64)))
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy(), rtol=1e-6)


LOGITS = data((4, 5), seed=5)
LOGITS3 = data((2, 5, 3), seed=6)
CW = np.linspace(0.5, 2.0, 5).astype(np.float32)


@pytest.mark.parametrize("case", ["nll", "nll_weight_ignore", "ce", "ce_smooth_weight", "ce_3d_transposed",
                                  "ce_unbatched_0d", "ce_ignore_negative"])
def test_losses(device, dt, case):
    tF = torch.nn.functional
    if case == "ce_ignore_negative" and dt not in SIGNED:
        pytest.skip("ignore_index=-100 needs a signed dtype")
    x, idx, f, tf = {
        "nll": (LOGITS, [1, 4, 0, 4], lambda x, t: F.nll_loss(x.log_softmax(1), t),
                lambda x, t: tF.nll_loss(x.log_softmax(1), t)),
        "nll_weight_ignore": (LOGITS, [1, 4, 0, 2],
                              lambda x, t: F.nll_loss(x.log_softmax(1), t, weight=Tensor(CW, device=x.device),
                                                      ignore_index=4),
                              lambda x, t: tF.nll_loss(x.log_softmax(1), t, weight=torch.tensor(CW), ignore_index=4)),
        "ce": (LOGITS, [1, 4, 0, 4], lambda x, t: F.cross_entropy(x, t), lambda x, t: tF.cross_entropy(x, t)),
        "ce_smooth_weight": (LOGITS, [3, 0, 0, 2],
                             lambda x, t: F.cross_entropy(x, t, weight=Tensor(CW, device=x.device), label_smoothing=0.2),
                             lambda x, t: tF.cross_entropy(x, t, weight=torch.tensor(CW), label_smoothing=0.2)),
        "ce_3d_transposed": (LOGITS3, [[1, 4], [0, 0], [2, 3]],
                             lambda x, t: F.cross_entropy(x, t.T, reduction="none"),
                             lambda x, t: tF.cross_entropy(x, t.T, reduction="none")),
        "ce_unbatched_0d": (LOGITS[0], 3, lambda x, t: F.cross_entropy(x, t, reduction="none"),
                            lambda x, t: tF.cross_entropy(x, t, reduction="none")),
        "ce_ignore_negative": (LOGITS, [1, -100, 0, -100], lambda x, t: F.cross_entropy(x, t),
                               lambda x, t: tF.cross_entropy(x, t)),
    }[case]
    check_fwd_bwd(f, [x, ix(idx, dt)], _long(tf), device=device)


# ------------------------------------------------------------------ beyond int32, out of range

def _outcomes(device, i_np):
    """Every op's result for a (2,)-shaped index ``i_np`` (first entry the one under test, second 1)
    into axes of size 3/4/5: as NumPy arrays."""
    t = Tensor(i_np, device=device)
    x, w = Tensor(X, device=device), Tensor(W, device=device)
    out = {
        "getitem": x[t],
        "index_select": x.index_select(0, t),
        "gather": x.gather(0, t.reshape(2, 1)),
        "take_along_dim": x.take_along_dim(t.reshape(2, 1), 0),
        "scatter": x.scatter(0, t.reshape(2, 1), 9.0),
        "scatter_add": x.scatter_add(0, t.reshape(2, 1), Tensor(S, device=device)),
        "one_hot": F.one_hot(t, 5),
        "embedding": F.embedding(t, w),
        "nll_loss": F.nll_loss(Tensor(LOGITS[:2], device=device), t, reduction="none"),
    }
    y = Tensor(X, device=device)
    y[t] = -1.0
    out["setitem"] = y
    eqgrad.realize(*out.values())
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.parametrize("value, dt_", [(2 ** 32 + 1, "int64"), (2 ** 31, "int64"), (-(2 ** 32) + 1, "int64"),
                                        (-(2 ** 63), "int64"), (2 ** 32 - 1, "uint32"), (2 ** 31 + 1, "uint32")],
                         ids=["2**32+1", "2**31", "-2**32+1", "int64_min", "uint32_max", "2**31+1_uint32"])
def test_beyond_int32_is_out_of_range_not_wrapped(device, value, dt_):
    """torch raises for an index out of range; eqgrad's int32 index tensors read 0 there (no host
    read while the graph is built). A wide index out of range does the same, whatever it would wrap
    to in int32 (2**32 + 1 -> 1, 2**31 -> -2**31, uint32 max -> -1: the last element)."""
    skip_unsupported(device, dt_)
    got = _outcomes(device, np.array([value, 1], dt_))
    want = _outcomes(device, np.array([7, 1], np.int32))        # out of range for every axis above
    wrapped = _outcomes(device, np.array([value, 1], np.int64).astype(np.int32))
    for k in got:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    if -3 <= int(np.array(value).astype(np.int32)) < 3:           # the wrapped index is valid: it differs
        assert any(not np.array_equal(got[k], wrapped[k]) for k in got)
    with pytest.raises((IndexError, RuntimeError)):               # torch: an error
        torch.tensor(X)[torch.tensor([value, 1], dtype=torch.int64 if dt_ == "int64" else torch.uint32).long()]


@pytest.mark.parametrize("dt_", sorted(SIGNED))
def test_negative_gather_scatter_as_int32(device, dt_):
    """gather/scatter take no negative indices (torch raises): out of range, as an int32 -1 is."""
    skip_unsupported(device, dt_)
    x, s = Tensor(G, device=device), Tensor(S, device=device)

    def outs(dtype):
        i = Tensor(np.array([[-1, 0, 1, 2]], dtype), device=device)
        res = [x.gather(0, i), x.scatter(0, i, s), x.scatter_add(0, i, s), F.one_hot(i, 3), F.embedding(i, x)]
        eqgrad.realize(*res)
        return [r.numpy() for r in res]

    got, want = outs(dt_), outs(np.int32)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert got[0][0, 0] == 0.0 and not got[3][0, 0].any()


def test_host_index_arrays_beyond_int32(device):
    """NumPy/list indices are checked on the host: out of range raises AxisError, any int dtype."""
    skip_unsupported(device, "int64")
    x = Tensor(X, device=device)
    with pytest.raises(AxisError, match="out of bounds"):
        x[np.array([2 ** 32 + 1], np.int64)]
    np.testing.assert_array_equal(x[np.array([2, 0], np.uint32)].numpy(), X[[2, 0]])
    np.testing.assert_array_equal(x.gather(1, np.array([[1]] * 3, np.int64)).numpy(), X[:, [1]])
    with pytest.raises(OverflowError):                           # a list is int32: 2**40 does not fit
        x.gather(0, [[2 ** 40]])


# ------------------------------------------------------------------ errors

DTS = "int8, uint8, int16, int32, uint32, int64"


def test_errors_name_the_dtypes():
    x, f = Tensor(X), Tensor(np.array([1.0, 0.0], np.float32))
    with pytest.raises(AxisError, match=r"integer \(int8, int16, int32, uint32, int64\) or bool tensor, got float32"):
        x[f]
    with pytest.raises(AxisError, match="got float32"):
        x[f] = 1.0
    for name, call in [("gather", lambda: x.gather(0, f.reshape(2, 1))),
                       ("index_select", lambda: x.index_select(0, f)),
                       ("take_along_dim", lambda: x.take_along_dim(f.reshape(2, 1), 0)),
                       ("scatter", lambda: x.scatter(0, f.reshape(2, 1), 1.0)),
                       ("scatter_reduce", lambda: x.scatter_add(0, f.reshape(2, 1), Tensor(S))),
                       ("gather", lambda: x.gather(0, Tensor([[True]])))]:
        with pytest.raises(DTypeError, match=name + r"\(\): index must be .*" + DTS + ".*got (float32|bool)"):
            call()
    for name, call in [("one_hot", lambda: F.one_hot(f, 3)), ("embedding", lambda: F.embedding(f, Tensor(W))),
                       ("nll_loss", lambda: F.nll_loss(Tensor(LOGITS[:2]), f))]:
        with pytest.raises(DTypeError, match=name + r"\(\): expected .*" + DTS + ".*got float32"):
            call()
    with pytest.raises(DTypeError, match=r"cross_entropy\(\): expected int32 class indices or float32 probabilities.*got bool"):
        F.cross_entropy(Tensor(LOGITS[:2]), Tensor([True, False]))
    # a uint8 mask is not a mask (torch's masked_fill refuses it too); a bool one is
    with pytest.raises(DTypeError, match=r"masked_fill\(\): mask must be a bool tensor, got uint8"):
        x.masked_fill(Tensor(np.ones((3, 4), np.uint8)), 0.0)
    np.testing.assert_array_equal(x[Tensor(X > 0)].numpy(), X[X > 0])
    np.testing.assert_array_equal(x[Tensor(np.array([1, 0, 1], np.uint8)).bool()].numpy(), X[[0, 2]])
