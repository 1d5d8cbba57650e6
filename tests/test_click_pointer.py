"""The click pointer (holotron/click_pointer.py): where the image tokens lie, the checkpoint's declaration, and the
decoding constraint, whose attention (from the decode state's KV cache) must be the training loss's
(``train.pointer.attention_scores`` on a full forward) and whose coordinate must be the model's best in that
token's cell."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import holotron
from holotron.click_pointer import ClickPointer, PointerConstraint, pointer_of
from holotron.data import generate_sample
from holotron.generation import generate
from holotron.model import Holotron
from holotron.train import init_weights, make_config
from holotron.train.checkpoint import save_checkpoint
from holotron.train.pointer import attention_scores
from holotron.train.targets import image_token_targets
from holotron.vision.preprocess import token_centres

COORDS = list(range(1000, 2001))  # stand-ins for the word tokenizer's <0> .. <1000>


@pytest.fixture(scope="module")
def model():
    return init_weights(Holotron(make_config("micro", 2100)), seed=3).eval()


@pytest.mark.parametrize("preset,size", [("micro", (400, 200)), ("micro", (200, 600)), ("micro", (300, 300)),
                                         ("tiny-ui", (1280, 800)), ("tiny-ui-tiles", (1920, 1080))])
def test_token_centres_are_the_training_targets_positions_with_cells_that_tile_the_image(preset, size):
    cfg = make_config(preset, 600).vision
    sample = generate_sample(5, size=size)
    pos, cell = token_centres(size, cfg)
    _, want = image_token_targets(sample, cfg)
    assert np.array_equal(pos.astype(np.float32), want.numpy())
    g2 = cfg.tokens_per_tile
    tiles = pos[: len(pos) - (g2 if len(pos) > g2 and cfg.use_thumbnail else 0)]
    area = (cell[: len(tiles), 0] * cell[: len(tiles), 1]).sum()
    assert area == pytest.approx(1.0)  # the tiles' cells cover the image once
    assert np.all(np.abs(tiles - np.round(tiles / cell[: len(tiles)] - 0.5) * cell[: len(tiles)]
                         - cell[: len(tiles)] / 2) < 1e-9)  # each centre is the middle of its cell


def test_pointer_of_reads_and_checks_the_models_declaration(model, tmp_path, monkeypatch):
    assert pointer_of(model) is None  # built in memory: no generation_config, no pointer
    monkeypatch.setattr(model, "generation_config", {"max_new_tokens": 8})
    assert pointer_of(model) is None
    monkeypatch.setattr(model, "generation_config", {"click_pointer": {"layer": 1, "heads": 2}})
    assert pointer_of(model) == ClickPointer(1, 2)
    monkeypatch.setattr(model, "generation_config", {"click_pointer": {"layer": 1, "heads": 1, "first": 3}})
    assert pointer_of(model) == ClickPointer(1, 1, 3)
    for bad in ({"layer": 0, "heads": 1}, {"layer": 2, "heads": 1}, {"layer": 1, "heads": 5}, {"layer": 1},
                {"layer": 1, "heads": True}, [1, 2], {"layer": 9, "heads": 1}, {"layer": 1, "heads": 2, "first": 3},
                {"layer": 1, "heads": 1, "first": -1}, {"layer": 1, "heads": 1, "last": 1}):
        monkeypatch.setattr(model, "generation_config", {"click_pointer": bad})
        with pytest.raises(ValueError, match="click_pointer"):
            pointer_of(model)
    # a checkpoint written with it declares it; holotron.load reads it back onto the model
    monkeypatch.setattr(model, "generation_config", {})
    save_checkpoint(model, tmp_path / "ck", tmp_path, click_pointer={"layer": 1, "heads": 2})
    assert pointer_of(holotron.load(tmp_path / "ck")) == ClickPointer(1, 2)


def _prompt(model, pad: int = 0):
    """Left pads, text, the image tokens of a 128 x 64 image (2 tiles + thumbnail, 4 tokens each), text."""
    g = torch.Generator().manual_seed(1)
    img = [model.config.image_token_id] * 12
    ids = torch.tensor([0] * pad + [40, 41, 42] + img + [43, 44, 45, 46])
    mask = torch.tensor([0] * pad + [1] * (len(ids) - pad))
    return ids, mask, torch.randn(3, 3, 64, 64, generator=g)


def _reference_cell(model, ptr, ids, mask, pixels, t, axis):
    """The cell the training loss's attention (full forward, heads averaged) points at from position t."""
    seen = {}
    layers = model.language_model.backbone.layers
    hook = layers[ptr.layer - 1].register_forward_hook(lambda m, a, out: seen.__setitem__("h", out))
    try:
        with torch.no_grad():
            model(ids[None, : t + 1], pixel_values=pixels, attention_mask=mask[None, : t + 1])
    finally:
        hook.remove()
    sc = attention_scores(layers[ptr.layer], seen["h"], torch.tensor([[t]]), ptr.first + ptr.heads)[0, ptr.first:, 0]
    sc = sc.masked_fill(mask[: t + 1] == 0, float("-inf"))
    p = torch.softmax(sc, -1).mean(0)
    img = (ids[: t + 1] == model.config.image_token_id).nonzero().squeeze(1)
    pos, cell = token_centres((128, 64), model.config.vision)
    top = int(p[img].argmax())
    c, half = 1000 * pos[top, axis], 500 * cell[top, axis]
    return max(0, math.floor(c - half)), min(1000, math.ceil(c + half))


