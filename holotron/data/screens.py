"""Synthetic GUI screenshots for grounding: ``generate_sample(seed) -> Sample``, ``stream(seed0, n)`` and
``corpus(n)`` (the screens' prompt and answer texts, for training a tokenizer).

    s = generate_sample(7)                       # a training-distribution screen
    s.image                                      # PIL RGB image
    s.elements                                   # [Element(label, role, box)], boxes in pixels
    s.instruction, s.answer                      # "the 'Save' button", '{"x": 512, "y": 384}'
    s.target                                     # the Element the instruction names
    generate_sample(7, split="heldout")          # looks the training never shows (styles.SPLITS)
    generate_sample(7, size=(390, 844), theme="dark", layout="mobile", font_size=16)
    generate_sample(7, vocab="train")            # no label of the held-out vocabulary anywhere (for training)
    generate_sample(7, vocab="heldout")          # the target's label is one of them (for evaluation)
    generate_sample(7, font="mixed")             # the text in one face per screen (faces.py), for training
    generate_sample(7, tables=True)              # now and then a data table (tables.py), for training
    generate_sample(7, icon_places=True)         # icons in varied places (icon_places.py), for training
    generate_sample(7, tab_places=True)          # now and then tabs in a column (tab_places.py), for training

The same seed and options give the same pixels. Every element lies inside the image, no two overlap,
texts fit their elements, no text appears twice on a screen, and the target's label appears nowhere
else on it, so the instruction names exactly one element. The answer is the target's centre (or a
jittered point inside it) as ``{"x": int, "y": int}`` in [0, 1000], x = round(1000 * px / width),
which lands inside the target's box when converted back to pixels.

Vocabulary (vocab.heldout_vocab, ~15% of the labels): vocab="all" (the default) draws from every label;
vocab="train" never draws a held-out label (elements, captions, values, headings, sentences: the label
picker skips them), the vocabulary a training run should use; vocab="heldout" draws from every label and
picks the target among the elements with a held-out label, re-drawing the screen deterministically (the
next attempt's random source, as when a screen has no target at all; up to 100 attempts) until one has
such an element. So a vocab="heldout" screen is the vocab="all" screen of the same seed whenever that one
has a held-out-label candidate (about 4 screens in 5), with another target. Icon names are never held out.

Fonts (faces.py): font=None (the default) draws every text in Pillow's bundled Aileron, as every screen always
was; a face name draws it in that face; font="mixed" draws one face per screen from a random source of its
own, not the screen's: a seed keeps its size, theme, layout and style, while what fits where (and so the
controls and labels placed after it) can move with the face's text widths.

Tables (tables.py): tables=True lets the training layouts draw a data table on about half of their screens (split
"train" only; a ValueError elsewhere). Its rows' controls repeat their labels on every row: each is recorded with
its row (``Element.row``, the row's identifier) and, as a target, named through it ("the 'Edit' button in the
INV-20417 row", instructions.row_instruction), so the names stay unique where the labels are not; a table's status
cells and action labels repeat too. Screens with a table pick their target among the table's controls and
identifiers half of the time. ``settings["tables"]`` lists the tables' boxes. tables=False (the default) draws the
screens exactly as before.

Icon places (icon_places.py): icon_places=True lets the training layouts move the icons so that only the glyph
tells them apart (split "train" only; a ValueError elsewhere): the window controls at either end of the title bar
in a shuffled order now and then, a toolbar's icons in a vertical strip along the content's left or right edge, a
web page's icon strip, a dialog's close icon in either top corner. ``settings["icon_places"]`` records what the
screen did. icon_places=False (the default) draws the screens exactly as before.

Tab places (tab_places.py): tab_places=True lets the training layouts draw tabs one under another (split "train"
only; a ValueError elsewhere): an app's sidebar as a column of tabs, its tab row turned into a column (the sidebar, or
beside the content), a web page's settings-style column of tabs. ``settings["tab_places"]`` records what the screen did.
tab_places=False (the default) draws the screens exactly as before.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from PIL import Image

from ..grounding import Box, Point, localization_prompt, parse_click
from .canvas import Canvas, Element, Text, inside, overlaps
from .context import Ctx
from .faces import canvas_face, pick_face
from .instructions import ROLE_NAMES, answer_text, click_point, instruction_for, row_instruction
from .labels import LabelPicker
from .layouts import LAYOUTS
from .styles import CORNERS, DENSITY, SIZES, SPLITS, THEMES, make_style, pick_size
from .tables import row_is_unique
from .vocab import VOCABS, heldout_vocab

ROLES = tuple(ROLE_NAMES)
_MIN_SIDE = 6  # px: smaller elements are not chosen as targets
_LABEL_INSIDE = ("button", "tab", "link", "menu", "menu item", "list item")  # roles drawn with their label inside


@dataclass
class Sample:
    image: Image.Image | None     # None when generated with render=False
    elements: list[Element]
    instruction: str
    target: Element
    answer: str                   # '{"x": int, "y": int}' in [0, 1000]
    texts: list[Text] = field(repr=False)   # every visible text and its ink box
    size: tuple[int, int] = (0, 0)          # (width, height) px
    settings: dict = field(default_factory=dict)  # split, layout, theme, sizes, ... that made this screen
    seed: int = 0

    @property
    def point(self) -> Point:
        """The answer as a model-space Point."""
        return parse_click(self.answer)

    @property
    def target_box(self) -> Box:
        """The target's box for scoring (pixels; holotron.grounding.Box, edges inclusive)."""
        return Box(*self.target.box, space="pixel")


