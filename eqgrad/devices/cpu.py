"""The LLVM CPU device: plan -> loop IR per kernel -> LLVM IR -> machine code, run through ctypes.

Threads: a kernel may split its outermost parallel loop (loop IR ``parallel``) into chunks that
the ``EQGRAD_THREADS`` threads take in turn; one is the calling thread, the others a small
persistent pool. ctypes releases the GIL for the call, so the chunks really run at once; they write
disjoint output elements. Handing work to the pool costs what waking a sleeping thread costs on
this machine, which differs by an order of magnitude between machines: ~10-20 us on a Zen 5 host,
100-300 us on a 2-vCPU Emerald Rapids VM (a no-op job's round trip; there a 184K-element multiply
took 41 us on one thread and 284 us split in two, a 1M-element one 393 against 724 us). So whether a
kernel is split is measured, per kernel: ``launch`` runs each one on one thread, then split, over its
first ``SPLIT_PROBES`` runs (per loop extent within a factor of 2) and keeps the faster (a threshold
on the predicted time would inherit the cost model's errors: it underestimates some kernels 5x),
timing the other way again from run ``SPLIT_RECHECK`` on, at every power of 4 (a probe the other
vCPU's work slowed is not kept for the rest of the process).
Kernels predicted below ``SPLIT_FLOOR`` always run on one thread, kernels predicted above
``SPLIT_SURE`` are always split; ``PARALLEL_MIN``, when set (tests), replaces the measurement by a
threshold on the prediction. A kernel that reduces a
large tensor to one value has no parallel loop; the device's stage first rewrites it into parallel
partial reductions and a small final one (lower/split.py), and routes contractions to the BLAS
(cpustage.py: what the device rewrites is decided there; this module is the runtime).

Target: ``EQGRAD_CPU`` (config.py) names the CPU LLVM compiles for; ``host`` (the default) is this
machine's name and features. The device runs what it compiles, so ``runnable_target`` refuses a
target with a feature this CPU lacks, naming it.

Compiled programs live as long as a prepared plan uses them: ``prepare`` returns a ``run`` that
holds its programs, and each plan's new programs share one MCJIT engine (llvm.CodeEngine), whose
machine code is unmapped when the last of them is gone -- when eqgrad.engine's plan cache drops the
plan (and no JIT, explain() result or other plan still holds it). ``programs`` finds a program
that is still alive by source, nontemporal and target, so plans share their common kernels;
it holds none of them. Object code is cached on disk across processes (kernelcache.py). A kernel
family whose sizes keep changing (a growing sequence) gets one program that takes its sizes as an
argument (sizeargs.py, ``build_member``).
"""
from __future__ import annotations

import functools
import itertools
import math
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import llvmlite.binding as llvm

from eqgrad import config
from eqgrad.graph.caps import Capabilities, cpu_caps
from eqgrad.graph.plan import KernelPlan, NodeMemo
from eqgrad.graph.sizes import body_sizes
from eqgrad.devices import Buffer, Device, DevicePlan
from eqgrad.lower import lowering, trace
from eqgrad.lower.passes import LowerOptions
from eqgrad.ops import numel
from eqgrad.devices import blas, compilepool, kernelcache, spin
from eqgrad.devices.llvm import (LLVM_OPS, COMPILE_LOCK, NT_MIN, PREFETCHED, CodeEngine, LLVMProgram, compiler,
                                 render_llvm, streaming_store)
from eqgrad.devices.sizeargs import Families, Sized
from eqgrad.devices.cpustage import CPUStage
from eqgrad import progress
from eqgrad.counters import GlobalCounters, log_kernel, timing_kernels
from eqgrad.errors import CompileError, DeviceError
from eqgrad.cache import save_failed_source
from eqgrad.devices.search import search_upcast

# Every import is above, none in a function: a thread inside a first import when another forks
# leaves the module's import lock held in the child, whose own import of it then waits forever.

PARALLEL_MIN: float | None = None   # predicted seconds above which a kernel is split; None: measured (launch)
# the knobs below: docs/lowering.md, Constants (what each bounds, the measurement behind it)
SPLIT_PROBES = 4          # first runs of a kernel timed by ``launch``: half on one thread, then half split (the best of each counts)
SPLIT_RECHECK = 16        # from this run on, at every run that is a power of 4, the way not chosen is timed again (launch)
SPLIT_FLOOR = 20e-6       # predicted seconds below which a kernel runs on one thread, unprobed: waking a
                          # thread costs about that on a fast host (10-20 us), far more on a VM
SPLIT_SURE = 10e-3        # predicted seconds above which a kernel is split, unprobed: 30x the dearest
                          # wake-up measured (300 us), so one run on one thread would only cost time
CHUNKS_PER_THREAD = 4     # pieces of the split loop per thread, taken in turn (launch)
CHUNK_MIN = 4             # iterations of the split loop per piece, at least (times the grain)
WARM_POOL_NODES = 16      # program nodes from which warm() starts the compile worker (a smaller one rarely plans 2+ kernels)

Target = tuple[str, str]  # (LLVM CPU name, LLVM feature string)


