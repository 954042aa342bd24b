"""Lowering without a compiler: kernels are lowered to loop IR, verified, run by the loop-IR
interpreter (``graph.interp.run_loop``) and compared with the kernel-tree reference
(``graph.interp.run_kernel``) on the same inputs -- no LLVM, no OpenCL. Every named pass switched
off alone gives the same values (passes change speed, never results), and the loop-IR verifier
(``loopir.verify``) rejects each kind of malformed kernel."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import math

import numpy as np
import pytest

import eqgrad
import eqgrad.nn.functional as F
from eqgrad import Tensor, config, engine
from eqgrad.dtype import bool_, float32, int32
from eqgrad.graph.interp import run_kernel, run_loop
from eqgrad.graph.loopir import INDEX, NONNEG, LInst, LoopIRError, LoopKernel, verify
from eqgrad.graph.plan import Kernel, KernelPlan
from eqgrad.lower import passes
from eqgrad.lower.lowering import Lowerer, lower_kernel
from eqgrad.lower.passes import LowerOptions, run_passes
from eqgrad.lower.split import split_reduction
from eqgrad.lower.symbolic import Lin
from eqgrad.devices import Buffer, get_device
from conftest import DEVICES


def _t(*shape: int, seed: int = 0, dtype=np.float32) -> Tensor:
    rng = np.random.default_rng(seed)
    if dtype == np.int32:
        return Tensor(rng.integers(-6, 7, shape).astype(np.int32), device="NUMPY")
    return Tensor(rng.uniform(-2, 2, shape).astype(np.float32), device="NUMPY")


# small enough for the Python interpreter (a few 10k loop iterations per kernel at most)
CORPUS: dict[str, Callable[[], Tensor]] = {
    "elementwise": lambda: ((_t(16) * _t(16, seed=1) + 1).exp2() + _t(16, seed=2).abs().sqrt()).log2(),
    "int_ops": lambda: ((_t(6, 7, dtype=np.int32) // (_t(6, 7, seed=1, dtype=np.int32).abs() + 1))
                        + _t(6, 7, seed=2, dtype=np.int32) % 3).maximum(_t(6, 7, seed=3, dtype=np.int32)),
    "int_bits": lambda: (_t(9, dtype=np.int32) & 5) | (_t(9, seed=1, dtype=np.int32) ^ 3),
    "casts_where": lambda: (_t(5, 4) > 0).where(_t(5, 4, seed=1).cast(eqgrad.int32), _t(5, 4, seed=2, dtype=np.int32)),
    "reshape_flip": lambda: _t(2, 3).reshape(6).flip(0) * 2,
    "movement_chain": lambda: (_t(3, 4, 5).reshape(12, 5).flip((0, 1)).reshape(6, 10).flip(1)
                               .pad(((1, 0), (0, 2))).permute(1, 0) + 1),
    "shrink_expand": lambda: _t(10, 10)[2:7, 1:9:2] * _t(5, 1).expand(5, 4),
    "pad_sum": lambda: _t(3, 4).pad(((2, 1), (1, 3))).exp2().sum(1),
    "sum_rows": lambda: _t(8, 32).sum(1),
    "sum_cols": lambda: _t(32, 48).sum(0),                       # lanes on the kept axis
    "max_all": lambda: _t(4, 8).max(),
    "sum_axes": lambda: _t(6, 5, 7).sum((0, 2)),
    "sum_blocked": lambda: _t(3000).sum(),                      # > 1024: levels
    "sum_rows_blocked": lambda: _t(2, 2100).sum(1),
    "int_sum": lambda: _t(40, 50, dtype=np.int32).sum(),
    "matmul_lanes": lambda: _t(32, 16) @ _t(16, 64, seed=1),
    "matmul_odd": lambda: _t(5, 9) @ _t(9, 7, seed=1),
    # RoPE's rotated half of a projection: pads of the product under lanes (one loop nest per block)
    "rope_lanes": lambda: _rope(_t(2, 16) @ _t(16, 32, seed=1), _t(32, seed=2), _t(32, seed=3)),
    # x @ w.T with a Linear layer's (out, in) weight, a bias and a relu: a dot block (3 x 2 lanes;
    # with SMALL's thresholds)
    "linear_dot": lambda: (_t(6, 20) @ _t(10, 20, seed=1).transpose() + _t(10, seed=2)).relu(),
    "softmax": lambda: _t(8, 16).softmax(-1),
    "softmax_3d": lambda: _t(2, 3, 8).softmax(-1),
    "softmax_cols": lambda: _t(16, 8).softmax(0),               # the stash's row check says no
    "softmax_long": lambda: _t(3, 40).softmax(-1),               # blocked sums with SMALL
    "layernorm": lambda: F.layer_norm(_t(8, 16), (16,)),
    "row_max": lambda: _t(8, 16) - _t(8, 16).amax(-1, keepdim=True),
    "full_variance": lambda: ((_t(6, 7) - _t(6, 7).mean()) ** 2).mean(),
    "conv": lambda: F.conv2d(_t(1, 2, 5, 5), _t(3, 2, 3, 3, seed=1), padding=1),
    "bool_any": lambda: (_t(64) > 1.5).any(),
    # planned under a memory bound (BOUNDED): one kernel, the scores kept per row (row stash), the
    # output row's 8 values as lanes after the row's loops
    "attention": lambda: (_t(2, 12, 8) @ _t(2, 12, 8, seed=1).transpose(-1, -2) * 0.3).softmax(-1) @ _t(2, 12, 8, seed=2),
    "attention_causal": lambda: ((_t(1, 2, 10, 8) @ _t(1, 2, 10, 8, seed=1).transpose(-1, -2) * 0.3)
                                 + Tensor(np.triu(np.full((10, 10), -np.inf, np.float32), 1), device="NUMPY"))
                                .softmax(-1) @ _t(1, 2, 10, 8, seed=2),
    # k given as k^T (contiguous along the keys), 16 keys: the row-dots pass computes the scores as
    # register blocks of 8 keys x the block's rows (the device packs k so: lower/passes.py row_pack)
    "attention_kt": lambda: (_t(2, 16, 8) @ _t(2, 8, 16, seed=1) * 0.3).softmax(-1) @ _t(2, 16, 8, seed=2),
    # copies that read along the output's last axis with a stride: cache blocks with SMALL
    "transpose": lambda: _t(24, 40).transpose().contiguous(),
    "nhwc": lambda: _t(2, 20, 3, 16).permute(0, 2, 3, 1).contiguous(),
    "empty": lambda: _t(0, 4) + 1,
}
def _rope(t: Tensor, c: Tensor, s: Tensor) -> Tensor:
    half = t.shape[-1] // 2
    return t * c + Tensor.cat(-t[:, half:], t[:, :half], dim=-1) * s


# thresholds lowered so that the passes for big kernels apply to these small ones
SMALL = LowerOptions(tile_blocks=2, tile_min_stream=0, sum_block=16, sum_radix=4, block_stride=16, block_bytes=0)
SMALL_CASES = ("matmul_lanes", "sum_blocked", "sum_rows_blocked", "sum_axes", "layernorm", "softmax_long", "linear_dot",
               "transpose", "nhwc")


BOUNDED = {"attention": 1024, "attention_causal": 1024, "attention_kt": 1024}     # EQGRAD_PEAK_MEMORY of these cases
# planned as two kernels, the product then inlined into the kernel that reads it: the RoPE projection
# as one kernel, whose lowering these cases test -- the extractor keeps the product apart, the cost
# model counting its sum once per offset it is read at (extract/evaluate.py ``offsets``)
INLINED = ("rope_lanes",)


def _inlined(plan: KernelPlan) -> KernelPlan:
    """``plan``'s two kernels as one: the first's body in place of the second's reads of its buffer."""
    first, second = plan.kernels
    reads = {id(n): first.ast for n in second.ast.walk() if n.op == "BUF" and n.arg == first.out}
    ast = second.ast.replaced(reads)
    k = Kernel(second.name, second.out, ast, ast.buffers(), second.predicted, second.nbytes, second.flops)
    return replace(plan, kernels=[k])


