"""Screen grounding: the localisation prompt, parsing click answers, coordinates, scoring, drawing.

Holotron answers a localisation prompt with ``{"x": int, "y": int}`` in
[0, 1000] relative to the image it was sent: x = 1000 * px / width, y = 1000 * py / height.

Coordinates carry their space explicitly:
    "model"       0..1000 on each axis (what the model writes)
    "normalized"  0..1 on each axis (some datasets' boxes)
    "pixel"       pixels of the original image (needs its width and height to convert)

    prompt = localization_prompt("the Save button")
    point = parse_click(answer)                        # Point(x, y, "model") or None
    px = to_pixels(point, width, height)
    hit = score_click(answer, [x0, y0, x1, y1], box_format="xyxy", box_space="pixel", width=w, height=h)
    draw_click(image, point).save("click.png")
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = [
    "Point", "Box", "SPACES", "parse_click", "convert", "to_pixels", "to_model", "point_in_box", "score_click",
    "localization_schema", "localization_prompt", "localization_messages", "draw_click",
]

# full-scale value of each space (None: pixels, scaled by the image size)
SPACES = {"model": 1000.0, "normalized": 1.0, "pixel": None}


def _check_space(space: str) -> None:
    if space not in SPACES:
        raise ValueError(f"unknown coordinate space {space!r}: use one of {', '.join(SPACES)}")


@dataclass(frozen=True)
class Point:
    """A click position; ``space`` says how x and y are measured (see the module docstring)."""

    x: float
    y: float
    space: str = "model"

    def __post_init__(self):
        _check_space(self.space)

    def rounded(self) -> "Point":
        return Point(float(round(self.x)), float(round(self.y)), self.space)


def _scale(space: str, size: float | None, axis: str) -> float:
    if SPACES[space] is not None:
        return SPACES[space]
    if size is None:
        raise ValueError(f"converting pixel coordinates needs the image {axis}")
    if not size > 0:
        raise ValueError(f"image {axis} must be positive, got {size}")
    return float(size)


def convert(point: Point, space: str, width: float | None = None, height: float | None = None) -> Point:
    """``point`` expressed in ``space``; width and height (pixels of the original image) are needed
    whenever one side is "pixel"."""
    _check_space(space)
    if space == point.space:
        return point
    # multiply before dividing: 960 px of 1920 gives exactly 500
    x = point.x * _scale(space, width, "width") / _scale(point.space, width, "width")
    y = point.y * _scale(space, height, "height") / _scale(point.space, height, "height")
    return Point(x, y, space)


def to_pixels(point: Point, width: float, height: float) -> Point:
    """Pixels of a ``width`` x ``height`` image (px = x * width / 1000 for a model-space point)."""
    return convert(point, "pixel", width, height)


def to_model(point: Point, width: float | None = None, height: float | None = None) -> Point:
    """The model's 0-1000 space (x = 1000 * px / width for a pixel point)."""
    return convert(point, "model", width, height)


