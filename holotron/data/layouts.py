"""Whole screens: bars (bars.py) and navigation around columns of content blocks (blocks.py).

Training layouts: "app" (a desktop window), "dialog" (a modal over another screen), "web" (a page with
a navigation bar), "mobile" (a phone app), "form" (a sign-in style card). Held-out layouts, never shown
in training: "panels" (icon rail + list + detail, no title bar) and "wizard" (steps beside a form,
Back / Next in a footer). Opt-in, in neither split's defaults: "mosaic" (random panes; ``holotron.train
--layouts``). Every layout adapts to any screen size; each is a function
``layout(ctx) -> None`` drawing on ``ctx.c``.
"""

from __future__ import annotations

from . import blocks as B
from . import widgets as W
from .bars import menu_bar, sidebar, status_bar, tab_row, title_bar, toolbar
from .blocks import Ctx
from .canvas import text_height, text_width
from .styles import mix

APP_BLOCKS = {"form": 3, "checks": 2, "radios": 1.5, "switches": 1, "dropdowns": 1.5, "buttons": 2.5, "links": 1,
              "heading": 1.5, "paragraph": 1, "cards": 1, "list": 1}
WEB_BLOCKS = {"cards": 3, "links": 1.5, "paragraph": 1.5, "heading": 1.5, "form": 1.5, "buttons": 2, "list": 0.7,
              "checks": 0.7, "dropdowns": 0.5}
MOBILE_BLOCKS = {"list": 3, "switches": 2.5, "form": 2, "buttons": 1.5, "checks": 1, "heading": 1, "paragraph": 1,
                 "cards": 0.5, "links": 0.7, "radios": 1, "dropdowns": 1}
DETAIL_BLOCKS = {"form": 3, "dropdowns": 2, "switches": 1.5, "checks": 1.5, "radios": 1.5, "paragraph": 1,
                 "buttons": 1, "heading": 1, "links": 0.5}


