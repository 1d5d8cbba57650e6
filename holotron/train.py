"""Training holotron VL models on streamed synthetic screens: ``python -m holotron.train``.

    python -m holotron.train --config tiny-ui --steps 3000 --batch-size 32 --out runs/tiny --time-budget 7
    python -m holotron.train --config micro --steps 4 --batch-size 2 --device cpu --out /tmp/m   # a CPU smoke run

The loop, in the order a step runs:
  data      ``ScreenBatches[step]``: batch ``step`` of the stream, rendered in DataLoader worker processes
            (``holotron.data.generate_sample`` with seeds ``seed * 10**12 + step * batch + i``, so a
            batch depends only on (seed, step): runs and resumed runs see the same data). Each screen
            goes through ``holotron.Processor`` exactly as at inference (chat template, ``<img><image>*N
            </img>``, tiling), then the answer tokens are appended. Tiles travel as uint8 and are
            normalised on the device (``normalize_tiles``: the same arithmetic as the preprocessing).
  labels    -100 everywhere except the answer tokens: the click JSON, the newline and the end-of-turn
            token ``<SPECIAL_12>`` (so the model learns to stop). With ``--queries k`` a screen carries
            k questions, as turns of one conversation; the first turn is the inference prompt.
  forward   vision tower + mlp1 + the LM's hidden states; the lm_head runs only at the answer
            positions. Rows are right-padded (pads after the answer change nothing before them, so no
            attention mask is needed and attention stays plain causal).
  update    AdamW (no decay on norms, biases, embeddings and the SSM constants), linear warm-up then
            cosine decay to ``min_lr_ratio * lr`` (``lr_at``), gradient clipping; bf16 autocast on CUDA.
            With ``--time-budget`` the schedule runs on whichever ends first, steps or minutes.
  eval      every ``--eval-every`` steps: point-in-box accuracy on held-out screens by greedy
            generation + ``parse_click`` (``holotron.eval``).
  save      the HF layout (``save_pretrained``: config.json, safetensors shards, preprocessor_config.json,
            generation_config.json) + the tokenizer files + ``trainer_state.json`` (the loss log and
            evals) in ``--out`` at the end (also on a time-budget stop, SIGTERM or Ctrl-C), and in
            ``--out/checkpoint-STEP`` every ``--save-every`` steps (the latest kept); with
            ``--save-optimizer`` also ``training_state.pt`` (fp32 weights + AdamW state) for
            ``--resume``. ``holotron.load`` and ``Processor.from_pretrained`` read the folder as it is.

Options past the plain loop: ``--aux-weight W`` adds dense losses on the image tokens (the text class
under each token, the character under each of its patches, its screen position; ``image_token_targets``,
``char_classes_at``, ``AuxHeads``: training-only heads, written beside the model as aux_heads.pt, never
loaded by ``holotron.load``). ``--stage read`` trains the vision side alone on tile mosaics of text crops
(``reading_tile``, ``ReadingBatches``, ``reading_loss_fn``), colour-augmented, characters alone first and
label classes beside them after ``--labels-after`` of the run (the order the reading probe found to
work, docs/tiny-model.md); ``--init-from DIR`` starts a run from a checkpoint's weights (fresh optimizer)
and, without ``--tokenizer``, its tokenizer.

The scan: Triton's SSD scan has a forward only, so training runs every Mamba layer through the
pure-PyTorch ``chunked`` backend (autograd works through it) on every device:
``holotron.kernels.use_backend("chunked")``.
"""

from __future__ import annotations

import argparse
import functools
import copy
import csv
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import TextConfig
from .model import Holotron, HolotronConfig
from .processor import END_OF_TURN, Processor
from .progress import Progress, format_seconds
from .vision.config import VisionConfig
from .vision.preprocess import tile_image, to_rgb
from .weights import save_pretrained

__all__ = ["PRESETS", "make_config", "init_weights", "make_optimizer", "lr_at", "ScreenBatches", "collate", "normalize_tiles",
           "uint8_tiles", "answer_ids", "extra_targets", "train", "main"]

IGNORE = -100
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 12], "pad_token_id": 0, "max_new_tokens": 48}

# ----------------------------------------------------------------------------------------------
# architectures
# ----------------------------------------------------------------------------------------------

# the tiny model's sizes; its presets differ only in how a screen is cut into tiles
_TINY_VISION = dict(hidden_size=192, num_hidden_layers=8, num_attention_heads=3, patch_size=16, mlp_ratio=4.0,
                    max_img_size=384, num_prefix_tokens=4, projector_hidden_size=1280)
_TINY_TEXT = dict(hidden_size=320, hybrid_override_pattern="M-M*-M-M*-", num_attention_heads=8, num_key_value_heads=2,
                  head_dim=40, intermediate_size=1280, mamba_num_heads=10, mamba_head_dim=64, ssm_state_size=32,
                  n_groups=2, conv_kernel=4, chunk_size=128)

# name -> (VisionConfig fields, TextConfig fields); vocab_size comes from the tokenizer
PRESETS: dict[str, tuple[dict, dict]] = {
    # the shipped model (holotron/models/holotron-tiny-ui/README.md says why these sizes): one 1024 px tile
    "tiny-ui": (dict(_TINY_VISION, image_size=1024, max_num_tiles=1, use_thumbnail=False), _TINY_TEXT),
    # the 12B model's tiling at the tiny size: 384 px tiles, up to 12 and a thumbnail (shipped until 2026-12-03)
    "tiny-ui-tiles": (dict(_TINY_VISION, image_size=384, max_num_tiles=12, use_thumbnail=True), _TINY_TEXT),
    # a few-second CPU configuration for tests and smoke runs: same layer kinds, toy sizes
    "micro": (
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=16, mlp_ratio=2.0,
             max_img_size=64, num_prefix_tokens=2, image_size=64, max_num_tiles=2, use_thumbnail=True,
             projector_hidden_size=64),
        dict(hidden_size=64, hybrid_override_pattern="M*-", num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=128, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16,
             n_groups=1, conv_kernel=4, chunk_size=64),
    ),
}


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def make_config(preset: str, vocab_size: int, overrides: list[str] | tuple[str, ...] = ()) -> HolotronConfig:
    """The HolotronConfig of a preset, with ``overrides`` such as ``"vision.image_size=448"`` or
    ``"text.hybrid_override_pattern=M*M-"`` (values are JSON, else strings)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown --config {preset!r}: use one of {', '.join(PRESETS)}")
    vis, txt = (dict(d) for d in PRESETS[preset])
    for item in overrides:
        key, sep, value = item.partition("=")
        part, _, name = key.strip().partition(".")
        target = {"vision": vis, "text": txt}.get(part)
        fields = {"vision": VisionConfig, "text": TextConfig}.get(part)
        if not sep or target is None or name not in {f.name for f in dataclasses.fields(fields)}:
            raise ValueError(f"--set {item!r}: expected vision.FIELD=VALUE or text.FIELD=VALUE with a field of "
                             "VisionConfig / TextConfig")
        target[name] = _parse_value(value)
    if isinstance(vis.get("norm_mean"), list):
        vis["norm_mean"] = tuple(vis["norm_mean"])
    text = TextConfig(**{**txt, "vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": (2, 12),
                         "pad_token_id": 0})
    vision = VisionConfig(**{**vis, "projector_output_size": text.hidden_size})
    return HolotronConfig(text=text, vision=vision, image_token_id=18)


@torch.no_grad()
def init_weights(model: Holotron, seed: int = 0) -> Holotron:
    """A from-scratch initialisation (the modules' constructors leave placeholders: zero position
    embeddings, A = -1, dt_bias = 0). Linear and embedding weights N(0, 0.02), residual output
    projections scaled by 1/sqrt(2 * layers); norms 1, biases 0; Mamba A in [-16, -1] and
    softplus(dt_bias) log-uniform in [1e-3, 1e-1] (the Mamba2 recipe); conv1d keeps torch's default."""
    g = torch.Generator().manual_seed(seed)
    n_lm = model.config.text.num_hidden_layers
    n_vit = model.config.vision.num_hidden_layers
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=g)))
        elif leaf == "dt_bias":
            dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * torch.rand(p.shape, generator=g))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        elif leaf == "D":
            p.fill_(1.0)
        elif "conv1d" in name:
            continue
        elif leaf == "bias":
            p.zero_()
        elif p.dim() == 1:  # LayerNorm / RMSNorm weights
            p.fill_(1.0)
        else:
            std = 0.02
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) and name.startswith("language_model"):
                std /= math.sqrt(2 * n_lm)
            elif name.endswith(("attn.proj.weight", "mlp.fc2.weight")) and name.startswith("vision_model"):
                std /= math.sqrt(2 * n_vit)
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


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


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

