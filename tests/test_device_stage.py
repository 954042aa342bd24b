"""The device's rewrites as a named stage (Device.rewrite -> DevicePlan): what the LLVM device does to
an extracted plan before it lowers it -- full reductions split into parallel partials, contractions
handed to the BLAS with the ops after them split off -- is one step with a line per rewrite, shown
by explain() and DEBUG=3, and the plan it runs is the one it describes."""
import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.devices import DevicePlan, blas, get_device
from conftest import blas_always_pays

rng = np.random.default_rng(0)


def _t(*shape, device="LLVM"):
    return Tensor(rng.standard_normal(shape).astype(np.float32), device=device)


def test_a_full_sum_is_split_into_partials_on_two_threads(monkeypatch, capsys):
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    x = _t(2048, 1024)
    s = x.sum()
    ex = eqgrad.explain(s)
    dp = ex.device_plan()
    assert isinstance(dp, DevicePlan) and len(dp.plan.kernels) == len(ex.plan.kernels) + 1
    assert len(dp.scratch) == 1 and "parallel partials" in dp.notes[0]
    assert "device stage (LLVM): 1 rewrite(s), 2 kernel(s) run" in str(ex)
    np.testing.assert_allclose(s.numpy(), x.numpy().astype(np.float64).sum(), rtol=1e-4)
    monkeypatch.setenv("DEBUG", "3")
    capsys.readouterr()
    y = _t(1024, 2048)                     # planned and prepared under DEBUG=3
    np.testing.assert_allclose(y.sum().numpy(), y.numpy().astype(np.float64).sum(), rtol=1e-4)
    assert "device stage (LLVM): 1 rewrite(s)" in capsys.readouterr().out


def test_a_reduction_whose_output_loop_is_too_short_to_share_is_split_into_partials(monkeypatch):
    """lower/passes.py SplitReductions: a sum to 3 values of 0.5M elements each -- an outer loop of 3
    iterations on 2 threads -- is split along its first reduced axis into 64 partials of the 3 values,
    the partials' axis outermost (the loop the threads share), and a final sum of them."""
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    x = _t(3, 512, 1024)
    s = x.sum((1, 2))
    dp = eqgrad.explain(s).device_plan()
    assert len(dp.plan.kernels) == 2 and [list(sh) for sh, _ in dp.scratch] == [[64, 3, 1, 1]], dp.notes
    assert "parallel partials" in dp.notes[0]
    np.testing.assert_allclose(s.numpy(), x.numpy().astype(np.float64).sum((1, 2)), rtol=1e-4)


def test_a_convolution_weight_gradient_is_split_and_matches_numpy(monkeypatch):
    """A 3 x 3 convolution's weight gradient over 32 images of 32 x 32 reduces to 432 values, whose
    outer loop (3 kernel rows) the threads could not share: its partials over the batch run on both
    (490-570 us on one thread, 230 us split, on a 2-vCPU Xeon); the gradient is NumPy's."""
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    import eqgrad.nn.functional as F
    x, g = _t(32, 3, 32, 32), _t(32, 16, 32, 32)
    w = Tensor(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), requires_grad=True)
    (F.conv2d(x, w, padding=1) * g).sum().backward()
    dp = eqgrad.explain(w.grad).device_plan()
    assert any("parallel partials" in n and "(3, 3, 1, 3, 16)" in n for n in dp.notes), dp.notes
    # the partials are still a contraction with lanes, as the plan kernel was priced (the split's
    # reshape is below the product, lower/split.py)
    from eqgrad.lower.classify import classify
    (part,) = [k for k in dp.plan.kernels if k.name.endswith("a")]
    assert part.kind == ("contraction",) and classify(part, blas=True).contraction == "lanes"
    xp = np.pad(x.numpy().astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.stack([np.stack([np.einsum("nohw,nchw->oc", g.numpy(), xp[:, :, i:i + 32, j:j + 32])
                               for j in range(3)], -1) for i in range(3)], -2)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-4, atol=1e-3)


def test_a_balanced_batch_of_products_is_left_to_its_outer_loop(monkeypatch):
    """Two 512 x 512 products have an outer loop of 2 on 2 threads, and 64 partials of their 2 x 512 x
    512 outputs would write a quarter of what they reduce (``SPLIT_WORK``): not split."""
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    a, b = _t(2, 512, 512), _t(2, 512, 512)
    dp = eqgrad.explain(a @ b).device_plan()
    assert not any("partials" in n for n in dp.notes) and dp.scratch == [], dp.notes


