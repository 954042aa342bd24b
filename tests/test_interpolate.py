"""nn.functional.interpolate and nn.Upsample (eqgrad/nn/interpolate.py) against torch 2.13.0 (CPU):
forward and the input's gradient for every mode, size= and scale_factor=, align_corners, and the
errors; the host-side source indices against torch's index for index."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from eqgrad.errors import DTypeError, ShapeError
from eqgrad.nn import Upsample
from eqgrad.nn.functional import interpolate
from eqgrad.nn.interpolate import _linear_index, _nearest_index
from conftest import data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
pytestmark = needs_torch
TF = torch.nn.functional if HAVE_TORCH else None


CASES = [
    # 1-D: nearest / nearest-exact / linear, up and down, integer and non-integer factors
    ((2, 3, 5), dict(size=11)),
    ((2, 3, 6), dict(scale_factor=2)),
    ((2, 3, 9), dict(scale_factor=1 / 3)),
    ((1, 2, 7), dict(scale_factor=0.5, mode="nearest-exact")),
    ((1, 2, 5), dict(size=8, mode="nearest-exact")),
    ((1, 2, 8), dict(scale_factor=4, mode="linear")),
    ((1, 2, 8), dict(scale_factor=0.5, mode="linear")),
    ((1, 2, 7), dict(size=10, mode="linear", align_corners=True)),
    ((1, 2, 5), dict(size=1, mode="linear")),
    ((1, 2, 5), dict(size=1, mode="linear", align_corners=True)),
    # 2-D
    ((1, 2, 4, 5), dict(size=(7, 3), mode="bilinear")),
    ((2, 2, 4, 5), dict(scale_factor=2, mode="bilinear")),
    ((1, 2, 4, 5), dict(scale_factor=(1.5, 0.5), mode="bilinear", align_corners=True)),
    ((1, 3, 6, 7), dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)),
    ((1, 2, 5, 5), dict(size=(1, 1), mode="bilinear")),
    ((1, 2, 3, 4), dict(scale_factor=(2.5, 3))),
    ((1, 2, 7, 5), dict(size=(3, 9), mode="nearest-exact")),
    # 3-D
    ((1, 1, 3, 4, 5), dict(size=(5, 2, 7), mode="trilinear")),
    ((1, 2, 2, 3, 4), dict(scale_factor=2, mode="trilinear", align_corners=True)),
    ((1, 2, 2, 3, 4), dict(scale_factor=(2, 1.5, 0.5))),
    # area (adaptive average pooling)
    ((1, 2, 6, 7), dict(size=(3, 4), mode="area")),
]


def _ids(case):
    shape, kw = case
    return f"{len(shape) - 2}d-" + "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_interpolate_matches_torch(device, case):
    shape, kw = case
    check_fwd_bwd(lambda x: interpolate(x, **kw), [data(shape, seed=len(shape))],
                  lambda x: TF.interpolate(x, **kw), device=device)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_transposed_view(mode):
    """A non-contiguous input: the transpose of an (N, C, W, H) tensor."""
    kw = dict(size=(5, 7), mode=mode)
    check_fwd_bwd(lambda x: interpolate(x.transpose(2, 3), **kw), [data((1, 2, 3, 4), seed=3)],
                  lambda x: TF.interpolate(x.transpose(2, 3), **kw))


@pytest.mark.parametrize("kw", [dict(size=(7, 3), mode="bilinear"), dict(scale_factor=1.3, mode="bilinear"),
                                dict(size=(9, 4), mode="bilinear", align_corners=True),
                                dict(scale_factor=2.5), dict(size=(4, 9), mode="nearest-exact")])
def test_float64_tight(kw):
    x = data((1, 2, 5, 6), np.float64, seed=4)
    out = interpolate(Tensor(x), **kw)
    assert out.dtype == eqgrad.float64
    check_fwd_bwd(lambda t: interpolate(t, **kw), [x], lambda t: TF.interpolate(t, **kw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_kept(dtype):
    x = data((1, 2, 4, 5), seed=5)
    kw = dict(size=(7, 3), mode="bilinear")
    out = interpolate(Tensor(x).cast(dtype), **kw)
    assert out.dtype.name == dtype
    want = TF.interpolate(torch.tensor(x).to(getattr(torch, dtype)), **kw).float().numpy()
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2e-2, atol=2e-2)


def test_integer_inputs():
    x = data((1, 2, 3, 4), np.int32, seed=6, low=-50, high=50)
    for kw in (dict(scale_factor=2), dict(size=(5, 7)), dict(size=(2, 3), mode="nearest-exact")):
        out = interpolate(Tensor(x), **kw)
        assert out.dtype == eqgrad.int32
        # torch takes uint8 and floats for nearest on CPU: the float result holds the exact ints
        want = TF.interpolate(torch.tensor(x, dtype=torch.float64), **kw).numpy().astype(np.int32)
        np.testing.assert_array_equal(out.numpy(), want)
    u = data((1, 1, 4, 4), np.uint8, seed=7, low=0, high=255)
    np.testing.assert_array_equal(interpolate(Tensor(u), size=(6, 3)).numpy(),
                                  TF.interpolate(torch.tensor(u), size=(6, 3)).numpy())
    with pytest.raises(DTypeError, match=r"mode 'bilinear' needs a floating-point input, got int32"):
        interpolate(Tensor(x), scale_factor=2, mode="bilinear")


def test_movement_only_paths(monkeypatch):
    """Integer nearest upscales and downscales, 2x (bi)linear up and down, and unchanged axes are
    movement ops (expand, reshape, pad, shrink): no gather."""
    def no_gather(*args, **kwargs):
        raise AssertionError("index_select called")
    monkeypatch.setattr(Tensor, "index_select", no_gather)
    x = Tensor(data((1, 2, 4, 6), seed=8))
    for kw in (dict(scale_factor=2), dict(scale_factor=(3, 0.5)), dict(scale_factor=0.5, mode="nearest-exact"),
               dict(scale_factor=2, mode="bilinear"), dict(scale_factor=0.5, mode="bilinear"),
               dict(scale_factor=4, mode="bilinear"), dict(size=(4, 6), mode="bilinear")):
        got = interpolate(x, **kw).numpy()
        np.testing.assert_allclose(got, TF.interpolate(torch.tensor(x.numpy()), **kw).numpy(), rtol=1e-5, atol=1e-6)


def test_host_indices_match_torch():
    """Source indices (nearest) and interpolated positions (linear) for many sizes and factors,
    against torch's kernels on an arange: float32 and float64 arithmetic as torch's."""
    def torch_pos(n, mode, tdt, **kw):
        return TF.interpolate(torch.arange(n, dtype=tdt).reshape(1, 1, n), mode=mode, **kw)[0, 0].numpy()

    for tdt, ft in ((torch.float32, np.float32), (torch.float64, np.float64)):
        for n in range(1, 21):
            specs = [(o, None) for o in range(1, 45)] + \
                    [(int(n * s), s) for s in (0.3, 0.7, 1.1, 1.3, 1.5, 2.5, 1 / 3, 2 / 3, 4.2) if int(n * s) >= 1]
            for o, sf in specs:
                kw = dict(size=o) if sf is None else dict(scale_factor=sf)
                for mode in ("nearest", "nearest-exact"):
                    np.testing.assert_array_equal(_nearest_index(n, o, sf, mode == "nearest-exact", ft),
                                                  torch_pos(n, mode, tdt, **kw), err_msg=f"{mode} {n} -> {o} ({sf})")
                for ac in (False, True):
                    want = torch_pos(n, "linear", tdt, align_corners=ac, **kw)
                    if o == n:
                        got = np.arange(n, dtype=ft)
                    else:
                        i0, i1, w0, w1 = _linear_index(n, o, sf, ac, ft)
                        got = i0.astype(ft) * w0 + i1.astype(ft) * w1
                    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 if ft is np.float32 else 1e-12,
                                               err_msg=f"linear {n} -> {o} ({sf}, align_corners={ac})")


def test_upsample_module():
    for kw in (dict(scale_factor=2), dict(size=(5, 3), mode="bilinear", align_corners=True),
               dict(scale_factor=(1.5, 2.0), mode="bilinear")):
        m, tm = Upsample(**kw), torch.nn.Upsample(**kw)
        assert m.parameters() == [] and m.state_dict() == {}
        check_fwd_bwd(lambda x: m(x), [data((1, 2, 4, 4), seed=9)], lambda x: tm(x))
    assert repr(Upsample(scale_factor=2)) == "Upsample(scale_factor=2.0, mode='nearest')"
    assert repr(Upsample(size=3, mode="bilinear")) == "Upsample(size=3, mode='bilinear')"
    check_fwd_bwd(lambda x: Upsample(size=9, mode="linear")(x), [data((2, 3, 4), seed=10)],
                  lambda x: torch.nn.Upsample(size=9, mode="linear")(x))


def test_errors():
    x3, x4 = Tensor.ones(1, 1, 3), Tensor.ones(1, 1, 3, 3)
    with pytest.raises(ValueError, match="only one of size and scale_factor, got both"):
        interpolate(x3, size=2, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor, got neither"):
        interpolate(x3)
    with pytest.raises(ValueError, match="align_corners can only be set with the interpolating modes"):
        interpolate(x3, size=2, align_corners=True)
    with pytest.raises(NotImplementedError, match=r"mode must be one of nearest \| nearest-exact \| linear.*'bicubic'"):
        interpolate(x4, size=2, mode="bicubic")
    with pytest.raises(NotImplementedError, match="got 'foo'"):
        interpolate(x4, size=2, mode="foo")
    with pytest.raises(ShapeError, match=r"mode 'bilinear' needs a 4-D input \(N, C, H, W\), got a 3-D input of shape \(1, 1, 3\)"):
        interpolate(x3, size=2, mode="bilinear")
    with pytest.raises(ShapeError, match=r"mode 'linear' needs a 3-D input \(N, C, W\), got a 4-D input"):
        interpolate(x4, size=2, mode="linear")
    with pytest.raises(ShapeError, match=r"mode 'trilinear' needs a 5-D input"):
        interpolate(x4, size=2, mode="trilinear")
    with pytest.raises(ShapeError, match=r"expected a 3-D, 4-D or 5-D input .* got shape \(3,\)"):
        interpolate(Tensor.ones(3), size=2)
    with pytest.raises(ShapeError, match=r"sizes should be greater than 0, but got input \(W: 3\) and output \(W: 0\)"):
        interpolate(x3, size=0)
    with pytest.raises(ShapeError, match=r"input \(H: 3, W: 3\) and output \(H: 0, W: 0\)"):
        interpolate(x4, scale_factor=0.1)
    with pytest.raises(ShapeError, match=r"output \(W: -3\)"):
        interpolate(x3, scale_factor=-1.0)
    with pytest.raises(ShapeError, match=r"size must be an int or 2 ints .* spatial dimensions \[3, 3\], got size \(2, 2, 2\)"):
        interpolate(x4, size=(2, 2, 2))
    with pytest.raises(ShapeError, match=r"scale_factor must be a number or 1 numbers"):
        interpolate(x3, scale_factor=(2, 2))
    with pytest.raises(TypeError, match="size must be an int or a tuple of ints, got 2.5"):
        interpolate(x3, size=2.5)
    with pytest.raises(ValueError, match="recompute_scale_factor is not meaningful with an explicit size"):
        interpolate(x3, size=2, recompute_scale_factor=True)
    with pytest.raises(NotImplementedError, match="antialias"):
        interpolate(x4, size=2, mode="bilinear", antialias=True)
    with pytest.raises(ShapeError, match="needs a 4-D input"):
        Upsample(scale_factor=2, mode="bilinear")(x3)
