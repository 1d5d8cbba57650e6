"""The training layouts: "app" (a desktop window), "dialog" (a modal over another screen), "web" (a page
with a navigation bar), "mobile" (a phone app), "form" (a sign-in style card). Each is a function
``layout(ctx) -> None`` drawing on ``ctx.c`` at any screen size (the registry is layouts.LAYOUTS).
"""

from __future__ import annotations

from . import blocks as B
from . import widgets as W
from .bars import menu_bar, sidebar, status_bar, tab_row, title_bar, toolbar
from .canvas import text_height, text_width
from .columns import APP_BLOCKS, MOBILE_BLOCKS, WEB_BLOCKS, columns
from .context import Ctx
from .icon_places import dialog_close_left, icon_strip, strip_instead, web_strip
from .styles import mix
from .tab_places import row_to_column, sidebar_tabs, tab_column, tab_column_beside, web_tabs
from .tables import table_section

# texts drawn by name (vocab.fixed_texts: never held out of the training vocabulary)
CLOCKS = ("9:41", "10:24", "12:05", "18:30", "7:02")   # the phone status bar's time
CLOSE_DIALOG = "Close dialog"                         # a dialog's close icon


def app(x: Ctx):
    """A desktop application window, full screen or floating over a desktop with a taskbar."""
    c, st, p = x.c, x.st, x.st.p
    X0, Y0, X1, Y1 = 0, 0, c.width, c.height
    if c.width >= 800 and c.height >= 560 and x.chance(0.35):
        c.rect((0, 0, c.width, c.height), fill=p.desktop)
        tb = max(28, round(st.font_size * 2.6))
        c.rect((0, c.height - tb, c.width, c.height), fill=mix(p.desktop, (0, 0, 0), 0.55))
        for k in range(x.rng.randint(3, 8)):
            s = tb - 10
            c.rect((10 + k * (s + 8), c.height - tb + 5, 10 + k * (s + 8) + s, c.height - 5),
                   fill=mix(p.desktop, (255, 255, 255), 0.25 + 0.08 * (k % 3)), radius=4)
        X0, Y0 = round(c.width * x.rng.uniform(0.02, 0.12)), round(c.height * x.rng.uniform(0.02, 0.10))
        X1 = c.width - round(c.width * x.rng.uniform(0.02, 0.12))
        Y1 = c.height - tb - round(c.height * x.rng.uniform(0.02, 0.08))
        c.rect((X0 + 4, Y0 + 6, X1 + 4, Y1 + 6), fill=mix(p.desktop, (0, 0, 0), 0.35), radius=6)
        c.rect((X0, Y0, X1, Y1), fill=p.bg, outline=p.border, radius=6 if st.corner != "square" else 0)
    y = title_bar(x, X0, Y0, X1)
    draw_menu = None
    room = 3 * st.control_h  # what the bars leave for content at least
    if x.chance(0.6) and X1 - X0 >= 360:
        y, draw_menu = menu_bar(x, X0, y, X1, Y1 - room)
    strip = False  # with icon places on (icon_places.py), now and then the toolbar's icons in a vertical strip
    if x.chance(0.55):
        strip = strip_instead(x)
        if not strip:
            y = toolbar(x, X0, y, X1, Y1 - room)
    bottom = status_bar(x, X0, Y1, X1, y + room) if x.chance(0.5) else Y1
    column = False  # with tab places on (tab_places.py), now and then the tabs in a column instead of a row
    if x.chance(0.4):
        column = row_to_column(x)
        if not column:
            y = tab_row(x, X0 + st.pad, y + 4, X1 - st.pad, bottom - room)
    cx0, cx1 = X0, X1
    if X1 - X0 >= 700 and x.chance(0.55):
        sw = max(150, min(300, round((X1 - X0) * x.rng.uniform(0.16, 0.26))))
        if not ((column or sidebar_tabs(x)) and tab_column(x, X0, y, X0 + sw, bottom)):
            sidebar(x, X0, y, X0 + sw, bottom)
        cx0 = X0 + sw
    elif column:
        cx0, cx1 = tab_column_beside(x, cx0, y, cx1, bottom)
    if strip:
        cx0, cx1 = icon_strip(x, cx0, y, cx1, bottom)
    y = table_section(x, cx0, y, cx1, bottom)  # with tables on (tables.py), now and then
    columns(x, cx0, y, cx1, bottom, APP_BLOCKS)
    if draw_menu:
        draw_menu()


