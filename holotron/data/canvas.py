"""A recording canvas: layouts draw on it, it remembers what is where, and renders with Pillow at the end.

Layout code calls ``rect`` / ``ellipse`` / ``line`` / ``polygon`` / ``text`` (drawing ops, kept in a list)
and ``element`` (a clickable thing: label, role, box). Nothing is rasterised until ``render()``, so the
text corpus can build screens without paying for pixels. ``cover(box)`` records an opaque layer drawn
later (an open menu): earlier elements and texts it touches stop counting as visible. ``dim()`` records
a modal backdrop: every earlier element stops counting as clickable.

Text uses only Pillow's bundled scalable font (``ImageFont.load_default(size=...)``, Aileron, with the
basic layout engine) or, when a canvas is given a ``face``, one of the font files bundled in fonts/
(holotron/data/faces.py; the same basic layout engine), never a system font, so the same seed gives the
same pixels wherever the same Pillow and FreeType run. A canvas draws all its text in its one face, and
each text op records it; layout code measures with the face of the screen's style (``Style.face``), the
same one. Rasterised text is cached per (text, size, face): a screen pastes masks instead of rasterising,
which is most of the speed.

Boxes are (x0, y0, x1, y1) in pixels, x1 / y1 exclusive (a box of width w covers x0 .. x0 + w - 1).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from PIL import Image, ImageDraw, ImageFont

from .faces import face_path

BoxT = tuple[int, int, int, int]
RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Element:
    """Something a user can click: its visible (or, for icons, spoken) label, its role, its pixel box, and for a
    control of a table row (tables.py) the text of the row's identifier, through which instructions name it
    (its label repeats on every row); None everywhere else."""

    label: str
    role: str
    box: BoxT  # (x0, y0, x1, y1) pixels, x1 / y1 exclusive
    row: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Text:
    """A piece of text drawn on the screen and the pixel box of its ink."""

    text: str
    box: BoxT


# ----------------------------------------------------------------------------------------------
# the fonts: Pillow's bundled Aileron (face None or "aileron") or a face of fonts/ (faces.py)
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def font(size: int, face: str | None = None) -> ImageFont.FreeTypeFont:
    path = None if face is None else face_path(face)
    if path is not None:
        return ImageFont.truetype(path, size, layout_engine=ImageFont.Layout.BASIC)
    f = ImageFont.load_default(size=size)
    if not isinstance(f, ImageFont.FreeTypeFont):  # Pillow < 10.1 or without FreeType: a fixed bitmap font
        raise RuntimeError("holotron.data needs Pillow >= 10.1 with FreeType (a scalable ImageFont.load_default)")
    return f


@functools.lru_cache(maxsize=65536)
def ink(text: str, size: int, face: str | None = None) -> BoxT:
    """Ink box of ``text`` relative to its left-middle anchor point ("lm")."""
    return font(size, face).getbbox(text, anchor="lm")


def text_width(text: str, size: int, face: str | None = None) -> int:
    x0, _, x1, _ = ink(text, size, face)
    return x1 - x0


_REFERENCE = "Tg|()[]jpqy'/"  # ASCII ink reaches from this text's top to its bottom


@functools.lru_cache(maxsize=None)
def text_height(size: int, face: str | None = None) -> int:
    """Height of a line's ink (ascenders to descenders), the same for every text at one size in one face."""
    _, y0, _, y1 = ink(_REFERENCE, size, face)
    return y1 - y0


@functools.lru_cache(maxsize=32768)  # room for the masks of several faces (mixed fonts: 8192 halved the rate)
def _mask(text: str, size: int, face: str | None = None) -> Image.Image:
    x0, y0, x1, y1 = ink(text, size, face)
    mask = Image.new("L", (max(1, x1 - x0), max(1, y1 - y0)), 0)
    ImageDraw.Draw(mask).text((-x0, -y0), text, font=font(size, face), fill=255, anchor="lm")
    return mask


# ----------------------------------------------------------------------------------------------
# boxes
# ----------------------------------------------------------------------------------------------

