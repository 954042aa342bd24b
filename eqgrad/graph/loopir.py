"""The loop IR: a kernel as a flat list of instructions with structured loops.

Instructions (``LInst``; an instruction's id is its position, ``src`` are ids):

====================  ===========================================================================
``PARAM``             arg = parameter number (0 is the output); dtype = element dtype
``CONST``             arg = Python scalar; dtype
``RANGE``             arg = extent; dtype ``index``; opens a loop whose variable is this value
``ENDRANGE``          src = (range,): closes the loop
``DEFACC``            arg = initial value; dtype: an accumulator (mutable, declared before its loops)
``ACCUM``             src = (acc, value); arg = "ADD" | "MAX": acc <- acc op value
``ACCREAD``           src = (acc,): the accumulator's current value
``LOAD``              src = (param, index); dtype
``STORE``             src = (param, index, value)
``DEFLOCAL``          arg = extent >= 1; dtype: an array of that many elements that each work-item
                      (CPU thread, GPU work-item) has its own of, declared where its values are
                      needed (a row-fused kernel's row: ``lower/passes.py`` ``RowStash``); ``LOAD``
                      and ``STORE`` name it in place of a ``PARAM``. An element is read only after
                      it is stored, in the same iteration of the loops open at the declaration
ALU ops               the op table's unary/binary/ternary ops; dtype of the result; ``CAST``'s
                      dtype is the target. Index arithmetic uses ADD/MUL/IDIV/MOD/CMPLT/AND/WHERE
                      with dtype ``index`` (64-bit) or bool.
loop-IR ALU ops       ``LOOP_ALU_OPS``, below: the primitives that ``lower/decomp.py`` writes
                      transcendentals in, which every renderer implements natively
``BITCAST``           src = (x,); dtype: the same bits as another type (float32 <-> int32)
``SHL`` ``SHR``       src = (x, n), int32, 0 <= n < 32: shift the 32 bits left / right, filling
                      with zeros (``SHR`` is a logical shift, whatever the sign)
``FLOOR`` ``RINT``    src = (x,), float: round down / to the nearest integer, ties to even
``MULADD``            src = (a, b, c), float: a * b + c, rounded once or twice (a renderer may
                      fuse it into an FMA, as it may fuse the op table's float MUL and ADD)
``TABLE``             src = (i,), i int32; arg = a :class:`Table`; dtype: element i of the
                      constant array (a renderer emits each table once per kernel)
====================  ===========================================================================

``float64`` (:data:`FLOAT64`) exists only in the loop IR, for exact range reductions (sin); no
tensor has it. It is used with ADD MUL NEG MULADD FLOOR RINT CMPLT CMPEQ WHERE TABLE and CAST
(to and from float32 and int32; a float -> int32 ``CAST`` saturates, NaN -> 0, as the op table's).

Index ``IDIV``/``MOD`` (dtype ``index``) divide by a positive constant with **floor** semantics,
like ``symbolic.Lin``, for every sign of the numerator (unlike the op table's int32 ``IDIV``/``MOD``,
which truncate). ``arg = NONNEG`` records that the numerator is proven non-negative (by its
bounds), so a renderer may emit the cheaper truncating instruction; without it a renderer must
emit true floor division/modulo. :func:`run` checks every ``NONNEG`` claim it executes.

Every value used inside a loop is defined before it or inside it; no value defined inside a loop
is used after it except through ``ACCREAD``.

The first ``parallel`` instructions after the ``PARAM``s are ``RANGE``s over output axes that
enclose the whole body (their ``ENDRANGE``s are the last instructions). Their iterations are
independent -- each writes its own output elements -- so a device may run them in any order or
at once (GPU work-items, CPU threads); every other loop runs in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eqgrad.dtype import DType, bool_, float64, int32
from eqgrad.ops import OPS

INDEX = "index"
NONNEG = "nonneg"        # arg of an index IDIV/MOD whose numerator is proven >= 0 (see above)
FLOAT64 = float64        # decomp's exact range reductions use it whatever the tensors' dtypes (see above)
# the loop IR's own ALU ops, beyond the op table's (see above)
LOOP_ALU_OPS = ("BITCAST", "SHL", "SHR", "FLOOR", "RINT", "MULADD", "TABLE")


@dataclass(frozen=True)
class Table:
    """A constant array that ``TABLE`` instructions read, e.g. sin's range-reduction table."""
    name: str                        # a C identifier, unique among a kernel's tables
    values: tuple[float, ...]

    def __str__(self) -> str:        # the loop IR's printout shows the name, not 1024 numbers
        return f"{self.name}[{len(self.values)}]"


