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

from .ssd_triton_common import _DOT_MIN, _desc, _dot_ops, _mm, _p2, _process_dt, _put, _sm_count, _tile, _tokens, empty


@triton.jit
def _chunk_cols(ST, xv, Cv, W, BwT, ecs, eend, OPS: tl.constexpr, STATE_ONLY: tl.constexpr):
    """One column block of a chunk: (y, state leaving the chunk). y = exp(cs) (C S^T) + W x (not computed
    with STATE_ONLY); S^T_out = exp(cs_end) S^T + (B w)^T x."""
    if STATE_ONLY:
        y = ST
    else:
        y = _mm(Cv, ST, xv, OPS) * ecs[:, None]
        y += _mm(W, xv, xv, OPS)
    ST = ST * eend + _mm(BwT, xv, xv, OPS)
    return y, ST


@triton.jit
def _scan_seq(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, y_ptr, final_ptr, states_ptr,
    cu_ptr, choff_ptr, dec_ptr,
    L, H, P, N, HPG, NMAX, lo, hi,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, VARLEN: tl.constexpr,
    STORE_STATES: tl.constexpr, SEGS: tl.constexpr, STATE_ONLY: tl.constexpr, Q: tl.constexpr,
    BP0: tl.constexpr, BP1: tl.constexpr, BN: tl.constexpr, MASK_P: tl.constexpr, MASK_N: tl.constexpr,
    TMA: tl.constexpr, OPS: tl.constexpr, OPS1: tl.constexpr, NS: tl.constexpr,
):
    """One program per (column block, head, run of chunks of a sequence), walking the run's chunks."""
    pb = tl.program_id(0)
    h = tl.program_id(1)
    sk = tl.program_id(2)
    s = sk // SEGS
    k = sk % SEGS
    g = h // HPG
    if VARLEN:
        t_seq = tl.load(cu_ptr + s).to(tl.int32)
        t_end = tl.load(cu_ptr + s + 1).to(tl.int32)
    else:
        t_seq = s * L
        t_end = t_seq + L
    n_tok = t_end - t_seq
    n_chunks = tl.cdiv(n_tok, Q)
    # run k of SEGS: chunks [c_lo, c_hi) of the sequence
    per = tl.cdiv(n_chunks, SEGS)
    c_lo = tl.minimum(k * per, n_chunks)
    c_hi = tl.minimum(c_lo + per, n_chunks)
    if STATE_ONLY:  # the pass that finds the runs' end states skips each sequence's last run
        c_hi = tl.where(k == SEGS - 1, c_lo, c_hi)

    LOG2E: tl.constexpr = 1.4426950408889634
    p0 = pb * (BP0 + BP1)
    c0 = p0 + tl.arange(0, BP0)
    m0 = c0 < P
    ns = tl.arange(0, BN)
    mn = ns < N
    qs = tl.arange(0, Q)
    causal = qs[:, None] >= qs[None, :]
    A = tl.load(A_ptr + h).to(tl.float32) * LOG2E  # decays in the log2 domain (exp2)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h).to(tl.float32)
    else:
        bias = 0.0
    Dv0 = 0.0
    Dv1 = 0.0
    if HAS_D:
        if D_PER_CHANNEL:
            Dv0 = tl.load(D_ptr + h * P + c0, mask=m0, other=0.0).to(tl.float32)[None, :]
        else:
            Dv0 = tl.load(D_ptr + h).to(tl.float32)
            Dv1 = Dv0

    # the sequence's rows of x, B, C, z, y for this head (and group), from this program's first column
    t_seq64 = t_seq.to(tl.int64)
    xb = x_ptr + t_seq64 * s_x_t + h * s_x_h + p0
    x0d = _desc(xb, n_tok, P - p0, s_x_t, Q, BP0, TMA)
    bd = _desc(B_ptr + t_seq64 * s_b_t + g * s_b_g, n_tok, N, s_b_t, Q, BN, TMA)
    if not STATE_ONLY:
        cd = _desc(C_ptr + t_seq64 * s_c_t + g * s_c_g, n_tok, N, s_c_t, Q, BN, TMA)
        yb = y_ptr + t_seq64 * s_y_t + h * s_y_h + p0
        y0d = _desc(yb, n_tok, P - p0, s_y_t, Q, BP0, TMA)
        if HAS_Z:
            zb = z_ptr + t_seq64 * s_z_t + h * s_z_h + p0
            z0d = _desc(zb, n_tok, P - p0, s_z_t, Q, BP0, TMA)
    if STORE_STATES:
        # states (rows, h, p, n) as a matrix of (rows * h * p) rows of n: a tile is (BP, N), S^T transposed
        n_st = NMAX * H * P  # < 2**31 (the wrapper checks)
        s0d = _desc(states_ptr + p0 * N, n_st - p0, N, N, BP0, BN, TMA and not MASK_P)

    # the state, transposed (dstate x columns), fp32, in one or two column blocks; state tensors are
    # (run or sequence, h, p, n)
    st_base = (sk.to(tl.int64) * H + h) * P * N
    st0 = ns[:, None] + c0[None, :] * N
    sm0 = mn[:, None] & m0[None, :]
    if HAS_INIT:  # one initial state per run
        ST0 = tl.load(init_ptr + st_base + st0, mask=sm0, other=0.0).to(tl.float32)
    else:
        ST0 = tl.zeros([BN, BP0], dtype=tl.float32)
    if BP1 > 0:
        c1 = p0 + BP0 + tl.arange(0, BP1)
        m1 = c1 < P
        st1 = ns[:, None] + c1[None, :] * N
        sm1 = mn[:, None] & m1[None, :]
        if HAS_D:
            if D_PER_CHANNEL:
                Dv1 = tl.load(D_ptr + h * P + c1, mask=m1, other=0.0).to(tl.float32)[None, :]
        if HAS_INIT:
            ST1 = tl.load(init_ptr + st_base + st1, mask=sm1, other=0.0).to(tl.float32)
        else:
            ST1 = tl.zeros([BN, BP1], dtype=tl.float32)
        x1d = _desc(xb + BP0, n_tok, P - p0 - BP0, s_x_t, Q, BP1, TMA)
        if not STATE_ONLY:
            y1d = _desc(yb + BP0, n_tok, P - p0 - BP0, s_y_t, Q, BP1, TMA)
            if HAS_Z:
                z1d = _desc(zb + BP0, n_tok, P - p0 - BP0, s_z_t, Q, BP1, TMA)
        if STORE_STATES:
            s1d = _desc(states_ptr + (p0 + BP0) * N, n_st - p0 - BP0, N, N, BP1, BN, TMA and not MASK_P)
    if STORE_STATES:
        c_first = tl.load(choff_ptr + s).to(tl.int32)
    dsum = 0.0

    for c in tl.range(c_lo, c_hi, num_stages=NS):
        r0 = c * Q
        mq = r0 + qs < n_tok
        dt = tl.load(dt_ptr + (t_seq64 + r0) * s_dt_t + h * s_dt_h + qs * s_dt_t, mask=mq, other=0.0)
        dt = tl.where(mq, _process_dt(dt.to(tl.float32), bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP), 0.0)
        a = dt * A
        cs = tl.cumsum(a, axis=0)
        c_end = tl.sum(a, axis=0)
        eend = tl.exp2(c_end)
        dsum += c_end
        xv0 = _tile(x0d, r0, n_tok, P - p0, s_x_t, Q, BP0, TMA, MASK_P)
        Bv = _tile(bd, r0, n_tok, N, s_b_t, Q, BN, TMA, MASK_N)
        w = dt * tl.exp2(tl.cumsum(a, axis=0, reverse=True) - a)  # decay after token s: no cancellation
        BwT = tl.trans((Bv * w[:, None]).to(Bv.dtype))
        if STATE_ONLY:
            Cv = Bv
            W = Bv
            ecs = w
        else:
            Cv = _tile(cd, r0, n_tok, N, s_c_t, Q, BN, TMA, MASK_N)
            # intra-chunk weights: C_t . B_s * exp(cs_t - cs_s) * dt_s for s <= t (exp2 only there)
            CB = _mm(Cv, tl.trans(Bv), xv0, OPS)
            W = CB * tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf"))) * dt[None, :]
            ecs = tl.exp2(cs)
        if STORE_STATES:
            srow = ((c_first + c) * H + h) * P
            if TMA and not MASK_P:
                _put(s0d, srow, 0, 0, N, tl.trans(ST0).to(states_ptr.dtype.element_ty), BP0, BN, True, False)
            else:
                tl.store(states_ptr + srow.to(tl.int64) * N + st0, ST0.to(states_ptr.dtype.element_ty), mask=sm0)
        y0, ST0 = _chunk_cols(ST0, xv0, Cv, W, BwT, ecs, eend, OPS, STATE_ONLY)
        if not STATE_ONLY:
            if HAS_D:
                y0 += Dv0 * xv0.to(tl.float32)
            if HAS_Z:
                zv = _tile(z0d, r0, n_tok, P - p0, s_z_t, Q, BP0, TMA, MASK_P).to(tl.float32)
                y0 = y0 * zv * tl.sigmoid(zv)
            _put(y0d, r0, n_tok, P - p0, s_y_t, y0.to(y_ptr.dtype.element_ty), Q, BP0, TMA, MASK_P)
        if BP1 > 0:
            xv1 = _tile(x1d, r0, n_tok, P - p0 - BP0, s_x_t, Q, BP1, TMA, MASK_P)
            if STORE_STATES:
                if TMA and not MASK_P:
                    _put(s1d, srow, 0, 0, N, tl.trans(ST1).to(states_ptr.dtype.element_ty), BP1, BN, True, False)
                else:
                    tl.store(states_ptr + srow.to(tl.int64) * N + st1, ST1.to(states_ptr.dtype.element_ty),
                             mask=sm1)
            y1, ST1 = _chunk_cols(ST1, xv1, Cv, W, BwT, ecs, eend, OPS1, STATE_ONLY)
            if not STATE_ONLY:
                if HAS_D:
                    y1 += Dv1 * xv1.to(tl.float32)
                if HAS_Z:
                    zv = _tile(z1d, r0, n_tok, P - p0 - BP0, s_z_t, Q, BP1, TMA, MASK_P).to(tl.float32)
                    y1 = y1 * zv * tl.sigmoid(zv)
                _put(y1d, r0, n_tok, P - p0 - BP0, s_y_t, y1.to(y_ptr.dtype.element_ty), Q, BP1, TMA, MASK_P)

    if STATE_ONLY:
        if k < SEGS - 1:
            tl.store(final_ptr + st_base + st0, ST0, mask=sm0)
            if BP1 > 0:
                tl.store(final_ptr + st_base + st1, ST1, mask=sm1)
            if pb == 0:
                tl.store(dec_ptr + sk * H + h, dsum)
    else:
        if k == SEGS - 1:  # the sequence's final state
            fin = (s.to(tl.int64) * H + h) * P * N
            tl.store(final_ptr + fin + st0, ST0, mask=sm0)
            if BP1 > 0:
                tl.store(final_ptr + fin + st1, ST1, mask=sm1)