# ----------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------

def _choice(rng: random.Random, value, default: Sequence, known, what: str):
    """``value`` may be None (pick from ``default``), one value, or a sequence to pick from."""
    options = default if value is None else [value] if isinstance(value, (str, int, float)) else list(value)
    if not options:
        raise ValueError(f"no {what} to choose from")
    if known is not None:
        bad = [o for o in options if o not in known]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r}: use one of {', '.join(map(str, known))}")
    return rng.choice(list(options))


def _pick_layout(rng: random.Random, options: Sequence[str], width: int) -> str:
    weights = {"app": 3, "dialog": 1.5, "web": 2, "form": 1, "mobile": 0.7, "panels": 1, "wizard": 1, "mosaic": 3}
    if width < 700:
        weights.update(app=0.4, dialog=1.2, web=1, form=1.5, mobile=3.5)
    options = list(options)
    return rng.choices(options, [weights.get(o, 1) for o in options])[0]


def _ambiguous(target: Element, elements: list[Element], canvas: Canvas) -> bool:
    """True when the target's label occurs in another element's label or in any visible text that is
    not the target's own (caption, value, placeholder), as whole words, case-insensitively. A control of a
    table row (``target.row``) is named through its row instead: ambiguous unless ``tables.row_is_unique``."""
    if target.row is not None:
        return not row_is_unique(target, elements, canvas.texts)
    pattern = re.compile(r"(?<![a-z0-9])" + re.escape(target.label.lower()) + r"(?![a-z0-9])")
    if any(e is not target and pattern.search(e.label.lower()) for e in elements):
        return True
    return any(pattern.search(t.lower()) for t in canvas.texts_not_of(target.label))


def check_sample(sample: Sample) -> None:
    """Raise AssertionError when an invariant of the generator does not hold (see the module docstring)."""
    w, h = sample.size
    screen = (0, 0, w, h)
    for k, e in enumerate(sample.elements):
        assert e.box[0] < e.box[2] and e.box[1] < e.box[3], f"empty box {e}"
        assert inside(e.box, screen), f"{e} outside the {w}x{h} screen"
        for f in sample.elements[k + 1:]:
            assert not overlaps(e.box, f.box), f"{e} overlaps {f}"
    for t in sample.texts:
        assert inside(t.box, screen), f"text {t} outside the {w}x{h} screen"
        for e in sample.elements:  # a text is inside an element or clear of it, never across its edge
            assert inside(t.box, e.box) or not overlaps(t.box, e.box), f"text {t} crosses the edge of {e}"
    for e in sample.elements:
        if e.role in _LABEL_INSIDE:
            assert any(t.text == e.label and inside(t.box, e.box) for t in sample.texts), f"{e}: label not inside"
    labels = [e.label.lower() for e in sample.elements if e.row is None]
    assert len(labels) == len(set(labels)), f"repeated labels {sorted(x for x in labels if labels.count(x) > 1)}"
    rows = [(e.label.lower(), e.row.lower()) for e in sample.elements if e.row is not None]  # table rows' controls
    assert len(rows) == len(set(rows)), f"a row's control twice {sorted(x for x in rows if rows.count(x) > 1)}"
    assert not {lab for lab, _ in rows} & set(labels), "a row control's label on an element outside the rows"
    assert sample.target in sample.elements
    p = parse_click(sample.answer)
    assert p is not None and 0 <= p.x <= 1000 and 0 <= p.y <= 1000, sample.answer
    assert sample.target_box.contains(p, w, h), (sample.answer, sample.target)


# ----------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------

