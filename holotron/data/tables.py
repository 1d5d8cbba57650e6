"""Data tables on training screens (``generate_sample(tables=True)``, split "train" only): a header row of column
names over 3-10 body rows, zebra-striped or ruled, in the screen's palette, and now and then a pagination row.
Each row starts with an identifier made up by table_cells.py (a file name, a code such as "INV-20417", a person's
name of made-up syllables), then cells of dates, amounts, sizes, e-mails, counts or a status, and carries its controls:
a leading checkbox and / or action buttons, icons or links, the same in every row.

Row controls repeat their labels on every row, so each is recorded with its row (``Element.row``: the
identifier's text) and named through it ("the 'Edit' button in the INV-20417 row": instructions.py's
``row_instruction``); ``row_is_unique`` says when such a name points at one control only. The identifier
itself is a link, a clickable cell (role "list item") or plain text.

Vocabulary: a table's texts never contain an entry of the held-out vocabulary (vocab.heldout_vocab(), given as
``Ctx.avoid``) as whole words, whatever the screen's vocab; the fixed texts (column names, statuses, actions)
are claimed through the label picker too, so they are unique on the screen and, on vocab="train" screens, never
a held-out label. Drawn by the training layouts "app", "web" and "mobile" (``table_section``) at the top of
their content area, on about half of the screens that have room.
"""

from __future__ import annotations

import re

from . import blocks as B
from . import widgets as W
from .canvas import Text, text_height, text_width
from .context import Ctx
from .styles import hsl, mix
from .table_cells import contains_avoided, fixed, fresh

TABLE_SHARE = 0.5  # of the training layouts' content areas with room for a table
TABLE_LAYOUTS = ("app", "web", "mobile")  # the layouts that draw them (a dialog's dimmed base may too)

SELECT_ROW, SELECT_ALL = "Select row", "Select all"  # the row checkboxes' spoken labels
ROW_BUTTONS = ("Edit", "View", "Delete", "Remove", "Open", "Download", "Share", "Archive", "Details", "Preview",
               "Restore", "Resend", "Manage", "Duplicate", "Export", "Print", "Pay", "Assign", "Invite", "Copy")
ROW_LINKS = ("View", "Edit", "Details", "Open", "Manage", "Delete", "Remove", "Download", "Preview")
ROW_ICONS = {"edit": "Edit", "delete": "Delete", "view": "View", "more": W.ICONS["more"],
             "download": W.ICONS["download"], "star": W.ICONS["star"], "close": W.ICONS["close"],
             "settings": W.ICONS["settings"]}
PAGER = ("Previous", "Next")
STATUSES = ("Paid", "Pending", "Overdue", "Draft", "Active", "Inactive", "Shipped", "Cancelled", "Failed",
            "Completed", "In review", "Closed", "Archived", "Approved", "Rejected", "Processing", "Invited",
            "Suspended", "Synced", "Shared", "Private", "On hold", "Refunded", "Expired")
HEADERS = {
    "file": ("Name", "File name", "Document", "Title"), "code": ("Invoice", "Order", "ID", "Reference", "Ticket"),
    "person": ("Name", "Member", "Customer", "Employee", "User"),
    "date": ("Date", "Modified", "Created", "Due date", "Last updated", "Issued"),
    "amount": ("Total", "Price", "Balance", "Cost", "Sum"), "status": ("Status", "Stage", "Progress"),
    "size": ("Size", "File size"), "email": ("E-mail", "Contact", "Address"),
    "owner": ("Owner", "Assignee", "Customer", "Author"), "count": ("Items", "Qty", "Seats", "Views", "Pages"),
}
DATA_COLUMNS = {"file": ("size", "date", "owner", "status"), "code": ("date", "amount", "status", "owner", "count"),
                "person": ("email", "date", "status", "count")}


def _word_pattern(text: str) -> re.Pattern:
    return re.compile(r"(?<![a-z0-9])" + re.escape(text.strip().lower()) + r"(?![a-z0-9])")


def row_is_unique(element, elements: list, texts: list[Text]) -> bool:
    """Whether an instruction naming ``element`` (a control of a table row, ``Element.row`` set) by its label
    and its row's identifier points at it alone: the identifier is visible exactly once on the screen, as a text
    of its own on the control's row (no other text or element label holds it, bar the identifier's own element),
    and no other control of that row has a label holding the control's."""
    row = element.row
    if not row or not row.strip():
        return False
    key, lab = _word_pattern(row), _word_pattern(element.label)
    hits = [t for t in texts if key.search(t.text.lower())]
    if len(hits) != 1 or hits[0].text.strip().lower() != row.strip().lower():
        return False
    own = [o for o in elements if key.search(o.label.lower())]
    if len(own) > 1 or (own and own[0].label.strip().lower() != row.strip().lower()):
        return False
    t = hits[0].box
    if not (t[1] < element.box[3] and element.box[1] < t[3]):  # not on the control's row
        return False
    return not any(o is not element and o.row == row and lab.search(o.label.lower()) for o in elements)


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

