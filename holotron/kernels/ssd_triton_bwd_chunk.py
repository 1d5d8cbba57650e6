"""The chunk kernel of the SSD scan's backward (see ssd_triton_backward.py, which launches it twice and
derives the formulas): one program per (chunk, group x head split) computes the gradients of its chunk from
the states the forward stored and the state gradients the reverse pass stored."""

from __future__ import annotations

import triton
import triton.language as tl

from .ssd_triton_common import _desc, _mm, _put, _sdesc, _sload, _tile


@triton.jit
def _chunk_grads(
    k, s, g, sp, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, st_ptr, dst_ptr, dsp_ptr, dy_ptr, cu_ptr, choff_ptr,
    dx_ptr, ddt_ptr, dAp_ptr, dBp_ptr, dCp_ptr,
    n_seq, n_tok, H, P, N, HPG, HPS, Q, n_rows, n_pb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NP: tl.constexpr,
    OPS: tl.constexpr, TMA: tl.constexpr, NPB: tl.constexpr, PART: tl.constexpr,
):
    """The gradients of chunk k (of sequence s < n_seq) for the HPS heads of split sp of group g (see _bwd_chunk)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    G_N = (H // HPG) * N
    sd = _sdesc(st_ptr, n_rows * H, P, N, PP, NP, TMA)
    dsd = _sdesc(dst_ptr, n_rows * H, P, N, PP, NP, TMA)
    q = tl.arange(0, QP)
    ps = tl.arange(0, PP)
    mp = ps < P
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    ts = tl.load(cu_ptr + s)
    te = tl.load(cu_ptr + s + 1)
    r0 = (k - tl.load(choff_ptr + s)) * Q  # the chunk's first row in its sequence
    n_end = tl.minimum(te - ts, r0 + Q)  # rows of the sequence up to the chunk's end
    ts64 = ts.to(tl.int64)
    mq = r0 + q < n_end
    bd = _desc(B_ptr + ts64 * s_b_t + g * s_b_g, n_end, N, s_b_t, QP, NP, TMA)
    cd = _desc(C_ptr + ts64 * s_c_t + g * s_c_g, n_end, N, s_c_t, QP, NP, TMA)
    Bm = _tile(bd, r0, n_end, N, s_b_t, QP, NP, TMA, True)
    Cm = _tile(cd, r0, n_end, N, s_c_t, QP, NP, TMA, True)
    if PART == "dx":
        G = _mm(Cm, tl.trans(Bm), Bm, OPS)  # (Q, Q) C_t . B_s, shared by the group's heads
    else:
        dB = tl.zeros((QP, NP), dtype=tl.float32)
        dC = tl.zeros((QP, NP), dtype=tl.float32)
    for j in tl.range(0, HPS, num_stages=1):
        h = g * HPG + sp * HPS + j
        A = tl.load(A_ptr + h).to(tl.float32)
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums (log2 domain) as masked row / column sums of (Q, Q) tiles, not tl.cumsum: with a
        # scan in a backward kernel triton 3.6 addressed shared memory out of range on an H200
        cs = tl.sum(tl.where(causal, (dt * (A * LOG2E))[None, :], 0.0), axis=1)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)
        ecs = tl.exp2(cs)
        dec = tl.exp2(cL - cs)  # decay from token s (excluded) to the chunk's end
        w = tl.where(mq, dt * dec, 0.0)
        # exp only where t >= s: above the diagonal cs_t - cs_s > 0 could overflow
        Lm = tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))
        xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h, n_end, P, s_x_t, QP, PP, TMA)
        dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h, n_end, P, s_dy_t, QP, PP, TMA)
        x = _tile(xd, r0, n_end, P, s_x_t, QP, PP, TMA, True)
        dy = _tile(dyd, r0, n_end, P, s_dy_t, QP, PP, TMA, True)
        mat = k * H + h
        dS = _sload(dsd, mat, 0, P, N, PP, NP, TMA)  # (p, n)
        if PART == "dbc":
            S = _sload(sd, mat, 0, P, N, PP, NP, TMA)
        dWm = tl.where(causal, _mm(dy, tl.trans(x), x, OPS), 0.0)
        dM = dWm * dt[None, :]
        ddt_h = ddt_ptr + (ts64 + r0 + q) * H + h
        if PART == "dx":
            M = G * Lm
            E = dM * M
            ddt = tl.sum(dWm * M, axis=0)
            dcs = tl.sum(E, axis=1) - tl.sum(E, axis=0)
            dx = _mm(tl.trans(M * dt[None, :]), dy, x, OPS)
            R = _mm(Bm, tl.trans(dS), x, OPS)  # B dS^T
            dw = tl.sum(x.to(tl.float32) * R, axis=1)  # x_s . R_s
            dx += w[:, None] * R
            if HAS_D:
                if D_PER_CHANNEL:
                    Dv = tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :]
                else:
                    Dv = tl.load(D_ptr + h).to(tl.float32)
                dx += Dv * dy.to(tl.float32)
            dxd = _desc(dx_ptr + ts64 * s_dx_t + h * s_dx_h, n_end, P, s_dx_t, QP, PP, TMA)
            _put(dxd, r0, n_end, P, s_dx_t, dx.to(dx_ptr.dtype.element_ty), QP, PP, TMA, True)
            # exp(cs) rowsum(C * (dy S)), from the "dbc" launch (in ddt)
            dcs += tl.load(ddt_h, mask=mq, other=0.0) - dw * w
            # sum(dS * S), in the state pass's shares
            pbs = tl.arange(0, NPB)
            dSS = tl.sum(tl.load(dsp_ptr + mat.to(tl.int64) * n_pb + pbs, mask=pbs < n_pb, other=0.0), axis=0)
            dcL = tl.exp2(cL) * dSS + tl.sum(dw * w, axis=0)
            dcs += tl.where(last, dcL, 0.0)  # cL = cs of the padded block's last row
            da = tl.sum(tl.where(causal, dcs[:, None], 0.0), axis=0)  # da_s = sum_{t >= s} dcs_t
            ddt += dec * dw + A * da
            tl.store(ddt_h, ddt, mask=mq)
            tl.store(dAp_ptr + mat.to(tl.int64), tl.sum(dt * da, axis=0))  # mat = k H + h
        else:
            dG = dM * Lm
            dyS = _mm(dy, S, x, OPS)  # (Q, n) dy S
            dC += _mm(dG, Bm, x, OPS) + ecs[:, None] * dyS
            # rowsum(dy * exp(cs) (C S^T)) = exp(cs) rowsum(C * (dy S)), a term of dcs for the "dx" launch
            tl.store(ddt_h, ecs * tl.sum(Cm.to(tl.float32) * dyS, axis=1), mask=mq)
            xdS = _mm(x, dS, x, OPS)  # (Q, n) x dS
            dB += _mm(tl.trans(dG), Cm, x, OPS) + w[:, None] * xdS
    if PART == "dbc":
        part = (sp.to(tl.int64) * n_tok + ts64) * G_N + g * N
        bpd = _desc(dBp_ptr + part, n_end, N, G_N, QP, NP, TMA)
        cpd = _desc(dCp_ptr + part, n_end, N, G_N, QP, NP, TMA)
        _put(bpd, r0, n_end, N, G_N, dB, QP, NP, TMA, True)
        _put(cpd, r0, n_end, N, G_N, dC, QP, NP, TMA, True)


@triton.jit
def _bwd_chunk(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, st_ptr, dst_ptr, dsp_ptr, dy_ptr, cu_ptr, choff_ptr, cseq_ptr,
    dx_ptr, ddt_ptr, dAp_ptr, dBp_ptr, dCp_ptr,
    n_seq, n_tok, H, P, N, HPG, HPS, Q, n_rows, n_pb,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NP: tl.constexpr,
    OPS: tl.constexpr, TMA: tl.constexpr, NPB: tl.constexpr, PART: tl.constexpr,
):
    """One program per (chunk row, group x head split); rows past the last sequence's chunks do nothing. The
    gradients of the chunk for HPS heads of a group, in two launches (fewer tiles live in each): PART "dbc"
    (first) writes its split's share of dB, dC into dBp, dCp (splits, tokens, G, N) and, in ddt, the term
    exp(cs) rowsum(C * (dy S)) of dcs; PART "dx" then dx and ddt of its tokens and heads and dAp[k, h] (a
    partial sum over the chunk).

    Chunk k (of all sequences' chunks, in order) belongs to sequence cseq[k] (n_seq: none, past the last).
    Tiles are read through descriptors of the sequence's rows up to the chunk's end (zeros past it)."""
    k = tl.program_id(0)
    gs = tl.program_id(1)
    n_split = HPG // HPS
    g = gs // n_split
    sp = gs % n_split
    s = tl.load(cseq_ptr + k)
    if s < n_seq:
        _chunk_grads(k, s, g, sp, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, st_ptr, dst_ptr, dsp_ptr, dy_ptr,
                     cu_ptr, choff_ptr, dx_ptr, ddt_ptr, dAp_ptr, dBp_ptr, dCp_ptr, n_seq, n_tok, H, P, N, HPG, HPS,
                     Q, n_rows, n_pb, s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h,
                     s_dx_t, s_dx_h, HAS_D, D_PER_CHANNEL, QP, PP, NP, OPS, TMA, NPB, PART)