def dialog(x: Ctx):
    """A modal dialog over a dimmed app, web or phone screen; only the dialog is clickable."""
    c, st, p = x.c, x.st, x.st.p
    base = mobile if c.width < 600 else x.rng.choice((app, app, web))
    base(x)
    mark = c.mark()
    margin = max(12, round(c.width * 0.04))
    dw = min(c.width - 2 * margin, round(st.font_size * x.rng.uniform(26, 40)))
    pad = max(12, round(st.pad * 1.5))
    y = 0
    # title row (and a close icon)
    th = text_height(st.large, st.face)
    ih = max(th + 8, round(st.control_h * 0.9))
    close = x.labels.claim(CLOSE_DIALOG) and x.chance(0.7)
    left = close and dialog_close_left(x)  # with icon places on (icon_places.py): either top corner
    title = x.take("title", st.large, dw - 2 * pad - (ih + 4 if close else 0))
    if title:
        c.text_in((pad + (ih + 4 if left else 0), y + pad, dw - pad, y + pad + ih), title, st.large, p.text,
                  align="left", bold=True)
    if close:
        cx = pad if left else dw - pad - ih
        W.icon_button(c, st, (cx, y + pad, cx + ih, y + pad + ih), "close", color=p.muted, label=CLOSE_DIALOG)
    y += pad + ih + st.gap
    limit = c.height - 2 * margin
    y = B.paragraph(x, pad, y, dw - pad, limit, max_lines=4) or y
    y += st.gap
    extra = x.rng.choice(("none", "form", "checks", "radios", "dropdowns"))
    if extra != "none":
        ny = B.BLOCKS[extra](x, pad, y, dw - pad, limit - st.control_h - 2 * pad)
        y = (ny if ny is not None else y) + st.gap
    y += st.gap
    narrow = dw < 320
    by = B.buttons(x, pad, y, dw - pad, limit, n=x.rng.randint(1, 3), align="right" if not narrow else "left",
                   stacked=narrow)
    y = (by if by is not None else y) + pad
    dh = y
    dx = (c.width - dw) // 2
    dy = max(margin // 2, (c.height - dh) // 2 + x.rng.randint(-margin, margin))
    dy = min(dy, c.height - dh - 2) if dh < c.height else 0
    c.shift(mark, dx, dy)
    box = (dx, dy, dx + dw, dy + dh)
    with c.beneath(mark):
        c.dim((0, 0, 0), x.rng.uniform(0.3, 0.55), upto=mark)
        c.cover(box, upto=mark)
        r = min(14, st.radius(st.control_h) * 2)
        c.rect((box[0] + 3, box[1] + 5, box[2] + 3, box[3] + 5), fill=mix(p.bg, (0, 0, 0), 0.6), radius=r)
        c.rect(box, fill=p.surface, outline=p.border, width=1, radius=r)


def web(x: Ctx):
    """A web page: navigation bar, a hero heading, content columns and a footer."""
    c, st, p = x.c, x.st, x.st.p
    w = c.width
    m = max(12, round(w * x.rng.uniform(0.02, 0.07)))
    nh = st.control_h + 2 * max(6, st.gap)
    c.rect((0, 0, w, nh), fill=p.bar if x.chance(0.6) else p.bg)
    c.line([(0, nh), (w - 1, nh)], mix(p.bg, p.border, 0.6), 1)
    brand = x.take("brand", st.large, w // 3)
    xx = m
    if brand:
        c.text_in((m, 0, w, nh), brand, st.large, p.accent if x.chance(0.5) else p.text, align="left", bold=True)
        xx = m + text_width(brand, st.large, st.face) + 3 * st.pad
    top = (nh - st.control_h) // 2
    right = w - m
    if w < 700:
        for name in ("menu", "search")[:x.rng.randint(1, 2)]:
            if right - st.control_h < xx:
                break
            right -= st.control_h
            W.icon_button(c, st, (right, top, right + st.control_h, top + st.control_h), name, label=x.claim_icon(name))
            right -= st.gap
    else:
        label = x.take("button", st.font_size, 200)
        if label:
            bw = W.button_width(st, label)
            right -= bw
            W.button(c, st, (right, top, right + bw, top + st.control_h), label, primary=True)
            right -= 2 * st.pad
        for _ in range(x.rng.randint(2, 6)):
            label = x.take("link", st.font_size, 240)
            if label is None:
                break
            lw, _ = W.link_size(st, label)
            if xx + lw > right:
                break
            W.link(c, st, xx, nh // 2, label, underline=False, color=p.text)
            xx += lw + 2 * st.pad
    y = nh + 1
    footer = c.height
    if x.chance(0.6) and c.height > 500:
        fh = round(st.small * 3.2)
        footer = c.height - fh
        c.rect((0, footer, w, c.height), fill=p.bar)
        B.links(x, m, footer + (fh - text_height(st.small, st.face) - 5) // 2, w - m, c.height, n=x.rng.randint(2, 6),
                size=st.small, column=False, underline=False)
    if x.chance(0.7):
        hero = round(st.font_size * x.rng.uniform(1.9, 2.6))
        center = x.chance(0.4)
        y += round(st.gap * 3)
        h = text_height(hero, st.face) + 6
        title = x.take("title", hero, w - 2 * m)
        if title and y + h < footer:
            c.text_in((m, y, w - m, y + h), title, hero, p.text, align="center" if center else "left", bold=True)
            y += h + st.gap
        y = B.paragraph(x, m, y, w - m, footer, max_lines=2, align="center" if center else "left") or y
        y += st.gap
        y = B.buttons(x, m, y, w - m, footer, n=x.rng.randint(1, 2), align="center" if center else "left") or y
    x0, x1 = web_strip(x, 0, y, w, footer)  # with icon places on (icon_places.py), now and then an icon strip
    x0, x1 = web_tabs(x, x0, y, x1, footer)  # with tab places on (tab_places.py), now and then a column of tabs
    y = table_section(x, x0, y, x1, footer)
    columns(x, x0, y, x1, footer, WEB_BLOCKS)


def mobile(x: Ctx):
    """A phone app: status bar, app bar, one column of content, maybe a bottom tab bar and a button."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt = c.width, c.height
    sh = round(st.small * 2.0)
    c.rect((0, 0, w, sh), fill=p.bar)
    clock = x.rng.choice(CLOCKS)
    x.labels.claim(clock)
    c.text_in((12, 0, w, sh), clock, st.small, p.text, align="left", pad=4, bold=True)
    bw, bh = round(st.small * 1.8), round(st.small * 0.9)
    bx, by = w - 16 - bw, (sh - bh) // 2
    c.rect((bx, by, bx + bw, by + bh), outline=p.text, width=1, radius=2)
    c.rect((bx + 2, by + 2, bx + 2 + round((bw - 4) * x.rng.uniform(0.2, 1)), by + bh - 2), fill=p.text)
    for k in range(4):
        hh = round(bh * (0.4 + 0.2 * k))
        c.rect((bx - 30 + k * 5, by + bh - hh, bx - 27 + k * 5, by + bh), fill=p.text)
    # app bar
    ah = round(st.control_h * 1.35)
    y = sh
    c.rect((0, y, w, y + ah), fill=p.bar if x.chance(0.5) else p.bg)
    s = st.control_h
    top = y + (ah - s) // 2
    lead = x.rng.choice(("back", "menu", None))
    xx = 8
    if lead:
        W.icon_button(c, st, (xx, top, xx + s, top + s), lead, label=x.claim_icon(lead))
        xx += s + st.gap
    right = w - 8
    for name in x.rng.sample(("search", "more", "add", "settings", "star", "bell"), x.rng.randint(0, 2)):
        if right - s < xx:
            break
        right -= s
        W.icon_button(c, st, (right, top, right + s, top + s), name, label=x.claim_icon(name))
        right -= 2
    title = x.take("title", st.large, right - xx - st.gap)
    if title:
        c.text_in((xx, y, right, y + ah), title, st.large, p.text, align="left", bold=True)
    y += ah
    c.line([(0, y), (w - 1, y)], mix(p.bg, p.border, 0.6), 1)
    y += 1
    bottom = hgt
    th_ = round(st.font_size * 3.6)
    if x.chance(0.65) and hgt - y >= th_ + 3 * st.control_h:
        bottom = hgt - th_
        c.rect((0, bottom, w, hgt), fill=p.bar)
        c.line([(0, bottom), (w - 1, bottom)], mix(p.bg, p.border, 0.6), 1)
        n = x.rng.randint(3, 5)
        cw = w // n
        sel = x.rng.randrange(n)
        icons = x.rng.sample(W.TOOLBAR_ICONS, n)
        for k in range(n):
            cell = (k * cw, bottom + 1, (k + 1) * cw, hgt)
            label = x.take("tab", st.small, cw - 6)
            if label is None:
                continue
            color = p.accent if k == sel else p.muted
            gs = round(st.font_size * 1.5)
            gx, gy = cell[0] + (cw - gs) // 2, cell[1] + round(th_ * 0.12)
            W.glyph(c, (gx, gy, gx + gs, gy + gs), icons[k], color)
            c.text_in((cell[0], gy + gs, cell[2], cell[3] - 2), label, st.small, color, owner=label)
            c.element(label, "tab", cell)
        bottom -= 1
    m = max(10, round(w * 0.04))
    y += m
    if x.chance(0.3):
        y = (B.heading(x, m, y, w - m, bottom) or y) + st.gap
    y = table_section(x, m, y, w - m, bottom - m, margin=0)
    B.fill_column(x, m, y, w - m, bottom - m, MOBILE_BLOCKS)
    d = round(st.control_h * 1.5)
    if x.chance(0.25) and bottom - m - d >= y and x.labels.claim("Add"):
        box = (w - m - d, bottom - m - d, w - m, bottom - m)
        c.cover(box)
        c.ellipse((box[0] + 2, box[1] + 3, box[2] + 2, box[3] + 3), fill=mix(p.bg, (0, 0, 0), 0.35))
        c.ellipse(box, fill=p.accent)
        W.glyph(c, (box[0] + d // 5, box[1] + d // 5, box[2] - d // 5, box[3] - d // 5), "add", p.on_accent)
        c.element("Add", "icon", box)


def form_card(x: Ctx):
    """A sign-in style page: a card with a title, fields, a checkbox, a wide button and links."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt = c.width, c.height
    c.rect((0, 0, w, hgt), fill=mix(p.bg, p.accent, x.rng.uniform(0.0, 0.12)))
    margin = max(12, round(w * 0.04))
    top_bar = w >= 700 and x.chance(0.6)
    if top_bar:  # the site around the card: a brand and a few links
        nh = st.control_h + 2 * max(6, st.gap)
        c.rect((0, 0, w, nh), fill=p.bar)
        brand = x.take("brand", st.large, w // 3)
        if brand:
            c.text_in((margin, 0, w, nh), brand, st.large, p.text, align="left", bold=True)
        lx = w - margin
        for _ in range(x.rng.randint(1, 3)):
            label = x.take("link", st.font_size, 220)
            if label is None:
                break
            lw, _ = W.link_size(st, label)
            if lx - lw < w // 2:
                break
            lx -= lw
            W.link(c, st, lx, nh // 2, label, underline=False, color=p.text)
            lx -= 2 * st.pad
    if w >= 700 and hgt >= 600 and x.chance(0.5):
        fh = round(st.small * 3)
        B.links(x, margin, hgt - fh, w - margin, hgt - 4, n=x.rng.randint(2, 5), size=st.small, column=False,
                underline=False)
        hgt -= fh
    cw = min(w - 2 * margin, round(st.font_size * x.rng.uniform(24, 34)))
    pad = max(14, round(st.pad * 1.8))
    mark = c.mark()
    y = pad
    limit = hgt - 2 * margin
    brand = x.take("brand", st.large, cw - 2 * pad) if not top_bar and x.chance(0.5) else None
    if brand:
        c.text_in((0, y, cw, y + text_height(st.large, st.face) + 4), brand, st.large, p.accent, bold=True)
        y += text_height(st.large, st.face) + 4 + st.gap
    y = (B.heading(x, pad, y, cw - pad, limit, group="title") or y) + st.gap
    if x.chance(0.5):
        y = (B.paragraph(x, pad, y, cw - pad, limit, max_lines=3) or y) + st.gap
    y = (B.form(x, pad, y, cw - pad, limit, n=x.rng.randint(1, 4), labels_above=True, full_width=True) or y) + st.gap
    if x.chance(0.7):
        y = (B.checks(x, pad, y, cw - pad, limit, n=x.rng.randint(1, 2)) or y) + st.gap
    y = (B.buttons(x, pad, y, cw - pad, limit, n=x.rng.randint(1, 2), stacked=True) or y) + st.gap
    if x.chance(0.8):
        y = (B.links(x, pad, y, cw - pad, limit, n=x.rng.randint(1, 3), column=True) or y)
    ch = y + pad
    dx = (w - cw) // 2
    top = (st.control_h + 2 * max(6, st.gap) + 4) if top_bar else 0
    dy = max(top + margin // 2, top + (hgt - top - ch) // 2)
    if dy + ch > hgt:
        dy = top if top + ch <= hgt else 0
    c.shift(mark, dx, dy)
    with c.beneath(mark):
        c.cover((dx, dy, dx + cw, dy + ch), upto=mark)
        r = min(16, st.radius(st.control_h) * 2)
        c.rect((dx + 2, dy + 4, dx + cw + 2, dy + ch + 4), fill=mix(p.bg, (0, 0, 0), 0.2 if not p.dark else 0.5),
               radius=r)
        c.rect((dx, dy, dx + cw, dy + ch), fill=p.surface, outline=p.border, width=1, radius=r)
