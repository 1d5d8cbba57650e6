"""The SSD scan as one Triton kernel (forward): the GPU path of ``ssd_scan``.

Arguments are validated by ``holotron.kernels.ssd_scan``; call that. The README beside this file
derives the math. One launch, ``_scan_seq``, with one program per (headdim block, head, sequence):
the program walks its sequence's chunks in order and keeps the fp32 state (dstate x headdim block) on
chip from one chunk to the next. Per chunk of Q tokens it reads x, dt, B and C once and writes y once:

    dt  -> + dt_bias, softplus, clamp (in registers)         cs = cumsum(dt * A) within the chunk
    y   = (C B^T * exp(cs_t - cs_s) * dt_s, causal) @ x       the intra-chunk term
        + exp(cs) * (C @ S^T)                                 the incoming state
        + D x,  then  * silu(z)
    S^T = exp(cs_end) S^T + (B * dt * exp(cs_end - cs))^T @ x

There is no inter-program synchronisation and no state round trip through memory; with
``store_states`` (the backward's need) the state entering each chunk is also written. Sequences are
batch rows or ``cu_seqlens`` segments; chunks start at each sequence's start. Nothing waits on the
host, so the scan can be captured in a CUDA graph. Matrix products take half operands (bf16 / fp16
inputs) or fp32 operands in IEEE precision (fp32 inputs) and accumulate in fp32; the state entering
``C @ S^T`` is rounded to the operand dtype, as the chunked scans of other libraries do.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from .ssd_triton_common import _DOT_MIN, _dot_ops, _mm, _p2, _process_dt, _sm_count, _tokens, empty


@triton.jit
def _scan_seq(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, y_ptr, final_ptr, states_ptr,
    cu_ptr, choff_ptr,
    L, H, P, N, HPG, Q, lo, hi,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, VARLEN: tl.constexpr,
    STORE_STATES: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, OPS: tl.constexpr,
    NS: tl.constexpr,
):
    """One program per (headdim block, head, sequence), looping over the sequence's chunks."""
    pb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    g = h // HPG
    if VARLEN:
        t_begin = tl.load(cu_ptr + s).to(tl.int32)
        t_end = tl.load(cu_ptr + s + 1).to(tl.int32)
    else:
        t_begin = s * L
        t_end = t_begin + L
    n_chunks = tl.cdiv(t_end - t_begin, Q)

    ps = pb * BP + tl.arange(0, BP)
    mp = ps < P
    ns = tl.arange(0, BN)
    mn = ns < N
    qs = tl.arange(0, QP)
    causal = qs[:, None] >= qs[None, :]
    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h).to(tl.float32)
    else:
        bias = 0.0
    if HAS_D:
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h * P + ps, mask=mp, other=0.0).to(tl.float32)[None, :]
        else:
            Dv = tl.load(D_ptr + h).to(tl.float32)

    # state transposed, S^T (dstate x headdim block), fp32; state tensors are (seq, h, p, n)
    st_off = (s.to(tl.int64) * H + h) * P * N + ps[None, :] * N + ns[:, None]
    st_mask = mn[:, None] & mp[None, :]
    if HAS_INIT:
        ST = tl.load(init_ptr + st_off, mask=st_mask, other=0.0).to(tl.float32)
    else:
        ST = tl.zeros([BN, BP], dtype=tl.float32)
    if STORE_STATES:
        c_first = tl.load(choff_ptr + s).to(tl.int64)

    for c in tl.range(0, n_chunks, num_stages=NS):
        tok = t_begin + c * Q + qs
        mq = (qs < Q) & (tok < t_end)
        tok = tok.to(tl.int64)
        dt = tl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        dt = tl.where(mq, _process_dt(dt, bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP), 0.0)
        a = dt * A
        cs = tl.cumsum(a, axis=0)
        c_end = tl.sum(a, axis=0)
        mx = mq[:, None] & mp[None, :]
        xv = tl.load(x_ptr + tok[:, None] * s_x_t + h * s_x_h + ps[None, :], mask=mx, other=0.0)
        mb = mq[:, None] & mn[None, :]
        Bv = tl.load(B_ptr + tok[:, None] * s_b_t + g * s_b_g + ns[None, :], mask=mb, other=0.0)
        Cv = tl.load(C_ptr + tok[:, None] * s_c_t + g * s_c_g + ns[None, :], mask=mb, other=0.0)

        # intra-chunk: (C B^T * decay * dt, causal) @ x
        CB = _mm(Cv, tl.trans(Bv), xv, OPS)
        W = tl.where(causal, CB * tl.exp(cs[:, None] - cs[None, :]) * dt[None, :], 0.0)  # select: drops inf above
        y = _mm(W, xv, xv, OPS)
        # the state entering the chunk
        y += _mm(Cv, ST, xv, OPS) * tl.exp(cs)[:, None]
        if STORE_STATES:
            tl.store(states_ptr + (c_first + c) * H * P * N + h * P * N + ps[None, :] * N + ns[:, None],
                     ST.to(states_ptr.dtype.element_ty), mask=st_mask)
        # the state leaving it
        w = dt * tl.exp(tl.cumsum(a, axis=0, reverse=True) - a)  # decay after token s: no cancellation
        ST = ST * tl.exp(c_end) + _mm(tl.trans(Bv * w[:, None]), xv, xv, OPS)

        if HAS_D:
            y += Dv * xv.to(tl.float32)
        if HAS_Z:
            zv = tl.load(z_ptr + tok[:, None] * s_z_t + h * s_z_h + ps[None, :], mask=mx, other=0.0).to(tl.float32)
            y = y * zv * tl.sigmoid(zv)
        tl.store(y_ptr + tok[:, None] * s_y_t + h * s_y_h + ps[None, :], y.to(y_ptr.dtype.element_ty), mask=mx)

    tl.store(final_ptr + st_off, ST, mask=st_mask)


