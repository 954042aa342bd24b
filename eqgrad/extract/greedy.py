"""The greedy extractor (default) and its improvement pass.

**greedy**
1. *Semantic choice.* Per e-class, the node of least tree cost (FLOP weight x elements + 1 per
   node), with ``Realize`` transparent -- this picks among algebra and movement variants (``x``
   over ``x*1``, a folded constant over its expression). Among nodes of equal cost it takes the one
   with the most ``Realize`` children: the plan starts *unfused*, which is always legal.
2. *Fusion by toggles* (docs/extraction.md, "Extractors"). A move takes one producer class P and
   switches *every* consumer edge between ``Realize(P)`` (materialize) and ``P`` (inline) at once;
   flipping single edges gets stuck exactly on materialize-vs-recompute decisions. A move is kept
   when the plan's total cost under the kernel cost model drops and every kernel stays legal.

**improve** adds per-class *flips* (any other node of a class, e.g. an algebra variant the tree
cost misjudged because it double counts shared subterms) to the toggles, and repeats passes until
no move improves.

Toggling only swaps ``Realize(P)`` and ``P`` children, which reach the same classes, so a plan that
starts acyclic stays acyclic; flips are checked for cycles.

**Cost of the search** (docs/extraction.md, "What the search costs"). A move is evaluated
incrementally (evaluate.PlanState: only the kernels reading a changed class are re-costed), a toggle
visits only the consumers of its producer (an index built once), a flip's cycle check searches only
the flipped class's strongly connected component of the e-graph, and the semantic choice is two
Dijkstra-like passes instead of sweeps to a fixpoint. Each gives the same plans as the whole-plan
versions it replaced (random move sequences in tests/test_extract_incremental.py; every bench_core
workload and the e-graphs of the extractor, fusion, nn and training tests, compared with the
committed code: docs/extraction.md).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
import time
from typing import Callable

from eqgrad import progress
from eqgrad.ops import MOVEMENT_OPS, OPS, numel
from eqgrad.extract.cost import CostModel
from eqgrad.extract.egraph import EGraph, ENode
from eqgrad.extract.evaluate import _ULPS, Choice, Evaluation, PlanEvaluator, PlanState, body_classes

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
    # they were 1,018 of the extraction's 2,963 plan evaluations)
    alternatives_of: Callable[[], list[Alternative]] | None = field(default=None, repr=False)
    candidates: list[tuple[float, Choice]] = field(default_factory=list)   # distinct legal plans seen
    info: dict = field(default_factory=dict)
    _alternatives: list[Alternative] | None = field(default=None, repr=False, compare=False)

    @property
    def status(self) -> str:
        """How the extractor ended, in words: the ILP's "optimal" / "time limit (best found)" /
        "fallback to greedy: WHY" / "skipped: WHY", the measured extractor's verdict, a local
        search's "stopped: time limit ..." or "complete" -- so that a plan labelled "ilp" that is
        greedy's says so."""
        i = self.info
        if "ilp" in i:
            return i["ilp"] + (f": {i['why']}" if i.get("why") and i["ilp"] in ("fallback to greedy", "skipped") else "")
        if "verdict" in i:
            return str(i["verdict"])
        if isinstance(i.get("measured"), str):
            return i["measured"]
        if i.get("stopped"):
            return f"stopped: {i['stopped']}"
        return "complete"

    @property
    def alternatives(self) -> list[Alternative]:
        """Single moves away from the chosen plan, best legal first (computed once, on first use)."""
        if self._alternatives is None:
            self._alternatives = self.alternatives_of() if self.alternatives_of is not None else []
            self.alternatives_of = None          # the extractor's state is not kept once they are known
        return self._alternatives


_MOVEMENT = frozenset(MOVEMENT_OPS)


def _outermost(choice: Choice, reductions: tuple[int, ...]) -> tuple[int, ...]:
    """``reductions`` but those inside another one's body (``choice``'s nodes; all of them where
    each is inside another)."""
    inner = {c for r in reductions for c in body_classes(choice, r) if c != r} if len(reductions) > 1 else set()
    return tuple(r for r in reductions if r not in inner) or reductions


# follow moves of an inline under the memory bound that materialize what is still recomputed
# (``_apart_more``): attention's gradients need two (docs/lowering.md, Constants)
APART_ROUNDS = 3


