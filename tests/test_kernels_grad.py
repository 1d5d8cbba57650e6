"""Gradients of the Triton scan: ``ssd_scan(..., backend="triton")`` against torch autograd through the
float64 chunked scan (itself held to the naive recurrence by test_kernels.py), for every input.

The chain: (1) a PyTorch transcription of the backward formulas (``bwd_reference``, the ones the
kernel of holotron/kernels/ssd_triton_backward.py implements) equals autograd on the float64 chunked
scan; (2) the kernel alone, given chunk states from a PyTorch loop, equals the transcription; (3) the
whole differentiable path (PyTorch dt processing, the Triton forward with stored states, the Triton
backward, the gate) equals autograd on the float64 chunked scan, on awkward shapes (hypothesis).
CPU shapes are tiny (the Triton interpreter is slow); the ``gpu`` tests run the 12B layer's sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_close, rel_rms
from hypothesis import example, given
from hypothesis import strategies as st
from test_kernels import DEV, as64, make_inputs, nan_buffers  # noqa: F401  (nan_buffers: autouse)

from holotron.kernels import ssd_scan

NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")
# (relative RMS, absolute RMS floor) of a gradient against the float64 reference, per input dtype
GRAD_TOL = {torch.float32: (2e-4, 1e-6), torch.bfloat16: (3e-2, 5e-3), torch.float16: (1e-2, 1e-3)}
# the per-head parameters' gradients (A, dt_bias, D) are sums over every token, channel and state entry of a
# head: in fp32 their error follows the terms' size, not the (cancelling) sum's; a derandomized example (h 1,
# b 2, l 16, p 5, n 9, the gate) reached 2.5e-4 of dA's RMS with 2.3e-6 absolute, past (2e-4, 1e-6)
REDUCED_RTOL = {torch.float32: 1e-3}


# ----------------------------------------------------------------------------- a transcription of the backward


def _bounds(b, l, cu):
    """(batch row, first token, end token) of each sequence."""
    if cu is None:
        return [(r, 0, l) for r in range(b)]
    cu = [int(v) for v in cu]
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def chunk_states(x, dt, A, B, Q, cu=None, init=None):
    """The state entering each chunk, (chunks, h, p, n), sequences in order, and choff (n_seq + 1,): the
    forward's ``store_states`` layout, from a PyTorch loop over chunks in x's dtype (dt processed)."""
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    rows, choff = [], [0]
    for s, (r, t0, t1) in enumerate(_bounds(b, l, cu)):
        S = torch.zeros(h, p, n, dtype=x.dtype) if init is None else init[s].to(x.dtype).clone()
        for c0 in range(t0, t1, Q):
            c1 = min(c0 + Q, t1)
            rows.append(S.clone())
            Bc = B[r, c0:c1].repeat_interleave(h // g, dim=1)  # (q, h, n)
            cs = (dt[r, c0:c1] * A).cumsum(0)
            w = dt[r, c0:c1] * torch.exp(cs[-1] - cs)
            S = torch.exp(cs[-1])[:, None, None] * S + torch.einsum("qh,qhp,qhn->hpn", w, x[r, c0:c1], Bc)
        choff.append(len(rows))
    return torch.stack(rows), torch.tensor(choff)


def bwd_reference(x, dt, A, B, C, D, Q, dy, dfinal=None, cu=None, init=None):
    """The backward formulas of ssd_triton_backward.py in PyTorch (x's dtype, dt processed): per sequence,
    chunks in reverse, heads at once. Returns a dict of gradients keyed like NAMES (dt: processed dt's)."""
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    k = h // g
    states, choff = chunk_states(x, dt, A, B, Q, cu, init)
    dx, ddt, dA = torch.zeros_like(x), torch.zeros_like(dt), torch.zeros_like(A)
    dB, dC = torch.zeros_like(B), torch.zeros_like(C)
    seqs = _bounds(b, l, cu)
    dinit = torch.zeros(len(seqs), h, p, n, dtype=x.dtype)
    for s, (r, t0, t1) in enumerate(seqs):
        dS = torch.zeros(h, n, p, dtype=x.dtype) if dfinal is None else dfinal[s].transpose(-1, -2).clone()
        starts = list(range(t0, t1, Q))
        for ci in reversed(range(len(starts))):
            c0 = starts[ci]
            c1 = min(c0 + Q, t1)
            q = c1 - c0
            S = states[int(choff[s]) + ci].transpose(-1, -2)  # (h, n, p)
            xc, dyc = x[r, c0:c1].transpose(0, 1), dy[r, c0:c1].transpose(0, 1)  # (h, q, p)
            dtc = dt[r, c0:c1].T  # (h, q)
            Bc = B[r, c0:c1].repeat_interleave(k, dim=1).transpose(0, 1)  # (h, q, n)
            Cc = C[r, c0:c1].repeat_interleave(k, dim=1).transpose(0, 1)
            cs = (dtc * A[:, None]).cumsum(-1)
            cL = cs[:, -1:]
            causal = torch.ones(q, q, dtype=torch.bool).tril()
            Lm = torch.exp((cs[:, :, None] - cs[:, None, :]).masked_fill(~causal, -math.inf))
            M = (Cc @ Bc.transpose(-1, -2)) * Lm
            Wm = M * dtc[:, None, :]
            w = dtc * torch.exp(cL - cs)
            R = Bc @ dS  # (h, q, p)
            dxc = Wm.transpose(-1, -2) @ dyc + w[..., None] * R
            if D is not None:
                dxc = dxc + (D[:, None, None] if D.dim() == 1 else D[:, None, :]) * dyc
            dWm = (dyc @ xc.transpose(-1, -2)) * causal
            dM = dWm * dtc[:, None, :]
            dG = dM * Lm
            ecs = torch.exp(cs)[..., None]
            dCc = dG @ Bc + ecs * (dyc @ S.transpose(-1, -2))
            dBc = dG.transpose(-1, -2) @ Cc + (xc * w[..., None]) @ dS.transpose(-1, -2)
            dw = (xc * R).sum(-1)
            E = dM * M
            dcs = E.sum(-1) - E.sum(-2) + (dyc * ecs * (Cc @ S)).sum(-1) - dw * w
            dcs[:, -1] += (dS * torch.exp(cL)[..., None] * S).sum((-1, -2)) + (dw * w).sum(-1)
            da = dcs.flip(-1).cumsum(-1).flip(-1)
            dx[r, c0:c1] = dxc.transpose(0, 1)
            ddt[r, c0:c1] = ((dWm * M).sum(-2) + torch.exp(cL - cs) * dw + A[:, None] * da).T
            dA += (dtc * da).sum(-1)
            dB[r, c0:c1] += dBc.view(g, k, q, n).sum(1).transpose(0, 1)
            dC[r, c0:c1] += dCc.view(g, k, q, n).sum(1).transpose(0, 1)
            dS = torch.exp(cL)[..., None] * dS + Cc.transpose(-1, -2) @ (dyc * ecs)
        dinit[s] = dS.transpose(-1, -2)
    dD = None
    if D is not None:
        dD = (dy * x).sum((0, 1))
        dD = dD.sum(-1) if D.dim() == 1 else dD
    return dict(x=dx, dt=ddt, A=dA, B=dB, C=dC, D=dD, initial_state=dinit)


def _raw64(b, l, h, p, g, n, *, seed, D=None, init=True, cu=None):
    """float64 inputs with dt already processed (positive, 0.01 .. 0.51), dy and dfinal."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    n_seq = b if cu is None else len(cu) - 1
    return dict(
        x=r(b, l, h, p), dt=torch.rand(b, l, h, generator=gen, dtype=torch.float64) * 0.5 + 0.01,
        A=-torch.exp(torch.rand(h, generator=gen, dtype=torch.float64) * 2 - 1),
        B=r(b, l, g, n) / math.sqrt(n), C=r(b, l, g, n),
        D={None: None, "head": r(h), "channel": r(h, p)}[D],
        init=r(n_seq, h, p, n) if init else None, dy=r(b, l, h, p), dfinal=r(n_seq, h, p, n),
        cu=None if cu is None else torch.tensor(cu),
    )


TRANSCRIPTION_CASES = [
    dict(b=2, l=11, h=4, p=3, g=2, n=5, Q=4, D="head"),
    dict(b=1, l=17, h=4, p=3, g=1, n=5, Q=5, D="channel"),
    dict(b=1, l=20, h=2, p=24, g=2, n=5, Q=4, D="channel", cu=[0, 3, 4, 11, 20]),
    dict(b=1, l=1, h=2, p=3, g=1, n=5, Q=4, init=False),
    dict(b=1, l=9, h=4, p=5, g=4, n=3, Q=1),
]


@pytest.mark.parametrize("case", TRANSCRIPTION_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_transcription_equals_autograd(case):
    """The formulas (in PyTorch, float64) are the gradient of the float64 chunked scan."""
    case = dict(case)
    Q = case.pop("Q")
    i = _raw64(**case, seed=1)
    leaves = {k: i[k].clone().requires_grad_() for k in ("x", "dt", "A", "B", "C", "D", "init") if i[k] is not None}
    y, fin = ssd_scan(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], D=leaves.get("D"),
                      initial_state=leaves.get("init"), cu_seqlens=i["cu"], chunk_size=Q, backend="chunked")
    grads = torch.autograd.grad((y * i["dy"]).sum() + (fin * i["dfinal"]).sum(), list(leaves.values()))
    mine = bwd_reference(i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], Q, i["dy"], i["dfinal"], i["cu"], i["init"])
    for k, gr in zip(leaves, grads):
        assert_close(mine["initial_state" if k == "init" else k], gr, rtol=1e-10, atol=1e-12, name=f"d{k}")


# ----------------------------------------------------------------------------- the kernel alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", TRANSCRIPTION_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_kernel_equals_transcription(case, dtype):
    """ssd_scan_triton_bwd, given the chunk states of a PyTorch loop, against the float64 transcription."""
    check_kernel(case, dtype)


def check_kernel(case, dtype, seed=2):
    from holotron.kernels.ssd_triton_backward import ssd_scan_triton_bwd

    case = dict(case)
    Q = case.pop("Q")
    i = _raw64(**case, seed=seed)
    # inputs rounded to dtype; the reference computed from the rounded values
    for k in ("x", "B", "C", "dy"):
        i[k] = i[k].to(dtype).double()
    ref = bwd_reference(i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], Q, i["dy"], i["dfinal"], i["cu"], i["init"])
    states, choff = chunk_states(i["x"], i["dt"], i["A"], i["B"], Q, i["cu"], i["init"])
    f = lambda t: None if t is None else t.float().to(DEV)  # noqa: E731
    d = lambda t: t.to(dtype).to(DEV)  # noqa: E731
    cu = None if i["cu"] is None else i["cu"].to(DEV)
    out = ssd_scan_triton_bwd(d(i["x"]), f(i["dt"]), f(i["A"]), d(i["B"]), d(i["C"]), f(i["D"]), f(states),
                              choff.to(DEV), Q, d(i["dy"]), f(i["dfinal"]), cu, has_init=i["init"] is not None)
    rt, at = GRAD_TOL[dtype]
    for k, o in zip(("x", "dt", "A", "B", "C", "D", "initial_state"), out):
        if ref[k] is None or (k == "initial_state" and i["init"] is None):
            assert o is None, k
            continue
        assert o.dtype == (dtype if k in ("x", "B", "C") else torch.float32), k
        assert_close(o.cpu(), ref[k], rtol=rt, atol=at, name=f"d{k} {dtype}")


# ----------------------------------------------------------------------------- the differentiable ssd_scan


def leaves_of(kw):
    """The floating inputs of kw as fresh leaves that require grad (same dtypes)."""
    out = dict(kw)
    for k in NAMES:
        if out[k] is not None:
            out[k] = out[k].detach().clone().requires_grad_()
    return out


def scan_grads(kw, backend, wy, wf):
    """Gradients of sum(y * wy) + sum(final * wf) w.r.t. every floating input, and (y, final)."""
    kw = leaves_of(kw)
    args = {k: v for k, v in kw.items() if k not in ("x", "dt", "A", "B", "C")}
    y, fin = ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], backend=backend, **args)
    names = [k for k in NAMES if kw[k] is not None]
    loss = 0.0
    if wy is not None:
        loss = loss + (y.double() * wy).sum()
    if wf is not None:
        loss = loss + (fin.double() * wf).sum()
    grads = torch.autograd.grad(loss, [kw[k] for k in names], allow_unused=True)
    return dict(zip(names, grads)), y.detach(), fin.detach()


def check_grads(kw, use_y=True, use_final=True, name="", report=False):
    """Triton gradients (and outputs) against autograd through the float64 chunked scan."""
    dtype = kw["x"].dtype
    gen = torch.Generator().manual_seed(99)
    n_seq = kw["x"].shape[0] if kw["cu_seqlens"] is None else kw["cu_seqlens"].numel() - 1
    h, p, n = kw["x"].shape[2], kw["x"].shape[3], kw["B"].shape[-1]
    wy = torch.randn(*kw["x"].shape, generator=gen, dtype=torch.float64).to(kw["x"].device) if use_y else None
    wf = torch.randn(n_seq, h, p, n, generator=gen, dtype=torch.float64).to(kw["x"].device) if use_final else None
    ref, y_ref, f_ref = scan_grads(as64(kw), "chunked", wy, wf)
    got, y, fin = scan_grads(kw, "triton", wy, wf)
    rt, at = GRAD_TOL[dtype]
    errors = {"y": rel_rms(y, y_ref), "final": rel_rms(fin, f_ref)}
    errors.update({f"d{k}": rel_rms(got[k], g) for k, g in ref.items() if g is not None and got[k] is not None})
    if report:
        print(f"\n{name}: relative RMS error against float64 chunked (allowed {rt:.0e}, floor {at:.0e})")
        for k, e in errors.items():
            print(f"  {k:16s} {e:.3e}")
    assert_close(y, y_ref, rtol=rt, atol=at, name=f"y {name}")
    assert_close(fin, f_ref, rtol=rt, atol=at, name=f"final {name}")
    for k, g_ref in ref.items():
        g = got[k]
        if g_ref is None:  # not reached by the loss (e.g. z when only the final state is used)
            assert g is None or not g.any(), f"d{k} {name}"
            continue
        assert g is not None, f"d{k} missing {name}"
        assert g.dtype == kw[k].dtype and g.shape == kw[k].shape, f"d{k} {g.dtype} {tuple(g.shape)} {name}"
        rk = max(rt, REDUCED_RTOL.get(dtype, 0.0)) if k in ("A", "dt_bias", "D") else rt
        assert_close(g, g_ref, rtol=rk, atol=at, name=f"d{k} {name}")
    return errors


@st.composite
def shapes(draw):
    """(b, l, h, p, g, n, Q): tiny; headdim and dstate not powers of two, groups in {1, 2, heads}."""
    h = draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from(sorted({1, min(2, h), h})))
    return dict(b=draw(st.integers(1, 2)), l=draw(st.integers(1, 20)), h=h, p=draw(st.sampled_from([1, 5, 8, 24])),
                g=g, n=draw(st.integers(1, 17)), Q=draw(st.integers(2, 12)))


options = st.fixed_dictionaries(dict(
    D=st.sampled_from([None, "head", "channel"]), z=st.booleans(), dt_bias=st.booleans(),
    dt_softplus=st.booleans(), dt_limit=st.sampled_from([(0.0, math.inf), (0.05, 0.6)]),
    initial_state=st.booleans(),
))
ALL = dict(D="channel", z=True, dt_bias=True, dt_softplus=True, dt_limit=(0.05, 1.0), initial_state=True)
NONE = dict(D=None, z=False, dt_bias=False, dt_softplus=False, dt_limit=(0.0, math.inf), initial_state=False)


def inputs(shape, opts, seed, **over):
    s = dict(shape)
    Q = s.pop("Q")
    return make_inputs(**s, seed=seed, chunk_size=Q, **{**opts, **over})


@example(shape=dict(b=1, l=1, h=2, p=5, g=1, n=4, Q=8), opts=ALL, seed=0)  # seqlen 1
@example(shape=dict(b=2, l=7, h=2, p=5, g=2, n=4, Q=8), opts=ALL, seed=1)  # chunk - 1, groups == heads
@example(shape=dict(b=2, l=9, h=4, p=24, g=2, n=4, Q=8), opts=ALL, seed=2)  # chunk + 1, 2 heads per group
@example(shape=dict(b=1, l=16, h=4, p=5, g=1, n=17, Q=8), opts=dict(ALL, D="head"), seed=3)  # full chunks
@example(shape=dict(b=1, l=6, h=4, p=3, g=4, n=4, Q=1), opts=NONE, seed=4)  # chunk size 1, no options
@given(shape=shapes(), opts=options, seed=st.integers(0, 2**16))
def test_grads_match_chunked_fp64(shape, opts, seed):
    check_grads(inputs(shape, opts, seed), name=f"{shape} {opts}")


@st.composite
def packs(draw):
    lens = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    return [0] + torch.tensor(lens).cumsum(0).tolist()


@example(shape=dict(b=1, l=0, h=2, p=5, g=1, n=4, Q=4), cu=[0, 5, 6, 20], opts=ALL, seed=0)
@example(shape=dict(b=1, l=0, h=4, p=24, g=2, n=4, Q=4), cu=[0, 4, 8, 12], opts=ALL, seed=1)  # on chunk edges
@example(shape=dict(b=1, l=0, h=2, p=5, g=2, n=4, Q=3), cu=[0, 1, 2, 3], opts=dict(ALL, D="head"), seed=2)
@given(shape=shapes(), cu=packs(), opts=options, seed=st.integers(0, 2**16))
def test_grads_packed_match_chunked_fp64(shape, cu, opts, seed):
    """cu_seqlens: several sequences packed in one row, each with its own initial state."""
    check_grads(inputs(dict(shape, b=1, l=cu[-1]), opts, seed, cu_seqlens=cu), name=f"cu={cu} {shape} {opts}")


@pytest.mark.parametrize("use", ["y", "final"])
def test_grads_of_one_output(use):
    """Only y or only the final state reaches the loss (the other output's gradient is None)."""
    kw = make_inputs(2, 13, 4, 5, 2, 6, chunk_size=4, seed=5, **ALL)
    check_grads(kw, use_y=use == "y", use_final=use == "final", name=f"only {use}")


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_grads_half(dtype):
    kw = make_inputs(2, 19, 4, 10, 2, 8, dtype=dtype, chunk_size=8, seed=6, **ALL)
    check_grads(kw, name=str(dtype))


def test_grads_float64_inputs():
    """float64 inputs: the kernels compute in fp32, gradients come back in float64."""
    kw = as64(make_inputs(1, 10, 2, 5, 1, 4, chunk_size=4, seed=7, **ALL))
    wy = torch.ones(1, 10, 2, 5, dtype=torch.float64, device=DEV)
    ref, _, _ = scan_grads(kw, "chunked", wy, None)
    got, _, _ = scan_grads(kw, "triton", wy, None)
    for k, g in got.items():
        assert g.dtype == kw[k].dtype == (torch.float32 if k == "A" else torch.float64), k
        assert_close(g, ref[k], rtol=GRAD_TOL[torch.float32][0], atol=1e-6, name=f"d{k}")


def test_dispatch(monkeypatch):
    """ssd_scan's triton branch takes the autograd path only when a gradient is wanted; the outputs agree."""
    import holotron.kernels.ssd_triton_autograd as AG

    calls = []
    real = AG.ssd_scan_triton_train
    monkeypatch.setattr(AG, "ssd_scan_triton_train", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = make_inputs(1, 9, 2, 5, 1, 4, chunk_size=4, seed=8, **ALL)
    plain = {k: v for k, v in kw.items() if k not in ("x", "dt", "A", "B", "C")}
    y0, s0 = ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], backend="triton", **plain)
    assert not calls and not y0.requires_grad
    lv = leaves_of(kw)
    with torch.no_grad():
        ssd_scan(lv["x"], lv["dt"], lv["A"], lv["B"], lv["C"], backend="triton",
                 **{k: v for k, v in lv.items() if k not in ("x", "dt", "A", "B", "C")})
    assert not calls
    dtb = kw["dt_bias"].clone().requires_grad_()  # one leaf anywhere is enough
    y1, s1 = ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], backend="triton", **dict(plain, dt_bias=dtb))
    assert calls and y1.requires_grad and s1.requires_grad
    assert_close(y1.detach(), y0, name="y train vs inference")
    assert_close(s1.detach(), s0, name="final train vs inference")


