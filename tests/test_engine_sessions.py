"""Agent sessions on the decode engine, against running each conversation alone with the plain loop:
multi-turn sessions, many sessions with admissions mixed into decoding, forks, saving to host memory and
restoring, more sessions than rows, screenshots batched across sessions, and bad requests (one clear
error each, the engine keeps serving the others). Also the pieces under them: ``HybridLM.extend`` into
rows of a ``DecodeState``, and the decode step leaving rows that are not decoding untouched."""

from __future__ import annotations

import pytest
import torch
from helpers import spy_chunks
from tiny_lm import random_ids as _ids
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)
from tiny_vl import IMAGE_TOKEN_ID, TILE, TOKENS_PER_TILE, tiny_vl

from holotron import kernels
from holotron.decode_ops import fused_decode
from holotron.engine import Engine, row_bytes
from holotron.generate import generate
from holotron.state import DecodeState, MambaState

IMG_START, IMG_END = 19, 20


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)


def _alone(model, history, n, **kw):
    """The plain loop on the whole conversation so far: the reference every session turn must equal."""
    return generate(model, history[None], n, engine=False, eos_token_id=[], **kw)[0].tolist()


def _drive(eng, agents):
    """Run ``agents`` (lists of (prompt, n_new)) as sessions with zero think time: each submits its next
    turn as soon as its previous one is done. Returns each agent's list of generated token lists."""
    sess = [eng.session() for _ in agents]
    out = [[] for _ in agents]
    nxt = [0] * len(agents)
    cur = [None] * len(agents)
    while True:
        for i, turns in enumerate(agents):
            if (cur[i] is None or cur[i].done) and nxt[i] < len(turns):
                if cur[i] is not None:
                    out[i].append(cur[i].tokens)
                p, n = turns[nxt[i]]
                cur[i] = eng.submit(p, session=sess[i], max_new_tokens=n)
                nxt[i] += 1
        if eng.idle:
            break
        eng.step()
    for i in range(len(agents)):
        out[i].append(cur[i].tokens)
    return out, sess


def _reference(model, turns):
    """Each turn's tokens from the plain loop over the whole history (prompt, answer, prompt, ...)."""
    dev = turns[0][0].device
    hist, out = torch.empty(0, dtype=torch.long, device=dev), []
    for p, n in turns:
        hist = torch.cat([hist, p])
        gen = _alone(model, hist, n)
        out.append(gen)
        hist = torch.cat([hist, torch.tensor(gen, device=dev)])
    return out


def _assert_same_states(st, ref_st):
    """Every layer's state of two DecodeStates (KV slots up to max_len: the spare slot holds garbage)."""
    for a, b in zip(st.layers, ref_st.layers):
        if isinstance(a, MambaState):
            torch.testing.assert_close(a.conv, b.conv, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.ssm, b.ssm, atol=1e-5, rtol=1e-5)
        elif a is not None:
            torch.testing.assert_close(a.k[:, :, :st.max_len], b.k[:, :, :st.max_len], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.v[:, :, :st.max_len], b.v[:, :, :st.max_len], atol=1e-5, rtol=1e-5)


def _chunk_of(model, counts: list[int], T: int, seed: int):
    """A right-padded chunk (len(counts), T, D) of embeddings on the model's device: row i's first counts[i]
    positions hold tokens of seed ``seed + i``, the rest zeros."""
    emb = model.backbone.embeddings
    chunk = torch.zeros(len(counts), T, model.config.hidden_size, device=emb.weight.device, dtype=emb.weight.dtype)
    for i, n in enumerate(counts):
        if n:
            chunk[i, :n] = emb(_ids(n, seed=seed + i).to(emb.weight.device))
    return chunk


def _rows_holding(model, history: int, max_len: int):
    """A DecodeState of 6 rows on the model's device, row r holding ``history`` tokens of seed r."""
    dev = model.backbone.embeddings.weight.device
    st = DecodeState.allocate(model, 6, max_len)
    x = torch.stack([model.backbone.embeddings(_ids(history, seed=r).to(dev)) for r in range(6)])
    model.extend(x, st, list(range(6)), [0] * 6, [history] * 6)
    return st


