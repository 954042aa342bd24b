"""A Session owns the engine's state: the plan cache, the rule and extraction configuration, the
saturator it uses, the random generator of ``Tensor.rand``/``randn``, and per thread the last plan
and the JIT's capture hooks. The module functions (``eqgrad.engine.realize``, ``plan_for``,
``clear_cache``, ``last_plan``, ``_plan_cache``, ``capture_hooks``) act on the *current* session:
the one a ``with session:`` block made current in this thread, else ``default_session()``, whose
rules and extraction settings are the ones ``eqgrad.rules.use`` and ``eqgrad.extract.using``
change. docs/engine.md has the rules for threads.

    >>> import numpy as np, eqgrad
    >>> from eqgrad import Tensor
    >>> from eqgrad.engine import Session
    >>> s = Session(extractor="improve")
    >>> with s:                                   # realizes in this block plan with ``s``
    ...     y = (Tensor(np.ones(4, np.float32)) * 3).realize()
    >>> y.tolist(), len(s.plan_cache)
    ([3.0, 3.0, 3.0, 3.0], 1)
"""
from __future__ import annotations

import contextvars
import os
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from eqgrad import config
from eqgrad.counters import GlobalCounters
from eqgrad.devices import Buffer, Device, get_device
from eqgrad.engine import core, regions
from eqgrad.engine.core import CompiledPlan, PlanCache, compile_plan
from eqgrad.engine.validate import validate
from eqgrad import extract
from eqgrad.extract import DEFAULT as DEFAULT_EXTRACTION, DeviceParams, ExtractSettings, cost_model, settings_key
from eqgrad.extract.cost import CALIBRATIONS, CostFn, in_order, rescaled
from eqgrad.graph.plan import KernelPlan, shared_memory
from eqgrad.graph import lazy
from eqgrad.graph.lazy import LazyBuffer
from eqgrad.graph.program import Program, linearize, structure
from eqgrad.graph.resize import resize
from eqgrad.graph.sizes import ProgramSizes, program_sizes, structure_sizes
from eqgrad.rules import rulebook
from eqgrad.rules.rulebook import DEFAULT_PHASE, RuleConfig, RuleState
from eqgrad.rules.provenance import instrument
from eqgrad.rules.saturate import Saturator, default_saturator

# called after each plan runs with (plan, input LazyBuffers, targets, buffers), before the targets
# turn into buffers (the JIT's recorder, frontend/jit.py)
CaptureHook = Callable[[CompiledPlan, list[LazyBuffer], list[LazyBuffer], list[Buffer]], None]

# Linearizing a graph and turning its targets into buffers exclude each other, in every session:
# two threads may realize graphs that share a pending node, and one must not walk the node's
# sources while the other clears them (the walk then met an op without sources). Both are short
# walks over Python objects; compiling and running the plan happen outside.
GRAPH_LOCK = lazy.GRAPH_LOCK            # the graph floor owns it: one_value takes it too

_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()

# What ``Session._context`` is memoized on besides the session's own state: the flags
# ``settings_key`` reads (its ``_KEY_FLAGS``), the rules' environment (``RuleState.config``) and the
# calibration's stamp; and DEBUG and EQGRAD_VALIDATE, which every realize reads. The plan cache is keyed by a small int per distinct (rules.key,
# settings_key) pair, so a lookup hashes the program's structure and an int, not the device
# parameters (a dataclass: a Python-level hash).
_CONTEXT_FLAGS = extract._KEY_FLAGS + (config.EGRAPH_NODES, config.CACHE_DIR, config.DEBUG, config.VALIDATE)
_rules_env = config.raw_env_reader("EQGRAD_RULEBOOKS", "EQGRAD_SCHEDULE")
_CONTEXT_IDS: dict[tuple, int] = {}
_CONTEXT_LOCK = threading.Lock()


def _resizing() -> bool:
    """May a missing plan be resized from a cached one of other sizes (EQGRAD_RESIZE)? Not under
    EQGRAD_PEAK_MEMORY: a plan is then extracted for its own sizes (a resized one's buffers grow)."""
    return bool(config.RESIZE.value) and not config.PEAK_MEMORY.value


