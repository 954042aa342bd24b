"""The NumPy interpreter: the reference semantics of every IR eqgrad has, in one place.

One definition of what a primitive computes (the op table's NumPy references, plus the float-sum
rule of docs/semantics.md) serves three readers:

- :func:`run_program` -- a realize's program (``graph.program``) evaluated node by node with no
  optimizer at all: the reference of ``EQGRAD_VALIDATE`` and of the tests;
- :func:`run_kernel` -- one kernel body of a plan (``graph.plan``): the NUMPY device;
- :func:`run_loop` -- a lowered kernel (``graph.loopir``) one instruction at a time, bounds-checked:
  lowering tests and the index fuzzer compare it with the other two, with no compiler involved.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from eqgrad.dtype import DType, bfloat16, bool_, from_storage, round_bf16, to_storage
from eqgrad.graph.loopir import INDEX, NONNEG, LInst, LoopIRError, LoopKernel, Table
from eqgrad.graph.plan import Kernel
from eqgrad.graph.program import ConstLeaf, Input, ParamLeaf, Program, is_node
from eqgrad.ops import MOVEMENT_OPS, OPS, REDUCE_OPS, RETYPES, Shape


def eval_op(op: str, arg: Any, shape: Shape, dtype: DType, srcs: list[np.ndarray]) -> np.ndarray:
    """One primitive applied to whole arrays (``srcs`` already evaluated)."""
    if op == "RSUM" and dtype.is_float:
        out = float_sum(srcs[0], arg).reshape(shape)
        return round_bf16(out).reshape(shape) if dtype is bfloat16 else out
    if op == "CONTIGUOUS":
        return srcs[0]
    out = OPS[op].ref(srcs, arg, dtype)
    assert out.shape == tuple(shape), (op, out.shape, shape)
    return out


def const(value: Any, shape: Shape, dtype: DType) -> np.ndarray:
    """A broadcast view: an expanded scalar costs no memory (2**31 ones)."""
    v = np.array(value, dtype=dtype.vnp)
    return np.broadcast_to(round_bf16(v).reshape(()) if dtype is bfloat16 else v, shape)


def float_sum(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """A float32 sum accumulated in float64, rounded once to float32 (docs/semantics.md "Sums").

    ``np.add.reduce`` is pairwise only along a contiguous inner axis; over strided or broadcast
    axes it adds sequentially in float32 (1e7 x 0.1f: 1e-3 relative). In float64 the error of any
    order is below n * 2**-53 * sum|x_i|, far under float32's rounding for every n up to 2**31.
    An axis of stride 0 (an expanded value) is not iterated: its sum is the value times the count,
    exact in float64."""
    count = 1
    for d in axes:
        if a.shape[d] > 1 and a.strides[d] == 0:
            count *= a.shape[d]
            a = a[tuple(slice(0, 1) if i == d else slice(None) for i in range(a.ndim))]
    with np.errstate(all="ignore"):
        out = np.sum(a, axis=axes, keepdims=True, dtype=np.float64)
        if count != 1:
            out = out * count
        return out.astype(a.dtype)


def run_program(prog: Program, inputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """The value of each root of ``prog``; ``inputs`` default to the realized buffers' contents."""
    return _walk(prog, inputs, False)[0]


def run_program_magnitudes(prog: Program) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """Each root's value and its *rounding magnitude*: the same program evaluated with absolute
    values through its linear ops, so that any correct float evaluation of a root element lies
    within a few units of rounding of that magnitude, where the result itself may have cancelled to
    near zero (a sum of terms of size 1 that is mathematically 0 carries noise of ~1e-7, not of its
    own size). The classical running-error bound: through ADD, MUL, NEG, sums, maxima, WHERE and
    movement the magnitude is propagated (|a| + |b|, |a| |b|, sums of magnitudes, ...); every other
    op restarts it at the absolute value of its result (its inputs' noise is taken to be relative
    to its value, as without this bound). ``None`` for roots that are not floats (compared exactly)."""
    vals, mags, _ = _walk(prog, None, True)
    return vals, mags


