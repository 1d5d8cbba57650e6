"""`python -m holotron.generate`: end to end in a subprocess on a tiny VL checkpoint, and in-process
(with a scripted token stream where the answer's content matters: --ground, --out, --stop)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_vl import write_tiny_vl_checkpoint

import holotron.generation as gen_mod  # the CLI looks stream up here at each run
from holotron import bundled

cli = importlib.import_module("holotron.generate")  # the command line (the module, not the function)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_vl_checkpoint(tmp_path_factory.mktemp("tiny_vl"), seed=0)


@pytest.fixture(scope="module")
def screenshot(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "shot.png"
    im = Image.new("RGB", (120, 80), (240, 240, 240))
    im.paste((30, 90, 200), (10, 10, 60, 30))
    im.save(path)
    return path


def _run(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "holotron.generate", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(ROOT))


# ----------------------------------------------------------------------------- subprocess, end to end


def test_cli_json_end_to_end(ckpt, screenshot):
    r = _run("--model", ckpt, "--image", screenshot, "--prompt", "What is on the screen?", "--json",
             "--max-new-tokens", "5")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # stdout is exactly one JSON object; logs went to stderr
    cuda = torch.cuda.is_available()  # --device auto: cuda (bf16) when there is a GPU, else cpu (fp32)
    assert out["image_size"] == [120, 80]
    assert (out["device"], out["dtype"]) == (("cuda", "bfloat16") if cuda else ("cpu", "float32"))
    assert 1 <= out["new_tokens"] <= 5 and out["prompt_tokens"] > 16  # at least one tile of image tokens
    assert out["prefill_tokens_per_s"] > 0 and out["peak_memory_bytes"] > 0
    assert "loading" in r.stderr and "prefill:" not in r.stdout


def test_cli_streams_text_and_reports_speed(ckpt, screenshot):
    r = _run("--model", ckpt, "--image", screenshot, "--prompt", "hello", "--max-new-tokens", "6",
             "--temperature", "0.8", "--top-p", "0.9", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert "prefill:" in r.stderr and "decode:" in r.stderr and "tokens/s" in r.stderr and "peak" in r.stderr


@pytest.mark.parametrize("case", ["missing model", "unreadable image", "unknown device", "out without ground"])
def test_cli_errors_are_one_line_without_traceback(ckpt, screenshot, tmp_path, case):
    bad = tmp_path / "not_an_image.png"
    bad.write_text("this is text, not a PNG")
    args, expect = {
        "missing model": (["--model", tmp_path / "nope", "--image", screenshot, "--prompt", "x"], "no such folder"),
        "unreadable image": (["--model", ckpt, "--image", bad, "--prompt", "x"], "not_an_image.png"),
        "unknown device": (["--model", ckpt, "--image", screenshot, "--prompt", "x", "--device", "tpu"],
                           "unknown device"),
        "out without ground": (["--model", ckpt, "--image", screenshot, "--prompt", "x", "--out", tmp_path / "o.png"],
                               "--out draws the click"),
    }[case]
    r = _run(*args)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("holotron.generate: error:")]
    assert len(err) == 1 and expect in err[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o.png").exists()


# ----------------------------------------------------------------------------- in process, scripted answers


def _script(monkeypatch, ckpt, answer: str):
    """Make the model 'say' ``answer`` then end its turn, whatever its random weights would say."""
    from holotron.processor import Processor

    proc = Processor.from_pretrained(ckpt)
    ids = proc.encode(answer) + [proc.token_to_id("<SPECIAL_12>")]
    seen = {}

    def fake_stream(model, input_ids, max_new_tokens, **kw):
        seen.update(kw, input_ids=input_ids, max_new_tokens=max_new_tokens)
        for i in ids[:max_new_tokens]:
            yield torch.tensor([i])

    monkeypatch.setattr(gen_mod, "stream", fake_stream)
    return seen


def test_cli_ground_prints_click_and_draws_it(ckpt, screenshot, tmp_path, monkeypatch, capsys):
    seen = _script(monkeypatch, ckpt, '{"x": 250, "y": 500}')
    out_png = tmp_path / "click.png"
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "the blue box", "--ground",
                   "--out", str(out_png), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(captured.out)
    assert res["click"] == {"x": 250, "y": 500, "x_px": 30.0, "y_px": 40.0}  # 120x80 image
    assert res["stopped_by"] == "eos"
    # the prompt was the localisation format, with the image tokens in it
    from holotron.processor import Processor

    prompt = Processor.from_pretrained(ckpt).decode(seen["input_ids"][0])
    assert "Localize an element on the GUI image" in prompt and "the blue box" in prompt and "<image>" in prompt
    assert seen["pixel_values"].shape[1:] == (3, 32, 32)
    drawn = Image.open(out_png)
    drawn.load()
    assert drawn.size == (120, 80)
    original = Image.open(screenshot).convert("RGB")
    diff = [(x, y) for x in range(120) for y in range(80) if drawn.getpixel((x, y)) != original.getpixel((x, y))]
    assert diff and all(abs(x - 30) <= 12 and abs(y - 40) <= 12 for x, y in diff)  # the marker, around the click
    assert original.getpixel((30, 40)) == (240, 240, 240)  # and the input file was not touched


def test_cli_ground_human_output(ckpt, screenshot, monkeypatch, capsys):
    _script(monkeypatch, ckpt, 'click(x=100, y=900)')
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--ground"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "click: x=100, y=900 (0-1000) = (12, 72) px in the 120x80 image" in captured.out


def test_cli_unparsable_answer_is_reported_not_drawn(ckpt, screenshot, tmp_path, monkeypatch, capsys):
    _script(monkeypatch, ckpt, "I cannot see it")
    out_png = tmp_path / "click.png"
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--ground",
                   "--out", str(out_png), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["click"] is None and not out_png.exists()


def test_cli_an_empty_answer_is_said_not_left_blank(ckpt, screenshot, monkeypatch, capsys):
    _script(monkeypatch, ckpt, "")
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--ground"])
    captured = capsys.readouterr()
    assert rc == 0 and "the answer is empty (the model stopped by eos after" in captured.err
    assert "click: none" in captured.out


def test_cli_stop_string_cuts_the_answer(ckpt, screenshot, monkeypatch, capsys):
    _script(monkeypatch, ckpt, "open the menu STOP and more")
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--stop", "STOP", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["stopped_by"] == "stop string"
    assert res["text"] == "open the menu "


def test_cli_generation_config_defaults_and_limits(ckpt, screenshot, monkeypatch, capsys):
    seen = _script(monkeypatch, ckpt, "ok")
    assert cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--json"]) == 0
    capsys.readouterr()
    assert seen["max_new_tokens"] == 256 and seen["temperature"] == 0.0  # greedy: the file does not sample
    assert set(seen["eos_token_id"]) >= {2, 12}  # generation_config.json's ids
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--top-p", "0.5"])
    assert rc == 1 and "need sampling" in capsys.readouterr().err


def test_cli_prompt_too_long_is_a_clear_error(tmp_path, screenshot, capsys):
    from tiny_vl import tiny_vl, tiny_vl_config

    folder = write_tiny_vl_checkpoint(tmp_path / "short", model=tiny_vl(config=tiny_vl_config(max_sequence_length=40)))
    rc = cli.main(["--model", str(folder), "--image", str(screenshot), "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "the prompt is 97 tokens, at or over the model's limit of 40" in err or "max_length=40" in err


def test_cli_without_arguments_uses_the_bundled_model_or_says_it_is_missing(capsys, monkeypatch):
    if bundled.default_model() is None:
        rc = cli.main([])
        assert rc == 1 and "no bundled model" in capsys.readouterr().err
    else:
        monkeypatch.setattr(gen_mod, "stream", lambda *a, **k: iter([torch.tensor([2])]))
        rc = cli.main(["--json"])
        captured = capsys.readouterr()
        assert rc == 0 and "bundled" in captured.err
        assert json.loads(captured.out)["image"] == str(bundled.example_image())


def test_bundled_model_names_resolve(tmp_path, monkeypatch):
    """A bare name of a model shipped under holotron/models resolves for load and the Processor."""
    import holotron
    from holotron.processor import Processor

    models = tmp_path / "models"
    write_tiny_vl_checkpoint(models / "holotron-tiny-ui", seed=1)
    monkeypatch.setattr(bundled, "MODELS_DIR", models)
    assert bundled.default_model() == str(models / "holotron-tiny-ui")
    assert isinstance(holotron.load("holotron-tiny-ui"), holotron.Holotron)
    assert Processor.from_pretrained("holotron-tiny-ui").image_token_id == 18
    assert bundled.bundled_path("org/holotron-tiny-ui") is None and bundled.bundled_path("../x") is None


# ----------------------------------------------------------------------------- checks before the model loads


def _no_loading(monkeypatch):
    import holotron.weights

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before --out / --device were checked")

    monkeypatch.setattr(holotron.weights, "load", refuse)


def _read_only_folder(tmp_path) -> Path:
    """A folder no file can be created in: chmod 555, or for root (who ignores modes) /sys."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:
        if not Path("/sys").is_dir():
            pytest.skip("running as root without /sys: no read-only folder to test with")
        return Path("/sys")
    return ro


