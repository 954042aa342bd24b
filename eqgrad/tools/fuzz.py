"""A program fuzzer: random well-typed tensor programs, run through the whole pipeline and compared
with NumPy.

A program is a list of steps over a growing list of values (the inputs first). Each step applies
one op from :data:`STEPS` to earlier values; every op has an eqgrad form and a NumPy form, and a
``fits`` check that keeps programs well typed (shapes that broadcast, axes that exist, dtypes the op
accepts). Shapes include 0-d, size-1 and size-0 axes; dtypes float32, int32 and bool; movement
chains, reductions, ``where``, casts, comparisons and argmax/argmin all appear. Each program runs
twice: as the extractor plans it, and with every value materialized (``PLANS``).

hypothesis drives the choices (``program_strategy``), so a failing program is shrunk to a small
one before it is reported. ``tests/test_fuzz.py`` runs a short, seeded, bounded campaign in CI;
``python -m eqgrad fuzz --examples N [--device D]`` runs a long one. Every failure found becomes a
regression test in ``tests/test_fuzz.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from eqgrad.frontend.tensor import Tensor
from eqgrad.engine import realize

F, I, B = np.float32, np.int32, np.bool_


@dataclass(frozen=True)
class Step:
    name: str
    arity: int
    fits: Callable[..., bool]                        # (arrays..., param) -> bool
    eq: Callable[..., Any]                           # (tensors..., param) -> Tensor
    np: Callable[..., np.ndarray]                    # (arrays..., param) -> array
    params: tuple = (None,)                          # parameter choices


def _bcast(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        np.broadcast_shapes(a.shape, b.shape)
        return True
    except ValueError:
        return False


def _num(a: np.ndarray) -> bool:
    return a.dtype != B


def _float(a: np.ndarray) -> bool:
    return a.dtype == F


def _same_kind(a, b) -> bool:
    return _bcast(a, b) and (a.dtype == B) == (b.dtype == B)


def _promote(a: np.ndarray, b: np.ndarray) -> Any:
    order = {B: 0, I: 1, F: 2}
    return a.dtype.type if order[a.dtype.type] >= order[b.dtype.type] else b.dtype.type


def _np_binary(f: Callable) -> Callable:
    def run(a, b, _p):
        d = _promote(a, b)
        with np.errstate(all="ignore"):
            return np.asarray(f(a.astype(d), b.astype(d))).astype(d)
    return run


def _axis_ok(a: np.ndarray, ax: int) -> bool:
    return a.ndim > 0 and -a.ndim <= ax < a.ndim


def _np_sum(a, ax):
    if a.dtype == B:
        a = a.astype(I)
    return np.sum(a, axis=ax, dtype=a.dtype)


def _np_floordiv(a, b, _p):
    d = _promote(a, b)
    a, b = a.astype(d), b.astype(d)
    with np.errstate(all="ignore"):
        if d == F:
            return np.floor_divide(a, b).astype(F)
        return np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b))).astype(I)


STEPS: list[Step] = [
    Step("add", 2, lambda a, b, p: _same_kind(a, b) and _num(a), lambda a, b, p: a + b, _np_binary(np.add)),
    Step("sub", 2, lambda a, b, p: _bcast(a, b) and _num(a) and _num(b), lambda a, b, p: a - b, _np_binary(np.subtract)),
    Step("mul", 2, lambda a, b, p: _same_kind(a, b), lambda a, b, p: a * b,
         _np_binary(lambda x, y: np.logical_and(x, y) if x.dtype == B else x * y)),
    Step("maximum", 2, lambda a, b, p: _bcast(a, b), lambda a, b, p: a.maximum(b), _np_binary(np.maximum)),
    Step("lt", 2, lambda a, b, p: _bcast(a, b), lambda a, b, p: a < b,
         lambda a, b, p: np.less(a.astype(_promote(a, b)), b.astype(_promote(a, b)))),
    Step("eq", 2, lambda a, b, p: _bcast(a, b), lambda a, b, p: a == b,
         lambda a, b, p: np.equal(a.astype(_promote(a, b)), b.astype(_promote(a, b)))),
    # integer floor division only: a float quotient near an integer rounds either way
    Step("floordiv", 2, lambda a, b, p: _bcast(a, b) and a.dtype == I and b.dtype == I, lambda a, b, p: a // b,
         _np_floordiv),
    Step("where", 3, lambda c, a, b, p: c.dtype == B and _bcast(c, a) and _bcast(np.empty(np.broadcast_shapes(c.shape, a.shape)), b)
         and a.dtype == b.dtype,
         lambda c, a, b, p: c.where(a, b), lambda c, a, b, p: np.where(c, a, b).astype(a.dtype)),
    Step("neg", 1, lambda a, p: _num(a), lambda a, p: -a, lambda a, p: np.negative(a)),
    Step("abs", 1, lambda a, p: True, lambda a, p: a.abs(), lambda a, p: np.abs(a) if a.dtype != B else a),
    Step("exp2", 1, lambda a, p: _float(a), lambda a, p: a.clip(-60, 60).exp2(),
         lambda a, p: np.exp2(np.clip(a, -60, 60)).astype(F)),
    Step("sqrt_abs", 1, lambda a, p: _float(a), lambda a, p: a.abs().sqrt(), lambda a, p: np.sqrt(np.abs(a))),
    Step("relu", 1, lambda a, p: _num(a), lambda a, p: a.relu(), lambda a, p: np.where(a > 0, a, 0).astype(a.dtype)),
    Step("cast", 1, lambda a, p: not (a.dtype == F and p is I), lambda a, p: a.cast(p),
         lambda a, p: a.astype(p), params=(F, I, B)),
    Step("sum", 1, lambda a, p: _axis_ok(a, p), lambda a, p: a.sum(p),
         lambda a, p: _np_sum(a, p), params=(0, -1, 1)),
    Step("sum_all", 1, lambda a, p: True, lambda a, p: a.sum(), lambda a, p: np.asarray(_np_sum(a, None))),
    Step("max", 1, lambda a, p: _axis_ok(a, p) and a.shape[p] > 0, lambda a, p: a.amax(p, keepdim=True),
         lambda a, p: np.max(a, axis=p, keepdims=True), params=(0, -1)),
    # a value compared with a reduction of itself: a plan that evaluates the value in two kernels
    # must still find its max (argmax used to return the axis length there)
    Step("argmax", 1, lambda a, p: _axis_ok(a, p) and a.shape[p] > 0, lambda a, p: a.argmax(p),
         lambda a, p: np.argmax(a, axis=p).astype(I), params=(0, -1)),
    Step("argmin", 1, lambda a, p: _axis_ok(a, p) and a.shape[p] > 0, lambda a, p: a.argmin(p),
         lambda a, p: np.argmin(a, axis=p).astype(I), params=(0, -1)),
    Step("is_max", 1, lambda a, p: _axis_ok(a, p) and a.shape[p] > 0, lambda a, p: a == a.amax(p, keepdim=True),
         lambda a, p: a == np.max(a, axis=p, keepdims=True), params=(0, -1)),
    Step("mean", 1, lambda a, p: _axis_ok(a, p) and _float(a), lambda a, p: a.mean(p, keepdim=True),
         lambda a, p: np.sum(a, axis=p, keepdims=True, dtype=F) * F(1 / a.shape[p] if a.shape[p] else np.nan),
         params=(0, -1)),
    Step("reshape_flat", 1, lambda a, p: True, lambda a, p: a.reshape(-1) if a.size else a.reshape(0),
         lambda a, p: a.reshape(-1)),
    Step("transpose", 1, lambda a, p: a.ndim >= 2, lambda a, p: a.transpose(), lambda a, p: np.swapaxes(a, -1, -2)),
    Step("unsqueeze", 1, lambda a, p: a.ndim < 4, lambda a, p: a.unsqueeze(0), lambda a, p: a[None]),
    Step("expand", 1, lambda a, p: a.ndim < 4, lambda a, p: a.unsqueeze(0).expand(2, *a.shape),
         lambda a, p: np.broadcast_to(a[None], (2, *a.shape))),
    Step("flip", 1, lambda a, p: a.ndim >= 1, lambda a, p: a.flip(0), lambda a, p: a[::-1]),
    Step("slice", 1, lambda a, p: a.ndim >= 1, lambda a, p: a[1::2], lambda a, p: a[1::2]),
    Step("pad", 1, lambda a, p: a.ndim >= 1, lambda a, p: a.pad(((1, 2),) + ((0, 0),) * (a.ndim - 1)),
         lambda a, p: np.pad(a, ((1, 2),) + ((0, 0),) * (a.ndim - 1))),
    Step("cat", 2, lambda a, b, p: a.ndim >= 1 and a.ndim == b.ndim and a.shape[1:] == b.shape[1:] and a.dtype == b.dtype,
         lambda a, b, p: a.cat(b, dim=0), lambda a, b, p: np.concatenate([a, b], 0)),
]

# (4, 5) and (6, 4): sums of 4+ elements are where two evaluations of one value round two ways
SHAPES = [(), (1,), (3,), (0,), (2, 3), (3, 1), (1, 3), (2, 0), (2, 1, 3), (4, 3), (4, 5), (6, 4)]
DTYPES = [F, F, I, B]


def make_input(shape: tuple, dtype: Any, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == B:
        return rng.random(shape) < 0.5
    if dtype == I:
        return rng.integers(-5, 6, shape).astype(I)
    v = (rng.standard_normal(shape) * 2).astype(F)
    if v.size and rng.random() < 0.3:
        v.flat[rng.integers(v.size)] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan])
    return v


@dataclass
class Program:
    inputs: list[tuple[tuple, Any]]                  # (shape, dtype)
    steps: list[tuple[str, tuple[int, ...], Any]]    # (step name, value indices, parameter)

    def __str__(self) -> str:
        lines = [f"v{i} = input {s} {np.dtype(d).name}" for i, (s, d) in enumerate(self.inputs)]
        n = len(self.inputs)
        for j, (name, args, p) in enumerate(self.steps):
            ps = "" if p is None else f", {p.__name__ if isinstance(p, type) else p}"
            lines.append(f"v{n + j} = {name}({', '.join(f'v{a}' for a in args)}{ps})")
        return "\n".join(lines)


BY_NAME = {s.name: s for s in STEPS}


def run_numpy(prog: Program, arrays: list[np.ndarray]) -> list[np.ndarray]:
    vals = list(arrays)
    for name, args, p in prog.steps:
        with np.errstate(all="ignore"):
            vals.append(np.asarray(BY_NAME[name].np(*[vals[a] for a in args], p)))
    return vals


# How a program is planned: "inline" realizes the program's final values at once and leaves every
# choice to the extractor (values are inlined into the kernels that use them where it pays);
# "contiguous" makes every step's value its own kernel in that one plan (``contiguous()``);
# "materialize" realizes each step's value on its own, so every later step reads it from a buffer.
# A value has one value whatever the plan (docs/semantics.md), so all must agree with NumPy: a difference
# found only inline is a value evaluated twice that rounded two ways.
PLANS = ("inline", "contiguous", "materialize")


def run_eqgrad(prog: Program, arrays: list[np.ndarray], device: str, plan: str = "inline") -> list[np.ndarray]:
    if plan not in PLANS:
        raise ValueError(f"run_eqgrad: plan must be one of {PLANS}, got {plan!r}")
    vals = [Tensor(a, device=device) for a in arrays]
    for name, args, p in prog.steps:
        v = BY_NAME[name].eq(*[vals[a] for a in args], p)
        vals.append(v.realize() if plan == "materialize" else v.contiguous() if plan == "contiguous" else v)
    # one realize of the values no step reads: the whole program is one plan, and the values it
    # reads are the extractor's to inline or materialize (realizing them too would make every
    # value a root of the plan, so computed once: the "materialize" plan by another road)
    read = {a for _, args, _ in prog.steps for a in args}
    realize([v.lazydata for i, v in enumerate(vals) if i >= len(arrays) and i not in read])
    return [v.numpy() for v in vals]


def compare(got: np.ndarray, ref: np.ndarray) -> str | None:
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} != {ref.dtype}"
    if ref.dtype == F:
        ok = np.isclose(got, ref, rtol=1e-4, atol=1e-5, equal_nan=True) | ((got == ref) & np.isinf(ref))
        if not ok.all():
            i = tuple(np.argwhere(~ok)[0])
            return f"value at {list(i)}: {got[i]} != {ref[i]}"
    elif not np.array_equal(got, ref):
        i = tuple(np.argwhere(got != ref)[0])
        return f"value at {list(i)}: {got[i]} != {ref[i]}"
    return None


def check_program(prog: Program, device: str, seed: int = 0, plans: tuple[str, ...] = PLANS,
                  draws: int = 3) -> str | None:
    """None when eqgrad on ``device`` agrees with NumPy on every value of the program, under each of
    ``plans`` (inlined and materialized values: ``PLANS``), at ``draws`` input draws (the plan is
    compiled once and run on each: a value rounded two ways shows on some inputs only)."""
    for d in range(draws):
        arrays = [make_input(s, dt, seed + 101 * d + i) for i, (s, dt) in enumerate(prog.inputs)]
        refs = run_numpy(prog, arrays)
        for plan in plans:
            gots = run_eqgrad(prog, arrays, device, plan)
            for j, (g, r) in enumerate(zip(gots, refs)):
                err = compare(g, np.asarray(r))
                if err:
                    return f"v{j} ({plan}, input draw {d}): {err}"
    return None


def program_strategy(max_inputs: int = 3, max_steps: int = 6, probe: bool = False):
    """A hypothesis strategy of well-typed programs. Half of them (``probe``: all of them, and the
    value probed is a reduction's whenever the program has one) end by comparing a computed float
    value with its own max."""
    from hypothesis import strategies as st

    @st.composite
    def programs(draw) -> Program:
        n_in = draw(st.integers(1, max_inputs))
        inputs = [(draw(st.sampled_from(SHAPES)), draw(st.sampled_from(DTYPES))) for _ in range(n_in)]
        arrays = [np.zeros(s, d) for s, d in inputs]          # shapes and dtypes only, for `fits`
        steps = []
        for _ in range(draw(st.integers(1, max_steps))):
            step = draw(st.sampled_from(STEPS))
            # the first argument is the latest value half the time: chains of steps (a reduction
            # then a comparison with it) are where a value is inlined into several kernels
            last = len(arrays) - 1
            args = (draw(st.one_of(st.just(last), st.integers(0, last))),) + \
                tuple(draw(st.integers(0, last)) for _ in range(step.arity - 1))
            p = draw(st.sampled_from(step.params))
            xs = [arrays[a] for a in args]
            try:
                if not step.fits(*xs, p):
                    continue
                with np.errstate(all="ignore"):
                    out = np.asarray(step.np(*xs, p))
            except (ValueError, IndexError, TypeError):
                continue
            if out.ndim > 6 or out.size > 4096:
                continue
            arrays.append(out)
            steps.append((step.name, args, p))
        # half the programs end by comparing a computed float value with its own max (argmax,
        # argmin, x == x.max()): where a plan inlines that value into two kernels that round it two
        # ways, no element equals the max and argmax is out of range; a random step lands there too
        # rarely to find it
        computed = [len(inputs) + j for j in range(len(steps)) if arrays[len(inputs) + j].dtype == F
                    and arrays[len(inputs) + j].ndim >= 1 and 0 not in arrays[len(inputs) + j].shape]
        reduced = [v for v in computed if steps[v - len(inputs)][0] in ("sum", "mean", "max")]
        if computed and (probe or draw(st.booleans())):
            v = draw(st.sampled_from(reduced if reduced and (probe or draw(st.booleans())) else computed))
            compare = draw(st.sampled_from(["argmax", "argmin", "is_max"]))
            steps.append((compare, (v,), draw(st.sampled_from((0, -1)))))
        return Program(inputs, steps)
    return programs()
