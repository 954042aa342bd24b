"""Renderers are op tables, and transcendentals are loop-IR decompositions (docs/devices.md).

- coverage: every device's table has a rule for every op it can be given (the op table's ALU ops
  and the loop IR's own, less those decomposed for it), and the decompositions use only ops the
  table has;
- the loop IR's own ops and float64, rendered by every dialect and run on LLVM (and OpenCL where
  it exists), give the loop-IR interpreter's results;
- each decomposition, run on the interpreter (``interp.run_loop``), is NumPy's function within the
  bounds of docs/semantics.md on a dense sweep, and exactly NumPy's on special values.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from eqgrad import Tensor, engine
from eqgrad.devices.cstyle import CSTYLE_OPS, CStyleRenderer
from eqgrad.devices.cuda import CUDARenderer, compile_ptx, nvcc
from eqgrad.devices.llvm import LLVM_OPS, LLVMProgram, render_llvm
from eqgrad.devices.opencl import OpenCLRenderer
from eqgrad.devices.render import VALUE_OPS, MissingRule, required_ops
from eqgrad.dtype import DType, bool_, float32, int32
from eqgrad.graph.interp import run_loop
from eqgrad.graph.program import linearize
from eqgrad.graph.loopir import FLOAT64, INDEX, LOOP_ALU_OPS, LInst, LoopKernel, Table, verify
from eqgrad.lower.decomp import DECOMPOSITIONS, ERF_ULP, SIN_ABS_ERR, SIN_REL_ERR, Builder, Val, decompose, decomposed_for
from eqgrad.lower.lowering import lower_kernel
from eqgrad.ops import ALU_OPS
from eqgrad.rules import rulebook
from conftest import DEVICES, lowered_only_kernel

HAS_OPENCL = "OPENCL" in DEVICES


def _opencl_gpu() -> OpenCLRenderer:
    """The OpenCL dialect as a GPU (or a device without cl_khr_fp64) gets it: library sin."""
    r = OpenCLRenderer()
    r.code_for_op = {**r.code_for_op, "SIN": CSTYLE_OPS["SIN"]}
    return r


TABLES = {"LLVM": LLVM_OPS, "OpenCL": OpenCLRenderer.code_for_op, "OpenCL-GPU": _opencl_gpu().code_for_op,
          "CUDA": CUDARenderer.code_for_op}


def _emitted_ops(op: str) -> set[str]:
    """The ops the decomposition of ``op`` writes."""
    insts = [LInst("PARAM", float32, (), 1)]
    DECOMPOSITIONS[op](Builder(insts), Val(0, float32))
    return {x.op for x in insts[1:]} - {"CONST"}


# ---------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("device", list(TABLES))
def test_every_table_covers_what_it_can_be_given(device):
    table = TABLES[device]
    assert set(table) <= VALUE_OPS, f"{device}: rules for ops no IR has: {set(table) - VALUE_OPS}"
    missing = required_ops(table) - set(table)
    assert not missing, f"{device} renderer: no rule and no decomposition for {sorted(missing)}"
    for op in decomposed_for(table):
        lacking = _emitted_ops(op) - set(table)
        assert not lacking, f"{device}: the decomposition of {op} uses {sorted(lacking)}, which it lacks"
    assert required_ops(table) >= set(LOOP_ALU_OPS) | (set(ALU_OPS) - set(DECOMPOSITIONS))


def test_which_devices_decompose_what():
    """As before the tables: LLVM and a CPU OpenCL decompose all four (scalar library calls stop
    the vectorizers), a GPU OpenCL keeps its library sin, CUDA keeps its library for all four."""
    assert decomposed_for(LLVM_OPS) == decomposed_for(OpenCLRenderer.code_for_op) == {"EXP2", "LOG2", "SIN", "ERF"}
    assert decomposed_for(_opencl_gpu().code_for_op) == {"EXP2", "LOG2", "ERF"}
    assert decomposed_for(CUDARenderer.code_for_op) == set()


def test_decompositions_write_only_primitive_ops():
    for op in DECOMPOSITIONS:
        used = _emitted_ops(op)
        assert used <= VALUE_OPS - set(DECOMPOSITIONS), (op, used)


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_opencl_device_keeps_library_sin_where_decomposition_is_slow_or_impossible():
    import pyopencl as cl
    from eqgrad.devices import get_device
    dev = get_device("OPENCL")
    cpu_fp64 = bool(dev.device.type & cl.device_type.CPU) and "cl_khr_fp64" in dev.device.extensions
    assert ("SIN" in decomposed_for(dev.renderer.code_for_op)) == cpu_fp64
    assert {"EXP2", "LOG2"} <= decomposed_for(dev.renderer.code_for_op)


def test_an_op_without_a_rule_is_a_clear_error():
    k = _one_op("SHL", [int32, int32], int32)
    r = CUDARenderer()
    r.code_for_op = {op: rule for op, rule in CSTYLE_OPS.items() if op != "SHL"}
    with pytest.raises(MissingRule, match="CUDA renderer: no rule for SHL on int32"):
        r.render(k)
    with pytest.raises(MissingRule, match="LLVM renderer: no rule for SHL on float32"):
        render_llvm(_one_op("SHL", [float32, float32], float32))


# ---------------------------------------------------------------------------- the loop IR's own ops
TBL = Table("tbl", (0.5, -1.25, 3.0, 1e300, -0.0, 2.0 ** -1074, math.pi, 7.0))
MEM = {float32: float32, FLOAT64: float32, int32: int32, bool_: bool_}    # how each dtype is passed in memory


def _one_op(op: str, dts: list[DType], out: DType, arg: object = None, n: int = 64) -> LoopKernel:
    """out[i] = op(in_0[i], in_1[i], ...): float64 operands are loaded as float32 and cast, and a
    float64 result is cast to float32 to be stored."""
    params = [("b0", MEM[out], True)] + [(f"b{j + 1}", MEM[d], False) for j, d in enumerate(dts)]
    insts = [LInst("PARAM", d, (), j) for j, (_, d, _) in enumerate(params)]
    insts.append(LInst("RANGE", INDEX, (), n))
    r = len(insts) - 1
    srcs = []
    for j, d in enumerate(dts):
        insts.append(LInst("LOAD", MEM[d], (j + 1, r)))
        if d != MEM[d]:
            insts.append(LInst("CAST", d, (len(insts) - 1,)))
        srcs.append(len(insts) - 1)
    insts.append(LInst(op, out, tuple(srcs), arg))
    if out != MEM[out]:
        insts.append(LInst("CAST", MEM[out], (len(insts) - 1,)))
    insts += [LInst("STORE", None, (0, r, len(insts) - 1)), LInst("ENDRANGE", None, (r,))]
    return LoopKernel("eqk", params, insts, parallel=1)


F32_VALUES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.5, -3.5, 1e-40, -1e-38, 1e-45, 3e38, -3e38,
                       np.inf, -np.inf, np.nan, 2147483648.0, -2147483904.0, 2147483520.0, 100.5, -7.0, 1e10,
                       8388608.5, 4503599627370496.0, 0.49999997, -0.49999997, 12582912.0, 1.17549435e-38, 7.0], np.float32)
I32_VALUES = np.array([0, 1, -1, 2, 7, -7, 3, 2**31 - 1, -2**31, 123456, -99999, 0x7F800000, 0x7FC00000, 8388607,
                       1065353216, -8388608], np.int32)


def _inputs(op: str, dts: list[DType], n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, op)))
    out = []
    for j, d in enumerate(dts):
        if op == "TABLE":
            a = rng.integers(0, len(TBL.values), n).astype(np.int32)
        elif op in ("SHL", "SHR") and j == 1:
            a = rng.integers(0, 32, n).astype(np.int32)
        elif MEM[d] is bool_:
            a = rng.random(n) < 0.5
        else:
            vals = F32_VALUES if MEM[d] is float32 else I32_VALUES
            a = vals[rng.integers(0, vals.size, n)] if j else np.resize(vals, n)
        out.append(a)
    return out


# (op, operand dtypes, result dtype, arg): the loop IR's own ops on every kind they take, float64
# with every op it is used with (loopir.py)
LOOP_CASES = [
    ("BITCAST", [float32], int32, None), ("BITCAST", [int32], float32, None),
    ("SHL", [int32, int32], int32, None), ("SHR", [int32, int32], int32, None),
    ("FLOOR", [float32], float32, None), ("FLOOR", [FLOAT64], FLOAT64, None),
    ("RINT", [float32], float32, None), ("RINT", [FLOAT64], FLOAT64, None),
    ("MULADD", [float32] * 3, float32, None), ("MULADD", [FLOAT64] * 3, FLOAT64, None),
    ("TABLE", [int32], FLOAT64, TBL),
    ("CAST", [int32], FLOAT64, None), ("CAST", [FLOAT64], int32, None), ("CAST", [float32], FLOAT64, None),
    ("ADD", [FLOAT64] * 2, FLOAT64, None), ("MUL", [FLOAT64] * 2, FLOAT64, None), ("NEG", [FLOAT64], FLOAT64, None),
    ("CMPLT", [FLOAT64] * 2, bool_, None), ("CMPEQ", [FLOAT64] * 2, bool_, None),
    ("WHERE", [bool_, FLOAT64, FLOAT64], FLOAT64, None),
]
CASE_IDS = [f"{op}-{'-'.join(d.name for d in dts)}-{o.name}" for op, dts, o, _ in LOOP_CASES]


def _reference(k: LoopKernel, inputs: list[np.ndarray]) -> np.ndarray:
    verify(k)
    out = np.zeros(inputs[0].size, k.params[0][1].np)
    run_loop(k, [out] + [a.copy() for a in inputs])
    return out


def _check(got: np.ndarray, ref: np.ndarray, op: str, what: str) -> None:
    if op == "MULADD":      # may be one rounding (FMA) or two
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-30, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


@pytest.mark.parametrize("op, dts, out, arg", LOOP_CASES, ids=CASE_IDS)
def test_loop_ops_on_llvm_match_the_interpreter(op, dts, out, arg):
    k = _one_op(op, dts, out, arg)
    inputs = _inputs(op, dts, 64)
    ref = _reference(k, inputs)
    got = np.zeros_like(ref)
    prg = LLVMProgram(k, render_llvm(k))
    arrays = [got] + [np.ascontiguousarray(a) for a in inputs]
    prg(*[a.ctypes.data for a in arrays], lo=0, hi=64)
    _check(got, ref, op, f"LLVM {op}")


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
@pytest.mark.parametrize("op, dts, out, arg", LOOP_CASES, ids=CASE_IDS)
def test_loop_ops_on_opencl_match_the_interpreter(op, dts, out, arg):
    from eqgrad.devices import get_device
    dev = get_device("OPENCL")
    if FLOAT64 in (*dts, out) and "cl_khr_fp64" not in dev.device.extensions:
        pytest.skip("no cl_khr_fp64")
    k = _one_op(op, dts, out, arg)
    inputs = _inputs(op, dts, 64)
    ref = _reference(k, inputs)
    dtypes = [p[1] for p in k.params]
    raws = [dev.alloc((64,), d) for d in dtypes]
    for raw, a in zip(raws[1:], inputs):
        dev.copyin(raw, a)
    geo = dev.renderer.launch(k)
    dev.launch(dev.kernel(dev.renderer.render(k)), geo.global_size, geo.local_size, raws)
    _check(dev.copyout(raws[0], (64,), dtypes[0]), ref, op, f"OpenCL {op}")


@pytest.mark.parametrize("op, dts, out, arg", LOOP_CASES, ids=CASE_IDS)
def test_loop_ops_render_in_every_c_dialect(op, dts, out, arg):
    k = _one_op(op, dts, out, arg)
    for r in (OpenCLRenderer(), CUDARenderer()):
        src = r.render(k)
        assert "eqk(" in src
        if FLOAT64 in (*dts, out):
            assert "double" in src and (("cl_khr_fp64 : enable" in src) == isinstance(r, OpenCLRenderer))
        if op == "TABLE":
            assert f"{r.table_prefix} double tbl[8] = {{0x1p-1, " in src


# ---------------------------------------------------------------------------- the decompositions
def _decomposed(op: str, n: int) -> LoopKernel:
    k = decompose(_one_op(op, [float32], float32, n=n), native=())
    assert op not in {x.op for x in k.insts}
    verify(k)                  # a decomposition leaves the loop IR valid
    return k


def _run(op: str, x: np.ndarray) -> np.ndarray:
    return _reference(_decomposed(op, x.size), [x])


def test_exp2_decomposition():
    x = np.linspace(-126, 128, 3001, dtype=np.float32)
    ref = np.exp2(x.astype(np.float64))
    fin = ref < 3.4e38
    got = _run("EXP2", x)
    assert np.max(np.abs(got[fin] - ref[fin]) / ref[fin]) < 4e-7
    sp = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 200.0, -200.0, 128.5, 128.0, -126.0, 1.0, 3.0], np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_run("EXP2", sp), np.exp2(sp))
    below = np.linspace(-149, -127, 101, dtype=np.float32)               # flushed to 0: NumPy's subnormals
    assert np.all(_run("EXP2", below) == 0) and np.max(np.exp2(below)) < 1.2e-38


def test_log2_decomposition():
    x = np.exp(np.linspace(-103, 88.7, 3001)).astype(np.float32)        # subnormals to near max
    ref = np.log2(x.astype(np.float64))
    assert np.max(np.abs(_run("LOG2", x) - ref) / np.maximum(1.0, np.abs(ref))) < 2e-7
    sp = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0, 2.0, 1e-45, 0.5, 2.0 ** -126, -1e-45], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(_run("LOG2", sp), np.log2(sp))


def test_sin_decomposition():
    bits = np.random.default_rng(0).integers(0, 2**32, 1500, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([np.linspace(-1e4, 1e4, 1501, dtype=np.float32),
                        bits[(bits & 0x7F800000) != 0x7F800000].view(np.float32),       # every exponent
                        np.array([16367173 * 2.0**72, 10741887 * 2.0**12, 3.4028235e38, 1.5707964, 3.1415927], np.float32)])
    got = _run("SIN", x).astype(np.float64)
    ref = np.sin(x.astype(np.float64))
    err = np.abs(got - ref)
    assert np.max(err) < SIN_ABS_ERR
    assert np.max(err[ref != 0] / np.abs(ref[ref != 0])) < SIN_REL_ERR
    sp = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1.1754942e-38, np.inf, -np.inf, np.nan], np.float32)
    got = _run("SIN", sp)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.sin(sp))
    assert np.signbit(got[1]) and not np.signbit(got[0])


def test_erf_decomposition():
    from scipy.special import erf
    x = np.concatenate([np.linspace(-6, 6, 3001, dtype=np.float32),
                        np.float32(10.0) ** np.arange(-37, 0.5, 0.25, dtype=np.float32)])     # relative accuracy near 0
    ref = erf(x.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(_run("ERF", x).astype(np.float64) - ref) / ulp) < ERF_ULP
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 4.0, 1e30, -1e30], np.float32)
    got = _run("ERF", sp)
    np.testing.assert_array_equal(got, erf(sp.astype(np.float64)).astype(np.float32))
    assert np.signbit(got[1]) and not np.signbit(got[0])


def test_erf_uses_a_native_exp2_when_the_renderer_has_one():
    k = decompose(_one_op("ERF", [float32], float32, n=4), native={"EXP2"})
    assert "EXP2" in {x.op for x in k.insts} and "ERF" not in {x.op for x in k.insts}
    verify(k)


def test_decompose_renumbers_inside_loops_and_accumulators():
    """A lowered softmax (exp2 inside reduce loops, accumulators): decomposed, the interpreter gives
    the op table's result; a kernel without those ops is returned as it is."""
    x = np.random.default_rng(3).standard_normal((4, 40)).astype(np.float32)
    y = Tensor(x, device="NUMPY").softmax(-1)
    prog = linearize([y.lazydata], inspected=rulebook.DEFAULT.config().inspected_constants)
    y.realize()
    plan = engine.last_plan.plan
    bufs = [np.zeros(int(np.prod(s)), d.np) for s, d in plan.buffers]
    bufs[0][:] = x.ravel()
    for i, (v, _) in enumerate(prog.params):          # the runtime parameters (log2(e)) follow the input
        bufs[len(prog.inputs) + i][:] = v
    for k in plan.kernels:
        lk = lower_kernel(k, plan)
        dk = decompose(lk, LLVM_OPS)
        verify(dk)
        assert dk is not lk if "EXP2" in {i.op for i in lk.insts} else dk is lk
        assert lk.insts == lower_kernel(k, plan).insts, "decompose changed its input"
        run_loop(dk, [bufs[k.out]] + [bufs[i] for i in k.inputs])
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(bufs[plan.outputs[0]].reshape(4, 40), e / e.sum(1, keepdims=True), rtol=2e-6)