@pytest.fixture(scope="module")
def plans() -> dict[str, KernelPlan]:
    out = {}
    for name, make in CORPUS.items():
        with eqgrad.Context(PEAK_MEMORY=BOUNDED.get(name, 0)):
            out[name] = engine.plan_for([make().lazydata])[0].plan
        if name in INLINED:
            out[name] = _inlined(out[name])
    return out


def _inputs(plan: KernelPlan, seed: int = 0) -> list[np.ndarray]:
    """Random contents for the plan's input buffers, and every kernel's reference output."""
    rng = np.random.default_rng(seed)
    bufs: list[np.ndarray] = []
    for shape, dt in plan.buffers[:plan.n_inputs]:
        if dt == float32:
            bufs.append(rng.uniform(-2, 2, shape).astype(np.float32))
        elif dt == int32:
            bufs.append(rng.integers(-6, 7, shape).astype(np.int32))
        else:
            bufs.append(rng.random(shape) < 0.5)
    bufs += [np.zeros(shape, dt.np) for shape, dt in plan.buffers[plan.n_inputs:]]
    for k in plan.kernels:
        bufs[k.out] = np.asarray(run_kernel(k, bufs), dtype=plan.buffers[k.out][1].np).reshape(plan.buffers[k.out][0])
    return bufs


def _run(k: Kernel, plan: KernelPlan, bufs: list[np.ndarray], options: LowerOptions | None = None,
         upcast: tuple[int, int] | None = None) -> np.ndarray:
    """Lower ``k``, verify it and run it on ``bufs`` (the reference's buffers): its output."""
    lk = lower_kernel(k, plan, upcast, options)
    verify(lk)
    shape, dt = plan.buffers[k.out]
    out = np.zeros(int(np.prod(shape)), dt.np)
    run_loop(lk, [out] + [np.ascontiguousarray(bufs[b]).reshape(-1).copy() for b in k.inputs])
    return out.reshape(shape)


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    if got.dtype.kind == "f":
        scale = max(1.0, float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0)))
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * scale, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


@pytest.mark.parametrize("case", list(CORPUS))
def test_lowered_kernels_match_the_kernel_reference(case, plans):
    plan = plans[case]
    bufs = _inputs(plan)
    for k in plan.kernels:
        _same(_run(k, plan, bufs), bufs[k.out], f"{case} {k.name}: {k.ast.render()[:100]}")
        if case in SMALL_CASES:
            _same(_run(k, plan, bufs, SMALL), bufs[k.out], f"{case} {k.name} with small thresholds")


def _applied(k: Kernel, options: LowerOptions) -> set[str]:
    return {s.name for s in run_passes(k, options) if s.status == "applied"}


@pytest.mark.parametrize("name", [p.name for p in passes.PASSES if p.stage == "kernel"])
def test_each_pass_switched_off_alone_gives_the_same_values(name, plans):
    """A pass changes speed, never results: the kernels where it applies, lowered without it,
    compute the reference's values (and the pass does apply somewhere in the corpus)."""
    hit = 0
    for case, plan in plans.items():
        bufs = None
        for options in (LowerOptions(), SMALL) if case in SMALL_CASES else (LowerOptions(),):
            for k in plan.kernels:
                if name not in _applied(k, options):
                    continue
                hit += 1
                bufs = bufs if bufs is not None else _inputs(plan)
                off = replace(options, disabled=frozenset({name}))
                assert name not in _applied(k, off)
                _same(_run(k, plan, bufs, off), bufs[k.out], f"{case} {k.name} without {name!r}")
    assert hit, f"pass {name!r} applies to no kernel of the corpus"


