"""Contractions through the BLAS (lower/contraction.py reads a kernel body as a GEMM,
devices/blas.py runs it): which bodies are GEMMs and with which strides, and that the LLVM device
gives NumPy's (and torch's) numbers through that path -- every layout of a matmul, batched and
broadcast operands, slices, elementwise ops after it, matrix-vector products, gradients, one and
two threads -- and the generated kernels' numbers with ``EQGRAD_BLAS=0``."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.devices import blas, get_device
from conftest import count_gemm_calls
from eqgrad.lower import trace
from eqgrad.lower.contraction import find_contraction, is_pure, match_contraction

pytestmark = pytest.mark.skipif(blas.blas() is None, reason="SciPy's BLAS does not load here")


def body(t: Tensor):
    """The body of the one kernel ``t``'s plan has (asserted)."""
    plan = eqgrad.explain(t).plan
    assert len(plan.kernels) == 1, plan.describe()
    return plan.kernels[0].ast


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.fixture
def gemm_calls(monkeypatch):
    """The number of BLAS program calls made (a list of one count). Every contraction the BLAS
    can run goes to it (these tests' products are small; which path pays is ``test_what_pays``'s
    and ``test_a_batch_of_products_is_timed_once_per_machine``'s)."""
    engine.clear_cache()
    return count_gemm_calls(monkeypatch)


# ------------------------------------------------------------------ what is a GEMM
def test_a_matmul_is_a_gemm_with_its_strides():
    a, b = Tensor(rnd(6, 5)), Tensor(rnd(5, 7))
    found = find_contraction(body(a @ b))
    assert found is not None and is_pure(body(a @ b), found.red) and not found.packs
    g = found.gemm
    assert (g.m, g.n, g.k, g.sx_m, g.sx_k, g.sy_k, g.sy_n, g.sc_m, g.batch) == (6, 7, 5, 5, 1, 7, 1, 7, ())


def test_a_transposed_weight_is_read_in_place():
    """torch's Linear layout: W (out, in) read as W.T, no copy (its k stride is 1)."""
    x, w = Tensor(rnd(4, 3)), Tensor(rnd(8, 3))
    g = find_contraction(body(x @ w.T)).gemm
    assert (g.m, g.n, g.k, g.sy_k, g.sy_n) == (4, 8, 3, 1, 3)


def test_leading_axes_of_an_input_merge_into_rows():
    x, w = Tensor(rnd(2, 5, 3)), Tensor(rnd(3, 4))
    g = find_contraction(body(x @ w)).gemm
    assert (g.m, g.n, g.k, g.batch) == (10, 4, 3, ())


def test_batched_attention_scores_with_the_transpose_in_the_graph():
    q, k = Tensor(rnd(2, 3, 6, 4)), Tensor(rnd(2, 3, 6, 4, seed=1))
    t = (q @ k.transpose(-1, -2)) * 0.5
    f = find_contraction(body(t))
    red, g = f.red, f.gemm
    assert not is_pure(body(t), red)           # the scale is an epilogue
    assert (g.m, g.n, g.k, g.sy_k, g.sy_n, g.batch) == (6, 6, 4, 1, 4, ((6, 36, 24, 24),))


def test_a_slice_is_an_offset():
    a, b = Tensor(rnd(8, 9)), Tensor(rnd(6, 8))
    g = find_contraction(body(a[2:6, 1:7] @ b[:, 2:6])).gemm
    assert (g.x_off, g.y_off, g.sx_m, g.sy_k) == (2 * 9 + 1, 2, 9, 8)


