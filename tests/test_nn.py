"""nn: each layer and loss against its torch 2.13.0 counterpart (forward, input gradient and
parameter gradients), parameter discovery, state dicts and safetensors files."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, nn
import eqgrad.nn.functional as F
from eqgrad.errors import DTypeError, ShapeError
from conftest import data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch, upstream

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
F32 = np.float32


def run_layer(layer: nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Forward, then backward of sum(out * upstream): the output, the input's gradient and each
    parameter's gradient, realized as one program."""
    xt = Tensor(x, requires_grad=True)
    out = layer(xt)
    (out * Tensor(upstream(out.shape))).sum().backward()
    params = dict(layer.named_parameters())
    eqgrad.realize(out, xt.grad, *[p.grad for p in params.values()])
    return out.numpy(), xt.grad.numpy(), {k: p.grad.numpy() for k, p in params.items()}


def run_torch_layer(layer, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """As ``run_layer``, in torch, in float64 (on a copy of the layer): the reference is the exact
    answer, not float32 torch's, whose own rounding would add to eqgrad's. A gradient that is zero
    in exact arithmetic (a bias before a batch norm) is float32 rounding noise of the size of its
    terms in both frameworks: 8e-6 in torch, -3e-6 in eqgrad against an atol of 1e-5."""
    ref = copy.deepcopy(layer).double()
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    out = ref(xt)
    (out * torch.tensor(upstream(tuple(out.shape)).astype(np.float64))).sum().backward()
    with torch.no_grad():           # what the forward pass updates (a batch norm's running statistics)
        for b, b64 in zip(layer.buffers(), ref.buffers()):
            b.copy_(b64.to(b.dtype))
    return out.detach().numpy(), xt.grad.numpy(), {k: p.grad.numpy() for k, p in ref.named_parameters()}


def copy_to_torch(layer: nn.Module, tlayer) -> None:
    with torch.no_grad():
        for k, v in layer.state_dict().items():
            dict(tlayer.named_parameters(), **dict(tlayer.named_buffers()))[k].copy_(torch.tensor(v.numpy()))


def check_layer(layer: nn.Module, tlayer, x: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    copy_to_torch(layer, tlayer)
    out, gx, gp = run_layer(layer, x)
    tout, tgx, tgp = run_torch_layer(tlayer, x)
    np.testing.assert_allclose(out, tout, rtol=rtol, atol=atol, err_msg="forward")
    np.testing.assert_allclose(gx, tgx, rtol=rtol, atol=atol, err_msg="input gradient")
    assert set(gp) == set(tgp)
    for k in gp:
        np.testing.assert_allclose(gp[k], tgp[k], rtol=rtol, atol=atol, err_msg=f"gradient of {k}")


# ------------------------------------------------------------------ layers

@needs_torch
def test_linear():
    check_layer(nn.Linear(5, 3), torch.nn.Linear(5, 3), data((4, 5), seed=1))
    check_layer(nn.Linear(5, 3, bias=False), torch.nn.Linear(5, 3, bias=False), data((2, 4, 5), seed=2))


CONV = [
    dict(cin=2, cout=3, k=3),
    dict(cin=2, cout=4, k=3, stride=2, padding=1),
    dict(cin=3, cout=2, k=(3, 2), dilation=2, padding=(2, 1)),
    dict(cin=4, cout=6, k=3, groups=2, padding=1),
    dict(cin=4, cout=4, k=1, groups=4, bias=False),
    # the input gradient is a convolution of the zero-inserted, padded output gradient: strides that
    # do not divide the input, padding beyond the window's reach (a crop), non-overlapping windows
    dict(cin=2, cout=2, k=3, stride=(2, 3), padding=(0, 2), dilation=(2, 1)),
    dict(cin=6, cout=6, k=1, padding=2, groups=3),
    dict(cin=4, cout=4, k=2, stride=2, groups=4),
    # the weight gradient's layout puts the channel axis that fills lanes last: here the outputs
    dict(cin=3, cout=16, k=(5, 4), stride=3, padding=2),
]


@needs_torch
@pytest.mark.parametrize("cfg", CONV, ids=["plain", "stride_pad", "dilation_rect", "groups", "depthwise_1x1",
                                           "stride_uneven", "pad_beyond_reach", "stride_eq_kernel", "outputs_last"])
def test_conv2d(cfg):
    cfg = dict(cfg)
    cin, cout, k = cfg.pop("cin"), cfg.pop("cout"), cfg.pop("k")
    eqgrad.manual_seed(1)
    check_layer(nn.Conv2d(cin, cout, k, **cfg), torch.nn.Conv2d(cin, cout, k, **cfg),
                data((2, cin, 7, 6), seed=3), rtol=2e-4, atol=2e-5)


@needs_torch
def test_batchnorm2d_train_and_eval():
    bn, tbn = nn.BatchNorm2d(3, momentum=0.2), torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        tbn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        tbn.bias.copy_(torch.tensor([0.0, -1.0, 0.3]))
    bn.load_state_dict({k: v.detach().numpy() for k, v in tbn.state_dict().items()})
    x = data((4, 3, 5, 5), seed=4)
    bn.train(), tbn.train()
    out, gx, gp = run_layer(bn, x)
    tout, tgx, tgp = run_torch_layer(tbn, x)
    np.testing.assert_allclose(out, tout, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, tgx, rtol=1e-4, atol=1e-5)
    for k in gp:
        np.testing.assert_allclose(gp[k], tgp[k], rtol=1e-4, atol=1e-4)
    # the running statistics were assigned during the forward pass; realizing them commits the write
    eqgrad.realize(bn.running_mean, bn.running_var, bn.num_batches_tracked)
    np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert bn.num_batches_tracked.item() == 1
    bn.eval(), tbn.eval()
    x2 = data((2, 3, 4, 4), seed=5)
    out, gx, _ = run_layer(bn, x2)
    tout, tgx, _ = run_torch_layer(tbn, x2)
    np.testing.assert_allclose(out, tout, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, tgx, rtol=1e-4, atol=1e-5)
    assert [k for k, _ in bn.named_parameters()] == ["weight", "bias"]
    assert len(bn.buffers()) == 3


@needs_torch
def test_layernorm():
    ln, tln = nn.LayerNorm((3, 4)), torch.nn.LayerNorm((3, 4))
    with torch.no_grad():
        tln.weight.copy_(torch.tensor(data((3, 4), seed=6)))
        tln.bias.copy_(torch.tensor(data((3, 4), seed=7)))
    ln.load_state_dict({k: v.detach().numpy() for k, v in tln.state_dict().items()})
    out, gx, gp = run_layer(ln, data((2, 3, 4), seed=8))
    tout, tgx, tgp = run_torch_layer(tln, data((2, 3, 4), seed=8))
    np.testing.assert_allclose(out, tout, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, tgx, rtol=1e-4, atol=1e-4)
    for k in gp:
        np.testing.assert_allclose(gp[k], tgp[k], rtol=1e-4, atol=1e-5)


@needs_torch
def test_embedding():
    emb, temb = nn.Embedding(7, 3), torch.nn.Embedding(7, 3)
    copy_to_torch(emb, temb)
    idx = np.array([[1, 5, 1], [0, 6, 2]], np.int32)
    out = emb(Tensor(idx))
    (out * Tensor(upstream(out.shape))).sum().backward()
    tout = temb(torch.tensor(idx, dtype=torch.long))
    (tout * torch.tensor(upstream(tuple(tout.shape)))).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(DTypeError, match="int32 indices"):
        emb(Tensor([0.5]))


def test_dropout():
    eqgrad.manual_seed(3)
    d = nn.Dropout(0.25)
    x = Tensor(np.ones((200, 50), F32), requires_grad=True)
    y = d(x)
    y.sum().backward()
    out, g = y.numpy(), x.grad.numpy()
    kept = out != 0
    assert 0.72 < kept.mean() < 0.78
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(g, out)                    # gradient: the same mask and scale
    assert not np.array_equal(d(x).numpy() != 0, kept)       # a new mask every call
    d.eval()
    assert d(x) is x
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        nn.Dropout(1.5)


POOLS = [
    ("max_k2", lambda x: F.max_pool2d(x, 2), lambda x: torch.nn.functional.max_pool2d(x, 2)),
    ("max_k3_s1_p1", lambda x: F.max_pool2d(x, 3, 1, 1), lambda x: torch.nn.functional.max_pool2d(x, 3, 1, 1)),
    ("max_k2_s1_dil2", lambda x: F.max_pool2d(x, 2, 1, 0, 2), lambda x: torch.nn.functional.max_pool2d(x, 2, 1, 0, 2)),
    ("max_k3_s2", lambda x: F.max_pool2d(x, 3, 2), lambda x: torch.nn.functional.max_pool2d(x, 3, 2)),
    ("avg_k2", lambda x: F.avg_pool2d(x, 2), lambda x: torch.nn.functional.avg_pool2d(x, 2)),
    ("avg_k3_s2_p1", lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 1)),
    ("avg_k3_p1_nopad", lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
     lambda x: torch.nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=False)),
]


