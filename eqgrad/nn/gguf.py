"""GGUF files (llama.cpp's format): metadata and tensors, dequantized to float32 on load.

The file is read with the ``gguf`` package (llama.cpp's own reader, ``pip install 'eqgrad[llama]'``):
it parses the header, the metadata and the tensor table and memory-maps the data. Dequantization
is here, in NumPy, one vectorized expression per type over all blocks at once:

    F32, F16, BF16           plain floats
    Q8_0   blocks of 32: f16 d, 32 x int8 q            x = d * q
    Q4_0   blocks of 32: f16 d, 16 bytes of nibbles     x = d * (q - 8)
    Q4_1   blocks of 32: f16 d, f16 m, 16 bytes         x = d * q + m

(a Q4 block's byte j holds element j in its low nibble and element j + 16 in its high one).
Any other type is a ``DTypeError`` naming it. tests/test_gguf.py checks each against
``gguf.quants.dequantize``.

    tensors, meta = gguf_load("model.gguf")        # {name: Tensor}, {key: value}
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from eqgrad.errors import DTypeError, ShapeError
from eqgrad.frontend.tensor import Tensor

BLOCK = 32                       # elements per block of every quantized type handled here


def _halves(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian float16 at byte ``at`` of each block, as a (n, 1) float32 column."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) values 0..15: the low nibbles are elements 0-15, the high 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _halves(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _halves(b, 0) * (_nibbles(b[:, 2:]) - 8.0)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _halves(b, 0) * _nibbles(b[:, 4:]) + _halves(b, 2)


# type name -> (bytes per block, elements per block, bytes (n_blocks, bytes) -> float32 (n_blocks, elements))
DEQUANTIZERS: dict[str, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    "F32": (4, 1, lambda b: b.copy().view(np.float32)),
    "F16": (2, 1, lambda b: b.copy().view(np.float16).astype(np.float32)),
    "BF16": (2, 1, lambda b: (b.copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)),
    "Q8_0": (2 + BLOCK, BLOCK, _q8_0),
    "Q4_0": (2 + BLOCK // 2, BLOCK, _q4_0),
    "Q4_1": (4 + BLOCK // 2, BLOCK, _q4_1),
}


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...], name: str = "tensor") -> np.ndarray:
    """The raw bytes of one GGUF tensor of ``type_name`` -> a float32 array of ``shape`` (NumPy
    order: the last axis is GGUF's first, the contiguous one)."""
    if type_name not in DEQUANTIZERS:
        raise DTypeError(f"gguf: {name} has tensor type {type_name}; eqgrad dequantizes "
                         f"{', '.join(DEQUANTIZERS)} (requantize the file, e.g. llama.cpp's llama-quantize)")
    nbytes, per_block, fn = DEQUANTIZERS[type_name]
    n = int(np.prod(shape, dtype=np.int64))
    if n % per_block:
        raise ShapeError(f"gguf: {name} ({type_name}) has {n} elements, not a multiple of its block of {per_block}")
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if b.size != n // per_block * nbytes:
        raise ShapeError(f"gguf: {name} ({type_name}, shape {shape}) needs {n // per_block * nbytes} bytes, has {b.size}")
    return fn(b.reshape(n // per_block, nbytes)).reshape(shape)


def gguf_read(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every tensor of a GGUF file as a float32 NumPy array (by its GGUF name, e.g.
    ``blk.0.attn_q.weight``) and the metadata (``llama.block_count``, ``tokenizer.ggml.tokens``,
    ...) as Python values."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'eqgrad[llama]' (or pip install gguf)") from e
    reader = GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arrays = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))      # GGUF lists the contiguous axis first
        arrays[t.name] = dequantize(t.data, t.tensor_type.name, shape, t.name)
    return arrays, meta


def gguf_load(path: str | Path, device: str | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``gguf_read`` into realized float32 tensors."""
    arrays, meta = gguf_read(path)
    return {k: Tensor(v, device=device) for k, v in arrays.items()}, meta


__all__ = ["DEQUANTIZERS", "dequantize", "gguf_read", "gguf_load"]