@pytest.mark.parametrize("make,ref", [
    (lambda a, b: a.pad(((1, 0), (0, 0))) @ b,          # a pad that is read is a mask, not a stride
     lambda a, b: np.pad(a, ((1, 0), (0, 0))) @ b),
    (lambda a, b: a.flip(1) @ b, lambda a, b: a[:, ::-1] @ b),           # a negative stride
    (lambda a, b: a.exp() @ b, lambda a, b: np.exp(a) @ b),              # a prologue on an operand
    (lambda a, b: a[:, ::2] @ b[::2], lambda a, b: a[:, ::2] @ b[::2]),  # strided along both axes
], ids=["pad", "flip", "prologue", "strided"])
def test_operands_that_are_not_views_are_packed_first(make, ref, gemm_calls):
    """The operand is materialized (below its broadcast) by a kernel of its own, then the GEMM
    reads it."""
    a, b = rnd(6, 8), rnd(8, 5, seed=2)
    t = make(Tensor(a), Tensor(b))
    found = [f for f in (find_contraction(k.ast) for k in eqgrad.explain(t).plan.kernels) if f is not None]
    assert len(found) == 1 and len(found[0].packs) >= 1
    u = found[0].packs[0]
    assert int(np.prod(u.shape)) <= 7 * 8, u.shape          # the operand, not the (6, 5, 8) product
    np.testing.assert_allclose(t.numpy(), ref(a, b), rtol=1e-5, atol=1e-5)
    assert gemm_calls[0] >= 1


def test_a_contraction_under_a_second_reduction_is_not_a_gemm():
    a, b = rnd(4, 4), rnd(4, 4, seed=2)
    t = (Tensor(a) @ Tensor(b)).sum()
    assert all(find_contraction(k.ast) is None for k in eqgrad.explain(t).plan.kernels)
    np.testing.assert_allclose(t.numpy(), (a @ b).sum(), rtol=1e-5, atol=1e-5)


def test_a_sum_of_squares_per_row_is_left_to_the_generated_kernel():
    x = Tensor(rnd(8, 32))
    red, = [n for n in body((x * x).sum(-1)).walk() if n.op == "RSUM"]
    g = match_contraction(red)
    assert g is not None and (g.m, g.n, g.k, g.batches) == (1, 1, 32, 8)
    assert not blas.pays(g, predicted=1.0, threads=1)


def test_what_pays(monkeypatch):
    """A contraction whose calls cost more than their arithmetic at the measured rate stays
    generated where the BLAS's best case comes in above the generated kernel's predicted time;
    otherwise a single product goes to the BLAS, and a batch of them is timed both ways by the
    device (None), as is a product whose call costs less than its arithmetic; a reduction (one
    output per batch index) is never the BLAS's."""
    monkeypatch.setattr(blas, "speeds", lambda: (1e-6, 1e11))      # 1 us a call, 100 GFLOP/s
    q, k = Tensor(rnd(32, 12, 15, 32)), Tensor(rnd(32, 12, 15, 32, seed=1))
    small = find_contraction(body(q @ k.transpose(-1, -2))).gemm             # 14,400 flops a call: 0.14 us
    assert not blas.pays(small, predicted=1e-4, threads=2)                 # 384 calls: 0.44 ms
    assert blas.pays(small, predicted=1.0, threads=2) is None              # ... unless the kernel is slower: timed
    one = find_contraction(body(Tensor(rnd(16, 24)) @ Tensor(rnd(24, 16, seed=1)))).gemm   # one call, 12,288 flops
    assert blas.pays(one, predicted=1e-4, threads=2) is True              # 1.1 us: the BLAS, unmeasured
    assert blas.pays(one, predicted=1e-6, threads=2) is False
    big = find_contraction(body(Tensor(rnd(64, 64)) @ Tensor(rnd(64, 64, seed=1)))).gemm   # 524,288: 5.2 us
    assert blas.pays(big, predicted=0.0, threads=2) is None                # timed by the device
    row = match_contraction([n for n in body((q * q).sum(-1)).walk() if n.op == "RSUM"][0])
    assert not blas.pays(row, predicted=1.0, threads=2)


def test_the_measured_speeds_are_sane():
    call, rate = blas.speeds()
    assert 0 < call < 1e-3 and 1e8 < rate < 1e14


def test_int_contractions_are_not_gemms():
    a, b = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4)), Tensor(np.arange(8, dtype=np.int32).reshape(4, 2))
    assert find_contraction(body(a @ b)) is None
    np.testing.assert_array_equal((a @ b).numpy(), a.numpy() @ b.numpy())