def run_program_ties(prog: Program) -> tuple[list[np.ndarray], list[np.ndarray | None], list[np.ndarray | None]]:
    """``run_program_magnitudes``' values and magnitudes, and for each root the elements that
    depend on a *near tie*: a comparison (CMPLT, CMPEQ) of float operands that lie within rounding
    (``TIE_RTOL``, and ``TIE_ATOL`` times their rounding magnitude) of each other, through the ops
    after it (elementwise: any operand's; movement: moved with the value; a reduction: any element
    of its window). Two correct evaluations may decide such a comparison either way: ``x < s``
    for a value ``x = max(y, s)`` realized by one kernel and ``s`` summed again by another rounds
    one way on the device and the other in the reference. None where a root depends on none."""
    return _walk(prog, None, True, True)


# a comparison of floats within this of a tie may go either way (the validator's float tolerance)
TIE_RTOL, TIE_ATOL = 1e-4, 1e-5


_LINEAR = frozenset({"ADD", "MUL", "NEG", "MAX", "RSUM", "RMAX", "WHERE", "CONTIGUOUS"})


def _magnitude(n: Any, value: np.ndarray, vsrcs: list[np.ndarray], srcs: list[np.ndarray | None]
               ) -> np.ndarray | None:
    if not n.dtype.is_float:
        return None
    linear = n.op in MOVEMENT_OPS or n.op in _LINEAR or n.op == "CAST"
    ms = srcs[1:] if n.op == "WHERE" else srcs
    if not linear or any(m is None for m in ms):
        return np.abs(value)
    with np.errstate(all="ignore"):
        if n.op == "ADD":
            return ms[0] + ms[1]
        if n.op == "MUL":
            return ms[0] * ms[1]
        if n.op == "WHERE":
            return np.where(vsrcs[0], ms[0], ms[1])
        if n.op in ("NEG", "CAST", "CONTIGUOUS"):
            return ms[0]
        return np.asarray(eval_op(n.op, n.arg, n.shape, n.dtype, ms))


def _tie(n: Any, vsrcs: list[np.ndarray], msrcs: list[np.ndarray | None], tsrcs: list[np.ndarray | None]
         ) -> np.ndarray | None:
    """The near-tie mask of node ``n`` (``run_program_ties``) from its operands' values, magnitudes
    and masks."""
    mask = None
    if n.op in ("CMPLT", "CMPEQ") and vsrcs[0].dtype.kind == "f":
        a, b = vsrcs
        scale = np.maximum(1.0, np.maximum(*(m if m is not None else np.abs(v) for m, v in zip(msrcs, vsrcs))))
        with np.errstate(all="ignore"):
            mask = np.isclose(a, b, rtol=TIE_RTOL, atol=0.0) | (np.abs(a - b) <= TIE_ATOL * scale)
        mask = np.broadcast_to(mask, n.shape)
    ts = [t for t in tsrcs if t is not None]
    if not ts:
        return mask
    if n.op in MOVEMENT_OPS:
        moved = np.asarray(eval_op(n.op, n.arg, n.shape, bool_, [tsrcs[0]])) if tsrcs[0] is not None else None
        ts = [moved] if moved is not None else []
    elif n.op in REDUCE_OPS:
        ts = [np.any(ts[0], axis=n.arg, keepdims=True).reshape(n.shape)]
    elif any(t.shape != tuple(n.shape) for t in ts):
        ts = [np.full(n.shape, any(bool(t.any()) for t in ts))]      # (an op that reshapes: all or none)
    for t in ts:
        mask = t if mask is None else (mask | t)
    return mask


def _walk(prog: Program, inputs: list[np.ndarray] | None, magnitudes: bool, ties: bool = False
          ) -> tuple[list[np.ndarray], list[np.ndarray | None], list[np.ndarray | None]]:
    if inputs is None:
        inputs = [from_storage(lb.buffer.numpy(), lb.dtype).reshape(lb.shape) for lb in prog.inputs]
    vals: list[np.ndarray] = []
    mags: list[np.ndarray | None] = []

    def ref(r: Any) -> np.ndarray:
        if is_node(r):
            return vals[r]
        if isinstance(r, Input):
            return inputs[r.pos].reshape(r.shape)
        if isinstance(r, ParamLeaf):
            return const(prog.params[r.index][0], r.shape, r.dtype)
        assert isinstance(r, ConstLeaf)
        return const(r.value, r.shape, r.dtype)

    def mag(r: Any) -> np.ndarray | None:
        if is_node(r):
            return mags[r]
        v = ref(r)
        return np.abs(v) if v.dtype.kind == "f" else None

    tmasks: list[np.ndarray | None] = []

    def tie(r: Any) -> np.ndarray | None:
        return tmasks[r] if is_node(r) else None

    for n in prog.nodes:
        srcs = [ref(s) for s in n.src]
        vals.append(eval_op(n.op, n.arg, n.shape, n.dtype, srcs))
        if magnitudes:
            ms = [mag(s) for s in n.src]
            mags.append(_magnitude(n, vals[-1], srcs, ms))
            if ties:
                tmasks.append(_tie(n, srcs, ms, [tie(s) for s in n.src]))
    return ([np.asarray(ref(r)) for r in prog.roots],
            [mag(r) for r in prog.roots] if magnitudes else [],
            [tie(r) for r in prog.roots] if ties else [])