# Launch settings. None = the automatic choice of ``launch_config`` (the benchmark sweeps them):
#   Q          chunk length the kernel walks (None: the caller's chunk_size, at most 128; the result is
#              the same function, only the rounding differs)
#   BLOCK_P    headdim columns per program (a power of two >= 16; P is padded with masks)
#   num_warps, num_stages (software pipelining of the chunk loop)
SCAN_CONFIG = dict(Q=None, BLOCK_P=None, num_warps=None, num_stages=None)

# The compiled kernel of the last launch (``LAST_KERNEL["scan"]``): the benchmark reads its registers,
# spills and shared memory from it.
LAST_KERNEL = {}

def launch_config(n_seq: int, h: int, p: int, chunk_size: int, dev: torch.device, wide: bool = False) -> dict:
    """The launch settings for a scan of ``n_seq`` sequences: SCAN_CONFIG where set, else the best
    measured on an H200 (docs/benchmarks.md): while sequences x heads fill the SMs about once, 128-token
    chunks on 8 warps with the whole (padded) headdim per program (64-token chunks: headdim blocks of 64
    on 4 warps); with several programs per SM, 64-token chunks, the whole headdim, 4 warps. ``wide``
    (fp32 operands): 64-token chunks, headdim blocks of 32, 4 warps."""
    cfg = dict(SCAN_CONFIG)
    sms = _sm_count(dev)
    few = n_seq * h <= 2 * sms
    if wide:  # fp32 tiles take twice the shared memory: the settings that fit
        few = False
        for k, v in (("Q", min(int(chunk_size), 64)), ("BLOCK_P", min(_p2(p), 32)), ("num_warps", 4)):
            cfg[k] = v if cfg[k] is None else cfg[k]
    if cfg["Q"] is None:
        cfg["Q"] = min(int(chunk_size), 128 if few else 64)
    if cfg["BLOCK_P"] is None:
        cfg["BLOCK_P"] = min(_p2(p), 64 if few and cfg["Q"] <= 64 else 128)
    if cfg["num_warps"] is None:
        cfg["num_warps"] = 8 if cfg["Q"] > 64 else 4
    if cfg["num_stages"] is None:
        cfg["num_stages"] = 2
    return cfg


