"""Tables on the training screens (holotron/data/tables.py, table_cells.py, screens.py ``tables=``): off (the default)
is every screen and every training batch as before, byte for byte; the held-out split and the eval sets never draw
one; on, a fair share of the training screens shows a table whose rows' controls are asked through the row's
identifier, with the answer in the control, and no made-up text holds a word of the held-out vocabulary; the
ambiguity rule takes a row control named through a unique row and refuses the truly ambiguous; the training batches
ask row questions and point them at the control and its row's identifier; ``python -m holotron.train --tables``
is checked and a micro run with tables trains."""

from __future__ import annotations

import hashlib
import random
import re

import PIL
import pytest
import torch
from screen_option_checks import (
    check_recorded_batches,
    check_train_split_flag,
    micro_ground_run,
    text_digest,
    train_args,
)
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (chunked scan on the CPU, one thread)

from holotron.data import generate_sample, heldout_vocab
from holotron.data import screens as screens_mod
from holotron.data.canvas import Canvas, inside, overlaps
from holotron.data.context import Ctx
from holotron.data.example import MADE_WITH_PILLOW
from holotron.data.instructions import ROW_CHECKBOX_TEMPLATES, ROW_TEMPLATES
from holotron.data.labels import LabelPicker
from holotron.data.styles import make_style
from holotron.data.table_cells import contains_avoided
from holotron.data.tables import TABLE_LAYOUTS, row_is_unique, table
from holotron.grounding import parse_click, to_pixels

# ----------------------------------------------------------------------------------------------
# off: nothing moves
# ----------------------------------------------------------------------------------------------

# (seed, split, vocab, font, digest of elements / texts / instruction / answer / settings, digest of the pixels),
# taken with the code before tables existed (Pillow 13.0.0): with tables off the screens must stay exactly these
BEFORE_SCREENS = [
    (1, "train", "all", None, "acee9555682ea440", "41f4d2efcf9a7023"),
    (7, "train", "train", None, "e343c9624bf15173", "ce10ed10700c6c22"),
    (42, "train", "all", None, "dd694e17d676decf", "1320c159e8714da0"),
    (555, "train", "train", None, "92fd34affe5352e8", "f971077a6fe83dfc"),
    (9001, "train", "all", "mixed", "e97b9d246e09d378", "38d9c1ff28b9a574"),
    (3, "heldout", "all", None, "711ebe15af7fed61", "98a253d81d6df3ba"),
    (77, "heldout", "heldout", None, "94a5bcceef80e2f2", "55f3cbb8589ebff8"),
    (4040, "heldout", "all", None, "69f15d0cc9aae39a", "3094dd074e753de0"),
]
# the ground batches (ScreenBatches, micro vision, the word tokenizer of 40 screens: digest ade00c687372b786) and a
# matching batch, taken with the same code
BEFORE_TOKENIZER = "ade00c687372b786"
BEFORE_BATCHES = [
    (dict(queries=3, chars=True, match=True, pointer_element=True, options={"vocab": "train"}),
     ["42afc564ccc21b8e", "4dd09f6846887ca1"]),
    (dict(queries=2, short_followups=True, options={}), ["d832cd13f44ffab7", "83598d040964cebf"]),
    (dict(queries=4, pointer_core=True, options={"vocab": "train", "font": "mixed"}),
     ["4ac3d6354156f331", "b3474de2fba3aad3"]),
]
BEFORE_MATCH = "651b753164628ea8"




@pytest.mark.parametrize("seed, split, vocab, font, text, pixels", BEFORE_SCREENS)
def test_tables_off_gives_the_recorded_screens(seed, split, vocab, font, text, pixels):
    for s in (generate_sample(seed, split=split, vocab=vocab, font=font),
              generate_sample(seed, split=split, vocab=vocab, font=font, tables=False)):
        assert "tables" not in s.settings and all(e.row is None for e in s.elements)
        assert text_digest(s) == text
        if PIL.__version__ == MADE_WITH_PILLOW:  # text rendering (hence the pixels) may differ with other builds
            assert hashlib.sha256(s.image.tobytes()).hexdigest()[:16] == pixels


def test_tables_off_gives_the_recorded_batches(word_tok):
    check_recorded_batches(word_tok, BEFORE_TOKENIZER, MADE_WITH_PILLOW, BEFORE_BATCHES, BEFORE_MATCH)


