"""Icons in varied places on the training screens (holotron/data/icon_places.py, screens.py ``icon_places=``): off
(the default) is every screen and every training batch as before, byte for byte; the held-out split and the eval
sets never move icons; on, the training screens put the window controls at both ends of the title bar in varied
orders, draw vertical icon strips and dialogs' close icons in both corners, keep the generator's invariants and
answer icon targets inside their box; ``python -m holotron.train --icon-places`` is checked and a micro run with it
trains."""

from __future__ import annotations

import hashlib

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

from holotron.data import check_sample, generate_sample
from holotron.data.example import MADE_WITH_PILLOW
from holotron.grounding import parse_click, to_pixels

# ----------------------------------------------------------------------------------------------
# off: nothing moves
# ----------------------------------------------------------------------------------------------

# (seed, split, vocab, font, tables, digest of elements / texts / instruction / answer / settings, digest of the
# pixels), taken with the code before icon places existed (Pillow 13.0.0): with the option off they must stay these
BEFORE_SCREENS = [
    (1, "train", "all", None, False, "acee9555682ea440", "41f4d2efcf9a7023"),      # dialog
    (7, "train", "train", None, False, "e343c9624bf15173", "ce10ed10700c6c22"),    # mobile
    (23, "train", "all", None, False, "2dd6519002a6152a", "9980a6159860c856"),     # app
    (42, "train", "all", None, False, "dd694e17d676decf", "1320c159e8714da0"),     # app
    (131, "train", "train", None, False, "5c7176a7eb82c2ba", "0f63b503e33af877"),  # app
    (9001, "train", "all", "mixed", False, "e97b9d246e09d378", "38d9c1ff28b9a574"),  # web, mixed faces
    (5, "train", "train", None, True, "dd17ff499610a35b", "1626d81bdb5034b9"),     # app, tables on
    (12, "train", "all", None, True, "de99ca23be4450db", "64b91c4f33746e27"),      # mobile, tables on
    (3, "heldout", "all", None, False, "711ebe15af7fed61", "98a253d81d6df3ba"),    # wizard
    (77, "heldout", "heldout", None, False, "94a5bcceef80e2f2", "55f3cbb8589ebff8"),  # panels
]
# the text digests of screens 0-399 (render=False, every fourth with tables on), chained, before icon places
BEFORE_STREAM = "40fa417137c01571"
# the ground batches (ScreenBatches, micro vision, the word tokenizer of 40 screens: digest ade00c687372b786) and a
# matching batch, taken with the same code
BEFORE_TOKENIZER = "ade00c687372b786"
BEFORE_BATCHES = [
    (dict(queries=3, chars=True, match=True, pointer_element=True, options={"vocab": "train"}),
     ["42afc564ccc21b8e", "4dd09f6846887ca1"]),
    (dict(queries=2, short_followups=True, options={"tables": True, "vocab": "train"}),
     ["c46e7378f161e729", "db206bcc55a730ff"]),
    (dict(queries=4, pointer_core=True, options={"vocab": "train", "font": "mixed"}),
     ["4ac3d6354156f331", "b3474de2fba3aad3"]),
]
BEFORE_MATCH = "651b753164628ea8"
WINDOW = ("Close", "Minimize", "Maximize")




@pytest.mark.parametrize("seed, split, vocab, font, tables, text, pixels", BEFORE_SCREENS)
def test_icon_places_off_gives_the_recorded_screens(seed, split, vocab, font, tables, text, pixels):
    kw = dict(split=split, vocab=vocab, font=font, **({"tables": True} if tables else {}))
    for s in (generate_sample(seed, **kw), generate_sample(seed, icon_places=False, **kw)):
        assert "icon_places" not in s.settings
        assert text_digest(s) == text
        if PIL.__version__ == MADE_WITH_PILLOW:  # text rendering (hence the pixels) may differ with other builds
            assert hashlib.sha256(s.image.tobytes()).hexdigest()[:16] == pixels


def test_icon_places_off_gives_the_recorded_stream():
    h = hashlib.sha256()
    for seed in range(400):
        h.update(text_digest(generate_sample(seed, render=False, **({"tables": True} if seed % 4 == 0 else {})))
                 .encode())
    assert h.hexdigest()[:16] == BEFORE_STREAM


def test_icon_places_off_gives_the_recorded_batches(word_tok):
    check_recorded_batches(word_tok, BEFORE_TOKENIZER, MADE_WITH_PILLOW, BEFORE_BATCHES, BEFORE_MATCH)


# ----------------------------------------------------------------------------------------------
# never on the held-out split or the eval sets
# ----------------------------------------------------------------------------------------------