# ----------------------------------------------------------------------------------------------
# boxes and scoring
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    """An axis-aligned target box, stored as corners (x0, y0) top-left and (x1, y1) bottom-right."""

    x0: float
    y0: float
    x1: float
    y1: float
    space: str = "pixel"

    def __post_init__(self):
        _check_space(self.space)
        values = (self.x0, self.y0, self.x1, self.y1)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"box corners must be finite numbers, got {values}")
        if self.x1 < self.x0 or self.y1 < self.y0:
            raise ValueError(f"box corners are reversed: ({self.x0}, {self.y0}) to ({self.x1}, {self.y1}); "
                             f"is it xywh rather than xyxy?")

    @classmethod
    def from_values(cls, values: Sequence[float], box_format: str = "xyxy", space: str = "pixel") -> "Box":
        """Four numbers in ``box_format`` "xyxy" (x0, y0, x1, y1) or "xywh" (x0, y0, width, height)."""
        values = [float(v) for v in values]
        if len(values) != 4:
            raise ValueError(f"a box has 4 numbers, got {len(values)}")
        if box_format == "xyxy":
            return cls(*values, space=space)
        if box_format == "xywh":
            x, y, w, h = values
            if w < 0 or h < 0:
                raise ValueError(f"xywh box with negative size: width {w}, height {h}")
            return cls(x, y, x + w, y + h, space=space)
        raise ValueError(f"unknown box format {box_format!r}: use 'xyxy' or 'xywh'")

    def convert(self, space: str, width: float | None = None, height: float | None = None) -> "Box":
        a = convert(Point(self.x0, self.y0, self.space), space, width, height)
        b = convert(Point(self.x1, self.y1, self.space), space, width, height)
        return Box(a.x, a.y, b.x, b.y, space)

    @property
    def center(self) -> Point:
        return Point((self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2, self.space)

    def contains(self, point: Point, width: float | None = None, height: float | None = None) -> bool:
        """True when ``point`` lies inside or on the edge; both are compared in the box's space."""
        p = convert(point, self.space, width, height)
        # a relative 1e-9 slack absorbs the rounding of the conversion, so exact edges count as inside
        ex = 1e-9 * max(1.0, abs(self.x0), abs(self.x1))
        ey = 1e-9 * max(1.0, abs(self.y0), abs(self.y1))
        return self.x0 - ex <= p.x <= self.x1 + ex and self.y0 - ey <= p.y <= self.y1 + ey


def point_in_box(point: Point | None, box: Box, width: float | None = None, height: float | None = None) -> bool:
    """Benchmark rule: a click scores when it falls inside the box, edges included; None is a miss."""
    return point is not None and box.contains(point, width, height)


def score_click(answer: str | Point | None, box: Box | Sequence[float], *, width: float | None = None,
                height: float | None = None, box_format: str = "xyxy", box_space: str = "pixel",
                answer_space: str = "model") -> bool:
    """Score one answer (model text, a Point or None) against a target box.

    ``box`` is a Box or four numbers read with ``box_format`` ("xyxy" / "xywh") in ``box_space``
    ("pixel" / "normalized" / "model"); width and height are the original image's pixels. Text is
    parsed with ``parse_click(answer, space=answer_space)``; an unparseable answer is a miss.
    """
    if not isinstance(box, Box):
        box = Box.from_values(box, box_format, box_space)
    point = parse_click(answer, space=answer_space) if isinstance(answer, str) else answer
    return point_in_box(point, box, width, height)


# ----------------------------------------------------------------------------------------------
# parsing answers
# ----------------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
# x=12, y=34 / x: 12, y: 34 / click(x=12, y=34) / "x": "12", "y": "34" outside of valid JSON
_KEYWORD = re.compile(rf"""\bx["']?\s*[=:]\s*["']?({_NUM})["']?\s*[,;]?\s*["']?\by["']?\s*[=:]\s*["']?({_NUM})""", re.I)
# (12, 34) / [12, 34] / click(12, 34) / (12,34) inside other text; exactly two numbers
_PAIR = re.compile(rf"[(\[]\s*({_NUM})\s*,\s*({_NUM})\s*[)\]]")
# keys whose value may be an [x, y] pair
_PAIR_KEYS = {"point", "click", "coordinate", "coordinates", "position", "location", "xy", "click_point",
              "point_2d", "center"}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) else None


def _point_in_json(obj: Any) -> tuple[float, float] | None:
    """The click held by a parsed JSON value: {"x": .., "y": ..}, {"point": [x, y]}, nested in actions."""
    if isinstance(obj, dict):
        keys = {str(k).lower(): v for k, v in obj.items()}
        if "x" in keys and "y" in keys:
            x, y = _number(keys["x"]), _number(keys["y"])
            if x is not None and y is not None:
                return x, y
        for k, v in keys.items():
            if k in _PAIR_KEYS and isinstance(v, (list, tuple)) and len(v) == 2:
                x, y = _number(v[0]), _number(v[1])
                if x is not None and y is not None:
                    return x, y
        for v in obj.values():
            if isinstance(v, (dict, list)):
                found = _point_in_json(v)
                if found is not None:
                    return found
    elif isinstance(obj, list):
        for v in reversed(obj):  # the last action is the answer
            if isinstance(v, (dict, list)):
                found = _point_in_json(v)
                if found is not None:
                    return found
    return None


_MAX_OBJECT = 4000  # characters: a click answer is short; longer brace spans are not tried as JSON


def _brace_pairs(text: str) -> list[tuple[int, int]]:
    """(start, end) of every balanced {...} span, by start: one linear pass (braces inside JSON strings
    are not told apart, which click answers do not need)."""
    stack, pairs = [], []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs.append((stack.pop(), i))
    return sorted(pairs)


def _loads(chunk: str) -> Any:
    try:
        return json.loads(chunk)
    except ValueError:
        pass
    if "'" in chunk:  # {'x': 1, 'y': 2}: Python literal syntax, evaluated as data only
        try:
            return ast.literal_eval(chunk)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return None


