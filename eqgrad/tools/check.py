"""The soundness checker: every rewrite is tried on random concrete instances of its left side.

For each rule, ``check_rule``:

1. builds random *instances* of the rule's left-hand pattern (and, for a ``birewrite``, of its
   right-hand pattern too, so that both directions are checked): each tensor variable becomes a
   random buffer, constant or parameter, each attribute variable a random value consistent with the
   shapes (a valid permutation, a reshape with the same element count, axes to reduce, pads, ...),
   biased towards the cases guards ask for (identity permutations, unchanged shapes); guards that
   state shapes (``vec-of``, ``vec-get``, ``vec-length`` and ``shape`` equations) choose the sizes
   of the term, its operands and its reshape and broadcast targets (:class:`Guides`). Shapes are
   small (0-d up to rank 5, sizes 1-3) so a failure is a small counterexample. A term a rule builds
   that the op table rejects (``ops.attr_error``), or of another shape than its class, is unsound;
2. fills them with values: the first ``SPECIAL_INSTANCES`` instances take every leaf element,
   constant and parameter from the dtype's *special values* (``F_SPECIAL``/``I_SPECIAL``: +-0,
   float32 subnormals down to the smallest 1.4e-45, the smallest normal, +-inf, NaN, +-float32 max;
   INT_MIN/INT_MAX), dealt from a shuffled deck so that every special value occurs, in varying
   combinations; the rest mix edge values with random ones;
3. runs the rule on each instance in an e-graph of its own (with only this rule and the analyses;
   egglog evaluates the guards, so an instance that does not satisfy them simply does not fire).
   For speed, instances that share no term are inserted into one egglog e-graph and run together;
   afterwards every e-class is checked to be reachable from one instance only -- the e-graph is then
   the disjoint union of the instances' own e-graphs, exactly what separate runs would give. An
   instance whose part touches another's (a rule's result hash-consed to a term of another instance,
   a shared constant merged) is run again alone;
4. evaluates every e-node of every e-class with the op table's NumPy references and compares the
   nodes of each class: a rule is unsound when it put two nodes with different values in one class.

The report for an unsound rule is its smallest failing instance: the term (in the e-graph of that
instance alone), its inputs, and the values of the two sides. A rule whose guards no instance
satisfied is reported as *untested*, and so is a birewrite one of whose directions never fired.

Comparison: floats are *close* when both are NaN, when they are equal with the same sign (0 and -0
differ), or when both are finite, not both zero, and ``|a - b| <= atol + rtol * |b|`` (defaults
``RTOL = 1e-5``, ``ATOL = 1e-6``: float32 rounding of a reordered computation passes, a
different value does not; note that ``atol`` also accepts a subnormal flushed to 0). Integers and
bools compare exactly. ``check_rule(..., rtol=, atol=)`` and ``rules check --rtol/--atol`` change
the tolerance.

Annotations (a ``;; check: A, B`` comment before a rule):

- ``finite``: inputs restricted to moderate finite values -- +-0, +-1, 0.5, 2 and normal values of
  magnitude below ~10 (no inf, NaN, extremes, and no subnormals: their reciprocals overflow), int32
  values far from INT_MIN/INT_MAX -- for rules that are only claimed sound away from overflow,
  underflow and NaN (say so in the rule's comment);
- ``subnormal``: with ``finite``, keep the float32 subnormals among the inputs;
- ``zerosign``: +0 and -0 compare equal -- for rules that reassociate a sum of products (the sign
  of a zero sum depends on the order its terms are added in: (-0 * 1) + (-0 * -1) is +0, while
  -0 * (1 + -1) is -0), claimed sound up to the sign of zero as a BLAS is;
- ``exact``: no tolerance: the two sides must be bit-for-bit equal (any NaN equals any NaN).

Integer index arithmetic (permutation composition) is checked exhaustively for small ranks by the
same machinery: every permutation pair of rank <= 3 among the instances and 40 random ones of each
of ranks 4 and 5 (for a rank a guard fixes: every pair while there are at most 2000, else 200).
"""
from __future__ import annotations

import itertools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqgrad.dtype import DTYPES, DType, bool_, cast_scalar, float32, int32
from eqgrad.ops import EGG_TO_OP, OPS, OpDef, attr_error
from eqgrad.rules.rulebook import Rule
from eqgrad.rules.ranks import base_name, rank_of
from eqgrad.rules.sexpr import SExpr, SList, Str, Sym
from eqgrad.rules.saturate import Saturator
from eqgrad.extract.egraph import from_json
from eqgrad.rules.rulebook import RuleConfig
from eqgrad.rules.ir import fmt_attrs, fmt_f64, fmt_vec


class Retry(Exception):
    """This random choice cannot satisfy the pattern; try another."""


@dataclass(eq=False)
class Inst:
    op: str                                  # op-table name
    kids: tuple["Inst", ...]
    arg: Any
    shape: tuple[int, ...]
    dtype: DType
    value: np.ndarray
    name: str = ""                           # let name once emitted

    def text(self, leaves: dict[int, str]) -> str:
        """egglog text of this instance (leaves by their let names)."""
        if id(self) in leaves:
            return leaves[id(self)]
        o = OPS[self.op]
        if self.op == "CONST":
            v = float(self.arg)
            c = f'(Const {fmt_f64(abs(v) if v == 0 else v)} "{self.dtype.name}" {fmt_vec(self.shape)})'
            return f"(Neg {c})" if v == 0 and math.copysign(1.0, v) < 0 else c
        if self.op == "SIZE":
            return f'(Size {int(self.arg)} "{self.dtype.name}" {fmt_vec(self.shape)})'
        if self.op == "PARAM":          # (a counterexample's text; _run numbers the parameters)
            return f'(Param {float(self.arg)!r} "{self.dtype.name}" {fmt_vec(self.shape)})'
        return f"({o.egg} {' '.join([k.text(leaves) for k in self.kids] + fmt_attrs(o, self.arg))})"


