"""Lowering: symbolic index simplification, loop IR shape, and device agreement with the reference."""
import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.graph.plan import check_plan
from eqgrad.lower.lowering import lower_kernel
from eqgrad.lower.symbolic import Lin
from conftest import DEVICES


def test_div_mod_of_split_index():
    i, j = Lin.var("i", 8), Lin.var("j", 4)
    x = i * 4 + j
    assert x // 4 == i
    assert x % 4 == j
    assert (x * 3) // 12 == i
    assert (i * 6 + 5) // 2 == i * 3 + 2


def test_bounds_fold_constants():
    j = Lin.var("j", 4)
    assert (j // 4).is_const and (j // 4).const == 0
    assert j % 8 == j
    assert (j + 8) % 4 == j
    assert Lin.var("k", 1).is_const


def test_reshape_round_trip_needs_no_division():
    a = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    out = a.reshape(2, 2, 6).reshape(4, 6) + 1
    out.realize()
    lk = lower_kernel(engine.last_plan.plan.kernels[0], engine.last_plan.plan)
    assert not [x for x in lk.insts if x.op in ("IDIV", "MOD")]
    np.testing.assert_array_equal(out.numpy(), np.arange(24, dtype=np.float32).reshape(4, 6) + 1)


def test_reduction_lowers_to_nested_loop_with_accumulator():
    a = Tensor(np.ones((8, 32), np.float32))
    a.sum(1).realize()
    plan = engine.last_plan.plan
    lk = lower_kernel(plan.kernels[0], plan)
    ops = [x.op for x in lk.insts]
    assert ops.count("RANGE") == 2 and ops.count("DEFACC") == 1 and ops.count("ACCUM") == 1
    assert ops.index("DEFACC") < ops.index("ACCUM")


def test_matmul_kernel_uses_register_lanes():
    a, b = Tensor(np.ones((16, 32), np.float32)), Tensor(np.ones((32, 64), np.float32))
    (a @ b).realize()
    plan = engine.last_plan.plan
    lk = lower_kernel(plan.kernels[0], plan)
    assert sum(1 for x in lk.insts if x.op == "DEFACC") == 128     # 8 rows x 16 columns
    assert not lk.loop_vectorize


def test_no_lanes_where_a_streamed_load_would_be_gathered():
    """The lanes pass wants a load streamed with unit stride along the lane axis; a load streamed
    with a larger stride there would be a gather per lane. A sum over axes (0, 2, 3) of a relu mask
    times a per-(batch, channel) broadcast: the broadcast steps by 1 along the channels, the mask by
    256 -- no lanes (it ran in 233 us with them, 90 without). A column sum and a product keep theirs.
    The numbers are NumPy's."""
    from eqgrad.lower.passes import lanes_apply
    rng = np.random.default_rng(5)
    mn = rng.random((32, 32, 16, 16)) > 0.5
    sn = rng.standard_normal((32, 32, 1, 1)).astype(np.float32)
    xn = rng.standard_normal((64, 48)).astype(np.float32)

    def root(t):
        out = t.numpy()
        plan = engine.last_plan.plan
        assert len(plan.kernels) == 1, plan.describe()
        return out, plan.kernels[0].ast
    got, gathered = root(Tensor(mn).where(Tensor(sn).expand(32, 32, 16, 16), 0.0).sum((0, 2, 3)))
    np.testing.assert_allclose(got, np.where(mn, sn, 0).sum((0, 2, 3)), rtol=1e-5, atol=1e-4)
    assert not lanes_apply(gathered, True)
    got, column = root(Tensor(xn).sum(0))
    np.testing.assert_allclose(got, xn.sum(0), rtol=1e-5, atol=1e-5)
    assert lanes_apply(column, True)
    got, product = root(Tensor(xn) @ Tensor(xn.T.copy()))
    np.testing.assert_allclose(got, xn @ xn.T, rtol=1e-4, atol=1e-3)
    assert lanes_apply(product, True)


@pytest.mark.parametrize("m,n,k", [(8, 12, 32768), (6, 10, 32768), (32, 10, 32768), (5, 6, 45000), (7, 9, 40000),
                                   (8, 12, 64)])
def test_a_product_with_a_transposed_weight_gets_a_dot_block(m, n, k):
    """``x @ w.T`` with a Linear layer's (out, in) weight streams both operands along the reduce
    loop and neither along the output's last axis: no lanes, but a dot block (lower/passes.py
    ``DotLanes``) -- up to 4 x 2 outputs per iteration as scalar accumulators, the loop vectorizer
    on (it widens the reduce loop). Right with a bias and a relu after it, on blocks that divide
    the axes only in part (6 rows: 3; 5 rows: 1 -- no block; 9 columns: 1 -- none either), where
    the weight streams from beyond the cache (at least 1 MiB; 12 x 64 floats do not). The pass can
    be switched off (tests/test_lower_interp.py runs the corpus without it). The cost model prices
    it as a laned contraction (``block_of``: not (1, 1)) and the classifier calls it one.
    """
    from dataclasses import replace
    from eqgrad.graph.caps import CPU
    from eqgrad.lower.classify import classify
    from eqgrad.lower.passes import LowerOptions, block_of, schedule_kernel
    rng = np.random.default_rng(m * n * k)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (n, k), (n,)))
    with eqgrad.Context(BLAS=0):
        got = (Tensor(x) @ Tensor(w).T + Tensor(b)).relu().numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w.T + b, 0), rtol=1e-4, atol=1e-4)
    plan = engine.last_plan.plan
    (kern,) = plan.kernels
    s = schedule_kernel(kern)
    blocks = {(8, 12, 32768): ((0, 4), (1, 2)), (6, 10, 32768): ((0, 3), (1, 2)), (32, 10, 32768): ((0, 4), (1, 2))}
    assert s.lanes == blocks.get((m, n, k), ()) and s.dot == ((m, n, k) in blocks), s
    lk = lower_kernel(kern, plan)
    if s.dot:
        assert lk.loop_vectorize and lk.vector_lanes == 0
        a, b2 = (w_ for _, w_ in s.lanes)
        # one accumulator per lane and level of the blocked sum (32768 = 32 blocks of 1024: two)
        assert s.blocked and sum(1 for i in lk.insts if i.op == "DEFACC") == a * b2 * 2
        assert block_of(kern.ast, CPU) != (1, 1) and "contraction" in classify(kern).kinds
        off = schedule_kernel(kern, LowerOptions(disabled=frozenset({"dot lanes"})))
        assert not off.lanes and not off.dot