class GreedyExtractor:
    name = "greedy"
    flips = False
    skip_rejected = True      # don't evaluate a rejected move again while nothing it read changed (_Rejected)
    DEFAULT_PASSES = 4

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], max_passes: int = DEFAULT_PASSES,
                 keep_candidates: int = 0, time_limit: float | None = None, peak_bound: int = 0):
        self.g, self.cost = g, cost
        self.time_limit = time_limit      # seconds of local search (None: no limit); then the best plan so far
        # EQGRAD_PEAK_MEMORY: bytes the plan's buffers may take (0: no bound). Plans are then compared
        # first by their bytes over the bound, then by time (``better``)
        if isinstance(peak_bound, bool) or not isinstance(peak_bound, int) or peak_bound < 0:
            raise ValueError(f"peak_bound: expected an integer number of bytes >= 0 (0: no bound), got {peak_bound!r}")
        self.peak_bound = peak_bound
        self.ev = PlanEvaluator(g, cost, inputs)
        self.max_passes, self.keep = max_passes, keep_candidates
        self.greedy_plan: tuple[Choice, Evaluation] | None = None      # improve: greedy's own plan, once found
        self.realize_of: dict[int, int] = {}
        self.variants: list[dict[tuple, ENode]] = []
        # consumers[k]: the classes with a node that has child k (a toggle visits only these)
        self.consumers: list[list[int]] = [[] for _ in g.classes]
        for c, nodes in enumerate(g.classes):
            self.variants.append({(n.op, n.arg, n.children): n for n in nodes})
            for n in nodes:
                if n.op == "REALIZE":
                    self.realize_of[n.children[0]] = c
            for k in {k for n in nodes for k in n.children}:
                self.consumers[k].append(c)
        # producers smallest first (see _move_specs); sorted once, stable as before
        self._by_size = sorted(self.realize_of, key=lambda c: numel(self.g.shapes[c]))
        self._scc = _cyclic_components(g)
        self._candidates: dict[tuple, tuple[float, Choice, int]] = {}
        self._state: PlanState | None = None
        # inline toggle -> the "apart" move it led to, or ("operand", producer, None): the apart move
        # that materializes the producer's broadcast operand as the plan is then (_search)
        self._follow: dict[tuple, tuple | None] = {}
        self._only: set[int] | None = None     # _rows_phase: the producers toggled (None: every one)
        self._largest_first = False    # toggles of the largest producers first (the memory bound's search)

    # ------------------------------------------------------------------ step 1
    def semantic_choice(self) -> Choice:
        """Per class, the least tree cost node; among nodes of equal cost the unfused one (a
        ``Realize`` node itself -- a class that is both a value and its materialization,
        egraph._split_self_realize -- then the node with more realized arguments).

        The rule is defined by :meth:`semantic_sweeps`, a fixpoint of sweeps over the classes in
        index order, where a tie between equally unfused nodes goes to the node the sweeps met
        first. Sweeping is quadratic on a long chain (one level per sweep when the classes run
        from the top of the chain down: 39 s of the 123 s that greedy took on a 2,000-op chain;
        this takes 0.4 s), so this computes the same
        choice in O(nodes log classes): the least costs by Knuth's generalization of Dijkstra's
        algorithm (a node's cost is at least each child's), then, for the nodes that attain them,
        the sweep in which the sweeps would first see all their children at their final cost
        (same sweep if the child comes first, else the next; again a Dijkstra-like pass), which
        orders the ties as the sweeps meet them. Exact because tree costs are integers (the op
        table's FLOP weights are); with any other cost it sweeps."""
        g = self.g
        # uses[k]: (class, node index) of every occurrence of class k as a child
        uses: list[list[tuple[int, int]]] = [[] for _ in g.classes]
        for c, nodes in enumerate(g.classes):
            for i, n in enumerate(nodes):
                for k in n.children:
                    uses[k].append((c, i))
        costs = _tree_costs(g, uses)
        if costs is None:
            return self.semantic_sweeps()
        cost, node_cost = costs
        optimal = [[i for i, w in enumerate(node_cost[c]) if w == cost[c]] for c in range(len(g.classes))]
        seen = _first_sweeps(g, optimal, uses)
        is_realize = [any(n.op == "REALIZE" for n in nodes) for nodes in g.classes]
        best: dict[int, ENode] = {}
        for c, nodes in enumerate(g.classes):
            # the most unfused node of least cost; among equals, the one the sweeps meet first
            ranked = [(-(nodes[i].op == "REALIZE"), -sum(1 for k in nodes[i].children if is_realize[k]), seen[c][i], i)
                      for i in optimal[c]]
            best[c] = nodes[min(ranked)[3]]
        return best

    def semantic_sweeps(self) -> Choice:
        """The semantic choice as a fixpoint of sweeps over the classes in index order (the
        definition :meth:`semantic_choice` computes faster). A class is scanned again only when a
        child's cost dropped since its last scan -- in the same sweep when the child comes before
        it, else in the next -- which skips exactly the scans that change nothing."""
        g = self.g
        cost = [INF] * len(g.classes)
        best: list[ENode | None] = [None] * len(g.classes)
        is_realize = [any(n.op == "REALIZE" for n in nodes) for nodes in g.classes]
        sweep = list(range(len(g.classes)))       # the first sweep scans every class
        while sweep:
            queued, later = set(sweep), set()
            heapq.heapify(sweep)
            while sweep:
                c = heapq.heappop(sweep)
                queued.discard(c)
                before = cost[c]
                for n in g.classes[c]:
                    if any(cost[k] == INF for k in n.children):
                        continue
                    if n.op == "REALIZE":
                        # transparent: fused and unfused variants tie, and the tie goes to the
                        # unfused one (below); never a Realize of its own class (a cycle)
                        v = cost[n.children[0]] if n.children[0] != c else INF
                    else:
                        v = _node_work(g, c, n) + 1 + sum(cost[k] for k in n.children)
                    realized = sum(1 for k in n.children if is_realize[k])
                    cur = best[c]
                    tie = v == cost[c] and cur is not None and (
                        (n.op == "REALIZE") > (cur.op == "REALIZE") or
                        (n.op == "REALIZE") == (cur.op == "REALIZE") and
                        realized > sum(1 for k in cur.children if is_realize[k]))
                    if v < cost[c] or tie:
                        cost[c], best[c] = v, n
                if cost[c] < before:
                    for p in self.consumers[c]:
                        if p > c:
                            if p not in queued:
                                queued.add(p)
                                heapq.heappush(sweep, p)
                        else:
                            later.add(p)
            sweep = sorted(later)
        missing = [c for c, b in enumerate(best) if b is None]
        if missing:
            raise RuntimeError(f"extraction: e-classes {missing[:8]} have no finite-cost node")
        return dict(enumerate(best))

    # ------------------------------------------------------------------ moves
    def toggle(self, choice: Choice, prod: int, inline: bool) -> Choice | None:
        """``choice`` with producer ``prod`` inlined into (or materialized for) all its consumers."""
        changes = self.toggle_changes(choice, prod, inline)
        return None if changes is None else {**choice, **changes}

    def toggle_changes(self, choice: Choice, prod: int, inline: bool) -> dict[int, ENode] | None:
        """The classes a toggle changes and their new nodes (None: it changes nothing). Every class
        whose chosen node has ``Realize(prod)`` (inline) or ``prod`` (materialize) as a child, whether
        the plan reaches it or not."""
        r = self.realize_of.get(prod)
        if r is None:
            return None
        old, new = (r, prod) if inline else (prod, r)
        out: dict[int, ENode] = {}
        for c in self.consumers[old]:
            n = choice.get(c)
            if n is None or n.op == "REALIZE" or old not in n.children:
                continue
            kids = tuple(new if k == old else k for k in n.children)
            v = self.variants[c].get((n.op, n.arg, kids))
            if v is None:      # saturation may have stopped before every variant was added
                cur = n
                for i, k in enumerate(n.children):
                    if k == old:
                        kk = cur.children[:i] + (new,) + cur.children[i + 1:]
                        v2 = self.variants[c].get((n.op, n.arg, kk))
                        if v2 is not None:
                            cur = v2
                if cur is not n:
                    out[c] = cur
                continue
            out[c] = v
        return out or None

    def _move_specs(self, choice: Choice, flips: bool | None = None) -> list[tuple]:
        """The moves to try from ``choice``: ("toggle", producer, inline) and ("flip", class, node)."""
        used = self.ev.reachable(choice)
        specs: list[tuple] = []
        # smaller producers first: when materializing either of two nested producers improves the
        # plan (a padded input or the window tensor built from it), the first improving move is
        # taken, and the smaller one writes and reads fewer bytes
        for prod in (reversed(self._by_size) if self._largest_first else self._by_size):
            if self._only is not None and prod not in self._only:
                continue
            if prod in used or self.realize_of[prod] in used:
                specs += [("toggle", prod, True), ("toggle", prod, False)]
        if self._only is None:
            specs += self._sink_specs(choice, used)
        if self.flips if flips is None else flips:
            for c in sorted(used):
                specs += [("flip", c, n) for n in self.g.classes[c] if n.op != "REALIZE"]
        return specs

    def _sink_specs(self, choice: Choice, used: set[int]) -> list[tuple]:
        """("sink", producer, target): a materialized producer whose chosen node is a movement op
        (a reshape or permute of a projection, as attention's q, k and v are) written instead as
        the data below its chain of movement ops -- ``target``, each class down the chain -- with
        the movement inlined into the readers. Which layout a buffer is written in matters to its
        readers (a product reads an operand with unit stride along its lanes, or not at all:
        BERT's p @ v at 96 against 300 us predicted), and no single toggle reaches it: inlining
        the producer alone fuses the projection into the product, materializing the data alone
        adds a copy."""
        specs: list[tuple] = []
        for prod in self._by_size:
            if self.realize_of[prod] not in used:
                continue
            n, seen = choice.get(prod), {prod}
            while n is not None and OPS[n.op].kind == "movement" and len(n.children) == 1:
                target = n.children[0]
                if target in seen:
                    break
                seen.add(target)
                if target in self.realize_of:
                    specs.append(("sink", prod, target))
                n = choice.get(target)
        return specs

    def _apply(self, st: PlanState, spec: tuple) -> tuple[str, dict[int, ENode] | None, bool]:
        """A move from the state's plan: its description, the classes it changes (None: not a move)
        and whether it keeps every chosen node acyclic (so the state can evaluate it incrementally)."""
        kind, a, b = spec
        choice = st.choice
        if kind == "toggle":
            changes = self.toggle_changes(choice, a, b)
            move = f"{'inline' if b else 'materialize'} class {a} ({self._describe(choice, a)})"
            if changes is None:
                return move, None, True
            # Realize(P) and P reach the same classes when Realize(P)'s class chooses Realize(P)
            rn = choice.get(self.realize_of[a])
            return move, changes, rn is not None and rn.op == "REALIZE" and rn.children == (a,)
        if kind == "sink":
            move = f"write class {b} ({self._describe(choice, b)}) for class {a} ({self._describe(choice, a)})"
            first = self.toggle_changes(choice, a, True)
            if first is None:
                return move, None, True
            then = self.toggle_changes({**choice, **first}, b, False)
            if then is None:
                return move, None, True
            ra, rb = choice.get(self.realize_of[a]), choice.get(self.realize_of[b])
            safe = all(r is not None and r.op == "REALIZE" and r.children == (c,) for r, c in ((ra, a), (rb, b)))
            return move, {**first, **then}, safe
        if kind == "apart":
            move = (f"inline class {a} ({self._describe(choice, a)}), materializing "
                    + ", ".join(f"class {r} ({self._describe(choice, r)})" for r in b))
            changes = self.toggle_changes(choice, a, True)
            if changes is None:
                return move, None, True
            merged = {**choice, **changes}
            for r in b:
                more = self.toggle_changes(merged, r, False)
                if more is None:
                    return move, None, True
                changes.update(more)
                merged.update(more)
            safe = True
            for c in (a,) + b:
                rn = choice.get(self.realize_of[c])
                safe = safe and rn is not None and rn.op == "REALIZE" and rn.children == (c,)
            return move, changes, safe
        if choice.get(a) is b:
            return "", None, True
        move = f"use {b.op} for class {a}"
        if not st.acyclic:
            cand = {**choice, a: b}
            return move, ({a: b} if self.ev.is_acyclic(cand) else None), False
        return move, (None if self._flip_closes_cycle(st, a, b) else {a: b}), True

    def _flip_closes_cycle(self, st: PlanState, a: int, b: ENode) -> bool:
        """Would choosing ``b`` for class ``a`` give the plan a cycle reachable from the roots (what
        ``PlanEvaluator.is_acyclic`` of the flipped choice answers), given that no chosen nodes form a
        cycle now? A new cycle passes through ``a`` and a child of ``b`` and stays inside the
        strongly connected component of the e-graph that holds ``a``, so only that is searched."""
        comp = self._scc.get(a)
        if comp is None or not st.reachable(a):
            return False
        choice = st.choice
        stack = [ch for ch in b.children if self._scc.get(ch) == comp]
        seen: set[int] = set()
        while stack:
            c = stack.pop()
            if c == a:
                return True
            if c in seen:
                continue
            seen.add(c)
            stack.extend(ch for ch in choice[c].children if self._scc.get(ch) == comp)
        return False

    def _evaluate(self, st: PlanState, changes: dict[int, ENode], safe: bool) -> Evaluation:
        if safe and st.acyclic:
            return st.evaluate(changes)
        return self.ev.evaluate({**st.choice, **changes})      # the reference, where a cycle may close

    def _accept(self, st: PlanState, ev: Evaluation, changes: dict[int, ENode]) -> PlanState:
        if ev.delta is not None:
            st.accept(ev)
            return st
        return PlanState(self.ev, {**st.choice, **changes}, ev)

    def over(self, ev: Evaluation) -> int:
        """The bytes by which plan ``ev``'s buffers exceed the bound (0 without one)."""
        return max(0, ev.peak - self.peak_bound) if self.peak_bound else 0

    def better(self, ev: Evaluation, cur: Evaluation) -> bool:
        """Is the legal plan ``ev`` an improvement on ``cur``: fewer bytes over the memory bound,
        or as many and faster (by more than rounding)."""
        if not ev.legal:
            return False
        if self.peak_bound:
            a, b = self.over(ev), self.over(cur)
            if a != b:
                return a < b
        return ev.total < cur.total * (1 - 1e-9)

    def _describe(self, choice: Choice, c: int) -> str:
        n = choice[c]
        return f"{n.op} {list(self.g.shapes[c])}"

    def _remember(self, ev: Evaluation, choice: Choice) -> None:
        if not self.keep:
            return
        used = self.ev.reachable(choice)
        key = tuple(sorted((c, id(n)) for c, n in choice.items() if c in used))
        if key not in self._candidates:
            self._candidates[key] = (ev.total, choice, ev.peak)     # (its bytes, for the memory bound)

    def extract(self) -> Result:
        choice = self.semantic_choice()
        cur = self.ev.evaluate(choice)
        if not cur.legal:
            raise RuntimeError("extraction: the unfused starting plan is illegal: "
                               + "; ".join(kc.why for kc in cur.kernels.values() if not kc.legal))
        # Under a memory bound the search first runs as without one (the fastest plan, kept when it
        # fits), then again from there with the bound (``better``: fewest bytes over it first).
        # Judged by the bound from the unfused plan (every buffer stored: the most memory), the first
        # moves taken were any that saved bytes, however slow: an MLP step's GELU was recomputed
        # inside its weight gradient's contraction, 25.9 ms predicted, where the fastest plan
        # (1.7 ms) fitted the bound
        bound, self.peak_bound = self.peak_bound, 0
        self._remember(cur, choice)
        st = PlanState(self.ev, choice, cur)
        start, start_ev = dict(choice), cur          # the unfused plan: improve searches from it twice
        # every program gets all its passes: one pass for programs of 400+ producers dated from when
        # a move evaluated the whole plan. A later pass revisits the early greedy inlining (a
        # residual stream inlined into every later layer's kernels); LLaMA-shaped 30-layer step:
        # predicted 24.84 -> 24.50 ms, 427 -> 394 kernels, 87 -> 50 distinct kernel sources (what
        # LLVM compiles), extraction 2.2 -> 5.3 s (EQGRAD_EXTRACT_TIME still bounds it)
        deadline = None if self.time_limit is None else time.perf_counter() + self.time_limit
        # rejected moves whose evaluation could not have changed are not evaluated again (the last
        # pass, which finds nothing by definition, is mostly skips); off when candidates are kept,
        # since a skipped move is not remembered as a candidate of the new plan (nor under the memory
        # bound, below, where a move is judged by the bytes over it as well as by its total)
        seen = _Rejected() if self.skip_rejected and not self.keep else None
        st, cur, stopped = self._search(st, cur, self.flips, self.max_passes, deadline, seen)
        seen2 = None
        if self.flips and not stopped:
            # NOTE: and again from greedy's own plan (its toggles and passes, then flips as well),
            # keeping the better: moves are only taken when they improve, so improve is never worse
            # than greedy by the cost model. Interleaving flips with toggles from the start alone
            # reached worse local optima (a 2-layer MLP step 130.1 vs greedy's 117.3 us
            # predicted), and sometimes better ones (mlp_step 1012.6 vs 1015.9 us): both are tried
            seen2 = _Rejected() if self.skip_rejected and not self.keep else None
            st2 = PlanState(self.ev, start, start_ev)
            st2, cur2, stopped = self._search(st2, start_ev, False, GreedyExtractor.DEFAULT_PASSES, deadline, seen2)
            self.greedy_plan = (dict(st2.choice), cur2) if not stopped else None     # (the measured extractor's)
            if not stopped:
                st2, cur2, stopped = self._search(st2, cur2, True, self.max_passes, deadline, seen2)
            if self.better(cur2, cur):
                st, cur = st2, cur2
        rows_moves: list[str] = []
        if not stopped:
            st, cur, stopped = self._rows_phase(st, cur, deadline, rows_moves)
        self.peak_bound = bound
        memory_moves: list[str] = []
        if bound and self.over(cur) and not stopped:
            memory_moves.append(f"fastest plan: {cur.peak} bytes, {cur.total * 1e6:.1f} us")
            if not self.ev.rows:          # (every toggle priced as the lowering keeps rows: _rows_phase)
                st, cur = self._priced_with_rows(st)
            # the largest producers' toggles first: the first move that lowers the bytes over the
            # bound is taken, and one that stores a big buffer no longer saves the most
            self._largest_first = True
            try:
                st, cur, stopped = self._search(st, cur, self.flips, self.max_passes, deadline, None, memory_moves)
            finally:
                self._largest_first = False
        self._state = st
        choice = dict(st.choice)
        cands = sorted((t for t in self._candidates.values() if not (bound and t[2] > bound)),
                       key=lambda t: t[0])[:self.keep] if self.keep else []
        cands = [(total, c) for total, c, _ in cands]
        skipped = sum(s.skipped for s in (seen, seen2) if s is not None)
        info = dict(evaluations=self.ev.evaluations, skipped=skipped, peak=cur.peak)
        if self.peak_bound:
            info["peak_bound"] = self.peak_bound
        if memory_moves:
            info["memory_moves"] = memory_moves       # explain(): what the bound made the search do
        if rows_moves:
            info["rows_moves"] = rows_moves           # explain(): what pricing the rows kept made it do
        return Result(choice, cur, self.name, alternatives_of=lambda: self.alternatives_from(choice),
                      candidates=cands, info=dict(info, **({"stopped": stopped} if stopped else {})))

    def _rows_phase(self, st: PlanState, cur: Evaluation, deadline: float | None, taken: list[str] | None = None
                    ) -> tuple[PlanState, Evaluation, str]:
        """The plan priced again as the lowering runs a row-fused kernel that keeps its rows
        (evaluate.py ``rows``: a row stash, row dots), and the toggles of the producers around its
        row-fused kernels searched once more under that pricing: attention's scores and
        probabilities inlined into its ``p @ v``, one kernel that writes no score matrix, which
        single toggles reach from the three-kernel plan only when both are priced so (inlining the
        probabilities alone is then the faster plan: 6.95 -> 5.0 ms predicted at b1 h4 s1024 d64,
        measured 9.9-16.8 -> 7.9-13.7 ms on a noisy Zen 4). Only those producers are toggled -- the
        rows pricing changes nothing else -- so a program with no row-fused kernel costs nothing
        more (a whole second search had doubled extraction: llama 30 layers 0.27 -> 1.02 s). A plan
        with none keeps the earlier pricing. ``taken``: the plan priced so, then each move taken
        (explain() shows them)."""
        rowed = [k for k, kc in cur.kernels.items() if "row-fused" in kc.kind]
        if not rowed:
            return st, cur, ""
        st, cur = self._priced_with_rows(st)
        self._only = set(rowed) | {d for k in rowed for d in cur.deps[k]}
        moves: list[str] = [f"priced as the lowering keeps rows: {cur.n_kernels} kernels, {cur.total * 1e6:.1f} us"]
        try:
            out = self._search(st, cur, False, self.max_passes, deadline, None, moves)
            if taken is not None and len(moves) > 1:
                taken += moves
            return out
        finally:
            self._only = None

    def _priced_with_rows(self, st: PlanState) -> tuple[PlanState, Evaluation]:
        """The evaluator switched to pricing row-fused kernels as the lowering keeps their rows
        (evaluate.py ``rows``; its costed bodies forgotten), and ``st``'s plan priced so."""
        self.ev.rows = True
        self.ev.forget()
        cur = self.ev.evaluate(st.choice)
        return PlanState(self.ev, st.choice, cur), cur

    def _search(self, st: PlanState, cur: Evaluation, flips: bool, passes: int, deadline: float | None,
                seen: "_Rejected | None", taken: list[str] | None = None) -> tuple[PlanState, Evaluation, str]:
        """Passes of improving moves (toggles; and flips when ``flips``) until one finds none, the
        pass count or the deadline: the final state, its evaluation, why it stopped early ("")."""
        stopped = ""
        for pass_no in range(passes):
            improved = False
            specs = self._move_specs(st.choice, flips)
            progress.update(search_pass=pass_no + 1, moves=len(specs))
            for i, spec in enumerate(specs):
                if i % 256 == 0:
                    progress.update(plan_evaluations=self.ev.evaluations)
                if deadline is not None and time.perf_counter() > deadline:
                    stopped = (f"time limit {self.time_limit:g} s (EQGRAD_EXTRACT_TIME) after "
                               f"{self.ev.evaluations} plan evaluations")
                    break
                move, changes, safe = self._apply(st, spec)      # applied to the current (updated) plan
                if changes is None:
                    continue
                if seen is not None and seen.rejects(spec, changes, st, cur.total):
                    # known illegal or worse; an inline that recomputed a reduction is followed, as
                    # below, by the move its last evaluation led to (nothing it read has changed)
                    spec = self._follow.get(spec)
                    if spec is not None and spec[0] == "operand":
                        # (its operand as the plan is now, as the evaluated branch below finds it)
                        spec = self._operand_apart(spec[1], {**st.choice, **changes})
                    tried = self._try(st, spec, seen, cur) if spec is not None else None
                    if tried is None:
                        continue
                    move, changes, safe, ev = tried
                else:
                    ev = self._evaluate(st, changes, safe)
                    follow = self._follow_of(spec, ev, cur, {**st.choice, **changes}) \
                        if spec[0] == "toggle" and spec[2] else None
                    if follow is not None:
                        # the inline rejected, the move it leads to tried instead
                        if ev.legal and self.keep:
                            self._remember(ev, {**st.choice, **changes})
                        if seen is not None:
                            seen.rejected(spec, changes, st, ev)
                        spec = follow
                        tried = self._try(st, spec, seen, cur)
                        if tried is None:
                            continue
                        move, changes, safe, ev = tried
                if ev.legal and self.keep:
                    self._remember(ev, {**st.choice, **changes})
                if self.better(ev, cur):
                    if seen is not None:
                        seen.accepted(st, ev)
                    if taken is not None:
                        taken.append(f"{move}: {ev.peak} bytes, {ev.total * 1e6:.1f} us")
                    st, cur, improved = self._accept(st, ev, changes), ev, True
                elif seen is not None:
                    seen.rejected(spec, changes, st, ev)
            if not improved or stopped:
                break
        return st, cur, stopped

    def _try(self, st: PlanState, spec: tuple, seen: "_Rejected | None", cur: Evaluation
             ) -> tuple[str, dict[int, ENode], bool, Evaluation] | None:
        """A follow move applied and evaluated: (its description, changes, safety, evaluation), or None
        where it is not a move or is known to be rejected."""
        move, changes, safe = self._apply(st, spec)
        if changes is None or (seen is not None and seen.rejects(spec, changes, st, cur.total)):
            return None
        return move, changes, safe, self._evaluate(st, changes, safe)

    def _follow_of(self, spec: tuple, ev: Evaluation, cur: Evaluation, inlined: Choice) -> tuple | None:
        """The move an inline toggle ``spec`` (evaluated as ``ev``; ``inlined``: the plan with it)
        leads to, remembered in ``_follow`` for when it is skipped: where it is illegal, the inline
        with the reductions it recomputes materialized (``_apart``); where it is legal but not better,
        the inline with its product's computed broadcast operand materialized -- a product whose
        broadcast operand is computed (RoPE's rotated q in q @ k.T: masked reads in the contraction's
        loop, once per key) then fuses into its sum and the operand is one small kernel, where
        single toggles stopped at the product written out and summed by a kernel of its own."""
        if not ev.legal:
            follow = self._follow[spec] = self._apart(spec[1], ev, inlined)
            return follow
        if self.better(ev, cur):
            return None
        follow = self._operand_apart(spec[1], inlined)
        if follow is not None:
            self._follow[spec] = ("operand", spec[1], None)      # (its operand looked up again when skipped)
        return follow

    def _operand_apart(self, prod: int, choice: Choice) -> tuple | None:
        """("apart", prod, (its computed broadcast operand,)) in ``choice``, or None where it has none."""
        operand = self._broadcast_operand(prod, choice, None)
        return ("apart", prod, (operand,)) if operand is not None else None

    def _apart(self, prod: int, ev: Evaluation, choice: Choice) -> tuple | None:
        """("apart", prod, the classes to materialize): the move that inlines ``prod`` as the
        illegal evaluation ``ev`` did (``choice``: the plan with that inline), with what made it
        illegal materialized instead; None where that cannot be. A contraction's product fused into
        a producer that holds another reduction (a 2-layer MLP's first weight gradient reads dh, the
        second layer's ``dlogits @ w2.T`` times gelu'): inlining the product into the sum recomputes
        that reduction, materializing it alone leaves the product materialized, so single toggles
        stopped at a plan that wrote the 256 x 256 x 384 product (101 MB, 3 + 130 ms against 0.4).
        Where the recomputed reductions lie under a *broadcast* operand of the product (dh, expanded
        along the contraction's output axis), that operand is what gets materialized
        (``_broadcast_operand``): with only the reductions stored, the rest of dh (gelu' and its
        multiply) stays inlined and is evaluated once per product element, 384 times per value --
        on a machine whose BLAS timed slow that plan priced above the 101 MB product, which the
        search then kept (225 ms a step against 1.4)."""
        d = ev.delta
        costs = [e[0] for e in d.fresh.values()] if d is not None else list(ev.kernels.values())
        found = tuple(sorted({r for kc in costs if not kc.legal for r in kc.recomputed}))
        if self.peak_bound:
            # under the memory bound: a recomputed reduction inside another one's body is computed
            # by that one's kernel once it is materialized -- the scores inside a row's max that
            # attention's dv would recompute (storing them too stores the score matrix the bound
            # keeps out). Default plans keep materializing every one (their moves as measured)
            found = _outermost(choice, found)
        if not found or prod in found or any(r not in self.realize_of for r in found):
            return None
        operand = self._broadcast_operand(prod, choice, set(found))
        if operand is not None or not self.peak_bound:
            return ("apart", prod, (operand,) if operand is not None else found)
        return ("apart", prod, self._apart_more(prod, found, choice))

    def _apart_more(self, prod: int, found: tuple[int, ...], choice: Choice) -> tuple[int, ...]:
        """Under the memory bound: ``found`` and the reductions still recomputed once those are
        materialized, added while some are (APART_ROUNDS at most). Attention's dk with its
        probabilities inlined recomputes the row's sum(p * dp), and the row's sum of exponentials
        inside and beside it: the first materialized alone leaves the second recomputed."""
        out, new, merged = found, found, dict(choice)
        for _ in range(APART_ROUNDS):
            for r in new:                      # (the plan with the classes added so far materialized)
                more = self.toggle_changes(merged, r, False)
                if more is None:
                    return out
                merged.update(more)
            ev = self.ev.evaluate(merged)
            again = tuple(sorted({r for kc in ev.kernels.values() if not kc.legal for r in kc.recomputed}
                                 - set(out)))
            if ev.legal or not again or prod in again or any(r not in self.realize_of for r in again):
                return out
            new = _outermost(merged, again)
            out = out + new
        return out

    def _broadcast_operand(self, prod: int, choice: Choice, reductions: set[int] | None) -> int | None:
        """The computed, inlined class that an operand of ``prod``'s chosen node reads through movement
        ops that include an ``Expand`` (an operand broadcast along the product's axes), whose chosen
        body (up to stored buffers) holds one of ``reductions`` (None: any body) and that can be
        materialized; None where no operand is such."""
        node = choice.get(prod)
        if node is None:
            return None
        for c in node.children:
            expanded = False
            n = choice.get(c)
            while n is not None and n.op in _MOVEMENT:
                expanded = expanded or n.op == "EXPAND"
                c = n.children[0]
                n = choice.get(c)
            if n is None or n.op == "REALIZE" or not expanded or c not in self.realize_of:
                continue
            if reductions is None:
                return c
            if c in reductions:
                continue
            seen, todo = {c}, [c]
            while todo:
                x = choice.get(todo.pop())
                if x is None or x.op == "REALIZE":
                    continue
                for k in x.children:
                    if k in reductions:
                        return c
                    if k not in seen:
                        seen.add(k)
                        todo.append(k)
        return None

    def alternatives_from(self, choice: Choice) -> list[Alternative]:
        """Every single move from ``choice``, evaluated: legal ones cheapest first, then illegal ones."""
        st = self._state
        if st is None or st.choice != choice:
            st = PlanState(self.ev, choice)
        alts = []
        for spec in self._move_specs(choice):
            move, changes, safe = self._apply(st, spec)
            if changes is None:
                continue
            ev = self._evaluate(st, changes, safe)
            alts.append(Alternative(move, ev.total, ev.n_kernels, ev.legal, ev.why))
        alts.sort(key=lambda a: (not a.legal, a.total))
        return alts


