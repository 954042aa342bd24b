"""Fusion is tested by counting kernels, and by checking that movement is read in place."""
import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor
from eqgrad import engine
from eqgrad.lower.lowering import sum_error_terms
from conftest import data

rng = np.random.default_rng(0)


def _t(*shape):
    return Tensor(rng.standard_normal(shape).astype(np.float32))


def kernels(out: Tensor) -> int:
    GlobalCounters.reset()
    out.realize()
    return GlobalCounters.kernel_count


def test_elementwise_chain_is_one_kernel():
    a, b = _t(16, 16), _t(16, 16)
    out = (a + b + 1) * 2
    assert kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), (a.numpy() + b.numpy() + 1) * 2, rtol=1e-6)


def test_row_sum_is_one_kernel():
    a = _t(8, 32)
    out = a.sum(1)
    assert kernels(out) == 1
    # a float sum's order is the device's (docs/semantics.md, "Float sums"): the contract is the
    # bound depth * u * sum|x| there, not a relative tolerance (these rows cancel to ~0.05 of sum|x|)
    x = a.numpy().astype(np.float64)
    bound = sum_error_terms(32) * 2.0 ** -24 * np.abs(x).sum(1)
    assert np.all(np.abs(out.numpy() - x.sum(1)) <= bound), (out.numpy() - x.sum(1), bound)


@pytest.mark.parametrize("shape", [(64, 128), (512, 1000)])
def test_softmax_at_most_three_kernels(shape):
    a = _t(*shape)
    out = a.softmax(-1)
    assert kernels(out) <= 3
    x = a.numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_attention_probabilities_written_with_a_unit_axis_are_one_row_fused_kernel():
    """softmax(scores) feeding ``p @ v`` is written as (b, h, q, 1, k) for the product's broadcast:
    a reshape that only adds an axis of one element keeps the rows (the max and the sum are computed
    once per row in the output kernel, as without it), so the softmax is one kernel, not a max, a sum
    and an output kernel each re-reading the scores (a BERT-shaped encoder's layers 2-6 had them)."""
    sc, v = _t(32, 12, 15, 15), _t(32, 12, 15, 32)      # (the encoder's sizes: smaller ones fused before)
    s = Tensor(np.array([0.17], np.float32))
    p = (sc * s.reshape(1, 1, 1, 1)).softmax(-1)
    out = (p.reshape(32, 12, 15, 1, 15) * v.permute(0, 1, 3, 2).reshape(32, 12, 1, 32, 15)).sum(-1)
    assert kernels(out) <= 2           # (one where the product's lanes share the probabilities)
    (soft,) = [k for k in engine.last_plan.plan.kernels if any(n.op == "RMAX" for n in k.ast.walk())]
    assert {n.op for n in soft.ast.walk()} >= {"RMAX", "RSUM", "EXP2"}
    x = sc.numpy() * 0.17
    e = np.exp(x - x.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), v.numpy())
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def _offset_paths_to(root, target):
    """The distinct sequences of SHRINK/PAD steps on the paths from ``root`` down to ``target``."""
    out = set()

    def walk(n, seq):
        if n is target:
            out.add(seq)
            return
        if n.op in ("SHRINK", "PAD"):
            seq = seq + ((n.op, n.arg),)
        for s in n.src:
            walk(s, seq)
    walk(root, ())
    return out