@pytest.mark.parametrize("cfg", [dict(chunk_size=3), dict(BLOCK_P=16), dict(BLOCK_N=16), dict(BLOCK_P=16, chunk_size=3),
                                 dict(warps_dx=2, warps_dbc=2, stages_state=1, stages_dbc=1),
                                 dict(P_LOOP=False), dict(P_LOOP=False, BLOCK_P=16, chunk_size=3),
                                 dict(P_LOOP=True, BLOCK_P=16), dict(P_LOOP=True), dict(BLOCK_PK=16),
                                 dict(BLOCK_PK=16, BLOCK_N=16, P_LOOP=True, HEADS=2), dict(WALK=True),
                                 dict(WALK=True, BLOCK_W=16, chunk_size=3), dict(WALK=True, BLOCK_N=16, P_LOOP=False)],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_bwd_config(monkeypatch, cfg):
    """BWD_CONFIG: a training chunk shorter than the caller's, several headdim blocks in the reverse pass (their
    shares of ddt and dA added), several dstate blocks in the dB / dC kernel, other warps and stages, the dx
    kernel walking the headdim blocks of a head (P_LOOP, the default; 40 columns: three blocks of 16, or two of 32)
    or a program per block (P_LOOP False), the dB / dC
    kernel's products over the headdim in blocks (BLOCK_PK; three of 16 for 40), the state gradient in one
    reverse walk (WALK; headdim blocks of 32 or 16, a chunk that is not a power of two, sum(dS * S) from two
    dstate blocks): the same gradients."""
    from holotron.kernels import ssd_triton_backward

    for k, v in cfg.items():
        monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, k, v)
    check_grads(make_inputs(1, 21, 4, 40, 2, 20, chunk_size=4, seed=9, **ALL), name=f"BWD_CONFIG {cfg}")
    packed = make_inputs(1, 21, 2, 24, 1, 5, chunk_size=4, seed=10, cu_seqlens=[0, 5, 6, 21], **dict(ALL, D="head"))
    check_grads(packed, name=f"BWD_CONFIG {cfg} packed")


