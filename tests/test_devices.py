"""Devices: renderer semantics on special values, kernel-source goldens, CUDA C compiled to PTX,
device buffers, cross-device copies and device selection errors.

Goldens: ``tests/golden/devices/<case>.{ll,cl,cu}`` hold the LLVM IR, OpenCL C and CUDA C of a small
corpus of programs (planned on the NUMPY device, so they need no GPU). After an intended change to
lowering, a renderer or the plans, regenerate them with

    EQGRAD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_devices.py -k golden

and read the diff.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import eqgrad
import eqgrad.devices as devices
from eqgrad import DeviceError, Tensor, engine
from eqgrad.devices import Buffer, get_device
from eqgrad.devices.cuda import CUDARenderer, compile_ptx, nvcc
from eqgrad.devices.llvm import render_llvm
from eqgrad.devices.opencl import OpenCLRenderer
from eqgrad.dtype import DType, bool_, float32, int32
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.graph.loopir import LoopKernel
from eqgrad.lower.decomp import ERF_ULP
from eqgrad.lower.lowering import lower_kernel
from eqgrad.ops import ALU_OPS, OPS
from conftest import DEVICES, data

GOLDEN = Path(__file__).parent / "golden" / "devices"
UPDATE = os.environ.get("EQGRAD_UPDATE_GOLDEN") == "1"
HAS_OPENCL = "OPENCL" in DEVICES
HAS_CUDA = "CUDA" in DEVICES

# ---------------------------------------------------------------------------- one op per kernel
# Each ALU op on every dtype it accepts, as a hand-built one-kernel plan (no e-graph involved), on
# inputs full of special values: every device must agree with the op table's NumPy reference.
SPECIAL = {
    float32: np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.75, 1e-40, -1e-38, 3e38, -3e38, np.inf, -np.inf,
                       np.nan, 2147483648.0, -2147483904.0, 2147483520.0, 100.5, -7.0, 1e10], np.float32),
    int32: np.array([0, 1, -1, 2, -2, 7, -7, 3, 2**31 - 1, -2**31, 123456, -99999], np.int32),
    bool_: np.array([False, True]),
}
KIND = {"f": float32, "i": int32, "b": bool_}
LOOSE = {"EXP2", "LOG2", "SIN", "ERF"}    # library functions: compared with a tolerance


def _buf(i: int, shape: tuple[int, ...], dt: DType) -> KNode:
    return KNode("BUF", (), i, shape, dt)


def op_plan(op: str, dts: list[DType], out: DType, shape: tuple[int, ...], arg=None) -> KernelPlan:
    srcs = tuple(_buf(i, shape, d) for i, d in enumerate(dts))
    out_shape = OPS[op].shape_rule([shape] * len(dts), arg)
    ast = KNode(op, srcs, arg, out_shape, out)
    n = len(dts)
    return KernelPlan([(shape, d) for d in dts] + [(out_shape, out)], n, [Kernel("k0", n, ast, tuple(range(n)))], [n])


def op_cases() -> dict[str, tuple[str, list[DType], DType, object]]:
    cases = {}
    for name in ALU_OPS:
        o = OPS[name]
        if name == "CAST":
            for s in (float32, int32, bool_):
                for d in (float32, int32, bool_):
                    if s != d:
                        cases[f"CAST-{s.name}-{d.name}"] = (name, [s], d, d)
            continue
        if name == "BITCAST":                 # the widths every device has
            cases["BITCAST-float32-int32"] = (name, [float32], int32, int32)
            cases["BITCAST-int32-float32"] = (name, [int32], float32, float32)
            continue
        for k in o.dtypes:
            dt = KIND[k]
            dts = [dt] * o.arity
            if name == "WHERE":
                dts[0] = bool_
            cases[f"{name}-{dt.name}"] = (name, dts, o.dtype_rule(dts, None), None)
    for r in ("RSUM", "RMAX"):
        for k in OPS[r].dtypes:
            cases[f"{r}-{KIND[k].name}"] = (r, [KIND[k]], KIND[k], (1,))
            cases[f"{r}-{KIND[k].name}-long"] = (r, [KIND[k]], KIND[k], (1,))    # shared by a work-group
    return cases


OP_CASES = op_cases()


def long_rows(dt: DType) -> np.ndarray:
    """Rows of 512 (long enough for a work-group reduction on every device) with special values."""
    rng = np.random.default_rng(5)
    if dt is float32:
        rows = rng.standard_normal((4, 512)).astype(np.float32)
        rows[1, 300], rows[2, 7], rows[3, [5, 400]] = np.inf, np.nan, (-np.inf, np.inf)
        return rows
    if dt is int32:
        return np.stack([np.resize(SPECIAL[int32], 512), rng.integers(-2**31, 2**31 - 1, 512, dtype=np.int32)])
    rows = np.zeros((4, 512), bool)
    rows[1, 511], rows[2] = True, True
    rows[3] = rng.random(512) < 0.5
    return rows


def op_inputs(case: str) -> list[np.ndarray]:
    """Every combination of the special values of each source (a 2-d grid for reductions)."""
    name, dts = OP_CASES[case][:2]
    vals = [SPECIAL[d] for d in dts]
    if case.endswith("-long"):
        return [long_rows(dts[0])]
    if name in ("RSUM", "RMAX"):
        v = vals[0]
        return [np.stack([np.roll(v, i) for i in range(3)] + [v[:1].repeat(len(v))])]
    grids = np.meshgrid(*vals, indexing="ij")
    return [g.reshape(-1).copy() for g in grids]


def run_plan(plan: KernelPlan, inputs: list[np.ndarray], device: str) -> np.ndarray:
    bufs = [Buffer.from_numpy(x, device) for x in inputs]
    bufs += [Buffer.empty(s, d, device) for s, d in plan.buffers[len(inputs):]]
    get_device(device).prepare(plan)(bufs)
    return bufs[plan.outputs[0]].numpy()


@pytest.mark.parametrize("case", list(OP_CASES))
def test_op_semantics_on_special_values(device, case):
    name, dts, out, arg = OP_CASES[case]
    inputs = op_inputs(case)
    plan = op_plan(name, dts, out, inputs[0].shape, arg)
    got = run_plan(plan, inputs, device)
    with np.errstate(all="ignore"):
        ref = OPS[name].ref(inputs, arg, out)
    if case == "RSUM-float32-long":           # summation order differs between devices
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    elif out is float32 and name in LOOSE:
        # exp2 may flush results below 2**-127 to 0 (docs/semantics.md); sin of huge arguments
        # differs in the last bits between libraries
        # (erf: within ERF_ULP float32 ulp, docs/semantics.md)
        rtol = {"SIN": 1e-6, "ERF": ERF_ULP * 2.0 ** -23}.get(name, 4e-7)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=1.2e-38 if name != "SIN" else 1e-6,
                                   equal_nan=True, err_msg=case)
    else:
        np.testing.assert_array_equal(got, ref, err_msg=f"{case} on {device}\ninputs: {inputs}")


# ---------------------------------------------------------------------------- goldens
def _xs(shape, seed=0):
    return Tensor(data(shape, seed=seed), device="NUMPY")


CORPUS: dict[str, Callable[[], Tensor]] = {
    "elementwise": lambda: ((_xs((16,), 1) * _xs((16,), 2) + _xs((16,), 3)) * 0.5 - _xs((16,), 1)).exp()
                           .add(_xs((16,), 2).abs()).log(),
    "sum_rows": lambda: _xs((4, 8)).sum(1),
    "max_all": lambda: _xs((4, 8)).max(),
    "sum_long": lambda: _xs((2, 256)).sum(1),            # long enough to reduce with a work-group
    "any_long": lambda: (_xs((512,)) > 2.5).any(),       # bool, no parallel loop
    "softmax": lambda: _xs((4, 8)).softmax(-1),
    "matmul": lambda: _xs((2, 8), 1) @ _xs((8, 4), 2),
    "pad_flip": lambda: _xs((3, 4)).pad(((1, 0), (0, 2))).flip(1).relu(),
    "int_div_mod": lambda: (Tensor(data((6,), np.int32, seed=1), device="NUMPY")
                            // Tensor(data((6,), np.int32, seed=2), device="NUMPY")
                            + Tensor(data((6,), np.int32, seed=3), device="NUMPY") % 3),
    "casts": lambda: (_xs((5,)).cast(eqgrad.int32) + (_xs((5,), 2) > 0).cast(eqgrad.int32)).maximum(
        Tensor(data((5,), np.int32), device="NUMPY")),
}


def corpus_kernels(case: str) -> list[LoopKernel]:
    """The loop IR of every kernel of a corpus program's plan (planned on NUMPY: no GPU needed)."""
    CORPUS[case]().realize()
    plan = engine.last_plan.plan
    out = []
    for k in plan.kernels:
        lk = lower_kernel(k, plan)
        lk.name = "eqk"
        out.append(lk)
    return out