@pytest.mark.parametrize("case", ["missing folder", "read-only folder", "a folder", "not an image name"])
def test_cli_out_is_checked_before_the_model_loads(ckpt, screenshot, tmp_path, monkeypatch, capsys, case):
    _no_loading(monkeypatch)
    (tmp_path / "shots").mkdir()
    out, expect = {
        "missing folder": (tmp_path / "nope" / "click.png", "does not exist"),
        "read-only folder": (None, "cannot write in"),
        "a folder": (tmp_path / "shots", "is a folder"),
        "not an image name": (tmp_path / "click.txt", "use a file name ending in"),
    }[case]
    if out is None:
        out = _read_only_folder(tmp_path) / "click.png"
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--ground", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("holotron.generate: error:")]
    assert rc == 1 and len(lines) == 1, err
    assert f"--out {out}: " in lines[0] and expect in lines[0] and ".click.png." not in err  # no hidden temp name


def test_cli_out_file_honours_the_umask(ckpt, screenshot, tmp_path, monkeypatch, capsys):
    _script(monkeypatch, ckpt, '{"x": 250, "y": 500}')
    old = os.umask(0o027)
    try:
        out_png = tmp_path / "click.png"
        assert cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--ground",
                         "--out", str(out_png)]) == 0
    finally:
        os.umask(old)
    assert (out_png.stat().st_mode & 0o777) == 0o640  # what open() would give, not mkstemp's 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["click.png"]  # no temp file left


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_cli_cuda_without_a_gpu_says_why(ckpt, screenshot, monkeypatch, capsys):
    _no_loading(monkeypatch)
    rc = cli.main(["--model", str(ckpt), "--image", str(screenshot), "--prompt", "x", "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 1 and "CUDA was asked for but torch sees no GPU (torch " in err
    if torch.version.cuda is None:
        assert f"(torch {torch.__version__}, CPU build)" in err


# ----------------------------------------------------------------------------- long prompts, grounding hint


def test_cli_long_prefill_shows_progress_and_gives_the_same_answer(ckpt, screenshot, monkeypatch, capsys):
    args = ["--model", str(ckpt), "--image", str(screenshot), "--prompt", "What is on the screen?", "--json",
            "--max-new-tokens", "4", "--device", "cpu"]
    monkeypatch.setattr(cli, "PREFILL_CHUNK", 10**9)
    assert cli.main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(cli, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(cli, "PREFILL_PROGRESS_DELAY", 0)
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    pieces = json.loads(captured.out)
    assert pieces["prompt_tokens"] > 16 and "prefill" in captured.err and "tok" in captured.err
    assert pieces["text"] == whole["text"] and pieces["new_tokens"] == whole["new_tokens"]


def test_cli_warns_past_the_trained_context(tmp_path, screenshot, monkeypatch, capsys):
    from tiny_vl import tiny_vl, tiny_vl_config

    model = tiny_vl(config=tiny_vl_config(text={"max_position_embeddings": 20}))
    folder = write_tiny_vl_checkpoint(tmp_path / "short", model=model)
    _script(monkeypatch, folder, "ok")
    rc = cli.main(["--model", str(folder), "--image", str(screenshot), "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 0 and "longer than the 20 the model was trained on (max_position_embeddings)" in err


@pytest.mark.parametrize("grounding", [True, False])
def test_cli_says_how_to_ask_a_grounding_model(ckpt, screenshot, tmp_path, monkeypatch, capsys, grounding):
    folder = ckpt
    if grounding:  # what holotron.train writes beside a checkpoint marks it as one of its grounding models
        folder = tmp_path / "trained"
        folder.mkdir()
        for f in Path(ckpt).iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        (folder / "trainer_state.json").write_text("{}")
    _script(monkeypatch, folder, "")
    rc = cli.main(["--model", str(folder), "--image", str(screenshot), "--prompt", "the OK button"])
    err = capsys.readouterr().err
    assert rc == 0 and "the answer is empty" in err
    assert ("Ask it with --ground" in err and "--ground --prompt 'the OK button'" in err) == grounding


def test_cli_the_bundled_model_is_a_grounding_model():
    from holotron.generate import _grounding_model

    assert _grounding_model("holotron-tiny-ui") == (bundled.default_model() is not None)
    assert not _grounding_model("org/some-model")