@pytest.mark.parametrize("chunk", [4, 16])
def test_bwd_tma(monkeypatch, chunk):
    """BWD_CONFIG tma=True: the backward's tiles through tensor descriptors (the interpreter's TMA), on fp32
    shapes whose strides are 16-byte multiples (headdim 16, dstate 4), chunks shorter than their padded tile
    (4 in 16) and not; plain and packed sequences: the same gradients."""
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "tma", True)
    check_grads(make_inputs(2, 21, 4, 16, 2, 4, chunk_size=chunk, seed=12, **ALL), name=f"tma chunk {chunk}")
    assert ssd_triton_backward.LAST_KERNEL["tma"]
    packed = make_inputs(1, 37, 2, 16, 1, 4, chunk_size=chunk, seed=13, cu_seqlens=[0, 5, 6, 23, 37],
                         **dict(ALL, D="head"))
    check_grads(packed, name=f"tma chunk {chunk} packed")
    assert ssd_triton_backward.LAST_KERNEL["tma"]


@pytest.mark.parametrize("q", [16, 64])
def test_grads_whatever_the_forward_chunk(monkeypatch, q):
    """The training forward writes its states at the backward's chunk boundaries whether the scan's own
    chunk setting is shorter (16: every 2nd chunk of 32) or longer (64: capped to the backward's 32)."""
    from holotron.kernels import ssd_triton_backward, ssd_triton_scan

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "chunk_size", 32)
    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "Q": q})
    check_grads(make_inputs(1, 70, 2, 6, 1, 4, chunk_size=128, seed=12, **ALL), name=f"scan Q {q}")


