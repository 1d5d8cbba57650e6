"""Bars along the edges of a window: title bar, menu bar (with an open menu now and then), toolbar,
tab row, status bar, sidebar. Each takes the span it may use and a ``limit`` it must not cross, and
returns where the content may start (or end); it draws nothing when it does not fit.
"""

from __future__ import annotations

from . import blocks as B
from . import widgets as W
from .canvas import text_height, text_width
from .context import Ctx
from .icon_places import window_controls
from .styles import mix

SHORTCUTS = ("Ctrl+N", "Ctrl+O", "Ctrl+S", "Ctrl+Shift+S", "Ctrl+P", "Ctrl+Z", "Ctrl+Y", "Ctrl+F", "Ctrl+H",
             "F5", "F11", "Alt+F4", "Ctrl+W", "Ctrl+Q", "Ctrl+,", "Shift+F10", "Ctrl+G", "Del")
# the status bar's left text, drawn by name (vocab.fixed_texts: never held out of the training vocabulary)
STATUS_TEXTS = ("Ready", "Saved", "Connected", "Ln 12, Col 4", "3 items selected", "Syncing...", "100%")


def title_bar(x: Ctx, x0: int, y: int, x1: int) -> int:
    """The window's title bar: its controls at the window look's end, or where icon_places.window_controls puts
    them (with icon places on)."""
    st, c, p = x.st, x.c, x.st.p
    h = max(24, round(st.font_size * 2.3))
    c.rect((x0, y, x1, y + h), fill=p.bar)
    size = st.font_size
    side, names = window_controls(x)
    if st.window_look == "mac":
        d = min(max(10, round(h * 0.45)), (x1 - x0) // 7)
        clickable = [bool(x.claim_icon(n)) for n in names]
        start = x0 + max(8, d)
        if side == "right":
            start = x1 - max(8, d) - len(names) * (d + max(4, d // 2)) + max(4, d // 2)
        end = W.window_dots(c, st, start, y + h // 2, d, clickable, names)
        used = end - x0 if side == "left" else x1 - start
        room = x1 - x0 - 2 * used - 8
        title = x.take("title", size, room)
        if title:
            c.text_in((x0, y, x1, y + h), title, size, p.text)
    else:
        bw = min(round(h * 1.45), (x1 - x0) // 4)
        lo, hi = (x0, x1 - len(names) * bw) if side == "right" else (x0 + len(names) * bw, x1)
        xx = hi if side == "right" else x0
        for name in names:
            W.icon_button(c, st, (xx, y, xx + bw, y + h), name, color=p.text, label=x.claim_icon(name))
            xx += bw
        s = round(h * 0.5)
        c.rect((lo + st.pad, y + (h - s) // 2, lo + st.pad + s, y + (h - s) // 2 + s), fill=p.accent,
               radius=min(3, s // 4))
        tx = lo + 2 * st.pad + s
        title = x.take("title", size, hi - tx - st.pad)
        if title:
            c.text_in((tx, y, hi, y + h), title, size, p.text, align="left")
    c.line([(x0, y + h), (x1 - 1, y + h)], p.border, 1)
    return y + h + 1


def menu_bar(x: Ctx, x0: int, y: int, x1: int, limit: int):
    """Menu titles left to right; sometimes one is open. Returns (y below, a function drawing the open
    menu's panel, to be called after the content so the panel lies on top, or None). Nothing is drawn
    when the bar would reach below ``limit``."""
    st, c, p = x.st, x.c, x.st.p
    size = st.font_size
    h = max(20, round(size * 1.9))
    if y + h + 1 > limit:
        return y, None
    c.rect((x0, y, x1, y + h), fill=p.bar)
    pad = max(6, round(st.pad * 0.7))
    xx, boxes = x0 + 4, []
    for _ in range(x.rng.randint(3, 9)):
        label = x.take("menu", size, 400)
        if label is None:
            break
        w = text_width(label, size, st.face) + 2 * pad
        if xx + w > x1 - 4:
            break
        boxes.append(((xx, y + 1, xx + w, y + h - 1), label))
        xx += w
    opened = x.rng.randrange(len(boxes)) if boxes and x.chance(0.35) else None
    for k, (box, label) in enumerate(boxes):
        W.menu_title(c, st, box, label, k == opened, size)
    bottom = y + h
    c.line([(x0, bottom), (x1 - 1, bottom)], mix(p.bar, p.border, 0.5), 1)

    def draw_panel():
        if opened is None:
            return
        row_h = max(text_height(size, st.face) + 8, round(size * 1.9 * st.density))
        rows = []
        for _ in range(x.rng.randint(3, 9)):
            label = x.take("menu item", size, 320)
            if label is None:
                break
            shortcut = x.rng.choice(SHORTCUTS) if x.chance(0.4) else None
            rows.append((label, shortcut))
            if x.chance(0.2):
                rows.append(("-", None))
        while rows and rows[-1][0] == "-":
            rows.pop()
        room = (c.height - bottom - 12) // row_h
        rows = rows[:max(0, room)]
        while rows and rows[-1][0] == "-":
            rows.pop()
        if not rows:
            return
        width = max(text_width(lab, size, st.face)
                    + (text_width(sc, max(9, size - 1), st.face) + 3 * st.pad if sc else 0)
                    for lab, sc in rows if lab != "-") + 2 * st.pad + 12
        width = max(width, round(size * 10))
        box = boxes[opened][0]
        px = min(box[0], c.width - width - 6)
        if px < 0 or width > c.width - 6:
            return
        hover = x.rng.randrange(len(rows)) if x.chance(0.4) else None
        if hover is not None and rows[hover][0] == "-":
            hover = None
        W.menu_panel(c, st, px, bottom + 1, rows, size, width, row_h, hover)

    return bottom + 1, draw_panel


def toolbar(x: Ctx, x0: int, y: int, x1: int, limit: int, search: bool | None = None) -> int:
    st, c, p = x.st, x.c, x.st.p
    ch = st.control_h
    h = ch + 2 * max(3, st.gap // 2 + 2)
    if y + h + 1 > limit:
        return y
    c.rect((x0, y, x1, y + h), fill=mix(p.bg, p.bar, 0.5))
    top = y + (h - ch) // 2
    right = x1 - st.pad
    if (search if search is not None else x.chance(0.5)) and x1 - x0 > 500 and x.labels.claim("Search"):
        sw = max(140, min(300, round((x1 - x0) * 0.22)))
        W.text_field(c, st, (right - sw, top, right, top + ch), "Search", "Search", True, icon="search")
        right -= sw + st.gap
    xx = x0 + st.pad
    boxed = x.chance(0.4)
    names = list(W.TOOLBAR_ICONS)
    x.rng.shuffle(names)
    for name in names[:x.rng.randint(2, 6)]:
        if xx + ch > right:
            break
        W.icon_button(c, st, (xx, top, xx + ch, top + ch), name, boxed=boxed, label=x.claim_icon(name))
        xx += ch + max(2, st.gap // 2)
    if x.chance(0.7):
        xx += st.gap
        c.line([(xx, top + 3), (xx, top + ch - 4)], p.border, 1)
        xx += st.gap + 1
        B.buttons(x, xx, top, right, top + ch, n=x.rng.randint(1, 3), align="left")
    c.line([(x0, y + h), (x1 - 1, y + h)], mix(p.bg, p.border, 0.7), 1)
    return y + h + 1


def tab_row(x: Ctx, x0: int, y: int, x1: int, limit: int, group: str = "tab") -> int:
    st, c, p = x.st, x.c, x.st.p
    h = st.control_h + max(2, st.gap // 2)
    if y + h + 1 > limit:
        return y
    xx, labels = x0, []
    for _ in range(x.rng.randint(2, 7)):
        label = x.take(group, st.font_size, 400)
        if label is None:
            break
        w = W.tab_width(st, label)
        if xx + w > x1:
            break
        labels.append((xx, w, label))
        xx += w + (2 if st.tab_look == "box" else 0)
    if not labels:
        return y
    sel = x.rng.randrange(len(labels))
    for k, (tx, w, label) in enumerate(labels):
        W.tab(c, st, (tx, y, tx + w, y + h), label, k == sel)
    c.line([(x0, y + h), (x1 - 1, y + h)], p.border, 1)
    return y + h + 1


def status_bar(x: Ctx, x0: int, y1: int, x1: int, limit: int) -> int:
    """A status bar ending at y1; returns its top (y1 itself when it would reach above ``limit``)."""
    st, c, p = x.st, x.c, x.st.p
    size = st.small
    h = round(size * 2.1)
    y = y1 - h
    if y - 1 < limit:
        return y1
    c.rect((x0, y, x1, y1), fill=p.bar)
    c.line([(x0, y), (x1 - 1, y)], mix(p.bar, p.border, 0.6), 1)
    left = x.rng.choice(STATUS_TEXTS)
    if text_width(left, size, st.face) <= (x1 - x0) // 2 - st.pad and x.labels.claim(left):
        c.text_in((x0, y, x1, y1), left, size, p.muted, align="left", pad=st.pad)
    if x.chance(0.5):
        label = x.take("link", size, (x1 - x0) // 3)
        if label:
            w, _ = W.link_size(st, label, size)
            W.link(c, st, x1 - st.pad - w, y + h // 2, label, size, underline=False, color=p.muted)
    return y - 1


def sidebar(x: Ctx, x0: int, y0: int, x1: int, y1: int, group: str = "list item"):
    st, c, p = x.st, x.c, x.st.p
    c.rect((x0, y0, x1, y1), fill=mix(p.bg, p.bar, 0.7))
    c.line([(x1 - 1, y0), (x1 - 1, y1 - 1)], mix(p.bg, p.border, 0.6), 1)
    pad = max(6, st.pad // 2)
    y = y0 + pad
    if x.chance(0.5):
        y = (B.heading(x, x0 + pad + 4, y, x1 - pad, y1, size=st.small) or y) + 4
    rh = max(st.control_h, text_height(st.font_size, st.face) + 10)
    B.list_rows(x, x0 + pad, y, x1 - pad, y1 - pad, n=x.rng.randint(3, 12), chevrons=False, row_h=rh,
                group=group)
