"""Plans reused for new sizes: the plan compiled for one program, rewritten for a program that differs
from it only in dimension sizes -- with no saturation and no extraction (docs/engine.md: a new size reuses the plan).

Measured before this module: a decode step whose KV cache grows by ``cat`` cost 1.2-1.4 s per token
(a full compile per length) against 62-85 ms with a fixed cache; a ``@eqgrad.jit`` step after a
batch-size change 1.7-2.6 s. A plan's choice (which producers fuse, where kernels split) depends on
a program's structure and on which sizes are 1, not on the other sizes' values, so the plan for a
new size is the old plan with its sizes replaced; only lowering and the device's compiler run again.

- ``graph/sizes.py`` ``size_free_key``: ``Program.key`` with every size other than 0 and 1 replaced
  by a marker; two programs with the same key differ only in sizes: the key of a cache of plans that
  can be resized (where the sizes are is the op table's answer, ``OpDef.attr_sizes``).
- :func:`resize` / :func:`resize_plan` -- the rewritten plan, or None (and why) when that cannot be
  done safely. It never guesses: every size of the new plan is *derived*.

How a plan is resized. Walking both programs in the same order pairs each old size with its new
value: ``moves[v]`` is the set of new values of the positions whose old value is ``v``. A plan
(eqgrad/extract/plan.py ``build_plan``) holds values that rewrites copied from the program (a
reshape pushed through an add has the program's target), so each *free* value of the plan -- a
constant's shape, a RESHAPE/EXPAND target entry that its source does not determine, a PAD/SHRINK
amount -- can take only a value in ``moves`` of its old value. When that set has one element the
value is known (the usual case; ``sigma`` lists those that change). When it has several (a batch of
64 becomes 32 while a hidden size of 64 stays) the plan's own shape rules decide: every node's
shape is built symbolically from the new input buffers, sources unify with the shapes their op
requires (an add's two sources, an expand's kept axes, a kernel's output with the root it computes),
and a reshape's element count and a pad's or shrink's sum pin the rest. A free value that none of
this pins is refused, never chosen. Sizes that are not in the program at all (a user rule's
arithmetic) are accepted only where the shape rules pin them.

Constants: a size that a rule writes as a value is a ``Size`` e-node (``expand-sum``: a sum over an
axis expanded from 1 is ``x * Size(n)``), which the plan holds as a CONST whose value remembers the
size (``graph.plan.size_value``): it gets the new value of that size, and the resize is refused
when the size maps to several new values or none. No other constant is read as a size: the
program's constants and what the built-in folds compute from them are the same in the new program
(its size-free key holds their values), and so is a literal a user rule writes. Only while a rule
runs that computes a constant from a size or writes a ``Size`` that is not one size of a shape
(``rule_writers``, ``RuleConfig.constant_writers``) is a constant that is not the program's refused.

The result is checked on its own before it is returned: ``check_plan``, every node it made (a node
kept from the old plan, and a kernel kept whole, were checked with that plan) with its shape equal to
its op's shape rule of its sources and its op's argument valid (a reshape keeps the element count,
an expand only grows axes of size 1, pads are non-negative, shrinks in range), every size 1 (or 0)
exactly where the old plan had one, the input buffers equal to the new program's, the outputs its
roots. ``nbytes``/``flops`` are rescaled by the ratio of the kernel's buffer bytes and elementwise
work (a note in ``plan.notes`` says so); kernel ``predicted`` times are the old plan's here, and the
engine re-predicts them from the rescaled figures (``Session._repredict``, ``extract.cost.rescaled``)
before the device reads them to choose threads and the BLAS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import product as cartesian
from typing import Any, Union

from eqgrad.dtype import DType, bool_, cast_scalar
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, NodeMemo, check_plan, is_size, size_value
from eqgrad.graph.program import Program
from eqgrad.graph.sizes import (BOUNDARY, ELEMENTWISE, PAIR_ARG, SHAPE_ARG, ProgramSizes, body_builder,
                                body_size_set, body_sizes, carry_sizes, keep_sizes, known_op, program_sizes)
from eqgrad.ops import OPS, REDUCE_OPS, attr_error, numel

# Each propagation step that must enumerate combinations of ambiguous sizes tries at most this many;
# beyond it the sizes stay unpinned and the resize is refused (a bound on the work, not a tuning).
# _MAX_COMBOS: docs/lowering.md, Constants
_MAX_COMBOS = 256

# ------------------------------------------------------------------ the result


@dataclass(frozen=True)
class Trail:
    """Which kernels of a resized plan kept their old bodies (``kept``, by index) and every size those
    bodies hold (``sizes``: their shapes' and attributes', and the sizes their constants are). A resize
    *from* that plan keeps them again without looking at them (``_Resizer.unchanged``) when each of
    those sizes keeps its value at every position -- a growing sequence's next step, which moves the
    same few sizes (10 of a decode step's 14 kernels, 420 of a 30-layer one's 510)."""
    kept: tuple[bool, ...]
    sizes: frozenset[int]


@dataclass
class Resized:
    """What :func:`resize` found. ``plan`` is None when it refused, and ``reason`` says why;
    ``sigma`` maps each old size whose new value is the same at every position to that value (the
    sizes that changed), ``resolved`` each old size whose positions took several new values to
    those values (each pinned by the plan's shape rules); ``trail`` what a resize from ``plan`` may
    take from this one (:class:`Trail`)."""
    plan: KernelPlan | None
    sigma: dict[int, int] = field(default_factory=dict)
    resolved: dict[int, tuple[int, ...]] = field(default_factory=dict)
    reason: str = ""
    trail: Trail | None = None

    def describe(self) -> str:
        """One line for DEBUG output."""
        if self.plan is None:
            return f"resize refused: {self.reason}"
        amb = f", ambiguous sizes resolved {self.resolved}" if self.resolved else ""
        return f"resized the plan: sizes {self.sigma}{amb}"


class _Refuse(Exception):
    """Resizing is not safe; the message says why."""


# ------------------------------------------------------------------ the size solver


class _Var:
    """An unknown new size: an index into the solver's union-find (``_Solver.old[id]`` is the plan's
    value it replaces, for messages)."""
    __slots__ = ("id",)

    def __init__(self, i: int):
        self.id = i

    def __add__(self, o: Any) -> "_Lin":
        return _Lin.of(self) + o

    __radd__ = __add__

    def __sub__(self, o: Any) -> "_Lin":
        return _Lin.of(self) - o

    def __rsub__(self, o: Any) -> "_Lin":
        return _Lin.of(o) - self


class _Lin:
    """A sum of unknown sizes with integer coefficients plus a constant: what an op table shape
    rule computes from unknown sizes (a pad's ``before + size + after``, a shrink's ``end - start``);
    :meth:`_Solver.term` turns it into a size that a linear constraint pins."""
    __slots__ = ("const", "coefs")

    def __init__(self, const: int, coefs: dict[int, int]):
        self.const, self.coefs = const, coefs

    @staticmethod
    def of(t: Any) -> "_Lin":
        if isinstance(t, _Lin):
            return t
        return _Lin(t, {}) if isinstance(t, int) else _Lin(0, {t.id: 1})

    def _plus(self, o: Any, sign: int) -> "_Lin":
        o = _Lin.of(o)
        coefs = dict(self.coefs)
        for v, c in o.coefs.items():
            coefs[v] = coefs.get(v, 0) + sign * c
        return _Lin(self.const + sign * o.const, {v: c for v, c in coefs.items() if c})

    def __add__(self, o: Any) -> "_Lin":
        return self._plus(o, 1)

    __radd__ = __add__

    def __sub__(self, o: Any) -> "_Lin":
        return self._plus(o, -1)

    def __rsub__(self, o: Any) -> "_Lin":
        return _Lin.of(o)._plus(self, -1)


Term = Union[int, _Var]


class _Solver:
    """Union-find over unknown sizes, each with the set of values it may take (None: any), and the
    arithmetic constraints (reshape element counts, pad and shrink sums) that pin them."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.dom: list[frozenset[int] | None] = []
        self.val: list[int | None] = []
        self.old: list[int] = []
        self.linear: list[tuple[tuple[int, ...], tuple[Term, ...]]] = []     # sum(c * t) == 0
        self.products: list[tuple[tuple[Term, ...], tuple[Term, ...]]] = []  # prod(a) == prod(b)

    def var(self, old: int, dom: frozenset[int] | None) -> Term:
        if dom is not None and len(dom) == 1:
            return next(iter(dom))
        self.parent.append(len(self.parent))
        self.dom.append(dom)
        self.val.append(None)
        self.old.append(old)
        return _Var(len(self.parent) - 1)

    def _root(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def find(self, t: Term) -> Term:
        if isinstance(t, int):
            return t
        r = self._root(t.id)
        return self.val[r] if self.val[r] is not None else _Var(r)

    def pin(self, v: _Var, x: int) -> None:
        r = self._root(v.id)
        if x < 0 or (self.dom[r] is not None and x not in self.dom[r]):
            raise _Refuse(f"size {self.old[r]} would have to become {x}, not one of its new values "
                          f"{sorted(self.dom[r]) if self.dom[r] is not None else '(any)'}")
        self.val[r] = x

    def unify(self, a: Term, b: Term) -> None:
        a, b = self.find(a), self.find(b)
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                raise _Refuse(f"the plan's shape rules need {a} == {b}")
            return
        if isinstance(a, int):
            a, b = b, a
        if isinstance(b, int):
            self.pin(a, b)
            return
        ra, rb = self._root(a.id), self._root(b.id)
        if ra == rb:
            return
        da, db = self.dom[ra], self.dom[rb]
        dom = da if db is None else db if da is None else da & db
        if dom is not None and not dom:
            raise _Refuse(f"sizes {self.old[ra]} and {self.old[rb]} must be equal but have no new value in common")
        self.parent[rb] = ra
        self.dom[ra] = dom
        if dom is not None and len(dom) == 1:
            self.val[ra] = next(iter(dom))

    def term(self, x: "Term | _Lin", old: int) -> Term:
        """A shape rule's result as a size: an int or an unknown as it is; a sum of unknowns a new
        unknown (for the old size ``old``; 0 and 1 are structure and stay) tied to it by a linear
        constraint, which ``solve`` pins once the sum's unknowns are known."""
        if not isinstance(x, _Lin):
            return x
        if not x.coefs:
            return x.const
        if x.const == 0 and len(x.coefs) == 1 and next(iter(x.coefs.values())) == 1:
            return _Var(next(iter(x.coefs)))
        y = old if old in (0, 1) else self.var(old, None)
        ids = list(x.coefs)
        self.linear.append(((1, -1, *(-x.coefs[i] for i in ids)), (y, x.const, *(_Var(i) for i in ids))))
        return y

    def unify_shapes(self, a: tuple[Term, ...], b: tuple[Term, ...]) -> None:
        if len(a) != len(b):
            raise _Refuse(f"ranks differ: {len(a)} != {len(b)}")
        for x, y in zip(a, b):
            self.unify(x, y)

    def value(self, t: Term) -> int:
        t = self.find(t)
        if isinstance(t, int):
            return t
        r = self._root(t.id)
        dom = self.dom[r]
        raise _Refuse(f"size {self.old[r]} is ambiguous: it could become any of "
                      f"{sorted(dom) if dom is not None else '(any value)'} and no shape rule decides")

    # -- propagation
    def solve(self) -> None:
        """Pin what the constraints determine, until nothing changes; a violated one refuses."""
        pending = [(terms, _linear(coefs)) for coefs, terms in self.linear] + \
                  [(a + b, _product(len(a))) for a, b in self.products]
        changed = True
        while changed and pending:
            changed = False
            left = []
            for terms, (holds, solve_one) in pending:
                step, done = self._step(terms, holds, solve_one)
                changed |= step
                if not done:
                    left.append((terms, (holds, solve_one)))
            pending = left

    def _step(self, terms: tuple[Term, ...], holds: Any, solve_one: Any) -> tuple[bool, bool]:
        """One constraint: (did it pin a size, is it fully decided)."""
        cur = [self.find(t) for t in terms]
        unknown = sorted({self._root(t.id) for t in cur if isinstance(t, _Var)})
        if not unknown:
            if not holds(cur):
                raise _Refuse(f"the plan's shape rules fail for sizes {cur}")
            return False, True
        if len(unknown) == 1:
            idx = [i for i, t in enumerate(cur) if isinstance(t, _Var)]
            x = solve_one(idx, cur)
            if x is not None:
                self.pin(_Var(unknown[0]), x)
                return True, False
        doms = [self.dom[r] for r in unknown]
        if any(d is None for d in doms) or math.prod(len(d) for d in doms) > _MAX_COMBOS:
            return False, False
        fits = []
        for combo in cartesian(*[sorted(d) for d in doms]):
            at = dict(zip(unknown, combo))
            if holds([at[self._root(t.id)] if isinstance(t, _Var) else t for t in cur]):
                fits.append(combo)
        if not fits:
            raise _Refuse(f"no new values of sizes {[self.old[r] for r in unknown]} satisfy the plan's shape rules")
        changed = False
        for j, r in enumerate(unknown):
            if len({c[j] for c in fits}) == 1:
                self.val[r] = fits[0][j]
                changed = True
        return changed, False


def _linear(coefs: tuple[int, ...]) -> tuple[Any, Any]:
    """(does sum(coefs * v) == 0 hold, solve it for its one unknown)."""
    return (lambda v: sum(c * x for c, x in zip(coefs, v)) == 0), (lambda i, v: _solve_linear(coefs, v, i))


def _product(n: int) -> tuple[Any, Any]:
    """(does prod(v[:n]) == prod(v[n:]) hold, solve it for its one unknown)."""
    return (lambda v: math.prod(v[:n]) == math.prod(v[n:])), (lambda i, v: _solve_product(n, v, i))


def _solve_linear(coefs: tuple[int, ...], v: list[Term], idx: list[int]) -> int | None:
    k = sum(coefs[i] for i in idx)
    rest = sum(c * x for i, (c, x) in enumerate(zip(coefs, v)) if i not in idx)
    if k == 0 or rest % k:
        return None if k == 0 else -1          # -1: no integer solution (pin refuses it)
    return -rest // k


def _solve_product(n: int, v: list[Term], idx: list[int]) -> int | None:
    """The unknown of prod(v[:n]) == prod(v[n:]) when it occurs once."""
    if len(idx) != 1:
        return None
    i = idx[0]
    known = math.prod(x for j, x in enumerate(v) if j != i and (j < n) == (i < n))
    other = math.prod(x for j, x in enumerate(v) if (j < n) != (i < n))
    if known == 0:
        return None
    return other // known if other % known == 0 else -1


# ------------------------------------------------------------------ resizing


class _Resizer:
    def __init__(self, old: ProgramSizes, plan: KernelPlan, new: ProgramSizes,
                 rule_writers: tuple[str, ...] = (), trail: Trail | None = None):
        self.old, self.plan, self.new = old, plan, new
        self.rule_writers = rule_writers
        self.trail = trail
        self.s = _Solver()
        if old.key != new.key:
            raise _Refuse("the programs differ in more than sizes (their size-free keys differ)")
        if old.unknown:
            raise _Refuse(f"the program has {old.unknown}")
        self.moves: dict[int, set[int]] = {}
        for a, b in set(zip(old.values, new.values)):       # ~1,000 positions, a few dozen pairs
            self.moves.setdefault(a, set()).add(b)
        self.sigma = {a: next(iter(b)) for a, b in self.moves.items() if len(b) == 1 and a not in b}
        self.kept = {a for a, b in self.moves.items() if b == {a}} | {0, 1}     # sizes that stay
        self.ambiguous = {a: tuple(sorted(b)) for a, b in self.moves.items() if len(b) > 1}
        self.consts = old.consts
        self.built_sizes: dict[int, tuple] = {}     # id(old kernel) -> (new body, its sizes): ``_built``

    def free(self, v: int) -> Term:
        """The new value of a plan value that no source determines (see the module docstring)."""
        if v in (0, 1):
            return v
        return self.s.var(v, frozenset(self.moves[v]) if v in self.moves else None)

    # -- symbolic shapes
    def build(self) -> None:
        plan, old_specs, new_specs = self.plan, self.old.input_specs, self.new.input_specs
        if plan.n_inputs != len(old_specs) or len(old_specs) != len(new_specs):
            raise _Refuse(f"the plan reads {plan.n_inputs} input buffers, the programs have "
                          f"{len(old_specs)} and {len(new_specs)}")
        if list(old_specs) != [(tuple(s), d) for s, d in plan.buffers[:plan.n_inputs]]:
            raise _Refuse("the plan's input buffers are not the old program's")
        self.shape: dict[int, tuple[Term, ...]] = {}        # id(KNode) -> symbolic shape
        self.arg: dict[int, Any] = {}                       # id(KNode) -> symbolic attribute
        self.out: dict[int, tuple[Term, ...]] = {b: tuple(s) for b, (s, _) in enumerate(new_specs)}
        self.orders = [k.ast.walk() for k in plan.kernels]     # each body, sources first
        self.made: dict[int, KNode] = {}                    # id(old node) -> new node (``direct``)
        self.still: list[bool] = []
        kept = self._kept_before()
        for i, (k, order) in enumerate(zip(plan.kernels, self.orders)):
            if tuple(plan.buffers[k.out][0]) != tuple(k.ast.shape):
                raise _Refuse(f"{k.name}: its buffer's shape is not its body's")
            if kept is not None and kept[i]:
                # (what ``unchanged`` would find: its sizes stay (``_kept_before``), it reads what it
                # read -- a buffer of those sizes, which ``verify`` checks -- its constants stay)
                self.out[k.out] = k.ast.shape
                self.still.append(True)
                continue
            self.still.append(self.unchanged(k))
            if self.still[-1]:
                continue
            if self.direct(k, order):
                continue
            for n in order:
                self.shape[id(n)] = self.node(n)
            self.out[k.out] = self.shape[id(k.ast)]
        if len(plan.outputs) != len(self.new.roots):
            raise _Refuse(f"the plan has {len(plan.outputs)} outputs, the program {len(self.new.roots)} roots")
        for o, (shape, _, pos) in zip(plan.outputs, self.new.roots):
            if o < plan.n_inputs:
                if pos != o:
                    raise _Refuse(f"output b{o} aliases an input that is not the program's root")
                continue
            self.s.unify_shapes(self.out[o], shape)

    def _kept_before(self) -> tuple[bool, ...] | None:
        """The kernels the resize that made the plan kept (``Trail.kept``), when every size they
        hold keeps its value here; None otherwise (each kernel is then looked at)."""
        t = self.trail
        if t is None or self.ambiguous or len(t.kept) != len(self.plan.kernels) or not t.sizes <= self.kept:
            return None
        return t.kept

    def trail_out(self) -> Trail:
        """What a resize from the plan made here may take from this one: the kernels kept, and the
        sizes they hold (the trail's own where the same kernels were kept)."""
        kept = tuple(self.still)
        t = self.trail
        if t is not None and t.kept == kept:
            return t
        sizes: set[int] = set()
        for k, still in zip(self.plan.kernels, kept):
            if still:
                sizes |= body_size_set(k, self.plan)
                sizes.update(c.arg.size for c in _body(k.ast)[2] if is_size(c.arg))
        return Trail(kept, frozenset(sizes))

    def unchanged(self, k: Kernel) -> bool:
        """Does the kernel stay as it is: every size of its body one whose positions all keep their
        value, every op one resize knows, every buffer it reads still of the shape it reads, every
        constant its own new value? Such a body is the old one (a growing sequence changes 4 of a
        decoder layer's 32 kernels); deriving it node by node gave the same nodes."""
        if not body_size_set(k, self.plan) <= self.kept:     # (first: a changed body is not walked)
            return False
        known, reads, consts = _body(k.ast)
        if not known:
            return False
        if any(self.out.get(n.arg) != n.shape for n in reads):
            return False
        if any(self.const_value(n.arg, n.dtype) != n.arg for n in consts):
            return False
        self.out[k.out] = k.ast.shape
        return True

    def direct(self, k: Kernel, order: list[KNode]) -> bool:
        """The kernel's new body worked out in one walk with plain integers (``self.made``), when
        every free value of it has one new value (``sigma``, or it stays) -- the usual case: a
        growing sequence's changed kernels. The same nodes as ``node`` then ``concrete`` give
        there, in one walk instead of two (a growing KV cache's resize 0.69 -> 0.59 ms a step);
        False, with nothing kept, when a value needs the solver (an ambiguous size, one not in
        the program)."""
        if self.ambiguous:
            return False
        made = self._built(k, order)
        if made is None:
            made = {}
            for n in order:
                m = self._direct(n, made)
                if m is None:
                    return False
                made[id(n)] = m
        self.made.update(made)
        for n in order:              # (a node another body shares: its shape for ``node``)
            self.shape[id(n)] = made[id(n)].shape
        self.out[k.out] = made[id(k.ast)].shape
        return True

    def _built(self, k: Kernel, order: list[KNode]) -> dict[int, KNode] | None:
        """``direct``'s nodes made by the body's generated builder (graph/sizes.py ``body_builder``)
        from its sizes mapped one by one (each stays or takes ``sigma``'s value), or None where the
        generic walk decides (no builder, a size the solver must find, one that would become 0 or 1:
        the walk refuses those). The builder checks nothing: ``verify`` checks every node it makes,
        as it checks the walk's."""
        build = body_builder(k, self.plan)
        if build is None:
            return None
        for c in _body(k.ast)[2]:
            # (the builder keeps a plain constant: the walk's ``const_value`` refuses it where a
            # rule that computes constants from sizes runs, and so must this)
            self.const_value(c.arg, c.dtype)
        sigma = self.sigma
        moving = body_size_set(k, self.plan) - self.kept
        if not moving <= sigma.keys() or any(sigma[x] in (0, 1) for x in moving):
            return None
        old = body_sizes(k, self.plan)[1]
        v = [sigma.get(x, x) for x in old]
        moved = {i for i, x in enumerate(old) if x in moving}
        made = build(v, order, moved)
        self.built_sizes[id(k)] = (made[-1], v)        # (the new body's sizes: ``emit`` keeps them)
        return {id(o): n for o, n in zip(order, made)}

    def _sub(self, v: int) -> int | None:
        """A free value's new value: itself where it stays, ``sigma``'s where it moves to one
        value; None where the solver must decide."""
        if v in self.kept:
            return v
        return self.sigma.get(v)

    def _direct(self, n: KNode, made: dict[int, KNode]) -> KNode | None:
        """Node ``n`` at the new sizes (its sources already in ``made``), or None where a value
        needs the solver."""
        op = n.op
        if op in ELEMENTWISE or op in BOUNDARY:
            # (most of a body) its shape is its sources': ``known``'s and ``_rebuilt``'s checks hold
            # for it when they held for them; a node whose sources stay is itself
            _known_op(n)
            src = tuple([made[id(x)] for x in n.src])
            shape = src[0].shape
            if len(src) > 1 and any(x.shape != shape for x in src):
                raise _Refuse(f"the plan's shape rules need {shape} == {[x.shape for x in src[1:]]}")
            if all(a is b for a, b in zip(src, n.src)):
                return n
            return KNode(op, src, n.arg, shape, n.dtype)
        if op == "BUF":
            shape = self.read(n)
            if not all(type(d) is int for d in shape):
                return None
            arg = n.arg
            src: tuple[KNode, ...] = ()
        elif op == "CONST":
            shape = tuple(self._sub(d) for d in n.shape)
            if None in shape:
                return None
            arg = self.const_value(n.arg, n.dtype)
            src = ()
        else:
            src = tuple([made[id(x)] for x in n.src])
            shapes = [x.shape for x in src]
            arg = n.arg
            if op == "EXPAND":
                target = []
                for o, t, x in zip(n.src[0].shape, n.arg, shapes[0]):
                    if o == 1:
                        if x != 1:
                            raise _Refuse(f"the plan's shape rules need {x} == 1")
                        target.append(self._sub(t))
                    else:                    # (o == t: ``known`` checks it below where the node changes)
                        target.append(x)
                if None in target:
                    return None
                arg = tuple(target)
            elif op in SHAPE_ARG:
                arg = tuple([self._sub(d) for d in n.arg])
                if None in arg:
                    return None
            elif op in PAIR_ARG:
                arg = tuple([tuple([self._sub(d) for d in p]) for p in n.arg])
                if any(None in p for p in arg):
                    return None
            if arg == n.arg and all(a is b for a, b in zip(src, n.src)):
                # the same op of the same sources with the same attribute: the node itself (its
                # shape rule gives its shape again), as ``_rebuilt`` would return it
                _known_op(n)
                return n
            self.known(n)
            if op != "EXPAND" and op in SHAPE_ARG and numel(shapes[0]) != numel(arg):
                raise _Refuse(f"{op} of {shapes[0]} to {arg}")
            shape = tuple(OPS[op].shape_rule(shapes, arg))
        return _rebuilt(n, src, arg, shape)

    def read(self, n: KNode) -> tuple[Term, ...]:
        """The new shape of buffer read ``n`` (a BUF node), refused where the plan reads a buffer
        before it writes it or with a shape that is not the buffer's."""
        if n.arg not in self.out:
            raise _Refuse(f"b{n.arg} is read before it is written")
        if tuple(n.shape) != tuple(self.plan.buffers[n.arg][0]):
            raise _Refuse(f"a read of b{n.arg} with shape {n.shape}, not its buffer's")
        return self.out[n.arg]

    @staticmethod
    def known(n: KNode) -> None:
        """Refuse node ``n`` (neither a read nor a constant) where resize does not know its op, or
        where its old sources do not fit it: an elementwise op's of its shape, an expand's of its
        rank with only axes of 1 grown."""
        op = n.op
        _known_op(n)
        olds = [tuple(x.shape) for x in n.src]
        if op in ELEMENTWISE or op in BOUNDARY:
            if any(o != tuple(n.shape) for o in olds):
                raise _Refuse(f"{op} over sources of shapes {olds} != {n.shape}")
        elif op == "EXPAND":
            if len(n.arg) != len(olds[0]):
                raise _Refuse(f"EXPAND of rank {len(olds[0])} to {n.arg}")
            if any(o != 1 and o != t for o, t in zip(olds[0], n.arg)):
                raise _Refuse(f"EXPAND of {olds[0]} to {n.arg}")

    def node(self, n: KNode) -> tuple[Term, ...]:
        op, s = n.op, self.s
        if op == "BUF":
            return self.read(n)
        if op == "CONST":
            return tuple(self.free(d) for d in n.shape)
        self.known(n)
        src = [self.shape[id(x)] for x in n.src]
        # the attribute with its sizes as unknowns: a value that its source determines (an expand's
        # kept axis) is the source's size; the others are free (their new values are in ``moves``)
        arg = n.arg
        if op in ELEMENTWISE or op in BOUNDARY:
            for x in src[1:]:           # the sources of an elementwise op have one shape
                s.unify_shapes(src[0], x)
        elif op == "EXPAND":
            target = []
            for d, o in enumerate(n.src[0].shape):
                if o == 1:
                    s.unify(src[0][d], 1)
                    target.append(self.free(n.arg[d]))
                else:                   # (o == the target's: ``known`` checked)
                    target.append(src[0][d])
            arg = self.arg[id(n)] = tuple(target)
        elif op in SHAPE_ARG:          # RESHAPE: any target with the source's element count
            arg = self.arg[id(n)] = tuple(self.free(d) for d in n.arg)
            if all(isinstance(t, int) for t in src[0] + arg):
                if numel(src[0]) != numel(arg):
                    raise _Refuse(f"RESHAPE of {src[0]} to {arg}")
            else:
                s.products.append((tuple(src[0]), arg))
        elif op in PAIR_ARG:
            arg = self.arg[id(n)] = tuple(tuple(self.free(d) for d in p) for p in n.arg)
        # the shape: the op table's shape rule over the unknowns (a pad's before + size + after
        # becomes an unknown that a linear constraint ties to the three)
        out = OPS[op].shape_rule(src, arg)
        return tuple(s.term(x, old) for x, old in zip(out, n.shape))

    # -- constants
    def const_value(self, v: Any, dtype: DType) -> Any:
        if is_size(v):                 # a size as a constant (an expand-sum's x * n): the new size
            if v.size in (0, 1):
                return v
            news = self.moves.get(v.size, set())
            if len(news) != 1:
                raise _Refuse(f"the size {v.size} (a constant of the plan) is " +
                              ("unknown: no size of the program has it" if not news else
                               f"ambiguous: it becomes one of {sorted(news)}"))
            n = next(iter(news))
            return v if n == v.size else size_value(cast_scalar(n, dtype), n)
        if dtype is bool_ or isinstance(v, bool):
            return v
        f = float(v)
        if not math.isfinite(f) or f in (0.0, 1.0, -1.0) or f in self.consts:
            return v
        if self.rule_writers:
            raise _Refuse(f"constant {v} is not the program's, and rules that write constants run "
                          f"({', '.join(self.rule_writers[:3])}): it may depend on the sizes")
        # the built-in folds made it from the program's own constants, which the new program shares
        # (its size-free key holds their values); a rule that writes a size writes a Size
        return v

    # -- the concrete plan
    def emit(self) -> KernelPlan:
        s, plan, memo = self.s, self.plan, dict(self.made)
        buffers = list(self.new.input_specs)
        kernels = []
        self.new_orders = []
        # what verify() walks: an unchanged body's reads only; a changed body's reads and the nodes
        # it does not share with the old body (a node kept from the old plan was checked with it:
        # a growing sequence's attention kernel keeps 20 of its 56)
        self.checks = []
        for k, order, still in zip(plan.kernels, self.orders, self.still):
            if still:
                self.new_orders.append(order)
                self.checks.append(_body(k.ast)[1])
                ast = k.ast
            else:
                if id(k.ast) not in self.made:      # (``direct`` made the others, and the
                    for n in order:                  # nodes a body shares with theirs)
                        if id(n) not in self.made:
                            memo[id(n)] = self.concrete(n, memo)
                new_order = [memo[id(n)] for n in order]
                self.new_orders.append(new_order)
                self.checks.append([m for n, m in zip(order, new_order) if m is not n or m.op == "BUF"])
                ast = memo[id(k.ast)]
                ast.known_walk(self.new_orders[-1])
            buffers.append((ast.shape, plan.buffers[k.out][1]))
            kernels.append(Kernel(k.name, k.out, ast, k.inputs, k.predicted, k.nbytes, k.flops, k.kind, k.stats))
        out = replace(plan, buffers=buffers, kernels=kernels, outputs=list(plan.outputs), notes=list(plan.notes))
        for k, ko, order, new_order, still in zip(out.kernels, plan.kernels, self.orders, self.new_orders, self.still):
            if still:
                continue
            k.nbytes = _rescale(ko.nbytes, plan.traffic(ko), out.traffic(k))
            k.flops = _rescale(ko.flops, _work(order), _work(new_order))
            if ko.stats is not None:      # what the cost function would read at the new sizes, rescaled alike
                r = k.flops / ko.flops if ko.flops else 1.0
                # a row-fused kernel's passes: one per row of each of its reductions (cost.py)
                passes = ko.stats.passes
                if passes and (rows := _rows(order)):
                    passes *= _rows(new_order) / rows
                # its strided reads (cost.py): the same share of its bytes
                strided = ko.stats.strided * k.nbytes / ko.stats.nbytes if ko.stats.strided and ko.stats.nbytes else 0.0
                k.stats = replace(ko.stats, nbytes=float(k.nbytes), flops=ko.stats.flops * r, cflops=ko.stats.cflops * r,
                                  passes=passes, strided=strided)
            # (made node for node from the old body: its sizes are looked up in every stage after)
            built = self.built_sizes.get(id(ko))
            if built is not None and built[0] is k.ast:
                keep_sizes(ko, k, out, built[1])
            else:
                carry_sizes(ko, plan, order, k, out, new_order)
        changed = dict(sorted(self.sigma.items()))
        if self.ambiguous:
            changed.update({a: b for a, b in sorted(self.ambiguous.items())})
        out.notes.append(f"resized (graph/resize.py) for new sizes {changed}: bytes and FLOPs rescaled by the "
                         "kernels' buffer sizes, kernel times from the old plan's predictions (cost.rescaled)")
        return out

    def concrete(self, n: KNode, memo: dict[int, KNode]) -> KNode:
        s = self.s
        shape = tuple(s.value(t) for t in self.shape[id(n)])
        arg = n.arg
        if n.op == "CONST":
            arg = self.const_value(n.arg, n.dtype)
        elif n.op in SHAPE_ARG:
            arg = tuple(s.value(t) for t in self.arg[id(n)])
        elif n.op in PAIR_ARG:
            arg = tuple(tuple(s.value(t) for t in p) for p in self.arg[id(n)])
        return _rebuilt(n, tuple(memo[id(x)] for x in n.src), arg, shape)


def _known_op(n: KNode) -> None:
    """Refuse node ``n`` where resize does not know its op (or its attribute's form)."""
    if not known_op(n.op, n.arg):
        raise _Refuse(f"op {n.op} (attribute {n.arg!r}) is not one whose sizes resize knows")


def _rebuilt(n: KNode, src: tuple[KNode, ...], arg: Any, shape: tuple[int, ...]) -> KNode:
    """Node ``n`` with new sources, attribute and shape: refused where an axis of size 0 or 1 would
    take another size or another would become 0 or 1 (sizes 0 and 1 are structure). A node the new
    sizes leave as it was is the old node itself (bodies are immutable), so what is worked out per
    body -- its walk, its structure (devices.kernel_structure) -- carries over to the kernels of the
    resized plan that did not change."""
    for o, x in zip(n.shape, shape):
        if (o in (0, 1) or x in (0, 1)) and o != x:
            raise _Refuse(f"an axis of size {o} would become {x}: sizes 0 and 1 are structure")
    if shape == n.shape and all(a is b for a, b in zip(src, n.src)) and \
            (arg is n.arg or (n.op != "CONST" and arg == n.arg)):
        return n
    return KNode(n.op, src, arg, shape, n.dtype)


_BODIES = NodeMemo()      # body -> _body's answer (a body that is a lone read or constant is not kept:
                          # its answer would hold the body itself)


def _body(ast: KNode) -> tuple[bool, tuple[KNode, ...], tuple[KNode, ...]]:
    """(whether resize knows all the body's ops, its buffer reads, its constants), worked out once
    per body (bodies are immutable); its sizes are ``sizes.body_sizes``'."""
    hit = _BODIES.get(ast)
    if hit is None:
        known, reads, consts = True, [], []
        for n in ast.walk():
            if n.op == "BUF":
                reads.append(n)
            elif n.op == "CONST":
                consts.append(n)
            elif not known_op(n.op, n.arg):
                known = False
        hit = (known, tuple(reads), tuple(consts))
        if ast.src:
            _BODIES.put(ast, hit)
    return hit


_WORK = NodeMemo()        # body -> its ``_work`` (a growing sequence's body at one step is the old body at the next)


def _work(order: list[KNode]) -> int:
    """The elements a body's elementwise ops and reductions visit (``order``: its walk, root last)."""
    hit = _WORK.get(order[-1])
    if hit is None:
        hit = _WORK.put(order[-1], sum(numel(n.src[0].shape if n.op in REDUCE_OPS else n.shape)
                                       for n in order if n.op in ELEMENTWISE or n.op in REDUCE_OPS))
    return hit


def _rows(order: list[KNode]) -> int:
    """The output elements of a body's reductions (a row-fused kernel's passes scale with them)."""
    return sum(numel(n.shape) for n in order if n.op in REDUCE_OPS)


def _rescale(value: int, before: int, after: int) -> int:
    return round(value * after / before) if before else value


# ------------------------------------------------------------------ checking the result


def _sizes_of(p: "Program | ProgramSizes") -> ProgramSizes:
    return p if isinstance(p, ProgramSizes) else program_sizes(p)


def verify(plan: KernelPlan, prog: "Program | ProgramSizes", orders: list[list[KNode]] | None = None) -> None:
    """Raise AssertionError unless ``plan`` is a well-formed plan for ``prog``'s inputs and roots:
    ``check_plan``; every node's attribute valid for its sources and its shape its op's shape rule;
    every read of a buffer with the buffer's shape; the input buffers the program's, each output
    the shape and dtype of its root. ``orders``: each kernel body's ``walk()``, if known, or the
    part of it to check (resize: an unchanged body's reads, a changed body's reads and new nodes;
    the rest is the old plan's, checked)."""
    check_plan(plan, orders)
    ps = _sizes_of(prog)
    got = [(tuple(s), d) for s, d in plan.buffers[:plan.n_inputs]]
    if got != list(ps.input_specs):
        raise AssertionError(f"input buffers {got} != the program's {list(ps.input_specs)}")
    for i, k in enumerate(plan.kernels):
        for n in (orders[i] if orders is not None else k.ast.walk()):
            if n.op == "BUF":
                if tuple(n.shape) != tuple(plan.buffers[n.arg][0]):
                    raise AssertionError(f"{k.name}: b{n.arg} read as {n.shape}, it is {plan.buffers[n.arg][0]}")
                continue
            if n.op == "CONST":
                continue
            srcs = [tuple(x.shape) for x in n.src]
            why = attr_error(n.op, srcs, n.arg)
            if why:
                raise AssertionError(f"{k.name}: {n.op} {why}")
            want = tuple(OPS[n.op].shape_rule(srcs, n.arg))
            if want != tuple(n.shape):
                raise AssertionError(f"{k.name}: {n.op} has shape {n.shape}, its shape rule gives {want}")
    if len(plan.outputs) != len(ps.roots):
        raise AssertionError(f"{len(plan.outputs)} outputs for {len(ps.roots)} roots")
    for o, (shape, dt, _) in zip(plan.outputs, ps.roots):
        if (tuple(plan.buffers[o][0]), plan.buffers[o][1]) != (shape, dt):
            raise AssertionError(f"output b{o} is {plan.buffers[o]}, its root {shape} {dt.name}")


# ------------------------------------------------------------------ entry points


def resize(old: "Program | ProgramSizes", plan: KernelPlan, new: "Program | ProgramSizes", *,
           rule_writers: tuple[str, ...] = (), trail: Trail | None = None) -> Resized:
    """``plan`` (compiled for ``old``) rewritten for ``new``'s sizes, with the sizes that changed;
    ``Resized.plan`` is None, and ``reason`` says why, when that cannot be done safely. Either
    program may be given as its ``program_sizes`` (what a plan cache keeps).

    ``rule_writers``: the rules that made ``plan`` and compute constants from sizes
    (``RuleConfig.constant_writers``); while any runs, a plan constant that is neither the program's
    nor a size (``size_value``) refuses the resize.

    ``trail``: the ``Resized.trail`` of the resize that made ``plan`` (the same answer, faster)."""
    new_sizes = _sizes_of(new)
    try:
        r = _Resizer(_sizes_of(old), plan, new_sizes, rule_writers, trail)
        r.build()
        r.s.solve()
        out = r.emit()
    except _Refuse as e:
        return Resized(None, reason=str(e))
    try:
        verify(out, new_sizes, r.checks)
    except AssertionError as e:        # a case the derivation above missed: refuse, never run it
        return Resized(None, reason=f"the resized plan fails its check: {e}")
    return Resized(out, dict(sorted(r.sigma.items())), dict(sorted(r.ambiguous.items())), trail=r.trail_out())


def resize_plan(old: "Program | ProgramSizes", plan: KernelPlan, new: "Program | ProgramSizes",
                **rules: Any) -> KernelPlan | None:
    """The plan compiled for ``old`` rewritten for ``new``'s sizes, or None when that cannot be done
    safely (``resize`` says why, and which sizes changed)."""
    return resize(old, plan, new, **rules).plan