@dataclass(frozen=True)
class LInst:
    op: str
    dtype: DType | str | None
    src: tuple[int, ...] = ()
    arg: Any = None


@dataclass
class LoopKernel:
    name: str
    params: list[tuple[str, DType, bool]]     # (name, element dtype, written)
    insts: list[LInst]
    loop_vectorize: bool = True     # False when lanes are already explicit (rendered as vectors instead)
    parallel: int = 0               # leading RANGEs whose iterations are independent (see above)
    # register lanes: how many offsets the innermost upcast axis has (0: no lanes). A lane kernel's
    # per-lane instructions come in that order, that axis fastest: its accumulators are runs of
    # DEFACCs and its output STOREs runs of STOREs, in groups of this many consecutive lanes,
    # which a renderer may emit as one vector each (llvm.py, _Lanes)
    vector_lanes: int = 0
    # a lane kernel's row loops (RANGE ids): the loops of a row-fused kernel's hoisted reductions,
    # rendered before its lanes, whose values are scalars -- a renderer may vectorize them as it
    # does the loops of a kernel without lanes (llvm.py: attention's scores as dot products)
    row_loops: frozenset = frozenset()

    def parallel_ranges(self) -> list[int]:
        """Instruction ids of the leading independent RANGEs, outermost first."""
        start = len(self.params)
        out = list(range(start, start + self.parallel))
        assert all(self.insts[i].op == "RANGE" for i in out), "parallel loops must lead the body"
        return out

    def __str__(self) -> str:
        lines = [f"kernel {self.name}({', '.join(f'{n}: {d.name}*' for n, d, _ in self.params)})"]
        depth = 1
        for i, x in enumerate(self.insts):
            if x.op == "ENDRANGE":
                depth -= 1
            dt = x.dtype if isinstance(x.dtype, str) or x.dtype is None else x.dtype.name
            arg = "" if x.arg is None else f" {x.arg.name if isinstance(x.arg, DType) else x.arg}"
            src = " " + ", ".join(f"%{s}" for s in x.src) if x.src else ""
            lines.append(f"{'  ' * depth}%{i} = {x.op}{'' if dt is None else ':' + dt}{src}{arg}")
            if x.op == "RANGE":
                depth += 1
        return "\n".join(lines)


class LoopIRError(AssertionError):
    """The loop IR broke its own rules: found by :func:`verify` (structure, scopes, dtypes), or
    while running (``graph.interp.run_loop``: an out-of-bounds load or store, a ``NONNEG``
    division of a negative numerator, a non-positive index divisor)."""


# ------------------------------------------------------------------ the verifier
# Index arithmetic: the ops run_loop evaluates on exact integers (graph/interp.py, index_alu)
INDEX_ALU_OPS = ("ADD", "MUL", "NEG", "MAX", "IDIV", "MOD", "CMPLT", "CMPEQ", "WHERE")
ACCUM_OPS = ("ADD", "MAX")
_PARAM, _ACC = "a parameter", "an accumulator"      # what such an instruction is, as an operand


def _name(t: Any) -> str:
    return t.name if isinstance(t, DType) else str(t)


def _kind(dt: DType) -> str:
    """The op table's dtype letter: f(loat), i(nt), b(ool)."""
    return "f" if dt.is_float else ("i" if dt.is_int else "b")


