"""holotron.data: synthetic screens are deterministic, geometrically valid, correctly answered, varied,
split into disjoint train / held-out looks, and feed holotron.Processor the way training needs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from holotron.data import (
    LAYOUTS,
    ROLES,
    SIZES,
    SPLITS,
    all_labels,
    corpus,
    generate_sample,
    load_labels,
    stream,
    to_messages,
)
from holotron.data import canvas as canvas_mod
from holotron.data.labels import parse_labels
from holotron.grounding import Box, localization_prompt, parse_click, point_in_box, to_pixels

INNER_LABEL = ("button", "tab", "link", "menu", "menu item", "list item")  # roles whose label is drawn inside


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _within(a, b) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and a[2] <= b[2] and a[3] <= b[3]


# ----------------------------------------------------------------------------------------------
# determinism
# ----------------------------------------------------------------------------------------------

def test_same_seed_same_pixels_and_text():
    a = generate_sample(123)
    canvas_mod._mask.cache_clear()  # cached text masks must not change pixels
    b = generate_sample(123)
    assert a.image.tobytes() == b.image.tobytes()
    assert (a.elements, a.instruction, a.answer, a.settings) == (b.elements, b.instruction, b.answer, b.settings)
    c = generate_sample(124)
    assert c.image.tobytes() != a.image.tobytes()
    # render=False builds the same screen without pixels
    d = generate_sample(123, render=False)
    assert d.image is None and (d.elements, d.answer) == (a.elements, a.answer)


# digests of fixed-seed screens (every layout, both splits) and of a corpus, taken from the code before its
# files were split: moving code between files must not change one element, one answer or one pixel
FIXED_CASES = [(1, "train", "app"), (2, "train", "dialog"), (3, "train", "web"), (4, "train", "mobile"),
               (5, "train", "form"), (6, "heldout", "panels"), (7, "heldout", "wizard"), (8, "train", "mosaic"),
               (9, "heldout", None), (10, "train", None)]
FIXED_TEXT_DIGEST, FIXED_PIXEL_DIGEST, FIXED_CORPUS_DIGEST = "b892c6576ac7160d", "99904506ec426b27", "d3675c5058496a00"


def test_fixed_seeds_give_the_recorded_screens():
    import hashlib

    import PIL

    from holotron.data.example import MADE_WITH_PILLOW

    text, pixels = hashlib.sha256(), hashlib.sha256()
    for seed, split, layout in FIXED_CASES:
        s = generate_sample(seed, split=split, layout=layout, size=(640, 480) if seed % 2 else None)
        text.update(repr((s.elements, s.texts, s.instruction, s.answer, sorted(s.settings.items()))).encode())
        pixels.update(s.image.tobytes())
    assert text.hexdigest()[:16] == FIXED_TEXT_DIGEST
    assert hashlib.sha256("\n".join(corpus(20)).encode()).hexdigest()[:16] == FIXED_CORPUS_DIGEST
    if PIL.__version__ == MADE_WITH_PILLOW:  # text rendering (hence the pixels) may differ with other builds
        assert pixels.hexdigest()[:16] == FIXED_PIXEL_DIGEST


def test_stream_is_generate_sample_by_seed():
    got = list(stream(40, 3, split="heldout", render=False))
    assert [s.seed for s in got] == [40, 41, 42]
    for s in got:
        ref = generate_sample(s.seed, split="heldout", render=False)
        assert (s.elements, s.answer) == (ref.elements, ref.answer)


# ----------------------------------------------------------------------------------------------
# geometry and answers (hypothesis over seeds)
# ----------------------------------------------------------------------------------------------

@given(seed=st.integers(0, 10**9), split=st.sampled_from(sorted(SPLITS)), jitter=st.sampled_from([0.0, 0.5, 1.0]),
       size=st.one_of(st.none(), st.tuples(st.integers(200, 2600), st.integers(200, 1600))),
       layout=st.one_of(st.none(), st.sampled_from(sorted(LAYOUTS))))
def test_elements_valid_and_answer_inside_target(seed, split, jitter, size, layout):
    s = generate_sample(seed, split=split, jitter=jitter, size=size, layout=layout, render=False)
    if size is not None:
        assert s.size == size
    w, h = s.size
    assert s.elements and s.target in s.elements
    for k, e in enumerate(s.elements):
        assert e.role in ROLES and e.label.strip()
        x0, y0, x1, y1 = e.box
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (e, s.size)
        for f in s.elements[k + 1:]:
            assert not _overlap(e.box, f.box), (e, f)
    labels = [e.label.lower() for e in s.elements]
    assert len(set(labels)) == len(labels)
    for t in s.texts:  # every text on the screen, inside the image, inside or clear of each element
        assert _within(t.box, (0, 0, w, h)), t
        for e in s.elements:
            assert _within(t.box, e.box) or not _overlap(t.box, e.box), (t, e)
    for e in s.elements:  # a label drawn inside its element fits there
        if e.role in INNER_LABEL:
            assert any(t.text == e.label and _within(t.box, e.box) for t in s.texts), e
    # the instruction names the target, and no other element carries its label
    assert s.target.label in s.instruction
    others = [e.label.lower() for e in s.elements if e is not s.target]
    assert not any(re.search(r"(?<![a-z0-9])" + re.escape(s.target.label.lower()) + r"(?![a-z0-9])", o) for o in others)
    # the answer: H Company's JSON, integers in [0, 1000], landing in the target in pixels
    assert re.fullmatch(r'\{"x": \d{1,4}, "y": \d{1,4}\}', s.answer), s.answer
    assert json.loads(s.answer).keys() == {"x", "y"}
    p = parse_click(s.answer)
    assert 0 <= p.x <= 1000 and 0 <= p.y <= 1000
    px = to_pixels(p, w, h)
    assert s.target.box[0] <= px.x <= s.target.box[2] - 1 and s.target.box[1] <= px.y <= s.target.box[3] - 1
    assert point_in_box(p, Box(*s.target.box), w, h) and point_in_box(p, s.target_box, w, h)
    if jitter == 0:  # the centre, rounded
        cx, cy = (s.target.box[0] + s.target.box[2]) / 2, (s.target.box[1] + s.target.box[3]) / 2
        assert (p.x, p.y) == (round(1000 * cx / w), round(1000 * cy / h))


def test_mosaic_is_opt_in_and_puts_its_elements_all_over_the_screen():
    assert not any("mosaic" in sp.layouts for sp in SPLITS.values())
    assert all(generate_sample(s, render=False).settings["layout"] != "mosaic" for s in range(20))
    cells = set()
    for seed in range(20):
        s = generate_sample(seed, layout="mosaic", size=(1600, 1000), render=False)
        assert s.settings["layout"] == "mosaic"
        cells |= {((e.box[0] + e.box[2]) * 2 // 3200, (e.box[1] + e.box[3]) * 2 // 2000) for e in s.elements}
    assert cells == {(0, 0), (0, 1), (1, 0), (1, 1)}  # elements in every quarter of the screen


def test_jitter_moves_the_click_inside_the_box():
    centre = [generate_sample(s, render=False).answer for s in range(30)]
    jittered = [generate_sample(s, jitter=1.0, render=False).answer for s in range(30)]
    assert sum(a != b for a, b in zip(centre, jittered)) >= 10


def test_pixels_show_the_elements():
    """Each element box holds something drawn (more than one colour), and the target differs from the
    screen around it: boxes match the render."""
    for seed in range(8):
        s = generate_sample(seed)
        img = np.asarray(s.image)
        assert img.shape == (s.size[1], s.size[0], 3)
        for e in s.elements:
            x0, y0, x1, y1 = e.box
            patch = img[y0:y1, x0:x1].reshape(-1, 3)
            assert len(np.unique(patch, axis=0)) > 1, (seed, e)


# ----------------------------------------------------------------------------------------------
# variety and the split
# ----------------------------------------------------------------------------------------------

def test_settings_vary_over_seeds():
    samples = [generate_sample(seed, render=False) for seed in range(50)]
    seen = {k: {s.settings[k] for s in samples} for k in ("theme", "size_family", "layout", "font_size", "corner")}
    assert len(seen["theme"]) >= 3 and len(seen["size_family"]) >= 3 and len(seen["layout"]) >= 4
    assert len(seen["font_size"]) >= 4 and len(seen["corner"]) >= 2
    widths = [s.size[0] for s in samples]
    assert min(widths) < 500 and max(widths) > 1500
    assert len({s.target.role for s in samples}) >= 7
    assert len({s.answer for s in samples}) >= 45


def test_dark_and_light_themes_render_dark_and_light():
    for theme, dark in (("light", False), ("grey", False), ("dark", True), ("slate", True)):
        lum = [np.asarray(generate_sample(seed, theme=theme, layout="app").image.convert("L")).mean()
               for seed in range(3)]
        assert all((v < 100) if dark else (v > 150) for v in lum), (theme, lum)


def test_heldout_split_uses_settings_train_never_does():
    train = [generate_sample(seed, split="train", render=False) for seed in range(60)]
    held = [generate_sample(seed, split="heldout", render=False) for seed in range(60)]
    for key in ("theme", "layout", "font_size", "corner", "size_family"):
        a, b = {s.settings[key] for s in train}, {s.settings[key] for s in held}
        assert a and b and not a & b, (key, a, b)
    bands = lambda ss: {int(s.settings["accent_hue"] // 30) % 12 for s in ss}  # noqa: E731
    assert not bands(train) & bands(held)

    def aspect_ranges(split):
        return [SIZES[f][1] for f in SPLITS[split].sizes]

    for s in held:  # held-out aspect ratios lie outside every training family's range
        a = s.size[0] / s.size[1]
        assert not any(lo - 0.01 <= a <= hi + 0.01 for lo, hi in aspect_ranges("train")), (a, s.settings)
    for s in train:
        a = s.size[0] / s.size[1]
        assert any(lo - 0.01 <= a <= hi + 0.01 for lo, hi in aspect_ranges("train")), (a, s.settings)


def test_options_are_honoured_and_checked():
    s = generate_sample(5, size=(390, 844), theme="dark", layout="mobile", font_size=15, corner="pill", density=1.0)
    assert s.image.size == (390, 844)
    assert (s.settings["theme"], s.settings["layout"], s.settings["font_size"], s.settings["corner"]) == \
        ("dark", "mobile", 15, "pill")
    s = generate_sample(5, size_range=((700, 720), (500, 510)), render=False)
    assert 700 <= s.size[0] <= 720 and 500 <= s.size[1] <= 510
    s = generate_sample(5, size="ultrawide", render=False)
    assert s.settings["size_family"] == "ultrawide" and s.size[0] >= 2000
    for seed in range(10):
        assert generate_sample(seed, roles=("checkbox", "switch"), render=False).target.role in ("checkbox", "switch")
    for bad in (dict(split="test"), dict(theme="neon"), dict(layout="grid"), dict(size="watch"), dict(jitter=2),
                dict(roles=("slider",)), dict(size=(100, 100)), dict(size=(800, 600), size_range=((1, 2), (1, 2))),
                dict(size=(300, 250), font_size=26), dict(font_size=7)):
        with pytest.raises(ValueError):
            generate_sample(0, **bad)


@pytest.mark.parametrize("size", [(390, 844), (360, 640), (1920, 1080), (2560, 1080), (777, 333), (1000, 1000)])
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_phone_desktop_and_odd_sizes(size, split):
    for seed in range(3):
        s = generate_sample(seed, size=size, split=split)
        assert s.image.size == size and s.image.mode == "RGB"
        assert len(s.elements) >= 1
        assert point_in_box(s.point, s.target_box, *size)


# ----------------------------------------------------------------------------------------------
# the label vocabulary
# ----------------------------------------------------------------------------------------------

def test_labels_file():
    groups = load_labels()
    labels = all_labels()
    assert len(set(labels)) >= 200
    for g in ("button", "menu", "menu item", "tab", "link", "field", "checkbox", "radio", "switch", "dropdown",
              "list item", "title", "sentence"):
        assert len(groups[g]) >= 10, g
    assert all(label.isascii() and label == label.strip() and label for label in labels)
    assert parse_labels("# c\n[a]\nx\nx\n\n[b]\ny\n") == {"a": ("x",), "b": ("y",)}
    for bad in ("x\n[a]\n", "[a]\n[a]\n", "[]\n"):
        with pytest.raises(ValueError):
            parse_labels(bad)


# ----------------------------------------------------------------------------------------------
# the held-out vocabulary
# ----------------------------------------------------------------------------------------------

def test_heldout_vocab_is_a_stable_sixth_of_the_labels_and_never_a_fixed_text():
    import zlib

    from holotron.data import heldout_vocab
    from holotron.data.vocab import fixed_texts
    from holotron.data.widgets import ICONS

    held = heldout_vocab()
    labels = {s.lower() for s in all_labels()}
    assert held <= labels and all(h == h.lower() for h in held)
    assert 0.12 <= len(held) / len(labels) <= 0.18, len(held)
    # the rule, written out again: crc32 of the lower-cased label (stable across runs, unlike hash())
    assert held == {s for s in labels if zlib.crc32(s.encode()) % 100 < 15} - fixed_texts()
    assert not held & {v.lower() for v in ICONS.values()} and not held & fixed_texts()
    for group, pool in load_labels().items():  # every group keeps most of its labels for training
        assert sum(s.lower() not in held for s in pool) >= 0.5 * len(pool), group


def test_every_text_a_layout_claims_by_name_is_a_fixed_text():
    """Literal ``claim("...")`` calls in the generator's sources name fixed texts, which are never held out."""
    from pathlib import Path

    import holotron.data
    from holotron.data.vocab import fixed_texts

    claimed = set()
    for path in Path(holotron.data.__file__).parent.glob("*.py"):
        claimed |= set(re.findall(r"""claim\(\s*["']([^"']+)["']""", path.read_text()))
    assert claimed and {c.lower() for c in claimed} <= fixed_texts(), claimed - fixed_texts()


