"""A kernel body deeper than Python's default recursion limit allows the lowering's recursive
emitter (3-4 frames per level) still lowers: a 400-op chain fused into one kernel with
DeviceParams.max_nodes raised to 320 hit RecursionError (lower/lowering.py ``_room_for``)."""
import numpy as np

from eqgrad import Tensor, engine
from eqgrad.extract import using


def test_a_chain_deeper_than_the_recursion_limit_lowers_and_is_right():
    a = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    with using(params={"LLVM": {"max_nodes": 1000}}):
        y = Tensor(a)
        ref = a.astype(np.float64)
        for i in range(350):
            y = y * 0.999 + 0.001 if i % 2 else y + 0.5
            ref = ref * 0.999 + 0.001 if i % 2 else ref + 0.5
        out = y.numpy()
    assert len(engine.last_plan.plan.kernels) == 1
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_a_body_that_reads_its_values_many_times_renders_in_linear_size():
    """``KNode.render`` (DEBUG=2's kernel lines, explain(), errors) writes a node read more than once
    once: 22 squarings written out at every use are 2**22 leaves (31 hung DEBUG=2 for `x ** y`)."""
    from eqgrad.dtype import float32
    from eqgrad.graph.plan import KNode
    x = KNode("BUF", (), 0, (4,), float32)
    for _ in range(22):
        x = KNode("MUL", (x, x), None, (4,), float32)
    text = x.render()
    assert len(text) < 2000 and text.startswith("MUL(t20, t20) where t0 = MUL(b0, b0); t1 = MUL(t0, t0)"), text[:200]
    y = KNode("ADD", (KNode("BUF", (), 1, (4,), float32), KNode("CONST", (), 2.0, (), float32)), None, (4,), float32)
    assert y.render() == "ADD(b1, 2.0)"
