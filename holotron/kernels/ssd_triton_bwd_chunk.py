"""The chunk kernels of the SSD scan's backward (see ssd_triton_backward.py, which derives the formulas and
launches them after the state-gradient pass), both all chunks in parallel, from the states the forward stored
and the state gradients the pass stored:

- ``_bwd_dbc``: dB and dC of one chunk, for one group and one block of dstate columns. With
  dG_h = (dy_h x_h^T, t >= s) * dt_h[None, :] * L_h the gradient of head h's C B^T (Q x Q), the group's

      dC = (sum_h dG_h) B + sum_h exp(cs_h) (dy_h S_h)          dB = (sum_h dG_h)^T C + sum_h w_h (x_h dS_h)

  The program walks the group's heads (the loop's loads pipelined like a matrix product's K loop) adding
  sum_h dG_h and the two state terms in fp32 registers, then multiplies the summed dG by B and C once; dB,
  dC are written once, in B's dtype, without partial sums.
- ``_bwd_dx``: dx, and the shares of ddt and dA, of one chunk, head and block of headdim columns (or, with
  ``BWD_CONFIG["P_LOOP"]``, of every headdim block of the head in a loop).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ssd_triton_common import _desc, _mm, _put, _sdesc, _sload, _smm, _tile


@triton.jit
def _dbc_chunk(
    k, s, g, nb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, dB_ptr, dC_ptr,
    vp_ptr, dssp_ptr, H, P, N, HPG, n_rows, n_nb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g,
    Q: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    NS: tl.constexpr, PK: tl.constexpr, NPK: tl.constexpr, SS: tl.constexpr,
):
    """dB and dC of chunk k (of sequence s) for group g, dstate columns nb * NB .. (see _bwd_dbc)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    n0 = nb * NB
    q = tl.arange(0, QP)
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    ts = tl.load(cu_ptr + s)
    te = tl.load(cu_ptr + s + 1)
    r0 = (k - tl.load(choff_ptr + s)) * Q  # the chunk's first row in its sequence
    n_end = tl.minimum(te - ts, r0 + Q)  # rows of the sequence up to the chunk's end
    ts64 = ts.to(tl.int64)
    mq = r0 + q < n_end
    bd = _desc(B_ptr + ts64 * s_b_t + g * s_b_g + n0, n_end, N - n0, s_b_t, QP, NB, TMA)
    cd = _desc(C_ptr + ts64 * s_c_t + g * s_c_g + n0, n_end, N - n0, s_c_t, QP, NB, TMA)
    Bm = _tile(bd, r0, n_end, N - n0, s_b_t, QP, NB, TMA, True)
    Cm = _tile(cd, r0, n_end, N - n0, s_c_t, QP, NB, TMA, True)
    sd = _sdesc(st_ptr, n_rows * H, P, N, PK, NB, TMA)
    dsd = _sdesc(dst_ptr, n_rows * H, P, N, PK, NB, TMA)
    dGs = tl.zeros((QP, QP), dtype=tl.float32)
    accB = tl.zeros((QP, NB), dtype=tl.float32)
    accC = tl.zeros((QP, NB), dtype=tl.float32)
    for j in tl.range(0, HPG, num_stages=NS):
        h = g * HPG + j
        A = tl.load(A_ptr + h).to(tl.float32) * LOG2E
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums (log2 domain) as masked row sums of a (Q, Q) tile, not tl.cumsum: with a scan in a
        # backward kernel triton 3.6 addressed shared memory out of range on an H200
        cs = tl.sum(tl.where(causal, (dt * A)[None, :], 0.0), axis=1)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)
        ecs = tl.where(mq, tl.exp2(cs), 0.0)
        w = tl.where(mq, dt * tl.exp2(cL - cs), 0.0)
        # exp only where t >= s: above the diagonal cs_t - cs_s > 0 could overflow
        Lm = tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))
        mat = k * H + h
        # the three products over the headdim, in NPK blocks of PK columns (one of PP: the padded headdim)
        dW = tl.zeros((QP, QP), dtype=tl.float32)   # dy x^T
        dyS = tl.zeros((QP, NB), dtype=tl.float32)  # dy S, S (p, n block) the state entering the chunk
        xdS = tl.zeros((QP, NB), dtype=tl.float32)  # x dS, dS the gradient of the state leaving it
        ss = 0.0                                     # sum(dS * S) over this block of dstate columns
        for pk in tl.static_range(NPK):
            p0 = pk * PK
            xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h + p0, n_end, P - p0, s_x_t, QP, PK, TMA)
            dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0, n_end, P - p0, s_dy_t, QP, PK, TMA)
            x = _tile(xd, r0, n_end, P - p0, s_x_t, QP, PK, TMA, True)
            dy = _tile(dyd, r0, n_end, P - p0, s_dy_t, QP, PK, TMA, True)
            S = _sload(sd, mat, p0, n0, P, N, PK, NB, TMA)
            dS = _sload(dsd, mat, p0, n0, P, N, PK, NB, TMA)
            dW += _mm(dy, tl.trans(x), x, OPS)
            dyS += _smm(dy, S, x, OPS, st_ptr)
            xdS += _smm(x, dS, x, OPS, dst_ptr)
            if SS:
                ss += tl.sum(tl.sum(S.to(tl.float32) * dS.to(tl.float32), axis=1), axis=0)
        if SS:
            tl.store(dssp_ptr + mat.to(tl.int64) * n_nb + nb, ss)
        dWm = tl.where(causal, dW, 0.0)
        dGs += dWm * dt[None, :] * Lm
        accC += ecs[:, None] * dyS
        # rowsum(dy * exp(cs) (C S^T)) = exp(cs) rowsum(C * (dy S)), this block's share: a term of ddt's dcs
        tl.store(vp_ptr + ((ts64 + r0 + q) * H + h) * n_nb + nb, ecs * tl.sum(Cm.to(tl.float32) * dyS, axis=1),
                 mask=mq)
        accB += w[:, None] * xdS
    dC = accC + _mm(dGs, Bm, Bm, OPS)
    dB = accB + _mm(tl.trans(dGs), Cm, Bm, OPS)
    dbd = _desc(dB_ptr + ts64 * s_db_t + g * s_db_g + n0, n_end, N - n0, s_db_t, QP, NB, TMA)
    dcd = _desc(dC_ptr + ts64 * s_dc_t + g * s_dc_g + n0, n_end, N - n0, s_dc_t, QP, NB, TMA)
    _put(dbd, r0, n_end, N - n0, s_db_t, dB.to(dB_ptr.dtype.element_ty), QP, NB, TMA, True)
    _put(dcd, r0, n_end, N - n0, s_dc_t, dC.to(dC_ptr.dtype.element_ty), QP, NB, TMA, True)