@pytest.mark.parametrize("ptr", [ClickPointer(1, 2), ClickPointer(1, 1, 1), ClickPointer(1, 2, 2)],
                         ids=["heads01", "head1", "heads23"])
@pytest.mark.parametrize("pad", [0, 2])
def test_the_constraint_writes_each_coordinate_in_the_cell_the_training_attention_points_at(model, pad, ptr):
    ids, mask, pixels = _prompt(model, pad)
    bias = torch.zeros(2100)
    bias[COORDS] = 50.0  # a model whose greedy next tokens are coordinates: the constraint's case

    class Biased(torch.nn.Module):  # the micro model with its logits shifted toward the coordinates
        def __init__(self):
            super().__init__()
            self.inner = model
            self.config = model.config

        def new_state(self, *a, **k):
            return model.new_state(*a, **k)

        def forward(self, *a, **k):
            return model(*a, **k) + bias

    seen_logits = []
    con = PointerConstraint(model, ptr, COORDS, ids[None], [(128, 64)])

    def spy(logits, state, rows):
        seen_logits.append(logits[0].clone())
        return con(logits, state, rows)

    try:
        with torch.no_grad():
            new = generate(Biased(), ids[None], 3, attention_mask=mask[None], pixel_values=pixels, constrain=spy,
                           eos_token_id=[], engine=False)[0].tolist()
    finally:
        con.close()
    assert con.written == [2]
    seq = ids.tolist()
    for axis in (0, 1):
        lo, hi = _reference_cell(model, ptr, torch.tensor(seq), torch.cat([mask, torch.ones(axis, dtype=mask.dtype)]),
                                 pixels, len(seq) - 1, axis)
        value = COORDS.index(new[axis])
        assert lo <= value <= hi, (axis, value, lo, hi)
        assert value == lo + int(seen_logits[axis][COORDS[lo: hi + 1]].argmax())  # the model's best in the cell
        seq.append(new[axis])
    assert new[2] == int(seen_logits[2].argmax())  # a third coordinate is left as it is


def test_a_grounding_run_declares_its_pointer_in_generation_config(tmp_path, model):
    save_checkpoint(model, tmp_path / "ck", tmp_path, click_pointer={"layer": 1, "heads": 2})
    gc = json.loads((tmp_path / "ck" / "generation_config.json").read_text())
    assert gc["click_pointer"] == {"layer": 1, "heads": 2} and gc["max_new_tokens"] == 48
    save_checkpoint(model, tmp_path / "plain", tmp_path)
    assert "click_pointer" not in json.loads((tmp_path / "plain" / "generation_config.json").read_text())


def test_a_prompt_whose_image_tokens_do_not_match_its_image_is_one_clear_error(model):
    ids, _, _ = _prompt(model)
    with pytest.raises(ValueError, match="prompt 0 has 12 image tokens, an image of 300x300 gives 4"):
        PointerConstraint(model, ClickPointer(1, 2), COORDS, ids[None], [(300, 300)])
