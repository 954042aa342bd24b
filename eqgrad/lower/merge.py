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
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from eqgrad import config
from eqgrad.graph.plan import GROUP, Kernel, KernelPlan, KernelStats, KNode, NodeMemo
from eqgrad.lower.indexing import dry_sources
from eqgrad.lower.passes import LowerOptions, schedule_kernel
from eqgrad.lower.symbolic import Lin


class SiblingMerger:
    """Merges sibling kernels (``merge``), keeping what it worked out per kernel body."""

    def __init__(self) -> None:
        self._schedule_memo = NodeMemo()     # body -> (options, its lowering decisions alone)
        # body -> {ids of the bodies of a group it may join: (options, those bodies, whether it may)}
        self._group_memo = NodeMemo()

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


def _reads_at_its_index(root: KNode, bufs: set[int]) -> bool:
    """Whether every read of ``bufs`` in the body ``root`` is at the element the root computes: a
    dry run of the index function (``indexing.dry_sources``: a reduction's axes are variables of its
    own) reads them at the root's own output index and nowhere else -- through elementwise ops, or
    broadcast along a reduction's axes and read inside its loop (the variance's reads of the mean, a
    softmax's sum's of the row's max), never through a pad."""
    out = tuple(Lin.var(f"o{d}", n) if n > 1 else Lin.num(0) for d, n in enumerate(root.shape))
    stack, seen = [(root, out)], set()
    while stack:
        n, ix = stack.pop()
        if (id(n), ix) in seen:
            continue
        seen.add((id(n), ix))
        if n.op == "BUF":
            if n.arg in bufs and (n.shape != root.shape or ix != out):
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
