"""The differentiable Triton scan: ``ssd_scan(..., backend="triton")`` when a gradient is needed.

``ssd_scan_triton_train`` has ``ssd_scan``'s signature (arguments validated there). In order:

    1. dt processing in PyTorch (dt + dt_bias, softplus, clamp; fp32), so autograd takes dt_bias and
       the softplus / clamp through it;
    2. ``SSDScanFn``: forward = the Triton scan (``ssd_scan_triton_fwd`` of ssd_triton_scan.py with
       ``store_states=True``: the state entering every chunk) on processed dt, without z; backward = the
       four Triton launches of ssd_triton_backward.py (dx, ddt, dA, dB, dC, dD, d initial_state);
    3. the gate y * silu(z) in PyTorch (``GateFn``, fp32 math, saves y and z as they are).

``SSDScanFn`` saves x, dt, A, B, C, D and the chunk states (one (h, p, n) per chunk, fp32, or bf16 / fp16
for such inputs): everything
else (decays, C B^T, the intra-chunk matrices) is recomputed by the backward kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .ssd_naive import process_dt
from .ssd_triton_backward import BWD_CONFIG, ssd_scan_triton_bwd


def _forward(x, dt, A, B, C, D, initial_state, cu_seqlens, chunk_size):
    """The Triton forward with chunk states (a function of its own so tests can stand in for it)."""
    from .ssd_triton_scan import launch_config, ssd_scan_triton_fwd

    half = x.dtype in (torch.bfloat16, torch.float16)  # states kept in the products' operand dtype (or fp32)
    if BWD_CONFIG.get("STATES") not in (None, "fp32", "grads"):
        raise ValueError(f"BWD_CONFIG['STATES'] must be None, 'fp32' or 'grads', got {BWD_CONFIG.get('STATES')!r}")
    keep = x.dtype if half and BWD_CONFIG.get("STATES") != "fp32" else torch.float32
    # the forward walks its own (shorter) chunks and writes the state at the backward's chunk boundaries
    # (both powers of two, so the forward's divides the backward's)
    cfg = launch_config(1, x.shape[2], x.shape[3], chunk_size, x.device, wide=not half)
    # headdim blocks of at most 64 at every batch: with the states stored, a wider block was slower
    return ssd_scan_triton_fwd(x, dt, A, B, C, D=D, initial_state=initial_state, cu_seqlens=cu_seqlens,
                               chunk_size=chunk_size, store_states=True,
                               states_dtype=keep, states_chunk=chunk_size,
                               config=dict(Q=min(chunk_size, cfg["Q"]), BLOCK_P=min(cfg["BLOCK_P"], 64)))


class SSDScanFn(torch.autograd.Function):
    """(x, processed dt fp32, A, B, C, D, initial_state, cu_seqlens, chunk_size) -> (y, final_state)."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_state, cu_seqlens, chunk_size):
        out = _forward(x, dt, A, B, C, D, initial_state, cu_seqlens, chunk_size)
        ctx.save_for_backward(x, dt, A, B, C, D, out.states, out.choff, cu_seqlens)
        ctx.Q = int(out.states_Q)
        ctx.has_init = initial_state is not None
        ctx.init_dtype = None if initial_state is None else initial_state.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros to read)
        return out.y, out.final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, dt, A, B, C, D, states, choff, cu_seqlens = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(x)
        dx, ddt, dA, dB, dC, dD, dinit = ssd_scan_triton_bwd(
            x, dt, A, B, C, D, states, choff, ctx.Q, dy, dfinal, cu_seqlens, has_init=ctx.has_init)
        need = ctx.needs_input_grad
        return (dx if need[0] else None, ddt.to(dt.dtype) if need[1] else None, dA.to(A.dtype) if need[2] else None,
                dB if need[3] else None, dC if need[4] else None,
                dD.to(D.dtype) if D is not None and need[5] else None,
                dinit.to(ctx.init_dtype) if ctx.has_init and need[6] else None, None, None)


class GateFn(torch.autograd.Function):
    """y * silu(z) computed in fp32, returned in y's dtype; saves y and z as given."""

    @staticmethod
    def forward(ctx, y, z):
        ctx.save_for_backward(y, z)
        return (y.float() * F.silu(z.float())).to(y.dtype)

    @staticmethod
    def backward(ctx, g):
        y, z = ctx.saved_tensors
        zf, gf = z.float(), g.float()
        sig = torch.sigmoid(zf)
        dy = gf * zf * sig
        dz = gf * y.float() * sig * (1.0 + zf * (1.0 - sig))
        return dy.to(y.dtype), dz.to(z.dtype)


def ssd_scan_triton_train(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                          dt_limit=(0.0, math.inf), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The Triton scan with a Triton backward. Shapes as in ``holotron.kernels.ssd_scan``; returns
    (y like x, final state fp32). ``BWD_CONFIG["chunk_size"]``, when set, caps ``chunk_size`` (the result
    is the same function; only the rounding differs)."""
    Q = min(int(chunk_size), int(BWD_CONFIG["chunk_size"] or chunk_size))
    if x.dtype not in (torch.bfloat16, torch.float16):
        Q = min(Q, 32)  # fp32 tiles take twice the shared memory
    Q = max(16, 1 << (Q.bit_length() - 1))  # a power of two: the forward's own chunks divide it
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
    y, final = SSDScanFn.apply(x, dtp, A, B, C, D, initial_state, cu_seqlens, Q)
    if z is not None:
        y = GateFn.apply(y, z)
    return y, final
