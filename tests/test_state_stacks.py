"""A ``DecodeState``'s layers as views of stacked tensors (holotron/state_stacks.py): the same shapes, dtypes,
bytes and contiguity as per-layer tensors; row moves, exchanges and resets through the stacks equal the same
operations done layer by layer (a state whose stacks are dropped); a replaced tensor turns the stacks off; and
the engine's tokens are unchanged."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import random_ids as _ids
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

from holotron import state as state_module
from holotron.engine import Engine
from holotron.kv_cache import FP8
from holotron.state import DecodeState, KVCache, MambaState
from holotron.state_stacks import intact


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*M"), seed=11)


def _tensors(st: DecodeState) -> list[torch.Tensor]:
    return [t for s in st.layers if s is not None
            for t in ((s.conv, s.ssm) if isinstance(s, MambaState) else s.tensors())]


def _fill(st: DecodeState, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in _tensors(st):
        if t.dtype == torch.uint8:
            t.copy_(torch.randint(0, 120, t.shape, generator=g, dtype=torch.uint8))  # finite e4m3 codes
        else:
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    st.lengths.copy_(torch.randint(0, st.max_len, st.lengths.shape, generator=g))


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_the_layers_are_contiguous_views_of_stacks_with_the_per_layer_shapes(model, kv_dtype):
    st = DecodeState.allocate(model, 3, 40, torch.bfloat16, kv_dtype=kv_dtype)
    plain = model.layer_states(3, 64, torch.bfloat16, kv_dtype=kv_dtype)   # capacity: 41 rounded up to 64
    assert st.stacks and intact(st.layers, st.stacks)
    assert [type(s) for s in st.layers] == [type(s) for s in plain]
    for s, p in zip(st.layers, plain):
        if s is None:
            continue
        ours = (s.conv, s.ssm) if isinstance(s, MambaState) else (s.k, s.v, s.k_scale, s.v_scale)
        ref = (p.conv, p.ssm) if isinstance(p, MambaState) else (p.k, p.v, p.k_scale, p.v_scale)
        for a, b in zip(ours, ref):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous()
    assert st.nbytes() == st.lengths.nbytes + sum(s.nbytes() for s in plain if s is not None)
    assert len(st.stacks) == (2 + (4 if kv_dtype == FP8 else 2))   # one Mamba shape, one attention shape
    assert all(torch.count_nonzero(t) == 0 for t in _tensors(st))   # zeroed by default


@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_row_copies_through_the_stacks_equal_those_layer_by_layer(model, kv_dtype):
    a = DecodeState.allocate(model, 4, 40, kv_dtype=kv_dtype)
    b = DecodeState.allocate(model, 4, 40, kv_dtype=kv_dtype)
    b.stacks = []   # layer by layer
    for st in (a, b):
        _fill(st, seed=3)
        st.swap(0, 2, 17, 5)
        st.move(3, 1, 9)
        st.reset(3)
        st.swap(1, 0, 0, 30)
    assert a._stacked() and not b._stacked()
    assert torch.equal(a.lengths, b.lengths)
    for x, y in zip(_tensors(a), _tensors(b)):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    c = DecodeState.allocate(model, 4, 40, kv_dtype=kv_dtype)   # the operations did something
    _fill(c, seed=3)
    assert not all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(_tensors(a), _tensors(c)))


def test_a_replaced_tensor_turns_the_stacks_off(model):
    st = DecodeState.allocate(model, 2, 16)
    _fill(st, seed=4)
    mamba = next(s for s in st.layers if isinstance(s, MambaState))
    mamba.ssm = mamba.ssm.clone()
    assert not intact(st.layers, st.stacks) and not st._stacked()
    before = mamba.ssm[1].clone()
    st.move(1, 0, 4)
    assert torch.equal(mamba.ssm[0], before)   # the replaced tensor got the copy
    cache = next(s for s in st.layers if isinstance(s, KVCache))
    assert torch.equal(cache.k[0, :, :4], cache.k[1, :, :4])


def test_the_engine_with_stacks_gives_each_sequence_alone(model):
    """More turns than rows with a shared prefix: rows are loaded, moved and exchanged through the stacks."""
    eng = Engine(model, max_batch=3, max_len=64)
    assert eng.state._stacked()
    pre = eng.prefix(_ids(7, seed=90))
    prompts = [_ids(1 + i % 4, seed=91 + i) for i in range(7)]
    reqs = [eng.submit(p, prefix=pre, max_new_tokens=2 + 3 * (i % 3)) for i, p in enumerate(prompts)]
    eng.run()
    ref = Engine(model, max_batch=1, max_len=64)
    ref.state.stacks = []
    alone = [ref.submit(torch.cat([_ids(7, seed=90), p]), max_new_tokens=2 + 3 * (i % 3))
             for i, p in enumerate(prompts)]
    ref.run()
    assert [r.tokens for r in reqs] == [r.tokens for r in alone]
    assert eng.stats["row_moves"] > 0


def test_without_stacks_each_layer_has_its_own_tensors(model, monkeypatch):
    """HOLOTRON_STATE_STACKS=0: the layers' own tensors (the state of before), row copies layer by layer."""
    monkeypatch.setattr(state_module, "STACKS", False)
    st = DecodeState.allocate(model, 2, 16)
    assert st.stacks == [] and not st._stacked()
    _fill(st, seed=5)
    mamba = next(s for s in st.layers if isinstance(s, MambaState))
    lengths, rows = st.lengths.tolist(), mamba.ssm.clone()
    st.swap(0, 1, 3, 3)
    assert st.lengths.tolist() == lengths[::-1]
    assert torch.equal(mamba.ssm[0], rows[1]) and torch.equal(mamba.ssm[1], rows[0])


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [None, FP8])
def test_row_exchanges_by_the_swap_graph_over_the_stacks_give_each_sequence_alone(monkeypatch, kv_dtype):
    """On CUDA a row exchange is one replay of the swap graph, over the stacks' rows (dimension 1): the tokens equal
    those with each layer's tensors apart (HOLOTRON_STATE_STACKS=0) and those of each sequence alone."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*M"), seed=12).cuda()
    prompts = [_ids(3 + i % 5, seed=95 + i) for i in range(9)]
    out = {}
    for stacks in (True, False):
        monkeypatch.setattr(state_module, "STACKS", stacks)
        eng = Engine(model, max_batch=4, max_len=64, kv_dtype=kv_dtype)
        assert eng.state._stacked() == stacks
        assert any(dim == 1 for _, dim in eng._row_tensors()) == stacks
        reqs = [eng.submit(p.cuda(), max_new_tokens=2 + 4 * (i % 3)) for i, p in enumerate(prompts)]
        eng.run()
        assert eng.stats["row_moves"] > 0
        out[stacks] = [r.tokens for r in reqs]
    assert out[True] == out[False]
    ref = Engine(model, max_batch=1, max_len=64, kv_dtype=kv_dtype)
    alone = [ref.submit(p.cuda(), max_new_tokens=2 + 4 * (i % 3)) for i, p in enumerate(prompts)]
    ref.run()
    assert out[True] == [r.tokens for r in alone]
