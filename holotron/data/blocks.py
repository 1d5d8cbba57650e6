"""Content blocks: a heading, a paragraph, a form, a group of checkboxes, radio buttons, switches or
drop-downs, a row of buttons, links, cards, a list. Each block is placed at the top of a column
(x0, y) .. (x1, y1), puts as many rows as fit, and returns the y below itself, or None when not even
one row fits (then it has drawn nothing). Columns are filled by ``fill_column``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import widgets as W
from .canvas import Canvas, text_height, text_width
from .labels import LabelPicker
from .styles import Style, mix


@dataclass
class Ctx:
    """What every layout and block needs: the canvas, the style, the random source, the label picker."""

    c: Canvas
    st: Style
    rng: random.Random
    labels: LabelPicker

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def take(self, group: str, size: int, width: int) -> str | None:
        """An unused label of ``group`` whose text is at most ``width`` px wide at ``size``."""
        if width <= 0:
            return None
        return self.labels.take(group, lambda s: text_width(s, size) <= width)

    def claim_icon(self, name: str) -> str:
        """The icon's label when it is still free on this screen, else "" (drawn as decoration)."""
        return W.ICONS[name] if self.labels.claim(W.ICONS[name]) else ""


def wrap(text: str, size: int, width: int) -> list[str]:
    """Greedy word wrap; a word longer than the width gets a line of its own (callers check it fits)."""
    lines, line = [], ""
    for word in text.split():
        cand = word if not line else line + " " + word
        if text_width(cand, size) <= width or not line:
            line = cand
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


# ----------------------------------------------------------------------------------------------
# blocks
# ----------------------------------------------------------------------------------------------

def heading(x: Ctx, x0: int, y: int, x1: int, y1: int, group: str = "heading", size: int | None = None) -> int | None:
    size = size or x.st.large
    h = text_height(size) + 4
    if y + h > y1:
        return None
    label = x.take(group, size, x1 - x0)
    if label is None:
        return None
    x.c.text_in((x0, y, x1, y + h), label, size, x.st.p.text, align="left", bold=size >= 15)
    return y + h


def paragraph(x: Ctx, x0: int, y: int, x1: int, y1: int, max_lines: int = 3, size: int | None = None,
              align: str = "left") -> int | None:
    size = size or x.st.font_size
    th = text_height(size)
    step = round(th * 1.45)
    sentence = x.labels.take("sentence")
    if sentence is None:
        return None
    lines = wrap(sentence, size, x1 - x0)
    if len(lines) > max_lines or any(text_width(s, size) > x1 - x0 for s in lines) or y + step * len(lines) > y1:
        return None
    color = x.st.p.muted if x.chance(0.6) else x.st.p.text
    for line in lines:
        x.c.text_in((x0, y, x1, y + step), line, size, color, align=align)
        y += step
    return y


