"""Kernels with several outputs: the LLVM device's stage runs sibling kernels as one
(devices/cpustage.py ``merge_siblings``; graph/plan.py ``GROUP``, ``Kernel.also``).

Siblings: one output shape, a buffer read in common, neither reading what the other writes, and
no kernel between them reading what the first writes. Each test checks the numbers against the
same program run with ``EQGRAD_MERGE=0`` (bit for bit: a GROUP's roots are lowered as they were
alone) and against NumPy or torch, and what the stage did."""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
import eqgrad.nn.functional as F
from eqgrad import GlobalCounters, Tensor, config, engine
from eqgrad.graph.plan import GROUP
from conftest import DEVICES

RNG = np.random.default_rng(1234)


def _t(*shape: int) -> Tensor:
    return Tensor(RNG.standard_normal(shape, dtype=np.float32)).realize()


def _run(make, merge: int) -> tuple[list[np.ndarray], list[str]]:
    """The outputs of ``make()`` realized together with EQGRAD_MERGE=``merge``, and the names of
    the kernels that ran."""
    with config.Context(MERGE=merge):
        outs = make()
        GlobalCounters.kernel_log = log = []
        try:
            eqgrad.realize(*outs)
        finally:
            GlobalCounters.kernel_log = None
        return [o.numpy() for o in outs], [e[0] for e in log]


def _both(make) -> tuple[list[np.ndarray], list[str], list[str]]:
    merged, names = _run(make, 1)
    alone, names0 = _run(make, 0)
    for a, b in zip(merged, alone):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    return merged, names, names0


def _layer_norm_backward(x: Tensor, w: Tensor, b: Tensor, dy: Tensor):
    """A program making d/dx, d/dw, d/db of sum(layer_norm(x, w, b) * dy), and a check of them
    against torch."""
    import torch
    n = x.shape[-1]

    def make():
        xs, ws, bs = x.detach().requires_grad_(), w.detach().requires_grad_(), b.detach().requires_grad_()
        (F.layer_norm(xs, (n,), ws, bs) * dy).sum().backward()
        return [xs.grad, ws.grad, bs.grad]

    def check(outs: list[np.ndarray], atol: float) -> None:
        tx, tw, tb = (torch.tensor(t.numpy(), requires_grad=True) for t in (x, w, b))
        (torch.nn.functional.layer_norm(tx, (n,), tw, tb) * torch.tensor(dy.numpy())).sum().backward()
        for got, want in zip(outs, (tx.grad, tw.grad, tb.grad)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=atol)
    return make, check


def _adam_update(g: Tensor, m: Tensor, v: Tensor, p: Tensor):
    """A program making an Adam-style update (m, v, then the parameter from them), and a check of
    the parameter against NumPy in float64."""
    def make():
        m2, v2 = m * 0.9 + g * 0.1, v * 0.999 + g * g * 0.001
        return [m2, v2, p - 0.01 * (m2 / 0.1) / ((v2 / 0.001).sqrt() + 1e-8)]

    def check(outs: list[np.ndarray]) -> None:
        G, M, V, P = (t.numpy().astype(np.float64) for t in (g, m, v, p))
        M2, V2 = M * 0.9 + G * 0.1, V * 0.999 + G * G * 0.001
        np.testing.assert_allclose(outs[2], P - 0.01 * (M2 / 0.1) / (np.sqrt(V2 / 0.001) + 1e-8), rtol=1e-5, atol=1e-5)
    return make, check


def test_siblings_that_read_a_buffer_in_common_run_as_one_kernel():
    g, m, v = _t(64, 48), _t(64, 48), _t(64, 48)
    (m2, v2), names, names0 = _both(lambda: [m * 0.9 + g * 0.1, v * 0.999 + g * g * 0.001])
    assert len(names) == 1 and "+" in names[0] and len(names0) == 2
    G, M, V = g.numpy(), m.numpy(), v.numpy()
    np.testing.assert_allclose(m2, M * np.float32(0.9) + G * np.float32(0.1), rtol=1e-6, atol=1e-6)  # (an FMA)
    np.testing.assert_allclose(v2, V * np.float32(0.999) + G * G * np.float32(0.001), rtol=1e-6, atol=1e-7)