class ResizablePlans:
    """The compiled plans that a plan of another size can be resized from, by size-free key (rules,
    extraction settings, ``graph.sizes.size_free_key``): the newest ``PER_KEY`` of each key
    (which neighbour resolves an ambiguous size depends on the direction: from length 7 to 8 may
    resolve where 5 to 8 does not), least recently used keys dropped past EQGRAD_PLAN_CACHE. Holds
    ``ProgramSizes``, never a Program (whose inputs would stay alive)."""
    PER_KEY = 4

    def __init__(self) -> None:
        self._by_key: OrderedDict[tuple, list[tuple[ProgramSizes, CompiledPlan]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, skey: tuple, ps: ProgramSizes, cp: CompiledPlan) -> None:
        if ps.unknown:
            return
        with self._lock:
            entries = self._by_key.setdefault(skey, [])
            entries.append((ps, cp))
            del entries[:-self.PER_KEY]
            self._by_key.move_to_end(skey)
            while len(self._by_key) > max(1, config.PLAN_CACHE.value):
                self._by_key.popitem(last=False)

    def candidates(self, skey: tuple) -> list[tuple[ProgramSizes, CompiledPlan]]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._by_key.get(skey, [])))

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


_RNG_LOCK = threading.Lock()       # a session's generator is made once (Session.rng)


def _intermediates(cp: CompiledPlan, device: str) -> list[Buffer]:
    """Buffers for a run of ``cp``'s intermediates and outputs. Where the device says what each
    launch reads and writes (``run.buffer_io``, on host memory), intermediates whose lifetimes do
    not overlap share memory (graph/plan.py ``shared_memory``): a kernel then writes memory that a
    kernel a few launches before it used, still in cache, instead of memory last touched a whole
    run ago (every intermediate of a plan had its own buffer), and a plan holds less. The sharing
    is worked out once per compiled plan, at its second run: a plan run once (a growing sequence's
    step, resized at every length) does not pay for it (bench_compile's growing_seq x1.41-1.43 ->
    x1.48-1.50 of the fixed-shape step when every plan worked it out)."""
    plan, n_in, run = cp.plan, cp.plan.n_inputs, cp.run
    owner = getattr(run, "shared", None)
    if owner is None:
        io = getattr(run, "buffer_io", None)
        if io is not None and getattr(run, "ran", False):
            owner = run.shared = shared_memory(plan.buffers, n_in, plan.outputs, io)
        elif io is not None:
            run.ran = True
    # (an owner holds its own memory: shared_memory hands out only memory's first holders)
    out: list = [None if owner and b in owner else Buffer.empty(shape, dt, device)
                 for b, (shape, dt) in enumerate(plan.buffers[n_in:], n_in)]
    for b, root in (owner or {}).items():
        shape, dt = plan.buffers[b]
        out[b - n_in] = Buffer(device, shape, dt, out[root - n_in].raw.reshape(-1).view(dt.np).reshape(shape))
    return out


