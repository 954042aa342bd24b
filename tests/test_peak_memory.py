"""EQGRAD_PEAK_MEMORY: a bound on the bytes of a plan's buffers (its intermediates and outputs, all
held while it runs), met by extraction recomputing producers inside their consumers instead of
storing them -- and the plan's numbers stay right."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import eqgrad
from eqgrad import EqgradWarning, GlobalCounters, Tensor
from eqgrad.engine import clear_cache, plan_for
from eqgrad.extract import cost_model
from eqgrad.extract.greedy import GreedyExtractor
from eqgrad.ops import numel

RNG = np.random.default_rng(3)
X = RNG.standard_normal((64, 96)).astype(np.float32)
W1 = (RNG.standard_normal((96, 80)) * 0.1).astype(np.float32)
W2 = (RNG.standard_normal((80, 10)) * 0.1).astype(np.float32)


def _step() -> tuple[Tensor, Tensor]:
    """A 2-layer GELU MLP's weight gradients: the GELU's output is read by the forward's second
    product and by both backward products, so it may be stored or recomputed in each."""
    a, b = Tensor(W1, requires_grad=True), Tensor(W2, requires_grad=True)
    ((Tensor(X) @ a).gelu() @ b).log_softmax(-1).mean().backward()
    return a.grad, b.grad


def _reference() -> tuple[np.ndarray, np.ndarray]:
    """The same step in torch, float64."""
    torch = pytest.importorskip("torch")
    a = torch.tensor(W1, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(W2, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.gelu(torch.tensor(X, dtype=torch.float64) @ a).matmul(b).log_softmax(-1).mean().backward()
    return a.grad.numpy(), b.grad.numpy()


def _plan(bound: int, extractor: str = "greedy"):
    ga, gb = _step()
    with eqgrad.Context(PEAK_MEMORY=bound, EXTRACTOR=extractor, REGIONS=0):
        cp, _ = plan_for([ga.lazydata, gb.lazydata])
    return cp


def _held(plan) -> int:
    return sum(numel(s) * d.itemsize for s, d in plan.buffers[plan.n_inputs:])


def test_the_evaluation_counts_the_buffers_the_plan_allocates():
    cp = _plan(0)
    assert cp.result.evaluation.peak == _held(cp.plan) > 0
    assert cp.result.info["peak"] == _held(cp.plan) and "peak_bound" not in cp.result.info


def test_a_bound_the_fastest_plan_fits_changes_nothing():
    free = _plan(0)
    fits = _plan(_held(free.plan))
    assert [k.ast.render() for k in fits.plan.kernels] == [k.ast.render() for k in free.plan.kernels]
    assert fits.plan.predicted == free.plan.predicted


@pytest.mark.slow
@pytest.mark.parametrize("extractor", ["greedy", "improve", "ilp", "measured"])
def test_a_bound_below_the_fastest_plan_stores_less_and_the_numbers_stay_right(extractor):
    free = _held(_plan(0, extractor).plan)
    # every float32 output of the step (the two gradients) must be stored: the bound lies between
    outs = (W1.size + W2.size) * 4
    bound = free - 1
    cp = _plan(bound, extractor)
    assert _held(cp.plan) <= bound < free, (free, _held(cp.plan), bound)
    assert outs < _held(cp.plan)
    assert cp.result.info["peak_bound"] == bound
    clear_cache()
    ga, gb = _step()
    with eqgrad.Context(PEAK_MEMORY=bound, EXTRACTOR=extractor, REGIONS=0):
        got = (ga.numpy(), gb.numpy())
    ref = _reference()
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-3, atol=1e-5)
    np.testing.assert_allclose(got[1], ref[1], rtol=2e-3, atol=1e-5)


def test_an_unreachable_bound_warns_with_the_bytes_and_keeps_the_least_over():
    free = _held(_plan(0).plan)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        cp = _plan(1000)
    msgs = [str(w.message) for w in ws if issubclass(w.category, EqgradWarning)]
    assert any("EQGRAD_PEAK_MEMORY=1000" in m and str(_held(cp.plan)) in m for m in msgs), msgs
    assert _held(cp.plan) < free          # it still brought the buffers down as far as it could


def test_the_bound_keys_the_plan_cache_and_explain_shows_it():
    bound = _held(_plan(0).plan) - 1
    clear_cache()
    ga, gb = _step()
    lbs = [ga.lazydata, gb.lazydata]
    with eqgrad.Context(REGIONS=0):
        n0 = GlobalCounters.saturations
        plan_for(lbs)
        with eqgrad.Context(PEAK_MEMORY=bound):
            cp, _ = plan_for(lbs)
        plan_for(lbs)                               # the unbounded plan again: cached
        n1 = GlobalCounters.saturations
        with eqgrad.Context(PEAK_MEMORY=bound):
            text = str(eqgrad.explain(ga, gb, provenance=False))
    assert n1 - n0 == 2
    assert f"buffers: {_held(cp.plan)} bytes" in text and f"EQGRAD_PEAK_MEMORY {bound}: within it" in text, text
    # the moves the bound made, from the fastest plan (over it) to this one, each with its bytes
    moves = cp.result.info["memory_moves"]
    assert moves[0].startswith("fastest plan: ") and len(moves) >= 2, moves
    assert moves[-1].endswith(f": {_held(cp.plan)} bytes, {cp.result.evaluation.total * 1e6:.1f} us"), moves
    assert all(f"  for the bound: {m}" in text for m in moves), text


def test_bad_bounds_are_refused_naming_what_was_expected():
    with pytest.raises(ValueError, match="EQGRAD_PEAK_MEMORY"):
        with eqgrad.Context(PEAK_MEMORY=-1):
            pass
    with pytest.raises(ValueError, match="EQGRAD_PEAK_MEMORY"):
        with eqgrad.Context(PEAK_MEMORY="lots"):
            pass
    with eqgrad.Context(PEAK_MEMORY="2M"):
        assert eqgrad.config.PEAK_MEMORY.value == 2 << 20
    cm = cost_model("LLVM")
    with pytest.raises(ValueError, match="peak_bound: expected an integer number of bytes >= 0"):
        GreedyExtractor(None, cm, [], peak_bound=-5)          # noqa: the graph is not read before the check


def _attention_forward(seed: int, causal: bool) -> tuple:
    """q, k, v of b1 h4 s256 d32 (float32) and a causal mask of -inf, and ``attention(q, k, v, m)`` =
    softmax(q @ k.T / 8 [+ m where ``causal``]) @ v, for eqgrad's and torch's tensors alike."""
    rng = np.random.default_rng(seed)
    arrays = tuple(rng.standard_normal((1, 4, 256, 32)).astype(np.float32) for _ in range(3))
    mask = np.triu(np.full((256, 256), -np.inf, np.float32), 1)

    def attention(q, k, v, m):
        s = q @ k.transpose(-1, -2) / 8
        return (s + m if causal else s).softmax(-1) @ v
    return arrays + (mask,), attention


@pytest.mark.parametrize("causal", [False, True])
def test_attention_under_a_bound_writes_no_score_matrix_and_matches_torch(causal):
    """softmax(q @ k.T / 8 [+ causal mask]) @ v under a bound of its output's bytes: one kernel that
    keeps each row's scores in local arrays (lower/passes.py RowStash), no buffer but the output
    (the scores are 4 x 256 x 256 floats, 1 MB); it matches torch. (Its gradient for q alone streams
    too, below; a step that also computes k's and v's holds two score-sized buffers: those are
    column sums over the queries, which no kernel here computes from the rows' statistics.)"""
    torch = pytest.importorskip("torch")
    (qn, kn, vn, mask), attention = _attention_forward(11, causal)
    out = attention(*(Tensor(a) for a in (qn, kn, vn)), Tensor(mask))
    bound = 4 * 256 * 32 * 4
    free, _ = plan_for([out.lazydata])                  # the fastest plan without a bound
    with eqgrad.Context(PEAK_MEMORY=bound):
        cp, _ = plan_for([out.lazydata])
        text = str(eqgrad.explain(out, provenance=False))    # explain() names the lowering that keeps the rows
        got = out.numpy()
    assert len(cp.plan.kernels) == 1 and _held(cp.plan) == bound, [k.ast.render()[:80] for k in cp.plan.kernels]
    # priced as the lowering runs it: its scores are dot products streamed along the head dim
    # (lower/passes.py row_dots_streamed), not unlaned -- 16x the materializing plan's price before
    assert cp.plan.predicted < 2 * free.plan.predicted, (cp.plan.predicted, free.plan.predicted)
    ref = attention(*(torch.tensor(a, dtype=torch.float64) for a in (qn, kn, vn)), torch.tensor(mask, dtype=torch.float64))
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)
    assert "k0 row stash: 2 value(s) (RSUM EXP2) kept per row in a local array" in text, text