def test_the_passes_decide_what_the_docs_say(plans):
    """Spot checks of the decisions: lanes on a matmul, a tile with small thresholds, hoisting
    in the row-fused kernels, blocking of the long sum, parallel rows before the hoisted sums."""
    def sched(case: str, options: LowerOptions | None = None) -> passes.Schedule:
        return passes.schedule_kernel(plans[case].kernels[-1], options)
    assert sched("matmul_lanes").lanes == ((0, 8), (1, 16)) and sched("matmul_lanes").tile is None
    assert sched("matmul_lanes", SMALL).tile == (0, 2)
    assert sched("rope_lanes").lanes == ((0, 2), (1, 16)) and len(plans["rope_lanes"].kernels) == 1
    dot = sched("linear_dot", SMALL)                  # (its weight is under the default 1 MiB: no block)
    assert not sched("linear_dot").dot
    assert dot.lanes == ((0, 3), (1, 2)) and dot.dot and dot.tile is None and not sched("matmul_lanes").dot
    soft = sched("softmax")
    assert len(plans["softmax"].kernels) == 1 and soft.hoist and not soft.lanes and soft.parallel == 1
    assert sched("full_variance").hoist[0][0] == 0           # no output loop: hoisted before the store
    assert sched("sum_blocked").blocked and not sched("sum_rows").blocked
    assert sched("elementwise").parallel == 1 and not sched("elementwise").hoist
    assert soft.stash is not None and soft.stash.op == "EXP2" and sched("layernorm").stash is None


@pytest.mark.parametrize("case", ["softmax", "softmax_3d", "softmax_long"])
def test_softmax_computes_exp_once_per_element(case, plans):
    """The stash pass: exp2 of each element is stored by the sum's loop and loaded back by the
    loop over the row's outputs (one EXP2 in the loop IR, two without the pass)."""
    (k,) = plans[case].kernels
    for options, exps in ((LowerOptions(), 1), (LowerOptions(disabled={"stash", "row stash"}), 2)):
        lk = lower_kernel(k, plans[case], options=options)
        assert sum(x.op == "EXP2" for x in lk.insts) == exps, (case, options.disabled)
        assert sum(x.op == "STORE" for x in lk.insts) == 3 - exps, (case, options.disabled)
    # without the stash, the row stash keeps exp2 in a local array instead of the output row
    lk = lower_kernel(k, plans[case], options=LowerOptions(disabled={"stash"}))
    assert sum(x.op == "EXP2" for x in lk.insts) == 1 and sum(x.op == "DEFLOCAL" for x in lk.insts) == 1


@pytest.mark.parametrize("case", ["attention", "attention_causal"])
def test_attention_is_one_kernel_that_computes_each_score_once(case, plans):
    """The row stash pass: softmax(q @ k.T) @ v as one kernel (under a memory bound) stores each
    row's scores and exp2 in local arrays -- computed once per element, not in each of the row's
    three passes -- and the output row's values are register lanes after the row's loops. The rows
    of a row block (lanes on the query axis too, ``passes.row_block``) each have their slot in the
    arrays: one exp2 per row of the block."""
    (k,) = plans[case].kernels
    sched = passes.schedule_kernel(k)
    assert sched.hoist and sched.lanes and {n.op for n in sched.row_stash} == {"RSUM", "EXP2"}
    last = max(d for d, _ in sched.lanes)
    rows = math.prod(w for d, w in sched.lanes if d != last)
    lk = lower_kernel(k, plans[case])
    assert sum(x.op == "DEFLOCAL" for x in lk.insts) == 2
    assert sum(x.op == "EXP2" for x in lk.insts) == rows
    off = lower_kernel(k, plans[case], options=LowerOptions(disabled={"row stash"}))
    assert sum(x.op == "EXP2" for x in off.insts) > rows and not any(x.op == "DEFLOCAL" for x in off.insts)


def test_a_row_block_reduces_several_query_rows_at_once(plans):
    """A row-fused kernel with lanes (attention as one kernel) reduces a block of rows together
    (``passes.row_block``): the rows' max, sum and row-stash values in one loop nest, one
    accumulator and one array slot a row, so the keys and values are read once per block, not once
    per row. 12 query rows: blocks of 6 (the largest divisor up to 8 that leaves a row loop), 6 max
    accumulators; the numbers are the interpreter's of the kernel without the block. No block where
    the kernel hoists nothing at its row loop, or has one row."""
    plan = plans["attention"]
    (k,) = plan.kernels
    sched = passes.schedule_kernel(k)
    assert dict(sched.lanes) == {1: 6, 2: 8}
    lk = lower_kernel(k, plan)
    assert sum(x.op == "DEFACC" and x.arg == float("-inf") for x in lk.insts) == 6
    bufs = _inputs(plan)
    _same(_run(k, plan, bufs), bufs[k.out], "row block")
    one = _run(k, plan, bufs, upcast=(8, 1))                   # lanes forced on the last axis alone
    _same(one, bufs[k.out], "one row at a time")
    assert passes.schedule_kernel(k, LowerOptions(upcast=(8, 1))).lanes == ((2, 8),)
    for case in ("matmul_lanes", "full_variance"):
        (kk,) = [x for x in plans[case].kernels if any(n.op in ("RSUM", "RMAX") for n in x.ast.walk())][-1:]
        assert passes.row_block(kk.ast, 8, (8, 4, 2), 8192) == 1, case