# ------------------------------------------------------------------ numbers
LAYOUTS = {
    "nn": (lambda a, b: a @ b, (33, 17), (17, 29)),
    "nt": (lambda a, b: a @ b.T, (33, 17), (29, 17)),
    "tn": (lambda a, b: a.T @ b, (17, 33), (17, 29)),
    "tt": (lambda a, b: a.T @ b.T, (17, 33), (29, 17)),
    "vec-mat": (lambda a, b: a @ b.T, (1, 40), (23, 40)),
    "mat-vec": (lambda a, b: a @ b, (23, 40), (40, 1)),
    "mat-vec-t": (lambda a, b: a.T @ b, (40, 23), (40, 1)),
    "batched": (lambda a, b: a @ b, (3, 2, 9, 7), (3, 2, 7, 5)),
    "batched-t": (lambda a, b: a @ b.transpose(-1, -2), (3, 2, 9, 7), (3, 2, 5, 7)),
    "broadcast-batch": (lambda a, b: a @ b, (4, 9, 7), (7, 5)),
    "broadcast-left": (lambda a, b: a @ b, (9, 7), (4, 7, 5)),
    "broadcast-heads": (lambda a, b: a @ b, (2, 1, 6, 7), (1, 3, 7, 4)),
    "linear-3d": (lambda a, b: a @ b.T, (2, 15, 12), (20, 12)),
    "slices": (lambda a, b: a[1:9, 2:12] @ b[3:13, 1:7], (10, 14), (16, 12)),
    "permuted": (lambda a, b: a.permute(1, 0, 2) @ b, (7, 3, 5), (3, 5, 4)),
}


def _np_of(make, a, b):
    return make(Tensor(a), Tensor(b)).numpy(), make(_NP(a), _NP(b))


class _NP:
    """NumPy arrays with the Tensor spellings the layouts use."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __matmul__(self, o): return self.a @ (o.a if isinstance(o, _NP) else o)
    def __rmatmul__(self, o): return o @ self.a
    def __getitem__(self, i): return _NP(self.a[i])

    @property
    def T(self): return _NP(self.a.T)
    def transpose(self, i, j): return _NP(np.swapaxes(self.a, i, j))
    def permute(self, *p): return _NP(self.a.transpose(p))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_give_numpys_numbers(layout, threads, gemm_calls):
    make, sa, sb = LAYOUTS[layout]
    a, b = rnd(*sa), rnd(*sb, seed=5)
    with eqgrad.Context(THREADS=threads):
        got, want = _np_of(make, a, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert gemm_calls[0] >= 1


@pytest.mark.parametrize("layout", ["nt", "batched-t", "vec-mat"])
def test_without_the_blas_the_generated_kernel_gives_the_same_numbers(layout, gemm_calls):
    make, sa, sb = LAYOUTS[layout]
    a, b = rnd(*sa), rnd(*sb, seed=5)
    with eqgrad.Context(BLAS=0):
        got, want = _np_of(make, a, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert gemm_calls[0] == 0


def test_epilogues_run_after_the_gemm(gemm_calls):
    """Bias and activation (a Linear layer), attention's scale and mask: the contraction goes to the
    BLAS and the rest is a generated kernel reading it. (A softmax after the scores may instead keep
    them per row in its own kernel: greedy's rows phase, tests/test_fusion.py.)"""
    x, w, bias = rnd(24, 16), rnd(40, 16, seed=1), rnd(40, seed=2)
    got = (Tensor(x) @ Tensor(w).T + Tensor(bias)).relu().numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w.T + bias, 0), rtol=1e-5, atol=1e-5)
    q, k, m = rnd(2, 3, 8, 4), rnd(2, 3, 8, 4, seed=3), rnd(8, 8, seed=4)
    s = ((Tensor(q) @ Tensor(k).transpose(-1, -2)) * 0.5 + Tensor(m)).numpy()
    np.testing.assert_allclose(s, q @ k.swapaxes(-1, -2) * 0.5 + m, rtol=1e-5, atol=1e-6)
    assert gemm_calls[0] >= 2


