"""The ``Module`` base class, ``Linear`` and parameter initialization: what the layer modules
(nn/__init__.py, nn/conv.py, nn/attention.py) build on, in a module of its own so they import it
without a cycle through the package."""
from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from eqgrad.frontend import tensor as _t
from eqgrad.frontend.tensor import Tensor
from eqgrad.nn import functional as F
from eqgrad.nn.state import get_state_dict, load_state_dict


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    return Tensor(_t._rng.uniform(-bound, bound, size=shape).astype(np.float32), requires_grad=True)


class Module:
    """Base class: ``__call__`` runs ``forward``; tensors, modules, and lists/dicts of them held as
    attributes are found by ``state_dict``/``parameters``; ``train()``/``eval()`` set ``training``
    on the module and everything under it."""
    training: bool = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def modules(self) -> Iterator["Module"]:
        """This module and every module under it, each once."""
        seen: set[int] = set()
        stack: list[Any] = [self]
        while stack:
            o = stack.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, Module):
                yield o
                stack.extend(reversed([v for k, v in vars(o).items() if not k.startswith("_")]))
            if isinstance(o, (list, tuple)):
                stack.extend(reversed(o))
            elif isinstance(o, dict):
                stack.extend(reversed(list(o.values())))

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def state_dict(self) -> dict[str, Tensor]:
        return get_state_dict(self)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        load_state_dict(self, state, strict)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return [(k, v) for k, v in self.state_dict().items() if v.requires_grad]

    def parameters(self) -> list[Tensor]:
        """The trainable tensors (as torch). For an optimizer prefer ``nn.state.get_parameters``,
        which also includes buffers such as BatchNorm's running statistics."""
        return [v for _, v in self.named_parameters()]

    def buffers(self) -> list[Tensor]:
        return [v for v in self.state_dict().values() if not v.requires_grad]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None


class Linear(Module):
    """``x @ weight.T + bias``; weight (out, in) initialized U(-1/sqrt(in), 1/sqrt(in)) as torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)
