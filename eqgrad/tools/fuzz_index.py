"""An index-arithmetic fuzzer at the loop-IR level: random chains of movement ops, lowered and
checked against NumPy indexing.

A :class:`Chain` is an input shape and a list of movement steps (``reshape permute expand pad
shrink flip``, and now and then a final ``sum`` over some axes, whose loops index the same way)
over random shapes of rank 1-5 with sizes 1-7. The input is ``arange(1, n + 1)`` as int32, so every
element is distinct, padding (0) differs from every element, and every comparison is exact.
:func:`check_chain` builds the chain as a lazy graph of Tensor ops and checks it three ways:

1. **loop IR, no compiler**: the lazy graph becomes one fused kernel, ``lower_kernel`` turns it
   into loop IR, and ``graph.interp.run_loop`` executes it in Python (every load and store bounds-checked,
   every ``NONNEG`` division claim verified). Every symbolic index expression the lowering emits
   is also evaluated at every point of its loop box with exact floor arithmetic, and each value
   of it and of each of its ``Div``/``Mod`` atoms must lie inside the bounds the simplifier claims
   (the simplifier's rewrites are only as sound as those bounds);
2. **devices**: the same one-kernel plan, rendered and run by each device (LLVM, OPENCL, NUMPY...);
3. **engine** (optional): the chain realized through the whole pipeline (saturation, extraction,
   lowering) on each device.

Everything is seeded: case ``i`` of seed ``s`` is ``random_chain(np.random.default_rng([s, i]))``.
``tests/test_fuzz_index.py`` runs a bounded campaign in CI; ``python -m eqgrad fuzz --index
[--seed S] [--count N] [--device D] [--engine]`` runs a long one. A failure is reported with its
shortest failing prefix and then with every step removed that it does not need.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.frontend.tensor import Tensor
from eqgrad.lower.symbolic import Div, Var
from eqgrad.lower.lowering import Lowerer
from eqgrad.graph.interp import run_loop as run
from eqgrad.graph.loopir import LoopIRError
from eqgrad.devices import Buffer, get_device

MOVES = ("reshape", "permute", "expand", "pad", "shrink", "flip")
MAX_NUMEL = 1024          # most elements of any intermediate shape (keeps the Python interpreter fast)


@dataclass(frozen=True)
class Chain:
    shape: tuple[int, ...]
    steps: tuple[tuple[str, Any], ...]          # (move, argument), applied in order

    def __str__(self) -> str:
        return f"arange{self.shape}" + "".join(f".{op}({arg})" for op, arg in self.steps)


# ------------------------------------------------------------------ the reference: NumPy indexing

def apply_numpy(a: np.ndarray, op: str, arg: Any) -> np.ndarray:
    if op == "reshape":
        return a.reshape(arg)
    if op == "permute":
        return a.transpose(arg)
    if op == "expand":
        return np.broadcast_to(a, arg)
    if op == "pad":
        return np.pad(a, arg)
    if op == "shrink":
        return a[tuple(slice(b, e) for b, e in arg)]
    if op == "flip":
        return np.flip(a, arg)
    if op == "sum":
        return np.sum(a, axis=arg, keepdims=True, dtype=np.int32)
    raise ValueError(f"unknown step {op!r}")


def apply_tensor(t: Any, op: str, arg: Any) -> Any:
    if op == "shrink":
        return t.shrink(arg)
    if op == "sum":
        return t.sum(arg, keepdim=True)
    return getattr(t, op)(arg)


def input_array(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(1, int(np.prod(shape)) + 1, dtype=np.int32).reshape(shape)


def reference(chain: Chain) -> np.ndarray:
    a = input_array(chain.shape)
    for op, arg in chain.steps:
        a = apply_numpy(a, op, arg)
    return np.ascontiguousarray(a)


def valid(chain: Chain) -> bool:
    """Whether every step applies to the shape before it (a shrunk chain may break a step)."""
    shape = chain.shape
    for op, arg in chain.steps:
        nd = len(shape)
        if op in ("permute", "expand", "pad", "shrink") and len(arg) != nd:
            return False
        if op == "reshape" and int(np.prod(arg)) != int(np.prod(shape)):
            return False
        if op == "permute" and sorted(arg) != list(range(nd)):
            return False
        if op == "expand" and any(s != t and s != 1 for s, t in zip(shape, arg)):
            return False
        if op == "shrink" and any(not 0 <= b < e <= s for (b, e), s in zip(arg, shape)):
            return False
        if op in ("flip", "sum") and any(not 0 <= d < nd for d in arg):
            return False
        shape = apply_numpy(np.empty(shape, np.int8), op, arg).shape
    return True


# ------------------------------------------------------------------ random chains

def _factor(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _random_move(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[str, Any] | None:
    nd, numel = len(shape), int(np.prod(shape))
    op = MOVES[rng.integers(len(MOVES))]
    if op == "reshape":           # regroup the prime factors (merge and split axes), with some 1s
        rank = int(rng.integers(1, 6))
        dims = [1] * rank
        for f in _factor(numel):
            dims[rng.integers(rank)] *= f
        return op, tuple(dims)
    if op == "permute":
        return (op, tuple(int(p) for p in rng.permutation(nd))) if nd >= 2 else None
    if op == "expand":
        ones = [d for d, s in enumerate(shape) if s == 1]
        if not ones:
            return None
        new = list(shape)
        for d in ones:
            if rng.random() < 0.7:
                new[d] = int(rng.integers(2, 5))
        new_t = tuple(new)
        return (op, new_t) if new_t != shape and np.prod(new_t) <= MAX_NUMEL else None
    if op == "pad":
        pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) if rng.random() < 0.6 else (0, 0)
                     for _ in shape)
        new = tuple(s + b + a for s, (b, a) in zip(shape, pads))
        return (op, pads) if any(b or a for b, a in pads) and np.prod(new) <= MAX_NUMEL else None
    if op == "shrink":
        arg = []
        for s in shape:
            b = int(rng.integers(0, s))
            arg.append((b, int(rng.integers(b + 1, s + 1))) if rng.random() < 0.6 else (0, s))
        return (op, tuple(arg)) if any(p != (0, s) for p, s in zip(arg, shape)) else None
    axes = tuple(d for d in range(nd) if shape[d] > 1 and rng.random() < 0.6)
    return ("flip", axes) if axes else None


def random_chain(rng: np.random.Generator, max_steps: int = 6) -> Chain:
    rank = int(rng.integers(1, 6))
    while True:
        shape = tuple(int(s) for s in rng.integers(1, 8, rank))
        if np.prod(shape) <= MAX_NUMEL // 2:
            break
        rank = max(1, rank - 1)
    steps: list[tuple[str, Any]] = []
    cur = shape
    n_steps = int(rng.integers(1, max_steps + 1))
    for _ in range(8 * n_steps):
        if len(steps) == n_steps:
            break
        mv = _random_move(rng, cur)
        if mv is None:
            continue
        steps.append(mv)
        cur = apply_numpy(np.empty(cur, np.int8), *mv).shape
    if rng.random() < 0.25:       # a reduction over the chain: its loops index the same expressions
        axes = tuple(d for d in range(len(cur)) if rng.random() < 0.5) or (int(rng.integers(len(cur))),)
        steps.append(("sum", axes))
    return Chain(shape, tuple(steps))


def chains(seed: int, count: int, max_steps: int = 6) -> list[Chain]:
    return [random_chain(np.random.default_rng([seed, i]), max_steps) for i in range(count)]


# ------------------------------------------------------------------ lowering one fused kernel

def fused_plan(chain: Chain) -> Any:
    """The chain built as a lazy graph (Tensor ops), turned into ONE kernel whose body is the whole
    graph (the plan the fusion rules aim for), with buffer 0 the input and buffer 1 the output."""
    t = Tensor(input_array(chain.shape), device="NUMPY")
    leaf = t.lazydata
    for op, arg in chain.steps:
        t = apply_tensor(t, op, arg)
    memo: dict[int, KNode] = {}

    def node(lb: Any) -> KNode:
        if id(lb) not in memo:
            if lb.op == "BUF":              # the input (its only realized buffer)
                assert lb.buffer is leaf.buffer
                memo[id(lb)] = KNode("BUF", (), 0, lb.shape, lb.dtype)
            else:
                memo[id(lb)] = KNode(lb.op, tuple(node(s) for s in lb.src), lb.arg, lb.shape, lb.dtype)
        return memo[id(lb)]

    ast = node(t.lazydata)
    if ast.op == "BUF":           # no step left (a shrunk chain): copy through a reshape
        ast = KNode("RESHAPE", (ast,), ast.shape, ast.shape, ast.dtype)
    k = Kernel("k0", 1, ast, (0,))
    return KernelPlan([(leaf.shape, leaf.dtype), (ast.shape, ast.dtype)], 1, [k], [1])


def _eval_lin(x: Any, env: dict[str, np.ndarray], where: list[str]) -> np.ndarray:
    """Exact floor-semantics value of a symbolic ``Lin`` over the broadcast grid ``env``; appends
    to ``where`` every (sub)expression whose values leave its claimed bounds."""
    out = np.asarray(np.int64(x.const))
    for a, c in x.terms:
        if isinstance(a, Var):
            v = env[a.name]
        else:
            num = _eval_lin(a.x, env, where)
            v = np.floor_divide(num, a.d) if isinstance(a, Div) else np.mod(num, a.d)
            lo, hi = a.bounds
            if v.min() < lo or v.max() > hi:
                where.append(f"{a} takes [{v.min()}, {v.max()}], claimed bounds [{lo}, {hi}]")
        out = out + c * v
    lo, hi = x.bounds
    if out.min() < lo or out.max() > hi:
        where.append(f"{x} takes [{out.min()}, {out.max()}], claimed bounds [{lo}, {hi}]")
    return out


def check_bounds(exprs: list[Any]) -> str | None:
    """Every expression evaluated at every point of its variables' box stays inside its bounds."""

    def variables(x: Any, acc: dict[str, int]) -> dict[str, int]:
        for a, _ in x.terms:
            if isinstance(a, Var):
                acc[a.name] = a.hi + 1
            else:
                variables(a.x, acc)
        return acc

    for x in exprs:
        ext = variables(x, {})
        names = sorted(ext)
        grids = np.meshgrid(*[np.arange(ext[n], dtype=np.int64) for n in names], indexing="ij") if names else []
        where: list[str] = []
        _eval_lin(x, dict(zip(names, grids)), where)
        if where:
            return f"index bounds unsound in {x}: {where[0]}"
    return None


