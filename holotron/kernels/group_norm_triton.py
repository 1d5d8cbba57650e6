"""Mamba2's gated norm for the decode step as one Triton kernel: ``GatedRMSNorm.normed`` (holotron/layers.py)
of an already gated v, per group of ``K / groups`` contiguous channels:

    out[m, g] = v[m, g] / sqrt(mean(v[m, g]^2) + eps) * w[g]      fp32 math, stored in v's dtype

One program per (row, group), the whole group in registers; nothing waits on the host (CUDA-graph safe). The
decode step uses it before out_proj (holotron/decode_ops.py's ``linear_residual``): as its own launch it
measured faster than folding the norm into out_proj's GEMV one group at a time (docs/benchmarks.md)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _group_rms(v_ptr, w_ptr, o_ptr, GS, s_vm, s_om, eps, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cs = g * GS + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < GS
    v = tl.load(v_ptr + m * s_vm + cs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / GS + eps)
    w = tl.load(w_ptr + cs, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + m * s_om + cs, (v * rstd * w).to(o_ptr.dtype.element_ty), mask=mask)


def group_rms_norm_triton(v: torch.Tensor, weight: torch.Tensor, groups: int, eps: float,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """v (M, K) with unit-stride rows, weight (K,), groups dividing K -> (M, K) in v's dtype, written into
    ``out`` when given ((M, K), unit-stride rows: a block of rows of a larger buffer)."""
    m, k = v.shape
    gs = k // groups
    out = torch.empty_like(v) if out is None else out
    block = triton.next_power_of_2(gs)
    _group_rms[(m, groups)](v, weight, out, gs, v.stride(0), out.stride(0), float(eps), BLOCK=block,
                            num_warps=4 if block <= 2048 else 8)
    return out
