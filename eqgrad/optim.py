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
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from eqgrad.errors import DTypeError
from eqgrad.frontend.autograd import set_grad_enabled
from eqgrad.frontend.tensor import Tensor, pending_assigns, realize


def _scalar(v: float, device: str) -> Tensor:
    return Tensor(np.array(v, dtype=np.float32), device=device)


def _array(v: Any) -> np.ndarray:
    """A state value given to ``load_state_dict``: an eqgrad Tensor, a NumPy array, a number or
    anything with ``__array__`` (a CPU torch tensor)."""
    return v.numpy() if isinstance(v, Tensor) else np.asarray(v, dtype=np.float32)


class ParamGroup(dict):
    """A parameter group: a dict as torch's (``params`` and hyperparameters) that users and
    schedulers may edit. Its learning rate lives in a tensor buffer read by the compiled step:
    writing ``group["lr"]`` writes that buffer (no recompilation, and a jitted step sees it).
    Other hyperparameters are constants of the step's graph: changing one compiles a new plan."""

    # keys whose value a compiled step reads from a tensor: the JIT does not guard them (frontend/jit.py)
    jit_live_keys = frozenset({"lr"})

    def __init__(self, group: dict[str, Any], device: str):
        super().__init__(group)
        self.lr_buffer = _scalar(float(group["lr"]), device)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == "lr":
            self.lr_buffer.assign(_scalar(float(value), self.lr_buffer.device)).realize()


