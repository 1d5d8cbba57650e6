"""The reading stage (``--stage read``): the vision tower, the projector and the heads alone, on tile mosaics of
text crops (``reading_tile``, streamed by ``ReadingBatches``) shown at the scales the tiling shows screens
(``tiling_scale``), with the text-class and character losses on the projector output (``reading_loss_fn``)."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import torch
import torch.nn.functional as F

from ..model import Holotron
from ..vision.config import VisionConfig
from ..vision.preprocess import closest_grid
from .heads import AuxHeads
from .targets import AUX_CLASSES, IGNORE, char_classes_at, char_table, class_boxes, text_classes_at
from .tiles import normalize_tiles

__all__ = ["tiling_scale", "FIT_JITTER", "reading_tile", "ReadingBatches", "reading_loss_fn"]


def tiling_scale(size: tuple[int, int], cfg: VisionConfig) -> tuple[float, float]:
    """The scales (x, y) at which the preprocessing's tiling shows a screen of ``size`` px to the vision
    tower: tile px / screen px on each axis of ``closest_grid``'s grid (one tile: the screen squeezed to a
    square, so the two differ by the screen's ratio)."""
    w, h = size
    cols, rows = closest_grid(w, h, cfg.image_size, cfg.max_num_tiles)
    return cols * cfg.image_size / w, rows * cfg.image_size / h


FIT_JITTER = (0.85, 1.15)  # reading_tile(scale="fit"): each axis' tiling scale times a draw from this


def reading_tile(samples, cfg: VisionConfig, rng: random.Random, cell_tokens: int | None = None,
                 scale: tuple[float, float] | str = (0.65, 1.05), n_classes: int = AUX_CLASSES,
                 extra=None, extra_per_side: int = 2, tables: dict | None = None, fit: VisionConfig | None = None):
    """One tile-sized mosaic for the reading stage: a grid of cells, each a crop of one of ``samples``'
    screens centred near a random element or text (a square of side ``cell / s`` px resized to the cell,
    s drawn from ``scale``: the range of scales at which tiling shows screens to the vision tower), so
    most tokens show text. ``scale="fit"``: each cell shows its screen at the scales the tiling would
    (``tiling_scale``, each axis jittered by ``FIT_JITTER``): a rectangle of screen squeezed or stretched
    to the cell, as a one-tile configuration shows a wide screen's text narrowed; ``fit``: the configuration
    whose tiling sets those scales, when the mosaics are not its tiles (default ``cfg``). Cells are
    ``cell_tokens`` image tokens on a side, so no token straddles two crops (default: the largest divisor
    of the tokens on a tile's side up to 4). Returns the uint8 tile (S, S, 3) and the text class under each
    image token (row-major, as ``image_token_targets``); with ``extra`` (a function (sample, px, py) -> int
    array of the points' shape) also its values on an ``extra_per_side`` x ``extra_per_side`` grid of points
    inside each token, (tokens, extra_per_side ** 2), points row-major as pixel shuffle reads a token's patches.
    ``tables``: a dict kept across calls on the same ``samples`` (it caches their box tables)."""
    from PIL import Image

    S = cfg.image_size
    g = math.isqrt(cfg.tokens_per_tile)
    if cell_tokens is None:
        cell_tokens = max(d for d in range(1, min(4, g) + 1) if g % d == 0)
    tok_px = S / g
    cell = int(round(cell_tokens * tok_px))
    n = g // cell_tokens
    if n < 1 or n * cell_tokens != g:
        raise ValueError(f"cell_tokens={cell_tokens} must divide the {g} image tokens on a tile's side")
    tile = np.zeros((S, S, 3), dtype=np.uint8)
    cls = np.zeros((g, g), dtype=np.int64)
    k = extra_per_side
    more = np.zeros((g, k, g, k), dtype=np.int64) if extra is not None else None
    sub = (np.arange(cell_tokens * k) + 0.5) * tok_px / k  # sub-point centres inside a cell, cell px
    centre = (np.arange(cell_tokens) + 0.5) * tok_px  # token centres inside a cell, cell px
    tables = {} if tables is None else tables
    for r in range(n):
        for c in range(n):
            sm = rng.choice(samples)
            if id(sm) not in tables:
                tables[id(sm)] = class_boxes(sm, n_classes)
            w, h = sm.size
            boxes = [e.box for e in sm.elements] + [t.box for t in sm.texts]
            x0, y0, x1, y1 = rng.choice(boxes) if boxes else (0, 0, w, h)
            if scale == "fit":
                fx, fy = tiling_scale((w, h), fit or cfg)
                sw, sh = cell / (fx * rng.uniform(*FIT_JITTER)), cell / (fy * rng.uniform(*FIT_JITTER))
            else:
                sw = sh = cell / rng.uniform(*scale)
            sw, sh = min(sw, w), min(sh, h)                       # screen px the cell shows, each axis
            cx = rng.uniform(x0, x1) + rng.uniform(-0.25, 0.25) * sw
            cy = rng.uniform(y0, y1) + rng.uniform(-0.25, 0.25) * sh
            left = min(max(cx - sw / 2, 0.0), w - sw)             # the crop stays on the screen
            top = min(max(cy - sh / 2, 0.0), h - sh)
            crop = sm.image.resize((cell, cell), Image.Resampling.BICUBIC,
                                   box=(left, top, left + sw, top + sh))
            tile[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell] = np.asarray(crop, dtype=np.uint8)
            px = left + centre * sw / cell
            py = top + centre * sh / cell
            gx, gy = np.meshgrid(px, py)
            cls[r * cell_tokens:(r + 1) * cell_tokens, c * cell_tokens:(c + 1) * cell_tokens] = text_classes_at(
                sm, gx, gy, n_classes, tables[id(sm)])
            if more is not None:
                sx, sy = np.meshgrid(left + sub * sw / cell, top + sub * sh / cell)
                vals = np.asarray(extra(sm, sx, sy)).reshape(cell_tokens, k, cell_tokens, k)
                more[r * cell_tokens:(r + 1) * cell_tokens, :, c * cell_tokens:(c + 1) * cell_tokens, :] = vals
    if more is not None:
        return tile, cls.reshape(-1), more.transpose(0, 2, 1, 3).reshape(g * g, k * k)
    return tile, cls.reshape(-1)


