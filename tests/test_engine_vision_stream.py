"""The engine's ``vision_stream`` (holotron/engine_vision.py): screenshots admitted in a step are embedded on a
stream of their own and their turns prefilled once that work is done. Off CUDA the "event" is done from its
second query on, so turns with a screenshot wait for it while other rows decode. Agents of several turns, a
screenshot each turn, must get the tokens of each conversation run alone with the plain loop, and the engine
must not stall when the only work left waits for the vision encoder."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import scan_backend_of_the_device  # noqa: F401 (autouse fixture)
from tiny_vl import IMAGE_TOKEN_ID, TILE, TOKENS_PER_TILE, tiny_vl

from holotron.engine import Engine
from holotron.generate import generate

IMG_START, IMG_END = 19, 20


def _turn(n_tiles: int, text: list[int]) -> torch.Tensor:
    return torch.tensor([IMG_START] + [IMAGE_TOKEN_ID] * (n_tiles * TOKENS_PER_TILE) + [IMG_END] + text)


def _agents(n_agents: int, n_turns: int, seed: int):
    """Per agent, per turn: (prompt ids, pixel values (tiles, 3, TILE, TILE), new tokens)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in range(n_agents):
        turns = []
        for t in range(n_turns):
            tiles = 1 + (a + t) % 2
            text = torch.randint(30, 200, (2 + (a * 3 + t) % 5,), generator=g).tolist()
            turns.append((_turn(tiles, text), torch.randn(tiles, 3, TILE, TILE, generator=g), 2 + (a + 2 * t) % 4))
        out.append(turns)
    return out


def _drive(eng, agents, device):
    """Each agent submits its next turn when the previous one is done. Returns (tokens per agent per turn,
    per turn: (engine step it entered the prefill at, engine steps done when its first token came))."""
    sess = [eng.session() for _ in agents]
    out, when = [[] for _ in agents], [[] for _ in agents]
    cur, nxt = [None] * len(agents), [0] * len(agents)
    first: dict[int, int] = {}
    while True:
        for i, turns in enumerate(agents):
            if (cur[i] is None or cur[i].done) and nxt[i] < len(turns):
                if cur[i] is not None:
                    out[i].append(cur[i].tokens)
                p, px, n = turns[nxt[i]]
                cur[i] = eng.submit(p.to(device), session=sess[i], pixel_values=px.to(device), max_new_tokens=n)
                when[i].append(cur[i])
                nxt[i] += 1
        if eng.idle:
            break
        for req, _ in eng.step():
            first.setdefault(id(req), eng.steps)
    for i in range(len(agents)):
        out[i].append(cur[i].tokens)
    return out, [[(r.admitted_step, first[id(r)]) for r in w] for w in when]


def _reference(model, turns, device):
    """Each turn's tokens from the plain loop over the whole conversation so far, every screenshot in it."""
    hist, shots, tiles, out = torch.empty(0, dtype=torch.long), [], [], []
    for p, px, n in turns:
        hist = torch.cat([hist, p])
        shots.append(px)
        tiles.append(px.shape[0])
        toks = generate(model, hist[None].to(device), n, engine=False, eos_token_id=[],
                        pixel_values=torch.cat(shots).to(device), num_tiles=tiles)[0].tolist()
        out.append(toks)
        hist = torch.cat([hist, torch.tensor(toks)])
    return out


@pytest.mark.parametrize("mixed", [False, True])
def test_turns_whose_screenshots_run_on_the_vision_stream_equal_each_conversation_alone(mixed):
    model = tiny_vl(seed=3)
    agents = _agents(4, 3, seed=1)
    got = {}
    for side in (False, True):
        eng = Engine(model, max_batch=3, max_len=512, prefill_tokens=40, mixed=mixed, vision_stream=side)
        got[side], steps = _drive(eng, agents, "cpu")
        assert eng.stats["vision_tiles"] == sum(px.shape[0] for turns in agents for _, px, _ in turns)
        # a turn's first token comes out of the step that admitted it (f - s == 1) only when its screenshot's
        # work is not waited for: with the vision stream, never while other rows decode (every agent's later
        # turns here; without it, some of them do)
        waits = [f - s for turns in steps for s, f in turns[1:]]
        assert (min(waits) >= 2) if side else (min(waits) == 1), waits
    for a, turns in enumerate(agents):
        assert got[True][a] == got[False][a] == _reference(model, turns, "cpu"), f"agent {a}"


def test_a_turn_alone_waiting_for_its_screenshot_does_not_stall_the_engine():
    """Nothing decodes: the chunk waits for the vision work (``synchronize``) instead of stepping forever."""
    model = tiny_vl(seed=4)
    (p, px, n), = _agents(1, 1, seed=2)[0]
    eng = Engine(model, max_batch=2, max_len=256, vision_stream=True)
    req = eng.submit(p, pixel_values=px, max_new_tokens=n)
    eng.step()
    assert req.tokens and req.ready is None  # prefilled in the step that admitted it: waited, not skipped
    eng.run()
    assert req.tokens == _reference(model, [(p, px, n)], "cpu")[0]


