"""generate(): greedy against a recompute-everything oracle, eos handling, sampling, streaming, padding."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

import holotron
from holotron.generate import eos_ids, generate, sample, stream


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)


def _ids(b, t, seed):
    return torch.randint(3, 96, (b, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _greedy_by_full_forward(model, ids, n):
    """The oracle: no state at all, the whole sequence recomputed for every new token."""
    seq = ids
    for _ in range(n):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, ids.shape[1]:]


@pytest.mark.parametrize("t", [1, 9, 17])
def test_greedy_equals_full_recompute(model, t):
    ids = _ids(2, t, seed=t)
    assert torch.equal(generate(model, ids, 12, eos_token_id=[]), _greedy_by_full_forward(model, ids, 12))


def test_mixed_length_batch_generates_as_each_row_alone(model):
    rows = [_ids(1, n, seed=n)[0] for n in (3, 11, 7)]
    t = max(len(r) for r in rows)
    ids = torch.zeros(3, t, dtype=torch.long)
    mask = torch.zeros(3, t, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
    batch = generate(model, ids, 10, attention_mask=mask, eos_token_id=[])
    for i, r in enumerate(rows):
        assert torch.equal(batch[i], generate(model, r[None], 10, eos_token_id=[])[0]), f"row {i}"


def test_eos_stops_rows_and_pads_them(model):
    ids = _ids(3, 6, seed=2)
    free = generate(model, ids, 10, eos_token_id=[])
    stop = int(free[1, 3])  # row 1 emits this at step 3 (other rows may too: compute where each stops)
    got = generate(model, ids, 10, eos_token_id=stop, pad_token_id=-1)
    for r in range(3):
        hits = (free[r] == stop).nonzero()
        end = int(hits[0]) + 1 if len(hits) else 10
        assert torch.equal(got[r, :end], free[r, :end]), r
        assert (got[r, end:] == -1).all(), r
    assert got.shape[1] == max(int((free[r] == stop).nonzero()[0]) + 1 if (free[r] == stop).any() else 10
                               for r in range(3))


def test_all_rows_stopping_ends_early(model):
    ids = _ids(1, 5, seed=3)
    first = int(generate(model, ids, 1)[0, 0])
    assert generate(model, ids, 10, eos_token_id=[first]).shape == (1, 1)


def test_eos_defaults_come_from_config_and_generation_config(model):
    m = tiny_lm(tiny_config(eos_token_id=(2,)), seed=1)
    m.generation_config = {"eos_token_id": [12, 2]}
    assert eos_ids(m) == (2, 12)
    assert eos_ids(model) == (2,)


def test_sampling_is_seeded_and_top_k_1_is_greedy(model):
    ids = _ids(2, 7, seed=4)
    a = generate(model, ids, 8, temperature=1.0, seed=123, eos_token_id=[])
    b = generate(model, ids, 8, temperature=1.0, seed=123, eos_token_id=[])
    c = generate(model, ids, 8, temperature=1.0, seed=124, eos_token_id=[])
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = torch.Generator().manual_seed(123)
    assert torch.equal(a, generate(model, ids, 8, temperature=1.0, generator=g, eos_token_id=[]))
    greedy = generate(model, ids, 8, eos_token_id=[])
    assert torch.equal(generate(model, ids, 8, temperature=2.0, top_k=1, seed=0, eos_token_id=[]), greedy)
    assert torch.equal(generate(model, ids, 8, temperature=2.0, top_p=1e-6, seed=0, eos_token_id=[]), greedy)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    k2 = sample(logits, 1.0, top_k=2, generator=g)
    assert set(k2.tolist()) == {0, 1}
    p = sample(logits, 1.0, top_p=0.79, generator=g)  # 0.5 + 0.3 reaches 0.79: tokens 0 and 1 only
    assert set(p.tolist()) == {0, 1}
    p = sample(logits, 1.0, top_p=0.81, generator=g)
    assert set(p.tolist()) == {0, 1, 2}
    full = sample(logits, 1.0, generator=g)
    freq = torch.bincount(full, minlength=4).float() / len(full)
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)


def test_streaming_callback_and_iterator(model):
    ids = _ids(2, 5, seed=6)
    seen = []
    out = generate(model, ids, 6, streamer=seen.append, eos_token_id=[])
    assert torch.equal(torch.stack(seen, 1), out)
    it = stream(model, ids, 6, eos_token_id=[])
    assert torch.equal(next(it), out[:, 0])
    assert torch.equal(torch.stack([out[:, 0], *it], 1), out)


def test_one_dimensional_prompt_and_zero_tokens(model):
    ids = _ids(1, 5, seed=7)
    assert torch.equal(generate(model, ids[0], 4), generate(model, ids, 4)[0])
    assert generate(model, ids, 0).shape == (1, 0)


@pytest.mark.parametrize("kw, msg", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_k=5), "top_k / top_p only apply when sampling"),
    (dict(temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=1.0, top_k=0), "top_k must be >= 1"),
    (dict(max_new_tokens=-2), "max_new_tokens must be an int >= 0"),
    (dict(attention_mask=torch.tensor([[1, 1, 0]])), "last prompt position of every row must be a real token"),
    (dict(attention_mask=torch.ones(1, 2)), "attention_mask must have the shape of input_ids"),
])
def test_bad_arguments(model, kw, msg):
    kw = {"max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=msg):
        generate(model, _ids(1, 3, seed=0), **kw)
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        generate(model, torch.zeros(1, 3))


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_prefill_gives_the_same_tokens(model, chunk):
    """A prompt prefilled in pieces (each continuing the state) decodes as the whole prompt does, padded
    rows included; ``on_prefill`` sees the progress."""
    ids = _ids(2, 23, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # a left-padded row
    whole = generate(model, ids, 8, attention_mask=mask, eos_token_id=[], engine=False)
    seen = []
    pieces = generate(model, ids, 8, attention_mask=mask, eos_token_id=[], engine=False, prefill_chunk=chunk,
                      on_prefill=lambda done, total: seen.append((done, total)))
    assert torch.equal(whole, pieces)
    assert (seen[-1] == (23, 23)
            and [d for d, _ in seen] == sorted({min(23, k) for k in range(chunk, 23 + chunk, chunk)}))
    with pytest.raises(ValueError, match="prefill_chunk must be an int >= 1"):
        generate(model, ids, 2, prefill_chunk=0)


def test_chunked_prefill_with_images():
    from tiny_vl import IMAGE_TOKEN_ID, TOKENS_PER_TILE, tiny_vl

    vl = tiny_vl(seed=2)
    tiles = torch.randn(1, 3, vl.config.vision.image_size, vl.config.vision.image_size,
                        generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[5, 6] + [IMAGE_TOKEN_ID] * TOKENS_PER_TILE + [7, 8, 9]])
    whole = generate(vl, ids, 5, pixel_values=tiles, eos_token_id=[], engine=False)
    pieces = generate(vl, ids, 5, pixel_values=tiles, eos_token_id=[], engine=False, prefill_chunk=4)
    assert torch.equal(whole, pieces)


def test_module_import_keeps_generate_callable(model):
    import holotron.generate as mod  # the import system binds holotron.generate to the module
    assert callable(holotron.generate)
    ids = _ids(1, 4, seed=8)
    assert torch.equal(holotron.generate(model, ids, 3), mod.generate(model, ids, 3))


def test_cli_help_lists_the_options():
    r = subprocess.run([sys.executable, "-m", "holotron.generate", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for opt in ("--model", "--image", "--prompt", "--max-new-tokens", "--temperature", "--top-p", "--seed",
                "--device", "--dtype", "--system", "--ground", "--out", "--json", "--debug"):
        assert opt in r.stdout, opt


def test_docs_architecture_example_runs():
    """The Python example in docs/architecture.md is executed, so it cannot drift."""
    import re
    from pathlib import Path
    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/architecture.md", "exec"), {})
