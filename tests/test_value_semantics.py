"""A tensor's value never changes after it was built (in-place updates have
value semantics), state written in a forward pass is committed with the optimizer step (its graph
stays bounded), ``backward()`` through a released graph raises as in torch, and ``@eqgrad.jit``
never replays a capture whose Python state changed."""
from __future__ import annotations

import time

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

W1, B1, W2 = data((6, 4), seed=11) * 0.5, data((6,), seed=12) * 0.1, data((3, 6), seed=13) * 0.5
XS = [data((8, 4), seed=20 + i) for i in range(10)]
YS = [np.random.default_rng(30 + i).integers(0, 3, 8).astype(np.int32) for i in range(10)]


# ------------------------------------------------------------------ value semantics of assign

def _model(ws=(W1, B1, W2)):
    return [Tensor(w, requires_grad=True) for w in ws]


def _forward(ps, x):
    return (x @ ps[0].T + ps[1]).tanh() @ ps[2].T


OPTS = {
    "sgd_momentum": (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "adam": (lambda p: optim.Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
}


def _torch_habit_losses(make_opt, steps: int = 10) -> list[float]:
    """The PyTorch habit: backward, step, *then* read the loss."""
    ps = _model()
    opt = make_opt(ps)
    out = []
    for i in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(_forward(ps, Tensor(XS[i])), Tensor(YS[i]))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


@needs_torch
@pytest.mark.parametrize("name", sorted(OPTS))
def test_loss_read_after_the_step_is_torchs(name):
    make, make_torch = OPTS[name]
    got = _torch_habit_losses(make)
    ps = [torch.tensor(w, requires_grad=True) for w in (W1, B1, W2)]
    opt = make_torch(ps)
    want = []
    for i in range(10):
        opt.zero_grad()
        x, y = torch.tensor(XS[i]), torch.tensor(YS[i]).long()
        loss = torch.nn.functional.cross_entropy(torch.tanh(x @ ps[0].T + ps[1]) @ ps[2].T, y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=2e-5)


@pytest.mark.parametrize("name", sorted(OPTS))
def test_loss_read_after_the_step_is_the_steps_loss(name):
    """Without torch: the loss read after ``opt.step()`` equals the loss realized with the step."""
    make, _ = OPTS[name]
    ps = _model()
    opt = make(ps)
    want = []
    for i in range(6):
        opt.zero_grad()
        loss = F.cross_entropy(_forward(ps, Tensor(XS[i])), Tensor(YS[i]))
        loss.backward()
        opt.step(loss)
        want.append(loss.item())
    np.testing.assert_allclose(_torch_habit_losses(make, 6), want, rtol=1e-6)


def test_torch_habit_compiles_nothing_in_the_steady_state():
    ps = _model()
    opt = optim.Adam(ps, lr=0.05)
    c = eqgrad.GlobalCounters
    for i in range(10):
        if i == 3:
            compiled = c.plans_compiled
        opt.zero_grad()
        loss = F.cross_entropy(_forward(ps, Tensor(XS[i])), Tensor(YS[i]))
        loss.backward()
        opt.step()
        loss.item()
    assert c.plans_compiled == compiled


def test_grad_read_after_the_step_equals_the_one_read_before():
    """The gradient of a parameter the optimizer does not own is a lazy graph over the parameters
    the step overwrites; read after the step, it must still be the gradient of this step."""
    def run(read_before: bool) -> float:
        ps = _model()
        opt = optim.SGD(ps[2:], lr=0.5)                # fine-tune the head only
        opt.zero_grad()
        loss = F.cross_entropy(_forward(ps, Tensor(XS[0])), Tensor(YS[0]))
        loss.backward()
        norm = sum((p.grad * p.grad).sum() for p in ps).sqrt()
        before = norm.item() if read_before else None
        opt.step()
        after = norm.item()
        return before if read_before else after
    assert run(False) == pytest.approx(run(True), rel=1e-6)


def test_assign_keeps_the_value_of_tensors_built_before():
    w = Tensor([1.0, 2.0])
    alias = w.detach()                                 # shares the storage: sees the write
    old = w * 10
    view = w.reshape(2, 1)                             # a computation on the old value
    w.assign(w + 1).realize()
    assert w.tolist() == [2.0, 3.0] and alias.tolist() == [2.0, 3.0]
    assert old.tolist() == [10.0, 20.0] and view.tolist() == [[1.0], [2.0]]
    later = w * 10
    w.assign(w * 0).realize()
    assert later.tolist() == [20.0, 30.0] and w.tolist() == [0.0, 0.0]


def test_assign_to_a_realized_result_that_other_graphs_read():
    """A node read by another graph while it was pending keeps its buffer: the assigned tensor
    moves to new storage (copy-on-write) instead."""
    x = Tensor([1.0, 2.0])
    h = x + 1
    y = h * 2                                          # reads h's node itself, not a snapshot
    h.realize()
    h.assign(h + 5).realize()
    assert h.tolist() == [7.0, 8.0]
    assert y.tolist() == [4.0, 6.0]
    h.assign(h * 0).realize()                          # and again, now from its own storage
    assert h.tolist() == [0.0, 0.0] and y.tolist() == [4.0, 6.0]


def test_backward_after_an_assign_differentiates_the_old_value():
    w = Tensor([1.0, 3.0], requires_grad=True)
    y = (w * w).sum()
    with eqgrad.no_grad():
        w.assign(w * 100).realize()
    y.backward()
    assert w.grad.tolist() == [2.0, 6.0] and y.item() == 10.0


def test_jit_torch_habit_replays_the_steps_loss():
    """Inside a jitted step, a loss realized after ``opt.step()`` reads the parameters the step
    replaced; replays bind the buffers that the replay's own step replaces."""
    def make(with_step: bool):
        ps = _model()
        opt = optim.SGD(ps, lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(_forward(ps, x), y)
            loss.backward()
            opt.step(*[loss] * with_step)
            return loss
        return ps, step
    (pa, sa), (pb, sb) = make(True), make(False)
    sb = eqgrad.jit(sb)
    for i in range(6):
        la = sa(Tensor(XS[i]), Tensor(YS[i])).item()
        assert sb(Tensor(XS[i]), Tensor(YS[i])).item() == pytest.approx(la, rel=1e-6)
    assert sb.replays == 4
    for a, b in zip(pa, pb):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ state graphs stay bounded

def _bn_model():
    eqgrad.manual_seed(3)
    return nn.Sequential(nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))


def test_batchnorm_stats_are_committed_with_the_step_of_model_parameters():
    model = _bn_model()
    bn = model[0]
    opt = optim.SGD(model.parameters(), lr=0.01)       # the torch habit: no buffers given
    x, y = Tensor(data((4, 2, 2, 2), seed=5)), Tensor(np.array([0, 1, 2, 0], np.int32))
    times = []
    for i in range(1000):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        # the running statistics are one realized buffer after every step: their graph is bounded
        assert bn.running_mean.lazydata.realized and bn.running_var.lazydata.realized, i
    early, late = np.median(times[50:100]), np.median(times[950:1000])
    assert late < 3 * early + 1e-3, (early, late)
    c = eqgrad.GlobalCounters
    realizes = c.realize_count
    stats = bn.running_mean.numpy(), bn.num_batches_tracked.item()
    assert c.realize_count == realizes                 # nothing left to compute
    assert stats[1] == 1000
    # the same statistics as the reference update, 1000 times
    xs = data((4, 2, 2, 2), seed=5).astype(np.float64)
    mean = xs.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(stats[0], mean * (1 - 0.9 ** 1000), rtol=1e-4, atol=1e-6)


def test_repeated_assigns_without_a_realize_stay_bounded():
    """Forward passes in training mode without any step: the chain of pending writes is cut."""
    bn = nn.BatchNorm2d(2)
    x = Tensor(data((4, 2, 2, 2), seed=6))
    sizes = []
    for _ in range(100):
        bn(x)
        sizes.append(len(toposort([bn.running_mean.lazydata])))
    assert max(sizes) <= max(sizes[:40])               # no growth past the bound
    assert bn.num_batches_tracked.item() == 100
    mean = data((4, 2, 2, 2), seed=6).astype(np.float64).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(bn.running_mean.numpy(), mean * (1 - 0.9 ** 100), rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ backward twice

def test_backward_twice_raises_like_torch():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]          # the failed call accumulated nothing
    h = x.exp()                                        # a shared subgraph
    h.sum().backward()
    with pytest.raises(eqgrad.AutogradError, match="retain_graph"):
        (h * 2).sum().backward()


def test_retain_graph_accumulates_like_torch():
    a = data((3, 4), seed=8)
    x = Tensor(a, requires_grad=True)
    y = (x.tanh() * x).sum()
    y.backward(retain_graph=True)
    y.backward(retain_graph=True)
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()
    got = x.grad.numpy()
    if HAVE_TORCH:
        xt = torch.tensor(a, requires_grad=True)
        yt = (xt.tanh() * xt).sum()
        yt.backward(retain_graph=True)
        yt.backward(retain_graph=True)
        yt.backward()
        with pytest.raises(RuntimeError, match="retain_graph"):
            yt.backward()
        want = xt.grad.numpy()
    else:
        t = np.tanh(a)
        want = 3 * (t + a * (1 - t * t))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the JIT never replays stale state

def test_jit_closure_scalar_change_captures_again():
    w = Tensor(data((4, 4), seed=9))
    scale = 1.0

    @eqgrad.jit
    def f(x):
        return ((x @ w) * scale).sum().realize()
    x = Tensor(data((2, 4), seed=10))
    base = f(x).item()
    for s in (1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 1.0):
        scale = s
        assert f(x).item() == pytest.approx(base * s, rel=1e-6)
    assert f.recaptures == 3 and f.last_recapture.endswith("scale")


SCALE = 1.0


def test_jit_global_scalar_change_captures_again():
    global SCALE
    w = Tensor(data((4, 4), seed=9))

    @eqgrad.jit
    def f(x):
        return ((x @ w) * SCALE).sum().realize()
    x = Tensor(data((2, 4), seed=10))
    try:
        base = f(x).item()
        for s in (1.0, 1.0, 2.0, 2.0, 3.0):
            SCALE = s
            assert f(x).item() == pytest.approx(base * s, rel=1e-6)
        assert f.recaptures == 2 and f.last_recapture == "global SCALE"
    finally:
        SCALE = 1.0


def test_jit_replaced_attribute_tensor_captures_again():
    m = nn.Linear(4, 3)
    x = Tensor(data((2, 4), seed=10))

    @eqgrad.jit
    def f(x):
        return m(x).realize()
    for _ in range(3):
        np.testing.assert_allclose(f(x).numpy(), x.numpy() @ m.weight.numpy().T + m.bias.numpy(), rtol=1e-5)
    m.weight = Tensor(data((3, 4), seed=14), requires_grad=True)
    np.testing.assert_allclose(f(x).numpy(), x.numpy() @ m.weight.numpy().T + m.bias.numpy(), rtol=1e-5)
    assert f.recaptures == 1 and "weight" in f.last_recapture


def test_jit_method_reads_attribute_scalars():
    class Scaled(nn.Module):
        def __init__(self):
            self.lin = nn.Linear(4, 3)
            self.scale = 1.0

        @eqgrad.jit
        def run(self, x):
            return (self.lin(x) * self.scale).realize()
    m = Scaled()
    x = Tensor(data((2, 4), seed=10))
    ref = x.numpy() @ m.lin.weight.numpy().T + m.lin.bias.numpy()
    for s in (1.0, 1.0, 1.0, 2.0, 2.0):
        m.scale = s
        np.testing.assert_allclose(m.run(x).numpy(), ref * s, rtol=1e-5)
    assert Scaled.run.recaptures == 1


def test_jit_unchanged_state_replays_without_capturing_again():
    model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 3))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @eqgrad.jit
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss)
        return loss
    for i in range(10):
        step(Tensor(XS[i]), Tensor(YS[i]))
    assert step.captures == 1 and step.recaptures == 0 and step.replays == 8
    opt.param_groups[0]["momentum"] = 0.5              # a hyperparameter baked into the plan (torch's spelling)
    step(Tensor(XS[0]), Tensor(YS[0]))
    assert step.recaptures == 1 and step.last_recapture.endswith("['momentum']")


