"""What each image token shows, as training targets (dense, known from the generator): the text class under it
(``label_class`` of the element or text, ``text_classes_at``), the character under each of its patches
(``char_class``, ``char_classes_at``), its screen position (``image_token_targets``), and the tokens on a
question's element (``pointer_tokens``). ``IGNORE`` (-100) marks a position without a target."""

from __future__ import annotations

import functools
import math
import zlib

import numpy as np
import torch

from ..vision.config import VisionConfig
from ..vision.preprocess import closest_grid, token_centres

__all__ = ["IGNORE", "AUX_CLASSES", "N_CHAR", "label_class", "char_class", "char_table", "char_classes_at",
           "class_boxes", "text_classes_at", "image_token_targets", "pointer_tokens"]

IGNORE = -100  # cross-entropy's ignore_index: no target here
AUX_CLASSES = 4096  # label-hash buckets; class 0 is "no text here"


def label_class(text: str, n_classes: int = AUX_CLASSES) -> int:
    """A stable bucket in [1, n_classes) for a label, compared case-insensitively."""
    return 1 + zlib.crc32(text.strip().lower().encode("utf-8")) % (n_classes - 1)


N_CHAR = 39  # character classes: 0 no text, 1 space, 2-27 a-z (either case), 28-37 0-9, 38 any other mark


def char_class(ch: str) -> int:
    """The class of one character (``N_CHAR`` classes; letters case-insensitive)."""
    c = ch.lower()
    if c == " ":
        return 1
    if "a" <= c <= "z":
        return 2 + ord(c) - ord("a")
    if "0" <= c <= "9":
        return 28 + ord(c) - ord("0")
    return 38


@functools.lru_cache(maxsize=None)
def _face_metrics(face: str | None) -> tuple[object, dict, dict]:
    """The screen face at 64 px with its character advances and pair kernings, filled as texts meet them."""
    from ..data.canvas import font

    return font(64, face), {}, {}


def _prefix_widths(text: str, face: str | None) -> list[float]:
    """``font.getlength(text[:i + 1])`` for every i, composed from cached advances and pair kernings: the
    fonts' basic layout places each glyph at the sum of the advances and kernings before it, in 1/64 px, so
    the sums are the same floats (``tests/test_train_targets.py`` compares them with ``getlength`` in every
    bundled face) at one ``getlength`` per new character or pair instead of one per prefix."""
    f, advance, kerning = _face_metrics(face)
    widths, total, prev = [], 0.0, ""
    for c in text:
        a = advance.get(c)
        if a is None:
            a = advance[c] = f.getlength(c)
        total += a
        if prev:
            pair = prev + c
            k = kerning.get(pair)
            if k is None:
                k = kerning[pair] = f.getlength(pair) - advance[prev] - a
            total += k
        widths.append(total)
        prev = c
    return widths


@functools.lru_cache(maxsize=65536)
def _char_edges(text: str, face: str | None = None) -> np.ndarray:
    """Right edge of each character as a fraction of ``text``'s width in the screen's font (``face``: None for
    the bundled Aileron, holotron/data/faces.py; at 64 px: advances scale with the size, so the fractions hold
    at any size up to hinting)."""
    widths = np.array(_prefix_widths(text, face), dtype=np.float64)
    return widths / max(float(widths[-1]), 1e-9)


@functools.lru_cache(maxsize=8192)
def _char_codes(text: str) -> np.ndarray:
    return np.array([char_class(c) for c in text], dtype=np.int64)


def char_table(sample) -> tuple[list, np.ndarray]:
    """(the non-empty visible texts, their ink boxes (n, 4)): what ``char_classes_at`` looks up."""
    texts = [t for t in sample.texts if t.text]
    return texts, np.array([t.box for t in texts], dtype=np.float64).reshape(-1, 4)


