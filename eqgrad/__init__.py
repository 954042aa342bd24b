"""eqgrad: a lazy deep-learning framework whose compiler is equality saturation.

    >>> from eqgrad import Tensor
    >>> ((Tensor([1.0, 2.0]) + 1) * 2).tolist()
    [4.0, 6.0]
"""
from eqgrad import config
from eqgrad.config import Context
from eqgrad.rules import launch as _launch
_launch.prestart()          # the saturation worker starts now: it loads egglog while eqgrad imports
from eqgrad.rules.saturate import prestart as _prestart
_prestart()                 # ... and is sent the IR and the rules to load as soon as they are known
from eqgrad.dtype import (bool_, uint8, int8, int16, int32, uint32, int64, float16, bfloat16, float32, float64,
                          DType, ConversionWarning)
half, double, long = float16, float64, int64      # torch's names
from eqgrad.cache import CacheWarning
from eqgrad.counters import EqgradWarning, GlobalCounters
from eqgrad.engine.session import Session
from eqgrad.errors import AxisError, CompileError, DeviceError, DTypeError, EqgradError, ShapeError
from eqgrad.tools.explain import explain
from eqgrad.frontend.tensor import Tensor, manual_seed

from eqgrad.errors import AutogradError, JitError, OutOfMemoryError
from eqgrad.frontend.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from eqgrad.frontend.tensor import realize
from eqgrad.frontend.jit import jit
from eqgrad import nn, optim

bool = bool_  # noqa: A001  (eqgrad.bool, as torch.bool)

__all__ = ["Tensor", "Context", "explain", "GlobalCounters", "manual_seed", "DType", "float32", "int32", "bool_",
           "uint8", "int8", "int16", "uint32", "int64", "float16", "bfloat16", "float64", "half", "double", "long",
           "EqgradError", "ShapeError", "DTypeError", "AxisError", "DeviceError", "EqgradWarning",
           "ConversionWarning", "CacheWarning"]
__all__ += ["Session", "realize", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "jit", "nn", "optim",
            "AutogradError", "JitError", "CompileError", "OutOfMemoryError"]
__version__ = config.VERSION