def _loop_alu_rule(op: str, dt: Any, ts: list[Any], arg: Any) -> str | None:
    """What is wrong with a loop-IR ALU op (``LOOP_ALU_OPS``) of dtype ``dt`` over operand types
    ``ts``, or None. Ops added to LOOP_ALU_OPS without a rule here get the generic checks only."""
    arity = {"BITCAST": 1, "SHL": 2, "SHR": 2, "FLOOR": 1, "RINT": 1, "MULADD": 3, "TABLE": 1}.get(op)
    if arity is not None and len(ts) != arity:
        return f"{arity} operand(s), got {len(ts)}"
    if op == "BITCAST" and ts[0].itemsize != dt.itemsize:
        return f"a dtype of {ts[0].itemsize} bytes like its operand's {ts[0].name}, got {dt.name}"
    if op in ("SHL", "SHR") and any(t != int32 for t in [dt, *ts]):
        return f"int32 operands and result, got {[t.name for t in ts]} -> {dt.name}"
    if op in ("FLOOR", "RINT", "MULADD") and (not dt.is_float or any(t != dt for t in ts)):
        return f"float operands of the result's dtype, got {[t.name for t in ts]} -> {dt.name}"
    if op == "TABLE" and (ts[0] != int32 or type(arg).__name__ != "Table"):
        return f"an int32 element number and a Table arg, got {ts[0].name} and {arg!r}"
    return None


