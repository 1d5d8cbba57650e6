"""The Mamba2 conv-window decode step as one Triton kernel: the GPU path of ``conv_step``
(``holotron/kernels/__init__.py``; its PyTorch twin is ``holotron/kernels/conv_naive.py``).

One program per (batch row, block of channels): the window (B, C, K) slides by one in place (the new
input enters last), out = silu(sum_k window[k] * w[k] + bias) in fp32, stored in the input's dtype.
A program reads its channels' windows as one tile (K contiguous taps per channel) and writes the shifted
tile back after a barrier (the layout may spread a channel's taps over threads, so every load happens before
any store). Nothing waits on the host (CUDA-graph safe).
``active`` (B,) (optional): a row whose entry is 0 computes its output but leaves its window unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# launch settings (dev/probes/step_sweep.py sweeps them)
CONV_CONFIG = dict(BLOCK_C=256, num_warps=4)


@triton.jit
def _conv_step(conv_ptr, x_ptr, w_ptr, b_ptr, out_ptr, act_ptr, C, s_cb, s_cc, s_ck, s_xb, s_ob,
               K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ACTIVE: tl.constexpr,
               BLOCK: tl.constexpr):
    """The window as one (BLOCK, KP) tile (a row's K taps are contiguous: one vector load per channel): the
    shifted window is [window[1:], x], out = silu(sum(shifted * w) + bias), the shifted window stored back."""
    bi = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ks = tl.arange(0, KP)
    mc = cs < C
    base = conv_ptr + bi * s_cb + cs[:, None] * s_cc
    old = tl.load(base + (ks[None, :] + 1) * s_ck, mask=mc[:, None] & (ks[None, :] + 1 < K), other=0.0)
    xv = tl.load(x_ptr + bi * s_xb + cs, mask=mc, other=0.0).to(conv_ptr.dtype.element_ty)
    new = tl.where(ks[None, :] == K - 1, xv[:, None], old)                     # (BLOCK, KP)
    w = tl.load(w_ptr + cs[:, None] * K + ks[None, :], mask=mc[:, None] & (ks[None, :] < K), other=0.0)
    acc = tl.sum(new.to(tl.float32) * w.to(tl.float32), axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cs, mask=mc, other=0.0).to(tl.float32)
    ms = mc  # where the window is written
    tl.debug_barrier()  # every thread's loads are used before any store: a channel's taps may span threads
    if HAS_ACTIVE:
        ms = mc & (tl.load(act_ptr + bi + cs * 0) != 0)  # the row's flag, broadcast over the block
    tl.store(base + ks[None, :] * s_ck, new, mask=ms[:, None] & (ks[None, :] < K))
    out = acc * tl.sigmoid(acc)
    tl.store(out_ptr + bi * s_ob + cs, out.to(out_ptr.dtype.element_ty), mask=mc)


def conv_step_triton(conv: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None, active: torch.Tensor | None = None) -> torch.Tensor:
    """conv (b, c, K) updated in place (rows where ``active`` is 0 keep theirs); x (b, c); weight (c, K)
    contiguous; returns silu(conv) (b, c) like x."""
    b, c, K = conv.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(b, c, dtype=x.dtype, device=x.device)
    _conv_step[(b, triton.cdiv(c, CONV_CONFIG["BLOCK_C"]))](
        conv, x, weight, bias if bias is not None else weight, out, active if active is not None else out, c,
        conv.stride(0), conv.stride(1), conv.stride(2), x.stride(0), out.stride(0),
        K=K, KP=triton.next_power_of_2(K), HAS_BIAS=bias is not None, HAS_ACTIVE=active is not None,
        BLOCK=CONV_CONFIG["BLOCK_C"], num_warps=CONV_CONFIG["num_warps"])
    return out