def test_extend_into_scattered_rows_equals_one_forward(model):
    prompts = [_ids(n, seed=n) for n in (13, 7, 20)]
    with torch.no_grad():
        ref = [model(p[None])[0, -1] for p in prompts]
        st = DecodeState.allocate(model, 5, 64)
        rows, cut = [4, 1, 2], [5, 3, 11]   # not consecutive: copies in and out of the Mamba rows

        def batch(parts):
            t = max(len(p) for p in parts)
            x = torch.zeros(len(parts), t, model.config.hidden_size)
            for i, p in enumerate(parts):
                x[i, :len(p)] = model.backbone.embeddings(p)  # right-padded
            return x

        first = [p[:c] for p, c in zip(prompts, cut)]
        rest = [p[c:] for p, c in zip(prompts, cut)]
        model.extend(batch(first), st, rows, [0, 0, 0], [len(p) for p in first])
        out = model.extend(batch(rest), st, rows, cut, [len(p) for p in rest])
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    assert st.lengths.tolist() == [0, 7, 20, 0, 13]


@pytest.mark.parametrize("pattern", ["M*-M*", "M-M"])
def test_mixed_pass_equals_a_decode_step_and_an_extend(pattern):
    """``HybridLM.mixed``: decode tokens of rows [0, n) and a chunk of other rows in one pass give the
    logits, states and lengths of a ``step`` of those rows followed by an ``extend`` of the chunk; a chunk row
    may be an inactive one of the first n (row 1 here), and a row of pads only (count 0) stays as it was."""
    model = tiny_lm(tiny_config(hybrid_override_pattern=pattern), seed=7)
    with torch.no_grad():
        chunk = _chunk_of(model, [11, 4, 0], 11, seed=20)
        toks, active = torch.tensor([4, 9, 30]), torch.tensor([1, 0, 1])
        ref_st = _rows_holding(model, 9, 64)
        ref_dec = model.step(toks, ref_st.rows(3), active)
        ref_pre = model.extend(chunk[:2], ref_st, [5, 1], [9, 9], [11, 4])
        st = _rows_holding(model, 9, 64)
        dec, pre = model.mixed(toks, st, active, chunk, torch.tensor([5, 1, 4]), torch.tensor([9, 9, 9]),
                               torch.tensor([11, 4, 0]))
    torch.testing.assert_close(dec[[0, 2]], ref_dec[[0, 2]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pre[:2], ref_pre, atol=1e-5, rtol=1e-5)
    assert st.lengths.tolist() == ref_st.lengths.tolist() == [10, 13, 10, 9, 9, 20]
    _assert_same_states(st, ref_st)


@pytest.mark.parametrize("scan", ["chunked", "triton"])
def test_mixed_pass_in_bf16_with_the_kernels_equals_a_step_and_an_extend(row_kernel_counts, scan):
    """The mixed pass in bf16 where the decode step's kernels run (Triton's interpreter here): both parts'
    group norms write rows of one buffer before out_proj (no concatenation); with the Triton scan and conv,
    the chunk rows' states read and written at their rows inside the kernels (``ssd_scan_rows``,
    ``conv_seq(rows=)``); against a step and an extend."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=7).to(torch.bfloat16)
    with torch.no_grad():
        chunk = _chunk_of(model, [11, 4], 11, seed=20)
        toks, active = torch.tensor([4, 9, 30]), torch.tensor([1, 1, 1])
        ref_st = _rows_holding(model, 9, 64)
        ref_dec = model.step(toks, ref_st.rows(3), active)
        ref_pre = model.extend(chunk, ref_st, [5, 4], [9, 9], [11, 4])
        st = _rows_holding(model, 9, 64)
        with fused_decode("on"), kernels.use_backend(scan):
            dec, pre = model.mixed(toks, st, active, chunk, torch.tensor([5, 4]), torch.tensor([9, 9]),
                                   torch.tensor([11, 4]))
    assert row_kernel_counts.count("group_rms_norm_triton") == 4   # 2 Mamba layers: the decode rows, the chunk
    _assert_rel(dec, ref_dec, torch.bfloat16)
    _assert_rel(pre, ref_pre, torch.bfloat16)
    assert st.lengths.tolist() == ref_st.lengths.tolist()


@pytest.fixture
def row_kernel_counts(monkeypatch):
    from holotron.kernels import group_norm_triton

    calls = []
    real = group_norm_triton.group_rms_norm_triton
    monkeypatch.setattr(group_norm_triton, "group_rms_norm_triton",
                        lambda *a, **kw: calls.append("group_rms_norm_triton") or real(*a, **kw))
    return calls


def test_extend_static_equals_extend_with_rows_of_pads(model):
    """``extend_static`` (positions on the device, the form a CUDA graph captures) equals ``extend``; an
    extra row with count 0 (what the engine's warm-ups and captures run) leaves its state row as it was."""
    with torch.no_grad():
        chunk = _chunk_of(model, [12, 5, 0], 12, seed=30)
        ref_st = _rows_holding(model, 9, 64)
        ref = model.extend(chunk[:2], ref_st, [4, 1], [9, 9], [12, 5])
        st = _rows_holding(model, 9, 64)
        spare_before = [(s.conv[5].clone(), s.ssm[5].clone()) for s in st.layers if isinstance(s, MambaState)]
        got = model.extend_static(chunk, st, torch.tensor([4, 1, 5]), torch.tensor([9, 9, 9]), torch.tensor([12, 5, 0]))
    torch.testing.assert_close(got[:2], ref, atol=1e-5, rtol=1e-5)
    assert st.lengths.tolist() == ref_st.lengths.tolist() == [9, 14, 9, 9, 21, 9]
    _assert_same_states(st, ref_st)
    for (c, s), layer in zip(spare_before, [s for s in st.layers if isinstance(s, MambaState)]):
        assert torch.equal(c, layer.conv[5]) and torch.equal(s, layer.ssm[5])


def test_a_decode_step_leaves_rows_that_are_not_decoding_unchanged(model):
    with torch.no_grad():
        st = DecodeState.allocate(model, 4, 64)
        x = model.backbone.embeddings(_ids(9, seed=1))[None].expand(4, -1, -1).contiguous()
        model.extend(x, st, [0, 1, 2, 3], [0] * 4, [9] * 4)
        before = [(s.conv.clone(), s.ssm.clone()) if isinstance(s, MambaState) else (s.k.clone(), s.v.clone())
                  for s in st.layers if s is not None]
        active = torch.tensor([1, 0, 1, 0])
        model.step(torch.tensor([5, 6, 7, 8]), st, active)
    assert st.lengths.tolist() == [10, 9, 10, 9]
    after = [(s.conv, s.ssm) if isinstance(s, MambaState) else (s.k, s.v) for s in st.layers if s is not None]
    for (a0, a1), (b0, b1) in zip(before, after):
        if a0.dim() == 4:  # keys and values: every slot but the spare one (slot max_len) the step writes to
            a0, a1, b0, b1 = (t[:, :, :st.max_len] for t in (a0, a1, b0, b1))
        for r in (1, 3):
            assert torch.equal(a0[r], b0[r]) and torch.equal(a1[r], b1[r])
        assert not torch.equal(a1[0], b1[0])


@pytest.mark.parametrize("backend", ["naive", "triton"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_ssd_step_does_not_write_the_state_of_inactive_rows(backend, state_dtype):
    if backend == "triton" and "triton" not in kernels.available_backends("cpu"):
        pytest.skip("triton not installed")
    g = torch.Generator().manual_seed(1)
    b, h, p, n = 3, 4, 8, 16
    state = torch.randn(b, h, p, n, generator=g).to(state_dtype)
    x, z = torch.randn(b, h, p, generator=g), torch.randn(b, h, p, generator=g)
    dt, A = torch.rand(b, h, generator=g), -torch.rand(h, generator=g) - 0.5
    B, C = torch.randn(b, 2, n, generator=g), torch.randn(b, 2, n, generator=g)
    kw = dict(D=torch.ones(h), z=z, dt_softplus=True)
    ref_state = state.clone()
    ref = kernels.ssd_step(ref_state, x, dt, A, B, C, backend=backend, **kw)   # the same backend, no mask
    got_state = state.clone()
    got = kernels.ssd_step(got_state, x, dt, A, B, C, backend=backend, active=torch.tensor([0, 1, 0]), **kw)
    assert torch.equal(got, ref)   # y of every row, the inactive ones too
    assert torch.equal(got_state[[0, 2]], state[[0, 2]]) and not torch.equal(ref_state[0], state[0])
    assert torch.equal(got_state[1], ref_state[1])


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_conv_step_keeps_the_window_of_inactive_rows(backend):
    if backend == "triton" and "triton" not in kernels.available_backends("cpu"):
        pytest.skip("triton not installed")
    g = torch.Generator().manual_seed(0)
    conv = torch.randn(3, 40, 4, generator=g)
    x, w, b = torch.randn(3, 40, generator=g), torch.randn(40, 4, generator=g), torch.randn(40, generator=g)
    ref_conv = conv.clone()
    ref = kernels.conv_step(ref_conv, x, w, b, backend="naive")
    got_conv = conv.clone()
    got = kernels.conv_step(got_conv, x, w, b, backend=backend, active=torch.tensor([1, 0, 1]))
    torch.testing.assert_close(got, ref)
    assert torch.equal(got_conv[1], conv[1])
    torch.testing.assert_close(got_conv[[0, 2]], ref_conv[[0, 2]])


def test_a_session_turn_prefills_only_the_new_tokens_and_equals_the_whole_history(model):
    eng = Engine(model, max_batch=2, max_len=128)
    turns = [(_ids(12, seed=1), 5), (_ids(7, seed=2), 6), (_ids(3, seed=3), 4)]
    with spy_chunks(eng) as chunks:
        got, (s,) = _drive(eng, [turns])
    assert got[0] == _reference(model, turns)
    # each later turn: the last answer's final token, then its own prompt
    assert [n for _, n, _ in chunks] == [12, 1 + 7, 1 + 3]
    assert s.length == 12 + 5 + 7 + 6 + 3 + 4 - 1 and s.pending == got[0][-1][-1]


@pytest.mark.parametrize("mode", ["mixed", "mixed-fed", "separate", "overlap", "static"])
def test_many_sessions_with_admissions_mixed_into_decoding_equal_each_alone(model, mode):
    """mixed: chunks and decode tokens in one pass (``HybridLM.mixed`` on the static chunk buffers, eager here),
    short prompts as chunks too (a mixed engine's default); mixed-fed: the same with short prompts read by the
    decode steps; separate: a decode step, then the chunk, with short prompts read by decode steps; static: the
    chunks of ``prefill_graphs`` (bucketed rows and tokens, ``extend_static`` on static buffers; eager here, no
    CUDA graph); overlap (off CUDA: a chunk is finished one engine step after it ran): rows' lengths are set late
    and rows of a chunk are not moved before it is finished."""
    agents = [[(_ids(5 + 3 * a + t, seed=10 * a + t), 3 + (a + t) % 4) for t in range(3)] for a in range(5)]
    mixed = mode.startswith("mixed")
    eng = Engine(model, max_batch=5, max_len=192, prefill_tokens=12, overlap=mode == "overlap",
                 mixed=mixed, prefill_graphs=mode == "static",
                 step_prompt_max=32 if mode == "mixed-fed" else None)  # chunks span steps
    with spy_chunks(eng) as chunks:
        got, _ = _drive(eng, agents)
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns), f"agent {a}"
    fed = eng.prefill_tokens_done + eng.stats["forced_tokens"]  # chunks + prompts read by decode steps
    assert fed == sum(len(p) for turns in agents for p, _ in turns) + sum(len(turns) - 1 for turns in agents)
    assert eng.prefill_tokens_done > 0 and eng.stats["decode_steps"] > 0
    with_decode = sum(d > 0 for *_, d in chunks)
    # short prompts read by decode steps in every mode but a mixed engine's default
    assert (eng.stats["forced_tokens"] > 0) == (mode != "mixed")
    if mixed:   # the chunks that ran while rows decoded ran in the same pass as the decode tokens
        assert with_decode == eng.stats["mixed_steps"] > 0
    elif mode == "static":  # every chunk through extend_static (neither extend nor mixed)
        assert not chunks and eng.stats["mixed_steps"] == 0
    else:
        assert with_decode == eng.stats["mixed_steps"] == 0


def test_short_prompts_read_through_decode_steps_equal_a_prefill(model):
    agents = [[(_ids(4 + a, seed=60 + a), 3 + 4 * a), (_ids(3, seed=70 + a), 5)] for a in range(3)]
    runs = {}
    for limit in (0, 32):
        eng = Engine(model, max_batch=3, max_len=128, step_prompt_max=limit, mixed=False)
        runs[limit] = (_drive(eng, agents)[0], dict(eng.stats))
    assert runs[0][1]["forced_tokens"] == 0 and runs[32][1]["forced_tokens"] > 0
    assert runs[0][0] == runs[32][0] == [_reference(model, turns) for turns in agents]


def test_waiting_for_fuller_chunks_runs_fewer_and_gives_the_same_tokens(model):
    agents = [[(_ids(6 + 2 * a, seed=100 + a), 3 + a), (_ids(9, seed=110 + a), 4)] for a in range(4)]
    runs = {}
    for least in (0, 24):
        eng = Engine(model, max_batch=4, max_len=128, step_prompt_max=0, prefill_min_tokens=least,
                     prefill_max_wait=3)
        with spy_chunks(eng) as chunks:
            runs[least] = (_drive(eng, agents)[0], len(chunks))
    assert runs[0][0] == runs[24][0] == [_reference(model, turns) for turns in agents]
    assert runs[24][1] < runs[0][1]


@pytest.mark.parametrize("mode", ["mixed", "separate", "overlap"])
def test_a_row_being_prefilled_below_the_decoding_ones_is_moved_only_after_its_chunk(model, mode):
    """Agent 0 ends its first turn early and sends a long second one (several chunks) from a low row
    while agents 1 and 2 decode: compaction must not move that row while a chunk writes it (mixed: the
    chunk's rows are moved above the decoding ones before the pass)."""
    agents = [[(_ids(6, seed=90), 2), (_ids(40, seed=91), 4)], [(_ids(5, seed=92), 30)], [(_ids(7, seed=93), 30)]]
    eng = Engine(model, max_batch=3, max_len=128, prefill_tokens=8, overlap=mode == "overlap",
                 mixed=mode == "mixed", step_prompt_max=0)
    got, _ = _drive(eng, agents)
    assert got == [_reference(model, turns) for turns in agents]


def test_forks_continue_one_screen_independently(model):
    eng = Engine(model, max_batch=2, max_len=128)  # two rows: the second fork goes to host memory
    s = eng.session()
    first = _ids(10, seed=4)
    r = eng.submit(first, session=s, max_new_tokens=4)
    eng.run()
    a, b = eng.fork(s, 2)
    assert a.row is not None and b.on_host
    tasks = {a: _ids(4, seed=5), b: _ids(6, seed=6), s: _ids(2, seed=7)}
    reqs = {k: eng.submit(v, session=k, max_new_tokens=5) for k, v in tasks.items()}
    eng.run()
    for k, v in tasks.items():
        hist = torch.cat([first, torch.tensor(r.tokens), v])
        assert reqs[k].tokens == _alone(model, hist, 5)


@pytest.mark.parametrize("overlap", [False, True])
def test_save_restore_and_more_sessions_than_rows(model, overlap):
    agents = [[(_ids(6 + a, seed=20 + a), 4), (_ids(3, seed=30 + a), 3)] for a in range(5)]
    eng = Engine(model, max_batch=2, max_len=128, overlap=overlap)  # 5 sessions, 2 rows: idle ones on the host
    got, sess = _drive(eng, agents)
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns)
    mem = eng.memory()
    assert mem["sessions"] == 5 and mem["sessions_on_host"] >= 3 and mem["host_bytes"] > 0
    s = sess[0]
    if not s.on_host:
        eng.save(s)
    assert s.on_host and s.row is None
    eng.restore(s)
    assert s.row is not None and not s.on_host
    r = eng.submit(_ids(2, seed=40), session=s, max_new_tokens=3)
    eng.run()
    hist = torch.empty(0, dtype=torch.long)
    for (p, _), g in zip(agents[0], got[0]):
        hist = torch.cat([hist, p, torch.tensor(g)])
    assert r.tokens == _alone(model, torch.cat([hist, _ids(2, seed=40)]), 3)


def test_screenshots_of_many_sessions_go_through_the_vision_encoder_together():
    model = tiny_vl(seed=2)
    g = torch.Generator().manual_seed(0)
    calls = []
    orig = model.embed_images
    model.embed_images = lambda px: (calls.append(px.shape[0]), orig(px))[1]

    def turn(n_tiles, text):
        return torch.tensor([IMG_START] + [IMAGE_TOKEN_ID] * (n_tiles * TOKENS_PER_TILE) + [IMG_END] + text)

    try:
        eng = Engine(model, max_batch=3, max_len=256)
        shots = [torch.randn(n, 3, TILE, TILE, generator=g) for n in (1, 2, 1)]
        prompts = [turn(px.shape[0], [40 + i, 41]) for i, px in enumerate(shots)]
        sess = [eng.session() for _ in shots]
        reqs = [eng.submit(p, session=s, pixel_values=px, max_new_tokens=4) for p, s, px in zip(prompts, sess, shots)]
        eng.run()
        assert calls == [4]  # one encoder call for the three sessions' four tiles
        nxt = turn(1, [50])
        shot2 = torch.randn(1, 3, TILE, TILE, generator=g)
        r2 = eng.submit(nxt, session=sess[1], pixel_values=shot2, max_new_tokens=4)
        eng.run()
    finally:
        del model.embed_images
    for p, px, r in zip(prompts, shots, reqs):
        assert r.tokens == _alone(model, p, 4, pixel_values=px)
    hist = torch.cat([prompts[1], torch.tensor(reqs[1].tokens), nxt])
    assert r2.tokens == _alone(model, hist, 4, pixel_values=torch.cat([shots[1], shot2]), num_tiles=[2, 1])


def test_bad_requests_get_one_clear_error_and_the_others_are_served(model):
    eng = Engine(model, max_batch=2, max_len=64)
    good = eng.submit(_ids(8, seed=1), max_new_tokens=4)
    s = eng.session()
    busy = eng.submit(_ids(5, seed=2), session=s, max_new_tokens=3)
    with pytest.raises(ValueError, match="exceed the engine's max_len 64"):
        eng.submit(_ids(60, seed=3), max_new_tokens=8)
    with pytest.raises(ValueError, match="turn in flight"):
        eng.submit(_ids(2, seed=4), session=s)
    eng.run()
    with pytest.raises(ValueError, match=r"session \d+ holds 8 tokens"):
        eng.submit(_ids(50, seed=5), session=s, max_new_tokens=10)
    eng.close(s)
    with pytest.raises(ValueError, match="closed"):
        eng.submit(_ids(2, seed=6), session=s)
    with pytest.raises(ValueError, match="closed"):
        eng.fork(s)
    other = Engine(model, max_batch=1, max_len=64)
    with pytest.raises(ValueError, match="not a session of this engine"):
        other.submit(_ids(2, seed=7), session=eng.session())
    assert good.done and good.tokens == _alone(model, _ids(8, seed=1), 4)
    assert busy.done and busy.tokens == _alone(model, _ids(5, seed=2), 3)
    assert eng.idle and eng.live == 0


def test_without_offload_idle_sessions_holding_every_row_are_said_not_waited_for(model):
    eng = Engine(model, max_batch=1, max_len=64, offload=False)
    s = eng.session()
    eng.submit(_ids(4, seed=1), session=s, max_new_tokens=2)
    eng.run()
    waiting = eng.submit(_ids(4, seed=2), max_new_tokens=2)
    with pytest.raises(RuntimeError, match="idle sessions hold all 1 rows and offload is off"):
        eng.run()
    eng.save(s)
    eng.run()
    assert waiting.done and waiting.tokens == _alone(model, _ids(4, seed=2), 2)


def test_an_image_token_count_that_does_not_match_is_refused_at_submit():
    model = tiny_vl(seed=2)
    eng = Engine(model, max_batch=2, max_len=128)
    px = torch.randn(2, 3, TILE, TILE)
    ids = torch.tensor([IMG_START] + [IMAGE_TOKEN_ID] * TOKENS_PER_TILE + [IMG_END, 40])  # one tile's tokens
    with pytest.raises(ValueError, match=f"has {TOKENS_PER_TILE} <image> tokens but the images give "
                                         f"{2 * TOKENS_PER_TILE}"):
        eng.submit(ids, pixel_values=px)
    ok = eng.submit(ids, pixel_values=px[:1], max_new_tokens=3)
    eng.run()
    assert ok.done and ok.error is None and len(ok.tokens) == 3


def test_memory_accounting_matches_the_allocated_rows(model):
    eng = Engine(model, max_batch=3, max_len=128)
    mem = eng.memory()
    per = row_bytes(model, eng.max_len)
    assert mem["row_bytes"] == per["total"] == eng.state.bytes_per_row()["total"]
    assert Engine.rows_that_fit(model, eng.max_len, 10 * per["total"] + 1) == 10
    assert mem["rows"] == mem["sessions_fit"] == 3 and mem["rows_held"] == 0


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["graphs", "eager", "mixed", "mixed-eager", "overlap"])
def test_sessions_on_cuda_graphs_equal_each_alone(mode):
    """Graph steps with chunks as graphs (the default), eager chunks, mixed passes (chunk + decode tokens) as
    graphs and eagerly, chunks on their own stream (overlap); short prompts read by decode steps, offload. A
    mixed graph captured while other rows hold sessions changes none of them."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=7).cuda()
    agents = [[(_ids(5 + 20 * a + t, seed=10 * a + t).cuda(), 3 + (a + t) % 4 + 3 * a) for t in range(3)]
              for a in range(6)]
    mixed = mode.startswith("mixed")
    eng = Engine(model, max_batch=4, max_len=512, prefill_tokens=24, overlap=mode == "overlap", mixed=mixed,
                 prefill_graphs=None if mode in ("graphs", "mixed") else False, step_prompt_max=32)  # 6 agents, 4 rows
    if mode == "mixed-eager":
        eng._mixed_seen = _NeverSeen()
    assert eng.cuda_graph and eng.overlap == (mode == "overlap")
    assert eng.prefill_graphs == (mode in ("graphs", "mixed"))
    got, _ = _drive(eng, agents)
    assert eng.prefill_tokens_done > 0 and eng.memory()["sessions"] == 6 and eng.stats["forced_tokens"] > 0
    assert (eng.stats["mixed_steps"] > 0) == mixed
    assert (eng.stats["mixed_captures"] > 0) == (len(eng.mixed_graphs) > 0) == (mode == "mixed")
    assert (eng.stats["chunk_captures"] > 0) == (len(eng.chunk_graphs) > 0)
    if mode != "mixed":   # (a mixed engine's chunks that run alone may be graphs too)
        assert (len(eng.chunk_graphs) > 0) == (mode == "graphs")
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns), f"agent {a}"


class _NeverSeen(dict):
    """A ``_mixed_seen`` for which no shape was ever met: every mixed pass runs eagerly."""

    def get(self, key, default=None):
        return 0

    def __setitem__(self, key, value):
        pass


def _cuda_model(dtype):
    """A tiny hybrid on CUDA with the real model's attention head size (128)."""
    cfg = tiny_config(hybrid_override_pattern="M*M*", hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=128, mamba_num_heads=4, mamba_head_dim=64, ssm_state_size=32, chunk_size=16)
    return tiny_lm(cfg, seed=3).cuda().to(dtype)


def _assert_rel(got, ref, dtype):
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < (1e-4 if dtype == torch.float32 else 5e-2), err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_on_cuda_matches_one_forward(dtype):
    """The per-row attention (a lower-right causal bias over the row's cache: the fused kernels) at a
    head size of the real model's, in bf16 too."""
    model = _cuda_model(dtype)
    cfg = model.config
    prompts = [_ids(n, seed=n).cuda() for n in (130, 71, 200)]
    with torch.no_grad():
        ref = torch.stack([model(p[None])[0, -1] for p in prompts])
        st = DecodeState.allocate(model, 4, 256)
        cut = [60, 70, 17]
        for part in (0, 1):
            pieces = [p[:c] if part == 0 else p[c:] for p, c in zip(prompts, cut)]
            t = max(len(p) for p in pieces)
            x = torch.zeros(3, t, cfg.hidden_size, device="cuda", dtype=dtype)
            for i, p in enumerate(pieces):
                x[i, :len(p)] = model.backbone.embeddings(p)  # right-padded
            out = model.extend(x, st, [3, 0, 1], [0] * 3 if part == 0 else cut, [len(p) for p in pieces])
    _assert_rel(out, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_on_cuda_matches_step_and_extend(dtype):
    """``HybridLM.mixed`` on CUDA (the decode kernels on the decode rows, the scan and the Triton chunk attention
    on the chunk) against a ``step`` and an ``extend``, at the real model's attention head size."""
    model = _cuda_model(dtype)
    with torch.no_grad():
        chunk = _chunk_of(model, [70, 33], 70, seed=20)
        toks = torch.tensor([4, 9, 30, 50], device="cuda")
        ref_st = _rows_holding(model, 40, 256)
        ref_dec = model.step(toks, ref_st.rows(4), torch.ones(4, dtype=torch.long, device="cuda"))
        ref_pre = model.extend(chunk, ref_st, [5, 4], [40, 40], [70, 33])
        st = _rows_holding(model, 40, 256)
        dev = lambda v: torch.tensor(v, device="cuda")  # noqa: E731
        dec, pre = model.mixed(toks, st, dev([1] * 4), chunk, dev([5, 4]), dev([40, 40]), dev([70, 33]))
    _assert_rel(dec, ref_dec, dtype)
    _assert_rel(pre, ref_pre, dtype)
    assert st.lengths.tolist() == ref_st.lengths.tolist() == [41] * 4 + [73, 110]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_static_on_cuda_matches_extend(dtype):
    """The chunk as a graph runs ``extend_static`` (the Triton chunk attention): against ``extend`` (SDPA per
    row) on CUDA at the real model's attention head size, with history in the rows."""
    model = _cuda_model(dtype)
    with torch.no_grad():
        chunk = _chunk_of(model, [130, 33, 1], 130, seed=20)
        ref_st = _rows_holding(model, 90, 512)
        ref = model.extend(chunk, ref_st, [5, 2, 3], [90] * 3, [130, 33, 1])
        st = _rows_holding(model, 90, 512)
        dev = lambda v: torch.tensor(v, device="cuda")  # noqa: E731
        got = model.extend_static(chunk, st, dev([5, 2, 3]), dev([90] * 3), dev([130, 33, 1]))
    _assert_rel(got, ref, dtype)
    assert st.lengths.tolist() == ref_st.lengths.tolist()