@triton.jit
def _bwd_dbc(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, cseq_ptr, dB_ptr, dC_ptr,
    vp_ptr, dssp_ptr, n_seq, H, P, N, HPG, n_rows, n_nb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g,
    Q: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    NS: tl.constexpr, PK: tl.constexpr, NPK: tl.constexpr, SS: tl.constexpr,
):
    """One program per (chunk row, group, block of NB dstate columns); rows past the last sequence's chunks
    do nothing. Chunk k (of all sequences' chunks, in order) belongs to sequence cseq[k] (n_seq: none). Also
    writes vp[token, h, nb], its block's share of exp(cs) rowsum(C * (dy S)) (a term of ddt, for _bwd_dx).
    Tiles are read through descriptors of the sequence's rows up to the chunk's end (zeros past it). The
    products over the headdim take it in NPK blocks of PK columns (one block of PP: the padded headdim). With SS
    (the one-launch state gradient of ssd_triton_bwd_walk.py) also dssp[row, h, nb], its block's share of
    sum(dS * S) per head."""
    k = tl.program_id(0)
    g = tl.program_id(1)
    nb = tl.program_id(2)
    s = tl.load(cseq_ptr + k)
    if s < n_seq:
        _dbc_chunk(k, s, g, nb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr,
                   dB_ptr, dC_ptr, vp_ptr, dssp_ptr, H, P, N, HPG, n_rows, n_nb, s_x_t, s_x_h, s_dt_t, s_dt_h,
                   s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g, Q, QP, PP, NB, OPS,
                   TMA, NS, PK, NPK, SS)