def test_decomposed_c_is_textually_sound_for_every_dialect():
    """CUDA keeps its library functions, but its dialect must render the decompositions too (a table
    without them); compiled to PTX where nvcc exists."""
    r = CUDARenderer()
    r.code_for_op = {op: rule for op, rule in CSTYLE_OPS.items() if op not in DECOMPOSITIONS}
    srcs = [r.render(_one_op(op, [float32], float32)) for op in DECOMPOSITIONS]
    assert "__constant__ double sin_tbl[1024]" in srcs[2] and "__float_as_int(" in srcs[0]
    assert not any(f in s for s in srcs for f in ("exp2f(", "log2f(", "sinf(", " as_int(", "#pragma"))
    if nvcc() is not None:
        for s in srcs:
            assert ".entry eqk(" in compile_ptx(s)
    base = CStyleRenderer()
    base.code_for_op = r.code_for_op
    assert "static const double sin_tbl[1024]" in base.render(_one_op("SIN", [float32], float32))


def test_llvm_unrolls_only_innermost_loops():
    """A loop that holds another loop gets ``llvm.loop.unroll.disable`` (LLVM's O3 unrolled
    nests of short constant loops hundreds of times: a conv weight gradient's 150 lines of IR took 1 s
    to compile), innermost loops keep LLVM's unrolling and vectorizing; the results do not change."""
    x = np.random.default_rng(0).standard_normal((4, 6, 8, 16)).astype(np.float32)
    t = (Tensor(x, device="NUMPY") * 2.0).sum(axis=(1, 3))          # loops nested in loops
    lk = lowered_only_kernel(t)
    src = render_llvm(lk)
    ranges = [i for i, x in enumerate(lk.insts) if x.op == "RANGE"]
    latch = {r: next(line for line in src.splitlines() if line.strip().startswith(f"br label %L{r}.cond, !llvm.loop"))
             for r in ranges}
    closes = {x.src[0]: i for i, x in enumerate(lk.insts) if x.op == "ENDRANGE"}
    holds_loop = {r: any(r < q < closes[r] for q in ranges) for r in ranges}
    assert any(holds_loop.values()) and not all(holds_loop.values())
    # !6: also not vectorized (a short loop over strided rows, test_devices.py); it keeps !5 as !4 does
    for r in ranges:
        assert latch[r].endswith(("!4", "!6")) == holds_loop[r], (r, latch[r])
    assert '!5 = !{!"llvm.loop.unroll.disable"}' in src and "!4 = distinct !{!4, !1" in src
    assert "!llvm.loop !6" not in src or "!6 = distinct !{!6, !1, !5, !7}" in src
    got = (Tensor(x) * 2.0).sum(axis=(1, 3)).numpy()
    np.testing.assert_allclose(got, (x * 2).sum(axis=(1, 3)), rtol=1e-5, atol=1e-5)


