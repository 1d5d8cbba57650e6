"""One SSD decode step as a Triton kernel: the GPU path of ``ssd_step``.

Arguments are validated by ``holotron.kernels.ssd_step``; call that. One launch, one program per
(batch row, head, block of state rows): S = exp(dt A) S + dt x B^T in place, y = S C + D x, y *= silu(z).
The state is fp32 or fp64 (computed in its dtype), or bf16 / fp16 (computed in fp32, rounded once when
stored). Nothing waits on the host: the step can be captured in a CUDA graph. ``active`` (b,) (optional):
rows where it is 0 compute y but do not store their state (the decode engine's rows that are not
decoding: a prefill may be writing them at the same time on another stream).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ssd_triton_common import _process_dt, empty


@triton.jit
def _step(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, act_ptr,
    H, P, N, HPG, lo, hi,
    s_s_b, s_s_h, s_s_p, s_x_b, s_x_h, s_dt_b, s_dt_h, s_b_b, s_b_g, s_c_b, s_c_g,
    s_z_b, s_z_h, s_y_b, s_y_h,
    HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    STATE_LOW: tl.constexpr, HAS_ACTIVE: tl.constexpr, STREAM: tl.constexpr,
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
    if STREAM:  # the state is read once and written once per step: keep it from displacing cached lines
        S = tl.load(sptr, mask=mp[:, None] & mn[None, :], other=0.0, eviction_policy="evict_first")
    else:
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
    ms = mp
    if HAS_ACTIVE:
        ms = mp & (tl.load(act_ptr + bi + ps * 0) != 0)  # the row's flag, broadcast over its state rows
    if STREAM:
        tl.store(sptr, S.to(state_ptr.dtype.element_ty), mask=ms[:, None] & mn[None, :], cache_modifier=".cs")
    else:
        tl.store(sptr, S.to(state_ptr.dtype.element_ty), mask=ms[:, None] & mn[None, :])
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


# launch settings of the step (dev/probes/step_sweep.py sweeps them). BLOCK_P None: 4 KiB of state per program
# (8 rows of an fp32 state, 16 of a 16-bit one, at N = 128); stream: the state's loads and stores marked as
# streaming (evict first). At batch 128 on an H200 (2026-12-04) these took the 12B's step from 370 to 358 us per
# layer with an fp32 state (85 -> 88% of copy bandwidth) and from 189 to 180 us with a bf16 state (84 -> 88%).
STEP_CONFIG = dict(BLOCK_P=None, num_warps=2, stream=True)


def ssd_step_triton(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                    dt_limit=(0.0, float("inf")), active=None):
    """One token: updates ``state`` (b, h, p, n) in place, returns y (b, h, p) like x."""
    b, h, p = x.shape
    g, n = B.shape[-2:]
    if state.stride(-1) != 1:  # updated in place, so it cannot be copied to a contiguous one
        raise ValueError(f"state must have a unit-stride last dim (dstate) for the triton step, "
                         f"got strides {state.stride()}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    z = None if z is None else (z if z.stride(-1) == 1 else z.contiguous())
    B = B if B.stride(-1) == 1 else B.contiguous()
    C = C if C.stride(-1) == 1 else C.contiguous()
    y = empty(b, h, p, dtype=x.dtype, device=x.device)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    clamp = lo > 0.0 or hi < float("inf")
    BLOCK_N = triton.next_power_of_2(n)
    # 4 KiB of the state per program: at P = 80 whole blocks (no masked lanes), and b * h * P / BLOCK_P programs
    # keep every multiprocessor busy from batch 1 on
    BLOCK_P = STEP_CONFIG["BLOCK_P"] or min(triton.next_power_of_2(p), max(1, 4096 // (BLOCK_N * state.element_size())))
    Dc = None if D is None else D.contiguous()
    _step[(b, h, triton.cdiv(p, BLOCK_P))](
        state, x, dt, A, B, C, Dc if Dc is not None else A, z if z is not None else x,
        dt_bias if dt_bias is not None else A, y, active if active is not None else dt,
        h, p, n, h // g, lo if clamp else 0.0, hi if hi < float("inf") else 3.0e38,
        state.stride(0), state.stride(1), state.stride(2), x.stride(0), x.stride(1),
        dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        *(z.stride()[:2] if z is not None else (0, 0)), y.stride(0), y.stride(1),
        HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None,
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), CLAMP=clamp,
        BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, STATE_LOW=state.dtype in (torch.bfloat16, torch.float16),
        HAS_ACTIVE=active is not None, STREAM=bool(STEP_CONFIG.get("stream")), num_warps=STEP_CONFIG["num_warps"],
    )
    return y
