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
    if n.op == "CONST":       # a broadcast view: an expanded scalar costs no memory (2**31 ones)
        return np.broadcast_to(np.array(n.arg, dtype=n.dtype.np), n.shape)
    if n.op == "RSUM" and n.dtype.is_float:
        return float_sum(srcs[0], n.arg).reshape(n.shape)
    out = OPS[n.op].ref(srcs, n.arg, n.dtype)
    assert out.shape == n.shape, (n.op, out.shape, n.shape)
    return out


def float_sum(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """A float32 sum accumulated in float64, rounded once to float32 (docs/semantics.md "Sums").

    ``np.add.reduce`` is pairwise only along a contiguous inner axis; over strided or broadcast
    axes it adds sequentially in float32 (1e7 x 0.1f: 1e-3 relative). In float64 the error of any
    order is below n * 2**-53 * sum|x_i|, far under float32's rounding for every n up to 2**31.
    An axis of stride 0 (an expanded value) is not iterated: its sum is the value times the count,
    exact in float64."""
    count = 1
    for d in axes:
        if a.shape[d] > 1 and a.strides[d] == 0:
            count *= a.shape[d]
            a = a[tuple(slice(0, 1) if i == d else slice(None) for i in range(a.ndim))]
    with np.errstate(all="ignore"):
        out = np.sum(a, axis=axes, keepdims=True, dtype=np.float64)
        if count != 1:
            out = out * count
        return out.astype(a.dtype)


class NumpyDevice(Device):
    name = "NUMPY"

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        def run(bufs: list[Buffer]) -> None:
            from ..engine import GlobalCounters
            for k in plan.kernels:
                np.copyto(bufs[k.out].data, eval_kernel(k, bufs).reshape(bufs[k.out].shape))
                GlobalCounters.kernel_count += 1
        return run
