"""Optimizers and learning-rate schedules.

An optimizer's ``step()`` builds the update of every parameter (and of its own state) as lazy
tensors, writes them with ``assign`` and realizes everything -- the forward pass, the backward pass
and the update -- as **one program**: the e-graph sees the whole training step. Pass the loss (or
anything else you want from this step) to ``step(loss)`` so it is computed in the same program.

Hyperparameters that change during training (the learning rate; Adam's bias corrections through
``beta ** t``) are tensors, not Python numbers baked into the graph: a schedule changes a buffer's
contents, never the graph's structure, so the plan is compiled once and a jitted step replays.

    >>> import numpy as np
    >>> from eqgrad import Tensor, optim
    >>> w = Tensor([1.0, -2.0], requires_grad=True)
    >>> opt = optim.SGD([w], lr=0.5)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w.tolist()
    [0.0, 0.0]
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from eqgrad.errors import DTypeError
from eqgrad.frontend.autograd import set_grad_enabled
from eqgrad.frontend.tensor import Tensor, pending_assigns, realize


def _scalar(v: float, device: str) -> Tensor:
    return Tensor(np.array(v, dtype=np.float32), device=device)


class Optimizer:
    """Base class. ``params``: tensors that require a gradient are updated; the others (buffers,
    e.g. BatchNorm's running statistics) are realized with every step, and so is every other
    tensor with a pending ``assign`` (state a forward pass wrote, given to the optimizer or not)."""

    def __init__(self, params: Iterable[Tensor], lr: float):
        ts = list({id(p): p for p in params}.values())
        for p in ts:
            if not isinstance(p, Tensor):
                raise DTypeError(f"{type(self).__name__}: expected Tensors, got {type(p).__name__}")
        self.params = [p for p in ts if p.requires_grad]
        self.buffers = [p for p in ts if not p.requires_grad]
        if not self.params:
            raise ValueError(f"{type(self).__name__}: none of the {len(ts)} tensors given requires a gradient")
        self.device = self.params[0].device
        realize(*ts)                     # parameters must own buffers: updates are written into them
        self.lr = _scalar(lr, self.device)
        self.state: list[Tensor] = []    # optimizer state, realized with each step

    def _zeros_like(self, p: Tensor) -> Tensor:
        t = Tensor(np.zeros(p.shape, np.float32), device=p.device)
        self.state.append(t)
        return t

    def set_lr(self, lr: float) -> None:
        """Write a new learning rate into the ``lr`` buffer (no recompilation)."""
        self.lr.assign(_scalar(lr, self.device)).realize()

    def get_lr(self) -> float:
        return float(self.lr.item())

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def schedule_step(self) -> list[Tensor]:
        """Assign the updates (lazily) and return every tensor the step must realize: parameters,
        state, gradients, buffers, and every pending assign (e.g. running statistics of a model
        whose optimizer was given ``model.parameters()`` only), so no state's graph grows."""
        with set_grad_enabled(False):
            live = [p for p in self.params if p.grad is not None]
            self._update(live)
        return [*self.params, *self.state, *[p.grad for p in live], *self.buffers, *pending_assigns()]

    def step(self, *also: Tensor) -> None:
        """Realize the update together with ``also`` (e.g. the loss) as one program."""
        realize(*self.schedule_step(), *also)

    def _update(self, params: list[Tensor]) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay, as torch."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov momentum needs momentum > 0")
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.bufs = [self._zeros_like(p) for p in self.params] if momentum else []

    def _update(self, params: list[Tensor]) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                # NOTE: torch starts the buffer at g; with a zero buffer momentum*0 + g is the same
                buf = self.bufs[i].assign(self.bufs[i] * self.momentum + g)
                g = g + buf * self.momentum if self.nesterov else buf
            p.assign(p - self.lr * g)


