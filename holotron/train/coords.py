"""Coordinates as tokens: starting embeddings for the number tokens, and which numbers hit a box.

    ids = coordinate_token_ids(processor)                 # holotron/tokenizer.py; None for the "bpe" kind
    init_coordinate_embeddings(model, ids)                # rows of "0" .. "1000" in embeddings and lm_head
    x_lo, x_hi, y_lo, y_hi = coordinate_box_range(box_px, (width, height))

With the "word" tokenizer (holotron/tokenizer.py) a click coordinate k = 0 .. 1000 is one token. Drawn at
random, the 1,001 rows know nothing of order: 624 is as far from 625 as from 3. ``init_coordinate_embeddings``
starts them from Fourier features of k / 1000 (periods of 1000 down to 2 units, sin and cos, plus k / 1000
itself) through a fixed random projection, so neighbouring values start with similar rows, in the input
embedding and in the output head alike. ``coordinate_box_range`` gives the values k that score a hit for a
pixel box, exactly by the scorer's rule (``holotron.grounding.point_in_box``, as ``holotron/eval.py``
calls it), e.g. for a loss that accepts any value inside the target.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Sequence

import torch
from torch import nn

from ..grounding import Box, Point, point_in_box

__all__ = ["COORDINATE_PERIODS", "coordinate_features", "init_coordinate_embeddings", "coordinate_box_range"]

N_VALUES = 1001  # k = 0 .. 1000: holotron.grounding's model space
# periods (in units of k) of the sin / cos features: coarse position down to the last digit's parity
COORDINATE_PERIODS = (1000, 500, 250, 100, 50, 20, 10, 5, 2)


def coordinate_features(periods: Sequence[float] = COORDINATE_PERIODS) -> torch.Tensor:
    """(1001, 2 * len(periods) + 1) float64: for k = 0 .. 1000, sin and cos of 2 pi k / P for each period P,
    then k / 1000. Two values' features agree the more, the more of the periods they are close in."""
    k = torch.arange(N_VALUES, dtype=torch.float64)
    cols = []
    for p in periods:
        angle = 2 * math.pi * k / p
        cols += [torch.sin(angle), torch.cos(angle)]
    cols.append(k / (N_VALUES - 1))
    return torch.stack(cols, dim=1)


