"""The SSD scan as a fused Triton kernel (forward): the GPU path of ``ssd_scan``.

Arguments are validated by ``holotron.kernels.ssd_scan``; call that. The README beside this file
derives the math. The scan is two launches (and a memset) over chunks of at most Q tokens that never
straddle a sequence boundary:

    1. _dt_cumsum   per (chunk, head block): dt -> +bias, softplus, clamp; cs = cumsum(dt * A)
                    (ssd_triton_common.py, shared with the four-kernel scan)
    2. _scan_fused  per (chunk, head): the chunk's state S_c; wait for S_in from the previous chunk,
                    publish exp(cs_end) S_in + S_c; y = intra-chunk term + C . S_in term + D x,
                    gated by silu(z)

With SCAN_CONFIG["cb"] a third launch, _chunk_cb, computes C_t.B_s once per (chunk, group) into a
scratch buffer that _scan_fused reads instead of recomputing it for each of the group's heads. With
SCAN_CONFIG["fused"] = False, ``ssd_scan_triton`` runs the four-kernel version of
``ssd_triton_chunks.py`` instead, as a second opinion for tests and benchmarks. With ``cu_seqlens``
the chunk table is computed on the device with a static upper bound on the number of chunks; without
it the kernels compute chunk bounds themselves. Nothing here waits on the host (the whole scan can be
captured in a CUDA graph).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ssd_triton_chunks import ssd_scan_triton_chunks
from .ssd_triton_common import _DOT_MIN, _chunk_bounds, _mm, _p2, empty, prepare_scan

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
            x1 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p1[None, :], mask=mk[:, None] & mp1[None, :],
                         other=0.0)
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
    s0 = tl.load(slot_in + ns[:, None] * P + p0[None, :], mask=tl.where(from_slot, m0s, False), other=0.0,
                 cache_modifier=".cg")
    if HAS_INIT:
        s0 += tl.load(init_ptr + (sh * P + p0[None, :]) * N + ns[:, None], mask=tl.where(real & (ci == 0), m0s, False),
                      other=0.0)
    decay_end = tl.exp(cs_end)
    o0 = decay_end * s0 + sc0
    is_last = last != 0
    keep = last == 0  # not the sequence's last chunk: publish for the next one
    tl.store(final_ptr + (sh * P + p0[None, :]) * N + ns[:, None], o0, mask=tl.where(real & is_last, m0s, False))
    tl.store(slot_out + ns[:, None] * P + p0[None, :], o0, mask=tl.where(real & keep, m0s, False))
    if P1 > 0:
        m1s = mn[:, None] & mp1[None, :]
        s1 = tl.load(slot_in + ns[:, None] * P + p1[None, :], mask=tl.where(from_slot, m1s, False), other=0.0,
                     cache_modifier=".cg")
        if HAS_INIT:
            s1 += tl.load(init_ptr + (sh * P + p1[None, :]) * N + ns[:, None],
                          mask=tl.where(real & (ci == 0), m1s, False), other=0.0)
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
        Cm = tl.load(C_ptr + tok_m[:, None] * s_c_t + g * s_c_g + ns[None, :], mask=mm[:, None] & mn[None, :],
                     other=0.0)
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
            x0 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p0[None, :], mask=mk[:, None] & mp0[None, :],
                         other=0.0)
            acc0 += _mm(W, x0, x0, OPS)
            if P1 > 0:
                x1 = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + p1[None, :], mask=mk[:, None] & mp1[None, :],
                             other=0.0)
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



# launch settings of the fused scan (the benchmark sweeps them). fused=False runs the four-kernel
# version (ssd_triton_chunks.py: chunk states through memory), kept as the benchmark's and the tests'
# second opinion. cb: C_t.B_s once per (chunk, group) by _chunk_cb into a scratch buffer that _scan_fused
# reads, instead of once per head: True (the default: buffer in fp32, the same values as recomputed; 7-9%
# faster at the Nemotron shapes on an H200, docs/benchmarks.md), False (recomputed per head), "half"
# (buffer in x's dtype: half the bytes, one more rounding, and slower than True on the H200).
SCAN_CONFIG = dict(fused=True, P_TILE=None, BLOCK_M=64, BLOCK_K=64, num_warps=8, num_stages=2, state_ops=None,
                   ticket=True, cb=True)


def ssd_scan_triton(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The fused Triton scan. Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state fp32).

    Launches: a memset (flags), _dt_cumsum, (with SCAN_CONFIG["cb"] _chunk_cb,) _scan_fused; with
    cu_seqlens also the few small torch ops of ``chunk_table``. None of them waits on the host, so the
    scan can be captured in a CUDA graph. SCAN_CONFIG["fused"] = False: the four-kernel scan instead.
    """
    cfg = SCAN_CONFIG
    if not cfg["fused"]:
        return ssd_scan_triton_chunks(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                      dt_limit=dt_limit, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                      chunk_size=chunk_size)
    varlen = cu_seqlens is not None
    s = prepare_scan(x, dt, A, B, C, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, chunk_size, varlen=varlen)
    xt, Bt, Ct, zt, yt, h, p, n, g = s.xt, s.Bt, s.Ct, s.zt, s.yt, s.h, s.p, s.n, s.g
    Q, QP, n_max, ops, dev, A32, ctab = s.Q, s.QP, s.n_max, s.ops, xt.device, s.A32, s.ctab
    state_ops = cfg["state_ops"] or ("ieee" if ops == "ieee" else "tf32")
    final = empty(s.n_seq, h, p, n, dtype=torch.float32, device=dev)
    init = None if initial_state is None else initial_state.float().contiguous()
    Dc = None if D is None else D.contiguous()

    if cfg["P_TILE"]:
        P0, P1, npb = cfg["P_TILE"], 0, triton.cdiv(p, cfg["P_TILE"])
    else:
        (P0, P1), npb = _p_split(p), 1
    BLOCK_M = min(cfg["BLOCK_M"], QP)
    BLOCK_K = min(cfg["BLOCK_K"], QP)
    slots = empty(s.n_seq, h, 2, n, p, dtype=torch.float32, device=dev)
    # [ticket counter, one per (seq, head, tile)]
    flags = torch.zeros(1 + s.n_seq * h * npb, dtype=torch.int32, device=dev)
    cb_mode = cfg.get("cb", False)
    if cb_mode:
        if cb_mode not in (True, "half"):
            raise ValueError(f"SCAN_CONFIG['cb'] must be False, True or 'half', got {cb_mode!r}")
        cb = empty(n_max, g, QP, QP, dtype=xt.dtype if cb_mode == "half" else torch.float32, device=dev)
        _chunk_cb[(n_max, g, triton.cdiv(Q, BLOCK_M))](
            Bt, Ct, cb, *ctab, n, s.l, max(s.cps, 1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
            VARLEN=varlen, Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_N=_p2(n), OPS=ops, num_warps=4,
        )
    else:
        cb = A32  # not read
    _scan_fused[(n_max * h * npb,)](
        xt, zt if zt is not None else xt, Dc if Dc is not None else A32, Bt, Ct, s.dtp, s.cs,
        init if init is not None else final, final, slots, flags, yt, cb, *ctab,
        h, p, n, h // g, s.l, max(s.cps, 1), npb,
        xt.stride(0), xt.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)),
        yt.stride(0), yt.stride(1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_INIT=init is not None, VARLEN=varlen, TICKET=cfg["ticket"], CB_BUF=bool(cb_mode),
        Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_N=_p2(n), P0=P0, P1=P1, OPS=ops, STATE_OPS=state_ops,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return s.y.to(s.out_dtype), final
