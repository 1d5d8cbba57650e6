"""The decode engine against the plain generate() loop: padded batches, rows ending at different
times, refill, compaction, chunked prefill, prefix snapshots, images, sampling; on a GPU, the
CUDA-graph step against the eager one and against the plain loop."""

from __future__ import annotations

import pytest
import torch
from helpers import spy_chunks
from tiny_lm import random_ids as _ids
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)
from tiny_vl import IMAGE_TOKEN_ID, TILE, TOKENS_PER_TILE, tiny_vl

from holotron import engine_sessions
from holotron.config import TextConfig
from holotron.engine import Engine, choose_tokens, default_batch_sizes, engine_for, release
from holotron.generate import generate
from holotron.lm import HybridLM
from holotron.state import DecodeState

IMG_START, IMG_END = 19, 20


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)


def _left_pad(rows):
    t = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    mask = torch.zeros(len(rows), t, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
    return ids, mask


def _alone(model, ids, n, **kw):
    return generate(model, ids[None], n, engine=False, **kw)[0].tolist()


def test_padded_batch_equals_the_plain_loop(model):
    ids, mask = _left_pad([_ids(n, seed=n) for n in (3, 11, 7, 1)])
    plain = generate(model, ids, 12, attention_mask=mask, eos_token_id=[], engine=False)
    fast = generate(model, ids, 12, attention_mask=mask, eos_token_id=[], engine=True)
    assert torch.equal(fast, plain)


def test_rows_ending_at_different_times_equal_the_plain_loop_and_shrink_the_step(model):
    ids, mask = _left_pad([_ids(n, seed=10 + n) for n in (4, 9, 6, 5, 8)])
    free = generate(model, ids, 10, attention_mask=mask, eos_token_id=[], engine=False)
    stop = int(free[1, 2])  # row 1 ends at step 2; the others wherever they meet it (or not at all)
    plain = generate(model, ids, 10, attention_mask=mask, eos_token_id=stop, pad_token_id=-1, engine=False)
    eng = Engine(model, max_batch=5, max_len=32)
    live = []
    fast = generate(model, ids, 10, attention_mask=mask, eos_token_id=stop, pad_token_id=-1, engine=eng,
                    streamer=lambda tok: live.append(eng.live))
    assert torch.equal(fast, plain)
    assert live == sorted(live, reverse=True) and live[-1] < 5
    assert eng.idle and eng.rows == [None] * 5
    ended = [int((plain[r] == stop).nonzero()[0]) + 1 if (plain[r] == stop).any() else 10 for r in range(5)]
    assert len(set(ended)) > 1, "the test needs rows that end at different steps"


@pytest.mark.parametrize("lazy", [True, False])
def test_compaction_moves_live_rows_down_and_runs_smaller_batches(model, lazy, monkeypatch):
    monkeypatch.setattr(engine_sessions, "LAZY_ROWS", lazy)   # HOLOTRON_LAZY_ROWS=0: rows moved at every hole
    eng = Engine(model, max_batch=4, max_len=64, batch_sizes=[1, 2, 4])
    prompts = [_ids(5 + i, seed=20 + i) for i in range(4)]
    reqs = [eng.submit(p, max_new_tokens=n) for p, n in zip(prompts, (2, 9, 3, 6))]
    steps = []
    orig = eng._step
    eng._step = lambda b: (steps.append(b), orig(b))
    eng.run()
    assert steps[0] == 4 and steps[-1] == 1 and 2 in steps  # 4 live, then 3 and 2 (batch 4, 2), then 1
    for p, n, r in zip(prompts, (2, 9, 3, 6), reqs):
        assert r.done and r.tokens == _alone(model, p, n, eos_token_id=[])


def test_rows_move_only_when_that_gives_a_smaller_batch(model):
    """Row 1 ends first: rows 0, 2, 3 go on at batch 4 where they are (a move would not shrink the batch); when
    two rows are left above row 1 they are moved into rows [0, 2) and the steps run at batch 2."""
    eng = Engine(model, max_batch=4, max_len=64, batch_sizes=[1, 2, 4])
    prompts = [_ids(5 + i, seed=60 + i) for i in range(4)]
    news = (9, 2, 5, 9)
    reqs = [eng.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    seen = []   # (batch, rows of the live requests, moves so far) at each step
    orig = eng._step
    eng._step = lambda b: (seen.append((b, sorted(r.session.row for r in reqs if not r.done), eng.stats["row_moves"])),
                           orig(b))
    eng.run()
    three = [s for s in seen if len(s[1]) == 3]
    assert three and all(b == 4 and rows == [0, 2, 3] and moves == 0 for b, rows, moves in three)
    two = [s for s in seen if len(s[1]) == 2]
    assert two and all(b == 2 and rows == [0, 1] for b, rows, _ in two) and two[0][2] == 1   # row 3 -> row 1
    for p, n, r in zip(prompts, news, reqs):
        assert r.done and r.tokens == _alone(model, p, n, eos_token_id=[])


def test_refill_serves_more_requests_than_rows(model):
    eng = Engine(model, max_batch=2, max_len=64)
    prompts = [_ids(n, seed=30 + n) for n in (4, 12, 7, 2, 9)]
    news = (6, 3, 8, 5, 4)
    reqs = [eng.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    live = []
    while not eng.idle:
        eng.step()
        live.append(eng.live)
    assert max(live) == 2
    for p, n, r in zip(prompts, news, reqs):
        assert r.tokens == _alone(model, p, n, eos_token_id=[])
    # and with an end-of-sequence id: a row that stops early is refilled at once
    first = _alone(model, prompts[0], 6, eos_token_id=[])
    eos = first[1]
    reqs = [eng.submit(p, max_new_tokens=n, eos_token_id=[eos]) for p, n in zip(prompts, news)]
    eng.run()
    for p, n, r in zip(prompts, news, reqs):
        want = _alone(model, p, n, eos_token_id=[eos])
        cut = want.index(eos) + 1 if eos in want else len(want)
        assert r.tokens == want[:cut]


def test_prefix_snapshot_continuations_equal_full_prompts(model):
    eng = Engine(model, max_batch=3, max_len=64)
    shared = _ids(13, seed=40)
    pre = eng.prefix(shared)
    suffixes = [_ids(n, seed=41 + n) for n in (3, 1, 6)] + [shared[:0]]
    reqs = [eng.submit(s if len(s) else None, prefix=pre, max_new_tokens=7) for s in suffixes]
    reqs.append(eng.submit(_ids(5, seed=49), max_new_tokens=7))  # a request without the prefix in the same batch
    eng.run()
    for s, r in zip(suffixes, reqs):
        assert r.tokens == _alone(model, torch.cat([shared, s]), 7, eos_token_id=[])
    assert reqs[-1].tokens == _alone(model, _ids(5, seed=49), 7, eos_token_id=[])
    assert pre.length == 13 and pre.nbytes() > 0


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
def test_load_plain_copies_a_prefix_into_rows_as_load_does(model, kv_dtype):
    """``DecodeState.load_plain`` (what a prefix's load graph replays, holotron/engine_sessions.py): row 0 of a
    pad-free state into several rows at once, byte for byte what ``load`` writes row by row (a bf16 Mamba state
    from the prefix's fp32 one: the same cast), and no other row touched."""
    src = model.new_state(1, capacity=24, kv_dtype=kv_dtype)
    with torch.inference_mode():
        model(_ids(19, seed=60)[None], state=src)
    a, b = (DecodeState.allocate(model, 4, 32, ssm_dtype=torch.bfloat16, kv_dtype=kv_dtype) for _ in range(2))
    parts = lambda st: [t for s in st.layers if s is not None  # noqa: E731
                        for t in (s.tensors() if hasattr(s, "tensors") else (s.conv, s.ssm))]
    for x, y in zip(parts(a), parts(b)):
        x.view(torch.uint8).copy_(torch.randint(0, 120, x.view(torch.uint8).shape, dtype=torch.uint8))
        y.copy_(x)
    for r in (1, 3):
        assert a.load(r, src, 0) == 19
    b.load_plain(torch.tensor([3, 1]), src)
    assert b.lengths.tolist() == a.lengths.tolist() == [0, 19, 0, 19]
    assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(parts(a), parts(b)))
    with pytest.raises(ValueError, match="do not fit max_len"):
        DecodeState.allocate(model, 1, 8).load_plain(torch.tensor([0]), src)


def test_a_prefix_is_loaded_without_pads_and_its_graph_is_kept_only_on_cuda(model):
    eng = Engine(model, max_batch=2, max_len=64)
    pre = eng.prefix(_ids(11, seed=61))
    assert pre.padless and pre.length == 11
    reqs = [eng.submit(_ids(2, seed=62 + i), prefix=pre, max_new_tokens=3) for i in range(3)]
    eng.run()
    # the first two rows loaded together (a bucket of 2), the third alone; eagerly: no graphs on a CPU
    assert eng._prefix_graphs[pre] == {2: None, 1: None}
    for i, r in enumerate(reqs):
        assert r.tokens == _alone(model, torch.cat([_ids(11, seed=61), _ids(2, seed=62 + i)]), 3, eos_token_id=[])


@pytest.mark.parametrize("batched", [True, False])
def test_the_rows_of_one_admission_load_their_prefix_together(model, monkeypatch, batched):
    """Requests admitted in one step from the same prefix are loaded by one ``load_plain`` over their rows, padded
    to a power of two with the last row repeated (holotron/engine_sessions.py); HOLOTRON_BATCH_LOADS=0 loads
    them one by one. Both give each continuation's tokens alone; a second prefix's rows are loaded apart."""
    monkeypatch.setattr(engine_sessions, "BATCH_LOADS", batched)
    eng = Engine(model, max_batch=5, max_len=64)
    shared = [_ids(9, seed=71), _ids(6, seed=72)]
    pres = [eng.prefix(x) for x in shared]
    calls = []
    plain = eng.state.load_plain

    def spy(index, src):
        calls.append((index.tolist(), src.seqlen))
        plain(index, src)

    monkeypatch.setattr(eng.state, "load_plain", spy)
    which = [0, 0, 1, 0, 1]
    suffixes = [_ids(1 + i % 3, seed=73 + i) for i in range(5)]
    reqs = [eng.submit(x, prefix=pres[w], max_new_tokens=4) for x, w in zip(suffixes, which)]
    eng.run()
    if batched:
        assert calls == [([0, 1, 3, 3], 9), ([2, 4], 6)]
    else:
        assert calls == [([0], 9), ([1], 9), ([2], 6), ([3], 9), ([4], 6)]
    for r, x, w in zip(reqs, suffixes, which):
        assert r.tokens == _alone(model, torch.cat([shared[w], x]), 4, eos_token_id=[])


def test_chunked_prefill_equals_one_call(model):
    prompts = [_ids(37, seed=50), _ids(21, seed=51)]
    ids, mask = _left_pad(prompts)
    plain = generate(model, ids, 8, attention_mask=mask, eos_token_id=[], engine=False)
    eng = Engine(model, max_batch=2, max_len=64, prefill_tokens=16)  # at most 16 positions per engine step
    with spy_chunks(eng) as chunks:
        fast = generate(model, ids, 8, attention_mask=mask, eos_token_id=[], engine=eng)
    assert len(chunks) >= 4 and all(b * t <= 16 for (b, t), _, _ in chunks)
    assert sum(n for _, n, _ in chunks) == 37 + 21
    assert torch.equal(fast, plain)


def test_a_failed_vision_capture_leaves_the_engine_eager_and_serving():
    """capture_vision over several buckets where the first capture fails (here: no CUDA on a CPU engine told
    to capture; on a GPU, out of memory): the rest of the buckets are skipped, no error, and the engine goes on
    serving screenshots eagerly, token for token as the plain loop."""
    model = tiny_vl(seed=2)
    tiles = torch.randn(1, 3, TILE, TILE, generator=torch.Generator().manual_seed(3))
    p = torch.tensor([5, 40, IMG_START] + [IMAGE_TOKEN_ID] * TOKENS_PER_TILE + [IMG_END, 42])
    eng = Engine(model, max_batch=2, max_len=128, vision_tiles=4)
    eng.cuda_graph = True    # as on a GPU; capturing then fails here
    eng.capture_vision([1, 2, 4])
    assert eng.vision_graphs is None and "capturing the vision encoder failed" in eng.note
    eng.cuda_graph = False   # the CPU engine steps eagerly
    r = eng.submit(p, pixel_values=tiles, max_new_tokens=5)
    eng.run()
    assert r.tokens == generate(model, p[None], 5, pixel_values=tiles, eos_token_id=[], engine=False)[0].tolist()
    # the vision encoder's share of the admissions is counted apart (bench_agents.py reports it)
    assert eng.stats["vision_tiles"] == 1 and eng.stats["vision_calls"] == 1
    assert 0 < eng.stats["vision_s"] <= eng.stats["admit_s"]


def test_vl_batch_with_images_and_a_shared_screenshot():
    model = tiny_vl(seed=2)
    g = torch.Generator().manual_seed(0)
    tiles = torch.randn(3, 3, TILE, TILE, generator=g)

    def prompt(n_tiles, before, after):
        return torch.tensor(list(before) + [IMG_START] + [IMAGE_TOKEN_ID] * (n_tiles * TOKENS_PER_TILE) + [IMG_END]
                            + list(after))

    a, b = prompt(1, (5, 40), (42, 43, 44)), prompt(2, (6,), (45, 46))
    ids, mask = _left_pad([a, b])
    kw = dict(attention_mask=mask, pixel_values=tiles, num_tiles=[1, 2], eos_token_id=[])
    assert torch.equal(generate(model, ids, 6, engine=True, **kw), generate(model, ids, 6, engine=False, **kw))

    eng = Engine(model, max_batch=2, max_len=128)
    screen = prompt(2, (5, 41), ())
    pre = eng.prefix(screen, pixel_values=tiles[1:], num_tiles=[2])
    tasks = [torch.tensor([50, 51, 52]), torch.tensor([60, 61])]
    reqs = [eng.submit(t, prefix=pre, max_new_tokens=5) for t in tasks]
    reqs.append(eng.submit(a, max_new_tokens=5, pixel_values=tiles[:1]))  # its own image, queued behind
    eng.run()
    for t, r in zip(tasks, reqs):
        full = torch.cat([screen, t])[None]
        assert r.tokens == generate(model, full, 5, pixel_values=tiles[1:], eos_token_id=[], engine=False)[0].tolist()
    assert reqs[2].tokens == generate(model, a[None], 5, pixel_values=tiles[:1], eos_token_id=[],
                                      engine=False)[0].tolist()


def test_sampling_is_seeded_and_temperature_zero_rows_stay_greedy(model):
    ids, mask = _left_pad([_ids(n, seed=60 + n) for n in (5, 8)])
    kw = dict(attention_mask=mask, eos_token_id=[], engine=True)
    a = generate(model, ids, 8, temperature=1.0, seed=3, **kw)
    assert torch.equal(a, generate(model, ids, 8, temperature=1.0, seed=3, **kw))
    assert not torch.equal(a, generate(model, ids, 8, temperature=1.0, seed=4, **kw))
    greedy = generate(model, ids, 8, attention_mask=mask, eos_token_id=[], engine=False)
    assert torch.equal(generate(model, ids, 8, temperature=3.0, top_k=1, seed=0, **kw), greedy)
    assert torch.equal(generate(model, ids, 8, temperature=3.0, top_p=1e-6, seed=0, **kw), greedy)
    eng = Engine(model, max_batch=2, max_len=32, sampling=True)
    hot = eng.submit(_ids(5, seed=65), max_new_tokens=8, temperature=1.5)
    cold = eng.submit(_ids(8, seed=68), max_new_tokens=8)
    eng.run()
    assert cold.tokens == greedy[1].tolist() and len(hot.tokens) == 8


def test_choose_tokens_filters_like_sample():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    one = torch.ones(4000)
    k2 = choose_tokens(logits, one, torch.full((4000,), 2), torch.full((4000,), 2.0), g)
    assert set(k2.tolist()) == {0, 1}
    p = choose_tokens(logits, one, torch.full((4000,), 4), torch.full((4000,), 0.79), g)
    assert set(p.tolist()) == {0, 1}
    full = choose_tokens(logits, one, torch.full((4000,), 4), torch.full((4000,), 2.0), g)
    freq = torch.bincount(full, minlength=4).float() / len(full)
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    assert torch.equal(choose_tokens(logits[:3], torch.zeros(3), torch.full((3,), 4), torch.full((3,), 2.0), g),
                       torch.zeros(3, dtype=torch.long))


def test_closing_the_stream_frees_the_rows(model):
    eng = Engine(model, max_batch=2, max_len=32)
    ids, mask = _left_pad([_ids(4, seed=70), _ids(6, seed=71)])
    from holotron.generate import stream

    s = stream(model, ids, 10, attention_mask=mask, eos_token_id=[], engine=eng)
    next(s), next(s)
    assert eng.live == 2
    s.close()
    assert eng.idle


def test_errors(model):
    eng = Engine(model, max_batch=1, max_len=16)
    assert eng.max_len == 64  # rounded up to the alignment
    with pytest.raises(ValueError, match="exceed the engine's max_len 64"):
        eng.submit(_ids(60, seed=0), max_new_tokens=8)
    with pytest.raises(ValueError, match="needs an Engine built with sampling=True"):
        eng.submit(_ids(3, seed=0), temperature=1.0)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.submit(None)
    with pytest.raises(ValueError, match="1-d"):
        eng.submit(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds max_batch 1"):
        next(eng.stream(torch.zeros(2, 3, dtype=torch.long), 4))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_graph=True needs the model on a CUDA device"):
            Engine(model, 1, 16, cuda_graph=True)


def test_engine_cache_reuses_and_rebuilds(model):
    a = engine_for(model, 2, 40)
    assert engine_for(model, 1, 30) is a
    b = engine_for(model, 3, 40)
    assert b is not a and b.max_batch == 3
    c = engine_for(model, 2, 40, sampling=True)
    assert c is not b and c.sampling
    release(model)
    assert engine_for(model, 1, 8) is not c
    release(model)


def test_a_bfloat16_mamba_state_halves_its_bytes_and_stays_close_to_fp32(model):
    from holotron.state import MambaState

    ids = _ids(9, seed=1)
    runs = {}
    for dt in (torch.float32, torch.bfloat16):
        eng = Engine(model, max_batch=2, max_len=64, ssm_dtype=dt, keep_logits=True)
        req = eng.submit(ids, max_new_tokens=6)
        logits = []
        while not eng.idle:
            eng.step()
            logits.append(eng.logits[0].clone())
        ssm = [s.ssm for s in eng.state.layers if isinstance(s, MambaState)]
        assert ssm and all(s.dtype == dt for s in ssm)
        runs[dt] = (req.tokens, torch.stack(logits), sum(s.numel() * s.element_size() for s in ssm))
    (t32, l32, b32), (t16, l16, b16) = runs[torch.float32], runs[torch.bfloat16]
    assert b16 * 2 == b32
    assert t16 == t32  # same greedy tokens, so the step-by-step logits below compare like with like
    assert float((l16 - l32).abs().max() / l32.abs().max()) < 1e-2
    assert t32 == _alone(model, ids, 6, eos_token_id=[])


def test_default_batch_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(5) == [1, 2, 4, 5]
    assert default_batch_sizes(256) == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256]


def test_decode_state_bytes_per_row_at_12b_size():
    with torch.device("meta"):
        lm = HybridLM(TextConfig()).to(torch.bfloat16)
    st = DecodeState.allocate(lm, 1, 4096)
    per = st.bytes_per_row(4096)
    assert per["mamba"] == 28 * (12288 * 4 * 2 + 128 * 80 * 128 * 4)   # 149.5 MB, whatever the length
    assert per["attention"] == 6 * 2 * 8 * 128 * 2 * 4096             # 24 KiB per token
    assert st.bytes_per_row(131072)["attention"] == 32 * per["attention"]


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["M*-M*", "M-M*-M"])
def test_cuda_graph_step_equals_eager_step_and_plain_loop(pattern):
    model = tiny_lm(tiny_config(hybrid_override_pattern=pattern), seed=7).cuda()
    prompts = [_ids(n, seed=80 + n) for n in (5, 9, 3)]
    ids, mask = _left_pad(prompts)
    ids, mask = ids.cuda(), mask.cuda()
    graph = Engine(model, max_batch=4, max_len=64, keep_logits=True, overlap=False)  # in step with the eager one
    eager = Engine(model, max_batch=4, max_len=64, keep_logits=True, cuda_graph=False)
    assert graph.cuda_graph and sorted(graph.graphs) == [1, 2, 4]
    for eng in (graph, eager):
        for p, n in zip(prompts, (12, 4, 8)):
            eng.submit(p.cuda(), max_new_tokens=n)
    decoded = 0
    while not graph.idle:
        n = graph.live  # rows the step decodes (0 on the first step: prefill only)
        a, b = graph.step(), eager.step()
        assert [t for _, t in a] == [t for _, t in b]
        if n:
            torch.testing.assert_close(graph.logits[:n], eager.logits[:n], rtol=1e-5, atol=1e-5)
            decoded += 1
    assert decoded >= 10
    plain = generate(model, ids, 10, attention_mask=mask, eos_token_id=[], engine=False)
    assert torch.equal(generate(model, ids, 10, attention_mask=mask, eos_token_id=[]), plain)  # auto: the graph path


def _prefix_continuations(monkeypatch, setting: str, model, shared, suffixes, max_new: int, check) -> None:
    """``suffixes`` continuing ``shared`` on three CUDA rows with ``engine_sessions.<setting>`` on, then off
    (``check(on, graphs)`` asked of each engine's load graphs of the prefix): the tokens are the same both ways and
    equal the plain loop's on the whole prompts."""
    out = {}
    for on in (True, False):
        monkeypatch.setattr(engine_sessions, setting, on)
        eng = Engine(model, max_batch=3, max_len=64)
        pre = eng.prefix(shared.cuda())
        reqs = [eng.submit(s.cuda(), prefix=pre, max_new_tokens=max_new) for s in suffixes]
        eng.run()
        out[on] = [r.tokens for r in reqs]
        check(on, eng._prefix_graphs.get(pre, {}))
    assert out[True] == out[False]
    ref = Engine(model, max_batch=3, max_len=64)
    alone = [ref.submit(torch.cat([shared, s]).cuda(), max_new_tokens=max_new) for s in suffixes]
    ref.run()
    assert out[True] == [r.tokens for r in alone]


@pytest.mark.gpu
def test_prefix_load_graph_equals_the_copies_and_the_plain_loop(monkeypatch):
    """A prefix met a second time is loaded by a graph replay (holotron/engine_sessions.py): the tokens of six
    continuations on three rows equal those with the prefix copied as before (HOLOTRON_PREFIX_GRAPHS=0) and those
    of the plain loop on the whole prompt."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M-M*-M"), seed=8).cuda()

    def check(on, graphs):
        assert any(isinstance(g, torch.cuda.CUDAGraph) for g in graphs.values()) == on

    _prefix_continuations(monkeypatch, "PREFIX_GRAPHS", model, _ids(21, seed=63),
                          [_ids(1 + i % 3, seed=64 + i) for i in range(6)], 6, check)


@pytest.mark.gpu
def test_prefix_loads_of_several_rows_by_one_graph_equal_the_plain_loop(monkeypatch):
    """Nine continuations of one prefix on three rows, all of the same length: they are admitted three at a time,
    so the third group's rows are loaded by a replay of the graph captured at the second (a bucket of 4 rows, the
    last repeated). Their tokens equal those loaded row by row (HOLOTRON_BATCH_LOADS=0) and the plain loop's."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M-M*-M"), seed=9).cuda()

    def check(batched, graphs):
        assert set(graphs) == ({4} if batched else {1})
        assert isinstance(graphs[4 if batched else 1], torch.cuda.CUDAGraph)

    _prefix_continuations(monkeypatch, "BATCH_LOADS", model, _ids(17, seed=83),
                          [_ids(3, seed=84 + i) for i in range(9)], 5, check)


