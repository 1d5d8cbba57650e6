"""Sessions dropped for host memory and replayed (``Engine(host_limit=)``, holotron/engine_replay.py): when
saving an idle session would take the saved sessions past the limit, its state is given up and its next turn
prefills the whole conversation again (prompts, answers, every screenshot) before its own tokens. Each
conversation's greedy tokens must equal that conversation run alone with the plain loop, whether its sessions
were saved, dropped or both; a cancelled or failed turn must leave a dropped session replayable; bad
arguments are one clear error."""

from __future__ import annotations

import pytest
import torch
from test_engine_vision_stream import _agents, _drive, _reference
from tiny_lm import random_ids, scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)
from tiny_vl import tiny_vl

from holotron.engine import Engine
from holotron.generate import generate


@pytest.fixture(scope="module")
def vl():
    return tiny_vl(seed=3)


@pytest.mark.parametrize("mixed,vision_stream", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("limit", ["none", "zero", "one session"])
def test_agents_on_fewer_rows_equal_each_conversation_alone_whether_saved_or_dropped(vl, mixed, vision_stream, limit):
    agents = _agents(5, 3, seed=2)
    probe = Engine(vl, max_batch=2, max_len=512)
    one = probe.state.bytes_per_row(60)["total"]   # about one idle session after a turn or two
    host_limit = {"none": None, "zero": 0, "one session": one}[limit]
    eng = Engine(vl, max_batch=2, max_len=512, prefill_tokens=40, mixed=mixed, host_limit=host_limit,
                 vision_stream=vision_stream)
    got, _ = _drive(eng, agents, "cpu")
    for a, turns in enumerate(agents):
        assert got[a] == _reference(vl, turns, "cpu"), f"agent {a}"
    st, mem = eng.stats, eng.memory()
    if limit == "none":
        assert st["sessions_dropped"] == 0 and st["replayed_turns"] == 0
    else:
        assert st["sessions_dropped"] > 0 and st["replayed_turns"] > 0 and st["replayed_tokens"] > 0
        assert mem["host_bytes"] <= host_limit
        assert mem["host_limit"] == host_limit and mem["turns_bytes"] > 0
    if limit == "zero":
        assert mem["sessions_on_host"] == 0


def _alone(model, history, n):
    return generate(model, history[None], n, engine=False, eos_token_id=[])[0].tolist()


def test_a_dropped_session_started_from_a_prefix_replays_from_that_prefix():
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)
    eng = Engine(model, max_batch=1, max_len=256, host_limit=0)
    pre_ids, a1, b1, a2 = random_ids(20, seed=1), random_ids(7, seed=2), random_ids(9, seed=3), random_ids(5, seed=4)
    pre = eng.prefix(pre_ids)
    sa, sb = eng.session(), eng.session()
    ra = eng.submit(a1, session=sa, prefix=pre, max_new_tokens=4)
    eng.run()
    rb = eng.submit(b1, session=sb, max_new_tokens=3)   # takes sa's row: sa is dropped
    eng.run()
    assert sa.dropped and sa.row is None and not sa.on_host
    ra2 = eng.submit(a2, session=sa, max_new_tokens=5)
    eng.run()
    assert eng.stats["replayed_turns"] == 1
    hist = torch.cat([pre_ids, a1])
    assert ra.tokens == _alone(model, hist, 4)
    assert rb.tokens == _alone(model, b1, 3)
    hist = torch.cat([hist, torch.tensor(ra.tokens), a2])
    assert ra2.tokens == _alone(model, hist, 5)
    assert sa.length == hist.numel() + 4 and sa.pending == ra2.tokens[-1]


def test_a_cancelled_turn_of_a_dropped_session_leaves_it_replayable_and_forks_share_the_turns():
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)
    eng = Engine(model, max_batch=1, max_len=256, host_limit=0)
    a1, b1, a2, a3 = (random_ids(n, seed=s) for n, s in ((8, 1), (6, 2), (5, 3), (4, 4)))
    sa, sb = eng.session(), eng.session()
    ra = eng.submit(a1, session=sa, max_new_tokens=3)
    eng.run()
    eng.submit(b1, session=sb, max_new_tokens=2)
    eng.run()
    assert sa.dropped
    eng.cancel(eng.submit(a2, session=sa, max_new_tokens=3))   # never admitted: as if never sent
    assert sa.dropped and len(sa.turns) == 1
    (fork,) = eng.fork(sa)
    assert fork.dropped and len(fork.turns) == 1
    rf = eng.submit(a3, session=fork, max_new_tokens=4)
    eng.run()
    ra3 = eng.submit(a3, session=sa, max_new_tokens=4)
    eng.run()
    hist = torch.cat([a1, torch.tensor(ra.tokens), a3])
    assert rf.tokens == ra3.tokens == _alone(model, hist, 4)
    eng.close(sa)
    assert sa.turns is None and not sa.dropped and eng.memory()["turns_bytes"] == sum(
        t.ids.nbytes for t in fork.turns + sb.turns)


