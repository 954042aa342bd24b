"""graph/program.py: ``structure`` (the cached realize's one-walk key) gives exactly
``linearize``'s key, inputs and parameters, on programs of every kind the frontend builds."""
import numpy as np
import pytest

import eqgrad.nn.functional as F
from eqgrad import Tensor
from eqgrad.graph.program import linearize, structure
from conftest import data


def _programs():
    a, b = Tensor(data((4, 6), seed=1)), Tensor(data((6, 5), seed=2))
    c = Tensor(data((4, 6), seed=3))
    s = a * 0.37 + 1.0                                     # one parameter (0.37), one structural constant
    yield "elementwise", [(a + c * 2.5).exp() - a]
    yield "shared", [s * s + s, s.sum(1)]                  # a subexpression read twice, two targets
    yield "matmul", [(a @ b).relu() * 0.5]
    yield "same_input_twice", [a * a + a.T.T]
    yield "reductions", [a.amax(1) - a.mean(0).sum(), a.softmax(-1)]
    yield "casts", [(a > 0.25).float() + a.int().float()]
    yield "conv", [F.conv2d(Tensor(data((1, 2, 5, 5))), Tensor(data((3, 2, 3, 3), seed=4)), padding=1)]
    yield "params_distinct_nodes", [a * 0.3 + c * 0.3]     # equal values, two parameters
    yield "const_target", [Tensor.full((2, 3), 1.5) * 1.0]


NAMES = [n for n, _ in _programs()]


@pytest.mark.parametrize("inspected", [None, frozenset({0.0, 1.0})], ids=["all_structural", "rules"])
@pytest.mark.parametrize("name", NAMES)
def test_structure_is_linearize(name, inspected):
    targets = dict(_programs())[name]          # built afresh: the end of each case realizes them
    lbs = list({id(t.lazydata): t.lazydata for t in targets}.values())
    prog = linearize(lbs, device="LLVM", inspected=inspected)
    key, inputs, params, order = structure(lbs, device="LLVM", inspected=inspected)
    assert key == prog.key
    assert linearize(lbs, order, device="LLVM", inspected=inspected).key == key
    assert [id(x) for x in inputs] == [id(x) for x in prog.inputs]
    assert params == prog.params
    if inspected is not None and name in ("elementwise", "shared", "params_distinct_nodes"):
        assert params                                     # the non-rule floats became parameters
    for t in targets:
        t.realize()



@pytest.mark.parametrize("inspected", [None, frozenset({0.0, 1.0})], ids=["all_structural", "rules"])
@pytest.mark.parametrize("name", NAMES)
def test_structure_sizes_is_program_sizes(name, inspected):
    """resize's ProgramSizes from the one-walk structure (no Program) equals program_sizes(prog)."""
    from eqgrad.graph.sizes import program_sizes, structure_sizes
    targets = dict(_programs())[name]
    lbs = list({id(t.lazydata): t.lazydata for t in targets}.values())
    prog = linearize(lbs, device="LLVM", inspected=inspected)
    key, inputs, params, _ = structure(lbs, device="LLVM", inspected=inspected)
    specs = [(x.shape, x.dtype) for x in inputs] + [((), d) for _, d in params]
    assert structure_sizes(key, specs, len(inputs)) == program_sizes(prog)
