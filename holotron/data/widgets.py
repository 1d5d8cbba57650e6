"""Single widgets drawn on a Canvas: buttons, icons, tabs, links, menus, text fields, checkboxes, radio
buttons, switches, dropdowns, list rows. Each draws itself inside the box it is given and registers
itself as an Element; layouts decide where boxes go and check that the text fits first.

Which box is the element: the whole control for buttons, tabs, menus, menu items, fields, dropdowns,
list rows and icons; the text (plus a 2 px margin) for links; only the square / circle / track for
checkboxes, radio buttons and switches, whose label is drawn beside them.
"""

from __future__ import annotations

import math

from .canvas import BoxT, Canvas, text_height, text_width
from .styles import RGB, Style, mix

# icon name -> the label an instruction uses for it
ICONS = {
    "close": "Close", "minimize": "Minimize", "maximize": "Maximize", "menu": "Menu", "search": "Search",
    "back": "Back", "forward": "Forward", "more": "More options", "add": "Add", "refresh": "Refresh",
    "home": "Home", "star": "Favorite", "download": "Download", "settings": "Settings", "bell": "Notifications",
}
TOOLBAR_ICONS = ("back", "forward", "refresh", "home", "star", "download", "settings", "search", "add", "bell", "more")


def _inset(box: BoxT, d: int) -> BoxT:
    return box[0] + d, box[1] + d, box[2] - d, box[3] - d


def fits(text: str, size: int, width: int, face: str | None = None) -> bool:
    return text_width(text, size, face) <= width


# ----------------------------------------------------------------------------------------------
# glyphs
# ----------------------------------------------------------------------------------------------

