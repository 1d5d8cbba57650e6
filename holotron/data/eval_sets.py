"""The examples an evaluation scores (``holotron.eval``): ``Example``, synthetic screens (``synthetic_examples``,
with their size family and whether the target's label is held out) and ScreenSpot-style files
(``read_screenspot``). The seed ranges: ``EVAL_SEED0`` for the reported number only, ``DEV_SEED0`` for
every training-time eval and every decision. ``holotron.eval`` re-exports all of them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..grounding import Box
from .screens import generate_sample
from .vocab import heldout_vocab

EVAL_SEED0 = 10**9      # the reported screens: the final number only
DEV_SEED0 = 3 * 10**9   # every training-time eval and every decision


@dataclass
class Example:
    image: Any          # a path or a PIL image
    instruction: str
    box: Box            # the target; "pixel" boxes are in the original image's pixels
    role: str = "all"
    id: str = ""
    family: str | None = None   # synthetic screens: the size family (settings["size_family"])
    vocab: str | None = None    # synthetic screens: "heldout" when the target's label is held out, else "train"


def _synthetic_example(seed: int, split: str, vocab: str, options: dict) -> Example:
    s = generate_sample(seed, split=split, vocab=vocab, **options)
    tag = split if vocab == "all" else f"{split}-{vocab}"
    return Example(s.image, s.instruction, s.target_box, s.target.role, f"{tag}-{seed}",
                   family=s.settings["size_family"],
                   vocab="heldout" if s.target.label.lower() in heldout_vocab() else "train")


def synthetic_examples(n: int, *, split: str = "heldout", seed0: int = EVAL_SEED0, vocab: str = "all",
                       workers: int = 0, **options) -> Iterator[Example]:
    """``n`` synthetic screens of seeds seed0 .. seed0 + n - 1 (rendered one by one as the iterator is read;
    with ``workers`` > 1 in that many processes, in the same order), each with its size family and whether
    its target's label is held out (``Example.family`` / ``.vocab``). ``vocab`` and ``options`` as
    ``holotron.data.generate_sample``; pass ``seed0=DEV_SEED0`` for decisions. Tables (``tables=True``) are for
    training screens only: asking for them here is a ValueError, and so are ``icon_places=True`` and
    ``tab_places=True``."""
    if options.get("tables"):
        raise ValueError("the eval sets never draw tables: tables=True is for training screens only "
                         "(holotron/data/tables.py)")
    if options.get("icon_places"):
        raise ValueError("the eval sets never move icons: icon_places=True is for training screens only "
                         "(holotron/data/icon_places.py)")
    if options.get("tab_places"):
        raise ValueError("the eval sets never draw tab columns: tab_places=True is for training screens only "
                         "(holotron/data/tab_places.py)")
    seeds = range(seed0, seed0 + n)
    if workers <= 1:
        for seed in seeds:
            yield _synthetic_example(seed, split, vocab, options)
        return
    import functools
    import multiprocessing

    render = functools.partial(_synthetic_example, split=split, vocab=vocab, options=options)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(render, seeds, chunksize=4)


class DataError(ValueError):
    """A ScreenSpot-style file that cannot be read; the message names the file and the entry."""


def _check_box_range(box: Box, img: Path, where: str, raw) -> None:
    """A box more than 1% outside its space (0-1, 0-1000, or the image's pixels) was given in another space:
    say so rather than score every answer a miss."""
    if box.space == "pixel":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(img) as im:  # reads the header only
                w, h = im.size
        except (OSError, UnidentifiedImageError) as e:
            raise DataError(f"{where}: image {img} cannot be read ({type(e).__name__}: {e})") from None
    else:
        w = h = 1.0 if box.space == "normalized" else 1000.0
    if min(box.x0, box.y0) < -0.01 * max(w, h) or box.x1 > 1.01 * w or box.y1 > 1.01 * h:
        where_to = f"the {w}x{h} image" if box.space == "pixel" else f"0-{w:g}"
        raise DataError(f"{where}: bbox {raw!r} lies outside {where_to} (--box-space {box.space}): "
                        "is --box-space right (pixel, normalized 0-1, model 0-1000)?")


def read_screenspot(path, *, box_format: str, box_space: str) -> list[Example]:
    """Examples from a JSON list of {"image", "instruction", "bbox"} (see the module docstring)."""
    path = Path(path)
    if box_format not in ("xyxy", "xywh"):
        raise DataError(f"--box-format must be xyxy or xywh, got {box_format!r}")
    if box_space not in ("pixel", "normalized", "model"):
        raise DataError(f"--box-space must be pixel, normalized or model, got {box_space!r}")
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of examples, found {type(items).__name__}")
    out = []
    for i, it in enumerate(items):
        where = f"{path}, entry {i}"
        if not isinstance(it, dict):
            raise DataError(f"{where}: expected an object, found {type(it).__name__}")
        image = it.get("image", it.get("img_filename"))
        missing = [k for k, v in (("image", image), ("instruction", it.get("instruction")), ("bbox", it.get("bbox")))
                   if v is None]
        if missing:
            raise DataError(f"{where}: missing {', '.join(missing)}")
        img = (path.parent / image) if not Path(image).is_absolute() else Path(image)
        if not img.is_file():
            raise DataError(f"{where}: image {img} not found")
        try:
            box = Box.from_values(it["bbox"], box_format, box_space)
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: bbox {it['bbox']!r}: {e}") from None
        _check_box_range(box, img, where, it["bbox"])
        role = it.get("role", it.get("data_type", "all"))
        out.append(Example(str(img), str(it["instruction"]), box, str(role), str(it.get("id", i))))
    return out
