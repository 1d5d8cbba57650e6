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
# Small-shape tests run on the GPU when there is one (Triton compiled), else on the CPU (interpreter).
DEV = "cuda" if torch.cuda.is_available() else "cpu"
HALF_TOL = {torch.float16: (5e-3, 1e-3), torch.bfloat16: (2e-2, 5e-3)}


# ----------------------------------------------------------------------------- inputs


def make_inputs(b, l, h, p, g, n, *, dtype=torch.float32, seed=0, device=DEV, D=None, z=False,
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
        (2, 5, 2, 3, 1, 4, 1),  # chunk size 1
        (1, 6, 16, 2, 8, 3, 4),  # groups 8, 2 heads per group
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


@pytest.mark.parametrize("backend", FAST)
def test_softplus_extremes(backend):
    """softplus past its linear (> 20) and exponential (< -15) switches; negative dt without it."""
    kw = make_inputs(1, 12, 4, 3, 2, 4, chunk_size=4, seed=13, dt_softplus=True, initial_state=True)
    kw["dt"] = torch.linspace(-30, 30, 12 * 4, device=DEV).view(1, 12, 4)
    kw["A"] = kw["A"] * 0.01  # keep some memory across the large dt
    check(kw, backend, "softplus extremes")
    state = kw["initial_state"].clone()
    s_ref = state.double().clone()
    assert_close(steps(kw, "triton" if backend == "triton" else "naive", state), steps(as64(kw), "naive", s_ref),
                 name="step y, softplus extremes")
    assert_close(state, s_ref, name="step state, softplus extremes")
    neg = make_inputs(1, 12, 2, 3, 1, 4, chunk_size=5, seed=14, dt_bias=True)
    neg["dt_bias"] = torch.full((2,), -0.3, device=DEV)  # dt + bias < 0: exp(dt A) > 1, still the recurrence
    check(neg, backend, "negative dt")


def test_chunked_float64_exact():
    """In float64 the chunked algorithm agrees with the recurrence to rounding (1e-9 relative)."""
    kw = as64(make_inputs(2, 45, 6, 5, 3, 4, chunk_size=16, seed=5, D="channel", z=True,
                          dt_bias=True, dt_softplus=True, initial_state=True))
    check(kw, "chunked", "fp64")


@pytest.mark.parametrize("group_bytes", [1, 2 * (3 * 2 * 6 * 16 * 16 * 8) + 1, 2**40],
                         ids=["one-chunk-per-group", "few-chunks-per-group", "all-at-once"])
def test_chunked_groups_of_chunks_are_the_same_function(monkeypatch, group_bytes):
    """The chunked scan takes chunks in groups sized by CHUNKED_CONFIG["group_bytes"] (3 float64 (b, h,
    Q, Q) tensors per chunk): one chunk at a time, two for two rows (three groups, then the short last
    chunk alone) and four for one, or all at once agree with the recurrence in float64, packed sequences
    included."""
    from holotron.kernels import ssd_chunked

    monkeypatch.setitem(ssd_chunked.CHUNKED_CONFIG["group_bytes"], DEV, group_bytes)
    kw = as64(make_inputs(2, 100, 6, 5, 3, 4, chunk_size=16, seed=15, D="head", z=True,
                          dt_bias=True, dt_softplus=True, initial_state=True))
    check(kw, "chunked", f"fp64 groups {group_bytes}")
    packed = as64(make_inputs(1, 90, 6, 5, 3, 4, chunk_size=16, seed=16, initial_state=True,
                              cu_seqlens=[0, 37, 40, 90]))
    check(packed, "chunked", f"fp64 packed groups {group_bytes}")


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


@pytest.fixture(autouse=True)
def nan_buffers(monkeypatch):
    """Every buffer the Triton wrappers allocate starts as NaN: an element left unwritten fails."""
    try:
        from holotron.kernels import ssd_triton_common
    except ImportError:  # no triton: only the PyTorch backends run
        return

    def nan_empty(*shape, dtype=None, device=None):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(ssd_triton_common, "_empty", nan_empty)


def test_nan_fill_is_in_force():
    """The fixture above reaches the wrappers (else the NaN checks would prove nothing): the scans and the
    step allocate through ``ssd_triton_common.empty`` only."""
    from holotron.kernels import ssd_triton_common, ssd_triton_scan, ssd_triton_step, ssd_triton_twopass

    assert torch.isnan(ssd_triton_common.empty(3, dtype=torch.float32, device="cpu")).all()
    for mod in (ssd_triton_scan, ssd_triton_step, ssd_triton_twopass):
        assert mod.empty is ssd_triton_common.empty and "_empty" not in vars(mod), mod.__name__


@pytest.mark.parametrize("backend", FAST)
def test_several_tiles(backend):
    """Row, source and headdim tiles > 1 in the Triton output kernel: Q=100 (two 64-row blocks),
    P=80 (two 64-wide blocks), a packed boundary inside the second chunk."""
    kw = make_inputs(1, 130, 2, 80, 1, 16, chunk_size=100, seed=8, cu_seqlens=[0, 110, 130],
                     D="channel", z=True, dt_softplus=True, initial_state=True)
    check(kw, backend, "tiles")


# ----------------------------------------------------------------------------- ssd_step


def step_inputs(kw, t):
    """Token t of scan inputs, as ssd_step arguments."""
    return dict(x=kw["x"][:, t], dt=kw["dt"][:, t], A=kw["A"], B=kw["B"][:, t], C=kw["C"][:, t],
                D=kw["D"], z=None if kw["z"] is None else kw["z"][:, t], dt_bias=kw["dt_bias"],
                dt_softplus=kw["dt_softplus"], dt_limit=kw["dt_limit"])


def steps(kw, backend, state):
    """Runs ssd_step over every token of ``kw``; returns the stacked y (b, l, h, p)."""
    ys = []
    for t in range(kw["x"].shape[1]):
        a = step_inputs(kw, t)
        x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
        ys.append(ssd_step(state, x, dt, A, B, C, backend=backend, **a))
    return torch.stack(ys, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("opts", [dict(), dict(D="head", z=True, dt_bias=True, dt_softplus=True),
                                  dict(D="channel", dt_softplus=True, dt_limit=(0.1, 0.8))],
                         ids=["plain", "Dhead-z-bias-softplus", "Dchannel-limit"])
def test_step_triton_matches_naive(dtype, opts):
    kw = make_inputs(3, 4, 4, 10, 2, 8, dtype=dtype, seed=9, initial_state=True, **opts)
    s_ref = kw["initial_state"].double().clone()
    y_ref = steps(as64(kw), "naive", s_ref)
    s = kw["initial_state"].clone()
    y = steps(kw, "triton", s)
    rt, at = tol(dtype)
    assert y.dtype == dtype
    assert_close(y, y_ref, rtol=rt, atol=at, name="step y")
    assert_close(s, s_ref, rtol=rt, atol=at, name="step state (in place)")


def test_step_triton_headdim80_strided_state():
    """P=80 (masked block), dstate 128, a state that is a slice of a bigger cache (strided batch)."""
    kw = make_inputs(2, 2, 2, 80, 1, 128, seed=10, initial_state=True, D="channel", z=True)
    cache = torch.randn(2, 3, 2, 80, 128, device=DEV)
    cache[:, 1] = kw["initial_state"]
    other = cache[:, [0, 2]].clone()
    s = cache[:, 1]
    s_ref = kw["initial_state"].double().clone()
    assert_close(steps(kw, "triton", s), steps(as64(kw), "naive", s_ref), name="step y")
    assert_close(cache[:, 1], s_ref, name="state written through the view")
    assert torch.equal(cache[:, [0, 2]], other), "the step wrote outside its state"


def test_step_triton_float64_state():
    """A float64 state is updated in float64 (the step computes in the state's dtype)."""
    kw = as64(make_inputs(2, 3, 2, 5, 1, 4, seed=15, initial_state=True, D="head", z=True))
    s_ref, s = kw["initial_state"].clone(), kw["initial_state"].clone()
    y_ref = steps(kw, "naive", s_ref)
    assert_close(steps(kw, "triton", s), y_ref, rtol=1e-9, atol=1e-12, name="fp64 step y")
    assert_close(s, s_ref, rtol=1e-9, atol=1e-12, name="fp64 step state")


@pytest.mark.parametrize("sdtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_step_low_precision_state_is_fp32_math_rounded_once_per_step(backend, sdtype):
    """A bf16 / fp16 state halves the bytes a decode step moves: each step computes in fp32 from the stored
    state and rounds the new state once; y comes from the unrounded fp32 state. Checked against the same
    recipe in float64 (rounding the state to ``sdtype`` after every step)."""
    kw = make_inputs(2, 5, 4, 10, 2, 8, dtype=torch.bfloat16, seed=21, initial_state=True, D="head", z=True,
                     dt_bias=True, dt_softplus=True)
    s = kw["initial_state"].to(sdtype)
    ref = as64(kw)
    s_ref = s.double()
    ys, y_ref = steps(kw, backend, s), []
    for t in range(kw["x"].shape[1]):
        a = step_inputs(ref, t)
        x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
        y_ref.append(ssd_step(s_ref, x, dt, A, B, C, backend="naive", **a))
        s_ref.copy_(s_ref.to(sdtype).double())  # the stored state is rounded each step
    assert s.dtype == sdtype and ys.dtype == torch.bfloat16
    assert_close(ys, torch.stack(y_ref, 1), rtol=2e-2, atol=2e-2, name="y with a low-precision state")
    assert_close(s, s_ref, rtol=1e-2, atol=1e-2, name="low-precision state")


def test_step_triton_rejects_strided_dstate():
    kw = step_inputs(make_inputs(1, 1, 2, 3, 1, 4, seed=16), 0)
    state = torch.zeros(1, 2, 3, 8, device=DEV)[..., ::2]
    with pytest.raises(ValueError, match="state must have a unit-stride last dim"):
        ssd_step(state, *(kw.pop(k) for k in ("x", "dt", "A", "B", "C")), backend="triton", **kw)


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_step_equals_scan(backend):
    """T calls of ssd_step == one ssd_scan (y and state)."""
    kw = make_inputs(2, 9, 4, 5, 2, 4, seed=11, initial_state=True, D="head", z=True, dt_softplus=True,
                     chunk_size=4)
    y_ref, s_ref = reference(kw)
    s = kw["initial_state"].clone()
    assert_close(steps(kw, backend, s), y_ref, name="steps y")
    assert_close(s, s_ref, name="steps state")


# ----------------------------------------------------------------------------- bad input


def _good():
    return make_inputs(1, 6, 4, 3, 2, 5, seed=12, device="cpu")


BAD_SCAN = [
    (lambda k: k.update(x=k["x"][0]), "x must have shape (batch, seqlen, heads, headdim)"),
    (lambda k: k.update(x=k["x"].long()), "x must be a floating tensor"),
    (lambda k: k.update(dt=k["dt"][:, :, :3]), "dt must have shape (1, 6, heads=4)"),
    (lambda k: k.update(A=k["A"][:3]), "A must have shape (heads=4,)"),
    (lambda k: k.update(A=k["A"].half()), "A must be float32"),
    (lambda k: k.update(B=k["B"][0]), "B must have shape (1, 6, groups, dstate)"),
    (lambda k: k.update(C=k["C"][..., :4]), "C must have the shape of B (1, 6, 2, 5)"),
    (lambda k: k.update(B=k["B"][:, :, :1].expand(1, 6, 3, 5).contiguous(),
                        C=k["C"][:, :, :1].expand(1, 6, 3, 5).contiguous()),
     "heads (4) must be divisible by groups (3)"),
    (lambda k: k.update(B=k["B"].double()), "B must have the dtype of x (torch.float32)"),
    (lambda k: k.update(z=torch.zeros(1, 6, 4, 2)), "z must have the shape of x"),
    (lambda k: k.update(z=torch.zeros(1, 6, 4, 3, dtype=torch.float16)), "z must have the dtype of x"),
    (lambda k: k.update(D=torch.zeros(3)), "D must have shape (heads=4,) or (heads=4, headdim=3)"),
    (lambda k: k.update(dt_bias=torch.zeros(4, 1)), "dt_bias must have shape (heads=4,)"),
    (lambda k: k.update(dt_limit=(1.0, 0.5)), "dt_limit must satisfy low <= high"),
    (lambda k: k.update(dt_limit=(0.0,)), "dt_limit must be a pair"),
    (lambda k: k.update(chunk_size=0), "chunk_size must be a positive int"),
    (lambda k: k.update(initial_state=torch.zeros(1, 4, 3, 4)), "initial_state must have shape (1, 4, 3, 5)"),
    (lambda k: k.update(initial_state=torch.zeros(1, 4, 3, 5, dtype=torch.bfloat16)), "initial_state must be float32"),
    (lambda k: k.update(cu_seqlens=torch.tensor([0, 3, 3, 6])), "cu_seqlens must be strictly increasing"),
    (lambda k: k.update(cu_seqlens=torch.tensor([0, 4, 3, 6])), "cu_seqlens must be strictly increasing"),
    (lambda k: k.update(cu_seqlens=torch.tensor([0, 3, 5])), "cu_seqlens must end at seqlen (6), got 5"),
    (lambda k: k.update(cu_seqlens=torch.tensor([1, 3, 6])), "cu_seqlens must start at 0"),
    (lambda k: k.update(cu_seqlens=torch.tensor([0.0, 6.0])), "cu_seqlens must be an integer tensor"),
    (lambda k: k.update(cu_seqlens=torch.tensor([[0, 6]])), "cu_seqlens must be a 1-d tensor"),
    (lambda k: k.update(cu_seqlens=torch.tensor([0, 2, 6]), initial_state=torch.zeros(1, 4, 3, 5)),
     "initial_state must have shape (2, 4, 3, 5)"),
]


@pytest.mark.parametrize("sdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["chunked", "triton"])
def test_scan_rows_reads_and_writes_the_states_in_place(backend, sdtype):
    """``ssd_scan_rows``: row i starts from state[rows[i]] and leaves its final state there, rounded once to the
    buffer's dtype; other rows untouched. Against ``ssd_scan`` on the gathered states (fp32): y and the states
    equal bit for bit (the Triton kernel reads the 16-bit rows directly, the fallback gathers and scatters;
    on the CPU interpreter a bf16 store may be one step low)."""
    kw = make_inputs(3, 40, 4, 16, 2, 16, dtype=torch.bfloat16, D="head", z=True, dt_bias=True, dt_softplus=True)
    kw.pop("initial_state"), kw.pop("cu_seqlens")
    gen = torch.Generator().manual_seed(9)
    state = torch.randn(6, 4, 16, 16, generator=gen).to(DEV, sdtype)
    rows = torch.tensor([5, 1, 3], device=DEV)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    y_ref, fin = ssd_scan(x, dt, A, B, C, initial_state=state[rows].float(), backend=backend, **kw)
    got_state = state.clone()
    y = K.ssd_scan_rows(x, dt, A, B, C, got_state, rows, backend=backend, **kw)
    assert torch.equal(y, y_ref)
    if backend == "triton" and sdtype == torch.bfloat16 and DEV == "cpu":
        # Triton's CPU interpreter truncates fp32 -> bf16 on store (the GPU rounds to nearest): within a step
        assert ((got_state[rows].float() - fin).abs() <= fin.abs() * 2**-7).all()
    else:
        assert torch.equal(got_state[rows], fin.to(sdtype))
    for r in (0, 2, 4):
        assert torch.equal(got_state[r], state[r])
    with pytest.raises(ValueError, match="state must have shape"):
        K.ssd_scan_rows(x, dt, A, B, C, state[:, :, :8], rows, backend=backend, **kw)
    with pytest.raises(ValueError, match="rows must be an integer tensor"):
        K.ssd_scan_rows(x, dt, A, B, C, state, rows[:2], backend=backend, **kw)


@pytest.mark.parametrize("mutate,msg", BAD_SCAN, ids=[m for _, m in BAD_SCAN])
def test_scan_bad_input(mutate, msg):
    kw = _good()
    mutate(kw)
    with pytest.raises(ValueError) as e:
        scan(kw, "chunked")
    assert msg in str(e.value)


def test_scan_cu_seqlens_needs_batch_1():
    kw = make_inputs(2, 6, 4, 3, 2, 5, device="cpu")
    kw["cu_seqlens"] = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match=r"cu_seqlens needs batch == 1 .*got batch 2"):
        scan(kw, "chunked")


def test_scan_bad_backend_name():
    with pytest.raises(ValueError, match="backend must be one of"):
        scan(_good(), "cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        K.use_backend("fast")


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: tensors are on cpu; Triton needs CUDA"):
        scan(_good(), "triton")


BAD_STEP = [
    (lambda k: k.update(x=k["x"][None]), "x must have shape (batch, heads, headdim)"),
    (lambda k: k.update(state=k["state"][..., :4]), "state must have shape (2, 4, 3, 5)"),
    (lambda k: k.update(state=k["state"].int()), "state must be float32 (or bfloat16 / float16"),
    (lambda k: k.update(dt=k["dt"][:, :2]), "dt must have shape (2, heads=4)"),
    (lambda k: k.update(B=k["B"][:, :, :2], C=k["C"][:, :, :2]), "state must have shape (2, 4, 3, 2)"),
    (lambda k: k.update(C=k["C"][:1]), "C must have the shape of B"),
    (lambda k: k.update(z=k["x"].double()), "z must have the dtype of x"),
]


@pytest.mark.parametrize("mutate,msg", BAD_STEP, ids=[m for _, m in BAD_STEP])
def test_step_bad_input(mutate, msg):
    kw = step_inputs(make_inputs(2, 1, 4, 3, 2, 5, z=True, device="cpu"), 0)
    kw["state"] = torch.zeros(2, 4, 3, 5)
    mutate(kw)
    x, dt, A, B, C, st = (kw.pop(k) for k in ("x", "dt", "A", "B", "C", "state"))
    with pytest.raises(ValueError) as e:
        ssd_step(st, x, dt, A, B, C, backend="naive", **kw)
    assert msg in str(e.value)


# ----------------------------------------------------------------------------- backend=None


def test_backend_none_logs_once(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(K, "_said", set())
    caplog.set_level(logging.INFO, logger="holotron.kernels")
    kw = _good()
    y, s = scan(kw, None)
    scan(kw, None)
    msgs = [r.getMessage() for r in caplog.records if r.name == "holotron.kernels"]
    assert len(msgs) == 1, msgs
    assert "uses the 'chunked' backend because the Triton one is off" in msgs[0]
    assert "Triton needs CUDA" in msgs[0]
    y_c, _ = scan(kw, "chunked")
    assert torch.equal(y, y_c)


def test_backend_none_never_picks_the_interpreter(monkeypatch):
    """Under TRITON_INTERPRET=1 the Triton backend can run on the CPU when asked for, but backend=None
    keeps the (much faster) chunked PyTorch path there."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert K._pick(None, torch.device("cpu"), "ssd_scan", "chunked") == "chunked"
    assert K._pick("triton", torch.device("cpu"), "ssd_scan", "chunked") == "triton"
    assert K.available_backends("cpu") == ["naive", "chunked", "triton"]


def test_use_backend_switch(monkeypatch):
    calls = []
    from holotron.kernels import ssd_naive

    real = ssd_naive.ssd_scan_naive
    monkeypatch.setattr(ssd_naive, "ssd_scan_naive", lambda *a, **k: calls.append(1) or real(*a, **k))
    with K.use_backend("naive"):
        scan(_good(), None)
    assert calls == [1]
    scan(_good(), "chunked")
    assert calls == [1]


# ----------------------------------------------------------------------------- GPU, real sizes


REAL = dict(b=1, l=4096, h=128, p=80, g=8, n=128)


def _gpu_check(kw, y, s, dtype):
    """Compares to the chunked scan run in float64 on the GPU (itself checked against naive above)."""
    y_ref, s_ref = scan(as64(kw), "chunked")
    rt, at = tol(dtype)
    assert_close(y, y_ref, rtol=rt, atol=at, name=f"y {dtype}")
    assert_close(s, s_ref, rtol=rt, atol=at, name=f"final_state {dtype}")


@pytest.mark.gpu
def test_gpu_real_size_bf16():
    r = REAL
    kw = make_inputs(r["b"], r["l"], r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda",
                     seed=20, D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True,
                     chunk_size=128)
    y, s = scan(kw, "triton")
    _gpu_check(kw, y, s, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(), dict(Q=64), dict(TP_STATES="bf16"), dict(TP_ROWS=32),
                                 dict(Q=256, num_warps=8), dict(BLOCK_P=128, num_warps=8), dict(tma=False)],
                         ids=["auto", "Q64", "bf16-states", "rows32", "Q256-w8", "P128-w8", "no-tma"])
def test_gpu_real_size_two_pass(monkeypatch, cfg):
    """``TWO_PASS`` at the real size, two batch rows, bf16, against float64 (the wgmma shapes the interpreter
    does not exercise)."""
    from holotron.kernels import ssd_triton_scan

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "TWO_PASS": True, **cfg})
    r = REAL
    kw = make_inputs(2, 2000, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=22,
                     D="channel", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    y, s = scan(kw, "triton")
    _gpu_check(kw, y, s, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_real_size_bf16_packed():
    r = REAL
    cu = [0, 1000, 1001, 2500, 4096]  # boundaries inside chunks
    kw = make_inputs(1, r["l"], r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda",
                     seed=21, D="channel", dt_softplus=True, initial_state=True, cu_seqlens=cu,
                     chunk_size=128)
    y, s = scan(kw, "triton")
    _gpu_check(kw, y, s, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("Q", [64, 128, 100])
def test_gpu_medium(dtype, Q):
    kw = make_inputs(2, 700, 16, 80, 4, 128, dtype=dtype, device="cuda", seed=22, D="channel", z=True,
                     dt_bias=True, dt_softplus=True, dt_limit=(0.0, 1.0), initial_state=True, chunk_size=Q)
    y_ref, s_ref = reference({k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()})
    y, s = scan(kw, "triton")
    rt, at = tol(dtype)
    assert_close(y.cpu(), y_ref, rtol=rt, atol=at, name="y")
    assert_close(s.cpu(), s_ref, rtol=rt, atol=at, name="final_state")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_step_real_size(dtype):
    r = REAL
    kw = make_inputs(8, 3, r["h"], r["p"], r["g"], r["n"], dtype=dtype, device="cuda", seed=23,
                     D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True)
    s_ref = kw["initial_state"].double().clone()
    y_ref = steps(as64(kw), "naive", s_ref)
    s = kw["initial_state"].clone()
    y = steps(kw, "triton", s)
    rt, at = tol(dtype)
    assert_close(y, y_ref, rtol=rt, atol=at, name="step y")
    assert_close(s, s_ref, rtol=rt, atol=at, name="step state")


@pytest.mark.gpu
def test_gpu_graph_capture_step_and_scan():
    """ssd_step and ssd_scan (without cu_seqlens) never wait on the host: both capture in a CUDA
    graph, and the replays (on new inputs copied into the captured buffers) match eager calls."""
    r = REAL
    kw = make_inputs(2, 256, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=24,
                     D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    new = make_inputs(2, 256, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=25,
                      D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    a = step_inputs(kw, 0)
    x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
    state = kw["initial_state"].clone()
    scan_kw = {k: v for k, v in kw.items() if k not in ("x", "dt", "A", "B", "C")}

    def step():
        return ssd_step(state, x, dt, A, B, C, backend="triton", **a)

    def full():
        return ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], backend="triton", **scan_kw)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # compile and warm up outside the capture
        step(), full()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_step = step()
        y_scan, s_scan = full()
    for k in ("x", "dt", "A", "B", "C", "z", "D", "dt_bias"):  # new inputs into the captured buffers
        kw[k].copy_(new[k])
    kw["initial_state"].copy_(new["initial_state"])
    state.copy_(new["initial_state"])
    g.replay()
    torch.cuda.synchronize()
    state_eager = new["initial_state"].clone()
    b = step_inputs(new, 0)
    y_eager = ssd_step(state_eager, *(b.pop(k) for k in ("x", "dt", "A", "B", "C")), backend="triton", **b)
    assert torch.equal(y_step, y_eager) and torch.equal(state, state_eager)
    y_ref, s_ref = scan(new, "triton")
    assert torch.equal(y_scan, y_ref) and torch.equal(s_scan, s_ref)


@pytest.mark.parametrize("cfg", [dict(BLOCK_P=16), dict(BLOCK_P=32, num_stages=1), dict(BLOCK_P=128, num_warps=8),
                                 dict(Q=32, num_stages=3), dict(Q=64, BLOCK_P=64), dict(tma=True),
                                 dict(tma=True, Q=32, BLOCK_P=32), dict(tma=False), dict(FLAT=True, BLOCK_P=64),
                                 dict(FLAT=True, BLOCK_P=16, tma=False), dict(FLAT=True, BLOCK_P=128, tma=True),
                                 dict(FLAT=True, BLOCK_P=32, tma=True, Q=32)],
                         ids=["P16", "P32-stages1", "P128-warps8", "Q32-stages3", "Q64-P64", "tma", "tma-Q32-P32",
                              "no-tma", "flat-P64", "flat-P16-pointers", "flat-P128-tma", "flat-P32-tma-Q32"])
def test_triton_scan_configs(monkeypatch, cfg):
    """The scan's launch settings (headdim blocks of 16 to 128 columns, the kernel's own chunk length,
    pipelining depth, warps, tiles through tensor descriptors or pointers, blocks across the heads of a
    group) compute the same function: P=80 (ragged last block; across heads: blocks of one, two or three
    heads), packed sequences with boundaries inside chunks, Q=100 unless overridden (its power
    of two below), several chunks per sequence."""
    from holotron.kernels import ssd_triton_scan

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, **cfg})
    kw = make_inputs(1, 230, 2, 80, 1, 16, chunk_size=100, seed=26, cu_seqlens=[0, 110, 111, 230],
                     D="channel", z=True, dt_softplus=True, initial_state=True)
    check(kw, "triton", str(cfg))
    check(make_inputs(2, 21, 4, 5, 2, 4, chunk_size=8, seed=27, D="head", dt_bias=True, dt_softplus=True,
                      initial_state=True), "triton", str(cfg))


@pytest.mark.parametrize("cfg,dtype", [(dict(), torch.float32), (dict(BLOCK_P=16, Q=16), torch.float32),
                                       (dict(BLOCK_P=32, TP_BLOCK=64), torch.float32),
                                       (dict(BLOCK_P=128, Q=32, num_warps=8), torch.float32),
                                       (dict(TP_STATES="bf16"), torch.bfloat16),
                                       (dict(TP_ROWS=16), torch.float32), (dict(Q=128, TP_ROWS=32), torch.float32),
                                       (dict(tma=True), torch.float32), (dict(tma=True, TP_ROWS=16), torch.float32),
                                       (dict(tma=True, BLOCK_P=16), torch.bfloat16)],
                         ids=["auto", "P16-Q16", "P32-pass64", "P128-Q32-w8", "bf16-states", "rows16", "Q128-rows32",
                              "tma", "tma-rows16", "tma-P16-bf16"])
def test_triton_scan_two_pass(monkeypatch, cfg, dtype):
    """``TWO_PASS`` (ssd_triton_twopass.py: every chunk's own state, a pass over them, every chunk's y) computes
    the scan: P=80 in ragged headdim blocks, several chunks with a partial last one, two heads a group, D per
    channel or per head, z, dt's bias, softplus and limit, an initial state; bf16 chunk states with bf16 inputs;
    the output kernel's rows in blocks of 16 or 32 (``TP_ROWS``: 2-4 row blocks a chunk, the intra-chunk
    product over several column blocks); tiles through tensor descriptors or pointers. It serves batch rows;
    packed sequences take the walk (the same function)."""
    from holotron.kernels import ssd_triton_scan, ssd_triton_twopass

    calls = []
    real = ssd_triton_twopass.scan_two_pass
    monkeypatch.setattr(ssd_triton_twopass, "scan_two_pass", lambda *a, **k: calls.append(k["Q"]) or real(*a, **k))
    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "TWO_PASS": True, **cfg})
    check(make_inputs(2, 230, 4, 80, 2, 16, chunk_size=64, seed=41, D="channel", z=True, dt_bias=True,
                      dt_softplus=True, dt_limit=(0.0, 1.2), initial_state=True, dtype=dtype), "triton", str(cfg))
    check(make_inputs(3, 21, 2, 5, 1, 4, chunk_size=8, seed=42, D="head", initial_state=True, dtype=dtype),
          "triton", str(cfg))
    assert calls == [cfg.get("Q", 64), cfg.get("Q", 16)]
    check(make_inputs(1, 40, 2, 5, 1, 4, chunk_size=16, seed=43, cu_seqlens=[0, 17, 40], dtype=dtype), "triton")
    assert len(calls) == 2  # packed: the walk


@pytest.mark.parametrize("cfg,match", [(dict(BLOCK_P=24), "BLOCK_P"), (dict(BLOCK_P=80), "BLOCK_P"),
                                       (dict(TWO_PASS=True, TP_ROWS=24), "TP_ROWS"),
                                       (dict(TWO_PASS=True, TP_ROWS=32, Q=16), "TP_ROWS"),
                                       (dict(TWO_PASS=True, TP_STATES="fp8"), "TP_STATES")])
def test_triton_scan_bad_config(monkeypatch, cfg, match):
    from holotron.kernels import ssd_triton_scan

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, **cfg})
    with pytest.raises(ValueError, match=match):
        scan(make_inputs(1, 8, 2, 4, 1, 4, chunk_size=8), "triton")


@pytest.mark.parametrize("tma,p,block,every", [(False, 6, None, 1), (True, 16, None, 1), (True, 20, 16, 1),
                                              (True, 24, 16, 1), (False, 6, None, 2), (True, 16, None, 4)],
                         ids=["pointers", "tma-P16", "tma-P20-ragged", "tma-P24-16+16", "every-2nd", "tma-every-4th"])
@pytest.mark.parametrize("cu", [None, [0, 9, 10, 40]], ids=["batch", "packed"])
@pytest.mark.parametrize("flat", [False, True], ids=["per-head", "flat"])
def test_triton_scan_stores_chunk_states(monkeypatch, cu, tma, p, block, every, flat):
    """``store_states`` (what the backward reads): row choff[s] + c is the state of sequence s entering
    its chunk c, equal to the naive scan's final state over the tokens before that chunk; also with tiles
    through tensor descriptors (P=16: the states too; P=20 in blocks of 16: a ragged rest block, its states
    through pointers; P=24: a full block and a ragged one), and at the boundaries of chunks 2 or 4 times
    the kernel's own (``states_chunk``, the training path's); also with blocks across a group's heads
    (``FLAT``: 3 heads of 20 in blocks of 16 are 4 blocks: two of two heads, the last ragged)."""
    from holotron.kernels import ssd_triton_scan
    from holotron.kernels.ssd_triton_scan import ssd_scan_triton_fwd

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "tma": tma, "BLOCK_P": block,
                                                         "FLAT": flat})
    Q = 16  # the kernel's chunks are powers of two >= 16
    Qs = Q * every
    kw = make_inputs(2 if cu is None else 1, 40, 3, p, 1, 4, chunk_size=Q, seed=31, cu_seqlens=cu, D="head",
                     dt_bias=True, dt_softplus=True, initial_state=True)
    a = dict(kw)
    x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
    out = ssd_scan_triton_fwd(x, dt, A, B, C, store_states=True, states_chunk=Qs, **a)
    assert out.Q == Q and out.states_Q == Qs and out.config["tma"] == tma
    bounds = [(r * 40, r * 40 + 40) for r in range(2)] if cu is None else list(zip(cu[:-1], cu[1:]))
    choff = out.choff.tolist()
    flat = {k: (v.reshape(1, -1, *v.shape[2:]) if k in ("x", "dt", "B", "C") else v) for k, v in as64(kw).items()}
    for s, (t0, t1) in enumerate(bounds):
        assert choff[s + 1] - choff[s] == math.ceil((t1 - t0) / Qs)
        for c in range(choff[s + 1] - choff[s]):
            ref = flat["initial_state"][s:s + 1]
            if c:
                sub = dict(flat, cu_seqlens=None, initial_state=ref, chunk_size=Q)
                for k in ("x", "dt", "B", "C"):
                    sub[k] = flat[k][:, t0:t0 + c * Qs]
                sub["z"] = None
                _, ref = scan(sub, "naive")
            assert_close(out.states[choff[s] + c, :].double(), ref[0], rtol=1e-5, atol=1e-6, name=f"seq {s} chunk {c}")


@pytest.mark.parametrize("every", [1, 2, 4])
def test_two_pass_stores_chunk_states(monkeypatch, every):
    """``TWO_PASS`` with ``store_states``: its chunk is ``states_chunk`` and row s * chunks + c of the returned
    states is the state of batch row s entering chunk c, as the walk's layout (the naive scan over the tokens
    before it)."""
    from holotron.kernels import ssd_triton_scan
    from holotron.kernels.ssd_triton_scan import ssd_scan_triton_fwd

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "TWO_PASS": True})
    Qs = 16 * every
    kw = make_inputs(2, 40, 3, 20, 1, 4, chunk_size=16, seed=32, D="head", dt_bias=True, dt_softplus=True,
                     initial_state=True)
    a = dict(kw)
    x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
    out = ssd_scan_triton_fwd(x, dt, A, B, C, store_states=True, states_chunk=Qs, **a)
    nc = math.ceil(40 / Qs)
    assert out.Q == out.states_Q == Qs and out.choff.tolist() == [0, nc, 2 * nc] and out.n_max == 2 * nc
    k64 = as64(kw)
    for s in range(2):
        for c in range(nc):
            ref = k64["initial_state"][s:s + 1]
            if c:
                sub = dict(k64, initial_state=ref, z=None)
                for k in ("x", "dt", "B", "C"):
                    sub[k] = k64[k][s:s + 1, :c * Qs]
                _, ref = scan(sub, "naive")
            assert_close(out.states[s * nc + c].double(), ref[0], rtol=1e-5, atol=1e-6, name=f"row {s} chunk {c}")
    with pytest.raises(ValueError, match="states_chunk"):
        ssd_scan_triton_fwd(x, dt, A, B, C, store_states=True, states_chunk=24, **a)


def test_triton_scan_states_chunk_must_be_a_power_of_two_multiple():
    from holotron.kernels.ssd_triton_scan import ssd_scan_triton_fwd

    kw = make_inputs(1, 40, 2, 4, 1, 4, chunk_size=16, seed=3)
    a = dict(kw)
    x, dt, A, B, C = (a.pop(k) for k in ("x", "dt", "A", "B", "C"))
    for bad in (8, 48):
        with pytest.raises(ValueError, match="states_chunk"):
            ssd_scan_triton_fwd(x, dt, A, B, C, store_states=True, states_chunk=bad, **a)


REAL_PACKED = [0, 1000, 1001, 2500, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(), dict(BLOCK_P=128, Q=128, num_warps=8), dict(BLOCK_P=32, Q=64),
                                 dict(BLOCK_P=16, Q=64), dict(Q=64, BLOCK_P=64), dict(BLOCK_P=128, Q=32),
                                 dict(tma=False), dict(BLOCK_P=64, Q=32), dict(FLAT=True, BLOCK_P=64),
                                 dict(FLAT=True, BLOCK_P=32), dict(FLAT=True, BLOCK_P=128, num_warps=8),
                                 dict(FLAT=True, BLOCK_P=64, tma=False)],
                         ids=["auto", "P128-Q128", "P32-Q64", "P16-Q64", "Q64-P64", "P128-Q32", "no-tma", "P64-Q32",
                              "flat-P64", "flat-P32", "flat-P128-w8", "flat-P64-no-tma"])
def test_gpu_real_size_packed_and_graph(monkeypatch, cfg):
    """The scan's settings at the real size: packed (boundaries inside chunks) against float64, and
    captured in a CUDA graph (no host sync) whose replay equals the eager call."""
    from holotron.kernels import ssd_triton_scan

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, **cfg})
    r = REAL
    kw = make_inputs(1, r["l"], r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=29,
                     D="channel", z=True, dt_bias=True, dt_softplus=True, initial_state=True,
                     cu_seqlens=REAL_PACKED, chunk_size=128)
    y, s = scan(kw, "triton")
    _gpu_check(kw, y, s, torch.bfloat16)
    kw2 = make_inputs(2, 256, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=30,
                      D="head", dt_softplus=True, initial_state=True, chunk_size=128)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        scan(kw2, "triton")
        scan(kw, "triton")
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg, sg = scan(kw2, "triton")
        yp, sp = scan(kw, "triton")  # packed sequences too: no host sync
    g.replay()
    torch.cuda.synchronize()
    y2, s2 = scan(kw2, "triton")
    assert torch.equal(yg, y2) and torch.equal(sg, s2)
    assert torch.equal(yp, y) and torch.equal(sp, s)
