"""Grounding helpers: answer parsing, coordinate spaces, point-in-box scoring, the prompt, drawing."""

import ast
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image, ImageChops

from holotron.grounding import (
    Box,
    Point,
    convert,
    draw_click,
    localization_messages,
    localization_prompt,
    localization_schema,
    parse_click,
    point_in_box,
    score_click,
    to_model,
    to_pixels,
)

# ------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------

PARSE_CASES = [
    ('{"x": 512, "y": 384}', (512, 384)),
    ('{"x":5,"y":6}', (5, 6)),
    ('```json\n{"x": 10, "y": 20}\n```', (10, 20)),
    ('Sure! The button is here: {"x": 1, "y": 2}. Anything else?', (1, 2)),
    ('{"X": 7.5, "Y": 8.25}', (7.5, 8.25)),
    ('{"x": "55", "y": "66"}', (55, 66)),
    ("{'x': 11, 'y': 12}", (11, 12)),
    ('{"action": "click", "point": [33, 44]}', (33, 44)),
    ('{"action": {"type": "click", "x": 70, "y": 80}}', (70, 80)),
    ('[{"action": "move", "x": 1, "y": 1}, {"action": "click", "x": 2, "y": 3}]', (2, 3)),
    ('{"x": -5, "y": 1200}', (-5, 1200)),  # returned as written: scoring decides
    ("click(120, 640)", (120, 640)),
    ("left_click(120.5,640)", (120.5, 640)),
    ("click(x=120, y=640)", (120, 640)),
    ("x=3, y=4", (3, 4)),
    ("X: 3.5, Y: 4.25", (3.5, 4.25)),
    ('"x": 9, "y": 10 (not valid JSON)', (9, 10)),
    ("(7, 8)", (7, 8)),
    ("The answer is [7, 8].", (7, 8)),
    ("click(start_box='(100,200)')", (100, 200)),
    # reasoning is skipped: the answer after </think> wins over numbers inside the block
    ('<think>\nThe button at (100, 200)? No: {"x": 1, "y": 1}\n</think>\n{"x": 300, "y": 400}', (300, 400)),
    ('The generation prompt opened the block (100, 200)\n</think>{"x": 5, "y": 6}', (5, 6)),
    # JSON is preferred over other forms, and the last occurrence of a form wins
    ('first (1, 2) then {"x": 9, "y": 9} then (3, 4)', (9, 9)),
    ('{"x": 1, "y": 1} ... final: {"x": 2, "y": 2}', (2, 2)),
    ("(1, 2) ... no wait, click(3, 4)", (3, 4)),
    ("x=1, y=2 then [5, 6]", (5, 6)),
]

MISSES = [
    "",
    "no coordinates here",
    '{"x": 1}',
    '{"y": 2, "z": 3}',
    '{"x": NaN, "y": 1}',
    '{"x": "left", "y": "top"}',
    "[1, 2, 3, 4]",          # a box, not a point
    "(1, 2, 3)",
    "<think>\nstill thinking about (1, 2) and {\"x\": 3, \"y\": 4}",  # unfinished reasoning: no answer yet
    "{broken json",
    "max: 5, y: 6",          # 'max' is not an x key
]


@pytest.mark.parametrize("text,expected", PARSE_CASES)
def test_parse_click_forms(text, expected):
    p = parse_click(text)
    assert p is not None, text
    assert (p.x, p.y) == pytest.approx(expected)
    assert p.space == "model"


@pytest.mark.parametrize("text", MISSES)
def test_parse_click_misses(text):
    assert parse_click(text) is None


def test_parse_click_non_text_and_space():
    assert parse_click(None) is None
    assert parse_click('{"x": 10, "y": 20}', space="pixel") == Point(10, 20, "pixel")
    with pytest.raises(ValueError, match="unknown coordinate space 'pixels'"):
        parse_click("(1, 2)", space="pixels")


_noise = st.text(alphabet=st.characters(blacklist_characters="{}[]()0123456789.-+=:,'\"xyXY",
                                        blacklist_categories=("Cs",)),
                 max_size=40)