class _Rejected:
    """The rejected moves of a local search, and what their evaluations depended on, so that a move
    is evaluated again only when that may have changed ("don't-look bits").

    An incremental evaluation (``PlanState.evaluate``) of a move reads: the chosen nodes of the
    classes it changes and of every class the re-costed kernels read, who reads the changed
    classes, and the costs, dependencies and reference counts of the kernels it touches (re-costed,
    dropped, or whose count it changes). An accepted move *touches* the classes it changes and
    every class read by a kernel it re-costs or drops (before or after: their readers change), and
    every kernel in its delta. A move rejected after ``n`` accepts, with the same changes now and
    nothing it read touched since, has the same evaluation: the same legality and the same exact
    change of the total, so whether it would be accepted now is known without evaluating it
    (``rejects`` answers from that, and evaluates nothing). Moves evaluated from scratch (one that
    may close a cycle) and plans with a total that is not finite are not remembered.
    """

    def __init__(self) -> None:
        self.step = 0                                  # moves accepted so far
        self.classes: dict[int, int] = {}              # class -> step of the last accept that touched it
        self.kernels: dict[int, int] = {}              # kernel -> the same
        self.moves: dict[tuple, tuple] = {}            # spec -> (changes, step, classes, kernels, legal, delta)
        self.skipped = 0

    def rejected(self, spec: tuple, changes: dict[int, ENode], st: PlanState, ev: Evaluation) -> None:
        d = ev.delta
        if d is None or d.version != st.version or d.exact is None or st.exact is None:
            self.moves.pop(spec, None)
            return
        classes = set(changes)
        for _, _, reads in d.fresh.values():
            classes |= reads
        kernels = set(d.fresh) | d.removed | set(d.refs)      # (the re-costed readers are in fresh or removed)
        self.moves[spec] = (dict(changes), self.step, classes, kernels, ev.legal, d.exact - st.exact)

    def rejects(self, spec: tuple, changes: dict[int, ENode], st: PlanState, total: float) -> bool:
        """Is ``spec`` (now giving ``changes``) known to be rejected from the current plan?"""
        m = self.moves.get(spec)
        if m is None or st.exact is None:
            return False
        old, step, classes, kernels, legal, delta = m
        if len(old) != len(changes) or any(old.get(c) is not n for c, n in changes.items()):
            return False
        if step < self.step:
            tc, tk = self.classes, self.kernels
            if any(tc.get(c, -1) >= step for c in classes) or any(tk.get(k, -1) >= step for k in kernels):
                return False
        if legal and (st.exact + delta) / _ULPS < total * (1 - 1e-9):
            return False          # it would be accepted now: evaluated (and accepted) by the caller
        self.skipped += 1
        return True

    def accepted(self, st: PlanState, ev: Evaluation) -> None:
        """Record what ``ev`` (about to be accepted into ``st``) touches."""
        d = ev.delta
        if d is None:                                  # a new state: nothing remembered holds
            self.moves.clear()
        else:
            s, tc, tk = self.step, self.classes, self.kernels
            for c in d.changed:
                tc[c] = s
            for k in list(d.fresh) + list(d.removed):
                for c in st.reads.get(k, ()):
                    tc[c] = s
                tk[k] = s
            for _, _, reads in d.fresh.values():
                for c in reads:
                    tc[c] = s
            for k in d.refs:
                tk[k] = s
        self.step += 1


