"""Extraction in near-linear time: each shortcut gives exactly what the whole-plan
computation it replaced gives.

- PlanState (incremental evaluation) == PlanEvaluator.evaluate on random move sequences;
- the consumer-indexed toggle == a scan of every class; the component-local cycle check of a flip
  == is_acyclic of the flipped plan;
- semantic_choice (Knuth's algorithm) == the sweeps that define it == the plain fixpoint loop;
- the extractors choose the same plans with incremental evaluation as with full evaluation.
"""
import math

import numpy as np
import pytest

import eqgrad.nn.functional as F
from eqgrad import Tensor
from eqgrad.dtype import float32
from eqgrad.extract.cost import CostModel, DeviceParams
from eqgrad.extract.egraph import EGraph, ENode, from_json
from eqgrad.extract.evaluate import PlanEvaluator, PlanState, globally_acyclic
from eqgrad.extract.greedy import INF, GreedyExtractor, ImproveExtractor
from eqgrad.graph.program import linearize
from eqgrad.ops import OPS, numel
from eqgrad.rules.ir import emit_program
from eqgrad.rules.saturate import default_saturator


def _t(rng, *shape):
    return Tensor(rng.standard_normal(shape).astype(np.float32), device="NUMPY")


def _mlp_step(rng):
    x, w1, w2 = _t(rng, 16, 12), _t(rng, 12, 24), _t(rng, 24, 5)
    w1.requires_grad_(True)
    w2.requires_grad_(True)
    loss = ((x @ w1).relu() @ w2).log_softmax(-1).mean()
    loss.backward()
    return [loss, w1 - 0.1 * w1.grad, w2 - 0.1 * w2.grad]


def _attention(rng):
    q, k, v = _t(rng, 2, 2, 16, 8), _t(rng, 2, 2, 16, 8), _t(rng, 2, 2, 16, 8)
    return [((q @ k.transpose(-1, -2)) * 0.35).softmax(-1) @ v]


def _conv(rng):
    x, w = _t(rng, 2, 3, 8, 8), _t(rng, 4, 3, 3, 3)
    return [F.max_pool2d(F.conv2d(x, w, padding=1).relu(), 2)]


def _layernorm(rng):
    x, w, b = _t(rng, 8, 32), _t(rng, 32), _t(rng, 32)
    return [F.layer_norm(x * 2 + 1, (32,), w, b)]


def _chain(rng, n: int = 48):
    y = _t(rng, 8, 16)
    steps = [lambda t: t * 0.999, lambda t: t.permute(1, 0), lambda t: t + 0.001, lambda t: t.flip(0),
             lambda t: t.exp2() * 0.5, lambda t: t.permute(1, 0)]
    for i in range(n):
        y = steps[i % len(steps)](y)
    return [y]


