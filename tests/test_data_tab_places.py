"""Tabs in a column on the training screens (holotron/data/tab_places.py, screens.py ``tab_places=``): off (the
default) is every screen and every training batch as before, byte for byte (the digests recorded before icon
places existed, tests/test_data_icon_places.py); the held-out split and the eval sets never draw tab columns; on,
the app and web training screens draw columns of tabs on either side in each look, keep the generator's invariants
and answer tab targets inside their box; ``python -m holotron.train --tab-places`` is checked and a micro run with
it trains."""

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
from test_data_icon_places import BEFORE_BATCHES, BEFORE_MATCH, BEFORE_SCREENS, BEFORE_STREAM, BEFORE_TOKENIZER
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (chunked scan on the CPU, one thread)

from holotron.data import check_sample, generate_sample
from holotron.data.example import MADE_WITH_PILLOW
from holotron.data.tab_places import LOOKS
from holotron.grounding import parse_click, to_pixels


@pytest.mark.parametrize("seed, split, vocab, font, tables, text, pixels", BEFORE_SCREENS)
def test_tab_places_off_gives_the_recorded_screens(seed, split, vocab, font, tables, text, pixels):
    kw = dict(split=split, vocab=vocab, font=font, **({"tables": True} if tables else {}))
    s = generate_sample(seed, tab_places=False, **kw)
    assert "tab_places" not in s.settings
    assert text_digest(s) == text
    if PIL.__version__ == MADE_WITH_PILLOW:  # text rendering (hence the pixels) may differ with other builds
        assert hashlib.sha256(s.image.tobytes()).hexdigest()[:16] == pixels


def test_tab_places_off_gives_the_recorded_stream_and_batches(word_tok):
    h = hashlib.sha256()
    for seed in range(400):
        h.update(text_digest(generate_sample(seed, render=False, tab_places=False,
                                             **({"tables": True} if seed % 4 == 0 else {}))).encode())
    assert h.hexdigest()[:16] == BEFORE_STREAM
    check_recorded_batches(word_tok, BEFORE_TOKENIZER, MADE_WITH_PILLOW, BEFORE_BATCHES, BEFORE_MATCH)


def test_heldout_split_and_eval_sets_refuse_tab_places():
    from holotron.eval import synthetic_examples

    with pytest.raises(ValueError, match="tab_places=True draws tab columns on training screens only"):
        generate_sample(3, split="heldout", tab_places=True)
    for split in ("heldout", "train"):
        with pytest.raises(ValueError, match="the eval sets never draw tab columns"):
            next(synthetic_examples(1, split=split, tab_places=True))


def _tab_columns(s):
    """Columns of at least two tabs with one x span, one under another."""
    by_x = {}
    for e in s.elements:
        if e.role == "tab":
            by_x.setdefault((e.box[0], e.box[2]), []).append(e)
    return [col for col in by_x.values() if len(col) >= 2 and len({e.box[1] for e in col}) == len(col)]


@pytest.fixture(scope="module")
def on_screens():
    return [generate_sample(seed, tab_places=True, render=False, jitter=0.5 * (seed % 2), vocab="train",
                            **({"font": "mixed"} if seed % 5 == 0 else {}),
                            **({"tables": True} if seed % 3 == 0 else {}),
                            **({"icon_places": True} if seed % 4 == 0 else {}))
            for seed in range(120)]


def test_tab_places_on_draws_columns_of_tabs_on_both_sides_in_each_look(on_screens):
    drawn = [s for s in on_screens if s.settings["tab_places"].get("columns")
             and s.settings["layout"] != "dialog"]  # (a dialog's base screen has no elements)
    assert len(drawn) >= 10, len(drawn)
    assert {s.settings["layout"] for s in drawn} == {"app", "web"}
    sides, looks, seen = set(), set(), 0
    for s in drawn:
        cols = _tab_columns(s)
        if not cols:  # an open menu leaves only its items clickable
            continue
        seen += 1
        assert len(cols[0]) == s.settings["tab_places"]["columns"][0][1]
        sides.add("left" if cols[0][0].box[0] < s.size[0] / 2 else "right")
        looks |= {look for _, _, look in s.settings["tab_places"]["columns"]}
    assert seen >= 0.75 * len(drawn), (seen, len(drawn))
    assert sides == {"left", "right"} and looks == set(LOOKS)
    # off, no column of tabs anywhere on those screens
    assert not any(_tab_columns(generate_sample(s.seed, vocab="train", render=False)) for s in drawn)


def test_tab_places_on_keeps_the_invariants_and_answers_tabs_inside_their_box(on_screens):
    for s in on_screens:
        check_sample(s)  # every element inside, none overlapping, labels unique, the answer in the target
    tabs = [generate_sample(seed, tab_places=True, roles=("tab",), jitter=0.8, render=False) for seed in range(80)]
    assert sum(bool(_tab_columns(s)) and any(s.target in col for col in _tab_columns(s)) for s in tabs) >= 10
    for s in tabs:
        check_sample(s)
        e, (w, h) = s.target, s.size
        px = to_pixels(parse_click(s.answer), w, h)
        assert e.box[0] <= px.x <= e.box[2] - 1 and e.box[1] <= px.y <= e.box[3] - 1, (s.answer, e)


def test_tab_places_flag_is_checked_and_reaches_the_screen_options():
    from holotron.train.loop import screen_options

    assert train_args().tab_places == "off" and train_args("--tab-places", "on").tab_places == "on"
    check_train_split_flag("--tab-places")
    assert screen_options(train_args("--tab-places", "on", "--icon-places", "on")) == {"icon_places": True,
                                                                                   "tab_places": True}


def test_a_micro_ground_run_with_tab_places_trains(tmp_path, word_tok, monkeypatch):
    """The whole ground step (questions, pointer heads, matching, in-box answer) on screens with tab places on."""
    state, made = micro_ground_run(tmp_path, word_tok, monkeypatch, "--tab-places", "on")
    assert state["step"] == 2 and state["args"]["tab_places"] == "on"
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in state["log"])
    assert len(made) == 8 and all(s.settings.get("tab_places") is not None for s in made)