# Launch settings. None = the automatic choice of ``launch_config`` (the benchmark sweeps them):
#   Q          chunk length the kernel walks (None: the caller's chunk_size, at most 128; the result is
#              the same function, only the rounding differs)
#   BLOCK_P    headdim columns per program: a power of two >= 16, or one plus a smaller one >= 16 (80 =
#              64 + 16: two column blocks, no padded columns); P is cut into such blocks, the last masked
#   SEGMENTS   programs per sequence and head: > 1 cuts each sequence into that many runs of chunks, a
#              first launch finds each run's end state from zero, a few torch ops chain them, a second
#              launch walks every run from its true initial state (more programs when sequences x heads
#              are few, for about 1/4 more work)
#   tail_ops   the products of the second column block: None (as the first) or "tf32" (fp32 operands)
#   tma        tiles through tensor descriptors (TMA on Hopper; no per-element addresses in registers)
#              where the tensors' addresses and strides are 16-byte multiples: None = on a CUDA GPU of
#              compute capability >= 9, True = also elsewhere (the interpreter), False = never
#   num_warps, num_stages (software pipelining of the chunk loop), maxnreg (registers per thread cap)
SCAN_CONFIG = dict(Q=None, BLOCK_P=None, SEGMENTS=None, tail_ops=None, tma=None, num_warps=None,
                   num_stages=None, maxnreg=None)