def test_vocab_train_screens_never_show_a_heldout_label():
    from holotron.data import heldout_vocab

    held = heldout_vocab()
    sentences = [s.lower() for s in load_labels()["sentence"] if s.lower() in held]  # drawn wrapped, line by line
    assert sentences
    for seed in range(25):
        for split in ("train", "heldout"):
            s = generate_sample(seed, split=split, vocab="train", render=False)
            assert s.settings["vocab"] == "train"
            assert not [e.label for e in s.elements if e.label.lower() in held], (seed, split)
            assert not [t.text for t in s.texts if t.text.lower() in held], (seed, split)
            joined = " ".join(t.text.lower() for t in s.texts)
            assert not [h for h in sentences if h in joined], (seed, split)
    # the same seed with every label does show held-out labels now and then
    assert any(t.text.lower() in held for seed in range(10) for t in generate_sample(seed, render=False).texts)


def test_vocab_heldout_targets_a_heldout_label_on_the_screen_of_the_same_seed():
    from holotron.data import heldout_vocab

    held = heldout_vocab()
    same = 0
    for seed in range(30):
        s = generate_sample(seed, vocab="heldout", render=False)
        assert s.target.label.lower() in held and s.target in s.elements, (seed, s.target)
        assert s.settings["vocab"] == "heldout" and s.settings["split"] == "train"
        ref = generate_sample(seed, render=False)
        if s.settings["attempt"] == ref.settings["attempt"]:  # the vocab="all" screen, another target
            assert s.elements == ref.elements and s.texts == ref.texts
            same += 1
    assert same >= 15
    s = generate_sample(3, split="heldout", vocab="heldout", roles=("checkbox", "radio"), render=False)
    assert s.target.label.lower() in held and s.target.role in ("checkbox", "radio")
    with pytest.raises(ValueError, match="icon"):
        generate_sample(0, vocab="heldout", roles=("icon",))
    with pytest.raises(ValueError, match="unknown vocab"):
        generate_sample(0, vocab="test")


