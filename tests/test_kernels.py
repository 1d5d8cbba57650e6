"""The chain of trust for the SSD scan: chunked and Triton against the naive recurrence in float64.

CPU shapes are tiny (the Triton interpreter is slow); the `gpu` tests run the real sizes on CUDA.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from helpers import assert_close

import holotron.kernels as K
from holotron.kernels import ssd_scan, ssd_step

FAST = ["chunked", "triton"]  # the backends held to the naive recurrence
HALF_TOL = {torch.float16: (5e-3, 1e-3), torch.bfloat16: (2e-2, 5e-3)}


# ----------------------------------------------------------------------------- inputs


def make_inputs(b, l, h, p, g, n, *, dtype=torch.float32, seed=0, device="cpu", D=None, z=False,
                dt_bias=False, dt_softplus=False, dt_limit=(0.0, math.inf), initial_state=False,
                cu_seqlens=None, big_decay=False, chunk_size=16):
    """Random SSD inputs as a kwargs dict for ssd_scan. D in {None, "head", "channel"}.

    Values are drawn in float64 and rounded to ``dtype``; the reference is then computed from the
    rounded values, so input rounding is not counted as kernel error.
    """
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    n_seq = b if cu_seqlens is None else len(cu_seqlens) - 1
    if dt_softplus:
        dt = r(b, l, h) - 1.0  # softplus of it is ~0.1 .. 1.5
    else:
        dt = torch.rand(b, l, h, generator=gen, dtype=torch.float64) * 0.5 + 0.01
    A = -torch.exp(torch.rand(h, generator=gen, dtype=torch.float64) * 2 - 1)  # -(0.37 .. 2.7)
    if big_decay:
        dt, A = dt * 30, A * 30  # |A dt| in the hundreds: decays underflow to exactly 0
    kw = dict(
        x=r(b, l, h, p), dt=dt, A=A.float(),
        B=r(b, l, g, n) / math.sqrt(n), C=r(b, l, g, n),
        D={None: None, "head": r(h), "channel": r(h, p)}[D],
        z=r(b, l, h, p) if z else None,
        dt_bias=r(h) * 0.5 if dt_bias else None,
        dt_softplus=dt_softplus, dt_limit=dt_limit,
        initial_state=r(n_seq, h, p, n).float() if initial_state else None,
        cu_seqlens=None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32),
        chunk_size=chunk_size,
    )
    for k in ("x", "dt", "B", "C", "z"):
        if kw[k] is not None:
            kw[k] = kw[k].to(dtype)
    for k in ("D", "dt_bias"):
        if kw[k] is not None:
            kw[k] = kw[k].float()
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in kw.items()}


def as64(kw):
    """The same inputs in float64 (the reference's precision)."""
    out = dict(kw)
    for k in ("x", "dt", "B", "C", "z", "D", "dt_bias", "initial_state"):
        if out[k] is not None:
            out[k] = out[k].double()
    return out


def scan(kw, backend):
    kw = dict(kw)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    return ssd_scan(x, dt, A, B, C, backend=backend, **kw)


def reference(kw):
    """The naive recurrence in float64: (y, final_state) in float64."""
    return scan(as64(kw), "naive")


def tol(dtype):
    """(rtol, atol) for comparing a backend run in ``dtype`` to the float64 reference."""
    if dtype in HALF_TOL:
        return HALF_TOL[dtype]
    return (1e-9, 1e-12) if dtype == torch.float64 else (1e-4, 1e-6)


def check(kw, backend, name=""):
    y_ref, s_ref = reference(kw)
    y, s = scan(kw, backend)
    dtype = kw["x"].dtype
    assert y.dtype == dtype and y.shape == kw["x"].shape
    assert s.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    rt, at = tol(dtype)
    assert_close(y, y_ref, rtol=rt, atol=at, name=f"{backend} y {name}")
    # the state is fp32 whatever the input dtype: its error comes only from rounding inside the
    # kernel (half-precision matmul operands in Triton), so it gets the input dtype's tolerance too
    assert_close(s, s_ref, rtol=rt, atol=at, name=f"{backend} final_state {name}")
    return y, s


# ----------------------------------------------------------------------------- chain of trust


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize(
    "b,l,h,p,g,n,Q",
    [
        (1, 1, 2, 4, 1, 4, 16),  # seqlen 1
        (2, 15, 4, 5, 2, 3, 16),  # chunk - 1
        (2, 17, 4, 5, 2, 3, 16),  # chunk + 1
        (1, 32, 4, 10, 4, 8, 16),  # two full chunks, groups == heads
        (1, 40, 6, 3, 3, 5, 7),  # odd chunk size, 2 heads per group
    ],
)
def test_matches_naive_fp32_plain(backend, b, l, h, p, g, n, Q):
    check(make_inputs(b, l, h, p, g, n, chunk_size=Q, seed=l), backend)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize(
    "opts",
    [
        dict(D="head"),
        dict(D="channel"),
        dict(z=True),
        dict(dt_bias=True, dt_softplus=True),
        dict(dt_softplus=True, dt_limit=(0.2, 0.6)),
        dict(initial_state=True),
        dict(D="channel", z=True, dt_bias=True, dt_softplus=True, dt_limit=(0.05, 1.0), initial_state=True),
    ],
    ids=lambda o: "-".join(f"{k}" for k in o),
)
def test_matches_naive_options(backend, opts):
    check(make_inputs(2, 21, 4, 5, 2, 4, chunk_size=8, seed=1, **opts), backend, str(opts))


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize(
    "cu,Q",
    [
        ([0, 5, 6, 20], 8),  # boundaries inside chunks, a 1-token sequence
        ([0, 8, 16, 24], 8),  # boundaries on chunk edges
        ([0, 1, 2, 3], 4),  # all length 1
        ([0, 23], 8),  # one sequence
    ],
)
@pytest.mark.parametrize("initial_state", [False, True])
def test_matches_naive_cu_seqlens(backend, cu, Q, initial_state):
    kw = make_inputs(1, cu[-1], 4, 5, 2, 4, chunk_size=Q, seed=2, cu_seqlens=cu, D="head", z=True,
                     dt_bias=True, dt_softplus=True, initial_state=initial_state)
    check(kw, backend, f"cu={cu}")


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_naive_half(backend, dtype):
    kw = make_inputs(2, 19, 4, 10, 2, 8, dtype=dtype, chunk_size=8, seed=3, D="channel", z=True,
                     dt_bias=True, dt_softplus=True, initial_state=True)
    check(kw, backend, str(dtype))


@pytest.mark.parametrize("backend", FAST)
def test_matches_naive_headdim80(backend):
    kw = make_inputs(1, 20, 2, 80, 1, 16, chunk_size=16, seed=4, D="channel", z=True,
                     dt_softplus=True, initial_state=True)
    check(kw, backend, "P=80")


def test_chunked_float64_exact():
    """In float64 the chunked algorithm agrees with the recurrence to rounding (1e-9 relative)."""
    kw = as64(make_inputs(2, 45, 6, 5, 3, 4, chunk_size=16, seed=5, D="channel", z=True,
                          dt_bias=True, dt_softplus=True, initial_state=True))
    check(kw, "chunked", "fp64")


def test_chunked_catches_a_wrong_decay():
    """The comparison is sharp enough to see an off-by-one in the decay (a test that can fail)."""
    kw = make_inputs(1, 20, 2, 4, 1, 4, chunk_size=8, seed=6)
    y, _ = scan(kw, "chunked")
    bad = dict(kw, dt=kw["dt"].roll(1, dims=1))  # decays shifted by one token
    y_bad, _ = scan(bad, "naive")
    with pytest.raises(AssertionError):
        assert_close(y, y_bad.float(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backend", FAST)
def test_large_decay_is_finite_and_right(backend):
    kw = make_inputs(1, 24, 4, 5, 2, 4, chunk_size=8, seed=7, big_decay=True, initial_state=True)
    y, s = check(kw, backend, "big |A dt|")
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
