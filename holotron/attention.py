"""Grouped-query attention of Nemotron-H: no positional encoding, no biases, causal, torch SDPA.

    q = q_proj(u) (B, Hq, T, hd);  k, v = k_proj(u), v_proj(u) (B, Hkv, T, hd);  KV head j serves
    query heads j*r .. j*r + r-1 (r = Hq / Hkv);  softmax(q k^T / sqrt(hd) + mask) v;  o_proj.

The mask is built once per forward by the model (``causal_mask``) and shared by every attention layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .state import KVCache

__all__ = ["Attention", "causal_mask"]


def causal_mask(t: int, total: int, key_valid: torch.Tensor | None, device) -> torch.Tensor | None:
    """Boolean mask (B or 1, 1, t, total), True = may attend, for the last ``t`` of ``total`` positions.

    ``key_valid`` (B, total) bool marks real tokens; None means all are real. Returns None when plain
    causal attention over t == total positions (SDPA's ``is_causal``) or one query without pads suffices.
    A pad query attends to itself only, which keeps its softmax finite; real tokens never read it.
    """
    if key_valid is None and (t == total or t == 1):
        return None
    q_pos = torch.arange(total - t, total, device=device)[:, None]  # (t, 1)
    k_pos = torch.arange(total, device=device)[None, :]              # (1, total)
    allowed = k_pos <= q_pos                                          # (t, total)
    if key_valid is None:
        return allowed[None, None]
    allowed = (allowed[None] & key_valid[:, None, :].to(device)) | (k_pos == q_pos)[None]  # (B, t, total)
    return allowed[:, None]


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"Attention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def new_state(self, batch_size: int, capacity: int) -> KVCache:
        w = self.k_proj.weight
        shape = (batch_size, self.n_kv_heads, capacity, self.head_dim)
        return KVCache(k=torch.zeros(shape, device=w.device, dtype=w.dtype),
                       v=torch.zeros(shape, device=w.device, dtype=w.dtype))

    def forward(self, u: torch.Tensor, cache: KVCache | None = None, pos: int = 0,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """u (B, T, D) -> (B, T, D). With ``cache``: writes slots [pos, pos+T) and attends to [0, pos+T).

        ``mask``: from ``causal_mask`` (None = plain causal)."""
        b, t, _ = u.shape
        q = self.q_proj(u).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)     # (B, Hq, T, hd)
        k = self.k_proj(u).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(u).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            cache.k[:, :, pos:pos + t] = k
            cache.v[:, :, pos:pos + t] = v
            k, v = cache.k[:, :, :pos + t], cache.v[:, :, :pos + t]
        if mask is None and t > 1 and k.shape[2] != t:  # standalone call with a filled cache
            mask = causal_mask(t, k.shape[2], None, u.device)
        causal = mask is None and t > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.n_heads != self.n_kv_heads)  # (B, Hq, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
