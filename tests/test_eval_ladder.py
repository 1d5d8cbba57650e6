"""The evaluation ladder and the dev seeds (holotron.eval): ``--ladder`` runs training looks, held-out looks and
the held-out vocabulary on one model and reports the three, ``--dev`` draws from DEV_SEED0, never the reported
seeds."""

from __future__ import annotations

import json

import pytest
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (chunked scan on the CPU, one thread)

import holotron.eval as ev

RUNGS = {"train-look": ("train", "all"), "heldout-look": ("heldout", "all"), "heldout-vocab": ("train", "heldout")}


@pytest.fixture
def centre_clicks(monkeypatch):
    """Every answer clicks the screen's centre (no generation: fast)."""
    seen = []

    def answer_batch(model, processor, images, instructions, **kw):
        seen.extend(instructions)
        return ['{"x": 500, "y": 500}'] * len(instructions)

    monkeypatch.setattr(ev, "answer_batch", answer_batch)
    return seen


def _ids(folder):
    return [json.loads(x)["id"] for x in (folder / "predictions.jsonl").read_text().splitlines()]


def test_ladder_json_has_the_three_reports_with_their_breakdowns(micro_ckpt, tmp_path, capsys):
    """The real micro model, greedy generation, two screens per rung."""
    rc = ev.main(["--model", str(micro_ckpt), "--ladder", "--n", "2", "--dev", "--batch-size", "2",
                  "--max-new-tokens", "8", "--json", "--no-progress", "--out", str(tmp_path / "o")])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["seed0"], res["dev"], res["n"]) == (ev.DEV_SEED0, True, 2)
    assert list(res["ladder"]) == list(RUNGS)
    for name, (split, vocab) in RUNGS.items():
        r = res["ladder"][name]
        assert (r["split"], r["vocab"], r["n"]) == (split, vocab, 2)
        for key in ("per_role", "per_family", "per_vocab"):
            assert sum(v["n"] for v in r[key].values()) == 2 and sum(v["hits"] for v in r[key].values()) == r["hits"]
        families = set(r["per_family"])
        assert families <= ({"tablet-portrait", "phone-landscape", "ultrawide"} if split == "heldout"
                            else {"phone", "square", "tablet", "laptop", "desktop"})
        tag = split if vocab == "all" else f"{split}-{vocab}"
        assert _ids(tmp_path / "o" / name) == [f"{tag}-{ev.DEV_SEED0}", f"{tag}-{ev.DEV_SEED0 + 1}"]
    assert res["ladder"]["heldout-vocab"]["per_vocab"].keys() == {"heldout"}


def test_ladder_text_is_one_compact_table(micro_ckpt, centre_clicks, capsys):
    assert ev.main(["--model", str(micro_ckpt), "--ladder", "--n", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"seeds {ev.EVAL_SEED0}.. (the reported seeds)" in out and len(centre_clicks) == 9
    lines = out.splitlines()
    header = next(line for line in lines if "train-look" in line)
    assert header.split() == list(RUNGS)
    assert any(line.startswith("split / vocab") and "train / heldout" in line for line in lines)
    assert any(line.startswith("vocab heldout") for line in lines)
    assert any(line.startswith("family ") and " - " in line + " " for line in lines)  # a family only one rung has
    assert sum(line.startswith("role ") for line in lines) >= 2


def test_ladder_function_reuses_evaluate(centre_clicks):
    reports = ev.ladder(None, None, 2, seed0=ev.DEV_SEED0, progress=False)
    assert list(reports) == list(RUNGS) and all(r.n == 2 for r in reports.values())
    assert reports["heldout-vocab"].vocabs == {"heldout": [reports["heldout-vocab"].hits, 2]}
    ids = [p.id for p in reports["heldout-look"].predictions]
    assert ids == [f"heldout-{ev.DEV_SEED0}", f"heldout-{ev.DEV_SEED0 + 1}"]
    table = ev.ladder_table(reports)
    assert "accuracy % (n)" in table and "95% CI" in table


@pytest.mark.parametrize("flags,seed0", [(["--dev"], ev.DEV_SEED0), ([], ev.EVAL_SEED0), (["--seed0", "7"], 7)])
def test_dev_draws_from_dev_seed0(micro_ckpt, centre_clicks, tmp_path, capsys, flags, seed0):
    out = tmp_path / "o"
    assert ev.main(["--model", str(micro_ckpt), "--n", "2", "--vocab", "heldout", "--split", "train", "--json",
                    "--no-progress", "--out", str(out), *flags]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["seed0"], res["dev"], res["vocab"], res["synthetic"]) == (seed0, seed0 == ev.DEV_SEED0, "heldout",
                                                                          "train")
    assert _ids(out) == [f"train-heldout-{seed0}", f"train-heldout-{seed0 + 1}"]
    assert res["per_vocab"] == {"heldout": {"n": 2, "hits": res["hits"], "accuracy": res["hits"] / 2,
                                            "ci95": list(ev.wilson_interval(res["hits"], 2))}}


def test_help_and_docstring_name_the_dev_seeds(capsys):
    with pytest.raises(SystemExit) as e:
        ev.main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--dev" in text and str(ev.DEV_SEED0) in text and "--ladder" in text and "--vocab" in text
    assert "--dev" in ev.__doc__ and "DEV_SEED0 = 3 * 10**9" in ev.__doc__ and "--ladder" in ev.__doc__
