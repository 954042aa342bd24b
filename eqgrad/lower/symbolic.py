"""Symbolic integer index expressions with bounds, in a canonical linear form.

An expression is a :class:`Lin`: ``const + sum(coef * atom)``, where an atom is a loop variable
(:class:`Var`) or a floor division / modulo of a linear expression by a positive constant
(:class:`Div`, :class:`Mod`). Every expression knows its [lo, hi] bounds, and division and modulo
simplify with them -- e.g. ``(4*i + j) // 4 -> i`` and ``(4*i + j) % 4 -> j`` when ``0 <= j < 4``,
which is what folding ``reshape`` chains into index expressions needs.

Semantics are floor division and modulo, for every sign. The simplifier keeps every ``Div``/``Mod``
numerator non-negative: ``//`` splits its constant so the residual's lower bound is >= 0 (any
split is exact under floor division, e.g. ``(2 - i) // 3`` with ``0 <= i <= 5`` becomes
``(5 - i) // 3 - 1``), and ``%`` reduces coefficients and constant modulo the divisor. The
lowering marks a division whose numerator's bounds prove it non-negative (``loopir.NONNEG``), and
renderers emit the cheap truncating instruction only for those; any other index division is
rendered as true floor division (a flipped or padded index is negative at in-bounds positions
of intermediate expressions, so truncation toward zero would be wrong there).
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Union


# Expressions are interned: equal expressions are one object, so equality is identity and hashing
# is the object's address, both done in C. The emitter's CSE keys and move_index's memo are tuples
# of index expressions, hashed and compared at every lookup: ~1,300 hashes per kernel, each a
# Python call while expressions hashed their fields (a cached hash still cost the call: 15-20 %
# of lowering). ``_INTERNED`` maps (kind, fields) to the one object; it is emptied, with
# move_index's memo, only between lowerings (``release``), once it holds ``INTERN_MAX`` entries --
# an expression kept across that (none is, in eqgrad) would only miss CSE, never be wrong.
_INTERNED: dict[tuple, object] = {}
# INTERN_MAX: docs/lowering.md, Constants
INTERN_MAX = 500_000
_active = [0]          # lowerings in progress (``lowering``), in any thread
_active_lock = threading.Lock()


def _interned(cls, key: tuple, fields: dict) -> object:
    if _tracing[0] and _holds_symbol(key):
        key = (key, "traced")       # never equal to an expression of plain sizes (``tracing``)
    hit = _INTERNED.get(key)
    if hit is None:
        hit = object.__new__(cls)
        hit.__dict__.update(fields)
        hit = _INTERNED.setdefault(key, hit)        # (another thread may have made it first)
    return hit


class _Interned:
    """An interned expression: made by its class's ``__new__`` through ``_interned``, which sets
    its fields (the dataclasses say ``init=False``); copied and pickled by its fields, so a copy
    is the interned object again."""
    _FIELDS: tuple[str, ...] = ()

    def __reduce__(self):
        return type(self), tuple(getattr(self, f) for f in self._FIELDS)


# ``with tracing():`` -- a lowering of a kernel whose sizes are symbols (lower/trace.py) is in
# progress. Its expressions hold trace.Sym numbers, which hash and compare equal to their values:
# interned under plain keys, an expression holding one would be handed to a lowering of plain
# sizes (in this thread or another) that asked for an equal-valued expression. So while a trace
# runs, a key that holds a non-int number is interned apart, and move_index's memo (keyed by
# shapes) is bypassed. One trace at a time.
_tracing = [0]
_trace_lock = threading.Lock()
SYMBOLS: tuple[type, ...] = ()        # trace.Sym, set by lower/trace.py


_here = threading.local()


def _gcd(c: int, d: int) -> int:
    """gcd(c, d) for a coefficient ``c`` and a divisor ``d > 0``, either of which may be a traced size
    (lower/trace.py): ``math.gcd`` takes its arguments' ``int()``, which fixes a traced size to its
    value -- a decode step's attention products were traced at one cache length and reused at none
    (``(64*s0) == 704`` among their guards). Euclid's steps with the divisor reduced first learn only
    what the result depends on (``(64*s0) % 64 != 0`` is False: 64 at every length)."""
    if type(c) is int and type(d) is int:
        return math.gcd(c, d)
    a, b = abs(c), d
    if not a:
        return b
    b = b % a
    while b:
        a, b = b, a % b
    return a


class tracing:
    def __enter__(self) -> None:
        _trace_lock.acquire()
        _tracing[0] += 1
        _here.on = True          # (set after the acquire: _after_fork_in_child reads it)

    def __exit__(self, *exc) -> None:
        _here.on = False
        _tracing[0] -= 1
        _trace_lock.release()


def tracing_here() -> bool:
    """Whether this thread is lowering a kernel whose sizes are symbols (``tracing``)."""
    return getattr(_here, "on", False)


def _holds_symbol(key: tuple) -> bool:
    kind = key[0]
    if kind == "L":
        return type(key[2]) is not int or any(type(c) is not int for _, c in key[1])
    if kind == "V":
        return type(key[2]) is not int or type(key[3]) is not int
    return type(key[2]) is not int


class lowering:
    """``with symbolic.lowering():`` -- a lowering is in progress: the interned expressions stay."""
    def __enter__(self) -> None:
        with _active_lock:
            _active[0] += 1
            _here.lowerings = getattr(_here, "lowerings", 0) + 1

    def __exit__(self, *exc) -> None:
        with _active_lock:
            _active[0] -= 1
            _here.lowerings -= 1
            if not _active[0] and len(_INTERNED) > INTERN_MAX:
                release()


def _after_fork_in_child() -> None:
    """The locks are made anew (a parent thread may have held one), and the counts are the forking
    thread's own, the only thread the child has: a parent thread's lowering or trace in progress
    at the fork never ends in the child, and would have kept the table from ever being emptied
    and every lowering checking its keys for symbols."""
    global _active_lock, _trace_lock
    _active_lock, _trace_lock = threading.Lock(), threading.Lock()
    _active[0] = getattr(_here, "lowerings", 0)
    _tracing[0] = int(tracing_here())
    if tracing_here():              # its ``tracing.__exit__`` releases the new lock
        _trace_lock.acquire()


os.register_at_fork(after_in_child=_after_fork_in_child)


_RELEASE_HOOKS: list = []      # memos that hold expressions (indexing's move_index memo), emptied with the table


def on_release(fn) -> None:
    """Call ``fn()`` whenever the interned expressions are forgotten (``release``)."""
    _RELEASE_HOOKS.append(fn)


def release() -> None:
    """Forget the interned expressions (and the memos that hold some, ``on_release``); the small
    constants are interned again."""
    _INTERNED.clear()
    _SORT_KEYS.clear()
    for fn in _RELEASE_HOOKS:
        fn()
    for v, x in _NUMS.items():
        _INTERNED[("L", (), v)] = x


@dataclass(frozen=True, eq=False, init=False)
class Var(_Interned):
    name: str
    lo: int
    hi: int          # inclusive
    _FIELDS = ("name", "lo", "hi")

    def __new__(cls, name: str, lo: int, hi: int) -> "Var":
        return _interned(cls, ("V", name, lo, hi), dict(name=name, lo=lo, hi=hi))

    def __repr__(self) -> str:
        return self.name


# atom -> its repr (``_sort_key``), kept beside the atom, not on it: keyed by the atom (identity,
# as every interned expression) and emptied with the table (``release``), which holds the atoms anyway
_SORT_KEYS: dict = {}


def _sort_key(a: "Atom") -> str:
    """An atom's place in a Lin's terms (their repr, computed once per atom)."""
    if isinstance(a, Var):
        return a.name
    k = _SORT_KEYS.get(a)
    if k is None:
        k = _SORT_KEYS[a] = repr(a)
    return k


@dataclass(frozen=True, eq=False, init=False)
class Div(_Interned):
    x: "Lin"
    d: int
    _FIELDS = ("x", "d")

    def __new__(cls, x: "Lin", d: int) -> "Div":
        return _interned(cls, ("D", x, d), dict(x=x, d=d))

    @property
    def bounds(self) -> tuple[int, int]:
        lo, hi = self.x.bounds
        return lo // self.d, hi // self.d

    def __repr__(self) -> str:
        return f"({self.x}//{self.d})"


@dataclass(frozen=True, eq=False, init=False)
class Mod(_Interned):
    x: "Lin"
    d: int
    _FIELDS = ("x", "d")

    def __new__(cls, x: "Lin", d: int) -> "Mod":
        return _interned(cls, ("M", x, d), dict(x=x, d=d))

    @property
    def bounds(self) -> tuple[int, int]:
        lo, hi = self.x.bounds
        if lo >= 0 and hi < self.d:
            return lo, hi
        return 0, self.d - 1

    def __repr__(self) -> str:
        return f"({self.x}%{self.d})"


Atom = Union[Var, Div, Mod]


def _atom_bounds(a: Atom) -> tuple[int, int]:
    return (a.lo, a.hi) if isinstance(a, Var) else a.bounds


@dataclass(frozen=True, eq=False, init=False)
class Lin(_Interned):
    terms: tuple[tuple[Atom, int], ...]     # sorted by repr, no zero coefficients
    const: int = 0
    _FIELDS = ("terms", "const")

    def __new__(cls, terms: tuple, const: int = 0) -> "Lin":
        return _interned(cls, ("L", terms, const), dict(terms=terms, const=const))

    # -------------------------------------------------------------- construction
    @staticmethod
    def num(v: int) -> "Lin":
        if _tracing[0] and isinstance(v, SYMBOLS):     # (int() would fix a traced size's value)
            return Lin((), v)
        v = int(v)
        hit = _NUMS.get(v)
        return hit if hit is not None else Lin((), v)

    @staticmethod
    def var(name: str, extent: int) -> "Lin":
        if extent <= 1:
            return Lin.num(0)
        return Lin(((Var(name, 0, extent - 1), 1),), 0)

    @staticmethod
    def _make(terms: dict, const: int) -> "Lin":
        items = [(a, c) for a, c in terms.items() if c != 0]
        if len(items) > 1:
            items.sort(key=_item_key)
        return Lin(tuple(items), const)

    # -------------------------------------------------------------- queries
    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def bounds(self) -> tuple[int, int]:
        b = self.__dict__.get("_bounds")            # computed once: the expression is immutable
        if b is None:
            lo = hi = self.const
            for a, c in self.terms:
                alo, ahi = _atom_bounds(a)
                if c >= 0:
                    lo += c * alo
                    hi += c * ahi
                else:
                    lo += c * ahi
                    hi += c * alo
            b = self.__dict__["_bounds"] = (lo, hi)
        return b

    def __repr__(self) -> str:
        parts = [(f"{a}" if c == 1 else f"{c}*{a}") for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    # -------------------------------------------------------------- arithmetic
    def __add__(self, o: "Lin | int") -> "Lin":
        o = o if isinstance(o, Lin) else Lin.num(o)
        if not o.terms:                     # a constant: the terms stay as they are
            return self if not o.const else Lin(self.terms, self.const + o.const)
        if not self.terms:
            return o if not self.const else Lin(o.terms, self.const + o.const)
        terms = dict(self.terms)
        divmod_ = False
        for a, c in o.terms:
            terms[a] = terms.get(a, 0) + c
            divmod_ = divmod_ or type(a) is not Var
        const = self.const + o.const
        if divmod_:
            const = _recombine(terms, const)
        return Lin._make(terms, const)

    def __sub__(self, o: "Lin | int") -> "Lin":
        return self + (o * -1 if isinstance(o, Lin) else -o)

    def __mul__(self, k: int) -> "Lin":
        if k == 0:
            return Lin.num(0)
        return Lin(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def __floordiv__(self, d: int) -> "Lin":
        assert d > 0
        if d == 1:
            return self
        lo, hi = self.bounds
        if lo // d == hi // d:
            return Lin.num(lo // d)
        # pull out terms whose coefficient is a multiple of d
        quot: dict = {}
        rest: dict = {}
        for a, c in self.terms:
            if c % d == 0:
                quot[a] = c // d
            else:
                rest[a] = c
        q_const, r_const = _split_constant(self.const, Lin._make(rest, 0).bounds[0], d)
        r = Lin._make(rest, r_const)
        rlo, rhi = r.bounds
        if rlo // d == rhi // d:
            return Lin._make(quot, q_const + rlo // d)
        q = Lin._make(quot, q_const)
        if len(r.terms) > 1:
            # (g*b + s) // d = b // (d/g) where g divides d and 0 <= s < g: a reshape's index of a
            # merged axis group ((6*r + j) // 42 with 0 <= j < 6 is r // 7)
            for g in sorted({_gcd(c, d) for _, c in r.terms} - {1}, reverse=True):
                big = {a: c // g for a, c in r.terms if c % g == 0}
                small = Lin._make({a: c for a, c in r.terms if c % g}, r.const)
                slo, shi = small.bounds
                if 0 <= slo and shi < g:
                    return q + Lin._make(big, 0) // (d // g)
        if len(r.terms) == 1 and not r.const and r.terms[0][1] == 1 and type(r.terms[0][0]) is Div:
            inner = r.terms[0][0]               # (x // a) // d = x // (a * d) (floor, a, d > 0)
            return q + Lin(((Div(inner.x, inner.d * d), 1),), 0)
        # (x % (d*m)) // d with a Mod atom: leave as is
        return q + Lin(((Div(r, d), 1),), 0)

    def __mod__(self, d: int) -> "Lin":
        assert d > 0
        if d == 1:
            return Lin.num(0)
        rest = {a: c % d for a, c in self.terms if c % d != 0}
        r = Lin._make(rest, self.const % d)
        lo, hi = r.bounds
        if lo >= 0 and hi < d:
            return r
        if lo // d == hi // d:
            return r - (lo // d) * d
        # (x % (d*m)) % d = x % d
        if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], Mod) \
                and r.terms[0][0].d % d == 0:
            return r.terms[0][0].x % d
        return Lin(((Mod(r, d), 1),), 0)


def _recombine(terms: dict, const: int) -> int:
    """Fold ``k*d*(x // d) + k*(x % d)`` in ``terms`` back into ``k*x`` (exact under floor
    semantics for every ``x``), in place, until none is left; returns the new constant. A loop over
    merged output axes (lower/collapse.py ``merge_axes``) reads each axis of the original shape as
    a division and a modulo of the merged variable: a contiguous operand's index then folds back to
    the merged variable itself, and LLVM sees a unit-stride loop. Also ``k*d*(x // d) + k*(y % d)``
    where ``x - y`` is a multiple of ``d`` (``_congruent_div``)."""
    changed = True
    while changed:
        changed = False
        for m, k in list(terms.items()):
            if type(m) is not Mod or not k:
                continue
            q = m.x // m.d
            if len(q.terms) == 1 and q.terms[0][1] == 1 and terms.get(q.terms[0][0], 0) == k * m.d:
                dv = q.terms[0][0]
                del terms[m]
                del terms[dv]
                # k*x = k*d*(x//d) + k*(x%d), and x//d = dv + q.const
                for a, c in m.x.terms:
                    terms[a] = terms.get(a, 0) + k * c
                const += k * m.x.const - k * m.d * q.const
                changed = True
                break
            dv = _congruent_div(terms, m, k)
            if dv is not None:
                # x % d == y % d where x - y is a multiple of d: k*d*(x//d) + k*(y%d) = k*x
                del terms[m]
                del terms[dv]
                for a, c in dv.x.terms:
                    terms[a] = terms.get(a, 0) + k * c
                const += k * dv.x.const
                changed = True
                break
    return const


def _congruent_div(terms: dict, m: "Mod", k: int) -> "Div | None":
    """A ``Div`` atom ``x // d`` of ``terms`` with coefficient ``k*d`` whose ``x`` differs from the
    modulo ``m = y % d``'s ``y`` by a multiple of ``d`` in every coefficient and the constant, or
    None. The modulo's own simplification reduces coefficients modulo ``d`` (``(1024*b + r) % 384``
    is ``(256*b + r) % 384``) where the division keeps them: a sum blocked over a merged axis
    (lower/collapse.py ``merge_reduced``) reads ``384*((1024*b + r)//384) + (256*b + r)%384``,
    which is ``1024*b + r``."""
    d, y = m.d, dict(m.x.terms)
    for a, c in terms.items():
        if type(a) is not Div or a.d != d or c != k * d or (a.x.const - m.x.const) % d:
            continue
        x = dict(a.x.terms)
        if all((x.get(v, 0) - y.get(v, 0)) % d == 0 for v in x.keys() | y.keys()):
            return a
    return None


def _item_key(t: tuple) -> str:
    return _sort_key(t[0])


_NUMS = {v: Lin((), v) for v in range(-64, 1025)}     # the constants index expressions use most


def _split_constant(const: int, rest_lo: int, d: int) -> tuple[int, int]:
    """``(q, r)`` with ``const = q * d + r`` and the smallest ``r`` that keeps a residual numerator
    ``rest + r`` non-negative (``rest >= rest_lo``): the usual ``divmod`` when the rest is >= 0. Any
    split is exact under floor division; this one also makes truncating division exact."""
    r = -rest_lo + (const + rest_lo) % d
    return (const - r) // d, r


def substitute_free(x: Lin) -> set[str]:
    """Names of the loop variables an expression depends on."""
    out: set[str] = set()
    for a, _ in x.terms:
        if isinstance(a, Var):
            out.add(a.name)
        else:
            out |= substitute_free(a.x)
    return out
