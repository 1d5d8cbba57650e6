"""One block of keys of online-softmax attention, the step both attention kernels repeat: the chunk's
(``attn_chunk_triton.py``) over each row's cache and the decode step's (``attn_decode_triton.py``) over a
chunk of slots.

For queries q (M, HD_PAD) and the keys / values at slots ``ns`` (N,) of ``kbase`` / ``vbase`` (row strides
``s_kl`` / ``s_vl``, columns ``ds`` with ``md`` the real ones), with ``live`` (N,) the slots that may be read and
``keep`` (M, N) the scores that count: the running max ``m_i``, sum ``l_i`` and unnormalised output ``acc``
(fp32) after the block. Scores in fp32 times ``scale``; bf16 / fp16 operands into fp32 accumulators, fp32
inputs (F32) as IEEE fp32 products. A query whose every score so far is masked keeps max -inf and sum 0
(the caller divides by a sum of 0 as by 1).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_block(q, kbase, vbase, ns, live, keep, ds, md, s_kl, s_vl, scale, m_i, l_i, acc,
                         F32: tl.constexpr):
    k = tl.load(kbase + ns[:, None] * s_kl + ds[None, :], mask=live[:, None] & md[None, :], other=0.0)
    if F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale                      # (M, N)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no score yet: exp(-inf) stays 0, no NaN
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(vbase + ns[:, None] * s_vl + ds[None, :], mask=live[:, None] & md[None, :], other=0.0)
    if F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc * alpha[:, None] + pv
