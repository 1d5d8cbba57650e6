"""The optimiser and its schedule: AdamW with weight decay on the weight matrices only (``make_optimizer``),
linear warm-up then cosine decay (``lr_at``)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["make_optimizer", "lr_at"]


def _no_decay(name: str, p: nn.Parameter) -> bool:
    return (p.dim() < 2 or name.endswith(("A_log", "dt_bias", ".D")) or "embeddings" in name
            or "pos_embed" in name or "cls_token" in name)


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, fused: bool = False) -> torch.optim.AdamW:
    """AdamW (betas 0.9 / 0.95) with weight decay on the weight matrices only: not on norms, biases,
    embeddings, position embeddings, CLS/register tokens or the Mamba constants A_log, D, dt_bias."""
    decay = [p for n, p in model.named_parameters() if not _no_decay(n, p)]
    other = [p for n, p in model.named_parameters() if _no_decay(n, p)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))


def lr_at(progress: float, lr: float, warmup: float, min_ratio: float = 0.1) -> float:
    """Learning rate at ``progress`` in [0, 1] of the run: linear warm-up over the first ``warmup``
    fraction (from lr / 100), then cosine decay from ``lr`` to ``min_ratio * lr`` at progress 1."""
    progress = min(max(progress, 0.0), 1.0)
    if warmup > 0 and progress < warmup:
        return lr * (0.01 + 0.99 * progress / warmup)
    t = (progress - warmup) / max(1e-12, 1.0 - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))
