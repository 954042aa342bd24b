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
  (lower/contraction.py);
- a contraction the BLAS does not run whose operand streams across its register lanes' axis (``q @
  k.T``) with that operand packed first, lanes' axis innermost (lower/passes.py ``lane_pack``), and
  so the operand of a row-fused kernel's scores that the row-dots pass reads along the keys
  (attention as one kernel: k, packed as k^T; ``row_pack``);
- sibling kernels run as one kernel with several outputs (lower/merge.py), none that the BLAS runs.

``LLVMDevice`` (devices/cpu.py) keeps the runtime: compiling, the thread pool, launching, the
BLAS programs; this module decides. What is worked out once per kernel body is kept here by body
(weakly, ``NodeMemo``: an entry goes with its body), never on the body.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

import numpy as np

from eqgrad import config
from eqgrad.cache import machine_key, source_digest
from eqgrad.devices import Buffer, DevicePlan, blas
from eqgrad.dtype import to_storage
from eqgrad.graph.plan import Kernel, KernelPlan, KNode, NodeMemo
from eqgrad.graph.sizes import body_sizes
from eqgrad.lower import contraction, trace
from eqgrad.lower.merge import SiblingMerger
from eqgrad.lower.passes import LowerOptions, lane_pack, row_lanes, row_pack
from eqgrad.ops import numel
from eqgrad.lower.split import split_reduction

# the knobs below: docs/lowering.md, Constants (what each bounds, the measurement behind it)
MEASURED_SPAN = 4         # a BLAS-or-generated choice holds for contractions of up to 4x (1/4x) its flops
MEASURED_KEEP = 16        # choices kept per kernel structure (the latest)
BLAS_GIVE_UP = 4          # a BLAS this much slower than the generated kernel in two turns is not timed a third time
MEASURED_PROCESSES = 3    # a kept choice is timed again by each of the first 3 processes that meet it


def gemm_key() -> tuple:
    """What a BLAS-or-generated answer depends on besides the body: the BLAS flag, the threads."""
    return (config.BLAS.value, config.THREADS.value)


def _note_miss(misses: dict, key: tuple, scale: int) -> None:
    """Remember that a body structure found nothing at size ``scale`` (``CPUStage._missed_near``);
    at most 4096 structures, then forgotten."""
    if len(misses) >= 4096:
        misses.clear()
    misses[key] = scale


def _near(a: int, b: int) -> bool:
    """Whether two sizes (or flop counts) are within MEASURED_SPAN x of each other."""
    return max(a, b) <= MEASURED_SPAN * max(1, min(a, b))


def gemm_dims(g: Any) -> list[int]:
    """The dimensions a kept BLAS-or-generated choice is near in: (batches, m, n, k) of a Gemm."""
    return [g.batches, g.m, g.n, g.k]


def near_choice(seen: list, flops: int, dims: list[int]) -> list | None:
    """The kept choice of ``seen`` (``gemm.json`` entries of one structure) that holds for a
    contraction of ``flops`` and ``dims`` (``gemm_dims``): within MEASURED_SPAN x of its flops and
    of each of its dimensions. Flops alone matched attention's 384 products of 128 x 32 x 128 to 4
    of 1024 x 64 x 1024 (the same body at other sizes, 0.75x the flops), where the BLAS won by 3 %
    and the generated kernel runs 1.6x faster (1.5 against 2.5 ms; 2-vCPU Xeon)."""
    return next((e for e in seen if _near(e[0], flops) and all(_near(a, b) for a, b in zip(e[4], dims))), None)


def kept_choice(entry: list | None, flops: int, dims: list[int], t_gen: float, t_blas: float) -> list:
    """The ``gemm.json`` entry ``[flops, generated seconds, BLAS seconds, processes, dims]`` after a
    process timed a contraction of ``flops`` and ``dims`` at ``t_gen`` and ``t_blas``: a new one,
    or ``entry`` (a choice near it: ``near_choice``) with each side's fastest, this timing scaled
    to its flops (the choice holds across the span; the times per flop move slowly within it)."""
    if entry is None:
        return [flops, t_gen, t_blas, 1, list(dims)]
    scale = entry[0] / max(1, flops)
    return [entry[0], min(entry[1], t_gen * scale), min(entry[2], t_blas * scale), entry[3] + 1, entry[4]]


