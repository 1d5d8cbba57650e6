"""One block of keys of online-softmax attention, the step both attention kernels repeat: the chunk's
(``attn_chunk_triton.py``) over each row's cache and the decode step's (``attn_decode_triton.py``) over a
chunk of slots.

For queries q (M, HD_PAD) and the keys / values at slots ``ns`` (N,) of ``kbase`` / ``vbase`` (row strides
``s_kl`` / ``s_vl``, columns ``ds`` with ``md`` the real ones), with ``live`` (N,) the slots that may be read and
``keep`` (M, N) the scores that count: the running max ``m_i``, sum ``l_i`` and unnormalised output ``acc``
(fp32) after the block. Scores in fp32 times ``scale``; bf16 / fp16 operands into fp32 accumulators, fp32
inputs (F32) as IEEE fp32 products. A query whose every score so far is masked keeps max -inf and sum 0
(the caller divides by a sum of 0 as by 1).

FP8 caches (``QUANT``; holotron/kv_cache.py): the keys and values are e4m3 codes, with one fp32 scale per slot
at ``ksbase`` / ``vsbase`` + slot * ``s_sl``. The key codes go into the product as they are (widened to q's
dtype, exact: every e4m3 value is a bf16 / fp16 one) and each column of scores is multiplied by its slot's key
scale in fp32 afterwards (the same scores, without rounding the dequantized keys); the value codes are widened
to fp32, multiplied by their scales and rounded to q's dtype (fp32 with F32) as the product's operand.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_block(q, kbase, vbase, ksbase, vsbase, ns, live, keep, ds, md, s_kl, s_vl, s_sl, scale, m_i, l_i,
                         acc, F32: tl.constexpr, QUANT: tl.constexpr):
    k = tl.load(kbase + ns[:, None] * s_kl + ds[None, :], mask=live[:, None] & md[None, :], other=0.0)
    if QUANT:
        if F32:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype))).to(tl.float32)
        s = s * tl.load(ksbase + ns * s_sl, mask=live, other=0.0)[None, :] * scale
    elif F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale                      # (M, N)
    s = tl.where(keep, s.to(tl.float32), float("-inf"))  # fp32 even where torch.compile passes scale as fp64
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no score yet: exp(-inf) stays 0, no NaN
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(vbase + ns[:, None] * s_vl + ds[None, :], mask=live[:, None] & md[None, :], other=0.0)
    if QUANT:
        v = v.to(tl.float32) * tl.load(vsbase + ns * s_sl, mask=live, other=0.0)[:, None]
        if F32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype)).to(tl.float32)
    elif F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc * alpha[:, None] + pv
