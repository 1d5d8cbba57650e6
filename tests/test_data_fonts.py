"""The font faces of the synthetic screens (holotron/data/faces.py, canvas.py, screens.py ``font=``): the default
is every screen as before, byte for byte; "mixed" varies the face from a random source of its own; every face
keeps the screens' invariants (tests/test_data.py's, run again here); a named face is really used; an unknown
name is one clear error; ``python -m holotron.train --fonts`` reaches the training batches."""

from __future__ import annotations

import ast
import functools
import hashlib
import pickle
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import PIL
import pytest
import test_data as D  # tests/test_data.py: its invariant tests, run here with a face (a module: not collected)
from screen_option_checks import train_args

from holotron.data import canvas as canvas_mod
from holotron.data import check_sample, generate_sample
from holotron.data.canvas import Canvas, font, ink, text_height, text_width
from holotron.data.example import MADE_WITH_PILLOW
from holotron.data.faces import AILERON_SHARE, DEFAULT_FACE, FACES, canvas_face, face_path, pick_face

FONTS = Path(canvas_mod.__file__).resolve().parent / "fonts"

# (seed, split, vocab, digest of elements / texts / instruction / answer / settings, digest of the pixels), taken
# with the code before fonts could be chosen (Pillow 13.0.0): with no font the screens must stay exactly these
DEFAULT_SCREENS = [
    (0, "train", "all", "f65f16dbc229651b", "d74ed89cda4fa0f3"),
    (11, "train", "all", "caaa14ffd7cb636a", "149eb8e6cc878d80"),
    (222, "train", "train", "b4b5b8e1421f59c1", "3987b8c4a045e307"),
    (3333, "train", "all", "12d20c3d6273b192", "18b621a68c43ae03"),
    (0, "heldout", "all", "5c0a93fc1fa2d6e5", "c865f9d596d9c3d5"),
    (11, "heldout", "all", "c353b761121be466", "4b45e0b4aa4afc0e"),
    (222, "heldout", "all", "692320223faf667e", "a30607d43e6c4715"),
    (3333, "heldout", "all", "2fe115f9574b06fc", "660861f2c5b7ac5d"),
]