RENDERERS = {"ll": render_llvm, "cl": OpenCLRenderer().render, "cu": CUDARenderer().render}


@pytest.mark.parametrize("ext", list(RENDERERS))
@pytest.mark.parametrize("case", list(CORPUS))
def test_kernel_source_golden(case, ext):
    src = "".join(f"// ---- kernel {i}\n{RENDERERS[ext](lk)}\n" for i, lk in enumerate(corpus_kernels(case)))
    path = GOLDEN / f"{case}.{ext}"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
    assert path.exists(), f"missing golden {path}; create it with EQGRAD_UPDATE_GOLDEN=1"
    assert src == path.read_text(), (f"kernel source of {case!r} ({ext}) changed; if intended, regenerate with "
                                     "EQGRAD_UPDATE_GOLDEN=1 and review the diff")



def test_short_loops_over_strided_rows_are_not_vectorized():
    """A loop of at most GATHER_TRIP iterations that holds the rows it strides over (an attention
    score's 15 query rows of 15, rows of 16) keeps LLVM's loop vectorizer off (``!6``: it made one
    vector of gathers and scatters of it, docs/lowering.md); the loop over a column sum's 15 columns, whose
    loads step by 1 along it, and a loop over 40 rows of 3 keep it -- the columns' loop, holding only
    short loops, left to LLVM to unroll too (``!0``, ``_short_nests``), the rows' loop, split across
    threads, not (``!4``). The LLVM device's numbers are NumPy's."""
    from eqgrad.devices.llvm import GATHER_TRIP

    def latches(t: Tensor, extent: int) -> set[str]:
        """The metadata of the latches of the loops of ``extent`` iterations that hold another loop."""
        t.realize()
        plan = engine.last_plan.plan
        out = set()
        for k in plan.kernels:
            lk = lower_kernel(k, plan)
            src = render_llvm(lk).splitlines()
            ranges = [i for i, x in enumerate(lk.insts) if x.op == "RANGE"]
            closes = {x.src[0]: i for i, x in enumerate(lk.insts) if x.op == "ENDRANGE"}
            for r in ranges:
                if lk.insts[r].arg == extent and any(r < q < closes[r] for q in ranges):
                    out.add(next(ln for ln in src if ln.strip().startswith(f"br label %L{r}.cond, !llvm.loop")).split()[-1])
        return out
    x = data((2, 3, 15, 15), seed=4)
    x16 = data((2, 3, 16, 16), seed=6)
    r = data((40, 3), seed=5)
    cases = {"rows": (lambda t: t - t.amax(-1, keepdim=True), x, lambda a: a - a.max(-1, keepdims=True), 15, "!6"),
             "rows of 16": (lambda t: t - t.amax(-1, keepdim=True), x16, lambda a: a - a.max(-1, keepdims=True), 16, "!6"),
             "row sums": (lambda t: t.sum(-1), x, lambda a: a.sum(-1), 15, "!6"),
             "columns": (lambda t: t.sum(-2), x, lambda a: a.sum(-2), 15, "!0"),
             "rows of 3": (lambda t: t.sum(-1), r, lambda a: a.sum(-1), 40, "!4")}
    assert GATHER_TRIP >= 16
    for name, (f, a, ref, extent, tag) in cases.items():
        assert latches(f(Tensor(a, device="NUMPY")), extent) == {tag}, name
        np.testing.assert_allclose(f(Tensor(a, device="LLVM")).numpy(), ref(a), rtol=1e-5, atol=1e-5, err_msg=name)
    src = render_llvm(lower_kernel(engine.last_plan.plan.kernels[0], engine.last_plan.plan))
    assert "!llvm.loop !6" not in src and "!7 = " not in src          # the metadata only where it is used