def test_a_contraction_read_at_rotated_offsets_is_not_recomputed_per_offset():
    """RoPE on a projection, t * cos + cat(-t[h:], t[:h]) * sin with t = x @ W: the lowering renders
    a node once per index it is read at, so a kernel holding the product reached at the direct and
    the two rotated offsets ran its loop three times per element (a decode step's q projection, 576
    x 576: 363-400 us, priced 72). The cost model counts the offsets: no kernel reaches a sum through
    more than one of them, and the values are NumPy's."""
    x, w = _t(1, 1, 576), _t(576, 576)
    cos, sin = _t(1, 1, 9, 64), _t(1, 1, 9, 64)
    t = (x @ w).reshape(1, 1, 9, 64)
    a, b = t.shrink((None, None, None, (0, 32))), t.shrink((None, None, None, (32, 64)))
    out = t * cos + (-b).cat(a, dim=3) * sin
    got = out.numpy()
    for k in engine.last_plan.plan.kernels:
        for n in k.ast.walk():
            if n.op == "RSUM":
                assert len(_offset_paths_to(k.ast, n)) == 1, k.ast
    tn = (x.numpy() @ w.numpy()).reshape(1, 1, 9, 64)
    want = tn * cos.numpy() + np.concatenate([-tn[..., 32:], tn[..., :32]], -1) * sin.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_product_read_in_disjoint_halves_is_still_one_kernel():
    """t[:, :4] + t[:, 4:] with t = x @ w reaches the product through two SHRINK paths, each reading
    half of it: every element of the product is computed once, so the offsets count (the paths'
    evaluations, not the paths) leaves the kernel legal -- one kernel, NumPy's values."""
    x, w = _t(4, 16), _t(16, 8)
    t = x @ w
    out = t[:, :4] + t[:, 4:]
    assert kernels(out) == 1
    tn = x.numpy() @ w.numpy()
    np.testing.assert_allclose(out.numpy(), tn[:, :4] + tn[:, 4:], rtol=1e-5, atol=1e-5)


def test_a_product_whose_broadcast_operand_is_computed_fuses_into_its_sum():
    """rope(q) @ k.T in a decode step: with the rotation inlined into the product, fusing the product
    into its sum reads the rotation's pads in the contraction's loop once per key (dearer than the
    two kernels it replaces), and materializing the rotation alone adds a kernel -- so single greedy
    moves stopped at the product written out, (1, 9, 1, 41, 64), and summed by a kernel of its own.
    The search tries the inline with the broadcast operand materialized: the rotation is one small
    kernel and the scores one contraction, nothing of the product's size is written."""
    qp, kk = _t(1, 1, 9, 64).realize(), _t(1, 9, 41, 64).realize()
    cos, sin = _t(1, 1, 1, 64), _t(1, 1, 1, 64)
    q = qp.permute(0, 2, 1, 3)
    a, b = q.shrink((None, None, None, (0, 32))), q.shrink((None, None, None, (32, 64)))
    sc = (q * cos + (-b).cat(a, dim=3) * sin) @ kk.transpose(-1, -2)
    assert kernels(sc) == 2
    plan = engine.last_plan.plan
    assert max(int(np.prod(plan.buffers[k.out][0])) for k in plan.kernels) < 41 * 64
    qn = qp.numpy().transpose(0, 2, 1, 3)
    qr = qn * cos.numpy() + np.concatenate([-qn[..., 32:], qn[..., :32]], -1) * sin.numpy()
    np.testing.assert_allclose(sc.numpy(), qr @ kk.numpy().transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)


def test_moved_inputs_are_read_in_place():
    """A permuted, expanded and padded input is read through its index expression: no copy kernel."""
    a, b = _t(6, 8), _t(6)
    out = a.permute(1, 0).pad(((1, 1), (0, 0))) + b.reshape(1, 6).expand(10, 6)
    assert kernels(out) == 1
    plan = engine.last_plan.plan
    (k,) = plan.kernels
    assert set(k.inputs) == {0, 1}          # reads the two realized inputs directly
    ref = np.pad(a.numpy().T, ((1, 1), (0, 0))) + b.numpy().reshape(1, 6)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_matmul_is_one_kernel():
    a, b = _t(32, 16), _t(16, 8)
    out = a @ b
    assert kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-5)


