"""The SSD scan's forward in two passes over the chunks (``SCAN_CONFIG["TWO_PASS"]``, off by default): the
structure of the chunked scans of other libraries (each chunk's state, a pass over the chunks, each chunk's
output), the alternative to the one-walk kernel (ssd_triton_scan.py), in three launches where they take five:

    _tp_states  one program per (headdim block, chunk, head, sequence), all in parallel: the chunk's own
                state, S_c^T = (B * dt * exp(cs_end - cs))^T @ x (dstate x columns), written to ``states``
                in ``states_dtype``, and the chunk's decay exp(cs_end) to ``decay``
    _tp_pass    one program per (block of a state's elements, head, sequence): walks the chunks in order,
                S = exp(cs_end) S + S_c, overwriting each chunk's own state with the state entering it
                (fp32 in registers), and writes the final state
    _tp_out     one program per (headdim block, rows of a chunk, head, sequence), all in parallel: those
                rows' y as the walk computes it, (C B^T * L) @ x + exp(cs) (C @ S_in^T) + D x, times silu(z),
                the intra-chunk product over the chunk's columns up to the rows, QR at a time

The walk keeps the state on chip and walks the chunks of a (sequence, head) in one program: at batch 1
that is a few hundred programs in a latency-bound chain. Here every chunk is a program of its own in the
first and last launches; the price is the chunk states written, read and written again, and read (in
``states_dtype``: bf16 halves it), so larger chunks suit it (fewer states). The buffer takes batch x chunks x
heads x headdim x dstate elements (5.4 GB in fp32 at 8 x 16384 tokens in chunks of 128 at the 12B sizes).
After the pass it holds the state entering every chunk: what the backward reads (``store_states``), at no
extra cost. Batch rows only: with ``cu_seqlens`` ``ssd_scan_triton_fwd`` takes the walk. Numerics as the
walk's (ssd_triton_scan.py's docstring): fp32 decays and accumulation, half operands for bf16 / fp16 inputs,
the state rounded to the operand dtype for C @ S^T.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from .ssd_triton_common import (
    _desc,
    _dot_ops,
    _ensure_allocator,
    _load_D,
    _mm,
    _p2,
    _process_dt,
    _put_y,
    _seq_descs,
    _tile,
    _tma_ok,
    _tokens,
    empty,
)

__all__ = ["scan_two_pass", "two_pass_fwd"]


@triton.jit
def _chunk_dt(dt_ptr, A_ptr, bias_ptr, row0, h, n_tok, s_dt_t, s_dt_h, lo, hi, qs,
              HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr):
    """The chunk's processed dt (0 past the sequence's end) and dt * A in the log2 domain, (Q,) fp32 each."""
    mq = qs < n_tok
    A = tl.load(A_ptr + h).to(tl.float32) * 1.4426950408889634
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h).to(tl.float32)
    else:
        bias = 0.0
    dt = tl.load(dt_ptr + (row0 + qs).to(tl.int64) * s_dt_t + h * s_dt_h, mask=mq, other=0.0)
    dt = tl.where(mq, _process_dt(dt.to(tl.float32), bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP), 0.0)
    return dt, dt * A


@triton.jit
def _tp_states(x_ptr, dt_ptr, A_ptr, B_ptr, bias_ptr, states_ptr, decay_ptr,
               L, H, P, N, HPG, NC, NPB, lo, hi,
               s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g,
               HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr,
               Q: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, MASK_P: tl.constexpr, MASK_N: tl.constexpr,
               OPS: tl.constexpr, TMA: tl.constexpr):
    """Program ((chunk * H + head) * NPB + headdim block, sequence): the chunk's own state into ``states`` (the
    chunks and heads on the grid's first axis, whose size has no 65,535 limit)."""
    pb = tl.program_id(0) % NPB
    c = tl.program_id(0) // NPB // H
    h = tl.program_id(0) // NPB % H
    s = tl.program_id(1)
    p0 = pb * BP
    g = h // HPG
    row0 = s * L + c * Q               # the chunk's first token row
    n_tok = L - c * Q                  # tokens left in the sequence from there
    qs = tl.arange(0, Q)
    ns = tl.arange(0, BN)
    cols = p0 + tl.arange(0, BP)
    dt, a = _chunk_dt(dt_ptr, A_ptr, bias_ptr, row0, h, n_tok, s_dt_t, s_dt_h, lo, hi, qs,
                      HAS_BIAS, SOFTPLUS, CLAMP)
    w = dt * tl.exp2(tl.cumsum(a, axis=0, reverse=True) - a)   # dt_s times the decay from s to the chunk's end
    t_seq = (s * L).to(tl.int64)       # tiles at rows of the sequence (descriptors: 0 past its end)
    xd = _desc(x_ptr + t_seq * s_x_t + h * s_x_h + p0, L, P - p0, s_x_t, Q, BP, TMA)
    bd = _desc(B_ptr + t_seq * s_b_t + g * s_b_g, L, N, s_b_t, Q, BN, TMA)
    xv = _tile(xd, c * Q, L, P - p0, s_x_t, Q, BP, TMA, MASK_P)
    Bv = _tile(bd, c * Q, L, N, s_b_t, Q, BN, TMA, MASK_N)
    BwT = tl.trans((Bv * w[:, None]).to(Bv.dtype))
    ST = _mm(BwT, xv, xv, OPS)                                  # (BN, BP) fp32
    base = ((s * NC + c).to(tl.int64) * H + h) * P * N
    tl.store(states_ptr + base + ns[:, None] + cols[None, :] * N, ST.to(states_ptr.dtype.element_ty),
             mask=(ns < N)[:, None] & (cols < P)[None, :])
    if pb == 0:
        tl.store(decay_ptr + (s * NC + c) * H + h, tl.exp2(tl.sum(a, axis=0)))


