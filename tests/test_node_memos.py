"""No memo is written onto a frozen plan node: what is worked out once per kernel body (its walk,
resize's and the trace's size lists, the LLVM device's program, BLAS split, contraction and GEMM
choices) is kept beside the body, in a memo keyed by it and bounded (graph/plan.py ``NodeMemo``:
weak keys and a limit), never in the node's own ``__dict__``; and the memos keep neither the device
alive from the graph floor nor a body alive past the plans that use it."""
from __future__ import annotations

import ast
import dataclasses
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.counters import GlobalCounters
from eqgrad.devices import Buffer, Device, blas, get_device
from conftest import count_gemm_calls
from eqgrad.dtype import float32
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, NodeMemo
from eqgrad.lower.contraction import find_contraction

FIELDS = {f.name for f in dataclasses.fields(KNode)}
EQGRAD = Path(eqgrad.__file__).parent


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def live_nodes() -> list[KNode]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is KNode]


@pytest.fixture
def gemm_calls(monkeypatch):
    """The BLAS runs every contraction it can (as tests/test_blas.py's fixture): the bodies go
    through the device's contraction, BLAS split and GEMM memos. A list of one count of calls."""
    if blas.blas() is None:
        return None
    return count_gemm_calls(monkeypatch)


def workload(device: str) -> list:
    with eqgrad.Context(EQGRAD_DEVICE=device):
        return _workload(device)