def _matrices(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The input embedding's weight (V, D) and the lm_head's (V, D), or None when they are one tensor (tied)."""
    lm = getattr(model, "language_model", model)
    backbone = getattr(lm, "backbone", None)
    emb = getattr(backbone, "embeddings", None)
    head = getattr(lm, "lm_head", None)
    if not isinstance(emb, nn.Embedding) or not isinstance(head, nn.Linear):
        raise TypeError(f"expected a holotron Holotron / HybridLM (language_model.backbone.embeddings and "
                        f"language_model.lm_head), got {type(model).__name__}")
    tied = head.weight is emb.weight or (head.weight.data_ptr() == emb.weight.data_ptr()
                                         and head.weight.shape == emb.weight.shape)
    return emb.weight, None if tied else head.weight


def _other_rows_norm(weight: torch.Tensor, ids: torch.Tensor) -> float:
    keep = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    keep[ids] = False
    rows = weight[keep].float()
    if rows.shape[0] == 0:
        raise ValueError("every row is a number token: no other row to take the norm from; pass scale=")
    return float(rows.norm(dim=1).mean())


@torch.no_grad()
def init_coordinate_embeddings(model: nn.Module, ids: Sequence[int], seed: int = 0,
                               scale: float | None = None) -> nn.Module:
    """Overwrite the input-embedding and lm_head rows of the number tokens ``ids`` (index k: the id of "k",
    as ``holotron.tokenizer.coordinate_token_ids`` returns them) with ``coordinate_features`` through a
    random projection drawn from ``seed``, so close values start with close rows (cosine similarity).

    Every written row has norm ``scale``; None: the mean norm of that matrix's other rows (each matrix its
    own), so the new rows neither dominate nor vanish. A tied lm_head (the same tensor as the embedding)
    is written once. The other rows are left untouched. Returns ``model``."""
    ids = [int(i) for i in ids]
    if len(ids) != N_VALUES or len(set(ids)) != N_VALUES:
        raise ValueError(f"ids must hold {N_VALUES} distinct token ids (those of \"0\" .. \"1000\"), "
                         f"got {len(ids)} ({len(set(ids))} distinct)")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be a positive row norm or None, got {scale}")
    emb, head = _matrices(model)
    if min(ids) < 0 or max(ids) >= emb.shape[0]:
        raise ValueError(f"token ids must lie in 0 .. {emb.shape[0] - 1} (the model's vocabulary), got "
                         f"{min(ids)} .. {max(ids)}: was the model built for this tokenizer?")
    feats = coordinate_features()
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(feats.shape[1], emb.shape[1], generator=gen, dtype=torch.float64)
    rows = feats @ proj
    rows = rows / rows.norm(dim=1, keepdim=True)
    for weight in (emb,) if head is None else (emb, head):
        index = torch.tensor(ids, dtype=torch.long, device=weight.device)
        norm = scale if scale is not None else _other_rows_norm(weight, index)
        weight.index_copy_(0, index, (rows * norm).to(weight.dtype).to(weight.device))
    return model


# ----------------------------------------------------------------------------------------------
# which values k hit a box
# ----------------------------------------------------------------------------------------------

RULES = ("score", "answer")


def _axis_range(lo_edge: float, hi_edge: float, size: float, hit: Callable[[int], bool]) -> tuple[int, int]:
    """[lo, hi], the values k = 0 .. 1000 on one axis for which ``hit(k)``, a predicate true on one interval
    of k (the pixel position k * size / 1000 grows with k); lo = hi + 1 when none does."""
    # the value nearest the middle of the box is in the interval whenever any is; +-1 absorbs float rounding
    mid = Fraction(N_VALUES - 1) * (Fraction(lo_edge) + Fraction(hi_edge)) / (2 * Fraction(size))
    centre = min(max(round(mid), 0), N_VALUES - 1)
    seed = next((k for k in (centre, centre - 1, centre + 1) if 0 <= k < N_VALUES and hit(k)), None)
    if seed is None:
        return centre + 1, centre
    lo = min(max(math.ceil(Fraction(N_VALUES - 1) * Fraction(lo_edge) / Fraction(size)), 0), seed)
    if hit(lo):
        while lo > 0 and hit(lo - 1):
            lo -= 1
    else:
        while not hit(lo):
            lo += 1
    hi = max(min(math.floor(Fraction(N_VALUES - 1) * Fraction(hi_edge) / Fraction(size)), N_VALUES - 1), seed)
    if hit(hi):
        while hi < N_VALUES - 1 and hit(hi + 1):
            hi += 1
    else:
        while not hit(hi):
            hi -= 1
    return lo, hi


def coordinate_box_range(box_px: Box | Sequence[float], size: tuple[float, float],
                         rule: str = "score") -> tuple[int, int, int, int]:
    """(x_lo, x_hi, y_lo, y_hi): the integer model-space values k (0 .. 1000) whose click lands in a pixel
    box on each axis, bounds included; a click (x, y) lands when x_lo <= x <= x_hi and y_lo <= y <= y_hi.
    An axis no value lands on has lo = hi + 1.

    box_px: a pixel ``holotron.grounding.Box`` or four numbers x0, y0, x1, y1 in pixels; size: the image's
        (width, height) in pixels; the value k stands for pixel k * size / 1000 (``grounding.to_pixels``).
    rule: "score" (the default): exactly the scorer's rule, ``grounding.point_in_box`` as
        ``holotron/eval.py`` calls it: x0 <= px <= x1 with the edges included (and its 1e-9 relative
        slack); "answer": the stricter check of the training answers (``holotron.data.instructions.
        click_point``, x1 / y1 exclusive: x0 <= px <= x1 - 1), a sub-range of "score"'s."""
    box = box_px if isinstance(box_px, Box) else Box.from_values(box_px, "xyxy", "pixel")
    if box.space != "pixel":
        raise ValueError(f"box_px must be in pixels, got a {box.space!r} box")
    width, height = (float(v) for v in size)
    if not (width > 0 and height > 0):
        raise ValueError(f"size must be a positive (width, height), got {tuple(size)}")
    if rule == "score":
        # one axis at a time through the scorer itself: the other axis sits at 0 in a box [0, 0] of a 1-pixel image
        def x_hit(k: int) -> bool:
            return point_in_box(Point(k, 0), Box(box.x0, 0, box.x1, 0), width, 1)

        def y_hit(k: int) -> bool:
            return point_in_box(Point(0, k), Box(0, box.y0, 0, box.y1), 1, height)
    elif rule == "answer":
        def x_hit(k: int) -> bool:
            return box.x0 <= k * width / 1000 <= box.x1 - 1

        def y_hit(k: int) -> bool:
            return box.y0 <= k * height / 1000 <= box.y1 - 1
    else:
        raise ValueError(f"unknown rule {rule!r}: use one of {', '.join(RULES)}")
    return (*_axis_range(box.x0, box.x1, width, x_hit), *_axis_range(box.y0, box.y1, height, y_hit))
