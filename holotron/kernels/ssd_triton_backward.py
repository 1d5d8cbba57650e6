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

Only the last line runs from chunk to chunk. Two launches:

- ``_bwd_seq``: one program per (headdim block, head, sequence) walks the sequence's chunks in reverse with
  dS^T (dstate x its columns, fp32) on chip, as the forward walks them in order with the state, the loads
  of the next chunk pipelined with this one's products. Per chunk it computes what a block of headdim
  columns determines: dx of its columns (every term of dx is column by column), and its block's share of
  ddt and of dA (every term of ddt is a sum over the headdim: dy x^T, x . R, dy S, sum(dS * S) are sums
  over p, so the blocks' shares add up; PyTorch adds them), and dD; it stores the gradient of the state
  leaving each chunk (beside the forward's states, same layout and dtype) and, at the end, the initial
  state's.
- ``_bwd_dbc`` (ssd_triton_bwd_chunk.py): one program per (chunk, group, dstate block), all chunks in
  parallel, walks the group's heads adding the dG's and the state terms, then dB and dC of its block.

No atomics, every sum in a fixed order: deterministic. Tiles are read and written through tensor
descriptors (TMA on Hopper) where addresses allow (``BWD_CONFIG["tma"]``), else through masked pointers;
decays are exp2 of log2-scaled cumulative sums.

The formulas are checked against torch autograd through the float64 chunked scan in
``tests/test_kernels_grad.py`` (a PyTorch transcription of them lives there too). Decays, the state
gradient's recurrence and every accumulation are fp32; the matrix products take the forward's operand
precision (``_mm``: IEEE fp32 for fp32 inputs, half operands for bf16 / fp16), and the stored states and
state gradients are in the operand dtype (the forward rounds the state to it for C S^T as well; the reverse
pass rounds dS^T to it for its own products too, so both kernels see the same dS). The chunk is padded to
QP = the next power of two >= 16, headdim and dstate to powers of two >= 16, by masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .ssd_triton_bwd_chunk import _bwd_dbc
from .ssd_triton_common import (
    _DOT_MIN,
    _desc,
    _dot_ops,
    _ensure_allocator,
    _mm,
    _p2,
    _put,
    _sdesc,
    _sload,
    _sm_count,
    _sstore,
    _tile,
    _tma_ok,
    _tokens,
    empty,
)

# Launch settings (the benchmark sweeps them; None: the automatic choice of ``bwd_launch``). chunk_size: the
# longest chunk the training entry uses for the forward's stored states and the backward (the caller's
# chunk_size when shorter; None: the caller's); BLOCK_P: headdim columns per program of the reverse pass (a
# power of two >= 16); BLOCK_N: dstate columns per program of the dB / dC kernel (a power of two >= 16);
# warps and pipeline stages of each kernel ("seq": the reverse pass, "dbc": the dB / dC kernel); tma: tiles
# through tensor descriptors (TMA on Hopper) where addresses and strides are 16-byte multiples and the chunk
# is a power of two (True; None / False: masked pointers).
BWD_CONFIG = dict(chunk_size=64, BLOCK_P=None, BLOCK_N=None, warps_seq=None, warps_dbc=None, stages_seq=None,
                  stages_dbc=None, tma=None)

# The compiled kernels of the last launch ("seq", "dbc"), for the benchmark's register counts.
LAST_KERNEL = {}


@triton.jit
def _bwd_seq(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dy_ptr, dfin_ptr, st_ptr, dst_ptr, dinit_ptr, cu_ptr, choff_ptr,
    dx_ptr, ddtp_ptr, dAp_ptr, dD_ptr,
    H, P, N, HPG, n_rows, n_pb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr,
    Q: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr, NP: tl.constexpr, OPS: tl.constexpr, NS: tl.constexpr,
    TMA: tl.constexpr,
):
    """One program per (headdim block, head, sequence), chunks in reverse, dS^T (n, its columns) on chip.
    Per chunk c: dx of its columns; at ddtp[token, h, pb] its share of ddt; at row choff[s] + c of dst
    (chunks, H, P, N) the gradient with respect to the state leaving chunk c. At the end: dAp[s, h, pb] its
    share of dA, dD[s, h, its columns] sum_t dy * x (with HAS_D), dinit[s, h, its columns] (with
    HAS_INIT)."""
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
    A = tl.load(A_ptr + h).to(tl.float32)
    A2 = A * LOG2E  # decays in the log2 domain (exp2)
    q = tl.arange(0, QP)
    p0 = pb * BP
    ps = p0 + tl.arange(0, BP)
    ns = tl.arange(0, NP)
    mp = ps < P
    mnp = (ns < N)[:, None] & mp[None, :]
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    if HAS_D:
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :]
        else:
            Dv = tl.load(D_ptr + h).to(tl.float32)
        dD = tl.zeros((BP,), dtype=tl.float32)
    # the sequence's rows of x, dy, dx (this head, from this program's first column), B and C (its group);
    # descriptors only when chunks are powers of two (then no chunk's tile reaches into the next one)
    ts64 = ts.to(tl.int64)
    xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h + p0, n_tok, P - p0, s_x_t, QP, BP, TMA)
    dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0, n_tok, P - p0, s_dy_t, QP, BP, TMA)
    dxd = _desc(dx_ptr + ts64 * s_dx_t + h * s_dx_h + p0, n_tok, P - p0, s_dx_t, QP, BP, TMA)
    bd = _desc(B_ptr + ts64 * s_b_t + g * s_b_g, n_tok, N, s_b_t, QP, NP, TMA)
    cd = _desc(C_ptr + ts64 * s_c_t + g * s_c_g, n_tok, N, s_c_t, QP, NP, TMA)
    sd = _sdesc(st_ptr, n_rows * H, P, N, BP, NP, TMA)
    dsd = _sdesc(dst_ptr, n_rows * H, P, N, BP, NP, TMA)
    if HAS_DFINAL:
        dS = tl.load(dfin_ptr + (sh * P + ps[None, :]) * N + ns[:, None], mask=mnp, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros((NP, BP), dtype=tl.float32)
    dAv = tl.zeros((QP,), dtype=tl.float32)
    for i in tl.range(0, nch, num_stages=NS):
        ci = nch - 1 - i
        r0 = ci * Q
        n_end = tl.minimum(n_tok, r0 + Q)  # rows of the tiles past the chunk (Q < QP) read as 0
        mq = r0 + q < n_end
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums as masked row sums of a (Q, Q) tile (no tl.cumsum: see ssd_triton_bwd_chunk.py)
        cs = tl.sum(tl.where(causal, (dt * A2)[None, :], 0.0), axis=1)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)  # flat past the chunk's end (dt = 0 there)
        ecs = tl.where(mq, tl.exp2(cs), 0.0)
        dec = tl.exp2(cL - cs)  # decay from token s (excluded) to the chunk's end
        w = tl.where(mq, dt * dec, 0.0)
        Lm = tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))
        x = _tile(xd, r0, n_end, P - p0, s_x_t, QP, BP, TMA, True)
        dy = _tile(dyd, r0, n_end, P - p0, s_dy_t, QP, BP, TMA, True)
        Bm = _tile(bd, r0, n_end, N, s_b_t, QP, NP, TMA, True)
        Cm = _tile(cd, r0, n_end, N, s_c_t, QP, NP, TMA, True)
        mat = (cbase + ci) * H + h
        S = _sload(sd, mat, p0, 0, P, N, BP, NP, TMA)  # (its columns, n): the state entering the chunk
        dSr = dS.to(dst_ptr.dtype.element_ty)  # (n, its columns), as stored and as the products take it
        _sstore(dsd, mat, p0, 0, P, N, tl.trans(dSr), BP, NP, TMA)
        M = _mm(Cm, tl.trans(Bm), Bm, OPS) * Lm  # (C B^T) * L
        dWm = tl.where(causal, _mm(dy, tl.trans(x), x, OPS), 0.0)  # this block's share
        dxv = _mm(tl.trans(M * dt[None, :]), dy, x, OPS)
        R = _mm(Bm, dSr, x, OPS)  # B dS^T, (Q, its columns)
        dw = tl.sum(x.to(tl.float32) * R, axis=1)  # x_s . R_s, this block's share
        dxv += w[:, None] * R
        if HAS_D:
            dxv += Dv * dy.to(tl.float32)
            dD += tl.sum(dy.to(tl.float32) * x.to(tl.float32), axis=0)
        _put(dxd, r0, n_end, P - p0, s_dx_t, dxv.to(dx_ptr.dtype.element_ty), QP, BP, TMA, True)
        dyS = _mm(dy, S, x, OPS)  # (Q, n) this block's share of dy S
        E = dWm * dt[None, :] * M
        dcs = tl.sum(E, axis=1) - tl.sum(E, axis=0) + ecs * tl.sum(Cm.to(tl.float32) * dyS, axis=1) - dw * w
        dSS = tl.sum(tl.sum(tl.trans(dSr).to(tl.float32) * S.to(tl.float32), axis=1), axis=0)
        dcs += tl.where(last, tl.exp2(cL) * dSS + tl.sum(dw * w, axis=0), 0.0)  # cL = the padded last row's cs
        da = tl.sum(tl.where(causal, dcs[:, None], 0.0), axis=0)  # da_s = sum_{t >= s} dcs_t
        ddt = tl.sum(dWm * M, axis=0) + dec * dw + A * da
        tl.store(ddtp_ptr + ((ts64 + r0 + q) * H + h) * n_pb + pb, ddt, mask=mq)
        dAv += dt * da
        dS = tl.exp2(cL) * dS + _mm(tl.trans(Cm), dy.to(tl.float32) * ecs[:, None], dy, OPS)
    tl.store(dAp_ptr + sh * n_pb + pb, tl.sum(dAv, axis=0))
    if HAS_D:
        tl.store(dD_ptr + sh * P + ps, dD, mask=mp)
    if HAS_INIT:
        tl.store(dinit_ptr + (sh * P + ps[None, :]) * N + ns[:, None], dS, mask=mnp)


