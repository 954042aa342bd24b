"""Optimizers: parameter groups (per-group hyperparameters, editable ``param_groups``),
state dicts in torch's layout (loaded from torch mid-training, then stepped on against torch),
ReduceLROnPlateau, and gradient clipping -- each against torch 2.13.0 over several steps."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, nn, optim
import eqgrad.nn.functional as F
from gradcheck import HAVE_TORCH, torch
from test_optim import W1, B1, W2, X, Y

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def ours_loss(ps, x, y):
    return F.mse_loss((x @ ps[0].T + ps[1]).tanh() @ ps[2].T, y)


def torch_loss(ps, x, y):
    return torch.nn.functional.mse_loss(torch.tanh(x @ ps[0].T + ps[1]) @ ps[2].T, y)


def groups(ps, **second):
    return [{"params": [ps[0], ps[1]]}, {"params": [ps[2]], **second}]


def run_ours(make_opt, steps, ps=None, between=None, clip=None):
    ps = ps or [Tensor(a, requires_grad=True) for a in (W1, B1, W2)]
    opt = make_opt(ps)
    x, y, out = Tensor(X), Tensor(Y), []
    for i in range(steps):
        opt.zero_grad()
        loss = ours_loss(ps, x, y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(ps, clip) if clip else None
        opt.step(loss, *([norm] if norm is not None else []))
        out.append([p.numpy() for p in ps] + ([norm.numpy()] if norm is not None else []))
        if between:
            between(opt, i)
    return out, opt, ps


def run_torch(make_opt, steps, between=None, clip=None):
    ps = [torch.tensor(a, requires_grad=True) for a in (W1, B1, W2)]
    opt = make_opt(ps)
    x, y, out = torch.tensor(X), torch.tensor(Y), []
    for i in range(steps):
        opt.zero_grad()
        torch_loss(ps, x, y).backward()
        norm = torch.nn.utils.clip_grad_norm_(ps, clip) if clip else None
        opt.step()
        out.append([p.detach().numpy().copy() for p in ps] + ([norm.numpy()] if norm is not None else []))
        if between:
            between(opt, i)
    return out, opt, ps


def assert_trajectories(got, want, what):
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-6, err_msg=f"{what}: value {i} after step {step + 1}")


def edit_groups(opt, i):
    if i == 2:
        opt.param_groups[1]["lr"] = 0.005
        opt.param_groups[0]["weight_decay"] = 0.1


GROUPED = [
    ("sgd", lambda p: optim.SGD(groups(p, lr=0.02, momentum=0.5), lr=0.1, momentum=0.9),
     lambda p: torch.optim.SGD(groups(p, lr=0.02, momentum=0.5), lr=0.1, momentum=0.9)),
    ("sgd_nesterov_wd", lambda p: optim.SGD(groups(p, nesterov=True, weight_decay=0.01), lr=0.05, momentum=0.8),
     lambda p: torch.optim.SGD(groups(p, nesterov=True, weight_decay=0.01), lr=0.05, momentum=0.8)),
    ("adam", lambda p: optim.Adam(groups(p, lr=0.03, betas=(0.8, 0.99)), lr=0.01, weight_decay=0.01),
     lambda p: torch.optim.Adam(groups(p, lr=0.03, betas=(0.8, 0.99)), lr=0.01, weight_decay=0.01)),
    ("adamw", lambda p: optim.AdamW(groups(p, weight_decay=0.3, eps=1e-6), lr=0.02),
     lambda p: torch.optim.AdamW(groups(p, weight_decay=0.3, eps=1e-6), lr=0.02)),
]


@pytest.mark.parametrize("name, ours, theirs", GROUPED, ids=[g[0] for g in GROUPED])
def test_param_groups_match_torch(name, ours, theirs):
    got, opt, _ = run_ours(ours, 6, between=edit_groups)
    want, topt, _ = run_torch(theirs, 6, between=edit_groups)
    assert_trajectories(got, want, name)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]


def test_editing_lr_in_a_group_reuses_the_plan():
    _, opt, ps = run_ours(lambda p: optim.SGD(groups(p), lr=0.1, momentum=0.9), 2)
    compiled = eqgrad.GlobalCounters.plans_compiled
    opt.param_groups[1]["lr"] = 0.0
    before = ps[2].numpy()
    x, y = Tensor(X), Tensor(Y)
    for _ in range(2):
        opt.zero_grad()
        loss = ours_loss(ps, x, y)
        loss.backward()
        opt.step(loss)
    assert eqgrad.GlobalCounters.plans_compiled == compiled
    np.testing.assert_array_equal(ps[2].numpy(), before)


STATEFUL = [
    ("sgd_momentum", lambda p: optim.SGD(groups(p, lr=0.03), lr=0.1, momentum=0.9),
     lambda p: torch.optim.SGD(groups(p, lr=0.03), lr=0.1, momentum=0.9)),
    ("adam", lambda p: optim.Adam(groups(p, betas=(0.7, 0.9)), lr=0.01),
     lambda p: torch.optim.Adam(groups(p, betas=(0.7, 0.9)), lr=0.01)),
]


def to_numpy(sd):
    return {"state": {i: {k: v.detach().numpy().copy() for k, v in st.items()} for i, st in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


def resumed_torch(theirs, tsd: dict, start: list):
    """A torch optimizer factory for run_torch that starts from parameters ``start`` and the state
    dict ``tsd`` (a resumed run)."""
    def resume(p):
        with torch.no_grad():
            for q, a in zip(p, start):
                q.copy_(torch.tensor(a))
        o = theirs(p)
        o.load_state_dict(tsd)
        return o
    return resume


@pytest.mark.parametrize("name, ours, theirs", STATEFUL, ids=[s[0] for s in STATEFUL])
def test_state_dict_has_torch_layout_and_loads_torch_state(name, ours, theirs):
    # torch steps 3 times; its parameters and optimizer state are loaded here; both step 4 more
    _, topt, tps = run_torch(theirs, 3)
    tsd = copy.deepcopy(topt.state_dict())          # torch's state dict holds its live tensors
    start = [p.detach().numpy().copy() for p in tps]
    ps = [Tensor(a, requires_grad=True) for a in start]
    opt = ours(ps)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for i in tsd["state"]:
        assert set(sd["state"][i]) == set(tsd["state"][i]), f"state names of parameter {i}"
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        assert g["params"] == tg["params"]
        assert all(g[k] == tg[k] for k in ("lr", "momentum", "betas", "eps", "weight_decay") if k in g)
    opt.load_state_dict(to_numpy(tsd))
    got, _, _ = run_ours(lambda _: opt, 4, ps=ps)
    want, topt, _ = run_torch(resumed_torch(theirs, tsd, start), 4)
    assert_trajectories(got, want, name)
    mine, tsd = opt.state_dict(), topt.state_dict()
    for i, st in tsd["state"].items():
        for k, v in st.items():
            np.testing.assert_allclose(mine["state"][i][k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}: state {k} of parameter {i} after 4 more steps")


def test_reduce_lr_on_plateau_matches_torch():
    metrics = [5.0, 4.0, 4.0, 3.99, 3.99, 3.99, 4.5, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    configs = [dict(), dict(patience=1, factor=0.5), dict(patience=0, cooldown=2, min_lr=[0.02, 0.001]),
               dict(mode="max", patience=1, threshold=0.1, threshold_mode="abs"),
               dict(patience=1, threshold=0.01, factor=0.2, min_lr=0.003)]
    for cfg in configs:
        ps = [Tensor([1.0], requires_grad=True), Tensor([2.0], requires_grad=True)]
        tps = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
        opt = optim.SGD([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.05}], lr=0.1)
        topt = torch.optim.SGD([{"params": [tps[0]]}, {"params": [tps[1]], "lr": 0.05}], lr=0.1)
        sched = optim.ReduceLROnPlateau(opt, **cfg)
        tsched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **cfg)
        for m in metrics:
            sched.step(Tensor(m) if m == 3.0 else m)
            tsched.step(m)
            assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12), cfg
            np.testing.assert_allclose([g.lr_buffer.item() for g in opt.param_groups], tsched.get_last_lr(), rtol=1e-6)


def test_schedulers_set_every_group():
    ps = [Tensor([1.0], requires_grad=True), Tensor([2.0], requires_grad=True)]
    opt = optim.SGD([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.5}], lr=0.1)
    topt = torch.optim.SGD([{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)], "lr": 0.5}], lr=0.1)
    sched, tsched = optim.CosineAnnealingLR(opt, 6, 0.01), torch.optim.lr_scheduler.CosineAnnealingLR(topt, 6, 0.01)
    for _ in range(5):
        topt.step()
        sched.step(), tsched.step()
        np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-6)
        np.testing.assert_allclose([g["lr"] for g in opt.param_groups], tsched.get_last_lr(), rtol=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_in_the_step_matches_torch(norm_type):
    got, _, _ = run_ours(lambda p: optim.SGD(p, lr=0.3, momentum=0.5), 4, clip=0.05)
    want, _, _ = run_torch(lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.5), 4, clip=0.05)
    assert_trajectories(got, want, "clip_grad_norm_")
    grads = [np.random.default_rng(i).normal(size=s).astype(np.float32) for i, s in enumerate([(3, 4), (5,)])]
    ps = [Tensor(g, requires_grad=True) for g in grads]
    tps = [torch.tensor(g, requires_grad=True) for g in grads]
    for p, tp, g in zip(ps, tps, grads):
        (p * Tensor(g)).sum().backward()
        tp.grad = torch.tensor(g)
    total = nn.utils.clip_grad_norm_(ps, 1.5, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(tps, 1.5, norm_type=norm_type)
    np.testing.assert_allclose(total.numpy(), ttotal.numpy(), rtol=1e-5)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)
    nn.utils.clip_grad_value_(ps, 0.1)
    torch.nn.utils.clip_grad_value_(tps, 0.1)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_group_errors():
    p = Tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="a parameter group is a dict with 'params'"):
        optim.SGD([{"params": [p]}, {"lr": 0.1}])
    with pytest.raises(ValueError, match=r"the state has groups of \[1, 1\] parameters, this optimizer \[1\]"):
        optim.SGD([p], lr=0.1).load_state_dict({"state": {}, "param_groups": [{"params": [0]}, {"params": [1]}]})