def _cyclic_components(g: EGraph) -> dict[int, int]:
    """The classes on a cycle of the e-graph (a class reaching itself through some nodes' children),
    each mapped to its strongly connected component; the other classes are absent. Iterative
    Tarjan, O(nodes)."""
    kids = [sorted({k for n in nodes for k in n.children}) for nodes in g.classes]
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    comp_stack: list[int] = []
    out: dict[int, int] = {}
    counter = 0
    for root in range(len(g.classes)):
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        comp_stack.append(root)
        on.add(root)
        work = [(root, iter(kids[root]))]
        while work:
            c, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    comp_stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(kids[nxt])))
                elif nxt in on:
                    low[c] = min(low[c], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[c])
            if low[c] == index[c]:
                members = []
                while True:
                    x = comp_stack.pop()
                    on.discard(x)
                    members.append(x)
                    if x == c:
                        break
                if len(members) > 1 or c in kids[c]:
                    for x in members:
                        out[x] = c
    return out


class ImproveExtractor(GreedyExtractor):
    """Greedy, then local search with per-class flips as well as toggles, until no move improves."""
    name = "improve"
    flips = True

    def __init__(self, g: EGraph, cost: CostModel, inputs: list[tuple], max_passes: int = 6, keep_candidates: int = 0,
                 time_limit: float | None = None, peak_bound: int = 0):
        super().__init__(g, cost, inputs, max_passes, keep_candidates, time_limit, peak_bound)