def test_reduction_is_not_recomputed_under_broadcast():
    """x - x.max(0) must not inline the max into the elementwise kernel (it would be recomputed
    for every output row): two kernels."""
    a = _t(32, 64)
    out = a - a.amax(0, keepdim=True)
    assert kernels(out) == 2
    for k in engine.last_plan.plan.kernels:
        walk = k.ast.walk()
        for n in walk:
            if n.op in ("RMAX", "RSUM"):
                assert k.ast.op in ("RMAX", "RSUM") or k.ast.shape == n.shape
    np.testing.assert_array_equal(out.numpy(), a.numpy() - a.numpy().max(0, keepdims=True))


def _loop_depths(lk):
    """(op, loop depth) of every instruction of a loop-IR kernel."""
    depth, out = 0, []
    for x in lk.insts:
        if x.op == "ENDRANGE":
            depth -= 1
        out.append((x.op, depth))
        if x.op == "RANGE":
            depth += 1
    return out


@pytest.mark.parametrize("what", ["max", "softmax", "layernorm"])
def test_row_reductions_share_the_row_loop(what):
    """A reduction broadcast back along the trailing axis (x - x.max(-1), softmax, layernorm)
    joins its consumer's kernel: each row's reductions run once, in their own loops inside the
    row loop and before the loop over the row's outputs (Lowerer.hoist), never per element."""
    from eqgrad.lower.lowering import lower_kernel
    import eqgrad.nn.functional as F
    a = _t(32, 64)
    if what == "max":
        out, ref = a - a.amax(-1, keepdim=True), a.numpy() - a.numpy().max(-1, keepdims=True)
    elif what == "softmax":
        e = np.exp(a.numpy() - a.numpy().max(-1, keepdims=True))
        out, ref = a.softmax(-1), e / e.sum(-1, keepdims=True)
    else:
        x = a.numpy()
        d = x - x.mean(-1, keepdims=True)
        out, ref = F.layer_norm(a, (64,)), d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    assert kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    plan = engine.last_plan.plan
    lk = lower_kernel(plan.kernels[0], plan)
    depths = _loop_depths(lk)
    assert all(d == 2 for op, d in depths if op in ("ACCUM", "STORE"))       # row loop > reduce/output loop
    assert not any(op == "RANGE" and d > 1 for op, d in depths)              # no loop nested in a row's loops
    assert lk.parallel == 1 and sum(1 for op, _ in depths if op == "RANGE") >= 3


def test_plan_is_cached_by_structure():
    a, b = _t(8, 8), _t(8, 8)
    (a * b + 3).realize()
    before = GlobalCounters.plans_compiled
    c, d = _t(8, 8), _t(8, 8)              # new buffers, same structure
    out = c * d + 3
    out.realize()
    assert GlobalCounters.plans_compiled == before
    # c*d + 3 may be one fused multiply-add (docs/semantics.md): up to half an ulp of c*d apart
    np.testing.assert_allclose(out.numpy(), c.numpy() * d.numpy() + 3, rtol=1e-6, atol=3e-7)


def test_contiguous_forces_a_boundary():
    a = _t(8, 8)
    out = ((a + 1).contiguous() * 2)
    assert kernels(out) == 2
    np.testing.assert_allclose(out.numpy(), (a.numpy() + 1) * 2, rtol=1e-6)


def test_two_outputs_share_work():
    a = _t(16, 16)
    y = a + 1
    z = y * 2
    GlobalCounters.reset()
    engine.realize([y.lazydata, z.lazydata])
    assert GlobalCounters.kernel_count <= 2
    np.testing.assert_allclose(z.numpy(), (a.numpy() + 1) * 2, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), a.numpy() + 1, rtol=1e-6)