def test_short_nests_are_left_to_llvm_to_unroll():
    """A loop of a constant trip count that holds only loops of fewer than GATHER_TRIP iterations
    in all (max-pool's backward over 2 x 2 windows: a max, a count and the output per window, under
    the loop over 16 windows) gets no ``llvm.loop.unroll.disable``, nor do the loops inside it: LLVM
    unrolls the short loops and vectorizes the window loop (it ran the windows one at a time, 5x
    slower, docs/lowering.md). The loops that hold that loop keep the metadata, as does a loop
    split across threads or of a run-time extent. Numbers: NumPy's, forward and backward."""
    from eqgrad.devices.llvm import GATHER_TRIP, _outer_loops, _short_nests
    from eqgrad.graph.loopir import INDEX, LInst, LoopKernel
    from eqgrad.nn import functional as F

    def nest(*loops: tuple) -> LoopKernel:
        """A kernel of empty loops: each (extent, *the loops inside it); RANGE ids in order."""
        insts: list[LInst] = []

        def emit(extent: int, *inner: tuple) -> None:
            r = len(insts)
            insts.append(LInst("RANGE", INDEX, (), extent))
            for x in inner:
                emit(*x)
            insts.append(LInst("ENDRANGE", None, (r,)))
        for x in loops:
            emit(*x)
        return LoopKernel("eqk", [], insts)
    # b(32) { w(16) { m(4) s(4) o(2) { o2(2) } } } -> RANGEs 0, 1, 2, 4, 6, 7
    k = nest((32, (16, (4,), (4,), (2, (2,)))))
    assert _short_nests(k, set()) == ({1}, {2, 4, 6, 7}) and _outer_loops(k) == {0, 1, 6}
    assert _short_nests(k, {1}) == ({6}, {7})                          # w of a run-time extent
    assert _short_nests(nest((8, (16,))), set()) == (set(), set())     # a loop of 16: a vector
    assert _short_nests(nest((8, (10,), (6,))), set()) == ({0}, {1, 3})  # 10 and 6: each < 16
    assert _short_nests(nest((8, (4, (4,)))), set()) == ({1}, {2})     # the 8 holds 16 in all
    assert GATHER_TRIP == 16

    x = data((2, 3, 8, 8), seed=7)
    g = data((2, 3, 4, 4), seed=8)
    t = Tensor(x, device="LLVM", requires_grad=True)
    y = F.max_pool2d(t, 2)
    (y * Tensor(g, device="LLVM")).sum().backward()
    w = x.reshape(2, 3, 4, 2, 4, 2)
    m = w.max((3, 5), keepdims=True)
    hit = (w == m).astype(np.float32)
    ref = (hit * (g[:, :, :, None, :, None] / hit.sum((3, 5), keepdims=True))).reshape(x.shape)
    np.testing.assert_allclose(y.numpy(), m.reshape(2, 3, 4, 4), rtol=1e-6)
    np.testing.assert_allclose(t.grad.numpy(), ref, rtol=1e-5, atol=1e-6)
    a = F.avg_pool2d(Tensor(x, device="LLVM"), 3, 1).numpy()
    np.testing.assert_allclose(a, np.lib.stride_tricks.sliding_window_view(x, (3, 3), (2, 3)).mean((-1, -2)),
                               rtol=1e-5, atol=1e-6)


