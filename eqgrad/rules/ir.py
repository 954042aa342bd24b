"""The IR as egglog sees it, generated from the op table (the one place ops are declared).

- :func:`declarations` -- the sort ``T`` with one constructor per primitive op (stable names from
  ``OpDef.egg``, tensor arguments first), and the analyses ``shape`` (``IVec``) and ``dtype``
  (``String``), both without merge so that an unsound rule fails loudly ("Illegal merge").
- :func:`generated_rulebooks` -- rule families that are mechanical consequences of the op table:
  the shape/dtype analysis (per rank where a rule needs ``vec-get``), composing permutes, and
  pushing movement through elementwise ops. Hand-written rules live in ``rulebooks/*.egg``.
- :func:`emit_program` -- a program (``eqgrad.graph.program``) as egglog ``let`` commands, inserted *unfused*: every
  non-leaf argument is wrapped in ``Realize`` (see DESIGN.md, "Fusion").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.program import ConstLeaf, Input, Program, is_node
from eqgrad.ops import EGG_TO_OP, MAX_RANK, OPS, OpDef

SORTS = {"i64", "f64", "String", "IVec"}


def declarations() -> str:
    ctors = []
    for o in OPS.values():
        ctors.append(f"  ({o.egg}{' T' * o.arity}{''.join(' ' + a for a in o.attrs)})")
    return "\n".join([
        "(sort IVec (Vec i64))",
        "(datatype T", *ctors, ")",
        "(function shape (T) IVec :no-merge)",
        "(function dtype (T) String :no-merge)",
    ]) + "\n"


def constructor_names() -> set[str]:
    return {o.egg for o in OPS.values()}


# ------------------------------------------------------------------ generated rule families

def _vec(items: list[str]) -> str:
    return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"


def _analysis_rules() -> list[str]:
    rs = ["(ruleset analysis)"]

    def rule(name: str, query: str, actions: str) -> None:
        rs.append(f"(rule ({query}) ({actions}) :ruleset analysis :name \"{name}\")")

    rule("shape-buf", "(= e (Buf i s d))", "(set (shape e) s) (set (dtype e) d)")
    rule("shape-const", "(= e (Const v d s))", "(set (shape e) s) (set (dtype e) d)")
    for o in OPS.values():
        if o.kind in ("unary", "binary", "ternary", "boundary") or o.name == "FLIP":
            args = " ".join(f"x{i}" for i in range(o.arity))
            attrs = " ".join(f"a{i}" for i in range(len(o.attrs)))
            pat = f"(= e ({o.egg} {args} {attrs}))".replace("  ", " ").replace(" )", ")")
            src = "x1" if o.name == "WHERE" else "x0"
            dt = {"CMPLT": '"bool"', "CMPEQ": '"bool"', "CAST": "a0"}.get(o.name, "d")
            q = f"{pat} (= (shape {src}) s)" + ("" if dt != "d" else f" (= (dtype {src}) d)")
            rule(f"shape-{o.egg.lower()}", q, f"(set (shape e) s) (set (dtype e) {dt})")
    for egg in ("Reshape", "Expand"):
        rule(f"shape-{egg.lower()}", f"(= e ({egg} x s)) (= (dtype x) d)", "(set (shape e) s) (set (dtype e) d)")
    for r in range(1, MAX_RANK + 1):
        perm = _vec([f"(vec-get s (vec-get p {i}))" for i in range(r)])
        rule(f"shape-permute-{r}", f"(= e (Permute x p)) (= (shape x) s) (= (dtype x) d) (= (vec-length s) {r})",
             f"(set (shape e) {perm}) (set (dtype e) d)")
        pad = _vec([f"(+ (+ (vec-get b {i}) (vec-get s {i})) (vec-get a {i}))" for i in range(r)])
        rule(f"shape-pad-{r}", f"(= e (Pad x b a)) (= (shape x) s) (= (dtype x) d) (= (vec-length s) {r})",
             f"(set (shape e) {pad}) (set (dtype e) d)")
        shr = _vec([f"(- (vec-get n {i}) (vec-get b {i}))" for i in range(r)])
        rule(f"shape-shrink-{r}", f"(= e (Shrink x b n)) (= (dtype x) d) (= (vec-length b) {r})",
             f"(set (shape e) {shr}) (set (dtype e) d)")
    for k in range(1, MAX_RANK + 1):
        red = "s"
        for i in range(k):
            red = f"(vec-set {red} (vec-get ax {i}) 1)"
        for egg in ("Sum", "RMax"):
            rule(f"shape-{egg.lower()}-{k}", f"(= e ({egg} x ax)) (= (shape x) s) (= (dtype x) d) (= (vec-length ax) {k})",
                 f"(set (shape e) {red}) (set (dtype e) d)")
    return rs


def _movement_families() -> list[str]:
    """Permute composition per rank, and movement pushed through elementwise ops."""
    rs = ["(ruleset movement-gen)"]
    for r in range(1, MAX_RANK + 1):
        comp = _vec([f"(vec-get p (vec-get q {i}))" for i in range(r)])
        rs.append(f"(rewrite (Permute (Permute x p) q) (Permute x {comp}) :when ((= (vec-length q) {r})) "
                  f":ruleset movement-gen :name \"permute-permute-{r}\")")
    # Permute(op(a, b)) = op(Permute a, Permute b) for elementwise ops (same for Reshape, Flip)
    for o in OPS.values():
        if o.kind not in ("unary", "binary", "ternary"):
            continue
        args = [f"x{i}" for i in range(o.arity)]
        attrs = [f"a{i}" for i in range(len(o.attrs))]
        for mv in ("Permute", "Reshape", "Flip"):
            lhs = f"({mv} ({o.egg} {' '.join(args + attrs)}) m)"
            rhs = f"({o.egg} {' '.join([f'({mv} {a} m)' for a in args] + attrs)})"
            rs.append(f"(rewrite {lhs} {rhs} :ruleset movement-gen :name \"{mv.lower()}-through-{o.egg.lower()}\")")
    return rs


def generated_rulebooks() -> str:
    return "\n".join(_analysis_rules() + _movement_families()) + "\n"


# ------------------------------------------------------------------ emitting a graph

def fmt_f64(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = repr(float(v))
    return s if ("." in s or "e" in s) else s + ".0"


def fmt_vec(xs) -> str:
    return _vec([str(int(x)) for x in xs])


def fmt_attrs(o: OpDef, arg) -> list[str]:
    """The egglog text of an op's attributes (``arg`` as the frontend stores it)."""
    if o.name in ("PAD", "SHRINK"):
        return [fmt_vec(arg[0]), fmt_vec(arg[1])]
    if o.name == "CAST":
        return [f'"{arg.name}"']
    if o.attrs == ("IVec",):
        return [fmt_vec(arg)]
    return []


