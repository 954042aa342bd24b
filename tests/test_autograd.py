"""Autograd: every primitive's gradient rule (ops.py) against finite differences of its NumPy
reference, and the forward and backward of every Tensor op against torch 2.13.0 (finite
differences when torch is missing), on several shapes including broadcasting and non-contiguous
inputs (views made by transposes, strided and reversed slices).

Each case is one program (output and gradients realized together); shapes are small and reused.
"""
from __future__ import annotations

import math
import types

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor
from eqgrad.errors import AutogradError, DTypeError, ShapeError
from eqgrad.ops import OPS, NoGrad
from conftest import data
from gradcheck import HAVE_TORCH, check_fwd_bwd, torch

F32 = np.float32


def pos(shape, seed=0):
    return data(shape, seed=seed, low=0.5, high=3.0)


def unit(shape, seed=0):
    return data(shape, seed=seed, low=-0.9, high=0.9)


def anyv(shape, seed=0):
    return data(shape, seed=seed)


# ------------------------------------------------------------------ primitive rules (op table)

def _prim_case(name):
    """(inputs, attribute) for a primitive on (2, 3) float inputs."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 2.0, (2, 3)).astype(F32)
    y = rng.uniform(-2.0, 2.0, (2, 3)).astype(F32)
    o = OPS[name]
    arg = {"CAST": eqgrad.float32, "RSUM": (1,), "RMAX": (0, 1), "RESHAPE": (3, 2), "PERMUTE": (1, 0),
           "PAD": ((1, 0), (0, 2)), "SHRINK": ((0, 1), (2, 3)), "FLIP": (1,)}.get(name)
    if name == "EXPAND":
        return [x[:, :1]], (2, 3)
    if name == "WHERE":
        return [rng.random((2, 3)) > 0.5, x, y], None
    if name == "MAX":
        y[0, 0] = x[0, 0]                # a tie: the gradient is split evenly
        return [x, y], None
    return [x, y, x][:o.arity], arg


DIFFERENTIABLE = sorted(n for n, o in OPS.items() if callable(o.grad) and o.name != "REALIZE")


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_primitive_gradient_rule(name):
    """The rule in the op table vs central differences (float64) of the op's NumPy reference."""
    o = OPS[name]
    inputs, arg = _prim_case(name)
    ts = [Tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    out = ts[0]._apply(name, *ts[1:], arg=arg) if name != "WHERE" else ts[0]._apply(name, *ts[1:])
    w = np.random.default_rng(5).uniform(0.5, 1.5, out.shape)
    (out * Tensor(w.astype(F32))).sum().backward()
    eqgrad.realize(*[t.grad for t in ts if t.grad is not None])

    f64 = eqgrad.dtype.float64                                    # evaluate the reference in float64

    def f(arrs):
        if name == "CAST":                                           # float32 -> float32: the identity
            return float((arrs[0] * w).sum())
        return float((o.ref(arrs, arg, f64) * w).sum())

    for i, a in enumerate(inputs):
        if a.dtype.kind != "f":
            continue
        want = np.zeros(a.shape)
        for j in np.ndindex(a.shape):
            hi, lo = [np.array(v, dtype=np.float64 if v.dtype.kind == "f" else v.dtype) for v in inputs], None
            lo = [np.array(v) for v in hi]
            hi[i][j] += 1e-6
            lo[i][j] -= 1e-6
            want[j] = (f(hi) - f(lo)) / 2e-6
        if name == "MAX":
            want[0, 0] = w[0, 0] / 2      # finite differences straddle the tie; the rule splits it
        np.testing.assert_allclose(ts[i].grad.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{name} source {i}")


def test_not_differentiable_ops_say_why():
    reasons = {n: o.grad.reason for n, o in OPS.items() if isinstance(o.grad, NoGrad)}
    assert set(reasons) >= {"CMPLT", "CMPEQ", "IDIV", "MOD", "AND", "OR", "XOR", "TRUNC", "BUF", "CONST"}
    assert all(reasons.values())


# ------------------------------------------------------------------ Tensor ops vs torch

def tf(name):
    """A torch function by name (only called when torch is installed)."""
    def call(*a, **k):
        return getattr(torch.nn.functional, name)(*a, **k)
    return call


X34 = anyv((3, 4), 1)
X4 = anyv((4,), 2)
X31 = anyv((3, 1), 3)
X14 = anyv((1, 4), 4)
X234 = anyv((2, 3, 4), 5)
P34 = pos((3, 4), 6)
P4 = pos((4,), 7)
U34 = unit((3, 4), 8)
X43 = anyv((4, 3), 9)
X36 = anyv((3, 6), 10)

# (id, eqgrad fn, torch fn or None for the same, inputs)
UNARY = [
    ("neg", lambda x: -x, None, [X34]),
    ("exp", lambda x: x.exp(), None, [X34]),
    ("exp2", lambda x: x.exp2(), None, [X34]),
    ("log", lambda x: x.log(), None, [P34]),
    ("log2", lambda x: x.log2(), None, [P34]),
    ("sqrt", lambda x: x.sqrt(), None, [P34]),
    ("rsqrt", lambda x: x.rsqrt(), None, [P34]),
    ("reciprocal", lambda x: x.reciprocal(), None, [P34]),
    ("sin", lambda x: x.sin(), None, [X34]),
    ("cos", lambda x: x.cos(), None, [X34]),
    ("tan", lambda x: x.tan(), None, [U34]),
    ("abs", lambda x: x.abs(), None, [X34]),
    ("square", lambda x: x.square(), None, [X34]),
    ("relu", lambda x: x.relu(), None, [X34]),
    ("sigmoid", lambda x: x.sigmoid(), None, [X34]),
    ("tanh", lambda x: x.tanh(), None, [X34]),
    ("sign", lambda x: x.sign(), None, [X34]),
    ("floor", lambda x: x.floor(), None, [X34]),
    ("ceil", lambda x: x.ceil(), None, [X34]),
    ("trunc", lambda x: x.trunc(), None, [X34]),
    ("clip", lambda x: x.clip(-1.0, 1.0), None, [X34]),
    ("pow2", lambda x: x ** 2, None, [X34]),
    ("pow3", lambda x: x ** 3, None, [X34]),
    ("pow_half", lambda x: x ** 0.5, None, [P34]),
    ("pow_neg", lambda x: x ** -1.5, None, [P34]),
    ("rpow", lambda x: 2.0 ** x, None, [X34]),
    ("leaky_relu", lambda x: x.leaky_relu(0.1), lambda x: tf("leaky_relu")(x, 0.1), [X34]),
    ("elu", lambda x: x.elu(), tf("elu"), [X34]),
    ("silu", lambda x: x.silu(), tf("silu"), [X34]),
    ("gelu", lambda x: x.gelu(), tf("gelu"), [X34]),
    ("gelu_tanh", lambda x: x.gelu("tanh"), lambda x: tf("gelu")(x, approximate="tanh"), [X34]),
    ("softplus", lambda x: x.softplus(), tf("softplus"), [X34 * 10]),
    ("logsigmoid", lambda x: x.logsigmoid(), tf("logsigmoid"), [X34]),
    ("mish", lambda x: x.mish(), tf("mish"), [X34]),
    ("hardtanh", lambda x: x.hardtanh(), tf("hardtanh"), [X34]),
    ("relu6", lambda x: (x * 3).relu6(), lambda x: tf("relu6")(x * 3), [X34]),
    ("hardsigmoid", lambda x: x.hardsigmoid(), tf("hardsigmoid"), [X34 * 2]),
    ("hardswish", lambda x: x.hardswish(), tf("hardswish"), [X34 * 2]),
    ("erf", lambda x: x.erf(), lambda x: torch.erf(x), [X34]),
    # non-contiguous inputs: the op reads a transposed / strided / reversed view of the leaf
    ("exp_T", lambda x: x.T.exp(), None, [X43]),
    ("sigmoid_strided", lambda x: x[:, ::2].sigmoid(), None, [X36]),
    ("tanh_reversed", lambda x: x[::-1].tanh(), lambda x: x.flip(0).tanh(), [X34]),
    ("log_permuted", lambda x: x.permute(2, 0, 1).log(), None, [pos((2, 3, 4), 11)]),
]

BINARY = [
    ("add", lambda a, b: a + b, None, [X34, X34 * 0.5]),
    ("add_bcast_row", lambda a, b: a + b, None, [X34, X4]),
    ("add_bcast_outer", lambda a, b: a + b, None, [X31, X14]),
    ("sub_bcast", lambda a, b: a - b, None, [X234, X34]),
    ("mul_bcast", lambda a, b: a * b, None, [X34, X31]),
    ("div_bcast", lambda a, b: a / b, None, [X34, P4]),
    ("rdiv_scalar", lambda a: 2.0 / a, None, [P34]),
    ("pow_tensor", lambda a, b: a ** b, None, [P34, X4]),
    ("maximum", lambda a, b: a.maximum(b), None, [X34, X4]),
    ("minimum", lambda a, b: a.minimum(b), None, [X34, X31]),
    ("where", lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b),
     [X34 > 0, anyv((3, 4), 12), X4]),
    ("mul_views", lambda a, b: a.T * b[::2], None, [X43, anyv((6, 4), 13)]),
]

REDUCE = [
    ("sum_all", lambda x: x.sum(), None, [X234]),
    ("sum_axis", lambda x: x.sum(1), None, [X234]),
    ("sum_axes_keepdim", lambda x: x.sum((0, 2), keepdim=True), lambda x: x.sum((0, 2), keepdim=True), [X234]),
    ("mean", lambda x: x.mean(-1), None, [X234]),
    ("max_axis", lambda x: x.amax(1), lambda x: x.amax(1), [X234]),
    ("max_all", lambda x: x.max(), lambda x: x.amax(), [X34]),
    ("min_axis", lambda x: x.amin(0), lambda x: x.amin(0), [X34]),
    ("max_ties", lambda x: x.amax(1), lambda x: x.amax(1), [np.array([[1, 3, 3], [2, 2, 2]], F32)]),
    ("var", lambda x: x.var(1), None, [X234]),
    ("var_biased", lambda x: x.var(1, correction=0), lambda x: x.var(1, correction=0), [X34]),
    ("std", lambda x: x.std(0), None, [X34]),
    ("logsumexp", lambda x: x.logsumexp(1), None, [X34 * 3]),
    ("softmax", lambda x: x.softmax(-1), None, [X234]),
    ("softmax_axis0", lambda x: x.softmax(0), None, [X34]),
    ("log_softmax", lambda x: x.log_softmax(1), None, [X34 * 4]),
    ("softmax_T", lambda x: x.T.softmax(1), None, [X34]),
]

MOVEMENT = [
    ("reshape", lambda x: x.reshape(4, 6) * X46W, lambda x: x.reshape(4, 6) * torch.tensor(X46W), [X234]),
    ("permute", lambda x: x.permute(2, 0, 1), None, [X234]),
    ("transpose", lambda x: x.transpose(0, 1), None, [X234]),
    ("expand", lambda x: x.expand(2, 3, 4), None, [X31]),
    ("pad", lambda x: x.pad(((1, 0), (2, 1))), lambda x: tf("pad")(x, (2, 1, 1, 0)), [X34]),
    ("pad_value", lambda x: x.pad(((0, 1), (1, 1)), value=2.0), lambda x: tf("pad")(x, (1, 1, 0, 1), value=2.0), [X34]),
    ("slice", lambda x: x[1:, ::2], None, [X234]),
    ("slice_negative_step", lambda x: x[::-2, 1], lambda x: x.flip(0)[::2, 1], [X34]),
    ("flip", lambda x: x.flip(0), lambda x: x.flip(0), [X34]),
    ("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0), None, [X31]),
    ("flatten", lambda x: x.flatten(1), None, [X234]),
    ("cat", lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [X34, X31]),
    ("stack", lambda a, b: Tensor.stack([a, b], 1), lambda a, b: torch.stack([a, b], 1), [X34, X34 * 2]),
]
X46W = anyv((4, 6), 14)

LINALG = [
    ("matmul", lambda a, b: a @ b, None, [X34, X43]),
    ("matmul_batched_bcast", lambda a, b: a @ b, None, [X234, X43]),
    ("matmul_vec", lambda a, b: a @ b, None, [X34, X4]),
    ("vec_matmul", lambda a, b: a @ b, None, [anyv((3,), 15), X34]),
    ("matmul_T", lambda a, b: a @ b.T, None, [X34, X34 * 0.5]),
    ("linear_chain", lambda x, w, b: (x @ w + b).relu().sum(1), None, [X34, X43, anyv((3,), 16)]),
]

CASES = UNARY + BINARY + REDUCE + MOVEMENT + LINALG


@pytest.mark.parametrize("name, fn, tfn, inputs", CASES, ids=[c[0] for c in CASES])
def test_tensor_op_forward_backward(name, fn, tfn, inputs):
    if name == "max_ties" and not HAVE_TORCH:
        pytest.skip("finite differences are one-sided at a tie; the split needs torch as the reference")
    tol = dict(rtol=2e-4, atol=2e-5) if name in ("erf", "gelu", "tan", "pow_tensor", "rpow", "mish") else {}
    check_fwd_bwd(fn, inputs, tfn, **tol)


@pytest.mark.parametrize("name", ["exp", "add_bcast_outer", "max_axis", "matmul", "slice"])
def test_finite_difference_fallback(name):
    """The path taken when torch is not installed: gradients against central differences."""
    _, fn, _, inputs = next(c for c in CASES if c[0] == name)
    check_fwd_bwd(fn, inputs, use_fd=True)


# ------------------------------------------------------------------ autograd behaviour

def test_backward_scalar_and_accumulation():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    (x * 3).sum().backward()                      # accumulates
    assert x.grad.tolist() == [5.0, 7.0, 9.0]
    x.grad = None
    x.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_backward_with_explicit_gradient():
    x = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * x
    y.backward(np.array([[1.0, 0.0], [0.5, 2.0]], F32))
    np.testing.assert_allclose(x.grad.numpy(), [[2.0, 0.0], [3.0, 16.0]])
    with pytest.raises(ShapeError, match=r"gradient shape \(2,\) != tensor shape \(2, 2\)"):
        y.backward(Tensor([1.0, 1.0]))
    with pytest.raises(ShapeError, match="implicitly only for a tensor with one element"):
        y.backward()


def test_gradients_are_lazy_and_realize_in_one_program():
    x = Tensor(np.ones((4, 4), F32), requires_grad=True)
    loss = (x.exp() * 2).sum()
    loss.backward()
    assert not x.grad.lazydata.realized
    before = eqgrad.GlobalCounters.realize_count
    eqgrad.realize(loss, x.grad)
    assert eqgrad.GlobalCounters.realize_count == before + 1
    np.testing.assert_allclose(x.grad.numpy(), np.full((4, 4), 2 * math.e), rtol=1e-6)


def test_backward_after_the_loss_was_realized():
    """The autograd records survive realize(): a printed loss can still be differentiated."""
    w = Tensor([0.5, -1.0], requires_grad=True)
    loss = (w * w * 3).sum()
    assert loss.item() == pytest.approx(3.75)
    loss.backward()
    assert w.grad.tolist() == [3.0, -6.0]


def test_shared_subexpression_and_reused_input():
    x = Tensor([2.0, -1.0], requires_grad=True)
    h = x * x
    (h + h * x).sum().backward()                  # d/dx (x^2 + x^3) = 2x + 3x^2
    assert x.grad.tolist() == [16.0, 1.0]


def test_detach_and_no_grad():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x.detach() * x
    assert y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 2.0]           # the detached factor is a constant
    with eqgrad.no_grad():
        z = x * 2
    assert not z.requires_grad and z._ctx is None
    assert eqgrad.is_grad_enabled()
    with pytest.raises(AutogradError, match="does not require a gradient"):
        z.sum().backward()


def test_integer_outputs_stop_gradients():
    x = Tensor([1.5, -2.5], requires_grad=True)
    assert not (x > 0).requires_grad and not x.int().requires_grad
    y = x * (x > 0).float()
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 0.0]


