"""The OpenCL device: loop IR -> OpenCL C (``cstyle``) -> pyopencl program -> launches on a queue.

Runs on any OpenCL 1.2+ platform; in CI that is PoCL, a CPU OpenCL
(``apt-get install pocl-opencl-icd ocl-icd-libopencl1``). The device prefers a GPU when several
exist; ``PYOPENCL_CTX`` (pyopencl's own variable, e.g. ``0:1``) picks one explicitly.

Buffers live in device memory (``cl.Buffer``); copies to and from the host are blocking. A plan's
kernels are enqueued in order on one in-order queue, and ``run`` returns once they are done, so
measured times are real. Each kernel runs one work-item per iteration of its parallel output loops,
or one work-group per output element for a long reduction (``CStyleRenderer.launch``).

Failures: a kernel the OpenCL compiler rejects is a ``CompileError`` naming the kernel and where its
source was written; any other error of the runtime (``cl.Error``: a lost device, out of resources)
while allocating, copying, building, launching or waiting is one ``DeviceError`` naming the device,
the operation and the kernel (``Device.failed``).
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from eqgrad import config
from eqgrad.dtype import DType
from eqgrad.errors import CompileError, DeviceError
from eqgrad.graph.caps import Capabilities
from eqgrad.graph.plan import KernelPlan
from eqgrad.ops import Shape, numel
from eqgrad.devices import Buffer, Device, DevicePlan
from eqgrad.devices.cstyle import CSTYLE_OPS, INT_KINDS, SUPPORTED_KINDS, CStyleRenderer, one_program
from eqgrad.devices.sizeargs import SizedSources
from eqgrad.lower.decomp import DECOMPOSITIONS
from eqgrad.lower.merge import SiblingMerger
from eqgrad.lower.passes import LowerOptions
from eqgrad.counters import GlobalCounters, log_kernel, timing_kernels
from eqgrad.cache import save_failed_source


class OpenCLRenderer(CStyleRenderer):
    name = "OpenCL"
    kernel_prefix = "__kernel void"
    global_ptr = "__global "
    global_id = "(long)get_global_id(0)"
    global_ids = ("(long)get_global_id(0)", "(long)get_global_id(1)", "(long)get_global_id(2)")
    group_id = "(long)get_group_id(0)"
    local_id = "(long)get_local_id(0)"
    local_prefix = "__local"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    reduce_group = 16            # on a CPU OpenCL (PoCL) small groups measured best; GPUs: 128 (below)
    uint_type = "uint"
    byte_type = "uchar"
    # OpenCL C's integer types have fixed widths (char 8, short 16, int 32, long 64 bits, two's
    # complement): every integer dtype is computed in its own type, its wrapping + - * in the
    # unsigned one (uint for the 8- and 16-bit ones, which C promotes to int)
    supported_kinds = SUPPORTED_KINDS | frozenset(INT_KINDS)
    int_types = {"int8": ("char", "uint", ""), "uint8": ("uchar", "uint", ""), "int16": ("short", "uint", ""),
                 "uint32": ("uint", "uint", "u"), "int64": ("long", "ulong", "L")}
    as_type = "as_"
    table_prefix = "__constant"
    fp64_pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable"
    # PoCL's library exp2/log2/sin/erf are scalar calls (~10 ns per element) that its vectorizer cannot
    # widen: every op with a decomposition is decomposed instead (lower/decomp.py); a GPU gets its
    # library sin (__init__)
    code_for_op = {op: rule for op, rule in CSTYLE_OPS.items() if op not in DECOMPOSITIONS}


INSTALL = ("install the Python package with `pip install 'eqgrad[opencl]'` (pyopencl) and an OpenCL platform; "
           "for a CPU OpenCL on Debian/Ubuntu: `apt-get install pocl-opencl-icd ocl-icd-libopencl1`")


# fork: an OpenCL runtime started before os.fork() cannot be used in the child (PoCL's threads do
# not survive it: the child's first launch or even a new context waits forever), so a forked child
# of a process that started OpenCL gets a clear error instead of a hang.
_started = False           # this process has initialized an OpenCL runtime
_inherited = False         # ... or it is a forked child of one that had


def _after_fork_in_child() -> None:
    global _inherited
    _inherited = _inherited or _started


os.register_at_fork(after_in_child=_after_fork_in_child)


def _pick_device(cl: Any) -> Any:
    global _started
    if _inherited:
        raise DeviceError("OPENCL device unavailable in this process: it is a child made by os.fork() of a "
                          "process that had started OpenCL, and an OpenCL runtime cannot be used after fork; "
                          "use multiprocessing's 'spawn' or 'forkserver' start method, or start OpenCL only "
                          "in the child")
    _started = True
    if os.environ.get("PYOPENCL_CTX"):
        return cl.create_some_context(interactive=False).devices[0]
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:        # the ICD loader reports "no platforms" as an error
        raise DeviceError(f"OPENCL device unavailable: no OpenCL platform found ({e}); {INSTALL}") from None
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        raise DeviceError(f"OPENCL device unavailable: the OpenCL platforms have no devices; {INSTALL}")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


class OpenCLDevice(Device):
    name = "OPENCL"
    host_memory = False

    def __init__(self) -> None:
        try:
            import pyopencl as cl
        except (ImportError, OSError) as e:
            raise DeviceError(f"OPENCL device unavailable: pyopencl cannot be imported ({e}); {INSTALL}") from None
        self.cl = cl
        self.device = _pick_device(cl)
        try:
            self.ctx = cl.Context([self.device])
        except cl.Error as e:
            raise DeviceError(f"OPENCL device unavailable: cannot open {self.device.name.strip()} ({e})") from None
        self.queue = cl.CommandQueue(self.ctx)
        self.runtime_errors = (cl.Error,)
        self.renderer = OpenCLRenderer()
        # a CPU OpenCL vectorizes across a group's work-items and spreads groups over cores; a GPU
        # wants a few warps per group
        if not self.device.type & cl.device_type.CPU:
            self.renderer.group_size = self.renderer.reduce_group = 128
        if not self.device.type & cl.device_type.CPU or "cl_khr_fp64" not in self.device.extensions:
            # sin's decomposition reduces in double: slow on GPUs, impossible without cl_khr_fp64
            self.renderer.code_for_op = {**self.renderer.code_for_op, "SIN": CSTYLE_OPS["SIN"]}
        while self.renderer.reduce_group > self.device.max_work_group_size:
            self.renderer.group_size = self.renderer.reduce_group = self.renderer.reduce_group // 2
        # its own lowering choices (graph/caps.py): on a GPU outputs are work-items and a reduction's
        # group shares its loop, without CPU register blocks; a CPU platform keeps them (20x on PoCL)
        self.caps = Capabilities(f"OPENCL {self.device.name.strip()}",
                                 register_lanes=bool(self.device.type & cl.device_type.CPU),
                                 row_arrays_full=False,     # (a work-item's private array, on PoCL too)
                                 reduce_group=self.renderer.reduce_group)
        self.kernels: dict[str, Any] = {}          # compiled once per distinct source
        # kernels whose sizes keep changing build one program that reads them at run time: a
        # growing KV cache built 5 programs a decode step (~85 ms each on PoCL), and none after its
        # fifth length (devices/sizeargs.py)
        self.sources = SizedSources(self.renderer, "OpenCL C")
        self.merger = SiblingMerger()
        # a launch sets the kernel object's arguments, then enqueues it: two threads launching one
        # kernel (the same source is one object) must not interleave the two, or one runs with the
        # other's buffers (seen in tests/test_threads.py); copies and waits are thread-safe in OpenCL
        self._launch_lock = threading.Lock()

    @property
    def families(self) -> Any:
        """The kernel families (devices/sizeargs.py) of this device's sources."""
        return self.sources.families

    def __repr__(self) -> str:
        return f"<OpenCLDevice {self.device.name.strip()} on {self.device.platform.name.strip()}>"

    # ------------------------------------------------------------------ memory
    def alloc(self, shape: Shape, dtype: DType) -> Any:
        # OpenCL has no empty buffers; a zero-size tensor gets a few bytes that are never read
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(numel(shape) * dtype.itemsize, 4))

    def copyin(self, raw: Any, a: np.ndarray) -> None:
        if a.size:
            self.cl.enqueue_copy(self.queue, raw, a, is_blocking=True)

    def copyout(self, raw: Any, shape: Shape, dtype: DType) -> np.ndarray:
        out = np.empty(shape, dtype=dtype.np)
        if out.size:
            self.cl.enqueue_copy(self.queue, out, raw, is_blocking=True)
        return out

    def synchronize(self) -> None:
        self.queue.finish()

    # ------------------------------------------------------------------ programs
    def kernel(self, src: str, k: Any = None) -> Any:
        """The compiled kernel of ``src`` (built once per distinct source). ``k``, the plan's kernel,
        names it in errors: a build the compiler rejects is a CompileError (the source is written to
        the cache's failed/ folder), any other runtime error a DeviceError."""
        if src not in self.kernels:
            self.kernels[src] = self._build(src, [k], "eqk")[0]
        return self.kernels[src]

    def build_kernels(self, items: list[tuple[str, Any]]) -> list[Any]:
        """The compiled kernels of ``items`` (source, the plan's kernel), in order: those not built
        yet are built together, as one program (``cstyle.one_program``: a build costs the same for
        one kernel as for several); when that build fails, each is built alone, so the error names
        the kernel that failed."""
        new: dict[str, Any] = {}
        for src, k in items:
            if src not in self.kernels:
                new.setdefault(src, k)
        if len(new) > 1:
            srcs = list(new)
            at = {name: src for src, name in zip(srcs, (f"eqk_{j}" for j in range(len(srcs))))}
            for program, names in one_program(srcs, self.renderer.kernel_prefix):
                try:
                    built = self._build(program, [new[at[n]] for n in names], *names, quiet=True)
                except CompileError:
                    continue                            # each alone, below
                for n, knl in zip(names, built):
                    self.kernels[at[n]] = knl
        return [self.kernel(src, k) for src, k in items]

    def _build(self, src: str, ks: list[Any], *names: str, quiet: bool = False) -> list[Any]:
        """Build one program and return its kernels ``names``. ``ks``: the plan's kernels it holds
        (for errors); ``quiet``: a rejected build raises a bare CompileError (its kernels are built
        again one by one)."""
        cl = self.cl
        try:
            # -cl-fp32-correctly-rounded-divide-sqrt: 1/x and sqrt rounded like the LLVM device
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cl.CompilerWarning)   # PoCL's build log chatter
                prg = cl.Program(self.ctx, src).build(options=["-cl-fp32-correctly-rounded-divide-sqrt"])
            GlobalCounters.kernels_compiled += len(names)
            return [cl.Kernel(prg, n) for n in names]
        except cl.Error as e:
            k = ks[0] if len(ks) == 1 else None
            what = (f"kernel {k.name} ({k.ast.render()[:80]})" if k is not None else
                    f"kernels {', '.join(x.name for x in ks if x is not None)}" if any(ks) else "a kernel")
            if getattr(e, "code", None) not in (cl.status_code.BUILD_PROGRAM_FAILURE, cl.status_code.INVALID_KERNEL_NAME):
                raise self.failed(f"building {what}", e) from e
            if quiet:
                raise CompileError(f"OPENCL device: {what} failed to compile") from e
            where = save_failed_source(k.name if k is not None else "kernel", ".cl", src)   # never raises
            log = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower() and ln.strip()]
            first = next((ln for ln in log if "error:" in ln), log[0] if log else type(e).__name__)
            raise CompileError(f"OPENCL device: {what} failed to compile: {first}; "
                               f"its OpenCL C {where}") from e

    def launch(self, knl: Any, gsize: tuple[int, ...], lsize: tuple[int, ...], raws: list[Any]) -> None:
        """Enqueue one kernel (returns before it has run)."""
        with self._launch_lock:
            knl(self.queue, gsize, lsize, *raws)

    def rewrite(self, plan: KernelPlan) -> DevicePlan:
        """The device's stage: sibling kernels run as one kernel with several outputs (lower/merge.py)."""
        notes: list[str] = []
        return DevicePlan(self.merger.merge(plan, LowerOptions.for_caps(self.caps), notes), [], notes)

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        rewritten = self.rewrite(plan)
        if config.DEBUG.value >= 3:
            print(rewritten.describe(self.name))
        given, plan = plan, rewritten.plan
        rendered = [(k, *self.sources.source(self, k, plan)) for k in plan.kernels]
        knls = self.build_kernels([(src, k) for k, _, src, _, _ in rendered])
        steps = []
        for (k, lk, _, sizes, built), knl in zip(rendered, knls):
            if built is not None:
                built()
            geo = self.renderer.launch(lk)
            gsize = geo.global_size if numel(plan.buffers[k.out][0]) else None      # an empty output: no launch
            extra = () if sizes is None else (self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_ONLY |
                                                             self.cl.mem_flags.COPY_HOST_PTR, hostbuf=sizes),)
            steps.append((k, knl, gsize, geo.local_size, k.params, extra))
        names = ", ".join(k.name for k in plan.kernels)
        predicted = given.in_context([s[0] for s in steps])      # (DEBUG=2's, kernel_log's; by plan kernel)

        def run(bufs: list[Buffer]) -> None:
            dbg = config.DEBUG.value
            timed = timing_kernels(dbg)
            for j, (k, knl, gsize, lsize, ids, extra) in enumerate(steps):
                t0 = time.perf_counter() if timed else 0.0
                try:
                    if gsize:
                        self.launch(knl, gsize, lsize, [bufs[i].raw for i in ids] + list(extra))
                    if timed:
                        self.synchronize()
                except self.cl.Error as e:
                    raise self.failed(f"launching kernel {k.name} ({k.ast.render()[:80]})", e) from e
                GlobalCounters.kernel_count += 1
                if timed:
                    log_kernel(k, time.perf_counter() - t0, dbg, predicted[j])
            try:
                self.synchronize()
            except self.cl.Error as e:          # an error of a kernel that ran after its launch returned
                raise self.failed(f"running kernel(s) {names}", e) from e
        run.launches = len(steps)
        return run