def _lane_packed(k: Kernel, lp: tuple, first: int) -> tuple[list[Kernel], list]:
    """(the kernels -- the packs into scratch buffers ``first``, ``first + 1``, ..., then ``k``
    reading them --, those scratch buffers) of ``lane_pack``'s or ``row_pack``'s answer ``lp`` for
    kernel ``k``: (a pack, or a tuple of packs, the body reading pack i from buffer -1 - i)."""
    packs, body = lp
    packs = packs if isinstance(packs, tuple) else (packs,)
    body = _rebuffered(body, {n.arg: first - 1 - n.arg for n in body.walk() if n.op == "BUF" and n.arg < 0})
    # (each piece keeps the plan kernel's kind and prediction: what it was priced as)
    pks = [Kernel(f"{k.name}p{i}", first + i, pack, pack.buffers(), k.predicted, 8 * numel(pack.shape), 0, k.kind,
                  k.stats) for i, pack in enumerate(packs)]
    nk = Kernel(k.name, k.out, body, body.buffers(), k.predicted, k.nbytes, k.flops, k.kind, k.stats, also=k.also)
    return [*pks, nk], [(pack.shape, pack.dtype) for pack in packs]


def _shared_packs(pieces: list[Kernel], scratch: list, first: int, made: dict[str, int]) -> tuple[list[Kernel], list]:
    """``_lane_packed``'s kernels and scratch (from buffer ``first``) without the packs an earlier
    kernel of the plan made already (``made``: a pack's body -> its buffer; the scratch buffers live
    for the whole run): the body reads that one's buffer instead. The bounded attention backward's
    six kernels pack k^T four times, v^T, q^T twice each, 0.3 ms a pack at b1 h4 s1024 d64."""
    remap: dict[int, int] = {}
    kept, kept_scratch = [], []
    for pk, sc in zip(pieces[:-1], scratch):
        key = pk.ast.render()
        if key in made:
            remap[pk.out] = made[key]
            continue
        at = first + len(kept)
        remap[pk.out] = made[key] = at
        kept.append(dataclasses.replace(pk, out=at) if at != pk.out else pk)
        kept_scratch.append(sc)
    body = pieces[-1]
    if any(a != b for a, b in remap.items()):
        ast = _rebuffered(body.ast, remap)
        body = dataclasses.replace(body, ast=ast, inputs=ast.buffers())
    return [*kept, body], kept_scratch


