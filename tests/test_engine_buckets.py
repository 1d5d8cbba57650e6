"""The prefill chunks' shape buckets (holotron/engine_chunks.py): how many pads a chunk's rows get."""

import pytest

from holotron import engine_chunks
from holotron.engine_chunks import bucket_down, bucket_up, row_buckets, token_buckets


def test_token_buckets_pad_less_than_a_sixteenth_or_16_tokens():
    b = token_buckets(8192, step=16)
    assert b[0] == 16 and b[-1] >= 8192 and b == sorted(set(b))
    assert b[:32] == list(range(16, 513, 16))         # steps of 16 up to 512
    for t in range(1, 8193):
        pad = bucket_up(t, b) - t
        assert 0 <= pad < max(16, t / 16), t


def test_one_tile_agent_turns_are_padded_less_than_with_steps_of_64():
    """The agents benchmark's one-tile turns: 256 image tokens, 40..80 text, the pending token (297..337)."""
    turns = range(297, 338)
    fine, coarse = token_buckets(8192, step=16), token_buckets(8192, step=64)
    pads = {name: sum(bucket_up(t, bk) for t in turns) / sum(turns) - 1 for name, bk in [("16", fine), ("64", coarse)]}
    assert pads["16"] < 0.03 < 0.08 < pads["64"] < 0.11
    pairs = [(s, t) for s in turns for t in turns]   # two turns in one chunk: both padded to the longer
    two = sum(2 * bucket_up(max(p), fine) for p in pairs) / sum(sum(p) for p in pairs) - 1
    assert two < 0.05


def test_token_buckets_with_a_coarse_step_and_a_bad_one():
    assert token_buckets(1024, step=64) == list(range(64, 1025, 64))
    with pytest.raises(ValueError, match="step must be >= 1"):
        token_buckets(100, step=0)


def test_row_buckets_round_down_and_tokens_up():
    rows = row_buckets(100)
    assert rows[:8] == [1, 2, 3, 4, 6, 8, 12, 16] and rows[-1] <= 100
    assert bucket_down(5, rows) == 4 and bucket_up(321, token_buckets(512, step=16)) == 336


def test_engine_counts_a_bucketed_chunks_tokens_and_its_slots():
    """Three prompts of 5, 7 and 9 tokens in one chunk (rows bucket 3, tokens bucket 16): 21 tokens in 48 slots;
    the tokens equal the plain loop's."""
    from tiny_lm import random_ids, tiny_lm

    from holotron.engine import Engine
    from holotron.generate import generate

    model = tiny_lm(seed=1)
    prompts = [random_ids(n, seed=n) for n in (5, 7, 9)]
    eng = Engine(model, max_batch=4, max_len=64, prefill_tokens=64, prefill_graphs=True)
    reqs = [eng.submit(p, max_new_tokens=3) for p in prompts]
    eng.run()
    assert (eng.stats["chunk_tokens"], eng.stats["chunk_slots"]) == (21, 48)
    for p, r in zip(prompts, reqs):
        assert r.tokens == generate(model, p[None], 3, engine=False, eos_token_id=[])[0].tolist()


@pytest.mark.parametrize("value,step,warned", [("", 16, False), ("64", 64, False), (" 32 ", 32, False),
                                               ("0", 16, True), ("abc", 16, True), ("-8", 16, True)])
def test_chunk_step_from_the_environment(monkeypatch, caplog, value, step, warned):
    monkeypatch.setenv("HOLOTRON_CHUNK_STEP", value)
    with caplog.at_level("WARNING", logger="holotron.engine"):
        assert engine_chunks._chunk_step() == step
    assert ("HOLOTRON_CHUNK_STEP" in caplog.text) == warned
