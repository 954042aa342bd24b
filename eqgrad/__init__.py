"""eqgrad: a lazy deep-learning framework whose compiler is equality saturation.

    >>> from eqgrad import Tensor
    >>> ((Tensor([1.0, 2.0]) + 1) * 2).tolist()
    [4.0, 6.0]
"""
from .config import Context
from .dtype import bool_, float32, int32, DType, ConversionWarning
from .cache import CacheWarning
from .engine import EqgradWarning, GlobalCounters
from .errors import AxisError, CompileError, DeviceError, DTypeError, EqgradError, ShapeError
from .extract.explain import explain
from .frontend.tensor import Tensor, manual_seed

from .errors import AutogradError, JitError
from .frontend.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .frontend.tensor import realize
from .frontend.jit import jit
from . import nn, optim

bool = bool_  # noqa: A001  (eqgrad.bool, as torch.bool)

__all__ = ["Tensor", "Context", "explain", "GlobalCounters", "manual_seed", "DType", "float32", "int32", "bool_",
           "EqgradError", "ShapeError", "DTypeError", "AxisError", "DeviceError", "EqgradWarning",
           "ConversionWarning", "CacheWarning"]
__all__ += ["realize", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "jit", "nn", "optim",
            "AutogradError", "JitError", "CompileError"]
__version__ = "0.1.0"
