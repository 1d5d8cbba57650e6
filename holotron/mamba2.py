"""The Mamba2 mixer of Nemotron-H (docs/architecture.md, section 2).

    zxbcdt = in_proj(u)                          (B, T, d_inner | conv_dim | H)
    z, xBC, dt = split(zxbcdt)                   xBC = x (H*P) | B (G*N) | C (G*N)
    xBC = silu(causal_depthwise_conv1d(xBC))     kernel K, bias; decode keeps the last K inputs
    dt  = softplus(dt + dt_bias)                 fp32, clamped only if time_step_limit says so
    A   = -exp(A_log)                            fp32
    y, S = ssd_scan(x, dt, A, B, C, D)           prefill (holotron.kernels), ssd_step for one token
    y   = GatedRMSNorm(y, z)                     norm after the gate, per group of d_inner / G channels
    out = out_proj(y)

``step`` is the one-token decode (``HybridLM.step``, and ``forward`` of one unpadded token with a state):
in_proj (with the block's RMSNorm fused in, ``decode_ops.norm_linear``), then one op (``mamba_step`` below,
registered as ``holotron::mamba_step`` so that a ``torch.compile``d step keeps it whole) for the conv window
(``kernels.conv_step``) and the SSD step with dt_bias / softplus / clamp, D and the silu(z) gate fused
(``kernels.ssd_step``), then out_proj with the gated norm's normalisation and the block's residual fused in
(``decode_ops.linear_residual``). ``A = -exp(A_log)`` is computed once per version of ``A_log`` (``neg_A``).

Padding (``mask`` False): a masked token leaves the state as if it never existed: its dt is 0
(decay 1, no input) and its x is 0, and the conv sees each row's real tokens only (they are moved
together before the convolution, so the conv window is taken from real tokens).
"""

from __future__ import annotations

import math
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .decode_ops import group_normed, kernels_ok, linear_residual, norm_linear
from .layers import GatedRMSNorm
from .state import MambaState, Positions

__all__ = ["Mamba2Mixer", "mamba_step", "neg_A"]

# The fused prefill (HOLOTRON_FUSED_PREFILL=0 turns it off): a chunk of tokens in 16 bits on CUDA takes the conv
# as one Triton kernel (kernels.conv_seq), dt's bias and softplus and the gate inside the scan, and the group norm
# as one kernel (decode_ops.group_normed): fewer kernels per Mamba layer. On by default since it was timed in the
# engine's CUDA graphs on the H200 (2026-12-05, docs/benchmarks.md "Agents at concurrency, second run"): 100
# one-tile agents 9,664 against 8,565 total tok/s, their prefill 13.4 against 17.9 s; eagerly (no graphs) it was
# 1-2% faster on 8,000-token chunks and slower on 16-token ones, where the host's launches dominate.
FUSED_PREFILL = os.environ.get("HOLOTRON_FUSED_PREFILL", "1") not in ("", "0", "off", "false")

# id(A_log) -> (a weak reference to that very tensor, its (storage, device, version), -exp(A_log));
# an entry leaves with its tensor (the weakref's callback), so a later tensor reusing the id never hits it
_A_cache: dict[int, tuple[weakref.ref, tuple, torch.Tensor]] = {}


def neg_A(A_log: torch.Tensor) -> torch.Tensor:
    """-exp(A_log) in fp32, recomputed only when A_log changes (its storage, device or version); always
    fresh when autograd records it (training)."""
    if A_log.requires_grad and torch.is_grad_enabled():
        return -torch.exp(A_log.float())
    try:
        key = (A_log.data_ptr(), A_log.device, A_log._version)
    except RuntimeError:  # an inference tensor has no version counter: no caching
        return -torch.exp(A_log.float())
    hit = _A_cache.get(id(A_log))
    if hit is None or hit[0]() is not A_log or hit[1] != key:
        ref = weakref.ref(A_log, lambda _, i=id(A_log): _A_cache.pop(i, None))
        hit = (ref, key, -torch.exp(A_log.float()))
        _A_cache[id(A_log)] = hit
    return hit[2]


