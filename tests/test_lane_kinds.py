"""Lane groups whose lanes differ in kind (devices/llvm.py ``_Lanes``): an op is one
vector op only when every lane has the same operands' kinds, and a group packed from scalars is
one vector of one element type. A property test renders lane kernels whose lanes mix constants
of every kind the renderer has (special floats among them) with non-constant values, has LLVM
parse and verify the module, and runs it against the loop-IR interpreter."""
from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from hypothesis import example, given, settings, strategies as st

from eqgrad import Tensor, config
from eqgrad.devices.cpu import runnable_target
from eqgrad.devices.llvm import LLVMProgram, compiler, render_llvm
from eqgrad.dtype import bool_, float32, int32
from eqgrad.graph.interp import run_loop
from eqgrad.graph.loopir import FLOAT64, INDEX, LInst, LoopKernel, verify


def test_where_then_cat_then_sum_compiles_on_llvm():
    """Cat's bounds check (an index CMPLT) sat in the lanes beside the float CMPLT of
    the where, one vector op for both, so the index lanes were packed into a float vector
    (``insertelement <16 x float> ..., float 8``) and LLVM refused the kernel."""
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-2, 2, (8, 8)).astype(np.float32) for _ in range(2))
    y = (Tensor(a, device="LLVM") > 0.3).where(Tensor(a, device="LLVM"), Tensor(b, device="LLVM"))
    got = y.cat(y, dim=1).sum(0).numpy()
    ref = np.where(a > 0.3, a, b)
    np.testing.assert_allclose(got, np.concatenate([ref, ref], axis=1).sum(0), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ the property
BLOCKS = 3          # iterations of the kernel's loop, each computing one lane group
# constants of every kind the renderer has, the special ones first (hypothesis shrinks towards them)
CONSTS = {
    "float32": [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 0.3, 1e-45, -3.4e38],
    FLOAT64.name: [0.0, -0.0, np.inf, -np.inf, np.nan, 0.1, 1e300, -1e-310],
    "int32": [0, -1, 7, -2**31, 2**31 - 1],
    INDEX: [0, 5, -3, 2**40],
    "bool": [False, True],
}
DTYPES = {"float32": float32, FLOAT64.name: FLOAT64, "int32": int32, INDEX: INDEX, "bool": bool_}


def _atom(kind: str) -> st.SearchStrategy:
    """One lane's leaf of ``kind``: a constant, or None for a value known only at run time."""
    return st.one_of(st.sampled_from(CONSTS[kind]), st.none())


def _kinds(data: st.DataObject, w: int, kinds: list[str]) -> tuple[str, ...]:
    """A kind per lane: one for all lanes (a vector op), or that one with some lanes of another."""
    base = data.draw(st.sampled_from(kinds))
    if data.draw(st.booleans()):
        return (base,) * w
    return tuple(data.draw(st.sampled_from(kinds)) if data.draw(st.booleans()) else base for _ in range(w))


def _leaves(data: st.DataObject, w: int, kinds: tuple[str, ...]) -> tuple:
    return tuple(data.draw(_atom(kd)) for kd in kinds)


def _float_tree(data: st.DataObject, w: int, depth: int) -> tuple:
    """A float32 value per lane: the same op in every lane (what makes a vector op), with leaves,
    casts and comparisons whose kinds vary from lane to lane."""
    # a where half the time (the failing kernel's tree: a compare under it)
    how = data.draw(st.sampled_from(["leaf", "cast"]) if not depth else
                    st.one_of(st.just("where"), st.sampled_from(["leaf", "cast", "add", "max", "neg"])))
    if how == "leaf":
        return ("leaf", "float32", _leaves(data, w, ("float32",) * w))
    if how == "cast":        # from another kind, chosen per lane
        kinds = _kinds(data, w, ["bool", "int32", FLOAT64.name])
        return ("cast", kinds, _leaves(data, w, kinds))
    if how == "where":
        return ("where", _bool_tree(data, w, depth - 1), _float_tree(data, w, depth - 1), _float_tree(data, w, depth - 1))
    if how == "neg":
        return ("neg", _float_tree(data, w, depth - 1))
    return (how, _float_tree(data, w, depth - 1), _float_tree(data, w, depth - 1))


def _bool_tree(data: st.DataObject, w: int, depth: int) -> tuple:
    how = data.draw(st.one_of(st.just("cmp"), st.sampled_from(["leaf", "tobool"] + (["not", "and", "or"] if depth else []))))
    if how == "leaf":
        return ("leaf", "bool", _leaves(data, w, ("bool",) * w))
    if how == "cmp":         # CMPLT/CMPEQ is bool on every kind: the kind chosen per lane
        kinds = _kinds(data, w, ["float32", FLOAT64.name, "int32", INDEX])
        op = data.draw(st.sampled_from(["CMPLT", "CMPEQ"]))
        return ("cmp", op, kinds, _leaves(data, w, kinds), _leaves(data, w, kinds))
    if how == "tobool":
        return ("tobool", _float_tree(data, w, 0))
    if how == "not":
        return ("not", _bool_tree(data, w, depth - 1))
    return (how, _bool_tree(data, w, depth - 1), _bool_tree(data, w, depth - 1))


def _lane_kernel(tree: tuple, w: int) -> LoopKernel:
    """out[r * w + l] = lane l of ``tree``, for r < BLOCKS: one STORE per lane, so with
    ``vector_lanes = w`` the stores are one lane group and ``tree`` its value tree. The run-time
    values of each kind come from the parameters (x: float32, i: int32, m: bool) or the index."""
    params = [("out", float32, True), ("x", float32, False), ("i", int32, False), ("m", bool_, False)]
    insts = [LInst("PARAM", d, (), j) for j, (_, d, _) in enumerate(params)]

    def emit(op: str, dt, src=(), arg=None) -> int:
        insts.append(LInst(op, dt, tuple(src), arg))
        return len(insts) - 1

    def leaf(kind: str, v, idx: int) -> int:
        if v is not None:
            return emit("CONST", DTYPES[kind], (), v)
        if kind == FLOAT64.name:
            return emit("CAST", FLOAT64, (emit("LOAD", float32, (1, idx)),))
        return {"float32": lambda: emit("LOAD", float32, (1, idx)), "int32": lambda: emit("LOAD", int32, (2, idx)),
                "bool": lambda: emit("LOAD", bool_, (3, idx)), INDEX: lambda: idx}[kind]()

    def lane(t: tuple, l: int, idx: int) -> int:
        how = t[0]
        if how == "leaf":
            return leaf(t[1], t[2][l], idx)
        if how == "cast":
            return emit("CAST", float32, (leaf(t[1][l], t[2][l], idx),))
        if how == "cmp":
            return emit(t[1], bool_, (leaf(t[2][l], t[3][l], idx), leaf(t[2][l], t[4][l], idx)))
        if how == "tobool":
            return emit("CAST", bool_, (lane(t[1], l, idx),))
        if how in ("neg", "not"):
            return emit("NEG", float32 if how == "neg" else bool_, (lane(t[1], l, idx),))
        kids = tuple(lane(k, l, idx) for k in t[1:])
        op = {"where": "WHERE", "add": "ADD", "max": "MAX", "and": "AND", "or": "OR"}[how]
        return emit(op, bool_ if how in ("and", "or") else float32, kids)

    r = emit("RANGE", INDEX, (), BLOCKS)
    base = emit("MUL", INDEX, (r, emit("CONST", INDEX, (), w)))
    for l in range(w):
        idx = base if l == 0 else emit("ADD", INDEX, (base, emit("CONST", INDEX, (), l)))
        emit("STORE", None, (0, idx, lane(tree, l, idx)))
    emit("ENDRANGE", None, (r,))
    k = LoopKernel("eqk", params, insts, loop_vectorize=False, parallel=1, vector_lanes=w if w > 1 else 0)
    verify(k)
    return k


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    x = rng.choice(np.array(CONSTS["float32"] + [0.25, -7.0, 3.0], np.float32), n)
    i = rng.choice(np.array(CONSTS["int32"] + [3, -100], np.int32), n)
    return [x, i, rng.random(n) < 0.5]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(w=st.sampled_from([1, 2, 4, 8, 16, 32]), data=st.data())
@example(w=4, data=None)          # the failing kernel's shape: a float compare in lane 0, index compares after it
def test_lanes_mixing_kinds_and_constants_render_valid_ir_and_the_interpreters_values(w, data):
    if data is None:
        tree = ("where", ("cmp", "CMPLT", ("float32", INDEX, INDEX, INDEX), (0.3, 4, 5, 6), (None, 4, 4, 4)),
                ("leaf", "float32", (None, np.nan, -0.0, None)), ("leaf", "float32", (np.inf, None, 1e-45, 2.0)))
    else:
        tree = _float_tree(data, w, depth=3)
    k = _lane_kernel(tree, w)
    src = render_llvm(k)
    compiler()                        # (LLVM initialized)
    mod = llvm.parse_assembly(src)    # every lane of every kind written as its vector's type
    mod.verify()
    n = BLOCKS * w
    inputs = _inputs(n)
    want = np.full(n, -123.0, np.float32)
    run_loop(k, [want] + [a.copy() for a in inputs])
    got = np.full(n, -123.0, np.float32)
    prg = LLVMProgram(k, src, target=runnable_target(config.CPU.value))
    arrays = [got] + [np.ascontiguousarray(a) for a in inputs]
    prg(*[a.ctypes.data for a in arrays], lo=0, hi=BLOCKS)
    np.testing.assert_array_equal(got, want, err_msg=f"lanes {w}, tree {tree}")
