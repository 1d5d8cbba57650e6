"""The SSD recurrence, one token at a time: obviously correct, slow, the ground truth.

Arguments are validated by ``holotron.kernels.ssd_scan`` / ``ssd_step``; call those.
Math runs in float32, or in float64 when x is float64 (the reference the tests compare against).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def process_dt(dt, dt_bias, dt_softplus, dt_limit, dtype):
    """dt -> clamp(softplus?(dt + dt_bias), *dt_limit) in ``dtype`` (fp32 or fp64)."""
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    lo, hi = dt_limit
    if lo > 0.0 or hi < float("inf"):
        dt = dt.clamp(min=lo, max=hi)
    return dt


def _expand_groups(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., g, n) -> (..., h, n): head i reads group i // (h // g)."""
    g = t.shape[-2]
    return t.repeat_interleave(heads // g, dim=-2)


def _d_term(D, x, dtype):
    if D is None:
        return 0.0
    D = D.to(dtype)
    return (D[:, None] if D.dim() == 1 else D) * x  # (h, 1) or (h, p) broadcast over (..., h, p)


def _recur(S, x, dt, A, B, C):
    """One step for one token. S (b, h, p, n); x (b, h, p); dt (b, h); B, C (b, h, n). Returns y (b, h, p)."""
    decay = torch.exp(dt * A)  # (b, h)
    S.mul_(decay[:, :, None, None]).add_((dt[:, :, None] * x)[..., None] * B[:, :, None, :])
    return torch.einsum("bhpn,bhn->bhp", S, C)


def ssd_scan_naive(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                   dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    del chunk_size  # the recurrence has no chunks
    b, l, h, p = x.shape
    n = B.shape[-1]
    cd = _compute_dtype(x)
    xf, Bf, Cf = x.to(cd), _expand_groups(B.to(cd), h), _expand_groups(C.to(cd), h)
    dtf = process_dt(dt, dt_bias, dt_softplus, dt_limit, cd)
    Af = A.to(cd)
    y = torch.empty(b, l, h, p, dtype=cd, device=x.device)

    if cu_seqlens is None:
        bounds = [(r, 0, l) for r in range(b)]
        n_seq = b
    else:
        cs = cu_seqlens.tolist()
        bounds = [(0, cs[i], cs[i + 1]) for i in range(len(cs) - 1)]
        n_seq = len(bounds)
    final = torch.empty(n_seq, h, p, n, dtype=cd, device=x.device)
    for s, (row, t0, t1) in enumerate(bounds):
        S = (torch.zeros(1, h, p, n, dtype=cd, device=x.device) if initial_state is None
             else initial_state[s:s + 1].to(cd).clone())
        for t in range(t0, t1):
            y[row, t] = _recur(S, xf[row:row + 1, t], dtf[row:row + 1, t], Af, Bf[row:row + 1, t],
                               Cf[row:row + 1, t])[0]
        final[s] = S[0]
    y = y + _d_term(D, xf, cd)
    if z is not None:
        y = y * F.silu(z.to(cd))
    out_state = final if cd == torch.float64 else final.float()
    return y.to(x.dtype), out_state


def ssd_step_naive(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                   dt_limit=(0.0, float("inf")), active=None):
    if active is not None:  # rows where active is 0 keep their state
        old = state.clone()
        y = ssd_step_naive(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                           dt_limit=dt_limit)
        state.copy_(torch.where(active.view(-1, 1, 1, 1) != 0, state, old))
        return y
    h = x.shape[1]
    cd = state.dtype if state.dtype == torch.float64 else torch.float32
    xf = x.to(cd)
    dtf = process_dt(dt, dt_bias, dt_softplus, dt_limit, cd)
    S = state if state.dtype == cd else state.to(cd)  # a bf16 / fp16 state: fp32 math, rounded once when stored
    y = _recur(S, xf, dtf, A.to(cd), _expand_groups(B.to(cd), h), _expand_groups(C.to(cd), h))
    if S is not state:
        state.copy_(S)
    y = y + _d_term(D, xf, cd)
    if z is not None:
        y = y * F.silu(z.to(cd))
    return y.to(x.dtype)