@dataclass
class Counterexample:
    instance: str
    inputs: dict[str, Any]
    lhs: Any
    rhs: Any
    node: str
    size: int
    direction: str = ""                       # a birewrite's: "=>" (left to right) or "<=" (right to left)

    def __str__(self) -> str:
        ins = "\n".join(f"      {k} = {_show(v)}" for k, v in self.inputs.items())
        ins = ins or "      (none: constants only)"
        way = f" (direction {self.direction})" if self.direction else ""
        text = (f"    instance{way}: {self.instance}\n    inputs:\n{ins}\n"
                f"    left side  = {_show(self.lhs)}\n"
                f"    right side = {_show(self.rhs)}   (from {self.node})")
        a, b = np.asarray(self.lhs), np.asarray(self.rhs)
        if a.shape == b.shape and a.dtype == b.dtype and a.size > 1:
            with np.errstate(invalid="ignore"):
                diff = ~((a == b) | (a != a) & (b != b)) | (np.signbit(a) != np.signbit(b) if a.dtype.kind == "f" else False)
            if diff.any():
                i = tuple(int(x) for x in np.argwhere(diff)[0])
                text += f"\n    first difference at {list(i)}: {a[i]} against {b[i]}"
        return text


def _show(v) -> str:
    """A value on one line: its elements flattened (the shape is in the input's name)."""
    a = np.asarray(v)
    if a.dtype.kind not in "fiub":
        return str(v)
    body = np.array2string(a.reshape(-1), threshold=24, max_line_width=10**6)
    return body if a.ndim <= 1 else f"{body} (shape {list(a.shape)})"


@dataclass
class CheckResult:
    rule: Rule
    status: str                      # sound | unsound | untested | skipped
    instances: int = 0
    fired: int = 0
    counterexample: Counterexample | None = None
    note: str = ""

    def __str__(self) -> str:
        head = f"{self.status.upper():9} {self.rule.name:<28} {self.rule.where}  " \
               f"({self.instances} instances, {self.fired} matches{', ' + self.note if self.note else ''})"
        return head + ("\n" + str(self.counterexample) if self.counterexample else "")


# ------------------------------------------------------------------ random values

RTOL, ATOL = 1e-5, 1e-6           # the default tolerance of float comparisons (module docstring)
DEFAULT_N = 64                    # instances per rule (per direction of a birewrite)
SPECIAL_INSTANCES = 24            # the first instances: values from the special sets only
MAX_RANK = 5

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)               # the smallest normal, 1.18e-38
F32_SUBNORMAL = [float(np.float32(x)) for x in (1.4e-45, -1.4e-45, 1e-40, -3e-39)]
# special values, always sampled (the first SPECIAL_INSTANCES instances draw only from these)
F_SPECIAL = [0.0, -0.0, *F32_SUBNORMAL, F32_TINY, np.inf, -np.inf, np.nan, F32_MAX, -F32_MAX, 1.0, -1.0]
I_SPECIAL = [0, 1, -1, 2**31 - 1, -2**31, 2**31 - 2, -2**31 + 1]
B_SPECIAL = [False, True]
# moderate edge values: mixed with random ones after the special instances
F_EDGE = F_SPECIAL + [2.0, 0.5, -3.5, 3.0, 1e30, -1e30, 1e-30, 1e-20]
I_EDGE = I_SPECIAL + [2, -2, 7, -7, 3]
# `;; check: finite`: moderate finite values (no inf/NaN/extremes, no -0.0; subnormals only with
# `subnormal`); random ones are normal with standard deviation 2
F_FINITE = [0.0, 1.0, -1.0, 0.5, 2.0, -3.5]
I_FINITE = [0, 1, -1, 2, -3, 5]