def test_three_siblings_and_outputs_of_other_dtypes():
    g, a, b = _t(33, 17), _t(33, 17), _t(33, 17)
    outs, names, names0 = _both(lambda: [g * 2 + a, g > b, (g * b).cast(eqgrad.int32)])
    assert len(names) == 1 and names[0].count("+") == 2 and len(names0) == 3
    G, A, B = g.numpy(), a.numpy(), b.numpy()
    np.testing.assert_allclose(outs[0], G * 2 + A, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(outs[1], G > B)
    np.testing.assert_array_equal(outs[2], (G * B).astype(np.int32))


def test_a_kernel_that_reads_an_output_elsewhere_than_its_element_stays_apart():
    """The third value reads x through a row sum and y at its element: it may not take x's root
    in (x's value there is a whole row's), so it runs alone; x and y are siblings."""
    g, a = _t(40, 40), _t(40, 40)

    def make():
        x = g * 3 + a
        y = (g - a).exp2()
        return [x, y, x.sum(1, keepdim=True) + y, y.T * 2 + g]
    outs, names, names0 = _both(make)
    G, A = g.numpy(), a.numpy()
    X, Y = G * 3 + A, np.exp2(G - A)
    np.testing.assert_allclose(outs[2], X.sum(1, keepdims=True) + Y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(outs[3], Y.T * 2 + G, rtol=1e-6, atol=1e-6)
    assert len(names) == len(names0) - 1 and sum("+" in n for n in names) == 1, (names, names0)
    assert all(not k.also for k in engine.last_plan.plan.kernels)       # the extracted plan has none


def test_a_kernel_that_reads_its_siblings_outputs_at_its_element_takes_their_roots_in():
    """An Adam-style update: m and v are siblings (both read g), and the parameter's update reads m
    and v at its own element: one kernel computes m and v once, stores them, and uses them for p
    (its parameters: the three outputs, then what they read, never m or v)."""
    g, m, v, p = _t(64, 80), _t(64, 80), _t(64, 80), _t(64, 80)
    make, check = _adam_update(g, m, (v * v).realize(), p)
    outs, names, names0 = _both(make)
    assert len(names) == 1 and names[0].count("+") == 2 and len(names0) == 3
    check(outs)
    text = str(eqgrad.explain(*make()))
    assert "one kernel with 3 outputs" in text


def test_siblings_with_a_reader_of_the_first_between_them_stay_apart():
    """k0 writes x, k1 reads x transposed (so it cannot join k0), k2 reads what k0 read: k0 and k2
    cannot run as one kernel where k2 runs (k1 would read x before it is written)."""
    from eqgrad.devices import get_device
    from eqgrad.graph.plan import Kernel, KernelPlan, KNode
    from eqgrad.lower.passes import LowerOptions
    f32 = eqgrad.float32
    shape = (8, 16)

    def buf(i):
        return KNode("BUF", (), i, shape, f32)
    k0 = Kernel("k0", 2, KNode("ADD", (buf(0), buf(1)), None, shape, f32), (0, 1))
    k1 = Kernel("k1", 3, KNode("PERMUTE", (buf(2),), (1, 0), shape[::-1], f32), (2,))
    k2 = Kernel("k2", 4, KNode("MUL", (buf(0), buf(1)), None, shape, f32), (0, 1))
    k3 = Kernel("k3", 5, KNode("ADD", (buf(0), buf(0)), None, shape, f32), (0,))
    plan = KernelPlan([(shape, f32)] * 3 + [(shape[::-1], f32)] + [(shape, f32)] * 2, 2, [k0, k1, k2, k3], [3, 4, 5])
    stage = get_device("LLVM").stage
    notes: list[str] = []
    out = stage.merge_siblings(plan, LowerOptions(threads=2), notes)
    names = [k.name for k in out.kernels]
    # k0 cannot move past k1 (its reader); k2 and k3 are siblings (both read b0)
    assert names == ["k0", "k1", "k2+k3"], (names, notes)
    merged = out.kernels[2]
    assert merged.ast.op == GROUP and merged.out == 4 and merged.also == (5,) and merged.params == (4, 5, 0, 1)
    assert len(notes) == 1 and "k2, k3: one kernel with 2 outputs ((8, 16) each), their common reads done once " \
        "(512 bytes fewer)" in notes[0]      # b0 (8 x 16 floats) read once


def test_a_reduction_that_reads_a_siblings_row_value_inside_its_loop_takes_its_root_in():
    """A row's statistics as kernels of their own (attention's backward under a memory bound): k1
    sums exp2(x - m) over the row, reading the row's max m (k0's output) broadcast along its own
    loop -- at the element it computes: one kernel computes m and uses it. k2 reads m along its
    loop (m of every row, a reduction over rows): it stays apart. The merged kernel's numbers are
    NumPy's."""
    from eqgrad.devices import get_device
    from eqgrad.graph.plan import Kernel, KernelPlan, KNode
    from eqgrad.lower.passes import LowerOptions
    from eqgrad.lower.merge import _reads_at_its_index
    f32 = eqgrad.float32
    x = KNode("BUF", (), 0, (8, 16), f32)
    y = KNode("BUF", (), 1, (8, 8), f32)
    m = KNode("BUF", (), 2, (8, 1), f32)
    k0 = Kernel("k0", 2, KNode("RMAX", (x,), (1,), (8, 1), f32), (0,))
    e = KNode("EXP2", (KNode("ADD", (x, KNode("NEG", (KNode("EXPAND", (m,), (8, 16), (8, 16), f32),), None, (8, 16), f32)),
                             None, (8, 16), f32),), None, (8, 16), f32)
    k1 = Kernel("k1", 3, KNode("RSUM", (e,), (1,), (8, 1), f32), (0, 2))
    across = KNode("EXPAND", (KNode("RESHAPE", (m,), (1, 8), (1, 8), f32),), (8, 8), (8, 8), f32)
    k2 = Kernel("k2", 4, KNode("RSUM", (KNode("MUL", (y, across), None, (8, 8), f32),), (1,), (8, 1), f32), (1, 2))
    assert _reads_at_its_index(k1.ast, {2}) and not _reads_at_its_index(k2.ast, {2})
    plan = KernelPlan([((8, 16), f32), ((8, 8), f32)] + [((8, 1), f32)] * 3, 2, [k0, k1, k2], [2, 3, 4])
    notes: list[str] = []
    out = get_device("LLVM").stage.merge_siblings(plan, LowerOptions(threads=1), notes)
    assert [k.name for k in out.kernels] == ["k0+k1", "k2"], notes
    # the max is computed once a row, before the sum's loop, which reads it from a register: three
    # loops (the rows, the max's, the sum's), not the max's loop again inside the sum's
    from eqgrad.lower.lowering import lower_kernel
    lk = lower_kernel(out.kernels[0], out, options=LowerOptions(threads=1))
    assert sum(x.op == "RANGE" for x in lk.insts) == 3, str(lk)
    from eqgrad.devices import Buffer
    xs = RNG.standard_normal((8, 16)).astype(np.float32)
    ys = RNG.standard_normal((8, 8)).astype(np.float32)
    bufs = [Buffer.from_numpy(xs, "LLVM"), Buffer.from_numpy(ys, "LLVM")] + \
        [Buffer.empty((8, 1), f32, "LLVM") for _ in range(3)]
    get_device("LLVM").prepare(plan)(bufs)        # (the device's stage merges as above)
    mx = xs.max(1, keepdims=True)
    np.testing.assert_array_equal(bufs[2].numpy(), mx)
    np.testing.assert_allclose(bufs[3].numpy(), np.exp2(xs - mx).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(bufs[4].numpy(), ys @ mx, rtol=1e-5, atol=1e-5)


def test_layer_norm_backward_sums_its_weight_and_bias_gradients_in_one_kernel():
    """At (480, 384) the extracted plan sums dw = sum(dy * xhat) and db = sum(dy) over the rows in
    two kernels that both read dy (the default cost model; a smaller tensor gets another plan, whose
    dw reads a kernel's output instead, and no siblings)."""
    make, check = _layer_norm_backward(_t(480, 384), _t(384), _t(384), _t(480, 384))
    outs, names, names0 = _both(make)
    assert len(names) == len(names0) - 1
    check(outs, 1e-4)
    text = str(eqgrad.explain(*make()))
    assert "one kernel with 2 outputs" in text and "their common reads done once" in text


def test_a_merged_kernel_is_predicted_with_one_launch():
    """The merged kernel's prediction is one launch plus its members' bodies (less the bytes it
    does not move): it was the sum of the members' predictions, a launch per member, so three tiny
    siblings merged into one were predicted 10.8 us and ran in 3.9 (bench/bench_model.py)."""
    from eqgrad.extract import cost_model
    launch = cost_model("LLVM").params.launch
    g, m, v = _t(8, 64), _t(8, 64), _t(8, 64)

    def run(merge: int) -> list[tuple]:
        with config.Context(MERGE=merge):
            outs = [m * 0.5 + g, v - g * g]
            GlobalCounters.kernel_log = log = []
            try:
                eqgrad.realize(*outs)
            finally:
                GlobalCounters.kernel_log = None
        return log
    (merged,), alone = run(1), run(0)
    assert len(alone) == 2 and "+" in merged[0]
    assert engine.last_plan.plan.launch == launch
    bodies = sum(e[2] - launch for e in alone)
    assert bodies >= 0
    assert launch <= merged[2] <= launch + bodies * (1 + 1e-9), (merged[2], [e[2] for e in alone], launch)


@pytest.mark.parametrize("rows", [300, 3000])        # 3000: sums of more than 1024 values, summed in levels
def test_column_sums_of_one_tensor_share_its_reads(rows):
    x, y = _t(rows, 48), _t(rows, 48)
    outs, names, names0 = _both(lambda: [x.sum(0), (x * y).sum(0), x.amax(0)])
    X, Y = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    eps = float(np.finfo(np.float32).eps)             # float32 sums: a few roundings of the terms' size
    np.testing.assert_allclose(outs[0], X.sum(0), rtol=0, atol=8 * eps * np.abs(X).sum(0).max())
    np.testing.assert_allclose(outs[1], (X * Y).sum(0), rtol=0, atol=8 * eps * np.abs(X * Y).sum(0).max())
    np.testing.assert_array_equal(outs[2], X.max(0))
    assert len(names) < len(names0)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_merged_kernel_runs_split_over_threads(threads):
    g, m, v = _t(512, 1024), _t(512, 1024), _t(512, 1024)
    with config.Context(THREADS=threads):
        (m2, v2), names, _ = _both(lambda: [m * 0.5 + g, v - g * g])
    assert len(names) == 1
    G, M, V = g.numpy(), m.numpy(), v.numpy()
    np.testing.assert_allclose(m2, M * np.float32(0.5) + G, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v2, V - G * G, rtol=1e-6, atol=1e-6)


def test_streaming_stores_write_every_output_and_check_each_ones_alignment():
    """A merged elementwise kernel over 4 MiB+ outputs writes both with streaming stores, which need
    64-byte aligned outputs: one that is not runs the plain code (the check covers every output,
    not only the first)."""
    from eqgrad.devices import get_device
    from eqgrad.devices.llvm import NT_MIN
    from eqgrad.graph.plan import Kernel, KernelPlan, KNode
    from eqgrad.lower.passes import LowerOptions
    f32 = eqgrad.float32
    n = NT_MIN // 4 + 16 * 64
    shape = (n,)

    def buf(i):
        return KNode("BUF", (), i, shape, f32)
    k0 = Kernel("k0", 2, KNode("ADD", (buf(0), buf(1)), None, shape, f32), (0, 1))
    k1 = Kernel("k1", 3, KNode("MUL", (buf(0), buf(1)), None, shape, f32), (0, 1))
    plan = KernelPlan([(shape, f32)] * 4, 2, [k0, k1], [2, 3])
    dev = get_device("LLVM")
    merged = dev.stage.merge_siblings(plan, LowerOptions(threads=1)).kernels
    assert [k.name for k in merged] == ["k0+k1"]
    _, prg, extent = dev.build(merged[0], plan, None, dev.target())
    assert extent == n and prg.n_outs == 2 and prg.nontemporal and prg.nontemporal_stores >= 2
    a, b = RNG.standard_normal(n, dtype=np.float32), RNG.standard_normal(n, dtype=np.float32)

    def out(offset: int) -> np.ndarray:          # ``offset`` floats past a 64-byte aligned address
        raw = np.full(n + 32, np.nan, np.float32)
        start = (-raw.ctypes.data // 4) % 16 + offset
        return raw[start:start + n]
    for off0, off1 in ((0, 0), (0, 1), (3, 0)):
        o0, o1 = out(off0), out(off1)
        prg(o0.ctypes.data, o1.ctypes.data, a.ctypes.data, b.ctypes.data, lo=0, hi=n)
        np.testing.assert_array_equal(o0, a + b)
        np.testing.assert_array_equal(o1, a * b)
    assert prg._plain                                    # a misaligned output ran the plain code


def test_a_group_body_has_a_structure_and_a_trace_at_new_sizes():
    """Sizes that keep changing: the GROUP's body is lowered from its trace (lower/trace.py) and
    its sized program (devices/sizeargs.py) like any other."""
    from eqgrad.lower.trace import TRACES
    before = TRACES.hits + TRACES.traced
    for n in (40, 41, 42, 43, 45):
        g, a = _t(n, 24, 3), _t(n, 24, 3)
        (x, y), names, _ = _both(lambda: [(g * 2 + a).permute(1, 0, 2), (g - a).exp2().permute(1, 0, 2)])
        assert len(names) == 1
        np.testing.assert_allclose(x, (g.numpy() * 2 + a.numpy()).transpose(1, 0, 2), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(y, np.exp2(g.numpy() - a.numpy()).transpose(1, 0, 2), rtol=2e-6)
    assert TRACES.hits + TRACES.traced > before


@pytest.mark.skipif("OPENCL" not in DEVICES, reason="no OpenCL platform")
def test_opencl_runs_siblings_as_one_kernel_too():
    """The OpenCL device's stage merges as the LLVM device's does (its own lowering choices): a
    layer norm's dw and db, and an Adam-style update, against EQGRAD_MERGE=0 and torch/NumPy."""
    rng = np.random.default_rng(5)
    d = "OPENCL"
    x, w, b, dy = (Tensor(rng.standard_normal(s, dtype=np.float32), device=d).realize()
                   for s in ((480, 384), (384,), (384,), (480, 384)))
    g, m, v, p = (Tensor(rng.standard_normal((64, 80), dtype=np.float32), device=d).realize() for _ in range(4))
    make, check = _layer_norm_backward(x, w, b, dy)
    outs, names, names0 = _both(make)
    assert len(names) == len(names0) - 1
    check(outs, 2e-4)
    make, check = _adam_update(g, m, (v * v).realize(), p)
    outs, names, names0 = _both(make)
    assert len(names) == 1 and len(names0) == 3
    check(outs)


@pytest.mark.skipif("OPENCL" not in DEVICES, reason="no OpenCL platform")
def test_opencl_computes_a_softmax_rows_max_and_sum_in_one_kernel():
    """On OpenCL a softmax is three kernels (a work-group reduction each: the row's max, the sum of
    exp2(x - max), the output); the sum reads the max broadcast along its own loop, at the element
    it computes, so the device runs the two as one kernel with two outputs that computes the max
    once a row. The same numbers as with EQGRAD_MERGE=0, bit for bit, and NumPy's."""
    rng = np.random.default_rng(7)
    x = Tensor(rng.standard_normal((64, 300), dtype=np.float32), device="OPENCL").realize()
    (out,), names, names0 = _both(lambda: [x.softmax(-1)])
    assert len(names) == len(names0) - 1 and any("+" in n for n in names), (names, names0)
    X = x.numpy().astype(np.float64)
    e = np.exp(X - X.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def _merged_everywhere(merger, plan, options, exclude) -> list[tuple[int, ...]]:
    """The groups of ``SiblingMerger.merge`` found the plain way: each kernel asks every group of
    its output shape opened before it, newest first (what merge did before it indexed the groups
    by the buffers they touch and closed the ones a later kernel had read from)."""
    kernels, readers = plan.kernels, {}
    for i, k in enumerate(kernels):
        for b in k.inputs:
            readers.setdefault(b, []).append(i)
    outputs, groups, open_by_shape = set(plan.outputs), [], {}
    for j, k in enumerate(kernels):
        if k.also or not k.inputs or not any(n > 1 for n in k.ast.shape) or exclude(k):
            continue
        for gi in reversed(open_by_shape.get(k.ast.shape, [])):
            if merger._joins(groups[gi], j, kernels, readers, outputs, plan, options):
                groups[gi].append(j)
                break
        else:
            open_by_shape.setdefault(k.ast.shape, []).append(len(groups))
            groups.append([j])
    return sorted(tuple(g) for g in groups if len(g) > 1)


def test_merge_finds_the_groups_that_asking_every_group_finds():
    """``SiblingMerger.merge`` asks only the groups that share a buffer with a kernel and that no
    kernel outside them has read from yet (``_joins`` says no to the others, and a 30-layer
    decoder's resized step spent 13.7 ms a step asking them all): the same groups, on programs
    with siblings, Adam updates, layer norm backward and a model's repeated layers."""
    from eqgrad.devices import get_device
    from eqgrad.lower.passes import LowerOptions
    dev = get_device("LLVM")
    x, w, b, dy = _t(48, 32), _t(32), _t(32), _t(48, 32)
    ln, _ = _layer_norm_backward(x, w, b, dy)
    adams = [_adam_update(*(_t(16, 24) for _ in range(4)))[0] for _ in range(3)]

    def layers():
        h, outs = _t(8, 32), []
        for _ in range(4):
            h = (h @ _t(32, 32)).relu() + h
            outs += [h.sum(0), (h * h).sum(0), h.amax(0)]
        return outs
    found = 0
    for make in (ln, lambda: [o for a in adams for o in a()], layers):
        with config.Context(MERGE=1):
            outs = make()
            plan = engine.current_session().plan_for([o.lazydata for o in outs], whole=False)[0].plan
            eqgrad.realize(*outs)
        options = LowerOptions.for_caps(dev.caps, threads=max(1, config.THREADS.value))
        split, _ = dev.stage.split(plan, options)
        exclude = lambda k, p=split: dev.stage.gemm_of(k, p) is not None
        got = dev.stage.merger.merge(split, options, exclude=exclude)
        groups = sorted(tuple(split.kernels.index(m) for m in _members(k, split)) for k in got.kernels if k.also)
        assert groups == _merged_everywhere(dev.stage.merger, split, options, exclude), make
        found += len(groups)
    assert found >= 4, found


def _members(k, plan) -> list:
    """The kernels of ``plan`` a merged kernel runs (its outputs, in order)."""
    outs = (k.out, *k.also)
    return sorted((m for m in plan.kernels if m.out in outs), key=lambda m: outs.index(m.out))
