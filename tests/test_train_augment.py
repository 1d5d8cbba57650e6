"""Padding augmentation (holotron/train/augment.py): padded screens keep every box on the same pixels, the
target's identity and a scoring centre click; no padding means the same Sample; seeded draws repeat; the
aspect ranges the model card discloses."""

from __future__ import annotations

import random

import numpy as np
import pytest

from holotron.data import generate_sample
from holotron.data.screens import check_sample
from holotron.grounding import parse_click, point_in_box
from holotron.train.augment import edge_colour, pad_sample, padded_aspects

SEEDS = (0, 3, 11, 27, 40)


@pytest.fixture(scope="module")
def samples():
    return [generate_sample(s) for s in SEEDS]


def _crop(sample, box) -> np.ndarray:
    return np.asarray(sample.image.crop(box))


def test_padded_screens_keep_boxes_on_the_same_pixels(samples):
    axes = set()
    for k, s in enumerate(samples):
        for j in range(3):
            padded = pad_sample(s, random.Random(f"{k}:{j}"), p=1.0)
            assert padded is not s
            left, top, right, bottom = padded.settings["pad"]
            w, h = s.size
            assert padded.size == padded.image.size == (w + left + right, h + top + bottom)
            assert (left + right == 0) != (top + bottom == 0)          # one axis only
            axes.add("x" if left + right else "y")
            extra = left + right or top + bottom
            assert 1 <= extra <= round(0.4 * (w if left + right else h))
            assert padded.settings["unpadded_size"] == s.size
            assert (padded.settings["width"], padded.settings["height"]) == padded.size
            assert len(padded.elements) == len(s.elements) and len(padded.texts) == len(s.texts)
            for old, new in [*zip(s.elements, padded.elements), *zip(s.texts, padded.texts)]:
                assert new.box == (old.box[0] + left, old.box[1] + top, old.box[2] + left, old.box[3] + top)
                assert np.array_equal(_crop(s, old.box), _crop(padded, new.box))
            # the whole original sits inside, and the bands are the fill colour
            assert np.array_equal(_crop(padded, (left, top, left + w, top + h)), np.asarray(s.image))
            a = np.asarray(padded.image)
            band = np.concatenate([a[:, :left].reshape(-1, 3), a[:, left + w:].reshape(-1, 3),
                                   a[:top].reshape(-1, 3), a[top + h:].reshape(-1, 3)])
            assert len(band) and (band == padded.settings["pad_colour"]).all()
            assert s.size == (w, h) and s.image.size == (w, h)                # the original is untouched
            check_sample(padded)                                              # the generator's invariants hold
    assert axes == {"x", "y"}


def test_target_identity_and_the_answer_scores(samples):
    for k, s in enumerate(samples):
        padded = pad_sample(s, random.Random(k), p=1.0)
        assert padded.target in padded.elements
        assert sum(e is padded.target for e in padded.elements) == 1
        i = next(i for i, e in enumerate(s.elements) if e is s.target)
        assert padded.elements[i] is padded.target
        assert padded.target.label == s.target.label and padded.instruction == s.instruction
        w, h = padded.size
        assert point_in_box(parse_click(padded.answer), padded.target_box, w, h)   # the scorer's rule


def test_no_padding_returns_the_same_sample(samples):
    s = samples[0]
    assert pad_sample(s, random.Random(0), p=0.0) is s
    kept = [pad_sample(s, random.Random(i), p=0.5) for i in range(40)]
    n_same = sum(k is s for k in kept)
    assert 5 <= n_same <= 35  # about half
    with pytest.raises(ValueError):
        pad_sample(s, random.Random(0), p=1.5)


def test_seeded_padding_repeats(samples):
    s = samples[1]
    for seed in range(5):
        a, b = pad_sample(s, random.Random(seed)), pad_sample(s, random.Random(seed))
        assert (a is s) == (b is s)
        if a is not s:
            assert a.settings == b.settings and a.answer == b.answer and a.elements == b.elements
            assert np.array_equal(np.asarray(a.image), np.asarray(b.image))


def test_unrendered_samples_get_moved_boxes():
    s = generate_sample(5, render=False)
    padded = pad_sample(s, random.Random(1), p=1.0)
    left, top, _, _ = padded.settings["pad"]
    assert padded.image is None and padded.settings["pad_colour"] is None
    assert padded.target.box == (s.target.box[0] + left, s.target.box[1] + top,
                                 s.target.box[2] + left, s.target.box[3] + top)


def test_edge_colour_is_the_most_common_border_colour():
    from PIL import Image

    im = Image.new("RGB", (50, 40), (10, 20, 30))
    im.paste((200, 0, 0), (0, 0, 50, 3))  # a bar along the top
    assert edge_colour(im) == (10, 20, 30)


def test_padded_aspects_cover_the_heldout_ratios():
    ranges = padded_aspects(0.4)
    assert set(ranges) == {"phone", "square", "tablet", "laptop", "desktop"}
    assert ranges["phone"] == pytest.approx((0.42 / 1.4, 0.56 * 1.4))
    assert ranges["laptop"] == pytest.approx((1.55 / 1.4, 1.80 * 1.4))
    for lo, hi in ((0.66, 0.80), (1.95, 2.20), (2.20, 2.40)):  # the held-out families (styles.SIZES)
        assert all(any(a <= x <= b for a, b in ranges.values()) for x in np.linspace(lo, hi, 50))
    # the padded screens' aspect ratios stay in the disclosed range of their family
    for seed in range(12):
        s = generate_sample(seed, render=False)
        padded = pad_sample(s, random.Random(seed), p=1.0)
        lo, hi = ranges[s.settings["size_family"]]
        assert lo - 0.01 <= padded.size[0] / padded.size[1] <= hi + 0.01