class Sampler:
    """Random values for instances. ``special``: every value from the dtype's special set, dealt
    from a shuffled deck (``decks``, shared by the instances of a rule) so that all of them occur."""

    def __init__(self, rng: np.random.Generator, finite: bool, special: bool = False,
                 decks: dict | None = None, subnormal: bool = False):
        self.rng, self.finite, self.special = rng, finite, special
        self.decks = decks if decks is not None else {}
        self.subnormal = subnormal

    def _special_set(self, dt: DType) -> list:
        if dt is bool_:
            return B_SPECIAL
        if dt is int32:
            return I_FINITE if self.finite else I_SPECIAL
        if self.finite:
            return F_FINITE + (F32_SUBNORMAL if self.subnormal else [])
        return F_SPECIAL

    def _deal(self, n: int, dt: DType) -> np.ndarray:
        pool = self._special_set(dt)
        deck = self.decks.setdefault(dt.name, [])
        out = []
        while len(out) < n:
            if not deck:
                deck.extend(pool[i] for i in self.rng.permutation(len(pool)))
            out.append(deck.pop())
        return np.array(out, dtype=np.float64 if dt.is_float else object)

    def data(self, shape: tuple[int, ...], dt: DType) -> np.ndarray:
        n = math.prod(shape)
        r = self.rng
        if self.special:
            a = self._deal(n, dt)
            if self.finite and dt is float32:      # moderate values are not special: mix in random ones
                a = np.where(r.random(n) < 0.5, a, r.standard_normal(n) * 2)
            if dt is bool_:
                return a.astype(bool).reshape(shape)
            if dt is int32:
                return a.astype(np.int64).astype(np.int32).reshape(shape)
            return a.astype(np.float32).reshape(shape)
        if dt is bool_:
            return r.random(shape) < 0.5
        if dt is int32:
            pool = I_FINITE if self.finite else I_EDGE
            a = np.where(r.random(n) < 0.5, r.choice(pool, n), r.integers(-9, 10, n))
            return a.astype(np.int32).reshape(shape)
        if self.finite:
            pool = F_FINITE + (F32_SUBNORMAL if self.subnormal else [])
            a = np.where(r.random(n) < 0.3, r.choice(pool, n), r.standard_normal(n) * 2)
        else:
            a = np.where(r.random(n) < 0.5, r.choice(F_EDGE, n), r.standard_normal(n) * 3)
        return a.astype(np.float32).reshape(shape)

    def scalar(self, dt: DType) -> float | int | bool:
        return self.data((), dt).item()

    def shape(self) -> tuple[int, ...]:
        if self.special:       # a few elements more: more combinations of the special values
            if self.chance(0.7):
                return tuple(int(x) for x in self.rng.integers(2, 4, int(self.rng.choice([1, 2, 2, 3]))))
        rank = int(self.rng.choice([0, 1, 2, 2, 3, 3, 4, 5]))
        return tuple(int(x) for x in self.rng.integers(1, 4 if rank <= 3 else 3, rank))

    def dtype(self) -> DType:
        if self.special:       # float32 has the most special values
            return [float32, float32, float32, int32, bool_][int(self.rng.integers(5))]
        return [float32, float32, int32, bool_][int(self.rng.integers(4))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


def _factorizations(n: int, rng: np.random.Generator) -> tuple[int, ...]:
    """A random shape with ``n`` elements, rank 1-MAX_RANK."""
    dims, rest = [], n
    for _ in range(int(rng.integers(0, MAX_RANK))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = int(rng.choice(divs))
        dims.append(d)
        rest //= d
    dims.append(rest)
    return tuple(dims)


# ------------------------------------------------------------------ building instances from a pattern

class Guides:
    """What a rule's guards say about the shapes of its variables, read so that instances are drawn
    that can satisfy them (a rule over a product of products guards half a dozen shapes; drawn
    blind, not one instance in thousands fits): ``(= V (vec-of ...))`` and ``(= (shape X) (vec-of
    ...))`` define a vector, or a tensor variable's shape, from integer variables; ``(= i (vec-get
    V j))`` names V's elements (and, with ``(= (vec-length V) L)``, defines V from them). The
    guards themselves are still egglog's to evaluate: an instance that misses them does not fire."""

    def __init__(self, guards: list[SExpr]):
        self.vec: dict[str, SList] = {}
        self.shape: dict[str, SList] = {}
        gets: dict[str, dict[int, str]] = {}
        length: dict[str, int] = {}
        for g in guards:
            if not (isinstance(g, SList) and g.head == "=" and len(g) == 3):
                continue
            for x, y in ((g[1], g[2]), (g[2], g[1])):
                if isinstance(y, SList) and y.head == "vec-of" and isinstance(x, Sym):
                    self.vec[x.name] = y
                elif isinstance(y, SList) and y.head == "vec-of" and isinstance(x, SList) and x.head == "shape" \
                        and isinstance(x[1], Sym):
                    self.shape[x[1].name] = y
                elif isinstance(x, Sym) and isinstance(y, SList) and y.head == "vec-get" and len(y) == 3 \
                        and isinstance(y[1], Sym) and isinstance(y[2], int):
                    gets.setdefault(y[1].name, {})[y[2]] = x.name
                elif isinstance(x, SList) and x.head == "vec-length" and isinstance(x[1], Sym) and isinstance(y, int):
                    length[x[1].name] = y
        for v, idx in gets.items():
            if v not in self.vec and length.get(v) is not None and set(idx) == set(range(length[v])):
                self.vec[v] = SList([Sym("vec-of")] + [Sym(idx[i]) for i in range(length[v])])


class Builder:
    def __init__(self, sampler: Sampler, guides: Guides | None = None):
        self.s = sampler
        self.g = guides or Guides([])
        self.env: dict[str, Any] = {}
        self.leaves: list[Inst] = []
        self.pad_after: tuple[int, ...] | None = None     # a Shrink's wish for the Pad below it

    def _int(self, e: SExpr, sample: bool) -> int:
        """An integer of a guard's vector: a literal, or an integer variable (drawn from 1-3 when
        unbound and ``sample``)."""
        if isinstance(e, int):
            return e
        if isinstance(e, Sym):
            if e.name not in self.env and sample:       # 1 seldom: a size-1 axis hides most index mix-ups
                self.env[e.name] = int(self.s.rng.choice((1, 2, 3), p=(0.2, 0.4, 0.4)))
            v = self.env.get(e.name)
            if isinstance(v, int):
                return v
        raise Retry

    def _guided(self, e: SList | None, sample: bool) -> tuple[int, ...] | None:
        if e is None:
            return None
        try:
            return tuple(self._int(x, sample) for x in e.items[1:])
        except Retry:
            return None

    def _unify(self, name: str, value) -> None:
        """Bind the integer variables that a guard's definition of vector ``name`` names."""
        e = self.g.vec.get(name)
        if e is not None and isinstance(value, tuple) and len(e.items) - 1 == len(value):
            for x, v in zip(e.items[1:], value):
                if isinstance(x, Sym) and x.name not in self.env:
                    self.env[x.name] = int(v)

    def wanted(self, pat: SExpr) -> tuple[int, ...] | None:
        """The shape the guards want term ``pat`` to have, or None when they do not say."""
        if isinstance(pat, Sym):
            v = self.env.get(pat.name)
            return v.shape if isinstance(v, Inst) else self._guided(self.g.shape.get(pat.name), True)
        if not isinstance(pat, SList) or pat.head not in EGG_TO_OP:
            return None
        o, args = EGG_TO_OP[pat.head], pat.items[1:]
        if o.name in ("EXPAND", "RESHAPE"):
            return self._vector(args[1])
        if o.name == "PERMUTE":
            w, perm = self.wanted(args[0]), self._vector(args[1])
            ok = w is not None and perm is not None and sorted(perm) == list(range(len(w)))
            return tuple(w[i] for i in perm) if ok else None
        if o.kind in ("unary", "binary", "ternary", "boundary") and o.name not in ("CMPLT", "CMPEQ", "CAST", "BITCAST"):
            return next((w for w in map(self.wanted, args[:o.arity]) if w is not None), None)
        if o.kind == "reduce":
            w, axes = self.wanted(args[0]), self._vector(args[1])
            return None if w is None or axes is None else tuple(1 if d in axes else x for d, x in enumerate(w))
        return None

    def _vector(self, pat: SExpr) -> tuple[int, ...] | None:
        if isinstance(pat, Sym):
            v = self.env.get(pat.name)
            return tuple(v) if isinstance(v, tuple) else self._guided(self.g.vec.get(pat.name), True)
        try:
            v = _literal(pat)
        except Retry:            # a computed attribute: the guards do not say
            return None
        return tuple(v) if isinstance(v, tuple) else None

    def attr(self, pat: SExpr, make, check=None):
        """Resolve an attribute position: a literal, a bound variable, the value a guard defines
        it as (when all its integers are bound), or a fresh random value."""
        if isinstance(pat, Sym):
            if pat.name in self.env:
                v = self.env[pat.name]
                if check is not None and not check(v):
                    raise Retry
                return v
            v = self._guided(self.g.vec.get(pat.name), False)
            if v is None or (check is not None and not check(v)):
                v = make()
            self.env[pat.name] = v
            self._unify(pat.name, tuple(v) if isinstance(v, (tuple, list)) else v)
            return v
        v = _literal(pat)
        if check is not None and not check(v):
            raise Retry
        return v

    def leaf(self, shape: tuple[int, ...], dt: DType) -> Inst:
        if self.s.chance(0.15):
            v = cast_scalar(self.s.scalar(dt), dt)
            return Inst("CONST", (), v, shape, dt, np.full(shape, v, dt.np))
        if dt.is_float and self.s.chance(0.1):          # a runtime parameter: a value no rule can see
            v = cast_scalar(self.s.scalar(dt), dt)
            return Inst("PARAM", (), v, shape, dt, np.full(shape, v, dt.np))
        inst = Inst("BUF", (), None, shape, dt, self.s.data(shape, dt))
        self.leaves.append(inst)
        return inst

    def build(self, pat: SExpr, shape: tuple[int, ...], dt: DType) -> Inst:
        if isinstance(pat, Sym):
            if pat.name in self.env:
                v = self.env[pat.name]
                if not isinstance(v, Inst) or v.shape != shape or v.dtype != dt:
                    raise Retry
                return v
            inst = self.leaf(shape, dt)
            self.env[pat.name] = inst
            return inst
        if not isinstance(pat, SList) or pat.head not in EGG_TO_OP:
            raise Retry
        o = EGG_TO_OP[pat.head]
        args = pat.items[1:]
        kids_p, attrs_p = args[:o.arity], args[o.arity:]
        return getattr(self, f"_{o.kind}")(o, kids_p, attrs_p, shape, dt)

    def _make(self, o: OpDef, kids: list[Inst], arg: Any, dt: DType) -> Inst:
        vals = [k.value for k in kids]
        out = o.ref(vals, arg, dt)
        return Inst(o.name, tuple(kids), arg, tuple(out.shape), dt, out)

    # leaves in patterns
    def _leaf(self, o, kids_p, attrs_p, shape, dt):
        if o.name == "CONST":
            v_p, d_p, s_p = attrs_p
            d = self.attr(d_p, lambda: dt.name, lambda d: d == dt.name)
            self.attr(s_p, lambda: shape, lambda s: tuple(s) == shape)
            v = self.attr(v_p, lambda: float(self.s.scalar(dt)))
            v = cast_scalar(v, DTYPES[d])
            return Inst("CONST", (), v, shape, dt, np.full(shape, v, dt.np))
        if o.name == "SIZE":              # a size as a constant: a non-negative integer
            n_p, d_p, s_p = attrs_p
            d = self.attr(d_p, lambda: dt.name, lambda d: d == dt.name)
            self.attr(s_p, lambda: shape, lambda s: tuple(s) == shape)
            n = self.attr(n_p, lambda: int(self.s.rng.integers(0, 9)), lambda n: isinstance(n, int) and n >= 0)
            v = cast_scalar(n, DTYPES[d])
            return Inst("SIZE", (), n, shape, dt, np.full(shape, v, dt.np))
        if o.name == "PARAM":
            _, d_p, s_p = attrs_p                     # the index is _run's to number
            self.attr(d_p, lambda: dt.name, lambda d: d == dt.name and dt.is_float)
            self.attr(s_p, lambda: shape, lambda s: tuple(s) == shape)
            v = cast_scalar(self.s.scalar(dt), dt)
            return Inst("PARAM", (), v, shape, dt, np.full(shape, v, dt.np))
        return self.leaf(shape, dt)

    def _elementwise(self, o, kids_p, attrs_p, shape, dt):
        allowed = {"f": float32, "i": int32, "b": bool_}
        if o.name in ("CMPLT", "CMPEQ"):
            if dt is not bool_:
                raise Retry
            src = [allowed[k] for k in o.dtypes][int(self.s.rng.integers(len(o.dtypes)))]
            kids = [self.build(k, shape, src) for k in kids_p]
            return self._make(o, kids, None, bool_)
        if o.name == "CAST":
            d = self.attr(attrs_p[0], lambda: dt.name, lambda d: d == dt.name)
            src = self.s.dtype()
            kid = self.build(kids_p[0], shape, src)
            return self._make(o, [kid], DTYPES[d], dt)
        if o.name == "BITCAST":                  # float32 <-> int32, the instance dtypes of one width
            d = self.attr(attrs_p[0], lambda: dt.name, lambda d: d == dt.name)
            if dt not in (float32, int32):
                raise Retry
            kid = self.build(kids_p[0], shape, int32 if dt is float32 else float32)
            return self._make(o, [kid], DTYPES[d], dt)
        if o.name == "WHERE":
            kids = [self.build(kids_p[0], shape, bool_), self.build(kids_p[1], shape, dt),
                    self.build(kids_p[2], shape, dt)]
            return self._make(o, kids, None, dt)
        if dt not in [allowed[k] for k in o.dtypes]:
            raise Retry
        return self._make(o, [self.build(k, shape, dt) for k in kids_p], None, dt)

    _unary = _binary = _ternary = _elementwise

    def _reduce(self, o, kids_p, attrs_p, shape, dt):
        ones = [d for d, s in enumerate(shape) if s == 1]
        if not ones:
            raise Retry

        def make():
            k = int(self.s.rng.integers(1, len(ones) + 1))
            return tuple(sorted(int(x) for x in self.s.rng.choice(ones, k, replace=False)))
        axes = tuple(self.attr(attrs_p[0], make, lambda a: len(a) > 0 and all(x in ones for x in a)))
        want = self.wanted(kids_p[0])
        src_shape = want if want is not None and len(want) == len(shape) and \
            all(w == s for d, (w, s) in enumerate(zip(want, shape)) if d not in axes) else \
            tuple(int(self.s.rng.integers(1, 4)) if d in axes else s for d, s in enumerate(shape))
        if o.name == "RSUM" and dt is bool_ and self.s.chance(0.5):
            raise Retry
        kid = self.build(kids_p[0], src_shape, dt)
        return self._make(o, [kid], axes, dt)

    def _movement(self, o, kids_p, attrs_p, shape, dt):
        rng, n = self.s.rng, len(shape)
        kid_pat = kids_p[0]
        bound = self.env.get(kid_pat.name) if isinstance(kid_pat, Sym) else None
        if o.name == "RESHAPE":
            self.attr(attrs_p[0], lambda: shape, lambda s: tuple(s) == shape)
            want = None if isinstance(bound, Inst) else self.wanted(kid_pat)
            src = bound.shape if isinstance(bound, Inst) else want if want is not None and \
                math.prod(want) == math.prod(shape) else \
                (shape if self.s.chance(0.3) else _factorizations(math.prod(shape), rng))
            if math.prod(src) != math.prod(shape):
                raise Retry
            return self._make(o, [self.build(kid_pat, tuple(src), dt)], shape, dt)
        if o.name == "EXPAND":
            self.attr(attrs_p[0], lambda: shape, lambda s: tuple(s) == shape)
            want = None if isinstance(bound, Inst) else self.wanted(kid_pat)
            src = bound.shape if isinstance(bound, Inst) else want if want is not None and len(want) == n and \
                all(a == b or a == 1 for a, b in zip(want, shape)) else \
                tuple(1 if self.s.chance(0.5) else s for s in shape)
            if len(src) != n or any(a != b and a != 1 for a, b in zip(src, shape)):
                raise Retry
            return self._make(o, [self.build(kid_pat, tuple(src), dt)], shape, dt)
        if o.name == "PERMUTE":
            def make():
                return tuple(range(n)) if self.s.chance(0.3) else tuple(int(x) for x in rng.permutation(n))
            p = tuple(self.attr(attrs_p[0], make, lambda p: sorted(p) == list(range(n))))
            src = [0] * n
            for i, q in enumerate(p):
                src[q] = shape[i]
            return self._make(o, [self.build(kid_pat, tuple(src), dt)], p, dt)
        if o.name == "FLIP":
            axes = tuple(self.attr(attrs_p[0], lambda: tuple(d for d in range(n) if self.s.chance(0.5)),
                                   lambda a: all(0 <= x < n for x in a)))
            return self._make(o, [self.build(kid_pat, shape, dt)], tuple(sorted(axes)), dt)
        if o.name == "PAD":
            before = tuple(self.attr(attrs_p[0], lambda: tuple(int(rng.integers(0, min(2, s) + 1)) for s in shape),
                                     lambda b: len(b) == n))
            hint, self.pad_after = self.pad_after, None      # from a Shrink over this Pad (above)
            after = tuple(self.attr(attrs_p[1], lambda: hint if hint is not None and len(hint) == n else
                                    tuple(int(rng.integers(0, 2)) for _ in shape), lambda a: len(a) == n))
            src = tuple(s - b - a for s, b, a in zip(shape, before, after))
            if any(x < 0 for x in src):
                raise Retry
            return self._make(o, [self.build(kid_pat, src, dt)], (before, after), dt)
        if o.name == "SHRINK":
            extra = [int(rng.integers(0, 3)) for _ in shape]
            cut = None
            if isinstance(kid_pat, SList) and kid_pat.head == "Pad" and self.s.chance(0.5):
                # biased, half the time: a shrink that cuts exactly the padding of the pad below it (what
                # a shrink-of-pad rule's guards ask for; unbiased, ~1 rank-5 instance in 250 was one)
                cut = tuple(int(rng.integers(0, 2)) for _ in shape)
                extra = [int(rng.integers(0, 2)) for _ in shape]
                self.pad_after = tuple(extra)
            starts = tuple(self.attr(attrs_p[0], lambda: cut if cut is not None else
                                     tuple(int(rng.integers(0, e + 1)) for e in extra), lambda b: len(b) == n))
            ends = tuple(self.attr(attrs_p[1], lambda: tuple(b + s for b, s in zip(starts, shape)),
                                   lambda e: len(e) == n and all(x - y == s for x, y, s in zip(e, starts, shape))))
            src = tuple(e + x for e, x in zip(ends, extra))
            return self._make(o, [self.build(kid_pat, src, dt)], (starts, ends), dt)
        raise Retry

    def _boundary(self, o, kids_p, attrs_p, shape, dt):
        return self._make(o, [self.build(kids_p[0], shape, dt)], None, dt)


def _literal(pat: SExpr) -> Any:
    if isinstance(pat, Str):
        return pat.value
    if isinstance(pat, (int, float)):
        return pat
    if isinstance(pat, SList) and pat.head in ("vec-of", "vec-empty"):
        return tuple(int(x) for x in pat.items[1:])
    raise Retry      # a computed attribute in a left side: not instantiable by sampling


# ------------------------------------------------------------------ running one rule

Tol = "tuple[float, float, bool] | None"   # (rtol, atol, zerosign), or None: exact


def _close(a: np.ndarray, b: np.ndarray, dt: DType, tol=(RTOL, ATOL)) -> np.ndarray:
    if dt.is_float:
        with np.errstate(invalid="ignore", over="ignore"):
            return _close_float(a, b, *tol) if tol is not None else _same_float(a, b)
    return a == b


def _same_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit-for-bit equality of float arrays, except that any NaN equals any NaN."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)       # exact for float32
    return (np.isnan(a64) & np.isnan(b64)) | ((a64 == b64) & (np.signbit(a64) == np.signbit(b64)))


def _close_float(a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL,
                 zerosign: bool = False) -> np.ndarray:
    """``zerosign``: +0 and -0 are equal (a rule annotated ``zerosign``)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = np.abs(a64 - b64) <= atol + rtol * np.abs(b64)
    zeros = (a64 == 0) & (b64 == 0) if zerosign else False
    return _same_float(a, b) | zeros | (tol & np.isfinite(a64) & np.isfinite(b64) & ((a64 != 0) | (b64 != 0)))


@dataclass
class _Case:
    """One instance: its term and which side of the rule it instantiates (0: left, 1: a birewrite's right)."""
    inst: Inst
    side: int


def check_rule(rule: Rule, n: int = DEFAULT_N, seed: int = 0, saturator=None,
               rtol: float = RTOL, atol: float = ATOL) -> CheckResult:
    """Check ``rule`` on ``n`` random instances of its left side (and ``n`` of its right side for a
    birewrite); floats compare within ``rtol``/``atol`` unless the rule is annotated ``exact``."""
    if rule.rhs is None:
        return CheckResult(rule, "skipped", note="sets analysis facts only (checked by no-merge)")
    finite = "finite" in rule.check
    tol = None if "exact" in rule.check else (rtol, atol, "zerosign" in rule.check)
    rng = np.random.default_rng(seed)
    decks: dict = {}

    def sampler(special: bool) -> Sampler:
        return Sampler(rng, finite, special, decks, "subnormal" in rule.check)

    cases: list[_Case] = []
    guides = Guides(rule.guards)
    sides = [rule.lhs] + ([rule.rhs] if rule.kind == "birewrite" else [])
    rank = rank_of(rule.name)           # a rank-generic rule's expansion: instances of its rank
    rank = _rank_hint(rule.guards) if rank is None else rank
    for side, pat in enumerate(sides):
        perm_vars = _permute_vars(pat)
        if not perm_vars:
            continue
        # index arithmetic on permutations: for a rank the guards fix, every assignment while there
        # are at most 2000 (exhaustive up to rank 4 for two permutes), a random 200 beyond; without
        # one, every assignment up to rank 3 and a random 40 of each of ranks 4 and 5
        for r in ([rank] if rank is not None else range(1, MAX_RANK + 1)):
            total = math.factorial(r) ** len(perm_vars)
            limit = 2000 if rank is not None else 300
            combos = itertools.product(itertools.permutations(range(r)), repeat=len(perm_vars)) if total <= limit \
                else (tuple(tuple(int(x) for x in rng.permutation(r)) for _ in perm_vars)
                      for _ in range(200 if rank is not None else 40))
            for combo in combos:
                b = Builder(sampler(False), guides)
                b.env.update(dict(zip(perm_vars, combo)))
                try:
                    cases.append(_Case(b.build(pat, tuple(int(x) for x in rng.integers(1, 3, r)), b.s.dtype()), side))
                except Retry:
                    pass
    built = [0] * len(sides)          # random instances built per side; the first ones are special
    tries = [0] * len(sides)
    while True:
        live = [s for s in range(len(sides)) if built[s] < n and tries[s] < n * 40]
        if not live:
            break
        side = min(live, key=lambda s: built[s])
        tries[side] += 1
        b = Builder(sampler(built[side] < SPECIAL_INSTANCES), guides)
        try:
            dt = b.s.dtype()
            shape = b.s.shape() if rank is None else tuple(int(x) for x in rng.integers(1, 3, rank))
            want = b.wanted(sides[side])          # the guards' shape for the whole term, if they say
            shape = want if want is not None and (rank is None or len(want) == rank) else shape
            cases.append(_Case(b.build(sides[side], shape, dt), side))
            built[side] += 1
        except Retry:
            continue
    if not cases:
        return CheckResult(rule, "untested", note="could not build any instance of the left side")
    sat = saturator or Saturator()
    try:
        failures, fired, err = _run_isolated(rule, cases, sat, tol)
    finally:
        if saturator is None:
            sat.close()
    if err:
        return CheckResult(rule, "untested", len(cases), note=f"egglog stopped: {err[:300]}")
    total = sum(fired.values())
    note = "exact" if tol is None else ""
    if failures:
        best = min(failures, key=lambda f: f.size)
        return CheckResult(rule, "unsound", len(cases), total, best, note=note)
    if total == 0:
        return CheckResult(rule, "untested", len(cases), 0, note="no instance satisfied the rule's guards")
    if rule.kind == "birewrite":
        for way, what, side in (("=>", "left to right", 0), ("<=", "right to left", 1)):
            if not fired.get(way):
                why = "no instance of its right side could be built" if way == "<=" and not \
                    any(c.side == 1 for c in cases) else "no instance satisfied the rule's guards"
                return CheckResult(rule, "untested", len(cases), total,
                                   note=f"direction {way} ({what}) never fired: {why}")
        note = ", ".join([f"{fired['=>']} =>, {fired['<=']} <="] + ([note] if note else []))
    return CheckResult(rule, "sound", len(cases), total, note=note)


BATCH = 96          # the most instances run in one egglog e-graph (each in a part of its own)


def _batches(cases: list[_Case]) -> list[list[_Case]]:
    """Group instances that share no term (so no part of one e-graph is hash-consed with another's):
    buffers and parameters are numbered apart, so only terms made of constants can be shared."""
    out: list[tuple[set[str], list[_Case]]] = []
    for c in cases:
        keys = _const_terms(c.inst)
        for used, group in out:
            if len(group) < BATCH and not (keys & used):
                used |= keys
                group.append(c)
                break
        else:
            out.append((set(keys), [c]))
    return [g for _, g in out]


def _const_terms(inst: Inst) -> set[str]:
    """The text of every subterm of ``inst`` without a buffer or parameter in it."""
    out: set[str] = set()
    pure: dict[int, bool] = {}
    for x in _postorder(inst):
        pure[id(x)] = x.op not in ("BUF", "PARAM") and all(pure[id(k)] for k in x.kids)
        if pure[id(x)]:
            out.add(x.text({}))
    return out


def _run_isolated(rule: Rule, cases: list[_Case], sat, tol) -> tuple[list[Counterexample], dict[str, int], str | None]:
    """Run every instance in an e-graph of its own (batched where that is provably the same, see
    _run); the failures, the matches per direction ("=>"; "<=" too for a birewrite), and an egglog
    error that is not an Illegal merge."""
    failures: list[Counterexample] = []
    fired: dict[str, int] = {}
    alone: list[tuple[_Case, bool]] = []          # (instance, its matches are still to count)

    def count(m: dict[str, int]) -> None:
        for k, v in m.items():
            fired[k] = fired.get(k, 0) + v

    for batch in _batches(cases):
        f, m, tangled, err = _run(rule, batch, sat, tol)
        if err and "Illegal merge" in err and len(batch) > 1:
            alone += [(c, True) for c in batch]   # which instance makes it? each alone
        elif err and "Illegal merge" in err:
            failures.append(_illegal(batch[0], rule))
        elif err:
            return [], fired, err
        else:
            failures += f
            count(m)
            alone += [(c, False) for c in tangled]   # counted in the batch's matches already
    for c, uncounted in alone:
        f, m, _, err = _run(rule, [c], sat, tol)
        if err and "Illegal merge" in err:
            failures.append(_illegal(c, rule))
        elif err:
            return [], fired, err
        failures += f
        if uncounted:
            count(m)
    return failures, fired, None


def _illegal(c: _Case, rule: Rule) -> Counterexample:
    inst = c.inst
    return Counterexample(inst.text(_leaf_names(inst)), _inputs(inst), inst.value,
                          "(a value of another shape or dtype)", "an Illegal merge of shape/dtype",
                          sum(x.value.size for x in _postorder(inst)), _direction(rule, c.side))


def _direction(rule: Rule, side: int) -> str:
    return "" if rule.kind != "birewrite" else ("=>", "<=")[side]


def _run(rule: Rule, cases: list[_Case], sat, tol) -> tuple[list[Counterexample], dict[str, int], list[_Case], str | None]:
    """Insert the instances into one e-graph, run the rule alone, and compare the values of every
    class's nodes. Returns the failures, the matches per direction, the instances to run again
    alone (*tangled*: their part of the e-graph shares a class with another instance's, so the run
    is not the same as theirs alone; none of their failures is reported) and an egglog error.

    Every e-class is reachable from the let-bound terms of the instances whose parts hold it; when
    each class is reachable from one instance's terms only, the e-graph is the disjoint union of the
    instances' e-graphs: egglog's rules, analyses and rebuilding act on each part as on a graph of
    its own (a match is connected, a union joins the classes it merges, and classes only grow)."""
    lines: list[str] = []
    names: dict[int, str] = {}
    owner_of: dict[str, int] = {}          # let name -> instance index
    leaves_by_pos: list[Inst] = []
    params: list[Inst] = []
    for k, case in enumerate(cases):
        for j, node in enumerate(_postorder(case.inst)):
            if id(node) in names:
                continue
            if node.op == "BUF":
                text = f'(Buf {len(leaves_by_pos)} {_vec(node.shape)} "{node.dtype.name}")'
                leaves_by_pos.append(node)
            elif node.op == "PARAM":
                text = f'(Param {len(params)} "{node.dtype.name}" {_vec(node.shape)})'
                params.append(node)
            else:
                text = node.text(names)
            names[id(node)] = f"$i{k}n{j}"
            owner_of[names[id(node)]] = k
            lines.append(f"(let {names[id(node)]} {text})")
    with tempfile.TemporaryDirectory(prefix="eqgrad-check-") as tmp:
        rb = Path(tmp) / "rule.egg"
        body = rule.text.replace(f":ruleset {rule.ruleset}", ":ruleset check")
        rb.write_text(f"(ruleset check)\n{body}\n")
        sched = Path(tmp) / "schedule.egg"
        sched.write_text(";; phase analysis\n(run-schedule (saturate analysis))\n"
                         ";; phase check\n(run-schedule (repeat 2 (seq (run check) (saturate analysis))))\n")
        js, rep = sat.run("\n".join(lines) + "\n", timeout=120, node_limit=10**7,
                          rules=RuleConfig((str(rb),), str(sched)))
    if js is None:
        return [], {}, [], f"{rep.stop_reason}: {rep.detail}"
    m = rep.matches
    key = base_name(rule.name)          # a rank expansion's matches count as its template's (ranks.py)
    fired = {"=>": m.get(key, 0) + m.get(key + "=>", 0)}
    if rule.kind == "birewrite":
        fired["<="] = m.get(key + "<=", 0)
    let_names = list(names.values())
    g = from_json(js, let_names)
    let_class = dict(zip(let_names, g.roots))
    by_name = {names[id(node)]: node for case in cases for node in _postorder(case.inst)}
    # which instances reach each class
    reach: list[set[int]] = [set() for _ in g.classes]
    for name, c in let_class.items():
        k = owner_of[name]
        todo = [c]
        while todo:
            x = todo.pop()
            if k in reach[x]:
                continue
            reach[x].add(k)
            for nd in g.classes[x]:
                todo.extend(nd.children)
    tangled = {k for r in reach if len(r) > 1 for k in r}

    def report(c: int) -> bool:
        return len(reach[c]) == 1 and not (reach[c] & tangled)

    # class values from the instances; two different values in one class is already a counterexample
    value: dict[int, np.ndarray] = {}
    origin: dict[int, Inst] = {}
    failures: list[Counterexample] = []
    members: dict[int, list[Inst]] = {}
    for name, node in by_name.items():
        c = let_class[name]
        members.setdefault(c, []).append(node)
        if c in value:
            if value[c].shape == node.value.shape and not _close(node.value, value[c], node.dtype, tol).all() \
                    and report(c):
                # two terms of the instance ended in one class: show the larger one (the rule's left side)
                big, small = sorted([origin[c], node], key=lambda x: -len(_postorder(x)))
                failures.append(_cx(big, big.value, small.value, f"merged with {small.text(_leaf_names(big))}",
                                    _direction(rule, cases[next(iter(reach[c]))].side)))
        else:
            value[c], origin[c] = node.value, node
    # evaluate rule-created classes, then every node of every class
    changed = True
    while changed:
        changed = False
        for c, nodes in enumerate(g.classes):
            if c in value:
                continue
            for nd in nodes:
                v = _eval_node(nd, value, leaves_by_pos, g.dtypes[c], params)
                if v is not None:
                    value[c] = v
                    changed = True
                    break
    for c, nodes in enumerate(g.classes):
        if c not in value or not report(c):
            continue
        for nd in nodes:
            # a term the op table rejects (an elementwise op over two shapes: NumPy would broadcast
            # it), or one of another shape than its class, is as wrong as a different value
            bad = _ill_formed(nd, value)
            v = None if bad else _eval_node(nd, value, leaves_by_pos, g.dtypes[c], params)
            if not bad and v is not None and v.shape != value[c].shape:
                bad = f"a value of shape {v.shape} in a class of shape {value[c].shape}"
            if bad or (v is not None and not _close(v, value[c], g.dtypes[c], tol).all()):
                case = cases[next(iter(reach[c]))]
                # the instance's largest term in this class (the rule's left side), else the instance
                big = max(members[c], key=lambda x: len(_postorder(x))) if c in members else case.inst
                failures.append(_cx(big, value[c], f"(an ill-formed term: {bad})" if bad else v,
                                    _node_text(nd), _direction(rule, case.side)))
                break
    return failures, fired, [cases[k] for k in sorted(tangled)], None


def _leaf_names(inst: Inst) -> dict[int, str]:
    return {id(x): f"b{i}" for i, x in enumerate(y for y in _postorder(inst) if y.op == "BUF")}


def _inputs(inst: Inst) -> dict[str, Any]:
    names = _leaf_names(inst)
    return {f"{names[id(x)]}: {x.dtype.name}{list(x.shape)}": x.value for x in _postorder(inst) if x.op == "BUF"}


def _rank_hint(guards: list[SExpr]) -> int | None:
    """A guard (= (vec-length v) N) fixes the rank the instances need."""
    for g in guards:
        if isinstance(g, SList) and g.head == "=" and len(g) == 3:
            a, b = g[1], g[2]
            if isinstance(a, SList) and a.head == "vec-length" and isinstance(b, int):
                return b
    return None


def _permute_vars(pat: SExpr) -> list[str]:
    """Permutation variables of a pattern made only of Permutes over a tensor variable."""
    out: list[str] = []
    while isinstance(pat, SList) and pat.head == "Permute" and isinstance(pat[2], Sym):
        out.append(pat[2].name)
        pat = pat[1]
    return out if out and isinstance(pat, Sym) else []


def _vec(xs) -> str:
    return f"(vec-of {' '.join(map(str, xs))})" if xs else "(vec-empty)"


def _postorder(inst: Inst) -> list[Inst]:
    out, seen = [], set()

    def go(x: Inst) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        for k in x.kids:
            go(k)
        out.append(x)
    go(inst)
    return out


def _ill_formed(nd, value: dict) -> str:
    """Why the op table rejects e-node ``nd`` over its children's values' shapes ("" if it does
    not, or when a child's value is unknown)."""
    if nd.op in ("BUF", "PARAM", "CONST", "SIZE") or any(k not in value for k in nd.children):
        return ""
    return attr_error(nd.op, [tuple(value[k].shape) for k in nd.children], nd.arg)


def _eval_node(nd, value: dict, leaves: list[Inst], dt: DType, params: list[Inst]) -> np.ndarray | None:
    if nd.op == "BUF":
        return leaves[nd.arg[0]].value
    if nd.op == "PARAM":
        i, d, shape = nd.arg
        return np.full(shape, params[i].arg, d.np)
    if nd.op == "CONST":
        v, d, shape = nd.arg
        return np.full(shape, cast_scalar(v, d), d.np)
    if nd.op == "SIZE":
        n, d, shape = nd.arg
        return np.full(shape, cast_scalar(n, d), d.np)
    if any(k not in value for k in nd.children):
        return None
    try:
        with np.errstate(all="ignore"):
            return OPS[nd.op].ref([value[k] for k in nd.children], nd.arg, dt)
    except Exception:
        return None


def _node_text(nd) -> str:
    arg = nd.arg
    if nd.op == "CONST":
        v, d, shape = arg
        return f"Const {v!r} {d.name} {list(shape)}"
    if arg is None:
        return OPS[nd.op].egg
    return f"{OPS[nd.op].egg} {getattr(arg, 'name', arg)}"


def _cx(origin: Inst, lhs, rhs, node: str, direction: str = "") -> Counterexample:
    """A counterexample showing ``origin`` with its buffers named b0, b1, ... in its own order."""
    size = sum(x.value.size for x in _postorder(origin))
    return Counterexample(origin.text(_leaf_names(origin)), _inputs(origin), lhs, rhs, node, size, direction)


def check_rules(rules: list[Rule], n: int = DEFAULT_N, seed: int = 0, progress=None,
                rtol: float = RTOL, atol: float = ATOL) -> list[CheckResult]:
    sat = Saturator()
    try:
        out = []
        for r in rules:
            out.append(check_rule(r, n, seed, sat, rtol=rtol, atol=atol))
            if progress:
                progress(out[-1])
        return out
    finally:
        sat.close()