def _node_work(g: EGraph, c: int, n: ENode) -> int:
    """Node ``n`` of class ``c``'s own term of a tree cost: its op's FLOP weight times the elements
    it computes over -- a reduction's the elements it reads, not the ones it writes (a sum over an
    axis expanded to 3,000 is 3,000 adds per output; expand-sum's x * n one multiply: weighed by
    its output, the sum looked as cheap and was kept, 252 us predicted against 7 us)."""
    d = OPS[n.op]
    return d.flops * numel(g.shapes[n.children[0]] if d.kind == "reduce" else g.shapes[c])


def _tree_costs(g: EGraph, uses: list[list[tuple[int, int]]]) -> tuple[list, list[list]] | None:
    """Per class the least tree cost, and per node its tree cost over its children's least costs
    (INF where a child has none), by Knuth's generalization of Dijkstra's algorithm: a class's cost
    is final when it is the least in the queue, since a node costs at least each child (a Realize
    exactly its child, any other node 1 more). None if a cost is not an integer (then a cost tie is
    not exact: the caller sweeps)."""
    cost: list = [INF] * len(g.classes)
    node_cost: list[list] = [[INF] * len(nodes) for nodes in g.classes]
    pending = [[len(n.children) for n in nodes] for nodes in g.classes]
    done = [False] * len(g.classes)

    def value(c: int, n: ENode):
        if n.op == "REALIZE":
            return cost[n.children[0]] if n.children[0] != c else INF
        return _node_work(g, c, n) + 1 + sum(cost[k] for k in n.children)

    heap: list[tuple] = []
    for c, nodes in enumerate(g.classes):
        for i, n in enumerate(nodes):
            if not n.children:
                node_cost[c][i] = v = value(c, n)
                heapq.heappush(heap, (v, c))
    while heap:
        v, c = heapq.heappop(heap)
        if done[c]:
            continue
        if not isinstance(v, int):
            return None
        done[c], cost[c] = True, v
        for p, i in uses[c]:
            pending[p][i] -= 1
            if pending[p][i] == 0:
                # (also for a class already done: a Realize of a class of equal cost ties with it)
                node_cost[p][i] = w = value(p, g.classes[p][i])
                if w < INF and not done[p]:
                    heapq.heappush(heap, (w, p))
    missing = [c for c in range(len(g.classes)) if not done[c]]
    if missing:
        raise RuntimeError(f"extraction: e-classes {missing[:8]} have no finite-cost node")
    return cost, node_cost