def uint8_tiles(image, cfg: VisionConfig, grid: tuple[int, int] | None = None) -> tuple[torch.Tensor, int]:
    """The preprocessing's tiles (same grid, resize and order as ``preprocess_image``; ``grid`` overrides
    the grid) as uint8 (tiles, 3, S, S), and the number of image tokens: a quarter of the bytes of float32
    for the trip from the data workers; ``normalize_tiles`` finishes the job on the device."""
    tiles = tile_image(to_rgb(image), cfg.image_size, cfg.max_num_tiles, cfg.use_thumbnail, grid)
    x = torch.from_numpy(np.stack([np.asarray(t, dtype=np.uint8) for t in tiles])).permute(0, 3, 1, 2).contiguous()
    return x, len(tiles) * cfg.tokens_per_tile


GRID_STRETCH = 2.0  # --grid-aug: a grid's ratio within this factor of the screen's
GRID_SCALE = (0.5, 2.0)  # --grid-aug: the scales each axis may be read at


def augmented_grid(size: tuple[int, int], cfg: VisionConfig, rng: random.Random) -> tuple[int, int]:
    """A tiling grid for a training screen drawn at random among those (of at least two tiles) whose
    columns / rows ratio is within ``GRID_STRETCH`` of the screen's and which read each axis at a scale in
    ``GRID_SCALE``; ``closest_grid``'s own choice is always among them. Used by ``--grid-aug`` so the
    number of tiles does not tell the grid: without it every training screen of a tile count has one grid
    (2 tiles: 1 x 2, 6: 3 x 2, 10: 2 x 5, 12: 4 x 3) and the held-out sizes the transposed ones."""
    from .vision.preprocess import candidate_grids, closest_grid

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
    mean = torch.tensor(cfg.norm_mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(cfg.norm_std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return (xf - mean) / std


def answer_ids(processor: Processor, answer: str) -> list[int]:
    """What the model must write after the prompt: the answer, a newline and the end-of-turn token,
    as the chat template renders an assistant turn (``{answer}\\n<SPECIAL_12>``)."""
    return processor.encode(answer.strip() + "\n" + END_OF_TURN)


def followup_text(target: str, short: bool = False) -> str:
    """A later turn of the same conversation, as the Nemotron template renders it (reasoning off):
    the newline after the previous end of turn, the user's localisation prompt (with ``short``, the
    target alone: about 10 tokens instead of 170), the assistant header."""
    from .grounding import localization_prompt

    ask = target.strip() if short else localization_prompt(target).strip()
    return "\n<SPECIAL_11>User\n" + ask + "\n<SPECIAL_11>Assistant\n<think></think>"


def _word(label: str) -> re.Pattern:
    return re.compile(r"(?<![a-z0-9])" + re.escape(label.lower()) + r"(?![a-z0-9])")


def extra_targets(sample, k: int, rng: random.Random, boxes: bool = False) -> list[tuple]:
    """Up to ``k`` more (instruction, answer) pairs for other elements of ``sample``'s screen (with
    ``boxes``, (instruction, answer, element box) triples; the same draws either way).

    An element qualifies when it has a target role, is at least 6 px on each side, its label is in no
    other element's label (as whole words, case-insensitively) and every visible text that holds the
    label lies on or next to the element (its own caption or value). The generator applies the same
    rule with the texts' owners, which a Sample does not keep, so this one errs on the strict side."""
    from .data import ROLES
    from .data.instructions import answer_text, click_point, instruction_for

    if k <= 0:
        return []
    w, h = sample.size
    els = [e for e in sample.elements if e is not sample.target and e.role in ROLES
           and min(e.box[2] - e.box[0], e.box[3] - e.box[1]) >= 6]
    rng.shuffle(els)
    out = []
    for e in els:
        pat = _word(e.label)
        if any(o is not e and pat.search(o.label.lower()) for o in sample.elements):
            continue
        reach = 2 * (e.box[3] - e.box[1]) + 24  # px around the element where its own caption may sit
        near = (e.box[0] - reach, e.box[1] - reach, e.box[2] + reach, e.box[3] + reach)
        if any(pat.search(t.text.lower()) and not (t.box[0] < near[2] and near[0] < t.box[2] and t.box[1] < near[3]
                                                 and near[1] < t.box[3]) for t in sample.texts):
            continue
        try:
            point = click_point(e.box, w, h, rng)
        except ValueError:
            continue
        out.append((instruction_for(e.label, e.role, rng), answer_text(point)) + ((e.box,) if boxes else ()))
        if len(out) == k:
            break
    return out


# ----------------------------------------------------------------------------------------------
# auxiliary targets on the image tokens (training aid; the heads are not part of the checkpoint)
# ----------------------------------------------------------------------------------------------

AUX_CLASSES = 4096  # label-hash buckets; class 0 is "no text here"
AUX_FILE = "aux_heads.pt"
POINTER_DIM = 64  # width of the pointer head's queries and keys


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


@functools.lru_cache(maxsize=8192)
def _char_edges(text: str) -> np.ndarray:
    """Right edge of each character as a fraction of ``text``'s width in the bundled font (at 64 px:
    advances scale with the size, so the fractions hold at any size up to hinting)."""
    from .data.canvas import font

    f = font(64)
    widths = np.array([f.getlength(text[:i + 1]) for i in range(len(text))], dtype=np.float64)
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
    x, y = px.reshape(-1, 1), py.reshape(-1, 1)
    hit = (x >= boxes[:, 0]) & (x < boxes[:, 2]) & (y >= boxes[:, 1]) & (y < boxes[:, 3])  # (points, boxes)
    last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
    return np.where(hit.any(axis=1), last, -1)


def char_classes_at(sample, px, py, table=None, codes=None) -> np.ndarray:
    """The character under each pixel point (px, py) of ``sample``'s screen (``char_class``): the visible
    text whose ink box holds the point (the last drawn, where boxes overlap), the character at that
    fraction of the text's width (an approximation: ink box against advances), else 0. ``table``:
    ``char_table(sample)`` when the caller asks many times; ``codes``: text -> one class per character
    (default ``char_class`` of each; another, e.g. the word each character belongs to, reads other
    targets). The reading stage's local target: characters are learned in a minute where whole-label
    classes take far longer (docs/tiny-model.md, the probe)."""
    texts, boxes = table if table is not None else char_table(sample)
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    out = np.zeros(px.size, dtype=np.int64)
    if texts:
        last = _last_box(boxes, px, py)
        xs = px.reshape(-1)
        for ti in np.unique(last[last >= 0]):
            sel = last == ti
            t = texts[ti]
            frac = (xs[sel] - t.box[0]) / max(t.box[2] - t.box[0], 1)
            idx = np.minimum(np.searchsorted(_char_edges(t.text), frac, side="right"), len(t.text) - 1)
            out[sel] = (codes or _char_codes)(t.text)[idx]
    return out.reshape(px.shape)


def _class_boxes(sample, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(boxes (n, 4), classes (n,)) in paint order: visible texts, then elements over them."""
    items = [(t.box, t.text) for t in sample.texts] + [(e.box, e.label) for e in sample.elements]
    return (np.array([b for b, _ in items], dtype=np.float64).reshape(-1, 4),
            np.array([label_class(text, n_classes) for _, text in items], dtype=np.int64))


def text_classes_at(sample, px: np.ndarray, py: np.ndarray, n_classes: int = AUX_CLASSES, table=None) -> np.ndarray:
    """The text class at each pixel point (px, py) of ``sample``'s screen: ``label_class`` of the element
    whose box holds it (elements drawn over texts), else of the visible text whose ink box holds it, else 0.
    ``table``: ``_class_boxes(sample)`` when the caller asks many times."""
    boxes, classes = table if table is not None else _class_boxes(sample, n_classes)
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
    from .vision.preprocess import closest_grid

    w, h = sample.size
    cols, rows = grid or closest_grid(w, h, cfg.image_size, cfg.max_num_tiles)
    g = math.isqrt(cfg.tokens_per_tile)
    centre = (np.arange(g) + 0.5) / g
    # tile tokens: (rows, g, cols, g) -> reorder to (tile r, tile c, i, j)
    ys = (np.arange(rows)[:, None] + centre[None, :]) / rows          # (rows, g)
    xs = (np.arange(cols)[:, None] + centre[None, :]) / cols          # (cols, g)
    ty = np.broadcast_to(ys[:, None, :, None], (rows, cols, g, g)).reshape(-1)
    tx = np.broadcast_to(xs[None, :, None, :], (rows, cols, g, g)).reshape(-1)
    cls = text_classes_at(sample, tx * w, ty * h, n_classes)
    pos = np.stack([tx, ty], axis=1)
    thumb = cfg.use_thumbnail and rows * cols > 1
    if thumb:
        gy, gx = np.meshgrid(centre, centre, indexing="ij")
        pos = np.concatenate([pos, np.stack([gx.reshape(-1), gy.reshape(-1)], axis=1)])
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


class AuxHeads(nn.Module):
    """Training-only heads on the image tokens: the text class from the projector's output (what the
    vision tower reads), the character under each of its patches, and, from the residual stream entering
    the last attention layer, the text class and the screen position (what the lookup "which image token
    carries this label, and where is it" needs), and a pointer: a query from the position that answers a
    question, keys from the image tokens, scored against the tokens on the question's element (the lookup
    itself, which the last attention layer has to learn). Not saved with the model."""

    def __init__(self, config: HolotronConfig, n_classes: int = AUX_CLASSES):
        super().__init__()
        d = config.text.hidden_size
        kinds = config.text.layer_kinds
        attn = [i for i, k in enumerate(kinds) if k == "attention"]
        self.layer = max(0, (attn[-1] if attn else len(kinds)) - 1)
        self.label_in = nn.Linear(d, n_classes)
        self.label_mid = nn.Linear(d, n_classes)
        self.pos_mid = nn.Linear(d, 2)
        self.merge = config.vision.merge
        self.char_in = nn.Linear(d, self.merge**2 * N_CHAR)  # the character under each of a token's patches
        self.ptr_q = nn.Linear(d, POINTER_DIM)
        self.ptr_k = nn.Linear(d, POINTER_DIM)

    def chars(self, emb: torch.Tensor) -> torch.Tensor:
        """Projector outputs (n, d) -> character logits (n * merge^2, N_CHAR), fp32."""
        return self.char_in(emb.to(self.char_in.weight.dtype)).float().reshape(-1, N_CHAR)


def tiling_scale(size: tuple[int, int], cfg: VisionConfig) -> tuple[float, float]:
    """The scales (x, y) at which the preprocessing's tiling shows a screen of ``size`` px to the vision
    tower: tile px / screen px on each axis of ``closest_grid``'s grid (one tile: the screen squeezed to a
    square, so the two differ by the screen's ratio)."""
    from .vision.preprocess import closest_grid

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
    whose tiling sets those scales, when the mosaics are not its tiles (default ``cfg``). Cells are ``cell_tokens`` image tokens on a side, so no token straddles two
    crops (default: the largest divisor of the tokens on a tile's side up to 4). Returns the uint8 tile (S, S, 3) and the text class under each image token (row-major, as
    ``image_token_targets``); with ``extra`` (a function (sample, px, py) -> int array of the points'
    shape) also its values on an ``extra_per_side`` x ``extra_per_side`` grid of points inside each
    token, (tokens, extra_per_side ** 2), points row-major as pixel shuffle reads a token's patches.
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
                tables[id(sm)] = _class_boxes(sm, n_classes)
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
            cls[r * cell_tokens:(r + 1) * cell_tokens, c * cell_tokens:(c + 1) * cell_tokens] = text_classes_at(sm, gx, gy, n_classes, tables[id(sm)])
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
        from .data import generate_sample

        base = self.seed * 10**12 + step * self.screens
        samples = [generate_sample(base + i, split=self.split) for i in range(self.screens)]
        rng = random.Random(base)
        tables, char_tables = {}, {id(sm): char_table(sm) for sm in samples}

        def chars_at(sm, px, py):
            return char_classes_at(sm, px, py, char_tables[id(sm)])

        tiles, classes, chars = zip(*(reading_tile(samples, self.mosaic, rng, scale="fit", extra=chars_at, tables=tables,
                                                   extra_per_side=self.vision.merge, fit=self.vision)
                                      for _ in range(self.batch_size)))
        x = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).contiguous()
        return {"pixel_values": x, "image_classes": torch.from_numpy(np.concatenate(classes)),
                "image_chars": torch.from_numpy(np.concatenate(chars)),
                "tokens": x.shape[0] * self.mosaic.tokens_per_tile}


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
    if groups is not None:
        counts = groups.to(dev)
        perm, inv, gain, off = (t.repeat_interleave(counts, dim=0) for t in (perm, inv, gain, off))
    xf = x.float() / 255.0
    xf = torch.gather(xf, 1, perm[:, :, None, None].expand_as(xf))
    xf = torch.where(inv, 1.0 - xf, xf)
    return (xf * gain + off).clamp(0, 1)


def reading_loss_fn(model: Holotron, aux: "AuxHeads", batch: dict, device: torch.device,
                    parts: dict | None = None, label_weight: float = 1.0, char_weight: float = 1.0,
                    augment: torch.Generator | bool | None = None) -> tuple[torch.Tensor, int]:
    """The reading stage's loss, from the projector output (vision tower + pixel shuffle + mlp1; the
    language model is not run): ``label_weight`` x the text-class cross-entropy on every image token +
    ``char_weight`` x the character cross-entropy on every patch (when the batch has "image_chars").
    ``augment``: apply ``colour_aug`` (True, or a torch.Generator for it). ``parts`` receives each term and
    the accuracies on tokens that show text and on patches that show a character."""
    from .vision.projector import embed_tiles

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
            parts["char_acc"] = float((char_logits[ink].argmax(-1) == chars[ink]).float().mean()) if bool(ink.any()) else 0.0
    return loss, int(cls.numel())


class ScreenBatches(torch.utils.data.Dataset):
    """Map-style dataset whose item ``step`` is the whole training batch of that step (see the module
    docstring): a dict with input_ids and labels (B, T) right-padded, pixel_values (tiles, 3, S, S) uint8,
    num_tiles (images,), and counts. Workers build their own Processor from ``tokenizer_dir``.
    ``chars``: also the character under each patch of each image token ("image_chars");
    ``short_followups``: the later questions of a screen as the target alone, not the whole prompt;
    ``grid_aug``: the share of screens tiled on a grid drawn by ``augmented_grid`` instead of the closest one."""

    def __init__(self, tokenizer_dir, vision: VisionConfig, batch_size: int, seed: int = 0, queries: int = 1,
                 split: str = "train", options: dict | None = None, *, chars: bool = False,
                 short_followups: bool = False, grid_aug: float = 0.0):
        if not 0.0 <= grid_aug <= 1.0:
            raise ValueError(f"grid_aug must be in [0, 1], got {grid_aug}")
        self.tokenizer_dir, self.vision, self.batch_size = str(tokenizer_dir), vision, batch_size
        self.seed, self.queries, self.split, self.options = seed, queries, split, dict(options or {})
        self.chars, self.short_followups, self.grid_aug = chars, short_followups, grid_aug
        self._processor, self._grid = None, None

    def __len__(self) -> int:
        return 2**62

    def __getstate__(self):  # workers (spawned or forked) build their own Processor
        return {**self.__dict__, "_processor": None}

    @property
    def processor(self) -> Processor:
        if self._processor is None:
            vis = self.vision
            self._processor = Processor.from_pretrained(self.tokenizer_dir,
                                                        image_processor=lambda im: uint8_tiles(im, vis, self._grid))
        return self._processor

    def sample_seed(self, step: int, i: int) -> int:
        return self.seed * 10**12 + step * self.batch_size + i

    def row(self, sample, rng: random.Random) -> tuple:
        """One screen -> (ids, labels, uint8 tiles, tiles per image, targets): targets holds the image-token
        classes and positions (``image_token_targets``; with ``chars`` the characters too) and, per
        question, the sequence position that predicts its answer's first token ("pointer_pos") and the
        image tokens on its element ("pointer_tokens", ``pointer_tokens``)."""
        from .data import to_messages

        p = self.processor
        messages = to_messages(sample)
        grid = None
        if self.grid_aug and rng.random() < self.grid_aug:
            grid = augmented_grid(sample.size, self.vision, rng)
        self._grid = grid  # read by the processor's image_processor
        try:
            prompt = p(messages[:-1], add_generation_prompt=True)  # the inference prompt, image expanded
        finally:
            self._grid = None
        ids = prompt["input_ids"][0].tolist()
        labels = [IGNORE] * len(ids)
        q_pos, boxes = [len(ids) - 1], [sample.target.box]
        ans = answer_ids(p, messages[-1]["content"])
        ids, labels = ids + ans, labels + ans
        for instruction, answer, box in extra_targets(sample, self.queries - 1, rng, boxes=True):
            follow = p.encode(followup_text(instruction, short=self.short_followups))
            ans = answer_ids(p, answer)
            q_pos.append(len(ids) + len(follow) - 1)
            boxes.append(box)
            ids += follow + ans
            labels += [IGNORE] * len(follow) + ans
        cls, pos, *chars = image_token_targets(sample, self.vision, chars=self.chars, grid=grid)
        targets = {"image_classes": cls, "image_positions": pos, "pointer_pos": q_pos,
                   "pointer_tokens": [pointer_tokens(b, sample.size, pos, cls) for b in boxes]}
        if chars:
            targets["image_chars"] = chars[0]
        return ids, labels, prompt["pixel_values"], prompt["num_tiles"].tolist(), targets

    def __getitem__(self, step: int) -> dict:
        from .data import generate_sample

        rows = []
        for i in range(self.batch_size):
            seed = self.sample_seed(step, i)
            sample = generate_sample(seed, split=self.split, **self.options)
            rows.append(self.row(sample, random.Random(seed)))
        return collate(rows, self.processor.pad_token_id)


def collate(rows, pad_id: int) -> dict:
    """Right-pad rows of (ids, labels, tiles, num_tiles[, targets]) into one batch (targets as
    ``ScreenBatches.row``'s; the pointer's become "pointer_queries" (Q, 2): (row, sequence position) per
    question, and "pointer_targets" (M, 2): (question, image token of its row) per token on its element)."""
    T = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    for b, (i, l, *_) in enumerate(rows):
        ids[b, :len(i)] = torch.tensor(i)
        labels[b, :len(l)] = torch.tensor(l)
    return {
        "input_ids": ids, "labels": labels,
        "pixel_values": torch.cat([r[2] for r in rows]),
        "num_tiles": torch.tensor([n for r in rows for n in r[3]], dtype=torch.long),
        "tokens": int(sum(len(r[0]) for r in rows)),
        **_collate_targets([r[4] for r in rows] if all(len(r) > 4 for r in rows) else []),
    }


def _collate_targets(targets: list[dict]) -> dict:
    out = {}
    if not targets:
        return out
    for key in ("image_classes", "image_positions", "image_chars"):
        if all(key in t for t in targets):
            out[key] = torch.cat([t[key] for t in targets])
    if all("pointer_pos" in t for t in targets):
        queries, pairs = [], []
        for b, t in enumerate(targets):
            for pos, toks in zip(t["pointer_pos"], t["pointer_tokens"]):
                pairs += [(len(queries), int(i)) for i in toks]
                queries.append((b, pos))
        out["pointer_queries"] = torch.tensor(queries, dtype=torch.long).reshape(-1, 2)
        out["pointer_targets"] = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
    return out


# ----------------------------------------------------------------------------------------------
# the loss
# ----------------------------------------------------------------------------------------------

def loss_fn(model: Holotron, batch: dict, device: torch.device, aux: AuxHeads | None = None,
            aux_weight: float = 0.0, parts: dict | None = None, char_weight: float = 1.0,
            pointer_weight: float = 0.0, augment: torch.Generator | bool | None = None,
            pointer_heads: int = 0) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the answer tokens of a (right-padded) batch; also their count.

    With ``aux`` and ``aux_weight > 0`` (and the batch's image-token targets) the loss adds
    ``aux_weight`` x (text-class cross-entropy on the projector output + the same and an L1 position loss
    (x 10) on the residual stream entering the last attention layer), averaged over image tokens, and,
    when the batch has "image_chars", ``char_weight`` x the character cross-entropy per patch on the
    projector output, and, when the batch has pointer targets, ``pointer_weight`` x ``pointer_loss`` (with
    ``pointer_heads`` > 0: ``attention_pointer_loss`` on that many heads of the last attention layer instead).
    ``augment``: ``colour_aug`` each screen (all its tiles alike; True, or a torch.Generator for it).
    ``parts`` (a dict) receives each term as a float."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    pixel_values = normalize_tiles(batch["pixel_values"].to(device, non_blocking=True), model.config.vision,
                                   augment, batch["num_tiles"])
    emb = model.embed_inputs(ids, pixel_values)                  # (B, T, D)
    use_aux = aux is not None and aux_weight > 0 and "image_classes" in batch
    mid, hook = {}, None
    if use_aux:
        blk = model.language_model.backbone.layers[aux.layer]
        hook = blk.register_forward_hook(lambda mod, args, out: mid.__setitem__("h", out))
    try:
        h = model.language_model.hidden_states(inputs_embeds=emb)    # (B, T, D), plain causal
    finally:
        if hook is not None:
            hook.remove()
    target = labels[:, 1:]                                       # position t predicts token t + 1
    keep = target != IGNORE
    logits = model.language_model.lm_head(h[:, :-1][keep])       # (n, V): only where there is a label
    loss = F.cross_entropy(logits.float(), target[keep])
    if parts is not None:
        parts["answer"] = float(loss.detach())
    if use_aux:
        is_img = ids == model.config.image_token_id
        cls = batch["image_classes"].to(device, non_blocking=True)
        pos = batch["image_positions"].to(device, non_blocking=True)
        if int(is_img.sum()) != cls.numel():
            raise ValueError(f"{int(is_img.sum())} image tokens but {cls.numel()} image-token targets")
        l_in = F.cross_entropy(aux.label_in(emb[is_img].to(aux.label_in.weight.dtype)).float(), cls, ignore_index=IGNORE)
        hm = mid["h"][is_img].to(aux.label_mid.weight.dtype)
        l_mid = F.cross_entropy(aux.label_mid(hm).float(), cls, ignore_index=IGNORE)
        l_pos = 10 * F.l1_loss(aux.pos_mid(hm).float(), pos)
        loss = loss + aux_weight * (l_in + l_mid + l_pos)
        if parts is not None:
            parts.update(label_in=float(l_in.detach()), label_mid=float(l_mid.detach()), position=float(l_pos.detach()))
        if "image_chars" in batch and char_weight > 0:
            chars = batch["image_chars"].to(device, non_blocking=True).reshape(-1)
            l_char = F.cross_entropy(aux.chars(emb[is_img]), chars, ignore_index=IGNORE)
            loss = loss + aux_weight * char_weight * l_char
            if parts is not None:
                parts["char"] = float(l_char.detach())
        if "pointer_queries" in batch and pointer_weight > 0:
            if pointer_heads > 0:
                block = model.language_model.backbone.layers[aux.layer + 1]
                l_ptr, acc = attention_pointer_loss(block, mid["h"], is_img, batch["pointer_queries"].to(device),
                                                    batch["pointer_targets"].to(device), keep, pointer_heads)
            else:
                l_ptr, acc = pointer_loss(aux, mid["h"], is_img, batch["pointer_queries"].to(device),
                                          batch["pointer_targets"].to(device))
            loss = loss + aux_weight * pointer_weight * l_ptr
            if parts is not None:
                parts.update(pointer=float(l_ptr.detach()), pointer_acc=acc)
    return loss, int(keep.sum())


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def save_checkpoint(model: Holotron, folder, tokenizer_dir, *, dtype: torch.dtype = torch.float32,
                    max_shard_size="5GB", state: dict | None = None, optimizer=None, aux: nn.Module | None = None) -> Path:
    """Write a checkpoint that ``holotron.load`` and ``Processor.from_pretrained`` read: the model in
    ``dtype`` (the SSM constants stay fp32), generation_config.json, the tokenizer files and
    ``trainer_state.json``; with ``optimizer``, ``training_state.pt`` (fp32 weights + AdamW state) too."""
    folder = Path(folder)
    cpu = copy.deepcopy(model).to("cpu").to(dtype)
    cpu.generation_config = dict(GENERATION_CONFIG)
    save_pretrained(cpu, folder, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file() and src.resolve() != (folder / name).resolve():
            shutil.copyfile(src, folder / name)
    if state is not None:
        (folder / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n")
    if aux is not None:  # training-only heads, beside the model (holotron.load never reads them)
        torch.save({k: v.detach().cpu() for k, v in aux.state_dict().items()}, folder / AUX_FILE)
    if optimizer is not None:
        tmp = folder / "training_state.pt.tmp"
        extra = {} if aux is None else {"aux": {k: v.detach().cpu() for k, v in aux.state_dict().items()}}
        torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                    "optimizer": optimizer.state_dict(), "step": (state or {}).get("step", 0), **extra}, tmp)
        os.replace(tmp, folder / "training_state.pt")
    return folder


# ----------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------

def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"holotron.train: error: --device {name}: no CUDA GPU here")
    return dev


