"""Grounding evaluation (holotron.eval): the Wilson interval, scoring and per-role counts on a scripted
model, the ScreenSpot-style reader in every box format and space, annotated PNGs, the command line."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (chunked scan on the CPU, one thread)

import holotron.eval as ev
from holotron.eval import DataError, Example, evaluate, read_screenspot, wilson_interval
from holotron.grounding import Box

# ---------------------------------------------------------------------------------------- Wilson

def _score_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson interval from its definition: the p whose score test |k/n - p| <= z sqrt(p(1-p)/n)
    accepts, found by bisection on each side of k/n (independent of the closed form)."""
    phat = k / n

    def inside(p):
        return abs(phat - p) <= z * math.sqrt(p * (1 - p) / n)

    def edge(lo, hi):  # inside(lo) != inside(hi)
        for _ in range(200):
            mid = (lo + hi) / 2
            if inside(mid) == inside(lo):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else edge(0.0, phat)
    upper = 1.0 if k == n else edge(phat, 1.0)
    return lower, upper


@pytest.mark.parametrize("k,n", [(0, 10), (1, 10), (8, 10), (10, 10), (450, 500), (999, 1000), (3, 7)])
def test_wilson_interval_inverts_the_score_test(k, n):
    lo, hi = wilson_interval(k, n)
    rlo, rhi = _score_interval(k, n)
    assert lo == pytest.approx(rlo, abs=1e-9) and hi == pytest.approx(rhi, abs=1e-9)
    assert lo <= k / n <= hi


def test_wilson_interval_known_values_and_edges():
    lo, hi = wilson_interval(8, 10)   # a textbook example: 0.490 - 0.943
    assert (round(lo, 3), round(hi, 3)) == (0.49, 0.943)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(6, 5)


# ---------------------------------------------------------------------------------------- scripted model

def _examples(tmp_path=None):
    """Six 200x100 screens: target boxes, roles and the answer a scripted model gives to each."""
    img = Image.new("RGB", (200, 100), (240, 240, 240))
    box = Box(50, 20, 100, 60)  # pixels: x 250-500, y 200-600 in model space
    rows = [  # (role, answer, hit?)
        ("button", '{"x": 375, "y": 400}', True),             # the centre
        ("button", '{"x": 250, "y": 200}', True),             # the top-left corner: edges count
        ("button", '{"x": 600, "y": 400}', False),            # right of the box
        ("icon", "I cannot see it", False),                   # unparseable: a miss
        ("icon", '<think>hmm</think>{"x": 300, "y": 500}', True),
        ("link", '{"x": 375}', False),                        # no y: unparseable
    ]
    examples = [Example(img, f"target {i}", box, role, f"e{i}") for i, (role, _, _) in enumerate(rows)]
    answers = {f"target {i}": a for i, (_, a, _) in enumerate(rows)}
    return examples, answers, [h for *_, h in rows]


@pytest.fixture
def scripted(monkeypatch):
    calls = []

    def install(answers):
        def answer_batch(model, processor, images, instructions, **kw):
            calls.append(len(instructions))
            return [answers[t] for t in instructions]
        monkeypatch.setattr(ev, "answer_batch", answer_batch)
        return calls
    return install


def test_scores_per_role_counts_and_intervals_on_a_scripted_model(scripted):
    examples, answers, hits = _examples()
    calls = scripted(answers)
    rep = evaluate(None, None, examples, batch_size=4, progress=False)
    assert calls == [4, 2]                                         # batched
    assert [p.hit for p in rep.predictions] == hits
    assert (rep.n, rep.hits, rep.unparseable) == (6, 3, 2)
    assert rep.ci == wilson_interval(3, 6)
    roles = rep.per_role()
    assert {r: (v["hits"], v["n"]) for r, v in roles.items()} == {"button": (2, 3), "icon": (1, 2), "link": (0, 1)}
    assert roles["button"]["ci95"] == list(wilson_interval(2, 3))
    js = rep.to_json()
    assert js["accuracy"] == 0.5 and js["per_role"]["icon"]["accuracy"] == 0.5
    assert "button" in rep.table() and "3/6 = 50.0%" in rep.table()


