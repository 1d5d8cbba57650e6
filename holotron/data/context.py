"""The context every layout and block draws with: the canvas, the style, the random source and the label
picker of one screen, with the small random helpers they share."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import widgets as W
from .canvas import Canvas, text_width
from .labels import LabelPicker
from .styles import Style


@dataclass
class Ctx:
    """What every layout and block needs: the canvas, the style, the random source, the label picker."""

    c: Canvas
    st: Style
    rng: random.Random
    labels: LabelPicker
    # tables (tables.py, training screens of generate_sample(tables=True) only): whether the training layouts may
    # draw one, the lower-cased entries the made-up texts of a table never contain as whole words (the held-out
    # vocabulary), and the boxes of the tables drawn
    tables: bool = False
    avoid: frozenset[str] = frozenset()
    table_boxes: list = field(default_factory=list)
    # icon places (icon_places.py, training screens of generate_sample(icon_places=True) only): whether the training
    # layouts move the icons (window controls' side and order, vertical icon strips, a dialog's close corner), and
    # what this screen did (settings["icon_places"])
    icon_places: bool = False
    icon_log: dict = field(default_factory=dict)
    # tab places (tab_places.py, training screens of generate_sample(tab_places=True) only): whether the training
    # layouts may draw tabs in a column, and what this screen did (settings["tab_places"])
    tab_places: bool = False
    tab_log: dict = field(default_factory=dict)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def take(self, group: str, size: int, width: int) -> str | None:
        """An unused label of ``group`` whose text is at most ``width`` px wide at ``size``."""
        if width <= 0:
            return None
        return self.labels.take(group, lambda s: text_width(s, size, self.st.face) <= width)

    def claim_icon(self, name: str) -> str:
        """The icon's label when it is still free on this screen, else "" (drawn as decoration)."""
        return W.ICONS[name] if self.labels.claim(W.ICONS[name]) else ""