@torch.library.custom_op("holotron::mamba_step", mutates_args=("conv_state", "ssm_state"))
def mamba_step(xBC: torch.Tensor, dt: torch.Tensor, z: torch.Tensor, conv_state: torch.Tensor,
               ssm_state: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
               A_log: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, dt_lo: float, dt_hi: float,
               n_groups: int, active: torch.Tensor | None = None) -> torch.Tensor:
    """One decode token after in_proj: xBC (b, conv_dim), dt (b, H) raw, z (b, H*P); conv_state and
    ssm_state updated in place. Returns (S C + D x) * silu(z), (b, H*P), before the gated norm's norm.
    ``active`` (b,): rows where it is 0 write neither state (the kernels skip their stores)."""
    b = xBC.shape[0]
    _, H, P, N = ssm_state.shape
    xc = kernels.conv_step(conv_state, xBC, conv_weight, conv_bias, active=active)
    x, B, C = xc.split([H * P, n_groups * N, n_groups * N], dim=-1)
    y = kernels.ssd_step(ssm_state, x.reshape(b, H, P), dt, neg_A(A_log), B.reshape(b, n_groups, N),
                         C.reshape(b, n_groups, N), D=D, z=z.reshape(b, H, P), dt_bias=dt_bias, dt_softplus=True,
                         dt_limit=(dt_lo, dt_hi), active=active)
    return y.reshape(b, H * P)


@mamba_step.register_fake
def _(xBC, dt, z, conv_state, ssm_state, conv_weight, conv_bias, A_log, D, dt_bias, dt_lo, dt_hi, n_groups,
      active=None):
    return z.new_empty(z.shape[0], ssm_state.shape[1] * ssm_state.shape[2])


