"""Whole screens: bars (bars.py) and navigation around columns of content blocks (blocks.py).

Training layouts: "app" (a desktop window), "dialog" (a modal over another screen), "web" (a page with
a navigation bar), "mobile" (a phone app), "form" (a sign-in style card). Held-out layouts, never shown
in training: "panels" (icon rail + list + detail, no title bar) and "wizard" (steps beside a form,
Back / Next in a footer). Opt-in, in neither split's defaults: "mosaic" (random panes; ``holotron.train
--layouts``). Every layout adapts to any screen size; each is a function
``layout(ctx) -> None`` drawing on ``ctx.c``.

The layouts live in one file per family: layouts_train.py, layouts_heldout.py, layouts_mosaic.py; the
content columns they share are in columns.py.
"""

from __future__ import annotations

from .layouts_heldout import panels, wizard
from .layouts_mosaic import mosaic
from .layouts_train import app, dialog, form_card, mobile, web

LAYOUTS = {"app": app, "dialog": dialog, "web": web, "mobile": mobile, "form": form_card,
           "panels": panels, "wizard": wizard, "mosaic": mosaic}
