"""Multi-head attention, as torch.nn.MultiheadAttention (same parameter names and layout, so a
torch state dict loads).

    >>> from eqgrad import Tensor, nn
    >>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
    >>> out, w = mha(Tensor.ones(3, 5, 8), Tensor.ones(3, 4, 8), Tensor.ones(3, 4, 8))
    >>> out.shape, w.shape
    ((3, 5, 8), (3, 5, 4))
"""
from __future__ import annotations

import numpy as np

from eqgrad.errors import ShapeError
from eqgrad.frontend.tensor import Tensor
from eqgrad.nn import init
from eqgrad.nn.module import Linear, Module
from eqgrad.nn import functional as F


class MultiheadAttention(Module):
    """Attention over ``num_heads`` heads of ``embed_dim // num_heads``: q, k, v projected (one
    packed ``in_proj_weight`` when kdim == vdim == embed_dim, else ``q/k/v_proj_weight``),
    attended per head, concatenated and projected by ``out_proj``. ``forward`` returns (output,
    weights averaged over heads, or per head, or None)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False):
        if embed_dim % num_heads:
            raise ShapeError(f"MultiheadAttention: num_heads={num_heads} must divide embed_dim={embed_dim}")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim = embed_dim // num_heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = init.xavier_uniform_(Tensor(np.zeros((3 * embed_dim, embed_dim), np.float32), requires_grad=True))
        else:
            self.q_proj_weight = init.xavier_uniform_(Tensor(np.zeros((embed_dim, embed_dim), np.float32), requires_grad=True))
            self.k_proj_weight = init.xavier_uniform_(Tensor(np.zeros((embed_dim, self.kdim), np.float32), requires_grad=True))
            self.v_proj_weight = init.xavier_uniform_(Tensor(np.zeros((embed_dim, self.vdim), np.float32), requires_grad=True))
        self.in_proj_bias = Tensor(np.zeros(3 * embed_dim, np.float32), requires_grad=True) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _weights(self) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            return w[:e], w[e:2 * e], w[2 * e:]
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, N, E = query.shape
        S = key.shape[0]
        h, d = self.num_heads, self.head_dim
        wq, wk, wv = self._weights()
        b = self.in_proj_bias
        bq, bk, bv = (b[:E], b[E:2 * E], b[2 * E:]) if b is not None else (None, None, None)
        # (L, N, E) -> (N, h, L, d)
        q = F.linear(query, wq, bq).reshape(L, N, h, d).permute(1, 2, 0, 3)
        k = F.linear(key, wk, bk).reshape(S, N, h, d).permute(1, 2, 0, 3)
        v = F.linear(value, wv, bv).reshape(S, N, h, d).permute(1, 2, 0, 3)
        mask = None                                        # additive, broadcast to (N, h, L, S)
        if attn_mask is not None:
            # NOTE: here (as torch's module) a bool mask marks what is masked out, unlike sdpa's
            m = attn_mask.where(float("-inf"), 0.0) if attn_mask.dtype.name == "bool" else attn_mask
            mask = m.reshape(N, h, L, S) if m.ndim == 3 else m
        elif is_causal:
            mask = (Tensor.arange(L, device=query.device).reshape(L, 1) < Tensor.arange(S, device=query.device)).where(float("-inf"), 0.0)
        if key_padding_mask is not None:
            kp = key_padding_mask.where(float("-inf"), 0.0) if key_padding_mask.dtype.name == "bool" else key_padding_mask
            kp = kp.reshape(N, 1, 1, S)
            mask = kp if mask is None else mask + kp
        scores = (q @ k.transpose(-2, -1)) * (1.0 / float(np.sqrt(d)))
        if mask is not None:
            scores = scores + mask
        weights = scores.softmax(-1)
        attended = F.dropout(weights, self.dropout, self.training) @ v            # (N, h, L, d)
        out = self.out_proj(attended.permute(2, 0, 1, 3).reshape(L, N, E))
        if unbatched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        w = weights.mean(1) if average_attn_weights else weights
        return out, (w.squeeze(0) if unbatched else w)


__all__ = ["MultiheadAttention"]