@triton.jit
def _dx_chunk(
    k, s, g, hs, pb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, vp_ptr,
    dssp_ptr, dx_ptr, ddtp_ptr, dAp_ptr, dDp_ptr, H, P, N, HPG, n_rows, n_pb, n_nb, n_blk,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, Q: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr,
    NP: tl.constexpr, NNB: tl.constexpr, NBLK: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    HPP: tl.constexpr, NS: tl.constexpr, NPB: tl.constexpr,
):
    """dx of chunk k (of sequence s) for heads hs * HPP .. of group g, headdim columns from (pb * NPB) * BP in
    NPB blocks of BP; this program's shares of ddt and dA (and of dD); see _bwd_dx."""
    LOG2E: tl.constexpr = 1.4426950408889634
    q = tl.arange(0, QP)
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    ts = tl.load(cu_ptr + s)
    te = tl.load(cu_ptr + s + 1)
    r0 = (k - tl.load(choff_ptr + s)) * Q
    n_end = tl.minimum(te - ts, r0 + Q)
    ts64 = ts.to(tl.int64)
    mq = r0 + q < n_end
    bd = _desc(B_ptr + ts64 * s_b_t + g * s_b_g, n_end, N, s_b_t, QP, NP, TMA)
    cd = _desc(C_ptr + ts64 * s_c_t + g * s_c_g, n_end, N, s_c_t, QP, NP, TMA)
    Bm = _tile(bd, r0, n_end, N, s_b_t, QP, NP, TMA, True)
    Cm = _tile(cd, r0, n_end, N, s_c_t, QP, NP, TMA, True)
    G = _mm(Cm, tl.trans(Bm), Bm, OPS)  # C B^T, the group's
    dsd = _sdesc(dst_ptr, n_rows * H, P, N, BP, NP, TMA)
    first = (pb == 0).to(tl.float32)  # the terms summed over the whole headdim are added by the first program
    nbs = tl.arange(0, NNB)
    bls = tl.arange(0, NBLK)
    for j in tl.range(0, HPP, num_stages=NS):
        h = g * HPG + hs * HPP + j
        A = tl.load(A_ptr + h).to(tl.float32)
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        cs = tl.sum(tl.where(causal, (dt * (A * LOG2E))[None, :], 0.0), axis=1)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)  # flat past the chunk's end (dt = 0 there)
        dec = tl.exp2(cL - cs)  # decay from token s (excluded) to the chunk's end
        w = tl.where(mq, dt * dec, 0.0)
        M = G * tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))  # (C B^T) * L
        Mdt = M * dt[None, :]
        mat = k * H + h
        dW = tl.zeros((QP, QP), dtype=tl.float32)   # dy x^T over this program's columns
        dw = tl.zeros((QP,), dtype=tl.float32)      # x_s . R_s over this program's columns
        for i in tl.range(0, NPB, num_stages=NS):
            p0 = (pb * NPB + i) * BP
            ps = p0 + tl.arange(0, BP)
            mp = ps < P
            xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h + p0, n_end, P - p0, s_x_t, QP, BP, TMA)
            dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0, n_end, P - p0, s_dy_t, QP, BP, TMA)
            x = _tile(xd, r0, n_end, P - p0, s_x_t, QP, BP, TMA, True)
            dy = _tile(dyd, r0, n_end, P - p0, s_dy_t, QP, BP, TMA, True)
            dS = _sload(dsd, mat, p0, 0, P, N, BP, NP, TMA)  # (its columns, n): the state gradient leaving
            dW += _mm(dy, tl.trans(x), x, OPS)
            dxv = _mm(tl.trans(Mdt), dy, x, OPS)
            R = _smm(Bm, tl.trans(dS), x, OPS, dst_ptr)  # B dS^T, (Q, its columns)
            xf = x.to(tl.float32)
            dw += tl.sum(xf * R, axis=1)
            dxv += w[:, None] * R
            if HAS_D:
                dyf = dy.to(tl.float32)
                if D_PER_CHANNEL:
                    dxv += tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :] * dyf
                else:
                    dxv += tl.load(D_ptr + h).to(tl.float32) * dyf
                tl.store(dDp_ptr + mat.to(tl.int64) * P + ps, tl.sum(dyf * xf, axis=0), mask=mp)
            dxd = _desc(dx_ptr + ts64 * s_dx_t + h * s_dx_h + p0, n_end, P - p0, s_dx_t, QP, BP, TMA)
            _put(dxd, r0, n_end, P - p0, s_dx_t, dxv.to(dx_ptr.dtype.element_ty), QP, BP, TMA, True)
        dWm = tl.where(causal, dW, 0.0)
        E = dWm * Mdt
        dcs = tl.sum(E, axis=1) - tl.sum(E, axis=0) - dw * w
        dcL = tl.sum(dw * w, axis=0)
        vptr = vp_ptr + ((ts64 + r0 + q) * H + h)[:, None] * n_nb + nbs[None, :]
        dcs += first * tl.sum(tl.load(vptr, mask=mq[:, None] & (nbs < n_nb)[None, :], other=0.0), axis=1)
        dSS = tl.sum(tl.load(dssp_ptr + mat.to(tl.int64) * n_blk + bls, mask=bls < n_blk, other=0.0), axis=0)
        dcL += first * tl.exp2(cL) * dSS
        dcs += tl.where(last, dcL, 0.0)  # cL = cs of the padded block's last row
        da = tl.sum(tl.where(causal, dcs[:, None], 0.0), axis=0)  # da_s = sum_{t >= s} dcs_t
        ddt = tl.sum(dWm * M, axis=0) + dec * dw + A * da
        tl.store(ddtp_ptr + ((ts64 + r0 + q) * H + h) * n_pb + pb, ddt, mask=mq)
        tl.store(dAp_ptr + mat.to(tl.int64) * n_pb + pb, tl.sum(dt * da, axis=0))