def overlaps(a: BoxT, b: BoxT) -> bool:
    """True when two exclusive-corner boxes share at least one pixel."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner: BoxT, outer: BoxT) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


class Mark(NamedTuple):
    ops: int
    elements: int
    texts: int


# ----------------------------------------------------------------------------------------------
# the canvas
# ----------------------------------------------------------------------------------------------

class Canvas:
    def __init__(self, width: int, height: int, background: RGB, face: str | None = None):
        """``face``: the font face of every text drawn on it (faces.FACES; None: Aileron, as always)."""
        self.width, self.height, self.background, self.face = width, height, background, face
        self.ops: list[tuple] = []
        self._elements: list[tuple[Element, bool]] = []  # (element, still clickable)
        self._texts: list[tuple[Text, bool, str | None]] = []  # (text, still visible, label of its element)
        self.screen = (0, 0, width, height)
        self._row: str | None = None  # the table row whose controls are being recorded (``row_of``)

    # drawing ops ---------------------------------------------------------------------------
    def rect(self, box: BoxT, fill: RGB | None = None, outline: RGB | None = None, width: int = 1, radius: int = 0):
        if box[2] > box[0] and box[3] > box[1]:
            self.ops.append(("rect", box, fill, outline, width, radius))

    def ellipse(self, box: BoxT, fill: RGB | None = None, outline: RGB | None = None, width: int = 1):
        self.ops.append(("ellipse", box, fill, outline, width))

    def line(self, points: list[tuple[float, float]], fill: RGB, width: int = 1):
        self.ops.append(("line", points, fill, width))

    def polygon(self, points: list[tuple[float, float]], fill: RGB):
        self.ops.append(("polygon", points, fill))

    def arc(self, box: BoxT, start: float, end: float, fill: RGB, width: int = 1):
        self.ops.append(("arc", box, start, end, fill, width))

    def text(self, x: int, y: int, text: str, size: int, fill: RGB, bold: bool = False,
             owner: str | None = None) -> BoxT:
        """Draw ``text`` with its left edge at x and its vertical middle at y; returns its ink box.
        ``owner``: the label of the element this text belongs to (its caption, value or placeholder)."""
        x0, y0, x1, y1 = ink(text, size, self.face)
        box = (x + x0, y + y0, x + x1 + (1 if bold else 0), y + y1)
        self.ops.append(("text", (box[0], box[1]), text, size, fill, bold, self.face))
        self._texts.append((Text(text, box), True, owner))
        return box

    def text_in(self, box: BoxT, text: str, size: int, fill: RGB, align: str = "center", pad: int = 0,
                bold: bool = False, owner: str | None = None) -> BoxT:
        """Draw ``text`` vertically centred in ``box``, aligned "left" (after ``pad``), "center" or "right"."""
        w = text_width(text, size, self.face) + (1 if bold else 0)
        if align == "left":
            x = box[0] + pad
        elif align == "right":
            x = box[2] - pad - w
        else:
            x = box[0] + (box[2] - box[0] - w) // 2
        x -= ink(text, size, self.face)[0]
        _, y0, _, y1 = ink(_REFERENCE, size, self.face)  # centre the line's full height, so baselines line up
        y = (box[1] + box[3]) // 2 - (y0 + y1) // 2
        return self.text(x, y, text, size, fill, bold, owner)

    # what is where -------------------------------------------------------------------------
    def element(self, label: str, role: str, box: BoxT) -> Element:
        e = Element(label, role, tuple(int(v) for v in box), self._row)
        self._elements.append((e, True))
        return e

    @contextlib.contextmanager
    def row_of(self, identifier: str):
        """Elements recorded inside this block are controls of the table row that ``identifier`` names
        (``Element.row``)."""
        outer, self._row = self._row, identifier
        try:
            yield
        finally:
            self._row = outer

    def cover(self, box: BoxT, upto: Mark | None = None):
        """An opaque layer over ``box`` (drawn by the ops that follow): what was recorded before it (or
        before ``upto``) and touches it is hidden."""
        ne = len(self._elements) if upto is None else upto.elements
        nt = len(self._texts) if upto is None else upto.texts
        self._elements = [(e, ok and (i >= ne or not overlaps(e.box, box))) for i, (e, ok) in enumerate(self._elements)]
        self._texts = [(t, ok and (i >= nt or not overlaps(t.box, box)), o) for i, (t, ok, o) in enumerate(self._texts)]

    def dim(self, color: RGB, alpha: float, upto: Mark | None = None):
        """A modal backdrop over the whole screen: elements recorded before it (or before ``upto``) are
        no longer clickable (their texts stay visible, dimmed)."""
        ne = len(self._elements) if upto is None else upto.elements
        self.ops.append(("dim", color, alpha))
        self._elements = [(e, ok and i >= ne) for i, (e, ok) in enumerate(self._elements)]

    # building a group, then placing it -----------------------------------------------------
    def mark(self) -> Mark:
        """Where the records stand now: a group built after this can be moved (``shift``) or get a
        background drawn beneath it (``beneath``)."""
        return Mark(len(self.ops), len(self._elements), len(self._texts))

    def shift(self, mark: Mark, dx: int, dy: int):
        """Move everything recorded since ``mark`` by (dx, dy) pixels."""
        def box(b):
            return b[0] + dx, b[1] + dy, b[2] + dx, b[3] + dy

        def pts(ps):
            return [(x + dx, y + dy) for x, y in ps]

        for i in range(mark.ops, len(self.ops)):
            op = self.ops[i]
            kind = op[0]
            if kind in ("rect", "ellipse", "arc"):
                self.ops[i] = (kind, box(op[1]), *op[2:])
            elif kind == "text":
                self.ops[i] = (kind, (op[1][0] + dx, op[1][1] + dy), *op[2:])
            elif kind in ("line", "polygon"):
                self.ops[i] = (kind, pts(op[1]), *op[2:])
        for i in range(mark.elements, len(self._elements)):
            e, ok = self._elements[i]
            self._elements[i] = (Element(e.label, e.role, box(e.box), e.row), ok)
        for i in range(mark.texts, len(self._texts)):
            t, ok, o = self._texts[i]
            self._texts[i] = (Text(t.text, box(t.box)), ok, o)

    @contextlib.contextmanager
    def beneath(self, mark: Mark):
        """Ops recorded inside this block are drawn before everything recorded since ``mark``."""
        tail = self.ops[mark.ops:]
        del self.ops[mark.ops:]
        try:
            yield
        finally:
            self.ops.extend(tail)

    @property
    def elements(self) -> list[Element]:
        return [e for e, ok in self._elements if ok]

    @property
    def texts(self) -> list[Text]:
        return [t for t, ok, _ in self._texts if ok]

    def texts_not_of(self, label: str) -> list[str]:
        """Visible texts that do not belong to the element labelled ``label``."""
        return [t.text for t, ok, o in self._texts if ok and o != label]

    # pixels --------------------------------------------------------------------------------
    def render(self) -> Image.Image:
        image = Image.new("RGB", (self.width, self.height), self.background)
        draw = ImageDraw.Draw(image)
        for op in self.ops:
            kind = op[0]
            if kind == "rect":
                _, (x0, y0, x1, y1), fill, outline, width, radius = op
                xy = (x0, y0, x1 - 1, y1 - 1)  # Pillow's rectangles include their last pixel
                if radius > 0:
                    draw.rounded_rectangle(xy, radius=radius, fill=fill, outline=outline, width=width)
                else:
                    draw.rectangle(xy, fill=fill, outline=outline, width=width)
            elif kind == "text":
                _, (x, y), text, size, fill, bold, face = op
                mask = _mask(text, size, face)
                image.paste(fill, (x, y), mask)
                if bold:
                    image.paste(fill, (x + 1, y), mask)
            elif kind == "ellipse":
                _, (x0, y0, x1, y1), fill, outline, width = op
                draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=fill, outline=outline, width=width)
            elif kind == "line":
                _, points, fill, width = op
                draw.line(points, fill=fill, width=width)
            elif kind == "polygon":
                _, points, fill = op
                draw.polygon(points, fill=fill)
            elif kind == "arc":
                _, (x0, y0, x1, y1), start, end, fill, width = op
                draw.arc((x0, y0, x1 - 1, y1 - 1), start, end, fill=fill, width=width)
            elif kind == "dim":
                _, color, alpha = op
                image = Image.blend(image, Image.new("RGB", image.size, color), alpha)
                draw = ImageDraw.Draw(image)
            else:  # pragma: no cover
                raise AssertionError(f"unknown drawing op {kind!r}")
        return image