@pytest.mark.parametrize("causal", [False, True])
def test_attention_without_a_bound_is_one_kernel_where_the_cost_model_says_it_pays(causal, monkeypatch):
    """Greedy's rows phase (extract/greedy.py ``_rows_phase``): once the fastest plan priced without
    the row stash is found, it is priced again as the lowering runs its row-fused kernels, and the
    producers around them toggled again -- the probabilities inlined into ``p @ v``, then the
    scores. With no bound, softmax(q @ k.T / 8 [+ causal mask]) @ v is then one kernel (and the
    device's pack of k^T): no intermediate holds 10 % of the score matrix, the plan is predicted
    faster than the one without the phase (three kernels, the scores written), explain() names the
    moves, and the numbers are NumPy's."""
    (qn, kn, vn, mask), attention = _attention_forward(12, causal)

    def out() -> Tensor:
        return attention(*(Tensor(a) for a in (qn, kn, vn)), Tensor(mask))
    clear_cache()
    cp, _ = plan_for([out().lazydata])
    scores = 4 * 256 * 256 * 4
    assert len(cp.plan.kernels) == 1, [k.ast.render()[:80] for k in cp.plan.kernels]
    held = [numel(sh) * d.itemsize for i, (sh, d) in enumerate(cp.plan.buffers)
            if i >= cp.plan.n_inputs and i not in cp.plan.outputs]
    assert all(b < scores // 10 for b in held), held
    moves = cp.result.info["rows_moves"]            # explain() names the phase's moves
    text = str(eqgrad.explain(out(), provenance=False))
    assert moves[0].startswith("priced as the lowering keeps rows") and len(moves) >= 2, moves
    assert all(f"  rows phase: {m}" in text for m in moves), text
    s = qn @ kn.transpose(0, 1, 3, 2) / 8 + (mask if causal else 0)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out().numpy(), (e / e.sum(-1, keepdims=True)) @ vn, rtol=1e-4, atol=1e-5)
    clear_cache()
    monkeypatch.setattr(GreedyExtractor, "_rows_phase", lambda self, st, cur, deadline, taken=None: (st, cur, ""))
    without, _ = plan_for([out().lazydata])
    assert len(without.plan.kernels) == 3 and cp.plan.predicted < without.plan.predicted
    clear_cache()


