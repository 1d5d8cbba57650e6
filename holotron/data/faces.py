"""The font faces a screen's text can be drawn in: Pillow's bundled Aileron (the default, what every screen
used before faces could be chosen) and the open-licensed faces in ``fonts/`` (fonts/README.md: families,
Debian packages, licences).

    face_path("karla")                     # the bundled file of a face; None for "aileron" (Pillow's own)
    pick_face(None, "train", 7)            # None: Aileron, the screen exactly as without a face
    pick_face("karla", "train", 7)         # "karla"
    pick_face("mixed", "train", 7)         # one face per screen, drawn from (split, seed) alone

None of the bundled faces is a family of the real-browser set (scripts/browser_set/pages.py ``FONTS``), so
that set keeps measuring screens in fonts the training never showed. Bold text is drawn the way it always
is (the regular face pasted twice, holotron/data/canvas.py), so only regular files are bundled.

"mixed" draws Aileron for ``AILERON_SHARE`` of the screens and one of the other faces, equally likely, for
the rest. Its random source is its own (``random.Random("holotron.data.font:{split}:{seed}")``), not the
screen's: a mixed screen keeps its seed's size, theme, layout and style, and differs from the default one
by its glyphs and what their widths let fit where (the layouts' later draws follow what fitted).
"""

from __future__ import annotations

import random
from pathlib import Path

__all__ = ["DEFAULT_FACE", "FACES", "FONT_CHOICES", "AILERON_SHARE", "face_path", "pick_face", "canvas_face"]

DEFAULT_FACE = "aileron"
# face -> bundled file in fonts/ (None: Pillow's own ImageFont.load_default)
FACES: dict[str, str | None] = {
    "aileron": None,
    "cabin": "Cabin-Regular.otf",
    "clear-sans": "ClearSans-Regular.ttf",
    "junction": "Junction.otf",
    "karla": "Karla-Regular.otf",
    "manrope": "Manrope-Regular.ttf",
    "noto-serif": "NotoSerif-Regular.ttf",
    "oxygen-sans": "Oxygen-Sans.ttf",
}
FONT_CHOICES = ("mixed", *FACES)  # what generate_sample(font=...) takes besides None
# "mixed": Aileron on this share of the screens (the synthetic evals are all Aileron), the rest shared equally
AILERON_SHARE = 0.3

_FOLDER = Path(__file__).resolve().parent / "fonts"


def face_path(face: str) -> str | None:
    """The font file of ``face`` (a FACES key); None for Aileron, which Pillow carries itself."""
    if face not in FACES:
        raise ValueError(f"unknown font {face!r}: use one of {', '.join(FACES)}")
    name = FACES[face]
    return None if name is None else str(_FOLDER / name)


def canvas_face(face: str | None) -> str | None:
    """What a Canvas and a Style carry for the face ``face`` (a ``settings["font"]``): None for Aileron (the
    default's own caches and pixels), else the name."""
    return None if face in (None, DEFAULT_FACE) else face


def pick_face(font: str | None, split: str, seed: int) -> str | None:
    """The face of one screen for ``generate_sample(font=...)``: None stays None (Aileron, the default screen);
    a FACES name is itself; "mixed" draws one from its own random source (see the module docstring)."""
    if font is None:
        return None
    if font == "mixed":
        rng = random.Random(f"holotron.data.font:{split}:{seed}")
        if rng.random() < AILERON_SHARE:
            return DEFAULT_FACE
        return rng.choice([f for f in FACES if f != DEFAULT_FACE])
    if font not in FACES:
        raise ValueError(f"unknown font {font!r}: use None or one of {', '.join(FONT_CHOICES)}")
    return font