class ReadingBatches(torch.utils.data.Dataset):
    """The reading stage's stream: item ``step`` is ``batch_size`` mosaic tiles (``reading_tile``) cut from
    ``screens`` fresh screens of ``split`` (seeds as ``ScreenBatches``): {"pixel_values": uint8 (B, 3, S, S),
    "image_classes": (B * tokens_per_tile,), "image_chars": (B * tokens_per_tile, merge^2) (the character
    under each patch, ``char_classes_at``)}. ``tile``: the mosaics' side in px (default the configuration's
    tile); they show text at the scales ``vision``'s own tiling shows screens either way."""

    def __init__(self, vision: VisionConfig, batch_size: int, seed: int = 0, screens: int = 8, split: str = "train",
                 tile: int | None = None):
        self.vision, self.batch_size, self.seed, self.screens, self.split = vision, batch_size, seed, screens, split
        self.mosaic = dataclasses.replace(vision, image_size=tile) if tile else vision

    def __len__(self) -> int:
        return 2**62

    def __getitem__(self, step: int) -> dict:
        from ..data import generate_sample

        base = self.seed * 10**12 + step * self.screens
        samples = [generate_sample(base + i, split=self.split) for i in range(self.screens)]
        rng = random.Random(base)
        tables, char_tables = {}, {id(sm): char_table(sm) for sm in samples}

        def chars_at(sm, px, py):
            return char_classes_at(sm, px, py, char_tables[id(sm)])

        tiles, classes, chars = zip(*(reading_tile(samples, self.mosaic, rng, scale="fit", extra=chars_at,
                                                   tables=tables, extra_per_side=self.vision.merge, fit=self.vision)
                                      for _ in range(self.batch_size)))
        x = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).contiguous()
        return {"pixel_values": x, "image_classes": torch.from_numpy(np.concatenate(classes)),
                "image_chars": torch.from_numpy(np.concatenate(chars)),
                "tokens": x.shape[0] * self.mosaic.tokens_per_tile}

def reading_loss_fn(model: Holotron, aux: AuxHeads, batch: dict, device: torch.device,
                    parts: dict | None = None, label_weight: float = 1.0, char_weight: float = 1.0,
                    augment: torch.Generator | bool | None = None) -> tuple[torch.Tensor, int]:
    """The reading stage's loss, from the projector output (vision tower + pixel shuffle + mlp1; the
    language model is not run): ``label_weight`` x the text-class cross-entropy on every image token +
    ``char_weight`` x the character cross-entropy on every patch (when the batch has "image_chars").
    ``augment``: apply ``colour_aug`` (True, or a torch.Generator for it). ``parts`` receives each term and
    the accuracies on tokens that show text and on patches that show a character."""
    from ..vision.projector import embed_tiles

    vcfg = model.config.vision
    x = normalize_tiles(batch["pixel_values"].to(device, non_blocking=True), vcfg, augment)
    cls = batch["image_classes"].to(device, non_blocking=True)
    emb = embed_tiles(model.vision_model, model.mlp1, x).reshape(-1, model.config.text.hidden_size)
    logits = aux.label_in(emb.to(aux.label_in.weight.dtype)).float()
    l_read = F.cross_entropy(logits, cls)
    loss = label_weight * l_read
    chars = batch.get("image_chars")
    l_char = None
    if chars is not None and char_weight > 0:
        chars = chars.to(device, non_blocking=True).reshape(-1)
        char_logits = aux.chars(emb)
        l_char = F.cross_entropy(char_logits, chars, ignore_index=IGNORE)
        loss = loss + char_weight * l_char
    if parts is not None:
        text = cls > 0
        parts["read"] = float(l_read.detach())
        parts["read_acc"] = float((logits[text].argmax(-1) == cls[text]).float().mean()) if bool(text.any()) else 0.0
        if l_char is not None:
            ink = chars >= 2
            parts["char"] = float(l_char.detach())
            parts["char_acc"] = (float((char_logits[ink].argmax(-1) == chars[ink]).float().mean())
                                 if bool(ink.any()) else 0.0)
    return loss, int(cls.numel())
