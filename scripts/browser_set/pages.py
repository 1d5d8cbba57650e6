"""HTML/CSS for the browser grounding screens: seven page kinds, two themes, a palette of accent hues.

Every page is one fixed-size ``<div id="screen">`` of exactly the viewport's pixels (no vh/vw units, so the
layout does not depend on the window height Chromium uses while the page loads), with its click targets
marked ``data-target="<instruction>" data-role="<role>"``. ``BOX_SCRIPT`` (run at the end of the body)
writes every target's ``getBoundingClientRect()`` and whether it is visible and unclipped into
``<pre id="boxes">``; with ``#verify`` in the URL it also paints each target a flat colour of its own, so
a screenshot shows where each box really was drawn (``generate.py`` compares the two).

Which box is the element, as in ``holotron/data/widgets.py``: the whole control for buttons, icons, tabs,
menus, menu items, text fields, dropdowns and list rows; the text for links; only the square / circle /
track for checkboxes, radio buttons and switches, whose label sits beside them.
"""

from __future__ import annotations

import html
import math
import random
from dataclasses import dataclass

from holotron.data.instructions import instruction_for

KINDS = ("login", "signup", "settings", "toolbar", "dialog", "table", "search")
THEMES = ("light", "dark")
# families installed with fonts-* packages (see README.md); the page checks each one is really used
FONTS = ("Inter", "Roboto", "Open Sans", "Lato", "Liberation Sans", "DejaVu Sans", "Cantarell", "Carlito",
         "FreeSans", "Liberation Serif")
VIEWPORTS = ((1280, 800), (1440, 900), (1024, 768), (1920, 1080), (915, 412), (1366, 768))

# accent hues: name -> (light-theme accent, dark-theme accent)
ACCENTS = {
    "blue": ("#2563eb", "#60a5fa"), "green": ("#15803d", "#4ade80"), "purple": ("#7c3aed", "#a78bfa"),
    "orange": ("#c2410c", "#fb923c"), "teal": ("#0f766e", "#2dd4bf"), "pink": ("#be185d", "#f472b6"),
    "indigo": ("#4338ca", "#818cf8"), "slate": ("#334155", "#cbd5e1"),
}


@dataclass
class Ctx:
    """What a page builder knows: the rng, the viewport and the look."""
    rng: random.Random
    w: int
    h: int
    theme: str
    font: str
    font_size: int
    radius: int
    accent: str

    @property
    def compact(self) -> bool:
        return self.h < 600 or self.w < 1000


def esc(s: str) -> str:
    return html.escape(s, quote=True)


def tgt(instruction: str, role: str) -> str:
    """The attributes that mark a click target."""
    return f'data-target="{esc(instruction)}" data-role="{esc(role)}"'


def quoted(label: str, rng: random.Random) -> str:
    m = rng.choice(["'", '"', ""] if "'" not in label else ['"', ""])
    return f"{m}{label}{m}"


# ----------------------------------------------------------------------------------------------
# icons: 24x24 line drawings, stroke = currentColor
# ----------------------------------------------------------------------------------------------

def _gear() -> str:
    spokes = []
    for k in range(8):
        a = k * math.pi / 4
        spokes.append(f"M{12 + 7.5 * math.cos(a):.1f} {12 + 7.5 * math.sin(a):.1f}"
                      f"L{12 + 10 * math.cos(a):.1f} {12 + 10 * math.sin(a):.1f}")
    return f'<circle cx="12" cy="12" r="3"/><circle cx="12" cy="12" r="7"/><path d="{"".join(spokes)}"/>'


ICON_PATHS = {
    "search": '<circle cx="11" cy="11" r="6.5"/><path d="M16 16l4.5 4.5"/>',
    "close": '<path d="M6 6l12 12M18 6L6 18"/>',
    "add": '<path d="M12 5v14M5 12h14"/>',
    "menu": '<path d="M4 7h16M4 12h16M4 17h16"/>',
    "more": '<circle cx="5" cy="12" r="1.3"/><circle cx="12" cy="12" r="1.3"/><circle cx="19" cy="12" r="1.3"/>',
    "refresh": '<path d="M19.5 12a7.5 7.5 0 1 1-2.2-5.3"/><path d="M19.5 4v5h-5"/>',
    "home": '<path d="M3.5 11L12 4l8.5 7M6 9.5V20h12V9.5"/>',
    "star": '<path d="M12 3.5l2.6 5.6 6.1.6-4.6 4.1 1.3 6-5.4-3.1-5.4 3.1 1.3-6-4.6-4.1 6.1-.6z"/>',
    "download": '<path d="M12 4v11M7 10.5l5 5 5-5M5 20h14"/>',
    "upload": '<path d="M12 20V9M7 13.5l5-5 5 5M5 4h14"/>',
    "settings": _gear(),
    "bell": '<path d="M6 16.5V11a6 6 0 0 1 12 0v5.5l1.5 1.5h-15z"/><path d="M10 20.5a2 2 0 0 0 4 0"/>',
    "trash": '<path d="M4 7h16M9.5 7V4.5h5V7M6.5 7l1 13h9l1-13M10.5 11v5.5M13.5 11v5.5"/>',
    "edit": '<path d="M4.5 19.5h4l10-10-4-4-10 10z"/><path d="M13 7l4 4"/>',
    "eye": '<path d="M2.5 12S6 5.5 12 5.5 21.5 12 21.5 12 18 18.5 12 18.5 2.5 12 2.5 12z"/>'
           '<circle cx="12" cy="12" r="3"/>',
    "back": '<path d="M15 5l-7 7 7 7"/>',
    "forward": '<path d="M9 5l7 7-7 7"/>',
    "filter": '<path d="M4 5h16l-6 7.5V19l-4-2v-4.5z"/>',
    "share": '<circle cx="18" cy="5.5" r="2.5"/><circle cx="6" cy="12" r="2.5"/><circle cx="18" cy="18.5" r="2.5"/>'
             '<path d="M8.2 10.8l7.6-4.1M8.2 13.2l7.6 4.1"/>',
    "user": '<circle cx="12" cy="8" r="4"/><path d="M4 21c0-4 3.6-6.5 8-6.5s8 2.5 8 6.5"/>',
    "mail": '<rect x="3" y="5.5" width="18" height="13" rx="1.5"/><path d="M3.5 7l8.5 6 8.5-6"/>',
    "undo": '<path d="M9 14L4 9l5-5"/><path d="M4 9h10a6 6 0 0 1 0 12h-3"/>',
    "redo": '<path d="M15 14l5-5-5-5"/><path d="M20 9H10a6 6 0 0 0 0 12h3"/>',
    "print": '<path d="M6.5 9V3.5h11V9"/><rect x="3" y="9" width="18" height="8" rx="1.5"/>'
             '<path d="M6.5 14h11v6.5h-11z"/>',
    "image": '<rect x="3" y="4.5" width="18" height="15" rx="1.5"/><circle cx="8.5" cy="9.5" r="1.8"/>'
             '<path d="M3.5 17l5-5 4 4 3-3 5 5"/>',
    "align-left": '<path d="M4 6h16M4 10h10M4 14h16M4 18h10"/>',
    "align-center": '<path d="M4 6h16M7 10h10M4 14h16M7 18h10"/>',
    "list": '<path d="M9 6h11M9 12h11M9 18h11"/><circle cx="4.5" cy="6" r="1"/><circle cx="4.5" cy="12" r="1"/>'
            '<circle cx="4.5" cy="18" r="1"/>',
    "folder": '<path d="M3 6.5V18a1.5 1.5 0 0 0 1.5 1.5h15A1.5 1.5 0 0 0 21 18V9a1.5 1.5 0 0 0-1.5-1.5H12L10 5H4.5'
              'A1.5 1.5 0 0 0 3 6.5z"/>',
    "file": '<path d="M6 3h8l5 5v13H6z"/><path d="M14 3v5h5"/>',
    "grid": '<rect x="4" y="4" width="7" height="7"/><rect x="13" y="4" width="7" height="7"/>'
            '<rect x="4" y="13" width="7" height="7"/><rect x="13" y="13" width="7" height="7"/>',
    "help": '<circle cx="12" cy="12" r="9"/><path d="M9.5 9.5a2.5 2.5 0 1 1 3.5 2.3c-.7.3-1 .9-1 1.7v.5"/>'
            '<circle cx="12" cy="17" r=".6"/>',
    "calendar": '<rect x="3.5" y="5" width="17" height="15" rx="1.5"/><path d="M3.5 10h17M8 3v4M16 3v4"/>',
    "lock": '<rect x="5" y="10.5" width="14" height="10" rx="1.5"/><path d="M8 10.5V7.5a4 4 0 0 1 8 0v3"/>',
}