# The compiled kernel of the last launch (``LAST_KERNEL["scan"]``, and ``"segments"`` for the first of two):
# the benchmark reads its registers, spills and shared memory from it.
LAST_KERNEL = {}


def column_blocks(width: int) -> tuple[int, int] | None:
    """A program's column width as (first block, second block): a power of two, or a power of two plus a
    smaller power of two (both >= 16); None when ``width`` is neither."""
    if width < _DOT_MIN:
        return None
    b0 = 1 << (int(width).bit_length() - 1)
    b1 = width - b0
    if b1 == 0:
        return b0, 0
    if b1 >= _DOT_MIN and b1 & (b1 - 1) == 0:
        return b0, b1
    return None


def launch_config(n_seq: int, h: int, p: int, chunk_size: int, dev: torch.device, wide: bool = False) -> dict:
    """The launch settings for a scan of ``n_seq`` sequences: SCAN_CONFIG where set, else the best
    measured on an H200 (docs/benchmarks.md). ``wide`` (fp32 operands): 64-token chunks, headdim blocks
    of 32, 4 warps (fp32 tiles take twice the shared memory)."""
    cfg = dict(SCAN_CONFIG)
    sms = _sm_count(dev)
    few = n_seq * h <= 2 * sms
    if wide:
        few = False
        for k, v in (("Q", min(int(chunk_size), 64)), ("BLOCK_P", min(_p2(p), 32)), ("num_warps", 4)):
            cfg[k] = v if cfg[k] is None else cfg[k]
    if cfg["Q"] is None:
        cfg["Q"] = min(int(chunk_size), 128 if few else 64)
    cfg["Q"] = max(_DOT_MIN, 1 << (int(cfg["Q"]).bit_length() - 1))  # a power of two
    if cfg["BLOCK_P"] is None:
        w16 = -(-p // 16) * 16
        cfg["BLOCK_P"] = w16 if column_blocks(w16) else _p2(p)
    if cfg["SEGMENTS"] is None:
        cfg["SEGMENTS"] = 1
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
    Q, width, segs = int(cfg["Q"]), int(cfg["BLOCK_P"]), int(cfg["SEGMENTS"])
    blocks = column_blocks(width)
    if blocks is None:
        raise ValueError(f"SCAN_CONFIG['BLOCK_P'] must be a power of two >= {_DOT_MIN}, or one plus a smaller "
                         f"one >= {_DOT_MIN} (80 = 64 + 16), got {width}")
    if segs < 1:
        raise ValueError(f"SCAN_CONFIG['SEGMENTS'] must be >= 1, got {segs}")
    if width >= p:  # one program covers the headdim: the second block only as wide as needed
        b0 = min(blocks[0], _p2(p))
        b1 = 0 if b0 >= p else _p2(p - b0)
        blocks = (b0, b1) if b1 < b0 else (2 * b0, 0)
        width = sum(blocks)
    ops = _dot_ops(x.dtype)
    tail_ops = cfg.get("tail_ops") or ops
    if tail_ops not in ("half", "ieee", "tf32"):
        raise ValueError(f"SCAN_CONFIG['tail_ops'] must be None or 'tf32', got {tail_ops!r}")

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
    if n_max * h * p >= 2**31:
        raise ValueError(f"ssd_scan: {n_max} chunks x {h} heads x headdim {p} >= 2**31 rows of chunk states; "
                         f"use fewer tokens per call or a larger chunk_size")
    states = empty(n_max, h, p, n, dtype=states_dtype, device=dev) if store_states else None
    extra = {} if cfg.get("maxnreg") is None else dict(maxnreg=int(cfg["maxnreg"]))
    es = x.element_size()
    tma = cfg.get("tma")
    if tma is None:
        tma = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    if tma:  # only where the addresses allow
        tma = (_tma_ok(es, [xt, Bt, Ct, yt] + ([zt] if zt is not None else []),
                           [xt.stride(1), Bt.stride(1), Ct.stride(1), yt.stride(1), width, blocks[0]]
                           + ([zt.stride(1)] if zt is not None else []))
               and (states is None or _tma_ok(states.element_size(), [states], [n, p * n])))
    if tma:
        _ensure_allocator()

    def launch(state_only, init_t, final_t, dec_t):
        grid = (triton.cdiv(p, width), h, n_seq * segs)
        return _scan_seq[grid](
            xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, zt if zt is not None else xt,
            bias if bias is not None else A32, init_t if init_t is not None else final_t, yt, final_t,
            states if states is not None else final_t, cu, choff, dec_t if dec_t is not None else A32,
            l, h, p, n, h // g, n_max, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
            xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
            Ct.stride(0), Ct.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)), yt.stride(0),
            yt.stride(1),
            HAS_D=D is not None and not state_only, D_PER_CHANNEL=D is not None and D.dim() == 2,
            HAS_Z=z is not None and not state_only, HAS_INIT=init_t is not None, HAS_BIAS=bias is not None,
            SOFTPLUS=bool(dt_softplus), CLAMP=clamp, VARLEN=varlen,
            STORE_STATES=bool(store_states) and not state_only, SEGS=segs, STATE_ONLY=state_only, Q=Q,
            BP0=blocks[0], BP1=blocks[1], BN=_p2(n), MASK_P=p % width != 0, MASK_N=_p2(n) != n, TMA=bool(tma),
            OPS=ops,
            OPS1=tail_ops, NS=int(cfg["num_stages"]), num_warps=int(cfg["num_warps"]), **extra,
        )

    seg_init = init
    if segs > 1:
        ends = empty(n_seq * segs, h, p, n, dtype=torch.float32, device=dev)
        dec = empty(n_seq * segs, h, dtype=torch.float32, device=dev)
        LAST_KERNEL["segments"] = launch(True, None, ends, dec)
        ends, dec = ends.view(n_seq, segs, h, p, n), torch.exp2(dec.view(n_seq, segs, h, 1, 1))
        seg_init = empty(n_seq, segs, h, p, n, dtype=torch.float32, device=dev)
        if init is None:
            seg_init[:, 0].zero_()
        else:
            seg_init[:, 0].copy_(init)
        for k in range(1, segs):  # the state entering run k: run k-1's from its true start
            torch.addcmul(ends[:, k - 1], dec[:, k - 1], seg_init[:, k - 1], out=seg_init[:, k])
    LAST_KERNEL["scan"] = launch(False, seg_init, final, None)
    return SimpleNamespace(y=y.to(out_dtype), final=final, states=states, choff=choff, Q=Q, n_max=n_max,
                           config=dict(cfg, tma=bool(tma)))


def _tma_ok(elsize: int, tensors, strides) -> bool:
    """Tensor descriptors need 16-byte aligned addresses and row strides (and column offsets)."""
    return (all(t.data_ptr() % 16 == 0 and t.stride(0) * elsize % 16 == 0 for t in tensors)
            and all(v * elsize % 16 == 0 for v in strides))


def _ensure_allocator() -> None:
    """Device-made tensor descriptors need a global scratch buffer per launch: from torch's allocator
    (so CUDA-graph capture takes it from the graph's pool), unless the caller set one."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream):
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=dev)


def ssd_scan_triton(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The Triton scan (inference). Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state
    fp32). One launch (with cu_seqlens also a few small torch ops for the chunk offsets, on the device)."""
    out = ssd_scan_triton_fwd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              dt_limit=dt_limit, initial_state=initial_state, cu_seqlens=cu_seqlens,
                              chunk_size=chunk_size)
    return out.y, out.final