def test_jit_warns_when_state_changes_every_call():
    from eqgrad.frontend.jit import JitWarning
    step = {"t": 0}

    @eqgrad.jit
    def f(x):
        return (x * step["t"]).realize()
    x = Tensor([1.0, 2.0])
    with pytest.warns(JitWarning, match=r"changed 8 times \(f: step\['t'\]\).*tensor argument"):
        for t in range(12):
            step["t"] = t
            assert f(x).tolist() == [t, 2.0 * t]


# ---------------------------------------------------------------- one value where bits are compared
# argmax/argmin of a computed input used to return the axis length on LLVM (the input
# was evaluated in two kernels that rounded differently, so no element equalled its max).

ARGMAX_CASES = {
    "mean(1).argmax(0)": (lambda t: t.mean(1, keepdim=True).argmax(0),
                          lambda x: np.argmax(x.mean(1, keepdims=True, dtype=F32), 0)),
    "softmax(0).argmax(1)": (lambda t: t.softmax(0).argmax(1),
                             lambda x: np.argmax(np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0), 1)),
    "(exp / exp.sum(0)).argmax(1)": (lambda t: (t.exp() / t.exp().sum(0)).argmax(1),
                                     lambda x: np.argmax(np.exp(x) / np.exp(x).sum(0), 1)),
    "softmax(0).argmin(1)": (lambda t: t.softmax(0).argmin(1),
                             lambda x: np.argmin(np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0), 1)),
}