def test_vocab_all_is_the_default_screen_byte_for_byte():
    for seed, split in ((0, "train"), (1, "heldout"), (2, "train")):
        a, b = generate_sample(seed, split=split), generate_sample(seed, split=split, vocab="all")
        assert a.image.tobytes() == b.image.tobytes()
        assert (a.elements, a.texts, a.instruction, a.answer, a.settings) == \
            (b.elements, b.texts, b.instruction, b.answer, b.settings)
        assert "vocab" not in a.settings
    assert corpus(5, vocab="all") == corpus(5) != corpus(5, vocab="train")


def test_label_picker_exclude_skips_and_refuses():
    import random

    from holotron.data.labels import LabelPicker

    pool = load_labels()["button"]
    exclude = frozenset(s.lower() for s in pool[1:])
    picker = LabelPicker(random.Random(0), exclude=exclude)
    assert picker.take("button") == pool[0] and picker.take("button") is None  # the one label left, then none
    assert not picker.claim(pool[1]) and picker.claim("Something else")

# ----------------------------------------------------------------------------------------------
# model input: messages, the processor, the tokenizer corpus
# ----------------------------------------------------------------------------------------------

def test_to_messages_through_the_processor(tmp_path):
    from tiny_tokenizer import write_tiny_tokenizer

    from holotron import Processor

    def preprocess(image):  # one stub tile of 4 tokens per image
        return torch.zeros(1, 3, 8, 8), 4

    proc = Processor.from_pretrained(write_tiny_tokenizer(tmp_path), image_processor=preprocess)
    s = generate_sample(3)
    msgs = to_messages(s)
    assert msgs[0] == {"role": "system", "content": "/no_think"}
    assert msgs[1]["role"] == "user" and msgs[1]["content"][0] == {"type": "image", "image": s.image}
    assert msgs[1]["content"][1]["text"] == localization_prompt(s.instruction)
    assert msgs[-1] == {"role": "assistant", "content": s.answer}
    prompt = proc.apply_chat_template(msgs[:-1], add_generation_prompt=True)
    assert prompt.endswith("<SPECIAL_11>Assistant\n<think></think>") and s.instruction in prompt
    # the prompt ends in a special token, so prompt ids + answer ids are exactly the ids of the joined text:
    # the loss can go on the answer's ids (plus end of turn) appended to the inference prompt
    assert proc.encode(prompt + s.answer) == proc.encode(prompt) + proc.encode(s.answer)
    batch = proc(msgs[:-1])
    ids = batch["input_ids"][0].tolist()
    assert ids.count(proc.image_token_id) == 4 and batch["pixel_values"].shape[0] == 1
    assert proc.decode(proc.encode(s.answer)) == s.answer
    assert to_messages(s, image=False)[1]["content"][0] == {"type": "image"}
    assert to_messages(s, thinking=True)[0]["role"] == "user"