def _fused_attention():
    """softmax(q @ k.T * 0.3) @ v planned as one kernel (under a memory bound): the row stash keeps
    each row's scores and exp2 in local arrays (loop IR DEFLOCAL). The kernel, its loop IR, its
    inputs and the kernel tree's output."""
    import eqgrad
    from eqgrad.graph.interp import run_kernel
    rng = np.random.default_rng(3)
    q, k, v = (Tensor(rng.uniform(-2, 2, (2, 3, 40, 8)).astype(np.float32), device="NUMPY") for _ in range(3))
    with eqgrad.Context(PEAK_MEMORY=8192):
        plan = engine.plan_for([((q @ k.transpose(-1, -2) * 0.3).softmax(-1) @ v).lazydata])[0].plan
    (kern,) = plan.kernels
    bufs = [rng.uniform(-2, 2, s).astype(np.float32) for s, _ in plan.buffers[:plan.n_inputs]]
    bufs += [np.zeros(s, d.np) for s, d in plan.buffers[plan.n_inputs:]]
    ref = np.asarray(run_kernel(kern, bufs), np.float32).reshape(-1)
    lk = replace(lower_kernel(kern, plan), name="eqk")            # the name the OpenCL device builds
    verify(lk)
    assert sum(x.op == "DEFLOCAL" for x in lk.insts) == 2, str(lk)
    return lk, [np.ascontiguousarray(bufs[b]).reshape(-1) for b in kern.inputs], ref