def test_family_and_vocab_breakdowns_add_up_to_the_totals(scripted):
    examples, answers, hits = _examples()
    for k, ex in enumerate(examples):
        ex.family, ex.vocab = ("phone", "laptop", "ultrawide")[k % 3], ("heldout", "train")[k % 2]
    scripted(answers)
    rep = evaluate(None, None, examples, batch_size=4, progress=False)
    assert {f: (v["hits"], v["n"]) for f, v in rep.per_family().items()} == \
        {"phone": (hits[0] + hits[3], 2), "laptop": (hits[1] + hits[4], 2), "ultrawide": (hits[2] + hits[5], 2)}
    assert {f: (v["hits"], v["n"]) for f, v in rep.per_vocab().items()} == \
        {"heldout": (hits[0] + hits[2] + hits[4], 3), "train": (hits[1] + hits[3] + hits[5], 3)}
    js = rep.to_json()
    for key in ("per_role", "per_family", "per_vocab"):
        assert sum(v["n"] for v in js[key].values()) == rep.n and sum(v["hits"] for v in js[key].values()) == rep.hits
        for v in js[key].values():
            assert v["ci95"] == list(wilson_interval(v["hits"], v["n"])) and v["accuracy"] == v["hits"] / v["n"]
    table = rep.table()
    assert "size family" in table and "ultrawide" in table and "vocab" in table and "heldout" in table
    assert {p.to_json()["family"] for p in rep.predictions} == {"phone", "laptop", "ultrawide"}


def test_synthetic_examples_carry_the_size_family_and_the_vocab():
    from holotron.data import generate_sample, heldout_vocab

    exs = list(ev.synthetic_examples(6, split="heldout", seed0=ev.DEV_SEED0))
    for k, ex in enumerate(exs):
        s = generate_sample(ev.DEV_SEED0 + k, split="heldout", render=False)
        assert ex.id == f"heldout-{ev.DEV_SEED0 + k}" and ex.family == s.settings["size_family"]
        assert ex.vocab == ("heldout" if s.target.label.lower() in heldout_vocab() else "train")
        assert ex.family in ("tablet-portrait", "phone-landscape", "ultrawide")
    held = list(ev.synthetic_examples(3, split="train", seed0=ev.DEV_SEED0, vocab="heldout"))
    assert [ex.vocab for ex in held] == ["heldout"] * 3 and held[0].id == f"train-heldout-{ev.DEV_SEED0}"
    assert ev.DEV_SEED0 == 3 * 10**9 and ev.EVAL_SEED0 == 10**9


def test_out_writes_annotated_hits_and_misses_and_every_prediction(scripted, tmp_path):
    examples, answers, _ = _examples()
    scripted(answers)
    evaluate(None, None, examples, batch_size=3, progress=False, out_dir=tmp_path / "o", n_draw=4)
    pngs = sorted(p.name for p in (tmp_path / "o").glob("*.png"))
    assert pngs == ["0000-hit-button.png", "0001-hit-button.png", "0002-miss-button.png", "0003-miss-icon.png"]
    with Image.open(tmp_path / "o" / pngs[2]) as im:
        assert im.format == "PNG" and im.width == 200 and im.height > 100      # caption strip on top
        strip = (im.height - 100)
        assert im.getpixel((75, strip + 20)) == (0, 200, 0)                      # the box's top edge, green
        assert im.getpixel((120, strip + 40))[0] > 200 and im.getpixel((120, strip + 40))[1] < 60  # the click, red
    lines = [json.loads(x) for x in (tmp_path / "o" / "predictions.jsonl").read_text().splitlines()]
    assert [x["hit"] for x in lines] == [True, True, False, False, True, False] and lines[3]["click"] is None


# ---------------------------------------------------------------------------------------- ScreenSpot-style data