def random_egraph(seed: int, n: int = 100) -> tuple[EGraph, list[tuple]]:
    """An e-graph like a saturated one, with more cycles: classes built bottom-up (each with a node
    over earlier classes, so each has a finite cost), a Realize class for most of them, row
    reductions broadcast back (legal only when row-fused), extra nodes over any classes --
    equivalent forms, some closing cycles through the e-graph (as ``x * 1 = x`` does) -- and every
    node's fused forms."""
    rng = np.random.default_rng(seed)
    shape, row = (16, 32), (16, 1)
    g = EGraph()
    full = [g.add_class([ENode("BUF", (), (0, shape, float32))]), g.add_class([ENode("CONST", (), (0.5, float32, shape))])]
    real: dict[int, int] = {}

    def arg() -> int:
        c = full[rng.integers(len(full))]
        return real[c] if c in real and rng.random() < 0.9 else c
    unary, binary = ("NEG", "EXP2", "SQRT"), ("ADD", "MUL", "MAX")
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            s = g.add_class([ENode("RSUM", (arg(),), (1,))])
            real[s] = g.add_class([ENode("REALIZE", (s,), None)])
            c = g.add_class([ENode("EXPAND", (real[s],), shape)])
        elif r < 0.5:
            c = g.add_class([ENode(unary[rng.integers(3)], (arg(),), None)])
        else:
            c = g.add_class([ENode(binary[rng.integers(3)], (arg(), arg()), None)])
        full.append(c)
        if rng.random() < 0.7:
            real[c] = g.add_class([ENode("REALIZE", (c,), None)])
            if rng.random() < 0.2:     # a class both a value and its materialization (egraph._split_self_realize)
                g.classes[real[c]].append(g.classes[c][0])
    for _ in range(n // 2):
        c = full[2 + rng.integers(len(full) - 2)]
        if rng.random() < 0.5:
            node = ENode(unary[rng.integers(3)], (arg(),), None)
        else:
            node = ENode(binary[rng.integers(3)], (arg(), arg()), None)
        if node not in g.classes[c]:
            g.classes[c].append(node)
    # the fused forms, as the fusion rules add them: any Realize argument replaced by its value
    inner = {r: v for v, r in real.items()}
    for c, nodes in enumerate(g.classes):
        for node in list(nodes):
            if node.op == "REALIZE":
                continue
            forms = [()]
            for k in node.children:
                forms = [f + (x,) for f in forms for x in ((k, inner[k]) if k in inner else (k,))]
            nodes += [v for v in (ENode(node.op, f, node.arg) for f in forms) if v not in nodes]
    g.roots = [full[-1], full[-2], full[-5], full[len(full) // 2], full[len(full) // 3]]
    g.infer()
    return g, [(shape, float32)]


PROGRAMS = {"mlp_step": _mlp_step, "attention": _attention, "conv": _conv, "layernorm": _layernorm, "chain": _chain}
RANDOM = [f"random{i}" for i in range(6)]
_CACHE: dict[str, tuple] = {}


def saturated(name: str) -> tuple[EGraph, list[tuple]]:
    if name.startswith("random"):
        return random_egraph(int(name[6:]))
    if name not in _CACHE:
        outs = PROGRAMS[name](np.random.default_rng(0))
        prog = linearize([o.lazydata for o in outs])
        emitted = emit_program(prog)
        js, rep = default_saturator().run(emitted.text)
        assert rep.stop_reason == "completed", rep.detail
        _CACHE[name] = (from_json(js, emitted.roots), [(lb.shape, lb.dtype) for lb in prog.inputs])
    return _CACHE[name]


def _same(inc, full) -> None:
    assert inc.kernels == full.kernels          # the same kernels with the same costs, field by field
    assert inc.total == full.total and inc.legal == full.legal and inc.why == full.why
    assert inc.peak == full.peak                # the bytes of the buffers (EQGRAD_PEAK_MEMORY's measure)


def _same_state(st: PlanState, ref: PlanState) -> None:
    """Everything a state keeps equals what a state built from scratch for its plan keeps."""
    assert st.choice == ref.choice and st.kernels == ref.kernels
    assert st.deps == ref.deps and st.reads == ref.reads and st.readers == ref.readers
    assert +st.refs == +ref.refs and st.illegal == ref.illegal and st.exact == ref.exact


class _Unremembered(PlanEvaluator):
    """Every kernel costed from its body (PlanEvaluator remembers the bodies it costed)."""
    kernel_cost_reads = PlanEvaluator._kernel_cost_reads


def _walk(ex: GreedyExtractor, rng, steps: int = 300) -> tuple[int, int, int]:
    """A random walk over plans from the semantic choice (toggles and flips, taken whether they
    improve or not, legal or not), checking every incremental evaluation against a full one and,
    every fifth move taken, the whole state against one built from scratch; and every full
    evaluation against one that costs each kernel from its body (no remembered costs)."""
    fresh = _Unremembered(ex.ev.g, ex.ev.cost, ex.ev.inputs)
    st = PlanState(ex.ev, ex.semantic_choice())
    assert st.acyclic
    specs_now = ex._move_specs(st.choice)
    checked = taken = unsafe = 0
    for step in range(steps):
        if step % 40 == 0:
            specs_now = ex._move_specs(st.choice)
        spec = specs_now[rng.integers(len(specs_now))]
        _, changes, safe = ex._apply(st, spec)
        if changes is None:
            continue
        full = ex.ev.evaluate({**st.choice, **changes})
        _same(full, fresh.evaluate({**st.choice, **changes}))
        if not (safe and st.acyclic):      # a move that may close a cycle: the extractors evaluate it in full
            unsafe += 1
            if rng.random() < 0.3:
                st = PlanState(ex.ev, {**st.choice, **changes}, full)
                assert st.acyclic == globally_acyclic(st.choice)
            continue
        inc = st.evaluate(changes)
        _same(inc, full)
        checked += 1
        if rng.random() < 0.3:
            st.accept(inc)
            taken += 1
            _same(st.evaluation, ex.ev.evaluate(st.choice))
            if taken % 5 == 0:
                _same_state(st, PlanState(ex.ev, st.choice))
    return checked, taken, unsafe


@pytest.mark.parametrize("row_fusion", [True, False])
@pytest.mark.parametrize("name", sorted(PROGRAMS) + RANDOM)
def test_incremental_evaluation_equals_full_evaluation_on_random_moves(name, row_fusion):
    g, specs = saturated(name)
    ex = ImproveExtractor(g, CostModel(DeviceParams(row_fusion=row_fusion)), specs)
    checked, taken, unsafe = _walk(ex, np.random.default_rng(len(name) + 7 * row_fusion))
    assert checked > 50 and taken > 10


def test_incremental_evaluation_with_a_cost_function_that_gives_inf():
    """A user's cost function may call a kernel impossible (inf): totals are then summed as the full
    evaluation sums them, and a state that leaves such kernels behind sums exactly again."""
    def cost(stats, params):
        return math.inf if stats.nodes > 3 else params.launch + stats.nbytes / params.bandwidth
    for name in ("chain", "random1"):
        g, specs = saturated(name)
        checked, taken, _ = _walk(ImproveExtractor(g, CostModel(DeviceParams(), cost), specs), np.random.default_rng(3))
        assert checked > 50 and taken > 10


def test_a_state_accepts_only_its_own_latest_candidates():
    g, specs = saturated("layernorm")
    ex = GreedyExtractor(g, CostModel(DeviceParams()), specs)
    st = PlanState(ex.ev, ex.semantic_choice())
    moves = [c for c in (ex._apply(st, spec)[1] for spec in ex._move_specs(st.choice)) if c]
    a, b = st.evaluate(moves[0]), st.evaluate(moves[1])
    st.accept(a)
    with pytest.raises(ValueError, match="expected an evaluation made by this state's evaluate"):
        st.accept(b)                               # made before the plan changed
    with pytest.raises(ValueError, match="got a full evaluation"):
        st.accept(ex.ev.evaluate(st.choice))


def test_incremental_evaluation_re_costs_few_kernels():
    """On a long chain a move re-costs a few kernels, not the whole plan (before: every kernel of
    the plan for every candidate), and the search still ends on the full evaluation's plan."""
    g, specs = saturated("chain")
    ex = GreedyExtractor(g, CostModel(DeviceParams()), specs)
    start = ex.ev.evaluate(ex.semantic_choice())
    res = ex.extract()
    per_move = (ex.ev.kernels_costed - 2 * start.n_kernels) / (ex.ev.evaluations - 2)
    assert start.n_kernels > 40 and per_move < 4
    assert ex.ev.full_evaluations == 2          # the starting plan (here and in extract) only
    _same(res.evaluation, ex.ev.evaluate(res.choice))


class _FullEvaluation(ImproveExtractor):
    """The local search as it was before: every candidate evaluated from scratch."""

    def _evaluate(self, st, changes, safe):
        return self.ev.evaluate({**st.choice, **changes})


class _FullEvaluationGreedy(GreedyExtractor):
    _evaluate = _FullEvaluation._evaluate


@pytest.mark.parametrize("name", sorted(PROGRAMS) + RANDOM)
def test_extractors_choose_the_plans_of_full_evaluation(name):
    g, specs = saturated(name)
    for params in (DeviceParams(), DeviceParams(launch=5e-5, peak=5e9), DeviceParams(row_fusion=False)):
        cost = CostModel(params)
        for fast, slow in ((GreedyExtractor, _FullEvaluationGreedy), (ImproveExtractor, _FullEvaluation)):
            a, b = fast(g, cost, specs, keep_candidates=3).extract(), slow(g, cost, specs, keep_candidates=3).extract()
            assert a.choice == b.choice and a.info == b.info
            _same(a.evaluation, b.evaluation)
            assert [t for t, _ in a.candidates] == [t for t, _ in b.candidates]
            alts_a, alts_b = a.alternatives, b.alternatives
            assert alts_a == alts_b and alts_a


class _NoSkipGreedy(GreedyExtractor):
    skip_rejected = False


class _NoSkipImprove(ImproveExtractor):
    skip_rejected = False


@pytest.mark.parametrize("name", sorted(PROGRAMS) + RANDOM)
def test_skipping_rejected_moves_chooses_the_same_plans(name):
    """A rejected move is evaluated again only when something its evaluation read has changed
    (greedy._Rejected): the search takes the same moves, so the plans are the same."""
    g, specs = saturated(name)
    skipped = 0
    for params in (DeviceParams(), DeviceParams(launch=5e-5, peak=5e9), DeviceParams(row_fusion=False)):
        cost = CostModel(params)
        for fast, slow in ((GreedyExtractor, _NoSkipGreedy), (ImproveExtractor, _NoSkipImprove)):
            a, b = fast(g, cost, specs).extract(), slow(g, cost, specs).extract()
            assert a.choice == b.choice
            _same(a.evaluation, b.evaluation)
            assert b.info["skipped"] == 0
            assert a.info["evaluations"] + a.info["skipped"] >= b.info["evaluations"]
            skipped += a.info["skipped"]
    if not name.startswith("random"):
        assert skipped > 0         # every real program's last pass re-visits moves it rejected


def _toggle_by_scanning(ex: GreedyExtractor, choice, prod, inline):
    """The toggle as it was: every class of the choice scanned for the producer's edges."""
    r = ex.realize_of.get(prod)
    if r is None:
        return None
    old, new = (r, prod) if inline else (prod, r)
    out, changed = dict(choice), False
    for c, n in choice.items():
        if n.op == "REALIZE" or old not in n.children:
            continue
        kids = tuple(new if k == old else k for k in n.children)
        v = ex.variants[c].get((n.op, n.arg, kids))
        if v is None:
            for i, k in enumerate(n.children):
                if k == old:
                    kk = out[c].children[:i] + (new,) + out[c].children[i + 1:]
                    v2 = ex.variants[c].get((n.op, n.arg, kk))
                    if v2 is not None:
                        out[c], changed = v2, True
            continue
        out[c], changed = v, True
    return out if changed else None


@pytest.mark.parametrize("name", sorted(PROGRAMS) + RANDOM)
def test_toggles_and_flip_cycle_checks_equal_the_whole_plan_versions(name):
    g, specs = saturated(name)
    ex = ImproveExtractor(g, CostModel(DeviceParams()), specs)
    res = ex.extract()
    for choice in (ex.semantic_choice(), res.choice):
        st = PlanState(ex.ev, choice)
        for prod in ex.realize_of:
            for inline in (True, False):
                assert ex.toggle(choice, prod, inline) == _toggle_by_scanning(ex, choice, prod, inline)
        cycles = 0
        for c in range(len(g.classes)):
            for n in g.classes[c]:
                if n.op == "REALIZE" or choice[c] is n:
                    continue
                closes = not ex.ev.is_acyclic({**choice, c: n})
                assert ex._flip_closes_cycle(st, c, n) == closes
                cycles += closes
    assert ex._scc or not cycles


def _semantic_by_fixpoint(g: EGraph):
    """The semantic choice as it was: sweep every class until no cost drops."""
    cost = [INF] * len(g.classes)
    best = [None] * len(g.classes)
    is_realize = [any(n.op == "REALIZE" for n in nodes) for nodes in g.classes]
    changed = True
    while changed:
        changed = False
        for c, nodes in enumerate(g.classes):
            for n in nodes:
                if any(cost[k] == INF for k in n.children):
                    continue
                if n.op == "REALIZE":
                    v = cost[n.children[0]] if n.children[0] != c else INF
                else:
                    # a node's own work: its FLOP weight times the elements it computes over (a
                    # reduction's: the elements it reads)
                    d = OPS[n.op]
                    v = d.flops * numel(g.shapes[n.children[0]] if d.kind == "reduce" else g.shapes[c]) + 1 + \
                        sum(cost[k] for k in n.children)
                realized = sum(1 for k in n.children if is_realize[k])
                cur = best[c]
                tie = v == cost[c] and cur is not None and (
                    (n.op == "REALIZE") > (cur.op == "REALIZE") or
                    (n.op == "REALIZE") == (cur.op == "REALIZE") and
                    realized > sum(1 for k in cur.children if is_realize[k]))
                if v < cost[c] or tie:
                    changed = changed or v < cost[c]
                    cost[c], best[c] = v, n
    return dict(enumerate(best))


def _shuffled(g: EGraph, seed: int) -> EGraph:
    """The same e-graph with its classes renumbered and its nodes reordered (another sweep order)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(g.classes))           # old id -> new id
    out = EGraph()
    out.classes = [None] * len(g.classes)
    out.shapes, out.dtypes = [None] * len(g.classes), [None] * len(g.classes)
    for c, nodes in enumerate(g.classes):
        nodes = [ENode(n.op, tuple(int(perm[k]) for k in n.children), n.arg) for n in nodes]
        out.classes[perm[c]] = [nodes[i] for i in rng.permutation(len(nodes))]
        out.shapes[perm[c]], out.dtypes[perm[c]] = g.shapes[c], g.dtypes[c]
    out.roots = [int(perm[r]) for r in g.roots]
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS) + RANDOM)
def test_semantic_choice_equals_the_sweeps(name):
    """Ties included, on the e-graph as saturated and renumbered at random (the sweeps' order, and so
    which of two equally unfused nodes they meet first, changes)."""
    g0, specs = saturated(name)
    for seed in range(4):
        g = g0 if seed == 0 else _shuffled(g0, seed)
        ex = GreedyExtractor(g, CostModel(DeviceParams()), specs)
        fast, sweeps, plain = ex.semantic_choice(), ex.semantic_sweeps(), _semantic_by_fixpoint(g)
        assert all(fast[c] is plain[c] and sweeps[c] is plain[c] for c in plain)
        assert globally_acyclic(fast)


def test_a_runtime_scalar_costs_as_a_constant():
    """PARAM (a scalar passed to the kernel at run time) is a free leaf exactly like CONST: inline,
    or behind a Realize."""
    shape = (64, 32)

    def graph(leaf: str) -> EGraph:
        g = EGraph()
        x = g.add_class([ENode("BUF", (), (0, shape, float32))])
        arg = (0, float32, shape) if leaf == "PARAM" else (0.5, float32, shape)
        s = g.add_class([ENode(leaf, (), arg)])
        rs = g.add_class([ENode("REALIZE", (s,), None)])
        m = g.add_class([ENode("MUL", (x, s), None)])
        rm = g.add_class([ENode("REALIZE", (m,), None)])
        g.roots = [g.add_class([ENode("ADD", (rm, rs), None)])]
        for c, n in enumerate(g.classes):
            g.shapes[c], g.dtypes[c] = shape, float32
        return g

    ev = {leaf: PlanEvaluator(graph(leaf), CostModel(DeviceParams()), [(shape, float32)]) for leaf in ("CONST", "PARAM")}
    plans = {leaf: e.evaluate({c: nodes[0] for c, nodes in enumerate(e.g.classes)}) for leaf, e in ev.items()}
    assert plans["PARAM"].kernels == plans["CONST"].kernels and plans["PARAM"].n_kernels == 2
    assert plans["PARAM"].deps == plans["CONST"].deps          # the Realize of the scalar is no kernel
