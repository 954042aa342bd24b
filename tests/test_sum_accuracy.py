"""Float32 sums are accurate on every device (docs/semantics.md "Sums").

Each sum is compared with a float64 reference against the documented first-order bound
    |sum - exact| <= depth * 2**-24 * sum(|x_i|)
where ``depth`` is the most rounded additions any value goes through. For the loop-IR devices it
is read from the kernels actually emitted (``lowering.sum_depth``) and must itself stay within the
documented ceiling ``SUM_DEPTH_MAX``; the NUMPY device accumulates in float64 (depth 1: the final
rounding, plus the float64 error). A single float32 accumulator over n values has depth n - 1:
1e6 x 0.1f was off by 2.2e-4 on LLVM, 1e7 x 0.1f by 6e-3 on OPENCL, 1e9 expanded ones gave 2**28.
"""
from __future__ import annotations

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.lower.lowering import lower_kernel, sum_depth

from conftest import DEVICES

U = 2.0 ** -24                      # float32 unit roundoff
SUM_DEPTH_MAX = 2200                # docs/semantics.md: the depth of a blocked sum, n <= 2**31
DEVS = [d for d in DEVICES if d in ("LLVM", "NUMPY", "OPENCL")]


@pytest.fixture(autouse=True)
def own_reference():
    # the reference here is float64 NumPy; plan validation would re-run 2**31-element sums
    with eqgrad.Context(VALIDATE=0):
        yield


def _depth(device: str, n: int) -> int:
    """The accumulation depth of the plan just run (its kernels are chained: depths add up)."""
    if device == "NUMPY":        # float64 accumulation: n * 2**-53 <= 2**-24 per 2**29 terms, + the rounding
        return 1 + -(-n // 2 ** 29)
    plan = engine.last_plan.plan
    if device == "LLVM":         # the device splits long full sums into parallel partials
        from eqgrad.devices import get_device
        plan = get_device("LLVM").rewrite(plan).plan
    # at least one rounding: a sum over an expanded axis may be the value times the count
    # (expand-sum), which rounds once and accumulates nothing
    d = max(1, sum(sum_depth(lower_kernel(k, plan)) for k in plan.kernels))
    assert d <= SUM_DEPTH_MAX, f"a sum's accumulation depth {d} exceeds the documented {SUM_DEPTH_MAX}"
    if device == "OPENCL":       # a work-group shares the outermost loop and adds its parts in a tree
        d += 8
    return d


def _check(t: Tensor, device: str, exact, magnitude, what: str, n: int) -> None:
    got = t.numpy().astype(np.float64)
    depth = _depth(device, n)
    bound = depth * U * np.asarray(magnitude) * (1 + 1e-6) + 1e-30
    err = np.abs(got - exact)
    worst = float(np.max(err / bound))
    assert worst <= 1.0, (f"{device}: {what}: error {float(np.max(err)):.3g} "
                          f"(relative {float(np.max(err / magnitude)):.3g}) exceeds the bound "
                          f"depth {depth} * 2**-24 * sum|x| by {worst:.2f}x")


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("n", [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7])
@pytest.mark.parametrize("kind", ["tenth", "positive", "mixed"])
def test_full_sum_materialized(device: str, n: int, kind: str) -> None:
    rng = np.random.default_rng(n)
    x = {"tenth": lambda: np.full(n, 0.1, np.float32),
         "positive": lambda: rng.random(n, dtype=np.float32),
         "mixed": lambda: rng.standard_normal(n, dtype=np.float32)}[kind]()
    x64 = x.astype(np.float64)
    _check(Tensor(x, device=device).sum(), device, x64.sum(), np.abs(x64).sum(), f"sum of {n} {kind}", n)


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("n", [3 * 10 ** 3, 10 ** 6])
def test_axis_sums(device: str, n: int) -> None:
    """Sums along one axis of a 2-D tensor: rows (contiguous) and columns (strided, register lanes)."""
    rng = np.random.default_rng(1)
    x = (rng.random((4, n), dtype=np.float32) + np.float32(0.05)).astype(np.float32)
    x64 = x.astype(np.float64)
    _check(Tensor(x, device=device).sum(1), device, x64.sum(1), np.abs(x64).sum(1), f"row sums of (4, {n})", n)
    xt = np.ascontiguousarray(x.T)
    _check(Tensor(xt, device=device).sum(0), device, x64.sum(1), np.abs(x64).sum(1), f"column sums of ({n}, 4)", n)


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("n", [10 ** 4, 10 ** 7, 10 ** 9, 2 ** 31])
def test_expanded_sum(device: str, n: int) -> None:
    """Stride-0 inputs need no memory: an expanded constant and an expanded buffer element."""
    ones = Tensor.ones(1, device=device).expand(n).sum()
    _check(ones, device, np.float64(n), np.float64(n), f"sum of {n} expanded ones", n)
    if n == 2 ** 31:
        assert ones.numpy() == 2147483648.0        # also the loop counters: 2**31 does not fit int32
    tenth = np.float64(np.float32(0.1))
    _check(Tensor([0.1], device=device).expand(n).sum(), device, tenth * n, tenth * n,
           f"sum of {n} expanded 0.1f", n)


@pytest.mark.parametrize("device", DEVS)
def test_sum_of_expand(device: str) -> None:
    """A sum over an expanded materialized row (2-axis reduction, 1e8 terms) and a column
    expanded along a long axis."""
    rng = np.random.default_rng(2)
    row = rng.random(1000, dtype=np.float32)
    r64 = row.astype(np.float64)
    t = Tensor(row, device=device).reshape(1, 1000).expand(10 ** 5, 1000).sum()
    _check(t, device, r64.sum() * 10 ** 5, np.abs(r64).sum() * 10 ** 5, "sum of a row expanded 1e5 times", 10 ** 8)
    col = rng.random((3, 1), dtype=np.float32)
    c64 = col.astype(np.float64)
    t = Tensor(col, device=device).expand(3, 3 * 10 ** 6).sum(1)
    _check(t, device, c64[:, 0] * 3e6, c64[:, 0] * 3e6, "row sums of a column expanded 3e6 times", 3 * 10 ** 6)


def test_depth_is_bounded_for_every_length() -> None:
    """The blocked scheme's depth (computed the way the lowering splits a loop) stays under the
    documented ceiling for every n up to 2**31, and a blocked sum's loop IR agrees with it."""
    from eqgrad.lower.lowering import sum_error_terms, sum_pieces
    rng = np.random.default_rng(3)
    for n in list(rng.integers(1, 2 ** 31, size=2000)) + [2 ** 31, 2 ** 31 - 1, 1025, 2 ** 20 + 1]:
        n = int(n)
        pieces = sum_pieces(n, 1024, 32, 1024)
        assert sum(int(np.prod(e)) for _, e in pieces) == n
        assert all(x <= 1024 for _, e in pieces for x in e)
        assert sum_error_terms(n) <= SUM_DEPTH_MAX
    t = Tensor(np.ones(10 ** 6, np.float32), device="LLVM").sum()
    t.realize()
    plan = engine.last_plan.plan
    assert sum_depth(lower_kernel(plan.kernels[0], plan)) == sum_error_terms(10 ** 6)