def run_kernel(k: Kernel, bufs: list[np.ndarray]) -> np.ndarray:
    """The output of kernel ``k`` of a plan (as values: bfloat16 in float32); ``bufs[i]`` is plan
    buffer ``i`` (any shape, as stored: bfloat16 as its bits)."""
    vals: dict[int, np.ndarray] = {}
    for n in k.ast.walk():
        if n.op == "BUF":
            vals[id(n)] = from_storage(bufs[n.arg], n.dtype).reshape(n.shape)
        elif n.op == "CONST":
            vals[id(n)] = const(n.arg, n.shape, n.dtype)
        else:
            vals[id(n)] = eval_op(n.op, n.arg, n.shape, n.dtype, [vals[id(s)] for s in n.src])
    return vals[id(k.ast)]


def _shift(a: np.ndarray, n: np.ndarray, left: bool) -> np.ndarray:
    if not 0 <= int(n) < 32:
        raise LoopIRError(f"{'SHL' if left else 'SHR'} by {int(n)}: shift amounts are 0..31")
    u = a.astype(np.int32).view(np.uint32)
    return (u << np.uint32(n) if left else u >> np.uint32(n)).view(np.int32)


def _table(i: np.ndarray, t: Table, dtype: DType) -> np.ndarray:
    if not 0 <= int(i) < len(t.values):
        raise LoopIRError(f"TABLE read at {int(i)} of {t} ({len(t.values)} elements)")
    return np.asarray(t.values[int(i)], dtype.np)


# the NumPy semantics of the loop IR's own ALU ops (loopir.LOOP_ALU_OPS), as the op table's refs:
# (operand arrays, the instruction's arg, result dtype) -> result
LOOP_REFS: dict[str, Any] = {
    "BITCAST": lambda s, arg, dt: s[0].view(dt.np),
    "SHL": lambda s, arg, dt: _shift(s[0], s[1], left=True),
    "SHR": lambda s, arg, dt: _shift(s[0], s[1], left=False),
    "FLOOR": lambda s, arg, dt: np.floor(s[0]),
    "RINT": lambda s, arg, dt: np.rint(s[0]),            # ties to even
    "MULADD": lambda s, arg, dt: s[0] * s[1] + s[2],     # two roundings (a renderer may fuse them)
    "TABLE": lambda s, arg, dt: _table(s[0], arg, dt),
}


