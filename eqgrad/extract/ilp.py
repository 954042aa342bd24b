"""Exact extraction as an integer program (HiGHS through scipy's ``milp``), for small e-graphs.

Variables (per e-node n, e-class c, potential kernel k -- the roots and every class with a
``Realize``):

- ``x[n]``      node n is chosen (binary); each used class chooses exactly one node
- ``e[k]``      kernel k exists: a root, or a chosen ``Realize(k)``
- ``m[c,k]``    class c is evaluated inside kernel k (so its work counts in k)
- ``q[n,k]``    node n is chosen and evaluated in k: its FLOPs count in k
- ``r[d,k]``    kernel k reads the buffer of class d (a materialized producer or an input)
- ``t[k]``      kernel k's time: ``t >= launch*e + bytes/bandwidth`` and ``t >= launch*e + flops/peak``
- ``L[c]``      a level per class, so the chosen graph is acyclic (MTZ constraints)

minimize ``sum t[k]``. The objective is the cost model of cost.py except that a node inlined under a
broadcast is counted once per kernel rather than once per evaluation; legality is encoded as
"a reduction is never evaluated in a kernel with more output elements than it has" (a necessary
condition). The solution is then costed with the exact evaluator; an illegal kernel adds a cut and
the program is solved again. Above ``EQGRAD_ILP_MAX_CLASSES`` classes, past the time limit, or when
HiGHS finds nothing, the greedy plan is returned (and ``info`` says why).
"""
from __future__ import annotations

import time

import numpy as np

from eqgrad.ops import OPS, REDUCE_OPS, numel
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph
from eqgrad.extract.evaluate import Choice
from eqgrad.extract.greedy import GreedyExtractor, Result


class ILPExtractor(GreedyExtractor):
    name = "ilp"

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], time_limit: float = 10.0,
                 max_classes: int = 300, keep_candidates: int = 0):
        super().__init__(g, cost, inputs, max_passes=4, keep_candidates=keep_candidates)
        self.time_limit, self.max_classes = time_limit, max_classes

    def extract(self) -> Result:
        greedy = super().extract()
        t0 = time.perf_counter()
        reach = self._reachable_all()
        if len(reach) > self.max_classes:
            greedy.extractor = self.name
            greedy.info.update(ilp="skipped", why=f"{len(reach)} classes > {self.max_classes} (EQGRAD_ILP_MAX_CLASSES)")
            return greedy
        cuts: list[tuple[int, int]] = []
        best, why = None, ""
        for _round in range(4):
            sol = self._solve(reach, cuts, self.time_limit - (time.perf_counter() - t0))
            if sol is None:
                why = "HiGHS found no solution within the time limit"
                break
            choice = dict(greedy.choice)
            choice.update(sol)
            if not self.ev.is_acyclic(choice):
                why = "ILP plan has a cycle"
                break
            ev = self.ev.evaluate(choice)
            if ev.legal:
                best = (choice, ev)
                break
            new_cuts = self._cuts(choice, ev)
            if not new_cuts:
                why = "ILP plan illegal: " + "; ".join(kc.why for kc in ev.kernels.values() if not kc.legal)
                break
            cuts += new_cuts
        info = dict(greedy.info, ilp_seconds=time.perf_counter() - t0, greedy_total=greedy.evaluation.total)
        if best is None or best[1].total > greedy.evaluation.total:
            info.update(ilp="fallback to greedy", why=why or "ILP plan costs more than greedy's under the exact model")
            return Result(greedy.choice, greedy.evaluation, self.name, greedy.alternatives_of, greedy.candidates, info)
        info.update(ilp="optimal" if self._status == 0 else "time limit (best found)")
        return Result(best[0], best[1], self.name, greedy.alternatives_of, greedy.candidates, info)

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

    def _cuts(self, choice: Choice, ev) -> list[tuple[int, int]]:
        """(reduce class, kernel) pairs to forbid, from the illegal kernels of a plan."""
        out = []
        for k, kc in ev.kernels.items():
            if kc.legal:
                continue
            for c in self.ev.reachable(choice):
                if choice[c].op in REDUCE_OPS and c != k:
                    out.append((c, k))
        return out

    def _solve(self, reach: list[int], cuts: list[tuple[int, int]], time_limit: float) -> Choice | None:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
        g, p = self.g, self.cost.params
        self._status = -1
        if time_limit <= 0:
            return None
        cls = set(reach)
        kern = sorted({r for r in g.roots} | {k for k in self.realize_of if k in cls})
        nodes = [(c, i, n) for c in reach for i, n in enumerate(g.classes[c])]
        nvar = 0

        def alloc(count: int) -> int:
            nonlocal nvar
            nvar += count
            return nvar - count

        x = {(c, i): alloc(1) for c, i, _ in nodes}
        u = {c: alloc(1) for c in reach}
        e = {k: alloc(1) for k in kern}
        m = {(c, k): alloc(1) for c in reach for k in kern}
        q = {(c, i, k): alloc(1) for c, i, n in nodes if n.op not in ("BUF", "CONST", "PARAM", "REALIZE") for k in kern}
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
            if n.op in ("BUF", "CONST", "PARAM"):
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
            if n.op in ("BUF", "CONST", "PARAM", "REALIZE"):
                continue
            for k in kern:
                row({q[(c, i, k)]: 1, m[(c, k)]: -1, x[(c, i)]: -1}, -1, inf)       # q >= m + x - 1
                if n.op in REDUCE_OPS and numel(g.shapes[k]) > numel(g.shapes[c]):
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
        for c, k in cuts:
            for i, n in enumerate(g.classes[c]):
                if n.op in REDUCE_OPS and (c, i, k) in q:
                    row({x[(c, i)]: 1, m[(c, k)]: 1}, -inf, 1)
        for k in kern:
            write = numel(g.shapes[k]) * g.dtypes[k].itemsize
            bytes_row = {t[k]: 1, e[k]: -(p.launch + write / p.bandwidth)}
            for d in reach:
                bytes_row[r[(d, k)]] = -(numel(g.shapes[d]) * g.dtypes[d].itemsize) / p.bandwidth
            row(bytes_row, 0, inf)
            flops_row = {t[k]: 1, e[k]: -p.launch}
            for c, i, n in nodes:
                if (c, i, k) in q:
                    w = OPS[n.op].flops * (numel(g.shapes[n.children[0]]) if n.op in REDUCE_OPS else numel(g.shapes[c]))
                    if w:
                        flops_row[q[(c, i, k)]] = -w / p.peak
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
        a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
        res = milp(cost, constraints=LinearConstraint(a, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
                   options=dict(time_limit=max(0.1, time_limit), disp=False))
        self._status = res.status
        if res.x is None:
            return None
        sol: Choice = {}
        for c in reach:
            if res.x[u[c]] > 0.5:
                i = max(range(len(g.classes[c])), key=lambda i: res.x[x[(c, i)]])
                sol[c] = g.classes[c][i]
        return sol
