"""A skinny matrix product as a Triton kernel: ``y = x @ W^T (* scale) (+ residual)`` for at most 16 rows.

The decode step's linear layers read every weight once per token, so their time is the weight bytes over the
memory bandwidth. This kernel streams W (bf16 / fp16 / fp32, or float8_e4m3fn with one fp32 scale per output
channel, dequantised in registers) with fp32 accumulation. Call it through ``holotron.quant.gemv`` (argument
checks, and the PyTorch twin ``gemv_ref`` where Triton cannot run).

Grid: (output blocks of BLOCK_N channels, SPLIT slices of K). With SPLIT == 1 a program owns its outputs and
finishes them (scale, residual, cast). With SPLIT > 1 (narrow N: too few output blocks to fill the GPU) each
program writes an fp32 partial sum to a (SPLIT, M, N) buffer and a second launch adds the SPLIT partials in a
fixed order (deterministic) and finishes. One row (M == 1): products summed elementwise in an fp32 tile over
the K steps, reduced once at the end; 2-16 rows: ``tl.dot`` on a 16-row tile (bf16 / fp16 operands, fp32
accumulation; fp32 inputs in IEEE precision). A per-channel scale factors out of the sum over K, so it is
applied once, at the end. Launch settings are picked by shape (``pick_config``), never autotuned: nothing is
timed or synchronised at call time, so the launches can be captured in a CUDA graph."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Buffers handed to the kernels come from ``_empty``; tests swap it for a NaN-filled allocation, so an
# element the kernel should have written but did not shows up as NaN.
_empty = torch.empty

# overrides of pick_config (the benchmark sweeps them): keys BLOCK_N, BLOCK_K, SPLIT, num_warps, DOT (one row
# through tl.dot on a 16-row tile too)
GEMV_CONFIG: dict = {}


@triton.jit
def _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym, HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr):
    """acc (BLOCK_M, BLOCK_N) fp32 -> y = acc * scale[n] + residual[m, n], stored in y's dtype."""
    mn = ns < N
    mask = (ms < M)[:, None] & mn[None, :]
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + ns, mask=mn, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc += tl.load(r_ptr + ms[:, None] * s_rm + ns[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + ms[:, None] * s_ym + ns[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv(x_ptr, w_ptr, s_ptr, r_ptr, y_ptr, p_ptr, M, N, K, K_SPLIT, s_xm, s_wn, s_rm, s_ym,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
          IEEE: tl.constexpr, PARTIAL: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr):
    """Outputs [pid_n * BLOCK_N, +BLOCK_N) of every row, summed over K in [pid_k * K_SPLIT, +K_SPLIT)
    (K_SPLIT a multiple of BLOCK_K). PARTIAL: store the fp32 sum to p[pid_k] instead of finishing."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    mn = ns < N
    mm = ms < M
    w_rows = w_ptr + ns.to(tl.int64)[:, None] * s_wn        # lm_head: N * K is near 2^31
    x_rows = x_ptr + ms[:, None] * s_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # one row: products summed elementwise, reduced once
    k0 = pid_k * K_SPLIT
    for kk in range(0, K_SPLIT, BLOCK_K):
        ks = k0 + kk + tl.arange(0, BLOCK_K)
        mk = ks < K
        w = tl.load(w_rows + ks[None, :], mask=mn[:, None] & mk[None, :], other=0.0)   # (BLOCK_N, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=mm[:, None] & mk[None, :], other=0.0)   # (BLOCK_M, BLOCK_K)
        if DOT:
            if IEEE:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        else:
            acc1 += w.to(tl.float32) * tl.sum(x.to(tl.float32), axis=0)[None, :]
    if not DOT:
        acc += tl.sum(acc1, axis=1)[None, :]
    if PARTIAL:
        mask = mm[:, None] & mn[None, :]
        tl.store(p_ptr + (pid_k * M + ms[:, None]) * N + ns[None, :], acc, mask=mask)
    else:
        _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym, HAS_SCALE, HAS_RES)


@triton.jit
def _reduce(p_ptr, s_ptr, r_ptr, y_ptr, M, N, SPLIT, s_rm, s_ym,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr):
    """y[:, block] = sum_s p[s, :, block] (in order s = 0, 1, ...), then scale and residual."""
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    mask = (ms < M)[:, None] & (ns < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(p_ptr + (s * M + ms[:, None]) * N + ns[None, :], mask=mask, other=0.0)
    _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym, HAS_SCALE, HAS_RES)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_config(m: int, n: int, k: int, w_bytes: int, device: torch.device) -> dict:
    """Launch settings by shape: BLOCK_N 16 for N <= 8192, 32 up to 65536, 64 above (the vocabulary
    projection); BLOCK_K covers 512 bytes of a weight row per step, at most 8192 weights per tile (the one-row
    path holds the tile's products in registers); then K is split in two until there are at least four
    programs per multiprocessor (132 on an H200), keeping two BLOCK_K steps per slice."""
    sms = _sm_count(device.index) if device.type == "cuda" else 132
    block_n = 16 if n <= 8192 else 32 if n <= 65536 else 64
    block_k = max(32, min(512 // w_bytes, 8192 // block_n))
    split = 1
    while triton.cdiv(n, block_n) * split < 4 * sms and k // (2 * split) >= 2 * block_k and split < 16:
        split *= 2
    cfg = dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4)
    cfg.update(GEMV_CONFIG)
    return cfg


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
                config: dict | None = None) -> torch.Tensor:
    """x (M, K) with M <= 16, weight (N, K) unit-stride rows, scale (N,) or None, residual (M, N) or None
    -> y (M, N) in ``out_dtype`` (default x's). Arguments are checked by ``holotron.quant.gemv``."""
    m, k = x.shape
    n = weight.shape[0]
    cfg = config or pick_config(m, n, k, weight.element_size(), x.device)
    block_n, block_k, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT"]
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = _empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    dot = m > 1 or cfg.get("DOT", False)
    # fp32 operands in IEEE precision for fp32 inputs; and for bf16 ones in Triton's CPU interpreter, whose
    # bf16 x bf16 tl.dot returns garbage (triton 3.9). Same result: bf16 products are exact in fp32.
    ieee = torch.float32 in (x.dtype, weight.dtype) or (x.dtype == torch.bfloat16 and x.device.type != "cuda")
    block_m = 16 if dot else 1
    k_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_split)  # no empty slices
    p = _empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    s_arg = scale if scale is not None else y
    r_arg = residual if residual is not None else y
    s_rm = residual.stride(0) if residual is not None else 0
    _gemv[(triton.cdiv(n, block_n), split)](
        x, weight, s_arg, r_arg, y, p, m, n, k, k_split, x.stride(0), weight.stride(0), s_rm, y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, IEEE=ieee,
        PARTIAL=split > 1, HAS_SCALE=scale is not None, HAS_RES=residual is not None,
        num_warps=cfg.get("num_warps", 4))
    if split > 1:
        rb = max(16, 1024 // triton.next_power_of_2(m))
        _reduce[(triton.cdiv(n, rb),)](p, s_arg, r_arg, y, m, n, split, s_rm, y.stride(0),
                                       BLOCK_M=triton.next_power_of_2(m), BLOCK_N=rb,
                                       HAS_SCALE=scale is not None, HAS_RES=residual is not None, num_warps=4)
    return y