def test_masked_reads_load_under_their_mask():
    """A pad's border is read through a clamped address whose value the mask then discards; LLVM
    loads it under a branch on the mask from the unclamped address instead (``_guarded_loads``: an
    affine address, a masked vector load, where the clamped one was a gather) -- only where every
    use of the value ends in that mask's WHERE, before any store, load or accumulation. Numbers:
    NumPy's, borders included, through a bool mask, a broadcast, a shifted slice and an integer
    division by a padded divisor (0 at the border: x // 0 = 0, docs/semantics.md)."""
    from eqgrad.devices.llvm import _guarded_loads
    from eqgrad.graph.loopir import INDEX, LInst
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    m = rng.random((2, 3, 5, 7)) < 0.5
    b = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    n = rng.integers(-9, 9, (4, 6)).astype(np.int32)
    d = rng.integers(1, 4, (4, 6)).astype(np.int32)
    pads = ((0, 0), (0, 0), (1, 2), (2, 1))
    cases = {
        "pad": (lambda a, m, b, n, d: a.pad((None, None, (1, 2), (2, 1))), lambda: np.pad(a, pads)),
        "where": (lambda a, m, b, n, d: m.where(a + b, 0.0).pad((None, None, (1, 2), (2, 1))).exp(),
                  lambda: np.exp(np.pad(np.where(m, a + b, 0), pads))),
        "shift": (lambda a, m, b, n, d: a[..., 1:].pad((None, None, None, (0, 1))) + a,
                  lambda: np.pad(a[..., 1:], ((0, 0), (0, 0), (0, 0), (0, 1))) + a),
        "division": (lambda a, m, b, n, d: n.pad(((1, 0), (0, 1))) // d.pad(((1, 0), (0, 1))),
                     lambda: np.where(np.pad(d, ((1, 0), (0, 1))) == 0, 0,
                                      np.floor_divide(np.pad(n, ((1, 0), (0, 1))), np.maximum(np.pad(d, ((1, 0), (0, 1))), 1)))),
    }
    for name, (f, ref) in cases.items():
        args = [Tensor(v, device="NUMPY") for v in (a, m, b, n, d)]
        f(*args).realize()
        plan = engine.last_plan.plan
        assert any(_guarded_loads(lower_kernel(k, plan)) for k in plan.kernels), name
        got = f(*[Tensor(v, device="LLVM") for v in (a, m, b, n, d)]).numpy()
        np.testing.assert_allclose(got, ref(), rtol=1e-6, atol=1e-6, err_msg=name)
    # a masked read whose value is stored, or read as an address, before its mask discards it: not guarded
    ix, f32 = INDEX, float32
    head = [LInst("PARAM", f32, (), 0), LInst("PARAM", f32, (), 1), LInst("RANGE", ix, (), 4),   # 0 1 2
            LInst("CONST", ix, (), 1), LInst("CMPLT", bool_, (3, 2)), LInst("CONST", ix, (), -1),  # 3 4 5
            LInst("ADD", ix, (2, 5)), LInst("CONST", ix, (), 0), LInst("WHERE", ix, (4, 6, 7)),    # 6 7 8
            LInst("LOAD", f32, (1, 8)), LInst("CONST", f32, (), 0.0)]                            # 9 10
    params = [("b1", f32, True), ("b0", f32, False)]
    masked = LInst("WHERE", f32, (4, 9, 10))                                                    # 11
    kept = LoopKernel("k", params, head + [LInst("NEG", f32, (9,)), LInst("WHERE", f32, (4, 11, 10)),
                                           LInst("STORE", None, (0, 2, 12)), LInst("ENDRANGE", None, (2,))], parallel=1)
    stored = LoopKernel("k", params, head + [masked, LInst("STORE", None, (0, 2, 9)), LInst("ENDRANGE", None, (2,))],
                        parallel=1)
    other = LoopKernel("k", params, head + [LInst("WHERE", f32, (4, 10, 9)), LInst("STORE", None, (0, 2, 11)),
                                            LInst("ENDRANGE", None, (2,))], parallel=1)
    assert _guarded_loads(kept) == {9: (4, 6)}
    assert _guarded_loads(stored) == {} and _guarded_loads(other) == {}


