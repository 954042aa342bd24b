"""torch parity, continued: ``nn.Sequential`` names its layers' tensors as torch's
(``0.weight``, nested ``1.0.weight``), ``SGD(dampening=)``, ``Adam/AdamW(amsgrad=True)``,
``max_unpool1d/3d`` and ``conv_transpose3d`` (and their modules) -- each against torch 2.13.0 (CPU)."""
from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, nn, optim
import eqgrad.nn.functional as F
from eqgrad.errors import ShapeError
from conftest import data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch
from test_nn import check_layer
from test_optim_more import assert_trajectories, groups, resumed_torch, run_ours, run_torch, to_numpy

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
TF = torch.nn.functional if HAVE_TORCH else None


# ------------------------------------------------------------------ Sequential

def torch_state(tmodel) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}


def test_sequential_names_tensors_as_torch_and_loads_its_state():
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(),
                               torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.BatchNorm1d(3)),
                               torch.nn.Linear(3, 2))
    net = nn.Sequential(nn.Linear(4, 5), Tensor.relu, nn.Sequential(nn.Linear(5, 3), Tensor.tanh, nn.BatchNorm1d(3)),
                        nn.Linear(3, 2))
    assert list(net.state_dict()) == list(tnet.state_dict())
    assert list(net.state_dict())[:4] == ["0.weight", "0.bias", "2.0.weight", "2.0.bias"]
    assert [k for k, _ in net.named_parameters()] == [k for k, _ in tnet.named_parameters()]
    net.load_state_dict(torch_state(tnet))
    x = data((6, 4), seed=1)
    net.eval(), tnet.eval()
    np.testing.assert_allclose(net(Tensor(x)).numpy(), tnet(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    # train mode reaches the nested Sequential's BatchNorm, and its running statistics load and update as torch's
    net.train(), tnet.train()
    assert net[2][2].training and all(m.training for m in net.modules())
    np.testing.assert_allclose(net(Tensor(x)).numpy(), tnet(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(net.state_dict()["2.2.running_var"].numpy(), tnet.state_dict()["2.2.running_var"].numpy(),
                               rtol=1e-5, atol=1e-6)


def test_sequential_gradients_match_torch():
    tnet = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    check_layer(net, tnet, data((5, 3), seed=2))


def test_sequential_container_behaviour():
    a, b = nn.Linear(2, 3), nn.Linear(3, 1)
    seq = nn.Sequential(a, Tensor.relu, b)
    assert len(seq) == 3 and seq[0] is a and seq[1] is Tensor.relu and seq[-1] is b
    assert list(seq) == [a, Tensor.relu, b] and seq.layers == [a, Tensor.relu, b]
    x = Tensor(data((4, 2), seed=3))
    np.testing.assert_allclose(seq(x).numpy(), b(a(x).relu()).numpy(), rtol=1e-6)
    tail = seq[1:]                                       # a slice keeps the layers' names, as torch's
    assert isinstance(tail, nn.Sequential) and list(tail.state_dict()) == ["2.weight", "2.bias"]
    assert list(nn.Sequential().state_dict()) == [] and len(nn.Sequential()) == 0
    seq.append(nn.Linear(1, 2))
    assert len(seq) == 4 and list(seq.state_dict())[-2:] == ["3.weight", "3.bias"]
    named = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", Tensor.relu), ("out", nn.Linear(2, 1))]))
    tnamed = torch.nn.Sequential(OrderedDict([("fc", torch.nn.Linear(2, 2)), ("act", torch.nn.ReLU()),
                                              ("out", torch.nn.Linear(2, 1))]))
    assert list(named.state_dict()) == list(tnamed.state_dict()) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert named[2] is named.out
    for bad in ("_hidden", "a.b", "forward", ""):
        with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
            nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), (bad, Tensor.relu)]))
    with pytest.raises(ValueError, match="'2'"):         # the slice holds "1" and "2": appending names "2" again
        tail.append(Tensor.relu)


# ------------------------------------------------------------------ SGD dampening

