"""The state gradient of the SSD scan's backward in one launch (``BWD_CONFIG["WALK"]``; see
ssd_triton_backward.py for the formulas).

Only the gradient with respect to the state runs from chunk to chunk:

    dS^T_in = exp(cL) dS^T + u,   u = C^T (dy * exp(cs))   (the chunk's own term, a (n, p) product)

The default backward computes every chunk's u in a chunk-parallel launch, stores it where the state
gradients go, and then walks the chunks in reverse entry by entry (``_bwd_dstates`` and ``_bwd_spass``): u
is written once and read once, and the pass also reads the stored states for sum(dS * S). Here one program
per (headdim block, head, sequence) walks its sequence's chunks in reverse with dS^T (its block of
columns x dstate, fp32) on chip, computes u itself (one product per chunk) and writes only the state
gradients; the share of sum(dS * S) per chunk is taken by the dB / dC kernel, which reads both tensors
anyway (``_bwd_dbc`` with ``SS``). Stored gradients are rounded to the states' dtype as in the two-launch
form; the recurrence and u stay fp32 (the two-launch form rounds u to that dtype once).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ssd_triton_common import _sload, _smm, _sstore, _tile


@triton.jit
def _bwd_dswalk(
    dfin_ptr, dt_ptr, A_ptr, C_ptr, dy_ptr, dst_ptr, dinit_ptr, cu_ptr, choff_ptr,
    H, P, N, HPG, s_dt_t, s_dt_h, s_c_t, s_c_g, s_dy_t, s_dy_h,
    Q: tl.constexpr, QP: tl.constexpr, BP: tl.constexpr, NP: tl.constexpr, OPS: tl.constexpr,
    HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr, NS: tl.constexpr,
):
    """One program per (block of BP headdim columns, head, sequence): the chunks of the sequence in reverse;
    dst[row of chunk c, h] gets the gradient of the state leaving chunk c (in dst's dtype), dinit the
    gradient of the state entering the sequence (with HAS_INIT); dfin the final state's gradient (or 0)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    pb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    p0 = pb * BP
    g = h // HPG
    ts = tl.load(cu_ptr + s)
    n_tok = tl.load(cu_ptr + s + 1) - ts
    ts64 = ts.to(tl.int64)
    cbase = tl.load(choff_ptr + s)
    nch = (n_tok + Q - 1) // Q
    q = tl.arange(0, QP)
    causal = q[:, None] >= q[None, :]
    A2 = tl.load(A_ptr + h).to(tl.float32) * LOG2E
    sh = s * H + h
    if HAS_DFINAL:
        dS = _sload(dfin_ptr, sh, p0, 0, P, N, BP, NP, False).to(tl.float32)
    else:
        dS = tl.zeros((BP, NP), dtype=tl.float32)
    c_base = C_ptr + ts64 * s_c_t + g * s_c_g
    dy_base = dy_ptr + ts64 * s_dy_t + h * s_dy_h + p0
    for i in tl.range(0, nch, num_stages=NS):
        c = nch - 1 - i
        _sstore(dst_ptr, (cbase + c) * H + h, p0, 0, P, N, dS.to(dst_ptr.dtype.element_ty), BP, NP, False)
        r0 = c * Q
        n_end = tl.minimum(n_tok, r0 + Q)  # a tile of QP rows must not reach into the next chunk
        mq = r0 + q < n_end
        dt = tl.load(dt_ptr + (ts64 + r0 + q) * s_dt_t + h * s_dt_h, mask=mq, other=0.0).to(tl.float32)
        # cumulative sums as masked row sums of a (Q, Q) tile (no tl.cumsum: see ssd_triton_bwd_chunk.py)
        cs = tl.sum(tl.where(causal, (dt * A2)[None, :], 0.0), axis=1)
        ecs = tl.where(mq, tl.exp2(cs), 0.0)
        Cm = _tile(c_base, r0, n_end, N, s_c_t, QP, NP, False, True)
        dyv = _tile(dy_base, r0, n_end, P - p0, s_dy_t, QP, BP, False, True)
        u = _smm(tl.trans(dyv.to(tl.float32) * ecs[:, None]), Cm, dyv, OPS, dst_ptr)  # (its columns, n)
        dS = tl.exp2(tl.sum(dt * A2, axis=0)) * dS + u
    if HAS_INIT:
        _sstore(dinit_ptr, sh, p0, 0, P, N, dS, BP, NP, False)


def walk_grid(p: int, h: int, n_seq: int, bp: int) -> tuple:
    return (triton.cdiv(p, bp), h, n_seq)
