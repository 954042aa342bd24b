"""A kernel whose sizes keep changing is lowered once, with its sizes as symbols, and then
instantiated for each new size vector by checking the guards its lowering recorded.

A growing KV cache changes, every step, the sizes of the few kernels that read it (attention's
two products and softmax, the cache's ``cat``), and nothing else about them. Those kernels
compile once per family already (devices/sizeargs.py: a *sized* program reads its sizes at run
time), but each new size vector was still lowered from scratch to find out that it is a member:
~1.5 ms a kernel, two thirds of a decode step's cost above the fixed-shape step's.

Here the third size vector of a kernel body (``CONCRETE`` earlier ones lowered as usual, for as
many earlier plans: the kernels of one plan that share a body at other widths count as one) is
lowered with every size that differed between them replaced by a :class:`Sym`: a number that
knows its value and also an expression over the body's size symbols. Arithmetic on a ``Sym``
gives a ``Sym`` (a plain int where the result is the same at every value of the symbols); every
*observation* of its value -- a comparison, ``bool``, ``int``/``index`` (``range``, a list's
length), a float operation -- returns the concrete answer and records it as a guard
(``(s0 + 1) // 16 < 4 is True``). The lowering's output (the loop IR) then holds ``Sym``s where it
holds sizes. A later body with the same structure instantiates that *trace* when every
guard holds for its sizes: each ``Sym`` of the loop IR is replaced by its expression's value, and
nothing is lowered.

Why it is sound: the lowering is deterministic Python, and the only inputs that differ between
two size vectors are the symbolized sizes. Every way Python code can learn something of a
number's value goes through its special methods, and each of those records a guard or
specializes (records ``s == value``); so if every guard holds for new sizes, the lowering run on
them would have taken the same decisions, and its loop IR is the trace's with the new values put
in. Two kinds of use learn nothing of the value and record nothing: a ``repr`` (the lowering sorts
an index expression's terms by theirs; a ``Sym`` prints its expression, not its value, so the
order does not depend on the value) and a hash (a ``Sym`` hashes as its value, so a memo or the
interning table finds an equal number's entry and ``==`` then records a guard; a miss only means
an expression is built again instead of shared). A third records nothing because it learns
nothing: an observation whose answer is the same at every value the trace is instantiated for --
a ``Sym``'s expression is a canonical polynomial (``Sym``), so ``(x + 1) > x`` and
``(64*x + 10) // 64 == x`` are decided by the polynomials alone, and every symbol is >= 1
(``Trace.holds`` takes no other values). A size whose values are an integer affine function of a
symbol's in the size vectors traced (a padded length ``n + 2``, a stride ``4 * n``) is that
function of the symbol, and ``env`` checks the function for new sizes, as it checks that the
positions of one symbol agree. The expressions are bounded (``MAX_DEPTH``,
``MAX_CHARS``: deeper ones specialize), the guards are compiled into one Python function
(``Trace.check``), and a trace that fails or raises falls back to the usual lowering. A body whose
traces have paid (each instantiated at least once), met at sizes where none of them holds, is
traced again at once with the newest one's symbols (``Trace.layout``): a growing cache crossing a
lane multiple, which was lowered as usual at CONCRETE more lengths first, each compiled apart.

Indexing's interned expressions (lower/symbolic.py) that hold a ``Sym`` are interned under keys of
their own (``symbolic.tracing``), so no lowering of plain sizes, in any thread, is handed one. Within
a trace they still compare by value, which is sound but can pin a trace to its sizes where two
numbers are equal by chance (a cache of 11 positions and a register lane's offset 11); interning
them by expression instead was tried and let expressions grow past ``MAX_CHARS``, where they are
specialized anyway. The emitter's common-subexpression memo keys a constant that is a ``Sym`` by its
expression (lowering.py ``emit``): keyed by value, a decode step's ``p @ v`` with 64 register lanes
merged its length with the lane offset equal to it, and every trace of it held for that one length
(a lowering and a compile at every step). C-level uses of a size (``math.gcd``) take its ``int()``: index arithmetic
uses ``symbolic._gcd`` instead.

Off with ``EQGRAD_SIZE_ARGS=0``, with sized programs (every size vector lowers and compiles its
own code).
"""
from __future__ import annotations

import ast
import math
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from eqgrad.graph.loopir import LInst, LoopKernel
from eqgrad.graph.plan import Kernel, KernelPlan, lru_entry
from eqgrad import config
from eqgrad.lower import symbolic
from eqgrad.lower.decomp import decompose
from eqgrad.lower.lowering import verify_emitted
from eqgrad.graph.sizes import body_sizes, with_sizes

# the knobs below: docs/lowering.md, Constants (what each bounds, the measurement behind it)
CONCRETE = 2            # size vectors of a body lowered as usual, for as many earlier plans, before
                        # its sizes are symbols
MAX_TRACES = 4          # traces kept per body structure, newest first (a size crossing a lane multiple
                        # takes the other branch of a guard: that region gets a trace of its own)
