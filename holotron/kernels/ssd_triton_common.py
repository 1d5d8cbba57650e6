"""What the Triton scans and the decode step share: the ``@triton.jit`` helpers (dt processing, the
matrix product in the right precision, a chunk's bounds), the first launch of both scans
(``_dt_cumsum``), and the host side of a scan's set-up (``prepare_scan``: token-major views, the chunk
layout, the output buffer, processed dt and the in-chunk cumulative decay).

Chunks hold at most Q tokens and never straddle a sequence boundary; sequence s (a batch row, or one
``cu_seqlens`` segment) owns ceil(len_s / Q) consecutive chunks. With a chunk table (``chunk_table``,
always with ``cu_seqlens``) the kernels read each chunk's bounds from it; without one they compute
them from (batch row, index). Tokens are addressed in the flattened (batch * seqlen) axis. Decay math,
accumulation and the state are fp32; the matrix products take fp32 operands in IEEE precision for fp32
inputs (no TF32) and half operands for bf16 / fp16 inputs. float64 inputs are computed in fp32.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

# Every buffer the wrappers of ssd_triton_scan.py, ssd_triton_chunks.py and ssd_triton_step.py hand to
# a kernel comes from ``empty`` below, which calls this. Tests swap it for a NaN-filled allocation, so an
# element a kernel should have written but did not shows up as NaN.
_empty = torch.empty


def empty(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised buffer for a kernel to fill (through ``_empty``, looked up at each call)."""
    return _empty(*shape, dtype=dtype, device=device)

_DOT_MIN = 16  # compiled tl.dot needs every block dimension >= 16


def _p2(v: int, lo: int = _DOT_MIN) -> int:
    return max(lo, triton.next_power_of_2(v))


@triton.jit
def _process_dt(dt, bias, lo, hi, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr):
    """dt (fp32) -> clamp(softplus?(dt + bias), lo, hi), as torch's F.softplus (threshold 20)."""
    if HAS_BIAS:
        dt = dt + bias
    if SOFTPLUS:
        sp = tl.log(1.0 + tl.exp(tl.minimum(dt, 20.0)))
        dt = tl.where(dt > 20.0, dt, tl.where(dt < -15.0, tl.exp(dt), sp))
    if CLAMP:
        dt = tl.minimum(tl.maximum(dt, lo), hi)
    return dt


@triton.jit
def _mm(a, b, like, OPS: tl.constexpr):
    """a @ b with fp32 accumulation. OPS: "half" casts the operands to like's dtype (bf16 / fp16),
    "ieee" multiplies fp32 operands in full precision (never TF32), "tf32" fp32 operands in TF32."""
    if OPS == "half":
        return tl.dot(a.to(like.dtype), b.to(like.dtype))
    elif OPS == "ieee":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))


@triton.jit
def _chunk_bounds(c, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr, L, CPS, Q, VARLEN: tl.constexpr):
    """Chunk c's token range [t0, t1), its sequence, its index in that sequence and whether it is the
    sequence's last. Without cu_seqlens, sequence s is batch row s and owns chunks s*CPS .. s*CPS+CPS-1."""
    if VARLEN:
        t0 = tl.load(cstart_ptr + c)
        t1 = tl.load(cend_ptr + c)
        seq = tl.load(cseq_ptr + c)
        ci = tl.load(cidx_ptr + c)
        last = tl.load(clast_ptr + c)
    else:
        seq = c // CPS
        ci = c - seq * CPS
        t0 = seq * L + ci * Q
        t1 = tl.minimum(t0 + Q, seq * L + L)
        last = (ci == CPS - 1).to(tl.int32)
    return t0, t1, seq, ci, last


# ----------------------------------------------------------------------------- launch 1 of both scans: dt, cumsum