def _screenspot(tmp_path, fmt, space):
    """One 400x200 image in a subfolder and the box x 100-200, y 50-150 (pixels) written as asked."""
    (tmp_path / "imgs").mkdir(exist_ok=True)
    Image.new("RGB", (400, 200), (255, 255, 255)).save(tmp_path / "imgs" / "a.png")
    x0, y0, x1, y1 = 100, 50, 200, 150
    scale = {"pixel": (1, 1), "normalized": (1 / 400, 1 / 200), "model": (1000 / 400, 1000 / 200)}[space]
    sx, sy = scale
    box = [x0 * sx, y0 * sy, x1 * sx, y1 * sy] if fmt == "xyxy" else [x0 * sx, y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy]
    data = [{"image": "imgs/a.png", "instruction": "the thing", "bbox": box, "data_type": "icon"}]
    path = tmp_path / f"{fmt}-{space}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("fmt", ["xyxy", "xywh"])
@pytest.mark.parametrize("space", ["pixel", "normalized", "model"])
def test_screenspot_reader_every_box_format_and_space_gives_the_same_pixel_box(tmp_path, fmt, space):
    path = _screenspot(tmp_path, fmt, space)
    (ex,) = read_screenspot(path, box_format=fmt, box_space=space)
    assert ex.image == str(tmp_path / "imgs" / "a.png") and ex.role == "icon" and ex.instruction == "the thing"
    px = ex.box.convert("pixel", 400, 200)
    assert [round(v, 6) for v in (px.x0, px.y0, px.x1, px.y1)] == [100, 50, 200, 150]


def test_screenspot_reader_errors_name_the_entry(tmp_path):
    path = _screenspot(tmp_path, "xyxy", "pixel")
    data = json.loads(path.read_text())
    for bad, msg in [({**data[0], "image": "imgs/missing.png"}, "entry 1: image .*missing.png not found"),
                     ({k: v for k, v in data[0].items() if k != "bbox"}, "entry 1: missing bbox"),
                     ({**data[0], "bbox": [200, 50, 100, 150]}, "entry 1: bbox .*reversed"),
                     ({**data[0], "bbox": [100, 50, 200, 250]}, "entry 1: bbox .*outside the 400x200 image")]:
        path.write_text(json.dumps(data + [bad]))
        with pytest.raises(DataError, match=msg):
            read_screenspot(path, box_format="xyxy", box_space="pixel")
    with pytest.raises(DataError, match="box-format"):
        read_screenspot(path, box_format="cxcywh", box_space="pixel")
    # pixel boxes declared normalized or model-space: out of 0-1 / 0-1000, named with the fix
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"entry 0: bbox .*outside 0-1 .*--box-space normalized.*is --box-space right"):
        read_screenspot(path, box_format="xyxy", box_space="normalized")
    path.write_text(json.dumps([{**data[0], "bbox": [100, 50, 2000, 150]}]))
    with pytest.raises(DataError, match="outside 0-1000"):
        read_screenspot(path, box_format="xyxy", box_space="model")
    # boxes on the edge, or a pixel or two past it (annotation rounding), are kept
    path.write_text(json.dumps([{**data[0], "bbox": [0, 0, 400, 200]}, {**data[0], "bbox": [-1, 10, 402, 201]}]))
    assert len(read_screenspot(path, box_format="xyxy", box_space="pixel")) == 2


# ---------------------------------------------------------------------------------------- the command line

