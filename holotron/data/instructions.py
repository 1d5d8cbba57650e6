"""What the model reads and writes for a screen: the instruction naming the target, the click answer and
the chat messages for ``holotron.Processor`` (the tokenizer corpus, which renders screens, is in screens.py)."""

from __future__ import annotations

import json
import random

from ..grounding import Point, localization_messages
from .canvas import BoxT

# role -> how instructions call it
ROLE_NAMES = {
    "button": "button", "icon": "icon", "tab": "tab", "link": "link", "menu": "menu", "menu item": "menu item",
    "checkbox": "checkbox", "radio": "radio button", "switch": "switch", "text field": "text field",
    "dropdown": "dropdown", "list item": "item",
}

# {q}: the label quoted, {l}: the label as is, {r}: the role's name
TEMPLATES = {
    "button": ("the {q} button", "{l} button", "click {q}", "the button labelled {q}", "{q}", "{l}"),
    "icon": ("the {l} icon", "{l} icon", "the {l} button", "the icon for {l}"),
    "tab": ("the {q} tab", "{l} tab", "switch to the {l} tab", "the tab labelled {q}"),
    "link": ("the {q} link", "{l} link", "the link {q}", "click the link {q}"),
    "menu": ("the {q} menu", "{l} menu", "{q} in the menu bar", "open the {l} menu"),
    "menu item": ("the {q} menu item", "{l} menu item", "{q} in the open menu", "the menu entry {q}"),
    "checkbox": ("the checkbox next to {q}", "{l} checkbox", "the {q} checkbox", "tick {q}"),
    "radio": ("the {q} option", "the radio button for {q}", "{l} radio button", "select {q}"),
    "switch": ("the switch for {q}", "{l} switch", "the {q} toggle", "the toggle next to {q}"),
    "text field": ("the {q} field", "{l} field", "the text field labelled {q}", "the {l} input"),
    "dropdown": ("the {q} dropdown", "{l} dropdown", "the drop-down for {q}", "the {q} selector"),
    "list item": ("the {q} item", "{l} in the list", "the row {q}", "the list item {q}"),
}


# a control of a table row (tables.py), named through the row's identifier {row}: {q} / {l} / {r} as above
ROW_TEMPLATES = ("the {q} {r} in the {row} row", "{l} for {row}", "click {q} for the {row} entry",
                 "the {r} {q} next to {row}", "the {row} row's {l} {r}")
ROW_CHECKBOX_TEMPLATES = ("the checkbox for {row}", "tick the {row} row", "the checkbox next to {row}")


def quote(label: str, rng: random.Random) -> str:
    marks = ["'", '"', ""] if "'" not in label else ['"', ""]
    m = rng.choice(marks)
    return f"{m}{label}{m}"


def instruction_for(label: str, role: str, rng: random.Random) -> str:
    """A short instruction naming the element, sometimes with its role: "the 'Save' button", "Settings tab"."""
    template = rng.choice(TEMPLATES[role])
    return template.format(q=quote(label, rng), l=label, r=ROLE_NAMES[role])


def row_instruction(label: str, role: str, row: str, rng: random.Random) -> str:
    """An instruction naming a control of a table row through the row's identifier ``row``: "the 'Edit' button
    in the INV-20417 row", "tick the 'notes_v2.pdf' row" (a row's checkbox, whose label is not shown)."""
    template = rng.choice(ROW_CHECKBOX_TEMPLATES if role == "checkbox" else ROW_TEMPLATES)
    return template.format(q=quote(label, rng), l=label, r=ROLE_NAMES[role], row=quote(row, rng))


def click_point(box: BoxT, width: int, height: int, rng: random.Random | None = None, jitter: float = 0.0) -> Point:
    """The model-space click for a pixel box (x1 / y1 exclusive): its centre, or with ``jitter`` in (0, 1]
    a point up to that fraction of the way from the centre to the edges. Rounded to integers and
    checked to land inside the box when converted back to pixels."""
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if jitter and rng is not None:
        cx += rng.uniform(-1, 1) * jitter * max(0.0, (x1 - x0) / 2 - 2)
        cy += rng.uniform(-1, 1) * jitter * max(0.0, (y1 - y0) / 2 - 2)
    point = Point(round(1000 * cx / width), round(1000 * cy / height))
    px, py = point.x * width / 1000, point.y * height / 1000
    if not (x0 <= px <= x1 - 1 and y0 <= py <= y1 - 1):
        raise ValueError(f"box {box} is too small for a click at {width}x{height} (got {px:.1f}, {py:.1f})")
    return point


def answer_text(point: Point) -> str:
    """H Company's answer form: ``{"x": 512, "y": 384}``."""
    return json.dumps({"x": int(point.x), "y": int(point.y)})


def to_messages(sample, *, thinking: bool = False, image: bool = True) -> list[dict]:
    """Chat messages for ``holotron.Processor``: the localisation query (system "/no_think" unless
    ``thinking``, then the user turn with the image and the prompt) followed by the assistant answer.

    Training contract: ``messages[:-1]`` rendered with ``add_generation_prompt=True`` is exactly the
    inference prompt; the loss goes on the tokens of ``messages[-1]["content"]`` plus the end-of-turn
    token. With ``image=False`` the image part carries no image (for text-only rendering).
    """
    messages = localization_messages(sample.instruction, sample.image if image else None, thinking=thinking)
    messages.append({"role": "assistant", "content": sample.answer})
    return messages

