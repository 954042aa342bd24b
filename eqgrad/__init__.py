"""eqgrad: a lazy deep-learning framework whose compiler is equality saturation.

    >>> from eqgrad import Tensor
    >>> ((Tensor([1.0, 2.0]) + 1) * 2).tolist()
    [4.0, 6.0]
"""
from .config import Context
from .dtype import bool_, float32, int32, DType
from .engine import EqgradWarning, GlobalCounters
from .errors import AxisError, DeviceError, DTypeError, EqgradError, ShapeError
from .extract.explain import explain
from .frontend.tensor import Tensor, manual_seed

bool = bool_  # noqa: A001  (eqgrad.bool, as torch.bool)

__all__ = ["Tensor", "Context", "explain", "GlobalCounters", "manual_seed", "DType", "float32", "int32", "bool_",
           "EqgradError", "ShapeError", "DTypeError", "AxisError", "DeviceError", "EqgradWarning"]
__version__ = "0.1.0"