def glyph(c: Canvas, box: BoxT, name: str, color: RGB):
    """Draw icon ``name`` in the square-ish ``box`` with lines and shapes (no font)."""
    x0, y0, x1, y1 = box
    s = min(x1 - x0, y1 - y0)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    r = s * 0.34                                   # the glyph's half size
    w = max(1, round(s / 11))                      # stroke width
    L, T, R, B = cx - r, cy - r, cx + r, cy + r
    if name == "close":
        c.line([(L, T), (R, B)], color, w)
        c.line([(L, B), (R, T)], color, w)
    elif name == "minimize":
        c.line([(L, cy + r * 0.5), (R, cy + r * 0.5)], color, w)
    elif name == "maximize":
        c.rect((round(L), round(T), round(R) + 1, round(B) + 1), outline=color, width=w)
    elif name == "menu":
        for dy in (-0.7, 0, 0.7):
            c.line([(L, cy + dy * r), (R, cy + dy * r)], color, w)
    elif name == "search":
        k = r * 0.62
        c.ellipse((round(cx - r), round(cy - r), round(cx - r + 2 * k) + 1, round(cy - r + 2 * k) + 1),
                  outline=color, width=w)
        c.line([(cx - r + 1.7 * k, cy - r + 1.7 * k), (R, B)], color, w + 1)
    elif name in ("back", "forward"):
        d = -1 if name == "back" else 1
        c.line([(cx - d * r, cy), (cx + d * r, cy)], color, w)
        c.line([(cx + d * r - d * r * 0.7, cy - r * 0.7), (cx + d * r, cy), (cx + d * r - d * r * 0.7, cy + r * 0.7)],
               color, w)
    elif name == "more":
        d = max(1.5, s / 14)
        for dy in (-0.75, 0, 0.75):
            c.ellipse((round(cx - d), round(cy + dy * r - d), round(cx + d) + 1, round(cy + dy * r + d) + 1),
                      fill=color)
    elif name == "add":
        c.line([(L, cy), (R, cy)], color, w)
        c.line([(cx, T), (cx, B)], color, w)
    elif name == "refresh":
        c.arc((round(L), round(T), round(R) + 1, round(B) + 1), 40, 320, color, w)
        ax, ay = cx + r * math.cos(math.radians(40)), cy + r * math.sin(math.radians(40))
        c.polygon([(ax - r * 0.45, ay), (ax + r * 0.35, ay), (ax + r * 0.05, ay - r * 0.6)], color)
    elif name == "home":
        c.polygon([(L - r * 0.1, cy - r * 0.05), (cx, T), (R + r * 0.1, cy - r * 0.05)], color)
        c.rect((round(L + r * 0.25), round(cy - r * 0.1), round(R - r * 0.25) + 1, round(B) + 1),
               outline=color, width=w)
    elif name == "star":
        pts = []
        for k in range(10):
            a = math.radians(-90 + 36 * k)
            rr = r * (1.1 if k % 2 == 0 else 0.45)
            pts.append((cx + rr * math.cos(a), cy + r * 0.08 + rr * math.sin(a)))
        c.polygon(pts, color)
    elif name == "download":
        c.line([(cx, T), (cx, cy + r * 0.4)], color, w)
        c.line([(cx - r * 0.6, cy - r * 0.15), (cx, cy + r * 0.45), (cx + r * 0.6, cy - r * 0.15)], color, w)
        c.line([(L, B), (R, B)], color, w)
    elif name == "settings":
        for k in range(8):
            a = math.radians(22.5 * 2 * k)
            c.line([(cx + r * 0.55 * math.cos(a), cy + r * 0.55 * math.sin(a)),
                    (cx + r * 1.05 * math.cos(a), cy + r * 1.05 * math.sin(a))], color, w + 1)
        c.ellipse((round(cx - r * 0.7), round(cy - r * 0.7), round(cx + r * 0.7) + 1, round(cy + r * 0.7) + 1),
                  outline=color, width=w)
    elif name == "bell":
        c.polygon([(cx - r * 0.75, cy + r * 0.55), (cx - r * 0.55, cy - r * 0.5), (cx, T),
                   (cx + r * 0.55, cy - r * 0.5), (cx + r * 0.75, cy + r * 0.55)], color)
        c.ellipse((round(cx - r * 0.22), round(cy + r * 0.6), round(cx + r * 0.22) + 1, round(cy + r * 1.0) + 1),
                  fill=color)
    elif name == "chevron":  # ">" for list rows and dropdown arrows turned sideways
        c.line([(cx - r * 0.35, T + r * 0.3), (cx + r * 0.35, cy), (cx - r * 0.35, B - r * 0.3)], color, w)
    elif name == "down":
        c.line([(L + r * 0.3, cy - r * 0.3), (cx, cy + r * 0.35), (R - r * 0.3, cy - r * 0.3)], color, w)
    elif name == "edit":  # a pencil, for a table row's controls (tables.py)
        c.line([(L + r * 0.25, B - r * 0.25), (R - r * 0.15, T + r * 0.15)], color, w + 2)
        c.polygon([(L, B), (L + r * 0.5, B - r * 0.08), (L + r * 0.08, B - r * 0.5)], color)
    elif name == "delete":  # a bin
        c.line([(L, T + r * 0.3), (R, T + r * 0.3)], color, w)
        c.line([(cx - r * 0.3, T), (cx + r * 0.3, T)], color, w)
        c.polygon([(L + r * 0.2, T + r * 0.5), (R - r * 0.2, T + r * 0.5), (R - r * 0.35, B), (L + r * 0.35, B)],
                  color)
    elif name == "view":  # an eye
        c.ellipse((round(L), round(cy - r * 0.6), round(R) + 1, round(cy + r * 0.6) + 1), outline=color, width=w)
        c.ellipse((round(cx - r * 0.3), round(cy - r * 0.3), round(cx + r * 0.3) + 1, round(cy + r * 0.3) + 1),
                  fill=color)
    else:  # pragma: no cover
        raise ValueError(f"unknown icon {name!r}")


# ----------------------------------------------------------------------------------------------
# widgets
# ----------------------------------------------------------------------------------------------

