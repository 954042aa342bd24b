"""Exact extraction as an integer program (HiGHS), for small e-graphs, warm-started from greedy.

Variables (per e-node n, e-class c, potential kernel k -- the roots and every class with a
``Realize``):

- ``x[n]``      node n is chosen (binary); each used class chooses exactly one node
- ``e[k]``      kernel k exists: a root, or a chosen ``Realize(k)``
- ``m[c,k]``    class c is evaluated inside kernel k (so its work counts in k)
- ``q[n,k]``    node n is chosen and evaluated in k: its FLOPs count in k
- ``r[d,k]``    kernel k reads the buffer of class d (a materialized producer or an input)
- ``t[k]``      kernel k's time: ``t >= launch*e + bytes/bandwidth`` and ``t >= launch*e + compute``, the
  compute with the evaluator's charges (``_compute_seconds``: contractions at the contraction rate or
  unlaned, masked pad reads)
- ``L[c]``      a level per class, so the chosen graph is acyclic (MTZ constraints)

minimize ``sum t[k]``. The objective is a linear approximation of the evaluator (evaluate.py): a
node inlined under a broadcast is counted once per kernel rather than once per evaluation, a
reduction inside a root contraction's loop is charged as part of the contraction (the evaluator
charges it ``unlaned``), the launch after a stream (cost.py ``after_stream``: a ramp in a kernel's
bytes) is left out, a row-fused kernel's row passes (cost.py) are charged to its rows' reductions
but not to its output's pass, and
legality is encoded as "a reduction is never evaluated in a kernel with more output elements than
it has" (a necessary condition).

Warm start: greedy's plan is completed to a full assignment of the variables (the program solved
with greedy's nodes fixed) and handed to HiGHS as its first incumbent (``highspy``'s
``setSolution``; without highspy, scipy's ``milp`` gets the cutoff "objective <= greedy's" instead),
so the solver only ever improves on greedy's plan and a time limit still leaves a plan.

The solution is then costed with the same evaluator as every other extractor; an illegal kernel
adds a cut and the program is solved again. The ILP never returns a plan the evaluator rates worse
than greedy's: then greedy's plan is kept, and the status says so. ``info["ilp_status"]`` is the
solver's verdict: ``optimal``, ``time limit``, ``infeasible`` or ``skipped`` (above
``EQGRAD_ILP_MAX_CLASSES`` classes); ``Result.status`` reads ``optimal`` or ``time limit (best
found)`` for a plan the ILP found, and ``fallback to greedy: <verdict>, greedy's plan kept (why)``
or ``skipped: why`` where greedy's plan is returned.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from eqgrad.ops import MOVEMENT_OPS, OPS, REDUCE_OPS, numel
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice, body_classes
from eqgrad.extract.greedy import GreedyExtractor, Result

try:
    import highspy
except ImportError:           # pragma: no cover - scipy's milp (no warm start, an objective cutoff instead)
    highspy = None

STATUSES = ("optimal", "time limit", "infeasible", "skipped")
_BANNER = threading.Lock()
_quiet = False


@dataclass
class _Model:
    a: object                  # scipy.sparse csc matrix of the constraints
    lo: np.ndarray
    hi: np.ndarray
    cost: np.ndarray
    integrality: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    x: dict                    # (class, node index) -> column
    u: dict                    # class -> column
    t: dict                    # kernel -> column
    reach: list

    def fixed(self, g: EGraph, choice: Choice, used: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """Bounds with every x and u fixed to ``choice`` (``used``: its classes reachable from the roots)."""
        lb, ub = self.lb.copy(), self.ub.copy()
        for c in self.reach:
            v = 1.0 if c in used else 0.0
            lb[self.u[c]] = ub[self.u[c]] = v
            for i, n in enumerate(g.classes[c]):
                w = 1.0 if c in used and n is choice[c] else 0.0
                lb[self.x[(c, i)]] = ub[self.x[(c, i)]] = w
        return lb, ub

    def decode(self, g: EGraph, vec: np.ndarray) -> Choice:
        sol: Choice = {}
        for c in self.reach:
            if vec[self.u[c]] > 0.5:
                i = max(range(len(g.classes[c])), key=lambda i: vec[self.x[(c, i)]])
                sol[c] = g.classes[c][i]
        return sol


def _new_highs():
    """A quiet ``highspy.Highs`` (its constructor prints a banner on the first one of a process)."""
    global _quiet
    with _BANNER:
        if not _quiet:
            _quiet = True
            try:
                sys.stdout.flush()
                fd = os.dup(1)
                with open(os.devnull, "w") as null:
                    os.dup2(null.fileno(), 1)
                    try:
                        h = highspy.Highs()
                    finally:
                        os.dup2(fd, 1)
                        os.close(fd)
            except OSError:
                h = highspy.Highs()
        else:
            h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def _run(model: _Model, lb: np.ndarray, ub: np.ndarray, time_limit: float, start: np.ndarray | None = None,
         cutoff: float | None = None) -> tuple[str, np.ndarray | None, float]:
    """Solve ``model`` with bounds lb/ub: (status, solution or None, objective)."""
    if highspy is not None:
        h = _new_highs()
        a = model.a
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.cost, lb, ub
        lp.row_lower_, lp.row_upper_ = model.lo, model.hi
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
        lp.integrality_ = [highspy.HighsVarType.kInteger if v else highspy.HighsVarType.kContinuous
                           for v in model.integrality]
        h.passModel(lp)
        h.setOptionValue("time_limit", float(max(0.05, time_limit)))
        h.setOptionValue("mip_rel_gap", 1e-6)
        if start is not None:
            h.setSolution(len(start), np.arange(len(start), dtype=np.int32), np.asarray(start, dtype=np.float64))
        h.run()
        st = h.getModelStatus()
        S = highspy.HighsModelStatus
        status = {S.kOptimal: "optimal", S.kTimeLimit: "time limit", S.kInfeasible: "infeasible",
                  S.kUnboundedOrInfeasible: "infeasible"}.get(st, h.modelStatusToString(st).lower())
        info = h.getInfo()
        if info.primal_solution_status != 2:       # kSolutionStatusFeasible
            return status, None, float("inf")
        vec = np.array(h.getSolution().col_value)
        return status, vec, float(model.cost @ vec)
    from scipy.optimize import Bounds, LinearConstraint, milp
    cons = [LinearConstraint(model.a, model.lo, model.hi)]
    if cutoff is not None:           # greedy's plan as a bound, since milp takes no starting solution
        cons.append(LinearConstraint(model.cost.reshape(1, -1), -np.inf, cutoff))
    res = milp(model.cost, constraints=cons, integrality=model.integrality, bounds=Bounds(lb, ub),
               options=dict(time_limit=max(0.05, time_limit), disp=False))
    status = {0: "optimal", 1: "time limit", 2: "infeasible"}.get(res.status, str(res.message))
    if res.x is None:
        return status, None, float("inf")
    return status, res.x, float(model.cost @ res.x)


class ILPExtractor(GreedyExtractor):
    name = "ilp"

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], time_limit: float = 10.0,
                 max_classes: int = 300, keep_candidates: int = 0, peak_bound: int = 0):
        super().__init__(g, cost, inputs, max_passes=4, keep_candidates=keep_candidates, peak_bound=peak_bound)
        # (not ``self.ilp_time``: that is greedy's own search limit, and a tiny ILP limit stopped
        # the greedy search it starts from at the unfused plan)
        self.ilp_time, self.max_classes = time_limit, max_classes
        self._greedy_pairs: set[tuple[int, int]] = set()

    def extract(self) -> Result:
        greedy = super().extract()
        t0 = time.perf_counter()
        gt = greedy.evaluation.total
        info = dict(greedy.info, greedy_total=gt, ilp_solver="highspy" if highspy is not None else "scipy")
        reach = self._reachable_all()

        def kept(status: str, why: str) -> Result:
            info.update(ilp="skipped" if status == "skipped" else "fallback to greedy", ilp_status=status,
                        why=why if status == "skipped" else f"{status}, greedy's plan kept ({why})",
                        ilp_seconds=time.perf_counter() - t0, ilp_plan="greedy")
            return Result(greedy.choice, greedy.evaluation, self.name, greedy.alternatives_of, greedy.candidates, info)

        if len(reach) > self.max_classes:
            return kept("skipped", f"{len(reach)} classes > {self.max_classes} (EQGRAD_ILP_MAX_CLASSES)")
        used = self.ev.reachable(greedy.choice)
        # (reduction, kernel) pairs of greedy's legal plan: the static legality rows never forbid them
        # (a reduction under a reshape in a row-fused kernel, which the shape test misses)
        gev = self.ev.evaluate(greedy.choice)
        self._greedy_pairs = {(c, k) for k, rs in (gev.reads or {}).items() for c in rs
                              if c != k and c not in gev.kernels and greedy.choice[c].op in REDUCE_OPS}
        cuts: list[tuple[int, frozenset]] = []
        status, why = "time limit", ""
        for _round in range(8):
            left = self.ilp_time - (time.perf_counter() - t0)
            if left <= 0:
                status, why = "time limit", why or f"no plan better than greedy's within {self.ilp_time:g} s"
                break
            model = self._build(reach, cuts)
            # greedy's plan, completed to every variable (its nodes fixed): the solver's first incumbent
            lb, ub = model.fixed(self.g, greedy.choice, used)
            st0, start, gobj = _run(model, lb, ub, min(left, max(1.0, left / 4)))
            info["ilp_greedy_objective"] = gobj
            left = self.ilp_time - (time.perf_counter() - t0)
            status, vec, obj = _run(model, model.lb, model.ub, left, start=start,
                                    cutoff=gobj * (1 + 1e-9) + 1e-12 if start is not None else None)
            info["ilp_objective"] = obj
            if vec is None:
                why = (f"no plan within {self.ilp_time:g} s" if status == "time limit" else
                       "the integer program has no solution" if status == "infeasible" else f"HiGHS: {status}")
                break
            choice = dict(greedy.choice)
            choice.update(model.decode(self.g, vec))
            if not self.ev.is_acyclic(choice):
                why = "ILP plan has a cycle"
                break
            ev = self.ev.evaluate(choice)
            if ev.legal:
                info.update(ilp_total=ev.total)
                same = all(choice[c] is greedy.choice[c] for c in self.ev.reachable(choice))
                if same and status != "optimal":
                    why = f"no better plan found within {self.ilp_time:g} s"
                    break
                if not self.better(greedy.evaluation, ev):       # no worse than greedy's (bound first, then time)
                    info.update(ilp="optimal" if status == "optimal" else "time limit (best found)", ilp_status=status,
                                ilp_seconds=time.perf_counter() - t0, ilp_plan="ilp")
                    return Result(choice, ev, self.name, greedy.alternatives_of, greedy.candidates, info)
                why = f"ilp's {ev.total * 1e6:.1f} us > greedy's {gt * 1e6:.1f} us by the evaluator"
                break
            new_cuts = [cu for cu in self._cuts(choice, ev) if cu not in cuts]
            if not new_cuts:
                why = "ILP plan illegal: " + "; ".join(kc.why for kc in ev.kernels.values() if not kc.legal)
                break
            cuts += new_cuts
            why = "ILP plans illegal after 8 rounds of cuts"
        return kept(status, why)

    def _reachable_all(self) -> list[int]:
        out, stack = set(), list(self.g.roots)
        while stack:
            c = stack.pop()
            if c in out:
                continue
            out.add(c)
            for n in self.g.classes[c]:
                stack.extend(n.children)
        return sorted(out)

    def _row_fusable(self, c: int, k: int) -> bool:
        """Could reduction class c share kernel k through a row-invariant broadcast (evaluate.py's
        row fusion: hoisted, it is evaluated once per row, as the ILP counts it)? Only a shape test:
        whether it really is hoisted the evaluator decides, and a plan where it is not adds a cut."""
        if not self.cost.params.row_fusion:
            return False
        sc, sk = self.g.shapes[c], self.g.shapes[k]
        return len(sc) == len(sk) and all(a == b or a == 1 for a, b in zip(sc, sk))

    def _contractions(self, reach: list[int]) -> dict[int, int]:
        """The classes that may compute a contraction's sum or its product (a sum of a product with
        a broadcast factor: graph/plan.py ``broadcast_product``) under some choice of their nodes, each with
        the element count of that sum (the product's: its smallest such sum)."""
        g = self.g
        memo: dict[int, bool] = {}

        def broadcast(c: int) -> bool:
            # some node of c is an Expand, or a movement op over a class that has one
            todo, seen = [c], set()
            while todo:
                d = todo.pop()
                if d in memo:
                    if memo[d]:
                        break
                    continue
                if d in seen:
                    continue
                seen.add(d)
                if any(n.op == "EXPAND" for n in g.classes[d]):
                    break
                todo.extend(n.children[0] for n in g.classes[d] if n.op in MOVEMENT_OPS and n.children)
            else:
                memo[c] = False
                return False
            memo[c] = True
            return True

        out: dict[int, int] = {}
        for c in reach:
            for n in g.classes[c]:
                if n.op != "RSUM":
                    continue
                prod = n.children[0]
                if any(m.op == "MUL" and any(broadcast(f) for f in m.children) for m in g.classes[prod]):
                    size = numel(g.shapes[c])
                    out[c] = size
                    out[prod] = min(out.get(prod, size), size)
        return out

    def _compute_seconds(self, c: int, n, k: int, contractions: dict[int, int]) -> float:
        """Seconds node ``n`` (of class ``c``) adds to kernel ``k``'s compute, with the charges of the
        evaluator (evaluate.py, cost.py) that a linear program can carry: FLOPs at ``peak``; a
        contraction's sum and product at the ``contraction`` rate when it is evaluated once per
        output element of k, at ``unlaned`` times the FLOPs when it sits in a row-fused kernel with
        more output elements than it has (hoisted, without register lanes); a Pad read more often
        than k has output elements pays ``masked_read`` FLOPs per element. Counted once per kernel,
        as every term here (the evaluator counts per evaluation: a linear approximation)."""
        g, p = self.g, self.cost.params
        size_c, size_k = numel(g.shapes[c]), numel(g.shapes[k])
        flops = OPS[n.op].flops * (numel(g.shapes[n.children[0]]) if n.op in REDUCE_OPS else size_c)
        if n.op == "PAD" and size_c > size_k:
            return (flops + p.masked_read * size_c) / p.peak
        if flops and c in contractions and n.op in ("RSUM", "MUL"):
            if contractions[c] >= size_k:
                return flops / (p.contraction or p.peak)
            return flops * p.unlaned / p.peak
        if n.op in REDUCE_OPS and size_c < size_k and p.row_fusion:
            # a row's reduction in a row-fused kernel: its loop once per row (cost.py, row passes;
            # the output's own pass over each row is left out)
            return flops / p.peak + size_c * p.row_pass
        return flops / p.peak

    def _cuts(self, choice: Choice, ev) -> list[tuple[int, frozenset]]:
        """From each illegal kernel k of a plan, a no-good cut ``(k, R)``: the reductions R of its
        body are never all evaluated in k again (``sum m[c,k] <= |R| - 1``). Forbidding each
        reduction of R in k alone would cut off legal plans: a row-fused softmax is legal with its
        max and sum in the kernel, illegal once the contraction it reads joins them."""
        out = []
        for k, kc in ev.kernels.items():
            if kc.legal:
                continue
            red = frozenset(c for c in body_classes(choice, k, root=k) if c != k and choice[c].op in REDUCE_OPS)
            if red:
                out.append((k, red))
        return out

    def _build(self, reach: list[int], cuts: list[tuple[int, frozenset]]) -> "_Model":
        from scipy.sparse import coo_matrix
        g, p = self.g, self.cost.params
        cls = set(reach)
        kern = sorted({r for r in g.roots} | {k for k in self.realize_of if k in cls})
        nodes = [(c, i, n) for c in reach for i, n in enumerate(g.classes[c])]
        nvar = 0

        def alloc(count: int) -> int:
            nonlocal nvar
            nvar += count
            return nvar - count

        contractions = self._contractions(reach)
        x = {(c, i): alloc(1) for c, i, _ in nodes}
        u = {c: alloc(1) for c in reach}
        e = {k: alloc(1) for k in kern}
        m = {(c, k): alloc(1) for c in reach for k in kern}
        q = {(c, i, k): alloc(1) for c, i, n in nodes if n.op not in ("BUF", "CONST", "PARAM", "SIZE", "REALIZE") for k in kern}
        r = {(d, k): alloc(1) for d in reach for k in kern}
        t = {k: alloc(1) for k in kern}
        lv = {c: alloc(1) for c in reach}
        rows, cols, vals, lo, hi = [], [], [], [], []

        def row(coefs: dict[int, float], lb: float, ub: float) -> None:
            ri = len(lo)
            for j, v in coefs.items():
                rows.append(ri)
                cols.append(j)
                vals.append(v)
            lo.append(lb)
            hi.append(ub)

        inf = np.inf
        big = len(reach) + 1
        realize_node = {}     # class d -> (class-local index of its Realize node, inner class)
        leaf_node = {}
        for c, i, n in nodes:
            if n.op == "REALIZE":
                realize_node.setdefault(c, []).append((i, n.children[0]))
            if n.op in ("BUF", "CONST", "PARAM", "SIZE"):
                leaf_node.setdefault(c, []).append((i, n))
        for c in reach:
            row({**{x[(c, i)]: 1 for i in range(len(g.classes[c]))}, u[c]: -1}, 0, 0)
        for rt in g.roots:
            row({u[rt]: 1}, 1, 1)
            row({e[rt]: 1}, 1, 1)
        for c, i, n in nodes:
            for d in n.children:
                row({u[d]: 1, x[(c, i)]: -1}, 0, inf)                       # a chosen node's children are used
                row({lv[c]: 1, lv[d]: -1, x[(c, i)]: -big}, 1 - big, inf)   # acyclic: L[c] >= L[d] + 1
        for k in kern:
            row({m[(k, k)]: 1, e[k]: -1}, 0, inf)
            if k not in g.roots:
                # kernel k exists iff a chosen Realize(k) is used
                rc = self.realize_of[k]
                for i, inner in realize_node.get(rc, []):
                    if inner == k:
                        row({e[k]: 1, x[(rc, i)]: -1}, 0, inf)
        for c, i, n in nodes:
            if n.op in ("BUF", "CONST", "PARAM", "SIZE", "REALIZE"):
                continue
            for k in kern:
                row({q[(c, i, k)]: 1, m[(c, k)]: -1, x[(c, i)]: -1}, -1, inf)       # q >= m + x - 1
                if n.op in REDUCE_OPS and numel(g.shapes[k]) > numel(g.shapes[c]) and not self._row_fusable(c, k) \
                        and (c, k) not in self._greedy_pairs:
                    row({x[(c, i)]: 1, m[(c, k)]: 1}, -inf, 1)                     # legality (necessary)
                if n.op == "CONTIGUOUS" and c != k:
                    row({x[(c, i)]: 1, m[(c, k)]: 1}, -inf, 1)
                for d in n.children:
                    stop = {x[(d, j)]: -1 for j, _ in realize_node.get(d, [])}
                    stop.update({x[(d, j)]: -1 for j, _ in leaf_node.get(d, [])})
                    # evaluated in k unless materialized or a leaf: m[d,k] >= m[c,k] + x[n] - 1 - stop
                    row({m[(d, k)]: 1, m[(c, k)]: -1, x[(c, i)]: -1, **{j: -v for j, v in stop.items()}}, -1, inf)
                    for j, inner in realize_node.get(d, []):
                        if inner in e:   # reads the buffer of the materialized producer
                            row({r[(inner, k)]: 1, m[(c, k)]: -1, x[(c, i)]: -1, x[(d, j)]: -1}, -2, inf)
                    for j, _ in leaf_node.get(d, []):
                        row({r[(d, k)]: 1, m[(c, k)]: -1, x[(c, i)]: -1, x[(d, j)]: -1}, -2, inf)
        for k, red in cuts:
            if k in e and all((c, k) in m for c in red):
                row({m[(c, k)]: 1 for c in red}, -inf, len(red) - 1)
        if self.peak_bound:          # EQGRAD_PEAK_MEMORY: the buffers the kernels write
            row({e[k]: numel(g.shapes[k]) * g.dtypes[k].itemsize for k in kern}, -inf, self.peak_bound)
        for k in kern:
            write = numel(g.shapes[k]) * g.dtypes[k].itemsize
            bytes_row = {t[k]: 1, e[k]: -(p.launch + write / p.bandwidth)}
            for d in reach:
                bytes_row[r[(d, k)]] = -(numel(g.shapes[d]) * g.dtypes[d].itemsize) / p.bandwidth
            row(bytes_row, 0, inf)
            flops_row = {t[k]: 1, e[k]: -p.launch}
            for c, i, n in nodes:
                if (c, i, k) in q:
                    sec = self._compute_seconds(c, n, k, contractions)
                    if sec:
                        flops_row[q[(c, i, k)]] = -sec
            row(flops_row, 0, inf)
        cost = np.zeros(nvar)
        for k in kern:
            cost[t[k]] = 1.0
        integrality = np.zeros(nvar)
        for j in list(x.values()) + list(u.values()) + list(e.values()):
            integrality[j] = 1
        lb, ub = np.zeros(nvar), np.ones(nvar)
        for k in kern:
            ub[t[k]] = inf
        for c in reach:
            ub[lv[c]] = big
        a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nvar)).tocsc()
        return _Model(a, np.array(lo, float), np.array(hi, float), cost, integrality, lb, ub, x, u, t, reach)