# icon -> the label an instruction uses for an icon-only button (as holotron/data/widgets.py ICONS)
ICON_LABELS = {
    "search": "Search", "close": "Close", "add": "Add", "menu": "Menu", "more": "More options",
    "refresh": "Refresh", "home": "Home", "star": "Favorite", "download": "Download", "upload": "Upload",
    "settings": "Settings", "bell": "Notifications", "trash": "Delete", "edit": "Edit", "back": "Back",
    "forward": "Forward", "filter": "Filter", "share": "Share", "user": "Profile", "mail": "Messages",
    "undo": "Undo", "redo": "Redo", "print": "Print", "image": "Insert image", "align-left": "Align left",
    "align-center": "Align center", "list": "Bulleted list", "help": "Help", "grid": "Grid view",
    "calendar": "Calendar", "eye": "Show password", "folder": "Open folder", "file": "File", "lock": "Lock",
}


def icon(name: str, size: int = 18) -> str:
    return (f'<svg width="{size}" height="{size}" viewBox="0 0 24 24" fill="none" stroke="currentColor" '
            f'stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round" aria-hidden="true">'
            f'{ICON_PATHS[name]}</svg>')


# ----------------------------------------------------------------------------------------------
# vocabulary
# ----------------------------------------------------------------------------------------------

BRANDS = ["Northwind", "Acme Cloud", "Brightline", "Pinecone", "Orbit", "Larkspur", "Tandem", "Bluefin",
          "Quarry", "Halcyon", "Meridian", "Copperleaf", "Fieldnote", "Lumen", "Keystone", "Riverbank"]
FIRST = ["Maria", "James", "Aiko", "Daniel", "Priya", "Lucas", "Fatima", "Chen", "Olivia", "Mateo", "Grace",
         "Noah", "Leila", "Tomas", "Hannah", "Ravi", "Sofia", "Ethan", "Amara", "Jonas"]
LAST = ["Lopez", "Carter", "Tanaka", "Novak", "Shah", "Moreau", "Haddad", "Wei", "Brennan", "Silva", "Kim",
        "Okafor", "Rahimi", "Berg", "Fischer", "Iyer", "Rossi", "Walsh", "Mensah", "Lindqvist"]
QUERIES = ["wireless headphones", "hiking boots", "python tutorial", "apartment rentals", "banana bread recipe",
           "standing desk", "flights to Lisbon", "weather radar", "used bicycles", "tax deadline",
           "sourdough starter", "electric kettle", "beginner guitar chords", "museum opening hours",
           "running shoes", "noise cancelling earbuds", "vegetable garden", "budget spreadsheet template"]
SITES = ["example.com", "shop.example.org", "docs.example.net", "news.example.com", "wiki.example.org",
         "forum.example.net", "reviews.example.com", "blog.example.org"]


def person(rng: random.Random, used: set) -> str:
    while True:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        if name not in used:
            used.add(name)
            return name


def pick(rng: random.Random, items, k: int) -> list:
    return rng.sample(list(items), k)


# ----------------------------------------------------------------------------------------------
# widgets
# ----------------------------------------------------------------------------------------------

def button(c: Ctx, label: str, *, kind: str = "", icon_name: str | None = None, target: bool = True,
           instruction: str | None = None, small: bool = False) -> str:
    """A text button (optionally with a leading icon); role "button"."""
    cls = " ".join(x for x in ("btn", kind, "small" if small else "") if x)
    attrs = tgt(instruction or instruction_for(label, "button", c.rng), "button") if target else ""
    ic = icon(icon_name, 16) if icon_name else ""
    return f'<button class="{cls}" {attrs}>{ic}<span>{esc(label)}</span></button>'


def icon_button(c: Ctx, name: str, *, target: bool = True, instruction: str | None = None, size: int = 34,
                boxed: bool = False) -> str:
    """An icon-only button; role "icon", named by ICON_LABELS unless an instruction is given."""
    attrs = tgt(instruction or instruction_for(ICON_LABELS[name], "icon", c.rng), "icon") if target else ""
    cls = "icon-btn boxed" if boxed else "icon-btn"
    return (f'<button class="{cls}" style="width:{size}px;height:{size}px" title="{esc(ICON_LABELS[name])}" '
            f'{attrs}>{icon(name, round(size * 0.55))}</button>')


def field(c: Ctx, label: str, *, kind: str = "text", value: str = "", placeholder: str = "", target: bool = True,
          instruction: str | None = None, show_label: bool = True, trailing: str = "") -> str:
    """A labelled text field; the box is the input only, so the instruction names the label."""
    attrs = tgt(instruction or instruction_for(label, "text field", c.rng), "text field") if target else ""
    lab = f'<label class="lab">{esc(label)}</label>' if show_label else ""
    ph = f' placeholder="{esc(placeholder)}"' if placeholder else ""
    val = f' value="{esc(value)}"' if value else ""
    inp = f'<input class="input" type="{kind}"{val}{ph} {attrs}>'
    if trailing:
        inp = f'<div class="with-trailing">{inp}{trailing}</div>'
    return f'<div class="fgroup">{lab}{inp}</div>'


def checkbox(c: Ctx, label: str, *, checked: bool = False, target: bool = True,
             instruction: str | None = None, extra: str = "") -> str:
    attrs = tgt(instruction or instruction_for(label, "checkbox", c.rng), "checkbox") if target else ""
    chk = " checked" if checked else ""
    return (f'<label class="choice"><input type="checkbox" class="cb"{chk} {attrs}>'
            f'<span>{esc(label)}{extra}</span></label>')


def radio(c: Ctx, group: str, label: str, *, checked: bool = False, target: bool = True) -> str:
    attrs = tgt(instruction_for(label, "radio", c.rng), "radio") if target else ""
    chk = " checked" if checked else ""
    return (f'<label class="choice"><input type="radio" class="rb" name="{esc(group)}"{chk} {attrs}>'
            f'<span>{esc(label)}</span></label>')


def switch(c: Ctx, label: str, *, on: bool = False, target: bool = True, desc: str = "") -> str:
    attrs = tgt(instruction_for(label, "switch", c.rng), "switch") if target else ""
    chk = " checked" if on else ""
    d = f'<div class="muted small">{esc(desc)}</div>' if desc else ""
    return (f'<div class="setrow"><div><div>{esc(label)}</div>{d}</div>'
            f'<input type="checkbox" class="sw"{chk} {attrs}></div>')


def dropdown(c: Ctx, label: str, options: list[str], *, selected: int = 0, target: bool = True,
             inline_label: bool = False, instruction: str | None = None) -> str:
    attrs = tgt(instruction or instruction_for(label, "dropdown", c.rng), "dropdown") if target else ""
    opts = "".join(f"<option{' selected' if i == selected else ''}>{esc(o)}</option>" for i, o in enumerate(options))
    cls = "fgroup inline" if inline_label else "fgroup"
    return (f'<div class="{cls}"><label class="lab">{esc(label)}</label>'
            f'<select class="select" {attrs}>{opts}</select></div>')


def link(c: Ctx, label: str, *, target: bool = True, instruction: str | None = None, cls: str = "") -> str:
    attrs = tgt(instruction or instruction_for(label, "link", c.rng), "link") if target else ""
    return f'<a href="#" class="lnk {cls}" {attrs}>{esc(label)}</a>'


# ----------------------------------------------------------------------------------------------
# CSS
# ----------------------------------------------------------------------------------------------

def palette(theme: str, accent: str) -> dict:
    light, dark = ACCENTS[accent]
    if theme == "light":
        return {"bg": "#f4f5f7", "surface": "#ffffff", "text": "#1f2328", "muted": "#5f6873", "border": "#d0d5dc",
                "strong": "#8a939e", "input": "#ffffff", "accent": light, "on_accent": "#ffffff", "hover": "#eef0f3",
                "danger": "#c62828", "on_danger": "#ffffff", "track": "#c3c9d1", "overlay": "rgba(15,20,30,.45)",
                "stripe": "#f8f9fb", "header": "#ffffff", "accent_soft": light + "1f"}
    return {"bg": "#15171c", "surface": "#1f232a", "text": "#e6e8eb", "muted": "#9aa3ad", "border": "#363c46",
            "strong": "#6b7480", "input": "#16191e", "accent": dark, "on_accent": "#0d1117", "hover": "#2a2f38",
            "danger": "#f87171", "on_danger": "#1a0a0a", "track": "#4a515c", "overlay": "rgba(0,0,0,.6)",
            "stripe": "#1b1e24", "header": "#1b1e24", "accent_soft": dark + "26"}


