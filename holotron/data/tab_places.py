"""Vertical tab lists on training screens (``generate_sample(tab_places=True)``, split "train" only): tabs that
stand one under another, as in a settings window's navigation, not only in a row above the content.

- an app window's sidebar drawn as a column of tabs (``SIDEBAR_TABS`` of the sidebars);
- a web page's settings-style column of tabs beside its content, on the left or the right (``WEB_TABS`` of the
  pages);
- an app window's tab row drawn as a column instead (``ROW_TO_COLUMN`` of the tab rows): as its sidebar where the
  window has one, else beside the content.

A column's looks are drawn at random: the selected tab filled, marked by an accent bar at either edge or only by
its text's colour; rows with or without separators, a bullet or a chevron; left or centred text. There are no
numbered steps. Every tab is drawn by ``_row`` as role "tab" (group "tab" of the labels), so the labels'
uniqueness rules stay as they are. With the option off (``Ctx.tab_places`` False) every helper here
returns without a draw from the random source, so the screens stay byte for byte the same. What a screen did is
recorded in ``Ctx.tab_log`` (``settings["tab_places"]``).
"""

from __future__ import annotations

from .canvas import Canvas, text_height
from .context import Ctx
from .styles import Style, mix
from .widgets import glyph

SIDEBAR_TABS = 0.45    # app sidebars drawn as a column of tabs
WEB_TABS = 0.3         # web pages with a column of tabs beside the content
ROW_TO_COLUMN = 0.35   # app tab rows drawn as a column (the sidebar, or beside the content)
LOOKS = ("fill", "bar", "text")


def sidebar_tabs(x: Ctx) -> bool:
    """Whether an app window's sidebar becomes a column of tabs (no draw with tab places off)."""
    return x.tab_places and x.chance(SIDEBAR_TABS)


def row_to_column(x: Ctx) -> bool:
    """Whether an app window's tab row becomes a column: its sidebar where it has one, else beside the content (no
    draw with tab places off)."""
    return x.tab_places and x.chance(ROW_TO_COLUMN)


def web_tabs(x: Ctx, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int]:
    """Maybe a column of tabs beside a web page's content (x0, y0) .. (x1, y1); returns the content's (x0, x1):
    unchanged, with no draw, with tab places off."""
    if not x.tab_places or not x.chance(WEB_TABS):
        return x0, x1
    return tab_column_beside(x, x0, y0, x1, y1)


def tab_column_beside(x: Ctx, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int]:
    """A column of tabs along the left or right edge of (x0, y0) .. (x1, y1); returns the (x0, x1) left to the
    content beside it (unchanged when no column fits or no tab was drawn)."""
    span = x1 - x0
    w = max(140, min(280, round(span * x.rng.uniform(0.16, 0.26))))
    if span < w + 360:
        return x0, x1
    left = x.chance(0.7)
    cx0 = x0 if left else x1 - w
    if not tab_column(x, cx0, y0, cx0 + w, y1, edge="right" if left else "left"):
        return x0, x1
    return (cx0 + w, x1) if left else (x0, cx0)


def tab_column(x: Ctx, x0: int, y0: int, x1: int, y1: int, edge: str = "right") -> int:
    """Tabs one under another in (x0, y0) .. (x1, y1), a panel with a border line at its ``edge`` side; returns
    how many tabs were drawn (0: nothing drawn at all)."""
    st, c, p = x.st, x.c, x.st.p
    pad = max(6, st.pad // 2)
    th = text_height(st.font_size, st.face)
    rh = max(st.control_h, th + 10) + x.rng.choice((0, 0, 4, 8))
    if y1 - y0 < 3 * rh + 2 * pad or x1 - x0 < 100:
        return 0
    look = x.rng.choice(LOOKS)
    bar_side = x.rng.choice(("left", "right"))
    marker = x.rng.choice((None, None, "dot", "chevron"))
    centre = x.chance(0.15)
    sep = x.chance(0.3)
    step = rh + (1 if sep else x.rng.choice((0, 2, 4)))
    n = x.rng.randint(3, 9)
    sel = x.rng.randrange(n)
    rows = []
    y = y0 + pad
    mw = round(th * 0.9) if marker else 0
    for k in range(n):
        if y + rh > y1 - pad:
            break
        label = x.take("tab", st.font_size, x1 - x0 - 2 * pad - 2 * st.pad - mw - 4)
        if label is None:
            break
        rows.append(((x0 + pad, y, x1 - pad, y + rh), label))
        y += step
    if len(rows) < 2:  # a lone tab is no list (its label, if any, stays claimed and unused)
        return 0
    sel = min(sel, len(rows) - 1)
    c.rect((x0, y0, x1, y1), fill=mix(p.bg, p.bar, x.rng.uniform(0.3, 0.8)))
    ex = x1 - 1 if edge == "right" else x0
    c.line([(ex, y0), (ex, y1 - 1)], mix(p.bg, p.border, 0.6), 1)
    for k, (box, label) in enumerate(rows):
        _row(c, st, box, label, k == sel, look, bar_side, marker, centre)
        if sep and k < len(rows) - 1:
            c.line([(box[0] + st.pad, box[3]), (box[2] - 1, box[3])], mix(p.bg, p.border, 0.5), 1)
    x.tab_log.setdefault("columns", []).append((edge, len(rows), look))
    return len(rows)


def _row(c: Canvas, st: Style, box: tuple[int, int, int, int], label: str, selected: bool, look: str, bar_side: str,
         marker: str | None, centre: bool):
    """One tab of a column: the selected one filled, marked by an accent bar or by its text's colour (``look``),
    an optional bullet or chevron, the label left-aligned or centred; the whole row is the element."""
    p = st.p
    h = box[3] - box[1]
    if selected and look == "fill":
        c.rect(box, fill=p.selected, radius=min(st.radius(h), 8))
    if selected and look == "bar":
        t = max(3, st.font_size // 5)
        bx = box[0] if bar_side == "left" else box[2] - t
        c.rect((bx, box[1] + 2, bx + t, box[3] - 2), fill=p.accent)
    tx0, tx1 = box[0] + st.pad, box[2] - st.pad
    if marker == "dot":
        d = max(4, st.font_size // 3)
        cy = (box[1] + box[3]) // 2
        c.ellipse((tx0, cy - d // 2, tx0 + d, cy - d // 2 + d), fill=p.accent if selected else p.muted)
        tx0 += d + st.pad // 2 + 2
    elif marker == "chevron":
        s = min(h - 4, st.font_size + 2)
        glyph(c, (tx1 - s, (box[1] + box[3] - s) // 2, tx1, (box[1] + box[3] - s) // 2 + s), "chevron", p.muted)
        tx1 -= s + 2
    color = (p.accent if look == "text" else p.text) if selected else p.muted
    c.text_in((tx0, box[1], tx1, box[3]), label, st.font_size, color, align="center" if centre else "left",
              owner=label)
    c.element(label, "tab", box)