def run_loop(k: LoopKernel, buffers: list[np.ndarray]) -> None:
    """Execute ``k`` in Python, one instruction at a time: the reference semantics of the loop IR
    (slow; for lowering tests and the index fuzzer, ``eqgrad/tools/fuzz_index.py``). ``buffers[i]`` is parameter
    ``i`` as a flat NumPy array of its dtype; parameter 0 is written. Index values are exact
    Python integers; every load and store is bounds-checked and every ``NONNEG`` claim verified,
    so a lowering bug that a device would turn into a silent wrong read raises
    :class:`LoopIRError` here instead."""
    insts = k.insts
    end_of: dict[int, int] = {}
    open_: list[int] = []
    for i, x in enumerate(insts):
        if x.op == "RANGE":
            open_.append(i)
        elif x.op == "ENDRANGE":
            r = open_.pop() if open_ else None
            if r is None or x.src != (r,):
                raise LoopIRError(f"%{i}: ENDRANGE closes %{x.src[0]}, but the innermost open loop is %{r}")
            end_of[r] = i
    if open_:
        raise LoopIRError(f"loops %{open_} are never closed")
    val: dict[int, Any] = {}
    kind: dict[int, str] = {}
    # the parameters, then a fresh array for each DEFLOCAL executed (with which of its elements were
    # stored: reading one that was not is an error, as its contents are undefined on a device)
    buffers = list(buffers)
    stored: dict[int, np.ndarray] = {}

    def index_alu(i: int, x: LInst, a: list[Any]) -> Any:
        op = x.op
        if op in ("IDIV", "MOD"):
            n, d = a
            if d <= 0:
                raise LoopIRError(f"%{i}: index {op} by {d}: index division is by a positive constant")
            if x.arg == NONNEG and n < 0:
                raise LoopIRError(f"%{i}: index {op} marked {NONNEG} got the numerator {n}")
            return n // d if op == "IDIV" else n % d
        if op == "WHERE":
            return a[1] if a[0] else a[2]
        ops = {"ADD": lambda p, q: p + q, "MUL": lambda p, q: p * q, "NEG": lambda p: -p,
               "MAX": max, "CMPLT": lambda p, q: np.bool_(p < q), "CMPEQ": lambda p, q: np.bool_(p == q)}
        if op not in ops:
            raise LoopIRError(f"%{i}: {op} is not an index operation")
        return ops[op](*a)

    def element(i: int, p: int, idx: int) -> int:
        if not 0 <= idx < buffers[p].size:
            what = f"parameter {p}" if p not in stored else "its local array"
            raise LoopIRError(f"%{i}: {insts[i].op} at index {idx} of {what} ({buffers[p].size} elements)")
        if p in stored:
            if insts[i].op == "STORE":
                stored[p][idx] = True
            elif not stored[p][idx]:
                raise LoopIRError(f"%{i}: LOAD at index {idx} of a local array before any STORE there")
        return idx

    def block(lo: int, hi: int) -> None:
        i = lo
        while i < hi:
            x = insts[i]
            op, src = x.op, x.src
            if op == "RANGE":
                kind[i] = INDEX
                for v in range(x.arg):
                    val[i] = v
                    block(i + 1, end_of[i])
                i = end_of[i] + 1
                continue
            if op == "PARAM":
                val[i], kind[i] = x.arg, "param"
            elif op == "CONST":
                val[i] = int(x.arg) if x.dtype == INDEX else const(x.arg, (), x.dtype)
                kind[i] = INDEX if x.dtype == INDEX else x.dtype.name
            elif op == "DEFACC":
                val[i], kind[i] = const(x.arg, (), x.dtype), x.dtype.name
            elif op == "DEFLOCAL":
                val[i], kind[i] = len(buffers), "param"
                stored[len(buffers)] = np.zeros(x.arg, bool)
                buffers.append(np.zeros(x.arg, x.dtype.np))
            elif op == "ACCUM":
                acc, v = src
                val[acc] = OPS[x.arg].ref([val[acc], val[v]], None, insts[acc].dtype)
            elif op == "ACCREAD":
                val[i], kind[i] = val[src[0]], kind[src[0]]
            elif op == "LOAD":
                p, ix = val[src[0]], val[src[1]]
                val[i], kind[i] = from_storage(np.asarray(buffers[p][element(i, p, ix)]), x.dtype), x.dtype.name
            elif op == "STORE":
                p, ix = val[src[0]], val[src[1]]
                buffers[p][element(i, p, ix)] = to_storage(val[src[2]], insts[src[2]].dtype) \
                    if insts[src[2]].dtype is bfloat16 else val[src[2]]
            elif op != "ENDRANGE":
                operand = src[1] if op == "WHERE" else src[0]
                a = [val[s] for s in src]
                if kind[operand] == INDEX:
                    val[i] = index_alu(i, x, a)
                    kind[i] = INDEX if x.dtype == INDEX else "bool"
                elif op in LOOP_REFS:
                    with np.errstate(all="ignore"):
                        val[i] = np.asarray(LOOP_REFS[op]([np.asarray(v) for v in a], x.arg, x.dtype))
                    kind[i] = x.dtype.name
                else:
                    arg = x.dtype if op in RETYPES else None
                    val[i] = OPS[op].ref([np.asarray(v) for v in a], arg, x.dtype)
                    kind[i] = x.dtype.name
            i += 1

    block(0, len(insts))
