"""The SSD scan's backward as one Triton kernel: the gradients of ``ssd_scan(..., backend="triton")``.

Called by ``ssd_triton_autograd.py`` (the ``torch.autograd.Function``); arguments are those of the
forward after dt processing (``dt`` is the processed fp32 step, +bias / softplus / clamp done in PyTorch)
plus the states the forward stored (the state entering every chunk).

One program per (headdim block, sequence, head) walks the sequence's chunks in reverse, holding its
columns of dS^T (dstate x headdim, fp32), the gradient with respect to the state leaving the chunk, on
chip; no program waits on another. Every gradient is linear in dy and dS^T, and a column block of dS^T
only needs the same columns of dy, so headdim blocks run apart and add up their shares.
For one chunk of Q tokens (positions t, s; a = A dt; cs = cumsum of a within the chunk, cL its last
value; L[t, s] = exp(cs_t - cs_s) for t >= s, else 0; S^T the state entering the chunk, (n, p)):

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

The formulas are checked against torch autograd through the float64 chunked scan in
``tests/test_kernels_grad.py`` (a PyTorch transcription of them lives there too). B and C are shared by
the heads of a group: each head adds its dB, dC into an fp32 (tokens, groups, dstate) buffer with atomic
adds, cast at the end; dA, dD (over sequences) and ddt (over headdim blocks) add the same way. Decays,
the state gradient and every accumulation are fp32; the matrix products take the forward's operand
precision (``_mm``: IEEE fp32 for fp32 inputs, half operands for bf16 / fp16, products with a state
operand in TF32 then). headdim blocks and dstate are powers of two >= 16 with masks, the chunk is padded
to QP = next power of two >= 16. C B^T and the other (Q, Q) products are recomputed by each headdim
block: the price of fitting the (Q, Q), (Q, n) and (n, block) tiles in one SM's shared memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ssd_triton_common import _DOT_MIN, _dot_ops, _mm, _p2, empty

# launch settings of the backward kernel (the benchmark sweeps them). BLOCK_P: headdim columns per program
# (a power of two >= 16); state_ops: the operand precision of the products with a state operand (None:
# "ieee" for fp32 inputs, "tf32" otherwise, as the forward); chunk_size: a chunk length the training entry
# uses instead of the caller's (None: the caller's, as the forward takes it). On an H200 (triton 3.6) at
# the 12B layer's sizes (b 2, l 1000, h 128, p 80, n 128, bf16) BLOCK_P=16 with 8 warps ran (13.5 ms at
# Q 128, 10.6 ms at Q 64, one reading each); BLOCK_P 32 or 4 warps hit illegal shared-memory addresses or
# ran out of shared memory: a compiler limit of this one-kernel design, not yet worked around by tiling.
BWD_CONFIG = dict(BLOCK_P=16, num_warps=8, num_stages=1, state_ops=None, chunk_size=None)


@triton.jit
def _ssd_bwd(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, st_ptr, choff_ptr, cu_ptr, dy_ptr, dfin_ptr,
    dx_ptr, ddt_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dinit_ptr,
    H, P, N, HPG, Q,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_dy_t, s_dy_h, s_dx_t, s_dx_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr,
    ADD_DDT: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr, NP: tl.constexpr, OPS: tl.constexpr,
    STATE_OPS: tl.constexpr,
):
    """One program per (headdim block of BP columns, sequence, head): the sequence's chunks in reverse (see
    the module docstring). Every gradient is linear in dy and dS, so a block of headdim columns of both
    carries on its own: its dx and dinit columns are its alone, and it adds its share of ddt (ADD_DDT: when
    there are several blocks; else it stores it), dB, dC, dA and dD into zeroed fp32 buffers.

    Sequence s is tokens cu[s] .. cu[s+1]-1 of the flattened (batch * seqlen) axis, its chunk i starts at
    cu[s] + i Q and its entering state is st[choff[s] + i] (chunks, H, P, N). Writes dx (and ddt) of its
    tokens, head and columns, dinit[s, h] (HAS_INIT); adds into dB, dC (tokens, G, N), dA (H,), dD (H,) or
    (H, P)."""
    pb = tl.program_id(0)
    s = tl.program_id(1)
    h = tl.program_id(2)
    g = h // HPG
    sh = s.to(tl.int64) * H + h
    ts = tl.load(cu_ptr + s)
    te = tl.load(cu_ptr + s + 1)
    cbase = tl.load(choff_ptr + s)
    nch = (te - ts + Q - 1) // Q
    A = tl.load(A_ptr + h).to(tl.float32)
    q = tl.arange(0, QP)
    ps = pb * BP + tl.arange(0, BP)
    ns = tl.arange(0, NP)
    mp = ps < P
    mn = ns < N
    mnp = mn[:, None] & mp[None, :]
    causal = q[:, None] >= q[None, :]
    last = q == QP - 1
    # dS^T, (n, p): the gradient with respect to the state leaving the chunk (the final one to start)
    if HAS_DFINAL:
        dS = tl.load(dfin_ptr + (sh * P + ps[None, :]) * N + ns[:, None], mask=mnp, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros((NP, BP), dtype=tl.float32)
    dA_acc = tl.zeros((QP,), dtype=tl.float32)
    dD_acc = tl.zeros((BP,), dtype=tl.float32)
    if HAS_D:
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :]
        else:
            Dv = tl.load(D_ptr + h).to(tl.float32)
    for i in range(0, nch):
        ci = nch - 1 - i
        t0 = ts + ci * Q
        t1 = tl.minimum(t0 + Q, te)
        mq = (q < Q) & (t0 + q < t1)
        tok = (t0 + q).to(tl.int64)
        mqp = mq[:, None] & mp[None, :]
        mqn = mq[:, None] & mn[None, :]
        dt = tl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums as masked row / column sums of (Q, Q) tiles, not tl.cumsum: with a scan in this
        # kernel triton 3.6 addressed shared memory out of range on an H200 (compute-sanitizer, Q = n = 64)
        cs = tl.sum(tl.where(causal, (dt * A)[None, :], 0.0), axis=1)  # flat past the chunk's end (dt = 0 there)
        cL = tl.sum(tl.where(last, cs, 0.0), axis=0)
        x = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + ps[None, :], mask=mqp, other=0.0)
        dy = tl.load(dy_ptr + tok[:, None] * s_dy_t + h * s_dy_h + ps[None, :], mask=mqp, other=0.0)
        Bm = tl.load(B_ptr + tok[:, None] * s_b_t + g * s_b_g + ns[None, :], mask=mqn, other=0.0)
        Cm = tl.load(C_ptr + tok[:, None] * s_c_t + g * s_c_g + ns[None, :], mask=mqn, other=0.0)
        row = (cbase + ci).to(tl.int64) * H + h
        S = tl.load(st_ptr + (row * P + ps[None, :]) * N + ns[:, None], mask=mnp, other=0.0)  # S^T (n, p)
        # transposed copies of loaded tiles are loaded as such rather than made with tl.trans
        mpq = mp[:, None] & mq[None, :]
        mnq = mn[:, None] & mq[None, :]
        xT = tl.load(x_ptr + tok[None, :] * s_x_t + h * s_x_h + ps[:, None], mask=mpq, other=0.0)  # (p, Q)
        BmT = tl.load(B_ptr + tok[None, :] * s_b_t + g * s_b_g + ns[:, None], mask=mnq, other=0.0)  # (n, Q)
        CmT = tl.load(C_ptr + tok[None, :] * s_c_t + g * s_c_g + ns[:, None], mask=mnq, other=0.0)
        Sp = tl.load(st_ptr + (row * P + ps[:, None]) * N + ns[None, :], mask=mp[:, None] & mn[None, :], other=0.0)
        x32 = x.to(tl.float32)
        dy32 = dy.to(tl.float32)

        ecs = tl.exp(cs)
        eL = tl.exp(cL)
        dec = tl.exp(cL - cs)  # decay from token s (excluded) to the chunk's end
        w = tl.where(mq, dt * dec, 0.0)
        # exp only where t >= s: above the diagonal cs_t - cs_s > 0 could overflow
        Lm = tl.exp(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))
        G = _mm(Cm, BmT, x, OPS)  # (QP, QP) C_t . B_s
        M = G * Lm
        Wm = M * dt[None, :]
        R = _mm(Bm, dS, x, STATE_OPS)  # (QP, BP)

        dx = _mm(tl.trans(Wm), dy, x, OPS) + w[:, None] * R
        if HAS_D:
            dx += Dv * dy32
            dD_acc += tl.sum(dy32 * x32, axis=0)
        dWm = tl.where(causal, _mm(dy, xT, x, OPS), 0.0)
        dM = dWm * dt[None, :]
        dG = dM * Lm
        CS = _mm(Cm, S, x, STATE_OPS)  # (QP, BP) C S^T
        dC = _mm(dG, Bm, x, OPS) + ecs[:, None] * _mm(dy, Sp, x, STATE_OPS)
        dB = _mm(tl.trans(dG), Cm, x, OPS) + _mm(x32 * w[:, None], tl.trans(dS), x, STATE_OPS)
        dw = tl.sum(x32 * R, axis=1)
        E = dM * M
        dcs = tl.sum(E, axis=1) - tl.sum(E, axis=0) + tl.sum(dy32 * ecs[:, None] * CS, axis=1) - dw * w
        dcL = eL * tl.sum(tl.sum(dS * S, axis=1), axis=0) + tl.sum(dw * w, axis=0)
        dcs += tl.where(last, dcL, 0.0)  # cL = cs of the padded block's last row
        da = tl.sum(tl.where(causal, dcs[:, None], 0.0), axis=0)  # da_s = sum_{t >= s} dcs_t
        ddt = tl.sum(dWm * M, axis=0) + dec * dw + A * da
        dA_acc += dt * da
        dS = eL * dS + _mm(CmT, dy32 * ecs[:, None], x, OPS)

        tl.store(dx_ptr + tok[:, None] * s_dx_t + h * s_dx_h + ps[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mqp)
        if ADD_DDT:
            tl.atomic_add(ddt_ptr + tok * H + h, ddt, mask=mq)
        else:
            tl.store(ddt_ptr + tok * H + h, ddt, mask=mq)
        G_N = (H // HPG) * N
        tl.atomic_add(dB_ptr + tok[:, None] * G_N + g * N + ns[None, :], dB, mask=mqn)
        tl.atomic_add(dC_ptr + tok[:, None] * G_N + g * N + ns[None, :], dC, mask=mqn)

    if HAS_INIT:
        tl.store(dinit_ptr + (sh * P + ps[None, :]) * N + ns[:, None], dS, mask=mnp)
    tl.atomic_add(dA_ptr + h, tl.sum(dA_acc, axis=0))
    if HAS_D:
        if D_PER_CHANNEL:
            tl.atomic_add(dD_ptr + h * P + ps, dD_acc, mask=mp)
        else:
            tl.atomic_add(dD_ptr + h, tl.sum(dD_acc, axis=0))


def _tok(t: torch.Tensor) -> torch.Tensor:
    """(b, l, *rest) -> (b * l, *rest) with a unit-stride last dim."""
    t = t.reshape(-1, *t.shape[2:])
    return t if t.stride(-1) == 1 else t.contiguous()


def ssd_scan_triton_bwd(x, dt, A, B, C, D, states, choff, Q, dy, dfinal=None, cu_seqlens=None, has_init=False):
    """Gradients of the SSD scan (without z, whose gate autograd handles) from one Triton launch.

    x (b, l, h, p); dt (b, l, h) processed fp32; A (h,); B, C (b, l, g, n); D None, (h,) or (h, p); states
    (chunks, h, p, n) fp32, the state entering each chunk (the forward's ``store_states``); choff (n_seq + 1,)
    int: sequence s owns chunks choff[s] .. choff[s+1]-1; Q the forward's chunk length; dy like x; dfinal
    (n_seq, h, p, n) or None; cu_seqlens as given to the forward (batch 1) or None; has_init: the forward had
    an initial state (its gradient is then returned).

    Returns (dx like x, ddt (b, l, h) fp32, dA (h,) fp32, dB, dC like B, dD fp32 like D or None, dinit
    (n_seq, h, p, n) fp32 or None). float64 inputs are computed in fp32 (as the forward) and returned in
    their dtype.
    """
    cfg = BWD_CONFIG
    in_dtype, b_dtype = x.dtype, B.dtype
    if x.dtype == torch.float64:
        x, B, C = x.float(), B.float(), C.float()
    dy = dy.to(x.dtype)
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    dev = x.device
    ops = _dot_ops(x.dtype)
    state_ops = cfg["state_ops"] or ("ieee" if ops == "ieee" else "tf32")
    if cu_seqlens is None:
        n_seq = b
        cu = torch.arange(b + 1, device=dev, dtype=torch.int32) * l
    else:
        n_seq = cu_seqlens.numel() - 1
        cu = cu_seqlens.to(device=dev, dtype=torch.int32)
    choff = choff.to(device=dev, dtype=torch.int32)
    xt, dtt, Bt, Ct, dyt = _tok(x), _tok(dt.float()), _tok(B), _tok(C), _tok(dy)
    st = states.float().contiguous()
    A32 = A.float().contiguous()
    Dc = None if D is None else D.float().contiguous()
    dfin = None if dfinal is None else dfinal.float().contiguous()

    dx = empty(b * l, h, p, dtype=x.dtype, device=dev)
    bp = cfg["BLOCK_P"] or 16
    if bp < _DOT_MIN or bp & (bp - 1):
        raise ValueError(f"BWD_CONFIG['BLOCK_P'] must be a power of two >= {_DOT_MIN}, got {bp}")
    npb = triton.cdiv(p, bp)
    # several headdim blocks add their shares of ddt; one stores it
    ddt = (torch.zeros if npb > 1 else empty)(b * l, h, dtype=torch.float32, device=dev)
    dA = torch.zeros(h, dtype=torch.float32, device=dev)
    dB = torch.zeros(b * l, g, n, dtype=torch.float32, device=dev)
    dC = torch.zeros(b * l, g, n, dtype=torch.float32, device=dev)
    dD = None if D is None else torch.zeros(D.shape, dtype=torch.float32, device=dev)
    dinit = empty(n_seq, h, p, n, dtype=torch.float32, device=dev) if has_init else None

    _ssd_bwd[(npb, n_seq, h)](
        xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, st, choff, cu, dyt, dfin if dfin is not None else st,
        dx, ddt, dA, dB, dC, dD if dD is not None else dA, dinit if dinit is not None else dA,
        h, p, n, h // g, int(Q),
        xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
        Ct.stride(0), Ct.stride(1), dyt.stride(0), dyt.stride(1), dx.stride(0), dx.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_DFINAL=dfin is not None,
        HAS_INIT=bool(has_init), ADD_DDT=npb > 1, QP=_p2(int(Q)), BP=bp, NP=_p2(n), OPS=ops, STATE_OPS=state_ops,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return (dx.view(b, l, h, p).to(in_dtype), ddt.view(b, l, h), dA, dB.view(b, l, g, n).to(b_dtype),
            dC.view(b, l, g, n).to(b_dtype), dD, dinit)