def verify(lk: LoopKernel) -> None:
    """Check that ``lk`` keeps the loop IR's rules (the module docstring), or raise
    :class:`LoopIRError` naming the instruction, what was expected and what was given:

    - the first ``len(params)`` instructions are ``PARAM i`` of parameter i's dtype, and no others;
    - every src refers to an earlier instruction that has a value (not a STORE, ACCUM, ENDRANGE);
    - RANGE/ENDRANGE are balanced and an ENDRANGE closes the innermost open loop;
    - a value is used only while the loop that defines it is open (an accumulator, defined
      outside its loops, is read after them through ACCREAD);
    - dtypes per op: the op table's ALU ops by their arity, accepted kinds and dtype rule (CMP
      gives bool, WHERE's condition is bool, binary operands match); index arithmetic only with
      ``INDEX_ALU_OPS`` and divisions by a positive constant; loads and stores at ``index``
      indices of a PARAM, with the parameter's dtype; stores to written parameters only;
      DEFACC/ACCUM/ACCREAD over a DEFACC with its dtype;
    - the ``parallel`` leading RANGEs enclose the whole body.
    """
    insts, params = lk.insts, lk.params
    n_params = len(params)

    def fail(i: int, msg: str) -> None:
        x = insts[i]
        raise LoopIRError(f"%{i} {x.op}: {msg}")

    vtype: list[Any] = []                      # each instruction's type as an operand (None: no value)
    scope_of: list[int] = []                   # the innermost loop open at its definition (-1: none)
    open_: list[int] = []
    open_set = {-1}
    for i, x in enumerate(insts):
        op, src, dt = x.op, x.src, x.dtype
        if not isinstance(src, tuple):
            fail(i, f"src is a tuple of instruction ids, got {src!r}")
        for s in src:
            if not isinstance(s, int) or not 0 <= s < i:
                fail(i, f"operands are earlier instructions (ids 0..{i - 1}), got %{s}")
            if vtype[s] is None and not (op == "ENDRANGE" and insts[s].op == "RANGE"):
                fail(i, f"operand %{s} ({insts[s].op}) has no value")
            if scope_of[s] not in open_set:
                fail(i, f"operand %{s} is defined inside loop %{scope_of[s]}, which is closed here "
                        f"(a value leaves its loop only through an accumulator)")
        if (i < n_params) != (op == "PARAM"):
            fail(i, f"PARAM instructions are exactly the first {n_params} (one per parameter)")
        ts = [vtype[s] for s in src]
        out: Any = dt
        if op == "PARAM":
            if x.arg != i or dt != params[i][1]:
                fail(i, f"PARAM {i} of dtype {params[i][1].name}, got PARAM {x.arg} of {_name(dt)}")
            out = _PARAM
        elif op == "CONST":
            if src or not (dt == INDEX or isinstance(dt, DType)):
                fail(i, f"no operands and a dtype, got {len(src)} operand(s) and {dt!r}")
            if not isinstance(x.arg, (bool, int, float, np.generic)) or (dt == INDEX and not isinstance(x.arg, int)):
                fail(i, f"a scalar value{' (an int for index)' if dt == INDEX else ''}, got {x.arg!r}")
        elif op == "RANGE":
            if src or dt != INDEX or type(x.arg) is not int or x.arg < 1:
                fail(i, f"no operands, dtype index and an extent >= 1, got {len(src)}, {dt!r}, {x.arg!r}")
        elif op == "ENDRANGE":
            innermost = open_[-1] if open_ else None
            if src != (innermost,) or dt is not None:
                fail(i, f"closes the innermost open loop %{innermost}, got src {src}")
            open_.pop()
            open_set.discard(innermost)
            out = None
        elif op == "DEFACC":
            if src or not isinstance(dt, DType) or not isinstance(x.arg, (bool, int, float, np.generic)):
                fail(i, f"no operands, a dtype and a scalar initial value, got {len(src)}, {dt!r}, {x.arg!r}")
            out = _ACC
        elif op in ("ACCUM", "ACCREAD"):
            n = 2 if op == "ACCUM" else 1
            if len(src) != n or insts[src[0]].op != "DEFACC":
                fail(i, f"src = (a DEFACC{', value' if n == 2 else ''}), got {src}")
            acc = insts[src[0]].dtype
            if op == "ACCUM":
                if x.arg not in ACCUM_OPS or ts[1] != acc or dt is not None:
                    fail(i, f"arg in {ACCUM_OPS} and a value of the accumulator's {acc.name}, "
                            f"got {x.arg!r} and {_name(ts[1])}")
                out = None
            elif dt != acc:
                fail(i, f"the accumulator's dtype {acc.name}, got {_name(dt)}")
        elif op == "DEFLOCAL":
            if src or not isinstance(dt, DType) or type(x.arg) is not int or x.arg < 1:
                fail(i, f"no operands, a dtype and an extent >= 1, got {len(src)}, {dt!r}, {x.arg!r}")
            out = _PARAM
        elif op in ("LOAD", "STORE"):
            n = 2 if op == "LOAD" else 3
            if len(src) != n or insts[src[0]].op not in ("PARAM", "DEFLOCAL"):
                fail(i, f"src = (a PARAM or DEFLOCAL, index{', value' if n == 3 else ''}), got {src}")
            if ts[1] != INDEX:
                fail(i, f"an index-typed element number, got {_name(ts[1])} (%{src[1]})")
            base = insts[src[0]]
            # a local array is written and read like a parameter of its dtype
            p, (pname, pdt, written) = (base.arg, params[base.arg]) if base.op == "PARAM" else \
                (f"%{src[0]}", (f"local array %{src[0]}", base.dtype, True))
            if op == "LOAD" and dt != pdt:
                fail(i, f"parameter {p}'s dtype {pdt.name}, got {_name(dt)}")
            if op == "STORE":
                if not written:
                    fail(i, f"a written parameter (parameter 0, the output), got parameter {p} ({pname}), "
                            f"which is read-only")
                if ts[2] != pdt or dt is not None:
                    fail(i, f"a value of parameter {p}'s dtype {pdt.name}, got {_name(ts[2])}")
                out = None
        elif op in OPS and OPS[op].kind in ("unary", "binary", "ternary"):
            _check_alu(i, x, ts, insts, fail)
        elif op in LOOP_ALU_OPS:
            if not isinstance(dt, DType) or any(not isinstance(t, DType) for t in ts):
                fail(i, f"value operands and a dtype, got {[_name(t) for t in ts]} -> {_name(dt)}")
            why = _loop_alu_rule(op, dt, ts, x.arg)
            if why:
                fail(i, f"expected {why}")
        else:
            fail(i, f"an op of the loop IR (PARAM CONST RANGE ENDRANGE DEFACC ACCUM ACCREAD LOAD STORE DEFLOCAL), "
                    f"an ALU op of the op table or one of {LOOP_ALU_OPS}, got {op!r}")
        vtype.append(out)
        scope_of.append(open_[-1] if open_ else -1)
        if op == "RANGE":
            open_.append(i)
            open_set.add(i)
            scope_of[i] = i                 # the loop variable lives inside its loop
    if open_:
        raise LoopIRError(f"loops {['%' + str(r) for r in open_]} are never closed (expected an ENDRANGE each)")
    if not isinstance(lk.parallel, int) or not 0 <= lk.parallel <= len(insts) - n_params:
        raise LoopIRError(f"parallel: expected a count of leading loops >= 0, got {lk.parallel!r}")
    for j in range(lk.parallel):
        r, end = n_params + j, len(insts) - 1 - j
        if insts[r].op != "RANGE" or insts[end].op != "ENDRANGE" or insts[end].src != (r,):
            raise LoopIRError(f"parallel = {lk.parallel}: expected %{r} to be a RANGE closed by the last "
                              f"instruction but {j}, got %{r} {insts[r].op} and %{end} {insts[end].op} "
                              f"{insts[end].src}")