SGD_CASES = [
    ("momentum_dampening", dict(lr=0.1, momentum=0.9, dampening=0.5)),
    ("dampening_wd", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("dampening_maximize", dict(lr=0.02, momentum=0.7, dampening=0.9, maximize=True)),
    ("dampening_without_momentum", dict(lr=0.1, dampening=0.5)),       # no buffer: dampening has no effect
    ("nesterov_wd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)),
    ("full_dampening", dict(lr=0.1, momentum=0.5, dampening=1.0)),     # the buffer stays the first gradient
]


@pytest.mark.parametrize("name, kw", SGD_CASES, ids=[c[0] for c in SGD_CASES])
def test_sgd_dampening_matches_torch(name, kw):
    got, _, _ = run_ours(lambda p: optim.SGD(p, **kw), 6)
    want, _, _ = run_torch(lambda p: torch.optim.SGD(p, **kw), 6)
    assert_trajectories(got, want, name)


def test_sgd_dampening_per_group_matches_torch():
    got, _, _ = run_ours(lambda p: optim.SGD(groups(p, dampening=0.6, lr=0.03), lr=0.1, momentum=0.9, dampening=0.1), 5)
    want, _, _ = run_torch(lambda p: torch.optim.SGD(groups(p, dampening=0.6, lr=0.03), lr=0.1, momentum=0.9,
                                                     dampening=0.1), 5)
    assert_trajectories(got, want, "per-group dampening")


def test_sgd_nesterov_needs_momentum_and_no_dampening():
    w = Tensor([1.0], requires_grad=True)
    for kw in (dict(momentum=0.9, dampening=0.1), dict(momentum=0.0)):
        with pytest.raises(ValueError):
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, nesterov=True, **kw)
        with pytest.raises(ValueError, match=r"SGD: nesterov momentum needs momentum > 0 and dampening 0"):
            optim.SGD([w], lr=0.1, nesterov=True, **kw)
    with pytest.raises(ValueError, match=r"dampening 0.5"):
        optim.SGD([{"params": [w], "dampening": 0.5}], lr=0.1, momentum=0.9, nesterov=True)


# ------------------------------------------------------------------ Adam/AdamW amsgrad

AMSGRAD = [
    ("adam", lambda p: optim.Adam(p, lr=0.05, amsgrad=True), lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True)),
    ("adam_wd_betas", lambda p: optim.Adam(p, lr=0.03, betas=(0.7, 0.8), weight_decay=0.05, amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.03, betas=(0.7, 0.8), weight_decay=0.05, amsgrad=True)),
    ("adamw", lambda p: optim.AdamW(p, lr=0.05, weight_decay=0.1, amsgrad=True),
     lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1, amsgrad=True)),
    ("adamw_maximize", lambda p: optim.AdamW(p, lr=0.01, amsgrad=True, maximize=True),
     lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, maximize=True)),
    ("adam_one_group", lambda p: optim.Adam(groups(p, amsgrad=True), lr=0.04),
     lambda p: torch.optim.Adam(groups(p, amsgrad=True), lr=0.04)),
]


@pytest.mark.parametrize("name, ours, theirs", AMSGRAD, ids=[c[0] for c in AMSGRAD])
def test_amsgrad_matches_torch(name, ours, theirs):
    # a large learning rate makes the loss (and exp_avg_sq) fall, so the running maximum matters
    got, opt, _ = run_ours(ours, 8)
    want, topt, _ = run_torch(theirs, 8)
    assert_trajectories(got, want, name)
    mine, tsd = opt.state_dict(), topt.state_dict()
    for i, st in tsd["state"].items():
        assert set(mine["state"][i]) == set(st), f"{name}: state names of parameter {i}"
        for k, v in st.items():
            np.testing.assert_allclose(mine["state"][i][k].numpy(), v.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}: state {k} of parameter {i}")


RESUMED = [
    ("sgd_dampening", lambda p: optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.4),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.4)),
    ("adam_amsgrad", lambda p: optim.Adam(p, lr=0.05, amsgrad=True), lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True)),
]


