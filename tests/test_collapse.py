"""Elementwise kernels over whole buffers lower to one flat loop (eqgrad/lower/collapse.py): the
same numbers as the kernel as written, one source for every shape of the same body, and every
kernel that reads across elements keeps its loops."""
from __future__ import annotations

import numpy as np
import pytest

from eqgrad.devices import get_device
from eqgrad.devices.llvm import render_llvm
from eqgrad.dtype import float32
from eqgrad.graph.interp import run_kernel
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.lower.collapse import collapse
from eqgrad.lower.lowering import lower_kernel


def buf(i: int, shape, dt=float32) -> KNode:
    return KNode("BUF", (), i, tuple(shape), dt)


def update_kernel(shape) -> KernelPlan:
    """An Adam-like update: p - s * m / (sqrt(v) + eps), with s computed from a scalar in the
    kernel and broadcast, eps a constant; p, m, v of ``shape``, the scalar of shape ()."""
    p, m, v, t = buf(0, shape), buf(1, shape), buf(2, shape), buf(3, ())
    ones = (1,) * len(shape)
    s = KNode("RECIP", (KNode("ADD", (KNode("CONST", (), 1.0, (), float32), t), None, (), float32),), None, (), float32)
    s = KNode("EXPAND", (KNode("RESHAPE", (s,), ones, ones, float32),), tuple(shape), tuple(shape), float32)
    eps = KNode("CONST", (), 1e-8, tuple(shape), float32)
    den = KNode("ADD", (KNode("SQRT", (v,), None, tuple(shape), float32), eps), None, tuple(shape), float32)
    step = KNode("MUL", (KNode("MUL", (s, m), None, tuple(shape), float32), KNode("RECIP", (den,), None, tuple(shape), float32)),
                 None, tuple(shape), float32)
    ast = KNode("ADD", (p, KNode("NEG", (step,), None, tuple(shape), float32)), None, tuple(shape), float32)
    return KernelPlan([(tuple(shape), float32)] * 3 + [((), float32), (tuple(shape), float32)], 4,
                      [Kernel("k0", 4, ast, (0, 1, 2, 3))], [4])


def inputs(plan: KernelPlan, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(s).astype(np.float32) for s, _ in plan.buffers[:plan.n_inputs]]
    out[2] = np.abs(out[2])                   # v >= 0
    return out


def run_llvm(plan: KernelPlan, arrays: list[np.ndarray]) -> np.ndarray:
    from eqgrad.devices import Buffer
    run = get_device("LLVM").prepare(plan)
    bufs = [Buffer.from_numpy(a, "LLVM") for a in arrays] + [Buffer.empty(s, d, "LLVM") for s, d in plan.buffers[plan.n_inputs:]]
    run(bufs)
    return bufs[plan.outputs[0]].numpy()


@pytest.mark.parametrize("shape", [(128, 64), (10, 128), (3, 5, 7), (1, 1, 9)])
def test_an_update_lowers_to_one_loop_with_the_numbers_of_the_kernel_as_written(shape):
    plan = update_kernel(shape)
    k = plan.kernels[0]
    lk = lower_kernel(k, plan)
    assert collapse(k).ast.shape == (int(np.prod(shape)),)
    assert sum(x.op == "RANGE" for x in lk.insts) == 1
    arrays = inputs(plan)
    want = run_kernel(k, list(arrays) + [None])
    np.testing.assert_allclose(run_llvm(plan, arrays), np.asarray(want).reshape(shape), rtol=1e-6, atol=1e-6)


def test_shapes_of_one_body_share_one_source():
    srcs = set()
    for shape in [(128, 64), (64, 128), (32, 16, 16), (8192,)]:
        plan = update_kernel(shape)
        srcs.add(render_llvm(lower_kernel(plan.kernels[0], plan)))
    assert len(srcs) == 1


def test_kernels_that_read_across_elements_keep_their_loops():
    x, y = buf(0, (4, 6)), buf(1, (6, 4))
    cases = [
        KNode("ADD", (x, KNode("PERMUTE", (y,), (1, 0), (4, 6), float32)), None, (4, 6), float32),
        KNode("ADD", (x, KNode("EXPAND", (buf(1, (1, 6)),), (4, 6), (4, 6), float32)), None, (4, 6), float32),
        KNode("EXP2", (KNode("PAD", (buf(0, (3, 5)),), ((1, 0), (0, 1)), (4, 6), float32),), None, (4, 6), float32),
        KNode("RSUM", (buf(0, (4, 6, 3)),), (2,), (4, 6, 1), float32),
    ]
    for ast in cases:
        k = Kernel("k0", 2, ast, ast.buffers())
        assert collapse(k) is k, ast.render()