@dataclass
class EmittedProgram:
    text: str                      # the egglog commands
    inputs: list[LazyBuffer]       # realized leaves in input-position order
    roots: list[str]               # let name of each requested target


def _const(c: ConstLeaf) -> str:
    v = c.value
    const = f'(Const {fmt_f64(abs(float(v)) if v == 0 else float(v))} "{c.dtype.name}" {fmt_vec(c.shape)})'
    # egglog's f64 equates -0.0 with 0.0, so negative zero is inserted as Neg(0.0)
    return f"(Neg {const})" if v == 0 and math.copysign(1.0, float(v)) < 0 else const


def emit_program(prog: Program) -> EmittedProgram:
    """``prog`` (``eqgrad.graph.program.linearize``) as egglog ``let`` commands, inserted unfused."""
    names: list[str] = []
    lines: list[str] = []

    def leaf(r: Input | ConstLeaf) -> str:
        if isinstance(r, ConstLeaf):
            return _const(r)
        return f"(Buf {r.pos} {fmt_vec(r.shape)} \"{r.dtype.name}\")"

    for i, n in enumerate(prog.nodes):
        o = OPS[n.op]
        args = [f"(Realize {names[s]})" if is_node(s) else leaf(s) for s in n.src]
        name = f"$v{i}"
        lines.append(f"(let {name} ({o.egg} {' '.join(args + fmt_attrs(o, n.arg))}))")
        # the frontend already knows every shape and dtype: stating them saves the analysis
        # one iteration per level of the graph (rules still derive them for rewritten terms)
        lines.append(f'(set (shape {name}) {fmt_vec(n.shape)}) (set (dtype {name}) "{n.dtype.name}")')
        names.append(name)
    roots = []
    for r in prog.roots:
        if is_node(r):
            roots.append(names[r])
        else:                           # a leaf target still gets a class of its own
            name = f"$r{len(roots)}"
            lines.append(f"(let {name} {leaf(r)})")
            roots.append(name)
    return EmittedProgram("\n".join(lines) + "\n", prog.inputs, roots)


def op_of(egg_name: str) -> OpDef:
    return EGG_TO_OP[egg_name]