def test_a_lane_group_of_padded_reads_is_one_masked_vector_load():
    """Register lanes reading consecutive elements each under its own mask (a Pad inside a
    reduction: a convolution's padded input along its rows) load one masked vector
    (``_Lanes._masked_load``: ``llvm.masked.load``; the lanes whose mask is off are not read and
    read as 0), where each lane's select of a safe index made them one scalar load a lane (a padded
    convolution fused with its padding ran ~8x slower than on a padded copy). The lanes' masks are
    built as the bits of one integer (most lanes share one; W inserts of an i1 became W mask-register
    shifts on AVX-512). Numbers against NumPy/torch: borders on both sides, widths that are and are
    not a lane multiple, wider pads than the window's reach, a pad along an axis that is not the
    lanes' (one mask for every lane), forward and the input's gradient (a padded read as well)."""
    import torch
    import eqgrad.nn.functional as F
    from dataclasses import replace
    from eqgrad.extract import using
    from eqgrad.extract.cost import params_for
    rng = np.random.default_rng(11)
    free = replace(params_for("LLVM"), masked_read=0.0)        # (the fused plan whatever the target)
    seen = 0
    for (n, c, h, wd, o, k, pad) in ((2, 3, 8, 16, 4, 3, 1), (1, 2, 7, 33, 3, 3, 1), (2, 4, 9, 12, 8, 5, 2),
                                     (1, 1, 6, 32, 2, 3, 3), (1, 3, 5, 40, 4, 3, (0, 1))):
        xn = rng.standard_normal((n, c, h, wd), dtype=np.float32)
        wn = rng.standard_normal((o, c, k, k), dtype=np.float32)
        xt = torch.tensor(xn, requires_grad=True)
        ref = torch.nn.functional.conv2d(xt, torch.tensor(wn), padding=pad)
        ref.backward(torch.ones_like(ref))
        with using(params={"LLVM": free}):
            x = Tensor(xn, requires_grad=True)
            y = F.conv2d(x, Tensor(wn), padding=pad)
            got = y.numpy()
            plan = engine.last_plan.plan
            seen += sum("@llvm.masked.load" in render_llvm(lower_kernel(kk, plan)) for kk in plan.kernels)
            y.sum().backward()
            grad = x.grad.numpy()
        scale = np.abs(ref.detach().numpy()).max()
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-5, atol=1e-5 * scale, err_msg=str((n, c, h, wd, k, pad)))
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-5, atol=1e-5 * np.abs(xt.grad.numpy()).max())
    assert seen, "no padded read was a masked lane group"      # (which ones: the target's lane widths)
    # a masked lane group's IR: one masked load of W floats under a mask built from an integer
    with using(params={"LLVM": free}):
        F.conv2d(Tensor(rng.standard_normal((1, 2, 6, 32), dtype=np.float32)), Tensor(np.ones((4, 2, 3, 3), np.float32)),
                 padding=1).realize()
        plan = engine.last_plan.plan
    ir = render_llvm(lower_kernel(plan.kernels[-1], plan))
    import re
    assert "@llvm.masked.load.v" in ir and re.search(r"bitcast i\d+ %\w+ to <\d+ x i1>", ir) and not re.search(r"insertelement <\d+ x i1>", ir)


