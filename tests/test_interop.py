"""PyTorch spelling and interop: repr with values, Python numbers, __array__, DLPack both
ways, Tensor(torch_tensor), Tensor.cat/stack class forms, requires_grad= on factories, in-place
``_`` methods as assigns, dim= for axis=."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import DTypeError, ShapeError, Tensor
from conftest import data
from gradcheck import HAVE_TORCH, torch

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def test_repr_shows_values_when_realized_and_says_lazy_otherwise(device):
    t = Tensor([[1.0, 2.5], [3.0, -4.0]], device=device)
    assert repr(t) == f"Tensor([[ 1. ,  2.5],\n        [ 3. , -4. ]], dtype=float32, device={device})"
    lazy = t * 2
    assert repr(lazy) == f"<Tensor shape=(2, 2) dtype=float32 device={device} lazy MUL>"
    assert not lazy.lazydata.realized                      # repr did not compute it
    big = Tensor(np.arange(5000, dtype=np.int32), device=device)
    assert "..." in repr(big) and "int32" in repr(big)     # summarized, as torch
    assert repr(Tensor(True, device=device).contiguous().realize()).startswith("Tensor(True")


def test_python_numbers_and_format(device):
    assert float(Tensor(2.5, device=device)) == 2.5 and int(Tensor([[7]], device=device)) == 7
    assert f"{Tensor(3.14159, device=device):.2f}" == "3.14"
    assert list(range(Tensor(3, device=device))) == [0, 1, 2] and [10, 11, 12][Tensor(1, device=device)] == 11
    with pytest.raises(ShapeError, match=r"one element.*shape \(2,\)"):
        float(Tensor([1.0, 2.0], device=device))
    with pytest.raises(DTypeError, match="integer"):
        [1, 2][Tensor(1.0, device=device)]
    with pytest.raises(TypeError, match="format spec"):
        f"{Tensor([1.0, 2.0], device=device):.2f}"
    assert f"{Tensor([1.0, 2.0], device=device)}" == repr(Tensor([1.0, 2.0], device=device))


def test_numpy_array_protocol_copies(device):
    x = data((3, 4))
    t = Tensor(x, device=device)
    a = np.asarray(t)
    assert a.dtype == np.float32 and np.array_equal(a, x)
    a[0, 0] = 99.0                                          # a copy: the tensor is unchanged
    assert t.numpy()[0, 0] == x[0, 0]
    assert np.asarray(t + 1, dtype=np.float64).dtype == np.float64
    assert np.array_equal(np.add(t, 1), x + 1)


@needs_torch
def test_dlpack_both_ways_and_torch_tensors(device):
    x = data((2, 3))
    t = Tensor(x, device=device)
    tt = torch.from_dlpack(t)
    assert tt.dtype == torch.float32 and np.array_equal(tt.numpy(), x)
    assert np.array_equal(np.from_dlpack(t), x)
    back = Tensor.from_dlpack(torch.arange(6, dtype=torch.float32).reshape(2, 3), device=device)
    assert back.device == device and np.array_equal(back.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    # Tensor(torch_tensor): a copy, also of one that requires grad, and of a non-contiguous view
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    src.requires_grad_(True)
    u = Tensor(src, device=device)
    assert u.shape == (4, 3) and np.array_equal(u.numpy(), src.detach().numpy())
    assert Tensor(torch.tensor([True, False]), device=device).dtype == eqgrad.bool_
    bf = torch.tensor([1.5, -2.0, 3.140625], dtype=torch.bfloat16)
    ub = Tensor(bf, device=device)
    assert ub.dtype == eqgrad.bfloat16 and np.array_equal(ub.numpy(), bf.float().numpy())


def test_cat_and_stack_in_the_class_and_method_forms(device):
    a, b = Tensor(data((2, 3), seed=1), device=device), Tensor(data((2, 3), seed=2), device=device)
    an, bn = a.numpy(), b.numpy()
    np.testing.assert_array_equal(Tensor.cat([a, b], dim=1).numpy(), np.concatenate([an, bn], 1))
    np.testing.assert_array_equal(a.cat(b, dim=0).numpy(), np.concatenate([an, bn], 0))
    np.testing.assert_array_equal(Tensor.stack([a, b], dim=1).numpy(), np.stack([an, bn], 1))
    np.testing.assert_array_equal(Tensor.stack((a, b), 2).numpy(), np.stack([an, bn], 2))
    np.testing.assert_array_equal(a.stack(b).numpy(), np.stack([an, bn]))
    with pytest.raises(DTypeError, match="expected Tensors"):
        Tensor.stack([a, an])
    with pytest.raises(ShapeError, match="expected"):
        Tensor.cat([])


def test_factories_take_requires_grad():
    for t in (Tensor.zeros(2, 3, requires_grad=True), Tensor.ones((2, 3), requires_grad=True),
              Tensor.full((2, 3), 0.5, requires_grad=True), Tensor.rand(2, 3, requires_grad=True),
              Tensor.randn(2, 3, seed=1, requires_grad=True), Tensor.eye(2, 3, requires_grad=True),
              Tensor.arange(6.0, requires_grad=True).reshape(2, 3)):
        assert t.requires_grad
    w = Tensor.zeros(2, 3, requires_grad=True)
    (w * Tensor(data((2, 3)))).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), data((2, 3)))
    assert not Tensor.zeros(2).requires_grad


def test_inplace_methods_are_assigns(device):
    x = data((2, 3))
    t = Tensor(x, device=device)
    old = t * 1                                   # computed from the old value: keeps it
    assert t.add_(1) is t and t.mul_(2) is t
    np.testing.assert_allclose(t.numpy(), (x + 1) * 2, rtol=1e-6)
    np.testing.assert_allclose(old.numpy(), x, rtol=1e-6)
    t.clamp_(-1.0, 1.0) if hasattr(t, "clamp_") else t.clip_(-1.0, 1.0)
    assert t.numpy().max() <= 1.0 and t.numpy().min() >= -1.0
    t.zero_()
    assert not t.numpy().any()
    t.fill_(2.5)
    assert (t.numpy() == 2.5).all()
    t.copy_(Tensor(x[0], device=device))          # broadcast, as torch's copy_
    np.testing.assert_array_equal(t.numpy(), np.broadcast_to(x[0], (2, 3)))
    t.neg_().exp_()
    np.testing.assert_allclose(t.numpy(), np.exp(-np.broadcast_to(x[0], (2, 3))), rtol=1e-5)


def test_dim_is_axis(device):
    x = data((3, 4))
    t = Tensor(x, device=device)
    np.testing.assert_allclose(t.sum(dim=1).numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_allclose(t.mean(dim=0, keepdim=True).numpy(), x.mean(0, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(t.argmax(dim=1).numpy(), x.argmax(1))
    np.testing.assert_allclose(t.softmax(dim=0).numpy().sum(0), np.ones(4), rtol=1e-5)
    np.testing.assert_array_equal(t.flip(dim=0).numpy(), x[::-1])
    with pytest.raises(TypeError, match="both axis= and dim="):
        t.sum(axis=0, dim=0)


@needs_torch
def test_max_and_min_with_a_dim_return_values_and_indices_as_torch(device):
    x = np.array([[1.0, 5.0, 5.0, -2.0], [7.0, 0.0, 7.0, 7.0], [-1.0, -3.0, -1.0, -3.0]], np.float32)
    t = Tensor(x, device=device)
    assert t.max().item() == 7.0 and t.min().item() == -3.0
    for op in ("max", "min"):
        for dim, keepdim in ((1, False), (0, True), (-1, True)):
            got = getattr(t, op)(dim, keepdim=keepdim)
            want = getattr(torch.tensor(x), op)(dim, keepdim=keepdim)
            np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
            np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
            v, i = getattr(t, op)(dim=dim, keepdim=keepdim)          # unpacks; dim= spelling
            assert v.shape == tuple(want.values.shape) and i.dtype == eqgrad.int32
    np.testing.assert_array_equal(t.max(Tensor(np.zeros_like(x), device=device)).numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(t.min(Tensor(np.zeros_like(x), device=device)).numpy(), np.minimum(x, 0))
    np.testing.assert_array_equal(t.max((0, 1)).numpy(), x.max())          # a tuple of axes: the values
    np.testing.assert_array_equal(t.amax(1).numpy(), x.max(1))
    # the gradient of max(dim) goes to the returned index alone (amax's is shared among ties)
    a = Tensor(x, requires_grad=True)
    a.max(1).values.sum().backward()
    b = torch.tensor(x, requires_grad=True)
    b.max(1).values.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    c = Tensor(x, requires_grad=True)
    c.amax(1).sum().backward()
    d = torch.tensor(x, requires_grad=True)
    d.amax(1).sum().backward()
    np.testing.assert_allclose(c.grad.numpy(), d.grad.numpy())


def test_clip_keywords_and_div_rounding_mode(device):
    x = data((3, 4))
    t = Tensor(x, device=device)
    np.testing.assert_array_equal(t.clip(min=-1.0, max=1.0).numpy(), np.clip(x, -1.0, 1.0))
    np.testing.assert_array_equal(t.clamp(max=0.5).numpy(), np.minimum(x, 0.5))
    np.testing.assert_array_equal(t.clamp_(min=0.0).numpy(), np.maximum(x, 0.0))
    with pytest.raises(TypeError, match="both by position and by keyword"):
        t.clip(0.0, min=1.0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        t.clip(low=0.0)
    i = Tensor(np.array([-7, 7, 5], np.int32), device=device)
    np.testing.assert_array_equal(i.div(2, rounding_mode="trunc").numpy(), [-3, 3, 2])
    np.testing.assert_array_equal(i.div(2, rounding_mode="floor").numpy(), [-4, 3, 2])
    np.testing.assert_allclose(i.div(2).numpy(), [-3.5, 3.5, 2.5])
    np.testing.assert_allclose(Tensor(np.float32([-7.5, 7.5]), device=device).div(2.0, rounding_mode="floor").numpy(), [-4.0, 3.0])
