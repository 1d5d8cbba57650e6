"""Screens as the vision tower sees them in training: the preprocessing's tiles as uint8 for the trip from the
data workers (``uint8_tiles``), normalised on the device (``normalize_tiles``), optionally through a colour
augmentation (``colour_aug``); and ``--grid-aug``'s random tiling grids (``augmented_grid``)."""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

from ..vision.config import VisionConfig
from ..vision.preprocess import candidate_grids, closest_grid, tile_image, to_rgb

__all__ = ["uint8_tiles", "GRID_STRETCH", "GRID_SCALE", "augmented_grid", "normalize_tiles", "colour_aug"]


def uint8_tiles(image, cfg: VisionConfig, grid: tuple[int, int] | None = None) -> tuple[torch.Tensor, int]:
    """The preprocessing's tiles (same grid, resize and order as ``preprocess_image``; ``grid`` overrides
    the grid) as uint8 (tiles, 3, S, S), and the number of image tokens: a quarter of the bytes of float32
    for the trip from the data workers; ``normalize_tiles`` finishes the job on the device."""
    tiles = tile_image(to_rgb(image), cfg.image_size, cfg.max_num_tiles, cfg.use_thumbnail, grid)
    s = cfg.image_size
    x = torch.empty((len(tiles), 3, s, s), dtype=torch.uint8)
    for out, t in zip(x, tiles):  # each tile copied once, straight into its channels-first place
        out.copy_(torch.from_numpy(np.asarray(t, dtype=np.uint8)).permute(2, 0, 1))
    return x, len(tiles) * cfg.tokens_per_tile


GRID_STRETCH = 2.0  # --grid-aug: a grid's ratio within this factor of the screen's
GRID_SCALE = (0.5, 2.0)  # --grid-aug: the scales each axis may be read at


def augmented_grid(size: tuple[int, int], cfg: VisionConfig, rng: random.Random) -> tuple[int, int]:
    """A tiling grid for a training screen drawn at random among those (of at least two tiles) whose
    columns / rows ratio is within ``GRID_STRETCH`` of the screen's and which read each axis at a scale in
    ``GRID_SCALE``; ``closest_grid``'s own choice is always among them. Used by ``--grid-aug`` so the
    number of tiles does not tell the grid: without it every training screen of a tile count has one grid
    (2 tiles: 1 x 2, 6: 3 x 2, 10: 2 x 5, 12: 4 x 3) and the held-out sizes the transposed ones."""
    w, h = size
    s = cfg.image_size
    lo, hi = GRID_SCALE
    best = closest_grid(w, h, s, cfg.max_num_tiles)
    ok = [g for g in candidate_grids(cfg.max_num_tiles)
          if g[0] * g[1] >= 2 and 1 / GRID_STRETCH <= (g[0] / g[1]) / (w / h) <= GRID_STRETCH
          and lo <= g[0] * s / w <= hi and lo <= g[1] * s / h <= hi]
    if best not in ok:
        ok.append(best)
    return rng.choice(ok)


def normalize_tiles(x: torch.Tensor, cfg: VisionConfig, augment: torch.Generator | bool | None = None,
                    groups: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 tiles (T, 3, S, S) -> float32 (x / 255 - mean) / std, as ``holotron.vision.preprocess.normalize``;
    with ``augment`` (True, or a torch.Generator for the draws) through ``colour_aug`` first (``groups``:
    tiles per image, one draw each)."""
    if x.dtype != torch.uint8:
        return x.float()
    if augment is None or augment is False:
        xf = x.to(torch.float32) / 255.0
    else:
        xf = colour_aug(x, augment if isinstance(augment, torch.Generator) else None, groups)
    mean, std = _channel_stats(tuple(cfg.norm_mean), tuple(cfg.norm_std), x.device)
    return (xf - mean) / std


@functools.lru_cache(maxsize=16)
def _channel_stats(mean: tuple, std: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``normalize_tiles``' mean and std (1, 3, 1, 1) on ``device``, made once: a tensor built from a list on
    the device is a blocking copy, which waits for everything queued on it."""
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, whatever mode the first call ran in
        return tuple(torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(device) for v in (mean, std))


def colour_aug(x: torch.Tensor, generator: torch.Generator | None = None,
               groups: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 tiles (B, 3, S, S) -> float32 in [0, 1] with, per tile, a random order of the colour
    channels, an inversion half the time, and a random gain and offset: colour no longer tells text from
    background, only shape does (what lets reading carry over to unseen themes). ``groups``: tiles per
    image (summing to B): one draw per image, shared by its tiles (and thumbnail)."""
    dev = x.device
    n = x.shape[0] if groups is None else groups.numel()
    perm = torch.argsort(torch.rand(n, 3, generator=generator, device=dev), dim=1)
    inv = torch.rand(n, 1, 1, 1, generator=generator, device=dev) < 0.5
    gain = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=generator, device=dev)
    off = 0.2 * (torch.rand(n, 1, 1, 1, generator=generator, device=dev) - 0.5)
    if groups is not None:  # the total is known on the host: repeat_interleave then reads nothing back
        counts = groups.to(dev, non_blocking=True)
        perm, inv, gain, off = (t.repeat_interleave(counts, dim=0, output_size=x.shape[0])
                                for t in (perm, inv, gain, off))
    xf = x.float() / 255.0
    xf = torch.gather(xf, 1, perm[:, :, None, None].expand_as(xf))
    xf = torch.where(inv, 1.0 - xf, xf)
    return (xf * gain + off).clamp(0, 1)