def bwd_launch(n_seq: int, h: int, p: int, n: int, Q: int, dev: torch.device) -> dict:
    """BWD_CONFIG with its automatic choices made (see BWD_CONFIG): measured on an H200 (docs/benchmarks.md)."""
    cfg = dict(BWD_CONFIG)
    sms = _sm_count(dev)
    if cfg["BLOCK_P"] is None:  # twice the programs while sequences x heads are few
        cfg["BLOCK_P"] = 64 if n_seq * h * triton.cdiv(p, 64) >= 2 * sms else 32
    if cfg["BLOCK_N"] is None:
        cfg["BLOCK_N"] = min(_p2(n), 64)
    for k, v in dict(warps_seq=4, warps_dbc=4, stages_seq=2, stages_dbc=2).items():
        cfg[k] = v if cfg[k] is None else cfg[k]
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
    cfg = bwd_launch(n_seq, h, p, n, Q, dev)
    bp, bn = int(cfg["BLOCK_P"]), int(cfg["BLOCK_N"])
    for key, v in (("BLOCK_P", bp), ("BLOCK_N", bn)):
        if v < _DOT_MIN or v & (v - 1):
            raise ValueError(f"BWD_CONFIG[{key!r}] must be a power of two >= {_DOT_MIN}, got {v}")

    xt, dtt, Bt, Ct, dyt = _tokens(x), _tokens(dt.float()), _tokens(B), _tokens(C), _tokens(dy)
    st = states if states.is_contiguous() else states.contiguous()
    A32 = A.float().contiguous()
    Dc = None if D is None else D.float().contiguous()
    dfin = None if dfinal is None else dfinal.float().contiguous()
    QP, PP, NP = _p2(Q), _p2(p), _p2(n)

    dst = empty(*st.shape, dtype=st.dtype, device=dev)
    n_tok = b * l
    dx = empty(n_tok, h, p, dtype=x.dtype, device=dev)
    dB = empty(n_tok, g, n, dtype=B.dtype, device=dev)
    dC = empty(n_tok, g, n, dtype=C.dtype, device=dev)
    tma = bool(cfg.get("tma")) and Q == QP  # a power-of-two chunk: no tile reaches into the next chunk
    if tma:  # only where the addresses allow
        es = x.element_size()
        tma = (_tma_ok(es, [xt, dyt, dx, Bt, Ct, dB, dC],
                       [xt.stride(1), dyt.stride(1), dx.stride(1), Bt.stride(1), Ct.stride(1), dB.stride(1),
                        dC.stride(1), bp, bn])
               and _tma_ok(st.element_size(), [st, dst], [n, p * n, bn]))
    if tma:
        _ensure_allocator()
    LAST_KERNEL["tma"] = bool(tma)
    dinit = empty(n_seq, h, p, n, dtype=torch.float32, device=dev) if has_init else None
    n_pb = triton.cdiv(p, bp)
    ddtp = empty(n_tok, h, n_pb, dtype=torch.float32, device=dev)  # the headdim blocks' shares of ddt
    dAp = empty(n_seq, h, n_pb, dtype=torch.float32, device=dev)
    dDs = empty(n_seq, h, p, dtype=torch.float32, device=dev) if D is not None else None  # dD per sequence
    try:
        LAST_KERNEL["seq"] = _bwd_seq[(n_pb, h, n_seq)](
            xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, dyt, dfin if dfin is not None else A32, st, dst,
            dinit if dinit is not None else A32, cu, choff, dx, ddtp, dAp, dDs if dDs is not None else A32,
            h, p, n, h // g, n_rows, n_pb,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
            Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dx.stride(0), dx.stride(1),
            HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_DFINAL=dfin is not None,
            HAS_INIT=bool(has_init), Q=Q, QP=QP, BP=bp, NP=NP, OPS=ops, NS=int(cfg["stages_seq"]), TMA=bool(tma),
            num_warps=int(cfg["warps_seq"]),
        )
        LAST_KERNEL["dbc"] = _bwd_dbc[(n_rows, g, triton.cdiv(n, bn))](
            xt, dtt, A32, Bt, Ct, st, dst, dyt, cu, choff, cseq, dB, dC,
            n_seq, h, p, n, h // g, n_rows,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
            Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dB.stride(0), dB.stride(1), dC.stride(0),
            dC.stride(1), Q=Q, QP=QP, PP=PP, NB=bn, OPS=ops, TMA=bool(tma), NS=int(cfg["stages_dbc"]),
            num_warps=int(cfg["warps_dbc"]),
        )
    except OutOfResources as e:
        raise ValueError(f"the Triton backward's tiles (chunk {Q}, headdim {p}, dstate {n}, {x.dtype}) do not fit "
                         f"this GPU ({e}); use bf16 / fp16 inputs or backend='chunked'") from None
    ddt = ddtp[..., 0] if n_pb == 1 else ddtp.sum(-1)
    dA = dAp.sum((0, 2))
    dD = None
    if D is not None:
        dDh = dDs.sum(0)
        dD = dDh if D.dim() == 2 else dDh.sum(1)
    return (dx.view(b, l, h, p).to(in_dtype), ddt.view(b, l, h), dA, dB.view(b, l, g, n).to(b_dtype),
            dC.view(b, l, g, n).to(b_dtype), dD, dinit)
