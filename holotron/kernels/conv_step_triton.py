"""The Mamba2 conv-window decode step as one Triton kernel: the GPU path of ``conv_step``
(``holotron/kernels/__init__.py``; its PyTorch twin is ``holotron/kernels/conv_naive.py``).

One program per (batch row, block of channels): the window (B, C, K) slides by one in place (the new
input enters last), out = silu(sum_k window[k] * w[k] + bias) in fp32, stored in the input's dtype.
Each channel is read and written by one thread only (BLOCK_C >= the program's threads: no lane holds a
channel twice), so the in-place shift needs no barrier. Nothing waits on the host (CUDA-graph safe).
``active`` (B,) (optional): a row whose entry is 0 computes its output but leaves its window unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_C, NUM_WARPS = 256, 4  # 128 threads, two channels each: never a replicated lane


@triton.jit
def _conv_step(conv_ptr, x_ptr, w_ptr, b_ptr, out_ptr, act_ptr, C, s_cb, s_cc, s_ck, s_xb, s_ob,
               K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr):
    bi = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mc = cs < C
    ms = mc  # where the window is written
    if HAS_ACTIVE:
        ms = mc & (tl.load(act_ptr + bi + cs * 0) != 0)  # the row's flag, broadcast over the block
    base = conv_ptr + bi * s_cb + cs * s_cc
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(K - 1):  # window[k] <- window[k + 1], read before it is overwritten
        v = tl.load(base + (k + 1) * s_ck, mask=mc, other=0.0)
        acc += v.to(tl.float32) * tl.load(w_ptr + cs * K + k, mask=mc, other=0.0).to(tl.float32)
        tl.store(base + k * s_ck, v, mask=ms)
    xv = tl.load(x_ptr + bi * s_xb + cs, mask=mc, other=0.0).to(conv_ptr.dtype.element_ty)
    acc += xv.to(tl.float32) * tl.load(w_ptr + cs * K + (K - 1), mask=mc, other=0.0).to(tl.float32)
    tl.store(base + (K - 1) * s_ck, xv, mask=ms)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cs, mask=mc, other=0.0).to(tl.float32)
    out = acc * tl.sigmoid(acc)
    tl.store(out_ptr + bi * s_ob + cs, out.to(out_ptr.dtype.element_ty), mask=mc)


def conv_step_triton(conv: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None, active: torch.Tensor | None = None) -> torch.Tensor:
    """conv (b, c, K) updated in place (rows where ``active`` is 0 keep theirs); x (b, c); weight (c, K)
    contiguous; returns silu(conv) (b, c) like x."""
    b, c, K = conv.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(b, c, dtype=x.dtype, device=x.device)
    _conv_step[(b, triton.cdiv(c, BLOCK_C))](
        conv, x, weight, bias if bias is not None else weight, out, active if active is not None else out, c,
        conv.stride(0), conv.stride(1), conv.stride(2), x.stride(0), out.stride(0),
        K=K, HAS_BIAS=bias is not None, HAS_ACTIVE=active is not None, BLOCK=BLOCK_C, num_warps=NUM_WARPS)
    return out