def test_the_scores_of_a_row_block_are_register_blocks_over_the_keys(plans):
    """The row-dots pass: attention as one kernel whose k is read in order along the keys (k^T)
    computes a row block's scores before the row's max as register blocks -- one accumulator a
    (row, key) for the 8 keys of a lane width and the block's rows, one loop over the keys in steps
    of 8 -- and stores them into the row-stash array the max, the sum and the output read; its
    values are the kernel reference's. The probabilities p = e / sum that p @ v reads along its
    loop, the same for every lane of the head dim, are computed once the row's sum is known, in a
    loop over the block's rows' keys into a local array of their own (``root_rows``), which the
    output's loop loads (it multiplied each e by 1 / sum there, a scalar and a broadcast a key and
    row). Not with k read a head dim apart along the keys (the device packs it first), nor where
    the lane width does not divide the keys."""
    plan = plans["attention_kt"]
    (k,) = plan.kernels
    sched = passes.schedule_kernel(k)
    rows = dict(sched.lanes)[1]
    assert [(x.op, r) for x, r in sched.row_dots] == [("RSUM", rows)] and rows == 8
    (p,) = sched.root_rows
    assert p.op == "MUL" and any(x is y for x in p.src for y in sched.row_stash) and \
        any(x.op == "RECIP" for x in p.walk())
    lk = lower_kernel(k, plan)
    # the scores' accumulators: 8 keys x 8 rows, all zero to start with
    assert sum(x.op == "DEFACC" and x.arg == 0.0 for x in lk.insts) >= 64
    # arrays: the scores, their exp2, and p; no RECIP inside the output's loop over the keys
    assert sum(x.op == "DEFLOCAL" for x in lk.insts) == 3
    last = max(j for j, x in enumerate(lk.insts) if x.op == "RANGE")
    assert not any(x.op == "RECIP" for x in lk.insts[last:])
    bufs = _inputs(plan)
    _same(_run(k, plan, bufs), bufs[k.out], "row dots")
    off = LowerOptions(disabled={"row dots"})
    assert not passes.schedule_kernel(k, off).row_dots
    _same(_run(k, plan, bufs, off), bufs[k.out], "without row dots")
    assert not passes.schedule_kernel(plans["attention"].kernels[0]).row_dots      # 12 keys, k strided


@pytest.mark.parametrize("causal", [False, True])
def test_a_kernels_own_reduction_reads_its_rows_dot_products_from_register_blocks(causal):
    """The row-dots pass on a kernel without hoists: attention's backward under a memory bound is
    six kernels (three row statistics, dq, dk, dv), each recomputing the scores ``q . k`` (and
    ``g . v``) inside its own reduction over the keys or the queries. After the device's packs
    (``row_pack``: k^T and v^T for a query row, q^T and g^T for a key row) each computes them for a
    whole row before that reduction's loop, as register blocks into a local array, and its values
    are the kernel reference's, with and without the pass."""
    from eqgrad.devices.cpustage import _lane_packed
    q, k, v = (Tensor(_t(1, 2, 32, 8, seed=i).numpy(), device="NUMPY", requires_grad=True) for i in range(3))
    scores = q @ k.transpose(-1, -2) * 0.35
    if causal:
        scores = scores + Tensor(np.triu(np.full((32, 32), -np.inf, np.float32), 1), device="NUMPY")
    (scores.softmax(-1) @ v * _t(1, 2, 32, 8, seed=3)).sum().backward()
    with eqgrad.Context(PEAK_MEMORY=4 * (3 * 2 * 32 * 8 + 3 * 2 * 32)):
        plan = engine.plan_for([q.grad.lazydata, k.grad.lazydata, v.grad.lazydata])[0].plan
    assert len(plan.kernels) == 6
    bufs = _inputs(plan)
    o = LowerOptions()
    for kk in plan.kernels:
        assert not passes.schedule_kernel(kk, o).root_dots        # strided before the packs
        rp = passes.row_pack(kk.ast, o)
        assert rp is not None, kk.ast.render()[:120]
        pieces, scratch = _lane_packed(kk, rp, len(plan.buffers))
        packed = replace(plan, buffers=plan.buffers + scratch)
        pb = bufs + [np.zeros(sh, dt.np) for sh, dt in scratch]
        for pk in pieces[:-1]:
            pb[pk.out] = np.asarray(run_kernel(pk, pb), np.float32).reshape(packed.buffers[pk.out][0])
        body = pieces[-1]
        sched = passes.schedule_kernel(body, o)
        assert sched.root_dots and not sched.hoist, body.ast.render()[:120]
        lanes = dict(sched.lanes)
        # the dot products' register blocks: the head dim's lanes (8) for each of a row block's 8
        # rows where the output has lanes, else the register block of 16 x 8 accumulators as 16
        # keys of each of 8 rows (a row block of the kernel's last axis, without lanes)
        assert {(w, r) for _, w, r in sched.root_dots} == ({(8, 8)} if lanes else {(16, 8)})
        assert sorted(lanes.values()) == ([8, 8] if lanes else []) and sched.root_block == (0 if lanes else 8)
        lk = lower_kernel(body, packed)
        assert any(x.op == "DEFLOCAL" for x in lk.insts)
        _same(_run(body, packed, pb), bufs[kk.out], f"{kk.name} with row dots")
        _same(_run(body, packed, pb, LowerOptions(disabled={"row dots"})), bufs[kk.out], f"{kk.name} without")
        # and on the devices, the packs and the body as a plan of their own
        for dev in DEVICES:
            if dev == "NUMPY":
                continue
            bs = [Buffer.from_numpy(np.ascontiguousarray(b), dev) for b in bufs]
            bs += [Buffer.empty(sh, dt, dev) for sh, dt in scratch]
            get_device(dev).prepare(KernelPlan(packed.buffers, plan.n_inputs, pieces, [body.out], 0.0))(bs)
            _same(bs[kk.out].numpy(), bufs[kk.out], f"{kk.name} on {dev}")


def test_a_kernels_own_row_arrays_stay_within_a_threads_stack():
    """The row dots of a kernel's own reduction keep a row of the reduction's extent for each row of
    their block in local arrays (a thread's stack): each within ``ROW_STASH_MAX`` elements. At 4,096
    keys the row statistics' block is 4 rows, not 8 (8 x 4,096 floats was 128 KB an array)."""
    from eqgrad.graph.caps import ROW_STASH_MAX
    from eqgrad.lower.indexing import row_array_cap
    s_, d = 4096, 16
    q, k, v = (Tensor(_t(1, 1, s_, d, seed=i).numpy(), device="NUMPY", requires_grad=True) for i in range(3))
    ((q @ k.transpose(-1, -2) * 0.25).softmax(-1) @ v * _t(1, 1, s_, d, seed=3)).sum().backward()
    with eqgrad.Context(PEAK_MEMORY=4 * (3 * s_ * d + 3 * s_)):
        plan = engine.plan_for([q.grad.lazydata, k.grad.lazydata, v.grad.lazydata])[0].plan
    blocks = []
    for kk in plan.kernels:
        body = passes.row_pack(kk.ast, LowerOptions())[1]
        sched = passes.schedule_kernel(Kernel(kk.name, kk.out, body, body.buffers()))
        assert sched.root_dots, kk.name
        blocks.append(sched.root_block)
        for x, w, r in sched.root_dots:
            rows = sched.root_block or dict(sched.lanes).get(2, 1)
            assert row_array_cap(s_) * rows <= ROW_STASH_MAX, (kk.name, w, r, rows)
    assert sorted(blocks) == [0, 0, 0, 4, 4, 4]