def button(c: Canvas, st: Style, box: BoxT, label: str, primary: bool = False, size: int | None = None):
    size = size or st.font_size
    p, h = st.p, box[3] - box[1]
    radius = st.radius(h)
    if primary:
        c.rect(box, fill=p.accent, radius=radius)
        c.text_in(box, label, size, p.on_accent, owner=label)
    elif st.button_look == "outline":
        c.rect(box, fill=p.bg, outline=p.accent, width=st.border, radius=radius)
        c.text_in(box, label, size, p.accent if not p.dark else p.text, owner=label)
    else:
        c.rect(box, fill=p.control, outline=p.border, width=st.border, radius=radius)
        c.text_in(box, label, size, p.text, owner=label)
    c.element(label, "button", box)


def button_width(st: Style, label: str, size: int | None = None) -> int:
    size = size or st.font_size
    return max(text_width(label, size, st.face) + 2 * st.pad, round(st.control_h * 1.8))


def icon_button(c: Canvas, st: Style, box: BoxT, name: str, color: RGB | None = None, boxed: bool = False,
                label: str | None = None):
    """An icon as an element (role "icon", label ICONS[name] unless given) when the caller has claimed
    its label; pass label="" for a decorative icon."""
    p = st.p
    if boxed:
        c.rect(box, fill=p.control, outline=p.border, width=st.border, radius=st.radius(box[3] - box[1]))
    glyph(c, _inset(box, max(1, (box[3] - box[1]) // 6)), name, color or p.text)
    label = ICONS[name] if label is None else label
    if label:
        c.element(label, "icon", box)


def window_dots(c: Canvas, st: Style, x: int, cy: int, d: int, clickable: list[bool],
                names: tuple[str, ...] = ("close", "minimize", "maximize")) -> int:
    """macOS-style close / minimize / zoom circles from x (in the order of ``names``); returns the x after them."""
    colors = {"close": (236, 95, 87), "minimize": (245, 190, 80), "maximize": (98, 197, 84)}
    for k, name in enumerate(names):
        color = colors[name]
        box = (x, cy - d // 2, x + d, cy - d // 2 + d)
        c.ellipse(box, fill=color, outline=mix(color, (0, 0, 0), 0.2))
        if clickable[k]:
            c.element(ICONS[name], "icon", box)
        x += d + max(4, d // 2)
    return x


def tab(c: Canvas, st: Style, box: BoxT, label: str, selected: bool, size: int | None = None, look: str | None = None):
    size = size or st.font_size
    p = st.p
    look = look or st.tab_look
    if look == "box":
        if selected:
            c.rect(box, fill=p.surface, outline=p.border, width=st.border, radius=min(st.radius(box[3] - box[1]), 6))
        c.text_in(box, label, size, p.text if selected else p.muted, owner=label)
    else:
        c.text_in(box, label, size, p.accent if selected else p.muted, owner=label)
        if selected:
            t = max(2, size // 6)
            c.rect((box[0], box[3] - t, box[2], box[3]), fill=p.accent)
    c.element(label, "tab", box)


def tab_width(st: Style, label: str, size: int | None = None) -> int:
    return text_width(label, size or st.font_size, st.face) + 2 * st.pad


def link(c: Canvas, st: Style, x: int, cy: int, label: str, size: int | None = None, underline: bool = True,
         color: RGB | None = None) -> BoxT:
    """A text link with its left edge at x and its middle at cy; returns the element box."""
    size = size or st.font_size
    th = text_height(size, st.face)
    box = (x, cy - th // 2 - 2, x + text_width(label, size, st.face) + 4, cy - th // 2 + th + 3)
    tb = c.text_in(box, label, size, color or st.p.link, owner=label)
    if underline:
        c.line([(tb[0], box[3] - 2), (tb[2] - 1, box[3] - 2)], color or st.p.link, 1)
    c.element(label, "link", box)
    return box


def link_size(st: Style, label: str, size: int | None = None) -> tuple[int, int]:
    size = size or st.font_size
    return text_width(label, size, st.face) + 4, text_height(size, st.face) + 5


def menu_title(c: Canvas, st: Style, box: BoxT, label: str, open_: bool, size: int):
    p = st.p
    if open_:
        c.rect(box, fill=p.selected, radius=min(4, st.radius(box[3] - box[1])))
    c.text_in(box, label, size, p.text, owner=label)
    c.element(label, "menu", box)


def menu_panel(c: Canvas, st: Style, x: int, y: int, rows: list[tuple[str, str | None]], size: int,
               width: int, row_h: int, hover: int | None = None) -> BoxT:
    """An open drop-down menu at (x, y): rows of (label, shortcut) where label "-" is a separator.
    Everything under it stops being visible; its items are elements (role "menu item")."""
    p = st.p
    sep_h = max(5, row_h // 3)
    h = sum(sep_h if lab == "-" else row_h for lab, _ in rows) + 8
    box = (x, y, x + width, y + h)
    c.cover(box)
    shadow = mix(p.bg, (0, 0, 0), 0.35)
    c.rect((box[0] + 3, box[1] + 3, box[2] + 3, box[3] + 3), fill=shadow, radius=min(6, st.radius(row_h)))
    c.rect(box, fill=p.surface, outline=p.border, width=1, radius=min(6, st.radius(row_h)))
    yy = y + 4
    for k, (label, shortcut) in enumerate(rows):
        if label == "-":
            c.line([(x + 6, yy + sep_h // 2), (x + width - 7, yy + sep_h // 2)], p.border, 1)
            yy += sep_h
            continue
        row = (x + 4, yy, x + width - 4, yy + row_h)
        if k == hover:
            c.rect(row, fill=p.selected)
        c.text_in(row, label, size, p.text, align="left", pad=st.pad, owner=label)
        if shortcut:
            c.text_in(row, shortcut, max(9, size - 1), p.muted, align="right", pad=st.pad, owner=label)
        c.element(label, "menu item", row)
        yy += row_h
    return box


def text_field(c: Canvas, st: Style, box: BoxT, name: str, content: str | None, placeholder: bool,
               size: int | None = None, icon: str | None = None):
    """A single-line input called ``name`` (its label is drawn by the caller, beside or above it),
    showing ``content`` as a value or, muted, as a placeholder."""
    size = size or st.font_size
    p = st.p
    h = box[3] - box[1]
    if st.field_look == "underline":
        c.rect((box[0], box[3] - max(1, st.border), box[2], box[3]), fill=p.border)
    else:
        c.rect(box, fill=p.field, outline=p.border, width=st.border, radius=min(st.radius(h), h // 2))
    x = box[0] + (st.pad if st.field_look == "box" else 2)
    if icon:
        s = min(h - 4, text_height(size, st.face) + 6)
        glyph(c, (x - 2, (box[1] + box[3] - s) // 2, x - 2 + s, (box[1] + box[3] - s) // 2 + s), icon, p.muted)
        x += s + 2
    if content and x + text_width(content, size, st.face) <= box[2] - st.pad:  # a text that fits, else none
        c.text_in((x, box[1], box[2] - st.pad, box[3]), content, size, p.muted if placeholder else p.text,
                  align="left", owner=name)
    c.element(name, "text field", box)


def checkbox(c: Canvas, st: Style, box: BoxT, label: str, checked: bool, size: int | None = None,
             gap: int | None = None, caption: bool = True):
    """The square at ``box`` with ``label`` to its right (``caption`` False: the square alone, its label only
    spoken, as a table row's)."""
    size = size or st.font_size
    p = st.p
    s = box[2] - box[0]
    r = 0 if st.corner == "square" else max(2, s // 5)
    if checked:
        c.rect(box, fill=p.accent, radius=r)
        w = max(2, s // 7)
        c.line([(box[0] + s * 0.22, box[1] + s * 0.52), (box[0] + s * 0.42, box[1] + s * 0.72),
                (box[0] + s * 0.78, box[1] + s * 0.3)], p.on_accent, w)
    else:
        c.rect(box, fill=p.field, outline=p.muted, width=max(1, st.border), radius=r)
    if caption:
        g = gap if gap is not None else max(6, s // 2)
        tw = text_width(label, size, st.face)
        c.text_in((box[2] + g, box[1] - 8, box[2] + g + tw + 2, box[3] + 8), label, size, p.text, align="left",
                  owner=label)
    c.element(label, "checkbox", box)


def radio(c: Canvas, st: Style, box: BoxT, label: str, selected: bool, size: int | None = None):
    size = size or st.font_size
    p = st.p
    s = box[2] - box[0]
    c.ellipse(box, fill=p.field, outline=p.accent if selected else p.muted, width=max(1, s // 9))
    if selected:
        k = max(2, round(s * 0.27))
        c.ellipse((box[0] + k, box[1] + k, box[2] - k, box[3] - k), fill=p.accent)
    g = max(6, s // 2)
    tw = text_width(label, size, st.face)
    c.text_in((box[2] + g, box[1] - 8, box[2] + g + tw + 2, box[3] + 8), label, size, p.text, align="left", owner=label)
    c.element(label, "radio", box)


def switch(c: Canvas, st: Style, box: BoxT, label: str, on: bool):
    """The track at ``box`` (its label is drawn by the caller)."""
    p = st.p
    h = box[3] - box[1]
    c.rect(box, fill=p.accent if on else mix(p.bg, p.muted, 0.55), radius=h // 2)
    k = max(2, h // 8)
    d = h - 2 * k
    kx = box[2] - k - d if on else box[0] + k
    c.ellipse((kx, box[1] + k, kx + d, box[1] + k + d), fill=(255, 255, 255))
    c.element(label, "switch", box)


def dropdown(c: Canvas, st: Style, box: BoxT, name: str, value: str, size: int | None = None):
    size = size or st.font_size
    p = st.p
    h = box[3] - box[1]
    c.rect(box, fill=p.control, outline=p.border, width=st.border, radius=min(st.radius(h), h // 2))
    c.text_in((box[0], box[1], box[2] - h, box[3]), value, size, p.text, align="left", pad=st.pad, owner=name)
    s = min(h, text_height(size, st.face) + 6)
    gx = box[2] - st.pad // 2 - s
    glyph(c, (gx, (box[1] + box[3] - s) // 2, gx + s, (box[1] + box[3] - s) // 2 + s), "down", p.muted)
    c.element(name, "dropdown", box)


def dropdown_min_width(st: Style, value: str, size: int | None = None) -> int:
    size = size or st.font_size
    return text_width(value, size, st.face) + st.pad + st.control_h + 4


def list_row(c: Canvas, st: Style, box: BoxT, label: str, selected: bool = False, chevron: bool = False,
             icon: str | None = None, size: int | None = None, sub: str | None = None):
    """A clickable row of a list (role "list item"), optionally with an icon, a chevron and a subtitle."""
    size = size or st.font_size
    p = st.p
    h = box[3] - box[1]
    if selected:
        c.rect(box, fill=p.selected, radius=min(st.radius(h), 8))
    x = box[0] + st.pad
    if icon:
        s = min(h - 4, round(size * 1.5))
        glyph(c, (x, (box[1] + box[3] - s) // 2, x + s, (box[1] + box[3] - s) // 2 + s), icon, p.muted)
        x += s + st.pad // 2 + 2
    right = box[2] - st.pad
    if chevron:
        s = min(h - 4, size + 4)
        glyph(c, (right - s, (box[1] + box[3] - s) // 2, right, (box[1] + box[3] - s) // 2 + s), "chevron", p.muted)
        right -= s + 2
    if sub:
        th = text_height(size, st.face)
        mid = (box[1] + box[3]) // 2
        c.text_in((x, mid - th, right, mid), label, size, p.text, align="left", owner=label)
        c.text_in((x, mid + 1, right, mid + th + 1), sub, max(9, size - 2), p.muted, align="left", owner=label)
    else:
        c.text_in((x, box[1], right, box[3]), label, size, p.text, align="left", owner=label)
    c.element(label, "list item", box)


def list_row_width(st: Style, label: str, icon: bool, chevron: bool, size: int | None = None) -> int:
    size = size or st.font_size
    w = text_width(label, size, st.face) + 2 * st.pad + 2
    if icon:
        w += round(size * 1.5) + st.pad // 2 + 2
    if chevron:
        w += size + 6
    return w