class Mamba2Mixer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, head_dim: int, d_state: int, n_groups: int,
                 d_conv: int = 4, conv_bias: bool = True, chunk_size: int = 128, eps: float = 1e-5,
                 dt_limit: tuple[float, float] = (0.0, math.inf)):
        super().__init__()
        self.n_heads, self.head_dim, self.d_state, self.n_groups = n_heads, head_dim, d_state, n_groups  # H, P, N, G
        self.d_conv, self.chunk_size, self.dt_limit = d_conv, chunk_size, tuple(dt_limit)           # K
        self.d_inner = n_heads * head_dim
        self.conv_dim = self.d_inner + 2 * n_groups * d_state
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + n_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, bias=conv_bias)
        # per-head SSM parameters; the model keeps these three in fp32 (see HybridLM.keep_fp32)
        self.dt_bias = nn.Parameter(torch.zeros(n_heads))
        self.A_log = nn.Parameter(torch.zeros(n_heads))
        self.D = nn.Parameter(torch.ones(n_heads))
        self.norm = GatedRMSNorm(self.d_inner, groups=n_groups, eps=eps)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def new_state(self, batch_size: int, ssm_dtype: torch.dtype = torch.float32, zero: bool = True) -> MambaState:
        w = self.conv1d.weight
        new = torch.zeros if zero else torch.empty
        return MambaState(
            conv=new(batch_size, self.conv_dim, self.d_conv, device=w.device, dtype=w.dtype),
            ssm=new(batch_size, self.n_heads, self.head_dim, self.d_state, device=w.device, dtype=ssm_dtype),
        )

    def _conv(self, xBC: torch.Tensor, state: MambaState | None, mask: torch.Tensor | None,
              pads_after: bool = False, fused: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """silu(causal depthwise conv) over (B, T, conv_dim) (``kernels.conv_seq``: its Triton kernel when
        ``fused``, else the PyTorch twin); reads and updates the window in ``state``. ``mask`` (B, T): False at
        pads, which the conv reads as zeros and leaves out of the window; ``pads_after``: every row's pads follow
        its tokens, else the real tokens are moved first (stable) and the outputs moved back, so the conv sees
        each row's real tokens in a row. ``rows``: ``state`` holds more rows and the batch's are ``rows``."""
        b, t, c = xBC.shape
        order = counts = None
        if mask is not None:
            if not pads_after:
                order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices  # (B, T)
                xBC = xBC.gather(1, order[:, :, None].expand(b, t, c))
            counts = mask.sum(1)
        out = kernels.conv_seq(xBC, None if state is None else state.conv, self.conv1d.weight, self.conv1d.bias,
                               counts, backend=None if fused else "naive", rows=rows)
        if order is not None:
            out = torch.empty_like(out).scatter_(1, order[:, :, None].expand(b, t, c), out)
        return out

    def step(self, u: torch.Tensor, state: MambaState, where: Positions | None = None, norm: nn.Module | None = None
             ) -> torch.Tensor:
        """One token per row: u (B, 1, D) -> (B, 1, D); ``state`` updated in place (not on rows where
        ``where.active`` is 0). Static shapes, no host sync. Without ``norm``, u is the mixer's input and the
        mixer's output is returned; with the block's ``norm``, u is the residual stream and the block's output
        ``u + mixer(norm(u))`` is returned (the norm and the residual fused into the projections,
        holotron/decode_ops.py)."""
        b = u.shape[0]
        zxbcdt = norm_linear(u[:, 0], norm, self.in_proj)
        z, xBC, dt = zxbcdt.split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
        y = mamba_step(xBC, dt, z, state.conv, state.ssm, self.conv1d.weight, self.conv1d.bias, self.A_log,
                       self.D, self.dt_bias, float(self.dt_limit[0]), float(self.dt_limit[1]), self.n_groups,
                       None if where is None else where.active)
        return linear_residual(y.view(b, 1, self.d_inner), self.out_proj, None if norm is None else u, self.norm)

    def forward(self, u: torch.Tensor, state: MambaState | None = None, where: Positions | None = None) -> torch.Tensor:
        """u (B, T, D) -> (B, T, D). ``state`` is updated in place; ``where.mask`` (B, T) bool, False at pads.
        With ``where.rows`` (``HybridLM.extend``), ``state`` holds the decode state's rows and the batch's
        rows are its ``where.rows``."""
        if where is not None and where.static:  # rows given on the device only
            return self.out_proj(self._chunk_static(self.in_proj(u), state, where))
        if where is not None and where.rows is not None:
            part = state.take(where.rows, where.row_index)
            out = self.forward(u, part, Positions(mask=where.mask, pads_after=where.pads_after))
            state.put(where.rows, part, where.row_index)
            return out
        mask = None if where is None else where.mask
        b, t, _ = u.shape
        if state is not None and t == 1 and mask is None:
            return self.step(u, state)
        y = self._chunk(self.in_proj(u), state, mask, where is not None and where.pads_after)
        return self.out_proj(y)

    def _chunk(self, zxbcdt: torch.Tensor, state: MambaState | None, mask: torch.Tensor | None,
               pads_after: bool, out: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Everything between in_proj and out_proj for a chunk of tokens: zxbcdt (B, T, in_proj features)
        -> the gated norm's output (B, T, d_inner), written into ``out`` when given (B*T rows of a mixed pass's
        buffer); ``state`` (B rows, or its rows ``rows`` (B,) when given: read and written there by the conv
        and scan kernels, no gathered copies) read and updated in place."""
        b, t, _ = zxbcdt.shape
        H, P, N, G = self.n_heads, self.head_dim, self.d_state, self.n_groups
        # FUSED_PREFILL, inference in 16 bits: the conv's kernel, the gate inside the scan, the group norm's kernel
        fused = FUSED_PREFILL and zxbcdt.dtype in (torch.bfloat16, torch.float16) \
            and kernels_ok(zxbcdt, self.norm.weight, self.D)
        z, xBC, dt = zxbcdt.split([self.d_inner, self.conv_dim, H], dim=-1)
        xBC = self._conv(xBC, state, mask, pads_after, fused, rows)
        x, B, C = xBC.split([self.d_inner, G * N, G * N], dim=-1)
        lo, hi = self.dt_limit
        dt_kw = {}
        if fused and lo == 0.0:  # dt_bias and softplus inside the scan; a pad's dt is -inf there: softplus 0
            dt = dt if mask is None else dt.masked_fill(~mask[..., None], float("-inf"))
            dt_kw = dict(dt_bias=self.dt_bias, dt_softplus=True, dt_limit=(lo, hi))
        else:
            dt = F.softplus(dt.float() + self.dt_bias.float())             # (B, T, H) fp32
            if lo > 0.0 or hi < math.inf:
                dt = dt.clamp(lo, hi)
            if mask is not None:
                dt = dt * mask[..., None]
                x = x * mask[..., None].to(x.dtype)
        A = neg_A(self.A_log)                                               # (H,) fp32

        scan_in = (x.reshape(b, t, H, P), dt, A, B.reshape(b, t, G, N), C.reshape(b, t, G, N))
        scan_kw = dict(D=self.D, z=z.reshape(b, t, H, P) if fused else None, chunk_size=self.chunk_size, **dt_kw)
        if rows is not None:
            y = kernels.ssd_scan_rows(*scan_in, state.ssm, rows, **scan_kw)
        else:
            y, final = kernels.ssd_scan(*scan_in, initial_state=None if state is None else state.ssm.float(),
                                        **scan_kw)
            if state is not None:
                state.ssm.copy_(final)
        if fused:
            return group_normed(y.reshape(b, t, self.d_inner), self.norm,
                                None if out is None else out.view(b, t, self.d_inner))
        y = self.norm(y.reshape(b, t, self.d_inner), z)
        return y if out is None else out.view(b, t, self.d_inner).copy_(y)

    def _chunk_static(self, zxbcdt: torch.Tensor, state: MambaState, where: Positions,
                      out: torch.Tensor | None = None) -> torch.Tensor:
        """``_chunk`` of a right-padded chunk (b, T, features) of the rows ``where.row_index`` (device tensors,
        distinct; ``HybridLM.extend_static`` / ``mixed``): their conv windows and SSM states read and written at
        those rows by the kernels (a row of pads only is left as it was: dt = 0 there)."""
        return self._chunk(zxbcdt, state, where.mask, True, out, rows=where.row_index)

    def mixed(self, u: torch.Tensor, state: MambaState, where: Positions, n: int) -> torch.Tensor:
        """``HybridLM.mixed``: u (n + b*T, D), the mixer's input (the block's norm applied) for one decode
        token of each of rows [0, n) of ``state`` and then a right-padded chunk (b, T) of new tokens of
        rows ``where.row_index``. in_proj and out_proj run once over all of it (one read of their weights); the
        decode tokens go through the decode step's conv window and SSD step (rows whose ``where.active`` is 0
        write nothing), the chunk through the conv and the scan. Returns (n + b*T, D)."""
        zxbcdt = self.in_proj(u)
        # both parts' gated norms write their rows of one buffer: out_proj reads it without a concatenation
        normed = zxbcdt.new_empty(zxbcdt.shape[0], self.d_inner)
        if n:
            z, xBC, dt = zxbcdt[:n].split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
            y = mamba_step(xBC, dt, z, state.conv[:n], state.ssm[:n], self.conv1d.weight, self.conv1d.bias,
                           self.A_log, self.D, self.dt_bias, float(self.dt_limit[0]), float(self.dt_limit[1]),
                           self.n_groups, where.active)
            group_normed(y, self.norm, normed[:n])   # one kernel where the decode step's kernels run
        b = where.row_index.shape[0]
        self._chunk_static(zxbcdt[n:].view(b, -1, zxbcdt.shape[-1]), state, where, normed[n:])
        return self.out_proj(normed)
