"""The chunk kernel of the SSD scan's backward (see ssd_triton_backward.py, which derives the formulas and
launches it after the reverse pass): dB and dC of one chunk, for one group and one block of dstate columns,
from the states the forward stored and the state gradients the reverse pass stored.

With dG_h = (dy_h x_h^T, t >= s) * dt_h[None, :] * L_h the gradient of head h's C B^T (a Q x Q matrix per
head), the group's

    dC = (sum_h dG_h) B + sum_h exp(cs_h) (dy_h S_h)          dB = (sum_h dG_h)^T C + sum_h w_h (x_h dS_h)

The program walks the group's heads (the loop's loads pipelined like a matrix product's K loop) adding
sum_h dG_h (Q x Q) and the two state terms (Q x BLOCK_N) in fp32 registers, then multiplies the summed
dG by B and C once: the heads' sum is taken before the two (Q, Q) x (Q, n) products, and dB, dC are
written once, in B's dtype, without partial sums.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ssd_triton_common import _desc, _mm, _put, _sdesc, _sload, _tile


@triton.jit
def _dbc_chunk(
    k, s, g, nb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, dB_ptr, dC_ptr,
    H, P, N, HPG, n_rows,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g,
    Q: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    NS: tl.constexpr,
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
    sd = _sdesc(st_ptr, n_rows * H, P, N, PP, NB, TMA)
    dsd = _sdesc(dst_ptr, n_rows * H, P, N, PP, NB, TMA)
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
        xd = _desc(x_ptr + ts64 * s_x_t + h * s_x_h, n_end, P, s_x_t, QP, PP, TMA)
        dyd = _desc(dy_ptr + ts64 * s_dy_t + h * s_dy_h, n_end, P, s_dy_t, QP, PP, TMA)
        x = _tile(xd, r0, n_end, P, s_x_t, QP, PP, TMA, True)
        dy = _tile(dyd, r0, n_end, P, s_dy_t, QP, PP, TMA, True)
        mat = k * H + h
        S = _sload(sd, mat, 0, n0, P, N, PP, NB, TMA)  # (p, n block): the state entering the chunk
        dS = _sload(dsd, mat, 0, n0, P, N, PP, NB, TMA)  # the gradient of the state leaving it
        dWm = tl.where(causal, _mm(dy, tl.trans(x), x, OPS), 0.0)
        dGs += dWm * dt[None, :] * Lm
        accC += ecs[:, None] * _mm(dy, S, x, OPS)
        accB += w[:, None] * _mm(x, dS, x, OPS)
    dC = accC + _mm(dGs, Bm, Bm, OPS)
    dB = accB + _mm(tl.trans(dGs), Cm, Bm, OPS)
    dbd = _desc(dB_ptr + ts64 * s_db_t + g * s_db_g + n0, n_end, N - n0, s_db_t, QP, NB, TMA)
    dcd = _desc(dC_ptr + ts64 * s_dc_t + g * s_dc_g + n0, n_end, N - n0, s_dc_t, QP, NB, TMA)
    _put(dbd, r0, n_end, N - n0, s_db_t, dB.to(dB_ptr.dtype.element_ty), QP, NB, TMA, True)
    _put(dcd, r0, n_end, N - n0, s_dc_t, dC.to(dC_ptr.dtype.element_ty), QP, NB, TMA, True)


@triton.jit
def _bwd_dbc(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr, cseq_ptr, dB_ptr, dC_ptr,
    n_seq, H, P, N, HPG, n_rows,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g,
    Q: tl.constexpr, QP: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, OPS: tl.constexpr, TMA: tl.constexpr,
    NS: tl.constexpr,
):
    """One program per (chunk row, group, block of NB dstate columns); rows past the last sequence's chunks
    do nothing. Chunk k (of all sequences' chunks, in order) belongs to sequence cseq[k] (n_seq: none).
    Tiles are read through descriptors of the sequence's rows up to the chunk's end (zeros past it)."""
    k = tl.program_id(0)
    g = tl.program_id(1)
    nb = tl.program_id(2)
    s = tl.load(cseq_ptr + k)
    if s < n_seq:
        _dbc_chunk(k, s, g, nb, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, st_ptr, dst_ptr, dy_ptr, cu_ptr, choff_ptr,
                   dB_ptr, dC_ptr, H, P, N, HPG, n_rows, s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g,
                   s_dy_t, s_dy_h, s_db_t, s_db_g, s_dc_t, s_dc_g, Q, QP, PP, NB, OPS, TMA, NS)
