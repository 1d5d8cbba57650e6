"""The SSD scan's backward in two Triton kernels: the gradients of ``ssd_scan(..., backend="triton")``.

Called by ``ssd_triton_autograd.py`` (the ``torch.autograd.Function``); arguments are those of the
forward after dt processing (``dt`` is the processed fp32 step, +bias / softplus / clamp done in PyTorch)
plus the states the forward stored (the state entering every chunk).

For one chunk of Q tokens (positions t, s; a = A dt; cs = cumsum of a within the chunk, cL its last
value; L[t, s] = exp(cs_t - cs_s) for t >= s, else 0; S^T the state entering the chunk, (n, p); dS^T the
gradient with respect to the state leaving it):

    forward   y = Wm x + exp(cs) (C S^T) + D x,  Wm = (C B^T) * L * dt[None, :]
              S^T_out = exp(cL) S^T + B^T (x * w),  w = dt * exp(cL - cs)
    backward  R = B dS^T                                   (Q, p)
              dx = Wm^T dy + w R (+ D dy)
              dWm = (dy x^T) masked to t >= s;  dM = dWm * dt[None, :];  dG = dM * L
              dC = dG B + exp(cs) (dy S);  dB = dG^T C + (x w) dS        (summed over a group's heads)
              ddt = colsum(dWm * M) + exp(cL - cs) dw + A da,  dw_s = x_s . R_s
              dcs = rowsum(E) - colsum(E) + rowsum(dy * exp(cs) (C S^T)) - dw w,  E = dM * M
                    (+ dcL = exp(cL) sum(dS^T * S^T) + sum(dw w) on the last token)
              da = reverse cumsum of dcs;  dA += sum(dt da)
              dS^T_in = exp(cL) dS^T + C^T (dy * exp(cs))   (after chunk 0: the initial state's gradient)

Only the last line runs from chunk to chunk; given dS^T of every chunk the rest is independent per chunk.
So the backward is a state pass and a chunk kernel (launched twice, to keep fewer tiles live at once):

- ``_bwd_dstate``: one program per (headdim block, head, sequence) walks the sequence's chunks in reverse
  with dS^T on chip (fp32) and stores the gradient leaving each chunk (beside the forward's states, in the
  same layout and dtype), and the initial state's gradient at the end; on the way it adds dD over the
  sequence and its block's share of sum(dS^T * S^T) per chunk (for dcL).
- ``_bwd_chunk``: one program per (chunk, group x head split), for each of its heads, from the stored states
  and state gradients: PART "dbc" dB and dC (the heads' added in registers) and the dcs term
  exp(cs) rowsum(C * (dy S)); then PART "dx" (C B^T once) dx, ddt and a per (chunk, head) partial of dA.
  The split partials of dB and dC, the chunk partials of dA and the sequence partials of dD are added by
  PyTorch (a fixed order: deterministic, no atomics).

Tiles are read and written through tensor descriptors (TMA on Hopper) where addresses allow
(``BWD_CONFIG["tma"]``), else through masked pointers; decays are exp2 of log2-scaled cumulative sums.

The formulas are checked against torch autograd through the float64 chunked scan in
``tests/test_kernels_grad.py`` (a PyTorch transcription of them lives there too). Decays, the state
gradient's recurrence and every accumulation are fp32; the matrix products take the forward's operand
precision (``_mm``: IEEE fp32 for fp32 inputs, half operands for bf16 / fp16), and the stored states and
state gradients are in the operand dtype (the forward rounds the state to it for C S^T as well). The
chunk is padded to QP = the next power of two >= 16, headdim and dstate to powers of two >= 16, by masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .ssd_triton_bwd_chunk import _bwd_chunk
from .ssd_triton_common import (
    _DOT_MIN,
    _desc,
    _dot_ops,
    _ensure_allocator,
    _mm,
    _p2,
    _sdesc,
    _sload,
    _sm_count,
    _sstore,
    _tile,
    _tma_ok,
    _tokens,
    empty,
)

# Launch settings (the benchmark sweeps them). chunk_size: the longest chunk the training entry uses for
# the forward and the backward (the caller's chunk_size when shorter; None: the caller's); BLOCK_P: headdim columns per
# program of the state-gradient pass (a power of two >= 16; None: 64, or 32 when sequences x heads are few);
# HEADS: heads per program of the chunk kernel (a divisor of the heads per group; None: all of them when
# chunks x groups give every SM two programs, else fewer); warps of each kernel; stages of the state pass.
# Measured on an H200 (docs/benchmarks.md): one head per program (HEADS 1) was the fastest, 16 and 4 were
# slower (more spills), 128-token chunks ran out of shared memory. tma: tiles through tensor descriptors (TMA on
# Hopper) where addresses and strides are 16-byte multiples (True; None / False: masked pointers, which measured
# faster on an H200: 3.19 vs 4.04 ms forward + backward at 1 x 4096). A persistent chunk kernel (programs
# walking every L-th chunk, the next chunk's tiles loaded while one computes) measured slower there (3.98-4.13 vs
# 2.89 ms at 1 x 4096; docs/benchmarks.md) and was taken out.
BWD_CONFIG = dict(chunk_size=64, BLOCK_P=None, HEADS=1, warps_state=4, warps_chunk=8, stages=2, tma=None)

# The compiled kernels of the last launch ("dstate", "chunk"), for the benchmark's register counts.
LAST_KERNEL = {}


@triton.jit
def _bwd_dstate(
    x_ptr, dt_ptr, A_ptr, C_ptr, dy_ptr, dfin_ptr, st_ptr, dst_ptr, dinit_ptr, cu_ptr, choff_ptr, dsp_ptr,
    dD_ptr, H, P, N, HPG, Q, n_rows, n_pb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_c_t, s_c_g, s_dy_t, s_dy_h,
    HAS_D: tl.constexpr, HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr,
    NP: tl.constexpr,
    OPS: tl.constexpr, NS: tl.constexpr, TMA: tl.constexpr,
):
    """One program per (headdim block, head, sequence): dS^T through the chunks in reverse. Stores, at row
    choff[s] + c of dst (chunks, H, P, N), the gradient with respect to the state leaving chunk c, and at
    dsp[choff[s] + c, h, pb] this block's share of sum(dS * S) (S: the state entering chunk c, from st; both
    rounded to st's dtype) for the chunk kernel's dcL; with HAS_D, at dD[s, h, p] sum_t dy * x over the
    sequence."""
    LOG2E: tl.constexpr = 1.4426950408889634
    pb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    g = h // HPG
    sh = s.to(tl.int64) * H + h
    ts = tl.load(cu_ptr + s)
    te = tl.load(cu_ptr + s + 1)
    n_tok = te - ts
    cbase = tl.load(choff_ptr + s)
    nch = (n_tok + Q - 1) // Q
    A = tl.load(A_ptr + h).to(tl.float32) * LOG2E  # decays in the log2 domain (exp2)
    q = tl.arange(0, QP)
    p0 = pb * BP
    ps = p0 + tl.arange(0, BP)
    ns = tl.arange(0, NP)
    mp = ps < P
    mn = ns < N
    mnp = mn[:, None] & mp[None, :]
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    # the sequence's rows of C (its group) and dy (this head, from this program's first column)
    ts64 = ts.to(tl.int64)
    cd = _desc(C_ptr + ts64 * s_c_t + g * s_c_g, n_tok, N, s_c_t, QP, NP, TMA)
    dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0, n_tok, P - p0, s_dy_t, QP, BP, TMA)
    if HAS_D:
        xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h + p0, n_tok, P - p0, s_x_t, QP, BP, TMA)
        dD = tl.zeros((BP,), dtype=tl.float32)
    sd = _sdesc(dst_ptr, n_rows * H, P, N, BP, NP, TMA)
    std = _sdesc(st_ptr, n_rows * H, P, N, BP, NP, TMA)
    if HAS_DFINAL:
        dS = tl.load(dfin_ptr + (sh * P + ps[None, :]) * N + ns[:, None], mask=mnp, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros((NP, BP), dtype=tl.float32)
    for i in tl.range(0, nch, num_stages=NS):
        ci = nch - 1 - i
        r0 = ci * Q
        mq = (q < Q) & (r0 + q < n_tok)
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums as masked row sums of a (Q, Q) tile (no tl.cumsum: see _bwd_chunk)
        cs = tl.sum(tl.where(causal, (dt * A)[None, :], 0.0), axis=1)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)  # flat past the chunk's end (dt = 0 there)
        mat = (cbase + ci) * H + h
        dSo = tl.trans(dS).to(dst_ptr.dtype.element_ty)  # (p, n) as stored
        _sstore(sd, mat, p0, P, N, dSo, BP, NP, TMA)
        S = _sload(std, mat, p0, P, N, BP, NP, TMA)
        tl.store(dsp_ptr + mat.to(tl.int64) * n_pb + pb, tl.sum(tl.sum(dSo.to(tl.float32) * S.to(tl.float32), axis=1),
                                                               axis=0))
        # rows of the tiles past the chunk (the next chunk's when Q < QP) get a zero weight
        Cm = _tile(cd, r0, n_tok, N, s_c_t, QP, NP, TMA, True)  # (Q, n)
        dy = _tile(dyd, r0, n_tok, P - p0, s_dy_t, QP, BP, TMA, True)
        ecs = tl.where(mq, tl.exp2(cs), 0.0)
        if HAS_D:
            xv = _tile(xd, r0, n_tok, P - p0, s_x_t, QP, BP, TMA, True)
            dD += tl.sum(tl.where(mq[:, None], dy.to(tl.float32) * xv.to(tl.float32), 0.0), axis=0)
        dS = tl.exp2(cL) * dS + _mm(tl.trans(Cm), dy.to(tl.float32) * ecs[:, None], dy, OPS)
    if HAS_D:
        tl.store(dD_ptr + sh * P + ps, dD, mask=mp)
    if HAS_INIT:
        tl.store(dinit_ptr + (sh * P + ps[None, :]) * N + ns[:, None], dS, mask=mnp)


def bwd_launch(n_seq: int, n_chunks: int, h: int, g: int, p: int, dev: torch.device) -> dict:
    """BWD_CONFIG with its automatic choices made (see BWD_CONFIG)."""
    cfg = dict(BWD_CONFIG)
    sms = _sm_count(dev)
    if cfg["BLOCK_P"] is None:
        cfg["BLOCK_P"] = 64 if n_seq * h * triton.cdiv(p, 64) >= 2 * sms else 32
    hpg = h // g
    if cfg["HEADS"] is None:
        hs = hpg
        while hs > 1 and hs % 2 == 0 and n_chunks * g * (hpg // hs) < 2 * sms:
            hs //= 2
        cfg["HEADS"] = hs
    return cfg


def ssd_scan_triton_bwd(x, dt, A, B, C, D, states, choff, Q, dy, dfinal=None, cu_seqlens=None, has_init=False):
    """Gradients of the SSD scan (without z, whose gate autograd handles) from two Triton launches.

    x (b, l, h, p); dt (b, l, h) processed fp32; A (h,); B, C (b, l, g, n); D None, (h,) or (h, p); states
    (chunks, h, p, n), the state entering each chunk (the forward's ``store_states``; fp32, or x's dtype
    when that is bf16 / fp16); choff (n_seq + 1,) int: sequence s owns chunks choff[s] .. choff[s+1]-1 (rows
    past the last are not read); Q the forward's chunk length; dy like x; dfinal (n_seq, h, p, n) or None;
    cu_seqlens as given to the forward (batch 1) or None; has_init: the forward had an initial state (its
    gradient is then returned).

    Returns (dx like x, ddt (b, l, h) fp32, dA (h,) fp32, dB, dC like B, dD fp32 like D or None, dinit
    (n_seq, h, p, n) fp32 or None). float64 inputs are computed in fp32 (as the forward) and returned in
    their dtype.
    """
    in_dtype, b_dtype = x.dtype, B.dtype
    if x.dtype == torch.float64:
        x, B, C = x.float(), B.float(), C.float()
    dy = dy.to(x.dtype)
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    if h % g:
        raise ValueError(f"heads ({h}) must be a multiple of groups ({g})")
    dev = x.device
    ops = _dot_ops(x.dtype)
    Q = int(Q)
    if cu_seqlens is None:
        n_seq = b
        cu = torch.arange(b + 1, device=dev, dtype=torch.int32) * l
    else:
        n_seq = cu_seqlens.numel() - 1
        cu = cu_seqlens.to(device=dev, dtype=torch.int32)
    choff = choff.to(device=dev, dtype=torch.int32)
    n_rows = states.shape[0]
    # the sequence of every chunk row (n_seq for rows past the last sequence's chunks): no host sync
    cseq = torch.searchsorted(choff[1:].contiguous(), torch.arange(n_rows, device=dev, dtype=torch.int32),
                              right=True).to(torch.int32)
    cfg = bwd_launch(n_seq, n_rows, h, g, p, dev)
    bp, hps = int(cfg["BLOCK_P"]), int(cfg["HEADS"])
    if bp < _DOT_MIN or bp & (bp - 1):
        raise ValueError(f"BWD_CONFIG['BLOCK_P'] must be a power of two >= {_DOT_MIN}, got {bp}")
    if hps < 1 or (h // g) % hps:
        raise ValueError(f"BWD_CONFIG['HEADS'] must divide the heads per group ({h // g}), got {hps}")
    n_split = (h // g) // hps

    xt, dtt, Bt, Ct, dyt = _tokens(x), _tokens(dt.float()), _tokens(B), _tokens(C), _tokens(dy)
    st = states if states.is_contiguous() else states.contiguous()
    A32 = A.float().contiguous()
    Dc = None if D is None else D.float().contiguous()
    dfin = None if dfinal is None else dfinal.float().contiguous()
    QP, PP, NP = _p2(Q), _p2(p), _p2(n)

    dst = empty(*st.shape, dtype=st.dtype, device=dev)
    n_tok = b * l
    dx = empty(n_tok, h, p, dtype=x.dtype, device=dev)
    dBp = empty(n_split, n_tok, g, n, dtype=torch.float32, device=dev)
    dCp = empty(n_split, n_tok, g, n, dtype=torch.float32, device=dev)
    tma = cfg.get("tma")
    if tma is None:  # not for fp32 inputs: with IEEE fp32 products ptxas spilled heavily (32 registers), offline
        tma = False  # measured slower than pointers on an H200 (docs/benchmarks.md): only when asked
    if tma:  # only where the addresses allow
        es = x.element_size()
        tma = (_tma_ok(es, [xt, dyt, dx, Bt, Ct], [xt.stride(1), dyt.stride(1), dx.stride(1), Bt.stride(1),
                                                    Ct.stride(1), bp])
               and _tma_ok(st.element_size(), [st, dst], [n, p * n])
               and _tma_ok(4, [dBp, dCp], [n]))
    if tma:
        _ensure_allocator()
    LAST_KERNEL["tma"] = bool(tma)
    dinit = empty(n_seq, h, p, n, dtype=torch.float32, device=dev) if has_init else None
    n_pb = triton.cdiv(p, bp)
    dsp = empty(n_rows, h, n_pb, dtype=torch.float32, device=dev)  # shares of sum(dS * S) (rows of chunks)
    dDs = empty(n_seq, h, p, dtype=torch.float32, device=dev) if D is not None else None  # dD per sequence
    try:
        LAST_KERNEL["dstate"] = _bwd_dstate[(n_pb, h, n_seq)](
            xt, dtt, A32, Ct, dyt, dfin if dfin is not None else A32, st, dst,
            dinit if dinit is not None else A32, cu, choff, dsp, dDs if dDs is not None else A32,
            h, p, n, h // g, Q, n_rows, n_pb,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Ct.stride(0), Ct.stride(1), dyt.stride(0),
            dyt.stride(1), HAS_D=D is not None, HAS_DFINAL=dfin is not None, HAS_INIT=bool(has_init), QP=QP,
            BP=bp, NP=NP, OPS=ops,
            NS=int(cfg["stages"]), TMA=bool(tma), num_warps=int(cfg["warps_state"]),
        )

        ddt = empty(n_tok, h, dtype=torch.float32, device=dev)
        # partial sums: rows of chunks past the last sequence stay zero
        dAp = torch.zeros(n_rows, h, dtype=torch.float32, device=dev)
        args = (xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, st, dst, dsp, dyt, cu, choff, cseq,
                dx, ddt, dAp, dBp, dCp,
                n_seq, n_tok, h, p, n, h // g, hps, Q, n_rows, n_pb,
                xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
                Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dx.stride(0), dx.stride(1))
        consts = dict(HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, QP=QP, PP=PP, NP=NP,
                      OPS=ops, TMA=bool(tma), NPB=triton.next_power_of_2(n_pb),
                      num_warps=int(cfg["warps_chunk"]))
        grid = (n_rows, g * n_split)
        LAST_KERNEL["dbc"] = _bwd_chunk[grid](*args, PART="dbc", **consts)
        LAST_KERNEL["chunk"] = _bwd_chunk[grid](*args, PART="dx", **consts)
    except OutOfResources as e:
        raise ValueError(f"the Triton backward's tiles (chunk {Q}, headdim {p}, dstate {n}, {x.dtype}) do not fit "
                         f"this GPU ({e}); use bf16 / fp16 inputs or backend='chunked'") from None
    dA = dAp.sum(0)
    dD = None
    if D is not None:
        dDh = dDs.sum(0)
        dD = dDh if D.dim() == 2 else dDh.sum(1)
    dB = dBp[0] if n_split == 1 else dBp.sum(0)
    dC = dCp[0] if n_split == 1 else dCp.sum(0)
    return (dx.view(b, l, h, p).to(in_dtype), ddt.view(b, l, h), dA, dB.view(b, l, g, n).to(b_dtype),
            dC.view(b, l, g, n).to(b_dtype), dD, dinit)