@triton.jit
def _tp_pass(states_ptr, decay_ptr, init_ptr, final_ptr, H, P, N, NC,
             HAS_INIT: tl.constexpr, BLK: tl.constexpr):
    """Program (block of BLK elements of a (P, N) state, head, sequence): the chunks in order."""
    h = tl.program_id(1)
    s = tl.program_id(2)
    e = tl.program_id(0) * BLK + tl.arange(0, BLK)
    m = e < P * N
    fin = (s.to(tl.int64) * H + h) * P * N + e
    if HAS_INIT:
        S = tl.load(init_ptr + fin, mask=m, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BLK], dtype=tl.float32)
    for c in tl.range(0, NC, num_stages=3):  # the loads do not depend on S: pipelined ahead of the chain
        at = ((s * NC + c).to(tl.int64) * H + h) * P * N + e
        own = tl.load(states_ptr + at, mask=m, other=0.0).to(tl.float32)
        tl.store(states_ptr + at, S.to(states_ptr.dtype.element_ty), mask=m)
        S = S * tl.load(decay_ptr + (s * NC + c) * H + h) + own
    tl.store(final_ptr + fin, S, mask=m)


@triton.jit
def _tp_out(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, states_ptr, y_ptr,
            L, H, P, N, HPG, NC, NPB, lo, hi,
            s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h,
            HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
            SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, Q: tl.constexpr, QR: tl.constexpr, BP: tl.constexpr,
            BN: tl.constexpr, MASK_P: tl.constexpr, MASK_N: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr):
    """Program ((((chunk * H + head) * Q / QR + row block) * NPB + headdim block), sequence): y of QR rows of a
    chunk from the state entering the chunk and the chunk's tokens up to those rows (QR columns at a time)."""
    NR: tl.constexpr = Q // QR
    pb = tl.program_id(0) % NPB
    rest = tl.program_id(0) // NPB
    r = rest % NR
    c = rest // NR // H
    h = rest // NR % H
    s = tl.program_id(1)
    p0 = pb * BP
    g = h // HPG
    row0 = s * L + c * Q               # the chunk's first token row
    n_tok = L - c * Q
    q0 = c * Q                         # the same within the sequence
    qs = tl.arange(0, Q)
    ks = tl.arange(0, QR)
    ns = tl.arange(0, BN)
    cols = p0 + tl.arange(0, BP)
    _, a_all = _chunk_dt(dt_ptr, A_ptr, bias_ptr, row0, h, n_tok, s_dt_t, s_dt_h, lo, hi, qs,
                         HAS_BIAS, SOFTPLUS, CLAMP)
    o = r * QR
    dt_r, a_r = _chunk_dt(dt_ptr, A_ptr, bias_ptr, row0 + o, h, n_tok - o, s_dt_t, s_dt_h, lo, hi, ks,
                          HAS_BIAS, SOFTPLUS, CLAMP)
    cs_r = tl.sum(tl.where(qs < o, a_all, 0.0), axis=0) + tl.cumsum(a_r, axis=0)
    Dv = _load_D(D_ptr, h, P, cols, HAS_D, D_PER_CHANNEL)
    t_seq = (s * L).to(tl.int64)       # tiles at rows of the sequence (descriptors: 0 past its end)
    xd, bd, cd, yd, zd = _seq_descs(x_ptr, B_ptr, C_ptr, y_ptr, z_ptr, t_seq, L, h, g, p0, P, N, s_x_t, s_x_h,
                                    s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h, QR, BP, BN, TMA, HAS_Z)
    Cv = _tile(cd, q0 + o, L, N, s_c_t, QR, BN, TMA, MASK_N)
    base = ((s * NC + c).to(tl.int64) * H + h) * P * N
    ST = tl.load(states_ptr + base + ns[:, None] + cols[None, :] * N,
                 mask=(ns < N)[:, None] & (cols < P)[None, :], other=0.0)
    y = _mm(Cv, ST, Cv, OPS) * tl.exp2(cs_r)[:, None]
    for k in range(0, r + 1):  # the chunk's columns up to these rows, QR at a time
        dt_k, a_k = _chunk_dt(dt_ptr, A_ptr, bias_ptr, row0 + k * QR, h, n_tok - k * QR, s_dt_t, s_dt_h, lo, hi,
                              ks, HAS_BIAS, SOFTPLUS, CLAMP)
        cs_k = tl.sum(tl.where(qs < k * QR, a_all, 0.0), axis=0) + tl.cumsum(a_k, axis=0)
        Bv = _tile(bd, q0 + k * QR, L, N, s_b_t, QR, BN, TMA, MASK_N)
        xv = _tile(xd, q0 + k * QR, L, P - p0, s_x_t, QR, BP, TMA, MASK_P)
        ok = (o + ks)[:, None] >= (k * QR + ks)[None, :]
        W = _mm(Cv, tl.trans(Bv), Cv, OPS) * tl.exp2(tl.where(ok, cs_r[:, None] - cs_k[None, :], float("-inf")))
        y += _mm(W * dt_k[None, :], xv, xv, OPS)
    xv = _tile(xd, q0 + o, L, P - p0, s_x_t, QR, BP, TMA, MASK_P)
    _put_y(y, xv, Dv, zd, yd, y_ptr, q0 + o, L, P - p0, s_z_t, s_y_t, QR, BP, TMA, MASK_P, HAS_D, HAS_Z)