# ---------------------------------------------------------------------------- CUDA C -> PTX (no GPU needed)
def _cuda_corpus() -> list[tuple[str, str]]:
    r = CUDARenderer()
    out = []
    for case in CORPUS:
        for i, lk in enumerate(corpus_kernels(case)):
            out.append((f"{case}_{i}", r.render(lk)))
    for case, (name, dts, o, arg) in OP_CASES.items():
        plan = op_plan(name, dts, o, op_inputs(case)[0].shape, arg)
        lk = lower_kernel(plan.kernels[0], plan)
        lk.name = "eqk"
        out.append((case.replace("-", "_"), r.render(lk)))
    for name, shape in (("grid4d", (2, 3, 4, 5)), ("flat", (70000, 2, 2))):
        # x + y.T over the last two axes: a transposed read keeps the kernel's loops (an elementwise
        # kernel over whole buffers is lowered as one flat loop, lower/collapse.py)
        perm = tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2)
        yt = _buf(1, tuple(shape[p] for p in perm), float32)
        ast = KNode("ADD", (_buf(0, shape, float32), KNode("PERMUTE", (yt,), perm, shape, float32)), None, shape, float32)
        plan = KernelPlan([(shape, float32), (yt.shape, float32), (shape, float32)], 2, [Kernel("k0", 2, ast, (0, 1))], [2])
        lk = lower_kernel(plan.kernels[0], plan)
        lk.name = "eqk"
        assert r.launch(lk).mode == name[:4]
        out.append((name, r.render(lk)))
    return out


@pytest.mark.skipif(nvcc() is None, reason="nvcc not found (PATH, $CUDA_ROOT/bin)")
def test_cuda_kernels_compile_to_ptx():
    """Every kernel of the corpus and of the op cases, compiled with nvcc in one translation unit
    (one namespace per kernel); on failure each is compiled alone to name the culprit."""
    kernels = _cuda_corpus()
    unit = "".join(f"namespace {name} {{\n{src.replace('void eqk(', f'void {name}(')}}}\n" for name, src in kernels)
    try:
        ptx = compile_ptx(unit)
    except DeviceError:
        for name, src in kernels:
            compile_ptx(src)         # raises with this kernel's source and nvcc's message
        raise
    for name, _ in kernels:
        assert f".entry {name}(" in ptx, name


# ---------------------------------------------------------------------------- buffers and copies
@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_opencl_buffers_live_on_the_device():
    import pyopencl as cl
    t = Tensor(np.arange(6, dtype=np.float32), device="OPENCL") * 2
    t.realize()
    buf = t.lazydata.buffer
    assert isinstance(buf.raw, cl.Buffer) and buf.device == "OPENCL"
    with pytest.raises(DeviceError, match=r"OPENCL lives in device memory.*\.numpy\(\)"):
        buf.data
    np.testing.assert_array_equal(t.numpy(), np.arange(6) * 2)


def test_one_program_writes_shared_lines_once_and_keeps_conflicting_ones_apart():
    from eqgrad.devices.cstyle import one_program
    pre = "__kernel void"
    a = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\ninline float h(float a) { return a; }\n"
         f"{pre} eqk(__global float* x) {{\n  x[0] = h(x[0]);\n}}\n")
    b = f"inline float h(float a) {{ return a; }}\n{pre} eqk(__global float* x) {{\n  x[0] = 2.0f;\n}}\n"
    c = f"__constant float t[2] = {{1.0f, 2.0f}};\n{pre} eqk(__global float* x) {{\n  x[0] = t[1];\n}}\n"
    d = f"__constant float t[2] = {{3.0f, 4.0f}};\n{pre} eqk(__global float* x) {{\n  x[0] = t[0];\n}}\n"
    progs = one_program([b, a, c, d], pre)
    assert [names for _, names in progs] == [["eqk_0", "eqk_1", "eqk_2"], ["eqk_3"]]
    one = progs[0][0]
    assert one.startswith("#pragma OPENCL EXTENSION cl_khr_fp64")       # before everything it enables
    assert one.count("inline float h(") == 1 and one.count("__constant float t[2]") == 1
    assert all(f"{pre} eqk_{j}(" in one for j in range(3)) and f"{pre} eqk(" not in one
    assert "{3.0f, 4.0f}" in progs[1][0] and f"{pre} eqk_3(" in progs[1][0]


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_opencl_builds_a_plans_new_kernels_as_one_program(monkeypatch):
    import pyopencl as cl
    built: list[str] = []
    real = cl.Program

    def program(ctx, src):
        built.append(src)
        return real(ctx, src)
    monkeypatch.setattr(cl, "Program", program)
    engine.clear_cache()
    x = data((6, 37), seed=11)
    t = Tensor(x, device="OPENCL")
    y = (t * 1.75 - 0.5).exp2()
    z = y / y.sum(1, keepdim=True) + y.amax(0)     # several kernels, none built before
    got = z.numpy()
    e = np.exp2(x * np.float32(1.75) - np.float32(0.5))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True) + e.max(0), rtol=1e-5)
    n = sum(src.count("__kernel void eqk_") for src in built)
    assert len(built) == 1 and n >= 2, (len(built), n)


