"""The NumPy reference device: runs a plan kernel by kernel with the NumPy interpreter
(``eqgrad.graph.interp.run_kernel``: the op table's references on whole arrays, no loop IR).

It is the living definition of what a kernel body means; tests compare every other device with it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from eqgrad.counters import GlobalCounters
from eqgrad.devices import Buffer, Device
from eqgrad.dtype import to_storage
from eqgrad.graph.interp import run_kernel
from eqgrad.graph.plan import KernelPlan


class NumpyDevice(Device):
    name = "NUMPY"

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        def run(bufs: list[Buffer]) -> None:
            for k in plan.kernels:
                out = run_kernel(k, [b.data for b in bufs])
                np.copyto(bufs[k.out].data, to_storage(out, bufs[k.out].dtype).reshape(bufs[k.out].shape))
                GlobalCounters.kernel_count += 1
        return run