def test_the_stash_is_stored_only_by_a_loop_over_the_unopened_row(plans):
    """The emitter's check: a hoisted sum stores the stashed value only when it loops over exactly
    the output elements the output loops have not opened yet, read at the open loops' row (a
    store from a loop over written outputs, or over another row, would overwrite results)."""
    (k,) = plans["softmax"].kernels
    lw = Lowerer(k, plans["softmax"])
    lw.sched = passes.schedule_kernel(k)
    (r,) = [n for n in k.ast.walk() if n.op == "RSUM"]
    o0, o1, zero = Lin.var("o0", 8), Lin.var("o1", 16), Lin.num(0)
    assert lw._covers_the_row(r, (o0, zero), [o0, None])
    assert not lw._covers_the_row(r, (o0, zero), [o0, o1])          # the row's loop is already open
    assert not lw._covers_the_row(r, (zero, zero), [o0, None])      # read at another row
    lw.sched = replace(lw.sched, stash=None)
    assert not lw._covers_the_row(r, (o0, zero), [o0, None])        # nothing to stash


def test_forced_lanes_of_the_kernel_search():
    plan = engine.plan_for([(_t(16, 8) @ _t(8, 32, seed=1)).lazydata])[0].plan
    bufs = _inputs(plan)
    k = plan.kernels[-1]
    for up in ((32, 4), (4, 4), (16, 1), (0, 0)):
        _same(_run(k, plan, bufs, upcast=up), bufs[k.out], f"upcast {up}")
    assert passes.schedule_kernel(k, LowerOptions(upcast=(4, 2))).lanes == ((0, 2), (1, 4))


def test_split_reductions_through_the_interpreter():
    """The plan-stage pass: with two threads and thresholds lowered, a full sum becomes 32
    partials and a final sum of them; both kernels, run in order, give the reference's value."""
    t = _t(64, 16).exp2()
    plan = engine.plan_for([t.sum().lazydata])[0].plan
    (k,) = plan.kernels
    options = LowerOptions(threads=2, parallel_min=-1.0, split_min=64, split_work=16)
    assert split_reduction(k, len(plan.buffers), LowerOptions(threads=1, parallel_min=-1.0, split_min=64)) is None
    assert split_reduction(k, len(plan.buffers), replace(options, disabled=frozenset({"split reductions"}))) is None
    k1, k2 = split_reduction(k, len(plan.buffers), options)
    assert k1.ast.shape[0] == 32 and k2.out == k.out
    split_plan = KernelPlan(plan.buffers + [(k1.ast.shape, k1.ast.dtype)], plan.n_inputs, [k1, k2], plan.outputs)
    bufs = _inputs(plan)
    ref = bufs[k.out]
    bufs.append(np.zeros(k1.ast.shape, np.float32))
    bufs[k1.out] = _run(k1, split_plan, bufs)
    _same(_run(k2, split_plan, bufs), ref, "split sum")


def test_passes_are_printed_at_debug_5(plans, capsys):
    with eqgrad.Context(DEBUG=5):
        lower_kernel(plans["softmax"].kernels[0], plans["softmax"])
    out = capsys.readouterr().out
    assert "--- passes" in out
    assert "hoist            applied: 2 reduction(s) after output loop 1" in out, out
    assert "lanes            skipped" in out and "parallel         applied: 1 loop(s)" in out


def test_unknown_pass_names_are_refused():
    with pytest.raises(ValueError, match=r"expected pass names from \['split reductions', 'lanes'.*got \['hoisting'\]"):
        LowerOptions(disabled={"hoisting"})


# ------------------------------------------------------------------ verification after every pass

def test_the_suite_verifies_every_lowered_kernel():
    assert config.VERIFY.value == 1, "tests/conftest.py turns EQGRAD_VERIFY on for the suite"


def test_a_pass_that_breaks_the_ir_is_named(plans, monkeypatch):
    """With EQGRAD_VERIFY the loop IR is checked after every pass: a broken pass (here one that
    declares every loop parallel, the hoisted reduction's too) is named in the error."""
    real = passes.Parallel.run
    monkeypatch.setattr(passes.Parallel, "run", lambda self, ctx, s: replace(real(self, ctx, s), parallel=3))
    with pytest.raises(LoopIRError, match=r"after pass 'parallel': parallel = 3: expected %\d+ to be a RANGE"):
        lower_kernel(plans["softmax"].kernels[0], plans["softmax"])
    with eqgrad.Context(VERIFY=0):              # unchecked, the broken IR goes through
        assert lower_kernel(plans["softmax"].kernels[0], plans["softmax"]).parallel == 3


def test_fuzz_index_lowerer_subclass_still_works(plans):
    """eqgrad/tools/fuzz_index.py subclasses Lowerer to record index expressions."""
    seen = []

    class Recording(Lowerer):
        def index(self, x):
            seen.append(x)
            return super().index(x)
    plan = plans["movement_chain"]
    lk = Recording(plan.kernels[0], plan).lower()
    verify(lk)
    assert seen


# ------------------------------------------------------------------ the verifier, rule by rule

P2 = [("b1", int32, True), ("b0", int32, False)]


