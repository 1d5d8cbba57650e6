"""Mamba2's causal depthwise conv over a prefill chunk as Triton kernels: the GPU path of ``conv_seq``
(``holotron/kernels/__init__.py``; its PyTorch twin is ``conv_seq_naive`` in ``holotron/kernels/conv_naive.py``).

Token-major throughout: x (b, T, c) is read where in_proj wrote it (a strided slice, no transpose, no
concatenation with the window) and the output (b, T, c) is written contiguous. Two launches: ``_conv_seq``,
one program per (row, block of tokens, block of channels), out[t] = silu(bias + sum_k w[k] x[t - K + 1 + k]),
positions before the chunk read from the row's window, pads (t >= counts[row]) as zeros, in fp32, rounded
once; then ``_conv_window``, one program per (row, block of channels), the window set to the row's last K
real inputs (after the first launch has read the old one: the stream orders them). Nothing waits on the
host (capturable in a CUDA graph).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# launch settings: tokens x channels per program of the conv, channels per program of the window update. 8 x 128
# tiles: the fastest of dev/probes/conv_sweep.py's 22 settings at 2 x 320, 4 x 160 and 1 x 8192 tokens of the 12B
# layer's 12,288 channels on an H100, 11-12.5% under the 16 x 256 before (docs/benchmarks.md, "Fewer kernels in a
# mixed pass")
CONV_SEQ_CONFIG = dict(BLOCK_T=8, BLOCK_C=128, num_warps=4, WINDOW_C=256)


@triton.jit
def _conv_seq(x_ptr, conv_ptr, w_ptr, b_ptr, out_ptr, cnt_ptr, rows_ptr, T, C, s_xb, s_xt, s_cb, s_cc, s_ob, s_ot,
              K: tl.constexpr, HAS_STATE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_COUNTS: tl.constexpr,
              BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr):
    """out[t, c] = silu(bias[c] + sum_k w[c, k] * in[t - K + 1 + k, c]) for a (BLOCK_T, BLOCK_C) tile; in[s] is
    x[s] for 0 <= s < n (n: the row's real tokens), the window's slot K + s for s < 0, else 0. With ROWS, batch
    row bi's window is row rows[bi] of the window buffer."""
    bi = tl.program_id(0).to(tl.int64)
    if ROWS:
        wi = tl.load(rows_ptr + bi).to(tl.int64)
    else:
        wi = bi
    ts = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    cs = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = cs < C
    if HAS_COUNTS:
        n = tl.load(cnt_ptr + bi).to(tl.int32)
    else:
        n = T
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for k in tl.static_range(K):
        src = ts - (K - 1) + k
        live = (src >= 0) & (src < n)
        v = tl.load(x_ptr + bi * s_xb + src[:, None].to(tl.int64) * s_xt + cs[None, :],
                    mask=live[:, None] & mc[None, :], other=0.0).to(w_ptr.dtype.element_ty).to(tl.float32)
        if HAS_STATE:
            old = src < 0
            v += tl.load(conv_ptr + wi * s_cb + cs[None, :] * s_cc + (K + src)[:, None],
                         mask=old[:, None] & mc[None, :], other=0.0).to(tl.float32)
        acc += v * tl.load(w_ptr + cs * K + k, mask=mc, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cs, mask=mc, other=0.0).to(tl.float32)[None, :]
    out = acc * tl.sigmoid(acc)
    tl.store(out_ptr + bi * s_ob + ts[:, None].to(tl.int64) * s_ot + cs[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(ts < T)[:, None] & mc[None, :])


@triton.jit
def _conv_window(x_ptr, conv_ptr, cnt_ptr, rows_ptr, T, C, s_xb, s_xt, s_cb, s_cc, K: tl.constexpr, KP: tl.constexpr,
                 HAS_COUNTS: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr):
    """window[c, k] = in[n - K + k, c] (n: the row's real tokens; in as in ``_conv_seq``), in place: every
    load of the old window happens before any store (a channel's taps may span threads). With ROWS, batch row
    bi's window is row rows[bi] of the buffer."""
    bi = tl.program_id(0).to(tl.int64)
    if ROWS:
        wi = tl.load(rows_ptr + bi).to(tl.int64)
    else:
        wi = bi
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ks = tl.arange(0, KP)
    mc = cs < C
    if HAS_COUNTS:
        n = tl.load(cnt_ptr + bi).to(tl.int32)
    else:
        n = T
    src = n - K + ks
    tap = ks < K
    from_x = (src >= 0) & tap
    vx = tl.load(x_ptr + bi * s_xb + src[None, :].to(tl.int64) * s_xt + cs[:, None],
                 mask=mc[:, None] & from_x[None, :], other=0.0).to(conv_ptr.dtype.element_ty)
    base = conv_ptr + wi * s_cb + cs[:, None] * s_cc
    vw = tl.load(base + (K + src)[None, :], mask=mc[:, None] & ((src < 0) & tap)[None, :], other=0.0)
    new = tl.where(from_x[None, :], vx, vw)
    tl.debug_barrier()
    tl.store(base + ks[None, :], new, mask=mc[:, None] & tap[None, :])


def conv_seq_triton(x: torch.Tensor, conv: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                    counts: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """x (b, T, c) with a unit-stride last dim; conv (b, c, K) with a unit-stride last dim, or None; weight
    (c, K) contiguous; counts (b,) or None; rows (b,) or None: conv is (R, c, K) and batch row i's window is
    conv[rows[i]]. Returns (b, T, c) like x; the window updated in place."""
    b, t, c = x.shape
    K = weight.shape[-1]
    cfg = CONV_SEQ_CONFIG
    out = torch.empty(b, t, c, dtype=x.dtype, device=x.device)
    cnt = counts.contiguous() if counts is not None else x
    rws = rows.to(dtype=torch.int64).contiguous() if rows is not None else x
    cv = conv if conv is not None else weight
    s_cb, s_cc = (conv.stride(0), conv.stride(1)) if conv is not None else (0, 0)
    if b * t * c:
        grid = (b, triton.cdiv(t, cfg["BLOCK_T"]), triton.cdiv(c, cfg["BLOCK_C"]))
        _conv_seq[grid](x, cv, weight, bias if bias is not None else weight, out, cnt, rws, t, c, x.stride(0),
                        x.stride(1), s_cb, s_cc, out.stride(0), out.stride(1), K=K, HAS_STATE=conv is not None,
                        HAS_BIAS=bias is not None, HAS_COUNTS=counts is not None, BLOCK_T=cfg["BLOCK_T"],
                        BLOCK_C=cfg["BLOCK_C"], ROWS=rows is not None, num_warps=cfg["num_warps"])
    if conv is not None and b * c:
        _conv_window[(b, triton.cdiv(c, cfg["WINDOW_C"]))](
            x, conv, cnt, rws, t, c, x.stride(0), x.stride(1), s_cb, s_cc, K=K, KP=triton.next_power_of_2(K),
            HAS_COUNTS=counts is not None, BLOCK_C=cfg["WINDOW_C"], ROWS=rows is not None, num_warps=4)
    return out