@pytest.mark.parametrize("rows", [None, 16])
def test_grads_with_the_two_pass_forward(monkeypatch, rows):
    """SCAN_CONFIG TWO_PASS serves the training forward too: the chunk states its pass leaves are the states
    entering each of the backward's chunks (its chunk is the backward's, 32 here; output rows of 32 or 16)."""
    from holotron.kernels import ssd_triton_backward, ssd_triton_scan, ssd_triton_twopass

    calls = []
    real = ssd_triton_twopass.scan_two_pass
    monkeypatch.setattr(ssd_triton_twopass, "scan_two_pass", lambda *a, **k: calls.append(k["Q"]) or real(*a, **k))
    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "chunk_size", 32)
    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "TWO_PASS": True,
                                                         "TP_ROWS": rows})
    check_grads(make_inputs(2, 70, 2, 6, 1, 4, chunk_size=128, seed=13, **ALL), name=f"two-pass rows {rows}")
    assert calls and set(calls) == {32}


@pytest.mark.parametrize("walk", [False, True], ids=["pass", "walk"])
def test_fp32_states_for_half_inputs(monkeypatch, walk):
    """BWD_CONFIG STATES "fp32": bf16 inputs, the training forward stores its chunk states in fp32 (so do the
    state gradients) and the gradients still match float64 within bf16's tolerance, dA and ddt closer than with
    bf16 storage (the interpreter multiplies every product in fp32: what differs here is the storage); "grads"
    (the state gradients alone in fp32) in between for dA."""
    from holotron.kernels import ssd_triton_autograd, ssd_triton_backward

    kept = []
    real = ssd_triton_autograd._forward
    monkeypatch.setattr(ssd_triton_autograd, "_forward",
                        lambda *a, **k: (lambda out: kept.append(out.states.dtype) or out)(real(*a, **k)))
    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "chunk_size", 16)
    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "WALK", walk)
    kw = make_inputs(2, 48, 4, 10, 2, 8, dtype=torch.bfloat16, chunk_size=16, seed=14, **ALL)
    errors = {}
    for states in (None, "fp32", "grads"):
        monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "STATES", states)
        errors[states] = check_grads(kw, name=f"states {states}")
    assert kept == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert errors["fp32"]["dA"] < errors[None]["dA"] and errors["fp32"]["ddt"] < errors[None]["ddt"], errors
    assert errors["fp32"]["dA"] < errors["grads"]["dA"] < errors[None]["dA"], errors
    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "STATES", "fp16")
    with pytest.raises(ValueError, match="STATES"):
        check_grads(kw)