def lower_recording(kernel: Any, plan: Any) -> tuple[Any, list[Any]]:
    """``lower_kernel`` that also returns every symbolic index expression it emitted."""
    exprs: list[Any] = []

    class Recording(Lowerer):
        def index(self, x: Any) -> int:
            exprs.append(x)
            return super().index(x)

    return Recording(kernel, plan).lower(), exprs


def run_loopir(plan: Any, inputs: list[np.ndarray]) -> np.ndarray:
    """Run a plan's kernels in order with the loop-IR interpreter; the first output's values."""
    bufs = [np.ascontiguousarray(a).reshape(-1).copy() for a in inputs]
    bufs += [np.zeros(int(np.prod(s)), dt.np) for s, dt in plan.buffers[len(inputs):]]
    for k in plan.kernels:
        lk = lower_recording(k, plan)[0]
        views = [bufs[k.out]] + [bufs[b] for b in k.inputs]
        run(lk, views)
    return bufs[plan.outputs[0]].reshape(plan.buffers[plan.outputs[0]][0])


def _diff(got: np.ndarray, ref: np.ndarray) -> str | None:
    got = np.asarray(got)
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if not np.array_equal(got, ref):
        i = tuple(int(v) for v in np.argwhere(got != ref)[0])
        f = int(np.ravel_multi_index(i, ref.shape)) if ref.ndim else 0
        lo = max(0, f - 4)
        return (f"at {list(i)}: got {got[i]}, expected {ref[i]} (flat elements {lo}..: got "
                f"{got.reshape(-1)[lo:lo + 12].tolist()}, expected {ref.reshape(-1)[lo:lo + 12].tolist()})")
    return None


