"""Small layers shared by the language model (and the projector): RMSNorm, GatedRMSNorm, the relu^2 MLP."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from .decode_ops import linear_residual, norm_linear, relu2, row_rms_norm

__all__ = ["RMSNorm", "GatedRMSNorm", "MLP"]

# HOLOTRON_NORM16 (on by default; =0 turns it off): an RMSNorm of a 16-bit tensor with a weight of its dtype,
# outside autograd, where holotron/decode_ops.py's kernels run, is one Triton row kernel (the decode step's: fp32
# inside, one rounding of the output, the same math as the fp32 path within one rounding) instead of an fp32 copy
# of x, a copy of the weight, torch's fp32 norm and a cast back (the 63 norms of a 12B pass: two copies, the norm
# and a cast each). Measured on an H100 (docs/benchmarks.md, "Fewer kernels in a mixed pass"): +2.1% at 100
# one-tile agents, +1.6% in the serving section's mixed passes; with relu2's kernel, a mixed pass's copies and
# casts went from 3.0 to 1.9 ms.
NORM16 = os.environ.get("HOLOTRON_NORM16", "1") not in ("", "0", "off", "false")


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in fp32 and cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim)
        # x * rsqrt(mean(x^2) + eps) * w; F.rms_norm has a fused CUDA kernel (aten::_fused_rms_norm, torch >= 2.8)
        # and the same composite ops elsewhere
        if NORM16 and x.dtype in (torch.bfloat16, torch.float16) and self.weight.dtype == x.dtype:
            y = row_rms_norm(x, self.weight, self.eps)   # see NORM16 above; None where the kernel does not run
            if y is not None:
                return y
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """Mamba2's output norm, norm *after* the gate, per group of ``dim // groups`` contiguous channels:

        v = y * silu(z);  v_g <- v_g / sqrt(mean(v_g^2) + eps) for each group g;  out = w * v
    All in fp32, cast back to the dtype of ``y``.
    """

    def __init__(self, dim: int, groups: int = 1, eps: float = 1e-5):
        super().__init__()
        if dim % groups:
            raise ValueError(f"GatedRMSNorm: dim ({dim}) must be a multiple of groups ({groups})")
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # y, z (..., dim)
        return self.normed(y.float() * F.silu(z.float()), y.dtype)

    def normed(self, v: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The norm of an already gated ``v = y * silu(z)`` (the decode step gates inside its kernel)."""
        vg = v.float().unflatten(-1, (self.groups, -1))  # (..., G, dim / G)
        vg = F.rms_norm(vg, (vg.shape[-1],), None, self.eps)
        return (self.weight.float() * vg.flatten(-2)).to(v.dtype if dtype is None else dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, groups={self.groups}, eps={self.eps}"


class MLP(nn.Module):
    """``down(relu(up(x))^2)``: no gate, no bias (Nemotron-H's relu2 MLP). Stateless."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, state=None, pos=None) -> torch.Tensor:  # (B, T, D)
        return self.down_proj(relu2(self.up_proj(x)))

    def mixed(self, u, state=None, where=None, n: int = 0) -> torch.Tensor:  # (N, D): ``HybridLM.mixed``'s tokens
        return self.forward(u)

    def step(self, u, state=None, where=None, norm: nn.Module | None = None) -> torch.Tensor:
        """One token per row, (B, 1, D). Without ``norm`` the MLP's output; with the block's ``norm``, u is the
        residual stream and ``u + mlp(norm(u))`` is returned (norm, relu^2 and residual fused into the two
        projections, holotron/decode_ops.py)."""
        h = norm_linear(u, norm, self.up_proj, act="relu2")
        return linear_residual(h, self.down_proj, None if norm is None else u)