def test_host_buffers_are_numpy_arrays():
    t = Tensor([1.0, 2.0], device="LLVM") + 1
    t.realize()
    assert isinstance(t.lazydata.buffer.data, np.ndarray) and t.lazydata.buffer.ptr


@pytest.mark.parametrize("src", DEVICES)
@pytest.mark.parametrize("dst", DEVICES)
def test_cross_device_copies(src, dst):
    x = data((3, 5), seed=4)
    a = Tensor(x, device=src) * 3
    b = a.to(dst)
    assert b.device == dst and a.device == src
    np.testing.assert_allclose(b.numpy(), x * 3, rtol=1e-6)
    np.testing.assert_allclose((b + 1).numpy(), x * 3 + 1, rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), x * 3, rtol=1e-6)        # the source is untouched
    for dt, v in ((np.bool_, [True, False]), (np.int32, [5, -2**31])):
        np.testing.assert_array_equal(Tensor(np.array(v, dt), device=src).to(dst).numpy(), v)
    assert Tensor(np.zeros((0, 2), np.float32), device=src).to(dst).numpy().shape == (0, 2)


def test_default_device_from_context(device):
    with eqgrad.Context(DEVICE=device):
        t = Tensor([1, 2, 3]) * 2
        assert t.device == device
        np.testing.assert_array_equal(t.numpy(), [2, 4, 6])


def test_cl_alias(monkeypatch):
    if not HAS_OPENCL:
        with pytest.raises(DeviceError, match="OPENCL device unavailable"):
            Tensor([1.0], device="cl")
        return
    assert Tensor([1.0], device="cl").device == "OPENCL"
    monkeypatch.setenv("EQGRAD_DEVICE", "CL")
    assert Tensor([1.0]).device == "OPENCL"


# ---------------------------------------------------------------------------- unavailable devices
@pytest.fixture
def fresh_devices(monkeypatch):
    """Forget created devices for one test (restored afterwards, with the cost model's record of
    them: graph/caps.py, which a device created here would otherwise leave pointing at itself)."""
    from eqgrad.graph import caps
    monkeypatch.setattr(devices, "_devices", {})
    monkeypatch.setattr(caps, "_BY_DEVICE", dict(caps._BY_DEVICE))


def test_missing_pyopencl_is_a_clear_error(fresh_devices, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)          # import fails as if not installed
    with pytest.raises(DeviceError, match=r"OPENCL device unavailable: pyopencl cannot be imported.*"
                                          r"pip install 'eqgrad\[opencl\]'.*pocl-opencl-icd"):
        Tensor([1.0], device="OPENCL")
    with pytest.raises(DeviceError, match="OPENCL device unavailable"):
        Tensor([1.0], device="LLVM").to("OPENCL")


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_no_opencl_platform_is_a_clear_error(fresh_devices, monkeypatch):
    import pyopencl as cl
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    monkeypatch.setattr(cl, "get_platforms", lambda: [])
    with pytest.raises(DeviceError, match=r"OPENCL device unavailable.*no devices.*apt-get install pocl-opencl-icd"):
        Tensor.zeros(2, device="OPENCL")


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is present")
def test_unavailable_cuda_is_a_clear_error(monkeypatch):
    with pytest.raises(DeviceError, match=r"CUDA device unavailable: .*(pycuda|GPU|driver|nvcc)") as e:
        Tensor([1.0], device="CUDA")
    if "pycuda cannot be imported" in str(e.value):
        assert "pip install 'eqgrad[cuda]'" in str(e.value) and "CUDA_ROOT" in str(e.value)
    monkeypatch.setenv("EQGRAD_DEVICE", "CUDA")
    with pytest.raises(DeviceError, match="CUDA device unavailable"):
        Tensor.ones(3)


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_opencl_source_at_debug_4(capsys):
    with eqgrad.Context(DEBUG=4):
        (Tensor(np.ones((3, 3), np.float32), device="OPENCL") * 7 - 2).realize()
    out = capsys.readouterr().out
    assert "--- OpenCL C" in out and "__kernel void eqk(" in out