def test_row_dots_count_as_register_blocks_only_where_they_cover_every_kept_sum():
    """The gradient of q alone as one kernel keeps each row's scores and g @ v.T in local arrays,
    reading k and v a head dim apart along the keys; the device packs k^T and v^T, one at a time
    (lower/passes.py ``row_pack``), and both become register blocks. Where v is read through an op
    that is not a view of one buffer (``exp(v)``, fused under the bound), it cannot be packed and
    g @ exp(v).T stays a streamed dot product: priced as if both were blocks, such a kernel was
    predicted 7.4 ms against 17-23 measured at s = 1024 and chosen over the 4-kernel plan (11.6-14
    ms), so ``row_dots_blocked`` answers for all of them (attention's forward, one kernel: yes)."""
    from eqgrad.graph.plan import Kernel
    from eqgrad.lower.passes import LowerOptions, row_dots_blocked, row_pack, schedule_kernel
    (qn, kn, vn, gn), loss = _attention_loss(5, False)
    q = Tensor(qn, requires_grad=True)
    loss(q, *(Tensor(a) for a in (kn, vn, gn))).backward()
    q2 = Tensor(qn, requires_grad=True)
    loss(q2, Tensor(kn), Tensor(vn).exp(), Tensor(gn)).backward()
    fwd = (Tensor(qn) @ Tensor(kn).transpose(-1, -2) / 8).softmax(-1) @ Tensor(vn)
    with eqgrad.Context(PEAK_MEMORY=256 * 32 * 4 * 4):
        (dq,) = plan_for([q.grad.lazydata])[0].plan.kernels
        (dq2,) = plan_for([q2.grad.lazydata])[0].plan.kernels
        (f,) = plan_for([fwd.lazydata])[0].plan.kernels
    assert row_dots_blocked(dq.ast) and not row_dots_blocked(dq2.ast) and row_dots_blocked(f.ast)
    # the packs: k^T and v^T for dq, only k^T for dq2; each packed body's row dots cover what it keeps
    packs, body = row_pack(dq.ast, LowerOptions())
    assert len(packs) == 2 and len(schedule_kernel(Kernel("dq", 0, body, body.buffers()), LowerOptions()).row_dots) == 2
    packs2, body2 = row_pack(dq2.ast, LowerOptions())
    assert len(packs2) == 1 and len(schedule_kernel(Kernel("dq2", 0, body2, body2.buffers()), LowerOptions()).row_dots) == 1


