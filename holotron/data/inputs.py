"""Input blocks: a form of text fields, a group of checkboxes, radio buttons, switches or drop-downs. Like
every block (blocks.py), each is placed at the top of a column (x0, y) .. (x1, y1), puts as many rows as
fit, and returns the y below itself, or None when not even one row fits (then it has drawn nothing).
"""

from __future__ import annotations

from . import widgets as W
from .canvas import text_height, text_width
from .context import Ctx
from .styles import mix


def _field_content(x: Ctx, name: str, width: int) -> tuple[str | None, bool]:
    """(text shown in the field, is it a placeholder) for a field called ``name``."""
    size = x.st.font_size
    if "password" in name.lower() and x.chance(0.5):
        stars = "*" * x.rng.randint(6, 12)
        return (stars, False) if text_width(stars, size, x.st.face) <= width else (None, False)
    r = x.rng.random()
    if r < 0.4:
        return x.take("placeholder", size, width), True
    if r < 0.7:
        return x.take("value", size, width), False
    return None, False


def form(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None, labels_above: bool | None = None,
         full_width: bool = False) -> int | None:
    st, c = x.st, x.c
    w = x1 - x0
    n = n or x.rng.randint(1, 4)
    names = [s for s in (x.take("field", st.font_size, w) for _ in range(n)) if s]
    if not names:
        return None
    label_w = max(text_width(s, st.font_size, st.face) for s in names) + st.gap + 4
    above = labels_above if labels_above is not None else (w < 420 or x.chance(0.5))
    if not above and w - label_w < 140:
        above = True
    th = text_height(st.font_size, st.face)
    ch = st.control_h
    row_h = (th + 6 + ch) if above else ch
    fw_max = w if above else w - label_w
    fw = fw_max if full_width or x.chance(0.5) else max(min(fw_max, 140), round(fw_max * x.rng.uniform(0.55, 1.0)))
    placed = 0
    for name in names:
        if y + row_h > y1:
            break
        if above:
            c.text_in((x0, y, x1, y + th + 2), name, st.font_size, st.p.text, align="left", owner=name)
            box = (x0, y + th + 6, x0 + fw, y + th + 6 + ch)
        else:
            c.text_in((x0, y, x0 + label_w, y + ch), name, st.font_size, st.p.text, align="left", owner=name)
            box = (x0 + label_w, y, x0 + label_w + fw, y + ch)
        content, placeholder = _field_content(x, name, fw - 2 * st.pad - (st.font_size + 8))
        icon = "search" if name.lower().startswith("search") else None
        W.text_field(c, st, box, name, content, placeholder, icon=icon)
        y += row_h + st.gap
        placed += 1
    return y - st.gap if placed else None


def checks(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None) -> int | None:
    st = x.st
    s = min(26, max(12, round(st.font_size * 1.15)))
    row_h = max(s, text_height(st.font_size, st.face)) + max(4, st.gap)
    n = n or x.rng.randint(1, 4)
    placed = 0
    for _ in range(n):
        if y + row_h > y1:
            break
        label = x.take("checkbox", st.font_size, x1 - x0 - s - max(6, s // 2) - 4)
        if label is None:
            break
        top = y + (row_h - s) // 2
        W.checkbox(x.c, st, (x0, top, x0 + s, top + s), label, x.chance(0.4))
        y += row_h
        placed += 1
    return y if placed else None


def radios(x: Ctx, x0: int, y: int, x1: int, y1: int) -> int | None:
    st, c = x.st, x.c
    th = text_height(st.font_size, st.face)
    s = min(24, max(12, round(st.font_size * 1.15)))
    g = max(6, s // 2)
    row_h = max(s, th) + max(4, st.gap)
    if y + th + 6 + row_h > y1:
        return None
    caption = x.take("dropdown", st.font_size, x1 - x0)
    labels = [s_ for s_ in (x.take("radio", st.font_size, x1 - x0 - s - g - 4) for _ in range(x.rng.randint(2, 4)))
              if s_]
    if caption is None or len(labels) < 2:
        return None
    c.text_in((x0, y, x1, y + th + 2), caption, st.font_size, st.p.muted, align="left")
    y += th + 6
    chosen = x.rng.randrange(len(labels))
    widths = [s + g + text_width(lab, st.font_size, st.face) + 4 for lab in labels]
    across = sum(widths) + 2 * st.pad * (len(labels) - 1) <= x1 - x0 and x.chance(0.5)
    xx = x0
    for k, label in enumerate(labels):
        if not across and y + row_h > y1:
            break
        top = y + (row_h - s) // 2
        W.radio(c, st, (xx, top, xx + s, top + s), label, k == chosen)
        if across:
            xx += widths[k] + 2 * st.pad
        else:
            y += row_h
    return y + row_h if across else y


def switches(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None) -> int | None:
    st, c = x.st, x.c
    tw, th_ = round(st.font_size * 2.6), round(st.font_size * 1.45)
    row_h = max(st.control_h, th_ + 2 * st.gap)
    lines = x.chance(0.5)
    n = n or x.rng.randint(1, 5)
    placed = 0
    for _ in range(n):
        if y + row_h > y1:
            break
        label = x.take("switch", st.font_size, x1 - x0 - tw - 2 * st.gap)
        if label is None:
            break
        c.text_in((x0, y, x1 - tw - st.gap, y + row_h), label, st.font_size, st.p.text, align="left", owner=label)
        top = y + (row_h - th_) // 2
        W.switch(c, st, (x1 - tw, top, x1, top + th_), label, x.chance(0.5))
        if lines:
            c.line([(x0, y + row_h), (x1 - 1, y + row_h)], mix(st.p.bg, st.p.border, 0.6), 1)
        y += row_h + 1
        placed += 1
    return y if placed else None


def dropdowns(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None) -> int | None:
    st, c = x.st, x.c
    th = text_height(st.font_size, st.face)
    ch = st.control_h
    n = n or x.rng.randint(1, 3)
    placed = 0
    for _ in range(n):
        if y + th + 6 + ch > y1:
            break
        name = x.take("dropdown", st.font_size, x1 - x0)
        value = x.take("option", st.font_size, x1 - x0 - st.pad - ch - 4)
        if name is None or value is None:
            break
        dw = min(x1 - x0, max(W.dropdown_min_width(st, value), round((x1 - x0) * x.rng.uniform(0.4, 1.0))))
        c.text_in((x0, y, x1, y + th + 2), name, st.font_size, st.p.text, align="left", owner=name)
        W.dropdown(c, st, (x0, y + th + 6, x0 + dw, y + th + 6 + ch), name, value)
        y += th + 6 + ch + st.gap
        placed += 1
    return y - st.gap if placed else None