@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 1, 70001), (1000, 3)])
def test_parallel_loops_map_to_work_items(device, shape):
    """4 parallel loops (a fused third grid dimension), an odd innermost extent (groups rounded up
    past the end) and a short innermost loop under a long one."""
    x, y = data(shape, seed=1), data(shape, seed=2)
    plan = op_plan("ADD", [float32, float32], float32, shape)
    np.testing.assert_array_equal(run_plan(plan, [x, y], device), x + y)


def test_kernels_that_differ_only_in_size(device):
    """Two kernels whose sources may coincide (a runtime-bounded loop) must each keep to their own
    size: the small output is a view into a larger host array whose tail must stay untouched."""
    for n in (4096, 8):
        plan = op_plan("EXP2", [float32], float32, (n,))
        x = np.linspace(-3, 3, n, dtype=np.float32)
        if device in ("LLVM", "NUMPY"):
            backing = np.full(2 * n, 7.0, np.float32)
            out = Buffer(device, (n,), float32, backing[:n])
            get_device(device).prepare(plan)([Buffer.from_numpy(x, device), out])
            np.testing.assert_allclose(backing[:n], np.exp2(x), rtol=1e-6)
            assert (backing[n:] == 7.0).all(), "a kernel wrote past its output"
        else:
            np.testing.assert_allclose(run_plan(plan, [x], device), np.exp2(x), rtol=1e-6)


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
@pytest.mark.parametrize("group", [2, 8, 64])
@pytest.mark.parametrize("case", [c for c in OP_CASES if c.endswith("-long")])
def test_work_group_reductions_at_any_group_size(monkeypatch, group, case):
    """The local-memory tree gives the same results whatever the group size (incl. 2 and 64)."""
    dev = get_device("OPENCL")
    monkeypatch.setattr(dev.renderer, "reduce_group", group)
    name, dts, out, arg = OP_CASES[case]
    inputs = op_inputs(case)
    plan = op_plan(name, dts, out, inputs[0].shape, arg)
    lk = lower_kernel(plan.kernels[0], plan)
    assert dev.renderer.launch(lk).mode == "group"
    got = run_plan(plan, inputs, "OPENCL")
    ref = OPS[name].ref(inputs, arg, out)
    if out is float32:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, ref)


def test_a_lane_kernels_widened_loops_may_use_the_widest_vectors():
    """A kernel with register lanes whose loops the loop vectorizer may still widen (``_SCALAR_MD``:
    a row-fused attention kernel's loops over a row's scores -- its max, its exp2 and sum, its
    probabilities; or all of them, in a kernel whose register blocks are root dots alone) asks
    LLVM for vectors as wide as its lanes' widest (``WIDE_LOOP_BITS``): x86's
    tuning prefers 256-bit vectors there, and the exp2 loops of attention_t128 ran 8 wide beside
    16-wide lanes (docs/lowering.md). LLVM clamps the width to the target's, so the same source
    serves an AVX2 target. A kernel without lanes, or with lanes and no such loop, asks for
    nothing; the LLVM device's numbers are NumPy's."""
    from eqgrad.devices.llvm import WIDE_LOOP_BITS
    assert WIDE_LOOP_BITS == 512
    attr = f'"prefer-vector-width"="{WIDE_LOOP_BITS}"'
    q, k, v = (data((2, 3, 32, 16), seed=s) for s in (1, 2, 3))

    def attention(T, q, k, v):
        return ((T(q) @ T(k).transpose(-1, -2)) * 0.25).softmax(-1) @ T(v)

    def sources(t: Tensor) -> list[tuple[bool, bool, str]]:
        t.realize()
        plan = engine.last_plan.plan
        out = []
        for kern in plan.kernels:
            lk = lower_kernel(kern, plan)
            out.append((lk.vector_lanes >= 2, bool(lk.row_loops) or lk.loop_vectorize, render_llvm(lk)))
        return out
    found = sources(attention(lambda a: Tensor(a, device="NUMPY"), q, k, v))
    assert any(lanes and rows for lanes, rows, _ in found)
    for lanes, rows, src in found:
        head = next(ln for ln in src.splitlines() if ln.startswith("define void @"))
        assert (attr in src and head.endswith(" #0 {")) == (lanes and rows), src[:300]
    (plain,) = sources(Tensor(data((64, 64), seed=4), device="NUMPY") + 1.0)
    assert attr not in plain[2] and "#0" not in plain[2]
    s = q @ np.swapaxes(k, -1, -2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(attention(lambda a: Tensor(a, device="LLVM"), q, k, v).numpy(),
                               (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-5)