def generate_sample(
    seed: int,
    *,
    split: str = "train",
    size: tuple[int, int] | str | Sequence[str] | None = None,
    size_range: tuple[tuple[int, int], tuple[int, int]] | None = None,
    theme: str | Sequence[str] | None = None,
    layout: str | Sequence[str] | None = None,
    font_size: int | Sequence[int] | None = None,
    density: float | tuple[float, float] | None = None,
    corner: str | Sequence[str] | None = None,
    accent_hue: float | None = None,
    roles: Sequence[str] | None = None,
    jitter: float = 0.0,
    render: bool = True,
    vocab: str = "all",
    font: str | None = None,
    tables: bool = False,
    icon_places: bool = False,
    tab_places: bool = False,
) -> Sample:
    """One synthetic screen, its elements, an instruction naming one of them and the click answer.

    split: "train" or "heldout": the families of every setting left as None (styles.SPLITS).
    size: (width, height) px, or a size family name (styles.SIZES) or several; size_range:
        ((min_w, max_w), (min_h, max_h)) to draw width and height uniformly instead.
    theme / layout / corner: a name or several (styles.THEMES, layouts.LAYOUTS, styles.CORNERS).
    font_size: body text px, or several to pick from; density: a spacing factor or a (lo, hi) range.
    accent_hue: degrees; default a hue from the split's bands.
    roles: the roles the target may have (default all: ROLES).
    jitter: 0 clicks the target's centre; up to 1 moves the click that fraction towards its edges.
    render: False skips the pixels (image None) for text-only uses such as the tokenizer corpus.
    vocab: "all" (every label), "train" (no held-out label anywhere on the screen) or "heldout" (the target's
        label is held out); see the module docstring. Recorded in ``settings["vocab"]`` unless "all".
    font: None (Aileron, the screens as ever), a face of ``faces.FACES`` or "mixed" (one face per screen:
        ``faces.pick_face``); the face used is recorded in ``settings["font"]`` unless font is None.
    tables: True lets the training layouts draw a data table (split "train" only; see the module docstring).
    icon_places: True lets the training layouts move the icons (split "train" only; see the module docstring).
    tab_places: True lets the training layouts draw tabs in a column (split "train" only; see the module docstring).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if vocab not in VOCABS:
        raise ValueError(f"unknown vocab {vocab!r}: use one of {', '.join(VOCABS)}")
    held = heldout_vocab() if vocab != "all" else frozenset()
    face = pick_face(font, split, seed)  # None, or a faces.FACES name (a ValueError for an unknown font)
    if tables and split != "train":
        raise ValueError(f"tables=True draws tables on training screens only (split='train'), not on {split!r} ones")
    if icon_places and split != "train":
        raise ValueError(f"icon_places=True moves icons on training screens only (split='train'), not on {split!r} "
                         "ones")
    if tab_places and split != "train":
        raise ValueError(f"tab_places=True draws tab columns on training screens only (split='train'), not on "
                         f"{split!r} ones")
    if size is not None and size_range is not None:
        raise ValueError("give size or size_range, not both")
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    roles = tuple(ROLES if roles is None else roles)
    bad = [r for r in roles if r not in ROLE_NAMES]
    if bad or not roles:
        raise ValueError(f"unknown target role {bad[0] if bad else None!r}: use some of {', '.join(ROLES)}")
    if vocab == "heldout" and set(roles) <= {"icon"}:
        raise ValueError('vocab="heldout" needs a target role other than "icon": icon names are never held out')
    sp = SPLITS[split]
    attempts = 100 if vocab == "heldout" else 20  # a rare role with a held-out label can take a few dozen
    for attempt in range(attempts):
        rng = random.Random(f"holotron.data:{split}:{seed}:{attempt}")
        # screen size
        if size_range is not None:
            (w0, w1), (h0, h1) = size_range
            width, height, family = rng.randint(w0, w1), rng.randint(h0, h1), "custom"
        elif isinstance(size, (tuple, list)) and len(size) == 2 and all(isinstance(v, int) for v in size):
            (width, height), family = tuple(size), "custom"
        else:
            family = _choice(rng, size, sp.sizes, SIZES, "size family")
            width, height = pick_size(rng, family)
        if width < 200 or height < 200:
            raise ValueError(f"screens must be at least 200x200 px, got {width}x{height}")
        # look
        th = _choice(rng, theme, sp.themes, THEMES, "theme")
        hue = float(accent_hue) if accent_hue is not None else 30 * rng.choice(sp.hue_bands) + rng.uniform(1, 29)
        cor = _choice(rng, corner, sp.corners, CORNERS, "corner")
        fs = int(_choice(rng, font_size, sp.font_sizes, None, "font size"))
        if not 8 <= fs <= min(40, min(width, height) // 10):
            raise ValueError(f"font_size must be in [8, {min(40, min(width, height) // 10)}] px for a {width}x{height} "
                             f"screen, got {fs}")
        if density is None:
            dens = rng.uniform(*DENSITY)
        elif isinstance(density, (int, float)):
            dens = float(density)
        else:
            dens = rng.uniform(*density)
        lay = layout if isinstance(layout, str) else None
        if lay is None:
            opts = sp.layouts if layout is None else list(layout)
            bad = [o for o in opts if o not in LAYOUTS]
            if bad:
                raise ValueError(f"unknown layout {bad[0]!r}: use one of {', '.join(LAYOUTS)}")
            lay = _pick_layout(rng, opts, width)
        elif lay not in LAYOUTS:
            raise ValueError(f"unknown layout {lay!r}: use one of {', '.join(LAYOUTS)}")
        st = make_style(rng, th, hue, cor, fs, dens)
        if canvas_face(face) is not None:  # layout measures in the face (st.face) the canvas draws in
            st = dataclasses.replace(st, face=canvas_face(face))
        # the screen
        canvas = Canvas(width, height, st.p.bg, face=st.face)
        ctx = Ctx(canvas, st, rng, LabelPicker(rng, exclude=held if vocab == "train" else frozenset()))
        if tables:
            ctx.tables, ctx.avoid = True, heldout_vocab()
        ctx.icon_places, ctx.tab_places = icon_places, tab_places
        LAYOUTS[lay](ctx)
        elements = canvas.elements
        candidates = [e for e in elements if e.role in roles
                      and min(e.box[2] - e.box[0], e.box[3] - e.box[1]) >= _MIN_SIDE
                      and (vocab != "heldout" or e.label.lower() in held)
                      and not _ambiguous(e, elements, canvas)]
        if not candidates:
            continue
        by_role: dict[str, list[Element]] = {}
        for e in candidates:
            by_role.setdefault(e.role, []).append(e)
        role = rng.choice(sorted(by_role))  # roles equally likely, then an element of that role
        target = rng.choice(by_role[role])
        if tables:  # half of the time one of a table's controls or identifiers, where there is one
            idents = {e.row for e in elements if e.row is not None}
            in_table = [e for e in candidates if e.row is not None or e.label in idents]
            if in_table and rng.random() < 0.5:
                target = rng.choice(in_table)
        point = click_point(target.box, width, height, rng, jitter)
        if target.row is not None:
            instruction = row_instruction(target.label, target.role, target.row, rng)
        else:
            instruction = instruction_for(target.label, target.role, rng)
        sample = Sample(
            image=canvas.render() if render else None,
            elements=elements,
            instruction=instruction,
            target=target,
            answer=answer_text(point),
            texts=canvas.texts,
            size=(width, height),
            settings=dict(split=split, layout=lay, theme=th, accent_hue=round(hue, 1), corner=cor, font_size=fs,
                          density=round(dens, 3), size_family=family, width=width, height=height, attempt=attempt,
                          **({} if vocab == "all" else {"vocab": vocab}), **({} if face is None else {"font": face}),
                          **({"tables": list(ctx.table_boxes)} if tables else {}),
                          **({"icon_places": dict(ctx.icon_log)} if icon_places else {}),
                          **({"tab_places": dict(ctx.tab_log)} if tab_places else {})),
            seed=seed,
        )
        check_sample(sample)
        return sample
    held_note = " and a held-out label" if vocab == "heldout" else ""
    raise RuntimeError(f"seed {seed}: no screen with a target of roles {roles}{held_note} in {attempts} attempts")


def stream(seed0: int = 0, n: int | None = None, **options) -> Iterator[Sample]:
    """Samples for seeds seed0, seed0 + 1, ... (n of them, or without end); options as generate_sample."""
    seed = seed0
    while n is None or seed < seed0 + n:
        yield generate_sample(seed, **options)
        seed += 1


def corpus(n: int, seed0: int = 0, split: str = "train", **options) -> list[str]:
    """Texts for training a byte-level BPE tokenizer: for each of ``n`` screens (seeds seed0 ..), the
    localisation prompt for its instruction, a newline and its answer. No pixels are rendered."""
    out = []
    for seed in range(seed0, seed0 + n):
        s = generate_sample(seed, split=split, render=False, **options)
        out.append(localization_prompt(s.instruction) + "\n" + s.answer)
    return out