def test_the_register_block_reuses_the_vector_loaded_operand():
    """The register block's second lane axis is the innermost output axis along which the operand
    the lanes load as vectors keeps its index (lower/passes.py ``block_axis``): a convolution's
    output channels (its input is loaded along the output columns and read at the same place for
    every channel), where the axis before the last (the output rows) re-read the input for every
    row; a matmul's rows, also in a batch; the axis before the last where no axis keeps it. The
    numbers are NumPy's."""
    from eqgrad.lower.passes import block_axis, schedule_kernel
    from eqgrad.nn import functional as F
    rng = np.random.default_rng(11)

    def contraction(out: Tensor):
        got = out.numpy()
        (kern,) = [k for k in engine.last_plan.plan.kernels if any(n.op == "RSUM" for n in k.ast.walk())]
        return got, kern
    x, w = rng.standard_normal((2, 4, 8, 16)).astype(np.float32), rng.standard_normal((16, 4, 3, 3)).astype(np.float32)
    with eqgrad.Context(BLAS=0):
        got, kern = contraction(F.conv2d(Tensor(x), Tensor(w), padding=1))
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("bchw,oc->bohw", xp[:, :, i:i + 8, j:j + 16], w[:, :, i, j]) for i in range(3) for j in range(3))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert block_axis(kern.ast) == 1 and dict(schedule_kernel(kern).lanes) == {1: 8, 3: 16}
    a, b = rng.standard_normal((4, 16, 32)).astype(np.float32), rng.standard_normal((4, 32, 64)).astype(np.float32)
    with eqgrad.Context(BLAS=0):
        got, kern = contraction(Tensor(a) @ Tensor(b))
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    assert block_axis(kern.ast) == 1 and 1 in dict(schedule_kernel(kern).lanes)
    c = rng.standard_normal((3, 4, 8, 64)).astype(np.float32)
    got, kern = contraction(Tensor(c).sum(0))
    np.testing.assert_allclose(got, c.sum(0), rtol=1e-5, atol=1e-5)
    assert block_axis(kern.ast) == 1                 # (4, 8, 64): the load varies along both axes


@pytest.mark.parametrize("m,k,n,transposed", [(128, 2048, 128, False), (136, 1024, 256, True), (384, 4096, 80, False),
                                               (480, 1024, 256, False)])
def test_cache_tiled_matmul(m, k, n, transposed):
    """Large contractions get a tile loop: (tiles, column blocks, 8 row blocks, reduce) -- fewer
    row blocks a tile where 8 does not divide them (480 rows: 60 blocks, 6 a tile); results match
    on sizes with partial tiles and on a transposed (non-contiguous) operand."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    tb = Tensor(b).T if transposed else Tensor(b)
    out = (Tensor(a) @ tb).numpy()
    np.testing.assert_allclose(out, a @ (b.T if transposed else b), rtol=1e-4, atol=1e-3)
    plan = engine.last_plan.plan
    lk = lower_kernel(plan.kernels[0], plan)
    ranges = [x.arg for x in lk.insts if x.op == "RANGE"]
    if not transposed:      # contiguous B: lanes 8x16, so m/8 row blocks in tiles of 8 (or fewer)
        t = max(d for d in range(2, 9) if (m // 8) % d == 0 and m // 8 >= 2 * d)
        assert ranges[:3] == [m // 8 // t, n // 16, t], ranges


@pytest.mark.parametrize("shape", [(5, 7), (16, 1), (3, 48)])
def test_upcast_keeps_remainders_right(shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((shape[0], 9)).astype(np.float32)
    b = rng.standard_normal((9, shape[1])).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Tensor(b).sum(0).numpy(), b.sum(0), rtol=1e-5, atol=1e-5)


def test_padded_loads_are_masked():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = Tensor(x).pad(((2, 1), (1, 3))).exp2().sum(1)     # exp2 of the padded zeros is 1
    ref = np.exp2(np.pad(x, ((2, 1), (1, 3)))).sum(1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_plans_pass_structural_checks():
    a = Tensor(np.ones((4, 8), np.float32))
    (a.softmax(-1) @ a.T).realize()
    check_plan(engine.last_plan.plan)


def test_llvm_ir_is_printed_at_debug_4(capsys):
    with eqgrad.Context(DEBUG=4):
        (Tensor(np.ones((3, 3), np.float32)) * 7 - 2).realize()
    out = capsys.readouterr().out
    assert "define void @eqk(" in out and "--- LLVM IR" in out


def test_kernel_search_keeps_results_and_caches(tmp_path, monkeypatch):
    """EQGRAD_BEAM: candidates are timed, wrong ones discarded, the pick cached on disk; odd sizes
    (primes) and non-contiguous inputs give the reference's numbers."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 64)).astype(np.float32)
    b = rng.standard_normal((48, 64)).astype(np.float32)[:, ::2]       # (48, 32) non-contiguous
    with eqgrad.Context(BEAM=6, BEAM_TIME=5.0, BLAS=0):     # (the search times generated kernels)
        out = (Tensor(a[:, :48]) @ Tensor(b)).numpy()
        np.testing.assert_allclose(out, a[:, :48] @ b, rtol=1e-4, atol=1e-4)
        engine.clear_cache()
        out2 = (Tensor(a[:, :48]) @ Tensor(b)).numpy()
    np.testing.assert_allclose(out2, out, rtol=1e-5, atol=1e-5)
    import json
    entries = json.loads((tmp_path / "beam.json").read_text())["entries"]
    assert len(entries) >= 1
    (tmp_path / "beam.json").write_text("{corrupt")            # ignored and rebuilt
    engine.clear_cache()
    with eqgrad.Context(BEAM=2, BEAM_TIME=5.0):
        np.testing.assert_allclose((Tensor(a[:, :48]) @ Tensor(b)).numpy(), out, rtol=1e-5, atol=1e-5)


