"""F.pad / Tensor.pad modes and Tensor.clone, forward and backward against torch on
every device; any rank against NumPy's pad (torch limits the non-constant modes to 1-3 trailing
axes of 2-5-d inputs)."""
import numpy as np
import pytest

import eqgrad.nn.functional as F
from eqgrad import Tensor
from eqgrad.errors import ShapeError

torch = pytest.importorskip("torch")
NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
CASES = [((2, 7), (2, 3)), ((2, 3, 7), (0, 4)), ((2, 3, 5, 6), (1, 2, 3, 0)), ((1, 2, 4, 5, 6), (1, 1, 0, 3, 2, 1)),
         ((2, 3, 5, 6), (4, 5, 3, 4))]


@pytest.mark.parametrize("mode", list(NP_MODE))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pad_matches_torch_forward_and_backward(mode, case, device):
    shape, p = CASES[case]
    if mode == "reflect" and max(p) >= min(shape[-len(p) // 2:]):
        p = tuple(min(v, min(shape[-len(p) // 2:]) - 1) for v in p)
    if mode == "circular" and max(p) > min(shape[-len(p) // 2:]):
        p = tuple(min(v, min(shape[-len(p) // 2:])) for v in p)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(case), requires_grad=True)
    want = torch.nn.functional.pad(x, p, mode=mode, value=(1.5 if mode == "constant" else None))
    g = torch.randn(want.shape, dtype=torch.float64)
    (want * g).sum().backward()
    dt = "float64"
    t = Tensor(x.detach().numpy(), dtype=dt, device=device, requires_grad=True)
    got = F.pad(t, p, mode=mode, value=(1.5 if mode == "constant" else None))
    (got * Tensor(g.numpy(), dtype=dt, device=device)).sum().backward()
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(t.grad.numpy(), x.grad.numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_any_axes_matches_numpy(mode):
    a = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    pairs = [(1, 1), (0, 3), (2, 0)]
    np.testing.assert_array_equal(Tensor(a).pad(pairs, mode=mode).numpy(), np.pad(a, pairs, mode=NP_MODE[mode]))
    v = np.array([1, 2, 3], np.int32)                      # integer tensors, a 1-d input
    np.testing.assert_array_equal(Tensor(v).pad([(2, 2)], mode=mode).numpy(), np.pad(v, [(2, 2)], mode=NP_MODE[mode]))


def test_pad_errors_name_the_limits():
    x = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match="reflect padding.*below its size 3"):
        F.pad(x, (3, 0), mode="reflect")
    with pytest.raises(ShapeError, match="circular padding.*at most its size 3"):
        F.pad(x, (0, 4), mode="circular")
    with pytest.raises(ValueError, match="mode must be one of"):
        F.pad(x, (1, 1), mode="symmetric")
    with pytest.raises(ValueError, match="value= is for mode='constant'"):
        F.pad(x, (1, 1), mode="reflect", value=2.0)
    with pytest.raises(ShapeError, match="even number"):
        F.pad(x, (1, 1, 1))
    # Tensor.pad takes a pair per axis: torch's flat amounts are an error naming F.pad, not an IndexError
    with pytest.raises(TypeError, match=r"one \(before, after\) pair of ints or None per axis, got 1 .*functional.pad"):
        x.pad((1, 1))
    with pytest.raises(TypeError, match="got \\(1, 2, 3\\)"):
        x.pad(((1, 2, 3), None))
    with pytest.raises(TypeError, match="got \\(1.5, 0\\)"):
        x.pad(((1.5, 0), None))


def test_negative_padding_crops_in_every_mode():
    a = np.arange(10, dtype=np.float32)
    for mode in NP_MODE:
        assert Tensor(a).pad([(-2, -3)], mode=mode).tolist() == a[2:7].tolist()
    np.testing.assert_array_equal(F.pad(Tensor(a), (-1, 2), mode="replicate").numpy(), np.pad(a[1:], (0, 2), mode="edge"))


def test_clone_is_a_copy_with_gradient(device):
    x = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    c = x.clone()
    (c * c).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    y = Tensor([1.0, 2.0], device=device).realize()
    c = y.clone()
    y.add_(10)
    c.mul_(2)
    assert y.tolist() == [11.0, 12.0] and c.tolist() == [2.0, 4.0]