class Optimizer:
    """Base class. ``params``: tensors, or dicts of parameter groups as torch's
    (``[{"params": [...], "lr": 0.1}, {"params": [...]}]``; a group's missing hyperparameters are
    the optimizer's arguments). Tensors that require a gradient are updated; the others (buffers,
    e.g. BatchNorm's running statistics) are realized with every step, and so is every other
    tensor with a pending ``assign`` (state a forward pass wrote, given to the optimizer or not).

    ``param_groups`` is a list of dicts as torch's; ``state_dict()``/``load_state_dict()`` use
    torch's layout (``{"state": {index: {name: tensor}}, "param_groups": [{..., "params": [index]}]}``),
    so a torch optimizer's state dict (its tensors as arrays) loads here and the other way round."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        name = type(self).__name__
        given = list(params)
        groups = given if given and isinstance(given[0], dict) else [{"params": given}]
        self.defaults = defaults
        self.param_groups: list[ParamGroup] = []
        self.buffers: list[Tensor] = []
        seen: set[int] = set()
        for g in groups:
            if not isinstance(g, dict) or "params" not in g:
                raise ValueError(f"{name}: a parameter group is a dict with 'params', got {g!r}")
            ps = [g["params"]] if isinstance(g["params"], Tensor) else list(g["params"])
            for p in ps:
                if not isinstance(p, Tensor):
                    raise DTypeError(f"{name}: expected Tensors, got {type(p).__name__}")
            ps = [p for p in ps if id(p) not in seen and not seen.add(id(p))]   # each tensor once
            self.buffers += [p for p in ps if not p.requires_grad]
            self.param_groups.append({**defaults, **g, "params": [p for p in ps if p.requires_grad]})
        self.params = [p for g in self.param_groups for p in g["params"]]
        if not self.params:
            raise ValueError(f"{name}: none of the {len(seen)} tensors given requires a gradient")
        self.device = self.params[0].device
        realize(*self.params, *self.buffers)   # parameters must own buffers: updates are written into them
        self.param_groups = [ParamGroup(g, self.device) for g in self.param_groups]
        self.state: list[Tensor] = []          # optimizer state tensors, realized with each step
        self._pstate: list[dict[str, Tensor]] = [{} for _ in self.params]   # per parameter, by torch's names
        self._index = {id(p): i for i, p in enumerate(self.params)}

    @property
    def lr(self) -> Tensor:
        """The first group's learning-rate buffer."""
        return self.param_groups[0].lr_buffer

    def _new_state(self, value: np.ndarray | float, shape: tuple[int, ...] = ()) -> Tensor:
        t = Tensor(np.broadcast_to(np.asarray(value, np.float32), shape).copy(), device=self.device)
        self.state.append(t)
        return t

    def _param_state(self, p: Tensor, name: str) -> Tensor:
        """The state tensor ``name`` of parameter ``p`` (zeros, created on first use)."""
        st = self._pstate[self._index[id(p)]]
        if name not in st:
            st[name] = self._new_state(0.0, p.shape)
        return st[name]

    def _zeros_like(self, p: Tensor) -> Tensor:
        return self._new_state(0.0, p.shape)

    def set_lr(self, lr: float) -> None:
        """Write a new learning rate into every group's ``lr`` buffer (no recompilation)."""
        for g in self.param_groups:
            g["lr"] = lr

    def get_lr(self) -> float:
        return float(self.param_groups[0]["lr"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def schedule_step(self) -> list[Tensor]:
        """Assign the updates (lazily) and return every tensor the step must realize: parameters,
        state, gradients, buffers, and every pending assign (e.g. running statistics of a model
        whose optimizer was given ``model.parameters()`` only), so no state's graph grows."""
        with set_grad_enabled(False):
            for g in self.param_groups:
                self._update_group(g, [p for p in g["params"] if p.grad is not None])
        live = [p for p in self.params if p.grad is not None]
        return [*self.params, *self.state, *[p.grad for p in live], *self.buffers, *pending_assigns()]

    def step(self, *also: Tensor) -> None:
        """Realize the update together with ``also`` (e.g. the loss) as one program."""
        realize(*self.schedule_step(), *also)

    def _update_group(self, group: ParamGroup, params: list[Tensor]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ state dicts
    def _group_state(self, group: ParamGroup) -> dict[str, Tensor]:
        """State kept per group but reported per parameter (Adam's step count)."""
        return {}

    def _load_group_state(self, group: ParamGroup, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """torch's layout; the values are this optimizer's state tensors (not copies, as torch)."""
        state: dict[int, dict[str, Tensor]] = {}
        hyper = []
        for g in self.param_groups:
            extra = self._group_state(g)
            for p in g["params"]:
                i = self._index[id(p)]
                if self._pstate[i]:
                    state[i] = {**extra, **self._pstate[i]}
            hyper.append({**{k: v for k, v in g.items() if k != "params"}, "params": [self._index[id(p)] for p in g["params"]]})
        return {"state": state, "param_groups": hyper}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict in torch's layout (its tensors as eqgrad Tensors or arrays): every
        hyperparameter of every group and every state tensor, written in place."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(len(a["params"]) != len(b["params"])
                                                        for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"{type(self).__name__}.load_state_dict(): the state has groups of "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                             f"{[len(g['params']) for g in self.param_groups]}")
        targets = []
        for saved, g in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v
            for j, p in zip(saved["params"], g["params"]):
                entry = state_dict["state"].get(j, state_dict["state"].get(str(j)))
                if not entry:
                    continue
                self._load_group_state(g, entry)
                for name, v in entry.items():
                    if name in self._group_state(g):
                        continue
                    targets.append(self._param_state(p, name).assign(Tensor(_array(v), device=self.device)))
        realize(*targets, *self.state)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, ``dampening``, Nesterov momentum, L2 weight decay
    and ``maximize``, as torch: buf = momentum * buf + (1 - dampening) * g, except at a buffer's
    first step, where buf = g."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))
        self._started: dict[int, Tensor] = {}      # per parameter with dampening: 1.0 once its buffer holds a step
        for g in self.param_groups:
            if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
                raise ValueError(f"SGD: nesterov momentum needs momentum > 0 and dampening 0, got momentum "
                                 f"{g['momentum']} and dampening {g['dampening']}")
            if g["momentum"]:
                for p in g["params"]:
                    self._param_state(p, "momentum_buffer")

    def _started_flag(self, p: Tensor) -> Tensor:
        """1.0 once ``p``'s momentum buffer has taken a step (a tensor, so the graph of every step
        is the same: the first step's buffer is g, undampened, as torch's)."""
        if id(p) not in self._started:
            self._started[id(p)] = self._new_state(0.0)
        return self._started[id(p)]

    def _update_group(self, group: ParamGroup, params: list[Tensor]) -> None:
        mom, damp, wd = group["momentum"], group["dampening"], group["weight_decay"]
        for p in params:
            g = -p.grad if group["maximize"] else p.grad
            if wd:
                g = g + wd * p
            if mom:
                # NOTE: torch starts the buffer at g; with a zero buffer momentum*0 + g is the same
                buf = self._param_state(p, "momentum_buffer")
                if damp:
                    started = self._started_flag(p)
                    buf = buf.assign(buf * mom + g * (1.0 - damp * started))
                    started.assign(started.maximum(1.0))
                else:
                    buf = buf.assign(buf * mom + g)
                g = g + buf * mom if group["nesterov"] else buf
            p.assign(p - group.lr_buffer * g)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``Optimizer.load_state_dict``; a loaded momentum buffer counts as started (dampened
        from the next step on, as torch)."""
        super().load_state_dict(state_dict)
        flags = []
        for saved, g in zip(state_dict["param_groups"], self.param_groups):
            for j, p in zip(saved["params"], g["params"]):
                entry = state_dict["state"].get(j, state_dict["state"].get(str(j)))
                if entry and "momentum_buffer" in entry:
                    flags.append(self._started_flag(p).assign(1.0))
        realize(*flags, *self.state)


class Adam(Optimizer):
    """Adam (L2 ``weight_decay`` added to the gradient; with ``amsgrad`` the denominator uses the
    running maximum of ``exp_avg_sq``, state ``max_exp_avg_sq``), as torch.optim.Adam."""
    decoupled = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))
        # per group: the step count and beta ** t as tensors (the bias corrections change every
        # step, the graph does not)
        self._steps = {id(g): {"step": self._new_state(0.0), "b1t": self._new_state(1.0), "b2t": self._new_state(1.0)}
                       for g in self.param_groups}
        for g in self.param_groups:
            for p in g["params"]:
                self._param_state(p, "exp_avg"), self._param_state(p, "exp_avg_sq")
                if g["amsgrad"]:
                    self._param_state(p, "max_exp_avg_sq")

    def _group_state(self, group: ParamGroup) -> dict[str, Tensor]:
        return {"step": self._steps[id(group)]["step"]}

    def _load_group_state(self, group: ParamGroup, state: dict[str, Any]) -> None:
        if "step" in state:
            t, (b1, b2) = float(_array(state["step"])), group["betas"]
            st = self._steps[id(group)]
            st["step"].assign(t), st["b1t"].assign(b1 ** t), st["b2t"].assign(b2 ** t)

    def _update_group(self, group: ParamGroup, params: list[Tensor]) -> None:
        if not params:
            return
        b1, b2 = group["betas"]
        eps, wd, lr = group["eps"], group["weight_decay"], group.lr_buffer
        st = self._steps[id(group)]
        st["step"].assign(st["step"] + 1.0)
        b1t = st["b1t"].assign(st["b1t"] * b1)
        b2t = st["b2t"].assign(st["b2t"] * b2)
        step_size = lr / (1.0 - b1t)
        bc2_sqrt = (1.0 - b2t).sqrt()
        for p in params:
            g = -p.grad if group["maximize"] else p.grad
            if wd and not self.decoupled:
                g = g + wd * p
            m, v = self._param_state(p, "exp_avg"), self._param_state(p, "exp_avg_sq")
            m = m.assign(m * b1 + g * (1.0 - b1))
            v = v.assign(v * b2 + (g * g) * (1.0 - b2))
            if group["amsgrad"]:                 # the denominator from the largest exp_avg_sq so far
                vmax = self._param_state(p, "max_exp_avg_sq")
                v = vmax.assign(vmax.maximum(v))
            base = p * (1.0 - lr * wd) if wd and self.decoupled else p
            p.assign(base - step_size * m / (v.sqrt() / bc2_sqrt + eps))


class AdamW(Adam):
    """Adam with decoupled weight decay (the parameter shrinks by lr * weight_decay), as torch."""
    decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


# ------------------------------------------------------------------ learning-rate schedules

class LRScheduler:
    """Sets each of ``optimizer``'s groups' learning rate from the epoch count and the group's
    initial rate (call ``step()`` once per epoch or per iteration, after ``optimizer.step()``), as
    torch.optim.lr_scheduler. Only a buffer changes: the compiled step is reused. Subclasses give
    ``lr_at(epoch, base_lr)``."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.last_epoch = 0
        self._last_lr = list(self.base_lrs)

    @property
    def base_lr(self) -> float:
        return self.base_lrs[0]

    def lr_at(self, epoch: int, base_lr: float) -> float:
        raise NotImplementedError

    def _set(self, epoch: int) -> None:
        self._last_lr = [self.lr_at(epoch, b) for b in self.base_lrs]
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr

    def step(self) -> None:
        self.last_epoch += 1
        self._set(self.last_epoch)

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


class LambdaLR(LRScheduler):
    """lr = base_lr * fn(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]):
        self.fn = lr_lambda
        super().__init__(optimizer)
        self._set(0)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.fn(epoch)


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (number of milestones <= epoch)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.gamma ** sum(1 for m in self.milestones if m <= epoch)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float):
        self.gamma = gamma
        super().__init__(optimizer)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Linear warm-up: the factor goes from start_factor to end_factor over total_iters epochs."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        self.start, self.end, self.total = start_factor, end_factor, total_iters
        super().__init__(optimizer)
        self._set(0)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        t = min(epoch, self.total) / self.total
        return base_lr * (self.start + (self.end - self.start) * t)


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
        self._set(0)

    @staticmethod
    def _cos(a: float, b: float, pct: float) -> float:
        return b + (a - b) / 2.0 * (math.cos(math.pi * pct) + 1)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        if epoch <= self.up:
            return self._cos(self.initial, self.max_lr, epoch / self.up)
        down = self.total - 1 - self.up
        return self._cos(self.max_lr, self.final, min((epoch - self.up) / down, 1.0))


class ReduceLROnPlateau:
    """Multiply every group's learning rate by ``factor`` (not below ``min_lr``) when ``step(metric)``
    has seen no improvement for more than ``patience`` epochs, then wait ``cooldown`` epochs, as
    torch.optim.lr_scheduler.ReduceLROnPlateau. Improvement: for mode "min" with threshold_mode
    "rel", metric < best * (1 - threshold); "abs": metric < best - threshold ("max" mirrored).

        >>> from eqgrad import Tensor
        >>> opt = SGD([Tensor([1.0], requires_grad=True)], lr=1.0)
        >>> sched = ReduceLROnPlateau(opt, patience=1, factor=0.5)
        >>> for loss in (3.0, 2.0, 2.0, 2.0, 2.0): sched.step(loss)
        >>> opt.get_lr()
        0.5
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1, got {factor}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                             f"got {mode!r} and {threshold_mode!r}")
        n = len(optimizer.param_groups)
        self.min_lrs = [float(v) for v in min_lr] if isinstance(min_lr, (list, tuple)) else [float(min_lr)] * n
        if len(self.min_lrs) != n:
            raise ValueError(f"ReduceLROnPlateau: expected {n} min_lrs (one per group), got {len(self.min_lrs)}")
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, factor, patience
        self.threshold, self.threshold_mode, self.cooldown, self.eps = threshold, threshold_mode, cooldown, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = self.last_epoch = 0
        self._last_lr = [float(g["lr"]) for g in optimizer.param_groups]

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics: float | Tensor) -> None:
        current = float(metrics.item() if isinstance(metrics, Tensor) else metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, low in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(g["lr"])
                new = max(old * self.factor, low)
                if old - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)


__all__ = ["Optimizer", "ParamGroup", "SGD", "Adam", "AdamW", "LRScheduler", "LambdaLR", "StepLR", "MultiStepLR",
           "ExponentialLR", "CosineAnnealingLR", "LinearLR", "OneCycleLR",
           "ReduceLROnPlateau"]
