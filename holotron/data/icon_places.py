"""Where the icons sit on training screens (``generate_sample(icon_places=True)``, split "train" only): the
training layouts move the icons so that only the glyph tells them apart, not their place on the screen.

- window controls (bars.py ``title_bar``): at the right end of the title bar on about half of the screens and at
  the left end on the rest, whatever the window look; in the Windows look now and then the close button alone,
  and the order of the controls shuffled on half of the screens (the macOS circles too);
- a vertical icon strip: on some app screens the toolbar's icon buttons stand in a strip along the left or right
  edge of the content area instead of a row (``STRIP_SHARE`` of the app screens that draw a toolbar), and on some
  web pages such a strip runs beside the content (``WEB_STRIP_SHARE``); the icons are shuffled as a toolbar's are;
- a dialog's close icon (layouts_train.py ``dialog``) in its top left corner on half of the dialogs.

Every icon is drawn with ``widgets.icon_button`` / ``widgets.window_dots`` and labelled through ``Ctx.claim_icon``,
so labels, elements and the uniqueness rules stay as they are. With the option off (``Ctx.icon_places`` False)
every helper here returns the old place without a draw from the random source, so the screens stay byte for byte
the same. What a screen did is recorded in ``Ctx.icon_log`` (``settings["icon_places"]``).
"""

from __future__ import annotations

from . import widgets as W
from .context import Ctx
from .styles import mix

WINDOW_RIGHT = 0.5     # window controls at the right end of the title bar (else the left end)
WINDOW_SHUFFLE = 0.5   # the controls' order shuffled
CLOSE_ONLY = 0.2       # Windows look: the close button alone
STRIP_SHARE = 0.4      # app screens with a toolbar: its icons in a vertical strip instead
WEB_STRIP_SHARE = 0.3  # web pages: a vertical icon strip beside the content
DIALOG_CLOSE_LEFT = 0.5  # a dialog's close icon in its top left corner (else the top right)


def window_controls(x: Ctx) -> tuple[str, tuple[str, ...]]:
    """(side, names left to right) of the title bar's window controls: the window look's own place and order
    ("left", close / minimize / maximize for the macOS look; "right", minimize / maximize / close for Windows),
    or with icon places on a side and order drawn here."""
    mac = x.st.window_look == "mac"
    names = ("close", "minimize", "maximize") if mac else ("minimize", "maximize", "close")
    if not x.icon_places:
        return ("left" if mac else "right"), names
    side = "right" if x.chance(WINDOW_RIGHT) else "left"
    if not mac and x.chance(CLOSE_ONLY):
        names = ("close",)
    elif x.chance(WINDOW_SHUFFLE):
        names = tuple(x.rng.sample(names, len(names)))
    x.icon_log["window"] = side
    return side, names


def strip_instead(x: Ctx) -> bool:
    """Whether an app screen's toolbar becomes a vertical icon strip (no draw with icon places off)."""
    return x.icon_places and x.chance(STRIP_SHARE)


def web_strip(x: Ctx, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int]:
    """Maybe a vertical icon strip beside a web page's content (x0, y0) .. (x1, y1); returns the content's
    (x0, x1): unchanged, with no draw, with icon places off."""
    if not x.icon_places or not x.chance(WEB_STRIP_SHARE):
        return x0, x1
    return icon_strip(x, x0, y0, x1, y1)


def icon_strip(x: Ctx, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int]:
    """A toolbar's icon buttons in a vertical strip along the left or right edge of (x0, y0) .. (x1, y1);
    returns the (x0, x1) left to the content beside it (unchanged when no strip fits)."""
    st, c, p = x.st, x.c, x.st.p
    ch = st.control_h
    m = max(3, st.gap // 2 + 2)
    w = ch + 2 * m
    if x1 - x0 < w + 320 or y1 - y0 < 3 * ch + 2 * m:
        return x0, x1
    left = x.chance(0.5)
    sx0 = x0 if left else x1 - w
    c.rect((sx0, y0, sx0 + w, y1), fill=mix(p.bg, p.bar, 0.5))
    edge = sx0 + w - 1 if left else sx0
    c.line([(edge, y0), (edge, y1 - 1)], mix(p.bg, p.border, 0.7), 1)
    boxed = x.chance(0.4)
    names = list(W.TOOLBAR_ICONS)
    x.rng.shuffle(names)
    step = ch + max(2, st.gap // 2) + (st.gap if x.chance(0.5) else 0)
    yy, drawn = y0 + m + 2, 0
    for name in names[:x.rng.randint(3, 7)]:
        if yy + ch > y1 - m:
            break
        W.icon_button(c, st, (sx0 + m, yy, sx0 + m + ch, yy + ch), name, boxed=boxed, label=x.claim_icon(name))
        yy += step
        drawn += 1
    x.icon_log.setdefault("strips", []).append(("left" if left else "right", drawn))
    return (sx0 + w, x1) if left else (x0, sx0)


def dialog_close_left(x: Ctx) -> bool:
    """Whether a dialog's close icon goes to its top left corner (no draw with icon places off)."""
    if not x.icon_places:
        return False
    left = x.chance(DIALOG_CLOSE_LEFT)
    x.icon_log["dialog close"] = "left" if left else "right"
    return left
