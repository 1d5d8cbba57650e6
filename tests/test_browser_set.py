"""The committed real-browser grounding set (scripts/browser_set/set/, made by scripts/browser_set/generate.py with
headless Chromium) reads through holotron.eval as the eval CLI reads it, and is as large and as varied as its
README says. Needs no Chromium: it only reads the committed JSON and PNG headers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from holotron.eval import read_screenspot

SET = Path(__file__).resolve().parents[1] / "scripts" / "browser_set" / "set"
DATA = SET / "browser_set.json"
KINDS = {"login", "signup", "settings", "toolbar", "dialog", "table", "search"}


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    return json.loads(DATA.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def examples():
    return read_screenspot(DATA, box_format="xyxy", box_space="pixel")


@pytest.fixture(scope="module")
def sizes(raw) -> dict[str, tuple[int, int]]:
    out = {}
    for it in raw:
        if it["image"] not in out:
            with Image.open(SET / it["image"]) as im:  # the header only
                out[it["image"]] = im.size
    return out


def test_the_eval_reader_takes_the_file_with_its_extra_keys(raw, examples):
    assert len(examples) == len(raw)
    for it, ex in zip(raw, examples):
        assert Path(ex.image) == SET / it["image"]
        assert ex.instruction == it["instruction"] and ex.role == it["role"] and ex.id == it["id"]
        assert (ex.box.x0, ex.box.y0, ex.box.x1, ex.box.y1) == tuple(it["bbox"]) and ex.box.space == "pixel"


def test_size(raw):
    assert len({it["image"] for it in raw}) >= 100
    assert len(raw) >= 250
    assert len({it["id"] for it in raw}) == len(raw)
    per_screen = Counter(it["image"] for it in raw)
    assert min(per_screen.values()) >= 2 and max(per_screen.values()) <= 4


def test_images_exist_and_boxes_lie_inside_them(raw, sizes):
    for it in raw:
        path = SET / it["image"]
        assert path.is_file() and not Path(it["image"]).is_absolute(), it["image"]
        w, h = sizes[it["image"]]
        assert it["viewport"] == f"{w}x{h}", it["id"]
        x0, y0, x1, y1 = it["bbox"]
        assert 0 <= x0 and 0 <= y0 and x1 <= w and y1 <= h, (it["id"], it["bbox"], (w, h))
        assert x1 - x0 >= 6 and y1 - y0 >= 6, (it["id"], it["bbox"])


def test_instructions_are_unique_within_a_screen(raw):
    seen = Counter((it["image"], it["instruction"]) for it in raw)
    assert max(seen.values()) == 1
    assert all(it["instruction"].strip() for it in raw)


def test_kinds_themes_fonts_viewports_and_roles_vary(raw):
    screens = {it["image"]: it for it in raw}.values()
    kinds = Counter(s["kind"] for s in screens)
    assert set(kinds) == KINDS and min(kinds.values()) >= 10
    themes = Counter(s["theme"] for s in screens)
    assert set(themes) == {"light", "dark"} and min(themes.values()) >= 40
    assert len({s["font"] for s in screens}) >= 6
    assert len({s["viewport"] for s in screens}) >= 5 and "915x412" in {s["viewport"] for s in screens}
    assert {(s["kind"], s["theme"]) for s in screens} == {(k, t) for k in KINDS for t in ("light", "dark")}
    roles = Counter(it["role"] for it in raw)
    assert {"button", "icon", "link", "text field", "checkbox", "radio", "dropdown", "switch"} <= set(roles)