def ssd_scan_triton_fwd(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                        dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128,
                        store_states=False, states_dtype=torch.float32):
    """The scan's forward. Returns a namespace: ``y`` (b, l, h, p) in x's dtype, ``final`` (n_seq, h, p, n)
    fp32, ``states`` (n_max, h, p, n) in ``states_dtype`` with ``store_states`` (else None): states[choff[s] + c] is the
    state of sequence s entering its chunk c; ``choff`` (n_seq + 1,) int32 on the device (sequence s
    owns chunks choff[s] .. choff[s + 1] - 1); ``Q`` the chunk length used; ``n_max`` rows of states."""
    out_dtype = x.dtype
    if x.dtype == torch.float64:  # the kernel computes in fp32
        x, B, C = x.float(), B.float(), C.float()
        z = None if z is None else z.float()
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    dev = x.device
    varlen = cu_seqlens is not None
    n_seq = cu_seqlens.numel() - 1 if varlen else b
    cfg = launch_config(n_seq, h, p, chunk_size, dev, wide=x.dtype == torch.float32)
    Q, BP = int(cfg["Q"]), int(cfg["BLOCK_P"])
    if BP < _DOT_MIN or BP & (BP - 1):
        raise ValueError(f"SCAN_CONFIG['BLOCK_P'] must be a power of two >= {_DOT_MIN}, got {BP}")
    QP = _p2(Q)

    xt, Bt, Ct, dtt = _tokens(x), _tokens(B), _tokens(C), _tokens(dt)
    zt = None if z is None else _tokens(z)
    y = empty(b, l, h, p, dtype=x.dtype, device=dev)
    yt = y.view(b * l, h, p)
    final = empty(n_seq, h, p, n, dtype=torch.float32, device=dev)
    A32 = A.float().contiguous()
    init = None if initial_state is None else initial_state.float().contiguous()
    Dc = None if D is None else D.contiguous()
    bias = None if dt_bias is None else dt_bias.float().contiguous()
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")

    if varlen:
        cu = cu_seqlens.to(device=dev, dtype=torch.int32)
        lens = cu[1:] - cu[:-1]
        choff = torch.cat([cu.new_zeros(1), ((lens + Q - 1) // Q).cumsum(0).to(torch.int32)])
        n_max = triton.cdiv(l, Q) + n_seq - 1  # sum_s ceil(len_s / Q) <= this, for lengths >= 1
    else:
        cu = A32  # not read
        cps = triton.cdiv(l, Q)
        choff = torch.arange(n_seq + 1, dtype=torch.int32, device=dev) * cps
        n_max = n_seq * cps
    states = empty(n_max, h, p, n, dtype=states_dtype, device=dev) if store_states else None

    grid = (triton.cdiv(p, BP), h, n_seq)
    LAST_KERNEL["scan"] = _scan_seq[grid](
        xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, zt if zt is not None else xt,
        bias if bias is not None else A32, init if init is not None else final, yt, final,
        states if states is not None else final, cu, choff,
        l, h, p, n, h // g, Q, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
        xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
        Ct.stride(0), Ct.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)), yt.stride(0), yt.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_INIT=init is not None, HAS_BIAS=bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp,
        VARLEN=varlen, STORE_STATES=bool(store_states), QP=QP, BP=BP, BN=_p2(n), OPS=_dot_ops(x.dtype),
        NS=int(cfg["num_stages"]), num_warps=int(cfg["num_warps"]),
    )
    return SimpleNamespace(y=y.to(out_dtype), final=final, states=states, choff=choff, Q=Q, n_max=n_max,
                           config=cfg)


def ssd_scan_triton(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The Triton scan (inference). Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state
    fp32). One launch (with cu_seqlens also a few small torch ops for the chunk offsets, on the device)."""
    out = ssd_scan_triton_fwd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              dt_limit=dt_limit, initial_state=initial_state, cu_seqlens=cu_seqlens,
                              chunk_size=chunk_size)
    return out.y, out.final