@triton.jit
def _dt_cumsum(
    dt_ptr, bias_ptr, A_ptr, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr, dtp_ptr, cs_ptr,
    H, s_dt_t, s_dt_h, lo, hi, L, CPS, Q,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, VARLEN: tl.constexpr,
    QP: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Writes processed dt and cs = cumsum(dt * A) over the chunk, (h, chunks, QP) fp32 each;
    tokens past the chunk's end get dt = 0 (so cs stays flat and cs[QP - 1] is the chunk total)."""
    c = tl.program_id(0)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    n_chunks = tl.num_programs(0)
    t0, t1, _, _, _ = _chunk_bounds(c, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr, L, CPS, Q, VARLEN)
    q = tl.arange(0, QP)
    tok = (t0 + q).to(tl.int64)
    mq = (t0 + q) < t1
    mh = hs < H
    m = mq[:, None] & mh[None, :]
    dt = tl.load(dt_ptr + tok[:, None] * s_dt_t + hs[None, :] * s_dt_h, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + hs, mask=mh, other=0.0).to(tl.float32)[None, :]
    else:
        bias = 0.0
    dt = _process_dt(dt, bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP)
    dt = tl.where(m, dt, 0.0)
    A = tl.load(A_ptr + hs, mask=mh, other=0.0).to(tl.float32)
    cs = tl.cumsum(dt * A[None, :], axis=0)  # (QP, BLOCK_H)
    off = (hs[None, :].to(tl.int64) * n_chunks + c) * QP + q[:, None]
    tl.store(dtp_ptr + off, dt, mask=mh[None, :])
    tl.store(cs_ptr + off, cs, mask=mh[None, :])



def _tokens(t: torch.Tensor) -> torch.Tensor:
    """(b, l, *rest) -> (b * l, *rest), a view when the strides allow; last dim unit-stride."""
    t = t.reshape(-1, *t.shape[2:])
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t


def _dot_ops(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "ieee"
    if dtype == torch.bfloat16 and _interpreting():
        return "tf32"  # the interpreter (triton 3.9) multiplies bf16 dot operands as raw bits
    return "half"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def chunk_table(cu: torch.Tensor, n_max: int, chunk_size: int):
    """Chunks of at most ``chunk_size`` tokens per sequence, on cu's device, without a host sync.

    cu (s+1,) int64 token offsets. Returns a dict of (n_max,) int32 arrays: start, end (token range;
    empty past the last chunk), seq (-1 past the last chunk), idx (index in its sequence), last (1 for
    a sequence's last chunk); and choff (s+1,) int32: sequence i owns chunks choff[i] .. choff[i+1] - 1.
    """
    lens = cu[1:] - cu[:-1]
    nch = (lens + chunk_size - 1) // chunk_size
    choff = torch.cat([torch.zeros(1, dtype=cu.dtype, device=cu.device), nch.cumsum(0)])
    j = torch.arange(n_max, dtype=cu.dtype, device=cu.device)
    seq = (torch.searchsorted(choff, j, right=True) - 1).clamp(0, lens.numel() - 1)
    idx = j - choff[seq]
    start = cu[seq] + idx * chunk_size
    end = torch.minimum(start + chunk_size, cu[seq + 1])
    valid = j < choff[-1]
    i32 = lambda t: torch.where(valid, t, 0).to(torch.int32)  # noqa: E731
    return dict(start=i32(start), end=i32(end), seq=torch.where(valid, seq, -1).to(torch.int32), idx=i32(idx),
                last=i32((j == choff[seq + 1] - 1).to(cu.dtype)), choff=choff.to(torch.int32))



def prepare_scan(x, dt, A, B, C, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, chunk_size, *, varlen: bool):
    """The set-up both scans start with, and their first launch (``_dt_cumsum``).

    ``varlen``: chunk bounds from a chunk table (needed with ``cu_seqlens``; the four-kernel scan always
    uses one) rather than computed by the kernels. Returns a namespace: out_dtype (x's), the inputs as
    token-major views ``xt, Bt, Ct, zt, dtt`` (float64 ones cast to fp32), the sizes ``b, l, h, p, g, n,
    Q, QP, n_seq, cps, n_max``, ``A32``, the table ``tab`` (or None) and ``ctab`` (its five arrays as
    kernel arguments), ``y`` (b, l, h, p) unfilled and its view ``yt``, ``dtp`` and ``cs`` (h, n_max, QP)
    fp32 filled, and ``ops`` (the operand precision of the matrix products).
    """
    out_dtype = x.dtype
    if x.dtype == torch.float64:  # the kernels compute in fp32
        x, B, C = x.float(), B.float(), C.float()
        z = None if z is None else z.float()
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    dev = x.device
    Q = int(chunk_size)
    QP = _p2(Q)
    if cu_seqlens is None:
        n_seq = b
        cps = triton.cdiv(l, Q)
        n_max = b * cps
        cu = torch.arange(b + 1, device=dev, dtype=torch.int64) * l if varlen else None
    else:
        n_seq = cu_seqlens.numel() - 1
        cps = 0
        cu = cu_seqlens.to(device=dev, dtype=torch.int64)
        n_max = triton.cdiv(l, Q) + n_seq - 1  # sum_i ceil(len_i / Q) <= this, for lengths >= 1
    A32 = A.float().contiguous()
    tab = chunk_table(cu, n_max, Q) if varlen else None
    ctab = (tab["start"], tab["end"], tab["seq"], tab["idx"], tab["last"]) if varlen else (A32,) * 5  # (not read)

    xt, Bt, Ct, dtt = _tokens(x), _tokens(B), _tokens(C), _tokens(dt)
    zt = None if z is None else _tokens(z)
    y = empty(b, l, h, p, dtype=x.dtype, device=dev)

    # processed dt and the in-chunk cumulative decay, (h, chunks, QP) each
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")
    dtp = empty(h, n_max, QP, dtype=torch.float32, device=dev)
    cs = empty(h, n_max, QP, dtype=torch.float32, device=dev)
    BLOCK_H = min(_p2(h, 1), max(1, 4096 // QP), 32)
    bias = None if dt_bias is None else dt_bias.float().contiguous()
    _dt_cumsum[(n_max, triton.cdiv(h, BLOCK_H))](
        dtt, bias if bias is not None else A32, A32, *ctab, dtp, cs,
        h, dtt.stride(0), dtt.stride(1), lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38, l, max(cps, 1), Q,
        HAS_BIAS=bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp, VARLEN=varlen, QP=QP, BLOCK_H=BLOCK_H,
    )
    return SimpleNamespace(out_dtype=out_dtype, xt=xt, Bt=Bt, Ct=Ct, zt=zt, dtt=dtt, b=b, l=l, h=h, p=p, g=g, n=n,
                           Q=Q, QP=QP, n_seq=n_seq, cps=cps, n_max=n_max, A32=A32, tab=tab, ctab=ctab,
                           y=y, yt=y.view(b * l, h, p), dtp=dtp, cs=cs, ops=_dot_ops(x.dtype))