@functools.lru_cache(maxsize=None)
def resolve_target(value: str) -> Target | None:
    """The target an EQGRAD_CPU value (as config.py checked it) names: ``"x86-64-v3,-fma"`` is
    ``("x86-64-v3", "-fma")`` (LLVM adds the CPU's own features); ``host`` with items is the host's
    name and features with the items applied. None for plain ``host``: compile as before the flag."""
    name, *mods = value.split(",")
    if name != "host":
        return name, ",".join(mods)
    if not mods:
        return None
    feats = llvm.get_host_cpu_features()
    for m in mods:
        feats[m[1:]] = m[0] == "+"
    return llvm.get_host_cpu_name(), feats.flatten()


@functools.lru_cache(maxsize=None)
def target_caps(value: str) -> Capabilities:
    """The lowering capabilities of code compiled for EQGRAD_CPU ``value`` (graph/caps.py
    ``cpu_caps``): its vector registers' width in float32s, from its features (AVX-512F: 16, AVX: 8,
    else SSE's 4) -- the host's as LLVM reports them, a named CPU's through ``has_features``."""
    target = resolve_target(value)
    if target is None:
        feats = llvm.get_host_cpu_features()
        has = {f for f in ("avx512f", "avx") if feats.get(f, False)}
    else:
        has = set(has_features(target, ("avx512f", "avx")))
    return cpu_caps(16 if "avx512f" in has else 8 if "avx" in has else 4)


@functools.lru_cache(maxsize=None)
def has_features(target: Target, features: tuple[str, ...]) -> tuple[str, ...]:
    """Which of ``features`` code compiled for ``target`` may use (``missing_features``' test, for
    features this CPU has as well as those it lacks)."""
    with COMPILE_LOCK:
        return _features_of(target, features)


def _features_of(target: Target, features: tuple[str, ...]) -> tuple[str, ...]:
    """The features of ``features`` that ``target`` has, by LLVM's inliner (``missing_features``);
    the caller holds COMPILE_LOCK."""
    cpu, feats = target
    lines = []
    for i, f in enumerate(features):
        without = f"{feats},-{f}" if feats else f"-{f}"
        lines += [f"define internal i32 @callee{i}(i32 %x) #{2 * i} {{\n  %y = add i32 %x, 1\n  ret i32 %y\n}}",
                  f"define i32 @caller{i}(i32 %x) #{2 * i + 1} {{\n  %y = call i32 @callee{i}(i32 %x)\n  ret i32 %y\n}}",
                  f'attributes #{2 * i} = {{ "target-cpu"="{cpu}" "target-features"="{feats}" }}',
                  f'attributes #{2 * i + 1} = {{ "target-cpu"="{cpu}" "target-features"="{without}" }}']
    mod = llvm.parse_assembly("\n".join(lines))
    tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    callers = {fn.name: str(fn) for fn in mod.functions}
    return tuple(f for i, f in enumerate(features) if f"@callee{i}(" in callers.get(f"caller{i}", ""))


@functools.lru_cache(maxsize=None)
def missing_features(target: Target) -> tuple[str, ...]:
    """The features of ``target`` this CPU lacks, sorted; () when it can run the target's code.

    LLVM has no API that lists the features a CPU name implies, so LLVM's inliner answers: it
    inlines a call only when the callee's features are a subset of the caller's
    (``X86TTIImpl::areInlineCompatible``). For each feature F this CPU lacks, one module holds a
    callee compiled for the target and its caller compiled for the target without F; the call
    stays iff the target has F. One module for all features: ~60 ms, once per target."""
    with COMPILE_LOCK:           # LLVM's one global context, as a compile (llvm.py)
        _, features = target
        host = llvm.get_host_cpu_features()
        asked = [m[1:] for m in features.split(",") if m.startswith("+")]
        lacks = sorted({f for f, on in host.items() if not on} | {f for f in asked if not host.get(f, False)})
        if not lacks:
            return ()
        return _features_of(target, tuple(lacks))


def runnable_target(value: str) -> Target | None:
    """``resolve_target(value)``, or DeviceError when this CPU cannot execute code compiled for it
    (the LLVM device runs what it compiles: an illegal instruction would kill the process)."""
    target = resolve_target(value)
    lacks = missing_features(target) if target is not None else ()
    if lacks:
        name, *mods = value.split(",")
        fix = ",".join([name] + [m for m in mods if m[1:] not in lacks] + [f"-{f}" for f in lacks])
        raise DeviceError(f"LLVM device: EQGRAD_CPU={value} needs {', '.join(lacks)}; this CPU "
                          f"({llvm.get_host_cpu_name()}) lacks {'it' if len(lacks) == 1 else 'them'}, and the "
                          f"device runs what it compiles. Use EQGRAD_CPU=host, a CPU this one covers "
                          f"(e.g. x86-64-v2), or remove them: EQGRAD_CPU={fix}")
    return target


def _compiled(k, src: str, make: Callable[[], Any], what: str = "") -> Any:
    """``make()`` (a program compiled from ``src``), or the CompileError naming the kernel, what
    went wrong and where its LLVM IR was saved."""
    try:
        return make()
    except Exception as e:
        where = save_failed_source(k.name, ".ll", src)      # never raises: it must not hide this error
        raise CompileError(f"LLVM device: kernel {k.name} ({k.ast.render()[:80]}) failed to compile{what}: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}; "
                           f"its LLVM IR {where}") from e


def _split_extent(lk) -> int:
    """The extent of loop kernel ``lk``'s split loop (its first parallel RANGE; 1 without one): a
    launch's [0, n), not part of the program (``lo``/``hi`` are arguments)."""
    return lk.insts[lk.parallel_ranges()[0]].arg if lk.parallel else 1


