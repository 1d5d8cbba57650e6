"""The PyTorch twin of the conv-window decode step (``conv_step`` in ``holotron/kernels/__init__.py``;
the Triton kernel is ``holotron/kernels/conv_step_triton.py``), the ground truth it is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["conv_step_naive"]


def conv_step_naive(conv: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None, active: torch.Tensor | None = None) -> torch.Tensor:
    """conv (b, c, K) slides by one in place (x (b, c) enters last); returns silu(sum window * weight
    + bias) (b, c), computed in fp32, in x's dtype. weight (c, K). ``active`` (b,): rows where it is 0
    compute their output but keep their window."""
    window = torch.cat([conv[:, :, 1:], x[:, :, None].to(conv.dtype)], dim=2)
    if active is None:
        conv.copy_(window)
    else:
        conv.copy_(torch.where(active.view(-1, 1, 1) != 0, window, conv))
    acc = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        acc = acc + bias.float()
    return F.silu(acc).to(x.dtype)
