"""generate_text: processor + model + generation_config + stop ids / strings, for one prompt or a batch."""

import pytest
from PIL import Image
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (autouse: chunked scan, one thread)
from tiny_vl import write_tiny_vl_checkpoint

from holotron.generate import generate, generate_text, stop_ids
from holotron.processor import Processor


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = write_tiny_vl_checkpoint(tmp_path_factory.mktemp("vl"), seed=3)
    import holotron

    model = holotron.load(folder)
    proc = Processor.from_pretrained(folder)
    img = Image.new("RGB", (70, 40), (250, 250, 250))
    img.paste((200, 20, 20), (5, 5, 30, 20))
    return model, proc, img


def _messages(text):
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def test_one_prompt_equals_generate_then_decode(setup):
    model, proc, img = setup
    text = generate_text(model, proc, _messages("what is red?"), images=[img], max_new_tokens=8)
    batch = proc(_messages("what is red?"), images=[img])
    ids = generate(model, batch["input_ids"], 8, attention_mask=batch["attention_mask"],
                   pixel_values=batch["pixel_values"], eos_token_id=list(stop_ids(model, proc)))[0].tolist()
    eos = set(stop_ids(model, proc))
    ids = ids[:next((i for i, t in enumerate(ids) if t in eos), len(ids))]
    assert isinstance(text, str) and text == proc.decode(ids, skip_special_tokens=True)


def test_batch_rows_equal_each_prompt_alone(setup):
    model, proc, img = setup
    wide = Image.new("RGB", (200, 40), (10, 10, 10))
    prompts = [_messages("first"), _messages("a longer second question here")]
    both = generate_text(model, proc, prompts, images=[[img], [wide]], max_new_tokens=6)
    alone = [generate_text(model, proc, p, images=[im], max_new_tokens=6) for p, im in zip(prompts, [img, wide])]
    assert both == alone


def test_stop_string_cuts_each_row(setup):
    model, proc, img = setup
    full = generate_text(model, proc, _messages("q"), images=[img], max_new_tokens=10)
    assert len(full) >= 3, full
    stop = full[2:4]
    cut = generate_text(model, proc, _messages("q"), images=[img], max_new_tokens=10, stop=[stop])
    assert cut == full[:full.index(stop)]


def test_generation_config_defaults_are_used(setup, monkeypatch):
    model, proc, img = setup
    import holotron.generation as g  # where generate_text looks stream up

    seen = {}
    real = g.stream

    def spy(*a, **k):
        seen.update(k, max_new_tokens=a[2])
        return real(*a, **k)

    monkeypatch.setattr(g, "stream", spy)
    monkeypatch.setattr(proc.generation_config, "max_new_tokens", 3)
    generate_text(model, proc, _messages("q"), images=[img])
    assert seen["max_new_tokens"] == 3 and seen["temperature"] == 0.0
    assert {2, 12} <= set(seen["eos_token_id"])
    generate_text(model, proc, _messages("q"), images=[img], temperature=0.7, top_k=5, seed=1)
    assert seen["temperature"] == 0.7 and seen["top_k"] == 5