def _good() -> list[LInst]:
    """out[i] = in[i // 2] * 3 + sum_j in[j], for i < 4 (every structural op once)."""
    ix = INDEX
    return [LInst("PARAM", int32, (), 0), LInst("PARAM", int32, (), 1),          # 0 1
            LInst("RANGE", ix, (), 4),                                           # 2
            LInst("CONST", ix, (), 2), LInst("IDIV", ix, (2, 3), NONNEG),        # 3 4
            LInst("LOAD", int32, (1, 4)), LInst("CONST", int32, (), 3),          # 5 6
            LInst("MUL", int32, (5, 6)),                                         # 7
            LInst("DEFACC", int32, (), 0), LInst("RANGE", ix, (), 2),            # 8 9
            LInst("LOAD", int32, (1, 9)), LInst("ACCUM", None, (8, 10), "ADD"),  # 10 11
            LInst("ENDRANGE", None, (9,)), LInst("ACCREAD", int32, (8,)),       # 12 13
            LInst("ADD", int32, (7, 13)), LInst("STORE", None, (0, 2, 14)),      # 14 15
            LInst("ENDRANGE", None, (2,))]                                       # 16


def _local() -> list[LInst]:
    """out[i] = in[0] + in[1], for i < 4, through a local array: each i stores in[0..1] into it and
    sums it back."""
    ix = INDEX
    return [LInst("PARAM", int32, (), 0), LInst("PARAM", int32, (), 1),          # 0 1
            LInst("RANGE", ix, (), 4), LInst("DEFLOCAL", int32, (), 2),          # 2 3
            LInst("RANGE", ix, (), 2), LInst("LOAD", int32, (1, 4)),             # 4 5
            LInst("STORE", None, (3, 4, 5)), LInst("ENDRANGE", None, (4,)),      # 6 7
            LInst("DEFACC", int32, (), 0), LInst("RANGE", ix, (), 2),            # 8 9
            LInst("LOAD", int32, (3, 9)), LInst("ACCUM", None, (8, 10), "ADD"),  # 10 11
            LInst("ENDRANGE", None, (9,)), LInst("ACCREAD", int32, (8,)),       # 12 13
            LInst("STORE", None, (0, 2, 13)), LInst("ENDRANGE", None, (2,))]    # 14 15


def _with(i: int, inst: LInst | None = None, insts: list[LInst] | None = None, **kw) -> LoopKernel:
    body = list(insts if insts is not None else _good())
    if inst is not None:
        body[i] = inst
    return LoopKernel("eqk", kw.pop("params", P2), body, parallel=kw.pop("parallel", 1))


