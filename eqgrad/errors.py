"""The exceptions eqgrad raises at its API. Each message names the op, what it expected and what it got."""
from __future__ import annotations



class OpError(ValueError):
    """Raised for invalid arguments to a primitive op (shape, dtype, axis): the graph floor's error,
    which the Tensor layer words for the user."""


class EqgradError(Exception):
    """Base class of eqgrad's API errors."""


class ShapeError(EqgradError, ValueError):
    """Shapes that do not fit the op (broadcasting, reshape sizes, matmul inner dimensions, ...)."""


class DTypeError(EqgradError, TypeError):
    """A dtype the op does not accept."""


class AxisError(EqgradError, IndexError, ValueError):
    """An axis or index out of range, or repeated."""


class OutOfMemoryError(EqgradError, MemoryError):
    """A buffer the device cannot hold; the message names its shape, dtype and bytes."""


class CompileError(EqgradError, RuntimeError):
    """A kernel failed to compile; the message names the kernel, the device and where its source was written."""


class DeviceError(EqgradError, RuntimeError):
    """A device is unknown or unavailable, or tensors are on different devices."""


class AutogradError(EqgradError, RuntimeError):
    """backward() on a tensor that does not require a gradient, a gradient of the wrong shape, ..."""


class JitError(EqgradError, RuntimeError):
    """A jitted function does something a replay could not repeat (e.g. reads a tensor into Python)."""


__all__ = ["EqgradError", "ShapeError", "DTypeError", "AxisError", "DeviceError", "OutOfMemoryError", "AutogradError", "JitError", "OpError"]
