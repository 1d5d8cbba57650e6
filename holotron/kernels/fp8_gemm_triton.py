"""A skinny FP8 x FP8 matrix product as a Triton kernel, for decode batches (tens to hundreds of rows):

    y = (xq * xs) @ (q * scale)^T          xq (M, K) e4m3 with per-row scales xs (M, 1), q (N, K) e4m3 with
                                           per-channel scales (N,); fp32 accumulation; y (M, N) bf16 / fp16

At such M the product is bound by reading the weight (the 12B's linear layers hold 11 GB of FP8 codes), and
``torch._scaled_mm`` read them at about half the copy bandwidth at 128 rows (docs/benchmarks.md). Here each
program streams a BLOCK_N x K strip of q once for all BLOCK_M rows through the FP8 tensor cores (``tl.dot`` of
e4m3 operands, software-pipelined over K), K split over programs when N has too few strips to fill the GPU
(partials in fp32, added in a fixed order by a second launch). Both scales are applied once, to the output.
Launch settings by shape (``pick``), never timed at call time: capturable in a CUDA graph."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _mm(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, p_ptr, M, N, K, K_SPLIT, s_am, s_bn, s_cm,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        PARTIAL: tl.constexpr, F32: tl.constexpr, ACC_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < M
    mn = rn < N
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am
    b_rows = b_ptr + rn.to(tl.int64)[:, None] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pid_k * K_SPLIT
    for kk in tl.range(0, K_SPLIT, BLOCK_K, num_stages=STAGES):
        ks = k0 + kk + tl.arange(0, BLOCK_K)
        mk = ks < K
        a = tl.load(a_rows + ks[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        b = tl.load(b_rows + ks[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        if F32:  # Triton's CPU interpreter: widened operands, IEEE fp32 (exact: e4m3 products fit in fp32)
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            # ACC_K: products summed in the tensor cores' own accumulator before each promotion to fp32
            # (Hopper's FP8 accumulator keeps fewer bits than fp32: a small ACC_K keeps the sum exact)
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=ACC_K)
    mask = mm[:, None] & mn[None, :]
    if PARTIAL:
        tl.store(p_ptr + (pid_k * M + rm[:, None]) * N + rn[None, :], acc, mask=mask)
    else:
        acc = acc * tl.load(as_ptr + rm, mask=mm, other=0.0)[:, None]
        acc = acc * tl.load(bs_ptr + rn, mask=mn, other=0.0)[None, :]
        tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mm_reduce(p_ptr, as_ptr, bs_ptr, c_ptr, M, N, SPLIT, s_cm, BLOCK: tl.constexpr):
    """c = (sum_s p[s]) * xs[m] * scale[n], the SPLIT partials added in order."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(p_ptr + s * M * N + offs, mask=mask, other=0.0)
    m = offs // N
    n = offs % N
    acc = acc * tl.load(as_ptr + m, mask=mask, other=0.0) * tl.load(bs_ptr + n, mask=mask, other=0.0)
    tl.store(c_ptr + m * s_cm + n, acc.to(c_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _sms(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick(m: int, n: int, k: int, device: torch.device, tile: dict | None = None) -> dict:
    """BLOCK_M covers the rows (16..128), BLOCK_N 64, BLOCK_K 128, four stages (``tile`` overrides any of
    these: the benchmark's sweep); K split in two until the strips x row blocks x slices reach two programs
    per multiprocessor, unless ``tile`` gives SPLIT."""
    sms = _sms(device.index) if device.type == "cuda" else 132
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    cfg = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=128, STAGES=4, num_warps=4, SPLIT=1, **(tile or {}))
    progs = triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(m, cfg["BLOCK_M"])
    if "SPLIT" not in (tile or {}):
        while progs * cfg["SPLIT"] < 2 * sms and k // (2 * cfg["SPLIT"]) >= 4 * cfg["BLOCK_K"]:
            cfg["SPLIT"] *= 2
    return cfg


def fp8_gemm_triton(xq: torch.Tensor, xs: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    out_dtype: torch.dtype, config: dict | None = None) -> torch.Tensor:
    """xq (M, K) e4m3, xs (M, 1) fp32, q (N, K) e4m3, scale (N,) fp32 -> (M, N) ``out_dtype``."""
    m, k = xq.shape
    n = q.shape[0]
    cfg = dict(config) if config else pick(m, n, k, xq.device)
    bk = cfg["BLOCK_K"]
    k_split = triton.cdiv(triton.cdiv(k, cfg["SPLIT"]), bk) * bk
    split = triton.cdiv(k, k_split)
    y = torch.empty(m, n, device=xq.device, dtype=out_dtype)
    p = torch.empty(split, m, n, device=xq.device, dtype=torch.float32) if split > 1 else y
    xs = xs.reshape(m).contiguous()
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split, triton.cdiv(m, cfg["BLOCK_M"]))
    _mm[grid](xq, xs, q, scale, y, p, m, n, k, k_split, xq.stride(0), q.stride(0), y.stride(0),
              BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk, STAGES=cfg["STAGES"], PARTIAL=split > 1,
              F32=xq.device.type != "cuda", ACC_K=cfg.get("ACC_K", 32), num_warps=cfg["num_warps"])
    if split > 1:
        _mm_reduce[(triton.cdiv(m * n, 1024),)](p, xs, scale, y, m, n, split, y.stride(0), BLOCK=1024, num_warps=4)
    return y
