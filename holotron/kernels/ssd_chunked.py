"""The SSD chunked algorithm in PyTorch: the CPU and fallback path of ``ssd_scan``.

Arguments are validated by ``holotron.kernels.ssd_scan``; call that. The README beside this file
derives the math; in short, a sequence is cut into chunks of Q tokens and for each chunk, in order:

    seg[t, s] = sum_{s<k<=t} dA_k            (t >= s; -inf above the diagonal)   dA = dt * A
    y_t   = sum_{s<=t} (C_t . B_s) exp(seg[t, s]) dt_s x_s        intra-chunk (quadratic) term
          + exp(cs_t) C_t . S_in                                   inter-chunk term, cs_t = sum_{k<=t} dA_k
    S_out = exp(cs_{Q-1}) S_in + sum_s exp(seg[Q-1, s]) dt_s x_s B_s^T      state passing

Only one chunk's (b, h, Q, Q) decay matrix is alive at a time, so memory stays at
O(b h Q^2 + b h p n) on top of the inputs and y, whatever the sequence length. Decays are exps of
sums of dA <= 0 (never of a difference of two large cumsums, never of a positive number), so large
|A dt| decays to 0 instead of overflowing. Math runs in float32 (float64 when x is float64),
whatever the input dtype; the returned state is float32 (float64 for float64 inputs).

Packed sequences (``cu_seqlens``) are scanned one after the other with the state reset (to their
``initial_state`` or 0) at each start: chunks never straddle a boundary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ssd_naive import process_dt


def segsum(a: torch.Tensor) -> torch.Tensor:
    """(..., q) -> (..., q, q): out[t, s] = sum_{s<k<=t} a_k for t >= s, -inf above the diagonal.

    Summed along columns of a masked copy, not as cs[t] - cs[s]: no cancellation between two large
    cumulative sums, and the diagonal is exactly 0.
    """
    q = a.shape[-1]
    rep = a[..., :, None].expand(*a.shape, q)  # rep[..., k, s] = a_k
    below = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)  # k > s
    out = rep.masked_fill(~below, 0.0).cumsum(dim=-2)  # out[..., t, s] = sum_{s<k<=t} a_k
    return out.masked_fill(~below.logical_or(torch.eye(q, dtype=torch.bool, device=a.device)), float("-inf"))


def _chunk(x, dt, A, B, C, S):
    """One chunk, all in the compute dtype.

    x (r, q, h, p)  dt (r, q, h) processed  A (h,)  B, C (r, q, g, n)  S (r, h, p, n) state on entry.
    Returns y (r, q, h, p) without the D term and gate, and the state after the chunk.
    """
    r, q, h, p = x.shape
    g, n = B.shape[-2:]
    k = h // g  # heads per group
    dA = (dt * A).transpose(1, 2)  # (r, h, q)
    seg = segsum(dA)  # (r, h, q, q), <= 0 on and below the diagonal
    decay_in = dA.cumsum(-1).exp()  # (r, h, q): from the chunk's start through token t
    decay_out = seg[..., -1, :].exp()  # (r, h, q): from token s (excluded) to the chunk's end

    # intra-chunk: y_t += sum_s (C_t . B_s) exp(seg[t, s]) dt_s x_s
    CB = torch.einsum("rtgn,rsgn->rgts", C, B)  # (r, g, q, q)
    M = seg.exp().view(r, g, k, q, q) * CB[:, :, None] * dt.transpose(1, 2).reshape(r, g, k, 1, q)
    xg = x.view(r, q, g, k, p)
    y = torch.einsum("rgkts,rsgkp->rtgkp", M, xg)
    # inter-chunk: y_t += exp(cs_t) C_t . S_in
    y_in = torch.einsum("rtgn,rgkpn->rtgkp", C, S.view(r, g, k, p, n))
    y = (y + y_in * decay_in.view(r, g, k, q).permute(0, 3, 1, 2)[..., None]).reshape(r, q, h, p)
    # state passing: S_out = exp(cs_end) S_in + sum_s exp(seg[end, s]) dt_s x_s B_s^T
    w = (dt * decay_out.transpose(1, 2)).view(r, q, g, k, 1)  # (r, q, g, k, 1)
    S_new = torch.einsum("rsgn,rsgkp->rgkpn", B, xg * w).reshape(r, h, p, n)
    S_new = S_new + S * decay_in[..., -1, None, None]
    return y, S_new


def _scan(y, x, dt, A, B, C, D, z, S, t0, t1, chunk_size, cd):
    """Scans rows of tokens [t0, t1) of every batch row, chunk by chunk; writes y; returns the state."""
    for c0 in range(t0, t1, chunk_size):
        c1 = min(c0 + chunk_size, t1)
        xc = x[:, c0:c1].to(cd)
        yc, S = _chunk(xc, dt[:, c0:c1], A, B[:, c0:c1].to(cd), C[:, c0:c1].to(cd), S)
        if D is not None:
            yc = yc + (D[:, None] if D.dim() == 1 else D) * xc
        if z is not None:
            yc = yc * F.silu(z[:, c0:c1].to(cd))
        y[:, c0:c1] = yc.to(y.dtype)
    return S


def ssd_scan_chunked(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                     dt_limit=(0.0, float("inf")), initial_state=None, cu_seqlens=None, chunk_size=128):
    """The chunked SSD scan. Shapes as in ``holotron.kernels.ssd_scan``; returns (y like x, state fp32)."""
    b, l, h, p = x.shape
    n = B.shape[-1]
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    dtf = process_dt(dt, dt_bias, dt_softplus, dt_limit, cd)  # (b, l, h)
    Af = A.to(cd)
    Df = None if D is None else D.to(cd)
    y = torch.empty_like(x)

    if cu_seqlens is None:
        S = (torch.zeros(b, h, p, n, dtype=cd, device=x.device) if initial_state is None
             else initial_state.to(cd).clone())
        final = _scan(y, x, dtf, Af, B, C, Df, z, S, 0, l, chunk_size, cd)
    else:
        cs = cu_seqlens.tolist()  # host sync: this path is sequential over sequences anyway
        final = torch.empty(len(cs) - 1, h, p, n, dtype=cd, device=x.device)
        for s in range(len(cs) - 1):
            S = (torch.zeros(1, h, p, n, dtype=cd, device=x.device) if initial_state is None
                 else initial_state[s:s + 1].to(cd).clone())
            final[s] = _scan(y, x, dtf, Af, B, C, Df, z, S, cs[s], cs[s + 1], chunk_size, cd)[0]
    return y, final