class _Signature(NamedTuple):
    """What LLVMProgram reads of a loop kernel, for a source kept on disk (``_from_disk``)."""
    name: str
    params: tuple


def _band(n: int) -> tuple[int, bool]:
    """What ``launch``'s choice between one thread and the split is kept by, for a split loop of
    ``n`` iterations: its bit length (extents within 2x share a choice: a growing sequence's kernels
    are measured once per doubling, not per step) and whether the native workers are asleep as it
    starts (spin.py ``asleep``: after the BLAS parked them, or past their polling window), where a
    split run pays for waking the other CPU. Kept as one, a BERT encoder's layer-norm program --
    twelve launches a step, half right after a BLAS product -- was split everywhere from the probes
    of the launches that found the workers polling (40 us, against 56-72 on one thread), and its
    launches after a product then ran split in 150-260 us (2-vCPU AMD EPYC, Zen 4)."""
    return n.bit_length(), spin.asleep()


class LLVMDevice(Device):
    name = "LLVM"

    def __init__(self) -> None:
        # the programs alive, by (source, nontemporal, target): a plan's run holds its own
        self.programs: weakref.WeakValueDictionary[tuple, LLVMProgram] = weakref.WeakValueDictionary()
        self._pool: ThreadPoolExecutor | None = None
        self.families = Families(LLVM_OPS)        # kernels whose sizes keep changing (sizeargs.py)
        # id of a loop kernel (or ("sized", id, slots)) -> (it, its LLVM IR), from this prepare's prefetch
        self._sources: dict[Any, tuple] = {}
        self._disk: dict[int, tuple] = {}          # id of a kernel -> (it, _from_disk's answer), per prepare
        self._structures = {}                      # id of a kernel -> (it, plan, structure), per prepare
        # id of a kernel -> (it, plan, target, _member's answer[, a rebound one's program]), per prepare
        self._members: dict[int, tuple] = {}
        # (body structure, its sizes, target) -> _rebound's (split extent, Shape, family key, program),
        # per prepare: a model's layers change alike (a 30-layer decoder step: 90 changed kernels, 3
        # distinct), and each bound its trace and looked its family up again
        self._bound: dict[tuple, tuple] = {}
        self._memo_now: tuple | None = None        # (target, _memo_key(target)) for the duration of a prepare
        self._gemms: dict[tuple, Any] = {}          # (Gemm, buffer ids, threads) -> its BLAS program
        # program -> {_band of the split loop's extent: [runs timed, fastest on one thread,
        # fastest split]}: launch's probes
        self._ran: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # what is worked out once per kernel body, for the plans that share it (a resized plan's
        # unchanged kernels, graph/resize.py): kept here by body (weakly: an entry goes with its
        # body), never on the body -- the graph floor holds nothing of the device's
        self._member_memo = NodeMemo()       # body -> (_memo_key, its program weakly, split extent)
        self.stage = CPUStage(self)          # the rewrites after extraction (cpustage.py), with their memos
        self._caps: Capabilities | None = None   # capabilities set on the device (``caps``)

    @property
    def caps(self) -> Capabilities:
        """What the lowering may do for the code this device compiles now: EQGRAD_CPU's target's
        (``target_caps``), unless capabilities were set on the device (a test, an experiment)."""
        return self._caps if self._caps is not None else target_caps(config.CPU.value)

    @caps.setter
    def caps(self, value: Capabilities) -> None:
        self._caps = None if value is target_caps(config.CPU.value) else value

    def after_fork_in_child(self) -> bool:
        # the inherited pool's threads do not exist in the child, but its idle count says they do:
        # a submitted chunk would wait forever. Compiled programs (plain memory) stay valid.
        self._pool = None
        self.families.after_fork_in_child()
        return True

    def warm(self, nodes: int = 0, waiting: Callable[[], bool] | None = None) -> None:
        try:
            c = compiler(runnable_target(config.CPU.value))
            # LLVM's first compile sets up its pass pipelines and code generator: a tiny compile
            # ahead of it moves ~3 ms off the first kernel but costs ~25 ms itself, worth it only
            # while the worker is still saturating (a one-op program's answer comes before
            # llvmlite has even loaded: the first realize's critical path)
            if waiting is None or waiting():
                c.warm()
        except Exception:          # an unusable EQGRAD_CPU: raised, with its message, by the compile
            pass
        # a program big enough to plan several kernels compiles two at a time (compilepool.py):
        # its worker starts now, not when the first kernels are ready
        if nodes >= WARM_POOL_NODES and config.THREADS.value > 1:
            compilepool.pool().prestart()

    def pool(self, threads: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool._max_workers != threads - 1:
            self._pool = ThreadPoolExecutor(max_workers=max(1, threads - 1), thread_name_prefix="eqgrad-cpu")
        return self._pool

    def program(self, src: str, lk, nontemporal: bool = False, target: Target | None = None,
                engine: CodeEngine | None = None, sized: bool = False) -> LLVMProgram:
        """The live program of this source, or a new one loaded into ``engine`` (None: its own)."""
        key = (src, nontemporal, target)
        with COMPILE_LOCK:
            prg = self.programs.get(key)
            if prg is None:
                prg = self.programs[key] = LLVMProgram(lk, src, nontemporal, target, engine, sized)
        return prg

    def build(self, k, plan: KernelPlan, upcast=None, target: Target | None = None,
              engine: CodeEngine | None = None, lk=None) -> tuple[str, LLVMProgram, int]:
        """Lower (unless ``lk``, its loop IR, is given), render and compile one kernel for ``target``
        (None: the host) into ``engine`` (None: an engine of its own); returns (source, program,
        extent of its split loop)."""
        lk = self.lowered_kernel(k, plan, upcast) if lk is None else lk
        pre = self._sources.get(id(lk))                 # rendered by this prepare's prefetch
        if pre is not None and pre[0] is lk:
            src = pre[1]
        else:
            lk, src = self.render_kernel(k, plan, render_llvm, "LLVM IR", upcast)
        # the split loop's extent is not in the source ([lo, hi) are arguments), so kernels that
        # differ only in it share a program: the extent belongs to the step, not the program
        n = _split_extent(lk)
        shape, dt = plan.buffers[k.out]
        nt = streaming_store(lk, numel(shape) * dt.itemsize)
        return src, _compiled(k, src, lambda: self.program(src, lk, nt, target, engine)), n

    def _member(self, k, plan: KernelPlan, upcast, target: Target | None) -> tuple:
        """What ``build_member`` decides for a kernel, without compiling: (loop kernel, extent of its
        split loop, it decomposed, its Shape, its family key, the live program or None, the sized
        program to compile or None). The loop kernel and its decomposition are worked out once per
        prepare (prefetch, then the build); the family is asked each time (a kernel built earlier
        in this prepare may have given it the program)."""
        hit = self._members.get(id(k)) if upcast is None else None
        if hit is not None and hit[0] is k and hit[1] is plan and hit[2] == target:
            lk, n, dk, shape, nt = hit[3]
            if lk is None:                  # rebound (below): the program it found, for this prepare
                return lk, n, dk, shape, (shape.skeleton, nt, target), hit[4], None
        elif (fast := self._rebound(k, plan, target) if upcast is None else None) is not None:
            return fast
        else:
            lk = self.lowered_kernel(k, plan, upcast)
            n = _split_extent(lk)
            dk, shape = self.families.shape_of(lk)
            shape_out, dt = plan.buffers[k.out]
            nt = streaming_store(lk, numel(shape_out) * dt.itemsize)
            if upcast is None:
                self._members[id(k)] = (k, plan, target, (lk, n, dk, shape, nt))
        key = (shape.skeleton, nt, target)
        prg = self.families.find(key, shape)
        # (a sized program does not use streaming stores: a kernel that would keeps its literal
        # reduction extents until its sizes keep changing)
        sized = self.families.plan(key, shape, speculate=not nt) if prg is None and config.SIZE_ARGS.value else None
        return lk, n, dk, shape, key, prg, sized

    def _rebound(self, k, plan: KernelPlan, target: Target | None) -> tuple | None:
        """``_member``'s answer for a kernel whose body is an instance of a trace (lower/trace.py)
        that an earlier plan's kernel has been through already, when its size family has the
        program for its sizes (a growing sequence's sized programs): the sizes are read from the
        trace's holes (``Families.rebound``), and no loop IR is made for it -- lowering,
        decomposing and splitting the sizes of a decode step's 5 changed kernels took ~0.5 ms of
        its ~1.6 ms more than a fixed-shape step's. None otherwise (an output of NT_MIN+ bytes,
        whose streaming stores the loop IR decides, too). Under EQGRAD_VERIFY the trace's
        instance is made as well, and its sizes and split extent must be the ones read."""
        if not config.SIZE_ARGS.value:
            return None
        shape_out, dt = plan.buffers[k.out]
        if numel(shape_out) * dt.itemsize >= NT_MIN:
            return None
        same = (*body_sizes(k, plan), target)       # (its answer is a function of these alone)
        hit = self._bound.get(same)
        found = None
        if hit is not None:
            n, shape, key, prg = hit
        else:
            found = trace.TRACES.bind(k, plan, self.trace_key)
            r = self.families.rebound(*found) if found is not None else None
            if r is None:
                return None
            shape, n = r
            key = (shape.skeleton, False, target)
            prg = self.families.find(key, shape)
            if prg is None:
                return None
            self._bound[same] = (n, shape, key, prg)
        if config.VERIFY.value:
            if found is None:
                found = trace.TRACES.bind(k, plan, self.trace_key)
                if found is None:
                    raise AssertionError(f"kernel {k.name}: a kernel of its structure and sizes was bound in "
                                         "this prepare, but no trace of it holds")
            # the trace's instance, made: (loop IR that this process kept at these very sizes is
            # what ``lowered_kernel`` would return instead -- where a size equals another
            # constant, the plain lowering shares the two: another family, as right)
            lk = found[0].instantiate(found[1])
            if lk is None:
                raise AssertionError(f"kernel {k.name}: bound from a trace that does not instantiate at {found[1]}")
            dk, usual = self.families.shape_of(lk)
            n_usual = _split_extent(lk)
            if (usual.skeleton is not shape.skeleton or usual.positions != shape.positions or usual.values != shape.values
                    or usual.reductions != shape.reductions or n_usual != n):
                raise AssertionError(f"kernel {k.name}: its sizes read from its trace {shape.values}, split {n} differ "
                                     f"from its instance's {usual.values}, split {n_usual}")
        # (the program kept with the answer: prefetch asks first, then the build; ``_members`` is
        # emptied at the end of each prepare)
        self._members[id(k)] = (k, plan, target, (None, n, None, shape, False), prg)
        self.families.rebinds += 1
        return None, n, None, shape, key, prg, None

    def _sized_source(self, dk, sized: dict[int, int]) -> str:
        """``render_llvm(dk, sized)``, rendered once per prepare: a model's repeated layers share
        the loop kernel, and none of them finds the family's sized program before the first is
        built (a 30-layer decoder rendered each of its sized kernels 30 times in prefetch)."""
        key = ("sized", id(dk), tuple(sorted(sized.items())))
        pre = self._sources.get(key)
        if pre is not None and pre[0] is dk:
            return pre[1]
        src = render_llvm(dk, sized)
        self._sources[key] = (dk, src)
        return src

    def _from_disk(self, k, plan: KernelPlan, target: Target | None) -> dict | None:
        """The kernel as an earlier process lowered and rendered it (kernelcache.load_lowered:
        source, split extent, streaming stores, parameters), when this process has not lowered it;
        None otherwise. Looked up once per prepare (``_disk``: the kernel, the answer, its structure
        when this process had not lowered it -- then ``_keep_lowered`` keeps it)."""
        if id(k) in self._disk:
            return self._disk[id(k)][1]
        hit = new = None
        # (a body whose sizes keep changing lowers from its trace faster than a disk lookup, and
        # a sized program's later members are not kept there: _keep_lowered; its sizes count as
        # met, so a structure whose every size vector is on disk is traced all the same)
        if config.DISK_CACHE.value and config.DEBUG.value < 4 and \
                not trace.TRACES.keeps_changing(k, plan, self.trace_key):
            structure = self.structure(k, plan)
            if not self.has_lowered(k, plan, structure=structure):
                c = compiler(target)
                new = kernelcache.lowered_key(structure, c.cpu, c.features)
                hit = kernelcache.load_lowered(new)
        self._disk[id(k)] = (k, hit, new)
        return hit

    def _keep_lowered(self, k, prg: Any, n: int) -> None:
        """Keep the source of a kernel this prepare lowered on disk for later processes
        (``_from_disk``), with its sizes when it compiled a sized program; kernels lowered before
        were kept then."""
        entry = self._disk.get(id(k))
        if entry is None or entry[2] is None:
            return
        if isinstance(prg, LLVMProgram):
            kernelcache.store_lowered(entry[2], prg.src, n, prg.nontemporal, prg.n_params)
        elif isinstance(prg, Sized) and isinstance(prg.program, LLVMProgram):
            kernelcache.store_lowered(entry[2], prg.program.src, n, False, prg.program.n_params,
                                      sizes=[int(v) for v in prg.sizes])

    def build_member(self, k, plan: KernelPlan, upcast=None, target: Target | None = None,
                     engine: CodeEngine | None = None) -> tuple[Any, int]:
        """``build`` through the kernel's size family (sizeargs.py): the live program of the same
        loop IR, or the family's sized program bound to this kernel's sizes, or a new program --
        sized when the family's sizes keep changing -- or, for a kernel an earlier process lowered,
        the program of the source it kept. Returns (program, extent of its split loop)."""
        memo = self._memo_key(target) if upcast is None else None
        if memo is not None:
            hit = self._built(k, memo)
            if hit is not None:
                return hit
            prg, n = self._build_member(k, plan, upcast, target, engine)
            self._member_memo.put(k.ast, (memo, weakref.ref(prg), n))
            return prg, n
        return self._build_member(k, plan, upcast, target, engine)

    def _memo_key(self, target: Target | None) -> tuple | None:
        """What a kernel's built program depends on besides its body, for ``build_member``'s memo
        (None: no memo, with DEBUG>=4, which prints each kernel's source as it is built).

        A kernel's program and split extent are a function of its body (its buffers' shapes and
        dtypes are its reads' and its root's) and of these, so they are kept by the body
        (``_member_memo``): a body that a resized plan shares with the plan it came from
        (graph/resize.py keeps a kernel's body where no size of it changes: 28 of a decoder
        step's 32 kernels when the KV cache grows) is not looked up again -- its loop IR, size
        family, disk entry -- in every prepare. The lowering function is part of the key, as it
        is of the loop IR's (tests patch it)."""
        now = self._memo_now
        if now is not None and now[0] == target:
            return now[1]
        if config.DEBUG.value >= 4:
            return None
        return target, config.SIZE_ARGS.value, config.THREADS.value, lowering.lower_kernel

    def _built(self, k, memo: tuple | None) -> tuple[Any, int] | None:
        """(program, split extent) of the kernel's body as built for an earlier plan, while that
        program is alive (the memo holds it weakly: a program lives as long as the plans that
        run it, not as long as a body)."""
        hit = self._member_memo.get(k.ast) if memo is not None else None
        if hit is None or hit[0] != memo:
            return None
        prg = hit[1]()
        return None if prg is None else (prg, hit[2])

    def _build_member(self, k, plan: KernelPlan, upcast, target: Target | None,
                      engine: CodeEngine | None) -> tuple[Any, int]:
        ix = self._from_disk(k, plan, target) if upcast is None else None
        if ix is not None:
            sig = _Signature("eqk", (None,) * ix["n_params"])
            sizes = ix.get("sizes")
            prg = _compiled(k, ix["src"], lambda: self.program(ix["src"], sig, ix["nontemporal"], target, engine,
                                                               sized=sizes is not None))
            return (prg if sizes is None else Sized(prg, sizes)), ix["n"]
        lk, n, dk, shape, key, prg, sized = self._member(k, plan, upcast, target)
        if prg is not None:
            if config.DEBUG.value >= 4:
                self.render_kernel(k, plan, render_llvm, "LLVM IR", upcast)     # prints it
            if upcast is None and not isinstance(prg, Sized):
                # (a sized program's later members are not kept: a growing sequence would write
                # the same source again at every length; a later process lowers them, and finds
                # the object code on disk by its source)
                self._keep_lowered(k, prg, n)
            return prg, n
        if sized is None:
            _, prg, n = self.build(k, plan, upcast, target, engine, lk)
            self.families.add(key, shape, prg)
            if upcast is None:
                self._keep_lowered(k, prg, n)
            return prg, n
        src = self._sized_source(dk, sized)
        if config.DEBUG.value >= 4:
            print(f"--- LLVM IR {k.name} (sized: {len(sized)} sizes are arguments)\n{src}")
        prg = _compiled(k, src, lambda: self.program(src, dk, False, target, engine, sized=True), " as a sized program")
        bound = self.families.add_sized(key, shape, sized, prg)
        if upcast is None:
            self._keep_lowered(k, bound, n)
        return bound, n

    def prefetch(self, plan: KernelPlan, target: Target | None) -> list[str]:
        """Compile the object code of the plan's new kernels two at a time, here and in the
        compile worker (compilepool.py), before ``prepare`` builds them one by one -- which then
        load it as they load disk-cache hits (``llvm.PREFETCHED``). Kernels alive in another plan
        or on disk are not compiled. Returns the keys it added (``prepare`` drops what is left)."""
        c = compiler(target)
        # the worker compiles while this thread lowers and renders the next kernels
        def local(job: compilepool.Job) -> compilepool.Result | None:
            try:
                return c.object_code(*job)
            except Exception:           # the kernel's build compiles it again and raises, with its source
                return None
        batch = compilepool.pool().batch((c.cpu, c.features), local, worker=len(plan.kernels) >= 2)
        job_keys, keys = [], []
        try:
            memo = self._memo_key(target)
            for k in plan.kernels:
                if self._built(k, memo) is not None or self.gemm_of(k, plan) is not None:
                    continue                        # built for an earlier plan, or the BLAS's: nothing to compile
                ix = self._from_disk(k, plan, target)
                if ix is not None:
                    src, nt = ix["src"], ix["nontemporal"]
                else:
                    lk, _, dk, _, _, prg, sized = self._member(k, plan, None, target)
                    if prg is not None:
                        continue
                    if sized is None:
                        shape_out, dt = plan.buffers[k.out]
                        pre = self._sources.get(id(lk))
                        # rendered once per loop kernel (a plan's repeated kernels share theirs),
                        # from its decomposition (render_llvm would decompose it again)
                        src = pre[1] if pre is not None and pre[0] is lk else render_llvm(dk)
                        nt = streaming_store(lk, numel(shape_out) * dt.itemsize)
                        self._sources[id(lk)] = (lk, src)
                    else:
                        src, nt = self._sized_source(dk, sized), False
                if (src, nt, target) in self.programs:
                    continue
                key = kernelcache.kernel_key(src, c.cpu, c.features, nt)
                if key in keys or key in job_keys or key in PREFETCHED:
                    continue
                hit = kernelcache.load(key)
                if hit is not None:
                    PREFETCHED[key] = hit
                    keys.append(key)
                    continue
                batch.add((src, "eqk", f"eqk_{key[:32]}", nt))      # every kernel's function is eqk
                job_keys.append(key)
        except BaseException:
            batch.cancel()
            raise
        done = batch.finish()
        for key, result in zip(job_keys, done):
            if result is None:
                continue
            kernelcache.store(key, *result)
            PREFETCHED[key] = result
        keys += job_keys
        return keys

    def launch(self, k, prg: LLVMProgram, ptrs: list[int], n: int, threads: int) -> None:
        """Run the split loop [0, n) on one thread or cut into up to CHUNKS_PER_THREAD chunks per
        thread that the threads share (``_split_run``: interleaved, each thread's own first), whichever
        this kernel's first SPLIT_PROBES runs measured faster (module docstring). Two contiguous
        halves were measured pathological for a row-fused layernorm (4096 rows: 2.1 ms against 1.6
        ms on one thread; two streams exactly 8 MB apart), chunks taken in turn 0.84-0.94 ms; they
        also let a core slowed by other work take fewer chunks."""
        if threads < 2 or n < threads or k.predicted <= (SPLIT_FLOOR if PARALLEL_MIN is None else PARALLEL_MIN):
            prg(*ptrs, lo=0, hi=n)
            return
        if PARALLEL_MIN is not None or k.predicted > SPLIT_SURE:
            self._split_run(prg, ptrs, n, threads)
            return
        ran = self._ran.get(prg)
        if ran is None:
            ran = self._ran[prg] = {}
        band = _band(n)
        seen = ran.get(band)
        if seen is None:
            seen = ran[band] = [0, math.inf, math.inf]
        runs = seen[0]
        if runs == 0:
            self.start_threads(threads)
        if runs >= SPLIT_PROBES:
            split = seen[2] < seen[1]
            seen[0] = runs + 1
            if runs >= SPLIT_RECHECK and runs & (runs - 1) == 0 and runs.bit_length() % 2:
                # runs 16, 64, 256, ...: the other way timed again, twice (its first run after the
                # chosen one's pays for the caches that one left), and the faster kept from then on
                for _ in range(2):
                    self._timed(prg, ptrs, n, threads, not split, seen)
                return
            self._timed(prg, ptrs, n, threads, split, seen)
            return
        # in two blocks, one thread first: alternating, each one-thread probe ran just after a split
        # one had left half the output in the other core's cache, and came out 6x slower than in
        # steady state (a 256K-element multiply: ~235 against 38 us), so the split was kept
        seen[0] = runs + 1
        self._timed(prg, ptrs, n, threads, runs >= SPLIT_PROBES // 2, seen)

    def _timed(self, prg: LLVMProgram, ptrs: list[int], n: int, threads: int, split: bool, seen: list) -> None:
        """One run of [0, n), split or on one thread, its time kept in ``seen`` (``launch``'s [runs,
        fastest on one thread, fastest split]) where it is that way's fastest."""
        t0 = time.perf_counter()
        if split:
            self._split_run(prg, ptrs, n, threads)
        else:
            prg(*ptrs, lo=0, hi=n)
        t = time.perf_counter() - t0
        i = 2 if split else 1
        if t < seen[i]:
            seen[i] = t

    def start_threads(self, threads: int) -> None:
        """Make the threads a split run uses (the native workers, or the Python pool where the
        platform has none) before a kernel's probes are timed, not inside its first split probe:
        a process's first split run also compiled the workers' loop and started their threads.
        Measured (2-vCPU AMD EPYC, Zen 4): attention as one kernel (b1 h4 s1024 d64), one thread
        18.8 ms, split 12.5 ms steadily; its first split probe 42.7 ms, the second 19.2, so one
        thread was kept for good (18.8 ms a run); with the threads made first, 12.4-12.6 ms and split."""
        if threads < 2:
            return
        if spin.available() and spin.workers(threads) is not None:
            return
        pool = self.pool(threads)
        for f in [pool.submit(int) for _ in range(1, threads)]:     # (a pool starts a thread a task)
            f.result()

    def settle(self, k, prg: Any, ptrs: list[int], n: int, threads: int) -> None:
        """Run kernel ``k`` until ``launch`` has chosen between one thread and the split for it (its
        probes; at once where it does not probe), so that runs timed next run as a plan's later
        runs do. The stage's BLAS-or-generated timing (cpustage.py) took the median of a kernel's
        first runs, one thread and split probes mixed: on a VM where waking a thread costs 100-300
        us, a 64x128x64 product timed 177 us generated against 61 us by the BLAS, and runs in 28 us
        generated on one thread."""
        for _ in range(SPLIT_PROBES):
            band = _band(n)
            self.launch(k, prg, ptrs, n, threads)
            ran = self._ran.get(prg)
            seen = ran.get(band) if ran is not None else None
            if seen is None or seen[0] >= SPLIT_PROBES:
                return

    def _split_run(self, prg: LLVMProgram, ptrs: list[int], n: int, threads: int) -> None:
        """``prg`` over [0, n) in chunks that ``threads`` threads, this one included, share: on the
        native workers that poll for work (spin.py; chunk c is thread c % threads's first), else on
        the Python pool from a shared counter."""
        grain = 16 if prg.nontemporal else 1          # streaming stores start 64-byte aligned
        m = max(threads, min(threads * CHUNKS_PER_THREAD, n // (grain * CHUNK_MIN)))
        # a multiple of the threads: 12 iterations of a column sum's 128-lane blocks made 3 pieces
        # for 2 threads, one thread running two of them while the other ran one (164 against 99 us
        # on one thread); as 2 pieces, 81 us
        m -= m % threads
        cuts = [n * c // m // grain * grain for c in range(m)] + [n]
        # on native workers that poll for work (spin.py), the same chunks on the same threads from
        # run to run; the BLAS's programs, and where those are not to be had, on the Python pool
        native = getattr(prg, "native", None)           # (compiled kernels: plain and sized)
        if native is not None:
            fn, args = native(ptrs)
            w = spin.workers(threads) if len(args) <= spin.MAX_ARGS else None
            if w is not None and w.try_run(fn, args, cuts):
                return
        nxt = itertools.count()                         # next() on a count is atomic under the GIL

        def work() -> None:
            while (c := next(nxt)) < m:
                prg(*ptrs, lo=cuts[c], hi=cuts[c + 1])
        futs = [self.pool(threads).submit(work) for _ in range(1, threads)]
        work()
        for f in futs:
            f.result()

    def rewrite(self, plan: KernelPlan) -> DevicePlan:
        """The device's stage after extraction (``Device.rewrite``; devices/cpustage.py) at the
        configured threads: a full reduction is cut into parallel partials above SPLIT_FLOOR
        (whether the partials' kernel then runs split is launch's measurement)."""
        threads = max(1, config.THREADS.value)
        options = LowerOptions.for_caps(self.caps, threads=threads,
                                        parallel_min=SPLIT_FLOOR if PARALLEL_MIN is None else PARALLEL_MIN)
        return self.stage.rewrite(plan, options)

    def target(self) -> Target | None:
        """What this device compiles for (``EQGRAD_CPU``; None: the host)."""
        return runnable_target(config.CPU.value)

    def gemm_program(self, k, g, threads: int) -> blas.GemmProgram:
        """The BLAS program of kernel ``k`` (its Gemm ``g``), kept by what it depends on: a
        resized plan's unchanged contractions are not set up again in every prepare."""
        key = (g, (k.out, *k.inputs), threads)
        prg = self._gemms.get(key)
        if prg is None:
            if len(self._gemms) >= 1024:
                self._gemms.clear()
            prg = self._gemms[key] = blas.GemmProgram(k.name, g, (k.out, *k.inputs), self.blas(), threads)
        return prg

    def library_speed(self) -> tuple[float, float, int] | None:
        """The BLAS's (seconds a call costs, FLOP/s of one thread on a SPEED_N-cubed product,
        SPEED_N), measured once per process and kept at the machine's best (``blas.speeds``), for the cost model (graph/caps.py
        ``library_for``); None when contractions do not use it."""
        if self.blas() is None:
            return None
        call, rate = blas.speeds()
        return call, rate, blas.SPEED_N

    def blas(self) -> blas.Blas | None:
        """The BLAS when contractions use it (``EQGRAD_BLAS``, and SciPy's loads), else None.
        SciPy's is loaded at the first contraction, not by a program without one."""
        return blas.blas() if config.BLAS.value else None

    def gemm_of(self, k, plan: KernelPlan) -> Any:
        """The Gemm the BLAS runs as kernel ``k`` (the stage's answer), or None."""
        return self.stage.gemm_of(k, plan)

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        threads = max(1, config.THREADS.value)
        beam = config.BEAM.value
        target = runnable_target(config.CPU.value)
        rewritten = self.rewrite(plan)
        if config.DEBUG.value >= 3:
            print(rewritten.describe(self.name))
        given, (plan, scratch) = plan, (rewritten.plan, rewritten.scratch)
        engine = CodeEngine(compiler(target))     # this plan's new programs (its MCJIT engine made on the first)
        self._memo_now = (target, self._memo_key(target))
        try:
            steps = self._build_all(plan, target, engine, beam, threads)
        finally:
            self._memo_now = None
            self._sources.clear()
            self._disk.clear()
            self._structures.clear()
            self._members.clear()
            self._bound.clear()
        # (the pieces are named after the plan kernels they run: the given plan prices them in context)
        return self._runner(steps, scratch, threads, given.in_context([s[0] for s in steps]))

    def _build_all(self, plan: KernelPlan, target: Target | None, engine: CodeEngine, beam: int,
                   threads: int) -> list[tuple]:
        """Every kernel's (kernel, program, buffer ids, split extent), in plan order."""
        fetched = self.prefetch(plan, target) if beam == 0 and threads > 1 and config.DEBUG.value < 4 else []
        try:
            return self._build_each(plan, target, engine, beam, threads)
        finally:
            for key in fetched:                   # object code no build took (a kernel that failed)
                PREFETCHED.pop(key, None)

    def _build_each(self, plan: KernelPlan, target: Target | None, engine: CodeEngine, beam: int,
                    threads: int) -> list[tuple]:
        steps = []
        for i, k in enumerate(plan.kernels):
            progress.update(done=i)
            g = self.gemm_of(k, plan)
            if g is not None:
                prg = self.gemm_program(k, g, threads)
                steps.append((k, prg, (k.out, *k.inputs), prg.units))
                continue
            upcast = None
            if beam > 0:
                candidates: list[LLVMProgram] = []     # alive until the pick is built below

                def build(up, k=k, candidates=candidates):
                    # each candidate in an engine of its own: the losers' code is freed after the search
                    src, prg, n = self.build(k, plan, up, target)
                    candidates.append(prg)
                    return src, lambda bufs: self.launch(k, prg, [bufs[i].ptr for i in k.params], n, threads)
                upcast, tried = search_upcast(k, plan, beam, config.BEAM_TIME.value, build,
                                              covering=self.lowered_kernel(k, plan).vector_lanes)
                if config.DEBUG.value >= 2:
                    print(f"  search {k.name}: picked {upcast or 'heuristic'} from {tried}")
            prg, n = self.build_member(k, plan, upcast, target, engine)
            steps.append((k, prg, k.params, n))
        return steps

    def _runner(self, steps: list[tuple], scratch: list, threads: int, predicted: list[float]
                ) -> Callable[[list[Buffer]], None]:
        def run(bufs: list[Buffer]) -> None:
            dbg = config.DEBUG.value
            timed = timing_kernels(dbg)
            if scratch:
                bufs = list(bufs) + [Buffer.empty(s, d, self.name) for s, d in scratch]
            # every buffer's address first, in one warm loop: asked for just before its kernel, after
            # a kernel that streamed megabytes through the caches, a new buffer's address (NumPy's
            # ``ctypes``) cost 15-18 us against ~1 us here (an FFN step's one-element kernels measured
            # 22 us, 5 of them the kernel's)
            addr = [b.ptr for b in bufs]
            for j, (k, prg, ids, n) in enumerate(steps):
                t0 = time.perf_counter() if timed else 0.0
                self.launch(k, prg, [addr[i] for i in ids], n, threads)
                GlobalCounters.kernel_count += 1
                if timed:
                    log_kernel(k, time.perf_counter() - t0, dbg, predicted[j])
        run.launches = len(steps)          # (the stage's pieces and merges: not the plan's kernel count)
        # what each launch reads and writes, in the order they run: the engine shares the memory of
        # intermediates whose lifetimes do not overlap (graph/plan.py ``shared_memory``)
        run.buffer_io = [(tuple(k.inputs), tuple(k.outs)) for k, *_ in steps]
        return run
