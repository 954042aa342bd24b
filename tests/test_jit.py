"""@eqgrad.jit: a replay gives the un-jitted step's numbers, builds no graph, and a new input
shape or dtype captures again; what it cannot replay fails loudly."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import JitError, Tensor, nn, optim
import eqgrad.nn.functional as F
from eqgrad.frontend.tensor import Tensor as TensorClass
from conftest import data

F32 = np.float32
XS = [data((8, 4), seed=s) for s in range(6)]
YS = [np.random.default_rng(s).integers(0, 3, 8).astype(np.int32) for s in range(6)]


def make(dropout: float = 0.0):
    eqgrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Dropout(dropout), nn.Linear(8, 3))
    opt = optim.SGD(nn.state.get_parameters(model), lr=0.1, momentum=0.9)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss)
        return loss
    return model, opt, step


def test_replay_matches_unjitted_step():
    model_a, _, step_a = make()
    model_b, opt_b, step_b = make()
    jitted = eqgrad.jit(step_b)
    for x, y in zip(XS, YS):
        la = step_a(Tensor(x), Tensor(y)).item()
        lb = jitted(Tensor(x), Tensor(y)).item()
        assert lb == pytest.approx(la, rel=1e-6)
    assert jitted.captures == 1 and jitted.replays == len(XS) - 2
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        np.testing.assert_allclose(pb.numpy(), pa.numpy(), rtol=1e-6, atol=1e-7)
    # the tensors the step wrote in Python on its capture call read the latest replay's values
    for p in opt_b.params:
        assert p.grad is not None and p.grad.lazydata.realized


def test_replay_builds_no_graph(monkeypatch):
    _, _, step = make()
    jitted = eqgrad.jit(step)
    for x, y in zip(XS[:2], YS[:2]):
        jitted(Tensor(x), Tensor(y))
    applied = []
    real_apply = TensorClass._apply
    monkeypatch.setattr(TensorClass, "_apply", lambda self, *a, **k: applied.append(a) or real_apply(self, *a, **k))
    c = eqgrad.GlobalCounters
    compiled, realizes, kernels = c.plans_compiled, c.realize_count, c.kernel_count
    x, y = Tensor(XS[2]), Tensor(YS[2])
    jitted(x, y)
    assert applied == [] and c.plans_compiled == compiled and c.realize_count == realizes
    assert c.kernel_count - kernels == jitted.kernels_per_call() > 0


def test_new_shape_or_dtype_captures_again():
    @eqgrad.jit
    def f(a: Tensor) -> Tensor:
        return (a * 2 + 1).realize()
    for n in (3, 3, 3, 5, 5, 5, 3):
        out = f(Tensor(np.arange(n, dtype=F32)))
        assert out.tolist() == [2 * i + 1 for i in range(n)]
    assert f.captures == 2 and f.replays == 3
    out = f(Tensor(np.arange(3, dtype=np.int32)))          # new dtype: runs normally, then captures
    assert out.dtype == eqgrad.int32 and out.tolist() == [1, 3, 5]
    assert f.replays == 3


def test_returns_fresh_tensors_and_python_values():
    @eqgrad.jit
    def f(a: Tensor, scale: float):
        b = (a * scale).realize()
        return b, {"sum": b.sum()}, "tag"
    outs = [f(Tensor([float(i), 1.0]), 2.0) for i in range(4)]
    assert [o[0].tolist() for o in outs] == [[0.0, 2.0], [2.0, 2.0], [4.0, 2.0], [6.0, 2.0]]
    assert [o[1]["sum"].item() for o in outs] == [2.0, 4.0, 6.0, 8.0]
    assert outs[3][2] == "tag" and f.replays == 2
    assert f(Tensor([1.0, 1.0]), 3.0)[0].tolist() == [3.0, 3.0]   # another Python argument: another capture


def test_dropout_masks_are_redrawn():
    _, _, step = make(dropout=0.5)
    masks = []

    @eqgrad.jit
    def f(x: Tensor) -> Tensor:
        return F.dropout(x, 0.5).realize()
    for _ in range(5):
        masks.append(f(Tensor(np.ones((4, 16), F32))).numpy() != 0)
    assert f.replays == 3
    assert len({m.tobytes() for m in masks}) == 5


def test_schedule_outside_the_jit_reaches_the_replay():
    model, opt, step = make()
    jitted = eqgrad.jit(step)
    for x, y in zip(XS[:3], YS[:3]):
        jitted(Tensor(x), Tensor(y))
    opt.set_lr(0.0)                                # a new value in the lr buffer, read by the replay
    before = [p.numpy() for p in model.parameters()]
    jitted(Tensor(XS[3]), Tensor(YS[3]))
    assert jitted.replays == 2
    for a, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, p.numpy())


def test_reading_values_inside_a_jitted_function_fails():
    @eqgrad.jit
    def f(a: Tensor) -> float:
        return (a * 2).sum().item()
    f(Tensor([1.0]))
    with pytest.raises(JitError, match=r"jit\(f\): reading a tensor into Python"):
        f(Tensor([1.0]))


def test_docstring_example():
    import doctest
    import eqgrad.frontend.jit as jit_module
    assert doctest.testmod(jit_module).failed == 0


def test_batchnorm_buffers_follow_the_replay():
    """Running statistics assigned inside the step are realized with it and replayed in place."""
    def make_bn():
        eqgrad.manual_seed(1)
        # NOTE: no conv bias before BatchNorm: its gradient is zero up to rounding, and Adam would
        # normalize that rounding noise into steps of size lr
        model = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.BatchNorm2d(2), Tensor.relu, nn.Flatten(), nn.Linear(8, 3))
        opt = optim.Adam(nn.state.get_parameters(model), lr=0.01)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss)
            return loss
        return model, step
    (ma, sa), (mb, sb) = make_bn(), make_bn()
    sb = eqgrad.jit(sb)
    for i in range(4):
        x, y = data((8, 1, 4, 4), seed=20 + i), YS[i]
        assert sb(Tensor(x), Tensor(y)).item() == pytest.approx(sa(Tensor(x), Tensor(y)).item(), rel=1e-5)
    assert sb.replays == 2
    for (k, a), b in zip(ma.state_dict().items(), mb.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert mb[1].num_batches_tracked.item() == 4
