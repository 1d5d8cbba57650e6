"""The opt-in "mosaic" layout (in neither split's defaults; ``holotron.train --layouts``): the screen cut
at random into panes, each filled like a part of another layout."""

from __future__ import annotations

from . import blocks as B
from .bars import tab_row, toolbar
from .columns import APP_BLOCKS, DETAIL_BLOCKS, MOBILE_BLOCKS, WEB_BLOCKS, columns
from .context import Ctx
from .styles import mix


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