def test_corpus():
    texts = corpus(20, seed0=7)
    assert len(texts) == 20 and texts == corpus(20, seed0=7)
    for seed, text in zip(range(7, 27), texts):
        s = generate_sample(seed, render=False)
        assert text == localization_prompt(s.instruction) + "\n" + s.answer
        assert parse_click(text.rsplit("\n", 1)[1]) is not None
    assert corpus(5, split="heldout") != corpus(5)


# ----------------------------------------------------------------------------------------------
# the canvas: recorded boxes are where the pixels are
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [9, 13, 20, 31])
def test_text_box_is_the_ink_box(size):
    from holotron.data.canvas import Canvas

    for text, bold in (("Save changes", False), ("Forgot password?", True), ("gjpqy", False), ("T", False)):
        c = Canvas(300, 80, (255, 255, 255))
        box = c.text_in((10, 10, 290, 70), text, size, (0, 0, 0), align="center", bold=bold)
        img = np.asarray(c.render().convert("L"))
        ys, xs = np.nonzero(img < 255)
        ink = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        assert _within(ink, box), (text, size, bold, ink, box)  # all ink inside the recorded box ...
        slack = size // 8 + 1                                    # ... which is no more than a side bearing larger
        assert max(ink[0] - box[0], ink[1] - box[1], box[2] - ink[2], box[3] - ink[3]) <= slack, (ink, box)
        assert c.texts[0].box == box and c.texts[0].text == text
        # centred: the ink's middle is within a pixel of the box's middle horizontally
        assert abs((box[0] + box[2]) / 2 - 150) <= 1.0