MAX_TRIES = 2           # traces of a body attempted beyond one per instantiation of its traces (a
                        # body whose traces do not pay for themselves stops being traced)
MAX_BODIES = 512        # body structures remembered (least recently used dropped)
MAX_DEPTH = 40          # a Sym's expression nests at most this deep (Python's parser nests ~200) ...
MAX_CHARS = 400         # ... and is at most this long; beyond, the value is specialized


class TraceError(Exception):
    """A traced lowering did something a trace cannot represent: it is lowered as usual."""


class Sym:
    """A size that is also an expression over a trace's symbols (see the module docstring).

    The expression is kept as a polynomial with integer coefficients over *atoms* (``p``): the
    symbols ``s0, s1, ...`` and the subexpressions no polynomial holds (a floor division or modulo
    that does not come out exact, ``abs``, bit operations), each written out as an atom of its own.
    It is canonical -- equal polynomials are one tuple, whatever order the lowering computed them
    in -- so the identities index arithmetic is full of fold by themselves and record nothing:
    ``x - x`` and ``(x + 1) - x`` are plain ints, ``(64*x + 10) // 64`` is ``x`` and ``(64*x) % 64``
    is 0. A division by a size folds where its answer is the same at every value of the symbols
    (each >= 1: ``(16*x) // x`` is 16, ``(512*x - 2) // (192*x)`` is 2), and otherwise, by polynomial
    division, under the guard that makes the quotient exact (``1 % x`` is 1 where ``x > 1``):
    written out instead, p @ v of a decode step recorded 1,226 guards, most of them
    such identities (``((16*s0)//s0)==16``), checked at every step."""
    __slots__ = ("v", "p", "e", "d", "t")

    def __init__(self, v: int, e: str, d: int, t: "_Recorder", p: tuple | None = None) -> None:
        self.v, self.e, self.d, self.t = v, e, d, t
        if p is None:                    # an atom: a symbol, or a subexpression written out
            p = (((e,), 1),)
            t.values[e] = v
        self.p = p

    # -------------------------------------------------------------- observations: guards
    def _guard(self, cond: str, result: bool) -> bool:
        self.t.guards[cond] = result
        return result

    def specialize(self) -> int:
        self.t.guards[f"{self.e}=={self.v}"] = True
        return self.v

    def __bool__(self) -> bool:
        if _sign(self.p):
            return True
        return self._guard(f"{self.e}!=0", self.v != 0)

    def __index__(self) -> int:
        return self.specialize()

    __int__ = __index__

    def __float__(self) -> float:
        return float(self.specialize())

    def __hash__(self) -> int:           # learns nothing: == decides (module docstring)
        return hash(self.v)

    def __repr__(self) -> str:           # learns nothing: the expression, not the value
        return f"<{self.e}>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if spec:
            return format(self.specialize(), spec)
        return repr(self)

    def _cmp(self, o: Any, op: str, f: Callable[[Any, Any], bool]) -> Any:
        if type(o) is Sym:
            if o.t is not self.t:
                return NotImplemented if op not in ("==", "!=") else (op == "!=")
            sign = _sign(_padd(self.p, o.p, -1))
            if sign is not None:        # x + 1 > x: the same at every value, nothing learnt
                return f(sign, 0)
            return self._guard(f"{self.e}{op}{o.e}", f(self.v, o.v))
        o = _plain(o)
        if o is NotImplemented:
            return NotImplemented
        if type(o) is int:
            sign = _sign(_padd(self.p, _poly(o), -1))
            if sign is not None:        # 4 * s0 > 3
                return f(sign, 0)
        return self._guard(f"{self.e}{op}{_literal(o)}", f(self.v, o))

    def __eq__(self, o: Any) -> Any:
        return self._cmp(o, "==", lambda a, b: a == b)

    def __ne__(self, o: Any) -> Any:
        return self._cmp(o, "!=", lambda a, b: a != b)

    def __lt__(self, o: Any) -> Any:
        return self._cmp(o, "<", lambda a, b: a < b)

    def __le__(self, o: Any) -> Any:
        return self._cmp(o, "<=", lambda a, b: a <= b)

    def __gt__(self, o: Any) -> Any:
        return self._cmp(o, ">", lambda a, b: a > b)

    def __ge__(self, o: Any) -> Any:
        return self._cmp(o, ">=", lambda a, b: a >= b)

    # -------------------------------------------------------------- arithmetic: expressions
    def _op(self, o: Any, op: str, f: Callable[[Any, Any], Any], flip: bool = False) -> Any:
        if type(o) is Sym:
            if o.t is not self.t:
                raise TraceError("sizes of two traces meet")
            d = max(self.d, o.d)
        else:
            o = _plain(o)
            if o is NotImplemented:
                return NotImplemented
            if isinstance(o, float):             # a float result is a value, not a size
                v = self.specialize()
                return f(o, v) if flip else f(v, o)
            d = self.d
        a, b = (o, self) if flip else (self, o)
        v = f(_value(a), _value(b))
        t = self.t
        if op == "+" or op == "-":
            return t.poly(v, _padd(_poly(a), _poly(b), 1 if op == "+" else -1), d)
        if op == "*":
            return t.poly(v, _pmul(_poly(a), _poly(b)), d)
        if op == "//" or op == "%":
            folded = self._divmod(a, b, op, v, d)
            if folded is not None:
                return folded
        return t.make(v, f"({_text(a)}{op}{_text(b)})", d + 1)

    def _divmod(self, a: Any, b: Any, op: str, v: int, d: int) -> Any:
        """``a // b`` or ``a % b`` (value ``v``) where an identity gives it, else None."""
        t, pa, pb = self.t, _poly(a), _poly(b)
        cb = _const(pb)
        if cb is not None:          # by a constant: a = cb*q + r, coefficient by coefficient
            if cb <= 0:
                return None
            q = tuple((m, c // cb) for m, c in pa if c // cb)
            r = tuple((m, c % cb) for m, c in pa if c % cb)
            rc = _const(r)
            if rc is not None:                   # 0 <= r < cb: a // cb is q, a % cb is r
                return t.poly(v, q, d) if op == "//" else rc
            if not q:
                return None
            rs = t.poly(_peval(r, t.values), r, d)
            if op == "%":                        # (cb*q + r) % cb = r % cb
                return rs % cb
            return t.poly(_peval(q, t.values), q, d) + rs // cb
        # by a size: k = a // b at these values; where 0 <= a - k*b < b at every value of the
        # symbols, it is k at all of them and nothing is learnt ((512*s0 - 2) // (192*s0) is 2)
        k = _value(a) // b.v
        r = _padd(pa, pb, -k)
        if _sign(r) in (0, 1) and _sign(_padd(pb, r, -1)) == 1:
            return k if op == "//" else t.poly(v, r, d)
        # else a = q*b + r (polynomial division): a // b is q and a % b is r where 0 <= r < b,
        # q - 1 and b + r where r is a constant and -b <= r < 0
        q, r = _pdiv(pa, pb)
        rc = _const(r)
        if rc == 0:
            if not b._guard(f"{b.e}!=0", b.v != 0):
                return None
        elif rc is not None and rc < 0:
            if not b >= -rc:
                return None
            q, r, rc = _padd(q, _poly(1), -1), _padd(r, pb), None
        else:
            rs = t.poly(_peval(r, t.values), r, d)
            if not (rs >= 0 and b > rs):
                return None
        if op == "//":
            return t.poly(v, q, d)
        return rc if rc is not None else t.poly(v, r, d)

    def __add__(self, o): return self if (type(o) is int and o == 0) else self._op(o, "+", lambda a, b: a + b)
    def __radd__(self, o): return self if (type(o) is int and o == 0) else self._op(o, "+", lambda a, b: a + b, True)
    def __sub__(self, o): return self if (type(o) is int and o == 0) else self._op(o, "-", lambda a, b: a - b)
    def __rsub__(self, o): return self._op(o, "-", lambda a, b: a - b, True)

    def __mul__(self, o):
        if type(o) is int and o in (0, 1):
            return self if o == 1 else 0     # x * 0 is 0 whatever x is
        return self._op(o, "*", lambda a, b: a * b)

    def __rmul__(self, o):
        if type(o) is int and o in (0, 1):
            return self if o == 1 else 0
        return self._op(o, "*", lambda a, b: a * b, True)

    def __floordiv__(self, o): return self if (type(o) is int and o == 1) else self._op(o, "//", lambda a, b: a // b)
    def __rfloordiv__(self, o): return self._op(o, "//", lambda a, b: a // b, True)
    def __mod__(self, o): return self._op(o, "%", lambda a, b: a % b)
    def __rmod__(self, o): return self._op(o, "%", lambda a, b: a % b, True)
    def __and__(self, o): return self._op(o, "&", lambda a, b: a & b)
    def __rand__(self, o): return self._op(o, "&", lambda a, b: a & b, True)
    def __or__(self, o): return self._op(o, "|", lambda a, b: a | b)
    def __ror__(self, o): return self._op(o, "|", lambda a, b: a | b, True)
    def __xor__(self, o): return self._op(o, "^", lambda a, b: a ^ b)
    def __rxor__(self, o): return self._op(o, "^", lambda a, b: a ^ b, True)
    def __lshift__(self, o): return self._op(o, "<<", lambda a, b: a << b)
    def __rlshift__(self, o): return self._op(o, "<<", lambda a, b: a << b, True)
    def __rshift__(self, o): return self._op(o, ">>", lambda a, b: a >> b)
    def __rrshift__(self, o): return self._op(o, ">>", lambda a, b: a >> b, True)

    def __divmod__(self, o): return self // o, self % o
    def __rdivmod__(self, o): return o // self, o % self

    def __truediv__(self, o): return self.specialize() / o
    def __rtruediv__(self, o): return o / self.specialize()
    def __pow__(self, o, mod=None): return pow(self.specialize(), o, mod)
    def __rpow__(self, o): return o ** self.specialize()

    def __neg__(self): return self.t.poly(-self.v, _pscale(self.p, -1), self.d)
    def __pos__(self): return self
    def __abs__(self):
        sign = _sign(self.p)
        if sign is not None:
            return self if sign > 0 else -self
        return self.t.make(abs(self.v), f"abs({self.e})", self.d + 1)

    def __invert__(self): return self.t.make(~self.v, f"(~{self.e})", self.d + 1)

    def __round__(self, n=None): return round(self.specialize(), n)
    def __trunc__(self): return self.specialize()
    def __floor__(self): return self.specialize()
    def __ceil__(self): return self.specialize()


# ------------------------------------------------------------------ polynomials over atoms
# A polynomial is a tuple of (monomial, coefficient), sorted by monomial, no coefficient 0; a
# monomial is a sorted tuple of atom names (the constant's is ()).

def _padd(a: tuple, b: tuple, k: int = 1) -> tuple:
    """a + k*b."""
    out = dict(a)
    for m, c in b:
        out[m] = out.get(m, 0) + k * c
    return tuple(sorted((m, c) for m, c in out.items() if c))


def _pscale(a: tuple, k: int) -> tuple:
    return tuple((m, c * k) for m, c in a) if k else ()


def _pmul(a: tuple, b: tuple) -> tuple:
    out: dict[tuple, int] = {}
    for m1, c1 in a:
        for m2, c2 in b:
            m = tuple(sorted(m1 + m2))
            out[m] = out.get(m, 0) + c1 * c2
    return tuple(sorted((m, c) for m, c in out.items() if c))


def _const(a: tuple) -> int | None:
    """The value of a constant polynomial, else None."""
    if not a:
        return 0
    if len(a) == 1 and not a[0][0]:
        return a[0][1]
    return None


def _sign(a: tuple) -> int | None:
    """The sign of the polynomial ``a`` at every value of its symbols, each >= 1 (``Trace.holds``
    takes no other), where its terms decide it alone; else None. Atoms other than symbols may be
    anything."""
    c = _const(a)
    if c is not None:
        return (c > 0) - (c < 0)
    at_one = 0                  # the polynomial at every symbol 1, and which way its terms move
    up = down = False
    for m, c in a:
        if m and not all(x[0] == "s" for x in m):       # (a symbol: s0, s1, ...)
            return None
        at_one += c
        if m:
            up, down = up or c > 0, down or c < 0
    if not down and at_one > 0:
        return 1
    if not up and at_one < 0:
        return -1
    return None


def _peval(a: tuple, values: dict[str, int]) -> int:
    total = 0
    for m, c in a:
        for x in m:
            c *= values[x]
        total += c
    return total


def _render(a: tuple) -> str:
    """Python source of a polynomial: ``s0``, ``(64*s0)``, ``(2*s0*s1+(s1//3)+-1)``."""
    terms = [(m, c) for m, c in a if m]
    const = a[0][1] if a and not a[0][0] else 0
    if len(terms) == 1 and terms[0][1] == 1 and not const:
        m = terms[0][0]
        return m[0] if len(m) == 1 else f"({'*'.join(m)})"
    parts = [("*".join(m) if c == 1 else f"{c}*{'*'.join(m)}") for m, c in terms]
    if const:
        parts.append(str(const))
    return f"({'+'.join(parts)})"


def _pdiv(a: tuple, b: tuple) -> tuple[tuple, tuple]:
    """(q, r) with a = q*b + r: b's leading term (most atoms, then by name) divided into a's
    leading terms while it divides them (``_PDIV_STEPS`` at most)."""
    order = lambda t: (len(t[0]), t[0])          # noqa: E731
    lm, lc = max(b, key=order)
    q, r = (), a
    for _ in range(_PDIV_STEPS):
        terms = [t for t in r if t[0]]
        if not terms:
            break
        m, c = max(terms, key=order)
        rest = list(m)
        for x in lm:
            if x not in rest:
                return q, r
            rest.remove(x)
        if c % lc:
            break
        step = ((tuple(rest), c // lc),)
        q, r = _padd(q, step), _padd(r, _pmul(step, b), -1)
    return q, r


_PDIV_STEPS = 64        # a quotient's terms (a trace's index arithmetic divides by sums of 2-3 terms)


def _poly(x: Any) -> tuple:
    return x.p if type(x) is Sym else ((((), x),) if x else ())


def _value(x: Any) -> int:
    return x.v if type(x) is Sym else x


def _text(x: Any) -> str:
    return x.e if type(x) is Sym else _literal(x)


def _literal(o: int | float) -> str:
    """``o`` as Python source (``repr`` of inf or NaN is not)."""
    return repr(o) if type(o) is int or math.isfinite(o) else f"float({str(o)!r})"


def _plain(o: Any) -> Any:
    """``o`` as a plain number an expression can hold, or NotImplemented."""
    t = type(o)
    if t is int or t is float:
        return o
    if t is bool:
        return int(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    return NotImplemented


symbolic.SYMBOLS = (Sym,)


class _Recorder:
    """The guards and the expression bound of one traced lowering."""

    def __init__(self) -> None:
        self.guards: dict[str, bool] = {}
        self.values: dict[str, int] = {}      # each atom's value (``Sym.p``)

    def make(self, v: Any, e: str, d: int) -> Any:
        """An atom: the expression ``e`` written out, of value ``v`` and nesting ``d``."""
        return v if self._specialized(v, e, d) else Sym(v, e, d, self)

    def poly(self, v: Any, p: tuple, d: int) -> Any:
        """The polynomial ``p`` of value ``v``: a plain int where it is a constant (the same at every
        value of the symbols), else a Sym."""
        c = _const(p)
        if c is not None:
            return c
        e = _render(p)
        return v if self._specialized(v, e, d) else Sym(v, e, d, self, p)

    def _specialized(self, v: Any, e: str, d: int) -> bool:
        """Whether ``e`` (value ``v``, nesting ``d``) is beyond the expression bound and is its value
        from here on (recorded as a guard)."""
        if type(v) is not int:
            raise TraceError(f"a size operation gave {type(v).__name__}")
        if d > MAX_DEPTH or len(e) > MAX_CHARS:
            self.guards[f"{e}=={v}"] = True
            return True
        return False


# ------------------------------------------------------------------ the sizes of a kernel body

# ------------------------------------------------------------------ traces

class _Holes:
    """Where a loop kernel of a trace holds sizes, and a function of the symbols giving their values."""

    def __init__(self, lk: LoopKernel, names: str) -> None:
        self.lk = lk
        self.holes: list[tuple[int, str]] = []         # (instruction id, or -1 for a field, field)
        exprs: list[str] = []
        for i, x in enumerate(lk.insts):
            if _has_sym(x.arg):
                self.holes.append((i, "arg"))
                exprs.append(_expr(x.arg))
            if _has_sym(x.src) or _has_sym(x.dtype):
                raise TraceError("an instruction's sources or dtype hold a size")
        for f in ("parallel", "vector_lanes"):
            v = getattr(lk, f)
            if type(v) is Sym:
                self.holes.append((-1, f))
                exprs.append(v.e)
            elif type(v) is not int:
                raise TraceError(f"loop kernel field {f} is {type(v).__name__}")
        if _has_sym(lk.params):
            raise TraceError("a parameter holds a size")
        scope: dict[str, Any] = {}
        exec(compile(f"def values({names}):\n return ({''.join(e + ', ' for e in exprs)})\n",   # noqa: S102
                     "<eqgrad trace>", "exec"), scope)       # (our own expressions)
        self.values = scope["values"]

    def instantiate(self, env: tuple[int, ...]) -> LoopKernel:
        insts = list(self.lk.insts)
        fields: dict[str, int] = {}
        for (i, f), v in zip(self.holes, self.values(*env)):
            if i < 0:
                fields[f] = v
            else:
                x = insts[i]
                insts[i] = LInst(x.op, x.dtype, x.src, list(v) if type(x.arg) is list else v)
        return replace(self.lk, insts=insts, params=list(self.lk.params), **fields)


def _check_source(names: str, conds: list[str]) -> str:
    """The source of ``check(names)``: every condition holds. Each distinct arithmetic
    subexpression of the conditions is computed once, into a local, before they are tested: a
    lowering's guards repeat their subexpressions (a decode step's attention product with 64
    register lanes recorded 623 guards, one per lane offset and index form, over the same few
    products and quotients of its length), and checking them each as written cost 0.2 ms a step.
    A subexpression computed ahead that a condition before it would have skipped may raise
    (a division by a size now 0): ``instantiate`` then falls back to the usual lowering."""
    shared: dict[str, str] = {}
    lines: list[str] = []

    class _Share(ast.NodeTransformer):
        def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
            self.generic_visit(node)
            text = ast.unparse(node)
            name = shared.get(text)
            if name is None:
                name = shared[text] = f"_t{len(shared)}"
                lines.append(f" {name} = {text}\n")
            return ast.Name(id=name, ctx=ast.Load())
    tests = [ast.unparse(_Share().visit(ast.parse(c, mode="eval")).body) for c in conds]
    return f"def check({names}):\n{''.join(lines)} return {' and '.join(f'({t})' for t in tests) or 'True'}\n"


class Trace:
    """One symbolic lowering: which sizes are which symbol, its guards and its loop IR."""

    def __init__(self, groups: list[tuple[int, ...]], fixed: dict[int, int], guards: dict[str, bool],
                 lk: LoopKernel, related: dict[int, tuple[int, int, int]] | None = None) -> None:
        self.groups, self.fixed = groups, fixed
        self.related = related or {}        # position -> (j, a, b): the size is a * s_j + b
        self.names = ", ".join(f"s{j}" for j in range(len(groups)))
        conds = [f"({c})" if r else f"not ({c})" for c, r in guards.items()]
        scope: dict[str, Any] = {}
        exec(compile(_check_source(self.names, conds), "<eqgrad trace>", "exec"), scope)      # noqa: S102
        self.check = scope["check"]
        self.n_guards = len(guards)
        self.ir = _Holes(lk, self.names)
        self._decomposed: dict[frozenset, _Holes | None] = {}
        self._lock = threading.Lock()
        _traces.add(self)

    def env(self, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
        """The symbols' values for ``sizes`` when this trace's structure applies to them, else None
        (the guards are ``check``'s)."""
        for p, v in self.fixed.items():
            if sizes[p] != v:
                return None
        out = []
        for g in self.groups:
            v = sizes[g[0]]
            for p in g[1:]:
                if sizes[p] != v:
                    return None
            out.append(v)
        for p, (j, a, b) in self.related.items():
            if sizes[p] != a * out[j] + b:
                return None
        return tuple(out)

    def layout(self, sizes: tuple[int, ...]) -> tuple[list[tuple[int, ...]], dict[int, tuple[int, int, int]]] | None:
        """(its symbols' positions, its positions affine in them) where its structure applies to
        ``sizes`` (``env``), whether or not its guards hold there: the layout of the next trace."""
        return (self.groups, self.related) if self.env(sizes) is not None else None

    def instantiate(self, env: tuple[int, ...]) -> LoopKernel | None:
        """The loop IR for the symbols' values ``env``, or None when a guard fails. It remembers
        where it came from (``decomposed``)."""
        if not self.holds(env):
            return None
        try:
            lk = self.ir.instantiate(env)
        except Exception:          # (a division by a size that is now 0, say): lowered as usual
            return None
        if config.VERIFY.value:
            verify_emitted(lk, "instantiated from its trace")
        lk.traced = (self, env)
        return lk

    def holds(self, env: tuple[int, ...]) -> bool:
        """Whether the guards hold for the symbols' values ``env`` (``instantiate`` without the loop
        IR); the symbols are taken to be >= 1 (``_sign``)."""
        if min(env, default=1) < 1:
            return False
        try:
            return bool(self.check(*env))
        except Exception:          # (a division by a size that is now 0): not this trace
            return False

    def decomposed_holes(self, native: Any) -> "_Holes | None":
        """The holes of this trace's loop IR decomposed for ``native`` (``ir`` itself when the
        decomposition rewrites nothing), once ``decomposed`` has worked them out; else None."""
        with self._lock:
            return self._decomposed.get(frozenset(native))

    def decomposed(self, lk: LoopKernel, native: Any) -> tuple[LoopKernel | None, "_Holes | None"]:
        """``decompose(lk, native)`` of ``lk``, an instance of this trace, from the trace's own loop
        IR decomposed once (a decode step's softmax rewrote its exp2 into ~200 instructions at
        every length), and the holes it was instantiated from (the same object for every instance:
        what a caller keeps per family). ``lk`` itself with ``ir`` when nothing is decomposed;
        (None, None) when the decomposition cannot be instantiated."""
        key = frozenset(native)
        with self._lock:
            if key not in self._decomposed:
                try:
                    dk = decompose(self.ir.lk, native)
                    self._decomposed[key] = self.ir if dk is self.ir.lk else _Holes(dk, self.names)
                except TraceError:
                    self._decomposed[key] = None
            h = self._decomposed[key]
        if h is None:
            return None, None
        if h is self.ir:
            return lk, h
        dk = h.instantiate(lk.traced[1])
        dk.name = lk.name
        return dk, h


def _has_sym(x: Any) -> bool:
    t = type(x)
    if t is Sym:
        return True
    if t is tuple or t is list:
        return any(_has_sym(y) for y in x)
    return False


def _expr(x: Any) -> str:
    """A Python expression of the value ``x`` holds (a Sym, or a tuple holding some)."""
    t = type(x)
    if t is Sym:
        return x.e
    if t is tuple or t is list:
        return "(" + "".join(_expr(y) + ", " for y in x) + ")"
    if t in (int, float, bool, str) or x is None:
        return repr(x)
    raise TraceError(f"an instruction's argument {type(x).__name__} holds a size")


def _affine(col: tuple[int, ...], base: tuple[int, ...]) -> tuple[int, int] | None:
    """(a, b), integers with a != 0, where ``col[i] == a * base[i] + b`` for every i; else None."""
    i = next((i for i in range(1, len(base)) if base[i] != base[0]), None)
    if i is None:
        return None
    a, r = divmod(col[i] - col[0], base[i] - base[0])
    if r or not a:
        return None
    b = col[0] - a * base[0]
    return (a, b) if all(c == a * x + b for c, x in zip(col, base)) else None


class _Body:
    __slots__ = ("seen", "traces", "tries", "hits")

    def __init__(self) -> None:
        # size vectors lowered as usual, oldest first, each with the id of the plan it was lowered
        # for: sizes that keep changing change between plans (a growing sequence, new batch sizes),
        # while the kernels of one plan that share a body (a model's layers of other widths) rarely
        # share its lane decisions, so their vectors count as one
        self.seen: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self.traces: list[Trace] = []
        self.tries = self.hits = 0      # traces attempted, and instances of them (``MAX_TRIES``)


class Traces:
    """Traced lowerings by body structure (``lower``); one per process, ``TRACES``."""

    def __init__(self) -> None:
        self._bodies: OrderedDict[tuple, _Body] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.traced = self.failed = 0

    def lower(self, k: Kernel, plan: KernelPlan, lower: Callable[[Kernel, KernelPlan], LoopKernel],
              key: Any = None) -> LoopKernel:
        """``lower(k, plan)``, or a trace of this body's structure instantiated for its sizes.
        ``key``: what else the lowering depends on (a device's capabilities: the traces of one
        device's lowering are not another's)."""
        skel, sizes = body_sizes(k, plan)
        if key is not None:
            skel = (skel, key)
        here = id(plan)
        with self._lock:
            body = self._body(skel)
            traces = list(body.traces)
            seen = self._others(body, sizes, here)
        for tr in traces:
            env = tr.env(sizes)
            if env is not None:
                lk = tr.instantiate(env)
                if lk is not None:
                    self.hits += 1
                    body.hits += 1
                    return lk
        # a body traced before, at sizes where none of its traces holds (a growing cache that has
        # just crossed a lane multiple): where its traces have paid (instantiated at least once
        # each), traced again at once with the symbols of its newest trace, not after CONCRETE more
        # size vectors lowered and compiled as usual (each crossing of a decode step's attention
        # lowered 3 times and compiled 3 programs: ~55 ms a step)
        again = traces[0].layout(sizes) if traces and body.tries <= body.hits else None
        if again is not None or self._tracing(body, seen):
            body.tries += 1
            tr = self._trace(k, plan, seen[0][-CONCRETE:] + [sizes], lower, again)
            if tr is not None:
                with self._lock:
                    body.traces.insert(0, tr)
                    del body.traces[MAX_TRACES:]
                    body.seen.clear()
                env = tr.env(sizes)
                lk = tr.instantiate(env) if env is not None else None
                if lk is not None:
                    return lk
        lk = lower(k, plan)
        with self._lock:
            self._saw(body, sizes, here)
        return lk

    def keeps_changing(self, k: Kernel, plan: KernelPlan, key: Any = None) -> bool:
        """Whether ``k``'s body structure (``key`` as for ``lower``) has traces, or ``lower`` would
        trace it now: met at CONCRETE other size vectors, for as many other plans. ``k``'s sizes
        count as met for ``plan`` from here on, lowered or not: a device that takes a body's code
        from its disk cache (devices/cpu.py ``_from_disk``) asks this first, so a structure whose
        sizes keep changing is traced even where every size vector was kept on disk by earlier
        processes -- they were not traced there, a growing KV cache's decode step loaded its
        changed kernels from disk at every step, 1.7-3.5 ms more a step than from their traces (2-vCPU
        Intel Xeon, bench_compile's decoder with a cache directory that had seen its lengths)."""
        skel, sizes = body_sizes(k, plan)
        here = id(plan)
        with self._lock:
            body = self._body(skel if key is None else (skel, key))
            if body.traces:
                return True
            seen = self._others(body, sizes, here)
            self._saw(body, sizes, here)
            return self._tracing(body, seen)

    def _body(self, skel: tuple) -> "_Body":
        """The entry of a body structure (made if new; the caller holds the lock)."""
        return lru_entry(self._bodies, skel, _Body, MAX_BODIES)

    @staticmethod
    def _others(body: "_Body", sizes: tuple[int, ...], here: int) -> tuple[list[tuple[int, ...]], int]:
        """(the size vectors other than ``sizes`` met for plans other than ``here``, oldest first;
        how many plans those are)."""
        return [s for s, p in body.seen.items() if s != sizes and p != here], \
            len({p for p in body.seen.values() if p != here})

    @staticmethod
    def _tracing(body: "_Body", seen: tuple[list, int]) -> bool:
        """Whether a body met at the other vectors ``seen`` (``_others``) is traced now: CONCRETE
        of them from as many plans, and its traces not given up on (``MAX_TRIES``)."""
        vectors, plans = seen
        return len(vectors) >= CONCRETE and plans >= CONCRETE and body.tries < MAX_TRIES + body.hits

    @staticmethod
    def _saw(body: "_Body", sizes: tuple[int, ...], here: int) -> None:
        """Keep ``sizes`` as met for plan ``here`` (the newest), at most 2 x CONCRETE vectors."""
        body.seen[sizes] = here
        body.seen.move_to_end(sizes)
        while len(body.seen) > 2 * CONCRETE:
            body.seen.popitem(last=False)

    def bind(self, k: Kernel, plan: KernelPlan, key: Any = None) -> tuple[Trace, tuple[int, ...]] | None:
        """The trace that ``lower`` would instantiate for ``k`` (``key`` as there), with the symbols'
        values for its sizes, without instantiating it: a device that finds the program of that
        instance by its sizes alone (devices/sizeargs.py ``Families.rebound``) needs no loop IR.
        None where no trace of the body's structure applies (then ``lower``)."""
        skel, sizes = body_sizes(k, plan)
        body = self._bodies.get(skel if key is None else (skel, key))
        if body is None:
            return None
        for tr in list(body.traces):
            env = tr.env(sizes)
            if env is not None and tr.holds(env):
                self.hits += 1
                body.hits += 1
                return tr, env
        return None

    def has_traces(self, k: Kernel, plan: KernelPlan, key: Any = None) -> bool:
        """Whether bodies of ``k``'s structure have been traced (for ``key``, as ``lower``): their
        sizes keep changing, and a new one lowers from a trace in a fraction of a millisecond."""
        skel = body_sizes(k, plan)[0]
        body = self._bodies.get(skel if key is None else (skel, key))
        return body is not None and bool(body.traces)

    def _trace(self, k: Kernel, plan: KernelPlan, vectors: list[tuple[int, ...]],
               lower: Callable[[Kernel, KernelPlan], LoopKernel],
               layout: tuple[list[tuple[int, ...]], dict[int, tuple[int, int, int]]] | None = None) -> Trace | None:
        """Lower ``k`` with the sizes that differ between ``vectors`` (the last is ``k``'s) as
        symbols: positions whose values agree in every vector share one. ``layout``: the symbols'
        positions and the positions that are affine functions of them (``Trace.layout``) taken
        from an earlier trace instead."""
        sizes = vectors[-1]
        groups, related = layout if layout is not None else _layout(vectors)
        taken = {p for g in groups for p in g} | set(related)
        fixed = {p: v for p, v in enumerate(sizes) if p not in taken}
        if any(sizes[g[0]] < 1 for g in groups):
            return None                 # (its symbols are taken to be >= 1: ``_sign``)
        rec = _Recorder()
        values: list[Any] = list(sizes)
        syms = [Sym(sizes[g[0]], f"s{j}", 0, rec) for j, g in enumerate(groups)]
        for j, g in enumerate(groups):
            for p in g:
                values[p] = syms[j]
        for p, (j, a, b) in related.items():
            values[p] = syms[j] * a + b
        try:
            sk, splan = with_sizes(k, plan, values)
            with symbolic.tracing():
                lk = lower(sk, splan)
            tr = Trace(groups, fixed, dict(rec.guards), lk, related)
        except Exception as e:    # anything a trace cannot follow: lowered as usual
            if config.DEBUG.value >= 5:
                print(f"trace: kernel {k.name} is lowered as usual ({type(e).__name__}: {e})")
            self.failed += 1
            return None
        self.traced += 1
        if config.DEBUG.value >= 5:
            print(f"trace: kernel {k.name}: {len(groups)} size symbol(s), {tr.n_guards} guard(s), "
                  f"{len(tr.ir.holes)} size(s) in its loop IR")
        return tr

    def clear(self) -> None:
        with self._lock:
            self._bodies.clear()


def _layout(vectors: list[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], dict[int, tuple[int, int, int]]]:
    """(the positions of each symbol, the positions that are an affine function ``a * s_j + b`` of
    one: position -> (j, a, b)) for the sizes that differ between ``vectors``."""
    by_column: dict[tuple[int, ...], list[int]] = {}
    for p in range(len(vectors[-1])):
        col = tuple(v[p] for v in vectors)
        if len(set(col)) > 1:
            by_column.setdefault(col, []).append(p)
    # a column that is an integer affine function of another's (a padded length n + 2, a
    # stride 4 * n) is that function of its symbol, not a symbol of its own: the lowering's
    # index arithmetic then folds across them (a division by 4 * n of 4 * (n + 2) * i is
    # (n + 2) * i // n written out, with n and 4n + 8 apart). Narrowest column first.
    bases: list[tuple[int, ...]] = []
    groups: list[tuple[int, ...]] = []
    related: dict[int, tuple[int, int, int]] = {}
    for col, ps in sorted(by_column.items(), key=lambda it: (max(it[0]) - min(it[0]), it[1][0])):
        for j, base in enumerate(bases):
            ab = _affine(col, base)
            if ab is not None:
                related.update((p, (j, *ab)) for p in ps)
                break
        else:
            bases.append(col)
            groups.append(tuple(ps))
    return groups, related


TRACES = Traces()
_traces: "weakref.WeakSet[Trace]" = weakref.WeakSet()     # every Trace alive, in TRACES or kept by a caller


def _after_fork_in_child() -> None:
    # a parent thread may have held one at the fork (what they guard is a dict, a thread leaves
    # each of its entries set or not set): made anew
    TRACES._lock = threading.Lock()
    for tr in list(_traces):
        tr._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