def test_constants_are_never_materialized():
    # 3.0 is a runtime parameter (no rule names it): the plan reads it as a one-element input, never
    # as a (4, 4) buffer; 1.0 is structural (rules name it) and folds away entirely
    out = Tensor.full((4, 4), 3.0) * _t(4, 4)
    assert kernels(out) == 1
    plan = engine.last_plan.plan
    assert plan.buffers[:plan.n_inputs] == [((4, 4), eqgrad.float32), ((), eqgrad.float32)]
    out = Tensor.full((4, 4), 1.0) * _t(4, 4)
    assert kernels(out) == 0            # x * 1 is x: the output aliases the input
    assert engine.last_plan.plan.n_inputs == 1


def test_unoptimized_mode_gives_same_numbers():
    a = _t(8, 16)
    with eqgrad.Context(OPT=0):
        out = a.softmax(-1)
        n = kernels(out)
    assert n > 3              # one kernel per op: nothing fused
    x = a.numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_padded_convolution_materializes_the_padded_input():
    """A pad read inside a reduction loop masks every register lane; the cost model charges it
    (cost.py: masked_read), so the plan copies the padded input once and convolves unmasked."""
    import eqgrad.nn.functional as F
    x, w = _t(2, 8, 12, 12), _t(16, 8, 3, 3)
    out = F.conv2d(x, w, padding=1)
    assert kernels(out) == 2
    first = engine.last_plan.plan.kernels[0]
    assert {n.op for n in first.ast.walk()} <= {"PAD", "BUF", "RESHAPE"}
    assert not any(n.op == "PAD" for n in engine.last_plan.plan.kernels[1].ast.walk())
    import torch
    ref = torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w.numpy()), padding=1).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_contraction_is_not_hoisted_into_a_row_fused_kernel():
    """max_pool2d's backward broadcasts the pooled gradient over each window; the convolution
    input gradient above it, inlined there, would be rendered in a hoisted loop nest without
    register lanes (cost.py: unlaned; measured 21 ms against ~1 ms as its own kernel): it stays a
    kernel whose output is the contraction itself."""
    import eqgrad.nn.functional as F
    from eqgrad.lower.contraction import candidate
    x, w = Tensor(data((4, 8, 8, 8)), requires_grad=True), _t(16, 8, 3, 3)
    y = F.conv2d(F.max_pool2d(x, 2), w, padding=1)
    (y * _t(*y.shape)).sum().backward()
    x.grad.realize()
    for k in engine.last_plan.plan.kernels:
        if any(n.op == "RMAX" for n in k.ast.walk()):    # max-pool's backward: no contraction in it
            assert not any(n.op == "RSUM" and n.src[0].op == "MUL" and candidate(n) is not None
                           for n in k.ast.walk()), k.ast.render()[:300]


def test_a_product_is_not_inlined_into_another_products_loop():
    """(A @ B) @ x as one kernel computes A @ B inside the outer product's reduction loop, in a
    scalar loop without register lanes (measured at 1024: 2.26 s, where materializing A @ B takes
    ~7 ms); the cost model charges such a nested reduction ``unlaned`` (evaluate.py), so A @ B is
    a kernel of its own."""
    r = np.random.default_rng(5)
    a, b, x = (r.uniform(-1, 1, s).astype(np.float32) for s in ((256, 256), (256, 256), (256, 1)))
    out = ((Tensor(a) @ Tensor(b)) @ Tensor(x)).realize()
    for k in engine.last_plan.plan.kernels:
        sums = [n for n in k.ast.walk() if n.op == "RSUM"]
        assert len(sums) <= 1, k.ast.render()[:300]
    np.testing.assert_allclose(out.numpy(), (a.astype(np.float64) @ b) @ x, rtol=1e-4, atol=1e-3)