# ------------------------------------------------------------------ the checks

def check_chain(chain: Chain, devices: tuple[str, ...] = ("LLVM", "NUMPY"), interp: bool = True,
                engine: bool = False) -> str | None:
    """None when every check agrees with NumPy; otherwise what failed, where."""
    ref = reference(chain)
    plan = fused_plan(chain)
    inp = input_array(chain.shape)
    if interp:
        try:
            lk, exprs = lower_recording(plan.kernels[0], plan)
        except Exception as e:          # a crash is a failure too
            return f"[lowering] raised {type(e).__name__}: {e}"
        err = check_bounds(exprs)
        if err:
            return f"[symbolic] {err}"
        out = np.zeros(ref.size, np.int32)
        try:
            run(lk, [out, inp.reshape(-1).copy()])
        except LoopIRError as e:
            return f"[loop IR] {e}\n{lk}"
        err = _diff(out.reshape(ref.shape), ref)
        if err:
            return f"[loop IR] {err}\n{lk}"
    for dev in devices:
        bufs = [Buffer.from_numpy(inp, dev), Buffer.empty(ref.shape, plan.buffers[1][1], dev)]
        try:
            get_device(dev).prepare(plan)(bufs)
            err = _diff(bufs[1].numpy().reshape(ref.shape), ref)
        except Exception as e:          # a crash is a failure too
            err = f"raised {type(e).__name__}: {e}"
        if err:
            return f"[{dev} kernel] {err}"
    if engine:
        for dev in devices:
            t = Tensor(inp, device=dev)
            for op, arg in chain.steps:
                t = apply_tensor(t, op, arg)
            try:
                err = _diff(t.numpy(), ref)
            except Exception as e:
                err = f"raised {type(e).__name__}: {e}"
            if err:
                return f"[{dev} engine] {err}"
    return None


