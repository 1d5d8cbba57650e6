"""The SSD scan as Triton kernels (forward): the GPU path of ``ssd_scan`` and ``ssd_step``.

Arguments are validated by ``holotron.kernels.ssd_scan`` / ``ssd_step``; call those. The README
beside this file derives the math. The scan is two launches (and a memset) over "chunks" of at most
Q tokens that never straddle a sequence boundary:

    1. _dt_cumsum   per (chunk, head block): dt -> +bias, softplus, clamp; cs = cumsum(dt * A)
    2. _scan_fused  per (chunk, head): the chunk's state S_c; wait for S_in from the previous chunk,
                    publish exp(cs_end) S_in + S_c; y = intra-chunk term + C . S_in term + D x,
                    gated by silu(z)

The four-kernel version (chunk states written, passed along, read back: _chunk_state, _pass_state,
_chunk_out) runs with SCAN_CONFIG["fused"] = False, as a second opinion for tests and benchmarks.
With SCAN_CONFIG["cb"] a third launch, _chunk_cb, computes C_t.B_s once per (chunk, group) into a
scratch buffer that _scan_fused reads instead of recomputing it for each of the group's heads.
Chunks are laid out per sequence: sequence s (a batch row, or one ``cu_seqlens`` segment) owns
ceil(len_s / Q) consecutive chunks. With ``cu_seqlens`` the chunk table is computed on the device
with a static upper bound on the number of chunks; without it the kernels compute chunk bounds
themselves. Nothing here waits on the host (the whole scan can be captured in a CUDA graph). Tokens
are addressed in the flattened (batch * seqlen) axis. Decay math, accumulation and the state are
fp32; the matrix products take fp32 operands in IEEE precision for fp32 inputs (no TF32) and half
operands for bf16 / fp16 inputs. float64 inputs are computed in fp32 (the naive and chunked
backends do float64).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Every buffer these wrappers hand to a kernel comes from here. Tests swap it for a NaN-filled
# allocation, so an element a kernel should have written but did not shows up as NaN.
_empty = torch.empty

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


# ----------------------------------------------------------------------------- 1. dt, cumsum


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


# ----------------------------------------------------------------------------- 2. chunk states


@triton.jit
def _chunk_state(
    x_ptr, B_ptr, dtp_ptr, cs_ptr, cstart_ptr, cend_ptr, st_ptr,
    H, P, N, HPG, s_x_t, s_x_h, s_b_t, s_b_g,
    Q, QP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, OPS: tl.constexpr,
):
    """S_c[h] (p, n) = sum_s x_s^T (B_s dt_s exp(cs_end - cs_s)), fp32, into (chunks, h, p, n)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    ps = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    ns = tl.arange(0, BLOCK_N)
    n_chunks = tl.num_programs(0)
    t0 = tl.load(cstart_ptr + c)
    t1 = tl.load(cend_ptr + c)
    g = h // HPG
    row = (h.to(tl.int64) * n_chunks + c) * QP
    cs_end = tl.load(cs_ptr + row + QP - 1)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mk = (ks < Q) & (t0 + ks < t1)
        tok = (t0 + ks).to(tl.int64)
        xT = tl.load(x_ptr + tok[None, :] * s_x_t + h * s_x_h + ps[:, None],
                     mask=mk[None, :] & (ps[:, None] < P), other=0.0)  # (BLOCK_P, BLOCK_K)
        Bk = tl.load(B_ptr + tok[:, None] * s_b_t + g * s_b_g + ns[None, :],
                     mask=mk[:, None] & (ns[None, :] < N), other=0.0)  # (BLOCK_K, BLOCK_N)
        dt = tl.load(dtp_ptr + row + ks, mask=ks < QP, other=0.0)
        cs = tl.load(cs_ptr + row + ks, mask=ks < QP, other=0.0)
        w = tl.where(mk, dt * tl.exp(cs_end - cs), 0.0)  # decay from s to the chunk's end
        Bw = Bk.to(tl.float32) * w[:, None]
        acc += _mm(xT, Bw, xT, OPS)
    off = ((c.to(tl.int64) * H + h) * P + ps[:, None]) * N + ns[None, :]
    tl.store(st_ptr + off, acc, mask=(ps[:, None] < P) & (ns[None, :] < N))


# ----------------------------------------------------------------------------- 3. state passing


