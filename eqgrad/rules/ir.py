"""The IR as egglog sees it, generated from the op table (the one place ops are declared).

- :func:`declarations` -- the sort ``T`` with one constructor per primitive op (stable names from
  ``OpDef.egg``, tensor arguments first), and the analyses ``shape`` (``IVec``) and ``dtype``
  (``String``), both without merge so that an unsound rule fails loudly ("Illegal merge").
- the rule families that are mechanical consequences of the op table (analysis, movement-gen,
  fusion) are generated in ``eqgrad/rules/families.py``; hand-written rules live in ``rulebooks/*.egg``.
- :func:`emit_program` -- a program (``eqgrad.graph.program``) as egglog ``let`` commands, inserted *unfused*: every
  non-leaf argument is wrapped in ``Realize``; the fusion family adds the fused forms (docs/rulebooks.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.program import ConstLeaf, Input, ParamLeaf, Program, is_node
from eqgrad.ops import EGG_TO_OP, OPS, RETYPES, OpDef

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


def vec_of(items: list[str]) -> str:
    """An ``IVec`` literal of egglog expressions."""
    return f"(vec-of {' '.join(items)})" if items else "(vec-empty)"


# ------------------------------------------------------------------ emitting a graph

def fmt_f64(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = repr(float(v))
    return s if ("." in s or "e" in s) else s + ".0"


def fmt_vec(xs) -> str:
    return vec_of([str(int(x)) for x in xs])


def fmt_attrs(o: OpDef, arg) -> list[str]:
    """The egglog text of an op's attributes (``arg`` as the frontend stores it)."""
    if o.name in ("PAD", "SHRINK"):
        return [fmt_vec(arg[0]), fmt_vec(arg[1])]
    if o.name in RETYPES:
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

    def leaf(r: Input | ConstLeaf | ParamLeaf) -> str:
        if isinstance(r, ConstLeaf):
            return _const(r)
        if isinstance(r, ParamLeaf):
            return f'(Param {r.index} "{r.dtype.name}" {fmt_vec(r.shape)})'
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
