"""The greedy extractor (default) and its improvement pass.

**greedy**
1. *Semantic choice.* Per e-class, the node of least tree cost (FLOP weight x elements + 1 per
   node), with ``Realize`` transparent -- this picks among algebra and movement variants (``x``
   over ``x*1``, a folded constant over its expression). Among nodes of equal cost it takes the one
   with the most ``Realize`` children: the plan starts *unfused*, which is always legal.
2. *Fusion by toggles* (shared/notes/fusion-prototype.md). A move takes one producer class P and
   switches *every* consumer edge between ``Realize(P)`` (materialize) and ``P`` (inline) at once;
   flipping single edges gets stuck exactly on materialize-vs-recompute decisions. A move is kept
   when the plan's total cost under the kernel cost model drops and every kernel stays legal.

**improve** adds per-class *flips* (any other node of a class, e.g. an algebra variant the tree
cost misjudged because it double counts shared subterms) to the toggles, and repeats passes until
no move improves.

Toggling only swaps ``Realize(P)`` and ``P`` children, which reach the same classes, so a plan that
starts acyclic stays acyclic; flips are checked for cycles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import Callable

from eqgrad.ops import OPS, numel
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph, ENode
from eqgrad.extract.evaluate import Choice, Evaluation, PlanEvaluator

INF = float("inf")


@dataclass
class Alternative:
    """A plan the extractor considered and did not keep."""
    move: str
    total: float
    kernels: int
    legal: bool
    why: str = ""


@dataclass
class Result:
    choice: Choice
    evaluation: Evaluation
    extractor: str
    # explain()'s rejected alternatives: every single move from the chosen plan, each an evaluation of
    # the plan, so they are computed when first read, not on every compile (for a BERT-shaped encoder
    # they were 1,018 of the extraction's 2,963 plan evaluations, issue 14)
    alternatives_of: Callable[[], list[Alternative]] | None = field(default=None, repr=False)
    candidates: list[tuple[float, Choice]] = field(default_factory=list)   # distinct legal plans seen
    info: dict = field(default_factory=dict)
    _alternatives: list[Alternative] | None = field(default=None, repr=False, compare=False)

    @property
    def alternatives(self) -> list[Alternative]:
        """Single moves away from the chosen plan, best legal first (computed once, on first use)."""
        if self._alternatives is None:
            self._alternatives = self.alternatives_of() if self.alternatives_of is not None else []
            self.alternatives_of = None          # the extractor's state is not kept once they are known
        return self._alternatives


class GreedyExtractor:
    name = "greedy"
    flips = False

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], max_passes: int = 4,
                 keep_candidates: int = 0, time_limit: float | None = None):
        self.g, self.cost = g, cost
        self.time_limit = time_limit      # seconds of local search (None: no limit); then the best plan so far
        self.ev = PlanEvaluator(g, cost, inputs)
        self.max_passes, self.keep = max_passes, keep_candidates
        self.realize_of: dict[int, int] = {}
        self.variants: list[dict[tuple, ENode]] = []
        for c, nodes in enumerate(g.classes):
            self.variants.append({(n.op, n.arg, n.children): n for n in nodes})
            for n in nodes:
                if n.op == "REALIZE":
                    self.realize_of[n.children[0]] = c
        self._candidates: dict[tuple, tuple[float, Choice]] = {}

    # ------------------------------------------------------------------ step 1
    def semantic_choice(self) -> Choice:
        g = self.g
        cost = [INF] * len(g.classes)
        best: list[ENode | None] = [None] * len(g.classes)
        is_realize = [any(n.op == "REALIZE" for n in nodes) for nodes in g.classes]
        changed = True
        while changed:
            changed = False
            for c, nodes in enumerate(g.classes):
                for n in nodes:
                    if any(cost[k] == INF for k in n.children):
                        continue
                    if n.op == "REALIZE":
                        # transparent: fused and unfused variants tie, and the tie goes to the
                        # unfused one (below); never a Realize of its own class (a cycle)
                        v = cost[n.children[0]] if n.children[0] != c else INF
                    else:
                        v = OPS[n.op].flops * numel(g.shapes[c]) + 1 + sum(cost[k] for k in n.children)
                    realized = sum(1 for k in n.children if is_realize[k])
                    cur = best[c]
                    # ties go to the unfused variant: a Realize node itself (a class that is both a
                    # value and its materialization, egraph._split_self_realize), then the node
                    # with more realized arguments
                    tie = v == cost[c] and cur is not None and (
                        (n.op == "REALIZE") > (cur.op == "REALIZE") or
                        (n.op == "REALIZE") == (cur.op == "REALIZE") and
                        realized > sum(1 for k in cur.children if is_realize[k]))
                    if v < cost[c] or tie:
                        if v < cost[c]:
                            changed = True
                        cost[c], best[c] = v, n
        missing = [c for c, b in enumerate(best) if b is None]
        if missing:
            raise RuntimeError(f"extraction: e-classes {missing[:8]} have no finite-cost node")
        return dict(enumerate(best))

    # ------------------------------------------------------------------ moves
    def toggle(self, choice: Choice, prod: int, inline: bool) -> Choice | None:
        r = self.realize_of.get(prod)
        if r is None:
            return None
        old, new = (r, prod) if inline else (prod, r)
        out = dict(choice)
        changed = False
        for c, n in choice.items():
            if n.op == "REALIZE" or old not in n.children:
                continue
            kids = tuple(new if k == old else k for k in n.children)
            v = self.variants[c].get((n.op, n.arg, kids))
            if v is None:      # saturation may have stopped before every variant was added
                for i, k in enumerate(n.children):
                    if k == old:
                        kk = out[c].children[:i] + (new,) + out[c].children[i + 1:]
                        v2 = self.variants[c].get((n.op, n.arg, kk))
                        if v2 is not None:
                            out[c] = v2
                            changed = True
                continue
            out[c] = v
            changed = True
        return out if changed else None

    def _move_specs(self, choice: Choice) -> list[tuple]:
        """The moves to try from ``choice``: ("toggle", producer, inline) and ("flip", class, node)."""
        used = self.ev.reachable(choice)
        specs: list[tuple] = []
        # smaller producers first: when materializing either of two nested producers improves the
        # plan (a padded input or the window tensor built from it), the first improving move is
        # taken, and the smaller one writes and reads fewer bytes
        for prod in sorted(self.realize_of, key=lambda c: numel(self.g.shapes[c])):
            if prod in used or self.realize_of[prod] in used:
                specs += [("toggle", prod, True), ("toggle", prod, False)]
        if self.flips:
            for c in sorted(used):
                specs += [("flip", c, n) for n in self.g.classes[c] if n.op != "REALIZE"]
        return specs

    def _apply(self, choice: Choice, spec: tuple) -> tuple[str, Choice | None]:
        kind, a, b = spec
        if kind == "toggle":
            return f"{'inline' if b else 'materialize'} class {a} ({self._describe(choice, a)})", self.toggle(choice, a, b)
        if choice.get(a) is b:
            return "", None
        cand = dict(choice)
        cand[a] = b
        return f"use {b.op} for class {a}", (cand if self.ev.is_acyclic(cand) else None)

    def _moves(self, choice: Choice):
        for spec in self._move_specs(choice):
            move, cand = self._apply(choice, spec)
            if cand is not None:
                yield move, cand

    def _describe(self, choice: Choice, c: int) -> str:
        n = choice[c]
        return f"{n.op} {list(self.g.shapes[c])}"

    def _remember(self, total: float, choice: Choice) -> None:
        if not self.keep:
            return
        key = tuple(sorted((c, id(n)) for c, n in choice.items() if c in self.ev.reachable(choice)))
        if key not in self._candidates:
            self._candidates[key] = (total, choice)

    def extract(self) -> Result:
        choice = self.semantic_choice()
        cur = self.ev.evaluate(choice)
        if not cur.legal:
            raise RuntimeError("extraction: the unfused starting plan is illegal: "
                               + "; ".join(kc.why for kc in cur.kernels.values() if not kc.legal))
        self._remember(cur.total, choice)
        passes = self.max_passes if len(self.realize_of) < 400 else 1
        rejected: dict[str, Alternative] = {}
        deadline = None if self.time_limit is None else time.perf_counter() + self.time_limit
        stopped = ""
        for _ in range(passes):
            improved = False
            for spec in self._move_specs(choice):
                if deadline is not None and time.perf_counter() > deadline:
                    stopped = (f"time limit {self.time_limit:g} s (EQGRAD_EXTRACT_TIME) after "
                               f"{self.ev.evaluations} plan evaluations")
                    break
                move, cand = self._apply(choice, spec)      # applied to the current (updated) choice
                if cand is None:
                    continue
                ev = self.ev.evaluate(cand)
                if ev.legal:
                    self._remember(ev.total, cand)
                if ev.legal and ev.total < cur.total * (1 - 1e-9):
                    choice, cur, improved = cand, ev, True
                else:
                    why = "" if ev.legal else next(kc.why for kc in ev.kernels.values() if not kc.legal)
                    rejected[move] = Alternative(move, ev.total, ev.n_kernels, ev.legal, why)
            if not improved or stopped:
                break
        cands = sorted(self._candidates.values(), key=lambda t: t[0])[:self.keep] if self.keep else []
        return Result(choice, cur, self.name, alternatives_of=lambda: self.alternatives_from(choice),
                      candidates=cands, info=dict(evaluations=self.ev.evaluations, **({"stopped": stopped} if stopped else {})))

    def alternatives_from(self, choice: Choice) -> list[Alternative]:
        """Every single move from ``choice``, evaluated: legal ones cheapest first, then illegal ones."""
        alts = []
        for move, cand in self._moves(choice):
            ev = self.ev.evaluate(cand)
            why = "" if ev.legal else next(kc.why for kc in ev.kernels.values() if not kc.legal)
            alts.append(Alternative(move, ev.total, ev.n_kernels, ev.legal, why))
        alts.sort(key=lambda a: (not a.legal, a.total))
        return alts


class ImproveExtractor(GreedyExtractor):
    """Greedy, then local search with per-class flips as well as toggles, until no move improves."""
    name = "improve"
    flips = True

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], max_passes: int = 6, keep_candidates: int = 0,
                 time_limit: float | None = None):
        super().__init__(g, cost, inputs, max_passes, keep_candidates, time_limit)