def _first_sweeps(g: EGraph, optimal: list[list[int]], uses: list[list[tuple[int, int]]]) -> list[list]:
    """For each node of least cost (``optimal``: node indices per class), the first sweep of
    GreedyExtractor.semantic_sweeps that scans it with every child at its final cost: the last of
    its children's ``first`` (the sweep in which the class first gets its final cost: the least over
    its optimal nodes), plus one for a child with a larger index (scanned after it in that sweep).
    A min-of-max recursion, solved like shortest paths; the sweeps begin with sweep 1."""
    seen: list[list] = [[INF] * len(nodes) for nodes in g.classes]
    wait = [[len(n.children) for n in nodes] for nodes in g.classes]
    is_opt = [set(o) for o in optimal]
    first: list = [INF] * len(g.classes)
    settled = [False] * len(g.classes)
    heap: list[tuple] = []
    for c in range(len(g.classes)):
        for i in optimal[c]:
            if not g.classes[c][i].children:
                seen[c][i] = 1
                heapq.heappush(heap, (1, c))
    while heap:
        t, c = heapq.heappop(heap)
        if settled[c]:
            continue
        settled[c], first[c] = True, t
        for p, i in uses[c]:
            if i not in is_opt[p]:
                continue
            wait[p][i] -= 1
            if wait[p][i] == 0:
                seen[p][i] = w = max(first[k] + (k > p) for k in g.classes[p][i].children)
                if not settled[p]:
                    heapq.heappush(heap, (w, p))
    return seen
