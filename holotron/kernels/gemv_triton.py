"""A skinny matrix product as a Triton kernel, with the decode step's neighbours fused in:

    y = act( (x * g) @ W^T * rstd * scale ) + residual          for at most 16 rows of x

The decode step's linear layers read every weight once per token, so their time is the weight bytes over the
memory bandwidth. This kernel streams W (bf16 / fp16 / fp32, or float8_e4m3fn with one fp32 scale per output
channel, widened in registers) with fp32 accumulation, and takes in the small ops around it that would each
be a kernel launch of their own: the RMSNorm before the projection (``NORM``: g the norm weight, rstd =
1 / sqrt(mean(x^2) + eps) over the row), the relu^2 after it (``ACT``, the MLP), the per-channel FP8 scale,
and the residual add of the block. Call it through ``holotron.quant.gemv`` (argument checks, and the PyTorch
twin ``gemv_ref`` where Triton cannot run).

The norm factors out of the product: (x * g * rstd) @ W^T = rstd * ((x * g) @ W^T), so a program sums x^2 in
the same pass as the product and scales once at the end (no second read of x, no normalised copy).

Grid: (output blocks of BLOCK_N channels, SPLIT slices of K). With SPLIT == 1 a program owns its outputs and
finishes them (norm factor, scale, act, residual, cast). With SPLIT > 1 (narrow N: too few output blocks to
fill the GPU) each program writes an fp32 partial sum to a (SPLIT, M, N) buffer and a second launch adds the
SPLIT partials in a fixed order (deterministic) and finishes; the row norm is then computed there, from x.
One row (M == 1): products summed elementwise in an fp32 tile over the K steps, reduced once at the end;
2-16 rows: ``tl.dot`` on a 16-row tile (bf16 / fp16 operands, fp32 accumulation; fp32 inputs in IEEE
precision). FP8 codes are widened by the conversion instruction (moving their bits into an fp32 word instead
never measured faster). Launch settings are picked by shape (``pick_config``), never autotuned at call time:
nothing is timed or synchronised, so the launches can be captured in a CUDA graph. (Mamba2's group norm was
also folded into this kernel, one group at a time; a small kernel of its own before the product measured
faster: group_norm_triton.py.)"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Buffers handed to the kernels come from ``_empty``; tests swap it for a NaN-filled allocation, so an
# element the kernel should have written but did not shows up as NaN.
_empty = torch.empty

# overrides of pick_config (the benchmark sweeps them): keys BLOCK_N, BLOCK_K, SPLIT, num_warps, STAGES,
# DOT (one row through tl.dot on a 16-row tile too)
GEMV_CONFIG: dict = {}


@triton.jit
def _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym,
            HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """acc (BLOCK_M, BLOCK_N) fp32 -> y = act(acc * scale[n]) + residual[m, n], stored in y's dtype."""
    mn = ns < N
    mask = (ms < M)[:, None] & mn[None, :]
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + ns, mask=mn, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:  # relu^2
        acc = tl.maximum(acc, 0.0)
        acc = acc * acc
    if HAS_RES:
        acc += tl.load(r_ptr + ms[:, None] * s_rm + ns[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + ms[:, None] * s_ym + ns[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv(x_ptr, w_ptr, s_ptr, r_ptr, y_ptr, p_ptr, g_ptr, M, N, K, K_SPLIT, s_xm, s_wn, s_rm, s_ym, eps,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
          IEEE: tl.constexpr, PARTIAL: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr,
          NORM: tl.constexpr, ACT: tl.constexpr, STAGES: tl.constexpr):
    """Outputs [pid_n * BLOCK_N, +BLOCK_N) of every row, summed over K in [pid_k * K_SPLIT, +K_SPLIT).
    PARTIAL: store the fp32 sum to p[pid_k] instead of finishing. NORM: x * g, and the row's rstd applied
    here when not PARTIAL (else by _reduce)."""
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
    ssv = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)   # x^2 summed elementwise (NORM), reduced once
    k0 = pid_k * K_SPLIT
    for kk in tl.range(0, K_SPLIT, BLOCK_K, num_stages=STAGES):
        kr = kk + tl.arange(0, BLOCK_K)
        ks = k0 + kr
        mk = (ks < K) & (kr < K_SPLIT)
        w = tl.load(w_rows + ks[None, :], mask=mn[:, None] & mk[None, :], other=0.0)   # (BLOCK_N, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=mm[:, None] & mk[None, :], other=0.0)   # (BLOCK_M, BLOCK_K)
        if NORM:
            xf = x.to(tl.float32)
            ssv += xf * xf
            x = xf * tl.load(g_ptr + ks, mask=mk, other=0.0).to(tl.float32)[None, :]
        if DOT:
            if IEEE:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                xt = x.to(x_ptr.dtype.element_ty)
                acc += tl.dot(xt, tl.trans(w.to(xt.dtype)))
        else:
            acc1 += w.to(tl.float32) * tl.sum(x.to(tl.float32), axis=0)[None, :]
    if not DOT:
        acc += tl.sum(acc1, axis=1)[None, :]
    if NORM and not PARTIAL:
        acc = acc * (1.0 / tl.sqrt(tl.sum(ssv, axis=1) / K + eps))[:, None]
    if PARTIAL:
        mask = mm[:, None] & mn[None, :]
        tl.store(p_ptr + (pid_k * M + ms[:, None]) * N + ns[None, :], acc, mask=mask)
    else:
        _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym, HAS_SCALE, HAS_RES, ACT)


@triton.jit
def _reduce(p_ptr, s_ptr, r_ptr, y_ptr, x_ptr, M, N, K, SPLIT, s_rm, s_ym, s_xm, eps,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_RES: tl.constexpr,
            NORM: tl.constexpr, ACT: tl.constexpr, BLOCK_X: tl.constexpr):
    """y[:, block] = sum_s p[s, :, block] (in order s = 0, 1, ...), times the row's rstd (NORM, from x), then
    scale, act and residual."""
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    mm = ms < M
    mask = mm[:, None] & (ns < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(p_ptr + (s * M + ms[:, None]) * N + ns[None, :], mask=mask, other=0.0)
    if NORM:
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_X):
            ks = k0 + tl.arange(0, BLOCK_X)
            x = tl.load(x_ptr + ms[:, None] * s_xm + ks[None, :], mask=mm[:, None] & (ks < K)[None, :],
                        other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=1)
        acc = acc * (1.0 / tl.sqrt(ss / K + eps))[:, None]
    _finish(acc, ms, ns, M, N, s_ptr, r_ptr, y_ptr, s_rm, s_ym, HAS_SCALE, HAS_RES, ACT)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_config(m: int, n: int, k: int, w_bytes: int, device: torch.device) -> dict:
    """Launch settings by shape (``GEMV_CONFIG`` overrides them). One row:
    BLOCK_N 16, BLOCK_K 512 weights (128 for fp32 weights), three pipeline stages, K split in two until
    there are at least two programs per multiprocessor (132 on an H200): the best of bench_gemv.py's sweep
    at every 12B shape (2026-12-04: 89-106% of copy bandwidth for bf16 weights, 59-100% for FP8;
    docs/benchmarks.md). 2-16 rows (``tl.dot`` on a 16-row tile): BLOCK_N 16 for N <= 8192, 32 up to
    65536, 64 above, BLOCK_K 512 bytes of a row, K split until four programs per multiprocessor."""
    sms = _sm_count(device.index) if device.type == "cuda" else 132
    if m == 1:
        block_n, block_k = 16, (128 if w_bytes >= 4 else 512)
        split = 1
        while triton.cdiv(n, block_n) * split < 2 * sms and k // (2 * split) >= 2 * block_k and split < 16:
            split *= 2
        cfg = dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4, STAGES=1 if w_bytes >= 4 else 3)
    else:
        block_n = 16 if n <= 8192 else 32 if n <= 65536 else 64
        block_k = max(32, min(512 // w_bytes, 8192 // block_n))
        split = 1
        while triton.cdiv(n, block_n) * split < 4 * sms and k // (2 * split) >= 2 * block_k and split < 16:
            split *= 2
        cfg = dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4)
    return dict(cfg, **GEMV_CONFIG)


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, *, norm: torch.Tensor | None = None, eps: float = 1e-5,
                act: str | None = None, out_dtype: torch.dtype | None = None, config: dict | None = None
                ) -> torch.Tensor:
    """x (M, K) with M <= 16, weight (N, K) unit-stride rows, scale (N,) or None, residual (M, N) or None,
    norm (K,) or None (an RMSNorm weight), act None or "relu2" -> y (M, N) in ``out_dtype`` (default x's).
    Arguments are checked by ``holotron.quant.gemv``."""
    m, k = x.shape
    n = weight.shape[0]
    cfg = dict(config) if config else pick_config(m, n, k, weight.element_size(), x.device)
    block_n, block_k = cfg["BLOCK_N"], cfg["BLOCK_K"]
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = _empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    dot = m > 1 or cfg.get("DOT", False)
    # fp32 operands in IEEE precision for fp32 inputs; and for bf16 ones in Triton's CPU interpreter, whose
    # bf16 x bf16 tl.dot returns garbage (triton 3.9). Same result: bf16 products are exact in fp32.
    ieee = torch.float32 in (x.dtype, weight.dtype) or (x.dtype == torch.bfloat16 and x.device.type != "cuda")
    block_m = 16 if dot else 1
    k_split = triton.cdiv(triton.cdiv(k, cfg["SPLIT"]), block_k) * block_k
    split = triton.cdiv(k, k_split)  # no empty slices
    p = _empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    s_arg = scale if scale is not None else y
    r_arg = residual if residual is not None else y
    g_arg = norm if norm is not None else y
    s_rm = residual.stride(0) if residual is not None else 0
    act_kind = {None: 0, "relu2": 1}[act]
    _gemv[(triton.cdiv(n, block_n), split)](
        x, weight, s_arg, r_arg, y, p, g_arg, m, n, k, k_split, x.stride(0), weight.stride(0), s_rm, y.stride(0),
        float(eps),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, IEEE=ieee,
        PARTIAL=split > 1, HAS_SCALE=scale is not None, HAS_RES=residual is not None,
        NORM=norm is not None, ACT=act_kind, STAGES=cfg.get("STAGES", 1),
        num_warps=cfg.get("num_warps", 4))
    if split > 1:
        rb = max(16, 1024 // triton.next_power_of_2(m))
        _reduce[(triton.cdiv(n, rb),)](p, s_arg, r_arg, y, x, m, n, k, split, s_rm, y.stride(0), x.stride(0),
                                       float(eps), BLOCK_M=triton.next_power_of_2(m), BLOCK_N=rb,
                                       HAS_SCALE=scale is not None, HAS_RES=residual is not None,
                                       NORM=norm is not None, ACT=act_kind, BLOCK_X=1024, num_warps=4)
    return y