def test_kernel_search_tries_a_covering_width_with_fewer_rows(tmp_path, monkeypatch):
    """A row-fused kernel whose lanes cover a last axis wider than any of the search's settings
    (attention's head dim of 64) is also tried at that width with 4, 2 and 1 rows a block, first
    (devices/search.py ``candidates``): the gradient of q under a memory bound, EQGRAD_BEAM=2, keeps
    NumPy's numbers and stores a pick the search made."""
    import json
    from eqgrad.devices.search import CANDIDATES, _check_entry, candidates
    assert candidates(0) == CANDIDATES == candidates(32)
    assert candidates(64) == [(64, 4), (64, 2), (64, 1)] + CANDIDATES
    assert _check_entry(None) is None and _check_entry([64, 4]) is None and _check_entry(list(CANDIDATES[-1])) is None
    assert _check_entry([64, 99]) and _check_entry([1 << 20, 4]) and _check_entry([64.0, 4]) and _check_entry("x")
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    s_, d = 32, 64
    qn, kn, vn, gn = (rng.standard_normal((1, 2, s_, d)).astype(np.float32) for _ in range(4))
    q = Tensor(qn, requires_grad=True)
    ((q @ Tensor(kn).transpose(-1, -2) * 0.125).softmax(-1) @ Tensor(vn) * Tensor(gn)).sum().backward()
    with eqgrad.Context(BEAM=2, BEAM_TIME=5.0, PEAK_MEMORY=4 * 2 * s_ * d):
        got = q.grad.numpy()
    sn = qn @ kn.transpose(0, 1, 3, 2) * 0.125
    p = np.exp(sn - sn.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = gn @ vn.transpose(0, 1, 3, 2)
    np.testing.assert_allclose(got, (p * (dp - (p * dp).sum(-1, keepdims=True)) * 0.125) @ kn, rtol=1e-4, atol=1e-4)
    picks = json.loads((tmp_path / "beam.json").read_text())["entries"].values()
    assert picks and all(v is None or tuple(v) in candidates(64) for v in picks)


@pytest.mark.parametrize("n", [1, 7, 17, 31])
def test_threaded_kernels_on_odd_sizes(n):
    """Kernels split across threads give the reference's numbers on sizes that do not divide."""
    import eqgrad.devices.cpu as cpu
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3 * n + 1)).astype(np.float32)
    old = cpu.PARALLEL_MIN
    cpu.PARALLEL_MIN = -1.0        # split every kernel
    try:
        got = (Tensor(x).exp2().sum(1) + Tensor(x.T.copy()).amax(0)).numpy()
    finally:
        cpu.PARALLEL_MIN = old
    np.testing.assert_allclose(got, np.exp2(x).sum(1) + x.max(1), rtol=1e-5, atol=1e-5)


def test_long_float_sums_are_blocked_and_accurate(device):
    """A float sum over millions of elements keeps ~1e-6 relative accuracy (block accumulators:
    Lowerer._reduce_lanes); one accumulator per vector lane lost ~3e-3 on 32M elements."""
    rng = np.random.default_rng(5)
    x = rng.random((2048, 2048), dtype=np.float32)
    ref = (x.astype(np.float64) ** 2).mean()
    t = Tensor(x, device=device)
    assert abs(float((t * t).mean().numpy()) - ref) / ref < 2e-6
    flat = Tensor(x.reshape(-1), device=device)
    assert abs(float(flat.sum().numpy()) - x.astype(np.float64).sum()) / x.astype(np.float64).sum() < 2e-6
    if device == "LLVM":
        plan = engine.last_plan.plan
        lk = lower_kernel(plan.kernels[-1] if len(plan.kernels) == 1 else plan.kernels[0], plan)
        assert sum(1 for i in lk.insts if i.op == "DEFACC") >= 2        # a block accumulator


@pytest.mark.parametrize("what", ["sum", "max", "int_sum", "mean"])
def test_large_full_reductions_split_across_threads(what, monkeypatch):
    """With threads, a large reduction to one value becomes parallel partials plus a final
    reduction (lower/split.py); with one thread it stays one kernel. Same results either way.
    (Whether a kernel runs split is measured, devices/cpu.py ``launch``: pinned here, so that the
    test does not depend on what this machine's threads cost.)"""
    import eqgrad.devices.cpu as cpu
    monkeypatch.setattr(cpu, "PARALLEL_MIN", 0.0)
    rng = np.random.default_rng(6)
    if what == "int_sum":
        x = rng.integers(-1000, 1000, (4096, 300), dtype=np.int32)
        ref = x.sum(dtype=np.int64).astype(np.int32)
    else:
        x = rng.standard_normal((4096, 300)).astype(np.float32)
        ref = {"sum": x.astype(np.float64).sum(), "max": x.max(), "mean": x.astype(np.float64).mean()}[what]
    t = Tensor(x)
    make = {"sum": lambda: t.sum(), "max": lambda: t.max(), "int_sum": lambda: t.sum(), "mean": lambda: t.mean()}[what]
    for threads, n_kernels in ((2, 2), (1, 1)):
        with eqgrad.Context(THREADS=threads):
            GlobalCounters.reset()
            got = make().numpy()
            assert GlobalCounters.kernel_count == n_kernels
        if what in ("max", "int_sum"):
            assert got == ref
        else:
            np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-3)