def _check_alu(i: int, x: LInst, ts: list[Any], insts: list[LInst], fail: Any) -> None:
    """Dtypes of an op-table ALU instruction: index arithmetic or the op table's rules."""
    op, dt = x.op, x.dtype
    d = OPS[op]
    if len(ts) != d.arity:
        fail(i, f"{d.arity} operand(s), got {len(ts)}")
    bad = [t for t in ts if not (t == INDEX or isinstance(t, DType))]
    if bad:
        fail(i, f"value operands, got {bad[0]}")
    operand = ts[1] if op == "WHERE" else ts[0]
    if op == "WHERE" and ts[0] != bool_:
        fail(i, f"a bool condition, got {_name(ts[0])}")
    if operand == INDEX:
        if op not in INDEX_ALU_OPS:
            fail(i, f"index arithmetic with one of {INDEX_ALU_OPS}, got {op}")
        if any(t != INDEX for t in (ts[1:] if op == "WHERE" else ts)):
            fail(i, f"index operands, got {[_name(t) for t in ts]}")
        want = bool_ if op in ("CMPLT", "CMPEQ") else INDEX
        if dt != want:
            fail(i, f"dtype {_name(want)}, got {_name(dt)}")
        if op in ("IDIV", "MOD"):
            div = insts[x.src[1]]
            if div.op != "CONST" or not div.arg > 0:
                fail(i, f"index division by a positive CONST, got %{x.src[1]} {div.op} {div.arg!r}")
            if x.arg not in (None, NONNEG):
                fail(i, f"arg None or {NONNEG!r}, got {x.arg!r}")
        elif x.arg is not None:
            fail(i, f"no arg, got {x.arg!r}")
        return
    if any(t == INDEX for t in ts):
        fail(i, f"operands all index or none, got {[_name(t) for t in ts]}")
    if x.arg is not None:
        fail(i, f"no arg (a CAST's target is its dtype), got {x.arg!r}")
    if op == "CAST":
        if not isinstance(dt, DType):
            fail(i, f"a target dtype, got {dt!r}")
        return
    if op == "BITCAST":          # the op table's (any same-width dtypes) and the loop IR's own
        if not isinstance(dt, DType) or dt.itemsize != ts[0].itemsize:
            fail(i, f"a dtype of its operand's width, got {_name(dt)} from {_name(ts[0])}")
        return
    values = ts[1:] if op == "WHERE" else ts
    if any(t != values[0] for t in values):
        fail(i, f"operands of one dtype, got {[t.name for t in values]}")
    if any(_kind(t) not in d.dtypes for t in values):
        fail(i, f"operands of kinds {d.dtypes!r} (f float, i int, b bool), got {[t.name for t in values]}")
    want = d.dtype_rule(ts, None)
    if dt != want:
        fail(i, f"dtype {want.name} (the op table's rule), got {_name(dt)}")