# ----------------------------------------------------------------------------------------------
# never on the held-out split or the eval sets
# ----------------------------------------------------------------------------------------------

def test_heldout_split_and_eval_sets_refuse_tables():
    from holotron.eval import synthetic_examples

    with pytest.raises(ValueError, match="tables=True draws tables on training screens only"):
        generate_sample(3, split="heldout", tables=True)
    for split in ("heldout", "train"):
        with pytest.raises(ValueError, match="the eval sets never draw tables"):
            next(synthetic_examples(1, split=split, tables=True))
    # what they do draw has no table: no row's control anywhere
    for ex in synthetic_examples(6, split="train", seed0=100, tables=False):
        assert ex.instruction
    for seed in range(20):
        s = generate_sample(seed, split="heldout", render=False)
        assert "tables" not in s.settings and all(e.row is None for e in s.elements)


# ----------------------------------------------------------------------------------------------
# on: tables, row targets, the vocabulary
# ----------------------------------------------------------------------------------------------

def _table_screens(n: int, **kw):
    return [generate_sample(seed, tables=True, render=False, **kw) for seed in range(n)]


def test_tables_on_a_fair_share_of_training_screens_with_row_targets_inside_their_control():
    screens = _table_screens(150, vocab="train")
    with_table = [s for s in screens if s.settings["tables"]]
    with_rows = [s for s in screens if any(e.row for e in s.elements)]
    assert 0.3 <= len(with_table) / len(screens) <= 0.7, len(with_table)
    assert len(with_rows) >= 0.2 * len(screens), len(with_rows)
    assert {s.settings["layout"] for s in with_rows} >= set(TABLE_LAYOUTS)
    row_targets = [s for s in screens if s.target.row is not None]
    assert len(row_targets) >= 0.25 * len(with_rows), len(row_targets)
    roles, templates = set(), set()
    for s in row_targets:
        e, (w, h) = s.target, s.size
        roles.add(e.role)
        assert e.row in s.instruction, (s.instruction, e)  # named through its row's identifier
        if e.role != "checkbox":
            assert e.label in s.instruction, (s.instruction, e)
        px = to_pixels(parse_click(s.answer), w, h)
        assert e.box[0] <= px.x <= e.box[2] - 1 and e.box[1] <= px.y <= e.box[3] - 1, (s.answer, e)
        assert row_is_unique(e, s.elements, s.texts)
        assert sum(t.text == e.row for t in s.texts) == 1  # the identifier, visible once, on the control's row
        fits = [t for t in ROW_TEMPLATES + ROW_CHECKBOX_TEMPLATES
                if re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", re.escape(t)), s.instruction)]
        templates.add(max(fits, key=lambda t: len(re.sub(r"\{\w+\}", "", t))))  # the most specific that fits
    assert roles >= {"checkbox", "button", "icon", "link"} and len(templates) >= 6, (roles, templates)
    # the identifiers are targets too, with the ordinary templates
    idents = [s for s in screens if s.target.row is None and s.target.label in {e.row for e in s.elements}]
    assert idents and {s.target.role for s in idents} <= {"link", "list item"}


def test_table_screens_keep_the_generator_invariants():
    """test_data.py's geometry checks on table screens (labels repeat on rows there, so those checks change)."""
    for seed in range(60):
        kw = {"font": "mixed"} if seed % 3 == 0 else {}
        s = generate_sample(seed, tables=True, jitter=0.5 * (seed % 2), size=("phone", "laptop", "square")[seed % 3],
                            render=False, **kw)
        screens_mod.check_sample(s)  # the generator's own check, rows' rule included
        w, h = s.size
        for k, e in enumerate(s.elements):
            assert inside(e.box, (0, 0, w, h))
            assert not any(overlaps(e.box, f.box) for f in s.elements[k + 1:]), e
        for t in s.texts:
            assert all(inside(t.box, e.box) or not overlaps(t.box, e.box) for e in s.elements), t
        keys = [(e.label.lower(), e.row) for e in s.elements]
        assert len(keys) == len(set(keys))
        for b in s.settings["tables"]:
            assert inside(b, (0, 0, w, h))


def test_no_made_up_text_holds_a_heldout_word():
    held = heldout_vocab()
    assert contains_avoided("OK-2041", held) and contains_avoided("save_notes.pdf", held)
    assert not contains_avoided("okra_notes.pdf", held) and not contains_avoided("INV-20417", held)
    assert contains_avoided("Kai Port", frozenset({"port"})) and not contains_avoided("Portia", frozenset({"port"}))
    # every text a table draws, on its own canvas, whatever the screen's vocab
    texts = []
    for seed in range(40):
        rng = random.Random(seed)
        st = make_style(rng, "light", 200.0, "small", 13, 1.0)
        c = Canvas(1200, 900, st.p.bg)
        x = Ctx(c, st, rng, LabelPicker(rng), tables=True, avoid=held)
        if table(x, 10, 10, 1190, 890) is not None:
            assert c.texts
            texts += [t.text for t in c.texts]
    assert len(texts) > 400
    assert not [t for t in texts if contains_avoided(t, held)]
    # on vocab="train" screens: no held-out label anywhere, no held-out word in any row's identifier
    for s in _table_screens(80, vocab="train"):
        assert not [e.label for e in s.elements if e.label.lower() in held]
        assert not [t.text for t in s.texts if t.text.lower() in held]
        assert not [e.row for e in s.elements if e.row and contains_avoided(e.row, held)]


# ----------------------------------------------------------------------------------------------
# the ambiguity rule
# ----------------------------------------------------------------------------------------------

def _rows(idents, hide: int | None = None, twice: bool = False):
    """A hand-made table: each row its identifier's text and an "Edit" button (``twice``: two in the first row);
    ``hide``: that row's identifier covered by a later layer."""
    c = Canvas(600, 400, (255, 255, 255))
    for k, ident in enumerate(idents):
        y = 20 + 40 * k
        c.text_in((10, y, 200, y + 30), ident, 13, (0, 0, 0), align="left")
        with c.row_of(ident):
            c.text_in((300, y, 360, y + 30), "Edit", 13, (0, 0, 0), owner="Edit")
            c.element("Edit", "button", (300, y, 360, y + 30))
            if twice and k == 0:
                c.text_in((370, y, 440, y + 30), "Edit", 13, (0, 0, 0), owner="Edit")
                c.element("Edit", "button", (370, y, 440, y + 30))
    if hide is not None:
        c.cover((0, 20 + 40 * hide, 250, 50 + 40 * hide))
    return c


def test_ambiguity_takes_a_control_named_by_a_unique_row_and_refuses_the_truly_ambiguous():
    amb = screens_mod._ambiguous
    c = _rows(["INV-1001", "INV-1002", "INV-1003"])
    els = c.elements
    assert len([e for e in els if e.label == "Edit"]) == 3
    assert not any(amb(e, els, c) for e in els)                # each Edit is unique through its row
    c = _rows(["INV-1001", "INV-1001", "INV-1003"])            # two rows with one identifier
    assert [amb(e, c.elements, c) for e in c.elements] == [True, True, False]
    c = _rows(["INV-1001", "INV-1002", "INV-1003"], hide=1)    # the second row's identifier is covered
    assert [amb(e, c.elements, c) for e in c.elements] == [False, True, False]
    c = _rows(["INV-1001", "INV-1002"], twice=True)            # two Edit buttons in one row
    assert [amb(e, c.elements, c) for e in c.elements] == [True, True, False]
    c = _rows(["INV-1001", "INV-1002"])                        # the identifier also in a text outside the rows
    c.text_in((10, 300, 400, 330), "Reminder sent for INV-1002", 13, (0, 0, 0), align="left")
    assert [amb(e, c.elements, c) for e in c.elements] == [False, True]
    c = _rows(["INV-1001", "INV-1002"])                        # the identifier held by another element's label
    c.element("Open INV-1002", "link", (450, 300, 590, 330))
    assert [amb(e, c.elements, c) for e in c.elements[:2]] == [False, True]
    # a control outside any row keeps the old rule: a label that repeats is ambiguous
    c = Canvas(600, 400, (255, 255, 255))
    for k in range(2):
        c.text_in((10, 40 * k, 80, 40 * k + 30), "Edit", 13, (0, 0, 0), owner="Edit")
        c.element("Edit", "button", (10, 40 * k, 80, 40 * k + 30))
    assert all(amb(e, c.elements, c) for e in c.elements)


# ----------------------------------------------------------------------------------------------
# the training batches
# ----------------------------------------------------------------------------------------------

def test_row_questions_in_batches_point_at_the_control_and_its_rows_identifier(word_tok):
    from holotron.data.instructions import ROLE_NAMES
    from holotron.processor import Processor
    from holotron.train import ScreenBatches, image_token_targets, make_config
    from holotron.train.element_tokens import _label_texts, element_core_tokens, element_tokens, token_cell
    from holotron.train.matching import match_targets
    from holotron.train.questions import extra_targets
    from holotron.train.targets import pointer_tokens

    p = Processor.from_pretrained(word_tok)
    vision = make_config("tiny-ui", p.vocab_size).vision
    asked = 0
    for seed in (5, 6, 8, 12):
        s = generate_sample(seed, tables=True, vocab="train")
        rows = [e for e in s.elements if e.row]
        assert rows, seed
        got = extra_targets(s, 40, random.Random(seed), boxes=True)
        by_box = {e.box: e for e in s.elements}
        for instruction, answer, box in got:
            e = by_box[box]
            if e.row:
                asked += 1
                assert e.row in instruction and row_is_unique(e, s.elements, s.texts)
        # a row control's label texts: its own text inside its box and its row's identifier, not the other rows'
        e = next(e for e in rows if e.role == "button") if any(e.role == "button" for e in rows) else rows[0]
        texts = _label_texts(s, e)
        assert [t.text for t in texts if t.text == e.row] == [e.row]
        assert all(t.text == e.row or inside(t.box, e.box) for t in texts)
        assert [t for t in _label_texts(s, e, row=False) if t.text == e.row] == []
        cls, pos = image_token_targets(s, vision)
        cell = token_cell(s.size, vision)
        toks = set(element_tokens(s, e, pos, cls, cell).tolist())
        ident = next(t for t in s.texts if t.text == e.row)
        near = set(element_tokens(s, type(e)(e.row, "text", ident.box), pos, cls, cell).tolist())
        assert near <= toks  # the identifier's tokens are the question's too
        other = next(o for o in rows if o.row != e.row and o.label == e.label)  # the same control, another row
        core = set(element_core_tokens(s, e, pos, cls).tolist())
        assert not set(element_core_tokens(s, other, pos, cls).tolist()) & core
        assert set(pointer_tokens(ident.box, s.size, pos, cls).tolist()) <= core
        # matching: no query for a row's control (its label is on every row); its box carries its centre
        t = match_targets(s, p.encode, pos, cls, ROLE_NAMES, cell)
        words = {tuple(p.encode(o.label.strip())) for o in rows}
        assert not [q for q in t["queries"] if tuple(q[0]) in words]
        w, h = s.size
        centre = torch.tensor([(e.box[0] + e.box[2]) / (2 * w), (e.box[1] + e.box[3]) / (2 * h), 1.0])
        on = pointer_tokens(e.box, s.size, pos, cls)
        assert any(torch.allclose(t["centres"][k], centre) for k in on.tolist()), e
    assert asked >= 8
    data = ScreenBatches(word_tok, vision, 2, seed=1, queries=8, short_followups=True, match=True, chars=True,
                         pointer_element=True, seeds=[5, 6], options={"tables": True, "vocab": "train"})
    batch = data[0]
    assert batch["pointer_queries"].shape[0] == 16 and len(batch["pointer_targets"]) > 16


# ----------------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------------

def test_tables_flag_is_checked():
    assert train_args().tables == "off" and train_args("--tables", "on").tables == "on"
    check_train_split_flag("--tables")
    with pytest.raises(SystemExit, match="none of the --layouts draws tables"):
        train_args("--tables", "on", "--layouts", "form", "mosaic")
    assert train_args("--tables", "on", "--layouts", "form", "web").layouts == ["form", "web"]


def test_tables_flag_reaches_the_screen_options():
    from holotron.train.loop import screen_options

    assert screen_options(train_args()) == {}
    assert screen_options(train_args("--tables", "on", "--vocab", "train")) == {"vocab": "train", "tables": True}


def test_a_micro_ground_run_with_tables_trains(tmp_path, word_tok, monkeypatch):
    """The whole ground step (questions, pointer heads, matching, in-box answer) on table screens: screens 0-7
    of the stream, three of which have a table with row controls."""
    state, made = micro_ground_run(tmp_path, word_tok, monkeypatch, "--tables", "on")
    assert state["step"] == 2 and state["args"]["tables"] == "on"
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in state["log"])
    assert len(made) == 8 and all(s.settings.get("tables") is not None for s in made)
    assert sum(any(e.row for e in s.elements) for s in made) >= 2
