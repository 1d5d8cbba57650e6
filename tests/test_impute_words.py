"""scripts/impute_unseen_words.py: the word tokens the tiny model's training never showed get embeddings read
from their spelling; every other tensor of the checkpoint stays bit for bit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import holotron
from holotron import Processor

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "impute_unseen_words.py"
spec = importlib.util.spec_from_file_location("impute_unseen_words", SCRIPT)
imp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(imp)


@pytest.fixture(scope="module")
def tokenizer():
    return Processor.from_pretrained("holotron-tiny-ui").tokenizer


def test_unseen_words_are_in_no_training_label_and_no_training_question(tokenizer):
    trained, unseen = imp.split_words(tokenizer, screens=200)
    words = {w for w, _ in unseen}
    assert len(trained) > 500 and len(unseen) > 50
    assert not words & {w for w, _ in trained}
    assert "Upload" in {w for w, _ in trained}          # the bundled example's target: trained, kept
    assert not {"bar", "input"} & words                 # held-out labels' words that training questions use
    asked = imp.question_tokens(tokenizer, 200)
    assert not {i for _, i in unseen} & asked
    for w, i in unseen:                                  # each one token of its own after a space
        assert tokenizer.decode([i]).strip() == w


def test_spelling_predicts_held_back_training_words_better_than_their_mean(tokenizer):
    trained, unseen = imp.split_words(tokenizer, screens=0)
    emb = holotron.load("holotron-tiny-ui", dtype=torch.float32).language_model.backbone.embeddings.weight
    x, y, _ = imp.spelling_rows(emb, trained, unseen)
    cv = imp.cross_validate(x, y, 1.0, 5)
    assert cv["cosine"] > cv["cosine_of_the_mean"] + 0.1, cv
    assert cv["median_rank"] < 20, cv   # among 740 training words


def test_the_new_checkpoint_differs_only_in_the_unseen_rows_which_get_the_spelling_fit(tmp_path, tokenizer):
    # a copy whose unseen rows are noise (as untrained rows are), so the script has rows to write
    _, unseen = imp.split_words(tokenizer, screens=200)
    rows = [i for _, i in unseen]
    model = holotron.load("holotron-tiny-ui", dtype=torch.float32)
    key = "language_model.backbone.embeddings.weight"
    with torch.no_grad():
        model.language_model.backbone.embeddings.weight[rows] = torch.randn(len(rows), model.config.text.hidden_size)
    src = tmp_path / "src"
    holotron.save_pretrained(model.to(torch.bfloat16), src, max_shard_size="8MB")
    bundled = Path(holotron.bundled.bundled_path("holotron-tiny-ui"))
    for f in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json"):
        (src / f).write_bytes((bundled / f).read_bytes())
    out = tmp_path / "imputed"
    assert imp.main([str(src), str(out), "--screens", "200"]) == 0
    report = json.loads((out / "impute_words.json").read_text())
    assert report["unseen_words"] == [w for w, _ in unseen]
    a = holotron.load(src, dtype=torch.float32).state_dict()
    b = holotron.load(out, dtype=torch.float32).state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == [key]
    changed = torch.nonzero((a[key] != b[key]).any(1)).squeeze(1).tolist()
    assert sorted(changed) == sorted(rows)
    # the rows are the spelling fit of the trained rows, scaled to their mean norm (--scale train-norm)
    trained, _ = imp.split_words(tokenizer, screens=0)
    _, y, want = imp.spelling_rows(a[key], trained, unseen)
    assert np.allclose(np.linalg.norm(want, axis=1), np.linalg.norm(y, axis=1).mean())
    assert np.allclose(b[key][rows].double().numpy(), want, rtol=1e-2, atol=2e-2)   # bf16 as shipped
    assert (out / "generation_config.json").read_text() == (bundled / "generation_config.json").read_text()


def test_the_shipped_weights_are_already_the_fit():
    """The bundled weights came out of this script (tiny-ui-v9 and v10): run again, the fit of the (unchanged)
    trained rows gives back the rows it has, up to bf16 rounding."""
    tok = Processor.from_pretrained("holotron-tiny-ui").tokenizer
    trained, unseen = imp.split_words(tok, screens=200)
    emb = holotron.load("holotron-tiny-ui", dtype=torch.float32).language_model.backbone.embeddings.weight.detach()
    _, _, want = imp.spelling_rows(emb, trained, unseen)
    assert np.allclose(emb[[i for _, i in unseen]].double().numpy(), want, rtol=1e-2, atol=2e-2)


def test_an_existing_output_folder_is_refused_and_left_alone(tmp_path, capsys):
    out = tmp_path / "there"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(SystemExit) as e:
        imp.main(["holotron-tiny-ui", str(out)])
    assert e.value.code == 2
    assert "exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_folder_without_a_checkpoint_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        imp.main([str(tmp_path), str(tmp_path / "out")])
    assert e.value.code == 2 and "not a checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
