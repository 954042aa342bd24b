"""The soundness checker: every rewrite is tried on random concrete instances of its left side.

For each rule, ``check_rule``:

1. builds random *instances* of the rule's left-hand pattern: each tensor variable becomes a
   random buffer or constant, each attribute variable a random value consistent with the shapes
   (a valid permutation, a reshape with the same element count, axes to reduce, pads, ...), biased
   towards the cases guards ask for (identity permutations, unchanged shapes) and filled with edge
   values (0, -0.0, +-1, +-inf, NaN, huge, tiny; INT_MIN/INT_MAX for int32). Shapes are small
   (0-d up to rank 3, sizes 1-4) so a failure is a small counterexample;
2. inserts all instances into one e-graph with only this rule (plus the analyses) and runs it --
   egglog evaluates the guards, so an instance that does not satisfy them simply does not fire;
3. evaluates every e-node of every e-class with the op table's NumPy references and compares the
   nodes of each class: a rule is unsound when it put two nodes with different values in one class.

The report for an unsound rule is its smallest failing instance: the term, its inputs, and the
values of the two sides. A rule whose guards no instance satisfied is reported as *untested*.

Annotations: a ``;; check: finite`` comment before a rule restricts inputs to moderate finite
values, for rules that are only claimed sound away from overflow and NaN (say so in the rule's
comment). Integer index arithmetic (permutation composition) is checked exhaustively for small ranks
by the same machinery, with every permutation pair of rank <= 3 among the instances.
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
from eqgrad.ops import EGG_TO_OP, OPS, OpDef
from eqgrad.rules.rulebook import Rule
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

    def __str__(self) -> str:
        ins = "\n".join(f"      {k} = {np.array2string(np.asarray(v), threshold=20)}" for k, v in self.inputs.items())
        return (f"    instance: {self.instance}\n    inputs:\n{ins}\n"
                f"    left side  = {np.array2string(np.asarray(self.lhs), threshold=20)}\n"
                f"    right side = {np.array2string(np.asarray(self.rhs), threshold=20)}   (from {self.node})")


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

F_EDGE = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -3.5, np.inf, -np.inf, np.nan, 1e30, -1e30, 1e-30, 3.4e38]
I_EDGE = [0, 1, -1, 2, -2, 7, -7, 2**31 - 1, -2**31]


class Sampler:
    def __init__(self, rng: np.random.Generator, finite: bool):
        self.rng, self.finite = rng, finite

    def data(self, shape: tuple[int, ...], dt: DType) -> np.ndarray:
        n = math.prod(shape)
        r = self.rng
        if dt is bool_:
            return r.random(shape) < 0.5
        if dt is int32:
            pool = [0, 1, -1, 2, -3, 5] if self.finite else I_EDGE
            a = np.where(r.random(n) < 0.5, r.choice(pool, n), r.integers(-9, 10, n))
            return a.astype(np.int32).reshape(shape)
        if self.finite:
            a = np.where(r.random(n) < 0.3, r.choice([0.0, 1.0, -1.0, 0.5, 2.0], n), r.standard_normal(n) * 2)
        else:
            a = np.where(r.random(n) < 0.5, r.choice(F_EDGE, n), r.standard_normal(n) * 3)
        return a.astype(np.float32).reshape(shape)

    def scalar(self, dt: DType) -> float | int | bool:
        return self.data((), dt).item()

    def shape(self) -> tuple[int, ...]:
        rank = int(self.rng.choice([0, 1, 2, 2, 3]))
        return tuple(int(x) for x in self.rng.integers(1, 4, rank))

    def dtype(self) -> DType:
        return [float32, float32, int32, bool_][int(self.rng.integers(4))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


def _factorizations(n: int, rng: np.random.Generator) -> tuple[int, ...]:
    """A random shape with ``n`` elements, rank 1-3."""
    dims, rest = [], n
    for _ in range(int(rng.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = int(rng.choice(divs))
        dims.append(d)
        rest //= d
    dims.append(rest)
    return tuple(dims)


# ------------------------------------------------------------------ building instances from a pattern

class Builder:
    def __init__(self, sampler: Sampler):
        self.s = sampler
        self.env: dict[str, Any] = {}
        self.leaves: list[Inst] = []

    def attr(self, pat: SExpr, make, check=None):
        """Resolve an attribute position: a literal, a bound variable, or a fresh random value."""
        if isinstance(pat, Sym):
            if pat.name in self.env:
                v = self.env[pat.name]
                if check is not None and not check(v):
                    raise Retry
                return v
            v = make()
            self.env[pat.name] = v
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
        src_shape = tuple(int(self.s.rng.integers(1, 4)) if d in axes else s for d, s in enumerate(shape))
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
            src = bound.shape if isinstance(bound, Inst) else (shape if self.s.chance(0.3) else _factorizations(math.prod(shape), rng))
            if math.prod(src) != math.prod(shape):
                raise Retry
            return self._make(o, [self.build(kid_pat, tuple(src), dt)], shape, dt)
        if o.name == "EXPAND":
            self.attr(attrs_p[0], lambda: shape, lambda s: tuple(s) == shape)
            src = bound.shape if isinstance(bound, Inst) else \
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
            after = tuple(self.attr(attrs_p[1], lambda: tuple(int(rng.integers(0, 2)) for _ in shape),
                                    lambda a: len(a) == n))
            src = tuple(s - b - a for s, b, a in zip(shape, before, after))
            if any(x < 0 for x in src):
                raise Retry
            return self._make(o, [self.build(kid_pat, src, dt)], (before, after), dt)
        if o.name == "SHRINK":
            extra = [int(rng.integers(0, 3)) for _ in shape]
            starts = tuple(self.attr(attrs_p[0], lambda: tuple(int(rng.integers(0, e + 1)) for e in extra),
                                     lambda b: len(b) == n))
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

def _close(a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
    if dt.is_float:
        with np.errstate(invalid="ignore", over="ignore"):
            return _close_float(a, b)
    return a == b


def _close_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    same = (a64 == b64) & (np.signbit(a64) == np.signbit(b64))
    tol = np.abs(a64 - b64) <= 1e-6 + 1e-5 * np.abs(b64)
    return both_nan | same | (tol & np.isfinite(a64) & np.isfinite(b64) & ((a64 != 0) | (b64 != 0)))


def check_rule(rule: Rule, n: int = 48, seed: int = 0, saturator=None) -> CheckResult:
    if rule.rhs is None:
        return CheckResult(rule, "skipped", note="sets analysis facts only (checked by no-merge)")
    finite = "finite" in rule.check
    rng = np.random.default_rng(seed)
    insts: list[tuple[Inst, Builder]] = []
    sides = [rule.lhs] + ([rule.rhs] if rule.kind == "birewrite" else [])
    rank = _rank_hint(rule.guards)
    perm_vars = _permute_vars(rule.lhs)
    if perm_vars:
        # index arithmetic on permutations: every assignment while there are at most 2000
        # (exhaustive up to rank 4 for two permutes), a random 500 beyond
        for r in ([rank] if rank is not None else [1, 2, 3]):
            total = math.factorial(r) ** len(perm_vars)
            combos = itertools.product(itertools.permutations(range(r)), repeat=len(perm_vars)) if total <= 2000 \
                else (tuple(tuple(int(x) for x in rng.permutation(r)) for _ in perm_vars) for _ in range(500))
            for combo in combos:
                b = Builder(Sampler(rng, finite))
                b.env.update(dict(zip(perm_vars, combo)))
                try:
                    insts.append((b.build(rule.lhs, tuple(int(x) for x in rng.integers(1, 3, r)), b.s.dtype()), b))
                except Retry:
                    pass
    tries = 0
    while len(insts) < n * len(sides) and tries < n * 40:
        tries += 1
        b = Builder(Sampler(rng, finite))
        try:
            side = sides[len(insts) % len(sides)]
            dt = b.s.dtype()
            shape = b.s.shape() if rank is None else tuple(int(x) for x in rng.integers(1, 3, rank))
            insts.append((b.build(side, shape, dt), b))
        except Retry:
            continue
    if not insts:
        return CheckResult(rule, "untested", note="could not build any instance of the left side")
    sat = saturator or Saturator()
    failures, fired, err = _run(rule, [i for i, _ in insts], sat)
    if err and "Illegal merge" in err:
        # the rule gave a class two shapes or dtypes: find the instances that do it, one by one
        failures, fired = [], 0
        for inst, _ in insts:
            f1, m1, e1 = _run(rule, [inst], sat)
            failures += f1
            fired += m1
            if e1 and "Illegal merge" in e1:
                failures.append(Counterexample(inst.text(_leaf_names(inst)), _inputs(inst), inst.value,
                                               "(a value of another shape or dtype)", "an Illegal merge of shape/dtype",
                                               sum(x.value.size for x in _postorder(inst))))
    elif err:
        return CheckResult(rule, "untested", len(insts), note=f"egglog stopped: {err[:300]}")
    if failures:
        best = min(failures, key=lambda f: f.size)
        return CheckResult(rule, "unsound", len(insts), fired, best)
    if fired == 0:
        return CheckResult(rule, "untested", len(insts), 0, note="no instance satisfied the rule's guards")
    return CheckResult(rule, "sound", len(insts), fired)


def _run(rule: Rule, insts: list[Inst], sat) -> tuple[list[Counterexample], int, str | None]:
    """Insert instances, run the rule alone, and compare the values of every class's nodes."""
    lines: list[str] = []
    names: dict[int, str] = {}
    leaves_by_pos: list[Inst] = []
    params: list[Inst] = []
    for k, inst in enumerate(insts):
        for j, node in enumerate(_postorder(inst)):
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
        return [], 0, f"{rep.stop_reason}: {rep.detail}"
    fired = rep.matches.get(rule.name, 0)
    let_names = list(names.values())
    g = from_json(js, let_names)
    let_class = dict(zip(let_names, g.roots))
    by_name = {names[id(node)]: node for inst in insts for node in _postorder(inst)}
    # class values from the instances; two different values in one class is already a counterexample
    value: dict[int, np.ndarray] = {}
    origin: dict[int, Inst] = {}
    failures: list[Counterexample] = []
    members: dict[int, list[Inst]] = {}
    for name, node in by_name.items():
        c = let_class[name]
        members.setdefault(c, []).append(node)
        if c in value:
            if value[c].shape == node.value.shape and not _close(node.value, value[c], node.dtype).all():
                # two instance terms ended in one class: show the larger one (the rule's left side)
                big, small = sorted([origin[c], node], key=lambda x: -len(_postorder(x)))
                failures.append(_cx(big, big.value, small.value, f"merged with {small.text(_leaf_names(big))}",
                                    leaves_by_pos))
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
        if c not in value or c not in origin:
            continue
        for nd in nodes:
            v = _eval_node(nd, value, leaves_by_pos, g.dtypes[c], params)
            if v is None or v.shape != value[c].shape:
                continue
            if not _close(v, value[c], g.dtypes[c]).all():
                big = max(members[c], key=lambda x: len(_postorder(x)))     # the rule's left side
                failures.append(_cx(big, value[c], v, _node_text(nd), leaves_by_pos))
    return failures, fired, None


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


