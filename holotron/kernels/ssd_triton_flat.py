"""The SSD scan's forward with headdim blocks laid across the heads of a group (``SCAN_CONFIG["FLAT"]``).

The one-launch scan of ssd_triton_scan.py gives every program the columns of one head: at P = 80 a block
of 64 or 128 columns leaves 48 of every 128 columns of its products padding (80 = 64 + a block of 16, or
one block padded to 128). Here a group's heads are laid end to end, HPG * P columns (x, z, y and the
state are (tokens, heads, headdim) with heads contiguous, so a group's columns are one contiguous run of
each token's row), and the program of block f takes columns f * BP .. f * BP + BP - 1 of that run: at
P = 80 and BP = 64, 16 heads are 20 full blocks where the per-head layout has 32 blocks, 12 of them
three quarters padding.

What stays per head is the decay: cs (the cumulative dt * A of the chunk), the weight of each token
toward the chunk's end and the chunk's whole decay belong to the head of a column. The incoming-state
term and the state update take them column by column (elementwise, so one product serves the whole
block):

    y        += exp(cs_col) * (C @ S^T)                      cs_col[t, j] = cs of column j's head at token t
    S^T       = exp(cs_end_col) * S^T + B^T @ (x * w_col)     w_col[t, j] = dt_t exp(cs_end - cs_t), j's head

and the intra-chunk term, whose decay matrix differs per head, is one product per head the block
touches, each over the block's columns of that head only (the others masked to 0):

    y        += sum over heads k in the block of  (C B^T * exp(cs_k,t - cs_k,s) * dt_k,s, causal) @ x[:, cols of k]

C B^T is computed once per chunk for all of them (B and C are the group's). At P = 80, BP = 64 the blocks
touch one or two heads (two intra products in three blocks of five): the intra product is a quarter of
the other two at Q = 32, N = 128, so this spends about 10% more product work per block on 37.5% fewer
blocks. Everything else (dt processing, the chunks in order with the fp32 state on chip, the states
stored for the backward, packed sequences, no host sync) is as in ssd_triton_scan.py, whose wrapper
validates, prepares and launches this kernel; the state tensors' (sequence, h, p, n) layout is the same.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ssd_triton_common import _desc, _mm, _process_dt, _put, _put_y, _seq_span, _state_in, _tile


def heads_per_block(p: int, hpg: int, bp: int) -> int:
    """The most heads any block of ``bp`` columns touches in a group of ``hpg`` heads of ``p`` columns."""
    width = hpg * p
    return max((min(f + bp, width) - 1) // p - f // p + 1 for f in range(0, width, bp))


@triton.jit
def _scan_flat(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, y_ptr, final_ptr, states_ptr,
    cu_ptr, choff_ptr,
    L, H, P, N, HPG, NMAX, lo, hi,
    s_x_t, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_y_t,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, VARLEN: tl.constexpr,
    STORE_STATES: tl.constexpr, EVERY: tl.constexpr, Q: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    NH: tl.constexpr, MASK_P: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr, OPS: tl.constexpr,
    NS: tl.constexpr,
):
    """One program per (block of BP columns of a group, group, sequence); NH: the most heads a block
    touches (heads_per_block); MASK_P: the group's last block is ragged."""
    g = tl.program_id(1)
    s = tl.program_id(2)
    c0 = tl.program_id(0) * BP
    GW = HPG * P
    t_seq, t_end = _seq_span(cu_ptr, s, L, VARLEN)
    if STORE_STATES:
        c_first = tl.load(choff_ptr + s).to(tl.int32)
    n_tok = t_end - t_seq
    n_chunks = tl.cdiv(n_tok, Q)
    LOG2E: tl.constexpr = 1.4426950408889634
    cols = c0 + tl.arange(0, BP)  # columns of the group's run
    mp = cols < GW
    hcol = cols // P              # each column's head within the group (>= HPG past the run)
    h_first = c0 // P
    h0 = g * HPG                  # the group's first head
    ns = tl.arange(0, BN)
    mn = ns < N
    qs = tl.arange(0, Q)
    causal = qs[:, None] >= qs[None, :]
    if HAS_D:
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h0 * P + cols, mask=mp, other=0.0).to(tl.float32)[None, :]
        else:
            Dv = tl.load(D_ptr + h0 + hcol, mask=mp, other=0.0).to(tl.float32)[None, :]
    else:
        Dv = 0.0

    t_seq64 = t_seq.to(tl.int64)
    col0 = h0 * P + c0            # the block's first column in a token's row of heads x headdim
    xd = _desc(x_ptr + t_seq64 * s_x_t + col0, n_tok, GW - c0, s_x_t, Q, BP, TMA)
    bd = _desc(B_ptr + t_seq64 * s_b_t + g * s_b_g, n_tok, N, s_b_t, Q, BN, TMA)
    cd = _desc(C_ptr + t_seq64 * s_c_t + g * s_c_g, n_tok, N, s_c_t, Q, BN, TMA)
    yd = _desc(y_ptr + t_seq64 * s_y_t + col0, n_tok, GW - c0, s_y_t, Q, BP, TMA)
    if HAS_Z:
        zd = _desc(z_ptr + t_seq64 * s_z_t + col0, n_tok, GW - c0, s_z_t, Q, BP, TMA)
    else:
        zd = yd  # (not read)
    STATES_TMA: tl.constexpr = TMA and not MASK_P
    if STORE_STATES:
        # states (rows, h, p, n) as rows * h * p rows of n: the block's rows of a state are contiguous
        sd = _desc(states_ptr + col0.to(tl.int64) * N, NMAX * H * P - col0, N, N, BP, BN, STATES_TMA)

    # the state, transposed (dstate x columns), fp32; state tensors are (sequence, h, p, n)
    st_base = (s.to(tl.int64) * H + h0) * P * N
    ST, st_off, st_mask = _state_in(init_ptr, st_base, ns, cols, N, mn, mp, BN, BP, HAS_INIT)

    for c in tl.range(0, n_chunks, num_stages=NS):
        r0 = c * Q
        mq = r0 + qs < n_tok
        xv = _tile(xd, r0, n_tok, GW - c0, s_x_t, Q, BP, TMA, MASK_P)
        Bv = _tile(bd, r0, n_tok, N, s_b_t, Q, BN, TMA, MASK_N)
        Cv = _tile(cd, r0, n_tok, N, s_c_t, Q, BN, TMA, MASK_N)
        if STORE_STATES and c % EVERY == 0:
            srow = (c_first + c // EVERY) * H * P
            if STATES_TMA:
                _put(sd, srow, 0, 0, N, tl.trans(ST).to(states_ptr.dtype.element_ty), BP, BN, True, False)
            else:
                tl.store(states_ptr + (srow.to(tl.int64) + h0 * P) * N + st_off,
                         ST.to(states_ptr.dtype.element_ty), mask=st_mask)
        CB = _mm(Cv, tl.trans(Bv), xv, OPS)
        # the incoming state's part C S^T, its decay exp(cs) applied head by head below
        y = _mm(Cv, ST, xv, OPS)
        xw = tl.zeros([Q, BP], dtype=xv.dtype)  # x weighted by its head's w, for the state update
        e_col = tl.zeros([BP], dtype=tl.float32)
        for k in tl.static_range(NH):
            hk = h_first + k                       # a head of the group (or past it: no column is its)
            hg = h0 + tl.minimum(hk, HPG - 1)
            dt = tl.load(dt_ptr + (t_seq64 + r0) * s_dt_t + hg * s_dt_h + qs * s_dt_t, mask=mq, other=0.0)
            if HAS_BIAS:
                bias = tl.load(bias_ptr + hg).to(tl.float32)
            else:
                bias = 0.0
            dt = tl.where(mq, _process_dt(dt.to(tl.float32), bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP), 0.0)
            a = dt * (tl.load(A_ptr + hg).to(tl.float32) * LOG2E)  # decays in the log2 domain (exp2)
            cs = tl.cumsum(a, axis=0)
            mine1 = hcol == hk
            mine = mine1[None, :]
            y = tl.where(mine, y * tl.exp2(cs)[:, None], y)
            # the head's intra-chunk part over its own columns: W[t, s] = C_t . B_s exp(cs_t - cs_s) dt_s
            # for s <= t (exp2 only there: no overflow above the diagonal)
            W = CB * tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf"))) * dt[None, :]
            y += _mm(W, tl.where(mine, xv, 0.0).to(xv.dtype), xv, OPS)
            # dt and the decay after each token to the chunk's end (a reverse sum: no cancellation)
            w = dt * tl.exp2(tl.cumsum(a, axis=0, reverse=True) - a)
            xw = tl.where(mine, (xv * w[:, None]).to(xv.dtype), xw)
            e_col = tl.where(mine1, tl.exp2(tl.sum(a, axis=0)), e_col)
        # the state leaving the chunk
        ST = ST * e_col[None, :] + _mm(tl.trans(Bv), xw, xv, OPS)
        _put_y(y, xv, Dv, zd, yd, y_ptr, r0, n_tok, GW - c0, s_z_t, s_y_t, Q, BP, TMA, MASK_P, HAS_D, HAS_Z)

    tl.store(final_ptr + st_base + st_off, ST, mask=st_mask)


def grid(p: int, h: int, g: int, n_seq: int, bp: int) -> tuple:
    return (triton.cdiv((h // g) * p, bp), g, n_seq)