def _workload(device: str) -> list:
    """An MLP's Adam training steps, a matmul alone and one with a bias and a ReLU after it, the
    same MLP forward at a second batch size (a resized plan), a softmax; checked against NumPy.
    Returns what keeps their plans' results alive."""
    from eqgrad import nn, optim
    import eqgrad.nn.functional as F
    keep = []
    xs, ys = rnd(32, 16), np.random.default_rng(0).integers(0, 4, 32).astype(np.int32)
    model = nn.Sequential(nn.Linear(16, 32), Tensor.relu, nn.Linear(32, 4))
    opt = optim.Adam(nn.state.get_parameters(model), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(Tensor(xs, device=device)), Tensor(ys, device=device))
        loss.backward()
        opt.step(loss)
        keep.append(loss.realize())
    a, b, bias = rnd(48, 40), rnd(40, 56, seed=1), rnd(56, seed=2)
    ta, tb, tbias = (Tensor(x, device=device) for x in (a, b, bias))
    keep.append(ta @ tb)
    np.testing.assert_allclose(keep[-1].numpy(), a @ b, rtol=1e-4, atol=1e-4)
    keep.append((ta @ tb + tbias).relu())
    np.testing.assert_allclose(keep[-1].numpy(), np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4)
    w1, w2 = rnd(24, 16, seed=3), rnd(16, 10, seed=4)
    resized = GlobalCounters.plans_resized
    for batch in (8, 12):
        x = rnd(batch, 24, seed=batch)
        t = (Tensor(x, device=device) @ Tensor(w1, device=device)).relu() @ Tensor(w2, device=device)
        np.testing.assert_allclose(t.numpy(), np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4)
        keep.append(t)
    assert GlobalCounters.plans_resized > resized, "the second batch size resizes the first's plan"
    x = rnd(6, 30, seed=5)
    keep.append(Tensor(x, device=device).softmax(-1))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(keep[-1].numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    return keep


@pytest.mark.parametrize("device", ["LLVM", "NUMPY"])
def test_no_module_writes_onto_a_plan_node(device, gemm_calls):
    """Every kernel body alive after planning, resizing, lowering and running these programs (the
    plans the engine keeps, the LLVM device's BLAS pieces) holds its dataclass fields and
    nothing else."""
    engine.clear_cache()
    keep = workload(device)
    if device == "LLVM" and gemm_calls is not None:
        assert gemm_calls[0] > 0, "the matmuls ran through the BLAS"
    nodes = live_nodes()
    assert len(nodes) > 50
    for n in nodes:
        assert set(vars(n)) == FIELDS, f"{n.op} node holds {sorted(set(vars(n)) - FIELDS)}"
    del keep


def test_the_graph_floor_holds_nothing_of_the_device(gemm_calls):
    """No kernel body refers to a device (a program memo once kept the device object on it)."""
    engine.clear_cache()
    keep = workload("LLVM")
    for n in live_nodes():
        assert not any(isinstance(r, Device) for r in gc.get_referents(n)), n.op
        assert not any(isinstance(r, Device) for r in gc.get_referents(vars(n))), n.op
    del keep


def test_a_body_goes_when_its_plans_do(gemm_calls):
    """The memos hold their bodies weakly and no value holds its own body -- a pure matmul's
    contraction is the body itself -- so once nothing else uses a plan, its bodies go, and the
    memos' entries with them."""
    if gemm_calls is None:
        pytest.skip("SciPy's BLAS does not load here")
    dev = get_device("LLVM")
    a, b = rnd(40, 48), rnd(48, 64, seed=1)
    red = eqgrad.explain(Tensor(a) @ Tensor(b)).plan.kernels[0].ast
    while red.op != "RSUM":                               # the product's reduction as the root
        red = red.src[0]
    plan = KernelPlan([(a.shape, float32), (b.shape, float32), (red.shape, float32)], 2,
                      [Kernel("k0", 2, red, red.buffers())], [2])
    del red
    (k,) = plan.kernels
    found = find_contraction(k.ast)
    assert found is not None and found.red is k.ast, "the body is the contraction itself"
    memos = [dev._member_memo, dev.stage._unsplit_memo, dev.stage._blas_memo, dev.stage._contraction_memo, dev.stage._gemm_memo]
    run = dev.prepare(plan)
    bufs = [Buffer.from_numpy(a, "LLVM"), Buffer.from_numpy(b, "LLVM")]
    bufs += [Buffer.empty(s, d, "LLVM") for s, d in plan.buffers[plan.n_inputs:]]
    run(bufs)
    np.testing.assert_allclose(bufs[plan.outputs[0]].numpy().reshape(40, 64), a @ b, rtol=1e-4, atol=1e-4)
    assert gemm_calls[0] > 0 and dev.gemm_of(k, plan) is not None
    body = weakref.ref(k.ast)
    assert any(m.get(k.ast) is not None for m in memos)
    del plan, k, found, run, bufs
    engine.clear_cache()
    gc.collect()
    assert body() is None, [type(r).__name__ for r in gc.get_referrers(body())]


def test_a_node_memo_is_keyed_weakly_and_bounded():
    memo = NodeMemo(limit=4)
    nodes = [KNode("BUF", (), i, (3,), float32) for i in range(4)]
    for i, n in enumerate(nodes):
        memo.put(n, i)
    assert [memo.get(n) for n in nodes] == [0, 1, 2, 3] and len(memo) == 4
    other = KNode("BUF", (), 0, (3,), float32)           # equal fields, another node: another key
    assert memo.get(other) is None
    del nodes[0]
    gc.collect()
    assert len(memo) == 3                                 # the entry went with its node
    memo.put(other, 9)
    last = KNode("CONST", (), 1.0, (), float32)
    memo.put(last, 10)                                    # full: emptied first
    assert len(memo) == 1 and memo.get(other) is None and memo.get(last) == 10


def test_walk_is_kept_beside_the_node():
    x = KNode("BUF", (), 0, (3,), float32)
    y = KNode("ADD", (x, x), None, (3,), float32)
    z = KNode("MUL", (y, x), None, (3,), float32)
    first = z.walk()
    assert first == [x, y, z] and z.walk() == first and z.walk() is not first
    assert set(vars(z)) == FIELDS
    ref = weakref.ref(z)
    del z, first
    gc.collect()
    assert ref() is None, "a walk's memo does not keep its node"


def _setattr_calls() -> list[tuple[str, int, str, str]]:
    """(file, line, innermost enclosing function, first argument) of every ``object.__setattr__``
    call in eqgrad/."""
    found = []

    class Calls(ast.NodeVisitor):
        def __init__(self, path: str) -> None:
            self.path, self.within = path, ["<module>"]

        def visit_FunctionDef(self, fn) -> None:
            self.within.append(fn.name)
            self.generic_visit(fn)
            self.within.pop()
        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Call(self, node: ast.Call) -> None:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "__setattr__" and \
                    isinstance(f.value, ast.Name) and f.value.id == "object":
                found.append((self.path, node.lineno, self.within[-1], ast.unparse(node.args[0])))
            self.generic_visit(node)
    for path in sorted(EQGRAD.rglob("*.py")):
        Calls(str(path.relative_to(EQGRAD))).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_object_setattr_only_sets_a_frozen_dataclass_own_fields():
    """``object.__setattr__`` appears in eqgrad/ only where a frozen dataclass sets its own fields
    as it is made (``__post_init__`` on ``self``): never a memo written onto a node."""
    calls = _setattr_calls()
    assert calls, "the scan finds the frozen dataclasses' own __post_init__ calls"
    wrong = sorted({c for c in calls if c[2] != "__post_init__" or c[3] != "self"})
    assert not wrong, f"object.__setattr__ outside a __post_init__ on self: {wrong}"
    text = "\n".join(p.read_text() for p in EQGRAD.rglob("*.py"))
    for memo in ("_walk", "_resize_body", "_trace_sizes", "_llvm_member", "_blas_split", "_unsplit",
                 "_contraction", "_gemm"):
        assert f'__dict__.get("{memo}")' not in text and f"__dict__.get('{memo}')" not in text, memo