def test_streaming_stores_for_large_elementwise_outputs():
    """A large 1-D elementwise kernel gets non-temporal vector stores (llvm.streaming_store); results
    match with them, on a size that is not a multiple of 16 (plain stores), split across threads,
    and when the output is not 64-byte aligned (the program falls back to a plain copy)."""
    from eqgrad.devices import get_device
    from eqgrad.devices.llvm import NT_MIN
    n = NT_MIN // 4 + 4096                                    # a multiple of 16
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ta, tb = Tensor(a), Tensor(b)
    for threads in (1, 2):
        with eqgrad.Context(THREADS=threads):
            np.testing.assert_allclose(((ta * tb + 1).exp2()).numpy(), np.exp2(a * b + 1), rtol=1e-6)
    dev = get_device("LLVM")
    prgs = [p for p in dev.programs.values() if p.nontemporal]
    assert prgs, "no streaming-store program was compiled"
    prg = prgs[-1]
    assert prg.nontemporal_stores >= 1                  # the vectorized main loop's stores
    out = np.zeros(n + 16, np.float32)
    base = out.ctypes.data
    shift = next(s for s in range(1, 16) if (base + 4 * s) % 64)     # a misaligned start
    src_a, src_b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    prg(base + 4 * shift, src_a.ctypes.data, src_b.ctypes.data, lo=0, hi=n)
    np.testing.assert_allclose(out[shift:shift + n], np.exp2(a * b + 1), rtol=1e-6)
    odd = n - 5                                                 # not a multiple of 16: plain stores
    np.testing.assert_allclose((Tensor(a[:odd]) * Tensor(b[:odd]) + 1).exp2().numpy(), np.exp2(a[:odd] * b[:odd] + 1), rtol=1e-6)


# ------------------------------------------------------------------ index arithmetic for every sign

