"""The SSD scan's backward in four Triton launches: the gradients of ``ssd_scan(..., backend="triton")``.

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

Only the last line runs from chunk to chunk, and once each chunk's own term C^T (dy * exp(cs)) is known it
needs no product. Four launches, all chunk-parallel but one elementwise pass:

- ``_bwd_dstates``: one program per (chunk, head, headdim block): the chunk's own term u = C^T (dy exp(cs)),
  stored where the state gradients go, and exp(cL).
- ``_bwd_spass``: one program per (block of state entries, head, sequence) walks the chunks in reverse,
  dS_in = exp(cL) dS + u entry by entry, overwriting each u with the gradient of the state leaving its chunk
  (in the forward's states' layout and dtype); its block's share of sum(dS * S) per chunk; the initial
  state's gradient at the end.
- ``_bwd_dbc`` (ssd_triton_bwd_chunk.py): one program per (chunk, group, dstate block) walks the group's
  heads adding the dG's and the state terms, then dB and dC of its block; also, per head, its block's share
  of the ddt term rowsum(dy * exp(cs) (C S^T)).
- ``_bwd_dx`` (ssd_triton_bwd_chunk.py): one program per (chunk, head, headdim block): dx of its columns
  (every term of dx is column by column) and its block's shares of ddt and dA (every term of ddt is a sum
  over the headdim: dy x^T, x . R are, and the two whole terms above are added by block 0) and of dD;
  PyTorch adds the shares.

With ``BWD_CONFIG["WALK"]`` the first two are one launch, a reverse walk per headdim block, head and sequence
(ssd_triton_bwd_walk.py); off: measured no faster on an H200 (docs/benchmarks.md).

A reverse walk that does every product of a chunk with dS^T on chip (the forward's shape) measured slower on
an H200 (docs/benchmarks.md): the chunks' independent products then run one after another.

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

from .ssd_triton_bwd_chunk import _bwd_dbc, _bwd_dx
from .ssd_triton_bwd_walk import _bwd_dswalk, walk_grid
from .ssd_triton_common import (
    _DOT_MIN,
    _dot_ops,
    _ensure_allocator,
    _p2,
    _smm,
    _sstore,
    _tile,
    _tma_ok,
    _tokens,
    empty,
)

# Launch settings (the benchmark sweeps them; None: the automatic choice of ``bwd_launch``). chunk_size: the
# longest chunk the training entry uses for the forward's stored states and the backward (the caller's
# chunk_size when shorter; None: the caller's); BLOCK_P: headdim columns per program of the dx kernel (a power of
# two >= 16); BLOCK_N: dstate columns per program of the dB / dC kernel (a power of two >= 16); HEADS: heads of
# a group per program of the dx kernel (a divisor of the heads per group; they share C B^T); warps of the dx
# and dB / dC kernels, pipeline stages of their loops over heads and of the state pass; tma:
# tiles of the dx and dB / dC kernels through tensor descriptors (TMA on Hopper) where addresses and strides
# are 16-byte multiples and the chunk is a power of two (True; None / False: masked pointers); P_LOOP: the dx
# kernel as one program per (chunk, HEADS heads) walking the headdim blocks (C B^T and the decays once per head,
# ddt whole; None / True: 24-25% faster than False on an H200, docs/benchmarks.md), False: one program per
# (chunk, HEADS heads, headdim block); BLOCK_PK: the dB / dC kernel's products over the headdim in blocks of this
# many columns (a power of two >= 16; None: one block of the headdim padded to a power of two, 128 for 80; blocks
# of 32 or 16 spilled and measured 16-25% slower); WALK: the state gradient in one launch (ssd_triton_bwd_walk.py:
# a reverse walk per (BLOCK_W headdim columns, head, sequence) computing each chunk's term on chip, warps_walk
# warps) instead of the chunk-parallel term and the entry-by-entry pass (None / False: on an H200 the walk was
# a little faster than the two launches, but the dB / dC kernel taking sum(dS * S) slower: no gain overall);
# STATES: the dtype of the chunk states the training forward stores and of the state gradients, for bf16 / fp16
# inputs (None: the inputs' dtype; "fp32": both fp32, and the products that read them take fp32 operands at
# tf32 precision, ``_smm``; "grads": the state gradients only). In float64 emulation at the 12B sizes
# (dev/probes/grad_rounding.py) "fp32" divides dA's error by 7.7 and ddt's by 8, "grads" by 1.9 and 2.6. On an
# H100 (docs/benchmarks.md, 2026-12-05) the fp32 tiles of the dB / dC kernel overflow shared memory at dstate
# blocks of 64 (BLOCK_N None then takes 32 for "fp32" and "grads"), and "fp32" at 32 ran forward + backward
# 1.5-2.2x slower than the default (spills) for dA's error 4.6e-4 -> 3.3e-4: off.
BWD_CONFIG = dict(chunk_size=64, BLOCK_P=None, BLOCK_N=None, HEADS=None, warps_dx=None, warps_dbc=None,
                  stages_dx=None, stages_dbc=None, stages_state=None, tma=None, P_LOOP=None, BLOCK_PK=None,
                  WALK=None, BLOCK_W=None, warps_walk=None, STATES=None)

# The compiled kernels of the last backward ("dstates" and "state", or "walk"; "dbc", "dx"), for the benchmark's
# register counts.
LAST_KERNEL = {}


@triton.jit
def _bwd_dstates(
    dt_ptr, A_ptr, C_ptr, dy_ptr, cu_ptr, choff_ptr, cseq_ptr, u_ptr, ecl_ptr,
    n_seq, H, P, N, HPG, s_dt_t, s_dt_h, s_c_t, s_c_g, s_dy_t, s_dy_h,
    Q: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr, NP: tl.constexpr, OPS: tl.constexpr,
):
    """One program per (chunk row, head, headdim block): the chunk's own term of the state gradient's
    recurrence, u = C^T (dy * exp(cs)), stored (p, n) at row k * H + h of u (chunks, H, P, N), and exp(cL) at
    ecl[k, h]. Rows past the last sequence's chunks do nothing."""
    LOG2E: tl.constexpr = 1.4426950408889634
    k = tl.program_id(0)
    h = tl.program_id(1)
    pb = tl.program_id(2)
    s = tl.load(cseq_ptr + k)
    if s < n_seq:
        g = h // HPG
        ts = tl.load(cu_ptr + s)
        te = tl.load(cu_ptr + s + 1)
        r0 = (k - tl.load(choff_ptr + s)) * Q
        n_end = tl.minimum(te - ts, r0 + Q)
        ts64 = ts.to(tl.int64)
        q = tl.arange(0, QP)
        mq = r0 + q < n_end
        causal = q[:, None] >= q[None, :]
        p0 = pb * BP
        A2 = tl.load(A_ptr + h).to(tl.float32) * LOG2E
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums as masked row sums of a (Q, Q) tile (no tl.cumsum: see ssd_triton_bwd_chunk.py)
        cs = tl.sum(tl.where(causal, (dt * A2)[None, :], 0.0), axis=1)
        ecs = tl.where(mq, tl.exp2(cs), 0.0)
        Cm = _tile(C_ptr + ts64 * s_c_t + g * s_c_g, r0, n_end, N, s_c_t, QP, NP, False, True)
        dy = _tile(dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0, r0, n_end, P - p0, s_dy_t, QP, BP, False, True)
        u = _smm(tl.trans(Cm), dy.to(tl.float32) * ecs[:, None], dy, OPS, u_ptr)  # (n, its columns)
        mat = k * H + h
        _sstore(u_ptr, mat, p0, 0, P, N, tl.trans(u).to(u_ptr.dtype.element_ty), BP, NP, False)
        if pb == 0:
            tl.store(ecl_ptr + mat, tl.exp2(tl.sum(dt * A2, axis=0)))