@pytest.mark.parametrize("case", list(ARGMAX_CASES))
def test_argmax_of_a_computed_input_is_an_index_of_its_max(case, device):
    fn, ref = ARGMAX_CASES[case]
    for seed in range(30):
        x = np.random.default_rng(seed).standard_normal((3, 5)).astype(F32)
        got = fn(Tensor(x, device=device)).numpy()
        want = ref(x.astype(np.float64))
        assert got.dtype == np.int32 and got.shape == want.shape
        # an index in range, and NumPy's (the draws have no near-ties at float32 precision)
        np.testing.assert_array_equal(got, want, err_msg=f"{case}, draw {seed}")


def test_a_value_compared_with_its_max_is_materialized_for_every_consumer():
    x = Tensor(data((3, 5)))
    y = x.exp() * 0.5                     # a computed value
    m = y.amax(1, keepdim=True)            # a consumer built before the comparison
    assert y.lazydata.op == "MUL"
    is_max = y == m
    # y is now computed once, into its own buffer, for m and is_max alike
    assert y.lazydata.op == "CONTIGUOUS" and y.lazydata.src[0].op == "MUL"
    assert m.lazydata.src[0] is y.lazydata
    want = np.exp(data((3, 5))) * F32(0.5)
    np.testing.assert_array_equal(is_max.numpy(), want == want.max(1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


def test_leaves_and_integers_compared_with_their_max_are_left_as_they_are():
    x = Tensor(data((3, 5)))
    before = x.lazydata
    _ = x == x.amax(1, keepdim=True)
    assert x.lazydata is before and x.lazydata.op == "BUF"
    i = Tensor(data((3, 5), np.int32)) + 1
    _ = i == i.amax(1, keepdim=True)
    assert i.lazydata.op == "ADD"          # integer arithmetic is exact in any plan