def test_heldout_split_and_eval_sets_refuse_icon_places():
    from holotron.eval import synthetic_examples

    with pytest.raises(ValueError, match="icon_places=True moves icons on training screens only"):
        generate_sample(3, split="heldout", icon_places=True)
    for split in ("heldout", "train"):
        with pytest.raises(ValueError, match="the eval sets never move icons"):
            next(synthetic_examples(1, split=split, icon_places=True))


# ----------------------------------------------------------------------------------------------
# on: the places
# ----------------------------------------------------------------------------------------------

def _window_controls(s):
    """The title bar's window controls (elements labelled Close / Minimize / Maximize in the top 12% of the screen),
    left to right."""
    return sorted((e for e in s.elements if e.label in WINDOW and e.role == "icon" and e.box[3] <= 0.12 * s.size[1]),
                  key=lambda e: e.box[0])


def _vertical_strips(s):
    """Columns of at least three icons with one x span, one under another."""
    by_x = {}
    for e in s.elements:
        if e.role == "icon":
            by_x.setdefault((e.box[0], e.box[2]), []).append(e)
    return [col for col in by_x.values() if len(col) >= 3 and len({e.box[1] for e in col}) == len(col)]


@pytest.fixture(scope="module")
def on_screens():
    return [generate_sample(seed, icon_places=True, render=False, jitter=0.5 * (seed % 2), vocab="train",
                            **({"font": "mixed"} if seed % 5 == 0 else {}),
                            **({"tables": True} if seed % 3 == 0 else {}))
            for seed in range(80)]


def test_icon_places_on_moves_the_window_controls_to_both_ends_in_varied_orders(on_screens):
    sides, orders = set(), set()
    for s in on_screens:
        controls = _window_controls(s)
        if not controls:
            continue
        mid = (controls[0].box[0] + controls[-1].box[2]) / 2
        sides.add("left" if mid < s.size[0] / 2 else "right")
        assert sides and s.settings["icon_places"]["window"] in sides
        orders.add(tuple(e.label for e in controls))
    assert sides == {"left", "right"}, sides
    assert len(orders) >= 4, orders  # shuffled (and close alone) as well as the looks' own orders


def test_icon_places_on_draws_vertical_icon_strips_and_moves_dialogs_close(on_screens):
    strips = [s for s in on_screens if s.settings["icon_places"].get("strips")
              and s.settings["layout"] != "dialog"]  # (a dialog's base screen has no elements)
    assert len(strips) >= 5, len(strips)
    assert {s.settings["layout"] for s in strips} >= {"app", "web"}
    sides = set()
    for s in strips:
        cols = _vertical_strips(s)
        assert cols, (s.seed, s.settings)
        sides.add("left" if cols[0][0].box[0] < s.size[0] / 2 else "right")
    assert sides == {"left", "right"}
    corners = {s.settings["icon_places"].get("dialog close") for s in on_screens} - {None}
    assert corners == {"left", "right"}
    # off, no vertical strip of icons anywhere
    assert not any(_vertical_strips(generate_sample(s.seed, vocab="train", render=False)) for s in strips)


def test_icon_places_on_keeps_the_invariants_and_answers_icons_inside_their_box(on_screens):
    for s in on_screens:
        check_sample(s)  # every element inside, none overlapping, labels unique, the answer in the target
    icons = [generate_sample(seed, icon_places=True, roles=("icon",), jitter=0.8, render=False) for seed in range(80)]
    assert {e.label for s in icons for e in [s.target]} & {"Close", "Close dialog"}
    for s in icons:
        check_sample(s)
        e, (w, h) = s.target, s.size
        px = to_pixels(parse_click(s.answer), w, h)
        assert e.box[0] <= px.x <= e.box[2] - 1 and e.box[1] <= px.y <= e.box[3] - 1, (s.answer, e)


# ----------------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------------

def test_icon_places_flag_is_checked_and_reaches_the_screen_options():
    from holotron.train.loop import screen_options

    assert train_args().icon_places == "off" and train_args("--icon-places", "on").icon_places == "on"
    check_train_split_flag("--icon-places")
    assert screen_options(train_args()) == {}
    assert screen_options(train_args("--icon-places", "on", "--tables", "on")) == {"tables": True, "icon_places": True}


def test_a_micro_ground_run_with_icon_places_trains(tmp_path, word_tok, monkeypatch):
    """The whole ground step (questions, pointer heads, matching, in-box answer) on screens with icon places on."""
    state, made = micro_ground_run(tmp_path, word_tok, monkeypatch, "--icon-places", "on")
    assert state["step"] == 2 and state["args"]["icon_places"] == "on"
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in state["log"])
    assert len(made) == 8 and all(s.settings.get("icon_places") is not None for s in made)
    assert any(s.settings["icon_places"] for s in made)
