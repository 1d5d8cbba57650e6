"""Per-row ops of the decode step above one row (holotron/decode_ops.py), as one Triton kernel: the block's
RMSNorm and, for FP8 weights, the per-row e4m3 quantisation of the activations that ``torch._scaled_mm``
takes (holotron/quant.py's ``fp8_matmul``), in one pass over x instead of a chain of casts and reductions.

    y = x * rstd * g                      NORM: rstd = 1 / sqrt(mean(x^2) + eps), g the norm weight
    QUANT: s = max|y| / 448 per row, y <- clamp(y / s, -448, 448) stored as float8_e4m3fn, s stored (fp32)

One program per row; the row is read twice (sums, then the output: the second read comes from L2), in
blocks of BLOCK. fp32 math; no host sync (CUDA-graph safe).

``relu2``: the relu^2 MLP's activation, ``relu(x)^2``, in one pass over x (torch's ``F.relu(x).square()`` is two
kernels, a read and a write each); the square is taken in fp32 and rounded once, as torch's 16-bit elementwise
product does, so the two agree bit for bit."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0


@triton.jit
def _row_norm_quant(x_ptr, g_ptr, y_ptr, s_ptr, K, s_xm, s_ym, eps,
                    NORM: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    ss = tl.zeros((BLOCK,), dtype=tl.float32)
    am = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        mk = ks < K
        x = tl.load(x_ptr + m * s_xm + ks, mask=mk, other=0.0).to(tl.float32)
        if NORM:
            ss += x * x
            x = x * tl.load(g_ptr + ks, mask=mk, other=0.0).to(tl.float32)
        if QUANT:
            am = tl.maximum(am, tl.abs(x))
    mul = 1.0
    if NORM:
        mul = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    if QUANT:
        scale = tl.maximum(tl.max(am, axis=0) * mul / 448.0, 1e-12)
        tl.store(s_ptr + m, scale)
        mul = mul / scale
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        mk = ks < K
        x = tl.load(x_ptr + m * s_xm + ks, mask=mk, other=0.0).to(tl.float32)
        if NORM:
            x = x * tl.load(g_ptr + ks, mask=mk, other=0.0).to(tl.float32)
        y = x * mul
        if QUANT:
            y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        tl.store(y_ptr + m * s_ym + ks, y.to(y_ptr.dtype.element_ty), mask=mk)


def row_norm_quant(x: torch.Tensor, norm: torch.Tensor | None, eps: float = 1e-5, quant: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (M, K) unit-stride rows; norm (K,) or None; -> (y (M, K) in x's dtype, None), or with ``quant``
    (float8_e4m3fn codes (M, K), fp32 scales (M, 1))."""
    m, k = x.shape
    # Triton's CPU interpreter rounds fp32 -> e4m3 wrongly (124.3 -> 64, triton 3.x): there the kernel stores the
    # scaled fp32 values and torch converts them
    direct = quant and x.device.type == "cuda"
    y = torch.empty(m, k, device=x.device, dtype=torch.float8_e4m3fn if direct else torch.float32 if quant
                    else x.dtype)
    s = torch.empty(m, 1, device=x.device, dtype=torch.float32) if quant else None
    block = min(4096, triton.next_power_of_2(k))
    _row_norm_quant[(m,)](x, norm if norm is not None else x, y, s if s is not None else x, k, x.stride(0),
                          y.stride(0), float(eps), NORM=norm is not None, QUANT=quant, BLOCK=block,
                          num_warps=8 if block >= 2048 else 4)
    if quant and not direct:
        y = y.to(torch.float8_e4m3fn)
    return y, s


@triton.jit
def _relu2(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mk = i < n
    x = tl.maximum(tl.load(x_ptr + i, mask=mk, other=0.0).to(tl.float32), 0.0)
    tl.store(y_ptr + i, (x * x).to(y_ptr.dtype.element_ty), mask=mk)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``relu(x) ** 2`` of a contiguous x of any shape, as one kernel; a new tensor of x's dtype."""
    y = torch.empty_like(x)
    n = x.numel()
    block = 4096
    if n:
        _relu2[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=8)
    return y