def test_one_thread_and_no_blas_leave_the_plan_as_extracted(monkeypatch):
    monkeypatch.setenv("EQGRAD_THREADS", "1")
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    ex = eqgrad.explain(_t(2048, 1024).sum())
    dp = ex.device_plan()
    assert dp.plan is ex.plan and dp.notes == [] and dp.scratch == []
    assert "device stage (LLVM): the plan as extracted" in str(ex)


def test_a_contraction_with_an_epilogue_goes_to_the_blas_in_its_own_kernel(monkeypatch):
    """Whether a contraction pays on the BLAS is measured on the machine; here it always does (as
    tests/test_blas.py's fixture), so the test does not depend on the host's speed."""
    if blas.blas() is None:
        pytest.skip("no BLAS library found")
    monkeypatch.setenv("EQGRAD_BLAS", "1")
    blas_always_pays(monkeypatch)
    a, b = _t(256, 256), _t(256, 256)
    y = (a @ b).relu()
    dp = eqgrad.explain(y).device_plan()
    assert any("to the BLAS" in n and "split off" in n for n in dp.notes), dp.notes
    assert len(dp.plan.kernels) == 2
    np.testing.assert_allclose(y.numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["NUMPY"])
def test_devices_without_rewrites_describe_the_plan_as_extracted(device):
    ex = eqgrad.explain(_t(64, 64, device=device).sum())
    assert get_device(device).rewrite(ex.plan).plan is ex.plan
    assert f"device stage ({device}): the plan as extracted" in str(ex)