def test_bwd_config_bad_block(monkeypatch):
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "BLOCK_P", 24)
    with pytest.raises(ValueError, match="BLOCK_P"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, chunk_size=4, seed=11, **ALL))


def test_bwd_config_bad_pk(monkeypatch):
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "BLOCK_PK", 20)
    with pytest.raises(ValueError, match=r"BLOCK_PK.*power of two >= 16, got 20"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, chunk_size=4, seed=11, **ALL))


def test_bwd_config_bad_walk_block(monkeypatch):
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "WALK", True)
    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "BLOCK_W", 24)
    with pytest.raises(ValueError, match=r"BLOCK_W.*power of two >= 16, got 24"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, chunk_size=4, seed=11, **ALL))


def test_bwd_config_bad_heads(monkeypatch):
    """HEADS must divide the heads per group (here 2): a clear error naming the setting."""
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "HEADS", 3)
    with pytest.raises(ValueError, match=r"HEADS.*heads per group \(2\), got 3"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, chunk_size=4, seed=11, **ALL))


# ----------------------------------------------------------------------------- GPU: the 12B layer's sizes

REAL = dict(b=2, l=1000, h=128, p=80, g=8, n=128)


def _gpu_report(kw, name):
    """Gradients against autograd through the float64 chunked scan on the GPU (itself held to the naive
    recurrence by test_kernels.py); prints the relative RMS error of each (pytest -s shows it)."""
    check_grads(kw, name=name, report=True)