class Session:
    """The engine's state; ``with session:`` makes it current for a block in this thread.

    ``rules``: a RuleState (default: a new one, the built-in rulebooks plus ``EQGRAD_RULEBOOKS``),
    with ``rulebooks`` (paths, or ``(path, phase)`` pairs) activated on it and ``schedule`` as its
    schedule file. ``extraction``: an ExtractSettings (default: a new one of ``extractor``,
    ``cost_fn`` and ``params``). ``saturator``: the Saturator it saturates with (default: the
    process's shared worker, ``default_saturator()``). ``seed``: its random generator's seed.

    Threads may share a session: its plan cache and rule state are locked, the last plan and the
    capture hooks are per thread. Devices are the process's (``device()``): a device is hardware
    and its compiled kernels are keyed by their source, so sessions share them safely."""

    def __init__(self, *, rulebooks: Sequence[str | Path | tuple[str | Path, str]] = (),
                 schedule: str | Path | None = None, extractor: str | None = None, cost_fn: CostFn | None = None,
                 params: dict[str, DeviceParams] | DeviceParams | None = None, saturator: Saturator | None = None,
                 seed: int = 0, rules: RuleState | None = None, extraction: ExtractSettings | None = None) -> None:
        if extraction is not None and (extractor is not None or cost_fn is not None or params is not None):
            raise ValueError("Session: give either extraction=ExtractSettings(...) or extractor/cost_fn/params, "
                             "not both")
        self.rules = rules if rules is not None else RuleState()
        if schedule is not None:
            self.rules.use_schedule(schedule)
        for rb in rulebooks:
            path, phase = rb if isinstance(rb, tuple) else (rb, DEFAULT_PHASE)
            self.rules.use(path, phase)
        self.extraction = extraction if extraction is not None else ExtractSettings(extractor, cost_fn, params or {})
        self._saturator = saturator
        self.plan_cache = PlanCache()
        self._resizable = ResizablePlans()
        # the generator is made on first use (``rng``): importing numpy.random is ~14 ms of a fresh
        # process's first realize
        self._seed, self._rng = seed, None
        self._local = threading.local()      # per thread: last_plan, capture_hooks
        self._contexts: dict[str, tuple] = {}     # device -> (state, RuleConfig, context id): _context
        _sessions.add(self)

    def __repr__(self) -> str:
        return (f"<Session rules={self.rules.config().key} extractor={self.extraction.extractor or 'EQGRAD_EXTRACTOR'} "
                f"{len(self.plan_cache)} plans>")

    # ------------------------------------------------------------------ state
    @property
    def saturator(self) -> Saturator:
        return self._saturator if self._saturator is not None else default_saturator()

    def warm(self) -> None:
        """Start what a first compile would wait for -- the saturation worker -- in the background
        (called at the first Tensor made from data; nothing with EQGRAD_OPT=0)."""
        if config.OPT.value:
            self.saturator.warm()

    @property
    def last_plan(self) -> CompiledPlan | None:
        """The plan of this thread's most recent realize with this session (for tools and tests)."""
        return getattr(self._local, "last_plan", None)

    @property
    def capture_hooks(self) -> list[CaptureHook]:
        """This thread's capture hooks: a JIT capture sees only the plans its own thread runs."""
        hooks = getattr(self._local, "capture_hooks", None)
        if hooks is None:
            hooks = self._local.capture_hooks = []
        return hooks

    def device(self, name: str) -> Device:
        return get_device(name)

    @property
    def rng(self) -> np.random.Generator:
        """This session's generator (``Tensor.rand``/``randn`` without a ``seed``)."""
        if self._rng is None:
            with _RNG_LOCK:                      # two threads' first draws share one generator
                if self._rng is None:
                    self._rng = np.random.default_rng(self._seed)
        return self._rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    def manual_seed(self, seed: int) -> None:
        """Seed this session's generator (``Tensor.rand``/``randn`` without a ``seed``)."""
        self._seed, self._rng = seed, None

    def clear_cache(self) -> None:
        self.plan_cache.clear()
        self._resizable.clear()

    # ------------------------------------------------------------------ current session
    def __enter__(self) -> "Session":
        _current.set(_current.get() + (self,))
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _current.get()
        if not stack or stack[-1] is not self:
            raise RuntimeError("Session: blocks must exit in the order they were entered")
        _current.set(stack[:-1])

    # ------------------------------------------------------------------ realize
    def realize(self, *xs: Any) -> None:
        """Realize tensors (or LazyBuffers, or one list of them) with this session, in one program.
        Tensors go through ``Tensor.realize`` inside ``with self:``, so pending assigns commit."""
        if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
            xs = tuple(xs[0])
        lbs = [x for x in xs if isinstance(x, LazyBuffer)]
        tensors = [x for x in xs if not isinstance(x, LazyBuffer)]
        with self:
            if tensors:
                tensors[0].realize(*tensors[1:])    # the frontend calls back into realize_lazy
            if lbs:
                self.realize_lazy(lbs)

    def realize_lazy(self, lbs: Iterable[LazyBuffer]) -> None:
        """Compute the pending LazyBuffers ``lbs`` (one program per device) and turn them into buffers."""
        if lbs.__class__ is not list:
            lbs = list(lbs)
        if len(lbs) == 1:                       # the common case: one tensor
            if lbs[0].op != "BUF":
                self._realize_on(lbs[0].device, lbs)
            return
        targets = list({id(lb): lb for lb in lbs if not lb.realized}.values())
        if not targets:
            return
        by_device: dict[str, list[LazyBuffer]] = {}
        for t in targets:
            by_device.setdefault(t.device, []).append(t)
        for device, ts in by_device.items():
            self._realize_on(device, ts)

    def plan_for(self, lbs: list[LazyBuffer], provenance: bool = False,
                 whole: bool = True) -> tuple[CompiledPlan, str]:
        """The compiled plan that realize() would run for these lazy buffers (compiled and cached if
        needed, not run). For explain() and tools. ``provenance``: planned afresh under the active
        rules instrumented to record which rule introduced each e-node (rules/provenance.py; the
        e-graph's ``provenance``), neither read from nor stored in a cache. ``whole``: a plan with an
        e-graph of the whole program (the tools read its alternatives and the cost of each kernel):
        where realize's plan was stitched from repeated regions (engine/regions.py), or resized, the
        program is planned whole, and that plan is cached in its place; ``whole=False`` gives a
        stitched plan as it is (no e-graph, no extractor result): explain()'s default, which then
        shows the plan realize runs, planned in its time (a 30-layer decoder step: ~1 s, against
        ~9 s planned whole)."""
        targets = list({id(lb): lb for lb in lbs if not lb.realized}.values())
        if not targets:
            raise ValueError("explain: the tensors are already realized; there is no plan left to explain")
        devices = {t.device for t in targets}
        if len(devices) != 1:
            raise ValueError(f"explain: tensors on several devices {sorted(devices)}; explain one device at a time")
        device = devices.pop()
        rules, ctx, _, _ = self._context(device)
        with GRAPH_LOCK:
            prog = linearize(targets, device=device, inspected=rules.inspected_constants)
        if provenance:
            with core.COMPILE_LOCK:
                return compile_plan(prog, instrument(rules), self.extraction, self._saturator, disk=False), device
        cp = self._cached_plan(prog, rules, ctx, resize=False)
        if cp.egraph is None and (whole or not regions.stitched(cp.plan)):
            # a resized plan (or one read from the disk cache) has no e-graph of its own sizes:
            # explain() and the tools need it (alternatives, the cost of each kernel), so compile
            with core.COMPILE_LOCK:
                cp = compile_plan(prog, rules, self.extraction, self._saturator, disk=False)
                self.plan_cache[(ctx, prog.key)] = cp
        return cp, device

    def _context(self, device: str) -> tuple[RuleConfig, int, int, bool]:
        """The active rules, the id of ``(rules.key, settings_key(device, self.extraction))`` (what
        the plan cache is keyed by next to the program's structure), DEBUG and EQGRAD_VALIDATE's
        values. One memo check on every
        realize: its state is everything those two read (this session's rules and extraction
        settings as they are now, the thread's ``using`` and ``Context`` overrides, the
        environment, the calibration's recent stamp), so any change is seen at the next realize."""
        rs, s = self.rules, self.extraction
        state = (config.raw_state(_CONTEXT_FLAGS), _rules_env(), extract._using.get(), rs, tuple(rs.user), rs.schedule,
                 s, s.extractor, s.cost_fn, tuple(s.params.items()), CALIBRATIONS.recent_stamp())
        m = self._contexts.get(device)
        if m is not None and m[0] == state:
            return m[1]
        rules = rs.config()
        pair = (rules.key, settings_key(device, s))
        with _CONTEXT_LOCK:
            ctx = _CONTEXT_IDS.setdefault(pair, len(_CONTEXT_IDS))
        answer = (rules, ctx, config.DEBUG.value, bool(config.VALIDATE.value))
        self._contexts[device] = (state, answer)
        return answer

    def _cached_plan(self, prog: Program, rules: RuleConfig, ctx: int, resize: bool = True) -> CompiledPlan:
        """The compiled plan of ``prog`` under ``rules`` (``ctx``: their ``_context`` id): cached,
        else resized from a cached plan of the same program at other sizes (``resize``,
        EQGRAD_RESIZE), else compiled."""
        key = (ctx, prog.key)
        cp = self.plan_cache.get(key)
        if cp is None:
            cp = self._missed(key, program_sizes(prog), lambda: prog, rules, prog.device, resize)
        return cp

    def _missed(self, key: tuple, ps: ProgramSizes, program: Callable[[], Program | None], rules: RuleConfig,
                device: str, resize: bool = True) -> CompiledPlan | None:
        """The plan of a program missing from the plan cache (``key``, its sizes ``ps``): resized
        from a cached plan of the same program at other sizes (``resize``, EQGRAD_RESIZE), else
        compiled from ``program()`` (None: the program changed meanwhile; so does the answer)."""
        with core.COMPILE_LOCK:
            cp = self.plan_cache.get(key)           # compiled by another thread while this one waited
            if cp is not None:
                return cp
            skey = (key[0], ps.key)
            if resize and _resizing():
                cp = self._resized(ps, skey, device, rules)
            if cp is None:
                prog = program()
                if prog is None:
                    return None
                cp = compile_plan(prog, rules, self.extraction, self._saturator)
            self.plan_cache[key] = cp
            self._resizable.add(skey, ps, cp)
        return cp

    def _resized(self, ps: ProgramSizes, skey: tuple, device: str, rules: RuleConfig) -> CompiledPlan | None:
        """A cached plan of the same program at other sizes, rewritten for ``ps``'s (graph/resize.py):
        no saturation, no extraction; the device lowers and compiles the resized kernels. None when
        no candidate resizes safely."""
        for old_ps, old in self._resizable.candidates(skey):
            t0 = time.perf_counter()
            r = resize(old_ps, old.plan, ps, rule_writers=rules.constant_writers, trail=old.trail)
            if config.DEBUG.value >= 2:
                print(f"plan cache miss: {r.describe()}")
            if r.plan is None:
                continue
            self._repredict(old.plan, r.plan, device)
            run = get_device(device).prepare(r.plan)
            GlobalCounters.plans_resized += 1
            # the e-graph and the extractor's result describe the old sizes: a resized plan has none
            # (explain() compiles its program fully, Session.plan_for)
            return CompiledPlan(r.plan, run, old.report, None,
                                dict(saturate=0.0, extract=0.0, compile=time.perf_counter() - t0), trail=r.trail)
        return None

    def _repredict(self, old: KernelPlan, new: KernelPlan, device: str) -> None:
        """The predicted seconds of a resized plan's kernels at their new sizes (``cost.rescaled``,
        with this session's cost parameters): resize rescales bytes and flops only. A contraction
        keeps the rate share of its register block at the old sizes (cost.py ``fill``): working
        it out again per resize (the lanes pass's decision) made a growing KV cache's decode step
        1.7x a fixed-shape one's."""
        model = cost_model(device, self.extraction)     # (once: it stats the calibration file)
        p = model.params
        for ko, kn in zip(old.kernels, new.kernels):
            passes = (ko.stats.passes, kn.stats.passes) if ko.stats is not None and kn.stats is not None else (0.0, 0.0)
            if (kn.nbytes, kn.flops, passes[1]) != (ko.nbytes, ko.flops, passes[0]):
                kn.predicted = rescaled(p, ko.predicted, ko.nbytes, ko.flops, kn.nbytes, kn.flops, *passes)
        new.predicted = sum(k.predicted for k in new.kernels)
        in_order(new, model)           # its reads from cache at the new sizes

    def _realize_on(self, device: str, targets: list[LazyBuffer]) -> None:
        t0 = time.perf_counter()
        rules, ctx, dbg, validating = self._context(device)
        with GRAPH_LOCK:
            targets = [t for t in targets if not t.realized]     # another thread may have realized some
            if not targets:
                return
            # the structure key in one walk; the Program itself only when the plan is not cached
            skey, in_lbs, pvals, order = structure(targets, device=device, inspected=rules.inspected_constants)
            key = (ctx, skey)
            cp = self.plan_cache.get(key)
            prog = ps = None
            if cp is None:
                # a miss: its sizes from the structure; the Program only when no cached plan of
                # other sizes may be resized (a growing KV cache's step never builds one)
                ps = structure_sizes(skey, [(lb.shape, lb.dtype) for lb in in_lbs] + [((), dt) for _, dt in pvals],
                                     len(in_lbs))
                if not (_resizing() and self._resizable.candidates((ctx, ps.key))):
                    prog = linearize(targets, order, device=device, inspected=rules.inspected_constants)
                    prog.__dict__["key"] = skey        # the same tuple (Program.key is computed_once)
            # host buffers come from the pool (devices/__init__.py); the intermediates go back to it as
            # soon as ``bufs`` is dropped at the end of this call, the outputs when no tensor holds them
            bufs: list[Buffer] = [lb.buffer for lb in in_lbs]
            if validating and prog is None:
                prog = linearize(targets, order, device=device, inspected=rules.inspected_constants)
        # the parameters' values, one element each, after the realized inputs (Program.input_specs)
        if pvals:
            bufs += [Buffer.scalar(v, dt, device) for v, dt in pvals]
        n_in = len(bufs)
        if cp is None:
            def program() -> Program | None:
                if prog is not None:
                    return prog
                with GRAPH_LOCK:                       # the resize was refused: build it now
                    p = linearize(targets, device=device, inspected=rules.inspected_constants)
                return p if p.key == skey else None    # another thread realized part of it meanwhile
            cp = self._missed(key, ps, program, rules, device)
            if cp is None:
                return self._realize_on(device, targets)
        local = self._local
        local.last_plan = cp
        plan = cp.plan
        bufs += _intermediates(cp, device)
        t1 = time.perf_counter()
        cp.run(bufs)
        t2 = time.perf_counter()
        GlobalCounters.realize_count += 1
        if validating:
            validate(targets, prog, [bufs[o] for o in plan.outputs], plan, cp.report, rules)
        hooks = getattr(local, "capture_hooks", None)
        if hooks:
            # they see the parameters as realized inputs that hold constants
            inputs = in_lbs + [LazyBuffer.from_buffer(b) for b in bufs[len(in_lbs):n_in]]
            for hook in list(hooks):
                hook(cp, inputs, targets, bufs)
        with GRAPH_LOCK:
            for t, o in zip(targets, plan.outputs):
                # the buffer first: a thread that reads ``realized`` without the lock (the frontend
                # freezing a source) then finds it set
                t.buffer = bufs[o]
                t.op, t.src, t.arg = "BUF", (), None
        if dbg >= 1:
            print(f"realize: {len(plan.kernels)} kernel(s) in {(t2 - t1) * 1e3:.3f} ms, "
                  f"total {(t2 - t0) * 1e3:.3f} ms{'' if dbg < 2 else ' ' + str({k: round(v * 1e3, 2) for k, v in cp.seconds.items()})}")