def table_section(x: Ctx, x0: int, y: int, x1: int, y1: int, margin: int | None = None) -> int:
    """Maybe a table (with a heading above it now and then) at the top of a training layout's content area
    (x0, y) .. (x1, y1), inside ``margin`` px (default the content columns' own, columns.py); returns the y
    where the content below may start: ``y`` itself, with no draw from the random source, unless the screen
    has tables on (``Ctx.tables``)."""
    if not x.tables or not x.chance(TABLE_SHARE):
        return y
    st = x.st
    m = max(8, round(st.pad * 1.4)) if margin is None else margin
    ax0, ay, ax1, ay1 = x0 + m, y + m, x1 - m, y1 - m
    if ax1 - ax0 < 280 or ay1 - ay < 6 * st.control_h:
        return y
    top = y
    if x.chance(0.4) and ay1 - ay >= 9 * st.control_h:
        below = B.heading(x, ax0, ay, ax1, ay1)
        if below is not None:  # the content below starts under the heading, whether a table fits or not
            ay = top = below + st.gap
    bottom = table(x, ax0, ay, ax1, ay1)
    return top if bottom is None else bottom + st.gap


def _columns(x: Ctx, id_kind: str, n: int) -> list[tuple[str, str, list[str]]]:
    """(kind, header, cells) of the identifier column and its data columns, ``n`` rows of each."""
    ids = [s for s in (fresh(x, id_kind) for _ in range(n)) if s]
    if len(ids) < 3:
        return []
    cols = [(id_kind, (fixed(x, HEADERS[id_kind]) or [""])[0], ids)]
    for kind in x.rng.sample(DATA_COLUMNS[id_kind], x.rng.randint(1, len(DATA_COLUMNS[id_kind]))):
        if kind == "status":
            words = fixed(x, STATUSES, x.rng.randint(2, 4))
            if len(words) < 2:
                continue
            cells = [x.rng.choice(words) for _ in ids]
        else:
            cells = [fresh(x, kind) or "" for _ in ids]
        cols.append((kind, (fixed(x, HEADERS[kind]) or [""])[0], cells))
    return cols


def _controls(x: Ctx) -> tuple[bool, str, list]:
    """(leading checkbox, action kind, actions): the controls of every row; actions are labels (buttons,
    links) or (icon name, label) pairs."""
    lead = x.chance(0.55) and bool(fixed(x, (SELECT_ROW,)))
    kind = x.rng.choices(("buttons", "icons", "links", "none"), (0.35, 0.3, 0.2, 0.15))[0]
    if kind == "none" and not lead:
        kind = "icons"
    if kind == "buttons":
        acts = fixed(x, ROW_BUTTONS, x.rng.randint(1, 3))
    elif kind == "links":
        acts = fixed(x, ROW_LINKS, x.rng.randint(1, 2))
    elif kind == "icons":
        want = x.rng.randint(1, 3)
        acts = []
        for name in x.rng.sample(list(ROW_ICONS), len(ROW_ICONS)):
            if len(acts) < want and not contains_avoided(ROW_ICONS[name], x.avoid) and x.labels.claim(ROW_ICONS[name]):
                acts.append((name, ROW_ICONS[name]))
    else:
        acts = []
    return lead, kind if acts else "none", acts


