"""The optimiser and its schedule: AdamW with weight decay on the weight matrices only (``make_optimizer``),
the learning rate at a point of the run (``lr_at``: linear warm-up, then a cosine decay or a
warm-up-stable-decay plateau and cool-down) and that point for a run spread over several jobs
(``schedule_progress``)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["make_optimizer", "lr_at", "schedule_progress", "SCHEDULES"]

SCHEDULES = ("cosine", "wsd")


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


def lr_at(progress: float, lr: float, warmup: float, min_ratio: float = 0.1, schedule: str = "cosine",
          cooldown: float = 0.2) -> float:
    """Learning rate at ``progress`` in [0, 1] of the run (clamped): linear warm-up over the first ``warmup``
    fraction (from lr / 100), then by ``schedule``:

    "cosine": cosine decay from ``lr`` to ``min_ratio * lr`` at progress 1;
    "wsd" (warm-up, stable, decay): ``lr`` held, then a linear decay to ``min_ratio * lr`` over the last
    ``cooldown`` fraction of the run (0: ``lr`` to the end; a cool-down reaching into the warm-up starts
    where the warm-up ends). The plateau does not depend on where the run ends, so a run stretched over
    more jobs (or steps) than planned loses nothing until its cool-down, which is where it ends either way."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if not 0.0 <= cooldown <= 1.0:
        raise ValueError(f"cooldown must be in [0, 1], got {cooldown}")
    progress = min(max(progress, 0.0), 1.0)
    if warmup > 0 and progress < warmup:
        return lr * (0.01 + 0.99 * progress / warmup)
    if schedule == "wsd":
        start = max(warmup, 1.0 - cooldown)  # where the cool-down begins
        if cooldown <= 0 or progress <= start:
            return lr
        t = (progress - start) / max(1e-12, 1.0 - start)
        return lr * (1 - (1 - min_ratio) * t)
    t = (progress - warmup) / max(1e-12, 1.0 - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def schedule_progress(step: int, steps: int, seconds_so_far: float = 0.0, total_seconds: float | None = None) -> float:
    """Where a run stands in its schedule, in [0, 1]: the larger of ``step / steps`` and
    ``seconds_so_far / total_seconds`` (whichever budget runs out first ends the schedule), or the steps
    alone when ``total_seconds`` is None (or not positive).

    For a run spread over several jobs, ``step`` is the global step (a --resume continues it) and
    ``seconds_so_far`` the training seconds of every job so far: the previous jobs' (``elapsed_before``,
    which ``load_training_state`` in holotron/train/checkpoint.py reads from trainer_state.json) plus this
    job's; ``total_seconds`` the whole run's budget, not one job's. A resumed job then continues the
    schedule where the last one stopped instead of starting it again."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    progress = step / steps
    if total_seconds is not None and total_seconds > 0:
        progress = max(progress, seconds_so_far / total_seconds)
    return min(max(progress, 0.0), 1.0)