def test_flip_after_a_reshape_that_merges_axes(device):
    """The report's case: the index simplifier split the constant of (5 - i) // 3 so that the
    division saw a negative numerator at in-bounds positions, and LLVM/OPENCL truncated it."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(Tensor(a, device=device).reshape(6).flip(0).numpy(), a.reshape(6)[::-1])
    b = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    out = Tensor(b, device=device).reshape(12, 5).flip((0, 1)).reshape(6, 10).flip(1).pad(((1, 0), (0, 2)))
    ref = np.pad(b.reshape(12, 5)[::-1, ::-1].reshape(6, 10)[:, ::-1], ((1, 0), (0, 2)))
    np.testing.assert_array_equal(out.numpy(), ref)


def test_division_numerators_are_kept_non_negative():
    from eqgrad.lower.symbolic import Div, Mod
    i = Lin.var("i", 6)
    for x in ((Lin.num(5) - i) // 3, (Lin.num(2) - i * 2) // 4, (i * -1 + 1) % 3, (Lin.num(7) - i) // 2 * 5):
        atoms = [a for a, _ in x.terms if isinstance(a, (Div, Mod))]
        assert atoms and all(a.x.bounds[0] >= 0 for a in atoms), x
    x = (Lin.num(5) - i) // 3          # and the value is still the floor division
    (atom, coef), = x.terms
    for v in range(6):
        n = sum(c * v for _, c in atom.x.terms) + atom.x.const
        assert n // 3 * coef + x.const == (5 - v) // 3


def _floor_div_kernel(n: int, c: int, d: int):
    """Loop IR by hand: out[i] = in[(i - c) // d + off] * 16 + in[(i - c) % d + d], index division
    WITHOUT the NONNEG mark, over numerators from -c to n-1-c (in = arange, so out encodes both)."""
    from eqgrad.dtype import int32
    from eqgrad.graph.loopir import LInst, LoopKernel
    off = -((-c) // d)
    ix = "index"
    insts = [LInst("PARAM", int32, (), 0), LInst("PARAM", int32, (), 1), LInst("RANGE", ix, (), n),
             LInst("CONST", ix, (), -c), LInst("ADD", ix, (2, 3)), LInst("CONST", ix, (), d),
             LInst("IDIV", ix, (4, 5)), LInst("MOD", ix, (4, 5)), LInst("CONST", ix, (), off),
             LInst("ADD", ix, (6, 8)), LInst("LOAD", int32, (1, 9)), LInst("ADD", ix, (7, 5)),
             LInst("LOAD", int32, (1, 11)), LInst("CONST", int32, (), 16), LInst("MUL", int32, (10, 13)),
             LInst("ADD", int32, (14, 12)), LInst("STORE", None, (0, 2, 15)), LInst("ENDRANGE", None, (2,))]
    lk = LoopKernel("eqk", [("b1", int32, True), ("b0", int32, False)], insts, parallel=1)
    ref = np.array([((i - c) // d + off) * 16 + (i - c) % d + d for i in range(n)], np.int32)
    return lk, ref


@pytest.mark.parametrize("c,d", [(7, 3), (13, 4), (1, 7)])
def test_index_division_is_floor_division_on_every_device(device, monkeypatch, c, d):
    """An index IDIV/MOD without the NONNEG mark is floor division on every device (and in the
    loop-IR interpreter), whatever the numerator's sign."""
    from eqgrad.devices import Buffer, get_device
    from eqgrad.graph import interp
    from eqgrad.lower import lowering
    n = 20
    lk, ref = _floor_div_kernel(n, c, d)
    out = np.zeros(n, np.int32)
    interp.run_loop(lk, [out, np.arange(n, dtype=np.int32)])
    np.testing.assert_array_equal(out, ref)
    if device == "NUMPY":
        return                           # no loop IR on the NumPy device
    x = Tensor(np.arange(n, dtype=np.int32), device=device)
    cp, _ = engine.plan_for([(x + 1).lazydata])
    monkeypatch.setattr(lowering, "lower_kernel", lambda k, plan, upcast=None, options=None: _floor_div_kernel(n, c, d)[0])
    bufs = [Buffer.from_numpy(np.arange(n, dtype=np.int32), device), Buffer.empty((n,), eqgrad.int32, device)]
    get_device(device).prepare(cp.plan)(bufs)
    np.testing.assert_array_equal(bufs[1].numpy(), ref)


def test_index_floor_division_renders_as_cuda_c():
    from eqgrad.devices.cuda import CUDARenderer, compile_ptx, nvcc
    from eqgrad.devices.opencl import OpenCLRenderer
    lk, _ = _floor_div_kernel(20, 7, 3)
    for src in (CUDARenderer().render(lk), OpenCLRenderer().render(lk)):
        assert "floordiv_idx(" in src and "floormod_idx(" in src
    if nvcc() is not None:
        assert ".entry" in compile_ptx(CUDARenderer().render(lk))
    lk.insts[6] = lk.insts[6].__class__("IDIV", "index", (4, 5), "nonneg")
    assert "floordiv_idx(" not in CUDARenderer().render(lk)     # proven non-negative: plain C division


def test_negative_numerators_are_still_right(device, monkeypatch):
    """With the old constant split (negative numerators at in-bounds positions), the lowering
    sees the negative bounds and every renderer emits floor division: still the right answer."""
    from eqgrad.lower import symbolic
    monkeypatch.setattr(symbolic, "_split_constant", lambda const, rest_lo, d: divmod(const, d))
    engine.clear_cache()
    try:
        b = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
        out = Tensor(b, device=device).reshape(12, 5).flip((0, 1)).reshape(6, 10).flip(1) * 2
        np.testing.assert_array_equal(out.numpy(), b.reshape(12, 5)[::-1, ::-1].reshape(6, 10)[:, ::-1] * 2)
    finally:
        engine.clear_cache()


# ------------------------------------------------------------------ honest blame

def _flip_program(device: str = "LLVM") -> Tensor:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return Tensor(a, device=device).reshape(4, 3).flip(0) * 2 + 1


def test_validation_does_not_blame_rules_for_a_lowering_bug(monkeypatch):
    """A lowering bug (here: flips forgotten) made a sound fusion rule look guilty, because the
    plan without it happened not to hit the bug. The same plan is right on the NUMPY device, so
    the error says the rules are innocent instead of naming them."""
    from eqgrad.lower import lowering
    real = lowering.Lowerer.move_index
    monkeypatch.setattr(lowering.Lowerer, "move_index",
                        lambda self, n, idx: idx if n.op == "FLIP" else real(self, n, idx))
    engine.clear_cache()
    try:
        with eqgrad.Context(VALIDATE=1), pytest.raises(engine.ValidationError) as e:
            _flip_program().realize()
    finally:
        engine.clear_cache()
    msg = str(e.value)
    assert "the mismatch is not caused by a rule: lowering or device" in msg
    assert "same plan is right on the NUMPY reference device" in msg
    assert "rules whose removal alone fixes it" not in msg


def test_validation_without_a_guilty_rule_says_so(monkeypatch):
    """When every plan is wrong, the rule-free one included, no rule is named either."""
    from eqgrad.devices import numpy_device
    real = numpy_device.run_kernel

    def broken(k, bufs):              # the NUMPY device computes every kernel wrong, the reference does not
        return real(k, bufs) + 1
    monkeypatch.setattr(numpy_device, "run_kernel", broken)
    engine.clear_cache()
    try:
        with eqgrad.Context(VALIDATE=1), pytest.raises(engine.ValidationError) as e:
            _flip_program("NUMPY").realize()
    finally:
        engine.clear_cache()
    msg = str(e.value)
    assert "the mismatch is not caused by a rule: lowering or device (the plan without any rule differs" in msg
    assert "rules whose removal alone fixes it" not in msg


def test_validation_accepts_the_rounding_noise_of_a_cancelled_sum():
    """A sum of terms of size ~1000 that cancels to 0 (x minus its row mean, summed) is rounding
    noise of the terms' size (~1e-2 here) in any order of evaluation: the validator compared it
    with an absolute tolerance scaled by the result's own size and blamed LLVM's lowering for it
    (and a Linear bias's gradient before a batch norm, 0 in exact arithmetic, failed
    test_containers_name_tensors_as_torch for 2 of 60 torch seeds). Each element's tolerance now
    scales with what was summed into it (``run_program_magnitudes``)."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((64, 1000)) * 1000).astype(np.float32)
    with eqgrad.Context(VALIDATE=1):
        t = Tensor(a)
        got = (t - t.mean(1, keepdim=True)).sum(1).numpy()
    assert np.abs(got).max() < 1e-7 * np.abs(a).sum(1).max()


def test_validation_tolerance_scales_with_the_summed_terms_only():
    """The widened tolerance is the terms' size times the same 1e-5 as before, element by element:
    an error well above rounding (1e-3 of the terms) is still reported, and an element whose terms
    are small keeps the tight tolerance even when another element's are large."""
    from eqgrad.engine.validate import _checker
    from eqgrad.graph.interp import run_program_magnitudes
    from eqgrad.graph.program import linearize
    a = np.array([[1000.0, -1000.0, 0.5], [1e-3, 2e-3, -3e-3]], dtype=np.float32)
    t = Tensor(a).sum(1)
    prog = linearize([t.lazydata])
    refs, mags = run_program_magnitudes(prog)
    np.testing.assert_allclose(mags[0].reshape(-1), np.abs(a).sum(1), rtol=1e-6)
    ok = refs[0] + np.array([1e-2, 0.0], dtype=np.float32).reshape(refs[0].shape)
    check = _checker([t.lazydata], prog, refs)
    assert not check([ok])
    for bad in ([3.0, 0.0], [0.0, 1e-4]):
        off = refs[0] + np.array(bad, dtype=np.float32).reshape(refs[0].shape)
        assert check([off])


def test_validation_accepts_either_answer_of_a_comparison_within_rounding_of_a_tie():
    """``x < s`` where ``x = max(y, s)`` was realized by an earlier plan and this one sums ``s``
    again: the device's ``s`` agrees with the one ``x`` was made from (so ``x < s`` is False), the
    reference's rounds an ulp lower (True) -- the fuzzer's seed 1205002 on OPENCL raised a
    ValidationError for a right answer. Elements that depend on a comparison of floats within
    rounding of a tie (``run_program_ties``) may go either way; a comparison far from a tie, and
    everything else, is still checked."""
    from eqgrad.engine.validate import _checker
    from eqgrad.graph.interp import run_program_ties
    from eqgrad.graph.program import linearize
    v = np.array([[0.1, 0.7, 0.2], [0.3, 0.4, 0.9]], dtype=np.float32)
    s = float(np.sum(v.astype(np.float64)))
    x = np.array([[s, 5.0, s], [-1.0, s, 7.0]], dtype=np.float32)   # max(y, s): s where y < s
    lt = Tensor(x) < Tensor(v).sum()
    prog = linearize([lt.lazydata])
    refs, _, ties = run_program_ties(prog)
    assert ties[0].reshape(2, 3).tolist() == [[True, False, True], [False, True, False]]
    check = _checker([lt.lazydata], prog, refs)
    flipped = refs[0].copy()
    flipped.reshape(-1)[[0, 2, 4]] = ~flipped.reshape(-1)[[0, 2, 4]]
    assert not check([flipped])                    # the near ties, either way
    wrong = refs[0].copy()
    wrong.reshape(-1)[3] = ~wrong.reshape(-1)[3]   # -1 < s: far from a tie
    assert check([wrong])
    # through the ops after it: a select by the comparison may pick either branch there
    w = (Tensor(x) < Tensor(v).sum()).where(Tensor(x), 0.0).sum(1)
    prog = linearize([w.lazydata])
    refs, _, ties = run_program_ties(prog)
    assert ties[0].reshape(-1).tolist() == [True, True]
    # and the fuzzer's program, validated end to end on every device here
    from eqgrad.tools.fuzz import F, Program, check_program
    steps = [("sum_all", (0,), None), ("add", (1, 1), None), ("sub", (2, 1), None), ("add", (3, 0), None),
             ("sub", (4, 0), None), ("add", (5, 0), None), ("add", (6, 0), None), ("add", (7, 1), None),
             ("maximum", (8, 1), None), ("lt", (9, 1), None), ("maximum", (10, 0), None)]
    prog = Program([((4, 3), F)], steps)
    with eqgrad.Context(VALIDATE=1):
        for device in DEVICES:
            assert check_program(prog, device, plans=("inline",)) is None


def test_validation_accepts_any_nan_payload_in_the_bits_of_computed_floats():
    """An arithmetic NaN's payload is the hardware's (NVIDIA GPUs give 0x7fffffff, x86 keeps the
    operand's): where the reference bitcast holds a NaN any NaN's bits are right, and every other
    element, a NaN against a number included, must still match bit for bit."""
    from eqgrad.engine.validate import _checker
    from eqgrad.graph.interp import run_program
    from eqgrad.graph.program import linearize
    for name, itype, canonical in (("float32", np.int32, 0x7FFFFFFF), ("float64", np.int64, 2 ** 63 - 1),
                                   ("bfloat16", np.int16, 0x7FFF)):
        x = Tensor(np.array([1.5, np.nan, -2.0], dtype=np.float32), dtype=name)
        t = (x * 2.0).bitcast(itype)
        prog = linearize([t.lazydata])
        refs = run_program(prog)
        check = _checker([t.lazydata], prog, refs)
        assert not check([refs[0].copy()])
        other = refs[0].copy()
        other[1] = canonical
        assert other[1] != refs[0][1]           # another NaN's bits
        assert not check([other])
        not_nan = refs[0].copy()
        not_nan[1] = refs[0][0]
        assert check([not_nan])
        off_by_one = refs[0].copy()
        off_by_one[2] += 1
        assert check([off_by_one])


def test_index_expressions_are_interned_and_released_between_lowerings(monkeypatch):
    """Equal index expressions are one object (equality and hashing are identity, in C); the table
    is emptied only between lowerings, and a kernel lowers to the same loop IR before and after."""
    from eqgrad.lower import symbolic
    from eqgrad.lower.symbolic import Div, Var
    a = Lin.var("r0", 8) * 4 + Lin.var("r1", 4)
    b = Lin.var("r1", 4) + Lin.var("r0", 8) * 4
    assert a is b and (a // 4) is (b // 4) and (a // 4) is Lin.var("r0", 8)
    assert Div(a, 3) is Div(b, 3) and Var("r0", 0, 7) is Var("r0", 0, 7)
    assert Lin.num(5) is Lin((), 5)
    x = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4)).permute(2, 0, 1).reshape(4, 6) * 2
    x.realize()
    k, plan = engine.last_plan.plan.kernels[-1], engine.last_plan.plan
    before = str(lower_kernel(k, plan))
    with symbolic.lowering():                  # inside a lowering nothing is released ...
        monkeypatch.setattr(symbolic, "INTERN_MAX", 0)
        with symbolic.lowering():
            pass
        assert a is Lin.var("r0", 8) * 4 + Lin.var("r1", 4)
    assert Lin.var("r0", 8) * 4 + Lin.var("r1", 4) is not a      # ... and after the last, it is
    assert Lin.num(5) is Lin((), 5)                                # (the small constants stay)
    assert str(lower_kernel(k, plan)) == before


