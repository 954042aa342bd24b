"""Devices: where buffers live and kernels run. One module per device, found by name.

A device provides ``params`` (its cost-model parameters) and ``prepare(plan)``, which compiles a
:class:`KernelPlan` into a callable that runs it on a list of buffers. Both CPU devices keep
buffers in host memory as contiguous NumPy arrays, so copies between them are free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..dtype import DType
from ..errors import DeviceError
from ..extract.cost import DEFAULT_PARAMS, DeviceParams
from ..ops import Shape


@dataclass(eq=False)
class Buffer:
    device: str
    shape: Shape
    dtype: DType
    data: np.ndarray         # contiguous, of exactly ``shape`` and ``dtype``

    @staticmethod
    def from_numpy(a: np.ndarray, device: str) -> "Buffer":
        from ..dtype import to_dtype
        dt = to_dtype(a.dtype)
        # always a copy: the tensor owns its memory, later writes to `a` must not leak in
        # (np.array keeps 0-d arrays 0-d; np.ascontiguousarray would make them 1-d)
        arr = np.array(a, dtype=dt.np, order="C", copy=True)
        return Buffer(device, tuple(arr.shape), dt, arr)

    @staticmethod
    def empty(shape: Shape, dtype: DType, device: str) -> "Buffer":
        return Buffer(device, tuple(shape), dtype, np.empty(shape, dtype=dtype.np))

    @property
    def ptr(self) -> int:
        return self.data.ctypes.data


class Device:
    name = "?"

    @property
    def params(self) -> DeviceParams:
        return DEFAULT_PARAMS[self.name]

    def prepare(self, plan: Any) -> Callable[[list[Buffer]], None]:
        raise NotImplementedError


_devices: dict[str, Device] = {}


def get_device(name: str) -> Device:
    name = name.upper()
    if name == "CPU":
        name = "LLVM"
    if name not in _devices:
        if name == "LLVM":
            from .cpu import LLVMDevice
            _devices[name] = LLVMDevice()
        elif name == "NUMPY":
            from .numpy_device import NumpyDevice
            _devices[name] = NumpyDevice()
        else:
            raise DeviceError(f"unknown device {name!r}: expected one of LLVM, NUMPY "
                              "(OPENCL and CUDA are not built yet)")
    return _devices[name]


def canonical_device(name: str | None) -> str:
    from .. import config
    name = (name or config.DEVICE.value).upper()
    if name == "CPU":
        name = "LLVM"
    if name not in ("LLVM", "NUMPY"):
        raise DeviceError(f"unknown device {name!r}: expected one of LLVM, NUMPY "
                          "(OPENCL and CUDA are not built yet)")
    return name