def columns(x: Ctx, x0: int, y0: int, x1: int, y1: int, weights: dict, max_cols: int = 3):
    """Split the area into 1..max_cols columns (each at least ~260 px) and fill each with blocks."""
    st = x.st
    m = max(8, round(st.pad * 1.4))
    x0, y0, x1, y1 = x0 + m, y0 + m, x1 - m, y1 - m
    if x1 - x0 < 60 or y1 - y0 < st.control_h:
        return
    min_w = max(260, st.font_size * 20)
    n = x.rng.randint(1, max(1, min(max_cols, (x1 - x0) // min_w)))
    g = 2 * m
    cw = (x1 - x0 - g * (n - 1)) // n
    for k in range(n):
        cx0 = x0 + k * (cw + g)
        B.fill_column(x, cx0, y0, cx0 + cw, y1, weights)


# ----------------------------------------------------------------------------------------------
# layouts
# ----------------------------------------------------------------------------------------------

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
    if x.chance(0.55):
        y = toolbar(x, X0, y, X1, Y1 - room)
    bottom = status_bar(x, X0, Y1, X1, y + room) if x.chance(0.5) else Y1
    if x.chance(0.4):
        y = tab_row(x, X0 + st.pad, y + 4, X1 - st.pad, bottom - room)
    cx0 = X0
    if X1 - X0 >= 700 and x.chance(0.55):
        sw = max(150, min(300, round((X1 - X0) * x.rng.uniform(0.16, 0.26))))
        sidebar(x, X0, y, X0 + sw, bottom)
        cx0 = X0 + sw
    columns(x, cx0, y, X1, bottom, APP_BLOCKS)
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
    x0, x1 = 0, dw
    y = 0
    # title row (and a close icon)
    th = text_height(st.large)
    ih = max(th + 8, round(st.control_h * 0.9))
    close = x.labels.claim("Close dialog") and x.chance(0.7)
    title = x.take("title", st.large, dw - 2 * pad - (ih + 4 if close else 0))
    if title:
        c.text_in((pad, y + pad, dw - pad, y + pad + ih), title, st.large, p.text, align="left", bold=True)
    if close:
        W.icon_button(c, st, (dw - pad - ih, y + pad, dw - pad, y + pad + ih), "close", color=p.muted,
                      label="Close dialog")
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
        xx = m + text_width(brand, st.large) + 3 * st.pad
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
        B.links(x, m, footer + (fh - text_height(st.small) - 5) // 2, w - m, c.height, n=x.rng.randint(2, 6),
                size=st.small, column=False, underline=False)
    if x.chance(0.7):
        hero = round(st.font_size * x.rng.uniform(1.9, 2.6))
        center = x.chance(0.4)
        y += round(st.gap * 3)
        h = text_height(hero) + 6
        title = x.take("title", hero, w - 2 * m)
        if title and y + h < footer:
            c.text_in((m, y, w - m, y + h), title, hero, p.text, align="center" if center else "left", bold=True)
            y += h + st.gap
        y = B.paragraph(x, m, y, w - m, footer, max_lines=2, align="center" if center else "left") or y
        y += st.gap
        y = B.buttons(x, m, y, w - m, footer, n=x.rng.randint(1, 2), align="center" if center else "left") or y
    columns(x, 0, y, w, footer, WEB_BLOCKS)


def mobile(x: Ctx):
    """A phone app: status bar, app bar, one column of content, maybe a bottom tab bar and a button."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt = c.width, c.height
    sh = round(st.small * 2.0)
    c.rect((0, 0, w, sh), fill=p.bar)
    clock = x.rng.choice(("9:41", "10:24", "12:05", "18:30", "7:02"))
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
        c.text_in((0, y, cw, y + text_height(st.large) + 4), brand, st.large, p.accent, bold=True)
        y += text_height(st.large) + 4 + st.gap
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
        c.rect((dx + 2, dy + 4, dx + cw + 2, dy + ch + 4), fill=mix(p.bg, (0, 0, 0), 0.2 if not p.dark else 0.5), radius=r)
        c.rect((dx, dy, dx + cw, dy + ch), fill=p.surface, outline=p.border, width=1, radius=r)


def panels(x: Ctx):
    """Held-out: an icon rail, a searchable list and a detail pane with a footer of actions."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt = c.width, c.height
    s = st.control_h
    rail = s + 2 * max(6, st.gap)
    c.rect((0, 0, rail, hgt), fill=p.bar)
    names = x.rng.sample(W.TOOLBAR_ICONS, x.rng.randint(3, 7))
    sel = x.rng.randrange(len(names))
    y = max(6, st.gap)
    for k, name in enumerate(names):
        if y + s > hgt - s - 8:
            break
        box = ((rail - s) // 2, y, (rail - s) // 2 + s, y + s)
        if k == sel:
            c.rect(box, fill=p.selected, radius=st.radius(s))
        W.icon_button(c, st, box, name, color=p.accent if k == sel else p.muted, label=x.claim_icon(name))
        y += s + st.gap
    x0 = rail
    if w >= 700:
        lw = max(200, min(380, round(w * x.rng.uniform(0.22, 0.3))))
        c.rect((x0, 0, x0 + lw, hgt), fill=mix(p.bg, p.bar, 0.4))
        c.line([(x0 + lw, 0), (x0 + lw, hgt - 1)], p.border, 1)
        m = max(8, st.pad)
        y = (B.heading(x, x0 + m, m, x0 + lw - m, hgt) or m) + st.gap
        if x.labels.claim("Search"):
            W.text_field(c, st, (x0 + m, y, x0 + lw - m, y + s), "Search", "Search", True, icon="search")
            y += s + st.gap
        B.list_rows(x, x0 + m // 2, y, x0 + lw - m // 2, hgt - m, n=x.rng.randint(4, 12), selected=0)
        x0 += lw + 1
    # detail pane: header, optional tabs, content, footer of actions
    m = max(10, round(st.pad * 1.4))
    hh = st.control_h + 2 * m
    title = x.take("title", st.large, w - x0 - 2 * m - 3 * s)
    if title:
        c.text_in((x0 + m, 0, w, hh), title, st.large, p.text, align="left", bold=True)
    xx = w - m
    for name in x.rng.sample(("more", "star", "refresh", "download"), x.rng.randint(0, 2)):
        if xx - s < x0 + m:
            break
        xx -= s
        W.icon_button(c, st, (xx, m, xx + s, m + s), name, label=x.claim_icon(name))
        xx -= 4
    y = hh
    fh = st.control_h + 2 * m
    footer = hgt - fh
    if footer - hh >= 2 * st.control_h:
        c.rect((x0, footer, w, hgt), fill=mix(p.bg, p.bar, 0.6))
        c.line([(x0, footer), (w - 1, footer)], p.border, 1)
        B.buttons(x, x0 + m, footer + m, w - m, hgt - m + 1, n=x.rng.randint(1, 3), align="right")
    else:
        footer = hgt
    if x.chance(0.5):
        y = tab_row(x, x0 + m, y, w - m, footer - 2 * st.control_h)
    columns(x, x0, y, w, footer, DETAIL_BLOCKS, max_cols=2)


def _wizard_footer(x: Ctx, footer: int, fh: int, m: int):
    """A link on the left, Back / Next (when those labels are still free, else any two buttons) on the right."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt, s = c.width, c.height, st.control_h
    c.rect((0, footer, w, hgt), fill=p.bar)
    c.line([(0, footer), (w - 1, footer)], p.border, 1)
    label = x.take("link", st.font_size, w // 3)
    lx = m
    if label:
        W.link(c, st, m, footer + fh // 2, label, underline=False)
        lx += W.link_size(st, label)[0] + m
    # Back / Next when they are still free, else any two buttons
    xx = w - m
    for names in (("Next", "Continue", "Finish", "Done"), ("Back", "Previous", "Skip")):
        label = next((s_ for s_ in x.rng.sample(names, len(names)) if x.labels.claim(s_)), None)
        if label is None:
            label = x.take("button", st.font_size, 300)
        bw = W.button_width(st, label) if label else 0
        if label and xx - bw >= lx:
            W.button(c, st, (xx - bw, footer + m, xx, footer + m + s), label, primary=names[0] == "Next")
            xx -= bw + st.gap


def wizard(x: Ctx):
    """Held-out: a step-by-step setup: header, numbered steps, a form, Back / Next in a footer."""
    c, st, p = x.c, x.st, x.st.p
    w, hgt = c.width, c.height
    s = st.control_h
    m = max(10, round(st.pad * 1.4))
    hh = s + 2 * m
    c.rect((0, 0, w, hh), fill=p.bar)
    close = x.claim_icon("close")
    W.icon_button(c, st, (w - m - s, m, w - m, m + s), "close", color=p.muted, label=close)
    title = x.take("title", st.large, w - 3 * m - s)
    if title:
        c.text_in((m, 0, w - 2 * m - s, hh), title, st.large, p.text, align="left", bold=True)
    fh = s + 2 * m
    footer = hgt - fh
    if footer - hh < 2 * s:  # no room for a footer
        footer = hgt
    else:
        _wizard_footer(x, footer, fh, m)
    x0 = 0
    n = x.rng.randint(3, 6)
    current = x.rng.randrange(n)
    if w >= 700:
        sw = max(180, min(300, round(w * 0.22)))
        c.rect((0, hh, sw, footer), fill=mix(p.bg, p.bar, 0.5))
        y = hh + m
        rh = max(s, text_height(st.font_size) + 12)
        d = round(text_height(st.font_size) * 1.5)
        for k in range(n):
            if y + rh > footer - m:
                break
            label = x.take("tab", st.font_size, sw - 2 * m - d - st.gap)
            if label is None:
                break
            row = (m // 2, y, sw - m // 2, y + rh)
            if k == current:
                c.rect(row, fill=p.selected, radius=st.radius(rh) // 2)
            cy = y + rh // 2
            color = p.accent if k <= current else p.muted
            c.ellipse((row[0] + 6, cy - d // 2, row[0] + 6 + d, cy - d // 2 + d), fill=color if k < current else None,
                      outline=color, width=2)
            c.text_in((row[0] + 6, cy - d // 2, row[0] + 6 + d, cy - d // 2 + d), str(k + 1), st.small,
                      p.on_accent if k < current else color)
            c.text_in((row[0] + 6 + d + st.gap, y, row[2], y + rh), label, st.font_size,
                      p.text if k == current else p.muted, align="left", owner=label)
            c.element(label, "tab", row)
            y += rh + 2
        x0 = sw
    else:  # a row of step dots
        d = max(8, st.small)
        y = hh + m
        for k in range(n):
            cx = m + k * (d + 10)
            c.ellipse((cx, y, cx + d, y + d), fill=p.accent if k <= current else mix(p.bg, p.muted, 0.5))
        hh = y + d
    columns(x, x0, hh, w, footer, DETAIL_BLOCKS, max_cols=2)


def mosaic(x: Ctx):
    """Opt-in for training (in no split's defaults): the screen cut at random into panes, across or down,
    up to three levels deep, each a list, a column of blocks or a strip of buttons, some under a toolbar
    or a tab row. No fixed place for anything, so a model trained on it cannot answer from where a
    layout usually puts a kind of element; it has to find the element."""
    c, st, p = x.c, x.st, x.st.p
    side = max(4 * st.control_h, 150)
    mixes = (APP_BLOCKS, WEB_BLOCKS, MOBILE_BLOCKS, DETAIL_BLOCKS)

    def pane(x0: int, y0: int, x1: int, y1: int):
        c.rect((x0, y0, x1, y1), fill=x.rng.choice((p.bg, p.surface, mix(p.bg, p.bar, 0.4))))
        y, room = y0, 3 * st.control_h
        head = x.rng.random()
        if head < 0.3:
            y = toolbar(x, x0, y, x1, y1 - room)
        elif head < 0.5:
            y = tab_row(x, x0 + st.pad, y + 4, x1 - st.pad, y1 - room)
        m = max(8, st.pad)
        kind = x.rng.choices(("blocks", "list", "buttons"), (5, 2, 1))[0]
        if kind == "list":
            B.list_rows(x, x0 + m // 2, y + m, x1 - m // 2, y1 - m, n=x.rng.randint(3, 10))
        elif kind == "buttons":
            B.buttons(x, x0 + m, y + m, x1 - m, y1 - m, n=x.rng.randint(1, 4), align=x.rng.choice(("left", "right")))
        else:
            columns(x, x0, y, x1, y1, x.rng.choice(mixes), max_cols=2)

    def split(x0: int, y0: int, x1: int, y1: int, depth: int):
        w, h = x1 - x0, y1 - y0
        across, down = w >= 2 * side, h >= 2 * side
        if depth < 3 and (across or down) and (depth == 0 or x.chance(0.6)):
            if across and (not down or x.chance(w / (w + h))):
                cut = min(max(x0 + round(w * x.rng.uniform(0.25, 0.75)), x0 + side), x1 - side)
                split(x0, y0, cut, y1, depth + 1)
                split(cut + 1, y0, x1, y1, depth + 1)
                c.line([(cut, y0), (cut, y1 - 1)], p.border, 1)
            else:
                cut = min(max(y0 + round(h * x.rng.uniform(0.25, 0.75)), y0 + side), y1 - side)
                split(x0, y0, x1, cut, depth + 1)
                split(x0, cut + 1, x1, y1, depth + 1)
                c.line([(x0, cut), (x1 - 1, cut)], p.border, 1)
            return
        pane(x0, y0, x1, y1)

    split(0, 0, c.width, c.height, 0)


LAYOUTS = {"app": app, "dialog": dialog, "web": web, "mobile": mobile, "form": form_card,
           "panels": panels, "wizard": wizard, "mosaic": mosaic}