@pytest.mark.parametrize("what", ["pure", "epilogue", "full_sum"])
def test_every_kernel_the_device_runs_keeps_the_kind_it_was_predicted_as(what, monkeypatch):
    """A kernel the device stage rewrites -- a GEMM alone (with its operands packed), a GEMM and
    the ops after it, a sum split into partials -- runs as pieces that each keep the plan kernel's
    kind (graph/plan.py KERNEL_KINDS): the cost model's check reads it from the kernels the device
    runs, and a pure GEMM handed to the BLAS once lost it (bench_model then took BERT's projections
    for plain kernels)."""
    from eqgrad.lower.contraction import find_contraction
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    if what != "full_sum":
        if blas.blas() is None:
            pytest.skip("no BLAS library found")
        monkeypatch.setenv("EQGRAD_BLAS", "1")
        blas_always_pays(monkeypatch)
    a, b = _t(256, 192), _t(192, 128)
    y = {"pure": lambda: a @ b, "epilogue": lambda: (a @ b).relu(), "full_sum": lambda: _t(2048, 1024).sum()}[what]()
    ex = eqgrad.explain(y)
    plan = ex.plan
    if what == "pure":          # run by the BLAS as it stands; its pieces where its operands are packed
        k = plan.kernels[0]
        pieces = get_device("LLVM").stage._blas_split(k, find_contraction(k.ast), len(plan.buffers))[0]
    else:
        dp = ex.device_plan()
        assert dp.plan is not plan, dp.notes               # the device rewrote the plan
        pieces = dp.plan.kernels
    kind = {k.name: k.kind for k in plan.kernels}
    assert any(kind.values()) or what == "full_sum", kind
    for k in pieces:
        base = next(n for n in kind if k.name.startswith(n) and k.name[len(n):].rstrip("0123456789") in ("", "a", "g", "p"))
        assert k.kind == kind[base], (k.name, k.kind, kind[base])


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_product_whose_operand_streams_across_the_lanes_is_packed_for_them(threads, monkeypatch):
    """``q @ k.T`` reads k along its rows, a head's width apart, on the axis the register lanes
    would run along: the lanes pass gives it none (a scalar dot product per score). The device packs
    k with that axis innermost first (lower/passes.py ``lane_pack``), and the product gets its
    lanes; the scores are NumPy's."""
    from eqgrad.lower.classify import classify
    monkeypatch.setenv("EQGRAD_THREADS", threads)
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    q, k = _t(4, 3, 64, 32), _t(4, 3, 64, 32)
    s = q @ k.transpose(-2, -1)
    ex = eqgrad.explain(s)
    assert classify(ex.plan.kernels[0]).lanes == ()            # as extracted: no lanes ...
    assert classify(ex.plan.kernels[0]).contraction == "lanes"  # ... which the stage's pack gives it
    dp = ex.device_plan()
    assert len(dp.plan.kernels) == 2 and [list(sh) for sh, _ in dp.scratch] == [[4, 3, 1, 32, 64]], dp.notes
    assert "packed" in dp.notes[0] and "unit stride" in dp.notes[0]
    pack, prod = dp.plan.kernels
    assert pack.out == prod.inputs[-1] and classify(prod).lanes != ()
    assert pack.kind == prod.kind == ex.plan.kernels[0].kind
    want = q.numpy() @ k.numpy().transpose(0, 1, 3, 2)
    np.testing.assert_allclose(s.numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_lane_pack_is_only_made_where_it_pays_and_gives_lanes():
    """No pack for a product that has its lanes already (``a @ b``), for one whose operand is read by
    fewer rows than the register block has (a decode step's one query over its keys: the pack would
    copy the keys to read them once), for one whose lanes' axis no lane width divides (15 keys: the
    packed product would have no lanes either), nor for a sum without a product."""
    from eqgrad.lower.passes import LowerOptions, lane_pack
    opts = LowerOptions()

    def body(t):
        return eqgrad.explain(t).plan.kernels[0].ast
    assert lane_pack(body(_t(4, 3, 64, 32) @ _t(4, 3, 64, 32).transpose(-2, -1)), opts) is not None
    assert lane_pack(body(_t(64, 32) @ _t(32, 64)), opts) is None
    assert lane_pack(body(_t(4, 3, 1, 32) @ _t(4, 3, 64, 32).transpose(-2, -1)), opts) is None
    assert lane_pack(body(_t(4, 3, 15, 32) @ _t(4, 3, 15, 32).transpose(-2, -1)), opts) is None
    assert lane_pack(body(_t(64, 32).sum(1)), opts) is None


@pytest.mark.parametrize("threads", ["1", "2"])
def test_attention_as_one_kernel_reads_a_packed_k_for_its_scores(threads, monkeypatch):
    """Attention as one kernel (under a memory bound) reads k along the keys a head dim apart; the
    device packs k with the keys innermost first (lower/passes.py ``row_pack``), and the kernel's
    scores are register blocks over the keys (``RowDots``); the output is NumPy's, with and without
    a causal mask. No pack where the keys are not a multiple of the lane width, nor for one query."""
    from eqgrad.lower.passes import LowerOptions, row_pack, schedule_kernel
    monkeypatch.setenv("EQGRAD_THREADS", threads)
    q, k, v = _t(1, 2, 64, 16), _t(1, 2, 64, 16), _t(1, 2, 64, 16)
    mask = Tensor(np.triu(np.full((64, 64), -np.inf, np.float32), 1), device="LLVM")
    for m in (None, mask):
        s = q @ k.transpose(-2, -1) * 0.25
        o = (s if m is None else s + m).softmax(-1) @ v
        with eqgrad.Context(PEAK_MEMORY=4 * 64 * 32):
            ex = eqgrad.explain(o)
            dp = ex.device_plan()
            got = o.numpy()
        assert len(ex.plan.kernels) == 1 and len(dp.plan.kernels) == 2, dp.notes
        assert "row-fused kernel" in dp.notes[0] and [list(sh) for sh, _ in dp.scratch] == [[1, 2, 1, 16, 64]]
        pack, body = dp.plan.kernels
        assert pack.out in body.inputs and schedule_kernel(body).row_dots
        assert not schedule_kernel(ex.plan.kernels[0]).row_dots
        sn = q.numpy() @ k.numpy().transpose(0, 1, 3, 2) * 0.25 + (0 if m is None else m.numpy())
        p = np.exp(sn - sn.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-4, atol=1e-5)
    with eqgrad.Context(PEAK_MEMORY=4 * 60 * 32):
        odd = eqgrad.explain((_t(1, 2, 60, 16) @ _t(1, 2, 60, 16).transpose(-2, -1)).softmax(-1) @ _t(1, 2, 60, 16))
    assert row_pack(odd.plan.kernels[0].ast, LowerOptions()) is None
    # a decode step's one query reads each key once: packing k would copy it to read it once
    with eqgrad.Context(PEAK_MEMORY=4 * 1 * 32):
        one = eqgrad.explain((_t(1, 2, 1, 16) @ k.transpose(-2, -1)).softmax(-1) @ v)
    assert all(row_pack(kk.ast, LowerOptions()) is None for kk in one.plan.kernels)


def test_a_row_blocks_local_arrays_hold_its_rows_a_cache_line_off_the_page():
    """Attention as one kernel keeps its scores and probabilities for a block of query rows in local
    arrays, a row of 1,024 keys (4 KiB) each; rows a whole number of pages apart fall in one L1 set
    and alias in the store-to-load check (the row-fused gradient of q ran 1.4-1.7x slower on one
    thread), so each row starts a cache line later (lower/lowering.py ``row_pitch``): no array of
    several rows is a multiple of a page. The output is NumPy's."""
    from eqgrad.lower.lowering import lower_kernel
    from eqgrad.lower.passes import CACHE_LINE, PAGE, schedule_kernel
    q, k, v = _t(1, 1, 1024, 64), _t(1, 1, 1024, 64), _t(1, 1, 1024, 64)
    o = (q @ k.transpose(-2, -1) * 0.125).softmax(-1) @ v
    ex = eqgrad.explain(o)
    dp = ex.device_plan()
    body = [kk for kk in dp.plan.kernels if schedule_kernel(kk).row_stash]
    assert len(body) == 1 and dict(schedule_kernel(body[0]).lanes).get(2, 1) > 1, dp.notes
    rows = dict(schedule_kernel(body[0]).lanes)[2]
    arrays = [x.arg for x in lower_kernel(body[0], dp.plan).insts if x.op == "DEFLOCAL"]
    assert arrays and all(a == rows * (1024 + CACHE_LINE // 4) for a in arrays), arrays
    assert all(a * 4 % PAGE for a in arrays)
    sn = q.numpy() @ k.numpy().transpose(0, 1, 3, 2) * 0.125
    p = np.exp(sn - sn.max(-1, keepdims=True))
    np.testing.assert_allclose(o.numpy(), (p / p.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_attentions_bounded_backward_packs_each_operand_once_and_dq_writes_the_row_statistics(threads, monkeypatch):
    """Attention's backward under a memory bound: six kernels (the three row statistics, dq, dk,
    dv), each recomputing the scores inside its own reduction. The device runs the statistics in
    dq's kernel (lower/merge.py ``absorb_rows``): a row-fused kernel that computes each query row's
    scores and g . v once, as register blocks, reduces its max, sum and sum(p * dp) from them and
    writes them for dk and dv, which run as one kernel with two outputs. The device packs what they
    read a head dim apart -- k^T and v^T for the query rows, q^T and g^T for the key rows, and a
    causal mask's transpose for the key rows -- each once for the plan (dv reads the packs dk made);
    the gradients are NumPy's, with and without a causal mask."""
    from eqgrad.lower.lowering import lower_kernel
    from eqgrad.lower.passes import schedule_kernel
    monkeypatch.setenv("EQGRAD_THREADS", threads)
    s_, d = 64, 16
    a = [rng.standard_normal((1, 2, s_, d)).astype(np.float32) for _ in range(4)]
    mask = np.triu(np.full((s_, s_), -np.inf, np.float32), 1)
    for m in (None, mask):
        q, k, v = (Tensor(x, device="LLVM", requires_grad=True) for x in a[:3])
        sc = q @ k.transpose(-2, -1) * 0.25
        if m is not None:
            sc = sc + Tensor(m, device="LLVM")
        (sc.softmax(-1) @ v * Tensor(a[3], device="LLVM")).sum().backward()
        with eqgrad.Context(PEAK_MEMORY=4 * (3 * 2 * s_ * d + 3 * 2 * s_)):
            ex = eqgrad.explain(q.grad, k.grad, v.grad)
            dp = ex.device_plan()
            eqgrad.realize(q.grad, k.grad, v.grad)
        assert len(ex.plan.kernels) == 6
        # four packs (k^T, v^T, q^T, g^T), each made once, and the mask's transpose, which dk and dv
        # read along the queries
        packs = 4 if m is None else 5
        stats_dq, grads = [kk for kk in dp.plan.kernels if kk.also]
        assert stats_dq.name == "k3+k0+k1+k2" and len(stats_dq.also) == 3 and grads.name == "k4+k5", dp.notes
        assert any("row statistics" in n and "computed by k3" in n for n in dp.notes), dp.notes
        # dq's kernel: the statistics hoisted at its rows, the scores and g . v kept per row as
        # register blocks; dk and dv: a key row's scores and g . v as register blocks, p and ds over them
        sd = schedule_kernel(stats_dq)
        assert sd.hoist and len(sd.row_stash) == 3 and len(sd.row_dots) == 2, dp.notes
        assert len(schedule_kernel(grads).root_dots) == 2 and len(schedule_kernel(grads).root_rows) == 2
        # each statistic stored once a row of the row block (not once an output lane), in its own shape
        rows = dict(sd.lanes).get(2, 1)
        stores = [i.src[0] for i in lower_kernel(stats_dq, dp.plan).insts if i.op == "STORE"]
        assert rows > 1 and stores.count(0) == rows * d and all(stores.count(p) == rows for p in (1, 2, 3)), stores
        assert len(dp.scratch) == packs and len(dp.plan.kernels) == 2 + packs, dp.notes
        assert m is None or [s_, s_] in [list(sh) for sh, _ in dp.scratch]
        assert sum("an earlier kernel made" in n for n in dp.notes) == 1, dp.notes
        # explain() names them: a row-dots line for each of the two
        assert sorted(k for k, p, _ in ex.lowering(dp) if p == "row dots") == \
            sorted(kk.name for kk in dp.plan.kernels if kk.out < len(ex.plan.buffers))
        Q, K, V, G = (x.astype(np.float64) for x in a)
        sn = Q @ K.transpose(0, 1, 3, 2) * 0.25 + (0 if m is None else m)
        p = np.exp(sn - sn.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        dpn = G @ V.transpose(0, 1, 3, 2)
        ds = p * (dpn - (p * dpn).sum(-1, keepdims=True)) * 0.25
        for got, want in ((q.grad, ds @ K), (k.grad, ds.transpose(0, 1, 3, 2) @ Q), (v.grad, p.transpose(0, 1, 3, 2) @ G)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_row_statistics_stay_their_own_kernels_without_merging_or_where_the_reader_reads_them_elsewhere(monkeypatch):
    """``absorb_rows`` (lower/merge.py) only under EQGRAD_MERGE=1 (off: the whole gradient's
    statistics stay their own kernels), and only into a reader that reads the statistics at its own
    row: attention's dk and dv read a query row's statistics along their reduction over the
    queries, so with dq not wanted the statistics stay a kernel of their own."""
    s_, d = 64, 16
    a = [rng.standard_normal((1, 2, s_, d)).astype(np.float32) for _ in range(4)]
    for merge, want in (("0", "qkv"), ("1", "kv")):
        monkeypatch.setenv("EQGRAD_MERGE", merge)
        t = [Tensor(x, device="LLVM", requires_grad=n in want) for x, n in zip(a[:3], "qkv")]
        (((t[0] @ t[1].transpose(-2, -1) * 0.25).softmax(-1) @ t[2]) * Tensor(a[3], device="LLVM")).sum().backward()
        grads = [x.grad for x, n in zip(t, "qkv") if n in want]
        with eqgrad.Context(PEAK_MEMORY=4 * (len(want) * 2 * s_ * d + 3 * 2 * s_)):
            dp = eqgrad.explain(*grads).device_plan()
        assert not any("row statistics" in n for n in dp.notes), dp.notes
        assert not any(kk.also and len(kk.ast.src) > 1 and kk.ast.src[1].op == "EXPAND" for kk in dp.plan.kernels)


def test_the_blas_is_timed_against_the_packed_kernel(monkeypatch, capsys, tmp_path):
    """With the BLAS on, a batch of products the BLAS may run is timed against the generated kernel
    with its lane pack (what the device would run), and the faster is kept."""
    if blas.blas() is None:
        pytest.skip("no BLAS library found")
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))            # (no choice kept from before)
    monkeypatch.setattr(get_device("LLVM").stage, "_timed_here", set())
    engine.clear_cache()                                              # (nor a plan prepared before)
    monkeypatch.setenv("EQGRAD_BLAS", "1")
    monkeypatch.setenv("DEBUG", "2")
    monkeypatch.setattr(blas, "pays", lambda g, predicted, threads: None)      # (timed, whatever the sizes)
    q, k = _t(4, 3, 64, 32), _t(4, 3, 64, 32)
    s = q @ k.transpose(-2, -1)
    out = s.numpy()
    said = capsys.readouterr().out
    assert "generated (its operand packed for lanes)" in said, said
    np.testing.assert_allclose(out, q.numpy() @ k.numpy().transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)