def _field_content(x: Ctx, name: str, width: int) -> tuple[str | None, bool]:
    """(text shown in the field, is it a placeholder) for a field called ``name``."""
    size = x.st.font_size
    if "password" in name.lower() and x.chance(0.5):
        stars = "*" * x.rng.randint(6, 12)
        return (stars, False) if text_width(stars, size) <= width else (None, False)
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
    label_w = max(text_width(s, st.font_size) for s in names) + st.gap + 4
    above = labels_above if labels_above is not None else (w < 420 or x.chance(0.5))
    if not above and w - label_w < 140:
        above = True
    th = text_height(st.font_size)
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
    row_h = max(s, text_height(st.font_size)) + max(4, st.gap)
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
    th = text_height(st.font_size)
    s = min(24, max(12, round(st.font_size * 1.15)))
    g = max(6, s // 2)
    row_h = max(s, th) + max(4, st.gap)
    if y + th + 6 + row_h > y1:
        return None
    caption = x.take("dropdown", st.font_size, x1 - x0)
    labels = [s_ for s_ in (x.take("radio", st.font_size, x1 - x0 - s - g - 4) for _ in range(x.rng.randint(2, 4))) if s_]
    if caption is None or len(labels) < 2:
        return None
    c.text_in((x0, y, x1, y + th + 2), caption, st.font_size, st.p.muted, align="left")
    y += th + 6
    chosen = x.rng.randrange(len(labels))
    widths = [s + g + text_width(lab, st.font_size) + 4 for lab in labels]
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
    th = text_height(st.font_size)
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


def buttons(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None, align: str | None = None,
            stacked: bool = False, size: int | None = None) -> int | None:
    """A row of buttons (the primary one last when right-aligned, first otherwise), or a stack of
    full-width buttons."""
    st = x.st
    ch = st.control_h
    if y + ch > y1:
        return None
    n = n or x.rng.randint(1, 3)
    align = align or x.rng.choice(("left", "right", "center"))
    primary = x.chance(0.8)
    if stacked:
        placed = 0
        for k in range(n):
            if y + ch > y1:
                break
            label = x.take("button", size or st.font_size, x1 - x0 - 2 * st.pad)
            if label is None:
                break
            W.button(x.c, st, (x0, y, x1, y + ch), label, primary and k == 0, size)
            y += ch + st.gap
            placed += 1
        return y - st.gap if placed else None
    labels, total = [], 0
    for _ in range(n):
        label = x.take("button", size or st.font_size, x1 - x0 - 2 * st.pad)
        if label is None:
            break
        w = W.button_width(st, label, size)
        if total + w + (st.gap if labels else 0) > x1 - x0:
            break
        total += w + (st.gap if labels else 0)
        labels.append(label)
    if not labels:
        return None
    if align == "right":
        xx = x1 - total
    elif align == "center":
        xx = x0 + (x1 - x0 - total) // 2
    else:
        xx = x0
    main = len(labels) - 1 if align == "right" else 0
    for k, label in enumerate(labels):
        w = W.button_width(st, label, size)
        W.button(x.c, st, (xx, y, xx + w, y + ch), label, primary and k == main, size)
        xx += w + st.gap
    return y + ch


def links(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None, size: int | None = None,
          column: bool | None = None, underline: bool | None = None) -> int | None:
    st = x.st
    size = size or st.font_size
    n = n or x.rng.randint(2, 5)
    column = x.chance(0.4) if column is None else column
    underline = x.chance(0.6) if underline is None else underline
    lh = text_height(size) + 5
    step = lh + max(4, st.gap // 2 + 2)
    if y + lh > y1:
        return None
    xx, placed = x0, 0
    for _ in range(n):
        label = x.take("link", size, x1 - x0 - 4)
        if label is None:
            break
        w, _ = W.link_size(st, label, size)
        if not column and xx > x0 and xx + w > x1:  # wrap to the next line
            xx, y = x0, y + step
        if y + lh > y1:
            break
        W.link(x.c, st, xx, y + lh // 2, label, size, underline)
        placed += 1
        if column:
            y += step
        else:
            xx += w + 2 * st.pad
    if not placed:
        return None
    return y - (step - lh) if column else y + lh


def cards(x: Ctx, x0: int, y: int, x1: int, y1: int) -> int | None:
    st, c, p = x.st, x.c, x.st.p
    min_w = max(170, st.font_size * 13)
    cols = max(1, min(x.rng.randint(1, 4), (x1 - x0 + st.gap) // (min_w + st.gap)))
    cw = (x1 - x0 - st.gap * (cols - 1)) // cols
    pad = max(8, st.pad)
    th_l, th = text_height(st.large), text_height(st.font_size)
    with_value = x.chance(0.5)
    action = x.rng.choice(("button", "link"))
    ch = st.control_h
    card_h = pad + th_l + 4 + (th + 8 if with_value else 0) + st.gap + ch + pad
    if y + card_h > y1 or cw < min_w:
        return None
    rows = x.rng.randint(1, 2)
    r = min(12, st.radius(ch) + 2)
    yy = y
    for _ in range(rows):
        if yy + card_h > y1:
            break
        for k in range(cols):
            cx0 = x0 + k * (cw + st.gap)
            card = (cx0, yy, cx0 + cw, yy + card_h)
            title = x.take("heading", st.large, cw - 2 * pad)
            if title is None:
                continue
            if x.chance(0.5):  # a drop shadow
                shadow = mix(p.bg, (0, 0, 0), 0.4 if p.dark else 0.12)
                c.rect((card[0] + 2, card[1] + 3, card[2] + 2, card[3] + 3), fill=shadow, radius=r)
            c.rect(card, fill=p.surface, outline=p.border, width=1, radius=r)
            ty = yy + pad
            c.text_in((cx0 + pad, ty, card[2] - pad, ty + th_l + 2), title, st.large, p.text, align="left", bold=True)
            ty += th_l + 4
            if with_value:
                value = x.take("value", st.font_size, cw - 2 * pad)
                if value:
                    c.text_in((cx0 + pad, ty, card[2] - pad, ty + th + 4), value, st.font_size, p.muted, align="left")
                ty += th + 8
            ty += st.gap
            if action == "button":
                label = x.take("button", st.font_size, cw - 4 * pad)
                if label:
                    bw = min(cw - 2 * pad, W.button_width(st, label))
                    W.button(c, st, (cx0 + pad, ty, cx0 + pad + bw, ty + ch), label, x.chance(0.3))
            else:
                label = x.take("link", st.font_size, cw - 2 * pad - 4)
                if label:
                    W.link(c, st, cx0 + pad, ty + ch // 2, label, underline=False)
        yy += card_h + st.gap
    return yy - st.gap


def list_rows(x: Ctx, x0: int, y: int, x1: int, y1: int, n: int | None = None, icons: bool | None = None,
              chevrons: bool | None = None, group: str = "list item", row_h: int | None = None,
              selected: int | None = -1) -> int | None:
    st, c = x.st, x.c
    icons = x.chance(0.5) if icons is None else icons
    chevrons = x.chance(0.5) if chevrons is None else chevrons
    sub = x.chance(0.25)
    th = text_height(st.font_size)
    row_h = row_h or max(round(st.control_h * x.rng.uniform(1.1, 1.5)), 2 * th + 8 if sub else 0)
    sub = sub and row_h >= 2 * th + 8  # a second line only where it fits
    n = n or x.rng.randint(3, 8)
    sep = x.chance(0.5)
    sel = x.rng.randrange(n) if selected == -1 and x.chance(0.4) else selected
    icon_names = list(W.TOOLBAR_ICONS)
    x.rng.shuffle(icon_names)
    placed = 0
    for k in range(n):
        if y + row_h > y1:
            break
        room = x1 - x0 - W.list_row_width(x.st, "", icons, chevrons)
        label = x.take(group, st.font_size, room)
        if label is None:
            break
        detail = x.take("option", max(9, st.font_size - 2), room) if sub else None
        W.list_row(c, st, (x0, y, x1, y + row_h), label, selected=k == sel, chevron=chevrons,
                   icon=icon_names[k % len(icon_names)] if icons else None, sub=detail)
        y += row_h
        if sep and k < n - 1:
            c.line([(x0 + st.pad, y), (x1 - 1, y)], mix(st.p.bg, st.p.border, 0.6), 1)
            y += 1
        placed += 1
    return y if placed else None


BLOCKS = {
    "heading": heading, "paragraph": paragraph, "form": form, "checks": checks, "radios": radios,
    "switches": switches, "dropdowns": dropdowns, "buttons": buttons, "links": links, "cards": cards,
    "list": list_rows,
}


def fill_column(x: Ctx, x0: int, y: int, x1: int, y1: int, weights: dict[str, float], max_blocks: int = 12) -> int:
    """Stack randomly chosen blocks (by ``weights``) from y down to y1; returns the y below the last."""
    names, w = list(weights), list(weights.values())
    misses, placed = 0, 0
    sg = round(x.st.gap * x.rng.uniform(1.6, 2.6))
    while misses < 3 and placed < max_blocks and y1 - y >= x.st.control_h:
        name = x.rng.choices(names, w)[0]
        ny = BLOCKS[name](x, x0, y, x1, y1)
        if ny is None:
            misses += 1
            continue
        y = ny + sg
        placed += 1
    return y
