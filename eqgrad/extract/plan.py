"""build_plan: a KernelPlan (eqgrad.graph.plan) from an extraction choice (one e-node per e-class)."""
from __future__ import annotations

from typing import Any

from eqgrad.dtype import DType, cast_scalar
from eqgrad.extract.egraph import EGraph, ENode
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, size_value
from eqgrad.ops import Shape


def param_view(buffer: int, shape: Shape, dtype: DType) -> KNode:
    """A kernel's read of a runtime parameter: its one-element buffer (shape ()) reshaped to rank
    ``len(shape)`` and broadcast to ``shape``. The lowering sees an ordinary broadcast input (a
    stride-0 load, hoisted out of the loops), so no device needs a scalar-argument ABI."""
    node = KNode("BUF", (), buffer, (), dtype)
    if shape:
        node = KNode("RESHAPE", (node,), (1,) * len(shape), (1,) * len(shape), dtype)
        if any(d != 1 for d in shape):
            node = KNode("EXPAND", (node,), tuple(shape), tuple(shape), dtype)
    return node


def params_in(g: EGraph) -> int:
    """How many parameters the program of ``g`` has: every one was inserted as a PARAM e-node (and
    saturation never removes a node)."""
    return 1 + max((n.arg[0] for nodes in g.classes for n in nodes if n.op == "PARAM"), default=-1)


def build_plan(g: EGraph, choice: dict[int, ENode], input_specs: list[tuple[Shape, DType]],
               costs: dict[int, Any] | None = None, n_params: int | None = None,
               bodies: dict[str, list[int]] | None = None) -> KernelPlan:
    """The plan of ``choice``. ``input_specs``: (shape, dtype) of its input buffers, the program's
    realized inputs and then its ``n_params`` parameters (``Program.input_specs``; None: counted in
    ``g``): parameter ``i`` (a PARAM e-node) is input buffer ``len(input_specs) - n_params + i``.
    ``bodies``: filled with each kernel's name -> the classes its body computes (explain's provenance)."""
    if n_params is None:
        n_params = params_in(g)
    buffers = list(input_specs)
    kernels: list[Kernel] = []
    buffer_of: dict[int, int] = {}
    param_base = len(input_specs) - n_params

    def leaf_node(c: int) -> KNode | None:
        n = choice[c]
        if n.op == "BUF":
            return KNode("BUF", (), n.arg[0], g.shapes[c], g.dtypes[c])
        if n.op == "CONST":
            return KNode("CONST", (), cast_scalar(n.arg[0], g.dtypes[c]), g.shapes[c], g.dtypes[c])
        if n.op == "SIZE":           # a constant that remembers the size it is (graph/resize.py)
            return KNode("CONST", (), size_value(cast_scalar(n.arg[0], g.dtypes[c]), n.arg[0]), g.shapes[c],
                         g.dtypes[c])
        if n.op == "PARAM":
            if not 0 <= n.arg[0] < n_params:
                raise ValueError(f"build_plan: parameter {n.arg[0]} of {n_params}")
            return param_view(param_base + n.arg[0], g.shapes[c], g.dtypes[c])
        return None

    def kernel_for(k: int) -> int:
        """Emit (once) the kernel computing class k; returns its buffer id. Iterative DFS."""
        if k in buffer_of:
            return buffer_of[k]
        # collect kernel dependencies first (post-order), so producers come before consumers
        stack: list[tuple[int, bool]] = [(k, False)]
        while stack:
            c, done = stack.pop()
            if c in buffer_of:
                continue
            if done:
                _emit(c)
                continue
            stack.append((c, True))
            for dep in _deps(c):
                if dep not in buffer_of:
                    stack.append((dep, False))
        return buffer_of[k]

    def _body_classes(k: int) -> list[int]:
        out, seen, stack = [], set(), [k]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            out.append(c)
            n = choice[c]
            if n.op in ("BUF", "CONST", "SIZE") or (n.op in ("REALIZE", "CONTIGUOUS") and c != k):
                continue
            stack.extend(n.children)
        return out

    def _deps(k: int) -> list[int]:
        deps = []
        for c in _body_classes(k):
            n = choice[c]
            if n.op == "REALIZE" and leaf_node(n.children[0]) is None:
                deps.append(n.children[0])
            elif n.op == "CONTIGUOUS" and c != k:
                deps.append(c)               # always a kernel of its own: read from its buffer
        return deps

    def _emit(k: int) -> None:
        memo: dict[int, KNode] = {}

        def build(c: int) -> KNode:
            # iterative post-order build of the body DAG
            stack: list[tuple[int, bool]] = [(c, False)]
            while stack:
                x, done = stack.pop()
                if x in memo:
                    continue
                n = choice[x]
                lf = leaf_node(x)
                if lf is not None:
                    memo[x] = lf
                    continue
                if n.op == "REALIZE" and x != k:
                    inner = n.children[0]
                    lf = leaf_node(inner)
                    memo[x] = lf if lf is not None else KNode("BUF", (), buffer_of[inner], g.shapes[x], g.dtypes[x])
                    continue
                if n.op == "CONTIGUOUS" and x != k:
                    memo[x] = KNode("BUF", (), buffer_of[x], g.shapes[x], g.dtypes[x])
                    continue
                if not done:
                    stack.append((x, True))
                    stack.extend((ch, False) for ch in n.children if ch not in memo)
                    continue
                if n.op in ("CONTIGUOUS", "REALIZE"):
                    memo[x] = memo[n.children[0]]
                else:
                    memo[x] = KNode(n.op, tuple(memo[ch] for ch in n.children), n.arg, g.shapes[x], g.dtypes[x])
            return memo[c]

        ast = build(k)
        bid = len(buffers)
        buffers.append((g.shapes[k], g.dtypes[k]))
        buffer_of[k] = bid
        ins = ast.buffers()
        kc = costs.get(k) if costs else None
        if bodies is not None:
            bodies[f"k{len(kernels)}"] = _body_classes(k)
        kernels.append(Kernel(f"k{len(kernels)}", bid, ast, ins,
                              kc.seconds if kc else 0.0, kc.bytes if kc else 0, kc.flops if kc else 0,
                              tuple(sorted(kc.kind)) if kc else (), kc.stats if kc else None))

    outputs = []
    for r in g.roots:
        n = choice[r]
        if n.op == "BUF" and g.shapes[r] == input_specs[n.arg[0]][0]:
            outputs.append(n.arg[0])            # nothing to compute: alias the input buffer
        else:
            outputs.append(kernel_for(r))
    plan = KernelPlan(buffers, len(input_specs), kernels, outputs)
    plan.predicted = sum(k.predicted for k in kernels)
    return plan