def _text_digest(s) -> str:
    return hashlib.sha256(repr((s.elements, s.texts, s.instruction, s.answer,
                                sorted(s.settings.items()))).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# the default: nothing moves
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, split, vocab, text, pixels", DEFAULT_SCREENS)
def test_default_font_gives_the_recorded_screens(seed, split, vocab, text, pixels):
    for s in (generate_sample(seed, split=split, vocab=vocab), generate_sample(seed, split=split, vocab=vocab,
                                                                                font=None)):
        assert "font" not in s.settings
        assert _text_digest(s) == text
        if PIL.__version__ == MADE_WITH_PILLOW:  # text rendering (hence the pixels) may differ with other builds
            assert hashlib.sha256(s.image.tobytes()).hexdigest()[:16] == pixels


def test_every_measurement_in_the_layouts_passes_the_face():
    """Layout code measures text in the screen's face: every call of the measuring helpers in holotron/data
    (outside canvas.py, which uses its canvas's face) gives the face argument."""
    want = {"text_width": 3, "text_height": 2, "ink": 3, "wrap": 4}
    missing = []
    for path in sorted(FONTS.parent.glob("*.py")):
        if path.name == "canvas.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in want:
                if len(node.args) + len(node.keywords) < want[node.func.id]:
                    missing.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert not missing, missing


# ----------------------------------------------------------------------------------------------
# the faces
# ----------------------------------------------------------------------------------------------

def test_bundled_faces_are_there_small_and_documented():
    readme = (FONTS / "README.md").read_text()
    total = 0
    for face, name in FACES.items():
        if name is None:
            assert face == DEFAULT_FACE and face_path(face) is None
            continue
        path = Path(face_path(face))
        assert path.is_file() and path.parent == FONTS, face
        total += path.stat().st_size
        assert f"`{face}`" in readme and f"`{name}`" in readme, face
        assert font(14, face).getname()[0] != font(14).getname()[0], face
    assert total < 3_000_000
    for lic in ("cabin-copyright", "clear-sans-copyright", "Apache-2.0", "junction-copyright", "karla-copyright",
                "manrope-copyright", "noto-copyright", "oxygen-copyright"):
        assert (FONTS / f"{lic}.txt").is_file() and f"`{lic}.txt`" in readme, lic
    # none of them is a family of the real-browser set
    browser = ("Inter", "Roboto", "Open Sans", "Lato", "Liberation Sans", "DejaVu Sans", "Cantarell", "Carlito",
               "FreeSans", "Liberation Serif")
    assert not {font(14, f).getname()[0] for f in FACES} & set(browser)


def test_a_named_face_is_used():
    words = ("Save changes", "Forgot password?", "Wi-Fi 42", "Remember me")
    aileron = [text_width(w, 14) for w in words] + [text_height(14)]
    for face in FACES:
        widths = [text_width(w, 14, face) for w in words] + [text_height(14, face)]
        assert (widths == aileron) == (face == DEFAULT_FACE), face
    s, ref = generate_sample(5, font="karla"), generate_sample(5)
    assert s.settings["font"] == "karla" and s.image.tobytes() != ref.image.tobytes()
    # each text is drawn with the face's own mask, at the box its ink takes in that face
    c = Canvas(200, 60, (255, 255, 255), face="manrope")
    box = c.text_in((0, 0, 200, 60), "Settings", 16, (0, 0, 0))
    assert c.ops[-1][-1] == "manrope" and box[2] - box[0] == text_width("Settings", 16, "manrope")
    img = np.asarray(c.render().convert("L"))
    expect = 255 - np.asarray(canvas_mod._mask("Settings", 16, "manrope"))
    assert np.array_equal(img[box[1]:box[3], box[0]:box[2]], expect)
    assert ink("Settings", 16, "manrope") != ink("Settings", 16)


def test_aileron_by_name_is_the_default_screen_with_its_name_recorded():
    a, b = generate_sample(9, font="aileron"), generate_sample(9)
    assert a.settings == {**b.settings, "font": "aileron"} and a.image.tobytes() == b.image.tobytes()
    assert (a.elements, a.texts, a.answer) == (b.elements, b.texts, b.answer)


def test_faces_docstring_examples_run():
    import textwrap

    from holotron.data import faces

    code = [line for line in faces.__doc__.splitlines() if line.startswith("    ")]
    assert len(code) == 4
    exec("from holotron.data.faces import *\n" + textwrap.dedent("\n".join(code)), {})  # noqa: S102


def test_unknown_font_is_one_clear_error():
    with pytest.raises(ValueError, match=r"unknown font 'comic'.*mixed, aileron, cabin"):
        generate_sample(0, font="comic")
    with pytest.raises(ValueError, match="unknown font"):
        face_path("comic")


# ----------------------------------------------------------------------------------------------
# "mixed"
# ----------------------------------------------------------------------------------------------

def test_mixed_varies_the_face_from_its_own_random_source():
    faces = [generate_sample(seed, font="mixed", render=False).settings["font"] for seed in range(24)]
    assert len(set(faces)) >= 5 and set(faces) <= set(FACES)
    assert faces == [pick_face("mixed", "train", seed) for seed in range(24)]
    drawn = [pick_face("mixed", split, seed) for split in ("train", "heldout") for seed in range(3000)]
    assert abs(drawn.count(DEFAULT_FACE) / len(drawn) - AILERON_SHARE) < 0.03
    for f in FACES:
        assert f in drawn
    # where mixed draws Aileron, the screen is the default screen of that seed: the face drew from its own stream
    seed = next(k for k in range(100) if pick_face("mixed", "train", k) == DEFAULT_FACE)
    a, b = generate_sample(seed, font="mixed"), generate_sample(seed)
    assert a.image.tobytes() == b.image.tobytes() and (a.elements, a.answer) == (b.elements, b.answer)
    # otherwise the look of the screen (size, theme, layout, sizes) is the seed's own
    other = next(k for k in range(100) if canvas_face(pick_face("mixed", "train", k)) is not None)
    a, b = generate_sample(other, font="mixed", render=False), generate_sample(other, render=False)
    keep = ("layout", "theme", "accent_hue", "corner", "font_size", "density", "width", "height")
    assert [a.settings[k] for k in keep] == [b.settings[k] for k in keep]


@pytest.mark.parametrize("face", sorted(FACES) + ["mixed"])
def test_every_face_keeps_the_screen_invariants(face, monkeypatch):
    """tests/test_data.py's geometry test (elements in the screen, no overlaps, texts inside or clear of each
    element, labels inside their controls, the answer in the target) on screens of every face."""
    monkeypatch.setattr(D, "generate_sample", functools.partial(generate_sample, font=face))
    inner = D.test_elements_valid_and_answer_inside_target.hypothesis.inner_test
    for seed, split, size, layout in ((1, "train", None, None), (2, "heldout", None, None), (3, "train", (390, 844),
                                      "mobile"), (4, "train", (2400, 1000), "app"), (5, "heldout", None, "wizard"),
                                      (6, "train", None, "mosaic"), (7, "train", (300, 300), None)):
        inner(seed=seed, split=split, jitter=0.5, size=size, layout=layout)


def test_mixed_screens_pass_the_geometry_and_pixel_tests_of_test_data(monkeypatch):
    monkeypatch.setattr(D, "generate_sample", functools.partial(generate_sample, font="mixed"))
    D.test_elements_valid_and_answer_inside_target()  # its hypothesis examples, on mixed screens
    D.test_pixels_show_the_elements()
    for seed in range(30, 60):  # check_sample, the generator's own check, again on screens of each split
        check_sample(generate_sample(seed, split="heldout" if seed % 2 else "train", font="mixed", render=False))


@pytest.mark.parametrize("face", sorted(f for f in FACES if f != DEFAULT_FACE))
def test_text_box_is_the_ink_box_in_every_face(face, monkeypatch):
    """tests/test_data.py's check that a text's recorded box holds all its ink and little more, per face."""
    monkeypatch.setattr(canvas_mod, "Canvas", functools.partial(Canvas, face=face))
    for size in (9, 13, 20, 31):
        D.test_text_box_is_the_ink_box(size)


def test_character_targets_read_the_screens_face():
    """The character under a point of a text (holotron/train/targets.py) is read with the advances of the face
    the screen was drawn in (its settings["font"])."""
    from holotron.data.canvas import Text
    from holotron.train import char_class, char_classes_at

    text = "Wi-Fi 42 mmm iii"
    for face in ("karla", "noto-serif", None):
        f = font(64, canvas_face(face))
        box = (100, 50, 100 + int(round(f.getlength(text))), 114)
        sample = NS(texts=[Text(text, box)], elements=[], settings={} if face is None else {"font": face})
        xs = [100 + (f.getlength(text[:i]) + f.getlength(text[:i + 1])) / 2 for i in range(len(text))]
        want = [char_class(c) for c in text]
        assert char_classes_at(sample, np.array(xs), np.full(len(xs), 80.0)).tolist() == want, face
        if face is not None:  # read with Aileron's advances, some characters would be misplaced
            aileron = NS(texts=sample.texts, elements=[], settings={})
            assert char_classes_at(aileron, np.array(xs), np.full(len(xs), 80.0)).tolist() != want, face


# ----------------------------------------------------------------------------------------------
# the training flag
# ----------------------------------------------------------------------------------------------

def test_fonts_flag_reaches_the_screen_options_and_the_workers(tmp_path):
    from holotron.processor import Processor
    from holotron.tokenizer import build_task_tokenizer
    from holotron.train import ScreenBatches, make_config
    from holotron.train.loop import _dataset, screen_options
    from holotron.train.matching import MatchBatches

    assert train_args().fonts == "default" and screen_options(train_args()) == {}
    assert screen_options(train_args("--fonts", "mixed", "--vocab", "train")) == {"font": "mixed", "vocab": "train"}
    with pytest.raises(SystemExit, match="--fonts"):
        train_args("--fonts", "mixed", "--stage", "read")
    with pytest.raises(SystemExit):
        train_args("--fonts", "karla")  # the flag takes default or mixed

    tok = build_task_tokenizer(tmp_path / "tok", vocab_size=600, n=10)
    vision = make_config("micro", Processor.from_pretrained(tok).vocab_size).vision
    seeds = [next(k for k in range(100) if canvas_face(pick_face("mixed", "train", k)) is not None)]
    for stage in ("ground", "match"):
        mixed = _dataset(train_args("--fonts", "mixed", "--stage", stage, "--batch-size", "1"), vision, tok, None)
        plain = _dataset(train_args("--stage", stage, "--batch-size", "1"), vision, tok, None)
        assert isinstance(mixed, MatchBatches if stage == "match" else ScreenBatches)
        worker = pickle.loads(pickle.dumps(mixed))  # what a data worker process receives
        assert worker.options["font"] == "mixed" and "font" not in plain.options
        worker.seeds = plain.seeds = seeds
        a, b = worker[0], plain[0]
        assert not torch_equal(a["pixel_values"], b["pixel_values"]), stage


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())