def test_attention_scores_are_computed_once_per_element_not_per_pass():
    """softmax(q @ k) @ v: the row-fused softmax makes three passes over each row (max, sum,
    output), so the scores' contraction is either materialized by a kernel of its own (scores,
    row-fused softmax, P @ v) or, inlined into the row-fused kernel, kept per row in a local array
    (the row stash) -- which the extractor prices once it asks the lowering (greedy's rows phase)
    -- and never recomputed in every pass."""
    from eqgrad.graph.caps import CPU
    from eqgrad.lower.passes import LowerOptions, run_passes
    r = np.random.default_rng(3)
    q, kt, v = (r.uniform(-1, 1, s).astype(np.float32) for s in ((2, 3, 32, 16), (2, 3, 16, 32), (2, 3, 32, 16)))
    out = ((Tensor(q) @ Tensor(kt)) * 0.25).softmax(-1) @ Tensor(v)
    assert kernels(out) <= 3
    s = (q @ kt) * 0.25
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
    (row,) = [k for k in engine.last_plan.plan.kernels if any(n.op == "RMAX" for n in k.ast.walk())]
    scores = [n for n in row.ast.walk() if n.op == "RSUM" and n.src[0].op == "MUL"
              and not any(x.op in ("RSUM", "RMAX") for x in n.src[0].walk())]
    if scores:                         # inlined: kept by the row stash, computed once per element
        stash = {id(x) for x in run_passes(row, LowerOptions.for_caps(CPU))[-1].schedule.row_stash}
        assert all(id(x) in stash for x in scores)


@pytest.mark.parametrize("peak", [50e9, 101e9])
def test_a_broadcast_product_is_not_materialized_to_fuse_its_sum(peak):
    """The convolution input gradient's sum, hoisted into max-pool's backward, counts as the
    contraction it belongs to even when its product is materialized by another kernel (cost.py:
    unlaned): otherwise greedy fused the sum there first and then materialized the whole product
    (a CNN-with-pooling step under a calibration with peak 101 and contraction 267 GFLOP/s: a 151 MB
    kernel, 5.5 -> 55 ms). No kernel writes more than a few times the largest tensor it reads."""
    import eqgrad.nn.functional as F
    from eqgrad.extract import using
    from eqgrad.extract.cost import DeviceParams
    from eqgrad.ops import numel
    x, w = Tensor(data((8, 16, 16, 16), seed=3), requires_grad=True), _t(32, 16, 3, 3)
    with using(params={"LLVM": DeviceParams(peak=peak, contraction=267e9, bandwidth=52e9)}):
        y = F.conv2d(F.max_pool2d(x, 2), w, padding=1)
        (y * _t(*y.shape)).sum().backward()
        x.grad.realize()
        plan = engine.last_plan.plan
    sizes = dict(enumerate(numel(s) for s, _ in plan.buffers))
    for k in plan.kernels:
        assert numel(k.ast.shape) <= 4 * max(sizes[i] for i in k.inputs), k.ast.render()[:300]


def test_a_strided_convolution_copies_its_windows_as_a_gemm_operand():
    """Strided windows are no view with a unit stride along the output row, so the plan copies
    them (an im2col); conv2d builds them channel-inner, so the copy is a GEMM operand with one
    contiguous reduce axis and the contraction runs as a GEMM (stride 2, 32 -> 64 channels,
    32x32, batch 32: 63 -> 2.8 ms; before, the copy's channel axis was outermost and the
    contraction ran scalar at 4 GFLOP/s)."""
    import eqgrad.nn.functional as F
    from eqgrad.lower.contraction import find_contraction
    import torch
    x, w = _t(4, 32, 32, 32), _t(64, 32, 3, 3)
    out = F.conv2d(x, w, stride=2, padding=1)
    out.realize()
    contractions = [k for k in engine.last_plan.plan.kernels
                    if any(n.op == "RSUM" and n.src[0].op == "MUL" for n in k.ast.walk())]
    assert len(contractions) == 1
    found = find_contraction(contractions[0].ast)
    assert found is not None and not found.packs, contractions[0].ast.render()[:300]
    assert found.gemm.k == 32 * 9                         # one contiguous reduce axis: channels x taps
    ref = torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w.numpy()), stride=2, padding=1)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-3)
