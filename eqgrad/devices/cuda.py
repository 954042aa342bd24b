"""The CUDA device: loop IR -> CUDA C (``cstyle``) -> PTX (nvcc) -> pycuda module -> launches.

An optional extra: ``pip install 'eqgrad[cuda]'`` builds pycuda against the CUDA toolkit (found
through ``CUDA_ROOT``, e.g. ``/usr/local/cuda``), and kernels are compiled with the toolkit's
``nvcc`` (on ``PATH`` or in ``$CUDA_ROOT/bin``). Without a GPU the device is unavailable, but the
renderer still works: the test suite compiles its corpus to PTX with ``compile_ptx`` whenever nvcc
exists, so a renderer bug is caught on any machine.

Buffers live in device memory (``cuda.mem_alloc``); copies are synchronous. A plan's kernels are
launched in order on the default stream, one thread per iteration of the parallel output loops in
blocks of 128, or one block per output element for a long reduction (``CStyleRenderer.launch``),
and ``run`` returns once they are done.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable

import numpy as np

from eqgrad import config
from eqgrad.dtype import DType
from eqgrad.errors import DeviceError
from eqgrad.graph.caps import Capabilities
from eqgrad.graph.plan import KernelPlan
from eqgrad.ops import Shape, numel
from eqgrad.devices import Buffer, Device
from eqgrad.devices.cstyle import MATH64, CStyleRenderer
from eqgrad.devices.sizeargs import SizedSources
from eqgrad.counters import GlobalCounters, log_kernel, timing_kernels


class CUDARenderer(CStyleRenderer):
    name = "CUDA"
    kernel_prefix = 'extern "C" __global__ void'
    restrict = "__restrict__"
    func_prefix = "static __device__ __forceinline__"
    global_id = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
    global_ids = ("(long long)blockIdx.x * blockDim.x + threadIdx.x",
                  "(long long)blockIdx.y * blockDim.y + threadIdx.y", "(long long)blockIdx.z")
    max_grid = (2**31 - 1, 65535, 65535)
    group_id = "(long long)blockIdx.x"
    local_id = "(long long)threadIdx.x"
    local_prefix = "__shared__"
    barrier = "__syncthreads();"
    group_size = 128
    reduce_group = 128
    index_type = "long long"
    index_suffix = "LL"
    uint_type = "unsigned int"
    byte_type = "unsigned char"
    table_prefix = "__constant__"
    # the full-precision float library (exp2f, log2f, sinf, erff, ...): every transcendental native
    math = {op: f + "f" for op, f in {**MATH64, "FMAX": "fmax"}.items()}
    as_float, as_int = "__int_as_float", "__float_as_int"
    inf = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fc00000)"


INSTALL = ("install pycuda with `pip install 'eqgrad[cuda]'` (it builds against the CUDA toolkit: set CUDA_ROOT "
           "to the toolkit's folder, e.g. /usr/local/cuda, and put its bin/ on PATH)")


def nvcc() -> str | None:
    """The nvcc executable: on PATH, else in $CUDA_ROOT/bin or /usr/local/cuda/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_ROOT"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def compile_ptx(src: str, arch: str = "sm_90") -> str:
    """CUDA C -> PTX text with nvcc (full-precision math: no --use_fast_math)."""
    exe = nvcc()
    if exe is None:
        raise DeviceError(f"CUDA: nvcc not found on PATH or in $CUDA_ROOT/bin; {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="eqgrad-cuda-") as d:
        cu, ptx = os.path.join(d, "k.cu"), os.path.join(d, "k.ptx")
        with open(cu, "w") as f:
            f.write(src)
        r = subprocess.run([exe, "--ptx", f"-arch={arch}", "-o", ptx, cu], capture_output=True, text=True)
        if r.returncode != 0:
            raise DeviceError(f"CUDA: nvcc failed on a kernel:\n{r.stderr.strip()}\n--- source\n{src}")
        with open(ptx) as f:
            return f.read()


class CUDADevice(Device):
    name = "CUDA"
    host_memory = False

    def __init__(self) -> None:
        try:
            import pycuda.driver as cuda
        except (ImportError, OSError) as e:
            raise DeviceError(f"CUDA device unavailable: pycuda cannot be imported ({e}); {INSTALL}") from None
        try:
            cuda.init()
            if cuda.Device.count() == 0:
                raise DeviceError("CUDA device unavailable: the CUDA driver sees no GPU")
        except cuda.Error as e:
            raise DeviceError(f"CUDA device unavailable: no usable CUDA driver or GPU ({e})") from None
        if nvcc() is None:
            raise DeviceError(f"CUDA device unavailable: nvcc not found on PATH or in $CUDA_ROOT/bin; {INSTALL}")
        self.cuda = cuda
        self.runtime_errors = (cuda.Error,)        # Buffer and run turn these into a DeviceError
        self.gpu = cuda.Device(0)
        self.ctx = self.gpu.retain_primary_context()
        self.ctx.push()
        atexit.register(self.ctx.pop)
        self.arch = "sm_%d%d" % self.gpu.compute_capability()
        self.renderer = CUDARenderer()
        # its own lowering choices: outputs are threads, a reduction's block shares its loop; no CPU
        # register blocks (graph/caps.py)
        self.caps = Capabilities(f"CUDA {self.arch}", register_lanes=False, row_arrays_full=False,
                                 reduce_group=self.renderer.reduce_group)
        self.functions: dict[str, Any] = {}        # compiled once per distinct source
        self.modules: list[Any] = []               # kept alive with their functions
        # kernels whose sizes keep changing compile one program that reads them at run time (an nvcc
        # run per new size otherwise: a growing KV cache's every step; devices/sizeargs.py)
        self.sources = SizedSources(self.renderer, "CUDA C")

    @property
    def families(self) -> Any:
        """The kernel families (devices/sizeargs.py) of this device's sources."""
        return self.sources.families

    def __repr__(self) -> str:
        return f"<CUDADevice {self.gpu.name()} {self.arch}>"

    # ------------------------------------------------------------------ memory
    def alloc(self, shape: Shape, dtype: DType) -> Any:
        return self.cuda.mem_alloc(max(numel(shape) * dtype.itemsize, 4))

    def copyin(self, raw: Any, a: np.ndarray) -> None:
        if a.size:
            self.cuda.memcpy_htod(raw, a)

    def copyout(self, raw: Any, shape: Shape, dtype: DType) -> np.ndarray:
        out = np.empty(shape, dtype=dtype.np)
        if out.size:
            self.cuda.Context.synchronize()
            self.cuda.memcpy_dtoh(out, raw)
        return out

    def synchronize(self) -> None:
        self.cuda.Context.synchronize()

    # ------------------------------------------------------------------ programs
    def function(self, src: str, nparams: int) -> Any:
        if src not in self.functions:
            mod = self.cuda.module_from_buffer(compile_ptx(src, self.arch).encode())
            fn = mod.get_function("eqk")
            fn.prepare("P" * nparams)
            GlobalCounters.kernels_compiled += 1
            self.modules.append(mod)
            self.functions[src] = fn
        return self.functions[src]

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        steps = []
        for k in plan.kernels:
            lk, src, sizes, built = self.sources.source(self, k, plan)
            fn = self.function(src, len(lk.params) + (sizes is not None))
            if built is not None:
                built()
            geo = self.renderer.launch(lk)
            grid = tuple(g // b for g, b in zip(geo.global_size, geo.local_size))
            if not numel(plan.buffers[k.out][0]):
                grid = (0, 1, 1)     # an empty output: no launch
            # a sized program's last argument: the member's sizes, in device memory
            extra = () if sizes is None else (self.cuda.to_device(sizes),)
            steps.append((k, fn, grid, geo.local_size, k.params, extra))
        names = ", ".join(k.name for k in plan.kernels)
        predicted = plan.in_context([s[0] for s in steps])       # (DEBUG=2's, kernel_log's)

        def run(bufs: list[Buffer]) -> None:
            dbg = config.DEBUG.value
            timed = timing_kernels(dbg)
            for j, (k, fn, grid, block, ids, extra) in enumerate(steps):
                t0 = time.perf_counter() if timed else 0.0
                try:
                    if grid[0]:
                        fn.prepared_call(grid, block, *[int(bufs[i].raw) for i in ids], *[int(e) for e in extra])
                    if timed:
                        self.cuda.Context.synchronize()
                except self.cuda.Error as e:
                    raise self.failed(f"launching kernel {k.name} ({k.ast.render()[:80]})", e) from e
                GlobalCounters.kernel_count += 1
                if timed:
                    log_kernel(k, time.perf_counter() - t0, dbg, predicted[j])
            try:
                self.cuda.Context.synchronize()
            except self.cuda.Error as e:         # an error of a kernel that ran after its launch returned
                raise self.failed(f"running kernel(s) {names}", e) from e
        return run