def _attention_loss(seed: int, causal: bool) -> tuple:
    """q, k, v and g of b1 h4 s256 d32 (float32), and ``loss(q, k, v, g)`` = sum(attention * g) with
    the scale 1/8 and, ``causal``, a causal mask of -inf, for eqgrad's and torch's tensors alike."""
    rng = np.random.default_rng(seed)
    arrays = tuple(rng.standard_normal((1, 4, 256, 32)).astype(np.float32) for _ in range(4))
    mask = np.triu(np.full((256, 256), -np.inf, np.float32), 1)

    def loss(q, k, v, g):
        s = q @ k.transpose(-1, -2) / 8
        if causal:
            s = s + (Tensor(mask) if isinstance(q, Tensor) else type(q)(mask).to(q.dtype))
        return (s.softmax(-1) @ v * g).sum()
    return arrays, loss


@pytest.mark.parametrize("causal", [False, True])
def test_the_gradient_of_q_under_a_bound_is_one_kernel_and_matches_torch(causal):
    """d/dq of sum(attention(q, k, v) * g) under a bound of its output's bytes: the rows' max, sum
    and sum(p * dp) and the output's contraction over the keys in one kernel that recomputes the
    scores and g @ v.T per row (kept in local arrays, both as register blocks) and writes no
    score-sized buffer; it matches torch in float64. (Without the bound the extractor chose 2-4
    kernels holding the scores until both row sums became register blocks; it may now choose the
    one kernel there too -- 7.70 -> 7.03 ms at s = 1024 on a 2-vCPU Intel Xeon -- so the plan
    without the bound is not asserted.)"""
    torch = pytest.importorskip("torch")
    (qn, kn, vn, gn), loss = _attention_loss(5, causal)
    q = Tensor(qn, requires_grad=True)
    loss(q, *(Tensor(a) for a in (kn, vn, gn))).backward()
    with eqgrad.Context(PEAK_MEMORY=256 * 32 * 4 * 4):
        cp, _ = plan_for([q.grad.lazydata])
        got = q.grad.numpy()
    assert len(cp.plan.kernels) == 1 and _held(cp.plan) == 4 * 256 * 32 * 4, [k.ast.render()[:80] for k in cp.plan.kernels]
    tq = torch.tensor(qn, dtype=torch.float64, requires_grad=True)
    loss(tq, *(torch.tensor(a, dtype=torch.float64) for a in (kn, vn, gn))).backward()
    np.testing.assert_allclose(got, tq.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_the_whole_gradient_of_attention_under_a_bound_writes_no_score_sized_buffer(causal):
    """dq, dk and dv of sum(attention(q, k, v) * g) under a bound of their outputs' bytes and a value
    per row for each of the rows' max, sum and sum(p * dp), which are kernels of their own; dq, dk
    and dv each recompute the scores (and g @ v.T) they read. dk and dv come out of autograd as
    contractions over the queries whose root is a permute of the sum ((g.T @ p).T): their lanes run along the
    head dim, which the probabilities are broadcast along (graph/plan.py ``lanes_axis``,
    lower/passes.py ``lane_shared``), so each probability is computed once per (query, key). No
    buffer but the outputs holds more than 10 % of the score matrix (without the bound: the scores
    and g @ v.T, 4 MB); the gradients match torch in float64."""
    torch = pytest.importorskip("torch")
    (qn, kn, vn, gn), loss = _attention_loss(6, causal)
    q, k, v = (Tensor(a, requires_grad=True) for a in (qn, kn, vn))
    loss(q, k, v, Tensor(gn)).backward()
    grads = [t.grad.lazydata for t in (q, k, v)]
    scores = 4 * 256 * 256 * 4
    free, _ = plan_for(grads)
    bound = 3 * 4 * 256 * 32 * 4 + 3 * 4 * 256 * 4       # the gradients, and a value per row for each statistic
    with eqgrad.Context(PEAK_MEMORY=bound):
        cp, _ = plan_for(grads)
        eqgrad.realize(q.grad, k.grad, v.grad)
        got = [t.grad.numpy() for t in (q, k, v)]
    outs = set(cp.plan.outputs)
    inner = [numel(s) * d.itemsize for i, (s, d) in enumerate(cp.plan.buffers)
             if i >= cp.plan.n_inputs and i not in outs]
    assert max(numel(s) * d.itemsize for s, d in free.plan.buffers) >= scores
    assert max(inner, default=0) < scores // 10, [k.ast.render()[:80] for k in cp.plan.kernels]
    assert _held(cp.plan) <= bound
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (qn, kn, vn))
    loss(tq, tk, tv, torch.tensor(gn, dtype=torch.float64)).backward()
    for a, t in zip(got, (tq, tk, tv)):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_only_dot_products_streamed_along_their_axis_count_as_vectorized():
    """lower/passes.py row_dots_streamed: the scores of softmax(q @ k.T) @ v as one kernel read q and
    k with unit stride along the head dim; with k given transposed (d, s) they gather along it."""
    from eqgrad.lower.passes import row_dots_streamed, rows_kept
    rng = np.random.default_rng(2)
    q, k, v = (Tensor(rng.standard_normal((1, 2, 40, 16)).astype(np.float32)) for _ in range(3))
    kt = Tensor(rng.standard_normal((1, 2, 16, 40)).astype(np.float32))
    for keys, streamed in ((k.transpose(-1, -2), True), (kt, False)):
        out = (q @ keys * 0.25).softmax(-1) @ v
        with eqgrad.Context(PEAK_MEMORY=1 * 2 * 40 * 16 * 4):
            cp, _ = plan_for([out.lazydata])
        (kern,) = cp.plan.kernels
        assert rows_kept(kern.ast) and row_dots_streamed(kern.ast) is streamed
