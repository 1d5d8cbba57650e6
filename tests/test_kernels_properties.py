"""Algebraic properties of the SSD scan, over random shapes and options (hypothesis).

Each property holds for the chunked and the Triton backend alike: chunk-size invariance, split +
state passing == one call, T ssd_steps == one scan, packed cu_seqlens == a loop over sequences,
batch rows independent, large |A dt| finite (and right). Edges are pinned with @example.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from hypothesis import example, given
from hypothesis import strategies as st
from test_kernels import check, make_inputs, nan_buffers, scan, steps  # noqa: F401  (nan_buffers: autouse)

BACKENDS = ["chunked", "triton"]


@st.composite
def shapes(draw, max_l=20):
    """(b, l, h, p, g, n, Q): tiny, with groups dividing heads and chunk sizes around l.

    The Triton interpreter costs ~20 ms per program (chunk x head x block), so chunks are >= 3
    tokens and heads <= 4 here; chunk size 1 and groups 8 are pinned by examples and test_kernels.py.
    """
    h = draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from([d for d in range(1, h + 1) if h % d == 0]))
    return dict(
        b=draw(st.integers(1, 2)), l=draw(st.integers(1, max_l)), h=h,
        p=draw(st.integers(1, 12)), g=g, n=draw(st.integers(1, 16)), Q=draw(st.integers(3, 20)),
    )


options = st.fixed_dictionaries(dict(
    D=st.sampled_from([None, "head", "channel"]), z=st.booleans(), dt_bias=st.booleans(),
    dt_softplus=st.booleans(), initial_state=st.booleans(),
))

# the edges DESIGN.md names: seqlen 1, chunk +- 1, headdim 80, groups 1 / 8 / heads
EDGES = [
    dict(b=1, l=1, h=2, p=3, g=1, n=4, Q=8),  # seqlen 1
    dict(b=1, l=7, h=2, p=3, g=2, n=4, Q=8),  # chunk - 1, groups == heads
    dict(b=2, l=9, h=2, p=3, g=1, n=4, Q=8),  # chunk + 1, groups 1
    dict(b=1, l=9, h=8, p=2, g=8, n=3, Q=4),  # groups 8 == heads
    dict(b=1, l=5, h=16, p=2, g=8, n=3, Q=4),  # groups 8, 2 heads per group
    dict(b=1, l=6, h=1, p=80, g=1, n=16, Q=4),  # headdim 80
]
ALL_OPTS = dict(D="channel", z=True, dt_bias=True, dt_softplus=True, initial_state=True)


def with_edges(fn):
    for e in EDGES:
        fn = example(shape=e, opts=ALL_OPTS, seed=0)(fn)
    return fn


def inputs(shape, opts, seed, **over):
    s = dict(shape)
    Q = s.pop("Q")
    kw = make_inputs(**s, seed=seed, chunk_size=Q, **{**opts, **over})
    return kw


seeds = st.integers(0, 2**16)


@pytest.mark.parametrize("backend", BACKENDS)
@with_edges
@given(shape=shapes(), opts=options, seed=seeds)
def test_chunk_size_invariance(backend, shape, opts, seed):
    kw = inputs(shape, opts, seed)
    y1, s1 = scan(kw, backend)
    for Q in {max(shape["Q"] - 1, 2), shape["Q"] + 1, 16}:
        y2, s2 = scan(dict(kw, chunk_size=Q), backend)
        assert_close(y2, y1, name=f"y, chunk {Q} vs {shape['Q']}")
        assert_close(s2, s1, name=f"state, chunk {Q} vs {shape['Q']}")


@pytest.mark.parametrize("backend", BACKENDS)
@with_edges
@given(shape=shapes(), opts=options, seed=seeds)
def test_split_and_pass_state(backend, shape, opts, seed):
    """scan(x[:k]) then scan(x[k:], initial_state=its final state) == scan(x)."""
    kw = inputs(shape, opts, seed)
    l = shape["l"]
    y, s = scan(kw, backend)
    for k in sorted({1, l // 2, l - 1} - {0, l}) if l > 1 else []:
        head = {n: (v[:, :k] if n in ("x", "dt", "B", "C", "z") and v is not None else v) for n, v in kw.items()}
        tail = {n: (v[:, k:] if n in ("x", "dt", "B", "C", "z") and v is not None else v) for n, v in kw.items()}
        y1, s1 = scan(head, backend)
        y2, s2 = scan(dict(tail, initial_state=s1), backend)
        assert_close(torch.cat([y1, y2], dim=1), y, name=f"y split at {k}")
        assert_close(s2, s, name=f"state split at {k}")


@pytest.mark.parametrize("backend", BACKENDS)
@with_edges
@given(shape=shapes(max_l=10), opts=options, seed=seeds)
def test_steps_equal_scan(backend, shape, opts, seed):
    """T calls of ssd_step (the decode path) == one ssd_scan (the prefill path)."""
    kw = inputs(shape, opts, seed)
    y, s = scan(kw, backend)
    state = (kw["initial_state"].clone() if kw["initial_state"] is not None
             else torch.zeros_like(s))
    ys = steps(kw, "triton" if backend == "triton" else "naive", state)
    assert_close(ys, y, name="steps y")
    assert_close(state, s, name="steps state")


@st.composite
def packs(draw):
    lens = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    return [0] + torch.tensor(lens).cumsum(0).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@example(shape=dict(b=1, l=0, h=2, p=3, g=1, n=4, Q=8), cu=[0, 7, 8, 17], opts=ALL_OPTS, seed=0)
@example(shape=dict(b=1, l=0, h=8, p=80, g=8, n=4, Q=4), cu=[0, 1, 6], opts=ALL_OPTS, seed=0)
@given(shape=shapes(), cu=packs(), opts=options, seed=seeds)
def test_packed_equals_loop(backend, shape, cu, opts, seed):
    """One call over packed sequences == one call per sequence (states reset at boundaries)."""
    kw = inputs(dict(shape, b=1, l=cu[-1]), opts, seed, cu_seqlens=cu)
    y, s = scan(kw, backend)
    for i in range(len(cu) - 1):
        t0, t1 = cu[i], cu[i + 1]
        one = {n: (v[:, t0:t1] if n in ("x", "dt", "B", "C", "z") and v is not None else v) for n, v in kw.items()}
        one["cu_seqlens"] = None
        if kw["initial_state"] is not None:
            one["initial_state"] = kw["initial_state"][i:i + 1]
        yi, si = scan(one, backend)
        assert_close(y[:, t0:t1], yi, name=f"y of sequence {i}")
        assert_close(s[i:i + 1], si, name=f"state of sequence {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@with_edges
@given(shape=shapes(), opts=options, seed=seeds)
def test_batch_rows_independent(backend, shape, opts, seed):
    """Each batch row's output is the output of that row alone."""
    kw = inputs(dict(shape, b=3), opts, seed)
    y, s = scan(kw, backend)
    for r in range(3):
        one = {n: (v[r:r + 1] if n in ("x", "dt", "B", "C", "z", "initial_state") and v is not None else v)
               for n, v in kw.items()}
        yr, sr = scan(one, backend)
        assert_close(y[r:r + 1], yr, name=f"y of row {r}")
        assert_close(s[r:r + 1], sr, name=f"state of row {r}")


@pytest.mark.parametrize("backend", BACKENDS)
@with_edges
@given(shape=shapes(), opts=options, seed=seeds)
def test_large_decay_finite_and_right(backend, shape, opts, seed):
    """|A dt| in the hundreds: decays underflow to 0; nothing overflows; still the recurrence."""
    opts = dict(opts, dt_softplus=opts["dt_softplus"] or opts["dt_bias"])  # dt >= 0: decays, not growth
    kw = inputs(shape, opts, seed, big_decay=True)
    y, s = check(kw, backend, "big |A dt|")
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