def _last_box(boxes: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """For each point (flattened), the index of the last of ``boxes`` (n, 4; x1 / y1 exclusive) holding it,
    -1 where none does: the box painted last over the point, as boxes are listed in paint order."""
    x, y = px.reshape(-1), py.reshape(-1)
    if not len(boxes):
        return np.full(x.size, -1, dtype=np.int64)
    xs, ix = np.unique(x, return_inverse=True)
    ys, iy = np.unique(y, return_inverse=True)
    if len(xs) * len(ys) > 4 * max(len(x), 64):  # scattered points: each against each box
        hit = ((x[:, None] >= boxes[:, 0]) & (x[:, None] < boxes[:, 2]) & (y[:, None] >= boxes[:, 1])
               & (y[:, None] < boxes[:, 3]))                                              # (points, boxes)
        last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
        return np.where(hit.any(axis=1), last, -1)
    # points on a grid (the image tokens' centres, the patches'): the boxes painted in order on the grid of the
    # points' distinct coordinates, O(points + boxes); x >= x0 from the first coordinate not below x0, x < x1
    # up to the first not below x1
    x0, x1 = np.searchsorted(xs, boxes[:, 0]), np.searchsorted(xs, boxes[:, 2])
    y0, y1 = np.searchsorted(ys, boxes[:, 1]), np.searchsorted(ys, boxes[:, 3])
    grid = np.full((len(ys), len(xs)), -1, dtype=np.int64)
    for i in range(len(boxes)):
        grid[y0[i]:y1[i], x0[i]:x1[i]] = i
    return grid[iy.reshape(-1), ix.reshape(-1)]


def char_classes_at(sample, px, py, table=None, codes=None) -> np.ndarray:
    """The character under each pixel point (px, py) of ``sample``'s screen (``char_class``): the visible
    text whose ink box holds the point (the last drawn, where boxes overlap), the character at that
    fraction of the text's width (an approximation: ink box against advances, in the screen's face, its
    ``settings["font"]``), else 0. ``table``:
    ``char_table(sample)`` when the caller asks many times; ``codes``: text -> one class per character
    (default ``char_class`` of each; another, e.g. the word each character belongs to, reads other
    targets). The reading stage's local target: characters are learned in a minute where whole-label
    classes take far longer (docs/tiny-model.md, the probe)."""
    from ..data.faces import canvas_face

    texts, boxes = table if table is not None else char_table(sample)
    face = canvas_face((getattr(sample, "settings", None) or {}).get("font"))  # the screen's face (None: Aileron)
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    out = np.zeros(px.size, dtype=np.int64)
    if texts:
        last = _last_box(boxes, px, py)
        xs = px.reshape(-1)
        for ti in np.unique(last[last >= 0]):
            sel = last == ti
            t = texts[ti]
            frac = (xs[sel] - t.box[0]) / max(t.box[2] - t.box[0], 1)
            idx = np.minimum(np.searchsorted(_char_edges(t.text, face), frac, side="right"), len(t.text) - 1)
            out[sel] = (codes or _char_codes)(t.text)[idx]
    return out.reshape(px.shape)


def class_boxes(sample, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(boxes (n, 4), classes (n,)) in paint order: visible texts, then elements over them."""
    items = [(t.box, t.text) for t in sample.texts] + [(e.box, e.label) for e in sample.elements]
    return (np.array([b for b, _ in items], dtype=np.float64).reshape(-1, 4),
            np.array([label_class(text, n_classes) for _, text in items], dtype=np.int64))


def text_classes_at(sample, px: np.ndarray, py: np.ndarray, n_classes: int = AUX_CLASSES, table=None) -> np.ndarray:
    """The text class at each pixel point (px, py) of ``sample``'s screen: ``label_class`` of the element
    whose box holds it (elements drawn over texts), else of the visible text whose ink box holds it, else 0.
    ``table``: ``class_boxes(sample)`` when the caller asks many times."""
    boxes, classes = table if table is not None else class_boxes(sample, n_classes)
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    if not len(classes):
        return np.zeros(px.shape, dtype=np.int64)
    last = _last_box(boxes, px, py)
    return np.where(last >= 0, classes[last], 0).reshape(px.shape).astype(np.int64)


def image_token_targets(sample, cfg: VisionConfig, n_classes: int = AUX_CLASSES, chars: bool = False,
                        grid: tuple[int, int] | None = None) -> tuple:
    """Per image token of ``sample``'s screen, in the order the model sees them (tiles row-major, 2x2
    pixel-shuffled tokens row-major inside a tile, the thumbnail last): the class of the text under the
    token's centre (``label_class`` of the element's label, else of the visible text, else 0; -100 on
    thumbnail tokens, which cover too much of the screen to name one text) and the centre as (x, y) in
    [0, 1] of the screen. Dense targets that tell the vision tower and the language model, from the
    first steps, what each image token shows and where it is on the screen. With ``chars`` also the
    character under each of a token's merge x merge patches (``char_classes_at``; (tokens, merge^2), patches
    in pixel-shuffle order; -100 on the thumbnail). ``grid``: the tiling grid if not ``closest_grid``'s."""
    w, h = sample.size
    cols, rows = grid or closest_grid(w, h, cfg.image_size, cfg.max_num_tiles)
    g = math.isqrt(cfg.tokens_per_tile)
    pos, _ = token_centres((w, h), cfg, (cols, rows))   # the tiles' tokens, then the thumbnail's
    n_tiles = rows * cols * g * g
    cls = text_classes_at(sample, pos[:n_tiles, 0] * w, pos[:n_tiles, 1] * h, n_classes)
    thumb = len(pos) > n_tiles
    if thumb:
        cls = np.concatenate([cls, np.full(g * g, IGNORE, dtype=np.int64)])
    out = (torch.from_numpy(cls), torch.from_numpy(pos.astype(np.float32)))
    if not chars:
        return out
    k = cfg.merge
    sub = (np.arange(g * k) + 0.5) / (g * k)
    sy = (np.arange(rows)[:, None] + sub[None, :]) / rows                # (rows, g*k)
    sx = (np.arange(cols)[:, None] + sub[None, :]) / cols                # (cols, g*k)
    Y = np.broadcast_to(sy[:, :, None, None], (rows, g * k, cols, g * k))
    X = np.broadcast_to(sx[None, None, :, :], (rows, g * k, cols, g * k))
    ch = char_classes_at(sample, X * w, Y * h).reshape(rows, g, k, cols, g, k)
    ch = ch.transpose(0, 3, 1, 4, 2, 5).reshape(rows * cols * g * g, k * k)  # tile, token, patch
    if thumb:
        ch = np.concatenate([ch, np.full((g * g, k * k), IGNORE, dtype=np.int64)])
    return (*out, torch.from_numpy(ch))


def pointer_tokens(box, size: tuple[int, int], positions: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """The image tokens (indices into a screen's image tokens, thumbnail left out) whose centre lies in
    ``box`` (pixels, x1 / y1 exclusive); for a box too small to hold a centre, the token nearest to its
    centre. ``positions`` / ``classes``: ``image_token_targets``' (the thumbnail's classes are -100)."""
    w, h = size
    x, y = positions[:, 0] * w, positions[:, 1] * h
    tile = classes != IGNORE
    inside = tile & (x >= box[0]) & (x < box[2]) & (y >= box[1]) & (y < box[3])
    if bool(inside.any()):
        return inside.nonzero().squeeze(1)
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    d = ((x - cx) ** 2 + (y - cy) ** 2).masked_fill(~tile, float("inf"))
    return d.argmin().reshape(1)