@given(x=st.integers(0, 1000), y=st.integers(0, 1000), before=_noise, after=_noise, fence=st.booleans())
@example(x=0, y=1000, before="", after="", fence=False)
def test_parse_click_json_roundtrip(x, y, before, after, fence):
    body = json.dumps({"x": x, "y": y})
    if fence:
        body = f"```json\n{body}\n```"
    p = parse_click(before + body + after)
    assert p == Point(float(x), float(y), "model")


# ------------------------------------------------------------------------------------------------
# coordinate spaces
# ------------------------------------------------------------------------------------------------

def test_conversion_values():
    assert to_pixels(Point(500, 500), 1920, 1080) == Point(960, 540, "pixel")
    assert to_pixels(Point(0, 1000), 1920, 1080) == Point(0, 1080, "pixel")
    assert to_model(Point(960, 540, "pixel"), 1920, 1080) == Point(500, 500, "model")
    assert convert(Point(250, 750), "normalized") == Point(0.25, 0.75, "normalized")
    assert convert(Point(0.25, 0.75, "normalized"), "pixel", 400, 200) == Point(100, 150, "pixel")
    assert to_model(Point(3, 4)) == Point(3, 4)  # same space: unchanged, no size needed


def test_conversion_needs_size():
    with pytest.raises(ValueError, match="needs the image width"):
        to_pixels(Point(1, 2), None, 100)
    with pytest.raises(ValueError, match="height must be positive"):
        to_pixels(Point(1, 2), 100, 0)


sizes = st.integers(1, 8000)
coords = st.floats(-2000, 3000, allow_nan=False, allow_infinity=False)


@given(x=coords, y=coords, w=sizes, h=sizes)
@example(x=1000.0, y=1000.0, w=1, h=1)
@example(x=333.0, y=667.0, w=1919, h=1079)
def test_model_pixel_roundtrip(x, y, w, h):
    p = Point(x, y, "model")
    back = to_model(to_pixels(p, w, h), w, h)
    assert back.space == "model"
    assert back.x == pytest.approx(x, abs=1e-9) and back.y == pytest.approx(y, abs=1e-9)


@given(x=coords, y=coords, w=sizes, h=sizes)
def test_pixel_model_roundtrip_and_formula(x, y, w, h):
    p = Point(x, y, "pixel")
    m = to_model(p, w, h)
    assert m.x == pytest.approx(1000 * x / w, rel=1e-12, abs=1e-9)  # x = 1000 * px / width
    assert m.y == pytest.approx(1000 * y / h, rel=1e-12, abs=1e-9)
    back = to_pixels(m, w, h)
    assert back.x == pytest.approx(x, abs=1e-9) and back.y == pytest.approx(y, abs=1e-9)


@given(x=coords, y=coords, w=sizes, h=sizes, via=st.sampled_from(["model", "normalized", "pixel"]))
def test_conversion_paths_agree(x, y, w, h, via):
    p = Point(x, y, "normalized")
    direct = convert(p, "pixel", w, h)
    two_step = convert(convert(p, via, w, h), "pixel", w, h)
    assert two_step.x == pytest.approx(direct.x, rel=1e-12, abs=1e-9)
    assert two_step.y == pytest.approx(direct.y, rel=1e-12, abs=1e-9)


# ------------------------------------------------------------------------------------------------
# boxes and scoring
# ------------------------------------------------------------------------------------------------

def test_box_formats():
    assert Box.from_values([10, 20, 30, 40], "xywh") == Box(10, 20, 40, 60)
    assert Box.from_values([10, 20, 30, 40], "xyxy", "normalized") == Box(10, 20, 30, 40, "normalized")
    with pytest.raises(ValueError, match="reversed.*xywh rather than xyxy"):
        Box.from_values([100, 100, 30, 40], "xyxy")
    with pytest.raises(ValueError, match="negative size"):
        Box.from_values([100, 100, -3, 40], "xywh")
    with pytest.raises(ValueError, match="unknown box format 'cxcywh'"):
        Box.from_values([1, 2, 3, 4], "cxcywh")
    with pytest.raises(ValueError, match="4 numbers"):
        Box.from_values([1, 2, 3], "xyxy")


