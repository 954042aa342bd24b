"""The NumPy reference device: runs a plan kernel by kernel with the op table's references.

It is the living definition of what a kernel body means (tests compare every other device with
it). No loop IR is involved: each body node is one NumPy call on whole arrays.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..extract.plan import Kernel, KernelPlan, KNode
from ..ops import OPS
from . import Buffer, Device


def eval_kernel(k: Kernel, bufs: list[Buffer]) -> np.ndarray:
    vals: dict[int, np.ndarray] = {}
    for n in k.ast.walk():
        vals[id(n)] = eval_node(n, [vals[id(s)] for s in n.src], bufs)
    return vals[id(k.ast)]


def eval_node(n: KNode, srcs: list[np.ndarray], bufs: list[Buffer]) -> np.ndarray:
    if n.op == "BUF":
        return bufs[n.arg].data.reshape(n.shape)
    if n.op == "CONST":
        return np.full(n.shape, n.arg, dtype=n.dtype.np)
    out = OPS[n.op].ref(srcs, n.arg, n.dtype)
    assert out.shape == n.shape, (n.op, out.shape, n.shape)
    return out


class NumpyDevice(Device):
    name = "NUMPY"

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        def run(bufs: list[Buffer]) -> None:
            from ..engine import GlobalCounters
            for k in plan.kernels:
                np.copyto(bufs[k.out].data, eval_kernel(k, bufs).reshape(bufs[k.out].shape))
                GlobalCounters.kernel_count += 1
        return run
