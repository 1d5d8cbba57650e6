"""Looks of a synthetic screen: colour themes, accent hues, corner shapes, font sizes, densities and
screen sizes, and the two splits that divide them.

The "train" and "heldout" splits use disjoint families of every setting, so an eval on "heldout" tests
generalisation to screens whose look the training never showed, not recall of renders:

    setting        train                                     heldout
    theme          light, dark, grey, slate                  sepia (warm tinted light), midnight (tinted dark)
    accent hue     8 of the 12 30-degree bands               the other 4 (60-90, 150-180, 240-270, 330-360)
    corners        square, small, round                      pill
    font size      11, 12, 13, 14, 16, 18 px                 15, 17, 20 px
    screen         phone, square, tablet, laptop, desktop    tablet-portrait, phone-landscape, ultrawide
                   (aspect 0.42-0.56, 0.9-1.25, 1.3-1.45,    (aspect 0.66-0.8, 1.95-2.4)
                    1.55-1.8)
    layout         app, dialog, web, mobile, form            panels, wizard

Density (spacing, control heights) is shared by both splits and drawn from [0.8, 1.3].
"""

from __future__ import annotations

import colorsys
import random
from dataclasses import dataclass

RGB = tuple[int, int, int]


# ----------------------------------------------------------------------------------------------
# the splits
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Split:
    themes: tuple[str, ...]
    hue_bands: tuple[int, ...]   # accent hue bands, band k covers hues [30k, 30k + 30) degrees
    corners: tuple[str, ...]
    font_sizes: tuple[int, ...]  # px of body text
    sizes: tuple[str, ...]       # SIZES keys
    layouts: tuple[str, ...]     # holotron.data.layouts.LAYOUTS keys


SPLITS = {
    "train": Split(
        themes=("light", "dark", "grey", "slate"),
        hue_bands=(0, 1, 3, 4, 6, 7, 9, 10),
        corners=("square", "small", "round"),
        font_sizes=(11, 12, 13, 14, 16, 18),
        sizes=("phone", "square", "tablet", "laptop", "desktop"),
        layouts=("app", "dialog", "web", "mobile", "form"),
    ),
    "heldout": Split(
        themes=("sepia", "midnight"),
        hue_bands=(2, 5, 8, 11),
        corners=("pill",),
        font_sizes=(15, 17, 20),
        sizes=("tablet-portrait", "phone-landscape", "ultrawide"),
        layouts=("panels", "wizard"),
    ),
}

# size family -> (width range, aspect ratio (width / height) range)
SIZES = {
    "phone": ((360, 430), (0.42, 0.56)),
    "square": ((560, 1100), (0.90, 1.25)),
    "tablet": ((1024, 1366), (1.30, 1.45)),
    "laptop": ((1280, 1536), (1.55, 1.80)),
    "desktop": ((1600, 1920), (1.55, 1.80)),
    "tablet-portrait": ((744, 900), (0.66, 0.80)),
    "phone-landscape": ((740, 932), (1.95, 2.20)),
    "ultrawide": ((2000, 2560), (2.20, 2.40)),
}

CORNERS = ("square", "small", "round", "pill")
DENSITY = (0.8, 1.3)


def pick_size(rng: random.Random, family: str) -> tuple[int, int]:
    (w0, w1), (a0, a1) = SIZES[family]
    w = rng.randint(w0, w1)
    return w, max(1, round(w / rng.uniform(a0, a1)))


# ----------------------------------------------------------------------------------------------
# colours
# ----------------------------------------------------------------------------------------------

def hsl(h: float, s: float, l: float) -> RGB:
    """Hue in degrees, saturation and lightness in [0, 1] -> 8-bit RGB."""
    r, g, b = colorsys.hls_to_rgb((h % 360) / 360, min(max(l, 0), 1), min(max(s, 0), 1))
    return round(r * 255), round(g * 255), round(b * 255)


def mix(a: RGB, b: RGB, t: float) -> RGB:
    """(1 - t) * a + t * b."""
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def luminance(c: RGB) -> float:
    r, g, b = (v / 255 for v in c)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@dataclass(frozen=True)
class Palette:
    desktop: RGB      # behind windows
    bg: RGB           # window / page background
    surface: RGB      # cards, dialogs, fields' panels
    bar: RGB          # title bars, toolbars, navigation bars
    border: RGB
    text: RGB
    muted: RGB        # secondary text, placeholders
    accent: RGB       # primary buttons, selection, checked boxes
    on_accent: RGB    # text on the accent colour
    link: RGB
    selected: RGB     # selected tab / row background
    field: RGB        # text field fill
    control: RGB      # default button fill
    dark: bool