def scan_two_pass(xt, dtt, A32, Bt, Ct, Dc, zt, bias, init, yt, final, *, b, l, h, p, g, n, lo, hi, clamp,
                  softplus, Q, BP, QR=None, num_warps=4, states_dtype=torch.float32, pass_block=1024,
                  D_per_channel=False, dtype=torch.bfloat16, tma=None) -> dict:
    """The three launches on the token-major views of ``ssd_scan_triton_fwd`` (xt (b*l, h, p), dtt (b*l, h),
    Bt / Ct (b*l, g, n), zt like xt or None, yt like xt; A32, bias, init, final fp32; Dc or None), writing
    yt and final; ``QR`` the output kernel's rows a program (a power of two dividing Q; None: min(Q, 64));
    ``tma``: tiles of x, B, C, z and y through tensor descriptors where the addresses allow (None: on a CUDA GPU
    of compute capability >= 9, as the walk).
    Returns the compiled kernels by name (the benchmark reads their registers) and, as "states", the chunk
    states: row s * chunks + c the state entering chunk c of batch row s, (b * chunks, h, p, n)."""
    QR = min(Q, 64) if QR is None else int(QR)
    if QR < 16 or QR & (QR - 1) or Q % QR:
        raise ValueError(f"SCAN_CONFIG['TP_ROWS'] must be a power of two >= 16 dividing the chunk ({Q}), got {QR}")
    nc = triton.cdiv(l, Q)
    states = empty(b * nc, h, p, n, dtype=states_dtype, device=xt.device)
    decay = empty(b * nc, h, dtype=torch.float32, device=xt.device)
    ops, bn = _dot_ops(dtype), _p2(n)
    mask_p, mask_n = p % BP != 0, bn != n
    flags = dict(HAS_BIAS=bias is not None, SOFTPLUS=bool(softplus), CLAMP=clamp)
    hpg = h // g
    lo_, hi_ = (lo if clamp else 0.0), (hi if hi < float("inf") else 3.0e38)
    npb = triton.cdiv(p, BP)
    dev = xt.device
    if tma is None:
        tma = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    if tma:  # only where the addresses allow
        tiles = [xt, Bt, Ct, yt] + ([zt] if zt is not None else [])
        offsets = [xt.stride(1), Bt.stride(1), Ct.stride(1), yt.stride(1), BP]
        tma = _tma_ok(xt.element_size(), tiles, offsets + ([zt.stride(1)] if zt is not None else []))
    if tma:
        _ensure_allocator()
    k1 = _tp_states[(nc * h * npb, b)](
        xt, dtt, A32, Bt, bias if bias is not None else A32, states, decay, l, h, p, n, hpg, nc, npb, lo_, hi_,
        xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1), **flags,
        Q=Q, BP=BP, BN=bn, MASK_P=mask_p, MASK_N=mask_n, OPS=ops, TMA=bool(tma), num_warps=num_warps)
    k2 = _tp_pass[(triton.cdiv(p * n, pass_block), h, b)](
        states, decay, init if init is not None else final, final, h, p, n, nc, HAS_INIT=init is not None,
        BLK=pass_block, num_warps=4)
    k3 = _tp_out[(nc * h * (Q // QR) * npb, b)](
        xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, zt if zt is not None else xt,
        bias if bias is not None else A32, states, yt, l, h, p, n, hpg, nc, npb, lo_, hi_,
        xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
        Ct.stride(0), Ct.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)), yt.stride(0), yt.stride(1),
        HAS_D=Dc is not None, D_PER_CHANNEL=D_per_channel, HAS_Z=zt is not None, **flags,
        Q=Q, QR=QR, BP=BP, BN=bn, MASK_P=mask_p, MASK_N=mask_n, OPS=ops, TMA=bool(tma), num_warps=num_warps)
    return {"tp_states": k1, "tp_pass": k2, "tp_out": k3, "states": states, "tma": bool(tma)}