@triton.jit
def _bwd_spass(
    dfin_ptr, st_ptr, dst_ptr, ecl_ptr, dssp_ptr, dinit_ptr, cu_ptr, choff_ptr, H, PN, n_blk,
    Q: tl.constexpr, BLK: tl.constexpr, HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr, NS: tl.constexpr,
):
    """One program per (block of BLK state entries, head, sequence): the state gradient through the
    sequence's chunks in reverse, entry by entry (no products): dst holds each chunk's own term u (from
    _bwd_dstates) and is overwritten, row by row, with the gradient of the state leaving the chunk (rounded
    to dst's dtype); dssp[row, blk] gets this block's share of sum(dS * S) with S the state entering the chunk;
    dS_in = exp(cL) dS + u. At the end the initial state's gradient (with HAS_INIT)."""
    blk = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    e = blk * BLK + tl.arange(0, BLK)
    me = e < PN
    sh = s.to(tl.int64) * H + h
    n_tok = tl.load(cu_ptr + s + 1) - tl.load(cu_ptr + s)
    cbase = tl.load(choff_ptr + s)
    nch = (n_tok + Q - 1) // Q
    if HAS_DFINAL:
        dS = tl.load(dfin_ptr + sh * PN + e, mask=me, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros((BLK,), dtype=tl.float32)
    for i in tl.range(0, nch, num_stages=NS):
        mat = ((cbase + nch - 1 - i) * H + h).to(tl.int64)
        u = tl.load(dst_ptr + mat * PN + e, mask=me, other=0.0).to(tl.float32)
        S = tl.load(st_ptr + mat * PN + e, mask=me, other=0.0).to(tl.float32)
        el = tl.load(ecl_ptr + mat)
        dSr = dS.to(dst_ptr.dtype.element_ty)
        tl.store(dst_ptr + mat * PN + e, dSr, mask=me)
        tl.store(dssp_ptr + mat * n_blk + blk, tl.sum(dSr.to(tl.float32) * S, axis=0))
        dS = el * dS + u
    if HAS_INIT:
        tl.store(dinit_ptr + sh * PN + e, dS, mask=me)


def bwd_launch(p: int, n: int) -> dict:
    """BWD_CONFIG with its automatic choices made (see BWD_CONFIG): measured on an H200 (docs/benchmarks.md)."""
    cfg = dict(BWD_CONFIG)
    if cfg["BLOCK_P"] is None:
        cfg["BLOCK_P"] = min(_p2(p), 32)
    if cfg["BLOCK_N"] is None:  # fp32 state tiles: half the dstate columns, or they overflow shared memory
        cfg["BLOCK_N"] = min(_p2(n), 32 if cfg.get("STATES") in ("fp32", "grads") else 64)
    if cfg["HEADS"] is None:
        cfg["HEADS"] = 1
    if cfg["P_LOOP"] is None:  # one dx program per (chunk, head) walking its headdim blocks
        cfg["P_LOOP"] = True
    if cfg["BLOCK_W"] is None:
        cfg["BLOCK_W"] = min(_p2(p), 32)
    for k, v in dict(warps_dx=4, warps_dbc=8, stages_dx=2, stages_dbc=3, stages_state=2, warps_walk=4).items():
        cfg[k] = v if cfg[k] is None else cfg[k]
    return cfg


# the state pass's block of state entries per program, and the dstates kernel's headdim block
STATE_BLOCK = 1024
DSTATES_BP = 32


def ssd_scan_triton_bwd(x, dt, A, B, C, D, states, choff, Q, dy, dfinal=None, cu_seqlens=None, has_init=False):
    """Gradients of the SSD scan (without z, whose gate autograd handles) from four Triton launches.

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
    cfg = bwd_launch(p, n)
    bp, bn, hpp = int(cfg["BLOCK_P"]), int(cfg["BLOCK_N"]), int(cfg["HEADS"])
    for key, v in (("BLOCK_P", bp), ("BLOCK_N", bn)):
        if v < _DOT_MIN or v & (v - 1):
            raise ValueError(f"BWD_CONFIG[{key!r}] must be a power of two >= {_DOT_MIN}, got {v}")
    if hpp < 1 or (h // g) % hpp:
        raise ValueError(f"BWD_CONFIG['HEADS'] must divide the heads per group ({h // g}), got {hpp}")
    pk = _p2(p) if not cfg.get("BLOCK_PK") else int(cfg["BLOCK_PK"])
    if pk < _DOT_MIN or pk & (pk - 1):
        raise ValueError(f"BWD_CONFIG['BLOCK_PK'] must be a power of two >= {_DOT_MIN}, got {pk}")
    ploop = bool(cfg.get("P_LOOP"))
    walk = bool(cfg.get("WALK"))
    bw = int(cfg["BLOCK_W"])
    if walk and (bw < _DOT_MIN or bw & (bw - 1)):
        raise ValueError(f"BWD_CONFIG['BLOCK_W'] must be a power of two >= {_DOT_MIN}, got {bw}")

    xt, dtt, Bt, Ct, dyt = _tokens(x), _tokens(dt.float()), _tokens(B), _tokens(C), _tokens(dy)
    st = states if states.is_contiguous() else states.contiguous()
    A32 = A.float().contiguous()
    Dc = None if D is None else D.float().contiguous()
    dfin = None if dfinal is None else dfinal.float().contiguous()
    QP, PP, NP = _p2(Q), _p2(p), _p2(n)

    n_tok = b * l
    # each chunk's own term, then the state gradients: in the states' dtype, or fp32 (BWD_CONFIG STATES)
    dst = empty(*st.shape, dtype=torch.float32 if cfg.get("STATES") in ("fp32", "grads") else st.dtype, device=dev)
    ecl = None if walk else empty(n_rows, h, dtype=torch.float32, device=dev)
    dx = empty(n_tok, h, p, dtype=x.dtype, device=dev)
    dB = empty(n_tok, g, n, dtype=B.dtype, device=dev)
    dC = empty(n_tok, g, n, dtype=C.dtype, device=dev)
    tma = bool(cfg.get("tma")) and Q == QP  # a power-of-two chunk: no tile reaches into the next chunk
    if tma:  # only where the addresses allow
        es = x.element_size()
        tma = (_tma_ok(es, [xt, dyt, dx, Bt, Ct, dB, dC],
                       [xt.stride(1), dyt.stride(1), dx.stride(1), Bt.stride(1), Ct.stride(1), dB.stride(1),
                        dC.stride(1), bp, bn])
               and all(_tma_ok(t.element_size(), [t], [n, p * n, bn]) for t in (st, dst)))
    if tma:
        _ensure_allocator()
    LAST_KERNEL.clear()
    LAST_KERNEL["tma"] = bool(tma)
    dinit = empty(n_seq, h, p, n, dtype=torch.float32, device=dev) if has_init else None
    n_pb, n_nb = triton.cdiv(p, bp), triton.cdiv(n, bn)
    n_sh = 1 if ploop else n_pb  # the dx kernel's shares of ddt and dA per (token or chunk, head)
    n_blk = n_nb if walk else triton.cdiv(p * n, STATE_BLOCK)  # (the dB / dC kernel's blocks take them with WALK)
    dssp = empty(n_rows, h, n_blk, dtype=torch.float32, device=dev)  # the blocks' shares of sum(dS * S)
    vp = empty(n_tok, h, n_nb, dtype=torch.float32, device=dev)  # the dstate blocks' shares of a ddt term
    ddtp = empty(n_tok, h, n_sh, dtype=torch.float32, device=dev)  # the headdim blocks' shares of ddt
    # per chunk row: rows past the last sequence's chunks stay zero
    dAp = torch.zeros(n_rows, h, n_sh, dtype=torch.float32, device=dev)
    dDp = torch.zeros(n_rows, h, p, dtype=torch.float32, device=dev) if D is not None else None
    dbp = min(_p2(p), DSTATES_BP)
    try:
        if walk:
            LAST_KERNEL["walk"] = _bwd_dswalk[walk_grid(p, h, n_seq, bw)](
                dfin if dfin is not None else A32, dtt, A32, Ct, dyt, dst, dinit if dinit is not None else A32, cu,
                choff, h, p, n, h // g, dtt.stride(0), dtt.stride(1), Ct.stride(0), Ct.stride(1), dyt.stride(0),
                dyt.stride(1), Q=Q, QP=QP, BP=bw, NP=NP, OPS=ops, HAS_DFINAL=dfin is not None,
                HAS_INIT=bool(has_init), NS=int(cfg["stages_state"]), num_warps=int(cfg["warps_walk"]),
            )
        else:
            LAST_KERNEL["dstates"] = _bwd_dstates[(n_rows, h, triton.cdiv(p, dbp))](
                dtt, A32, Ct, dyt, cu, choff, cseq, dst, ecl, n_seq, h, p, n, h // g,
                dtt.stride(0), dtt.stride(1), Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1),
                Q=Q, QP=QP, BP=dbp, NP=NP, OPS=ops, num_warps=4,
            )
            LAST_KERNEL["state"] = _bwd_spass[(n_blk, h, n_seq)](
                dfin if dfin is not None else A32, st, dst, ecl, dssp, dinit if dinit is not None else A32, cu,
                choff, h, p * n, n_blk, Q=Q, BLK=STATE_BLOCK, HAS_DFINAL=dfin is not None, HAS_INIT=bool(has_init),
                NS=int(cfg["stages_state"]), num_warps=4,
            )
        LAST_KERNEL["dbc"] = _bwd_dbc[(n_rows, g, n_nb)](
            xt, dtt, A32, Bt, Ct, st, dst, dyt, cu, choff, cseq, dB, dC, vp, dssp,
            n_seq, h, p, n, h // g, n_rows, n_nb,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
            Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dB.stride(0), dB.stride(1), dC.stride(0),
            dC.stride(1), Q=Q, QP=QP, PP=PP, NB=bn, OPS=ops, TMA=bool(tma), NS=int(cfg["stages_dbc"]),
            PK=pk, NPK=triton.cdiv(p, pk), SS=walk, num_warps=int(cfg["warps_dbc"]),
        )
        LAST_KERNEL["dx"] = _bwd_dx[(n_rows, h // hpp, n_sh)](
            xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, dst, dyt, cu, choff, cseq, vp, dssp,
            dx, ddtp, dAp, dDp if dDp is not None else A32, n_seq, h, p, n, h // g, n_rows, n_sh, n_nb, n_blk,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
            Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dx.stride(0), dx.stride(1),
            HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, Q=Q, QP=QP, BP=bp, NP=NP,
            NNB=triton.next_power_of_2(n_nb), NBLK=triton.next_power_of_2(n_blk), OPS=ops, TMA=bool(tma), HPP=hpp,
            NS=int(cfg["stages_dx"]), NPB=n_pb if ploop else 1, num_warps=int(cfg["warps_dx"]),
        )
    except OutOfResources as e:
        hint = ("smaller BWD_CONFIG tiles (BLOCK_N, chunk_size), BWD_CONFIG['STATES'] = None"
                if x.dtype in (torch.bfloat16, torch.float16) else "bf16 / fp16 inputs")
        raise ValueError(f"the Triton backward's tiles (chunk {Q}, headdim {p}, dstate {n}, {x.dtype}, BLOCK_N "
                         f"{bn}, STATES {cfg.get('STATES')}) do not fit this GPU ({e}); use {hint} or "
                         f"backend='chunked'") from None
    ddt = ddtp[..., 0] if n_sh == 1 else ddtp.sum(-1)
    dA = dAp.sum((0, 2))
    dD = None
    if D is not None:
        dDh = dDp.sum(0)
        dD = dDh if D.dim() == 2 else dDh.sum(1)
    return (dx.view(b, l, h, p).to(in_dtype), ddt.view(b, l, h), dA, dB.view(b, l, g, n).to(b_dtype),
            dC.view(b, l, g, n).to(b_dtype), dD, dinit)
