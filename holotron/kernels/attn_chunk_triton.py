"""Attention of a chunk of new tokens per row against that row's KV cache, as one Triton kernel: the prefill
of new turns into rows of the decode engine's ``DecodeState`` with every row's position given on the device
(``Attention`` in holotron/attention.py, when ``Positions.static``), so the chunk can be captured in a CUDA
graph whatever the rows' lengths.

    q (b, T, Hq, hd)            the chunk's queries, row i's first counts[i] positions real (right-padded)
    k, v (R, Hkv, L, hd)        the cache, the chunk's own keys and values already written at slots
                                starts[i] .. starts[i] + counts[i] - 1 of cache row rows[i]
    rows, starts, counts (b,)   int64 on the device                           ->  o (b, T, Hq, hd) in q's dtype

Query t of row i (t < counts[i]) attends to slots [0, starts[i] + t] of cache row rows[i] (causal, aligned
to the end of the row's cache); pads (t >= counts[i]) give zeros. Query head h reads KV head h // (Hq / Hkv).
One program per (block of BLOCK_M queries, row, query head): the keys in blocks of BLOCK_N, online softmax
in fp32 (``attn_block_triton.py``), bf16 / fp16 operands into fp32 accumulators (fp32 inputs: IEEE fp32
products). Scale 1 / sqrt(hd), as ``F.scaled_dot_product_attention``. No host sync. FP8 caches (``k_scale``,
``v_scale`` (R, Hkv, L) fp32 beside the e4m3 codes, holotron/kv_cache.py) are read as stored, codes and scales
into the block's products.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..kv_cache import dequantize_kv
from .attn_block_triton import online_softmax_block

# launch settings: queries and keys per block, warps (None: 4 for head dims up to 64, else 8), pipeline stages.
# dev/probes/attn_chunk_sweep.py times others at the engine's chunk shapes; at 40 query heads, 8 KV heads, head dim
# 128 and a bf16 cache (H100, 2026-12-06) 4 warps and 3 stages took 39-44% less time than 8 warps and 2 stages:
# 97.7 / 95.2 / 524 us against 170.5 / 168.8 / 856 at 2 x 320 and 4 x 160 tokens after 1,800, and 1 x 4,096
CHUNK_ATTN_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


@triton.jit
def _chunk_attn(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, o_ptr, rows_ptr, starts_ptr, counts_ptr, T, GROUP, HD, scale,
                s_qb, s_qt, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_sb, s_sh, s_sl, s_ob, s_ot, s_oh,
                HD_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F32: tl.constexpr,
                QUANT: tl.constexpr):
    mb = tl.program_id(0)
    i = tl.program_id(1)
    h = tl.program_id(2)
    cnt = tl.load(counts_ptr + i).to(tl.int32)
    start = tl.load(starts_ptr + i).to(tl.int32)
    row = tl.load(rows_ptr + i).to(tl.int64)
    ts = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = tl.arange(0, HD_PAD)
    md = ds < HD
    mt = ts < cnt
    obase = o_ptr + i.to(tl.int64) * s_ob + h * s_oh
    if mb * BLOCK_M >= cnt:  # pads only: zeros
        tl.store(obase + ts[:, None] * s_ot + ds[None, :], tl.zeros((BLOCK_M, HD_PAD), dtype=o_ptr.dtype.element_ty),
                 mask=(ts < T)[:, None] & md[None, :])
        return
    q = tl.load(q_ptr + i.to(tl.int64) * s_qb + h * s_qh + ts[:, None] * s_qt + ds[None, :],
                mask=mt[:, None] & md[None, :], other=0.0)
    hk = h // GROUP
    kbase = k_ptr + row * s_kb + hk * s_kh
    vbase = v_ptr + row * s_vb + hk * s_vh
    ksbase = ks_ptr + row * s_sb + hk * s_sh   # FP8 caches: the slots' scales (else unused)
    vsbase = vs_ptr + row * s_sb + hk * s_sh
    pos = start + ts                                   # each query's own slot
    end = start + tl.minimum(mb * BLOCK_M + BLOCK_M, cnt)  # keys this block needs: [0, end)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HD_PAD), dtype=tl.float32)
    for n0 in range(0, end, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        mn = ns < end
        m_i, l_i, acc = online_softmax_block(q, kbase, vbase, ksbase, vsbase, ns, mn,
                                             mn[None, :] & (ns[None, :] <= pos[:, None]), ds, md, s_kl, s_vl, s_sl,
                                             scale, m_i, l_i, acc, F32, QUANT)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out = tl.where(mt[:, None], out, 0.0)
    tl.store(obase + ts[:, None] * s_ot + ds[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(ts < T)[:, None] & md[None, :])


def chunk_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                           starts: torch.Tensor, counts: torch.Tensor, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring. q (b, T, Hq, hd) with unit stride in hd; k, v (R, Hkv, L, hd)."""
    b, t, hq, hd = q.shape
    hkv = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("chunk_attention: q, k and v need unit stride in the head dimension")
    quant = k_scale is not None
    if quant and k_scale.stride() != v_scale.stride():
        raise ValueError("chunk_attention: k_scale and v_scale need the same strides")
    ks, vs = (k_scale, v_scale) if quant else (k, v)   # (unused without FP8)
    o = torch.empty_like(q)
    hd_pad = max(16, triton.next_power_of_2(hd))
    f32 = q.dtype == torch.float32
    cfg = CHUNK_ATTN_CONFIG
    bm, bn = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"])
    warps = cfg["num_warps"] or (4 if hd_pad <= 64 else 8)
    grid = (triton.cdiv(t, bm), b, hq)
    _chunk_attn[grid](q, k, v, ks, vs, o, rows, starts, counts, t, hq // hkv, hd, 1.0 / math.sqrt(hd),
                      q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                      v.stride(0), v.stride(1), v.stride(2), ks.stride(0), ks.stride(1), ks.stride(2),
                      o.stride(0), o.stride(1), o.stride(2),
                      HD_PAD=hd_pad, BLOCK_M=bm, BLOCK_N=bn, F32=f32, QUANT=quant,
                      num_warps=warps, num_stages=int(cfg["num_stages"]))
    return o


def chunk_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                              starts: torch.Tensor, counts: torch.Tensor, k_scale: torch.Tensor | None = None,
                              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The same attention with torch ops, one row at a time (reads the positions back to the host). FP8 caches:
    each row's slots [0, starts + counts) dequantized to q's dtype as they are read."""
    b, t, hq, hd = q.shape
    hkv = k.shape[1]
    o = torch.zeros_like(q)
    for i, (r, s0, n) in enumerate(zip(rows.tolist(), starts.tolist(), counts.tolist())):
        if n <= 0:
            continue
        qi = q[i, :n].transpose(0, 1)                                  # (Hq, n, hd)
        ki, vi = k[r, :, :s0 + n], v[r, :, :s0 + n]
        if k_scale is not None:
            ki = dequantize_kv(ki, k_scale[r, :, :s0 + n], q.dtype)
            vi = dequantize_kv(vi, v_scale[r, :, :s0 + n], q.dtype)
        ki = ki.repeat_interleave(hq // hkv, dim=0)                     # (Hq, s0 + n, hd)
        vi = vi.repeat_interleave(hq // hkv, dim=0)
        allowed = torch.arange(s0 + n, device=q.device)[None, :] <= (s0 + torch.arange(n, device=q.device))[:, None]
        o[i, :n] = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=allowed).transpose(0, 1)
    return o
