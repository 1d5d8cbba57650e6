"""Grouped-query attention of Nemotron-H: no positional encoding, no biases, causal, torch SDPA.

    q = q_proj(u) (B, Hq, T, hd);  k, v = k_proj(u), v_proj(u) (B, Hkv, T, hd);  KV head j serves
    query heads j*r .. j*r + r-1 (r = Hq / Hkv);  softmax(q k^T / sqrt(hd) + mask) v;  o_proj.

The mask is built once per forward by the model (``causal_mask``) and shared by every attention layer
(``Positions.attn_mask``). ``step`` is the static-shape decode of one token per row at per-row positions
(``Positions.lengths`` / ``n_keys``): ``HybridLM.step``'s, which the decode engine captures.
``forward`` with ``Positions.rows`` prefills new tokens into rows of the engine's ``DecodeState``
(``HybridLM.extend``): each row's keys and values go to its own slots, and each row attends with
causal attention aligned to the end of its cache (a lower-right causal bias, so the fused SDPA kernels
read the cache in place: no mask is built and no cache row is copied). An FP8 cache (``KVCache.quantized``,
holotron/kv_cache.py) is written quantized on every path, and every path attends to the keys and values as
stored (the Triton kernels read codes and scales, the SDPA paths dequantize the slots they read), so a token's
key counts the same whether it came in this call or an earlier one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from .decode_ops import decode_attention, linear_residual, norm_linear
from .kernels.attn_chunk_triton import chunk_attention_reference, chunk_attention_triton
from .state import KVCache, Positions

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


def _lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Causal attention of the last q.shape[2] positions of k (a lower-right causal bias). The bias lets SDPA
    pick a fused kernel; if none takes it, an explicit boolean mask (the same attention) is used instead."""
    n, total = q.shape[2], k.shape[2]
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, total), enable_gqa=gqa)
    except RuntimeError:
        q_pos = torch.arange(total - n, total, device=q.device)[:, None]
        allowed = torch.arange(total, device=q.device)[None, :] <= q_pos
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)


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

    def new_state(self, batch_size: int, capacity: int, zero: bool = True, kv_dtype: torch.dtype | None = None
                  ) -> KVCache:
        """The layer's KV cache: in the weights' dtype, or FP8 with per-slot scales (``kv_dtype``
        torch.float8_e4m3fn, holotron/kv_cache.py)."""
        w = self.k_proj.weight
        shape = (batch_size, self.n_kv_heads, capacity, self.head_dim)
        return KVCache.allocate(shape, w.device, w.dtype, kv_dtype, zero)

    def forward(self, u: torch.Tensor, cache: KVCache | None = None, where: Positions | None = None) -> torch.Tensor:
        """u (B, T, D) -> (B, T, D). With ``cache``: writes slots [pos, pos+T) and attends to [0, pos+T).

        ``where.attn_mask``: from ``causal_mask`` (None = plain causal); ``where.pos``: the first position."""
        if where is not None and where.static:
            return self._forward_static(u, cache, where)
        if where is not None and where.rows is not None:
            return self._forward_rows(u, cache, where)
        pos, mask = (0, None) if where is None else (where.pos, where.attn_mask)
        b, t, _ = u.shape
        q = rearrange(self.q_proj(u), "b t (h d) -> b h t d", d=self.head_dim)  # (B, Hq, T, hd)
        k = rearrange(self.k_proj(u), "b t (h d) -> b h t d", d=self.head_dim)  # (B, Hkv, T, hd)
        v = rearrange(self.v_proj(u), "b t (h d) -> b h t d", d=self.head_dim)
        if cache is not None and cache.quantized:  # FP8: written quantized, attended as stored
            cache.write((slice(None), slice(None), slice(pos, pos + t)), k, v)
            k, v = cache.read((slice(None), slice(None), slice(0, pos + t)), q.dtype)
        elif cache is not None:
            cache.k[:, :, pos:pos + t] = k
            cache.v[:, :, pos:pos + t] = v
            k, v = cache.k[:, :, :pos + t], cache.v[:, :, :pos + t]
        if mask is None and t > 1 and k.shape[2] != t:  # standalone call with a filled cache
            mask = causal_mask(t, k.shape[2], None, u.device)
        causal = mask is None and t > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.n_heads != self.n_kv_heads)  # (B, Hq, T, hd)
        return self.o_proj(rearrange(y, "b h t d -> b t (h d)"))

    def _forward_rows(self, u: torch.Tensor, cache: KVCache, where: Positions) -> torch.Tensor:
        """u (b, T, D), right-padded; row i's first ``counts[i]`` tokens are new tokens of cache row
        ``rows[i]``, going to slots ``starts[i]`` on. One SDPA per row over its filled slots (GQA in the
        kernel); pad positions return zeros."""
        return self.o_proj(self._attend_rows(self.q_proj(u), self.k_proj(u), self.v_proj(u), cache, where))

    def _forward_static(self, u: torch.Tensor, cache: KVCache, where: Positions) -> torch.Tensor:
        """``_forward_rows`` with the rows, starts and counts on the device (``HybridLM.extend_static``)."""
        return self.o_proj(self._attend_static(self.q_proj(u), self.k_proj(u), self.v_proj(u), cache, where))

    def _attend_static(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, where: Positions
                       ) -> torch.Tensor:
        """``_forward_static`` between the projections: q (b, T, Hq*hd), k, v (b, T, Hkv*hd) -> (b, T, Hq*hd). The
        keys and values go to their slots by one indexed write (pads to the cache's last slot, past ``max_len``,
        which no row attends to), then one kernel attends every row to its cache
        (holotron/kernels/attn_chunk_triton.py; elsewhere the same attention row by row)."""
        b, t = q.shape[:2]
        hd = self.head_dim
        q = q.view(b, t, self.n_heads, hd)
        k = k.view(b, t, self.n_kv_heads, hd)
        v = v.view(b, t, self.n_kv_heads, hd)
        pos = torch.arange(t, device=q.device)[None, :]
        slots = torch.where(pos < where.counts_t[:, None], where.starts_t[:, None] + pos, cache.k.shape[2] - 1)
        rows = where.row_index[:, None].expand(b, t)
        if cache.quantized:
            cache.put(rows, slots, k, v)
        else:
            cache.k.transpose(1, 2).index_put_((rows, slots), k)   # (R, L, Hkv, hd)[rows, slots] = (b, t, Hkv, hd)
            cache.v.transpose(1, 2).index_put_((rows, slots), v)
        args = (q, cache.k, cache.v, where.row_index, where.starts_t, where.counts_t, cache.k_scale, cache.v_scale)
        y = chunk_attention_triton(*args) if q.is_cuda else chunk_attention_reference(*args)
        return y.reshape(b, t, self.n_heads * hd)

    def _attend_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, where: Positions
                     ) -> torch.Tensor:
        """``_forward_rows`` between the projections: q (b, T, Hq*hd), k, v (b, T, Hkv*hd) -> (b, T, Hq*hd)."""
        hd = self.head_dim
        q = rearrange(q, "b t (h d) -> b h t d", d=hd)
        k = rearrange(k, "b t (h d) -> b h t d", d=hd)
        v = rearrange(v, "b t (h d) -> b h t d", d=hd)
        y = q.new_zeros(q.shape)
        gqa = self.n_heads != self.n_kv_heads
        for i, (r, s0, n) in enumerate(zip(where.rows, where.starts, where.counts)):
            if n == 0:
                continue
            if cache.quantized:  # FP8: written quantized, the row's slots read back dequantized
                cache.write((r, slice(None), slice(s0, s0 + n)), k[i, :, :n], v[i, :, :n])
                kr, vr = cache.read((slice(r, r + 1), slice(None), slice(0, s0 + n)), q.dtype)
            else:
                cache.k[r, :, s0:s0 + n] = k[i, :, :n]
                cache.v[r, :, s0:s0 + n] = v[i, :, :n]
                kr, vr = cache.k[r:r + 1, :, :s0 + n], cache.v[r:r + 1, :, :s0 + n]
            qr = q[i:i + 1, :, :n]
            if s0 == 0 or n == 1:  # plain causal over the row's own tokens, or one query that sees all
                out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=n > 1, enable_gqa=gqa)
            else:
                out = _lower_right(qr, kr, vr, gqa)
            y[i, :, :n] = out[0]
        return rearrange(y, "b h t d -> b t (h d)")

    def _attend_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, where: Positions
                     ) -> torch.Tensor:
        """``step`` between the projections: one token per row, q (b, Hq*hd), k, v (b, Hkv*hd) -> (b, Hq*hd);
        the cache's first b rows are the step's rows."""
        b = q.shape[0]
        hkv, hd = self.n_kv_heads, self.head_dim
        slot = where.lengths.view(b, 1, 1, 1).expand(b, hkv, 1, hd)
        ck, cv = cache.k[:b], cache.v[:b]
        if cache.quantized:  # FP8: codes and scales written, the attention reads both
            cache.put_step(slot, k.reshape(b, hkv, 1, hd), v.reshape(b, hkv, 1, hd))
            y = decode_attention(q.reshape(b, hkv, self.n_heads // hkv, hd), ck, cv, where.n_keys,
                                 cache.k_scale[:b], cache.v_scale[:b])
            return y.reshape(b, self.n_heads * hd)
        ck.scatter_(2, slot, k.reshape(b, hkv, 1, hd))
        cv.scatter_(2, slot, v.reshape(b, hkv, 1, hd))
        y = decode_attention(q.reshape(b, hkv, self.n_heads // hkv, hd), ck, cv, where.n_keys)  # (b, Hkv, r, hd)
        return y.reshape(b, self.n_heads * hd)

    def mixed(self, u: torch.Tensor, cache: KVCache, where: Positions, n: int) -> torch.Tensor:
        """``HybridLM.mixed``: u (n + b*T, D) normed, one decode token of each of rows [0, n) then a right-padded
        chunk (b, T) of rows ``where.row_index`` (positions on the device); the projections once over all of it,
        attention per part: the decode tokens as ``step``, the chunk as ``_forward_static``."""
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)
        b = where.row_index.shape[0]
        parts = [self._attend_step(q[:n], k[:n], v[:n], cache, where)] if n else []
        parts.append(self._attend_static(q[n:].view(b, -1, q.shape[-1]), k[n:].view(b, -1, k.shape[-1]),
                                         v[n:].view(b, -1, v.shape[-1]), cache, where).reshape(-1, q.shape[-1]))
        return self.o_proj(torch.cat(parts) if len(parts) > 1 else parts[0])

    def step(self, u: torch.Tensor, cache: KVCache, where: Positions, norm: nn.Module | None = None) -> torch.Tensor:
        """One token per row, every shape static (CUDA-graph safe, no host sync).

        u (B, 1, D); cache k, v (B, Hkv, L, hd); ``where.lengths`` (B,) int64: row b's new key and value
        go to slot ``lengths[b]``; ``where.n_keys`` (B,): row b attends to slots [0, n_keys[b]) (its filled
        slots and the new one). The r = Hq / Hkv query
        heads of KV head j attend as r queries of one head, so the cache is read once, without a GQA
        expansion. (``HybridLM.step`` points rows that are not decoding at a spare slot that no row
        attends to.) Without ``norm`` the layer's output; with the block's ``norm``, u is the residual
        stream and ``u + attention(norm(u))`` is returned (norm and residual fused into the projections,
        holotron/decode_ops.py).
        """
        b = u.shape[0]
        q = norm_linear(u, norm, self.q_proj)
        k = norm_linear(u, norm, self.k_proj)
        v = norm_linear(u, norm, self.v_proj)
        y = self._attend_step(q.view(b, -1), k.view(b, -1), v.view(b, -1), cache, where)
        return linear_residual(y.view(b, 1, -1), self.o_proj, None if norm is None else u)