@pytest.mark.parametrize("name, fn, tfn", POOLS, ids=[p[0] for p in POOLS])
def test_pooling(name, fn, tfn):
    check_fwd_bwd(fn, [data((2, 3, 7, 6), seed=9)], tfn)


def test_conv2d_gradient_is_one_step_and_backward_twice_needs_retain_graph():
    """conv2d records one autograd step (autograd.Composite), not its primitives; it behaves like
    any other record (released by backward() unless retain_graph)."""
    from eqgrad.errors import AutogradError
    x, w = Tensor(data((1, 2, 5, 5), seed=7), requires_grad=True), Tensor(data((3, 2, 3, 3), seed=8), requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    assert out._ctx.op == "CONV2D" and out._ctx.parents == (x, w)
    loss = out.square().sum()
    loss.backward(retain_graph=True)
    g1 = w.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * g1, rtol=1e-5)
    with pytest.raises(AutogradError, match="second time"):
        loss.backward()
    with eqgrad.no_grad():
        assert F.conv2d(x, w)._ctx is None
    assert F.conv2d(x.detach(), w.detach())._ctx is None


def test_a_composite_gradient_of_the_wrong_arity_is_an_internal_error():
    from eqgrad.errors import AutogradError
    a = Tensor([1.0, 2.0], requires_grad=True)
    y = Tensor._composite("TWICE", lambda t: t * 2, lambda g, out, srcs: (g, g), a)
    with pytest.raises(AutogradError, match="gave 2 gradients for 1 inputs"):
        y.sum().backward()