def test_requires_grad_needs_float():
    with pytest.raises(DTypeError, match="only float32 tensors can require a gradient, got int32"):
        Tensor([1, 2], requires_grad=True)
    t = Tensor(3.0, requires_grad=True)
    assert t.lazydata.realized                   # a parameter owns a buffer (optimizers assign to it)
    (t * t).backward()
    assert t.grad.item() == 6.0


def test_leaf_and_non_leaf():
    x = Tensor([1.0], requires_grad=True)
    y = x * 2
    assert x.is_leaf and not y.is_leaf
    y.backward()
    assert y.grad is None and x.grad.item() == 2.0


def test_docstring_examples():
    import doctest

    import eqgrad.frontend.autograd as autograd
    from eqgrad.frontend import tensor
    assert doctest.testmod(autograd).failed == 0
    names = ["backward", "assign", "leaky_relu", "elu", "silu", "erf", "gelu", "softplus", "logsigmoid", "mish",
             "hardtanh", "relu6", "hardsigmoid", "hardswish"]
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for name in names:
        for test in finder.find(getattr(Tensor, name), f"Tensor.{name}", globs={"Tensor": Tensor}):
            runner.run(test)
    for test in finder.find(tensor.realize, "realize", globs={"Tensor": Tensor, "realize": tensor.realize}):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