def _given_tokenizer(args) -> Path | None:
    """The tokenizer folder the command line names: --tokenizer, else the --resume or --init-from checkpoint's
    own (every checkpoint holds its tokenizer files), else None (train one into OUT/tokenizer)."""
    if args.tokenizer:
        return Path(args.tokenizer)
    from .bundled import bundled_path

    for folder in (args.resume, args.init_from):
        path = folder and (Path(folder) if Path(folder).is_dir() else bundled_path(str(folder)))
        if path and (path / "tokenizer.json").is_file():
            return path
    return None


def _check_inputs(args):
    """Fail on a bad tokenizer or --init-from checkpoint before anything is written (OUT, a tokenizer).
    Returns the --init-from model, loaded on the CPU in float32, or None."""
    from .processor import ProcessorError
    from .weights import CheckpointError, load

    tok = _given_tokenizer(args)
    if tok is not None:
        try:
            Processor.from_pretrained(tok)
        except (ProcessorError, OSError) as e:
            what = "--tokenizer" if args.tokenizer else "the tokenizer of --resume / --init-from"
            raise SystemExit(f"holotron.train: error: {what} {tok}: {e}") from None
    if not args.init_from:
        return None
    try:
        return load(args.init_from, dtype=torch.float32, device="cpu")
    except (CheckpointError, OSError) as e:
        raise SystemExit(f"holotron.train: error: --init-from {args.init_from}: {e}") from None