@triton.jit
def _bwd_dx(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, cseq_ptr, vp_ptr, dssp_ptr,
    dx_ptr, ddtp_ptr, dAp_ptr, dDp_ptr, n_seq, H, P, N, HPG, n_rows, n_pb, n_nb, n_blk,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, Q: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr,
    NP: tl.constexpr, NNB: tl.constexpr, NBLK: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    HPP: tl.constexpr, NS: tl.constexpr, NPB: tl.constexpr,
):
    """One program per (chunk row, HPP heads of a group, NPB headdim blocks of BP), all chunks in parallel (NPB 1:
    a program per headdim block; NPB covering the headdim, BWD_CONFIG["P_LOOP"]: one per head, C B^T and the
    decays computed once for all its columns): dx of its columns (every term of dx is column by column) and its
    shares of ddt (at ddtp[token, h, pb]), of dA (dAp[k, h, pb]) and of dD (dDp[k, h, its columns]): every term
    of ddt is a sum over the headdim (dy x^T, x . R) or, for the two that _bwd_dbc (vp) and _bwd_spass (dssp)
    computed whole, added by the first program of the head, so the shares add up. Needs the state gradients of
    _bwd_spass. The heads share C B^T (computed once); their loop's loads are pipelined over NS stages. Rows
    past the last sequence's chunks do nothing."""
    k = tl.program_id(0)
    gh = tl.program_id(1)
    pb = tl.program_id(2)
    g = gh // (HPG // HPP)
    hs = gh % (HPG // HPP)
    s = tl.load(cseq_ptr + k)
    if s < n_seq:
        _dx_chunk(k, s, g, hs, pb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr,
                  vp_ptr, dssp_ptr, dx_ptr, ddtp_ptr, dAp_ptr, dDp_ptr, H, P, N, HPG, n_rows, n_pb, n_nb, n_blk,
                  s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
                  HAS_D, D_PER_CHANNEL, Q, QP, BP, NP, NNB, NBLK, OPS, TMA, HPP, NS, NPB)