def test_a_turn_cancelled_while_its_screenshot_is_embedded_leaves_the_others_as_alone():
    model = tiny_vl(seed=5)
    agents = _agents(3, 2, seed=3)
    eng = Engine(model, max_batch=3, max_len=512, prefill_tokens=40, vision_stream=True)
    sess = [eng.session() for _ in agents]
    (p0, px0, n0) = agents[0][0]
    first = eng.submit(p0, session=sess[0], pixel_values=px0, max_new_tokens=n0 + 6)
    while first.phase != "decode":
        eng.step()
    reqs = [eng.submit(p, session=s, pixel_values=px, max_new_tokens=n)
            for (p, px, n), s in zip([t[0] for t in agents[1:]], sess[1:])]
    eng.step()  # admitted; their screenshots' work not yet taken
    assert all(r.phase == "prefill" and r.ready is not None for r in reqs)
    eng.cancel(reqs[0])
    eng.run()
    assert reqs[0].done and not reqs[0].tokens
    assert reqs[1].tokens == _reference(model, agents[2][:1], "cpu")[0]
    assert first.tokens == _reference(model, [(p0, px0, n0 + 6)], "cpu")[0]


class _DoneAfterDecode:
    """A screenshot's "event" as on a GPU: done once the engine has run a decode step after the admission."""

    def __init__(self, engine):
        self.engine, self.n = engine, engine.stats["decode_steps"]

    def query(self) -> bool:
        return self.engine.stats["decode_steps"] > self.n

    def synchronize(self) -> None:
        """Nothing to wait for: the work ran when it was queued."""


def test_mixed_engine_keeps_a_turn_whose_screenshot_was_not_ready_for_the_next_mixed_pass(monkeypatch):
    """The screenshot's work finishes during the step's decode (as on the vision stream): its turn waits for the
    next step's mixed pass instead of running as a chunk of its own while rows decode; tokens unchanged."""
    import holotron.engine_prefill as EP

    monkeypatch.setattr(EP, "_NextStep", _DoneAfterDecode)
    model = tiny_vl(seed=3)
    agents = _agents(4, 3, seed=1)
    eng = Engine(model, max_batch=3, max_len=512, prefill_tokens=40, mixed=True, vision_stream=True)
    alone, chunk = [], eng._chunk

    def spy(*a, **k):
        alone.append(any(eng._decoding(i) for i in range(eng.max_batch)))
        return chunk(*a, **k)

    monkeypatch.setattr(eng, "_chunk", spy)
    got, _ = _drive(eng, agents, "cpu")
    assert alone and not any(alone), alone  # chunks alone ran only while no row decoded
    assert eng.stats["mixed_steps"] > 0
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns, "cpu"), f"agent {a}"


@pytest.mark.gpu
@pytest.mark.parametrize("mixed", [False, True])
def test_vision_stream_on_cuda_graphs_equals_each_conversation_alone(mixed):
    model = tiny_vl(seed=3).cuda()
    agents = _agents(5, 3, seed=1)
    eng = Engine(model, max_batch=3, max_len=512, prefill_tokens=40, mixed=mixed, vision_stream=True)
    assert eng.cuda_graph and eng._vstream is not None
    got, _ = _drive(eng, agents, "cuda")
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns, "cuda"), f"agent {a}"


@pytest.mark.gpu
def test_vision_graphs_are_captured_on_a_stream_of_their_own():
    # holotron/engine_vision.py: PyTorch's cuBLAS workspace is per stream and a graph keeps its capture stream's;
    # a vision graph replays beside the pass's graphs, so it must not share their (default) capture stream
    model = tiny_vl(seed=3).cuda()
    eng = Engine(model, max_batch=2, max_len=256, vision_stream=True)
    eng.capture_vision([1, 2])
    assert set(eng.vision_graphs) == {1, 2}
    assert torch.cuda.graph.default_capture_stream is not None   # the decode steps' graphs were captured there
    assert eng._vcap is not None and eng._vcap != torch.cuda.graph.default_capture_stream


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_prefix_made_while_admissions_embed_on_the_vision_stream_equals_the_plain_loop(device):
    # holotron/engine_vision.py: a vision call off the vision stream (``prefix``) waits for that stream first,
    # since the admissions' calls there share its graphs' input and output buffers
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_vl(seed=3).to(device)
    agents = _agents(4, 1, seed=5)
    eng = Engine(model, max_batch=4, max_len=512, prefill_tokens=40, vision_stream=True)
    if device == "cuda":
        eng.capture_vision([1, 2])
        assert set(eng.vision_graphs) == {1, 2}
    reqs = [eng.submit(p.to(device), session=eng.session(), pixel_values=px.to(device), max_new_tokens=n)
            for ((p, px, n),) in agents]
    eng.step()   # the admissions' screenshots go to the vision encoder (on its stream on CUDA)
    p0, px0, _ = _agents(1, 1, seed=9)[0][0]
    pre = eng.prefix(p0.to(device), pixel_values=px0.to(device))
    tail = torch.tensor([40, 41, 42])
    r = eng.submit(tail.to(device), prefix=pre, max_new_tokens=4)
    eng.run()
    want = generate(model, torch.cat([p0, tail])[None].to(device), 4, engine=False, eos_token_id=[],
                    pixel_values=px0.to(device), num_tiles=[px0.shape[0]])[0].tolist()
    assert r.error is None and r.tokens == want
    for req, turns in zip(reqs, agents):
        assert req.tokens == _reference(model, turns, device)[0]