def two_pass_fwd(x, xt, dtt, A, Bt, Ct, D, z, dt_bias, dt_softplus, dt_limit, initial_state, cfg, Q, bp, out_dtype,
                 keep=None):
    """``ssd_scan_triton_fwd`` (ssd_triton_scan.py) through these launches, for batch rows: x and its token-major
    views, the launch settings ``cfg`` (SCAN_CONFIG's TP_* keys), the chunk Q and headdim block ``bp``. ``keep``:
    the dtype of the chunk states to return (``store_states``: row s * chunks + c is the state entering chunk c
    of row s, the walk's layout with ``states_chunk`` = Q); None: not returned (their dtype TP_STATES). Returns
    (that function's namespace, the compiled kernels by name)."""
    b, l, h, p = x.shape
    g, n = Bt.shape[-2:]
    zt = None if z is None else _tokens(z)
    y = empty(b, l, h, p, dtype=x.dtype, device=x.device)
    final = empty(b, h, p, n, dtype=torch.float32, device=x.device)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    kinds = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if cfg.get("TP_STATES", "fp32") not in kinds:
        raise ValueError(f"SCAN_CONFIG['TP_STATES'] must be 'fp32' or 'bf16', got {cfg.get('TP_STATES')!r}")
    sdtype = kinds[cfg.get("TP_STATES", "fp32")] if keep is None else keep
    rows = cfg.get("TP_ROWS")
    if keep is not None and rows:  # the chunk is the caller's states_chunk there: rows within it
        rows = min(int(rows), Q)
    kernels = scan_two_pass(
        xt, dtt, A.float().contiguous(), Bt, Ct, None if D is None else D.contiguous(), zt,
        None if dt_bias is None else dt_bias.float().contiguous(),
        None if initial_state is None else initial_state.float().contiguous(), y.view(b * l, h, p), final,
        b=b, l=l, h=h, p=p, g=g, n=n, lo=lo, hi=hi, clamp=lo > 0.0 or hi < float("inf"), softplus=dt_softplus,
        Q=Q, BP=bp, QR=rows, num_warps=int(cfg["num_warps"]), states_dtype=sdtype,
        pass_block=int(cfg.get("TP_BLOCK", 1024)), D_per_channel=D is not None and D.dim() == 2, dtype=x.dtype,
        tma=cfg.get("tma"))
    states, tma = kernels.pop("states"), kernels.pop("tma")
    nc = triton.cdiv(l, Q)
    choff = None if keep is None else torch.arange(b + 1, dtype=torch.int32, device=x.device) * nc
    return SimpleNamespace(y=y.to(out_dtype), final=final, states=None if keep is None else states, choff=choff, Q=Q,
                           states_Q=Q, n_max=b * nc, config=dict(cfg, Q=Q, tma=tma)), kernels
