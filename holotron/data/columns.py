"""The content area of a screen: columns of blocks (blocks.py) drawn from a layout's mix of block kinds.
Every layout (layouts.py) fills its content area with ``columns``."""

from __future__ import annotations

from . import blocks as B
from .context import Ctx

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