def test_point_in_box_edges_inclusive():
    box = Box(100, 100, 200, 200, "pixel")
    for x, y in [(100, 100), (200, 200), (100, 200), (150, 100), (150, 150)]:
        assert point_in_box(Point(x, y, "pixel"), box), (x, y)
    for x, y in [(99.999, 150), (150, 200.001), (0, 0), (201, 201)]:
        assert not point_in_box(Point(x, y, "pixel"), box), (x, y)
    assert not point_in_box(None, box)


def test_edges_survive_conversion_rounding():
    # 31 px of 1920 becomes 16.1458... in model space and comes back as 30.999999999999996, and 503 px
    # comes back a hair above 503: clicks exactly on the edges must still count
    w, h = 1920, 1080
    box = Box(31, 59, 503, 568, "pixel")
    assert to_pixels(to_model(Point(31, 59, "pixel"), w, h), w, h).x < 31      # the rounding is real
    assert to_pixels(to_model(Point(503, 568, "pixel"), w, h), w, h).x > 503
    for corner in [(31, 59), (503, 568), (31, 568), (503, 59)]:
        m = to_model(Point(*corner, "pixel"), w, h)
        assert point_in_box(m, box, w, h), corner
        assert box.convert("model", w, h).contains(m), corner
    assert not point_in_box(to_model(Point(30.99, 59, "pixel"), w, h), box, w, h)


def test_point_in_box_across_spaces_needs_size():
    with pytest.raises(ValueError, match="needs the image width"):
        point_in_box(Point(500, 500), Box(0, 0, 10, 10, "pixel"))


@given(w=sizes, h=sizes, b=st.lists(st.floats(0, 1), min_size=4, max_size=4),
       t=st.tuples(st.floats(0.01, 0.99), st.floats(0.01, 0.99)),
       space=st.sampled_from(["model", "normalized", "pixel"]))
def test_inside_is_inside_in_every_space(w, h, b, t, space):
    x0, x1 = sorted(b[:2])
    y0, y1 = sorted(b[2:])
    box = Box(x0 * w, y0 * h, x1 * w, y1 * h, "pixel")
    inside = Point(box.x0 + t[0] * (box.x1 - box.x0), box.y0 + t[1] * (box.y1 - box.y0), "pixel")
    outside = Point(box.x1 + 1 + t[0] * w, inside.y, "pixel")
    assert box.convert(space, w, h).contains(convert(inside, space, w, h))
    assert point_in_box(convert(inside, space, w, h), box, w, h)
    assert not point_in_box(convert(outside, space, w, h), box, w, h)


def test_score_click():
    w, h = 2000, 1000
    # the target occupies pixels x 400..600, y 100..300 (xyxy), i.e. model x 200..300, y 100..300
    assert score_click('{"x": 250, "y": 200}', [400, 100, 600, 300], width=w, height=h)
    assert score_click('{"x": 250, "y": 200}', [400, 100, 200, 200], box_format="xywh", width=w, height=h)
    assert score_click('{"x": 250, "y": 200}', [0.2, 0.1, 0.3, 0.3], box_space="normalized")
    assert score_click('{"x": 250, "y": 200}', [200, 100, 300, 300], box_space="model")
    assert score_click("click(200, 300)", [400, 100, 600, 300], width=w, height=h)  # the corner: inclusive
    assert not score_click('{"x": 199, "y": 200}', [400, 100, 600, 300], width=w, height=h)
    assert not score_click("I cannot find it", [400, 100, 600, 300], width=w, height=h)  # unparseable = miss
    assert not score_click(None, [400, 100, 600, 300], width=w, height=h)
    assert score_click(Point(500, 200, "pixel"), Box(400, 100, 600, 300), width=w, height=h)
    assert score_click('{"x": 500, "y": 200}', [400, 100, 600, 300], answer_space="pixel")