def test_bad_host_limits_and_calls_on_a_dropped_session_are_one_clear_error():
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)
    for bad in (-1, 1.5, True, "1GB"):
        with pytest.raises(ValueError, match="host_limit must be None or bytes >= 0"):
            Engine(model, max_batch=1, max_len=64, host_limit=bad)
    with pytest.raises(ValueError, match="offload=False"):
        Engine(model, max_batch=1, max_len=64, host_limit=0, offload=False)
    eng = Engine(model, max_batch=1, max_len=128, host_limit=0)
    sa, sb = eng.session(), eng.session()
    eng.submit(random_ids(6, seed=1), session=sa, max_new_tokens=2)
    eng.run()
    eng.submit(random_ids(6, seed=2), session=sb, max_new_tokens=2)
    eng.run()
    assert sa.dropped and repr(sa).endswith("dropped)")
    with pytest.raises(ValueError, match="dropped for host memory.*submit that turn"):
        eng.restore(sa)
    emb = torch.zeros(3, model.config.hidden_size)
    with pytest.raises(ValueError, match="pass input_ids and pixel_values, not embeddings"):
        eng.submit(inputs_embeds=emb, session=sa, max_new_tokens=2)
    assert not sa.busy and len(sa.turns) == 1   # the refused turn left nothing behind


def test_a_session_given_embeddings_is_saved_past_the_limit_not_dropped():
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)
    eng = Engine(model, max_batch=1, max_len=128, host_limit=0)
    sa, sb = eng.session(), eng.session()
    emb = model.backbone.embeddings(random_ids(5, seed=1))
    eng.submit(inputs_embeds=emb, session=sa, max_new_tokens=2)
    eng.run()
    eng.submit(random_ids(4, seed=2), session=sb, max_new_tokens=2)
    eng.run()
    assert sa.turns is None and sa.on_host and not sa.dropped


def test_the_limit_counts_kept_turns_once_and_gives_cached_memory_back_before_dropping(vl, monkeypatch):
    import holotron.engine_replay as replay

    p, px, n = _agents(1, 1, seed=6)[0][0]
    eng = Engine(vl, max_batch=1, max_len=512, host_limit=10**12)
    sa, sb = eng.session(), eng.session()
    for s in (sa, sb):
        eng.submit(p, session=s, pixel_values=px, max_new_tokens=n)   # one turn, sent by both sessions
        eng.run()
    assert sa.turns[0].ids is sb.turns[0].ids is p and sa.turns[0].pixel_values is px
    kept = p.nbytes + px.nbytes
    assert eng.memory()["turns_bytes"] == kept   # the prompt and screenshot both sessions sent, once
    assert eng._host_held() == kept + sum(x.snapshot.host_bytes() for x in (sa, sb) if x.snapshot is not None)
    # past the limit with memory the allocator caches: it is given back and the session saved, not dropped
    held = [eng.host_limit, 0]
    freed = []
    monkeypatch.setattr(eng, "_host_held", lambda: held[len(freed)])
    monkeypatch.setattr(replay, "free_cached_pinned", lambda: freed.append(1))
    eng.submit(random_ids(5, seed=1), session=sa, max_new_tokens=1)   # sb, idle on the row, is evicted
    eng.run()
    assert freed == [1] and sb.on_host and not sb.dropped
    # past it after the cached memory is given back: dropped
    held[:] = [eng.host_limit] * 3
    freed.clear()
    eng.submit(random_ids(5, seed=2), session=sb, max_new_tokens=1)   # sa is evicted
    eng.run()
    assert freed == [1] and sa.dropped and not sa.on_host
    # at the limit with free pages that hold the snapshot: it takes them, nothing is given back or dropped
    monkeypatch.setattr(replay, "pooled_bytes", lambda: 10**9)
    freed.clear()
    eng.submit(random_ids(5, seed=3), session=sa, max_new_tokens=1)   # sb is evicted
    eng.run()
    assert freed == [] and sb.on_host and not sb.dropped


@pytest.mark.gpu
def test_dropped_sessions_replay_on_cuda_graphs_with_the_vision_stream():
    model = tiny_vl(seed=3).cuda()
    agents = _agents(5, 3, seed=2)
    eng = Engine(model, max_batch=2, max_len=512, prefill_tokens=40, vision_stream=True, host_limit=0)
    assert eng.cuda_graph
    got, _ = _drive(eng, agents, "cuda")
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns, "cuda"), f"agent {a}"
    assert eng.stats["sessions_dropped"] > 0 and eng.stats["replayed_turns"] > 0


@pytest.mark.gpu
def test_a_screenshot_on_the_gpu_is_kept_once_on_the_host_while_it_lives():
    model = tiny_vl(seed=3).cuda()
    eng = Engine(model, max_batch=1, max_len=512, host_limit=0)
    p, px, n = _agents(1, 1, seed=4)[0][0]
    px = px.cuda()
    s = eng.session()
    for _ in range(2):   # the same screenshot tensor sent by two turns
        eng.submit(p.cuda(), session=s, pixel_values=px, max_new_tokens=n)
        eng.run()
    a, b = s.turns
    assert a.pixel_values is b.pixel_values and a.pixel_values.is_pinned()
    assert torch.equal(a.pixel_values, px.cpu())
    px.add_(1)   # written to: the next turn gets a copy of its own
    eng.submit(p.cuda(), session=s, pixel_values=px, max_new_tokens=1)
    eng.run()
    assert s.turns[2].pixel_values is not a.pixel_values and torch.equal(s.turns[2].pixel_values, px.cpu())


@pytest.mark.gpu
def test_pinned_memory_is_measured_and_cached_blocks_are_given_back():
    from holotron.state_snapshot import free_cached_pinned, pinned_held

    torch.zeros(1, device="cuda")
    base = pinned_held()
    assert base is not None   # torch's pinned allocator reports its bytes
    x = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    held = pinned_held()
    assert held >= base + (64 << 20)
    del x   # freed: torch keeps the block cached for reuse
    assert pinned_held() == held
    free_cached_pinned()
    assert pinned_held() <= held - (64 << 20)