def test_random_layouts(gemm_calls):
    """Random sizes, operand orientations and broadcast batch axes."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        m, n, k = (int(v) for v in rng.integers(1, 24, 3))
        batch = tuple(int(v) for v in rng.integers(1, 4, rng.integers(0, 3)))
        ta, tb = bool(rng.integers(2)), bool(rng.integers(2))
        ba = tuple(1 if rng.integers(3) == 0 else d for d in batch)
        bb = tuple(1 if rng.integers(3) == 0 else d for d in batch)
        a = rng.standard_normal(ba + ((k, m) if ta else (m, k))).astype(np.float32)
        b = rng.standard_normal(bb + ((n, k) if tb else (k, n))).astype(np.float32)
        A, B = Tensor(a), Tensor(b)
        A, a2 = (A.transpose(-1, -2), np.swapaxes(a, -1, -2)) if ta else (A, a)
        B, b2 = (B.transpose(-1, -2), np.swapaxes(b, -1, -2)) if tb else (B, b)
        np.testing.assert_allclose((A @ B).numpy(), a2 @ b2, rtol=1e-5, atol=1e-5,
                                   err_msg=f"m={m} n={n} k={k} batch={ba}/{bb} ta={ta} tb={tb}")
    assert gemm_calls[0] > 0


def test_gradients_of_a_linear_layer_match_torch(gemm_calls):
    torch = pytest.importorskip("torch")
    x, w, bias = rnd(12, 10), rnd(7, 10, seed=1), rnd(7, seed=2)
    X, W, Bi = (Tensor(v, requires_grad=True) for v in (x, w, bias))
    loss = (X @ W.T + Bi).relu().square().sum()
    loss.backward()
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, bias))
    tl = torch.nn.functional.linear(tx, tw, tb).relu().square().sum()
    tl.backward()
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-5)
    for mine, theirs in ((X, tx), (W, tw), (Bi, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert gemm_calls[0] >= 2


def test_empty_and_large_k(gemm_calls):
    a, b = rnd(0, 5), rnd(5, 3)
    assert (Tensor(a) @ Tensor(b)).numpy().shape == (0, 3)
    a, b = rnd(3, 5000), rnd(5000, 2, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_the_library_names_its_kernel():
    assert isinstance(blas.blas().corename(), str) and blas.blas().corename()


def test_a_jitted_step_replays_the_blas_program(gemm_calls):
    w = Tensor(rnd(16, 8))

    @eqgrad.jit
    def step(x):
        return (x @ w.T).relu()
    for i in range(4):
        x = rnd(5, 8, seed=10 + i)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), np.maximum(x @ w.numpy().T, 0), rtol=1e-5, atol=1e-6)
    assert gemm_calls[0] >= 4


@pytest.fixture
def timed_choices(tmp_path, monkeypatch):
    """Every product is timed BLAS against generated (its calls cost next to nothing), with a
    fresh cache directory; the list of the choices stored in ``gemm.json``, as they are stored."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(blas, "speeds", lambda: (1e-9, 1e11))
    trace.TRACES.clear()            # (bodies whose sizes kept changing in earlier tests are not looked at)
    monkeypatch.setattr(get_device("LLVM").stage, "_no_gemm", {})
    monkeypatch.setattr(get_device("LLVM").stage, "_timed_here", set())
    puts = []
    real_put = blas.CHOICES.put
    monkeypatch.setattr(blas.CHOICES, "put", lambda key, v: (puts.append(v), real_put(key, v)))
    return puts