def _rebuffered(root: KNode, ids: dict[int, int]) -> KNode:
    """``root`` reading buffer ``ids[b]`` where it read buffer ``b``."""
    return root.replaced({id(n): KNode("BUF", (), ids[n.arg], n.shape, n.dtype) for n in root.walk()
                          if n.op == "BUF" and ids.get(n.arg, n.arg) != n.arg})


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
        self._no_gemm: dict[tuple, int] = {}        # (body skeleton, ()) -> the last size where it had no GEMM that pays
        self._no_pack: dict[tuple, int] = {}        # (body skeleton, lane widths) -> the last size where it had no lane pack
        self._unsplit_memo = NodeMemo()      # body -> what split left it alone for
        self._blas_memo = NodeMemo()         # body -> (what it depends on, its BLAS kernels, scratch)
        self._contraction_memo = NodeMemo()  # body -> (gemm_key, _contraction's answer, detached)
        self._gemm_memo = NodeMemo()         # body -> (gemm_key, the Gemm it runs as or None)
        self._lane_pack_memo = NodeMemo()    # body -> (the lane widths, lane_pack's answer)
        self._packed_memo = NodeMemo()       # body -> (its first scratch id, name, output; its kernels, scratch)
        self._timed_here: set[tuple] = set()  # (gemm.json key, entry's flops) this process timed
        self.merger = SiblingMerger()        # sibling kernels as one (lower/merge.py)

    def rewrite(self, plan: KernelPlan, options: LowerOptions) -> DevicePlan:
        """``split`` with the device's options (its threads, the predicted time above which a
        full reduction is cut into partials), with what it did in words."""
        notes: list[str] = []
        # (row statistics into their row-fused reader first: the reader's packs are then its own)
        plan = self.merger.absorb_rows(plan, options, notes, exclude=lambda k: self.gemm_of(k, plan) is not None)
        out, scratch = self.split(plan, options, notes)
        out = self.merge_siblings(out, options, notes)
        return DevicePlan(out, scratch, notes)

    def merge_siblings(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None) -> KernelPlan:
        """Sibling kernels run as one kernel with several outputs (lower/merge.py), none the BLAS runs."""
        return self.merger.merge(plan, options, notes, exclude=lambda k: self.gemm_of(k, plan) is not None)

    def split(self, plan: KernelPlan, options: LowerOptions, notes: list[str] | None = None) -> tuple[KernelPlan, list]:
        """The plan with each large full reduction split into parallel partials (lower/split.py)
        and each contraction with elementwise ops after it split into the contraction, which the
        BLAS runs, and the rest (lower/contraction.py); and the (shape, dtype) of the scratch
        buffers that adds (taken from the buffer pool at each run). ``notes``: a line per rewrite."""
        blas_on = bool(config.BLAS.value)          # (the library loads at the first contraction)
        threads = options.threads
        kernels, extra = [], []
        made: dict[str, int] = {}          # the lane packs made so far: body -> scratch buffer
        for k in plan.kernels:
            # a body the device leaves alone is kept so, for the plans that share it
            # (graph/resize.py)
            unsplit = (options, k.predicted, blas_on)
            if self._unsplit_memo.get(k.ast) == unsplit:
                kernels.append(k)
                continue
            found = self._contraction(k, plan, threads) if blas_on else None
            if found is None and (lp := self._lane_pack(k, options, plan)) is not None:
                # generated, with the operand that kept it from register lanes packed first
                first = len(plan.buffers) + len(extra)
                memo = self._packed_memo.get(k.ast)
                if memo is None or memo[0] != (first, k.name, k.out):
                    memo = self._packed_memo.put(k.ast, ((first, k.name, k.out), *_lane_packed(k, lp, first)))
                    # (chosen over the BLAS, or with it off: the packed body is not asked again)
                    self._gemm_memo.put(memo[1][-1].ast, (gemm_key(), None))
                pieces, scratch = _shared_packs(memo[1], memo[2], first, made)
                if pieces[-1] is not memo[1][-1]:
                    self._gemm_memo.put(pieces[-1].ast, (gemm_key(), None))
                kernels += pieces
                extra += scratch
                if notes is not None:
                    what = "row-fused kernel" if row_lanes(k.ast) else "contraction"
                    n, shared = len(memo[2]), len(memo[2]) - len(scratch)
                    notes.append(f"{k.name}: {what} {k.ast.shape} with {'an operand' if n == 1 else f'{n} operands'} "
                                 f"packed {', '.join(str(list(sh)) for sh, _ in memo[2])} so that its register "
                                 f"lanes read {'it' if n == 1 else 'them'} with unit stride ({len(pieces)} kernel{'s' if len(pieces) > 1 else ''}"
                                 + (f"; {shared} pack(s) an earlier kernel made" if shared else "") + ")")
                continue
            if blas_on:
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
        return dataclasses.replace(plan, buffers=plan.buffers + extra, kernels=kernels), extra

    def _lane_pack(self, k, options: LowerOptions, plan: KernelPlan) -> tuple | None:
        """``lower/passes.py lane_pack`` of ``k``'s body for ``options``' widths, once per body; and,
        as ``_contraction`` does for the BLAS, not asked again for a traced body whose structure had
        no pack at sizes within MEASURED_SPAN x of these (a growing sequence's resized kernels are new
        bodies at every step: a decode step's attention, fused into its output projection, spent
        3.5 ms a step in ``row_pack`` to find no pack again)."""
        key = (options.lanes_last, options.lanes_prev, options.lane_body_max, options.dot_block, options.tile_min_stream)
        hit = self._lane_pack_memo.get(k.ast)
        if hit is None or hit[0] != key:
            miss, scale, skipped = self._missed_near(self._no_pack, key, k, plan)
            found = None if skipped else lane_pack(k.ast, options) or row_pack(k.ast, options)
            if found is None and not skipped:
                _note_miss(self._no_pack, miss, scale)
            hit = self._lane_pack_memo.put(k.ast, (key, found))
        return hit[1]

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

    def _missed_near(self, misses: dict, extra: tuple, k, plan: KernelPlan) -> tuple[tuple, int, bool]:
        """(the key of ``k``'s body structure and ``extra`` in ``misses``, its size, whether a traced
        body of that structure found nothing at a size within MEASURED_SPAN x of it): the BLAS's
        (``_no_gemm``) and the lane pack's (``_no_pack``) questions, not asked again each step."""
        skeleton, sizes = body_sizes(k, plan)
        scale, key = max(sizes, default=1), (skeleton, extra)
        seen = misses.get(key)
        return key, scale, seen is not None and _near(seen, scale) and \
            trace.TRACES.has_traces(k, plan, self.device.trace_key)

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
        miss, scale, skipped = self._missed_near(self._no_gemm, (), k, plan)
        if skipped:
            found = None
        else:
            found = contraction.find_contraction(k.ast)
            verdict = False if found is None else blas.pays(found.gemm, k.predicted, threads)
            if verdict is False:
                _note_miss(self._no_gemm, miss, scale)
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
        separate streaming kernel there, ~10 % of a Linear layer's GEMM).

        What is kept is each side's time, not the verdict: each of the first MEASURED_PROCESSES
        processes that meet the structure times it again (once a process), and each side keeps
        its fastest over them, so a choice first timed while the machine was busy is righted by
        a later, quieter process (a slow moment only ever adds time). A choice timed while the
        test suite ran on both cores had kept 25 of a BERT encoder's 36 products on the BLAS
        side of a close call for good: 72 ms a forward against 60 with a fresh cache."""
        g = found.gemm
        # kept per kernel structure without its sizes: a choice measured within MEASURED_SPAN x
        # of this contraction's flops is this one's too (a new batch size, a longer sequence: the
        # crossover between the two moves slowly with size), so a new size is rarely timed
        skeleton = body_sizes(k, plan)[0]
        # and by eqgrad's sources (the generated side is this version's code): a choice an older
        # version measured kept an FFN step's 480 x 1536 x 384 GEMM generated, 6.8 ms, where this one
        # times the BLAS at 2.2 ms and the generated kernel at 6.1
        # the generated side is the kernel with its lane pack where it has one (``lane_pack``)
        lp = self._lane_pack(k, LowerOptions.for_caps(self.device.caps, threads=threads), plan)
        ckey = hashlib.sha256(repr((skeleton, found.packs != (), threads, machine_key("LLVM"), source_digest())
                                   + (("lane pack",) if lp is not None else ())).encode()).hexdigest()[:24]
        seen = blas.CHOICES.get(ckey, None) or []
        near = near_choice(seen, g.flops, gemm_dims(g))
        if near is not None and (near[3] >= MEASURED_PROCESSES or (ckey, near[0]) in self._timed_here):
            return near[2] < near[1]
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
        bufs_lane = None
        if lp is None:
            gen_steps = [(k, plan)]
        else:                              # (its scratch after the plan's buffers)
            pieces, lane_scratch = _lane_packed(k, lp, len(plan.buffers))
            lane_plan = KernelPlan(plan.buffers + lane_scratch, plan.n_inputs, [], [], 0.0)
            bufs_lane = {len(plan.buffers) + i: Buffer.from_numpy(np.zeros(sh, dt.vnp), self.device.name, dt)
                         for i, (sh, dt) in enumerate(lane_scratch)}
            gen_steps = [(pk, lane_plan) for pk in pieces]
        gen_built = [(gk, *self.device.build_member(gk, gp, None, target, None)) for gk, gp in gen_steps]
        built = [(pk, *self.device.build_member(pk, tmp, None, target, None)) for pk in packs]
        ins = body.buffers()
        lib = blas.GemmProgram(f"{k.name}g", g, (-1, *ins), self.device.blas(), threads)
        lib_ptrs = [scratch.ptr] + [bufs[b].ptr for b in ins]

        def ptr(b: int) -> int:
            return bufs[b].ptr if b in bufs else bufs_lane[b].ptr
        gen_runs = [(gk, prg, [ptr(b) for b in (gk.out, *gk.inputs)], m) for gk, prg, m in gen_built]

        def with_blas() -> None:
            for pk, prg, m in built:
                self.device.launch(pk, prg, [bufs[b].ptr for b in (pk.out, *pk.inputs)], m, threads)
            self.device.launch(k, lib, lib_ptrs, lib.units, threads)

        def generated() -> None:
            for gk, prg, ptrs, m in gen_runs:
                self.device.launch(gk, prg, ptrs, m, threads)

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
        # Each timed run comes after an untimed one of the same side: right after the other, a
        # run paid for what that one left -- the device's workers parked by the BLAS's threads
        # (spin.py), a wake-up of the other CPU: a 1536 x 576 matrix-vector kernel timed 146-164 us
        # generated against 45-102 us in a row, and went to the BLAS (95-132 us)
        for gk, prg, ptrs, m in gen_runs:
            self.device.settle(gk, prg, ptrs, m, threads)
        for pk, prg, m in built:
            self.device.settle(pk, prg, [bufs[b].ptr for b in (pk.out, *pk.inputs)], m, threads)
        self.device.settle(k, lib, lib_ptrs, lib.units, threads)
        ts_gen, ts_blas = [], []
        for turn in range(3):
            generated()
            ts_gen.append(timed(generated))
            with_blas()
            ts_blas.append(timed(with_blas))
            if turn == 1 and min(ts_blas) > BLAS_GIVE_UP * max(ts_gen):
                break
        entry = kept_choice(near, g.flops, gemm_dims(g), min(ts_gen), min(ts_blas))
        verdict = entry[2] < entry[1]
        if config.DEBUG.value >= 2:
            print(f"  BLAS or generated for {k.name} ({g.batches} x {g.m}x{g.n}x{g.k}"
                  f"{f', {len(packs)} packed' if packs else ''}): BLAS {min(ts_blas) * 1e6:.0f} us, "
                  f"generated{' (its operand packed for lanes)' if lp is not None else ''} "
                  f"{min(ts_gen) * 1e6:.0f} us (timed by {entry[3]} of {MEASURED_PROCESSES} "
                  f"processes): {'BLAS' if verdict else 'generated'}")
        self._timed_here.add((ckey, entry[0]))
        blas.CHOICES.put(ckey, ([e for e in seen if e is not near] + [entry])[-MEASURED_KEEP:])
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