@triton.jit
def _pass_state(
    st_ptr, cs_ptr, choff_ptr, init_ptr, final_ptr,
    H, PN, n_chunks,
    HAS_INIT: tl.constexpr, QP: tl.constexpr, BLOCK: tl.constexpr,
):
    """For sequence s, over its chunks in order: S_in(c) = S; S = exp(cs_end(c)) S + S_c.
    Overwrites each chunk's S_c with S_in(c) (the state entering it) and writes the final S."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    e = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    me = e < PN
    sh = s.to(tl.int64) * H + h
    if HAS_INIT:
        S = tl.load(init_ptr + sh * PN + e, mask=me, other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BLOCK,), dtype=tl.float32)
    c0 = tl.load(choff_ptr + s)
    c1 = tl.load(choff_ptr + s + 1)
    for i in range(0, c1 - c0):
        c = (c0 + i).to(tl.int64)  # (a tensor also under the interpreter, where range yields ints)
        ptr = st_ptr + (c * H + h) * PN + e
        Sc = tl.load(ptr, mask=me, other=0.0)
        tl.store(ptr, S, mask=me)
        decay = tl.exp(tl.load(cs_ptr + (h * n_chunks + c) * QP + QP - 1))
        S = decay * S + Sc
    tl.store(final_ptr + sh * PN + e, S, mask=me)


# ----------------------------------------------------------------------------- 4. chunk outputs


@triton.jit
def _chunk_out(
    x_ptr, z_ptr, D_ptr, B_ptr, C_ptr, dtp_ptr, cs_ptr, st_ptr, cstart_ptr, cend_ptr, y_ptr,
    H, P, N, HPG, n_pb,
    s_x_t, s_x_h, s_z_t, s_z_h, s_y_t, s_y_h, s_b_t, s_b_g, s_c_t, s_c_g,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr,
    Q, QP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, OPS: tl.constexpr, STATE_OPS: tl.constexpr,
):
    """y_t = sum_{s<=t} (C_t.B_s) exp(cs_t - cs_s) dt_s x_s + exp(cs_t) C_t.S_in + D x_t; y *= silu(z)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    pb = tl.program_id(2) % n_pb
    m0 = (tl.program_id(2) // n_pb) * BLOCK_M
    n_chunks = tl.num_programs(0)
    t0 = tl.load(cstart_ptr + c)
    t1 = tl.load(cend_ptr + c)
    g = h // HPG
    row = (h.to(tl.int64) * n_chunks + c) * QP
    ps = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    ns = tl.arange(0, BLOCK_N)
    ms = m0 + tl.arange(0, BLOCK_M)
    mm = (ms < Q) & (t0 + ms < t1)
    mp = ps < P
    tok_m = (t0 + ms).to(tl.int64)

    Cm = tl.load(C_ptr + tok_m[:, None] * s_c_t + g * s_c_g + ns[None, :],
                 mask=mm[:, None] & (ns[None, :] < N), other=0.0)  # (BLOCK_M, BLOCK_N)
    cs_m = tl.load(cs_ptr + row + ms, mask=ms < QP, other=0.0)

    # inter-chunk: exp(cs_t) C_t . S_in, the state entering the chunk (fp32)
    SinT = tl.load(st_ptr + ((c.to(tl.int64) * H + h) * P + ps[None, :]) * N + ns[:, None],
                   mask=mp[None, :] & (ns[:, None] < N), other=0.0)  # (BLOCK_N, BLOCK_P)
    acc = _mm(Cm, SinT, SinT, STATE_OPS)  # fp32 state: never half
    acc = acc * tl.exp(cs_m)[:, None]

    # intra-chunk: source blocks up to the diagonal
    for k0 in range(0, m0 + BLOCK_M, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mk = (ks < Q) & (t0 + ks < t1)
        tok_k = (t0 + ks).to(tl.int64)
        BkT = tl.load(B_ptr + tok_k[None, :] * s_b_t + g * s_b_g + ns[:, None],
                      mask=mk[None, :] & (ns[:, None] < N), other=0.0)  # (BLOCK_N, BLOCK_K)
        CB = _mm(Cm, BkT, Cm, OPS)  # (BLOCK_M, BLOCK_K) fp32
        cs_k = tl.load(cs_ptr + row + ks, mask=ks < QP, other=0.0)
        dt_k = tl.load(dtp_ptr + row + ks, mask=ks < QP, other=0.0)
        causal = (ms[:, None] >= ks[None, :]) & mk[None, :]
        # exp only where t >= s: above the diagonal cs_t - cs_s > 0 could overflow
        decay = tl.exp(tl.where(causal, cs_m[:, None] - cs_k[None, :], float("-inf")))
        W = CB * decay * dt_k[None, :]
        xk = tl.load(x_ptr + tok_k[:, None] * s_x_t + h * s_x_h + ps[None, :],
                     mask=mk[:, None] & mp[None, :], other=0.0)  # (BLOCK_K, BLOCK_P)
        acc += _mm(W, xk, xk, OPS)

    mo = mm[:, None] & mp[None, :]
    if HAS_D:
        xm = tl.load(x_ptr + tok_m[:, None] * s_x_t + h * s_x_h + ps[None, :], mask=mo, other=0.0).to(tl.float32)
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)
            acc += xm * Dv[None, :]
        else:
            acc += xm * tl.load(D_ptr + h).to(tl.float32)
    if HAS_Z:
        zm = tl.load(z_ptr + tok_m[:, None] * s_z_t + h * s_z_h + ps[None, :], mask=mo, other=0.0).to(tl.float32)
        acc = acc * zm * tl.sigmoid(zm)
    tl.store(y_ptr + tok_m[:, None] * s_y_t + h * s_y_h + ps[None, :], acc.to(y_ptr.dtype.element_ty), mask=mo)


# ----------------------------------------------------------------------------- C B^T per group


@triton.jit
def _chunk_cb(
    B_ptr, C_ptr, cb_ptr, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr,
    N, L, CPS, s_b_t, s_b_g, s_c_t, s_c_g,
    VARLEN: tl.constexpr, Q, QP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr, OPS: tl.constexpr,
):
    """CB[c, g, t, s] = C_t . B_s for the tokens of chunk c, once per group (the HPG heads of a group
    share B and C), into (chunks, G, QP, QP) in cb's dtype. One program per (chunk, group, BLOCK_M rows);
    it writes the source blocks up to the diagonal (the ones _scan_fused reads), zeros past the chunk."""
    c = tl.program_id(0)
    g = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    n_groups = tl.num_programs(1)
    t0, t1, _, _, _ = _chunk_bounds(c, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr, L, CPS, Q, VARLEN)
    ns = tl.arange(0, BLOCK_N)
    mn = ns < N
    ms = m0 + tl.arange(0, BLOCK_M)
    mm = (ms < Q) & (t0 + ms < t1)
    tok_m = (t0 + ms).to(tl.int64)
    Cm = tl.load(C_ptr + tok_m[:, None] * s_c_t + g * s_c_g + ns[None, :], mask=mm[:, None] & mn[None, :], other=0.0)
    base = cb_ptr + (c.to(tl.int64) * n_groups + g) * QP * QP
    for k0 in range(0, m0 + BLOCK_M, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mk = (ks < Q) & (t0 + ks < t1)
        tok = (t0 + ks).to(tl.int64)
        BkT = tl.load(B_ptr + tok[None, :] * s_b_t + g * s_b_g + ns[:, None],
                      mask=mk[None, :] & mn[:, None], other=0.0)  # (BLOCK_N, BLOCK_K)
        CB = _mm(Cm, BkT, Cm, OPS)  # (BLOCK_M, BLOCK_K) fp32, as _scan_fused computes it
        tl.store(base + ms[:, None] * QP + ks[None, :], CB.to(cb_ptr.dtype.element_ty),
                 mask=(ms[:, None] < QP) & (ks[None, :] < QP))


# ----------------------------------------------------------------------------- fused scan


@triton.jit
def _scan_fused(
    x_ptr, z_ptr, D_ptr, B_ptr, C_ptr, dtp_ptr, cs_ptr, init_ptr, final_ptr, slot_ptr, flag_ptr, y_ptr, cb_ptr,
    cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr,
    H, P, N, HPG, L, CPS, NPB,
    s_x_t, s_x_h, s_z_t, s_z_h, s_y_t, s_y_h, s_b_t, s_b_g, s_c_t, s_c_g,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    VARLEN: tl.constexpr, TICKET: tl.constexpr, CB_BUF: tl.constexpr,
    Q, QP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, OPS: tl.constexpr, STATE_OPS: tl.constexpr,
):
    """One program per (chunk, head, tile of P): a P0 block and, when P is not a power of two, a
    second P1 block (80 = 64 + 16, one tile), or NPB tiles of P0 columns. In three phases:
      1. S_c = sum_s exp(cs_end - cs_s) dt_s B_s x_s^T, the chunk's own state, kept as (n, p);
      2. waits until the program of the sequence's previous chunk has published S_in (its outgoing
         state), reads it, publishes S_out = exp(cs_end) S_in + S_c (or writes the final state);
      3. y = exp(cs_t) C_t . S_in + sum_{s<=t} (C_t.B_s) exp(cs_t - cs_s) dt_s x_s (+ D x) (* silu z);
         C_t.B_s computed here, or (CB_BUF) read from cb, _chunk_cb's (chunks, G, QP, QP) per group.
    Chunk states never go to memory except through a ring of two slots per (sequence, head): chunk i
    writes slot i % 2 only after chunk i - 1 published, i.e. after chunk i - 1 finished reading slot i % 2.
    Programs take chunks in ticket order (an atomic counter): a chunk only waits on one that started
    earlier, so the waits always end, whatever order the hardware starts programs in."""
    if TICKET:
        ticket = tl.atomic_add(flag_ptr, 1)
    else:
        ticket = tl.program_id(0)
    c = ticket // (H * NPB)
    h = (ticket - c * H * NPB) // NPB
    pb = ticket - (c * H + h) * NPB  # which tile of P0 + P1 columns
    n_chunks = tl.num_programs(0) // (H * NPB)
    t0, t1, seq, ci, last = _chunk_bounds(c, cstart_ptr, cend_ptr, cseq_ptr, cidx_ptr, clast_ptr, L, CPS, Q, VARLEN)
    real = t1 > t0  # padding chunks at the end of a packed table do nothing
    g = h // HPG
    row = (h.to(tl.int64) * n_chunks + c) * QP
    sh = seq.to(tl.int64) * H + h
    ns = tl.arange(0, BLOCK_N)
    mn = ns < N
    p0 = pb * (P0 + P1) + tl.arange(0, P0)
    mp0 = p0 < P
    cs_end = tl.load(cs_ptr + row + QP - 1)

    # 1. the chunk's own state, (n, p): sum over source blocks of (B w)^T x
    sc0 = tl.zeros((BLOCK_N, P0), dtype=tl.float32)
    if P1 > 0:
        p1 = pb * (P0 + P1) + P0 + tl.arange(0, P1)
        mp1 = p1 < P
        sc1 = tl.zeros((BLOCK_N, P1), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mk = (ks < Q) & (t0 + ks < t1)
        tok = (t0 + ks).to(tl.int64)
        BkT = tl.load(B_ptr + tok[None, :] * s_b_t + g * s_b_g + ns[:, None],
                      mask=mk[None, :] & mn[:, None], other=0.0)  # (BLOCK_N, BLOCK_K)
        dt = tl.load(dtp_ptr + row + ks, mask=ks < QP, other=0.0)
        cs = tl.load(cs_ptr + row + ks, mask=ks < QP, other=0.0)
        w = tl.where(mk, dt * tl.exp(cs_end - cs), 0.0)  # decay from s to the chunk's end
        BwT = BkT.to(tl.float32) * w[None, :]
        x0 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p0[None, :], mask=mk[:, None] & mp0[None, :], other=0.0)
        sc0 += _mm(BwT, x0, x0, OPS)
        if P1 > 0:
            x1 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p1[None, :], mask=mk[:, None] & mp1[None, :], other=0.0)
            sc1 += _mm(BwT, x1, x1, OPS)

    # 2. the state entering the chunk; publish the one leaving it
    if real & (ci > 0):
        while tl.atomic_add(flag_ptr + 1 + sh * NPB + pb, 0, sem="acquire", scope="gpu") < ci:
            pass
    slot_in = slot_ptr + (sh * 2 + (ci + 1) % 2) * N * P  # slot (ci - 1) % 2, laid out (n, p)
    slot_out = slot_ptr + (sh * 2 + ci % 2) * N * P
    m0s = mn[:, None] & mp0[None, :]
    from_slot = real & (ci > 0)  # (scalar conditions enter masks through tl.where: the interpreter
    # rejects a mask made by & with a scalar)
    s0 = tl.load(slot_in + ns[:, None] * P + p0[None, :], mask=tl.where(from_slot, m0s, False), other=0.0, cache_modifier=".cg")
    if HAS_INIT:
        s0 += tl.load(init_ptr + (sh * P + p0[None, :]) * N + ns[:, None], mask=tl.where(real & (ci == 0), m0s, False), other=0.0)
    decay_end = tl.exp(cs_end)
    o0 = decay_end * s0 + sc0
    is_last = last != 0
    keep = last == 0  # not the sequence's last chunk: publish for the next one
    tl.store(final_ptr + (sh * P + p0[None, :]) * N + ns[:, None], o0, mask=tl.where(real & is_last, m0s, False))
    tl.store(slot_out + ns[:, None] * P + p0[None, :], o0, mask=tl.where(real & keep, m0s, False))
    if P1 > 0:
        m1s = mn[:, None] & mp1[None, :]
        s1 = tl.load(slot_in + ns[:, None] * P + p1[None, :], mask=tl.where(from_slot, m1s, False), other=0.0, cache_modifier=".cg")
        if HAS_INIT:
            s1 += tl.load(init_ptr + (sh * P + p1[None, :]) * N + ns[:, None], mask=tl.where(real & (ci == 0), m1s, False), other=0.0)
        o1 = decay_end * s1 + sc1
        tl.store(final_ptr + (sh * P + p1[None, :]) * N + ns[:, None], o1, mask=tl.where(real & is_last, m1s, False))
        tl.store(slot_out + ns[:, None] * P + p1[None, :], o1, mask=tl.where(real & keep, m1s, False))
    tl.debug_barrier()  # every thread's slot stores happen before the release below
    if real & keep:
        tl.atomic_xchg(flag_ptr + 1 + sh * NPB + pb, ci + 1, sem="release", scope="gpu")

    # 3. outputs, BLOCK_M rows at a time
    cb_row = cb_ptr + (c.to(tl.int64) * (H // HPG) + g) * QP * QP
    for m0 in range(0, Q, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        mm = (ms < Q) & (t0 + ms < t1)
        tok_m = (t0 + ms).to(tl.int64)
        Cm = tl.load(C_ptr + tok_m[:, None] * s_c_t + g * s_c_g + ns[None, :], mask=mm[:, None] & mn[None, :], other=0.0)
        cs_m = tl.load(cs_ptr + row + ms, mask=ms < QP, other=0.0)
        em = tl.exp(cs_m)[:, None]
        acc0 = _mm(Cm, s0, s0, STATE_OPS) * em  # exp(cs_t) C_t . S_in
        if P1 > 0:
            acc1 = _mm(Cm, s1, s1, STATE_OPS) * em
        for k0 in range(0, m0 + BLOCK_M, BLOCK_K):  # source blocks up to the diagonal
            ks = k0 + tl.arange(0, BLOCK_K)
            mk = (ks < Q) & (t0 + ks < t1)
            tok = (t0 + ks).to(tl.int64)
            causal = (ms[:, None] >= ks[None, :]) & mk[None, :]
            if CB_BUF:  # computed once per group by _chunk_cb; only t >= s is read
                CB = tl.load(cb_row + ms[:, None] * QP + ks[None, :], mask=causal, other=0.0).to(tl.float32)
            else:
                BkT = tl.load(B_ptr + tok[None, :] * s_b_t + g * s_b_g + ns[:, None],
                              mask=mk[None, :] & mn[:, None], other=0.0)
                CB = _mm(Cm, BkT, Cm, OPS)  # (BLOCK_M, BLOCK_K) fp32
            cs_k = tl.load(cs_ptr + row + ks, mask=ks < QP, other=0.0)
            dt_k = tl.load(dtp_ptr + row + ks, mask=ks < QP, other=0.0)
            # exp only where t >= s: above the diagonal cs_t - cs_s > 0 could overflow
            W = CB * tl.exp(tl.where(causal, cs_m[:, None] - cs_k[None, :], float("-inf"))) * dt_k[None, :]
            x0 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p0[None, :], mask=mk[:, None] & mp0[None, :], other=0.0)
            acc0 += _mm(W, x0, x0, OPS)
            if P1 > 0:
                x1 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p1[None, :], mask=mk[:, None] & mp1[None, :], other=0.0)
                acc1 += _mm(W, x1, x1, OPS)
        _finish_rows(acc0, x_ptr, z_ptr, D_ptr, y_ptr, tok_m, mm, h, p0, mp0, P,
                     s_x_t, s_x_h, s_z_t, s_z_h, s_y_t, s_y_h, HAS_D, D_PER_CHANNEL, HAS_Z)
        if P1 > 0:
            _finish_rows(acc1, x_ptr, z_ptr, D_ptr, y_ptr, tok_m, mm, h, p1, mp1, P,
                         s_x_t, s_x_h, s_z_t, s_z_h, s_y_t, s_y_h, HAS_D, D_PER_CHANNEL, HAS_Z)


@triton.jit
def _finish_rows(acc, x_ptr, z_ptr, D_ptr, y_ptr, tok_m, mm, h, ps, mp, P,
                 s_x_t, s_x_h, s_z_t, s_z_h, s_y_t, s_y_h,
                 HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr):
    """y = acc + D x, times silu(z), stored in y's dtype; rows tok_m (mask mm), columns ps (mask mp)."""
    mo = mm[:, None] & mp[None, :]
    if HAS_D:
        xm = tl.load(x_ptr + tok_m[:, None] * s_x_t + h * s_x_h + ps[None, :], mask=mo, other=0.0).to(tl.float32)
        if D_PER_CHANNEL:
            acc += xm * tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :]
        else:
            acc += xm * tl.load(D_ptr + h).to(tl.float32)
    if HAS_Z:
        zm = tl.load(z_ptr + tok_m[:, None] * s_z_t + h * s_z_h + ps[None, :], mask=mo, other=0.0).to(tl.float32)
        acc = acc * zm * tl.sigmoid(zm)
    tl.store(y_ptr + tok_m[:, None] * s_y_t + h * s_y_h + ps[None, :], acc.to(y_ptr.dtype.element_ty), mask=mo)


# ----------------------------------------------------------------------------- the scan


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


def _p_split(p: int) -> tuple[int, int]:
    """P as one power-of-two block (P1 = 0) or two, when that pads less: 80 -> (64, 16), 96 -> (64, 32)."""
    full = _p2(p)
    if p <= _DOT_MIN or full == p:
        return full, 0
    p0 = 1 << (p.bit_length() - 1)
    p1 = _p2(p - p0)
    return (full, 0) if p0 + p1 >= full else (p0, p1)


# launch settings of the fused scan (the benchmark sweeps them). fused=False runs the four-kernel
# version (chunk states through memory), kept as the benchmark's and the tests' second opinion.
# cb: C_t.B_s once per (chunk, group) by _chunk_cb into a scratch buffer that _scan_fused reads, instead
# of once per head: True (the default: buffer in fp32, the same values as recomputed; 7-9% faster at the
# Nemotron shapes on an H200, docs/benchmarks.md), False (recomputed per head), "half" (buffer in x's
# dtype: half the bytes, one more rounding, and slower than True on the H200).
SCAN_CONFIG = dict(fused=True, P_TILE=None, BLOCK_M=64, BLOCK_K=64, num_warps=8, num_stages=2, state_ops=None, ticket=True,
                   cb=True)


def ssd_scan_triton(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The fused Triton scan. Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state fp32).

    Launches: a memset (flags), _dt_cumsum, (with SCAN_CONFIG["cb"] _chunk_cb,) _scan_fused; with
    cu_seqlens also the few small torch ops of ``chunk_table``. None of them waits on the host, so the
    scan can be captured in a CUDA graph.
    """
    cfg = SCAN_CONFIG
    out_dtype = x.dtype
    if x.dtype == torch.float64:  # the kernels compute in fp32
        x, B, C = x.float(), B.float(), C.float()
        z = None if z is None else z.float()
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    dev = x.device
    Q = int(chunk_size)
    QP = _p2(Q)
    varlen = cu_seqlens is not None or not cfg["fused"]
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
    if varlen:
        tab = chunk_table(cu, n_max, Q)
        ctab = (tab["start"], tab["end"], tab["seq"], tab["idx"], tab["last"])
    else:
        ctab = (A32,) * 5  # not read

    xt, Bt, Ct, dtt = _tokens(x), _tokens(B), _tokens(C), _tokens(dt)
    zt = None if z is None else _tokens(z)
    y = _empty(b, l, h, p, dtype=x.dtype, device=dev)
    yt = y.view(b * l, h, p)

    # processed dt and the in-chunk cumulative decay, (h, chunks, QP) each
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")
    dtp = _empty(h, n_max, QP, dtype=torch.float32, device=dev)
    cs = _empty(h, n_max, QP, dtype=torch.float32, device=dev)
    BLOCK_H = min(_p2(h, 1), max(1, 4096 // QP), 32)
    bias = None if dt_bias is None else dt_bias.float().contiguous()
    _dt_cumsum[(n_max, triton.cdiv(h, BLOCK_H))](
        dtt, bias if bias is not None else A32, A32, *ctab, dtp, cs,
        h, dtt.stride(0), dtt.stride(1), lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38, l, max(cps, 1), Q,
        HAS_BIAS=bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp, VARLEN=varlen, QP=QP, BLOCK_H=BLOCK_H,
    )
    ops = _dot_ops(x.dtype)
    state_ops = cfg["state_ops"] or ("ieee" if ops == "ieee" else "tf32")
    final = _empty(n_seq, h, p, n, dtype=torch.float32, device=dev)
    init = None if initial_state is None else initial_state.float().contiguous()
    Dc = None if D is None else D.contiguous()
    if not cfg["fused"]:
        _scan_unfused(xt, zt, Dc, Bt, Ct, yt, dtp, cs, init, final, tab, h, p, n, g, n_seq, n_max, Q, QP, ops, A32)
        return y.to(out_dtype), final

    if cfg["P_TILE"]:
        P0, P1, npb = cfg["P_TILE"], 0, triton.cdiv(p, cfg["P_TILE"])
    else:
        (P0, P1), npb = _p_split(p), 1
    BLOCK_M = min(cfg["BLOCK_M"], QP)
    BLOCK_K = min(cfg["BLOCK_K"], QP)
    slots = _empty(n_seq, h, 2, n, p, dtype=torch.float32, device=dev)
    flags = torch.zeros(1 + n_seq * h * npb, dtype=torch.int32, device=dev)  # [ticket counter, one per (seq, head, tile)]
    cb_mode = cfg.get("cb", False)
    if cb_mode:
        if cb_mode not in (True, "half"):
            raise ValueError(f"SCAN_CONFIG['cb'] must be False, True or 'half', got {cb_mode!r}")
        cb = _empty(n_max, g, QP, QP, dtype=x.dtype if cb_mode == "half" else torch.float32, device=dev)
        _chunk_cb[(n_max, g, triton.cdiv(Q, BLOCK_M))](
            Bt, Ct, cb, *ctab, n, l, max(cps, 1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
            VARLEN=varlen, Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_N=_p2(n), OPS=ops, num_warps=4,
        )
    else:
        cb = A32  # not read
    _scan_fused[(n_max * h * npb,)](
        xt, zt if zt is not None else xt, Dc if Dc is not None else A32, Bt, Ct, dtp, cs,
        init if init is not None else final, final, slots, flags, yt, cb, *ctab,
        h, p, n, h // g, l, max(cps, 1), npb,
        xt.stride(0), xt.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)),
        yt.stride(0), yt.stride(1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_INIT=init is not None, VARLEN=varlen, TICKET=cfg["ticket"], CB_BUF=bool(cb_mode),
        Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_N=_p2(n), P0=P0, P1=P1, OPS=ops, STATE_OPS=state_ops,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y.to(out_dtype), final


def _scan_unfused(xt, zt, Dc, Bt, Ct, yt, dtp, cs, init, final, tab, h, p, n, g, n_seq, n_max, Q, QP, ops, A32):
    """The four-kernel version: chunk states written, passed along in place, read back."""
    cstart, cend, choff = tab["start"], tab["end"], tab["choff"]
    dev = xt.device
    BLOCK_N = _p2(n)
    BLOCK_P = min(64, _p2(p))
    BLOCK_K = min(64, QP)
    n_pb = triton.cdiv(p, BLOCK_P)
    states = _empty(n_max, h, p, n, dtype=torch.float32, device=dev)
    _chunk_state[(n_max, h, n_pb)](
        xt, Bt, dtp, cs, cstart, cend, states,
        h, p, n, h // g, xt.stride(0), xt.stride(1), Bt.stride(0), Bt.stride(1),
        Q=Q, QP=QP, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, OPS=ops,
    )
    BLOCK_S = min(1024, triton.next_power_of_2(p * n))
    _pass_state[(n_seq, h, triton.cdiv(p * n, BLOCK_S))](
        states, cs, choff, init if init is not None else final, final,
        h, p * n, n_max, HAS_INIT=init is not None, QP=QP, BLOCK=BLOCK_S,
    )
    BLOCK_M = min(64, QP)
    _chunk_out[(n_max, h, n_pb * triton.cdiv(Q, BLOCK_M))](
        xt, zt if zt is not None else xt, Dc if Dc is not None else A32, Bt, Ct, dtp, cs, states,
        cstart, cend, yt,
        h, p, n, h // g, n_pb,
        xt.stride(0), xt.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)),
        yt.stride(0), yt.stride(1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
        HAS_D=Dc is not None, D_PER_CHANNEL=Dc is not None and Dc.dim() == 2, HAS_Z=zt is not None,
        Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, OPS=ops,
        STATE_OPS="ieee" if ops == "ieee" else "tf32",
    )


# ----------------------------------------------------------------------------- one decode step


@triton.jit
def _step(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr,
    H, P, N, HPG, lo, hi,
    s_s_b, s_s_h, s_s_p, s_x_b, s_x_h, s_dt_b, s_dt_h, s_b_b, s_b_g, s_c_b, s_c_g,
    s_z_b, s_z_h, s_y_b, s_y_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    STATE_LOW: tl.constexpr,
):
    """S = exp(dt A) S + dt x B^T; y = S C + D x; y *= silu(z). In the state's dtype (fp32 or fp64); a bf16 /
    fp16 state (STATE_LOW) is computed in fp32 and rounded once when stored (y uses the unrounded S)."""
    bi = tl.program_id(0)
    h = tl.program_id(1)
    ps = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    ns = tl.arange(0, BLOCK_N)
    mp = ps < P
    mn = ns < N
    g = h // HPG
    sptr = state_ptr + bi.to(tl.int64) * s_s_b + h * s_s_h + ps[:, None] * s_s_p + ns[None, :]
    S = tl.load(sptr, mask=mp[:, None] & mn[None, :], other=0.0)
    if STATE_LOW:
        S = S.to(tl.float32)
    cd = S.dtype
    dt = tl.load(dt_ptr + bi * s_dt_b + h * s_dt_h).to(cd)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h).to(cd)
    else:
        bias = 0.0
    dt = _process_dt(dt, bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP)
    A = tl.load(A_ptr + h).to(cd)
    x = tl.load(x_ptr + bi * s_x_b + h * s_x_h + ps, mask=mp, other=0.0).to(cd)
    Bv = tl.load(B_ptr + bi * s_b_b + g * s_b_g + ns, mask=mn, other=0.0).to(cd)
    Cv = tl.load(C_ptr + bi * s_c_b + g * s_c_g + ns, mask=mn, other=0.0).to(cd)
    S = S * tl.exp(dt * A) + (dt * x)[:, None] * Bv[None, :]
    tl.store(sptr, S.to(state_ptr.dtype.element_ty), mask=mp[:, None] & mn[None, :])
    y = tl.sum(S * Cv[None, :], axis=1)
    if HAS_D:
        if D_PER_CHANNEL:
            y += x * tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(cd)
        else:
            y += x * tl.load(D_ptr + h).to(cd)
    if HAS_Z:
        zv = tl.load(z_ptr + bi * s_z_b + h * s_z_h + ps, mask=mp, other=0.0).to(cd)
        y = y * zv * tl.sigmoid(zv)
    tl.store(y_ptr + bi * s_y_b + h * s_y_h + ps, y.to(y_ptr.dtype.element_ty), mask=mp)


# launch settings of the step (the benchmark sweeps them); BLOCK_P None: chosen from the shapes
STEP_CONFIG = dict(BLOCK_P=None, num_warps=4)


def ssd_step_triton(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf"))):
    """One token: updates ``state`` (b, h, p, n) in place, returns y (b, h, p) like x."""
    b, h, p = x.shape
    g, n = B.shape[-2:]
    if state.stride(-1) != 1:  # updated in place, so it cannot be copied to a contiguous one
        raise ValueError(f"state must have a unit-stride last dim (dstate) for the triton step, got strides {state.stride()}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    z = None if z is None else (z if z.stride(-1) == 1 else z.contiguous())
    B = B if B.stride(-1) == 1 else B.contiguous()
    C = C if C.stride(-1) == 1 else C.contiguous()
    y = _empty(b, h, p, dtype=x.dtype, device=x.device)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")
    BLOCK_N = triton.next_power_of_2(n)
    # 16 rows of the state per program: P = 80 is five full blocks (no masked lanes), and b * h * 5
    # programs of 8 KiB each keep every multiprocessor busy from batch 1 on
    BLOCK_P = STEP_CONFIG["BLOCK_P"] or min(triton.next_power_of_2(p), max(1, 2048 // BLOCK_N))
    Dc = None if D is None else D.contiguous()
    _step[(b, h, triton.cdiv(p, BLOCK_P))](
        state, x, dt, A, B, C, Dc if Dc is not None else A, z if z is not None else x,
        dt_bias if dt_bias is not None else A, y,
        h, p, n, h // g, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
        state.stride(0), state.stride(1), state.stride(2), x.stride(0), x.stride(1),
        dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        *(z.stride()[:2] if z is not None else (0, 0)), y.stride(0), y.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp,
        BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, STATE_LOW=state.dtype in (torch.bfloat16, torch.float16),
        num_warps=STEP_CONFIG["num_warps"],
    )
    return y
