"""Optimizers: each one's 10-step parameter trajectory against torch 2.13.0's, learning-rate
schedules against torch's, and what an in-place (assign) update promises: one program per step,
no recompilation across steps, no growing graphs, buffers updated in place."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, nn, optim
import eqgrad.nn.functional as F
from eqgrad.graph.lazy import toposort
from conftest import data
from gradcheck import HAVE_TORCH, torch

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
F32 = np.float32

W1, B1, W2 = data((5, 4), seed=1) * 0.5, data((5,), seed=2) * 0.1, data((1, 5), seed=3) * 0.5
X, Y = data((8, 4), seed=4), data((8, 1), seed=5)


def eqgrad_trajectory(make_opt, steps: int = 10) -> list[list[np.ndarray]]:
    ps = [Tensor(W1, requires_grad=True), Tensor(B1, requires_grad=True), Tensor(W2, requires_grad=True)]
    opt = make_opt(ps)
    x, y = Tensor(X), Tensor(Y)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss((x @ ps[0].T + ps[1]).tanh() @ ps[2].T, y)
        loss.backward()
        opt.step(loss)
        out.append([p.numpy() for p in ps])
    return out


def torch_trajectory(make_opt, steps: int = 10) -> list[list[np.ndarray]]:
    ps = [torch.tensor(a, requires_grad=True) for a in (W1, B1, W2)]
    opt = make_opt(ps)
    x, y = torch.tensor(X), torch.tensor(Y)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(torch.tanh(x @ ps[0].T + ps[1]) @ ps[2].T, y)
        loss.backward()
        opt.step()
        out.append([p.detach().numpy().copy() for p in ps])
    return out


OPTIMIZERS = [
    ("sgd", lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_momentum", lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    ("sgd_nesterov_wd", lambda p: optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("sgd_wd", lambda p: optim.SGD(p, lr=0.1, weight_decay=0.1), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.1)),
    ("adam", lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ("adam_betas_wd", lambda p: optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
     lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    ("adamw", lambda p: optim.AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    ("adamw_wd", lambda p: optim.AdamW(p, lr=0.03, weight_decay=0.2), lambda p: torch.optim.AdamW(p, lr=0.03, weight_decay=0.2)),
]


@needs_torch
@pytest.mark.parametrize("name, ours, theirs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_trajectory_matches_torch(name, ours, theirs):
    got, want = eqgrad_trajectory(ours), torch_trajectory(theirs)
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-6, err_msg=f"{name}: parameter {i} after step {step + 1}")


SCHEDULES = [
    ("step", lambda o: optim.StepLR(o, 4, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 4, 0.5)),
    ("multistep", lambda o: optim.MultiStepLR(o, [3, 7], 0.1), lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [3, 7], 0.1)),
    ("exponential", lambda o: optim.ExponentialLR(o, 0.9), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9)),
    ("cosine", lambda o: optim.CosineAnnealingLR(o, 10, 0.001),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.001)),
    ("linear_warmup", lambda o: optim.LinearLR(o, 0.25, 1.0, 5), lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.25, 1.0, 5)),
    ("lambda", lambda o: optim.LambdaLR(o, lambda e: 1 / (1 + e)),
     lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + e))),
    ("onecycle", lambda o: optim.OneCycleLR(o, 0.5, 12),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.5, total_steps=12, cycle_momentum=False)),
]


@needs_torch
@pytest.mark.parametrize("name, ours, theirs", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_schedule_matches_torch(name, ours, theirs):
    p = Tensor([1.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched, tsched = ours(opt), theirs(topt)
    got, want = [opt.get_lr()], [topt.param_groups[0]["lr"]]
    for _ in range(11):
        topt.step()
        sched.step(), tsched.step()
        got.append(opt.get_lr())
        want.append(tsched.get_last_lr()[0])
        assert sched.get_last_lr()[0] == pytest.approx(want[-1], rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)   # float32 buffer vs Python float


# ------------------------------------------------------------------ in-place updates

def _mlp_step():
    eqgrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), Tensor.relu, nn.Linear(6, 2))
    opt = optim.Adam(nn.state.get_parameters(model), lr=0.01)
    x, y = Tensor(X), Tensor(np.array([0, 1, 1, 0, 1, 0, 0, 1], np.int32))

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss)
        return loss
    return model, opt, step


def test_step_is_one_program_compiled_once():
    model, opt, step = _mlp_step()
    w = model[0].weight
    lb, held = w.lazydata, w.detach()
    step()
    c = eqgrad.GlobalCounters
    compiled, realizes = c.plans_compiled, c.realize_count
    losses = [step().item() for _ in range(5)]
    assert c.plans_compiled == compiled, "later steps must reuse the compiled plan"
    assert c.realize_count == realizes + 5, "forward, backward and update are one program per step"
    assert losses == sorted(losses, reverse=True)
    # the update was written in place: the parameter keeps its LazyBuffer, tensors sharing it see it
    assert w.lazydata is lb and lb.realized
    np.testing.assert_array_equal(held.numpy(), w.numpy())
    assert all(t.lazydata.realized for t in [*opt.params, *opt.state])
    assert all(p.grad.lazydata.realized for p in opt.params)


def test_graphs_do_not_grow():
    _, opt, step = _mlp_step()
    sizes = []
    for _ in range(4):
        step()
        nodes = sum(len(toposort([t.lazydata])) for t in [*opt.params, *opt.state])
        sizes.append(nodes)
    assert sizes == [len(opt.params) + len(opt.state)] * 4      # every one a single realized buffer


def test_set_lr_changes_a_buffer_not_the_plan():
    _, opt, step = _mlp_step()
    step()
    compiled = eqgrad.GlobalCounters.plans_compiled
    for lr in (0.02, 0.005, 0.0):
        opt.set_lr(lr)
        assert opt.get_lr() == pytest.approx(lr)
        step()
    assert eqgrad.GlobalCounters.plans_compiled == compiled
    before = [p.numpy() for p in opt.params]
    step()                                                        # lr 0: nothing moves
    for a, p in zip(before, opt.params):
        np.testing.assert_array_equal(a, p.numpy())


def test_assign_semantics():
    w = Tensor([1.0, 2.0])
    alias = w.detach()
    pending = w * 10                             # built before the write, realized after it
    w.assign(w + 1)
    assert w.tolist() == [2.0, 3.0] and alias.tolist() == [2.0, 3.0]
    assert pending.tolist() == [10.0, 20.0]      # value semantics: it was built from the old value
    w.assign(5.0)                                # scalars broadcast, dtypes cast
    assert w.tolist() == [5.0, 5.0]
    with pytest.raises(eqgrad.ShapeError, match=r"does not broadcast to the tensor's shape \(2,\)"):
        w.assign(Tensor([1.0, 2.0, 3.0]))
    lazy = Tensor([1.0]) + 1                     # not realized: assign just replaces the value
    lazy.assign(lazy * 3)
    assert lazy.tolist() == [6.0]


def test_optimizer_errors_and_buffers():
    with pytest.raises(ValueError, match="none of the 1 tensors given requires a gradient"):
        optim.SGD([Tensor([1.0])], lr=0.1)
    with pytest.raises(ValueError, match="nesterov momentum needs momentum > 0"):
        optim.SGD([Tensor([1.0], requires_grad=True)], nesterov=True)
    bn = nn.BatchNorm2d(2)
    opt = optim.SGD(nn.state.get_parameters(bn), lr=0.1)
    assert len(opt.params) == 2 and len(opt.buffers) == 3
    x = Tensor(data((3, 2, 2, 2), seed=6))
    bn(x).sum().backward()
    opt.step()
    assert bn.running_mean.lazydata.realized and bn.num_batches_tracked.item() == 1   # realized with the step


def test_docstring_examples():
    import doctest
    assert doctest.testmod(optim).failed == 0