def _json_points(text: str) -> list[tuple[float, float]]:
    """Clicks of the JSON objects in ``text``, in order; an object inside one already read is skipped,
    so {"x": 1, "y": 2, "alt": {"x": 3, "y": 4}} counts once, as (1, 2)."""
    points, read_until = [], -1
    for start, end in _brace_pairs(text):
        if start <= read_until or end - start > _MAX_OBJECT:
            continue
        value = _loads(text[start:end + 1])
        found = _point_in_json(value) if value is not None else None
        if found is not None:
            points.append(found)
            read_until = end
    return points


def parse_click(text: str | None, space: str = "model") -> Point | None:
    """Read the click in a model answer; None when there is none.

    Accepted, in order of preference (the last occurrence of the preferred form wins):
    JSON objects ``{"x": 512, "y": 300}`` (also nested in an action, ``{"point": [x, y]}``, single
    quotes, inside code fences or surrounding text); then ``x=.., y=..`` / ``click(x=.., y=..)`` and
    ``(x, y)`` / ``[x, y]`` / ``click(x, y)``. Reasoning is ignored: only the text after the last
    ``</think>`` is read, and an unfinished ``<think>`` block (no answer yet) gives None. ``space``
    tags the result: the numbers are returned as written, never clamped or rescaled.
    """
    _check_space(space)
    if not isinstance(text, str):
        return None
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        text = text.split("<think>", 1)[0]
    found = _json_points(text)
    if found:
        return Point(*found[-1], space)
    best, best_at = None, -1
    for pattern in (_KEYWORD, _PAIR):
        for m in pattern.finditer(text):
            x, y = _number(m.group(1)), _number(m.group(2))
            if x is not None and y is not None and m.start() > best_at:
                best, best_at = (x, y), m.start()
    return None if best is None else Point(*best, space)


# ----------------------------------------------------------------------------------------------
# the localisation prompt
# ----------------------------------------------------------------------------------------------

def localization_schema() -> dict:
    """JSON schema of the answer, as pydantic writes it for two integer fields in [0, 1000]."""
    def field(axis: str) -> dict:
        return {"description": f"{axis.upper()} coordinate as integer in [0, 1000]", "maximum": 1000, "minimum": 0,
                "title": axis.upper(), "type": "integer"}

    return {"properties": {"x": field("x"), "y": field("y")}, "required": ["x", "y"],
            "title": "VisualLocalizerOutput", "type": "object"}


def localization_prompt(target: str, schema: dict | str | None = None) -> str:
    """H Company's localisation prompt for ``target``.

    The schema is inserted the way H Company's documented client code does it, a Python f-string of
    the schema dict; pass a string to insert it verbatim instead.
    """
    if not isinstance(target, str) or not target.strip():
        raise ValueError("the localisation target must be a non-empty text")
    schema = localization_schema() if schema is None else schema
    return ("Localize an element on the GUI image according to the provided target and output a click position.\n"
            f" * You must output a valid JSON following the format: {schema}\n"
            f" Your target is:\n{target}")


def localization_messages(target: str, image: Any = None, *, thinking: bool = False,
                          schema: dict | str | None = None) -> list[dict]:
    """Chat messages for one grounding query: the image first, then the prompt. Reasoning is off by
    default (a "/no_think" system message), as H Company recommends for localisation."""
    image_part = {"type": "image"} if image is None else {"type": "image", "image": image}
    messages = [] if thinking else [{"role": "system", "content": "/no_think"}]
    messages.append({"role": "user",
                     "content": [image_part, {"type": "text", "text": localization_prompt(target, schema)}]})
    return messages


# ----------------------------------------------------------------------------------------------
# drawing
# ----------------------------------------------------------------------------------------------

def draw_click(image, point: Point, *, color=(255, 0, 0), radius: int | None = None, line_width: int | None = None):
    """A copy of ``image`` (PIL) with a circle and a crosshair centred on ``point``.

    ``point`` may be in any space; it is converted with the image's size. The input is not modified;
    images that are not RGB / RGBA are converted to RGB so the marker keeps its colour.
    """
    from PIL import ImageDraw

    out = image.copy() if image.mode in ("RGB", "RGBA") else image.convert("RGB")
    w, h = out.size
    p = convert(point, "pixel", w, h)
    r = radius if radius is not None else max(6, round(min(w, h) / 40))
    lw = line_width if line_width is not None else max(1, r // 5)
    fill = tuple(color) + ((255,) if out.mode == "RGBA" and len(color) == 3 else ())
    draw = ImageDraw.Draw(out)
    cx, cy = p.x, p.y
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=lw)
    arm = round(1.6 * r)
    draw.line([cx - arm, cy, cx + arm, cy], fill=fill, width=lw)
    draw.line([cx, cy - arm, cx, cy + arm], fill=fill, width=lw)
    return out
