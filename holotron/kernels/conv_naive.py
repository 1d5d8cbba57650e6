"""The PyTorch twins of Mamba2's causal depthwise conv: over a sequence (``conv_seq`` in
``holotron/kernels/__init__.py``; Triton: ``holotron/kernels/conv_seq_triton.py``) and for one decode token
(``conv_step``; Triton: ``holotron/kernels/conv_step_triton.py``): the ground truth the kernels are tested
against, and the path of training (autograd) and of the CPU."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

__all__ = ["CONV_CONFIG", "conv_seq_naive", "conv_step_naive"]

# shift: over a sequence without a window (training, a first chunk), the conv as K shifted multiply-adds on the
# token-major input instead of F.conv1d (a grouped conv over the channel-major copy, whose backward PyTorch
# computes with its depthwise-convolution kernels): the same function, whose backward is elementwise products and
# sums over tokens. Off until timed on a GPU (dev/probes/conv_train.py); HOLOTRON_CONV_SHIFT=1 turns it on (a
# training job's A/B).
CONV_CONFIG = {"shift": os.environ.get("HOLOTRON_CONV_SHIFT", "0") not in ("", "0")}


def conv_seq_naive(x: torch.Tensor, conv: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                   counts: torch.Tensor | None = None) -> torch.Tensor:
    """x (b, T, c) token-major; ``conv`` (b, c, K): the last K inputs before x (its last K - 1 enter the
    conv), updated in place to the last K real inputs; None: zeros before x, nothing kept. ``counts`` (b,):
    row i's real tokens are its first counts[i], the rest are pads, read as zeros (None: all T). Returns
    silu(causal depthwise conv(x) + bias) (b, T, c) in x's dtype, the conv in weight's dtype. weight (c, K)."""
    b, t, c = x.shape
    K = weight.shape[-1]
    if conv is None and CONV_CONFIG["shift"]:
        return _shifted(x, weight, bias, counts)
    xt = x.transpose(1, 2).to(weight.dtype)                            # (b, c, T)
    if counts is not None:
        xt = xt * (torch.arange(t, device=x.device)[None, :] < counts[:, None]).to(xt.dtype)[:, None, :]
    prev = conv[:, :, 1:] if conv is not None else xt.new_zeros(b, c, K - 1)
    out = F.conv1d(torch.cat([prev, xt], dim=2), weight.reshape(c, 1, K), bias, groups=c)  # (b, c, T)
    if conv is not None:
        full = torch.cat([conv, xt.to(conv.dtype)], dim=2)             # (b, c, K + T)
        if counts is None:
            conv.copy_(full[:, :, -K:])
        else:  # the last K real inputs: positions r .. r + K - 1 of `full`, r = the row's real tokens
            idx = counts[:, None] + torch.arange(K, device=x.device)
            conv.copy_(full.gather(2, idx[:, None, :].expand(b, c, K)))
    return F.silu(out).transpose(1, 2).to(x.dtype)


def _shifted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, counts: torch.Tensor | None
             ) -> torch.Tensor:
    """``conv_seq_naive`` without a window, token-major: out[t] = bias + sum_k weight[:, k] x[t - K + 1 + k]."""
    b, t, c = x.shape
    K = weight.shape[-1]
    xw = x.to(weight.dtype)
    if counts is not None:
        xw = xw * (torch.arange(t, device=x.device)[None, :] < counts[:, None]).to(xw.dtype)[:, :, None]
    full = torch.cat([xw.new_zeros(b, K - 1, c), xw], dim=1)           # (b, K - 1 + T, c)
    out = full[:, 0:t] * weight[:, 0]
    for k in range(1, K):
        out = out + full[:, k:k + t] * weight[:, k]
    if bias is not None:
        out = out + bias
    return F.silu(out).to(x.dtype)


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