def test_local_arrays_on_llvm_match_the_kernel_reference():
    lk, inputs, ref = _fused_attention()
    got = np.zeros_like(ref)
    run_loop(lk, [got] + [a.copy() for a in inputs])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    got = np.zeros_like(ref)
    hi = lk.insts[lk.parallel_ranges()[0]].arg
    LLVMProgram(lk, render_llvm(lk))(*[a.ctypes.data for a in [got] + inputs], lo=0, hi=hi)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    src = CUDARenderer().render(lk)
    assert src.count("float loc") == 2, src


@pytest.mark.skipif(not HAS_OPENCL, reason="no OpenCL platform")
def test_local_arrays_on_opencl_match_the_kernel_reference():
    from eqgrad.devices import get_device
    dev = get_device("OPENCL")
    lk, inputs, ref = _fused_attention()
    raws = [dev.alloc((ref.size,), float32)] + [dev.alloc((a.size,), float32) for a in inputs]
    for raw, a in zip(raws[1:], inputs):
        dev.copyin(raw, a)
    geo = dev.renderer.launch(lk)
    dev.launch(dev.kernel(dev.renderer.render(lk)), geo.global_size, geo.local_size, raws)
    np.testing.assert_allclose(dev.copyout(raws[0], (ref.size,), float32), ref, rtol=1e-5, atol=1e-5)
