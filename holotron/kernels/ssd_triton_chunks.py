"""The SSD scan as four Triton kernels (forward): the "second opinion" to the fused scan of
``ssd_triton_scan.py``, which runs it when ``SCAN_CONFIG["fused"]`` is False (tests and benchmarks).

Same signature and result as ``ssd_scan_triton``; chunk states go through memory:

    1. _dt_cumsum    per (chunk, head block): processed dt, cs = cumsum(dt * A)  (ssd_triton_common.py)
    2. _chunk_state  per (chunk, head, P block): the chunk's own state S_c, into (chunks, h, p, n)
    3. _pass_state   per (sequence, head, block of the state): over the sequence's chunks in order,
                     overwrites each S_c with the state entering the chunk; writes the final state
    4. _chunk_out    per (chunk, head, P block x row block): y = intra-chunk term + C . S_in term + D x,
                     gated by silu(z)

Chunks always come from a chunk table (``chunk_table``), with or without ``cu_seqlens``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ssd_triton_common import _mm, _p2, empty, prepare_scan

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


# ----------------------------------------------------------------------------- the scan


def ssd_scan_triton_chunks(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                           dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The four-kernel Triton scan. Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state fp32)."""
    s = prepare_scan(x, dt, A, B, C, z, dt_bias, dt_softplus, dt_limit, cu_seqlens, chunk_size, varlen=True)
    xt, Bt, Ct, zt, yt, h, p, n, g = s.xt, s.Bt, s.Ct, s.zt, s.yt, s.h, s.p, s.n, s.g
    Q, QP, n_max, ops, dev = s.Q, s.QP, s.n_max, s.ops, xt.device
    final = empty(s.n_seq, h, p, n, dtype=torch.float32, device=dev)
    init = None if initial_state is None else initial_state.float().contiguous()
    Dc = None if D is None else D.contiguous()
    cstart, cend, choff = s.tab["start"], s.tab["end"], s.tab["choff"]
    BLOCK_N = _p2(n)
    BLOCK_P = min(64, _p2(p))
    BLOCK_K = min(64, QP)
    n_pb = triton.cdiv(p, BLOCK_P)
    states = empty(n_max, h, p, n, dtype=torch.float32, device=dev)
    _chunk_state[(n_max, h, n_pb)](
        xt, Bt, s.dtp, s.cs, cstart, cend, states,
        h, p, n, h // g, xt.stride(0), xt.stride(1), Bt.stride(0), Bt.stride(1),
        Q=Q, QP=QP, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, OPS=ops,
    )
    BLOCK_S = min(1024, triton.next_power_of_2(p * n))
    _pass_state[(s.n_seq, h, triton.cdiv(p * n, BLOCK_S))](
        states, s.cs, choff, init if init is not None else final, final,
        h, p * n, n_max, HAS_INIT=init is not None, QP=QP, BLOCK=BLOCK_S,
    )
    BLOCK_M = min(64, QP)
    _chunk_out[(n_max, h, n_pb * triton.cdiv(Q, BLOCK_M))](
        xt, zt if zt is not None else xt, Dc if Dc is not None else s.A32, Bt, Ct, s.dtp, s.cs, states,
        cstart, cend, yt,
        h, p, n, h // g, n_pb,
        xt.stride(0), xt.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)),
        yt.stride(0), yt.stride(1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
        HAS_D=Dc is not None, D_PER_CHANNEL=Dc is not None and Dc.dim() == 2, HAS_Z=zt is not None,
        Q=Q, QP=QP, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, OPS=ops,
        STATE_OPS="ieee" if ops == "ieee" else "tf32",
    )
    return s.y.to(s.out_dtype), final
