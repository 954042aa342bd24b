"""The kernel cost model: one small function, with its units and assumptions.

    time(kernel) = launch + max(bytes / bandwidth, flops / peak)          [seconds]
    time(plan)   = sum over kernels

- bytes: the kernel's output written once, plus each distinct input buffer read once (or only the
  elements actually read, for a slice), at the dtype's item size. Constants cost nothing.
- flops: each body node's weight (``OpDef.flops``; EXP2/LOG2/SIN ~20, SQRT/RECIP 4, IDIV/MOD 8,
  others 1, movement 0) times the number of times it is *evaluated*. Evaluations propagate from
  the kernel's output: a node is evaluated once per output element of its consumer, and a
  reduction's source once per reduced element. Work shared inside one kernel counts once; a
  producer inlined into two kernels counts in both; a producer inlined under a broadcast
  (``Expand``) is evaluated once per broadcast element.
- legality (the extractor is its authority, DESIGN.md): a reduction evaluated more often than it
  has output elements (i.e. recomputed under a broadcast) is illegal, as is a ``Contiguous`` that
  is not its kernel's output, or a body larger than ``max_nodes``.

Worked example (defaults below: 5 us launch, 20 GB/s, 50 GFLOP/s). ``(a+b+1)*2`` on 1M float32:
unfused, 3 kernels each reading/writing ~8 MB: 3 * (5 us + 8e6/20e9 s) = 3 * 405 us = 1.2 ms;
fused, one kernel reading 8 MB and writing 4 MB: 5 us + 12e6/20e9 s = 605 us -> fused wins.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceParams:
    launch: float = 5e-6          # seconds per kernel launch
    bandwidth: float = 20e9       # bytes per second (one core streaming)
    peak: float = 50e9            # flops per second
    max_nodes: int = 160          # largest kernel body (nodes) the extractor will form


DEFAULT_PARAMS: dict[str, DeviceParams] = {
    "LLVM": DeviceParams(),
    "NUMPY": DeviceParams(launch=20e-6, bandwidth=5e9, peak=2e9),
}


@dataclass
class KernelCost:
    seconds: float
    bytes: int
    flops: int
    nodes: int
    legal: bool
    why: str = ""


def kernel_time(p: DeviceParams, nbytes: float, flops: float) -> float:
    return p.launch + max(nbytes / p.bandwidth, flops / p.peak)
