"""Content blocks: a heading, a paragraph, a row of buttons, links, cards, a list, and the input blocks
of inputs.py (a form, checkboxes, radio buttons, switches, drop-downs). Each block is placed at the top of
a column (x0, y) .. (x1, y1), puts as many rows as fit, and returns the y below itself, or None when not
even one row fits (then it has drawn nothing). Columns are filled by ``fill_column``.
"""

from __future__ import annotations

from . import widgets as W
from .canvas import text_height, text_width
from .context import Ctx
from .inputs import checks, dropdowns, form, radios, switches
from .styles import mix


def wrap(text: str, size: int, width: int, face: str | None = None) -> list[str]:
    """Greedy word wrap; a word longer than the width gets a line of its own (callers check it fits)."""
    lines, line = [], ""
    for word in text.split():
        cand = word if not line else line + " " + word
        if text_width(cand, size, face) <= width or not line:
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
    h = text_height(size, x.st.face) + 4
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
    th = text_height(size, x.st.face)
    step = round(th * 1.45)
    sentence = x.labels.take("sentence")
    if sentence is None:
        return None
    lines = wrap(sentence, size, x1 - x0, x.st.face)
    too_wide = any(text_width(s, size, x.st.face) > x1 - x0 for s in lines)
    if len(lines) > max_lines or too_wide or y + step * len(lines) > y1:
        return None
    color = x.st.p.muted if x.chance(0.6) else x.st.p.text
    for line in lines:
        x.c.text_in((x0, y, x1, y + step), line, size, color, align=align)
        y += step
    return y


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
    lh = text_height(size, st.face) + 5
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
    th_l, th = text_height(st.large, st.face), text_height(st.font_size, st.face)
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
    th = text_height(st.font_size, st.face)
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