# theme -> (dark?, background hue range, saturation range, lightness range)
THEMES = {
    "light": (False, (0, 360), (0.0, 0.04), (0.96, 1.0)),
    "grey": (False, (190, 230), (0.0, 0.08), (0.84, 0.90)),
    "dark": (True, (0, 360), (0.0, 0.04), (0.10, 0.16)),
    "slate": (True, (200, 228), (0.15, 0.30), (0.14, 0.20)),
    "sepia": (False, (28, 46), (0.25, 0.45), (0.86, 0.93)),
    "midnight": (True, (250, 290), (0.25, 0.45), (0.07, 0.12)),
}


def make_palette(rng: random.Random, theme: str, accent_hue: float) -> Palette:
    dark, (h0, h1), (s0, s1), (l0, l1) = THEMES[theme]
    h, s, l = rng.uniform(h0, h1), rng.uniform(s0, s1), rng.uniform(l0, l1)
    sign = 1 if dark else -1  # raised surfaces get lighter on dark themes, darker bars on light ones
    bg = hsl(h, s, l)
    surface = hsl(h, s, min(1.0, l + (0.05 if dark else 0.03)))
    bar = hsl(h, s, l + sign * rng.uniform(0.03, 0.08))
    border = hsl(h, s, l + sign * rng.uniform(0.16, 0.30))
    text = hsl(h, s * 0.6, rng.uniform(0.88, 0.96) if dark else rng.uniform(0.06, 0.20))
    muted = mix(text, bg, rng.uniform(0.35, 0.5))
    accent = hsl(accent_hue, rng.uniform(0.55, 0.85), rng.uniform(0.55, 0.66) if dark else rng.uniform(0.36, 0.48))
    on_accent = (255, 255, 255) if luminance(accent) < 0.55 else (15, 15, 15)
    link = hsl(accent_hue, 0.75, 0.68 if dark else 0.38)
    selected = mix(bg, accent, 0.22)
    if dark:
        field = hsl(h, s, l + 0.06)    # inputs a little lighter than the page
    elif l <= 0.97:
        field = hsl(h, s, l + 0.03)    # ... or a little whiter
    else:
        field = hsl(h, s, l - 0.03)    # ... or, on a white page, a little greyer
    control = hsl(h, s, l + sign * rng.uniform(0.06, 0.12))
    desktop = hsl(rng.uniform(0, 360), rng.uniform(0.2, 0.5), rng.uniform(0.25, 0.55))
    return Palette(desktop, bg, surface, bar, border, text, muted, accent, on_accent, link, selected, field,
                   control, dark)


# ----------------------------------------------------------------------------------------------
# the style of one screen
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Style:
    theme: str
    accent_hue: float
    corner: str
    font_size: int      # body text, px
    density: float      # spacing multiplier
    p: Palette
    # derived sizes, px
    small: int          # secondary text
    large: int          # headings
    control_h: int      # buttons, fields, tabs
    pad: int            # horizontal padding inside controls
    gap: int            # space between controls
    border: int         # outline width
    # drawing variants
    tab_look: str       # "underline" | "box"
    field_look: str     # "box" | "underline"
    window_look: str    # "win" | "mac"
    button_look: str    # "filled" | "outline"
    face: str | None = None  # the font face of the screen's text (faces.FACES; None: Aileron), set after make_style

    def radius(self, h: int) -> int:
        """Corner radius for a control of height ``h``."""
        return {"square": 0, "small": max(2, h // 8), "round": max(3, h // 4), "pill": h // 2}[self.corner]


def make_style(rng: random.Random, theme: str, accent_hue: float, corner: str, font_size: int,
               density: float) -> Style:
    fs = font_size
    return Style(
        theme=theme, accent_hue=accent_hue, corner=corner, font_size=fs, density=density,
        p=make_palette(rng, theme, accent_hue),
        small=max(9, round(fs * 0.85)),
        large=round(fs * rng.uniform(1.3, 1.7)),
        control_h=round(fs * rng.uniform(1.9, 2.3) * density),
        pad=max(4, round(fs * rng.uniform(0.7, 1.2) * density)),
        gap=max(3, round(fs * rng.uniform(0.45, 0.9) * density)),
        border=1 if rng.random() < 0.85 else 2,
        tab_look=rng.choice(("underline", "box")),
        field_look="box" if rng.random() < 0.8 else "underline",
        window_look=rng.choice(("win", "mac")),
        button_look="filled" if rng.random() < 0.7 else "outline",
    )