def test_cli_on_screenspot_data_with_json_and_out(micro_ckpt, tmp_path, scripted, capsys):
    path = _screenspot(tmp_path, "xywh", "pixel")
    data = json.loads(path.read_text())
    data = data + [{**data[0], "instruction": "elsewhere", "data_type": "text"}]
    path.write_text(json.dumps(data))
    scripted({"the thing": '{"x": 375, "y": 500}', "elsewhere": '{"x": 900, "y": 900}'})
    rc = ev.main(["--model", str(micro_ckpt), "--data", str(path), "--box-format", "xywh", "--box-space", "pixel",
                  "--json", "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["n"], res["hits"], res["box_format"]) == (2, 1, "xywh")
    assert res["per_role"] == {"icon": {"n": 1, "hits": 1, "accuracy": 1.0, "ci95": list(wilson_interval(1, 1))},
                               "text": {"n": 1, "hits": 0, "accuracy": 0.0, "ci95": list(wilson_interval(0, 1))}}
    assert sorted(p.name for p in (tmp_path / "o").glob("*.png")) == ["0000-hit-icon.png", "0001-miss-text.png"]


def test_cli_runs_the_real_model_on_synthetic_screens(micro_ckpt, capsys):
    assert ev.main(["--model", str(micro_ckpt), "--n", "3", "--batch-size", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "point-in-box accuracy:" in out and "3 examples in" in out


def test_cli_refuses_data_without_an_explicit_box_format_and_space(micro_ckpt, tmp_path, capsys):
    path = _screenspot(tmp_path, "xyxy", "pixel")
    assert ev.main(["--model", str(micro_ckpt), "--data", str(path), "--box-format", "xyxy"]) == 1
    assert "--box-space" in capsys.readouterr().err
    assert ev.main(["--model", str(micro_ckpt), "--box-space", "pixel"]) == 1
    assert "give the file too" in capsys.readouterr().err


@pytest.mark.parametrize("flags,named", [(["--ladder"], "--ladder"), (["--vocab", "heldout"], "--vocab"),
                                         (["--dev"], "--dev"), (["--split", "train"], "--split")])
def test_cli_synthetic_flags_with_data_are_one_line_usage_errors(micro_ckpt, tmp_path, monkeypatch, capsys, flags,
                                                                 named):
    _no_loading(monkeypatch)
    path = _screenspot(tmp_path, "xyxy", "pixel")
    rc = ev.main(["--model", str(micro_ckpt), "--data", str(path), "--box-format", "xyxy", "--box-space", "pixel",
                  *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"holotron.eval: error: {named} "), err
    assert "--data" in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("flags,named", [(["--ladder", "--vocab", "train"], "--vocab"),
                                         (["--ladder", "--split", "heldout"], "--split"),
                                         (["--dev", "--seed0", "5"], "--dev")])
def test_cli_flags_that_contradict_each_other(micro_ckpt, monkeypatch, capsys, flags, named):
    _no_loading(monkeypatch)
    assert ev.main(["--model", str(micro_ckpt), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"holotron.eval: error: {named} "), err


def test_progress_is_a_tqdm_line_on_stderr(scripted, capsys):
    examples, answers, _ = _examples()
    scripted(answers)
    evaluate(None, None, examples, batch_size=4, progress=True)
    err = capsys.readouterr().err
    assert "eval" in err and "6/6" in err


def _no_loading(monkeypatch):
    import holotron.weights

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before --out / --device were checked")

    monkeypatch.setattr(holotron.weights, "load", refuse)


@pytest.mark.parametrize("case", ["a file", "inside a file", "read-only"])
def test_cli_out_is_checked_before_the_model_loads(micro_ckpt, tmp_path, monkeypatch, capsys, case):
    import os
    from pathlib import Path

    _no_loading(monkeypatch)
    (tmp_path / "f.txt").write_text("x")
    if case == "read-only":
        if os.geteuid() == 0:  # root ignores file modes: use a file system that refuses new files
            if not Path("/sys").is_dir():
                pytest.skip("running as root without /sys")
            out, expect = Path("/sys") / "holotron-eval", "cannot write in"
        else:
            (tmp_path / "ro").mkdir(mode=0o555)
            out, expect = tmp_path / "ro" / "o", "cannot write in"
    else:
        out, expect = {"a file": (tmp_path / "f.txt", "is a file"),
                       "inside a file": (tmp_path / "f.txt" / "o", "is a file, not a folder")}[case]
    assert ev.main(["--model", str(micro_ckpt), "--n", "2", "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"holotron.eval: error: --out {out}: ") and expect in err[0], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_cli_cuda_without_a_gpu_says_why(micro_ckpt, monkeypatch, capsys):
    _no_loading(monkeypatch)
    assert ev.main(["--model", str(micro_ckpt), "--n", "2", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "CUDA was asked for but torch sees no GPU (torch " in err
    if torch.version.cuda is None:
        assert f"(torch {torch.__version__}, CPU build)" in err
