"""Lowering: symbolic index simplification, loop IR shape, and device agreement with the reference."""
import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.extract.plan import check_plan
from eqgrad.lower.lowering import lower_kernel
from eqgrad.lower.symbolic import Lin


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


@pytest.mark.parametrize("m,k,n,transposed", [(128, 2048, 128, False), (136, 1024, 256, True), (384, 4096, 80, False)])
def test_cache_tiled_matmul(m, k, n, transposed):
    """Large contractions get a tile loop: (tiles, column blocks, 8 row blocks, reduce); results
    match on sizes with partial tiles and on a transposed (non-contiguous) operand."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    tb = Tensor(b).T if transposed else Tensor(b)
    out = (Tensor(a) @ tb).numpy()
    np.testing.assert_allclose(out, a @ (b.T if transposed else b), rtol=1e-4, atol=1e-3)
    plan = engine.last_plan.plan
    lk = lower_kernel(plan.kernels[0], plan)
    ranges = [x.arg for x in lk.insts if x.op == "RANGE"]
    if not transposed:      # contiguous B: lanes 8x16, so m/8 row blocks in tiles of 8
        assert ranges[:3] == [m // 64, n // 16, 8], ranges


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
    with eqgrad.Context(BEAM=6, BEAM_TIME=5.0):
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


@pytest.mark.parametrize("n", [1, 7, 17, 31])
def test_threaded_kernels_on_odd_sizes(n):
    """Kernels split across threads give the reference's numbers on sizes that do not divide."""
    import eqgrad.devices.cpu as cpu
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3 * n + 1)).astype(np.float32)
    old = cpu.PARALLEL_MIN
    cpu.PARALLEL_MIN = -1.0        # split every kernel
    try:
        got = (Tensor(x).exp2().sum(1) + Tensor(x.T.copy()).max(0)).numpy()
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
def test_large_full_reductions_split_across_threads(what):
    """With threads, a large reduction to one value becomes parallel partials plus a final
    reduction (lower/split.py); with one thread it stays one kernel. Same results either way."""
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