@pytest.mark.gpu
def test_gpu_grads_real_size_bf16():
    r = REAL
    kw = make_inputs(r["b"], r["l"], r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=30,
                     D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    _gpu_report(kw, "12B layer bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("states", ["fp32", "grads"])
def test_gpu_grads_real_size_bf16_fp32_states(monkeypatch, states):
    """BWD_CONFIG STATES at the real size (the tf32 products the interpreter does not run)."""
    from holotron.kernels import ssd_triton_backward

    monkeypatch.setitem(ssd_triton_backward.BWD_CONFIG, "STATES", states)
    r = REAL
    kw = make_inputs(r["b"], r["l"], r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=30,
                     D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    _gpu_report(kw, f"12B layer bf16, states {states}")


@pytest.mark.gpu
def test_gpu_grads_real_size_bf16_two_pass(monkeypatch):
    """The training forward through SCAN_CONFIG TWO_PASS at the real size (two batch rows)."""
    from holotron.kernels import ssd_triton_scan

    monkeypatch.setattr(ssd_triton_scan, "SCAN_CONFIG", {**ssd_triton_scan.SCAN_CONFIG, "TWO_PASS": True})
    r = REAL
    kw = make_inputs(2, 1500, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=32,
                     D="head", z=True, dt_bias=True, dt_softplus=True, initial_state=True, chunk_size=128)
    _gpu_report(kw, "12B layer bf16, two-pass forward")


@pytest.mark.gpu
def test_gpu_grads_real_size_bf16_packed():
    r = REAL
    kw = make_inputs(1, 2000, r["h"], r["p"], r["g"], r["n"], dtype=torch.bfloat16, device="cuda", seed=31,
                     D="channel", dt_softplus=True, initial_state=True, cu_seqlens=[0, 700, 701, 1333, 2000],
                     chunk_size=128)
    _gpu_report(kw, "12B layer bf16 packed")


@pytest.mark.gpu
@pytest.mark.parametrize("Q", [64, 100])
def test_gpu_grads_medium_fp32(Q):
    """fp32 on the GPU at a headdim and dstate whose tiles fit (at the 12B's, ssd_scan takes the chunked
    backend for fp32 gradients on CUDA)."""
    kw = make_inputs(2, 300, 8, 40, 2, 32, device="cuda", seed=32, chunk_size=Q, **ALL)
    _gpu_report(kw, f"fp32 Q={Q}")


def test_bwd_out_of_shared_memory_says_what_to_do(monkeypatch):
    """A backward whose tiles do not fit the GPU's shared memory: a short ValueError naming the sizes and
    the way out, not Triton's traceback."""
    from triton.runtime.errors import OutOfResources

    from holotron.kernels import ssd_triton_backward

    class TooBig:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(300000, 232448, "shared memory")
            return launch

    monkeypatch.setattr(ssd_triton_backward, "_bwd_dbc", TooBig())
    with pytest.raises(ValueError, match=r"headdim 5, dstate 4.*backend='chunked'"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, chunk_size=4, seed=11, **ALL))
    with pytest.raises(ValueError, match=r"torch.bfloat16, BLOCK_N 16, STATES None.*smaller BWD_CONFIG tiles"):
        check_grads(make_inputs(1, 5, 2, 5, 1, 4, dtype=torch.bfloat16, chunk_size=4, seed=11, **ALL))


def test_fp32_state_tiles_take_half_the_dstate_columns(monkeypatch):
    """STATES "fp32" / "grads" store fp32 state tiles: the automatic BLOCK_N halves (64 overflowed an H100's
    shared memory at the 12B sizes, docs/benchmarks.md); a BLOCK_N that is set stays."""
    from holotron.kernels import ssd_triton_backward as TB

    assert TB.bwd_launch(80, 128)["BLOCK_N"] == 64
    for states in ("fp32", "grads"):
        monkeypatch.setitem(TB.BWD_CONFIG, "STATES", states)
        assert TB.bwd_launch(80, 128)["BLOCK_N"] == 32
        monkeypatch.setitem(TB.BWD_CONFIG, "BLOCK_N", 64)
        assert TB.bwd_launch(80, 128)["BLOCK_N"] == 64
        monkeypatch.setitem(TB.BWD_CONFIG, "BLOCK_N", None)