# the sessions ``with`` blocks made current, innermost last, per thread (and asyncio task)
_current: contextvars.ContextVar[tuple[Session, ...]] = contextvars.ContextVar("eqgrad_session", default=())
_DEFAULT = Session(rules=rulebook.DEFAULT, extraction=DEFAULT_EXTRACTION)


def default_session() -> Session:
    """The process's session: what the module functions use outside ``with session:`` blocks. Its
    rules are ``eqgrad.rules``' default state, its extraction settings ``eqgrad.extract``'s."""
    return _DEFAULT


def current_session() -> Session:
    """The session of the innermost ``with session:`` block of this thread, else the default one."""
    stack = _current.get()
    return stack[-1] if stack else _DEFAULT


def realize(lbs: list[LazyBuffer]) -> None:
    """Realize pending LazyBuffers with the current session (``Session.realize_lazy``)."""
    current_session().realize_lazy(lbs)


def plan_for(lbs: list[LazyBuffer], provenance: bool = False, whole: bool = True) -> tuple[CompiledPlan, str]:
    """``Session.plan_for`` of the current session."""
    return current_session().plan_for(lbs, provenance, whole)


def clear_cache() -> None:
    """Empty the current session's plan cache."""
    current_session().clear_cache()


def _after_fork_in_child() -> None:
    global GRAPH_LOCK, _CONTEXT_LOCK, _RNG_LOCK
    # made anew: a parent thread may have held them at the fork (_CONTEXT_LOCK guards a dict's
    # setdefault, _RNG_LOCK a generator's making: each done or not done in the child)
    GRAPH_LOCK = lazy.GRAPH_LOCK = threading.Lock()
    _CONTEXT_LOCK, _RNG_LOCK = threading.Lock(), threading.Lock()
    for s in list(_sessions):
        s.plan_cache.after_fork_in_child()
        s._resizable.after_fork_in_child()
        s.rules.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
