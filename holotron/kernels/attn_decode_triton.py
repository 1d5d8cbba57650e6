"""Attention of one new token per row against its KV cache, as two Triton kernels (split over the keys, then
combined): the decode step's attention (``Attention.step``, holotron/attention.py, through
holotron/decode_ops.py's ``decode_attention``).

    q (b, Hkv, r, hd): the r = Hq / Hkv query heads of each KV head;  k, v (b, Hkv, L, hd), any row stride
    n_keys (b,) int: row i attends to slots [0, n_keys[i])              ->  y (b, Hkv, r, hd) in q's dtype

Pass 1, one program per (row, KV head, chunk of CHUNK slots): the r queries (padded to 16 rows for
``tl.dot``; bf16 / fp16 operands, fp32 accumulation) against the chunk's keys in blocks of BLOCK_L, online
softmax in fp32 (``attn_block_triton.py``), partial output, running max and sum stored in fp32. Chunks at or
past n_keys only store an empty partial, so the keys read are the filled slots, not the cache's capacity.
Pass 2, one program per (row, KV head): the partials rescaled to the largest max and summed. Scale
1 / sqrt(hd), as ``F.scaled_dot_product_attention``. No host sync (CUDA-graph safe). An FP8 cache (e4m3 codes
and a scale per slot, holotron/kv_cache.py) is read as it is stored: codes and scales go into the block's
products (``attn_block_triton.py``), nothing is dequantized beforehand."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attn_block_triton import online_softmax_block

CHUNK, BLOCK_L = 256, 64


@triton.jit
def _attn_chunk(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, n_ptr, o_ptr, ml_ptr, R, HD, S, scale,
                s_qb, s_qh, s_qr, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_sb, s_sh, s_sl,
                R_PAD: tl.constexpr, HD_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_L: tl.constexpr,
                F32: tl.constexpr, QUANT: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.program_id(2)
    rs = tl.arange(0, R_PAD)
    ds = tl.arange(0, HD_PAD)
    md = ds < HD
    n = tl.load(n_ptr + b).to(tl.int32)
    q = tl.load(q_ptr + b * s_qb + h * s_qh + rs[:, None] * s_qr + ds[None, :],
                mask=(rs < R)[:, None] & md[None, :], other=0.0)
    m_i = tl.full((R_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((R_PAD,), dtype=tl.float32)
    acc = tl.zeros((R_PAD, HD_PAD), dtype=tl.float32)
    kbase = k_ptr + b.to(tl.int64) * s_kb + h * s_kh
    vbase = v_ptr + b.to(tl.int64) * s_vb + h * s_vh
    ksbase = ks_ptr + b.to(tl.int64) * s_sb + h * s_sh   # FP8 caches: the slots' scales (else unused)
    vsbase = vs_ptr + b.to(tl.int64) * s_sb + h * s_sh
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, n)
    for l0 in range(start, end, BLOCK_L):
        ls = l0 + tl.arange(0, BLOCK_L)
        ml = ls < end
        m_i, l_i, acc = online_softmax_block(q, kbase, vbase, ksbase, vsbase, ls, ml, ml[None, :], ds, md, s_kl,
                                             s_vl, s_sl, scale, m_i, l_i, acc, F32, QUANT)
    part = ((b * tl.num_programs(1) + h) * S + c)
    tl.store(o_ptr + part * R_PAD * HD_PAD + rs[:, None] * HD_PAD + ds[None, :], acc)
    tl.store(ml_ptr + part * 2 * R_PAD + rs, m_i)
    tl.store(ml_ptr + part * 2 * R_PAD + R_PAD + rs, l_i)


@triton.jit
def _attn_combine(o_ptr, ml_ptr, y_ptr, R, HD, S, s_yb, s_yh, s_yr,
                  R_PAD: tl.constexpr, HD_PAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    rs = tl.arange(0, R_PAD)
    ds = tl.arange(0, HD_PAD)
    base = (b * tl.num_programs(1) + h) * S
    m = tl.full((R_PAD,), float("-inf"), dtype=tl.float32)
    for c in range(S):
        m = tl.maximum(m, tl.load(ml_ptr + (base + c) * 2 * R_PAD + rs))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    num = tl.zeros((R_PAD, HD_PAD), dtype=tl.float32)
    den = tl.zeros((R_PAD,), dtype=tl.float32)
    for c in range(S):
        mc = tl.load(ml_ptr + (base + c) * 2 * R_PAD + rs)
        w = tl.where(mc == float("-inf"), 0.0, tl.exp(mc - m_safe))
        den += w * tl.load(ml_ptr + (base + c) * 2 * R_PAD + R_PAD + rs)
        num += w[:, None] * tl.load(o_ptr + (base + c) * R_PAD * HD_PAD + rs[:, None] * HD_PAD + ds[None, :])
    out = num / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(y_ptr + b * s_yb + h * s_yh + rs[:, None] * s_yr + ds[None, :], out.to(y_ptr.dtype.element_ty),
             mask=(rs < R)[:, None] & (ds < HD)[None, :])


def attn_decode_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                       k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, Hkv, r, hd), k / v (b, Hkv, L, hd) with unit-stride hd, n_keys (b,) -> y (b, Hkv, r, hd). FP8
    caches: k / v float8_e4m3fn codes and ``k_scale`` / ``v_scale`` (b, Hkv, L) fp32 of the same strides
    (holotron/kv_cache.py)."""
    b, hkv, r, hd = q.shape
    quant = k_scale is not None
    if quant and k_scale.stride() != v_scale.stride():
        raise ValueError("attn_decode: k_scale and v_scale need the same strides")
    ks, vs = (k_scale, v_scale) if quant else (k, v)   # (unused without FP8)
    L = k.shape[2]
    q = q if q.stride(-1) == 1 else q.contiguous()
    S = triton.cdiv(L, CHUNK)
    r_pad, hd_pad = max(16, triton.next_power_of_2(r)), max(16, triton.next_power_of_2(hd))
    o = torch.empty(b, hkv, S, r_pad, hd_pad, device=q.device, dtype=torch.float32)
    ml = torch.empty(b, hkv, S, 2, r_pad, device=q.device, dtype=torch.float32)
    y = torch.empty_like(q)
    _attn_chunk[(b, hkv, S)](q, k, v, ks, vs, n_keys, o, ml, r, hd, S, hd ** -0.5,
                             q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                             v.stride(0), v.stride(1), v.stride(2), ks.stride(0), ks.stride(1), ks.stride(2),
                             R_PAD=r_pad, HD_PAD=hd_pad, CHUNK=CHUNK, BLOCK_L=BLOCK_L, num_warps=4, QUANT=quant,
                             # fp32 operands in IEEE precision for fp32 inputs, and for bf16 / fp16 ones in Triton's
                             # CPU interpreter, whose 16-bit tl.dot is wrong (holotron/kernels/gemv_triton.py)
                             F32=q.dtype == torch.float32 or q.device.type != "cuda")
    _attn_combine[(b, hkv)](o, ml, y, r, hd, S, y.stride(0), y.stride(1), y.stride(2),
                            R_PAD=r_pad, HD_PAD=hd_pad, num_warps=4)
    return y