# ------------------------------------------------------------------------------------------------
# the localisation prompt
# ------------------------------------------------------------------------------------------------

def test_localization_prompt_format():
    prompt = localization_prompt("the Save button")
    head = ("Localize an element on the GUI image according to the provided target and output a click position.\n"
            " * You must output a valid JSON following the format: ")
    tail = "\n Your target is:\nthe Save button"
    assert prompt.startswith(head) and prompt.endswith(tail)
    schema_text = prompt[len(head):-len(tail)]
    assert ast.literal_eval(schema_text) == localization_schema()  # the dict as the f-string writes it


def test_localization_schema_describes_the_answer():
    schema = localization_schema()
    assert schema["type"] == "object" and schema["required"] == ["x", "y"]
    for axis in "xy":
        prop = schema["properties"][axis]
        assert (prop["type"], prop["minimum"], prop["maximum"]) == ("integer", 0, 1000)
    assert localization_prompt("t", schema='{"x": int, "y": int}').count('{"x": int, "y": int}') == 1
    with pytest.raises(ValueError, match="non-empty"):
        localization_prompt("  ")


def test_localization_messages():
    img = Image.new("RGB", (4, 4))
    msgs = localization_messages("the OK button", img)
    assert msgs[0] == {"role": "system", "content": "/no_think"}
    parts = msgs[1]["content"]
    assert parts[0] == {"type": "image", "image": img}
    assert parts[1] == {"type": "text", "text": localization_prompt("the OK button")}
    thinking = localization_messages("the OK button", thinking=True)
    assert [m["role"] for m in thinking] == ["user"] and thinking[0]["content"][0] == {"type": "image"}


# ------------------------------------------------------------------------------------------------
# drawing
# ------------------------------------------------------------------------------------------------

def test_draw_click_marks_a_copy():
    img = Image.new("RGB", (200, 100), "white")
    before = img.tobytes()
    out = draw_click(img, Point(500, 500), radius=10, line_width=1)  # model space -> pixel (100, 50)
    assert img.tobytes() == before, "the input image must not change"
    assert out.size == img.size and out.mode == "RGB"
    assert out.getpixel((100, 50)) == (255, 0, 0)       # crosshair centre
    assert out.getpixel((110, 50)) == (255, 0, 0)       # circle, right
    assert out.getpixel((100, 40)) == (255, 0, 0)       # circle, top
    assert out.getpixel((104, 56)) == (255, 255, 255)   # inside the circle, off the cross
    assert out.getpixel((5, 5)) == (255, 255, 255)      # far away
    changed = out.size[0] * out.size[1] - ImageChops.difference(out, img).convert("L").histogram()[0]
    assert 30 < changed < 400


def test_draw_click_pixel_point_and_modes():
    gray = Image.new("L", (50, 50), 0)
    out = draw_click(gray, Point(10, 20, "pixel"), color=(0, 255, 0))
    assert out.mode == "RGB" and out.getpixel((10, 20)) == (0, 255, 0) and gray.mode == "L"
    rgba = Image.new("RGBA", (50, 50), (0, 0, 0, 0))
    out = draw_click(rgba, Point(0.5, 0.5, "normalized"))
    assert out.mode == "RGBA" and out.getpixel((25, 25)) == (255, 0, 0, 255)
    assert rgba.getpixel((25, 25)) == (0, 0, 0, 0)


def test_parse_click_nested_and_degenerate_outputs():
    assert parse_click('{"x": 5, "y": 6, "alt": {"x": 1, "y": 2}}') == Point(5, 6)
    assert parse_click('{ I think {"x": 1, "y": 2} }') == Point(1, 2)
    # a runaway generation must not make parsing quadratic
    import time

    t0 = time.perf_counter()
    for junk in ("{" * 20000, "{" * 10000 + "}" * 10000, "[1," * 10000, "x=" * 10000, "(" * 20000 + '{"x": 1, "y": 2}'):
        parse_click(junk)
    assert time.perf_counter() - t0 < 2.0
    assert parse_click("{" * 5000 + '{"x": 3, "y": 4}') == Point(3, 4)