def _action_width(st, kind: str, acts: list, size: int, ch: int, gap: int) -> int:
    if kind == "buttons":
        ws = [text_width(a, size, st.face) + 2 * max(6, st.pad * 2 // 3) for a in acts]
    elif kind == "links":
        ws = [W.link_size(st, a, size)[0] for a in acts]
    else:
        ws = [ch for _ in acts]
    return sum(ws) + gap * max(0, len(ws) - 1)


def table(x: Ctx, x0: int, y: int, x1: int, y1: int) -> int | None:
    """A table in (x0, y) .. (x1, y1): returns the y below it, or None when none fits (nothing drawn)."""
    st, r = x.st, x.rng
    size = st.small if x.chance(0.3) else st.font_size
    th = text_height(size, st.face)
    ch = max(th + 6, round(st.control_h * r.uniform(0.75, 0.92)))     # the row controls' height
    vpad = max(3, round(st.gap * r.uniform(0.4, 0.9)))
    rh = max(ch, th + 6) + 2 * vpad                                     # a body row
    hh = max(th + 2 * vpad + 4, round(rh * r.uniform(0.8, 1.0)))        # the header row
    pager = x.chance(0.35)
    pager_h = st.control_h + 2 * st.gap if pager else 0
    fit = (y1 - y - hh - pager_h) // rh
    n = min(r.randint(3, 10), fit)
    if n < 3:
        return None
    id_kind = r.choice(("file", "code", "person"))
    cols = _columns(x, id_kind, n)
    if not cols:
        return None
    n = len(cols[0][2])
    lead, kind, acts = _controls(x)
    cpad, gap = max(6, st.pad), max(4, st.gap // 2 + 2)
    box_s = min(22, max(12, round(size * 1.1)))
    widths = [max(text_width(h, size, st.face) + 1 for h in [head, *cells] if h) + 2 * cpad + (4 if k == id_kind else 0)
              for k, head, cells in cols]
    lead_w = box_s + 2 * cpad if lead else 0
    act_w = _action_width(st, kind, acts, size, ch, gap) + 2 * cpad if acts else 0
    while lead_w + sum(widths) + act_w > x1 - x0 and (len(cols) > 1 or len(acts) > 1):
        if len(cols) > 1:
            cols.pop()
            widths.pop()
        else:
            acts.pop()
            act_w = _action_width(st, kind, acts, size, ch, gap) + 2 * cpad
    if lead_w + sum(widths) + act_w > x1 - x0:
        return None
    # spread the room left over the data columns (the identifier's takes a larger share), or end early
    room = x1 - x0 - lead_w - sum(widths) - act_w
    if x.chance(0.75):
        share = [2.0] + [1.0] * (len(widths) - 1)
        widths = [w + int(room * s / sum(share)) for w, s in zip(widths, share)]
    tw = lead_w + sum(widths) + act_w
    return _draw(x, (x0, y, x0 + tw, y + hh + n * rh), cols, widths, lead, lead_w, kind, acts, size, ch, rh, hh, cpad,
                 gap, box_s, pager, y1)


def _badge_colour(p, status: str):
    hue = {"Paid": 130, "Active": 130, "Completed": 130, "Approved": 130, "Shipped": 130, "Synced": 130,
           "Pending": 40, "In review": 40, "Processing": 40, "Invited": 40, "On hold": 40, "Draft": 210,
           "Overdue": 0, "Failed": 0, "Rejected": 0, "Cancelled": 0, "Suspended": 0, "Expired": 0}.get(status)
    if hue is None:
        return mix(p.bg, p.muted, 0.25)
    return mix(p.bg, hsl(hue, 0.6, 0.45), 0.35 if p.dark else 0.2)


def _draw(x: Ctx, box, cols, widths, lead, lead_w, kind, acts, size, ch, rh, hh, cpad, gap, box_s, pager,
          y1) -> int:
    st, c, p = x.st, x.c, x.st.p
    X0, Y0, X1, Y1 = box
    x.table_boxes.append(box)
    zebra, ruled, framed = x.chance(0.5), x.chance(0.7), x.chance(0.6)
    fill = p.surface if x.chance(0.6) else p.bg
    line = mix(fill, p.border, 0.7)
    c.rect(box, fill=fill, outline=p.border if framed else None, width=1, radius=min(8, st.radius(rh)) if framed else 0)
    head = mix(fill, p.bar if not p.dark else p.border, 0.5 if x.chance(0.5) else 0.0)
    c.rect((X0 + 1, Y0 + 1, X1 - 1, Y0 + hh), fill=head)
    c.line([(X0, Y0 + hh), (X1 - 1, Y0 + hh)], p.border, 1)
    bold, hcolor = x.chance(0.6), p.muted if x.chance(0.5) else p.text
    xs = [X0 + lead_w]
    for w in widths:
        xs.append(xs[-1] + w)
    if lead:  # the header's select-all box: an element when its label is free
        top = Y0 + (hh - box_s) // 2
        sq = (X0 + cpad, top, X0 + cpad + box_s, top + box_s)
        if fixed(x, (SELECT_ALL,)):
            W.checkbox(c, st, sq, SELECT_ALL, False, caption=False)
        else:
            c.rect(sq, fill=p.field, outline=p.muted, width=1)
    for k, (kind_k, title, _) in enumerate(cols):
        if title:
            right = kind_k in ("amount", "size", "count")
            c.text_in((xs[k], Y0, xs[k + 1], Y0 + hh), title, size, hcolor, align="right" if right else "left",
                      pad=cpad, bold=bold)
    checked = {i for i in range(len(cols[0][2])) if lead and x.chance(0.2)}
    link_ids, cell_ids = x.chance(0.45), x.chance(0.3)
    underline = x.chance(0.4)
    for i, ident in enumerate(cols[0][2]):
        ry0, ry1 = Y0 + hh + i * rh, Y0 + hh + (i + 1) * rh
        cy = (ry0 + ry1) // 2
        if i in checked:
            c.rect((X0 + 1, ry0, X1 - 1, ry1), fill=p.selected)
        elif zebra and i % 2:
            c.rect((X0 + 1, ry0, X1 - 1, ry1), fill=mix(fill, p.border, 0.18 if p.dark else 0.1))
        if ruled and i < len(cols[0][2]) - 1:
            c.line([(X0 + 1, ry1), (X1 - 2, ry1)], line, 1)
        if lead:
            top = cy - box_s // 2
            with c.row_of(ident):
                W.checkbox(c, st, (X0 + cpad, top, X0 + cpad + box_s, top + box_s), SELECT_ROW, i in checked,
                           caption=False)
        # the identifier: a link, a clickable cell or plain text
        if link_ids:
            W.link(c, st, xs[0] + cpad, cy, ident, size, underline=underline)
        elif cell_ids:
            c.text_in((xs[0], ry0, xs[1], ry1), ident, size, p.text, align="left", pad=cpad, owner=ident)
            c.element(ident, "list item", (xs[0], ry0 + 1, xs[1], ry1 - 1))
        else:
            c.text_in((xs[0], ry0, xs[1], ry1), ident, size, p.text, align="left", pad=cpad, bold=x.chance(0.2))
        for k in range(1, len(cols)):
            kind_k, _, cells = cols[k]
            text = cells[i]
            if not text:
                continue
            if kind_k == "status" and x.chance(0.6):
                bw = text_width(text, size, st.face) + 2 * max(5, cpad // 2)
                bh = min(rh - 4, text_height(size, st.face) + 8)
                b = (xs[k] + cpad - 4, cy - bh // 2, xs[k] + cpad - 4 + bw, cy - bh // 2 + bh)
                c.rect(b, fill=_badge_colour(p, text), radius=bh // 2 if st.corner != "square" else 2)
                c.text_in(b, text, size, p.text)
            else:
                right = kind_k in ("amount", "size", "count")
                c.text_in((xs[k], ry0, xs[k + 1], ry1), text, size, p.muted if kind_k != "status" else p.text,
                          align="right" if right else "left", pad=cpad)
        if acts:
            with c.row_of(ident):
                _row_actions(x, xs[-1] + cpad, X1 - cpad, ry0, ry1, kind, acts, size, ch, gap)
    bottom = Y1
    if pager:
        bottom = _pager(x, X0, Y1 + st.gap, X1, y1) or Y1
    return bottom


def _row_actions(x: Ctx, ax0: int, ax1: int, ry0: int, ry1: int, kind: str, acts: list, size: int, ch: int,
                 gap: int):
    st, c = x.st, x.c
    cy = (ry0 + ry1) // 2
    xx = ax0
    for a in acts:
        if kind == "buttons":
            bw = text_width(a, size, st.face) + 2 * max(6, st.pad * 2 // 3)
            W.button(c, st, (xx, cy - ch // 2, xx + bw, cy - ch // 2 + ch), a, size=size)
            xx += bw + gap
        elif kind == "links":
            lw = W.link_size(st, a, size)[0]
            W.link(c, st, xx, cy, a, size, underline=False)
            xx += lw + gap
        else:
            name, label = a
            W.icon_button(c, st, (xx, cy - ch // 2, xx + ch, cy - ch // 2 + ch), name, color=st.p.muted,
                          boxed=False, label=label)
            xx += ch + gap


def _pager(x: Ctx, x0: int, y: int, x1: int, y1: int) -> int | None:
    """Below a table, right-aligned in x0 .. x1: Previous, page numbers, Next (text buttons), and "Showing 11-20 of
    57" at the left where it fits; returns the y below it, or None when it does not fit (nothing drawn)."""
    st, c, r = x.st, x.c, x.rng
    ch = st.control_h
    if y + ch > y1:
        return None
    pages = [str(k) for k in range(1, r.randint(2, 5) + 1)]
    pages = [s for s in pages if x.labels.claim(s)]
    ends = [s for s in PAGER if not contains_avoided(s, x.avoid) and x.labels.claim(s)]
    labels = [ends[0], *pages, ends[1]] if len(ends) == 2 else pages
    widths = [max(text_width(s, st.font_size, st.face) + st.pad, ch) for s in labels]
    total_w = sum(widths) + 4 * max(0, len(widths) - 1)
    if not labels or total_w > x1 - x0:
        return None
    xx = x1 - total_w
    current = r.choice(pages) if pages else None
    for s, w in zip(labels, widths):
        W.button(c, st, (xx, y, xx + w, y + ch), s, primary=s == current)
        xx += w + 4
    first = r.randint(0, 4) * 10
    note = f"Showing {first + 1}-{first + 10} of {first + r.randint(11, 400)}"
    if text_width(note, st.small, st.face) + 2 * st.gap <= x1 - x0 - total_w and not contains_avoided(note, x.avoid) \
            and x.labels.claim(note):
        c.text_in((x0, y, x1 - total_w - st.gap, y + ch), note, st.small, st.p.muted, align="left")
    return y + ch