@pytest.mark.gpu
def test_cuda_graph_vl_and_sampling():
    model = tiny_vl(seed=2).cuda()
    tiles = torch.randn(2, 3, TILE, TILE, generator=torch.Generator().manual_seed(1)).cuda()
    ids = torch.tensor([[5, 40, IMG_START] + [IMAGE_TOKEN_ID] * (2 * TOKENS_PER_TILE) + [IMG_END, 42, 43]]).cuda()
    kw = dict(pixel_values=tiles, eos_token_id=[])
    assert torch.equal(generate(model, ids, 8, **kw), generate(model, ids, 8, engine=False, **kw))
    a = generate(model, ids, 8, temperature=1.0, seed=5, **kw)
    assert torch.equal(a, generate(model, ids, 8, temperature=1.0, seed=5, **kw))
    assert torch.equal(generate(model, ids, 8, temperature=2.0, top_k=1, seed=1, **kw),
                       generate(model, ids, 8, engine=False, **kw))
    release(model)


@pytest.mark.gpu
def test_vision_and_chunk_graphs_on_cuda_equal_the_plain_loop():
    """Screenshots of turns admitted together go through the vision graphs (tiles rounded up to a bucket,
    pad tiles dropped; several calls of one bucket in one admission), their prompts through the chunk
    graphs, rows exchanged by the swap graph."""
    model = tiny_vl(seed=2).cuda()
    tiles = torch.randn(3, 3, TILE, TILE, generator=torch.Generator().manual_seed(0)).cuda()

    def prompt(n_tiles, before, after):
        return torch.tensor(list(before) + [IMG_START] + [IMAGE_TOKEN_ID] * (n_tiles * TOKENS_PER_TILE) + [IMG_END]
                            + list(after)).cuda()

    eng = Engine(model, max_batch=3, max_len=256, vision_tiles=2)  # 6 tiles admitted together: 3 calls of 2
    assert eng.prefill_graphs and eng.cuda_graph
    turns = [(prompt(1, (5, 40), (42, 43)), tiles[:1], 9), (prompt(2, (6,), (45,)), tiles[1:], 4),
             (prompt(3, (7, 8), ()), tiles, 6)]
    want = [generate(model, p[None], n, pixel_values=t, eos_token_id=[], engine=False)[0].tolist()
            for p, t, n in turns]
    for rnd in range(2):   # a bucket met the first time runs eagerly, the second time through its graph
        reqs = [eng.submit(p, pixel_values=t, max_new_tokens=n) for p, t, n in turns]
        eng.run()
        later = eng.submit(turns[0][0], pixel_values=tiles[:1], max_new_tokens=9)  # one tile alone: another bucket
        eng.run()
        assert [r.tokens for r in reqs] == want and later.tokens == want[0], rnd
        assert (len(eng.vision_graphs) >= 2 and len(eng.chunk_graphs) >= 1) == (rnd == 1)


@pytest.mark.gpu
def test_cuda_graphs_captured_while_another_thread_pins_memory():
    """A DataLoader's pin-memory thread allocating pinned buffers while a training run's eval builds an engine
    (``CAPTURE_MODE`` in holotron/devices.py): the captures hold, the tokens equal the plain loop's."""
    import threading

    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=7).cuda()
    ids, mask = _left_pad([_ids(n, seed=90 + n) for n in (6, 11)])
    ids, mask = ids.cuda(), mask.cuda()
    stop = threading.Event()

    def pin():
        while not stop.is_set():
            torch.empty(1 << 20, dtype=torch.uint8).pin_memory()

    th = threading.Thread(target=pin, daemon=True)
    th.start()
    try:
        engines = [Engine(model, max_batch=4, max_len=64) for _ in range(3)]
        got = generate(model, ids, 10, attention_mask=mask, eos_token_id=[])
    finally:
        stop.set()
        th.join()
    for eng in engines:
        assert eng.cuda_graph and sorted(eng.graphs) == [1, 2, 4] and not eng.naive_step
    assert torch.equal(got, generate(model, ids, 10, attention_mask=mask, eos_token_id=[], engine=False))