@pytest.mark.parametrize("name, ours, theirs", RESUMED, ids=[c[0] for c in RESUMED])
def test_state_loaded_from_torch_resumes_as_torch(name, ours, theirs):
    """torch steps 3 times; its parameters and state load here (a loaded momentum buffer is
    dampened from the next step on); both step 4 more."""
    _, topt, tps = run_torch(theirs, 3)
    tsd = copy.deepcopy(topt.state_dict())
    start = [p.detach().numpy().copy() for p in tps]
    ps = [Tensor(a, requires_grad=True) for a in start]
    opt = ours(ps)
    opt.load_state_dict(to_numpy(tsd))
    got, _, _ = run_ours(lambda _: opt, 4, ps=ps)
    want, _, _ = run_torch(resumed_torch(theirs, tsd, start), 4)
    assert_trajectories(got, want, name)


# ------------------------------------------------------------------ max_unpool1d/3d, conv_transpose3d

def test_max_unpool1d_matches_torch():
    x = data((2, 3, 9), seed=4)
    out, idx = F.max_pool1d(Tensor(x), 3, 2, 1, return_indices=True)
    tout, tidx = TF.max_pool1d(torch.tensor(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    check_fwd_bwd(lambda y: F.max_unpool1d(y, idx, 3, 2, 1, output_size=(9,)), [tout.numpy()],
                  lambda y: TF.max_unpool1d(y, tidx, 3, 2, 1, output_size=(9,)))
    check_fwd_bwd(lambda y: F.max_unpool1d(y, idx, 3, 2, 1), [tout.numpy()],      # default size 8
                  lambda y: TF.max_unpool1d(y, tidx, 3, 2, 1))
    check_fwd_bwd(lambda y: nn.MaxUnpool1d(3, 2, 1)(y, idx, output_size=(2, 3, 9)), [tout.numpy()],
                  lambda y: torch.nn.MaxUnpool1d(3, 2, 1)(y, tidx, output_size=(2, 3, 9)))


def test_max_unpool3d_matches_torch():
    x = data((1, 2, 4, 6, 4), seed=5)
    out, idx = F.max_pool3d(Tensor(x), 2, return_indices=True)
    tout, tidx = TF.max_pool3d(torch.tensor(x), 2, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    check_fwd_bwd(lambda y: F.max_unpool3d(y, idx, 2), [tout.numpy()], lambda y: TF.max_unpool3d(y, tidx, 2))
    check_fwd_bwd(lambda y: nn.MaxUnpool3d(2)(y, idx, output_size=(5, 7, 5)), [tout.numpy()],      # flat indices, as torch
                  lambda y: torch.nn.MaxUnpool3d(2)(y, tidx, output_size=(5, 7, 5)))
    x = data((2, 1, 5, 4, 6), seed=6)
    k, s, p = (3, 2, 2), (2, 1, 2), (1, 0, 1)
    out, idx = F.max_pool3d(Tensor(x), k, s, p, return_indices=True)
    tout, tidx = TF.max_pool3d(torch.tensor(x), k, s, p, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    check_fwd_bwd(lambda y: F.max_unpool3d(y, idx, k, s, p, output_size=(5, 4, 6)), [tout.numpy()],
                  lambda y: TF.max_unpool3d(y, tidx, k, s, p, output_size=(5, 4, 6)))


def test_max_unpool_errors():
    y, idx = F.max_pool1d(Tensor(data((1, 1, 8), seed=7)), 2, return_indices=True)
    with pytest.raises(ShapeError, match=r"max_unpool1d\(\): output_size \(10,\) must be within stride \(2,\) of the default \(8,\)"):
        F.max_unpool1d(y, idx, 2, output_size=(10,))
    with pytest.raises(ShapeError, match=r"max_unpool1d\(\): output_size must have 1 or 3 sizes, got \(1, 8\)"):
        F.max_unpool1d(y, idx, 2, output_size=(1, 8))
    with pytest.raises(ShapeError, match=r"max_unpool3d\(\): expected a 5-D input"):
        F.max_unpool3d(y, idx, 2)
    with pytest.raises(ShapeError, match=r"MaxUnpool1d\(\): indices must be an integer tensor"):
        nn.MaxUnpool1d(2)(y, y)


CONVT3D = [
    ("stride_padding_output_padding", dict(stride=2, padding=1, output_padding=1), [(2, 3, 3, 4, 2), (3, 2, 3, 2, 3), (2,)]),
    ("groups_dilation", dict(stride=(1, 2, 1), padding=(1, 0, 2), groups=2, dilation=(2, 1, 2)),
     [(1, 4, 3, 3, 4), (4, 1, 2, 3, 2)]),
    ("unit", dict(), [(1, 2, 2, 3, 2), (2, 3, 2, 2, 2), (3,)]),
    ("output_padding_by_dilation", dict(stride=(1, 3, 1), output_padding=(1, 2, 0), dilation=(2, 1, 1)),
     [(1, 2, 3, 2, 2), (2, 2, 2, 2, 2)]),
]


@pytest.mark.parametrize("name, kw, shapes", CONVT3D, ids=[c[0] for c in CONVT3D])
def test_conv_transpose3d_matches_torch(name, kw, shapes):
    check_fwd_bwd(lambda *a: F.conv_transpose3d(*a, **kw), [data(s, seed=i) for i, s in enumerate(shapes)],
                  lambda *a: TF.conv_transpose3d(*a, **kw), rtol=1e-4, atol=1e-4)


def test_conv_transpose3d_module_and_errors():
    for ours, theirs, shape in [(nn.ConvTranspose3d(2, 4, 3, stride=2, padding=1, output_padding=1),
                                 torch.nn.ConvTranspose3d(2, 4, 3, stride=2, padding=1, output_padding=1), (1, 2, 2, 3, 2)),
                                (nn.ConvTranspose3d(4, 2, (1, 2, 2), groups=2, bias=False, dilation=(1, 2, 1)),
                                 torch.nn.ConvTranspose3d(4, 2, (1, 2, 2), groups=2, bias=False, dilation=(1, 2, 1)), (2, 4, 2, 2, 3))]:
        assert {k: v.shape for k, v in ours.state_dict().items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
        check_layer(ours, theirs, data(shape, seed=8), atol=1e-4)
    x, w = Tensor(data((1, 2, 2, 2, 2), seed=9)), Tensor(data((2, 3, 2, 2, 2), seed=10))
    with pytest.raises(ShapeError, match=r"conv_transpose3d\(\): output_padding \(1, 0, 0\) must be smaller than stride \(1, 1, 1\)"):
        F.conv_transpose3d(x, w, output_padding=(1, 0, 0))
    with pytest.raises(ShapeError, match=r"conv_transpose3d\(\): expected a weight \(C_in=2, C_out/groups, 3 kernel sizes\)"):
        F.conv_transpose3d(x, Tensor(data((3, 2, 2, 2, 2), seed=11)))
    with pytest.raises(ShapeError, match=r"conv_transpose3d\(\): stride must be an int or 3 ints, got \(1, 2\)"):
        F.conv_transpose3d(x, w, stride=(1, 2))


@pytest.mark.parametrize("make_opt", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3),
                                      lambda ps: optim.AdamW(ps, lr=0.05, amsgrad=True)], ids=["sgd_dampening", "amsgrad"])
def test_jitted_step_replays_dampening_and_amsgrad(make_opt):
    """The dampening's first-step flag and amsgrad's maximum are state tensors: one capture, and
    every replay gives the un-jitted step's numbers (the first step's undampened buffer included)."""
    def make():
        eqgrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 3))
        opt = make_opt(nn.state.get_parameters(model))

        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step(loss)
            return loss
        return model, step

    (model_a, step_a), (model_b, step_b) = make(), make()
    jitted = eqgrad.jit(step_b)
    for s in range(5):
        x, y = data((6, 4), seed=20 + s), data((6, 3), seed=30 + s)
        assert jitted(Tensor(x), Tensor(y)).item() == pytest.approx(step_a(Tensor(x), Tensor(y)).item(), rel=1e-6)
    assert jitted.captures == 1 and jitted.replays == 3
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        np.testing.assert_allclose(pb.numpy(), pa.numpy(), rtol=1e-6, atol=1e-7)
