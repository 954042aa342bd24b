"""nn/gguf.py's dequantization against gguf's own (gguf.quants.dequantize) and against hand-built
blocks of known values; GGUF files written with gguf.GGUFWriter read back; nn.state.load by suffix
(safetensors, GGUF, torch .pt)."""
from __future__ import annotations

import numpy as np
import pytest

from eqgrad import Tensor, nn
from eqgrad.errors import DTypeError, ShapeError
from eqgrad.nn.gguf import DEQUANTIZERS, dequantize, gguf_load

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]


def test_every_type_has_a_dequantizer():
    assert sorted(DEQUANTIZERS) == sorted(TYPES)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_matches_gguf(type_name):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize as ref_dequantize, quantize
    x = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32) * 3
    qtype = gguf.GGMLQuantizationType[type_name]
    raw = x if type_name == "F32" else quantize(x, qtype)
    np.testing.assert_array_equal(dequantize(raw, type_name, x.shape), ref_dequantize(raw, qtype).astype(np.float32))


def _f16(v: float) -> bytes:
    return np.float16(v).tobytes()


def test_q8_0_block_known_values():
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.frombuffer(_f16(0.5) + q.tobytes(), np.uint8)
    np.testing.assert_array_equal(dequantize(block, "Q8_0", (32,)), 0.5 * q)


def test_q4_blocks_known_values():
    """Byte j holds element j in its low nibble and element j + 16 in its high one."""
    lo, hi = np.arange(16, dtype=np.uint8), np.full(16, 15, np.uint8)
    qs = (lo | (hi << 4)).astype(np.uint8).tobytes()
    nib = np.concatenate([lo, hi]).astype(np.float32)
    np.testing.assert_array_equal(dequantize(np.frombuffer(_f16(2.0) + qs, np.uint8), "Q4_0", (32,)), 2.0 * (nib - 8))
    np.testing.assert_array_equal(dequantize(np.frombuffer(_f16(0.25) + _f16(-1.0) + qs, np.uint8), "Q4_1", (32,)),
                                  0.25 * nib - 1.0)


def test_bf16_known_values():
    x = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    raw = (x.view(np.uint32) >> 16).astype(np.uint16)               # bf16 is float32's top half
    np.testing.assert_array_equal(dequantize(raw, "BF16", (4,)), x)


def test_unknown_type_and_wrong_sizes_are_named():
    with pytest.raises(DTypeError, match="blk.0.ffn_down.weight has tensor type Q6_K.*Q8_0"):
        dequantize(np.zeros(210, np.uint8), "Q6_K", (256,), "blk.0.ffn_down.weight")
    with pytest.raises(ShapeError, match="not a multiple of its block of 32"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (30,))
    with pytest.raises(ShapeError, match="needs 68 bytes, has 34"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (64,))


def test_gguf_file_round_trip(tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize as ref_dequantize, quantize
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_block_count(3)
    writer.add_tensor("f32", w)
    writer.add_tensor("f16", w.astype(np.float16))
    writer.add_tensor("q4_1", quantize(w, gguf.GGMLQuantizationType.Q4_1), raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors, meta = gguf_load(tmp_path / "m.gguf")
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 3
    assert all(t.shape == (4, 64) for t in tensors.values())
    np.testing.assert_array_equal(tensors["f32"].numpy(), w)
    np.testing.assert_array_equal(tensors["f16"].numpy(), w.astype(np.float16).astype(np.float32))
    ref = ref_dequantize(quantize(w, gguf.GGMLQuantizationType.Q4_1), gguf.GGMLQuantizationType.Q4_1)
    np.testing.assert_array_equal(tensors["q4_1"].numpy(), ref)
    assert sorted(nn.state.load(tmp_path / "m.gguf")) == ["f16", "f32", "q4_1"]


def test_load_by_suffix(tmp_path):
    torch = pytest.importorskip("torch")
    model = nn.Linear(3, 2)
    sd = {"weight": torch.randn(2, 3, dtype=torch.bfloat16), "bias": torch.randn(2, dtype=torch.float64),
          "steps": torch.tensor(7, dtype=torch.int64)}
    torch.save(sd, tmp_path / "w.pt")
    loaded = nn.state.load(tmp_path / "w.pt")
    assert loaded["weight"].dtype.name == "float32" and loaded["steps"].dtype.name == "int32"
    np.testing.assert_array_equal(loaded["weight"].numpy(), sd["weight"].float().numpy())
    assert loaded["steps"].item() == 7
    model.load_state_dict({k: v for k, v in loaded.items() if k != "steps"})
    nn.state.safe_save(model.state_dict(), tmp_path / "w.safetensors")
    np.testing.assert_array_equal(nn.state.load(tmp_path / "w.safetensors")["bias"].numpy(), model.bias.numpy())
    torch.save([1, 2], tmp_path / "bad.pt")
    with pytest.raises(TypeError, match="not a state dict"):
        nn.state.load(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="unknown weights file suffix '.npz'"):
        nn.state.load(tmp_path / "w.npz")
