"""Snapshots of a row in host pages (holotron/state_snapshot.py): parts split into pieces that fit a page,
packed first-fit, restored byte for byte; pages given back and taken again; and sessions saved, forked and
restored through pages giving the tokens of each conversation alone. On a CPU the pages are not pinned
(``paged=True`` pages a CPU state as a CUDA engine pages its state); a small page size makes the pieces many."""

from __future__ import annotations

import functools

import pytest
import torch
from test_engine_sessions import _drive, _reference
from tiny_lm import random_ids as _ids
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

from holotron import state_snapshot
from holotron.engine import Engine
from holotron.state import DecodeState


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr(state_snapshot, "PAGE", 1024)
    monkeypatch.setattr(state_snapshot, "_PAGES", [])
    return state_snapshot


def _parts(st: DecodeState, kinds: bool = False) -> list:
    """Every tensor of the state (with ``kinds``: (is KV, tensor))."""
    out = [(hasattr(s, "tensors"), t) for s in st.layers if s is not None
           for t in (s.tensors() if hasattr(s, "tensors") else (s.conv, s.ssm))]
    return out if kinds else [t for _, t in out]


def _fill(st: DecodeState, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in _parts(st):
        b = t.view(torch.uint8)
        b.copy_(torch.randint(0, 120, b.shape, dtype=torch.uint8, generator=g))


def test_pieces_cover_a_tensor_in_order_each_within_a_page(small_pages):
    t = torch.arange(3 * 5 * 100, dtype=torch.float32).view(3, 5, 100)[:, :, :90]   # an index: 1,800 bytes > 1,024
    ps = small_pages.pieces(t)
    assert all(p.nbytes <= 1024 for p in ps) and sum(p.nbytes for p in ps) == t.nbytes
    assert torch.equal(torch.cat([p.reshape(-1) for p in ps]), t.reshape(-1))
    small = torch.zeros(4, 8)
    assert small_pages.pieces(small)[0] is small


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
def test_a_paged_snapshot_restores_byte_for_byte_and_its_pages_are_reused(model, small_pages, kv_dtype):
    a = DecodeState.allocate(model, 3, 40, ssm_dtype=torch.bfloat16, kv_dtype=kv_dtype)
    b = DecodeState.allocate(model, 3, 40, ssm_dtype=torch.bfloat16, kv_dtype=kv_dtype)
    _fill(a, 1)
    _fill(b, 2)
    before = [t.clone() for t in _parts(b)]
    snap = a.snapshot(1, 23, paged=True)
    plain = a.snapshot(1, 23)
    assert snap.nbytes() == plain.nbytes()
    assert any(isinstance(t, list) and len(t) > 1 for p in snap.parts if p is not None for t in p)  # split
    assert snap.host_bytes() == len(snap.pages) * 1024 >= snap.nbytes()
    assert len(snap.pages) <= -(-snap.nbytes() // 1024) + 3   # first-fit packing leaves little over
    b.restore(2, snap, release=True)
    assert b.lengths[2] == 23 and snap.pages is None and len(small_pages._PAGES) > 0
    for (kv, s_a), s_b, old in zip(_parts(a, kinds=True), _parts(b), before):
        if kv:   # KV (codes and scales): slots [0, 23) copied, the others as they were
            assert torch.equal(s_b[2, :, :23].view(torch.uint8), s_a[1, :, :23].view(torch.uint8))
            assert torch.equal(s_b[2, :, 23:].view(torch.uint8), old[2, :, 23:].view(torch.uint8))
        else:
            assert torch.equal(s_b[2].view(torch.uint8), s_a[1].view(torch.uint8))
        assert torch.equal(s_b[:2].view(torch.uint8), old[:2].view(torch.uint8))   # no other row touched
    free = {id(p) for p in small_pages._PAGES}
    again = a.snapshot(0, 5, paged=True)
    assert again.pages and {id(p) for p in again.pages} <= free   # taken from the free pages, none new


def test_an_empty_kv_takes_no_page(small_pages):
    attn = tiny_lm(tiny_config(hybrid_override_pattern="*-*"), seed=3)
    st = DecodeState.allocate(attn, 2, 16)
    snap = st.snapshot(1, 0, paged=True)
    assert snap.pages == [] and snap.nbytes() == 0
    _fill(st, 4)
    st.restore(0, snap, release=True)
    assert st.lengths.tolist() == [0, 0]


def test_reserve_pages_and_paged_bytes(small_pages):
    assert small_pages.reserve_pages(5000) == 5 * 1024 and small_pages.pooled_bytes() == 5120
    assert small_pages.paged_bytes(1) == 2048 and small_pages.paged_bytes(2048) == 3072


@pytest.mark.parametrize("overlap", [False, True])
def test_sessions_saved_forked_and_restored_through_pages_equal_each_alone(model, small_pages, monkeypatch, overlap):
    monkeypatch.setattr(DecodeState, "snapshot", functools.partialmethod(DecodeState.snapshot, paged=True))
    agents = [[(_ids(6 + a, seed=20 + a), 4), (_ids(3, seed=30 + a), 3)] for a in range(5)]
    eng = Engine(model, max_batch=2, max_len=128, overlap=overlap)  # 5 sessions, 2 rows: idle ones in pages
    got, sess = _drive(eng, agents)
    for a, turns in enumerate(agents):
        assert got[a] == _reference(model, turns)
    assert eng.memory()["sessions_on_host"] >= 3
    assert all(x.snapshot.pages for x in sess if x.on_host)
    s = sess[0]
    if not s.on_host:
        eng.save(s)
    f1, f2 = eng.fork(s, 2)   # forks of a saved session share its pages
    assert f1.snapshot is s.snapshot is f2.snapshot and s.snapshot.refs == 3
    hist = torch.empty(0, dtype=torch.long)
    for (p, _), g in zip(agents[0], got[0]):
        hist = torch.cat([hist, p, torch.tensor(g)])
    tails = {s: _ids(2, seed=40), f1: _ids(3, seed=41), f2: _ids(1, seed=42)}
    reqs = {k: eng.submit(v, session=k, max_new_tokens=3) for k, v in tails.items()}
    eng.run()
    for k, v in tails.items():
        assert reqs[k].tokens == _reference(model, [(torch.cat([hist, v]), 3)])[0]