def test_cover_and_dim_hide_what_lies_beneath():
    from holotron.data.canvas import Canvas

    c = Canvas(200, 100, (255, 255, 255))
    c.text(10, 20, "under", 12, (0, 0, 0))
    c.element("A", "button", (0, 0, 50, 40))
    c.element("B", "button", (100, 0, 150, 40))
    c.cover((40, 0, 60, 100))
    assert [e.label for e in c.elements] == ["B"] and c.texts == []
    mark = c.mark()
    c.element("C", "button", (160, 50, 190, 90))
    c.dim((0, 0, 0), 0.5, upto=mark)
    assert [e.label for e in c.elements] == ["C"]
    c.shift(mark, -10, 5)
    assert c.elements[0].box == (150, 55, 180, 95)


# ----------------------------------------------------------------------------------------------
# the bundled example screenshot
# ----------------------------------------------------------------------------------------------

def test_bundled_example_screen():
    import PIL
    from PIL import Image

    from holotron.data import EXAMPLE_ANSWER, EXAMPLE_INSTRUCTION, EXAMPLE_TARGET, example_path, example_sample
    from holotron.data.example import MADE_WITH_PILLOW

    path = example_path()
    assert path.is_file() and len(path.read_bytes()) < 150_000
    with path.open("rb") as f:
        image = Image.open(f)
        image.load()
    assert image.size == (1280, 800) and image.mode == "RGB"
    assert EXAMPLE_TARGET.label in EXAMPLE_INSTRUCTION
    p = parse_click(EXAMPLE_ANSWER)
    assert point_in_box(p, Box(*EXAMPLE_TARGET.box), *image.size)
    x0, y0, x1, y1 = EXAMPLE_TARGET.box  # a filled button: the box holds its colour and its text
    patch = np.asarray(image)[y0:y1, x0:x1].reshape(-1, 3)
    assert len(np.unique(patch, axis=0)) > 10
    if PIL.__version__ == MADE_WITH_PILLOW:  # font metrics and rasterisation may differ in other Pillow builds
        s = example_sample()
        assert s.target == EXAMPLE_TARGET and s.answer == EXAMPLE_ANSWER
        assert s.image.tobytes() == image.tobytes(), "regenerate it: python -m holotron.data.example"


@pytest.mark.parametrize("module", ["holotron.data", "holotron.data.screens"])
def test_docstring_examples_run(module):
    """The indented example lines of the module docstrings execute as written."""
    import importlib
    import textwrap

    doc = importlib.import_module(module).__doc__
    code = [line for line in doc.splitlines() if line.startswith("    ")]
    assert len(code) >= 3
    namespace: dict = {}
    exec("from holotron.data import *\n" + textwrap.dedent("\n".join(code)), namespace)  # noqa: S102
    assert namespace["s"].answer
