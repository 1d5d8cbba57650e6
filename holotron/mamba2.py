"""The Mamba2 mixer of Nemotron-H (docs/architecture.md, section 2).

    zxbcdt = in_proj(u)                          (B, T, d_inner | conv_dim | H)
    z, xBC, dt = split(zxbcdt)                   xBC = x (H*P) | B (G*N) | C (G*N)
    xBC = silu(causal_depthwise_conv1d(xBC))     kernel K, bias; decode keeps the last K inputs
    dt  = softplus(dt + dt_bias)                 fp32, clamped only if time_step_limit says so
    A   = -exp(A_log)                            fp32
    y, S = ssd_scan(x, dt, A, B, C, D)           prefill (holotron.kernels), ssd_step for one token
    y   = GatedRMSNorm(y, z)                     norm after the gate, per group of d_inner / G channels
    out = out_proj(y)

Padding (``mask`` False): a masked token leaves the state as if it never existed: its dt is 0
(decay 1, no input) and its x is 0, and the conv sees each row's real tokens only (they are moved
together before the convolution, so the conv window is taken from real tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .layers import GatedRMSNorm
from .state import MambaState

__all__ = ["Mamba2Mixer"]


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

    def new_state(self, batch_size: int, ssm_dtype: torch.dtype = torch.float32) -> MambaState:
        w = self.conv1d.weight
        return MambaState(
            conv=torch.zeros(batch_size, self.conv_dim, self.d_conv, device=w.device, dtype=w.dtype),
            ssm=torch.zeros(batch_size, self.n_heads, self.head_dim, self.d_state, device=w.device, dtype=ssm_dtype),
        )

    def _conv(self, xBC: torch.Tensor, state: MambaState | None, mask: torch.Tensor | None) -> torch.Tensor:
        """silu(causal depthwise conv) over (B, T, conv_dim); reads and updates the window in ``state``."""
        b, t, c = xBC.shape
        K = self.d_conv
        xt = xBC.transpose(1, 2).to(self.conv1d.weight.dtype)           # (B, c, T)
        order = None
        if mask is not None:
            # real tokens first (stable), pads after: the conv then sees each row's real tokens in a row
            order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices  # (B, T)
            xt = xt.gather(2, order[:, None, :].expand(b, c, t))
        prev = state.conv[:, :, 1:] if state is not None else xt.new_zeros(b, c, K - 1)  # the last K-1 inputs
        seq = torch.cat([prev, xt], dim=2)                                 # (B, c, K-1+T)
        out = F.conv1d(seq, self.conv1d.weight, self.conv1d.bias, groups=c)  # (B, c, T)
        if state is not None:
            full = torch.cat([state.conv, xt], dim=2)                      # (B, c, K+T)
            if mask is None:
                state.conv.copy_(full[:, :, -K:])
            else:  # the last K real inputs: positions r .. r+K-1 of `full`, r = real tokens in this call
                r = mask.sum(1)
                idx = r[:, None] + torch.arange(K, device=r.device)
                state.conv.copy_(full.gather(2, idx[:, None, :].expand(b, c, K)))
        if order is not None:
            out = torch.empty_like(out).scatter_(2, order[:, None, :].expand(b, c, t), out)
        return F.silu(out).transpose(1, 2).to(xBC.dtype)                   # (B, T, c)

    def forward(self, u: torch.Tensor, state: MambaState | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """u (B, T, D) -> (B, T, D). ``state`` is updated in place; ``mask`` (B, T) bool, False at pads."""
        b, t, _ = u.shape
        H, P, N, G = self.n_heads, self.head_dim, self.d_state, self.n_groups
        z, xBC, dt = self.in_proj(u).split([self.d_inner, self.conv_dim, H], dim=-1)
        if mask is not None:
            xBC = xBC * mask[..., None].to(xBC.dtype)
        xBC = self._conv(xBC, state, mask)
        x, B, C = xBC.split([self.d_inner, G * N, G * N], dim=-1)

        dt = F.softplus(dt.float() + self.dt_bias.float())                 # (B, T, H) fp32
        lo, hi = self.dt_limit
        if lo > 0.0 or hi < math.inf:
            dt = dt.clamp(lo, hi)
        if mask is not None:
            dt = dt * mask[..., None]
            x = x * mask[..., None].to(x.dtype)
        A = -torch.exp(self.A_log.float())                                  # (H,) fp32

        if state is not None and t == 1:
            y = kernels.ssd_step(state.ssm, x.view(b, H, P), dt[:, 0], A, B.view(b, G, N), C.view(b, G, N), D=self.D)
        else:
            y, final = kernels.ssd_scan(x.reshape(b, t, H, P), dt, A, B.reshape(b, t, G, N), C.reshape(b, t, G, N),
                                        D=self.D, initial_state=None if state is None else state.ssm,
                                        chunk_size=self.chunk_size)
            if state is not None:
                state.ssm.copy_(final)
        y = self.norm(y.reshape(b, t, self.d_inner), z)
        return self.out_proj(y)
