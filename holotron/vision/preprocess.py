"""Image preprocessing: any image -> normalised tiles for the vision encoder (docs/architecture.md, section 5).

    pixel_values, num_tokens = preprocess_image("screenshot.png", cfg)   # (tiles, 3, S, S) float32

1. Open and decode (path, bytes, file object or PIL image), refusing what is not a usable image with an
   ``ImageError`` that names the file: not an image, truncated, empty or 1-pixel-wide, over
   ``max_pixels`` (decompression bombs), a mode with no meaningful RGB reading.
2. Convert to RGB: transparency (RGBA, LA, PA, palette or RGB/L with a transparent colour) is flattened
   onto white; 16-bit and 32-bit integer greyscale is scaled from 0..65535 to 0..255 (a mode-"I" image whose
   values all fit in 0..255 is taken as 8-bit); float greyscale in 0..1 is scaled by 255, otherwise
   clipped to 0..255; CMYK, YCbCr, bilevel and palette images go through PIL's own conversion.
   The first frame of an animation is used; EXIF orientation is not applied (as in the reference processor).
3. Tiling: among the grids (i columns, j rows) with 1 <= i*j <= max_num_tiles, ordered by i*j, take the
   one whose i/j is closest to W/H; on an exact tie, a later (larger) grid wins when
   W*H > 0.5 * S^2 * i*j. Resize (bicubic) to (S*i, S*j), cut the i*j tiles row-major, and append an
   S x S thumbnail of the whole image when there is more than one tile (and use_thumbnail).
4. Scale to [0, 1] and normalise with the config's norm_mean / norm_std.
Each tile becomes ``cfg.tokens_per_tile`` (256) image tokens.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from typing import NamedTuple

import numpy as np
import torch
from einops import rearrange
from PIL import Image, UnidentifiedImageError

from .config import VisionConfig

__all__ = ["ImageError", "PreprocessedImage", "load_image", "to_rgb", "candidate_grids", "closest_grid",
           "tile_image", "normalize", "preprocess_image", "token_centres", "DEFAULT_MAX_PIXELS", "MIN_SIDE"]

DEFAULT_MAX_PIXELS = 8192 * 8192  # 67 M pixels: an 8K screenshot is 33 M
MIN_SIDE = 2                      # a 1-pixel-wide (or 1x1, or empty) image carries nothing to tile


class ImageError(ValueError):
    """An input that is not a usable image; the message names the file."""


class PreprocessedImage(NamedTuple):
    pixel_values: torch.Tensor  # (tiles, 3, S, S) float32, normalised; thumbnail last
    num_tokens: int             # tiles * tokens_per_tile


def _name(image) -> str:
    if isinstance(image, (str, os.PathLike)):
        return os.fspath(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return f"<{len(image)} bytes>"
    if isinstance(image, Image.Image):
        return getattr(image, "filename", "") or f"<PIL image {image.mode} {image.width}x{image.height}>"
    return str(getattr(image, "name", None) or f"<{type(image).__name__}>")


def load_image(image, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open, check and decode ``image`` (path, bytes, binary file object or PIL image); returns it RGB."""
    name = _name(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = io.BytesIO(bytes(image))
    elif isinstance(image, (str, os.PathLike)):
        if not os.path.isfile(image):
            raise ImageError(f"{name}: no such file")
    elif not isinstance(image, Image.Image) and not hasattr(image, "read"):
        raise ImageError(f"{name}: expected a path, bytes, a binary file object or a PIL image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            if isinstance(image, Image.Image):
                _check_size(image.size, name, max_pixels)
                image.load()
                return to_rgb(image, name)
            with Image.open(image) as im:
                _check_size(im.size, name, max_pixels)  # from the header, before any pixel is decoded
                im.load()
                return to_rgb(im, name)
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{name}: too many pixels to be a real image (decompression bomb?): {e}") from e
    except UnidentifiedImageError as e:
        raise ImageError(f"{name}: not an image, or a format PIL cannot read") from e
    except MemoryError:
        raise
    except Exception as e:  # truncated / corrupt data surfaces as OSError, SyntaxError, ValueError,
        # EOFError, zlib.error
        raise ImageError(f"{name}: cannot decode the image ({type(e).__name__}: {e}); "
                         "is the file truncated or corrupt?") from e


def _check_size(size: tuple[int, int], name: str, max_pixels: int) -> None:
    w, h = size
    if w < MIN_SIDE or h < MIN_SIDE:
        raise ImageError(f"{name}: the image is {w}x{h} pixels; at least {MIN_SIDE}x{MIN_SIDE} is needed")
    if w * h > max_pixels:
        raise ImageError(f"{name}: the image is {w}x{h} = {w * h} pixels, over the limit of {max_pixels} "
                         f"(decompression bomb?); pass max_pixels= to allow it")


_WHITE = (255, 255, 255, 255)


def to_rgb(im: Image.Image, name: str = "image") -> Image.Image:
    """Any PIL mode -> RGB (alpha flattened onto white); see the module docstring for the rules."""
    mode = im.mode
    if mode == "RGB" and "transparency" not in im.info:
        return im
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(im)
        if mode == "F":
            a = a.astype(np.float64)
            if not np.isfinite(a).all():
                raise ImageError(f"{name}: float image with NaN or infinite values")
            a = a * 255.0 if a.min() >= 0.0 and a.max() <= 1.0 else a
        else:
            a = a.astype(np.int64)
            if mode.startswith("I;16") or a.max() > 255 or a.min() < 0:  # 16-bit range
                a = np.clip(a, 0, 65535) / 257.0
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    try:
        if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
            rgba = im.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
        return im.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageError(f"{name}: cannot convert mode {mode!r} to RGB ({e})") from e


def candidate_grids(max_tiles: int) -> list[tuple[int, int]]:
    """(columns, rows) with 1 <= columns * rows <= max_tiles, ordered by tile count.

    Within one tile count the order is by columns; the reference builds a Python set and sorts it by
    tile count, which leaves that order to the set. It cannot change the choice unless two grids of the
    same tile count are exactly equally far from the image's ratio with no closer grid (not seen for
    any size up to 3000 x 600 at max_tiles=12; tests compare with the reference order)."""
    grids = [(i, j) for i in range(1, max_tiles + 1) for j in range(1, max_tiles + 1) if i * j <= max_tiles]
    return sorted(grids, key=lambda g: g[0] * g[1])


def closest_grid(width: int, height: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """The tiling grid (columns, rows) for a width x height image: closest ratio, ties as in the docstring."""
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for i, j in candidate_grids(max_tiles):
        diff = abs(aspect - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * i * j:
            best = (i, j)
    return best


def tile_image(im: Image.Image, tile: int, max_tiles: int, use_thumbnail: bool = True,
               grid: tuple[int, int] | None = None) -> list[Image.Image]:
    """RGB image -> tiles (row-major) + thumbnail last when more than one tile. ``grid`` (columns, rows)
    overrides ``closest_grid``'s choice (a training augmentation; inference never passes it)."""
    cols, rows = grid or closest_grid(im.width, im.height, tile, max_tiles)
    if cols < 1 or rows < 1 or cols * rows > max_tiles:
        raise ValueError(f"grid {cols}x{rows}: needs 1 <= columns x rows <= max_tiles ({max_tiles})")
    resized = im.resize((tile * cols, tile * rows), Image.Resampling.BICUBIC)
    if cols * rows == 1:  # the resized image is the tile: no crop (a copy)
        return [resized]
    tiles = [resized.crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile))
             for r in range(rows) for c in range(cols)]
    if use_thumbnail and len(tiles) > 1:
        tiles.append(im.resize((tile, tile), Image.Resampling.BICUBIC))
    return tiles


def normalize(tiles: list[Image.Image], mean, std) -> torch.Tensor:
    """RGB tiles -> (T, 3, S, S) float32: x / 255, then (x - mean) / std per channel."""
    x = rearrange(torch.from_numpy(np.stack([np.asarray(t, dtype=np.uint8) for t in tiles])), "t h w c -> t c h w")
    x = x.to(torch.float32) / 255.0
    mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - mean) / std


def preprocess_image(image, cfg: VisionConfig | None = None, *,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> PreprocessedImage:
    """Image (path, bytes, file object or PIL image) -> (pixel_values (tiles, 3, S, S), number of image tokens)."""
    cfg = cfg or VisionConfig()
    rgb = load_image(image, max_pixels=max_pixels)
    tiles = tile_image(rgb, cfg.image_size, cfg.max_num_tiles, cfg.use_thumbnail)
    pixel_values = normalize(tiles, cfg.norm_mean, cfg.norm_std)
    return PreprocessedImage(pixel_values, len(tiles) * cfg.tokens_per_tile)


def token_centres(size: tuple[int, int], cfg, grid: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The image tokens of a (width, height) image as the model sees them: their centres (n, 2) and their cells'
    sizes (n, 2), (x, y) in [0, 1] of the image. Tiles row-major (``grid`` (columns, rows), else
    ``closest_grid``'s), each tile's g x g tokens row-major (g^2 = ``cfg.tokens_per_tile``), then the thumbnail's
    g x g over the whole image when there is one."""
    w, h = size
    cols, rows = grid or closest_grid(w, h, cfg.image_size, cfg.max_num_tiles)
    g = math.isqrt(cfg.tokens_per_tile)
    centre = (np.arange(g) + 0.5) / g
    ys = (np.arange(rows)[:, None] + centre[None, :]) / rows          # (rows, g)
    xs = (np.arange(cols)[:, None] + centre[None, :]) / cols          # (cols, g)
    ty = np.broadcast_to(ys[:, None, :, None], (rows, cols, g, g)).reshape(-1)
    tx = np.broadcast_to(xs[None, :, None, :], (rows, cols, g, g)).reshape(-1)
    pos = np.stack([tx, ty], axis=1)
    cell = np.broadcast_to(np.array([1 / (g * cols), 1 / (g * rows)]), pos.shape)
    if cfg.use_thumbnail and rows * cols > 1:
        gy, gx = np.meshgrid(centre, centre, indexing="ij")
        pos = np.concatenate([pos, np.stack([gx.reshape(-1), gy.reshape(-1)], axis=1)])
        cell = np.concatenate([cell, np.full((g * g, 2), 1 / g)])
    return pos, np.ascontiguousarray(cell)
