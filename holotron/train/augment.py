"""Padding augmentation of grounding screens (``pad_sample``): a screen widened or heightened by a band of its
own edge colour, every box moved with it, so the model sees whole-screen aspect ratios and glyph shapes
beyond the training size families'.

Why: the model sees a whole screen squashed to its input square (holotron/train/tiles.py), so a screen's aspect
ratio sets how wide its glyphs look there. The training families (holotron/data/styles.py ``SIZES``) span
aspect 0.42-1.8, the held-out ones reach 2.4 (ultrawide) and sit in the gaps (tablet-portrait 0.66-0.8,
phone-landscape 1.95-2.2). Padding one axis by up to ``max_frac`` of its side stretches each family's range
(``padded_aspects``); with the default 0.4 (``python -m holotron.train.augment`` prints it):

    family     aspect       padded (max_frac 0.4)
    phone      0.42-0.56    0.30-0.78
    square     0.90-1.25    0.64-1.75
    tablet     1.30-1.45    0.93-2.03
    laptop     1.55-1.80    1.11-2.52
    desktop    1.55-1.80    1.11-2.52

so the padded training screens cover every held-out aspect ratio (0.66-0.80 and 1.95-2.40), and the widest
padded desktops (up to 1920 * 1.4 = 2688 px) reach the ultrawide widths (2000-2560 px). A model trained with
this augmentation has seen the held-out screens' aspect ratios, though never their looks (themes, layouts,
fonts): a model card must say so when it reports held-out scores.

The fill colour: the most frequent colour of the screen's border pixels (its four edge rows and columns),
not the palette's window background (``Palette.bg``, holotron/data/styles.py). The palette is not kept in
``Sample.settings`` (it is drawn from the generator's random stream), and the window background is not what
the edges show on most screens anyway: app windows float over a desktop with a taskbar, dialogs dim the
whole screen, forms sit on a backdrop (holotron/data/layouts_train.py); on 150 training screens the canvas
background was the edge colour of 43%. Padding with the edge colour continues what the screen's border
shows. The most frequent colour rather than the channel-wise median: the two agree on ~92% of screens,
and where they do not the median mixes channels of different colours into one the screen never shows.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from PIL import Image

from ..data.instructions import answer_text, click_point
from ..data.screens import Sample
from ..data.styles import SIZES, SPLITS

__all__ = ["pad_sample", "padded_aspects", "edge_colour"]


def edge_colour(image: Image.Image) -> tuple[int, ...]:
    """The most frequent colour among ``image``'s border pixels (first and last row and column)."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = a[..., None]
    ring = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]]).reshape(-1, a.shape[-1])
    colours, counts = np.unique(ring, axis=0, return_counts=True)
    return tuple(int(v) for v in colours[counts.argmax()])


def _shift(box: tuple[int, int, int, int], dx: int, dy: int) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = box
    return (x0 + dx, y0 + dy, x1 + dx, y1 + dy)


def pad_sample(sample: Sample, rng: random.Random, max_frac: float = 0.4, p: float = 0.5) -> Sample:
    """With probability ``p``, ``sample`` padded on one axis (width or height, even odds) by a fraction drawn
    uniformly in (0, ``max_frac``] of that side (at least 1 px), split at random between the two sides and
    filled with the screen's edge colour (``edge_colour``; see the module docstring for why); otherwise
    ``sample`` itself, unchanged.

    The padded Sample is a new one (``sample`` is not modified): the elements and texts moved by the left /
    top padding (new Element and Text objects; ``target`` is the padded list's entry for the old target, the
    same object, as code compares them with ``is``), ``size`` the padded size, ``answer`` the target's centre
    clicked on the padded screen (``click_point`` without jitter, so a jittered click becomes a centre one),
    and ``settings`` with ``width`` / ``height`` updated and "pad" = (left, top, right, bottom) px,
    "pad_colour" and "unpadded_size" added. A Sample without pixels (``render=False``) gets its boxes moved
    and no image. If the target is too small for a click at the padded size (``click_point`` raises; a
    target of the generator's 6 px minimum side never is), the sample comes back unpadded.

    The draws from ``rng`` (one for the coin, three when padding) are all it depends on, so a seeded ``rng``
    gives the same padding; use a generator of its own so that switching padding on or off leaves the other
    draws of a batch as they were."""
    if not 0 < max_frac:
        raise ValueError(f"max_frac must be positive, got {max_frac}")
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if p == 0 or rng.random() >= p:
        return sample
    w, h = sample.size
    horizontal = rng.random() < 0.5
    frac = max_frac * (1.0 - rng.random())  # uniform in (0, max_frac]
    side = w if horizontal else h
    pad = max(1, round(frac * side))
    first = rng.randint(0, pad)  # left or top; the rest goes right or bottom
    left, top, right, bottom = (first, 0, pad - first, 0) if horizontal else (0, first, 0, pad - first)
    W, H = w + left + right, h + top + bottom

    k = next(i for i, e in enumerate(sample.elements) if e is sample.target)
    elements = [dataclasses.replace(e, box=_shift(e.box, left, top)) for e in sample.elements]
    target = elements[k]
    try:
        answer = answer_text(click_point(target.box, W, H))
    except ValueError:
        return sample
    texts = [dataclasses.replace(t, box=_shift(t.box, left, top)) for t in sample.texts]
    image, colour = None, None
    if sample.image is not None:
        colour = edge_colour(sample.image)
        image = Image.new(sample.image.mode, (W, H), colour if len(colour) > 1 else colour[0])
        image.paste(sample.image, (left, top))
    settings = {**sample.settings, "width": W, "height": H, "pad": (left, top, right, bottom),
                "pad_colour": colour, "unpadded_size": (w, h)}
    return dataclasses.replace(sample, image=image, elements=elements, target=target, answer=answer, texts=texts,
                               size=(W, H), settings=settings)


def padded_aspects(max_frac: float = 0.4, split: str = "train") -> dict[str, tuple[float, float]]:
    """Size family of ``split`` -> the (lowest, highest) whole-screen aspect ratio (width / height) that
    ``pad_sample`` reaches with ``max_frac``: height padding divides the family's lowest aspect by
    1 + max_frac, width padding multiplies its highest by it (holotron/data/styles.py ``SIZES``)."""
    return {f: (SIZES[f][1][0] / (1 + max_frac), SIZES[f][1][1] * (1 + max_frac)) for f in SPLITS[split].sizes}


if __name__ == "__main__":  # the table of the module docstring
    for fam, (lo, hi) in padded_aspects().items():
        a0, a1 = SIZES[fam][1]
        print(f"{fam:10s} {a0:.2f}-{a1:.2f}    {lo:.2f}-{hi:.2f}")