class Adam(Optimizer):
    """Adam (L2 ``weight_decay`` added to the gradient), as torch.optim.Adam."""
    decoupled = False

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.m = [self._zeros_like(p) for p in self.params]
        self.v = [self._zeros_like(p) for p in self.params]
        # beta ** t as tensors: the bias corrections change every step, the graph does not
        self.b1t, self.b2t = _scalar(1.0, self.device), _scalar(1.0, self.device)
        self.state += [self.b1t, self.b2t]

    def _update(self, params: list[Tensor]) -> None:
        b1t = self.b1t.assign(self.b1t * self.b1)
        b2t = self.b2t.assign(self.b2t * self.b2)
        step_size = self.lr / (1.0 - b1t)
        bc2_sqrt = (1.0 - b2t).sqrt()
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            m = self.m[i].assign(self.m[i] * self.b1 + g * (1.0 - self.b1))
            v = self.v[i].assign(self.v[i] * self.b2 + (g * g) * (1.0 - self.b2))
            base = p * (1.0 - self.lr * self.weight_decay) if self.weight_decay and self.decoupled else p
            p.assign(base - step_size * m / (v.sqrt() / bc2_sqrt + self.eps))


class AdamW(Adam):
    """Adam with decoupled weight decay (the parameter shrinks by lr * weight_decay), as torch."""
    decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)


# ------------------------------------------------------------------ learning-rate schedules

class LRScheduler:
    """Sets ``optimizer``'s learning rate from the epoch count (call ``step()`` once per epoch or
    per iteration, after ``optimizer.step()``), as torch.optim.lr_scheduler. Only a buffer changes:
    the compiled step is reused."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.base_lr = optimizer.get_lr()
        self.last_epoch = 0
        self._last_lr = self.base_lr

    def lr_at(self, epoch: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._last_lr = self.lr_at(self.last_epoch)
        self.optimizer.set_lr(self._last_lr)

    def get_last_lr(self) -> list[float]:
        return [self._last_lr]


class LambdaLR(LRScheduler):
    """lr = base_lr * fn(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]):
        self.fn = lr_lambda
        super().__init__(optimizer)
        self._last_lr = self.base_lr * self.fn(0)
        optimizer.set_lr(self._last_lr)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.fn(epoch)


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (number of milestones <= epoch)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** sum(1 for m in self.milestones if m <= epoch)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float):
        self.gamma = gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Linear warm-up: the factor goes from start_factor to end_factor over total_iters epochs."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        self.start, self.end, self.total = start_factor, end_factor, total_iters
        super().__init__(optimizer)
        self._last_lr = self.lr_at(0)
        optimizer.set_lr(self._last_lr)

    def lr_at(self, epoch: int) -> float:
        t = min(epoch, self.total) / self.total
        return self.base_lr * (self.start + (self.end - self.start) * t)


class OneCycleLR(LRScheduler):
    """One cycle (cosine annealing, as torch's default): from max_lr/div_factor up to max_lr over
    pct_start of total_steps, then down to max_lr/(div_factor*final_div_factor)."""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 div_factor: float = 25.0, final_div_factor: float = 1e4):
        self.max_lr, self.total = max_lr, total_steps
        self.initial = max_lr / div_factor
        self.final = self.initial / final_div_factor
        self.up = float(pct_start * total_steps) - 1
        super().__init__(optimizer)
        self._last_lr = self.initial
        optimizer.set_lr(self._last_lr)

    @staticmethod
    def _cos(a: float, b: float, pct: float) -> float:
        return b + (a - b) / 2.0 * (math.cos(math.pi * pct) + 1)

    def lr_at(self, epoch: int) -> float:
        if epoch <= self.up:
            return self._cos(self.initial, self.max_lr, epoch / self.up)
        down = self.total - 1 - self.up
        return self._cos(self.max_lr, self.final, min((epoch - self.up) / down, 1.0))


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LRScheduler", "LambdaLR", "StepLR", "MultiStepLR",
           "ExponentialLR", "CosineAnnealingLR", "LinearLR", "OneCycleLR"]