def test_a_batch_of_products_is_timed_once_per_machine(tmp_path, timed_choices):
    """Batched products that pay for their calls are timed against the generated kernel; the
    times are kept in the cache directory and not measured again in this process, and again by
    each of the first MEASURED_PROCESSES processes only."""
    from eqgrad.devices import cpustage
    puts = timed_choices
    q, k = rnd(4, 3, 32, 16), rnd(4, 3, 32, 16, seed=1)
    want = q @ k.swapaxes(-1, -2)

    def run() -> None:
        engine.clear_cache()
        got = (Tensor(q) @ Tensor(k).transpose(-1, -2)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for _ in range(2):
        run()
    assert len(puts) == 1 and len(puts[0]) == 1
    flops, t_gen, t_blas, processes, dims = puts[0][0]
    assert flops == 2 * 4 * 3 * 32 * 32 * 16 and t_gen > 0 and t_blas > 0 and processes == 1
    assert dims == [12, 32, 32, 16]                 # batches, m, n, k
    assert (tmp_path / "gemm.json").exists()
    stage = get_device("LLVM").stage
    for later in range(2, cpustage.MEASURED_PROCESSES + 2):     # a later process (this one's memos gone)
        stage._timed_here.clear()
        stage._contraction_memo = type(stage._contraction_memo)()
        run()
        timed = min(later, cpustage.MEASURED_PROCESSES)
        assert len(puts) == timed and puts[-1][0][3] == timed, (later, puts)
        assert puts[-1][0][1] <= puts[-2][0][1] and puts[-1][0][2] <= puts[-2][0][2]    # each side's fastest
    # another size of the same kernel within 4x of its flops takes the kept choice; one beyond
    # it is timed, and both choices are kept
    base = len(puts)
    for n, timed in ((24, 0), (80, 1)):
        q2, k2 = rnd(4, 3, n, 16), rnd(4, 3, n, 16, seed=1)
        got = (Tensor(q2) @ Tensor(k2).transpose(-1, -2)).numpy()
        np.testing.assert_allclose(got, q2 @ k2.swapaxes(-1, -2), rtol=1e-5, atol=1e-5)
        assert len(puts) == base + timed, (n, puts)
    assert len(puts[-1]) == 2
    # within 4x of the first one's flops (1/3) but not of its batches (64 products against 12 of
    # the same body): a choice of its own, timed -- the crossover between the two sides moves with
    # the shape, not with the flops
    base = len(puts)
    q3, k3 = rnd(8, 8, 8, 16), rnd(8, 8, 8, 16, seed=1)
    got = (Tensor(q3) @ Tensor(k3).transpose(-1, -2)).numpy()
    np.testing.assert_allclose(got, q3 @ k3.swapaxes(-1, -2), rtol=1e-5, atol=1e-5)
    assert len(puts) == base + 1, puts[base:]
    assert [e[4] for e in puts[-1]] == [[12, 32, 32, 16], [12, 80, 80, 16], [64, 8, 8, 16]]


@pytest.mark.parametrize("runs,verdict", [
    # (generated, BLAS) seconds, turn by turn: one slow BLAS run does not decide
    ([(1e-3, 0.1), (1e-3, 5e-4), (1e-3, 5e-4)], True),
    # nor one slow generated run
    ([(0.1, 1e-3), (5e-4, 1e-3), (5e-4, 1e-3)], False),
    # a BLAS slower by more than BLAS_GIVE_UP in two turns is not run a third time
    ([(1e-3, 9e-3), (1e-3, 9e-3)], False),
])
def test_one_slow_run_does_not_decide_blas_or_generated(timed_choices, monkeypatch, runs, verdict):
    """``CPUStage._measured`` times the generated kernel and the BLAS in turns; each side's
    fastest run counts, so a slow moment of a shared machine in one run cannot decide (it once
    kept BERT's value projection generated, 2.6x slower, in gemm.json for good)."""
    from eqgrad.devices import cpustage
    puts = timed_choices
    durations = [d for turn in runs for d in turn]
    calls = []

    class Clock:                         # the stage's clock: each timed run takes the scripted time
        @staticmethod
        def perf_counter() -> float:
            calls.append(None)
            n = len(calls) - 1
            return float(n // 2) + (durations[n // 2] if n % 2 else 0.0)
    monkeypatch.setattr(cpustage, "time", Clock)
    engine.clear_cache()
    q, k = rnd(4, 3, 32, 16), rnd(4, 3, 32, 16, seed=1)
    got = (Tensor(q) @ Tensor(k).transpose(-1, -2)).numpy()
    np.testing.assert_allclose(got, q @ k.swapaxes(-1, -2), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 * len(durations)                   # every scripted run, and no more
    assert len(puts) == 1
    _, t_gen, t_blas, _, _ = puts[0][-1]
    assert (t_blas < t_gen) is verdict


def test_a_choice_timed_on_a_busy_machine_is_righted_by_a_later_process(timed_choices, monkeypatch):
    """What ``gemm.json`` keeps is each side's fastest time over the first MEASURED_PROCESSES
    processes, not the first one's verdict: a BLAS slowed in every turn of one process (another
    job on both cores) loses there, and wins once a quieter process has timed it."""
    from eqgrad.devices import cpustage
    puts = timed_choices
    stage = get_device("LLVM").stage
    q, k = rnd(4, 3, 32, 16), rnd(4, 3, 32, 16, seed=1)
    want = q @ k.swapaxes(-1, -2)
    used = []
    real_call = blas.GemmProgram.__call__

    def called(self, *ptrs, lo, hi):
        used.append(None)
        return real_call(self, *ptrs, lo=lo, hi=hi)
    monkeypatch.setattr(blas.GemmProgram, "__call__", called)

    def process(durations: list) -> str:
        """One process: the timed runs take the scripted (generated, BLAS) seconds; which ran."""
        calls = []

        class Clock:
            @staticmethod
            def perf_counter() -> float:
                calls.append(None)
                n = len(calls) - 1
                return float(n // 2) + (durations[n // 2] if n % 2 else 0.0)
        stage._timed_here.clear()
        stage._contraction_memo = type(stage._contraction_memo)()
        engine.clear_cache()
        with monkeypatch.context() as m:
            m.setattr(cpustage, "time", Clock)
            got = (Tensor(q) @ Tensor(k).transpose(-1, -2)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        used.clear()
        engine.clear_cache()
        (Tensor(q) @ Tensor(k).transpose(-1, -2)).numpy()
        return "BLAS" if used else "generated"
    busy = [1e-3, 3e-3] * 3              # the BLAS slowed 3x in every turn
    quiet = [1e-3, 4e-4] * 3
    assert process(busy) == "generated"
    assert process(quiet) == "BLAS"
    assert puts[-1][0][1:] == [pytest.approx(1e-3), pytest.approx(4e-4), 2, [12, 32, 32, 16]]
    assert process(busy) == "BLAS"        # a third, busy process keeps the fastest of each side
    assert puts[-1][0][3] == 3
    n = len(puts)
    assert process([]) == "BLAS" and len(puts) == n      # the fourth reads it: no timing at all


def test_a_scipy_without_the_wheels_library_is_reached_through_cython_blas(monkeypatch):
    """Where SciPy links another BLAS (no ``scipy.libs`` OpenBLAS), its cython_blas pointers are
    used: the same products, the same numbers."""
    monkeypatch.setattr(blas, "_wheel_library", lambda: (None, False))
    lib = blas.Blas()
    a, b = rnd(9, 7), rnd(7, 5, seed=1)
    c = np.zeros((9, 5), np.float32)
    x, y = Tensor(a), Tensor(b)
    g = find_contraction(body(x @ y)).gemm
    prg = blas.GemmProgram("k", g, (2, 0, 1), lib, 1)
    prg(c.ctypes.data, a.ctypes.data, b.ctypes.data, lo=0, hi=prg.units)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_contraction_written_transposed(gemm_calls):
    """A weight gradient written in the weight's (out, in) layout: the GEMM writes C with the
    root's strides, no copy (and a layout no GEMM can write goes through a scratch buffer)."""
    a, b = rnd(12, 9), rnd(12, 7, seed=1)
    t = (Tensor(a).T @ Tensor(b)).T                   # (7, 9) = b.T @ a
    f = find_contraction(body(t))
    assert f is not None and f.pure, f
    np.testing.assert_allclose(t.numpy(), b.T @ a, rtol=1e-5, atol=1e-5)
    x = rnd(2, 3, 4, 5)
    t2 = (Tensor(x) @ Tensor(x).transpose(-1, -2)).permute(1, 2, 0, 3)
    np.testing.assert_allclose(t2.numpy(), (x @ x.swapaxes(-1, -2)).transpose(1, 2, 0, 3), rtol=1e-5, atol=1e-5)
    assert gemm_calls[0] >= 2


def test_the_speeds_are_the_best_this_machine_measured(tmp_path, monkeypatch):
    """blas.speeds: the best of this process's timing and what earlier processes measured here
    (blas_speed.json in the cache directory), which it keeps: a process that started in a slow
    minute does not price its library GEMMs by that minute."""
    import json
    from eqgrad.cache import machine_id
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(blas, "_measured_speeds", lambda: (2e-6, 5e10))
    f = tmp_path / "blas_speed.json"
    try:
        blas.speeds.cache_clear()
        assert blas.speeds() == (2e-6, 5e10)                       # nothing stored: this process's, kept
        assert json.loads(f.read_text())["entries"][machine_id()] == [2e-6, 5e10]
        blas.speeds.cache_clear()
        blas.SPEEDS.put(machine_id(), [1e-6, 9e10])                 # an earlier, quieter process
        assert blas.speeds() == (1e-6, 9e10)
        blas.speeds.cache_clear()
        blas.SPEEDS.put(machine_id(), [3e-6, 9e10])                 # each part the best of both
        assert blas.speeds() == (2e-6, 9e10)
        assert json.loads(f.read_text())["entries"][machine_id()] == [2e-6, 9e10]
        blas.speeds.cache_clear()
        f.write_text(json.dumps({"version": 1, "entries": {machine_id(): [0, "fast"]}}))
        with pytest.warns(Warning, match="blas_speed"):
            assert blas.speeds() == (2e-6, 5e10)                   # a bad entry: ignored, rewritten
    finally:
        blas.speeds.cache_clear()


@pytest.mark.parametrize("bad", [[[393216, True]], [[393216, 1e-3, 0.0, 1, [12, 32, 32, 16]]],
                                 [[393216, 1e-3, 1e-3, 0, [12, 32, 32, 16]]], "BLAS",
                                 [[393216.0, 1e-3, 1e-3, 1, [12, 32, 32, 16]]], [[393216, 1e-3, 1e-3, 1]],
                                 [[393216, 1e-3, 1e-3, 1, [12, 32, 0, 16]]]])
def test_a_bad_kept_choice_is_ignored_and_timed_again(tmp_path, timed_choices, bad):
    """An entry of ``gemm.json`` that is not [flops, generated seconds, BLAS seconds, processes,
    [batches, m, n, k]] (the older [flops, verdict] and the dimensionless entries among them) is
    dropped with one warning naming the file, and the contraction is timed again."""
    import json
    import warnings
    puts = timed_choices
    q, k = rnd(4, 3, 32, 16), rnd(4, 3, 32, 16, seed=1)
    engine.clear_cache()
    (Tensor(q) @ Tensor(k).transpose(-1, -2)).realize()
    f = tmp_path / "gemm.json"
    data = json.loads(f.read_text())
    f.write_text(json.dumps({"version": data["version"], "entries": {key: bad for key in data["entries"]}}))
    stage = get_device("LLVM").stage
    stage._timed_here.clear()
    stage._contraction_memo = type(stage._contraction_memo)()
    engine.clear_cache()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        got = (Tensor(q) @ Tensor(k).transpose(-1, -2)).numpy()
    np.testing.assert_allclose(got, q @ k.swapaxes(-1, -2), rtol=1e-5, atol=1e-5)
    assert [str(w.message) for w in ws if "gemm.json" in str(w.message)], [str(w.message) for w in ws]
    assert len(puts) == 2 and puts[-1][0][3] == 1                 # timed again, as a first process