def test_conv2d_errors():
    x = Tensor.ones(1, 4, 5, 5)
    with pytest.raises(ShapeError, match="weight .* expects 2 input channels"):
        F.conv2d(x, Tensor.ones(3, 2, 3, 3))
    with pytest.raises(ShapeError, match="groups=3 must divide"):
        F.conv2d(x, Tensor.ones(3, 2, 3, 3), groups=3)
    with pytest.raises(ShapeError, match="expected a 4-D input"):
        F.conv2d(Tensor.ones(4, 5, 5), Tensor.ones(3, 4, 3, 3))
    with pytest.raises(ShapeError, match="does not fit the input"):
        F.conv2d(x, Tensor.ones(3, 4, 7, 7))
    with pytest.raises(ShapeError, match="does not fit the input"):
        F.conv2d(x, Tensor.ones(3, 4, 3, 3), stride=2, dilation=3)


# ------------------------------------------------------------------ losses

LOGITS = data((5, 4), seed=10)
TARGET = np.array([0, 3, 1, 3, 2], np.int32)


def _ce(**kw):
    return (lambda x, t: F.cross_entropy(x, t, **kw), lambda x, t: torch.nn.functional.cross_entropy(x, t.long(), **kw))


LOSSES = [
    ("cross_entropy", *_ce(), [LOGITS, TARGET]),
    ("cross_entropy_smoothing", *_ce(label_smoothing=0.1), [LOGITS, TARGET]),
    ("cross_entropy_sum", *_ce(reduction="sum"), [LOGITS, TARGET]),
    ("cross_entropy_none", *_ce(reduction="none"), [LOGITS, TARGET]),
    ("cross_entropy_ignore", *_ce(ignore_index=3), [LOGITS, TARGET]),
    ("cross_entropy_ignore_smoothing", *_ce(ignore_index=3, label_smoothing=0.2), [LOGITS, TARGET]),
    ("cross_entropy_spatial", *_ce(), [data((2, 4, 3), seed=11), np.array([[0, 1, 3], [2, 2, 0]], np.int32)]),
    ("cross_entropy_probs", lambda x, p: F.cross_entropy(x, p, label_smoothing=0.1),
     lambda x, p: torch.nn.functional.cross_entropy(x, p, label_smoothing=0.1),
     [LOGITS, np.random.default_rng(12).dirichlet(np.ones(4), 5).astype(F32)]),
    ("nll_loss", lambda x, t: F.nll_loss(x.log_softmax(1), t),
     lambda x, t: torch.nn.functional.nll_loss(x.log_softmax(1), t.long()), [LOGITS, TARGET]),
    ("binary_cross_entropy", lambda p, y: F.binary_cross_entropy(p.sigmoid(), y),
     lambda p, y: torch.nn.functional.binary_cross_entropy(p.sigmoid(), y), [LOGITS, (LOGITS > 0).astype(F32)]),
    ("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits,
     torch.nn.functional.binary_cross_entropy_with_logits if HAVE_TORCH else None,
     [LOGITS * 3, np.random.default_rng(13).random((5, 4)).astype(F32)]),
    ("mse", F.mse_loss, torch.nn.functional.mse_loss if HAVE_TORCH else None, [LOGITS, LOGITS[::-1].copy()]),
    ("mse_sum", lambda a, b: F.mse_loss(a, b, reduction="sum"),
     lambda a, b: torch.nn.functional.mse_loss(a, b, reduction="sum"), [LOGITS, LOGITS * 0.5]),
    ("l1", F.l1_loss, torch.nn.functional.l1_loss if HAVE_TORCH else None, [LOGITS, LOGITS * 0.5]),
]


