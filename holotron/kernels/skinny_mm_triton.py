"""A skinny matrix product as a Triton kernel, for decode batches (a few to a few hundred rows), with the
layer's epilogue taken in:

    y = act(x @ w^T * xs * ws) + residual     x (M, K), w (N, K): both bf16 / fp16, or both float8_e4m3fn
                                              with per-row scales xs (M, 1) and per-channel scales ws (N,);
                                              act None or relu^2; fp32 accumulation; y (M, N) bf16 / fp16 / fp32

At such M the product is bound by reading the weight: the 12B's linear layers hold 24 GB of bf16 (11 GB of
FP8 codes) that every decode step reads once, and at 128 rows cuBLAS read bf16 weights at 67-95% of the copy
bandwidth and ``torch._scaled_mm`` FP8 codes at 37-65% (docs/benchmarks.md). Here each program streams a
BLOCK_N x K-slice strip of w once for all BLOCK_M rows through the tensor cores (``tl.dot``, software-pipelined
over K), its tiles read through tensor descriptors (TMA on Hopper; masked pointer loads where the addresses
are not 16-byte multiples). When the strips are too few to fill the GPU, K is split over programs: each
writes an fp32 partial and a second launch adds them in a fixed order (the result does not depend on
timing) and applies the epilogue. Launch settings by shape (``pick``, from a sweep on an H200), never timed at
call time: capturable in a CUDA graph.

FP8: Hopper's tensor cores keep fewer bits than fp32 in their FP8 accumulator; ``ACC_K`` products are
summed there before each promotion to fp32: 32 up to ``ACC_K_ROWS`` rows, a whole BLOCK_K above (as
``torch._scaled_mm`` does). Never promoting (the whole K in the tensor cores' accumulator) was 35x further from
float64 than ``torch._scaled_mm`` at 128 x 5120 x 22656 (5.3e-3 against 1.5e-4): not offered.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ssd_triton_common import _ensure_allocator, _interpreting, _sm_count, _tma_ok

FP8 = torch.float8_e4m3fn
_X_DTYPES = (torch.bfloat16, torch.float16, FP8)


@triton.jit
def _finish(acc, rm, rn, M, N, xs_ptr, ws_ptr, r_ptr, y_ptr, s_rm, s_ym, X_SCALE: tl.constexpr,
            W_SCALE: tl.constexpr, RELU2: tl.constexpr, RESIDUAL: tl.constexpr):
    """y[rm, rn] = act(acc * xs * ws) + residual, rounded once to y's dtype."""
    mm = rm < M
    mn = rn < N
    if X_SCALE:
        acc = acc * tl.load(xs_ptr + rm, mask=mm, other=0.0)[:, None]
    if W_SCALE:
        acc = acc * tl.load(ws_ptr + rn, mask=mn, other=0.0)[None, :]
    if RELU2:
        acc = tl.maximum(acc, 0.0)
        acc = acc * acc
    mask = mm[:, None] & mn[None, :]
    rows = rm.to(tl.int64)[:, None]
    if RESIDUAL:
        acc += tl.load(r_ptr + rows * s_rm + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * s_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mm(x_ptr, w_ptr, xs_ptr, ws_ptr, r_ptr, y_ptr, p_ptr, M, N, K, K_SPLIT, s_xm, s_wn, s_rm, s_ym,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        TMA: tl.constexpr, PARTIAL: tl.constexpr, X_SCALE: tl.constexpr, W_SCALE: tl.constexpr,
        RELU2: tl.constexpr, RESIDUAL: tl.constexpr, F32: tl.constexpr, ACC_K: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) output tile over K slice pid_k: the finished tile, or its fp32 partial."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    k0 = pid_k * K_SPLIT
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    if TMA:
        xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[s_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
        wd = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[s_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(K, k0 + K_SPLIT)  # K_SPLIT is a multiple of BLOCK_K: no tile crosses into the next slice
    for kk in tl.range(k0, k_end, BLOCK_K, num_stages=STAGES):
        if TMA:  # past M, N or K the descriptor reads zeros
            a = xd.load([m0, kk])
            b = wd.load([n0, kk])
        else:
            ks = kk + tl.arange(0, BLOCK_K)
            mk = (ks < K)[None, :]
            a = tl.load(x_rows + ks[None, :], mask=(rm < M)[:, None] & mk, other=0.0)
            b = tl.load(w_rows + ks[None, :], mask=(rn < N)[:, None] & mk, other=0.0)
        if F32:  # Triton's CPU interpreter: widened operands, IEEE fp32 (its 16-bit / FP8 tl.dot is not exact)
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        elif ACC_K > 0:  # FP8: promoted to fp32 every ACC_K products
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=ACC_K)
        else:  # 16-bit operands: the tensor cores accumulate in fp32
            acc = tl.dot(a, tl.trans(b), acc)
    if PARTIAL:
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        tl.store(p_ptr + (pid_k * M + rm.to(tl.int64))[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        _finish(acc, rm, rn, M, N, xs_ptr, ws_ptr, r_ptr, y_ptr, s_rm, s_ym, X_SCALE, W_SCALE, RELU2, RESIDUAL)


@triton.jit
def _reduce(p_ptr, xs_ptr, ws_ptr, r_ptr, y_ptr, M, N, SPLIT, s_rm, s_ym, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, X_SCALE: tl.constexpr, W_SCALE: tl.constexpr, RELU2: tl.constexpr,
            RESIDUAL: tl.constexpr):
    """The SPLIT partials of a tile added in order, then the epilogue."""
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(p_ptr + (s * M + rm.to(tl.int64))[:, None] * N + rn[None, :], mask=mask, other=0.0)
    _finish(acc, rm, rn, M, N, xs_ptr, ws_ptr, r_ptr, y_ptr, s_rm, s_ym, X_SCALE, W_SCALE, RELU2, RESIDUAL)


# launch settings (``pick``) from sweeps at 128 rows on an H200 (benchmarks/bench_mm.py, 2026-12-04). FP8: 64 x 128
# tiles of one warpgroup (out_proj 0.028 ms, down 0.045 in 3 K slices, against 0.029 / 0.053 for
# torch._scaled_mm; 128 x 128 tiles of two warpgroups did not beat _scaled_mm on the wide layers once the
# accumulator was promoted per K block: in_proj 0.050-0.068 against 0.042). 16-bit weights never reached cuBLAS
# there (in_proj / up 0.067 / 0.064 ms against 0.065 / 0.057). Triton 3.6's warp-specialised loop
# (``tl.range(..., warp_specialize=True)``) gave wrong products in 7 of 10 tiles tried and was slower in the rest.
MM_CONFIG = {
    "fp8": dict(BLOCK_N=64, BLOCK_K=128, STAGES=4, num_warps=4),
    "16bit": dict(BLOCK_N=64, BLOCK_K=64, STAGES=3, num_warps=4),
}
# FP8: rows up to which the accumulator is promoted every 32 products (above, every BLOCK_K: at 128 rows the
# promotion every 32 cost 1.1-3.6x in time; torch._scaled_mm, which the product replaces there, promotes per block)
ACC_K_ROWS = 64
_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps", "SPLIT", "ACC_K", "TMA")


def pick(m: int, n: int, k: int, w_dtype: torch.dtype, device: torch.device, tile: dict | None = None) -> dict:
    """Launch settings for an (m, k) x (n, k)^T product. BLOCK_M covers the rows (16..128); BLOCK_N, BLOCK_K,
    stages and warps from ``MM_CONFIG``; K split into SPLIT slices where that shortens the estimated time
    (``_split``). ``tile`` overrides any key (the benchmark's sweep)."""
    tile = dict(tile or {})
    bad = set(tile) - set(_KEYS)
    if bad:
        raise ValueError(f"skinny_mm: unknown launch settings {sorted(bad)}; known: {list(_KEYS)}")
    sms = _sm_count(device) if device.type == "cuda" else 132
    if "ACC_K" in tile and not (isinstance(tile["ACC_K"], int) and tile["ACC_K"] >= 1):
        raise ValueError(f"skinny_mm: ACC_K must be a positive number of products, got {tile['ACC_K']!r}")
    base = dict(BLOCK_M=min(128, max(16, triton.next_power_of_2(m))), SPLIT=1, ACC_K=32 if m <= ACC_K_ROWS else None,
                TMA=True)
    cfg = {**base, **MM_CONFIG["fp8" if w_dtype == FP8 else "16bit"], **tile}
    if "SPLIT" not in tile:
        cfg["SPLIT"] = _split(m, n, k, w_dtype.itemsize, cfg, sms)
    if cfg["ACC_K"] is None:
        cfg["ACC_K"] = cfg["BLOCK_K"]
    return cfg


def _split(m: int, n: int, k: int, el: int, cfg: dict, sms: int) -> int:
    """The number of K slices: 1 when the output tiles alone give every multiprocessor a program; else as many
    as one wave of programs holds (multiprocessors x programs resident on each, by shared memory and warps),
    each slice at least 4 BLOCK_K long. (A second wave, or slices where the tiles already fill the GPU, cost
    more in the sweep than their fp32 partials saved: at 128 rows 20480 x 5120 FP8 took 0.038 ms unsplit, 0.057
    in 2 slices; 5120 x 10240 took 0.026 ms in 3 slices (240 programs, 2 per multiprocessor), 0.039 in 4.)"""
    tiles = triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(m, cfg["BLOCK_M"])
    if tiles >= sms:
        return 1
    smem = cfg["STAGES"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * el
    resident = max(1, min(227 * 1024 // smem, 64 // cfg["num_warps"]))
    most = triton.cdiv(k, cfg["BLOCK_K"]) // 4
    return max(1, min(most, sms * resident // tiles))


def skinny_mm(x: torch.Tensor, w: torch.Tensor, xs: torch.Tensor | None = None, ws: torch.Tensor | None = None,
              residual: torch.Tensor | None = None, act: str | None = None, out_dtype: torch.dtype | None = None,
              config: dict | None = None) -> torch.Tensor:
    """y = act(x @ w^T * xs * ws) + residual -> (M, N) in ``out_dtype`` (default: x's dtype, bf16 for FP8 x).

    x (M, K) and w (N, K) of one kind: bf16 / fp16 (same dtype), or float8_e4m3fn with xs (M, 1) / (M,) and
    ws (N,) fp32 scales; residual (M, N); act None or "relu2"; unit-stride last dims. ``config``: any of
    ``pick``'s keys. CUDA, or the CPU under TRITON_INTERPRET=1."""
    m, k = x.shape
    n = w.shape[0]
    fp8 = x.dtype == FP8
    if x.dtype not in _X_DTYPES or w.dtype != x.dtype or w.shape[1] != k:
        raise ValueError(f"skinny_mm: x (M, K) and w (N, K) must share a dtype of {_X_DTYPES}, got "
                         f"{x.dtype} {tuple(x.shape)} and {w.dtype} {tuple(w.shape)}")
    if fp8 != (xs is not None) or fp8 != (ws is not None):
        raise ValueError("skinny_mm: float8 operands need both scales (xs (M, 1), ws (N,)); 16-bit ones none")
    if act not in (None, "relu2"):
        raise ValueError(f"skinny_mm: act must be None or 'relu2', got {act!r}")
    if residual is not None and tuple(residual.shape) != (m, n):
        raise ValueError(f"skinny_mm: residual must be ({m}, {n}), got {tuple(residual.shape)}")
    if k == 0:
        raise ValueError("skinny_mm: x and w have no columns (K = 0)")
    if m == 0 or n == 0:
        return torch.empty(m, n, device=x.device, dtype=out_dtype or (torch.bfloat16 if fp8 else x.dtype))
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    cfg = pick(m, n, k, w.dtype, x.device, config)
    bk = cfg["BLOCK_K"]
    k_split = triton.cdiv(triton.cdiv(k, cfg["SPLIT"]), bk) * bk
    split = triton.cdiv(k, k_split)
    y = torch.empty(m, n, device=x.device, dtype=out_dtype or (torch.bfloat16 if fp8 else x.dtype))
    p = torch.empty(split, m, n, device=x.device, dtype=torch.float32) if split > 1 else y
    xs = xs.reshape(m).contiguous() if fp8 else y
    ws = ws.contiguous() if fp8 else y
    r = residual if residual is not None else y
    tma = bool(cfg["TMA"]) and _tma_ok(x.element_size(), (x, w), ())
    if tma:
        _ensure_allocator()
    flags = dict(X_SCALE=fp8, W_SCALE=fp8, RELU2=act == "relu2", RESIDUAL=residual is not None)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split, triton.cdiv(m, cfg["BLOCK_M"]))
    _mm[grid](x, w, xs, ws, r, y, p, m, n, k, k_split, x.stride(0), w.stride(0), r.stride(0), y.stride(0),
              BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk, STAGES=cfg["STAGES"], TMA=tma,
              PARTIAL=split > 1, F32=_interpreting(), ACC_K=min(cfg["ACC_K"], bk) if fp8 else 0,
              num_warps=cfg["num_warps"], **flags)
    if split > 1:
        _reduce[(triton.cdiv(n, 128), triton.cdiv(m, 16))](p, xs, ws, r, y, m, n, split, r.stride(0), y.stride(0),
                                                           BLOCK_M=16, BLOCK_N=128, num_warps=4, **flags)
    return y
