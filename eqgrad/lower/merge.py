"""Kernels with several outputs: sibling kernels of a plan run as one (a device's stage).

A plan's kernels each write one buffer. Kernels of one output shape that read a buffer in common
(a layer norm's ``dw`` and ``db``, both sums over the rows of ``dy``), or where one reads what
another writes only at the element it computes itself (an Adam step's parameter update, which
reads the ``m`` and ``v`` the kernels before it wrote; a row's sum of ``exp2(x - max)``, which reads
the row's max broadcast along its own loop), are *siblings*: run as one kernel whose body
is a GROUP of their roots (graph/plan.py), they read each shared buffer once and never read back
what they wrote. The lowering (lowering.py) opens the output loops once and stores each root to
its own output; the emitter renders a node once per element, so a root that another root holds is
computed once. A device's stage runs :class:`SiblingMerger` on the extracted plan (the LLVM
device's in devices/cpustage.py, OpenCL's in devices/opencl.py); ``EQGRAD_MERGE=0`` turns it off.

Before that, the LLVM device's stage gives a row-fused kernel the *row statistics* it reads at its
own rows and could compute from sums it computes already (``SiblingMerger.absorb_rows``): they are
hoisted at its rows and written from there (a GROUP root broadcast along its last axis, stored once
a row: lowering.py), instead of computed by kernels of their own that recomputed those sums --
attention's bounded backward, where dq's kernel now writes each query row's max, sum and
``sum(p * dp)`` for dk and dv.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from eqgrad import config
from eqgrad.graph.plan import GROUP, Kernel, KernelPlan, KernelStats, KNode, NodeMemo
from eqgrad.lower.indexing import REDUCES, dry_sources
from eqgrad.lower.passes import LowerOptions, schedule_kernel
from eqgrad.lower.symbolic import Lin


class SiblingMerger:
    """Merges sibling kernels (``merge``), keeping what it worked out per kernel body."""

    def __init__(self) -> None:
        self._schedule_memo = NodeMemo()     # body -> (options, its lowering decisions alone)
        # body -> {ids of the bodies of a group it may join: (options, those bodies, whether it may)}
        self._group_memo = NodeMemo()
        # reader body -> (options, the statistics' bodies, the GROUP absorb_rows made of them or None):
        # a resized plan's stage runs at every new size, and its unchanged bodies are asked again
        self._absorb_memo = NodeMemo()

    def merge(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None,
              exclude: Callable[[Kernel], bool] | None = None) -> KernelPlan:
        """The plan with *sibling* kernels -- of one output shape, reading a buffer in common, or one
        reading what another writes only at the element it computes itself, where that output is
        also an output of the plan or read by a later kernel -- run as one kernel with
        several outputs: a GROUP of their roots in one loop nest (graph/plan.py ``Kernel.also``),
        which reads each shared buffer once, and where a root that read another's output has that
        root in its place (computed once per element, stored, and used from a register). A layer
        norm's backward sums its weight's and its bias's gradients over the rows of the same ``dy``
        (two column sums reading ``dy`` twice); an Adam step writes ``m`` and ``v`` and then reads
        them back with its gradient to update the parameter: one kernel, 10 -> 7 tensor passes. The
        merged kernel runs where the last of them ran, so no kernel between them may read what an
        earlier one wrote; and only kernels the lowering gives the same decisions alone and together
        are merged (register lanes, the parallel loops; none with row fusion, a stash or a cache
        tile, none that ``exclude`` names: the LLVM device's BLAS calls), so each root's loop IR is
        what it was, in a shared loop nest. What it saves is the shared buffers' bytes and a
        launch: the bytes the cost model prices a kernel by (extract/cost.py), so a merge never
        costs more there, and the merged kernel's ``nbytes`` and ``predicted`` say what it saved."""
        kernels = plan.kernels
        # (EQGRAD_OPT=0: one kernel per op, as extracted)
        if len(kernels) < 2 or not config.MERGE.value or not config.OPT.value:
            return plan
        readers: dict[int, list[int]] = {}                # buffer -> the kernels that read it, in order
        for i, k in enumerate(kernels):
            for b in k.inputs:
                readers.setdefault(b, []).append(i)
        outputs = set(plan.outputs)
        groups: list[list[int]] = []                       # kernel indices run as one, in plan order
        # (output shape, buffer) -> the groups of that shape with a member that reads or writes the
        # buffer: a group that k neither reads from nor shares a read with cannot take it
        # (``_joins``' first answer), so only these are asked -- asking every group of k's shape
        # grew with the square of a model's depth (a 30-layer decoder's resized step: 10 ms)
        touching: dict[tuple, list[int]] = {}
        # a group whose member's output a kernel outside it has read is closed: no kernel after that
        # reader may join it (``_joins``: nothing between a member and k reads the member), so it is
        # not asked again -- a layer's groups close as the next layer reads them
        made_by: dict[int, int] = {}                       # a member's output -> its group
        closed: set[int] = set()
        for j, k in enumerate(kernels):
            gi = -1
            # (the cheap conditions first: a resized plan's stage runs at every new size)
            if not (k.also or not k.inputs or not any(n > 1 for n in k.ast.shape)
                    or (exclude is not None and exclude(k))):
                shape = k.ast.shape
                near = sorted({g for b in k.inputs for g in touching.get((shape, b), ()) if g not in closed},
                              reverse=True)
                for g in near:
                    if self._joins(groups[g], j, kernels, readers, outputs, plan, options):
                        groups[g].append(j)
                        gi = g
                        break
                else:
                    gi = len(groups)
                    groups.append([j])
                for b in (*k.inputs, k.out):
                    at = touching.setdefault((shape, b), [])
                    if not at or at[-1] != gi:
                        at.append(gi)
                made_by[k.out] = gi
            for b in k.inputs:
                g = made_by.get(b)
                if g is not None and g != gi:
                    closed.add(g)
        merged = {g[-1]: g for g in groups if len(g) > 1}
        if not merged:
            return plan
        skip = {i for g in merged.values() for i in g[:-1]}
        out = []
        for j, k in enumerate(kernels):
            if j in skip:
                continue
            if j not in merged:
                out.append(k)
                continue
            members = [kernels[i] for i in merged[j]]
            mk = _merged(members, plan)
            out.append(mk)
            if notes is not None:
                saved = sum(plan.traffic(m) for m in members) - mk.nbytes
                notes.append(f"{', '.join(k.name for k in members)}: one kernel with {len(members)} outputs "
                             f"({mk.ast.shape} each), their common reads done once ({saved} bytes fewer)")
        return dataclasses.replace(plan, kernels=out)

    def absorb_rows(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None,
                    exclude: Callable[[Kernel], bool] | None = None) -> KernelPlan:
        """The plan with each kernel of *row statistics* -- a reduction to one value a row of a later
        kernel ``K`` (its shape ``K``'s with the last axis 1), which ``K`` reads only at its own row --
        computed by ``K`` itself and written from there: one kernel whose body is a GROUP of ``K``'s
        root, with the statistics' roots in place of its reads of them, and each statistic broadcast
        along ``K``'s last axis (the lowering stores it once a row, in its own shape: lowering.py
        ``Lowerer.emit_kernel``). Only where ``K`` then reduces the statistics over its rows in passes of its
        own (hoisted: a row-fused kernel) and the sums of products under them are sums ``K`` already
        computes (its own row's scores): attention's backward under a memory bound computed each query
        row's max, sum and ``sum(p * dp)`` in a kernel that recomputed the scores and ``g . v`` over
        every key, and then dq recomputed both again; now dq's kernel computes the statistics from its
        own scores and writes them for dk and dv. No kernel between a statistic and ``K`` may read it
        (``K`` now writes it where ``K`` ran), and ``K``'s lowering must be the same with the
        statistics written or not (the GROUP's schedule: its register lanes, hoists, row stash and row
        dots as the body's alone)."""
        kernels = plan.kernels
        if len(kernels) < 2 or not config.MERGE.value or not config.OPT.value \
                or "row dots" in options.disabled or max(options.lanes_last, default=1) <= 1:
            return plan
        made = {k.out: i for i, k in enumerate(kernels)}
        readers: dict[int, list[int]] = {}
        for i, k in enumerate(kernels):
            for b in k.inputs:
                readers.setdefault(b, []).append(i)
        taken: dict[int, tuple[list[int], KNode]] = {}
        gone: set[int] = set()
        for j, k in enumerate(kernels):
            shape = k.ast.shape
            if k.also or k.ast.op == GROUP or not shape or shape[-1] <= 1 or (exclude is not None and exclude(k)):
                continue
            row = shape[:-1] + (1,)
            cands = sorted({made[b] for b in k.inputs if b in made and made[b] not in gone
                            and _row_statistic(kernels[made[b]], row, exclude)})
            if not cands:
                continue
            if any(i < r < j and r not in cands for i in cands for r in readers.get(kernels[i].out, ())):
                continue                    # a kernel between a statistic and K reads it
            stats = [kernels[i] for i in cands]
            bodies = tuple(m.ast for m in stats)
            hit = self._absorb_memo.get(k.ast)
            if hit is not None and hit[0] == options and len(hit[1]) == len(bodies) and \
                    all(a is b for a, b in zip(hit[1], bodies)):
                group = hit[2]
            else:
                group = None
                if _reads_at_its_index(k.ast, {m.out for m in stats}, row=True):
                    group = _absorbed(k, stats)
                    if not self._absorbs(k, stats, group, options):
                        group = None
                if group is None or all(n is not k.ast for n in group.walk()):   # (not holding its key)
                    self._absorb_memo.put(k.ast, (options, bodies, group))
            if group is not None:
                taken[j] = (cands, group)
                gone.update(cands)
        if not taken:
            return plan
        out = []
        for j, k in enumerate(kernels):
            if j in gone:
                continue
            if j not in taken:
                out.append(k)
                continue
            cands, group = taken[j]
            stats = [kernels[i] for i in cands]
            members = [k, *stats]
            mk = Kernel("+".join(m.name for m in members), k.out, group, group.buffers(),
                        flops=k.flops, kind=k.kind, also=tuple(m.out for m in stats))
            mk.nbytes = plan.traffic(mk)
            # its prediction: the reader's (the statistics are reduced from sums it computes already,
            # and written a value a row); the statistics' kernels are gone with theirs
            mk.predicted, mk.stats, mk.warm = k.predicted, k.stats, k.warm
            out.append(mk)
            if notes is not None:
                notes.append(f"{', '.join(m.name for m in stats)} (row statistics of {k.ast.shape}): computed by "
                             f"{k.name} from its own rows and written from there ({mk.name}: "
                             f"{1 + len(stats)} outputs, {sum(map(plan.traffic, members)) - mk.nbytes} bytes fewer)")
        return dataclasses.replace(plan, kernels=out)

    def _absorbs(self, k: Kernel, stats: list[Kernel], group: KNode, options: LowerOptions) -> bool:
        """``absorb_rows``' conditions on reader ``k`` and the GROUP that takes ``stats`` in: the
        statistics hoisted at ``k``'s rows (row fusion with a row stash), the GROUP's schedule the same
        as its first root's alone, and every sum of products under the statistics one ``k`` computes."""
        body = group.src[0]
        alone = schedule_kernel(Kernel("absorb", 0, body, body.buffers()), options)
        if not alone.hoist or not alone.row_stash:
            return False
        hoisted = {id(n) for _, ns in alone.hoist for n in ns}
        if not all(id(r.src[0]) in hoisted for r in group.src[1:]):
            return False
        mine = {_structure(x) for x in k.ast.walk() if _dot(x)}
        if not all(_structure(x) in mine for m in stats for x in m.ast.walk() if _dot(x)):
            return False
        together = schedule_kernel(Kernel("absorb", 0, group, group.buffers()), options)
        return (_decisions(together), len(together.row_stash), len(together.row_dots), len(together.blocked)) == \
            (_decisions(alone), len(alone.row_stash), len(alone.row_dots), len(alone.blocked))

    def _schedule(self, k, options: LowerOptions) -> tuple[_Decisions, int, list[tuple]]:
        """The lowering's decisions for ``k`` alone (``_decisions``), how many of its sums are
        blocked, and its row dots and root rows (``_dots``), kept by its body."""
        hit = self._schedule_memo.get(k.ast)
        if hit is None or hit[0] != options:
            s = schedule_kernel(k, options)
            hit = (options, (_decisions(s), len(s.blocked), _dots(s)))
            self._schedule_memo.put(k.ast, hit)
        return hit[1]

    def _joins(self, g: list[int], j: int, kernels: list, readers: dict[int, list[int]], outputs: set[int],
               plan: KernelPlan, options: LowerOptions) -> bool:
        """Whether kernel ``j`` may join group ``g`` (``merge``): a buffer read in common or a
        member's output read only at the element it computes, no kernel between them reading a
        member's output, and the same lowering decisions alone and together, none of them row fusion,
        a stash, a tile or a split (``_decisions``; worked out once per set of bodies)."""
        k = kernels[j]
        members = [kernels[i] for i in g]
        fed = {m.out for m in members} & set(k.inputs)
        if fed and not _reads_at_its_index(k.ast, fed):
            return False                            # k reads what a member writes elsewhere than its element
        # a member's output that k reads is also an output of the plan or read after k: where k alone
        # reads it, extraction chose to store it (a cost, ``contiguous()``, a schedule without
        # fusion), and taking its root into k would undo that choice, not share a value
        if any(b not in outputs and all(r <= j for r in readers.get(b, ())) for b in fed):
            return False
        if not fed and not set(k.inputs) & {b for m in members for b in m.inputs}:
            return False                            # nothing to read once
        for m_i in g:                               # none between a member and k reads the member
            if any(m_i < r < j and r not in g for r in readers.get(kernels[m_i].out, ())):
                return False
        want, blocked, dots = self._schedule(k, options)
        if want.hoist or want.stash or want.tile is not None or want.split:
            return False
        for m in members:
            d, n, md = self._schedule(m, options)
            if d != want:
                return False
            blocked += n
            dots = dots + md
        bodies = tuple(m.ast for m in members)
        memo = self._group_memo.get(k.ast)
        hit = memo.get(tuple(map(id, bodies))) if memo is not None else None
        if hit is not None and hit[0] == options and all(a is b for a, b in zip(hit[1], bodies)):
            return hit[2]
        got = schedule_kernel(_merged(members + [k], plan), options)
        # (each root's long sums blocked; each member's row dots and root rows kept, by structure:
        # a value the roots share is one, ``_shared``)
        ok = _decisions(got) == want and len(got.blocked) == blocked and set(dots) <= set(_dots(got))
        if any(b is k.ast for b in bodies):         # (a memo's value must not hold its key)
            return ok
        if memo is None:
            memo = {}
            self._group_memo.put(k.ast, memo)
        if len(memo) >= 16:
            memo.clear()
        memo[tuple(map(id, bodies))] = (options, bodies, ok)
        return ok


class _Decisions(NamedTuple):
    """What of a schedule must be the same for a kernel alone and in a GROUP (``SiblingMerger.merge``;
    the GROUP's blocked sums are its roots' together, and its row dots and root rows hold each
    root's: ``_dots``)."""
    lanes: tuple
    parallel: int
    hoist: bool
    stash: bool
    tile: Any
    split: bool
    sum_block: int
    sum_radix: int
    root_block: int
    root_rows: bool


def _decisions(s: Any) -> _Decisions:
    return _Decisions(s.lanes, s.parallel, bool(s.hoist), s.stash is not None, s.tile, s.split is not None,
                      s.sum_block, s.sum_radix, s.root_block, bool(s.root_rows))


def _dots(s: Any) -> list[tuple]:
    """A schedule's row dots of its own reduction as (the value's structure, w, per), and its root
    rows as (the value's structure,): a GROUP keeps a member's register-blocked dot products and
    the row values over them where it has each of them so."""
    return [(_structure(x), w, per) for x, w, per in s.root_dots] + [(_structure(y),) for y in s.root_rows]


def _structure(n: KNode) -> tuple:
    """``n``'s body as nested tuples, a node read twice built once (a row-dots value, a sum of
    products of two reads; a root-rows value, attention's ds = p * (dp - D): tens of nodes)."""
    memo: dict[int, tuple] = {}
    for x in n.walk():
        memo[id(x)] = (x.op, x.arg, x.shape, x.dtype, tuple(memo[id(c)] for c in x.src))
    return memo[id(n)]


def _shared(roots: list[KNode]) -> list[KNode]:
    """``roots`` with the subtrees they have in common one node: the emitter computes a node once
    per index and the row-dots pass keeps a value in one array (a row's statistics, each kernel's
    scores ``q . k`` built apart, read by the max, the sum and ``sum(p * dp)``)."""
    seen: dict[tuple, KNode] = {}
    memo: dict[int, KNode] = {}
    for r in roots:
        for n in r.walk():
            if id(n) in memo:
                continue
            src = tuple(memo[id(x)] for x in n.src)
            key = (n.op, n.arg, n.shape, n.dtype, tuple(map(id, src)))
            try:
                m = seen.get(key)
            except TypeError:             # (an argument that does not hash: not shared)
                m, key = None, None
            if m is None:
                m = n if all(a is b for a, b in zip(src, n.src)) else KNode(n.op, src, n.arg, n.shape, n.dtype)
                if key is not None:
                    seen[key] = m
            memo[id(n)] = m
    return [memo[id(r)] for r in roots]


def _reads_at_its_index(root: KNode, bufs: set[int], row: bool = False) -> bool:
    """Whether every read of ``bufs`` in the body ``root`` is at the element the root computes: a
    dry run of the index function (``indexing.dry_sources``: a reduction's axes are variables of its
    own) reads them at the root's own output index and nowhere else -- through elementwise ops, or
    broadcast along a reduction's axes and read inside its loop (the variance's reads of the mean, a
    softmax's sum's of the row's max), never through a pad. ``row``: at the root's own row instead
    (its index with the last axis 0, the buffers of that shape): a row's statistics read broadcast
    along the last axis (``absorb_rows``)."""
    out = tuple(Lin.var(f"o{d}", n) if n > 1 else Lin.num(0) for d, n in enumerate(root.shape))
    want, shape = (out[:-1] + (Lin.num(0),), root.shape[:-1] + (1,)) if row else (out, root.shape)
    stack, seen = [(root, out)], set()
    while stack:
        n, ix = stack.pop()
        if (id(n), ix) in seen:
            continue
        seen.add((id(n), ix))
        if n.op == "BUF":
            if n.arg in bufs and (n.shape != shape or ix != want):
                return False
            continue
        if n.op == "PAD":
            if any(x.op == "BUF" and x.arg in bufs for x in n.walk()):
                return False
            continue
        if len(seen) > MAX_DRY_NODES:
            return False                  # (a body too large to check: not merged)
        stack.extend(dry_sources(n, ix, "_g"))
    return True


MAX_DRY_NODES = 4096          # (node, index) pairs ``_reads_at_its_index`` visits before it gives up


def _row_statistic(s: Kernel, row: tuple, exclude: Callable[[Kernel], bool] | None) -> bool:
    """Whether kernel ``s`` is a row statistic of shape ``row`` (``absorb_rows``): one output, its
    root a reduction of that shape."""
    return not s.also and s.ast.op in REDUCES and s.ast.shape == row and (exclude is None or not exclude(s))


def _dot(x: KNode) -> bool:
    """A sum of products with no reduction below it (a score ``q . k``)."""
    return x.op == "RSUM" and x.src[0].op == "MUL" and not any(n.op in REDUCES for n in x.src[0].walk())


def _absorbed(k: Kernel, stats: list[Kernel]) -> KNode:
    """The GROUP ``absorb_rows`` runs ``k`` with ``stats`` as: ``k``'s root with its reads of the
    statistics replaced by their roots (each statistic's reads of an earlier one likewise), then each
    statistic's root broadcast to ``k``'s shape; subtrees they have in common one node (``_shared``)."""
    made: dict[int, KNode] = {}
    roots = []
    for m in stats:
        subs = {id(n): made[n.arg] for n in m.ast.walk() if n.op == "BUF" and n.arg in made}
        made[m.out] = m.ast.replaced(subs) if subs else m.ast
        roots.append(made[m.out])
    subs = {id(n): made[n.arg] for n in k.ast.walk() if n.op == "BUF" and n.arg in made}
    body = k.ast.replaced(subs)
    shape = k.ast.shape
    wide = [KNode("EXPAND", (r,), shape, shape, r.dtype) for r in roots]
    return KNode(GROUP, tuple(_shared([body, *wide])), None, shape, k.ast.dtype)


def _merged(members: list, plan: KernelPlan) -> Kernel:
    """One kernel running ``members`` (of one output shape, in plan order): their roots as a GROUP,
    a member's reads of an earlier member's output replaced by that member's root (the emitter
    computes a node once per element, so its value is shared, not read back), its outputs the
    members' in order, its inputs the GROUP's reads; bytes as the cost model counts them (every
    buffer read or written once), FLOPs and kinds summed."""
    roots: list[KNode] = []
    made: dict[int, KNode] = {}                  # an earlier member's output -> its root
    for m in members:
        subs = {id(n): made[n.arg] for n in m.ast.walk() if n.op == "BUF" and n.arg in made}
        roots.append(m.ast.replaced(subs) if subs else m.ast)
        made[m.out] = roots[-1]
    ast = KNode(GROUP, tuple(_shared(roots)), None, members[0].ast.shape, members[0].ast.dtype)
    k = Kernel("+".join(m.name for m in members), members[0].out, ast, ast.buffers(),
               flops=sum(m.flops for m in members), kind=tuple(sorted({x for m in members for x in m.kind})),
               also=tuple(m.out for m in members[1:]))
    k.nbytes = plan.traffic(k)
    # its prediction: one launch (the plan's, where known), and the members' bodies less the share
    # of their bytes it does not move
    launch = plan.launch
    body = sum(max(0.0, m.predicted - launch) for m in members)
    share = min(1.0, k.nbytes / max(1, sum(map(plan.traffic, members))))
    k.predicted = launch + body * share
    # and, where the plan's order has them read from cache (extract/cost.py ``in_order``), what that
    # saves them, in the same share (KernelPlan.in_context takes a merged kernel's own)
    k.warm = sum(m.warm for m in members) * share
    if all(m.stats is not None for m in members):
        st = [m.stats for m in members]
        k.stats = KernelStats(float(k.nbytes), sum(x.flops for x in st), sum(x.nodes for x in st),
                              sum(x.cflops for x in st), min(x.fill for x in st), 0.0, sum(x.passes for x in st),
                              min(float(k.nbytes), sum(x.hot for x in st) * share),
                              min(float(k.nbytes), sum(x.strided for x in st)))
    return k