def _tokenizer(args, out: Path, log) -> Path:
    if (given := _given_tokenizer(args)) is not None:
        return given
    from .tokenizer import build_task_tokenizer

    folder = out / "tokenizer"
    if not (folder / "tokenizer.json").is_file():
        t = time.perf_counter()
        build_task_tokenizer(folder, args.vocab_size, args.tokenizer_corpus)
        log(f"trained the tokenizer ({args.vocab_size} tokens) on {args.tokenizer_corpus} screens in "
            f"{time.perf_counter() - t:.1f} s -> {folder}")
    return folder


def train(args) -> dict:
    """Run training as ``args`` (the parsed command line) says; returns the final trainer state."""
    t_start = time.perf_counter()
    init_src = _check_inputs(args)
    out = Path(args.out)  # made once the setup below has passed its checks (a tokenizer trained into it makes it)
    bar = Progress(args.steps, "train", every_s=args.log_seconds,
                   deadline=t_start + 60 * args.time_budget if args.time_budget else None)
    log = bar.write
    device = _device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    tok_dir = _tokenizer(args, out, log)
    processor = Processor.from_pretrained(tok_dir)
    vocab = processor.vocab_size
    config = make_config(args.config, vocab, args.set)
    model = init_weights(Holotron(config), args.seed).to(device)
    n_params = model.num_parameters()

    reading = args.stage == "read"
    aux = AuxHeads(config).to(device) if (args.aux_weight > 0 or reading) else None
    if args.init_from:
        _init_from(model, aux, init_src, args.init_from, log)
    if reading:  # the vision tower, the projector and the text-class head; the language model waits
        trainable = nn.ModuleList([model.vision_model, model.mlp1, aux.label_in, aux.char_in])
    else:
        trainable = model if aux is None else nn.ModuleList([model, aux])
    opt = make_optimizer(trainable, args.lr, args.weight_decay, fused=device.type == "cuda")
    step, history, evals, elapsed_before = 0, [], [], 0.0
    if args.resume:
        ts_file, st_file = Path(args.resume) / "training_state.pt", Path(args.resume) / "trainer_state.json"
        if not (ts_file.is_file() and st_file.is_file()):
            raise SystemExit(f"holotron.train: error: --resume {args.resume}: no training_state.pt / trainer_state.json "
                             "there (a checkpoint written with --save-optimizer is needed)")
        prev_stage = json.loads(st_file.read_text()).get("args", {}).get("stage", "ground")
        if prev_stage != args.stage:
            raise SystemExit(f"holotron.train: error: --resume {args.resume}: that run was --stage {prev_stage}; "
                             f"resume it with the same stage, or start a new run from it with --init-from")
        ts = torch.load(ts_file, map_location="cpu", weights_only=True)
        if (aux is None) != ("aux" not in ts):
            raise SystemExit(f"holotron.train: error: --resume {args.resume}: that run was trained "
                             f"{'with' if 'aux' in ts else 'without'} --aux-weight; resume it the same way")
        model.load_state_dict(ts["model"])
        if aux is not None:
            aux.load_state_dict(ts["aux"])
        opt.load_state_dict(ts["optimizer"])
        prev = json.loads((Path(args.resume) / "trainer_state.json").read_text())
        step, history, evals = ts["step"], prev.get("log", []), prev.get("evals", [])
        elapsed_before = prev.get("train_seconds", 0.0)
        log(f"resumed from {args.resume} at step {step}")

    out.mkdir(parents=True, exist_ok=True)
    vcfg = config.vision
    log(f"model {args.config}: {n_params / 1e6:.2f} M parameters (vision {sum(p.numel() for p in model.vision_model.parameters()) / 1e6:.2f} M, "
        f"mlp1 {sum(p.numel() for p in model.mlp1.parameters()) / 1e6:.2f} M, language model "
        f"{model.language_model.num_parameters() / 1e6:.2f} M); tiles {vcfg.image_size} px, up to {vcfg.max_num_tiles} "
        f"{'+ thumbnail' if vcfg.use_thumbnail and vcfg.max_num_tiles > 1 else '(no thumbnail)'}, "
        f"{vcfg.tokens_per_tile} tokens each; device {device}")

    if reading:
        data = ReadingBatches(vcfg, args.batch_size, args.seed, max(1, args.batch_size // 8), args.split, args.read_tile)
    else:
        data = ScreenBatches(tok_dir, vcfg, args.batch_size, args.seed, args.queries, args.split,
                             chars=aux is not None and args.char_weight > 0,
                             options={"layout": tuple(args.layouts)} if args.layouts else None,
                             short_followups=args.followups == "short", grid_aug=args.grid_aug)
    # the reading stage: characters alone for the first --labels-after of the run, then label classes beside them
    labels_after = (0.5 if args.labels_after is None else args.labels_after) if reading and args.char_weight > 0 else 0.0
    aug_gen = None
    if args.colour_aug == "on" or (args.colour_aug == "auto" and reading):
        aug_gen = torch.Generator(device=device).manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, sampler=range(step // args.reuse, -(-args.steps // args.reuse)), num_workers=args.workers,
        pin_memory=device.type == "cuda", prefetch_factor=args.prefetch if args.workers else None,
        persistent_workers=False)

    eval_examples = eval_reading = None
    if reading and args.eval_every:  # fixed tiles from screens of the eval split
        eval_reading = ReadingBatches(vcfg, max(8, args.eval_n), seed=10**6, split=args.eval_split, tile=args.read_tile)[0]
    elif args.eval_every and args.eval_n:
        from .eval import synthetic_examples
        eval_examples = list(synthetic_examples(args.eval_n, split=args.eval_split))
        eval_proc = Processor.from_pretrained(tok_dir, image_processor=lambda im: _float_tiles(im, vcfg))

    budget_s = args.time_budget * 60 if args.time_budget else None
    stop_reason = "steps"
    interrupted = {"flag": False}

    def on_term(signum, frame):  # SIGTERM (a job scheduler's stop): finish the step, save, exit
        interrupted["flag"] = True

    try:
        old_term = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: no handler, Ctrl-C and the budget still stop cleanly
        old_term = None
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    ema, ema_sum, n_run, t_loop, tokens_seen = 0.0, 0.0, 0, time.perf_counter(), 0
    t_prev, window_tokens, window_samples, window_wait = time.perf_counter(), 0, 0, 0.0
    save_s = eval_s = 0.0
    prof, prof_end = None, step + _PROFILE_SKIP + 1 + args.profile
    if args.profile:  # where a step's time goes: a table of the busiest operators, written once
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = torch.profiler.profile(activities=acts, schedule=torch.profiler.schedule(
            skip_first=_PROFILE_SKIP, wait=0, warmup=1, active=args.profile, repeat=1))
        prof.start()
    model.train()
    try:
        # Triton's scan has no backward: train every Mamba layer through the chunked PyTorch scan
        with kernels.use_backend("chunked"):
            t_ready = time.perf_counter()
            for batch in _repeat(loader, args.reuse, skip=step % args.reuse):
                window_wait += time.perf_counter() - t_ready  # time the GPU / CPU sat waiting for data
                progress = step / args.steps
                if budget_s:  # the schedule ends with whichever comes first: the steps or this run's minutes
                    progress = max(progress, (time.perf_counter() - t_start) / budget_s)
                lr = lr_at(progress, args.lr, args.warmup, args.min_lr_ratio)
                for group in opt.param_groups:
                    group["lr"] = lr
                parts = {} if (step + 1) % args.log_every == 0 or step + 1 == args.steps else None
                with amp:
                    if reading:
                        loss, n_labels = reading_loss_fn(model, aux, batch, device, parts,
                                                         label_weight=float(progress >= labels_after),
                                                         char_weight=args.char_weight, augment=aug_gen)
                    else:
                        loss, n_labels = loss_fn(model, batch, device, aux, args.aux_weight, parts, args.char_weight,
                                                 args.pointer_weight, augment=aug_gen, pointer_heads=args.pointer_heads)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(trainable.parameters(), args.grad_clip)
                opt.step()
                step += 1
                if prof is not None:
                    prof.step()
                    if step == prof_end:
                        _write_profile(prof, out / "profile.txt", device, args.profile, log)
                        prof = None
                lv = float(loss.detach())
                ema_sum = 0.95 * ema_sum + 0.05 * lv
                n_run += 1
                ema = ema_sum / (1 - 0.95**n_run)  # bias-corrected moving average of the loss
                tokens_seen += batch["tokens"]
                window_tokens += batch["tokens"]
                window_samples += args.batch_size
                now = time.perf_counter()
                if step % args.log_every == 0 or step == args.steps:
                    dt = now - t_prev
                    history.append({"step": step, "loss": round(lv, 5), "loss_ema": round(ema, 5), "lr": lr,
                                    "grad_norm": round(float(gnorm), 4), "tokens_per_s": round(window_tokens / dt),
                                    "screens_per_s": round(window_samples / dt, 2),
                                    "data_wait": round(window_wait / dt, 3),
                                    **{k: round(v, 5) for k, v in (parts or {}).items()},
                                    "seconds": round(now - t_loop + elapsed_before, 2)})
                    t_prev, window_tokens, window_samples, window_wait = now, 0, 0, 0.0
                last = history[-1] if history else {}
                rate = {"tiles_s" if reading else "screens_s": f"{last.get('screens_per_s', 0)}"}  # the batch's items
                bar.update(step, loss=f"{ema:.4f}", lr=f"{lr:.2e}", tok_s=f"{last.get('tokens_per_s', 0):,}",
                           **rate, data_wait=f"{last.get('data_wait', 0):.0%}")
                if (eval_examples or eval_reading) and (step % args.eval_every == 0):
                    t = time.perf_counter()
                    evals.append(_eval(model, eval_proc, eval_examples, device, step, log) if eval_examples
                                 else _eval_reading(model, aux, eval_reading, device, step, log, amp))
                    eval_s = time.perf_counter() - t
                    model.train()
                if args.save_every and step % args.save_every == 0 and step < args.steps:
                    t = time.perf_counter()
                    folder = out / f"checkpoint-{step}"
                    save_checkpoint(model, folder, tok_dir, dtype=getattr(torch, args.save_dtype),
                                    max_shard_size=args.max_shard_size,
                                    state=_state(args, step, history, evals, n_params, now - t_loop + elapsed_before, "running"),
                                    optimizer=opt if args.save_optimizer else None, aux=aux)
                    for old in out.glob("checkpoint-*"):  # keep the latest only
                        if old != folder and old.is_dir():
                            shutil.rmtree(old)
                    save_s = time.perf_counter() - t
                if step >= args.steps:  # (with --reuse the last batch's repeats may run past it)
                    break
                if interrupted["flag"]:
                    stop_reason = "signal"
                    break
                # leave room for the final save (and the final eval) within this run's budget
                reserve = 2 * save_s + 5 + (eval_s if args.final_eval else 0.0)
                if budget_s and time.perf_counter() - t_start + reserve >= budget_s:
                    stop_reason = "time budget"
                    break
                t_ready = time.perf_counter()
    except KeyboardInterrupt:
        stop_reason = "interrupted"
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if prof is not None:  # the run ended before the profiled steps did: nothing is written
            prof.stop()
        bar.close()
    train_s = time.perf_counter() - t_loop + elapsed_before
    if (eval_examples or eval_reading) and (not evals or evals[-1]["step"] != step) and stop_reason != "interrupted" \
            and args.final_eval:
        evals.append(_eval(model, eval_proc, eval_examples, device, step, log) if eval_examples
                     else _eval_reading(model, aux, eval_reading, device, step, log, amp))
    state = _state(args, step, history, evals, n_params, train_s, stop_reason)
    save_checkpoint(model, out, tok_dir, dtype=getattr(torch, args.save_dtype), max_shard_size=args.max_shard_size,
                    state=state, optimizer=opt if args.save_optimizer else None, aux=aux)
    _write_csv(out / "train_log.csv", history)
    log(f"stopped after step {step} ({stop_reason}); {format_seconds(train_s)} training, {tokens_seen:,} tokens; "
        f"checkpoint in {out}")
    return state


def _float_tiles(image, cfg: VisionConfig):
    from .vision.preprocess import preprocess_image

    return preprocess_image(image, cfg)


@torch.no_grad()
def _eval_reading(model, aux, batch, device, step, log, amp) -> dict:
    model.eval()
    parts = {}
    with amp:
        reading_loss_fn(model, aux, batch, device, parts)
    chars = f", {100 * parts['char_acc']:.1f}% of characters" if "char_acc" in parts else ""
    log(f"reading eval at step {step}: {100 * parts['read_acc']:.1f}% of text tokens read right{chars}, "
        f"loss {parts['read']:.3f}")
    model.train()
    return {"step": step, "read_acc": parts["read_acc"], "read_loss": parts["read"],
            **({"char_acc": parts["char_acc"], "char_loss": parts["char"]} if "char_acc" in parts else {})}


_PROFILE_SKIP = 5  # steps left out of a --profile (start-up, allocator and autotuning warm-up)


def _write_profile(prof, path: Path, device: torch.device, steps: int, log) -> None:
    """Stop ``prof`` and write its operator table (sorted by device time on CUDA, else CPU time) to ``path``."""
    prof.stop()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"# holotron.train --profile {steps}: steps {_PROFILE_SKIP + 2}-{_PROFILE_SKIP + 1 + steps} "
                   f"of this run, sorted by {key}\n{table}\n")
    os.replace(tmp, path)
    log(f"profile of {steps} steps written to {path}")


def pointer_loss(aux: AuxHeads, h: torch.Tensor, is_img: torch.Tensor, queries: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The pointer's loss: for each question, a softmax over its row's image tokens of
    ptr_q(h at the question's answering position) . ptr_k(h at the token) / sqrt(dim), and minus the log of
    the probability it puts on the tokens of the question's element; mean over questions. Also the share of
    questions whose best-scored token is on their element. h: (B, T, D) residual stream; is_img (B, T)."""
    dtype = aux.ptr_q.weight.dtype
    qv = aux.ptr_q(h[queries[:, 0], queries[:, 1]].to(dtype)).float()          # (Q, dim)
    losses, hits = [], 0
    for b in torch.unique(queries[:, 0]).tolist():
        qi = (queries[:, 0] == b).nonzero().squeeze(1)                            # this row's questions
        kv = aux.ptr_k(h[b][is_img[b]].to(dtype)).float()                         # (n_img, dim)
        scores = qv[qi] @ kv.T / math.sqrt(kv.shape[1])                           # (q_b, n_img)
        on = torch.zeros_like(scores, dtype=torch.bool)
        sel = torch.isin(targets[:, 0], qi)
        local = torch.searchsorted(qi, targets[sel, 0])                           # question -> row of scores
        on[local, targets[sel, 1]] = True
        losses.append(torch.logsumexp(scores, 1) - torch.logsumexp(scores.masked_fill(~on, float("-inf")), 1))
        hits += int(on.gather(1, scores.argmax(1, keepdim=True)).sum())
    loss = torch.cat(losses).mean()
    return loss, hits / max(1, queries.shape[0])


def answer_spans(keep: torch.Tensor, queries: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """Per question (row, position that predicts its answer's first token), the positions that predict its
    answer's tokens: the run of ``keep`` (B, T - 1; position t predicts a labelled token) from that position.
    Returns flat lists (question, row, position)."""
    k = keep.detach().cpu().numpy()
    qs, rows, pos = [], [], []
    for j, (b, t) in enumerate(queries.tolist()):
        run = k[b, t:]
        n = int(run.argmin()) if not run.all() else len(run)
        qs += [j] * max(n, 1)
        rows += [b] * max(n, 1)
        pos += list(range(t, t + max(n, 1)))
    return qs, rows, pos


def attention_scores(block: nn.Module, h: torch.Tensor, positions: torch.Tensor, heads: int) -> torch.Tensor:
    """The pre-softmax scores of the first ``heads`` query heads of the attention layer ``block`` (whose input
    residual stream for one row is ``h``, (t, D)), from each of ``positions`` (P,) over the tokens ``h[:t]``,
    as the layer computes them (``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), grouped KV heads), the
    tokens after each position masked to -inf (causal). Returns (heads, P, t), float32."""
    attn = block.mixer
    hd, r = attn.head_dim, attn.n_heads // attn.n_kv_heads
    heads = min(heads, attn.n_heads)
    t = h.shape[0]
    u = block.norm(h.to(block.norm.weight.dtype))                                          # (t, D)
    q = attn.q_proj(u[positions]).view(len(positions), attn.n_heads, hd)[:, :heads].float()  # (P, heads, hd)
    k = attn.k_proj(u).view(t, attn.n_kv_heads, hd).float()                                 # (t, Hkv, hd)
    kv = torch.arange(heads, device=h.device) // r
    scores = torch.einsum("phd,thd->hpt", q, k[:, kv]) / math.sqrt(hd)                      # (heads, P, t)
    visible = torch.arange(t, device=h.device)[None, :] <= positions[:, None]               # (P, t)
    return scores.masked_fill(~visible, float("-inf"))


def attention_pointer_loss(block: nn.Module, h: torch.Tensor, is_img: torch.Tensor, queries: torch.Tensor,
                           targets: torch.Tensor, keep: torch.Tensor, heads: int) -> tuple[torch.Tensor, float]:
    """The pointer on the model's own attention: for the first ``heads`` query heads of the attention
    layer ``block`` (whose input residual stream is ``h``, (B, T, D)), at every position that predicts a
    token of a question's answer (``answer_spans``), the softmax of that head's scores over the tokens the
    position sees (as the layer computes them: ``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), causal),
    and minus the log of the probability it puts on the image tokens of the question's element; mean over
    heads and positions. So the layer that feeds the answer attends to the element and its values carry
    the element's position (which one tile's ViT position code states) into the digits. Also the share of
    (head, position) pairs whose most-attended token is on the element."""
    qs, rows, pos = answer_spans(keep, queries)
    dev = h.device
    qs_t, rows_t, pos_t = (torch.tensor(v, device=dev) for v in (qs, rows, pos))
    losses, hits, total = [], 0, 0
    for b in torch.unique(rows_t).tolist():
        sel = (rows_t == b).nonzero().squeeze(1)
        p, qj = pos_t[sel], qs_t[sel]
        t_max = int(p.max()) + 1
        scores = attention_scores(block, h[b, :t_max], p, heads)                  # (heads, P, t), causal
        visible = torch.isfinite(scores[0])                                        # (P, t)
        img_pos = is_img[b, :t_max].nonzero().squeeze(1)                          # image token -> position
        on = torch.zeros(len(p), t_max, dtype=torch.bool, device=dev)
        tq = targets[torch.isin(targets[:, 0], qj)]                                # (question, image token)
        match = (qj[:, None] == tq[None, :, 0])                                    # (P, pairs)
        pi, ti = match.nonzero(as_tuple=True)
        on[pi, img_pos[tq[ti, 1]]] = True
        on &= visible
        losses.append((torch.logsumexp(scores, -1) - torch.logsumexp(scores.masked_fill(~on, float("-inf")), -1)).reshape(-1))
        hits += int(on[None].expand_as(scores).gather(2, scores.argmax(-1, keepdim=True)).sum())
        total += scores.shape[0] * scores.shape[1]
    return torch.cat(losses).mean(), hits / max(1, total)


def _repeat(batches, times: int, skip: int = 0):
    """Each batch ``times`` times in a row (``--reuse``), the first one ``skip`` times fewer (a resumed run
    picks up in the middle of a batch's repeats)."""
    for i, batch in enumerate(batches):
        for _ in range(times - (skip if i == 0 else 0)):
            yield batch


def _init_from(model: Holotron, aux, src, folder, log) -> None:
    """Start from ``src``, the model loaded from checkpoint ``folder`` (a fresh optimizer and schedule, unlike
    --resume); the auxiliary heads too when the folder holds them (aux_heads.pt, written by every run that
    trains them)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if not isinstance(src, Holotron) or {k: tuple(v.shape) for k, v in src.state_dict().items()} != shapes:
        raise SystemExit(f"holotron.train: error: --init-from {folder}: not a checkpoint of this --config "
                         "(same preset and --set overrides and tokenizer needed)")
    model.load_state_dict(src.state_dict())
    heads = Path(folder) / AUX_FILE
    if aux is not None and heads.is_file():
        missing, unexpected = aux.load_state_dict(torch.load(heads, map_location="cpu", weights_only=True), strict=False)
        if unexpected or any(not k.startswith(("char_in.", "ptr_q.", "ptr_k.")) for k in missing):
            raise SystemExit(f"holotron.train: error: --init-from {folder}: {AUX_FILE} does not fit these heads "
                             f"(missing {missing}, unexpected {unexpected})")
        fresh = sorted({k.split(".")[0] for k in missing})
        log(f"initialised from {folder} (model and auxiliary heads{'; fresh ' + ', '.join(fresh) if fresh else ''})")
    else:
        log(f"initialised from {folder}")


def _eval(model, processor, examples, device, step, log) -> dict:
    from .eval import evaluate

    model.eval()
    with kernels.use_backend("chunked"):
        rep = evaluate(model, processor, examples, batch_size=16, device=device, progress=False)
    log(f"eval at step {step}: {rep.hits}/{rep.n} = {100 * rep.accuracy:.1f}% point-in-box "
        f"(95% CI {100 * rep.ci[0]:.1f}-{100 * rep.ci[1]:.1f}), {rep.unparseable} unparseable")
    return {"step": step, "n": rep.n, "hits": rep.hits, "accuracy": rep.accuracy, "ci": list(rep.ci),
            "unparseable": rep.unparseable}


def _state(args, step, history, evals, n_params, seconds, status) -> dict:
    return {"step": step, "status": status, "train_seconds": round(seconds, 2), "parameters": n_params,
            "args": {k: v for k, v in vars(args).items()}, "evals": evals, "log": history}


def _write_csv(path: Path, history: list[dict]) -> None:
    if not history:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in history for k in row)))
        w.writeheader()
        w.writerows(history)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m holotron.train",
                                description="Train a holotron VL model on streamed synthetic GUI screens.")
    p.add_argument("--config", default="tiny-ui", help=f"architecture preset: {', '.join(PRESETS)} (default tiny-ui)")
    p.add_argument("--set", action="append", default=[], metavar="PART.FIELD=VALUE",
                   help="override a size, e.g. --set vision.image_size=448 --set text.hidden_size=256 (repeatable)")
    p.add_argument("--out", required=True, help="checkpoint folder (written at the end, and every --save-every steps)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32, help="screens per step")
    p.add_argument("--queries", type=int, default=1, help="questions per screen (turns of one conversation)")
    p.add_argument("--read-tile", type=int, default=None, metavar="PX",
                   help="--stage read: the side of the reading mosaics in px (default the config's tile); the text in "
                        "them keeps the scales the config's tiling shows screens at (e.g. 384 for tiny-ui: the cells "
                        "of a 1024 px mosaic attend to each other's unrelated text)")
    p.add_argument("--grid-aug", type=float, default=0.0, metavar="P",
                   help="grounding: the share of screens tiled on a random grid near their ratio instead of the "
                        "closest one (augmented_grid), so the tile count does not give the grid away (default 0)")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT",
                   help="grounding: the screen layouts to train on instead of the split's own (holotron.data.LAYOUTS; "
                        "e.g. the training five and 'mosaic', random panes in no split's defaults)")
    p.add_argument("--followups", default="full", choices=["full", "short"],
                   help="the 2nd..Nth questions of a screen: the whole localisation prompt (full, default) or the "
                        "target alone (short: about 10 tokens instead of 170, so more questions per screen for the "
                        "same tokens; the first question always has the whole prompt, as at inference)")
    p.add_argument("--stage", default="ground", choices=["ground", "read"],
                   help="ground (default): the grounding task on whole screens; read: the vision tower, projector and "
                        "character and text-class heads alone, on tile mosaics of text crops (start a ground run from it with "
                        "--init-from)")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from this checkpoint's weights (and its aux_heads.pt), with a fresh optimizer and schedule")
    p.add_argument("--char-weight", type=float, default=1.0,
                   help="weight of the per-patch character loss (the character under each patch: a local target the "
                        "vision tower learns fast); in a ground run it is further scaled by --aux-weight; 0: off")
    p.add_argument("--pointer-weight", type=float, default=0.0,
                   help="weight of the pointer loss (scaled by --aux-weight): from the position that answers a "
                        "question, score the image tokens and put the probability on the question's element "
                        "(the lookup the last attention layer must learn); 0 (default): off")
    p.add_argument("--pointer-heads", type=int, default=0, metavar="N",
                   help="put the pointer loss on the first N heads of the last attention layer itself, at every "
                        "position that writes an answer token, instead of on a training-only head: the "
                        "layer that feeds the digits then looks at the element (default 0: the training-only head)")
    p.add_argument("--labels-after", type=float, default=None, metavar="FRACTION",
                   help="reading stage: train characters alone for this fraction of the run, then the label classes "
                        "beside them (default 0.5; 0 when --char-weight is 0)")
    p.add_argument("--colour-aug", default="auto", choices=["auto", "on", "off"],
                   help="colour augmentation (per tile in the reading stage, per screen in grounding: a random channel "
                        "order, inversion half the time, a random gain and offset); auto (default): reading stage only")
    p.add_argument("--aux-weight", type=float, default=0.0,
                   help="weight of the auxiliary image-token losses (text class under each token, its screen "
                        "position; training-only heads, not saved with the model); 0 (default): answer loss only")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.05, help="warm-up as a fraction of the run (default 0.05)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr of the cosine decay")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seeds the initialisation and the data stream")
    p.add_argument("--time-budget", type=float,
                   help="minutes for this run, setup included: stop cleanly, eval and save before they run out; "
                        "the lr schedule then ends with whichever comes first, --steps or the minutes")
    p.add_argument("--workers", type=int, default=max(0, min(16, (os.cpu_count() or 1) - 1)),
                   help="data worker processes (0: render in the training process)")
    p.add_argument("--prefetch", type=int, default=4, help="batches each worker prepares ahead")
    p.add_argument("--reuse", type=int, default=1,
                   help="steps each data batch is used for (default 1): where rendering cannot keep up with the "
                        "device, e.g. the reading stage, whose colour augmentation draws anew at each use")
    p.add_argument("--split", default="train", help="holotron.data split the training screens come from")
    p.add_argument("--tokenizer", help="folder with tokenizer.json + tokenizer_config.json (default: the --resume or "
                   "--init-from checkpoint's own, else train one into OUT/tokenizer)")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--tokenizer-corpus", type=int, default=4000, help="screens in the tokenizer's corpus")
    p.add_argument("--eval-every", type=int, default=500, help="steps between evals (0: none)")
    p.add_argument("--eval-n", type=int, default=64, help="held-out screens per eval")
    p.add_argument("--eval-split", default="heldout")
    p.add_argument("--no-final-eval", dest="final_eval", action="store_false", help="skip the eval at the end")
    p.add_argument("--log-every", type=int, default=10, help="steps between entries of the loss log")
    p.add_argument("--log-seconds", type=float, default=15.0, help="seconds between progress lines off a terminal")
    p.add_argument("--save-every", type=int, default=0,
                   help="steps between checkpoints in OUT/checkpoint-STEP (0: only the final one in OUT)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--save-optimizer", action="store_true", help="also write training_state.pt (for --resume)")
    p.add_argument("--max-shard-size", default="5GB", help="e.g. 14MB")
    p.add_argument("--resume", help="a checkpoint folder written with --save-optimizer: continue from its step")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help=f"profile N steps after the first {_PROFILE_SKIP + 1} (torch.profiler) and write the busiest "
                        "operators to OUT/profile.txt (default 0: off)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.profile < 0:
        raise SystemExit(f"holotron.train: error: --profile must be >= 0, got {args.profile}")
    if args.steps < 1 or args.batch_size < 1 or args.queries < 1 or args.reuse < 1:
        raise SystemExit("holotron.train: error: --steps, --batch-size, --queries and --reuse must be >= 1")
    if args.labels_after is not None and not 0 <= args.labels_after < 1:
        raise SystemExit(f"holotron.train: error: --labels-after must be in [0, 1), got {args.labels_after}")
    if not 0 <= args.grid_aug <= 1:
        raise SystemExit(f"holotron.train: error: --grid-aug must be in [0, 1], got {args.grid_aug}")
    if args.layouts:
        from .data import LAYOUTS, SPLITS

        bad = [name for name in args.layouts if name not in LAYOUTS]
        if bad:
            raise SystemExit(f"holotron.train: error: --layouts: unknown layout {bad[0]!r} (known: {', '.join(LAYOUTS)})")
        if args.stage == "read":
            raise SystemExit("holotron.train: error: --layouts picks grounding screens; leave it out of --stage read")
        scored = SPLITS[args.eval_split].layouts if args.eval_split in SPLITS and args.eval_split != args.split else ()
        held = [name for name in args.layouts if name in scored]
        if held:
            raise SystemExit(f"holotron.train: error: --layouts: {held[0]!r} is a layout of the {args.eval_split} split, "
                             "which the evals score: training on it would void them")
    if args.grid_aug and args.stage == "read":
        raise SystemExit("holotron.train: error: --grid-aug tiles grounding screens; the reading stage's mosaics "
                         "have no grid: leave it out of --stage read")
    if args.read_tile is not None:
        if args.stage != "read":
            raise SystemExit("holotron.train: error: --read-tile sizes the reading stage's mosaics: use it with --stage read")
        try:
            dataclasses.replace(make_config(args.config, 256, args.set).vision, image_size=args.read_tile)
        except ValueError as e:
            raise SystemExit(f"holotron.train: error: --read-tile {args.read_tile}: {e}") from None
    if args.grid_aug:
        try:
            vision = make_config(args.config, 256, args.set).vision
        except ValueError:
            vision = None  # train() reports a bad --config / --set
        if vision is not None and vision.max_num_tiles < 2:
            raise SystemExit(f"holotron.train: error: --grid-aug draws tiling grids, and --config {args.config} shows a "
                             "screen as one tile: use a tiled preset (tiny-ui-tiles) or leave --grid-aug out")
    if args.pointer_heads < 0:
        raise SystemExit(f"holotron.train: error: --pointer-heads must be >= 0, got {args.pointer_heads}")
    if args.pointer_heads and not args.pointer_weight:
        raise SystemExit("holotron.train: error: --pointer-heads moves the pointer loss onto attention heads: "
                         "give it a --pointer-weight > 0 (and an --aux-weight > 0) too")
    if args.pointer_weight < 0:
        raise SystemExit(f"holotron.train: error: --pointer-weight must be >= 0, got {args.pointer_weight}")
    if args.char_weight < 0:
        raise SystemExit(f"holotron.train: error: --char-weight must be >= 0, got {args.char_weight}")
    state = train(args)
    last = state["evals"][-1] if state["evals"] else None
    summary = {"step": state["step"], "status": state["status"], "train_seconds": state["train_seconds"],
               "loss": state["log"][-1]["loss_ema"] if state["log"] else None,
               "eval": last, "out": args.out}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
