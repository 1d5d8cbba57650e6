"""The SSD chunked algorithm in PyTorch: the CPU and fallback path of ``ssd_scan``.

Arguments are validated by ``holotron.kernels.ssd_scan``; call that. The README beside this file
derives the math; in short, a sequence is cut into chunks of Q tokens and for each chunk, in order:

    seg[t, s] = sum_{s<k<=t} dA_k            (t >= s; -inf above the diagonal)   dA = dt * A
    y_t   = sum_{s<=t} (C_t . B_s) exp(seg[t, s]) dt_s x_s        intra-chunk (quadratic) term
          + exp(cs_t) C_t . S_in                                   inter-chunk term, cs_t = sum_{k<=t} dA_k
    S_out = exp(cs_{Q-1}) S_in + sum_s exp(seg[Q-1, s]) dt_s x_s B_s^T      state passing

Chunks go in groups: every chunk of a group at once (its own outputs and state in a few batched
ops), the states entering them from one small (chunks x chunks) decay matrix over the group, and the
group's outgoing state into the next group. A group holds as many chunks as fit ``CHUNKED_CONFIG
["group_bytes"][device type]`` of (b, h, Q, Q) work tensors, so memory stays bounded whatever the
sequence length. On CUDA (512 MiB) short sequences and training batches run in a handful of large
kernels instead of dozens of small ones per chunk; on the CPU (0: one chunk per group, the plain
chunk-by-chunk loop) the small per-chunk tensors stay in cache, which measured faster there. Decays are exps
of sums of dA <= 0 (never of a difference of two large cumsums, never of a positive number), within a chunk
and across chunks alike, so large |A dt| decays to 0 instead of overflowing. Math runs in float32 (float64
when x is float64), whatever the input dtype; the returned state is float32 (float64 for float64 inputs).

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


# bytes of (b, h, Q, Q) work tensors one group of chunks may take, per device type (another type: the "cpu" entry);
# one chunk per group at the least. On a 2-core CPU, a 4 x 3,400-token, 10-head fp32 layer took 1.08 s
# forward + backward chunk by chunk and 1.13 s all at once (forward 0.17 -> 0.37 s, backward 0.91 ->
# 0.76 s); on CUDA, grouping trades launches for larger kernels: not yet measured.
CHUNKED_CONFIG = dict(group_bytes={"cuda": 512 * 2**20, "cpu": 0})


def _chunks(x, dt, A, B, C, S):
    """A group of m full chunks at once, all in the compute dtype.

    x (r, m, q, h, p)  dt (r, m, q, h) processed  A (h,)  B, C (r, m, q, g, n)  S (r, h, p, n) the state
    entering the group. Returns y (r, m, q, h, p) without the D term and gate, and the state after it.
    """
    r, m, q, h, p = x.shape
    g, n = B.shape[-2:]
    k = h // g  # heads per group
    dA = (dt * A).permute(0, 3, 1, 2)  # (r, h, m, q)
    seg = segsum(dA)  # (r, h, m, q, q), <= 0 on and below the diagonal
    cs = dA.cumsum(-1)  # (r, h, m, q): from the chunk's start through token t
    decay_in = cs.exp()
    decay_out = seg[..., -1, :].exp()  # (r, h, m, q): from token s (excluded) to the chunk's end

    # intra-chunk: y_t += sum_s (C_t . B_s) exp(seg[t, s]) dt_s x_s
    CB = torch.einsum("rmtgn,rmsgn->rgmts", C, B)  # (r, g, m, q, q)
    M = seg.exp().view(r, g, k, m, q, q) * CB[:, :, None] * dt.permute(0, 3, 1, 2).reshape(r, g, k, m, 1, q)
    xg = x.view(r, m, q, g, k, p)
    y = torch.einsum("rgkmts,rmsgkp->rmtgkp", M, xg)
    # each chunk's own state: sum_s exp(seg[end, s]) dt_s x_s B_s^T
    w = (dt.permute(0, 3, 1, 2) * decay_out).view(r, g, k, m, q)  # (r, g, k, m, q)
    own = torch.einsum("rmsgn,rgkms,rmsgkp->rmgkpn", B, w, xg)  # (r, m, g, k, p, n)
    # the states entering each chunk (and leaving the group): S_in[j] = sum_{i <= j} L[j, i] states[i] with
    # states = [S, own_0 .. own_{m-1}] and L = exp(segsum of the chunks' total decays, S's slot 0)
    totals = F.pad(cs[..., -1], (1, 0))  # (r, h, m + 1)
    L = segsum(totals).exp()  # (r, h, m + 1, m + 1)
    states = torch.cat([S.view(r, 1, g, k, p, n), own], dim=1)  # (r, m + 1, g, k, p, n)
    S_in = torch.einsum("rgkji,rigkpn->rjgkpn", L.view(r, g, k, m + 1, m + 1), states)
    # inter-chunk: y_t += exp(cs_t) C_t . S_in
    y_in = torch.einsum("rmtgn,rmgkpn->rmtgkp", C, S_in[:, :m])
    y = y + y_in * decay_in.view(r, g, k, m, q).permute(0, 3, 4, 1, 2)[..., None]
    return y.reshape(r, m, q, h, p), S_in[:, m].reshape(r, h, p, n)


def _scan(y, x, dt, A, B, C, D, z, S, t0, t1, chunk_size, cd):
    """Scans rows of tokens [t0, t1) of every batch row, in groups of full chunks (and the last, shorter
    chunk on its own); writes y; returns the state."""
    r, _, h, p = x.shape
    per_chunk = 3 * r * h * chunk_size * chunk_size * torch.finfo(cd).bits // 8  # seg, its exp, M
    budget = CHUNKED_CONFIG["group_bytes"]
    group = max(1, budget.get(x.device.type, budget["cpu"]) // per_chunk)
    c0 = t0
    while c0 < t1:
        m = max(1, min(group, (t1 - c0) // chunk_size))  # full chunks, or the short last one
        c1 = min(c0 + m * chunk_size, t1)
        q = min(chunk_size, c1 - c0)
        xc, dtc, Bc, Cc = (t[:, c0:c1].to(cd).reshape(r, m, q, *t.shape[2:]) for t in (x, dt, B, C))
        yc, S = _chunks(xc, dtc, A, Bc, Cc, S)
        if D is not None:
            yc = yc + (D[:, None] if D.dim() == 1 else D) * xc
        if z is not None:
            yc = yc * F.silu(z[:, c0:c1].to(cd).reshape(r, m, q, h, p))
        y[:, c0:c1] = yc.reshape(r, c1 - c0, h, p).to(y.dtype)
        c0 = c1
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
