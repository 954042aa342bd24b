"""The LLVM device's stage after extraction: what it rewrites in a plan before it compiles it.

``Device.rewrite`` (devices/__init__.py) turns the extracted ``KernelPlan`` into a ``DevicePlan``:
the plan the device runs, the scratch buffers it adds (allocated from the buffer pool at each run),
and a line per rewrite, which ``explain()`` and ``DEBUG=3`` print. On the CPU that is:

- a large full reduction cut into parallel partials and a final kernel (lower/split.py; the
  "split reductions" pass decides, lower/passes.py), when more than one thread runs;
- a contraction routed to the BLAS (devices/blas.py) where the BLAS runs it faster than the
  generated kernel: decided by the call and arithmetic costs measured once per process
  (``blas.pays``) or, where those do not settle it, by timing both (``CPUStage._measured``,
  cached per machine in ``gemm.json``); its operands packed first where they are not BLAS
  layouts, and the elementwise ops after it split off into a kernel of their own
  (lower/contraction.py).

``LLVMDevice`` (devices/cpu.py) keeps the runtime: compiling, the thread pool, launching, the
BLAS programs; this module decides. What is worked out once per kernel body is kept here by body
(weakly, ``NodeMemo``: an entry goes with its body), never on the body.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any, NamedTuple

import numpy as np

from eqgrad import config
from eqgrad.cache import machine_key, source_digest
from eqgrad.devices import Buffer, DevicePlan, blas
from eqgrad.dtype import to_storage
from eqgrad.graph.plan import GROUP, Kernel, KernelPlan, KernelStats, KNode, NodeMemo
from eqgrad.graph.sizes import ELEMENTWISE, body_sizes
from eqgrad.lower import contraction, trace
from eqgrad.lower.passes import LowerOptions, schedule_kernel
from eqgrad.ops import numel
from eqgrad.lower.split import split_reduction

# the knobs below: docs/lowering.md, Constants (what each bounds, the measurement behind it)
MEASURED_SPAN = 4         # a BLAS-or-generated choice holds for contractions of up to 4x (1/4x) its flops
MEASURED_KEEP = 16        # choices kept per kernel structure (the latest)
BLAS_GIVE_UP = 4          # a BLAS this much slower than the generated kernel in two turns is not timed a third time


def gemm_key() -> tuple:
    """What a BLAS-or-generated answer depends on besides the body: the BLAS flag, the threads."""
    return (config.BLAS.value, config.THREADS.value)


def _near(a: int, b: int) -> bool:
    """Whether two sizes (or flop counts) are within MEASURED_SPAN x of each other."""
    return max(a, b) <= MEASURED_SPAN * max(1, min(a, b))


def _detached(found: contraction.Found, root: Any) -> tuple:
    """``found`` to keep by its body ``root`` (``_contraction``) without the body itself: a pure
    contraction's reduction (and its packed form, with no packs) is the body, and a memo's value
    must not hold its key (the weak key would never go)."""
    red, packed = found.red is root, found.packed is root
    return red, packed, dataclasses.replace(found, red=None if red else found.red,
                                            packed=None if packed else found.packed)


def _attached(kept: tuple, root: Any) -> contraction.Found:
    """The ``found`` that ``_detached`` kept, with its body ``root`` back in place."""
    red, packed, f = kept
    return dataclasses.replace(f, red=root if red else f.red, packed=root if packed else f.packed)


class CPUStage:
    """The rewrites of one LLVM device (``device``: the runtime it times candidates with)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._no_gemm: dict[tuple, int] = {}        # body skeleton -> largest size where it had no GEMM that pays
        self._unsplit_memo = NodeMemo()      # body -> what split left it alone for
        self._blas_memo = NodeMemo()         # body -> (what it depends on, its BLAS kernels, scratch)
        self._contraction_memo = NodeMemo()  # body -> (gemm_key, _contraction's answer, detached)
        self._gemm_memo = NodeMemo()         # body -> (gemm_key, the Gemm it runs as or None)
        self._schedule_memo = NodeMemo()     # body -> (options, its lowering decisions alone)
        # body -> {ids of the bodies of a group it may join: (options, those bodies, whether it may)}
        self._group_memo = NodeMemo()

    def rewrite(self, plan: KernelPlan, options: LowerOptions) -> DevicePlan:
        """``split`` with the device's options (its threads, the predicted time above which a
        full reduction is cut into partials), with what it did in words."""
        notes: list[str] = []
        out, scratch = self.split(plan, options, notes)
        if config.MERGE.value:
            out = self.merge_siblings(out, options, notes)
        return DevicePlan(out, scratch, notes)

    def merge_siblings(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None) -> KernelPlan:
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
        tile, and none the BLAS runs), so each root's loop IR is what it was, in a shared loop nest. What it saves is the shared buffers' bytes and a
        launch: the bytes the cost model prices a kernel by (extract/cost.py), so a merge never
        costs more there, and the merged kernel's ``nbytes`` and ``predicted`` say what it saved."""
        kernels = plan.kernels
        if len(kernels) < 2 or not config.OPT.value:         # (EQGRAD_OPT=0: one kernel per op, as extracted)
            return plan
        readers: dict[int, list[int]] = {}                # buffer -> the kernels that read it, in order
        for i, k in enumerate(kernels):
            for b in k.inputs:
                readers.setdefault(b, []).append(i)
        outputs = set(plan.outputs)
        groups: list[list[int]] = []                       # kernel indices run as one, in plan order
        open_by_shape: dict[tuple, list[int]] = {}         # output shape -> indices into groups
        for j, k in enumerate(kernels):
            # (the cheap conditions first: a resized plan's stage runs at every new size)
            if k.also or not k.inputs or not any(n > 1 for n in k.ast.shape) or self.gemm_of(k, plan) is not None:
                continue
            for gi in reversed(open_by_shape.get(k.ast.shape, [])):
                g = groups[gi]
                if self._joins(g, j, kernels, readers, outputs, plan, options):
                    g.append(j)
                    break
            else:
                open_by_shape.setdefault(k.ast.shape, []).append(len(groups))
                groups.append([j])
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
                saved = sum(_traffic(m, plan) for m in members) - _traffic(mk, plan)
                notes.append(f"{', '.join(k.name for k in members)}: one kernel with {len(members)} outputs "
                             f"({mk.ast.shape} each), their common reads done once ({saved} bytes fewer)")
        return KernelPlan(plan.buffers, plan.n_inputs, out, plan.outputs, plan.predicted, plan.notes)

    def _schedule(self, k, options: LowerOptions) -> tuple[_Decisions, int]:
        """The lowering's decisions for ``k`` alone (``_decisions``) and how many of its sums are
        blocked, kept by its body."""
        hit = self._schedule_memo.get(k.ast)
        if hit is None or hit[0] != options:
            s = schedule_kernel(k, options)
            hit = (options, (_decisions(s), len(s.blocked)))
            self._schedule_memo.put(k.ast, hit)
        return hit[1]

    def _joins(self, g: list[int], j: int, kernels: list, readers: dict[int, list[int]], outputs: set[int],
               plan: KernelPlan, options: LowerOptions) -> bool:
        """Whether kernel ``j`` may join group ``g`` (``merge_siblings``): a buffer read in common or a
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
            if any(m_i < r < j for r in readers.get(kernels[m_i].out, ())):
                return False
        want, blocked = self._schedule(k, options)
        if want.hoist or want.stash or want.tile is not None or want.split:
            return False
        for m in members:
            d, n = self._schedule(m, options)
            if d != want:
                return False
            blocked += n
        bodies = tuple(m.ast for m in members)
        memo = self._group_memo.get(k.ast)
        hit = memo.get(tuple(map(id, bodies))) if memo is not None else None
        if hit is not None and hit[0] == options and all(a is b for a, b in zip(hit[1], bodies)):
            return hit[2]
        got = schedule_kernel(_merged(members + [k], plan), options)
        ok = _decisions(got) == want and len(got.blocked) == blocked     # (each root's long sums blocked)
        if any(b is k.ast for b in bodies):         # (a memo's value must not hold its key)
            return ok
        if memo is None:
            memo = {}
            self._group_memo.put(k.ast, memo)
        if len(memo) >= 16:
            memo.clear()
        memo[tuple(map(id, bodies))] = (options, bodies, ok)
        return ok

    def split(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None) -> tuple[KernelPlan, list]:
        """The plan with each large full reduction split into parallel partials (lower/split.py)
        and each contraction with elementwise ops after it split into the contraction, which the
        BLAS runs, and the rest (lower/contraction.py); and the (shape, dtype) of the scratch
        buffers that adds (taken from the buffer pool at each run). ``notes``: a line per rewrite."""
        blas_on = bool(config.BLAS.value)          # (the library loads at the first contraction)
        threads = options.threads
        if threads < 2 and not blas_on:
            return plan, []
        kernels, extra = [], []
        for k in plan.kernels:
            # a body the device leaves alone is kept so, for the plans that share it
            # (graph/resize.py)
            unsplit = (options, k.predicted, blas_on)
            if self._unsplit_memo.get(k.ast) == unsplit:
                kernels.append(k)
                continue
            if blas_on:
                found = self._contraction(k, plan, threads)
                if found is not None and (found.packs or not found.pure):
                    first = len(plan.buffers) + len(extra)
                    # kept by the body for the plans that share it (a resized plan's unchanged
                    # kernels: their pieces' programs are then found by their bodies too) -- not
                    # when a piece is the body itself (a memo's value must not hold its key)
                    memo = self._blas_memo.get(k.ast)
                    if memo is None or memo[0] != (gemm_key(), first, k.name, k.out):
                        memo = ((gemm_key(), first, k.name, k.out), *self._blas_split(k, found, first))
                        if all(p.ast is not k.ast for p in memo[1]):
                            self._blas_memo.put(k.ast, memo)
                    kernels += memo[1]
                    extra += memo[2]
                    if notes is not None:
                        notes.append(f"{k.name}: contraction {k.ast.shape} to the BLAS"
                                     + (f", {len(found.packs)} operand(s) packed" if found.packs else "")
                                     + ("" if found.pure else ", the ops after it split off into their own kernel")
                                     + f" ({len(memo[1])} kernels, scratch "
                                     + ", ".join(f"{list(sh)} {dt.name}" for sh, dt in memo[2]) + ")")
                    continue
            # the "split reductions" pass decides (lower/passes.py); the device allocates the scratch
            sp = split_reduction(k, len(plan.buffers) + len(extra), options) if threads > 1 else None
            if sp is None:
                self._unsplit_memo.put(k.ast, unsplit)
                kernels.append(k)
                continue
            extra.append((sp[0].ast.shape, sp[0].ast.dtype))
            kernels += sp
            if notes is not None:
                notes.append(f"{k.name}: reduction to {k.ast.shape} split into {sp[0].ast.shape} parallel partials "
                             f"and a final kernel (scratch {list(sp[0].ast.shape)} {sp[0].ast.dtype.name})")
        if not extra:
            return plan, []
        return KernelPlan(plan.buffers + extra, plan.n_inputs, kernels, plan.outputs, plan.predicted, plan.notes), extra

    def _blas_split(self, k, found: contraction.Found, first: int) -> tuple[list, list]:
        """(the kernels, the scratch buffers from id ``first``) that run kernel ``k`` through the
        BLAS: the packs, then the GEMM, then the ops after it (lower/contraction.py)."""
        ids = list(range(first, first + len(found.packs)))
        extra = [(u.shape, u.dtype) for u in found.packs]
        kernels = contraction.pack_kernels(k, found, first)
        body, g = contraction.with_buffers(found, ids)
        if found.pure:
            ast = k.ast.replaced({id(found.red): body})
            kernels.append(Kernel(k.name, k.out, ast, ast.buffers(), k.predicted, k.nbytes, k.flops, k.kind,
                                      k.stats))
        else:
            sp = contraction.split_epilogue(k, found.red, first + len(extra), body)
            extra.append((found.red.shape, found.red.dtype))
            kernels += sp
            ast = sp[0].ast
        self._gemm_memo.put(ast, (gemm_key(), g))
        return kernels, extra

    def _contraction(self, k, plan: KernelPlan, threads: int) -> contraction.Found | None:
        """The contraction of ``k``'s body (lower/contraction.py) when the BLAS runs it
        (``blas.pays``, or timed: ``_measured``), else None; worked out once per body."""
        memo = self._contraction_memo.get(k.ast)
        key = gemm_key()
        if memo is not None and memo[0] == key:
            return memo[1] if memo[2] is None else _attached(memo[2], k.ast)
        if contraction.candidate(k.ast) is None or self.device.blas() is None:
            self._contraction_memo.put(k.ast, (key, None, None))
            return None
        # a body whose sizes keep changing (traced: a growing sequence's attention) lowers from its
        # trace in a fraction of a millisecond: where its structure had no GEMM that pays at sizes
        # within MEASURED_SPAN x of these, it is not looked at again each step (~0.25 ms a kernel)
        skeleton, sizes = body_sizes(k, plan)
        scale = max(sizes, default=1)
        seen = self._no_gemm.get(skeleton)
        if seen is not None and _near(seen, scale) and trace.TRACES.has_traces(k, plan):
            found = None
        else:
            found = contraction.find_contraction(k.ast)
            verdict = False if found is None else blas.pays(found.gemm, k.predicted, threads)
            if verdict is False:
                if len(self._no_gemm) >= 4096:
                    self._no_gemm.clear()
                self._no_gemm[skeleton] = scale
            elif verdict is None or found.packs:                     # (packing costs: timed)
                verdict = self._measured(k, found, plan, threads)
            if not verdict:
                found = None
        # (a pure contraction's reduction is the body itself: kept without it, as a memo's value
        # must not hold its key)
        if found is not None and k.ast in (found.red, found.packed):
            self._contraction_memo.put(k.ast, (key, None, _detached(found, k.ast)))
        else:
            self._contraction_memo.put(k.ast, (key, found, None))
        return found

    def _measured(self, k, found: contraction.Found, plan: KernelPlan, threads: int) -> bool:
        """Whether the BLAS runs the contraction ``found`` of kernel ``k`` (with the kernels that
        materialize its packed operands first) faster than the generated kernel ``k`` runs with
        all of its body: both timed on random inputs (the fastest of 3 runs each, in turns), once per
        kernel structure (sizes aside: within MEASURED_SPAN x of the flops), thread count and
        machine (``gemm.json`` in the cache directory, as the kernel search's picks). The
        generated side includes the ops after the contraction, the BLAS side not (they are a
        separate streaming kernel there, ~10 % of a Linear layer's GEMM)."""
        g = found.gemm
        # kept per kernel structure without its sizes: a choice measured within MEASURED_SPAN x
        # of this contraction's flops is this one's too (a new batch size, a longer sequence: the
        # crossover between the two moves slowly with size), so a new size is rarely timed
        skeleton = body_sizes(k, plan)[0]
        # and by eqgrad's sources (the generated side is this version's code): a choice an older
        # version measured kept an FFN step's 480 x 1536 x 384 GEMM generated, 6.8 ms, where this one
        # times the BLAS at 2.2 ms and the generated kernel at 6.1
        ckey = hashlib.sha256(repr((skeleton, found.packs != (), threads, machine_key("LLVM"),
                                    source_digest())).encode()).hexdigest()[:24]
        seen = blas.CHOICES.get(ckey, None) or []
        near = [v for f, v in seen if _near(f, g.flops)]
        if near:
            return near[0]
        rng = np.random.default_rng(0)
        first = len(plan.buffers)
        ids = list(range(first, first + len(found.packs)))
        tmp = KernelPlan(plan.buffers + [(u.shape, u.dtype) for u in found.packs], plan.n_inputs, [], [], 0.0)
        packs = contraction.pack_kernels(k, found, first)
        body, g = contraction.with_buffers(found, ids)
        bufs = {b: Buffer.from_numpy(to_storage(rng.standard_normal(tmp.buffers[b][0]).astype(tmp.buffers[b][1].vnp),
                                                tmp.buffers[b][1]), self.device.name, tmp.buffers[b][1])
                for b in {k.out, *k.inputs, *ids}}
        scratch = Buffer.from_numpy(np.zeros(found.red.shape, np.float32), self.device.name)
        target = self.device.target()
        gen, n = self.device.build_member(k, plan, None, target, None)
        built = [(pk, *self.device.build_member(pk, tmp, None, target, None)) for pk in packs]
        ins = body.buffers()
        lib = blas.GemmProgram(f"{k.name}g", g, (-1, *ins), self.device.blas(), threads)
        gen_ptrs = [bufs[b].ptr for b in (k.out, *k.inputs)]
        lib_ptrs = [scratch.ptr] + [bufs[b].ptr for b in ins]

        def with_blas() -> None:
            for pk, prg, m in built:
                self.device.launch(pk, prg, [bufs[b].ptr for b in (pk.out, *pk.inputs)], m, threads)
            self.device.launch(k, lib, lib_ptrs, lib.units, threads)

        def generated() -> None:
            self.device.launch(k, gen, gen_ptrs, n, threads)

        def timed(run) -> float:
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0
        # each as a plan's later runs run it (its thread split chosen), then in turns, so that a
        # slow moment of a shared machine (another library's threads still spinning) falls on
        # both; each side's fastest run counts (a slow moment only ever adds time: a median of 3
        # is moved by two). A BLAS BLAS_GIVE_UP x slower than the generated kernel in each of the
        # first two turns is not run a third time. (One turn was once enough: a single slow BLAS
        # run then decided, and gemm.json kept it -- BERT's value projection ran generated in
        # every layer, 1.85 ms against 0.6 + 0.1 through the BLAS, in one of five bench runs.)
        self.device.settle(k, gen, gen_ptrs, n, threads)
        for pk, prg, m in built:
            self.device.settle(pk, prg, [bufs[b].ptr for b in (pk.out, *pk.inputs)], m, threads)
        self.device.settle(k, lib, lib_ptrs, lib.units, threads)
        ts_gen, ts_blas = [], []
        for turn in range(3):
            ts_gen.append(timed(generated))
            ts_blas.append(timed(with_blas))
            if turn == 1 and min(ts_blas) > BLAS_GIVE_UP * max(ts_gen):
                break
        t_gen, t_blas = min(ts_gen), min(ts_blas)
        verdict = t_blas < t_gen
        if config.DEBUG.value >= 2:
            print(f"  BLAS or generated for {k.name} ({g.batches} x {g.m}x{g.n}x{g.k}"
                  f"{f', {len(packs)} packed' if packs else ''}): BLAS {t_blas * 1e6:.0f} us, "
                  f"generated {t_gen * 1e6:.0f} us: {'BLAS' if verdict else 'generated'}")
        blas.CHOICES.put(ckey, (seen + [[g.flops, verdict]])[-MEASURED_KEEP:])
        return verdict

    def gemm_of(self, k, plan: KernelPlan) -> Any:
        """The Gemm the BLAS runs as kernel ``k`` (a pure contraction of buffers), or None."""
        if not config.BLAS.value or k.also:
            return None
        hit = self._gemm_memo.get(k.ast)
        if hit is not None and hit[0] == gemm_key():
            return hit[1]
        found = self._contraction(k, plan, config.THREADS.value)
        g = found.gemm if found is not None and not found.packs and found.pure else None
        self._gemm_memo.put(k.ast, (gemm_key(), g))
        return g


class _Decisions(NamedTuple):
    """What of a schedule must be the same for a kernel alone and in a GROUP (``merge_siblings``;
    the GROUP's blocked sums are its roots' together)."""
    lanes: tuple
    parallel: int
    hoist: bool
    stash: bool
    tile: Any
    split: bool
    sum_block: int
    sum_radix: int


def _decisions(s: Any) -> _Decisions:
    return _Decisions(s.lanes, s.parallel, bool(s.hoist), s.stash is not None, s.tile, s.split is not None,
                      s.sum_block, s.sum_radix)


def _traffic(k: Kernel, plan: KernelPlan) -> int:
    """The bytes of every buffer ``k`` writes or reads, once each (the cost model's count)."""
    return sum(numel(plan.buffers[b][0]) * plan.buffers[b][1].itemsize for b in k.params)


def _reads_at_its_index(root: KNode, bufs: set[int]) -> bool:
    """Whether every read of ``bufs`` in the body ``root`` is at the element the root computes:
    reached from the root through elementwise ops only (no movement, reduction or pad on the way)."""
    stack, seen = [(root, True)], set()
    while stack:
        n, here = stack.pop()
        if (id(n), here) in seen:
            continue
        seen.add((id(n), here))
        if n.op == "BUF":
            if n.arg in bufs and (not here or n.shape != root.shape):
                return False
            continue
        here = here and n.op in ELEMENTWISE
        stack.extend((x, here) for x in n.src)
    return True


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
    ast = KNode(GROUP, tuple(roots), None, members[0].ast.shape, members[0].ast.dtype)
    inputs = ast.buffers()
    first = members[0]
    nbytes = sum(numel(plan.buffers[b][0]) * plan.buffers[b][1].itemsize
                 for b in (*(m.out for m in members), *inputs))
    before = sum(_traffic(m, plan) for m in members)
    stats = None
    if all(m.stats is not None for m in members):
        st = [m.stats for m in members]
        stats = KernelStats(float(nbytes), sum(x.flops for x in st), sum(x.nodes for x in st),
                            sum(x.cflops for x in st), min(x.fill for x in st), 0.0)
    # its prediction: the members' less the share of their bytes it does not move
    total = sum(m.predicted for m in members) * min(1.0, nbytes / max(1, before))
    return Kernel("+".join(m.name for m in members), first.out, ast, inputs, total, nbytes,
                  sum(m.flops for m in members), tuple(sorted({x for m in members for x in m.kind})), stats,
                  tuple(m.out for m in members[1:]))