def _split_clock(monkeypatch, ran: list[str], one_cost, split_cost):
    """The LLVM device with a clock for ``launch``'s split probes: a program (weak-referenceable, as
    launch keys its probes) whose run costs ``one_cost()``, a split run ``split_cost()``, each
    appended to ``ran``; and a kernel predicted between SPLIT_FLOOR and SPLIT_SURE (probed)."""
    import eqgrad.devices.cpu as cpu
    from eqgrad.devices import get_device
    dev = get_device("LLVM")
    now = [0.0]

    class Prg:
        nontemporal = False

        def __call__(self, *ptrs, lo, hi):
            now[0] += one_cost()
            ran.append("one")

    def split_run(prg, ptrs, n, threads):
        now[0] += split_cost()
        ran.append("split")

    class K:
        predicted = (cpu.SPLIT_FLOOR + cpu.SPLIT_SURE) / 2
    monkeypatch.setattr(cpu.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(dev, "_split_run", split_run)
    monkeypatch.setattr(cpu, "PARALLEL_MIN", None)
    return dev, Prg, K


def test_the_thread_split_is_probed_one_thread_first_then_split(monkeypatch):
    """``LLVMDevice.launch`` times a kernel's first SPLIT_PROBES runs, one thread first and then
    split, and keeps the faster. Probed in turn, each one-thread run came right after a split one
    that had left half the output in the other core's cache and ran ~6x slower than it does
    steadily, so the split won where one thread was 4x faster (a 256K-element multiply on a
    2-vCPU VM). Modelled here with a clock: one-thread runs cost 1 (6 right after a split run),
    split runs 2. The threads a split run uses are made before the first probe, untimed
    (``start_threads``): a first split probe that compiled and started the native workers took
    42.7 ms where split runs take 12.5 and one thread 18.8, and the kernel stayed on one thread."""
    import eqgrad.devices.cpu as cpu
    ran: list[str] = []
    dev, Prg, K = _split_clock(monkeypatch, ran, lambda: 6.0 if ran and ran[-1] == "split" else 1.0, lambda: 2.0)
    monkeypatch.setattr(dev, "start_threads", lambda threads: ran.append(f"start {threads}"))
    prg = Prg()
    for _ in range(cpu.SPLIT_PROBES + 3):
        dev.launch(K(), prg, [], 1024, 2)
    assert ran[0] == "start 2"
    ran = ran[1:]
    half = cpu.SPLIT_PROBES // 2
    assert ran[:cpu.SPLIT_PROBES] == ["one"] * half + ["split"] * (cpu.SPLIT_PROBES - half)
    assert ran[cpu.SPLIT_PROBES:] == ["one"] * 3, ran


def test_the_thread_split_is_timed_again_at_runs_16_64_256_and_switches_where_the_other_way_is_faster(monkeypatch):
    """A split probe that the other vCPU's work slowed (a hypervisor's steal, a compile on the other
    core) kept attention as one kernel on one thread for the whole process: 14.0 ms a run against
    7.3-8.7 split (bench_core, 2-vCPU Zen 4, 3 runs of 4). From run ``SPLIT_RECHECK`` (16) on, at
    every power of 4, the way not chosen runs twice, timed, and the faster way is kept from then on.
    Modelled with a clock: one-thread runs cost 3; split runs 10 while the other core is busy (the
    probes), 2 after. And where the probes were right, the rechecks only confirm them."""
    import eqgrad.devices.cpu as cpu
    ran: list[str] = []
    busy = [True]
    dev, Prg, K = _split_clock(monkeypatch, ran, lambda: 3.0, lambda: 10.0 if busy[0] else 2.0)
    monkeypatch.setattr(dev, "start_threads", lambda threads: None)
    prg = Prg()
    for _ in range(cpu.SPLIT_PROBES):
        dev.launch(K(), prg, [], 1024, 2)
    busy[0] = False                  # the other core is free again
    for _ in range(cpu.SPLIT_RECHECK - cpu.SPLIT_PROBES + 3):
        dev.launch(K(), prg, [], 1024, 2)
    half = cpu.SPLIT_PROBES // 2
    assert ran[:cpu.SPLIT_PROBES] == ["one"] * half + ["split"] * half
    kept = ran[cpu.SPLIT_PROBES:cpu.SPLIT_PROBES + cpu.SPLIT_RECHECK - cpu.SPLIT_PROBES]
    assert kept == ["one"] * len(kept), ran                      # one thread, as the probes said
    assert ran[cpu.SPLIT_RECHECK:cpu.SPLIT_RECHECK + 2] == ["split", "split"], ran   # run 16: split again
    assert ran[cpu.SPLIT_RECHECK + 2:] == ["split"] * 2, ran     # and kept
    # probes that were right: the recheck at run 64 times one thread twice and keeps the split
    ran.clear()
    prg2 = Prg()
    for _ in range(70):
        dev.launch(K(), prg2, [], 1024, 2)
    assert ran.count("one") == half + 2 + 2 and ran[-1] == "split", ran   # probes, then runs 16 and 64


def test_start_threads_makes_the_split_runs_threads():
    """``LLVMDevice.start_threads`` leaves the threads a split run takes running: the native
    workers where the platform has them, else the Python pool's threads."""
    from eqgrad.devices import get_device, spin
    dev = get_device("LLVM")
    dev.start_threads(2)
    if spin.available():
        w = spin.workers(2)
        assert w is not None and len(w._threads) == 1
    else:
        assert len(dev.pool(2)._threads) == 1


def test_a_copy_read_a_page_apart_is_lowered_in_cache_line_blocks():
    """The cache-blocks pass: NCHW to NHWC of a (32, 64, 32, 32) tensor reads the input 4 KB apart
    along the output's last axis (the channels): its loops run over blocks of 16 columns x 16
    channels (a 64-byte line of each), and the copy is NumPy's. Not with a stride under a page
    ((32, 32, 32, 64) to NCHW: 256 bytes), not where the copy computes too, not below a core's
    private cache."""
    from eqgrad.lower import passes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64, 32, 32)).astype(np.float32)

    def kernel(t):
        (k,) = eqgrad.explain(t).plan.kernels
        return k
    y = Tensor(x).permute(0, 2, 3, 1).contiguous()
    assert passes.schedule_kernel(kernel(y)).blocks == ((2, 16), (3, 16))
    np.testing.assert_array_equal(y.numpy(), x.transpose(0, 2, 3, 1))
    z = rng.standard_normal((32, 32, 32, 64)).astype(np.float32)
    assert passes.schedule_kernel(kernel(Tensor(z).permute(0, 3, 1, 2).contiguous())).blocks == ()
    assert passes.schedule_kernel(kernel((Tensor(x).permute(0, 2, 3, 1) * 2).contiguous())).blocks == ()
    assert passes.schedule_kernel(kernel(Tensor(x[:2]).permute(0, 2, 3, 1).contiguous())).blocks == ()