def _eval_node(nd, value: dict, leaves: list[Inst], dt: DType, params: list[Inst]) -> np.ndarray | None:
    if nd.op == "BUF":
        return leaves[nd.arg[0]].value
    if nd.op == "PARAM":
        i, d, shape = nd.arg
        return np.full(shape, params[i].arg, d.np)
    if nd.op == "CONST":
        v, d, shape = nd.arg
        return np.full(shape, cast_scalar(v, d), d.np)
    if any(k not in value for k in nd.children):
        return None
    try:
        with np.errstate(all="ignore"):
            return OPS[nd.op].ref([value[k] for k in nd.children], nd.arg, dt)
    except Exception:
        return None


def _node_text(nd) -> str:
    return f"{OPS[nd.op].egg}{'' if nd.arg is None else ' ' + str(nd.arg)}"


def _cx(origin: Inst, lhs, rhs, node: str, leaves: list[Inst]) -> Counterexample:
    lt: dict[int, str] = {}
    inputs: dict[str, Any] = {}
    for x in _postorder(origin):
        if x.op == "BUF":
            nm = f"b{leaves.index(x)}"
            lt[id(x)] = nm
            inputs[f"{nm}: {x.dtype.name}{list(x.shape)}"] = x.value
    size = sum(x.value.size for x in _postorder(origin))
    return Counterexample(origin.text(lt), inputs, lhs, rhs, node, size)


def check_rules(rules: list[Rule], n: int = 48, seed: int = 0, progress=None) -> list[CheckResult]:
    sat = Saturator()
    try:
        out = []
        for r in rules:
            out.append(check_rule(r, n, seed, sat))
            if progress:
                progress(out[-1])
        return out
    finally:
        sat.close()