def test_the_good_kernel_verifies_and_runs():
    lk = _with(0)
    verify(lk)
    out, inp = np.zeros(4, np.int32), np.arange(10, dtype=np.int32)
    run_loop(lk, [out, inp])
    np.testing.assert_array_equal(out, [i // 2 * 3 + 1 for i in range(4)])


def test_a_local_array_verifies_runs_and_is_read_only_where_stored():
    """DEFLOCAL: each work-item's own array; the interpreter checks every load reads an element the
    same declaration's iteration stored, and the bounds."""
    lk = _with(0, insts=_local())
    verify(lk)
    out, inp = np.zeros(4, np.int32), np.array([5, 7, 100], np.int32)
    run_loop(lk, [out, inp])
    np.testing.assert_array_equal(out, [12] * 4)
    unstored = _local()
    unstored[4] = LInst("RANGE", INDEX, (), 1)               # stores element 0 only; the sum reads 0 and 1
    verify(_with(0, insts=unstored))
    with pytest.raises(LoopIRError, match="LOAD at index 1 of a local array before any STORE there"):
        run_loop(_with(0, insts=unstored), [out, inp])
    past = _local()
    past[9] = LInst("RANGE", INDEX, (), 3)                   # reads element 2 of 2
    with pytest.raises(LoopIRError, match="LOAD at index 2 of its local array \\(2 elements\\)"):
        run_loop(_with(0, insts=past), [out, inp])


ix = INDEX
BAD: dict[str, tuple[LoopKernel, str]] = {
    "forward reference": (_with(7, LInst("MUL", int32, (5, 8))),
        r"%7 MUL: operands are earlier instructions"),
    "operand without a value": (_with(14, LInst("ADD", int32, (7, 11))),
        r"%14 ADD: operand %11 \(ACCUM\) has no value"),
    "unclosed loop": (_with(0, insts=_good()[:-1], parallel=0), r"loops \['%2'\] are never closed"),
    "ENDRANGE of an outer loop": (_with(12, LInst("ENDRANGE", None, (2,))),
        r"%12 ENDRANGE: closes the innermost open loop %9"),
    "value used after its loop": (_with(14, LInst("ADD", int32, (7, 10))),
        r"%14 ADD: operand %10 is defined inside loop %9, which is closed"),
    "ALU operands differ": (_with(6, LInst("CONST", float32, (), 3.0)),
        r"%7 MUL: operands of one dtype, got \['int32', 'float32'\]"),
    "comparison not bool": (_with(7, LInst("CMPLT", int32, (5, 6))),
        r"%7 CMPLT: dtype bool \(the op table's rule\), got int32"),
    "WHERE condition not bool": (_with(7, LInst("WHERE", int32, (5, 5, 6))),
        r"%7 WHERE: a bool condition, got int32"),
    "op-table kinds": (_with(7, LInst("EXP2", int32, (5,))), r"%7 EXP2: operands of kinds 'f'"),
    "load at a non-index": (_with(10, LInst("LOAD", int32, (1, 5))),
        r"%10 LOAD: an index-typed element number, got int32"),
    "load of another dtype": (_with(5, LInst("LOAD", float32, (1, 4))),
        r"%5 LOAD: parameter 1's dtype int32, got float32"),
    "load from a non-parameter": (_with(5, LInst("LOAD", int32, (3, 4))),
        r"%5 LOAD: src = \(a PARAM or DEFLOCAL, index\)"),
    "a local array of no elements": (_with(3, LInst("DEFLOCAL", int32, (), 0), insts=_local()),
        r"%3 DEFLOCAL: no operands, a dtype and an extent >= 1"),
    "a store of another dtype to a local array": (_with(3, LInst("DEFLOCAL", float32, (), 2), insts=_local()),
        r"%6 STORE: a value of parameter %3's dtype float32, got int32"),
    "a local array used after its loop": (_with(0, insts=_local()[:15] + [LInst("ENDRANGE", None, (2,)),
                                                                         LInst("LOAD", int32, (3, 4))]),
        r"operand %3 is defined inside loop %2, which is closed here"),
    "store to a read-only parameter": (_with(15, LInst("STORE", None, (1, 2, 14))),
        r"%15 STORE: a written parameter .* parameter 1 \(b0\)"),
    "store of another dtype": (_with(15, LInst("STORE", None, (0, 2, 4))),
        r"%15 STORE: a value of parameter 0's dtype int32, got index"),
    "PARAM outside the prefix": (_with(6, LInst("PARAM", int32, (), 1)),
        r"%6 PARAM: PARAM instructions are exactly the first 2"),
    "PARAM numbered wrong": (_with(1, LInst("PARAM", int32, (), 0)),
        r"%1 PARAM: PARAM 1 of dtype int32, got PARAM 0"),
    "ACCUM into a non-accumulator": (_with(11, LInst("ACCUM", None, (7, 10), "ADD")),
        r"%11 ACCUM: src = \(a DEFACC, value\)"),
    "ACCUM op": (_with(11, LInst("ACCUM", None, (8, 10), "MUL")), r"%11 ACCUM: arg in \('ADD', 'MAX'\)"),
    "ACCREAD dtype": (_with(13, LInst("ACCREAD", float32, (8,))),
        r"%13 ACCREAD: the accumulator's dtype int32, got float32"),
    "accumulator read without ACCREAD": (_with(14, LInst("ADD", int32, (7, 8))),
        r"%14 ADD: value operands, got an accumulator"),
    "index division by a variable": (_with(4, LInst("IDIV", ix, (2, 2))),
        r"%4 IDIV: index division by a positive CONST, got %2 RANGE"),
    "index division by zero": (_with(3, LInst("CONST", ix, (), 0)),
        r"%4 IDIV: index division by a positive CONST, got %3 CONST 0"),
    "index op outside index arithmetic": (_with(4, LInst("RECIP", ix, (2,))),
        r"%4 RECIP: index arithmetic with one of"),
    "mixed index and value": (_with(7, LInst("MUL", int32, (5, 4))), r"%7 MUL: operands all index or none"),
    "unknown op": (_with(7, LInst("FROB", int32, (5, 6))), r"%7 FROB: an op of the loop IR .* got 'FROB'"),
    "parallel loops that do not lead": (_with(0, parallel=2), r"parallel = 2: expected %3 to be a RANGE"),
    "RANGE extent": (_with(9, LInst("RANGE", ix, (), 0)),
        r"%9 RANGE: no operands, dtype index and an extent >= 1"),
    "CAST with an arg": (_with(7, LInst("CAST", float32, (5,), float32)), r"%7 CAST: no arg"),
}


@pytest.mark.parametrize("rule", list(BAD))
def test_the_verifier_rejects(rule):
    lk, msg = BAD[rule]
    with pytest.raises(LoopIRError, match=msg):
        verify(lk)


def test_the_verifier_accepts_what_the_interpreter_runs():
    """Index masks (bool AND of comparisons, WHERE over indices), casts, a bool store."""
    b = [("b1", bool_, True), ("b0", float32, False)]
    insts = [LInst("PARAM", bool_, (), 0), LInst("PARAM", float32, (), 1), LInst("RANGE", ix, (), 6),
             LInst("CONST", ix, (), -1), LInst("ADD", ix, (2, 3)), LInst("CONST", ix, (), -1),
             LInst("CMPLT", bool_, (5, 4)), LInst("CONST", ix, (), 4), LInst("CMPLT", bool_, (4, 7)),
             LInst("AND", bool_, (6, 8)), LInst("CONST", ix, (), 0), LInst("WHERE", ix, (9, 4, 10)),
             LInst("LOAD", float32, (1, 11)), LInst("CAST", int32, (12,)), LInst("CAST", bool_, (13,)),
             LInst("STORE", None, (0, 2, 14)), LInst("ENDRANGE", None, (2,))]
    lk = LoopKernel("eqk", b, insts, parallel=1)
    verify(lk)
    out = np.zeros(6, np.bool_)
    run_loop(lk, [out, np.array([0.0, 2.5, 0.0, -1.0], np.float32)])
    np.testing.assert_array_equal(out, [False, False, True, False, True, False])


def _dv_kernel(permuted: bool, seed: int) -> tuple:
    """attention's gradient of v as one kernel, ``dv[j, e] = sum_i exp2(q_i . k_j) * g[i, e]``
    (n_i 12 queries, n_j 16 keys, head dims 8 for the scores and e = 32 for g): as a sum of shape
    (keys, head dim), or, ``permuted``, as autograd writes it, ``(g.T @ p).T`` -- a sum of shape
    (head dim, keys) read through a permute. (its output, its sum, the scores' dot product, the
    kernel, its plan, the buffers, the kernel reference's values)."""
    from eqgrad.graph.plan import KNode
    n_i, n_j, d, e = 12, 16, 8, 32
    f = float32

    def buf(k, shape):
        return KNode("BUF", (), k, shape, f)

    def expand(x, shape, to):
        return KNode("EXPAND", (KNode("RESHAPE", (x,), shape, shape, f),), to, to, f)
    q, k, g = buf(1, (n_i, d)), buf(2, (n_j, d)), buf(3, (n_i, e))
    prod = KNode("MUL", (expand(q, (n_i, 1, d), (n_i, n_j, d)), expand(k, (1, n_j, d), (n_i, n_j, d))), None,
                 (n_i, n_j, d), f)
    s = KNode("RSUM", (prod,), (2,), (n_i, n_j, 1), f)
    p = KNode("EXP2", (KNode("RESHAPE", (s,), (n_i, n_j), (n_i, n_j), f),), None, (n_i, n_j), f)
    if permuted:
        body = KNode("MUL", (expand(g, (n_i, e, 1), (n_i, e, n_j)), expand(p, (n_i, 1, n_j), (n_i, e, n_j))), None,
                     (n_i, e, n_j), f)
        red = KNode("RSUM", (body,), (0,), (1, e, n_j), f)
        out = KNode("PERMUTE", (KNode("RESHAPE", (red,), (e, n_j), (e, n_j), f),), (1, 0), (n_j, e), f)
    else:
        body = KNode("MUL", (expand(p, (n_i, n_j, 1), (n_i, n_j, e)), expand(g, (n_i, 1, e), (n_i, n_j, e))), None,
                     (n_i, n_j, e), f)
        red = KNode("RSUM", (body,), (0,), (1, n_j, e), f)
        out = KNode("RESHAPE", (red,), (n_j, e), (n_j, e), f)
    kern = Kernel("k0", 0, out, (1, 2, 3))
    plan = KernelPlan([((n_j, e), f), ((n_i, d), f), ((n_j, d), f), ((n_i, e), f)], 3, [kern], [0])
    rng = np.random.default_rng(seed)
    bufs = [np.zeros((n_j, e), np.float32)] + [rng.uniform(-0.5, 0.5, sh).astype(np.float32)
                                               for sh in ((n_i, d), (n_j, d), (n_i, e))]
    return out, red, s, kern, plan, bufs, run_kernel(kern, bufs)


def _run_dv(kern, plan, bufs, ref, upcast=None):
    """The dv kernel lowered (``upcast``: forced lanes), verified and run by the interpreter against
    the reference; its loop IR."""
    lk = lower_kernel(kern, plan, upcast)
    verify(lk)
    got = np.zeros(bufs[0].size, np.float32)
    run_loop(lk, [got] + [b.reshape(-1).copy() for b in bufs[1:]])
    _same(got.reshape(bufs[0].shape), ref, "dv as one kernel")
    return lk


def test_a_permuted_contraction_whose_lanes_share_a_factor_computes_it_once_per_element():
    """attention's dv as autograd writes it: ``(g.T @ p).T``, a sum over the queries of shape
    (head dim, keys) read through a permute, with p recomputed from the scores ``q_i . k_j``. The
    lanes run along the root's last axis -- the head dim, the sum's *first* kept axis
    (graph/plan.py ``lanes_axis``) -- and p is broadcast along it, so the lanes pass gives the
    kernel one-axis lanes over the whole head dim and each dot product is reduced once per
    (query, key); the values match the kernel reference."""
    from eqgrad.graph.plan import lanes_axis
    from eqgrad.lower.passes import lane_shared, row_lanes, rows_kept
    out, red, s, kern, plan, bufs, ref = _dv_kernel(True, 5)
    assert lanes_axis(out, lambda n: n.op, lambda n: n.arg, lambda n: n.src, lambda n: n.shape) == (red, 1)
    assert lane_shared(out) == (s,) and row_lanes(out) and rows_kept(out)
    lk = _run_dv(kern, plan, bufs, ref)
    assert len([x for x in lk.insts if x.op == "DEFACC"]) == 1 + 32     # the dot's one + the head dim's lanes


def test_explain_shows_row_fusion_and_the_stash():
    x = Tensor(np.random.default_rng(3).uniform(-2, 2, (8, 64)).astype(np.float32))
    ex = eqgrad.explain(x.softmax(-1))
    assert ("k0", "stash", "EXP2 stored by its row's reduction") in ex.lowering()
    assert "lowering: k0 hoist: 2 reduction(s) after output loop 1; k0 stash: EXP2" in str(ex)
    ln = eqgrad.explain(F.layer_norm(x, (64,)))
    assert [p for _, p, _ in ln.lowering()] == ["hoist"]         # x - mean is recomputed, not stashed
    assert eqgrad.explain(x * 2).lowering() == []


def test_a_reduction_the_lanes_share_is_computed_once_per_distinct_element_in_a_loop_llvm_may_widen():
    """attention's gradient of v as one kernel: ``dv[j, e] = sum_i exp2(q_i . k_j) * g[i, e]``. The
    dot product ``q_i . k_j`` is the same for every head-dim lane of a key, so it is reduced once
    per distinct key the lanes read (one accumulator, not one per lane: 16 head-dim lanes had each
    run it); the lanes pass gives such a kernel one-axis lanes over the whole head dim
    (``passes.lane_shared``; a block of 16 head dims x 4 keys reduced each dot twice), so the dot is
    reduced once per (i, j). Its loop -- a reduction inside the root's -- is one of the
    loops the LLVM renderer lets its loop vectorizer widen (``LoopKernel.row_loops``). One kernel at
    b1 h4 s256 d32: 11.1 -> 2.5 ms (the materializing plan: 0.9 ms)."""
    out, red, s, kern, plan, bufs, ref = _dv_kernel(False, 4)
    # the lanes pass's own block: one axis, all 32 head dims; forced to 16 x 1 (the kernel search),
    # one axis of 16 lanes: the dot once per block of 16 head dims
    for upcast, lanes in ((None, 32), ((16, 1), 16)):
        lk = _run_dv(kern, plan, bufs, ref, upcast)
        accs = [x for x in lk.insts if x.op == "DEFACC"]
        assert len(accs) == 1 + lanes, (upcast, len(accs))     # the dot's one accumulator + the root's lanes
        nested = [i for i, x in enumerate(lk.insts) if x.op == "RANGE" and i in lk.row_loops]
        assert nested, "the dot product's loop is not offered to the loop vectorizer"


def test_a_pad_under_lanes_keeps_the_reduction_below_it_one_loop_nest(plans):
    """RoPE's rotated half of a projection (``cat(-t[..., h:], t[..., :h]) * sin``, pads of the
    product) under a 2 x 16 lane block: each lane's index and mask go to the product's lanes
    together, one loop nest with one accumulator per lane for the direct half and one for the
    rotated half -- a PAD once rendered every lane alone, a scalar reduce loop per lane (66 loops
    here; a LLaMA decode step's 576-wide q projection with 9 heads ran in 826 us, 340 after, and
    its LLVM compile of the step 3.8 s with 3 x 16 lane blocks, 0.73 s after)."""
    plan = plans["rope_lanes"]
    (k,) = plan.kernels
    lk = lower_kernel(k, plan)
    assert sum(1 for x in lk.insts if x.op == "RANGE") == 4      # two output loops, two reduce loops