def test_a_cache_block_is_copied_through_a_local_array():
    """A copy in cache blocks reads each block's source rows whole into a local array, then writes
    the block's output rows from it (``Lowerer._block_tile``): one array of a block's elements,
    declared inside the loops over the blocks, which are the kernel's only parallel loops. A device
    whose threads keep no local arrays (a GPU's work-items: ``LowerOptions.block_tile``) reads the
    source straight, its inner loops parallel too. Transposes of power-of-two and other sizes
    (read straight, a 1024 x 1024 transpose's block fell in one L1 set: 2.9 ns an element on one
    thread, 0.37 through the array), float32, float16 and int8, and NCHW to NHWC: the loop-IR
    interpreter's numbers (small copies, the pass's thresholds lowered) and the LLVM device's are
    NumPy's."""
    from dataclasses import replace
    from eqgrad.graph import interp
    from eqgrad.lower import passes
    from eqgrad.lower.passes import LowerOptions
    rng = np.random.default_rng(1)
    low = LowerOptions(block_bytes=0, block_stride=64)

    def lowered(t, options):
        plan = eqgrad.explain(t).plan
        (k,) = plan.kernels
        return lower_kernel(k, plan, options=options), plan

    # (blocks of a cache line's elements on each axis: 16 float32s, 32 float16s, 64 int8s)
    cases = [((48, 32), (1, 0), np.float32), ((64, 96), (1, 0), np.float16), ((128, 192), (1, 0), np.int8),
             ((2, 32, 4, 32), (0, 2, 3, 1), np.float32)]
    for shape, perm, dt in cases:
        x = (rng.standard_normal(shape) * 50).astype(dt)
        t = Tensor(x).permute(*perm).contiguous()
        want = x.transpose(perm)
        lk, plan = lowered(t, low)
        locals_ = [i for i in lk.insts if i.op == "DEFLOCAL"]
        line = 64 // np.dtype(dt).itemsize
        assert len(locals_) == 1 and locals_[0].arg == line * line, (shape, [str(i) for i in locals_])
        ranges = [j for j, i in enumerate(lk.insts) if i.op == "RANGE"]
        first_local = lk.insts.index(locals_[0])
        assert lk.parallel == sum(1 for j in ranges if j < first_local) >= 2, shape
        out = np.zeros(want.size, want.dtype)
        interp.run_loop(lk, [out, np.ascontiguousarray(x).reshape(-1)])
        np.testing.assert_array_equal(out.reshape(want.shape), want, err_msg=str(shape))
        straight, _ = lowered(t, replace(low, block_tile=False))
        assert not any(i.op == "DEFLOCAL" for i in straight.insts)
        assert straight.parallel == sum(1 for i in straight.insts if i.op == "RANGE")      # every loop
    for shape, perm in (((1024, 1024), (1, 0)), ((1040, 1024), (1, 0)), ((512, 2048), (1, 0)),
                        ((8, 64, 32, 32), (0, 2, 3, 1))):
        # (the pass blocks copies larger than a core's private cache: the first axis grown past this
        # host's -- an Intel Xeon's 2 MiB L2 held the (8, 64, 32, 32) copy whole)
        shape = (shape[0] * (passes._private_cache() // (int(np.prod(shape)) * 4) + 1),) + shape[1:]
        x = rng.standard_normal(shape).astype(np.float32)
        t = Tensor(x).permute(*perm).contiguous()
        (k,) = eqgrad.explain(t).plan.kernels
        assert passes.schedule_kernel(k).blocks, shape
        np.testing.assert_array_equal(t.numpy(), x.transpose(perm), err_msg=str(shape))