@pytest.mark.parametrize("name, fn, tfn, inputs", LOSSES, ids=[c[0] for c in LOSSES])
def test_loss(name, fn, tfn, inputs):
    check_fwd_bwd(fn, inputs, tfn)


def test_loss_errors():
    with pytest.raises(ShapeError, match=r"target shape \(3,\) does not fit logits \(5, 4\)"):
        F.cross_entropy(Tensor(LOGITS), Tensor([0, 1, 2]))
    with pytest.raises(DTypeError, match="int32 class indices or float32 probabilities"):
        F.cross_entropy(Tensor(LOGITS), Tensor(TARGET).bool())
    with pytest.raises(ValueError, match="reduction must be"):
        F.mse_loss(Tensor(LOGITS), Tensor(LOGITS), reduction="avg")


# ------------------------------------------------------------------ modules and state

class Net(nn.Module):
    def __init__(self):
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.heads = [nn.Linear(8, 3), nn.Linear(3, 2)]
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = self.bn(self.conv(x)).relu().flatten(1)
        return self.heads[1](self.drop(self.heads[0](x)))


def test_parameter_discovery_and_modes():
    net = Net()
    names = list(net.state_dict())
    assert names == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                     "bn.num_batches_tracked", "heads.0.weight", "heads.0.bias", "heads.1.weight", "heads.1.bias"]
    assert len(net.parameters()) == 8 and len(net.buffers()) == 3
    assert len(nn.state.get_parameters(net)) == 11
    assert all(m.training for m in net.modules())
    net.eval()
    assert not any(m.training for m in net.modules())
    out = net(Tensor(data((2, 1, 4, 4), seed=14)))
    assert out.shape == (2, 2)
    seq = nn.Sequential(nn.Linear(2, 2), Tensor.relu)
    assert [k for k, _ in seq.named_parameters()] == ["0.weight", "0.bias"]


def test_state_dict_roundtrip_and_in_place_load(tmp_path):
    a, b = Net(), Net()
    x = Tensor(data((2, 1, 4, 4), seed=15))
    a.eval(), b.eval()
    held = b.conv.weight                        # an optimizer or a jitted step holds this tensor
    lb = held.lazydata
    path = tmp_path / "net.safetensors"
    nn.state.safe_save(a.state_dict(), path)
    b.load_state_dict(nn.state.safe_load(path))
    assert held.lazydata is lb                  # loaded in place: same tensor, same LazyBuffer
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    assert b.bn.num_batches_tracked.dtype == eqgrad.int32
    with pytest.raises(KeyError, match=r"missing keys \['conv.bias'\]"):
        b.load_state_dict({k: v for k, v in a.state_dict().items() if k != "conv.bias"})
    with pytest.raises(ShapeError, match=r"conv.weight has shape \(2, 1, 3, 3\), the state has \(3,\)"):
        b.load_state_dict(dict(a.state_dict(), **{"conv.weight": np.zeros(3, F32)}))


@needs_torch
def test_load_torch_weights(tmp_path):
    """A safetensors file written by torch loads into the eqgrad model and gives torch's outputs."""
    from safetensors.torch import save_file
    tnet = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    save_file(tnet.state_dict(), str(tmp_path / "t.safetensors"))     # torch's names: 0.weight, ...
    net = nn.Sequential(nn.Linear(6, 5), Tensor.relu, nn.Linear(5, 2))
    net.load_state_dict(nn.state.safe_load(tmp_path / "t.safetensors"))
    x = data((3, 6), seed=16)
    np.testing.assert_allclose(net(Tensor(x)).numpy(), tnet(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_docstring_examples():
    import doctest
    import eqgrad.nn.state as state
    for mod in (nn, F, state):
        assert doctest.testmod(mod).failed == 0, mod.__name__