def shrink(chain: Chain, fails: Callable[[Chain], bool]) -> Chain:
    """The shortest failing prefix, then every step dropped that the failure does not need."""
    for n in range(1, len(chain.steps) + 1):
        c = Chain(chain.shape, chain.steps[:n])
        if fails(c):
            chain = c
            break
    changed = True
    while changed:
        changed = False
        for j in range(len(chain.steps)):
            c = Chain(chain.shape, chain.steps[:j] + chain.steps[j + 1:])
            if c.steps and valid(c) and fails(c):
                chain, changed = c, True
                break
    return chain


@dataclass
class Campaign:
    count: int = 0
    seconds: float = 0.0
    failure: str | None = None          # the first failure, shrunk, with its seed and case
    first_failure_s: float | None = None


def campaign(seed: int, count: int, devices: tuple[str, ...] = ("LLVM", "NUMPY"), max_steps: int = 6,
             engine: bool = False, interp: bool = True, stop_first: bool = True,
             progress: Callable[[int], None] | None = None) -> Campaign:
    """Check ``count`` seeded chains; stops at the first failure (shrunk) when ``stop_first``."""
    res = Campaign()
    t0 = time.perf_counter()
    for i in range(count):
        chain = random_chain(np.random.default_rng([seed, i]), max_steps)
        res.count += 1
        err = check_chain(chain, devices, interp, engine)
        if progress is not None:
            progress(i)
        if err is None:
            continue
        if res.failure is None:
            res.first_failure_s = time.perf_counter() - t0
            small = shrink(chain, lambda c: check_chain(c, devices, interp, engine) is not None)
            res.failure = (f"seed {seed} case {i}: {chain}\n  shrunk: {small}\n  "
                           f"{check_chain(small, devices, interp, engine)}")
        if stop_first:
            break
    res.seconds = time.perf_counter() - t0
    return res
