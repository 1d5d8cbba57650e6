"""The held-out layouts, never shown in training: "panels" (icon rail + list + detail, no title bar) and
"wizard" (steps beside a form, Back / Next in a footer). Each is a function ``layout(ctx) -> None``
drawing on ``ctx.c`` at any screen size (the registry is layouts.LAYOUTS).
"""

from __future__ import annotations

from . import blocks as B
from . import widgets as W
from .bars import tab_row
from .canvas import text_height
from .columns import DETAIL_BLOCKS, columns
from .context import Ctx
from .styles import mix

# the wizard footer's forward / backward buttons, drawn by name when still free (vocab.fixed_texts: never held
# out of the training vocabulary)
WIZARD_BUTTONS = (("Next", "Continue", "Finish", "Done"), ("Back", "Previous", "Skip"))


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
    for names in WIZARD_BUTTONS:
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
        rh = max(s, text_height(st.font_size, st.face) + 12)
        d = round(text_height(st.font_size, st.face) * 1.5)
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
