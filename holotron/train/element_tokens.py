"""Which image tokens show an element of a synthetic screen (the data workers' side of the matching targets,
holotron/train/matching.py, and of the pointer's positives, holotron/train/batches.py): a token shows a box
when one of its SUB x SUB sub-points (spread over the screen pixels its cell covers) lies in it."""

from __future__ import annotations

import math

import numpy as np
import torch

from .targets import IGNORE, pointer_tokens

__all__ = ["SUB", "token_cell", "element_tokens", "element_core_tokens"]


def _label_texts(sample, element, row: bool = True) -> list:
    """The visible texts that spell ``element``'s label (case-insensitively): its caption or its own text. For a
    control of a table row (``Element.row``; its label repeats on every row) only those inside its box, and (with
    ``row``) the text of the row's identifier, which its instructions name: a text outside the box that belongs
    to the question, as a field's label does."""
    want = element.label.strip().lower()
    key = getattr(element, "row", None)
    if key is None:
        return [t for t in sample.texts if want and t.text.strip().lower() == want]
    key, b = key.strip().lower(), element.box
    return [t for t in sample.texts if (row and key and t.text.strip().lower() == key)
            or (want and t.text.strip().lower() == want and b[0] <= t.box[0] and b[1] <= t.box[1]
                and t.box[2] <= b[2] and t.box[3] <= b[3])]


SUB = 4  # sub-points per token side: a token "shows" a box when one of its SUB x SUB points lies in it


def token_cell(size: tuple[int, int], vision, grid: tuple[int, int] | None = None) -> tuple[float, float]:
    """The screen px (width, height) one image token of a tile covers: the screen over the tiling grid's
    tokens (``closest_grid``'s grid, or ``grid``)."""
    from ..vision.preprocess import closest_grid

    w, h = size
    cols, rows = grid or closest_grid(w, h, vision.image_size, vision.max_num_tiles)
    g = math.isqrt(vision.tokens_per_tile)
    return w / (cols * g), h / (rows * g)


def _sub_points(positions: torch.Tensor, size, cell) -> tuple[np.ndarray, np.ndarray]:
    """(n, SUB * SUB) pixel x and y of points spread over each token's cell, the points nearest the centre
    first (so a per-token pick of the first hit is the hit nearest the centre)."""
    w, h = size
    off = ((np.arange(SUB) + 0.5) / SUB - 0.5)
    oy, ox = np.meshgrid(off, off, indexing="ij")
    order = np.argsort((ox**2 + oy**2).reshape(-1), kind="stable")
    ox, oy = ox.reshape(-1)[order] * cell[0], oy.reshape(-1)[order] * cell[1]
    px = positions[:, 0].double().numpy()[:, None] * w + ox[None, :]
    py = positions[:, 1].double().numpy()[:, None] * h + oy[None, :]
    return px, py


def _first_hit(values: np.ndarray, invalid: int) -> np.ndarray:
    """Per row of ``values`` (n, k), the first entry that is not ``invalid`` (else ``invalid``)."""
    ok = values != invalid
    first = ok.argmax(axis=1)
    return np.where(ok.any(axis=1), values[np.arange(len(values)), first], invalid)


def _tokens_in(boxes, points, tile: torch.Tensor) -> torch.Tensor:
    """The tokens (bool, n) one of whose sub-points lies in one of ``boxes`` (x1 / y1 exclusive). Only the
    tokens whose sub-points' bounding box meets a box are tested point by point (every token's sub-points
    share one pattern of offsets, so its extreme columns bound them): a box covers a few of a screen's
    thousands of tokens, and this runs for every element of every screen in the data workers."""
    px, py = points
    if not len(boxes) or not px.shape[0]:
        return torch.zeros_like(tile)
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    x0, x1 = px[:, px[0].argmin()], px[:, px[0].argmax()]
    y0, y1 = py[:, py[0].argmin()], py[:, py[0].argmax()]
    near = np.nonzero(((x1[:, None] >= b[:, 0]) & (x0[:, None] < b[:, 2])
                       & (y1[:, None] >= b[:, 1]) & (y0[:, None] < b[:, 3])).any(axis=1))[0]
    sx, sy = px[near][..., None], py[near][..., None]                       # (m, SUB * SUB, 1)
    hit = ((sx >= b[:, 0]) & (sx < b[:, 2]) & (sy >= b[:, 1]) & (sy < b[:, 3])).any(axis=(1, 2))
    out = np.zeros(px.shape[0], dtype=bool)
    out[near[hit]] = True
    return torch.from_numpy(out) & tile


def element_tokens(sample, element, positions: torch.Tensor, classes: torch.Tensor,
                   cell: tuple[float, float], points=None, labels: bool = True) -> torch.Tensor:
    """The image tokens (indices, thumbnail left out) that show ``element``'s box or a text that spells its
    label (a sub-point of the token's ``cell`` inside; ``token_cell``); if none, the token nearest to the
    element's centre. ``positions`` / ``classes``: ``image_token_targets``' (the thumbnail's classes are
    -100); ``points``: ``_sub_points`` when the caller has them; ``labels`` False: the box alone (a label
    outside it, a field's or a checkbox's, left out)."""
    w, h = sample.size
    tile = classes != IGNORE
    points = points if points is not None else _sub_points(positions, sample.size, cell)
    texts = _label_texts(sample, element) if labels else []
    own = _tokens_in([element.box] + [t.box for t in texts], points, tile)
    if not bool(own.any()):
        cx, cy = (element.box[0] + element.box[2]) / 2, (element.box[1] + element.box[3]) / 2
        d = ((positions[:, 0] * w - cx) ** 2 + (positions[:, 1] * h - cy) ** 2).masked_fill(~tile, float("inf"))
        own[d.argmin()] = True
    return own.nonzero().squeeze(1)


def element_core_tokens(sample, element, positions: torch.Tensor, classes: torch.Tensor,
                        labels: bool = True) -> torch.Tensor:
    """Like ``element_tokens``, but a token counts only when its own centre lies in ``element``'s box or in a
    text that spells its label (``targets.pointer_tokens`` of each box: a box too small to hold a token centre
    gives the token nearest its centre). So a token whose own position an answer copies lies in the box: with
    ``element_tokens``' rule a token one sub-point of which touches a one-row-tall box is a positive, and its
    own row may lie a whole row outside the box (``--pointer-core``; dev/LOG.md, 2026-12-04, third v2 run).
    ``labels`` False: the box alone."""
    boxes = [element.box] + ([t.box for t in _label_texts(sample, element)] if labels else [])
    return torch.unique(torch.cat([pointer_tokens(b, sample.size, positions, classes) for b in boxes]))
