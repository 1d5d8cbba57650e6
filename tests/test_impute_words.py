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
    model = holotron.load("holotron-tiny-ui", dtype=torch.float32, device="cpu")
    emb = model.language_model.backbone.embeddings.weight.detach()
    index = {g: k for k, g in enumerate(sorted({g for w, _ in trained + unseen for g in imp.spelling(w)}))}
    x = imp.features([w for w, _ in trained], index)
    cv = imp.cross_validate(x, emb[[i for _, i in trained]].double().numpy(), 1.0, 5)
    assert cv["cosine"] > cv["cosine_of_the_mean"] + 0.1, cv
    assert cv["median_rank"] < 20, cv   # among 740 training words


def test_the_new_checkpoint_differs_only_in_the_unseen_rows(tmp_path, tokenizer):
    out = tmp_path / "imputed"
    assert imp.main(["holotron-tiny-ui", str(out), "--screens", "200"]) == 0
    report = json.loads((out / "impute_words.json").read_text())
    _, unseen = imp.split_words(tokenizer, screens=200)
    assert report["unseen_words"] == [w for w, _ in unseen]
    a = holotron.load("holotron-tiny-ui", dtype=torch.float32).state_dict()
    b = holotron.load(out, dtype=torch.float32).state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == ["language_model.backbone.embeddings.weight"]
    key = "language_model.backbone.embeddings.weight"
    changed = sorted(torch.nonzero((a[key] != b[key]).any(1)).squeeze(1).tolist())
    assert changed == sorted(i for _, i in unseen)
    norms = b[key][changed].norm(dim=1).numpy()        # --scale train-norm: the training words' mean norm
    assert np.allclose(norms, report["training_rows_norm"], rtol=0.02)
    assert (out / "generation_config.json").read_text() == (
        Path(holotron.bundled.bundled_path("holotron-tiny-ui")) / "generation_config.json").read_text()


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
