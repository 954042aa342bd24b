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
