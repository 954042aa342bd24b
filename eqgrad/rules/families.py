"""Rule families generated from the op table: the rules that are mechanical consequences of it.

Each family is one ruleset, named from the schedule like a hand-written rulebook's, and is plain
``.egg`` text (``python -m eqgrad rules dump`` writes it out; ``rules check`` checks it):

- ``analysis`` -- the shape and dtype of every op's result, from ``OpDef.shape_of`` and
  ``OpDef.dtype_of``: the same declarative names that ``OpDef.shape_rule``/``dtype_rule`` are
  built from (eqgrad/ops.py), so the Python rule and the egglog rule cannot disagree
  (tests/test_rules_data.py checks them against each other on random terms). Rules that need
  ``vec-get`` are generated per rank up to ``MAX_RANK``.
- ``movement-gen`` -- composing two permutes (per rank), and ``Permute``/``Reshape``/``Flip``
  pushed through every elementwise op.
- ``fusion`` -- one consumer-side rule per op and argument position in ``OpDef.fuse``:
  ``(rewrite (Add (Realize x0) x1) (Add x0 x1))``. The program is inserted unfused (every
  non-leaf argument wrapped in ``Realize``); each rule adds the fused form of ONE argument of ONE
  consumer next to the unfused one, in the consumer's e-class, so the producer's class is never
  touched, ``Realize(x)`` is never unioned with ``x`` and every extraction is an acyclic plan
  (docs/rulebooks.md, "Rulebooks"). Legality (a reduction recomputed per broadcast element, a ``Contiguous``
  that must stay a kernel root, kernel size) is the extractor's, per kernel.

Hand-written rules (``rulebooks/*.egg``) are those that are not one-per-op: algebra, cancelling
movement chains, folding movement onto constants.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from eqgrad.ops import MAX_RANK, OPS, OpDef
from eqgrad.rules.ir import vec_of

# movement ops pushed through elementwise ops: op(x, y) moved = op(x moved, y moved). Pad is not
# (it inserts zeros, and op(0, 0) is not 0 in general); Expand and Shrink would be sound but the
# movement phase does not need them to expose the patterns algebra.egg matches.
THROUGH_ELEMENTWISE = ("PERMUTE", "RESHAPE", "FLIP")
ELEMENTWISE = ("unary", "binary", "ternary")
RANKED_SHAPES = ("permute", "pad", "shrink", "reduce")      # their egglog rules need vec-get: one per rank


@dataclass(frozen=True)
class Family:
    """One generated ruleset, as the ``.egg`` text egglog loads."""
    name: str          # its ruleset, named from the schedule
    text: str
    n_rules: int

    @property
    def source(self) -> str:
        """How messages name it (in place of file:line's file)."""
        return f"<generated:{self.name}>"


class _Builder:
    def __init__(self, ruleset: str, doc: str):
        self.ruleset = ruleset
        self.lines = [f";; {line}".rstrip() for line in doc.strip().splitlines()] + [f"(ruleset {ruleset})"]
        self.n = 0

    def comment(self, text: str) -> None:
        self.lines += ["", f";; {text}"]

    def rule(self, name: str, query: list[str], actions: list[str]) -> None:
        self.lines.append(f"(rule ({' '.join(query)}) ({' '.join(actions)}) :ruleset {self.ruleset} :name \"{name}\")")
        self.n += 1

    def rewrite(self, name: str, lhs: str, rhs: str, when: str = "") -> None:
        guard = f" :when ({when})" if when else ""
        self.lines.append(f"(rewrite {lhs} {rhs}{guard} :ruleset {self.ruleset} :name \"{name}\")")
        self.n += 1

    def family(self) -> Family:
        return Family(self.ruleset, "\n".join(self.lines) + "\n", self.n)


def _term(o: OpDef, args: list[str]) -> str:
    attrs = [f"a{i}" for i in range(len(o.attrs))]
    return f"({o.egg}{''.join(' ' + a for a in args + attrs)})"


def _attr(o: OpDef, sort: str) -> str:
    """The variable of the op's (only) attribute of this sort: a leaf's shape or dtype, a reshape's
    new shape, a cast's target dtype."""
    if o.attrs.count(sort) != 1:
        raise ValueError(f"op {o.name}: a {sort!r} rule needs exactly one {sort} attribute, has {o.attrs}")
    return f"a{o.attrs.index(sort)}"


def _shape(o: OpDef, rank: int | None) -> tuple[list[str], str]:
    """(query facts, the result's shape) for ``o.shape_of`` (at ``rank``, for a ranked family)."""
    kind = o.shape_of
    if kind in ("given", "attr"):
        return [], _attr(o, "IVec")
    if kind in ("same", "arg1"):
        return [f"(= (shape x{0 if kind == 'same' else 1}) s)"], "s"
    r = range(rank)
    if kind == "permute":
        return ["(= (shape x0) s)", f"(= (vec-length s) {rank})"], vec_of([f"(vec-get s (vec-get a0 {i}))" for i in r])
    if kind == "pad":              # a0 = before, a1 = after
        return (["(= (shape x0) s)", f"(= (vec-length s) {rank})"],
                vec_of([f"(+ (+ (vec-get a0 {i}) (vec-get s {i})) (vec-get a1 {i}))" for i in r]))
    if kind == "shrink":           # a0 = starts, a1 = ends: the source's shape is not needed
        return [f"(= (vec-length a0) {rank})"], vec_of([f"(- (vec-get a1 {i}) (vec-get a0 {i}))" for i in r])
    if kind == "reduce":           # rank = the number of reduced axes (a0)
        out = "s"
        for i in r:
            out = f"(vec-set {out} (vec-get a0 {i}) 1)"
        return ["(= (shape x0) s)", f"(= (vec-length a0) {rank})"], out
    raise ValueError(f"op {o.name}: no egglog analysis for shape_of={kind!r}")


def _dtype(o: OpDef) -> tuple[list[str], str]:
    kind = o.dtype_of
    if kind in ("given", "attr"):
        return [], _attr(o, "String")
    if kind in ("same", "arg1"):
        return [f"(= (dtype x{0 if kind == 'same' else 1}) d)"], "d"
    if kind == "bool":
        return [], '"bool"'
    raise ValueError(f"op {o.name}: no egglog analysis for dtype_of={kind!r}")


def analysis_family() -> Family:
    b = _Builder("analysis", """
analysis -- generated by eqgrad/rules/families.py from the op table (OpDef.shape_of, OpDef.dtype_of).
Sets (shape e) and (dtype e) of every term; shape and dtype have no merge, so a rule that would give
one class two shapes or dtypes fails loudly ("Illegal merge").""")
    for o in OPS.values():
        pat = f"(= e {_term(o, [f'x{i}' for i in range(o.arity)])})"
        dt_facts, dt = _dtype(o)
        b.comment(f"{o.egg}: shape {o.shape_of}, dtype {o.dtype_of}")
        for rank in (range(1, MAX_RANK + 1) if o.shape_of in RANKED_SHAPES else [None]):
            facts, shape = _shape(o, rank)
            guard = [f for f in facts if f.startswith("(= (vec-length")]
            query = [pat] + [f for f in facts if f not in guard] + dt_facts + guard
            name = f"shape-{o.egg.lower()}" + ("" if rank is None else f"-{rank}")
            b.rule(name, query, [f"(set (shape e) {shape})", f"(set (dtype e) {dt})"])
    return b.family()


def movement_family() -> Family:
    b = _Builder("movement-gen", """
movement-gen -- generated by eqgrad/rules/families.py from the op table: composing permutes (per
rank), and Permute/Reshape/Flip pushed through every elementwise op.""")
    b.comment("permute(permute(x, p), q) = permute(x, [p[q[i]] ...])")
    for r in range(1, MAX_RANK + 1):
        comp = vec_of([f"(vec-get p (vec-get q {i}))" for i in range(r)])
        b.rewrite(f"permute-permute-{r}", "(Permute (Permute x p) q)", f"(Permute x {comp})", f"(= (vec-length q) {r})")
    b.comment("move(op(x0, x1, ...), m) = op(move(x0, m), move(x1, m), ...) for elementwise ops")
    for o in OPS.values():
        if o.kind not in ELEMENTWISE:
            continue
        args = [f"x{i}" for i in range(o.arity)]
        for mv in (OPS[m].egg for m in THROUGH_ELEMENTWISE):
            b.rewrite(f"{mv.lower()}-through-{o.egg.lower()}", f"({mv} {_term(o, args)} m)",
                      _term(o, [f"({mv} {a} m)" for a in args]))
    return b.family()


FUSION_COMMENTS = {
    "unary": "unary: op(Realize x0) -> op(x0)",
    "binary": "binary: each argument position on its own, so both-fused arises from two steps",
    "ternary": "ternary",
    "reduce": "reductions read their producer inside the reduce loop (elementwise -> reduce fusion)",
    "movement": "movement folds into the consumer's index expressions: no copy kernel",
    "boundary": "a user-forced boundary computes its argument in its own kernel; its consumers never inline "
                "it (the extractor keeps every Contiguous a kernel root). Realize has no rule (OpDef.fuse is "
                "empty): fusing into a Realize is what its consumers' rules do",
}


def fusion_family() -> Family:
    b = _Builder("fusion", """
fusion -- generated by eqgrad/rules/families.py from the op table (OpDef.fuse): kernel boundaries
removed by consumer-side rules, one per op and argument position:
    Op(..., Realize(a), ...)  ==  Op(..., a, ...)
The fused form is added next to the unfused one in the consumer's e-class; the producer's class is
never touched and Realize(x) is never unioned with x, so the class graph stays acyclic (a class
that held both would contain itself). Legality is decided by the extractor per kernel.""")
    seen: set[str] = set()
    for o in OPS.values():
        if not o.fuse:
            continue
        if o.kind not in seen and o.kind in FUSION_COMMENTS:
            seen.add(o.kind)
            b.comment(FUSION_COMMENTS[o.kind])
        for pos in o.fuse:
            args = [f"x{i}" for i in range(o.arity)]
            fused = list(args)
            fused[pos] = f"(Realize x{pos})"
            name = f"fuse-{o.egg.lower()}" + ("" if o.arity == 1 else f"-{pos}")
            b.rewrite(name, _term(o, fused), _term(o, args))
    return b.family()


@functools.cache
def families() -> tuple[Family, ...]:
    """Every generated family, in the order the worker loads them (before any rulebook)."""
    return analysis_family(), movement_family(), fusion_family()


def generated_rulebooks() -> str:
    """The text of every generated family, as the saturation worker loads it."""
    return "\n".join(f.text for f in families())
