"""The SSD scan as one Triton kernel (forward): the GPU path of ``ssd_scan``.

Arguments are validated by ``holotron.kernels.ssd_scan``; call that. The README beside this file
derives the math and records the launch settings measured. One launch, ``_scan_seq``, with one
program per (headdim block, head, sequence): the program walks its sequence's chunks in order and
keeps the fp32 state (dstate x headdim block) on chip from one chunk to the next. Per chunk of Q
tokens it reads x, dt, B and C once and writes y once:

    dt  -> + dt_bias, softplus, clamp (in registers)         cs = cumsum(dt * A) within the chunk
    y   = (C B^T * exp(cs_t - cs_s) * dt_s, causal) @ x       the intra-chunk term
        + exp(cs) * (C @ S^T)                                 the incoming state
        + D x,  then  * silu(z)
    S^T = exp(cs_end) S^T + (B * dt * exp(cs_end - cs))^T @ x

Decays are ``exp2`` of log2-scaled sums. Tiles move through tensor descriptors (TMA) where addresses
allow, else through masked pointer tiles (``_desc`` / ``_tile`` / ``_put`` of ssd_triton_common.py).
There is no inter-program synchronisation and no state round trip through memory; with
``store_states`` (the backward's need) the state entering each chunk of ``states_chunk`` tokens is also
written. Sequences are batch rows or ``cu_seqlens`` segments; chunks start at each sequence's start.
Nothing waits on the host, so the scan can be captured in a CUDA graph. Matrix products take half
operands (bf16 / fp16 inputs) or fp32 operands in IEEE precision (fp32 inputs) and accumulate in fp32;
the state entering ``C @ S^T`` is rounded to the operand dtype, as the chunked scans of other
libraries do.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from .ssd_triton_common import (
    _DOT_MIN,
    _desc,
    _dot_ops,
    _ensure_allocator,
    _load_D,
    _mm,
    _p2,
    _process_dt,
    _put,
    _put_y,
    _seq_descs,
    _seq_span,
    _sm_count,
    _state_in,
    _tile,
    _tma_ok,
    _tokens,
    empty,
)
from .ssd_triton_flat import _scan_flat, heads_per_block
from .ssd_triton_flat import grid as flat_grid
from .ssd_triton_twopass import two_pass_fwd


@triton.jit
def _scan_seq(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, y_ptr, final_ptr, states_ptr,
    cu_ptr, choff_ptr, rows_ptr,
    L, H, P, N, HPG, NMAX, lo, hi,
    s_x_t, s_x_h, s_dt_t, s_dt_h, s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, VARLEN: tl.constexpr,
    STORE_STATES: tl.constexpr, EVERY: tl.constexpr, Q: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    MASK_P: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr, OPS: tl.constexpr, NS: tl.constexpr,
    ROWS: tl.constexpr,
):
    """One program per (headdim block of BP columns, head, sequence): the sequence's chunks in order for
    columns p0 .. p0 + BP - 1 (those < P). With STORE_STATES, the state entering every EVERY-th chunk is
    written (chunks of Q * EVERY tokens). With ROWS, sequence s's initial and final states are row
    rows[s] of one buffer (init_ptr == final_ptr, any float dtype: read once at the start, written once at
    the end by the same program)."""
    h = tl.program_id(1)
    s = tl.program_id(2)
    p0 = tl.program_id(0) * BP
    t_seq, t_end = _seq_span(cu_ptr, s, L, VARLEN)
    if STORE_STATES:
        c_first = tl.load(choff_ptr + s).to(tl.int32)
    g = h // HPG
    n_tok = t_end - t_seq
    n_chunks = tl.cdiv(n_tok, Q)
    LOG2E: tl.constexpr = 1.4426950408889634
    cols = p0 + tl.arange(0, BP)
    mp = cols < P
    ns = tl.arange(0, BN)
    mn = ns < N
    qs = tl.arange(0, Q)
    causal = qs[:, None] >= qs[None, :]
    A = tl.load(A_ptr + h).to(tl.float32) * LOG2E  # decays in the log2 domain (exp2)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h).to(tl.float32)
    else:
        bias = 0.0
    Dv = _load_D(D_ptr, h, P, cols, HAS_D, D_PER_CHANNEL)

    # the sequence's rows of x, B, C, z, y for this head (and group), from the program's first column
    t_seq64 = t_seq.to(tl.int64)
    xd, bd, cd, yd, zd = _seq_descs(x_ptr, B_ptr, C_ptr, y_ptr, z_ptr, t_seq64, n_tok, h, g, p0, P, N, s_x_t, s_x_h,
                                    s_b_t, s_b_g, s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h, Q, BP, BN, TMA, HAS_Z)
    STATES_TMA: tl.constexpr = TMA and not MASK_P
    if STORE_STATES:
        # states (rows, h, p, n) as a matrix of rows * h * p rows of n: a tile is S^T transposed, (BP, N)
        sd = _desc(states_ptr + p0 * N, NMAX * H * P - p0, N, N, BP, BN, STATES_TMA)  # < 2**31 rows

    # the state, transposed (dstate x columns), fp32; state tensors are (sequence, h, p, n)
    if ROWS:
        st_row = tl.load(rows_ptr + s).to(tl.int64)
    else:
        st_row = s.to(tl.int64)
    st_base = (st_row * H + h) * P * N
    ST, st_off, st_mask = _state_in(init_ptr, st_base, ns, cols, N, mn, mp, BN, BP, HAS_INIT)

    for c in tl.range(0, n_chunks, num_stages=NS):
        r0 = c * Q
        mq = r0 + qs < n_tok
        dt = tl.load(dt_ptr + (t_seq64 + r0) * s_dt_t + h * s_dt_h + qs * s_dt_t, mask=mq, other=0.0)
        dt = tl.where(mq, _process_dt(dt.to(tl.float32), bias, lo, hi, HAS_BIAS, SOFTPLUS, CLAMP), 0.0)
        a = dt * A
        cs = tl.cumsum(a, axis=0)
        e_end = tl.exp2(tl.sum(a, axis=0))
        xv = _tile(xd, r0, n_tok, P - p0, s_x_t, Q, BP, TMA, MASK_P)
        Bv = _tile(bd, r0, n_tok, N, s_b_t, Q, BN, TMA, MASK_N)
        # B weighted by dt and the decay after each token to the chunk's end (a reverse sum: no cancellation)
        w = dt * tl.exp2(tl.cumsum(a, axis=0, reverse=True) - a)
        BwT = tl.trans((Bv * w[:, None]).to(Bv.dtype))
        Cv = _tile(cd, r0, n_tok, N, s_c_t, Q, BN, TMA, MASK_N)
        # the chunk's own part of y: W x, W[t, s] = C_t . B_s * exp(cs_t - cs_s) * dt_s for s <= t (exp2
        # only there: no overflow above the diagonal)
        CB = _mm(Cv, tl.trans(Bv), xv, OPS)
        W = CB * tl.exp2(tl.where(causal, cs[:, None] - cs[None, :], float("-inf"))) * dt[None, :]
        if STORE_STATES and c % EVERY == 0:
            srow = ((c_first + c // EVERY) * H + h) * P
            if STATES_TMA:
                _put(sd, srow, 0, 0, N, tl.trans(ST).to(states_ptr.dtype.element_ty), BP, BN, True, False)
            else:
                tl.store(states_ptr + srow.to(tl.int64) * N + st_off, ST.to(states_ptr.dtype.element_ty),
                         mask=st_mask)
        # the incoming state's part, exp(cs) (C S^T), then the state leaving the chunk
        y = _mm(Cv, ST, xv, OPS) * tl.exp2(cs)[:, None]
        y += _mm(W, xv, xv, OPS)
        ST = ST * e_end + _mm(BwT, xv, xv, OPS)
        _put_y(y, xv, Dv, zd, yd, y_ptr, r0, n_tok, P - p0, s_z_t, s_y_t, Q, BP, TMA, MASK_P, HAS_D, HAS_Z)

    tl.store(final_ptr + st_base + st_off, ST.to(final_ptr.dtype.element_ty), mask=st_mask)


# Launch settings. None = the automatic choice of ``launch_config`` (the benchmark sweeps them):
#   Q          chunk length the kernel walks, a power of two >= 16 (None: the caller's chunk_size, at most
#              32; the result is the same function, only the rounding differs)
#   BLOCK_P    headdim columns per program, a power of two >= 16: P is cut into blocks of BLOCK_P, the last
#              masked (80 at 64: two programs, the second with 16 columns; at 128: one program)
#   tma        tiles through tensor descriptors (TMA on Hopper; no per-element addresses in registers)
#              where the tensors' addresses and strides are 16-byte multiples: None = on a CUDA GPU of
#              compute capability >= 9, True = also elsewhere (the interpreter), False = never
#   num_warps, num_stages (software pipelining of the chunk loop), maxnreg (registers per thread cap)
#   FLAT       headdim blocks of BLOCK_P columns laid across a group's heads end to end (ssd_triton_flat.py:
#              no padded columns at P = 80; a product per head a block touches for the intra-chunk part;
#              measured slower than the per-head layout on an H200 at every setting tried: off)
#   TWO_PASS   the chunks in parallel, in three launches (ssd_triton_twopass.py: each chunk's own state, a
#              pass over the chunk states, each chunk's y), batch rows only (packed sequences: the walk); Q
#              defaults to the caller's chunk_size there (with stored states: states_chunk), BLOCK_P to 64;
#              TP_STATES the chunk states' dtype ("fp32" or "bf16"; stored states: states_dtype), TP_BLOCK
#              the pass's elements a program, TP_ROWS the output kernel's rows a program (None: min(Q, 64))
#              (not yet timed: off)
SCAN_CONFIG = dict(Q=None, BLOCK_P=None, tma=None, num_warps=None, num_stages=None, maxnreg=None, FLAT=False,
                   TWO_PASS=False, TP_STATES="fp32", TP_BLOCK=1024, TP_ROWS=None)

# The compiled kernel of the last launch (``LAST_KERNEL["scan"]``): the benchmark reads its registers,
# spills and shared memory from it.
LAST_KERNEL = {}


def launch_config(n_seq: int, h: int, p: int, chunk_size: int, dev: torch.device, wide: bool = False,
                  over: dict | None = None) -> dict:
    """The launch settings for a scan of ``n_seq`` sequences: SCAN_CONFIG where set, else the best
    measured on an H200 (docs/benchmarks.md): 32-token chunks, 4 warps, 3 stages; while sequences x heads
    do not fill the multiprocessors twice, headdim blocks of 64 (two programs per head at P=80, the second
    masked: twice the programs), else the whole headdim padded to a power of two in one program.
    ``wide`` (fp32 operands): headdim blocks of 32 (fp32 tiles take twice the shared memory)."""
    cfg = dict(SCAN_CONFIG, **(over or {}))
    few = n_seq * h < 2 * _sm_count(dev)
    block = 32 if wide else (64 if few else 128)
    defaults = dict(Q=min(int(chunk_size), 32), BLOCK_P=min(_p2(p), block), num_warps=4)
    if cfg.get("TWO_PASS"):  # every chunk a program: longer chunks, fewer chunk states
        defaults.update(Q=int(chunk_size), BLOCK_P=min(_p2(p), 32 if wide else 64))
    for k, v in defaults.items():
        cfg[k] = v if cfg[k] is None else cfg[k]
    cfg["Q"] = max(_DOT_MIN, 1 << (int(cfg["Q"]).bit_length() - 1))  # a power of two
    if cfg["num_stages"] is None:  # deeper pipelines of longer chunks do not fit shared memory
        cfg["num_stages"] = 3 if cfg["Q"] <= 32 and not wide else 2
    return cfg


def ssd_scan_triton_fwd(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                        dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128,
                        store_states=False, states_dtype=torch.float32, states_chunk=None, config=None,
                        state_rows=None):
    """The scan's forward (``config``: settings over SCAN_CONFIG's, as the training path pins them). Returns
    a namespace: ``y`` (b, l, h, p) in x's dtype, ``final`` (n_seq, h, p, n) fp32, ``states`` (n_max, h, p, n)
    in ``states_dtype`` with ``store_states`` (else None): states[choff[s] + c] is the state of sequence s
    entering its chunk c of ``states_Q`` tokens (``states_chunk``, a power-of-two multiple of the kernel's
    chunk; None: the kernel's); ``choff`` (n_seq + 1,) int32 on the device with ``store_states``, else None
    (sequence s owns chunks choff[s] .. choff[s + 1] - 1); ``Q`` the kernel's chunk length; ``n_max`` rows
    of states; ``config`` the settings used. With ``state_rows`` (n_seq,) (no cu_seqlens; the per-head layout,
    one pass): ``initial_state`` is a contiguous buffer (R, h, p, n) of any float dtype whose rows state_rows[s]
    (distinct) hold the sequences' initial states; their final states are written there in place (rounded once
    to its dtype) and ``final`` is that buffer."""
    out_dtype = x.dtype
    if x.dtype == torch.float64:  # the kernel computes in fp32
        x, B, C = x.float(), B.float(), C.float()
        z = None if z is None else z.float()
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    dev = x.device
    varlen = cu_seqlens is not None
    n_seq = cu_seqlens.numel() - 1 if varlen else b
    cfg = launch_config(n_seq, h, p, chunk_size, dev, wide=x.dtype == torch.float32, over=config)
    Q, bp = int(cfg["Q"]), int(cfg["BLOCK_P"])
    if bp < _DOT_MIN or bp & (bp - 1):
        raise ValueError(f"SCAN_CONFIG['BLOCK_P'] must be a power of two >= {_DOT_MIN}, got {bp}")

    flat = bool(cfg.get("FLAT"))
    if state_rows is not None and (varlen or flat or cfg.get("TWO_PASS") or initial_state is None
                                   or not initial_state.is_contiguous()):
        raise ValueError("state_rows needs batch rows (no cu_seqlens), the per-head one-pass layout and a "
                         "contiguous initial_state buffer")
    xt, Bt, Ct, dtt = _tokens(x), _tokens(B), _tokens(C), _tokens(dt)
    if cfg.get("TWO_PASS") and not varlen:  # stored states: its chunk states are those entering each chunk
        if store_states and states_chunk is not None:
            Q = int(states_chunk)
            if Q < _DOT_MIN or Q & (Q - 1):
                raise ValueError(f"states_chunk must be a power of two >= {_DOT_MIN}, got {states_chunk}")
        out, kernels = two_pass_fwd(x, xt, dtt, A, Bt, Ct, D, z, dt_bias, dt_softplus, dt_limit, initial_state, cfg,
                                    Q, bp, out_dtype, states_dtype if store_states else None)
        LAST_KERNEL.update(kernels, scan=kernels["tp_out"])
        return out
    zt = None if z is None else _tokens(z)
    if flat:  # a group's columns as one run of each token's row: heads contiguous
        xt = xt if xt.stride(1) == p else xt.contiguous()
        zt = zt if zt is None or zt.stride(1) == p else zt.contiguous()
    y = empty(b, l, h, p, dtype=x.dtype, device=dev)
    yt = y.view(b * l, h, p)
    A32 = A.float().contiguous()
    if state_rows is None:
        final = empty(n_seq, h, p, n, dtype=torch.float32, device=dev)
        init = None if initial_state is None else initial_state.float().contiguous()
    else:  # read and written in place by row: no copies of the rows, no fp32 copy
        final = init = initial_state
        state_rows = state_rows.to(device=dev, dtype=torch.int64).contiguous()
    Dc = None if D is None else D.contiguous()
    bias = None if dt_bias is None else dt_bias.float().contiguous()
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")

    Qs = Q if states_chunk is None else int(states_chunk)
    every = Qs // Q
    if Qs < Q or Qs % Q or every & (every - 1):
        raise ValueError(f"states_chunk must be the kernel's chunk ({Q}) times a power of two, got {states_chunk}")
    cu = cu_seqlens.to(device=dev, dtype=torch.int32) if varlen else A32  # A32: not read
    if varlen:
        n_max = triton.cdiv(l, Qs) + n_seq - 1  # sum_s ceil(len_s / Qs) <= this, for lengths >= 1
    else:
        n_max = n_seq * triton.cdiv(l, Qs)
    if not store_states:
        choff = None  # not read by the kernel: no device work for it on the inference path
    elif varlen:
        lens = cu[1:] - cu[:-1]
        choff = torch.cat([cu.new_zeros(1), ((lens + Qs - 1) // Qs).cumsum(0).to(torch.int32)])
    else:
        choff = torch.arange(n_seq + 1, dtype=torch.int32, device=dev) * triton.cdiv(l, Qs)
    if store_states and n_max * h * p >= 2**31:
        raise ValueError(f"ssd_scan: {n_max} chunks x {h} heads x headdim {p} >= 2**31 rows of chunk states; "
                         f"use fewer tokens per call or a larger chunk_size")
    states = empty(n_max, h, p, n, dtype=states_dtype, device=dev) if store_states else None

    tma = cfg.get("tma")
    if tma is None:
        tma = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
    if tma:  # only where the addresses allow
        es = x.element_size()
        tiles = [xt, Bt, Ct, yt] + ([zt] if zt is not None else [])
        offsets = [xt.stride(1), Bt.stride(1), Ct.stride(1), yt.stride(1), bp] + ([(h // g) * p] if flat else [])
        offsets += [zt.stride(1)] if zt is not None else []
        tma = _tma_ok(es, tiles, offsets) and (states is None or _tma_ok(states.element_size(), [states], [n]))
    if tma:
        _ensure_allocator()
    extra = {} if cfg.get("maxnreg") is None else dict(maxnreg=int(cfg["maxnreg"]))
    if flat:
        LAST_KERNEL["scan"] = _scan_flat[flat_grid(p, h, g, n_seq, bp)](
            xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, zt if zt is not None else xt,
            bias if bias is not None else A32, init if init is not None else final, yt, final,
            states if states is not None else final, cu, choff if choff is not None else cu,
            l, h, p, n, h // g, n_max, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
            xt.stride(0), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1), Ct.stride(0), Ct.stride(1),
            zt.stride(0) if zt is not None else 0, yt.stride(0),
            HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
            HAS_INIT=init is not None, HAS_BIAS=bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp,
            VARLEN=varlen, STORE_STATES=bool(store_states), EVERY=every, Q=Q, BP=bp, BN=_p2(n),
            NH=heads_per_block(p, h // g, bp), MASK_P=(h // g) * p % bp != 0, MASK_N=_p2(n) != n, TMA=bool(tma),
            OPS=_dot_ops(x.dtype), NS=int(cfg["num_stages"]), num_warps=int(cfg["num_warps"]), **extra,
        )
        return SimpleNamespace(y=y.to(out_dtype), final=final, states=states, choff=choff, Q=Q, states_Q=Qs,
                               n_max=n_max, config=dict(cfg, tma=bool(tma)))

    LAST_KERNEL["scan"] = _scan_seq[(triton.cdiv(p, bp), h, n_seq)](
        xt, dtt, A32, Bt, Ct, Dc if Dc is not None else A32, zt if zt is not None else xt,
        bias if bias is not None else A32, init if init is not None else final, yt, final,
        states if states is not None else final, cu, choff if choff is not None else cu,
        state_rows if state_rows is not None else cu,
        l, h, p, n, h // g, n_max, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
        xt.stride(0), xt.stride(1), dtt.stride(0), dtt.stride(1), Bt.stride(0), Bt.stride(1),
        Ct.stride(0), Ct.stride(1), *(zt.stride()[:2] if zt is not None else (0, 0)), yt.stride(0), yt.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_INIT=init is not None, HAS_BIAS=bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp,
        VARLEN=varlen, STORE_STATES=bool(store_states), EVERY=every, Q=Q, BP=bp, BN=_p2(n), MASK_P=p % bp != 0,
        MASK_N=_p2(n) != n, TMA=bool(tma), OPS=_dot_ops(x.dtype), NS=int(cfg["num_stages"]),
        ROWS=state_rows is not None, num_warps=int(cfg["num_warps"]), **extra,
    )
    return SimpleNamespace(y=y.to(out_dtype), final=final, states=states, choff=choff, Q=Q, states_Q=Qs, n_max=n_max,
                           config=dict(cfg, tma=bool(tma)))


def ssd_scan_triton(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The Triton scan (inference). Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state
    fp32). One launch (with cu_seqlens also a few small torch ops for the chunk offsets, on the device)."""
    out = ssd_scan_triton_fwd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              dt_limit=dt_limit, initial_state=initial_state, cu_seqlens=cu_seqlens,
                              chunk_size=chunk_size)
    return out.y, out.final
