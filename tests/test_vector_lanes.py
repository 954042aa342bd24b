"""Register lanes rendered as LLVM vectors (devices/llvm.py ``_Lanes``): every vector rule gives the
bits its scalar rule gives, on special values; lane groups that do not vectorize are packed from
scalars and stay right; real lane kernels (matmuls, long blocked sums, max reductions, strided
operands) render vector accumulators and match NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from eqgrad import Tensor
from eqgrad.devices.llvm import LLVMProgram, render_llvm
from eqgrad.dtype import bool_, float32, int32
from eqgrad.graph.loopir import INDEX, LInst, LoopKernel, verify

W = 4          # lanes per group in the hand-built kernels
N = 64         # elements


def _lane_kernel(body, n_inputs: int, lanes: int, in_dtype=float32) -> LoopKernel:
    """out[r * W + l] = body(lane l's loads) for each block r and lane l: the shape of a lane
    kernel's epilogue, with ``body(emit, loads, lane)`` building one lane's value."""
    insts: list[LInst] = [LInst("PARAM", float32, (), 0)] + [LInst("PARAM", in_dtype, (), i + 1) for i in range(n_inputs)]

    def emit(op, dt, src=(), arg=None) -> int:
        insts.append(LInst(op, dt, tuple(src), arg))
        return len(insts) - 1
    r = emit("RANGE", INDEX, (), N // W)
    base = emit("MUL", INDEX, (r, emit("CONST", INDEX, (), W)))
    for lane in range(W):
        idx = base if lane == 0 else emit("ADD", INDEX, (base, emit("CONST", INDEX, (), lane)))
        loads = [emit("LOAD", in_dtype, (p + 1, idx)) for p in range(n_inputs)]
        emit("STORE", None, (0, idx, body(emit, loads, lane)))
    emit("ENDRANGE", None, (r,))
    params = [("out", float32, True)] + [(f"x{i}", in_dtype, False) for i in range(n_inputs)]
    k = LoopKernel("eqk", params, insts, loop_vectorize=False, parallel=1, vector_lanes=lanes)
    verify(k)
    return k


def _f(op):
    return lambda e, a, lane: e(op, float32, a)


def _where(cond):
    """where(cond(lane values), x, y): a bool-valued tree stored as floats."""
    return lambda e, a, lane: e("WHERE", float32, (cond(e, a), a[0], a[1]))


def _cmp(op):
    return lambda e, a: e(op, bool_, (a[0], a[1]))


CASES = {
    "ADD": (_f("ADD"), 2), "MUL": (_f("MUL"), 2), "MULADD": (_f("MULADD"), 3), "MAX": (_f("MAX"), 2),
    "NEG": (_f("NEG"), 1), "SQRT": (_f("SQRT"), 1), "FLOOR": (_f("FLOOR"), 1), "TRUNC": (_f("TRUNC"), 1),
    "RINT": (_f("RINT"), 1), "RECIP": (_f("RECIP"), 1),
    "CMPLT": (_where(_cmp("CMPLT")), 2), "CMPEQ": (_where(_cmp("CMPEQ")), 2),
    "CAST bool->float": (lambda e, a, lane: e("CAST", float32, (_cmp("CMPLT")(e, a),)), 2),
    "CAST float->bool": (_where(lambda e, a: e("CAST", bool_, (a[0],))), 2),
    "AND": (_where(lambda e, a: e("AND", bool_, (_cmp("CMPLT")(e, a), _cmp("CMPEQ")(e, a[1:] + a[:1])))), 2),
    "OR": (_where(lambda e, a: e("OR", bool_, (_cmp("CMPLT")(e, a), _cmp("CMPEQ")(e, a)))), 2),
    "bool NEG": (_where(lambda e, a: e("NEG", bool_, (_cmp("CMPLT")(e, a),))), 2),
    "bool ADD": (_where(lambda e, a: e("ADD", bool_, (_cmp("CMPLT")(e, a), _cmp("CMPEQ")(e, a)))), 2),
    "bool MUL": (_where(lambda e, a: e("MUL", bool_, (_cmp("CMPLT")(e, a[::-1]), _cmp("CMPEQ")(e, a)))), 2),
    # a constant per lane (a vector constant) and one shared by the lanes (a splat)
    "lane constants": (lambda e, a, lane: e("ADD", float32, (a[0], e("CONST", float32, (), 0.25 * lane - 1.0))), 1),
    "shared constant": (lambda e, a, lane: e("MUL", float32, (a[0], e("CONST", float32, (), -3.5))), 1),
}

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.75, 1e-40, -1e-38, 3e38, -3e38, np.inf, -np.inf,
                    np.nan, 2.5, -0.5, 1.5, 100.5, -7.0, 1e10], np.float32)


def _inputs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([SPECIAL, rng.standard_normal(N - len(SPECIAL)).astype(np.float32) * 4])[rng.permutation(N)]
            for _ in range(n)]


def _run(k: LoopKernel, inputs: list[np.ndarray]) -> tuple[np.ndarray, str]:
    src = render_llvm(k)
    out = np.full(N, -123.0, np.float32)
    arrays = [out] + [np.ascontiguousarray(a) for a in inputs]
    LLVMProgram(k, src)(*[a.ctypes.data for a in arrays], lo=0, hi=N // W)
    return out, src


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_vector_rule_gives_the_bits_of_its_scalar_rule(case):
    body, n = CASES[case]
    inputs = _inputs(n, 0)
    want, scalar_src = _run(_lane_kernel(body, n, 0), inputs)
    got, vector_src = _run(_lane_kernel(body, n, W), inputs)
    assert f"store <{W} x float>" in vector_src and f"<{W} x float>" not in scalar_src
    assert "insertelement" not in vector_src          # every node a vector op, load or constant: nothing packed
    if case == "MULADD":      # one rounding (FMA) or two, as the scalar rule
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def test_lanes_that_do_not_vectorize_are_packed_from_scalars():
    """An int32 op (no vector rule), loads that are not consecutive (lane l reads element
    2 * (r * W + l) mod N ... via a gather of scalars) and a WHERE on index comparisons: each lane
    group is packed from its scalars, and the values are those of the scalar rendering."""
    def body(e, a, lane):
        as_int = e("CAST", int32, (a[0],))
        twice = e("ADD", int32, (as_int, as_int))
        return e("ADD", float32, (e("CAST", float32, (twice,)), a[1]))
    inputs = [np.round(x) for x in _inputs(2, 1)]
    inputs = [np.nan_to_num(x, nan=3.0, posinf=7.0, neginf=-7.0).clip(-1e6, 1e6) for x in inputs]
    want, _ = _run(_lane_kernel(body, 2, 0), inputs)
    got, src = _run(_lane_kernel(body, 2, W), inputs)
    assert "insertelement" in src and f"store <{W} x float>" in src
    np.testing.assert_array_equal(got, want)


def _llvm_sources(monkeypatch) -> list[str]:
    import eqgrad.devices.llvm as L
    seen: list[str] = []
    orig = L.LLVMCompiler.object_code

    def spy(self, src, *a, **k):
        seen.append(src)
        return orig(self, src, *a, **k)
    monkeypatch.setattr(L.LLVMCompiler, "object_code", spy)
    return seen


@pytest.mark.parametrize("what", ["matmul", "matmul_t", "long_k", "max", "odd", "relu", "relu_grad"])
def test_lane_kernels_use_vector_accumulators_and_match_numpy(what, monkeypatch, tmp_path):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))      # compiled here, so its source is seen
    monkeypatch.setenv("EQGRAD_BLAS", "0")                      # the generated contraction kernels
    seen = _llvm_sources(monkeypatch)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 96), dtype=np.float32)
    b = rng.standard_normal((96, 48), dtype=np.float32)
    if what == "matmul":
        got, want = (Tensor(a) @ Tensor(b)).numpy(), a @ b
    elif what == "matmul_t":          # the lane operand read with a stride: packed, still right
        bt = np.ascontiguousarray(b.T)
        got, want = (Tensor(a) @ Tensor(bt).T).numpy(), a @ b
    elif what == "long_k":            # a reduction long enough to be summed in blocked levels
        x, y = rng.standard_normal((16, 20000), dtype=np.float32), rng.standard_normal((20000, 32), dtype=np.float32)
        got, want = (Tensor(x) @ Tensor(y)).numpy(), x.astype(np.float64) @ y.astype(np.float64)
    elif what == "max":
        got, want = Tensor(a).amax(axis=0).numpy(), a.max(axis=0)
    elif what == "odd":
        x, y = rng.standard_normal((29, 37), dtype=np.float32), rng.standard_normal((37, 33), dtype=np.float32)
        got, want = (Tensor(x) @ Tensor(y)).numpy(), x @ y
    elif what == "relu":              # a bias and relu fused after the sum: CMPLT/WHERE lanes
        bias = rng.standard_normal(48, dtype=np.float32)
        got, want = (Tensor(a) @ Tensor(b) + Tensor(bias)).relu().numpy(), np.maximum(a @ b + bias, 0)
    else:                             # relu's gradient through a matmul (no unit-stride operand: no lanes)
        w = Tensor(b, requires_grad=True)
        (Tensor(a) @ w).relu().sum().backward()
        got, want = w.grad.numpy(), a.T @ ((a @ b) > 0).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
    if what in ("matmul", "long_k", "relu"):          # (29 x 33: no lane width divides)
        assert any("alloca <" in s and "x float>" in s for s in seen), "no vector accumulator was rendered"
    if what == "relu":
        assert any("select <" in s and "fcmp olt <" in s for s in seen)