def base_css(c: Ctx) -> str:
    p = palette(c.theme, c.accent)
    r = c.radius
    chevron = ("url(\"data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' width='12' height='12' "
               f"viewBox='0 0 12 12'><path d='M2 4l4 4 4-4' fill='none' stroke='{p['muted'].replace('#', '%23')}' "
               "stroke-width='1.6'/></svg>\")")
    return f"""
html,body{{margin:0;padding:0;background:{p['bg']}}}
#screen{{position:relative;width:{c.w}px;height:{c.h}px;overflow:hidden;background:{p['bg']};color:{p['text']};
  font-family:"{c.font}";font-size:{c.font_size}px;line-height:1.4}}
#screen *{{box-sizing:border-box}}
.muted{{color:{p['muted']}}} .small{{font-size:.86em}}
h1,h2,h3{{margin:0 0 .5em;font-weight:600;line-height:1.25}} h1{{font-size:1.6em}} h2{{font-size:1.3em}}
h3{{font-size:1.08em}} p{{margin:0 0 .8em}}
.btn{{display:inline-flex;align-items:center;justify-content:center;gap:6px;padding:.55em 1.1em;
  border-radius:{r}px;border:1px solid {p['border']};background:{p['surface']};color:{p['text']};font:inherit;
  font-weight:500;white-space:nowrap;cursor:pointer;margin:0}}
.btn.small{{padding:.3em .7em;font-size:.9em}}
.btn.primary{{background:{p['accent']};border-color:{p['accent']};color:{p['on_accent']}}}
.btn.danger{{background:{p['danger']};border-color:{p['danger']};color:{p['on_danger']}}}
.btn.ghost{{background:transparent;border-color:transparent;color:{p['accent']}}}
.btn.block{{display:flex;width:100%}}
.icon-btn{{display:inline-flex;align-items:center;justify-content:center;border:none;background:transparent;
  color:{p['muted']};border-radius:{min(r, 8)}px;padding:0;margin:0;cursor:pointer;flex:none}}
.icon-btn.boxed{{border:1px solid {p['border']};background:{p['surface']}}}
.fgroup{{margin:0 0 .9em}} .fgroup.inline{{display:flex;align-items:center;gap:.7em}}
.fgroup.inline .lab{{margin:0}}
.lab{{display:block;font-size:.9em;font-weight:500;margin:0 0 .35em}}
.input{{display:block;width:100%;padding:.55em .75em;border:1px solid {p['border']};border-radius:{r}px;
  background:{p['input']};color:{p['text']};font:inherit;margin:0;outline:none}}
.input::placeholder{{color:{p['muted']}}}
.with-trailing{{position:relative}} .with-trailing .input{{padding-right:2.6em}}
.with-trailing .icon-btn{{position:absolute;right:4px;top:50%;margin-top:-14px}}
.choice{{display:flex;align-items:center;gap:.55em;margin:.45em 0;cursor:pointer}}
.cb,.rb,.sw{{appearance:none;-webkit-appearance:none;margin:0;flex:none;cursor:pointer;position:relative}}
.cb{{width:16px;height:16px;border:1.5px solid {p['strong']};border-radius:{min(r, 4)}px;background:{p['input']}}}
.cb:checked{{background:{p['accent']};border-color:{p['accent']}}}
.cb:checked::after{{content:"";position:absolute;left:4px;top:1px;width:4px;height:8px;
  border:solid {p['on_accent']};border-width:0 2px 2px 0;transform:rotate(45deg)}}
.rb{{width:16px;height:16px;border:1.5px solid {p['strong']};border-radius:50%;background:{p['input']}}}
.rb:checked{{border:5px solid {p['accent']}}}
.sw{{width:38px;height:22px;border-radius:11px;background:{p['track']}}}
.sw::after{{content:"";position:absolute;top:3px;left:3px;width:16px;height:16px;border-radius:50%;background:#fff}}
.sw:checked{{background:{p['accent']}}} .sw:checked::after{{left:19px}}
.select{{appearance:none;-webkit-appearance:none;display:block;min-width:11em;padding:.5em 2.2em .5em .75em;
  border:1px solid {p['border']};border-radius:{r}px;background:{p['input']} {chevron} no-repeat right .7em center;
  color:{p['text']};font:inherit;margin:0}}
.setrow{{display:flex;align-items:center;justify-content:space-between;gap:1.5em;padding:.7em 0;
  border-bottom:1px solid {p['border']}}}
.lnk{{color:{p['accent']};text-decoration:none}} .lnk.u{{text-decoration:underline}}
.card{{background:{p['surface']};border:1px solid {p['border']};border-radius:{r + 4}px}}
.row{{display:flex;align-items:center;gap:.6em}} .spacer{{flex:1}}
.topbar{{display:flex;align-items:center;gap:.8em;padding:0 1.2em;height:56px;background:{p['header']};
  border-bottom:1px solid {p['border']}}}
.brand{{display:flex;align-items:center;gap:.5em;font-weight:700;font-size:1.1em}}
.logo{{width:26px;height:26px;border-radius:7px;background:{p['accent']};display:inline-block}}
.tabs{{display:flex;gap:.2em;border-bottom:1px solid {p['border']}}}
.tab{{padding:.6em 1em;border:none;background:transparent;color:{p['muted']};font:inherit;margin:0;cursor:pointer;
  border-bottom:2px solid transparent}}
.tab.on{{color:{p['accent']};border-bottom-color:{p['accent']};font-weight:600}}
.navitem{{display:flex;align-items:center;gap:.6em;padding:.55em .8em;border-radius:{r}px;color:{p['text']};
  text-decoration:none;margin:1px 0}}
.navitem.on{{background:{p['accent_soft']};color:{p['accent']};font-weight:600}}
table{{border-collapse:collapse;width:100%}}
th{{text-align:left;font-weight:600;font-size:.88em;color:{p['muted']};padding:.6em .8em;
  border-bottom:1px solid {p['border']}}}
td{{padding:.45em .8em;border-bottom:1px solid {p['border']};white-space:nowrap}}
tr:nth-child(even) td{{background:{p['stripe']}}}
.badge{{display:inline-block;padding:.1em .6em;border-radius:999px;font-size:.82em;background:{p['hover']}}}
.overlay{{position:absolute;inset:0;background:{p['overlay']};display:flex;align-items:center;justify-content:center}}
.menubar{{display:flex;align-items:center;gap:2px;padding:0 .5em;height:32px;background:{p['header']};
  border-bottom:1px solid {p['border']};font-size:.95em}}
.menu{{padding:.25em .7em;border:none;background:transparent;color:{p['text']};font:inherit;margin:0;
  border-radius:4px;cursor:pointer}}
.menu.open{{background:{p['accent_soft']};color:{p['accent']}}}
.dropmenu{{position:absolute;min-width:210px;background:{p['surface']};border:1px solid {p['border']};
  border-radius:{min(r, 8)}px;box-shadow:0 8px 24px rgba(0,0,0,.22);padding:4px;z-index:5}}
.mitem{{display:flex;justify-content:space-between;gap:2em;width:100%;padding:.4em .8em;border:none;
  background:transparent;color:{p['text']};font:inherit;margin:0;text-align:left;border-radius:4px;cursor:pointer}}
.mitem .kbd{{color:{p['muted']};font-size:.88em}}
.sep{{height:1px;background:{p['border']};margin:4px 2px}}
.toolbar{{display:flex;align-items:center;gap:4px;padding:6px 10px;background:{p['surface']};
  border-bottom:1px solid {p['border']};flex-wrap:nowrap}}
.vsep{{width:1px;height:24px;background:{p['border']};margin:0 6px;flex:none}}
.result{{margin:0 0 1.4em;max-width:640px}} .result .url{{font-size:.85em;color:{p['muted']}}}
.result .title{{font-size:1.15em}}
.skel{{height:.7em;border-radius:4px;background:{p['hover']};margin:.7em 0}}
"""


# ----------------------------------------------------------------------------------------------
# page kinds: each returns the inner HTML of #screen
# ----------------------------------------------------------------------------------------------

