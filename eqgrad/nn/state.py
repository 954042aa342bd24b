"""Finding, saving and loading a model's tensors.

A model is any object: its tensors are found by walking attributes, lists, tuples and dicts
(as tinygrad's ``nn.state``), named by their path (``"layers.0.weight"``). A ``Module`` gives the
same through methods (``model.state_dict()``).

    >>> from eqgrad import nn
    >>> model = nn.Linear(3, 2)
    >>> list(get_state_dict(model))
    ['weight', 'bias']

Files: ``safe_save``/``safe_load`` (safetensors), ``torch_load`` (a ``torch.save``d state dict,
read with torch), ``nn.gguf.gguf_load`` (llama.cpp's GGUF, dequantized), and ``load``, which picks
one of them by the file's suffix. Every loader gives ``{name: Tensor}`` for ``load_state_dict``;
eqgrad computes in float32, so floating tensors of any width become float32 on load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eqgrad.errors import ShapeError
from eqgrad.frontend.tensor import Tensor, realize
from eqgrad.nn.gguf import gguf_load


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor reachable from ``obj``, by dotted name (first name wins for a shared tensor)."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()

    def walk(o: Any, name: str) -> None:
        if isinstance(o, Tensor):
            if id(o) not in seen:
                seen.add(id(o))
                out[name] = o
            return
        if id(o) in seen:
            return
        if isinstance(o, (list, tuple)):
            seen.add(id(o))
            for i, v in enumerate(o):
                walk(v, f"{name}{i}.")
            return
        if isinstance(o, dict):
            seen.add(id(o))
            for k, v in o.items():
                walk(v, f"{name}{k}.")
            return
        if hasattr(o, "__dict__") and not isinstance(o, type):
            seen.add(id(o))
            for k, v in vars(o).items():
                if not k.startswith("_"):
                    walk(v, f"{name}{k}.")

    walk(obj, prefix)
    return {k.rstrip("."): v for k, v in out.items()}


def get_parameters(obj: Any) -> list[Tensor]:
    """Every tensor of ``obj``: the trainable ones and buffers such as BatchNorm's running
    statistics. Optimizers update the tensors that require a gradient and realize the others with
    each step (so buffers written during the step are committed with it)."""
    return list(get_state_dict(obj).values())


def load_state_dict(obj: Any, state: dict[str, Any], strict: bool = True) -> None:
    """Write ``state`` (tensors or arrays by name) into ``obj``'s tensors, in place (``assign``), so
    optimizers and jitted steps that hold them see the loaded values."""
    mine = get_state_dict(obj)
    if strict:
        missing = sorted(set(mine) - set(state))
        unexpected = sorted(set(state) - set(mine))
        if missing or unexpected:
            raise KeyError(f"load_state_dict(): missing keys {missing}, unexpected keys {unexpected}")
    targets = []
    for name, t in mine.items():
        if name not in state:
            continue
        v = state[name]
        shape = tuple(v.shape) if hasattr(v, "shape") else np.shape(v)
        if shape != t.shape:
            raise ShapeError(f"load_state_dict(): {name} has shape {t.shape}, the state has {shape}")
        src = v if isinstance(v, Tensor) else Tensor(np.asarray(v), device=t.device)
        if src.device != t.device:
            src = src.to(t.device)
        targets.append(t.assign(src.cast(t.dtype)))
    realize(*targets)


def safe_save(state: dict[str, Tensor], path: str | Path) -> None:
    """Save tensors by name in the safetensors format (readable by torch, tinygrad, numpy)."""
    from safetensors.numpy import save_file
    save_file({k: np.array(t.numpy(), order="C") for k, t in state.items()}, str(path))   # keeps 0-d arrays 0-d


def safe_load(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Load a safetensors file into realized tensors, by name."""
    from safetensors.numpy import load_file
    return {k: Tensor(v, device=device) for k, v in load_file(str(path)).items()}


def _host_array(v: Any, name: str, path: str | Path) -> np.ndarray:
    """A torch tensor -> a NumPy array eqgrad holds: floats of any width as float32, integers as
    int32, bool as bool."""
    import torch
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"torch_load(): {path} is no flat state dict: {name!r} holds a {type(v).__name__}, not a tensor")
    v = v.detach().cpu()
    if v.is_floating_point():
        return v.to(torch.float32).numpy()
    return v.numpy() if v.dtype == torch.bool else v.to(torch.int32).numpy()


def torch_load(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Load a ``torch.save``d state dict (``.pt``/``.pth``/``.bin``) into realized tensors, by name.
    Reading it needs torch (``weights_only=True``: no code in the file runs); without torch,
    convert the file to safetensors where torch is installed
    (``safetensors.torch.save_file(sd, "model.safetensors")``) and use ``safe_load``."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"torch_load(): reading {path} (a torch pickle) needs torch, which is not installed; "
                          "convert it to .safetensors where torch is (safetensors.torch.save_file) and use safe_load") from e
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]                                       # a checkpoint wrapping it
    if not isinstance(sd, dict):
        raise TypeError(f"torch_load(): {path} holds a {type(sd).__name__}, not a state dict")
    return {k: Tensor(_host_array(v, k, path), device=device) for k, v in sd.items()}


def load(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Tensors by name from a weights file, by its suffix: ``.safetensors`` (``safe_load``),
    ``.gguf`` (``nn.gguf.gguf_load``: its own names, e.g. ``blk.0.attn_q.weight``, dequantized
    to float32; the metadata is dropped, call ``gguf_load`` for it), ``.pt``/``.pth``/``.bin``
    (``torch_load``)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".safetensors":
        return safe_load(path, device)
    if suffix == ".gguf":
        return gguf_load(path, device)[0]
    if suffix in (".pt", ".pth", ".bin"):
        return torch_load(path, device)
    raise ValueError(f"load(): unknown weights file suffix {suffix!r} of {path}; expected .safetensors, .gguf, .pt, .pth or .bin")