def page_login(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    brand = rng.choice(BRANDS)
    user_label = rng.choice(["Email", "Email address", "Username", "Work email"])
    with_labels = rng.random() < 0.7
    user_instr = rng.choice([None, f"the {user_label.lower()} field", f"the {user_label.lower()} input box"])
    pw_instr = rng.choice([None, "the password field", "the password input"])
    show_pw = rng.random() < 0.5
    trailing = icon_button(c, "eye", target=True, size=28,
                           instruction=rng.choice(["the show password icon", "the eye icon in the password field",
                                                   "the button that shows the password"])) if show_pw else ""
    remember = rng.choice(["Remember me", "Keep me signed in", "Stay signed in"])
    forgot = rng.choice(["Forgot password?", "Forgot your password?", "Reset password"])
    submit = rng.choice(["Sign in", "Log in", "Continue", "Sign in securely"])
    signup = rng.choice(["Create an account", "Sign up", "Register", "Create account"])
    titles = ["Sign in", "Welcome back", "Log in to " + brand, "Sign in to your account"]
    no_account = rng.choice(["No account yet?", "New here?", "Don't have an account?"])
    alt = rng.choice(["Continue with SSO", "Sign in with a passkey", "Use a magic link", "Continue with email code"])
    form = (
        f'<h1>{esc(rng.choice([t for t in titles if t != submit]))}</h1>'
        f'<p class="muted">{esc(rng.choice(["Enter your details to continue.", "Good to see you again.", "Use your " + brand + " account."]))}</p>'  # noqa: E501
        + field(c, user_label, kind="email" if "mail" in user_label.lower() else "text",
                placeholder=rng.choice(["you@example.com", "name@company.com", ""]) if "mail" in user_label.lower()
                else (user_label if not with_labels else ""),
                instruction=user_instr, show_label=with_labels)
        + field(c, "Password", kind="password", value=rng.choice(["", "hunter22secret"]),
                placeholder="" if with_labels else "Password", instruction=pw_instr, show_label=with_labels,
                trailing=trailing)
        + f'<div class="row" style="justify-content:space-between;margin:.2em 0 1em">'
          f'{checkbox(c, remember, checked=rng.random() < 0.4)}{link(c, forgot)}</div>'
        + f'<div style="margin-bottom:.8em">{button(c, submit, kind="primary block")}</div>'
        + (f'<div style="margin-bottom:.8em">{button(c, alt, kind="block", icon_name=rng.choice(["lock", "mail", "user"]))}</div>'  # noqa: E501
           if rng.random() < 0.6 else "")
        + f'<p class="muted small" style="text-align:center">{esc(no_account)} '
          f'{link(c, signup)}</p>'
    )
    card_w = 380 if c.compact else rng.choice([380, 400, 420])
    pad = "1.2em 1.6em" if c.compact else "2em 2.2em"
    split = c.w >= 1280 and rng.random() < 0.5
    head = (f'<div class="topbar" style="height:48px"><span class="brand"><span class="logo"></span>{esc(brand)}</span>'
            f'<span class="spacer"></span>{link(c, "Help", target=rng.random() < 0.5, instruction=None)}</div>'
            if not split and not c.compact else "")
    card = f'<div class="card" style="width:{card_w}px;padding:{pad}">{form}</div>'
    if split:
        hero = (f'<div style="flex:1;height:100%;background:{palette(c.theme, c.accent)["accent"]};color:'
                f'{palette(c.theme, c.accent)["on_accent"]};padding:3em;display:flex;flex-direction:column;'
                f'justify-content:flex-end"><div class="brand" style="font-size:1.6em">{esc(brand)}</div>'
                f'<p style="font-size:1.2em;max-width:24em">{esc(rng.choice(["Plan, track and ship together.", "Your files, everywhere.", "Money made simple.", "Everything your team needs."]))}</p></div>')  # noqa: E501
        body = f'<div style="display:flex;height:100%">{hero}<div style="flex:1;display:flex;align-items:center;justify-content:center">{card}</div></div>'  # noqa: E501
    else:
        top = 12 if c.compact else 0
        align = "flex-start" if c.compact else "center"
        body = (f'{head}<div style="display:flex;justify-content:center;align-items:{align};'
                f'height:calc(100% - {0 if (split or c.compact) else 48}px);padding-top:{top}px">{card}</div>')
    return body, "login"


def page_signup(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    brand = rng.choice(BRANDS)
    two_col = c.w >= 1024 and rng.random() < 0.6
    fields = [field(c, "First name", placeholder=rng.choice(["", "Jane"])),
              field(c, "Last name", placeholder=rng.choice(["", "Doe"]))] if two_col else \
        [field(c, rng.choice(["Full name", "Name", "Your name"]))]
    email_lab = rng.choice(["Email", "Email address", "Work email"])
    more = [field(c, email_lab, kind="email", placeholder=rng.choice(["", "you@example.com"]),
                  instruction=rng.choice([None, "the email field", "the email address input"])),
            field(c, "Password", kind="password", placeholder=rng.choice(["", "At least 8 characters"])),
            field(c, rng.choice(["Confirm password", "Repeat password"]), kind="password")]
    if rng.random() < 0.5:
        more.append(field(c, rng.choice(["Company", "Organization", "Phone number"]),
                          placeholder=rng.choice(["", "Optional"])))
    countries = ["United States", "Canada", "Germany", "France", "Japan", "Brazil", "India", "Kenya", "Australia"]
    rng.shuffle(countries)
    sel = dropdown(c, rng.choice(["Country", "Country or region", "Region"]), countries)
    acct = ""
    if rng.random() < 0.6:
        a, b = rng.choice([("Personal", "Business"), ("Individual", "Team"), ("Student", "Professional")])
        acct = (f'<div class="fgroup"><div class="lab">Account type</div><div class="row" style="gap:1.4em">'
                f'{radio(c, "acct", a, checked=True)}{radio(c, "acct", b)}</div></div>')
    terms_label = rng.choice(["I agree to the Terms of Service", "I accept the terms and conditions",
                              "I agree to the Privacy Policy"])
    news = checkbox(c, rng.choice(["Send me product updates", "Subscribe to the newsletter",
                                   "Email me tips and offers"]),
                    checked=rng.random() < 0.3)
    terms = checkbox(c, terms_label)
    submit = rng.choice(["Create account", "Sign up", "Get started", "Register"])
    login, header_login = rng.choice([("Sign in", "Log in"), ("Log in", "Sign in")])  # never the same text twice
    grid = (f'<div style="display:grid;grid-template-columns:1fr 1fr;gap:0 1em">{"".join(fields)}</div>'
            if two_col else "".join(fields))
    form = (f'<h1>{esc(rng.choice(["Create your account", "Sign up for " + brand, "Get started with " + brand]))}</h1>'
            + grid + "".join(more) + sel + acct + terms + news
            + f'<div style="margin:1em 0 .8em">{button(c, submit, kind="primary block")}</div>'
            + f'<p class="muted small" style="text-align:center">Already have an account? {link(c, login)}</p>')
    card_w = 560 if two_col else 420
    pad = "1.2em 1.6em" if c.compact else "1.8em 2.2em"
    body = (f'<div class="topbar"><span class="brand"><span class="logo"></span>{esc(brand)}</span>'
            f'<span class="spacer"></span>'
            f'{link(c, rng.choice(["Pricing", "Features", "Contact sales"]))}'
            f'{button(c, header_login, kind="ghost", instruction=rng.choice([None, "the " + header_login + " button in the header"]))}</div>'  # noqa: E501
            f'<div style="display:flex;justify-content:center;padding-top:{12 if c.compact else 28}px">'
            f'<div class="card" style="width:{card_w}px;padding:{pad}">{form}</div></div>')
    return body, "signup"


SETTINGS_SECTIONS = ["General", "Account", "Profile", "Notifications", "Privacy", "Security", "Appearance",
                     "Billing", "Integrations", "Language & region", "Accessibility", "Storage"]
SWITCHES = [("Email notifications", "Get an email when someone mentions you."),
            ("Push notifications", "Alerts on your phone."), ("Weekly summary", "A digest every Monday."),
            ("Two-factor authentication", "Ask for a code when signing in."), ("Auto-update", ""),
            ("Show online status", "Let others see when you are active."), ("Sound effects", ""),
            ("Compact mode", "Show more items on screen."), ("Autoplay videos", ""),
            ("Sync across devices", "Keep settings the same everywhere."), ("Location access", ""),
            ("Read receipts", "Tell senders when you have read a message.")]
CHECKS = ["Comments", "Mentions", "New followers", "Product news", "Security alerts", "Billing reminders",
          "Direct messages", "Team invites", "Calendar reminders"]


def page_settings(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    brand = rng.choice(BRANDS)
    sections = pick(rng, SETTINGS_SECTIONS, 6 if c.compact else 8)
    current = rng.randrange(len(sections))
    use_tabs = rng.random() < 0.35
    if use_tabs:
        nav = '<div class="tabs" style="margin-bottom:1em">' + "".join(
            f'<button class="tab{" on" if i == current else ""}" {tgt(instruction_for(s, "tab", rng), "tab")}>'
            f'{esc(s)}</button>' for i, s in enumerate(sections[:6])) + "</div>"
    else:
        nav = "".join(
            f'<a href="#" class="navitem{" on" if i == current else ""}" {tgt(instruction_for(s, "list item", rng), "list item")}>'  # noqa: E501
            f'{esc(s)}</a>' for i, s in enumerate(sections))
    sw = pick(rng, SWITCHES, rng.randint(2, 4))
    switches = "".join(switch(c, lab, on=rng.random() < 0.5, desc=d if not c.compact else "") for lab, d in sw)
    checks = pick(rng, CHECKS, rng.randint(2, 4))
    check_html = ('<h3 style="margin-top:1.2em">' + esc(rng.choice(["Notify me about", "Email me about", "Alerts"]))
                  + "</h3>" + "".join(checkbox(c, x, checked=rng.random() < 0.5) for x in checks))
    theme_opts = rng.choice([["Light", "Dark", "System default"], ["Light", "Dark", "Match system"],
                             ["Comfortable", "Compact", "Spacious"]])
    group = "Theme" if "Light" in theme_opts else "Density"
    radios = (f'<h3 style="margin-top:1.2em">{group}</h3><div class="row" style="gap:1.5em">'
              + "".join(radio(c, group, o, checked=i == 0) for i, o in enumerate(theme_opts)) + "</div>")
    drops = [dropdown(c, "Language", ["English", "Deutsch", "Espanol", "Francais", "Portugues"], inline_label=False),
             dropdown(c, rng.choice(["Time zone", "Timezone"]), ["UTC", "Europe/Berlin", "America/New_York",
                                                                 "Asia/Tokyo"], selected=rng.randrange(4))]
    if rng.random() < 0.5:
        drops.append(dropdown(c, rng.choice(["Date format", "Start of week"]),
                              ["DD/MM/YYYY", "MM/DD/YYYY", "YYYY-MM-DD"] if rng.random() < 0.5
                              else ["Monday", "Sunday", "Saturday"]))
    name_field = field(c, rng.choice(["Display name", "Username", "Full name"]),
                       value=person(rng, set()), target=rng.random() < 0.6)
    drops_html = '<div style="display:flex;gap:1.5em;flex-wrap:wrap">' + "".join(drops) + "</div>"
    blocks = [switches, name_field + drops_html, radios, check_html]
    rng.shuffle(blocks)
    save = rng.choice(["Save changes", "Save", "Apply", "Update settings"])
    cancel = rng.choice(["Cancel", "Discard", "Reset"])
    actions = (f'<div class="row" style="margin-top:1.2em;gap:.8em">{button(c, save, kind="primary")}'
               f'{button(c, cancel)}</div>')
    main = (f'<h2>{esc(sections[current])}</h2>' + "".join(f'<div style="margin-bottom:.6em">{b}</div>' for b in blocks)
            + actions)
    top = (f'<div class="topbar"><span class="brand"><span class="logo"></span>{esc(brand)}</span>'
           f'<span class="spacer"></span>{icon_button(c, "bell", target="Notifications" not in sections)}'
           f'{icon_button(c, "user", target="Profile" not in sections)}</div>')
    if use_tabs:
        body = (f'{top}<div style="padding:1.2em 2em;height:calc(100% - 56px);overflow:hidden">'
                f'<h1>{esc(rng.choice(["Settings", "Preferences"]))}</h1>{nav}'
                f'<div style="max-width:760px">{main}</div></div>')
    else:
        side_w = 200 if c.compact else 240
        body = (f'{top}<div style="display:flex;height:calc(100% - 56px)">'
                f'<div style="width:{side_w}px;padding:1em;'
                f'border-right:1px solid {palette(c.theme, c.accent)["border"]}'
                f';flex:none">{nav}</div>'
                f'<div style="flex:1;padding:1.2em 2em;overflow:hidden">'
                f'<div style="max-width:760px">{main}</div></div></div>')
    return body, "settings"


MENUS = {
    "File": ["New", "Open...", "Open recent", "-", "Save", "Save as...", "Export", "-", "Print", "Close"],
    "Edit": ["Undo", "Redo", "-", "Cut", "Copy", "Paste", "-", "Find", "Replace", "Select all"],
    "View": ["Zoom in", "Zoom out", "Actual size", "-", "Show ruler", "Full screen", "Show sidebar"],
    "Insert": ["Image", "Table", "Link", "Page break", "-", "Comment", "Footnote", "Special character"],
    "Format": ["Bold", "Italic", "Underline", "-", "Align left", "Center", "Line spacing", "Clear formatting"],
    "Tools": ["Spelling", "Word count", "Translate", "-", "Extensions", "Preferences"],
}
SHORTCUTS = {"New": "Ctrl+N", "Open...": "Ctrl+O", "Save": "Ctrl+S", "Print": "Ctrl+P", "Undo": "Ctrl+Z",
             "Redo": "Ctrl+Y", "Cut": "Ctrl+X", "Copy": "Ctrl+C", "Paste": "Ctrl+V", "Find": "Ctrl+F",
             "Select all": "Ctrl+A", "Bold": "Ctrl+B", "Italic": "Ctrl+I", "Underline": "Ctrl+U",
             "Zoom in": "Ctrl++", "Zoom out": "Ctrl+-"}


def page_toolbar(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    p = palette(c.theme, c.accent)
    variant = rng.choice(["editor", "files"])
    if variant == "editor":
        menu_names = ["File", "Edit", "View", "Insert", "Format", "Tools", "Help"]
        open_i = rng.choice([None, 0, 1, 2, 3, 4])
        open_items = [it for it in MENUS[menu_names[open_i]] if it != "-"] if open_i is not None else []
        taken = {it.rstrip(".").lower() for it in open_items}  # toolbar labels that would be ambiguous
        menubar = ""
        for i, m in enumerate(menu_names):
            if i != open_i:
                menubar += f'<button class="menu" {tgt(instruction_for(m, "menu", rng), "menu")}>{m}</button>'
                continue
            rows = ""
            for it in MENUS[m]:
                if it == "-":
                    rows += '<div class="sep"></div>'
                    continue
                kbd = f'<span class="kbd">{SHORTCUTS[it]}</span>' if it in SHORTCUTS else ""
                rows += (f'<button class="mitem" {tgt(instruction_for(it.rstrip("."), "menu item", rng), "menu item")}>'
                         f'<span>{esc(it)}</span>{kbd}</button>')
            attrs = tgt(rng.choice([f"the {m} menu", f"{m} in the menu bar"]), "menu")
            menubar += (f'<span style="position:relative"><button class="menu open" {attrs}>{m}</button>'
                        f'<div class="dropmenu" style="left:0;top:29px">{rows}</div></span>')
        labelled = pick(rng, [("New", "add"), ("Open", "folder"), ("Save", "download"), ("Share", "share"),
                              ("Print", "print"), ("Comment", "mail")], 2 if c.compact else 3)
        only = pick(rng, ["undo", "redo", "align-left", "align-center", "list", "image", "search", "settings"],
                    4 if c.compact else 6)
        fmt = [("B", "Bold", "font-weight:700"), ("I", "Italic", "font-style:italic"),
               ("U", "Underline", "text-decoration:underline")]
        tb = "".join(button(c, lab, icon_name=ic, kind="ghost" if rng.random() < 0.5 else "", small=True,
                            target=lab.lower() not in taken) for lab, ic in labelled)
        tb += '<span class="vsep"></span>'
        for ch, name, st in fmt:
            tb += (f'<button class="icon-btn" style="width:32px;height:32px;{st};font-family:inherit;font-size:1.05em;'
                   f'color:{p["text"]}" '
                   f'{tgt(instruction_for(name, "icon", rng), "icon") if name.lower() not in taken else ""}>'
                   f'{ch}</button>')
        tb += '<span class="vsep"></span>' + "".join(
            icon_button(c, n, size=32, target=ICON_LABELS[n].lower() not in taken
                        and ICON_LABELS[n].split()[-1].lower() not in taken) for n in only)
        right = rng.choice([x for x in ("Publish", "Share", "Done") if x not in {lab for lab, _ in labelled}])
        tb += '<span class="spacer"></span>' + button(c, right, kind="primary", small=True)
        doc_title = rng.choice(["Quarterly report", "Meeting notes", "Project plan", "Untitled document",
                                "Travel itinerary", "Product brief"])
        paras = "".join(f'<div class="skel" style="width:{rng.randint(55, 98)}%"></div>' for _ in range(14))
        doc = (f'<div style="background:{p["surface"]};width:min(760px,88%);margin:1.5em auto;padding:2.5em 3em;'
               f'border:1px solid {p["border"]};min-height:900px"><h1>{esc(doc_title)}</h1>{paras}</div>')
        title = (f'<div class="row" style="height:34px;padding:0 .8em;gap:.6em"><span class="logo" style="width:20px;'
                 f'height:20px"></span><b>{esc(doc_title)}</b><span class="spacer"></span>{icon_button(c, "star", size=28)}'  # noqa: E501
                 f'{icon_button(c, "more", size=28)}</div>')
        body = (f'{title}<div class="menubar">{menubar}</div><div class="toolbar">{tb}</div>'
                f'<div style="height:100%;overflow:hidden;background:{p["bg"]}">{doc}</div>')
        return body, "toolbar"
    # a file manager: toolbar of icon + label buttons, breadcrumbs, an item grid
    actions = pick(rng, [("New folder", "folder"), ("Upload", "upload"), ("Download", "download"),
                         ("Share", "share"), ("Delete", "trash"), ("Rename", "edit")], 3 if c.compact else 5)
    tb = "".join(button(c, lab, icon_name=ic, kind=("primary" if i == 0 else rng.choice(["", "ghost"])), small=True)
                 for i, (lab, ic) in enumerate(actions))
    tb += ('<span class="spacer"></span>' + icon_button(c, "grid", size=32) + icon_button(c, "list", size=32)
           + icon_button(c, "refresh", size=32))
    crumbs = pick(rng, ["Home", "Projects", "2024", "Design", "Clients", "Archive", "Shared", "Marketing"], 3)
    crumb_html = ' <span class="muted">/</span> '.join(
        link(c, x, instruction=rng.choice([None, f"the {quoted(x, rng)} breadcrumb"])) if i < 2 else f"<b>{esc(x)}</b>"
        for i, x in enumerate(crumbs))
    names = pick(rng, ["Invoices", "Photos", "Contracts", "Drafts", "Reports", "Slides", "Budget.xlsx",
                       "Logo.svg", "Notes.txt", "Roadmap.pdf", "Team.png", "Minutes.docx", "Backup.zip",
                       "Schedule.ics", "Music"], 12)
    tiles = ""
    for n in names:
        ic = "file" if "." in n else "folder"
        tiles += (f'<div style="width:120px;padding:.8em .4em;text-align:center;border-radius:8px">'
                  f'<div style="color:{p["accent"] if ic == "folder" else p["muted"]}">{icon(ic, 40)}</div>'
                  f'<div class="small" style="margin-top:.3em">{esc(n)}</div></div>')
    side = "".join(f'<a href="#" class="navitem{" on" if i == 0 else ""}" '
                   f'{tgt(instruction_for(s, "list item", rng), "list item")}>{icon(ic, 16)}{esc(s)}</a>'
                   for i, (s, ic) in enumerate(pick(rng, [("My files", "folder"), ("Recent", "calendar"),
                                                          ("Starred", "star"), ("Shared with me", "user"),
                                                          ("Trash", "trash")], 4)))
    top = (f'<div class="topbar"><span class="brand"><span class="logo"></span>{esc(rng.choice(BRANDS))} Drive</span>'
           f'<div style="flex:1;max-width:420px;margin-left:2em">'
           f'<input class="input" placeholder="Search files" {tgt(rng.choice(["the search field", "the Search files box", "the file search input"]), "text field")}></div>'  # noqa: E501
           f'<span class="spacer"></span>{icon_button(c, "help")}{icon_button(c, "settings")}</div>')
    body = (f'{top}<div style="display:flex;height:calc(100% - 56px)"><div style="width:200px;padding:.8em;flex:none;'
            f'border-right:1px solid {p["border"]}">{side}</div><div style="flex:1;overflow:hidden">'
            f'<div class="toolbar">{tb}</div><div style="padding:.8em 1.2em">{crumb_html}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:.5em;padding:0 1em">{tiles}</div></div></div>')
    return body, "toolbar"


def _background_app(c: Ctx) -> str:
    """A plain app page behind a dialog (no targets: it is covered by the overlay)."""
    p = palette(c.theme, c.accent)
    rng = c.rng
    rows = "".join(f'<div class="skel" style="width:{rng.randint(40, 95)}%;height:.9em"></div>' for _ in range(18))
    return (f'<div class="topbar"><span class="brand"><span class="logo"></span>{esc(rng.choice(BRANDS))}</span>'
            f'<span class="spacer"></span>{icon_button(c, "bell", target=False)}{icon_button(c, "user", target=False)}'
            f'</div><div style="display:flex;height:100%"><div style="width:220px;border-right:1px solid {p["border"]};'
            f'padding:1em">' + "".join(f'<div class="navitem">{esc(s)}</div>' for s in SETTINGS_SECTIONS[:7])
            + f'</div><div style="flex:1;padding:2em">{rows}</div></div>')


def page_dialog(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    variant = rng.choice(["delete", "unsaved", "permission", "update", "rename", "cookies", "signout"])
    fname = rng.choice(["Q3 report.xlsx", "Holiday photos", "Draft proposal", "Team roster.csv", "Old backups",
                        "Invoice 1043.pdf"])
    dont_ask = rng.random() < 0.4
    body_html = ""
    extra = ""
    if variant == "delete":
        title = f"Delete {fname}?"
        msg = "This item will be permanently deleted. You can't undo this action."
        buttons = [("Cancel", ""), (rng.choice(["Delete", "Delete forever", "Yes, delete"]), "danger")]
    elif variant == "unsaved":
        title = rng.choice(["Save changes before closing?", "You have unsaved changes"])
        msg = f"Your changes to {fname} will be lost if you don't save them."
        buttons = [("Don't save", ""), ("Cancel", ""), ("Save", "primary")]
    elif variant == "permission":
        what = rng.choice(["notifications", "your location", "the camera", "the microphone"])
        title = f"Allow access to {what}?"
        msg = f"{rng.choice(BRANDS)} wants to use {what}. You can change this later in Settings."
        buttons = [(rng.choice(["Block", "Deny", "Don't allow"]), ""), ("Allow", "primary")]
    elif variant == "update":
        title = rng.choice(["Update available", "A new version is ready"])
        msg = f"Version {rng.randint(2, 9)}.{rng.randint(0, 20)} is ready to install. The app will restart."
        buttons = [(rng.choice(["Later", "Remind me later", "Not now"]), ""), (rng.choice(["Install now", "Restart and update", "Update"]), "primary")]  # noqa: E501
    elif variant == "rename":
        title = rng.choice(["Rename file", "Rename item"])
        msg = ""
        extra = field(c, rng.choice(["New name", "Name", "File name"]), value=fname)
        buttons = [("Cancel", ""), (rng.choice(["Rename", "Save", "OK"]), "primary")]
    elif variant == "cookies":
        title = rng.choice(["We value your privacy", "Cookie settings"])
        msg = "We use cookies to improve your experience and to measure traffic. Choose which ones to allow."
        extra = (checkbox(c, "Analytics cookies", checked=rng.random() < 0.5)
                 + checkbox(c, "Marketing cookies"))
        buttons = [(rng.choice(["Reject all", "Only necessary"]), ""), ("Customize", ""), ("Accept all", "primary")]
        dont_ask = False
    else:
        title = "Sign out?"
        msg = "You will need to sign in again to access your account on this device."
        buttons = [("Cancel", ""), (rng.choice(["Sign out", "Log out", "OK"]), "primary")]
    if rng.random() < 0.25 and len(buttons) == 2:
        buttons = [("Cancel", ""), ("OK", "primary")] if variant not in ("delete",) else buttons
    if rng.random() < 0.4:
        buttons = buttons[::-1] if rng.random() < 0.5 else buttons  # some platforms put the primary first
    if dont_ask:
        extra += checkbox(c, rng.choice(["Don't ask me again", "Don't show this again", "Remember my choice"]))
    close_instr = rng.choice(["the close button of the dialog", "the X that closes the dialog", None])
    btns = "".join(button(c, lab, kind=k) for lab, k in buttons)
    width = min(c.w - 40, rng.choice([420, 460, 520]))
    body_html = (f'<div class="card" style="width:{width}px;padding:1.4em 1.6em;'
                 f'box-shadow:0 20px 60px rgba(0,0,0,.35)">'
                 f'<div class="row" style="align-items:flex-start"><h2 style="flex:1">{esc(title)}</h2>'
                 f'{icon_button(c, "close", size=30, instruction=close_instr)}</div>'
                 + (f'<p class="muted">{esc(msg)}</p>' if msg else "") + extra
                 + f'<div class="row" style="justify-content:flex-end;gap:.7em;margin-top:1.2em">{btns}</div></div>')
    return _background_app(c) + f'<div class="overlay">{body_html}</div>', "dialog"


def page_table(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    p = palette(c.theme, c.accent)
    variant = rng.choice(["users", "invoices", "files", "orders"])
    used: set = set()
    n_rows = 6 if c.compact else rng.randint(7, 10)
    if variant == "users":
        title, add = "Team members", rng.choice(["Invite member", "Add user"])
        cols = ["Name", "Email", "Role", "Status"]
        rows = []
        for _ in range(n_rows):
            name = person(rng, used)
            rows.append((name, [name, name.lower().replace(" ", ".") + "@example.com",
                                rng.choice(["Admin", "Editor", "Viewer", "Owner"]),
                                rng.choice(["Active", "Invited", "Suspended"])]))
    elif variant == "invoices":
        title, add = "Invoices", rng.choice(["New invoice", "Create invoice"])
        cols = ["Invoice", "Customer", "Amount", "Due", "Status"]
        rows = []
        start = rng.randint(1000, 9000)
        for k in range(n_rows):
            inv = f"INV-{start + k}"
            rows.append((inv, [inv, person(rng, used), f"${rng.randint(40, 9000)}.{rng.randint(0, 99):02d}",
                               f"{rng.choice(['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun'])} {rng.randint(1, 28)}",
                               rng.choice(["Paid", "Due", "Overdue", "Draft"])]))
    elif variant == "files":
        title, add = "Documents", rng.choice(["Upload", "New file"])
        cols = ["Name", "Owner", "Size", "Modified"]
        names = pick(rng, ["Budget 2024.xlsx", "Brand guide.pdf", "Roadmap.pptx", "Contract draft.docx",
                           "Headshots.zip", "Survey results.csv", "Onboarding.pdf", "Floor plan.png",
                           "Press release.docx", "Minutes March.txt", "Price list.xlsx", "Launch video.mp4"], n_rows)
        rows = [(n, [n, person(rng, used), f"{rng.randint(12, 990)} KB", f"{rng.randint(1, 28)} days ago"])
                for n in names]
    else:
        title, add = "Orders", rng.choice(["New order", "Export"])
        cols = ["Order", "Customer", "Items", "Total", "Status"]
        start = rng.randint(20000, 90000)
        rows = [(f"#{start + 7 * k}", [f"#{start + 7 * k}", person(rng, used), str(rng.randint(1, 9)),
                                       f"${rng.randint(10, 900)}.00", rng.choice(["Shipped", "Pending", "Delivered",
                                                                                  "Cancelled"])])
                for k in range(n_rows)]
    if c.w < 1100:
        cols = cols[:3]
        rows = [(key, vals[:3]) for key, vals in rows]
    action_style = rng.choice(["icons", "text", "more"])
    head = ('<tr><th style="width:36px"></th>' + "".join(f"<th>{esc(x)}</th>" for x in cols)
            + '<th style="text-align:right">Actions</th></tr>')
    body_rows = ""
    marked = set(rng.sample(range(len(rows)), 3))
    for r_i, (key, vals) in enumerate(rows):
        q = quoted(key, rng)
        on = r_i in marked
        cb_instr = rng.choice([f"the checkbox for the row {q}", f"select the row {q}", f"the checkbox in the {q} row"])
        cb = f'<input type="checkbox" class="cb" {tgt(cb_instr, "checkbox") if on else ""}>'
        cells = "".join(f"<td>{esc(v)}</td>" if i else f"<td><b>{esc(v)}</b></td>" for i, v in enumerate(vals))
        if action_style == "icons":
            e = rng.choice([f"the edit icon in the row for {q}", f"edit {q}", f"the pencil button of {q}"])
            d = rng.choice([f"the delete icon in the row for {q}", f"delete {q}", f"the trash button of the {q} row"])
            acts = (icon_button(c, "edit", size=30, instruction=e, target=on)
                    + icon_button(c, "trash", size=30, instruction=d, target=on))
        elif action_style == "text":
            v = rng.choice([f"the View button in the {q} row", f"View for {q}"])
            e = rng.choice([f"the Edit button in the {q} row", f"Edit for {q}"])
            acts = (button(c, "View", small=True, kind="ghost", instruction=v, target=on)
                    + button(c, "Edit", small=True, instruction=e, target=on))
        else:
            m = rng.choice([f"the more options button of the {q} row", f"the row menu for {q}"])
            acts = icon_button(c, "more", size=30, instruction=m, target=on)
        body_rows += (f'<tr><td>{cb}</td>{cells}<td style="text-align:right"><span class="row" '
                      f'style="justify-content:flex-end;gap:2px">{acts}</span></td></tr>')
    pages = rng.randint(3, 12)
    pager = ('<div class="row" style="justify-content:flex-end;margin-top:.8em;gap:.4em">'
             + button(c, "Previous", small=True) + "".join(
                 button(c, str(k), small=True, kind="primary" if k == 1 else "",
                        instruction=rng.choice([f"page {k}", f"the page {k} button", f"go to page {k}"]))
                 for k in range(1, min(pages, 4) + 1))
             + button(c, "Next", small=True) + "</div>")
    search_instr = rng.choice(["the search field", "the table search box", f"the Search {title.lower()} field"])
    filt = dropdown(c, "Status", ["All", "Active", "Archived"], inline_label=True,
                    instruction=rng.choice(["the Status filter dropdown", "the Status dropdown"]))
    header = (f'<div class="row" style="margin-bottom:1em"><h1 style="margin:0">{esc(title)}</h1>'
              f'<span class="spacer"></span>'
              f'{button(c, "Export", icon_name="download") if add != "Export" else ""}'
              f'{button(c, add, kind="primary", icon_name="add")}</div>'
              f'<div class="row" style="margin-bottom:.8em;gap:1em"><div style="width:300px">'
              f'<input class="input" placeholder="Search {esc(title.lower())}" {tgt(search_instr, "text field")}></div>'
              f'<div style="margin-top:.9em">{filt}</div></div>')
    nav = "".join(f'<a href="#" class="navitem{" on" if s == title else ""}">{esc(s)}</a>'
                  for s in ["Dashboard", title, "Reports", "Settings"])
    body = (f'<div class="topbar"><span class="brand"><span class="logo"></span>{esc(rng.choice(BRANDS))}</span>'
            f'<span class="spacer"></span>{icon_button(c, "bell")}{icon_button(c, "help")}</div>'
            f'<div style="display:flex;height:calc(100% - 56px)">'
            + (f'<div style="width:190px;padding:1em;flex:none;border-right:1px solid {p["border"]}">{nav}</div>'
               if c.w >= 1280 else "")
            + f'<div style="flex:1;padding:1.2em 1.6em;overflow:hidden">{header}'
              f'<div class="card" style="padding:.4em .6em"><table>{head}{body_rows}</table></div>{pager}</div></div>')
    return body, "table"


def page_search(c: Ctx) -> tuple[str, str]:
    rng = c.rng
    p = palette(c.theme, c.accent)
    query = rng.choice(QUERIES)
    brand = rng.choice(["Findr", "Seekly", "Lookup", "Quest", "Scout", "Browse"])
    tabs = pick(rng, ["All", "Images", "News", "Videos", "Shopping", "Maps", "Books"], 5)
    if "All" in tabs:
        tabs.remove("All")
    tabs = ["All"] + tabs[:4]
    tab_html = '<div class="tabs" style="border:none">' + "".join(
        f'<button class="tab{" on" if i == 0 else ""}" {tgt(instruction_for(t, "tab", rng), "tab")}>{esc(t)}</button>'
        for i, t in enumerate(tabs)) + "</div>"
    clear = icon_button(c, "close", size=28, instruction=rng.choice(["the clear search button", "the X that clears the search", "the clear icon in the search box"]))  # noqa: E501
    sbox = (f'<div class="with-trailing" style="flex:1;max-width:560px">'
            f'<input class="input" value="{esc(query)}" {tgt(rng.choice(["the search field", "the search box", "the search bar", "the query input"]), "text field")}>'  # noqa: E501
            f'{clear}</div>')
    go = (button(c, "Search", kind="primary") if rng.random() < 0.5 else
          icon_button(c, "search", boxed=True, size=38, instruction=rng.choice([None, "the search button", "the magnifier button next to the search box"])))  # noqa: E501
    top = (f'<div class="topbar" style="height:64px"><span class="brand" style="width:150px">'
           f'<span class="logo"></span>{brand}</span>{sbox}{go}<span class="spacer"></span>'
           f'{icon_button(c, "settings")}{button(c, "Sign in", kind="primary" if rng.random() < 0.5 else "")}</div>')
    cats = pick(rng, ["Articles", "Products", "Forums", "Reviews", "Recipes", "Tutorials", "Local", "Guides"], 4)
    when = ["Any time", "Past 24 hours", "Past week", "Past month", "Past year"]
    filters = (f'<h3>{esc(rng.choice(["Filters", "Refine results"]))}</h3>'
               + '<div class="lab" style="margin-top:.8em">Type</div>'
               + "".join(checkbox(c, x, checked=rng.random() < 0.3) for x in cats)
               + '<div class="lab" style="margin-top:1em">Date</div>'
               + "".join(radio(c, "when", x, checked=i == 0, target=i < 4) for i, x in enumerate(when[:4]))
               + '<div style="margin-top:1em">'
               + dropdown(c, "Sort by", ["Relevance", "Newest", "Most popular", "Price: low to high"]) + "</div>"
               + button(c, rng.choice(["Clear filters", "Reset filters", "Reset"]), kind="ghost", small=True))
    words = query.split()
    results = ""
    titles = set()
    for k in range(5 if c.compact else 7):
        while True:
            t = rng.choice([
                f"The best {query} of {rng.randint(2019, 2025)}", f"{query.capitalize()}: a complete guide",
                f"How to choose {query}", f"{query.capitalize()} - reviews and prices",
                f"{rng.randint(5, 25)} tips for {query}", f"Everything about {words[-1]}",
                f"{query.capitalize()} near you", f"Ask the community: {query}?",
                f"{words[0].capitalize()} basics for beginners", f"Compare {query} side by side"])
            if t not in titles:
                titles.add(t)
                break
        site = rng.choice(SITES)
        snippet = " ".join(rng.choice(["Learn", "compare", "what", "experts", "say", "about", "the", "latest",
                                       "options", "prices", "and", "reviews", "for", words[-1], "today", "with",
                                       "our", "detailed", "guide"]) for _ in range(rng.randint(18, 28)))
        results += (f'<div class="result"><div class="url">{site} &rsaquo; {esc(words[-1])}</div>'
                    f'<div class="title">{link(c, t)}</div><div class="muted small">{esc(snippet.capitalize())}.</div>'
                    f'</div>')
    pager = ('<div class="row" style="gap:1em;margin:.5em 0 2em">'
             + "".join(link(c, str(k), instruction=rng.choice([f"page {k} of the results", f"the link to page {k}"]))
                       for k in range(2, 6))
             + link(c, rng.choice(["Next", "Next page", "More results"])) + "</div>")
    stats = f'<div class="muted small" style="margin:.6em 0 1.2em">About {rng.randint(2, 900)},{rng.randint(100, 999)} results</div>'  # noqa: E501
    side_w = 210 if c.compact else 240
    body = (f'{top}<div style="padding:0 1.2em 0 {150 + 20 + 12}px;border-bottom:1px solid {p["border"]}">'
            f'{tab_html}</div>'
            f'<div style="display:flex;height:calc(100% - 110px)"><div style="width:{side_w}px;flex:none;padding:1.2em;'
            f'overflow:hidden">{filters}</div><div style="flex:1;padding:0 2em;overflow:hidden">{stats}{results}{pager}'
            f'</div></div>')
    return body, "search"


BUILDERS = {"login": page_login, "signup": page_signup, "settings": page_settings, "toolbar": page_toolbar,
            "dialog": page_dialog, "table": page_table, "search": page_search}

# ----------------------------------------------------------------------------------------------
# the box script and the document
# ----------------------------------------------------------------------------------------------

BOX_SCRIPT = r"""
(function () {
  var screen = document.getElementById('screen');
  var sr = screen.getBoundingClientRect();
  function width(font) {
    var s = document.createElement('span');
    s.style.cssText = 'position:absolute;left:0;top:0;visibility:hidden;white-space:nowrap;font:32px ' + font;
    s.textContent = 'mmmmmmmmmmlliiWWQ@#0123456789';
    document.body.appendChild(s);
    var w = s.getBoundingClientRect().width;
    s.remove();
    return w;
  }
  var fam = screen.dataset.font;
  var fontOk = width('"' + fam + '", monospace') !== width('monospace') ||
               width('"' + fam + '", serif') !== width('serif');
  var els = Array.prototype.slice.call(document.querySelectorAll('[data-target]'));
  var targets = els.map(function (el, i) {
    var r = el.getBoundingClientRect();
    var cs = getComputedStyle(el);
    var visible = cs.display !== 'none' && cs.visibility === 'visible' && el.getClientRects().length > 0;
    var clip = [sr.left, sr.top, sr.right, sr.bottom];
    for (var a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      var ac = getComputedStyle(a);
      if (parseFloat(ac.opacity) === 0 || ac.display === 'none') visible = false;
      if (ac.overflowX !== 'visible' || ac.overflowY !== 'visible') {
        var q = a.getBoundingClientRect();
        clip = [Math.max(clip[0], q.left), Math.max(clip[1], q.top),
                Math.min(clip[2], q.right), Math.min(clip[3], q.bottom)];
      }
    }
    if (parseFloat(cs.opacity) === 0) visible = false;
    var inside = r.left >= clip[0] - 0.5 && r.top >= clip[1] - 0.5 &&
                 r.right <= clip[2] + 0.5 && r.bottom <= clip[3] + 0.5;
    return {index: i, instruction: el.dataset.target, role: el.dataset.role, tag: el.tagName.toLowerCase(),
            box: [r.left - sr.left, r.top - sr.top, r.right - sr.left, r.bottom - sr.top],
            visible: visible, inside: inside,
            nested: !!(el.parentElement && el.parentElement.closest('[data-target]'))};
  });
  document.getElementById('boxes').textContent = JSON.stringify({
    screen: [sr.left, sr.top, sr.width, sr.height], inner_width: window.innerWidth, dpr: window.devicePixelRatio,
    font: fam, font_ok: fontOk, targets: targets});
  if (location.hash === '#verify') {
    var st = document.createElement('style');
    st.textContent = '*{box-shadow:none !important;text-shadow:none !important}' +
      '[data-target] *{visibility:hidden !important}' +
      '[data-target]::before,[data-target]::after{visibility:hidden !important}' +
      '[data-target]::placeholder{color:transparent !important}';
    document.head.appendChild(st);
    els.forEach(function (el, i) {
      var c = VERIFY_COLOR(i);
      el.style.setProperty('background', c, 'important');
      el.style.setProperty('border-color', c, 'important');
      el.style.setProperty('color', 'transparent', 'important');
      el.style.setProperty('box-shadow', 'none', 'important');
      el.style.setProperty('outline', 'none', 'important');
      el.style.setProperty('text-decoration-color', 'transparent', 'important');
    });
  }
})();
"""

# the verify colours: 36 fully saturated hues (one channel 0, one 255), which no page palette uses
N_VERIFY = 36


def verify_color(i: int) -> tuple[int, int, int]:
    """Colour of target ``i`` in the verify screenshot."""
    if not 0 <= i < N_VERIFY:
        raise ValueError(f"a page may mark at most {N_VERIFY} targets, got target {i}")
    h = (i * 7 % N_VERIFY) * 360 / N_VERIFY  # neighbours in the DOM get far-apart hues
    sector, frac = divmod(h / 60, 1)
    up, down = round(255 * frac), round(255 * (1 - frac))
    return [(255, up, 0), (down, 255, 0), (0, 255, up), (0, down, 255), (up, 0, 255), (255, 0, down)][int(sector)]


def _verify_js(n: int) -> str:
    table = ",".join(f"'rgb({r},{g},{b})'" for r, g, b in (verify_color(i) for i in range(n)))
    return f"function VERIFY_COLOR(i) {{ return [{table}][i]; }}"


def document(c: Ctx, kind: str) -> str:
    """The whole HTML document of one screen of ``kind``."""
    body, _ = BUILDERS[kind](c)
    n = body.count("data-target=")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{kind}</title>\n'
            f"<style>{base_css(c)}</style></head>\n<body>\n"
            f'<div id="screen" data-font="{esc(c.font)}" data-kind="{kind}" data-theme="{c.theme}">{body}</div>\n'
            f'<pre id="boxes" style="display:none"></pre>\n'
            f"<script>{_verify_js(max(n, 1))}\n{BOX_SCRIPT}</script>\n</body></html>\n")
