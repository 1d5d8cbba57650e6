"""The one-token decode step: ``HybridLM.step`` on a ``DecodeState`` against ``HybridLM.forward`` on an
``InferenceState``; the Mamba decode op's kernels (the conv window in Triton, CPU interpreter or GPU)
against their PyTorch twin; the compiled step; the one sampler."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

from holotron import kernels
from holotron.engine import Engine
from holotron.generate import generate
from holotron.kernels import conv_step
from holotron.kernels.conv_naive import conv_step_naive
from holotron.mamba2 import mamba_step, neg_A
from holotron.sampling import choose_tokens, sample
from holotron.state import DecodeState

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=11)


def test_step_equals_forward_token_by_token(model):
    """Prefill 6 tokens into both states, then 8 steps: same logits, same greedy tokens (fp32)."""
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model.new_state(3, capacity=32)
        logits = model(ids, state=ref, logits_to_keep=1)[:, -1]
        tmp = model.new_state(3, capacity=6)
        model(ids, state=tmp)
        st = DecodeState.allocate(model, 4, 64)
        for r in range(3):
            st.load(r, tmp, r)
        rows = st.rows(3)
        tok = logits.argmax(-1)
        for _ in range(8):
            a = model(tok[:, None], state=ref, logits_to_keep=1)[:, -1]
            b = model.step(tok, rows)
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            assert torch.equal(a.argmax(-1), b.argmax(-1))
            tok = a.argmax(-1)
        assert st.lengths.tolist() == [14, 14, 14, 0]


def test_step_advances_only_active_rows(model):
    st = DecodeState.allocate(model, 2, 64)
    with torch.inference_mode():
        model.step(torch.tensor([5, 6]), st, torch.tensor([1, 0]))
    assert st.lengths.tolist() == [1, 0]


def test_one_allocator_for_both_states(model):
    a = model.new_state(2, capacity=64, ssm_dtype=torch.bfloat16)
    b = DecodeState.allocate(model, 2, 8, torch.bfloat16)  # 8 slots and the spare one, rounded up to 64
    def shapes(st):  # each layer's tensors (an FP8 cache's scales are None in a 16-bit one)
        return [None if s is None else {k: None if v is None else (v.shape, v.dtype) for k, v in vars(s).items()}
                for s in st.layers]

    assert shapes(a) == shapes(b)


# ------------------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("K,c,bias,dtype", [(4, 40, True, torch.float32), (3, 300, False, torch.float32),
                                            (4, 520, True, torch.bfloat16)])
def test_conv_step_triton_equals_naive(K, c, bias, dtype):
    g = torch.Generator().manual_seed(K + c)
    conv = torch.randn(3, c, K, generator=g).to(DEV, dtype)
    x = torch.randn(3, c, generator=g).to(DEV, dtype)
    w = torch.randn(c, 1, K, generator=g).to(DEV, dtype)
    b = torch.randn(c, generator=g).to(DEV, dtype) if bias else None
    c1, c2 = conv.clone(), conv.clone()
    y1 = conv_step(c1, x, w, b, backend="triton")
    y2 = conv_step(c2, x, w, b, backend="naive")
    assert torch.equal(c1, c2) and torch.equal(c1[:, :, -1], x.to(dtype)) and torch.equal(c1[:, :, :-1], conv[:, :, 1:])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y1, y2, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,t,c,K", [(3, 7, 40, 4), (2, 33, 300, 3), (2, 1, 20, 4)])
@pytest.mark.parametrize("counts", [None, "short"])
@pytest.mark.parametrize("window", [True, False])
def test_conv_seq_triton_equals_naive(dtype, b, t, c, K, counts, window):
    """The prefill conv: x a strided slice (as in_proj's output), the window in front of it, pads read as zeros
    and left out of the window; the Triton kernel against the PyTorch twin: windows equal, outputs within
    rounding."""
    g = torch.Generator().manual_seed(b * t + c)
    x = torch.randn(b, t, c + 9, generator=g).to(DEV, dtype)[:, :, 3:3 + c]
    w = torch.randn(c, 1, K, generator=g).to(DEV, dtype)
    bias = torch.randn(c, generator=g).to(DEV, dtype)
    n = None if counts is None else torch.tensor([t, max(t - 3, 0), 1][:b], device=DEV)
    conv = torch.randn(b, c, K, generator=g).to(DEV, dtype)
    c1, c2 = (conv.clone(), conv.clone()) if window else (None, None)
    y1 = kernels.conv_seq(x, c1, w, bias, n, backend="triton")
    y2 = kernels.conv_seq(x, c2, w, bias, n, backend="naive")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y1, y2, rtol=tol, atol=tol)
    if window:
        assert torch.equal(c1, c2)
        last = t if n is None else int(n[0])
        if last >= K:  # row 0's window: its last K real inputs
            assert torch.equal(c1[0], x[0, last - K:last].T.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_seq_with_rows_of_a_window_buffer_equals_the_gathered_windows(dtype):
    """``conv_seq(..., rows=)``: batch row i's window is row rows[i] of a larger buffer, read and updated there
    (a row of pads only left as it was), other rows untouched; the Triton kernel and the naive twin against the
    call on the gathered windows."""
    g = torch.Generator().manual_seed(5)
    b, t, c, K = 3, 9, 40, 4
    x = torch.randn(b, t, c, generator=g).to(DEV, dtype)
    w = torch.randn(c, K, generator=g).to(DEV, dtype)
    bias = torch.randn(c, generator=g).to(DEV, dtype)
    n = torch.tensor([9, 4, 0], device=DEV)
    buf = torch.randn(6, c, K, generator=g).to(DEV, dtype)
    rows = torch.tensor([4, 0, 2], device=DEV)
    part = buf[rows].clone()
    want = kernels.conv_seq(x, part, w, bias, n, backend="naive")
    for backend in ("naive", "triton"):
        got_buf = buf.clone()
        got = kernels.conv_seq(x, got_buf, w, bias, n, backend=backend, rows=rows)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert torch.equal(got_buf[rows], part), backend
        assert torch.equal(got_buf[2], buf[2])   # count 0: as it was
        for r in (1, 3, 5):
            assert torch.equal(got_buf[r], buf[r]), (backend, r)
    with pytest.raises(ValueError, match="rows must be an integer tensor"):
        kernels.conv_seq(x, buf, w, bias, n, rows=rows.float())
    with pytest.raises(ValueError, match=r"conv must have shape \(rows, channels=40, K=4\)"):
        kernels.conv_seq(x, buf[:, :, :3], w, bias, n, rows=rows)


def test_conv_seq_checks_its_arguments():
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"conv must have shape \(batch=2, channels=8, K=4\)"):
        kernels.conv_seq(x, torch.zeros(2, 8, 3), torch.randn(8, 4))
    with pytest.raises(ValueError, match="counts must be an integer tensor"):
        kernels.conv_seq(x, None, torch.randn(8, 4), counts=torch.ones(2))
    with pytest.raises(ValueError, match=r"weight must have shape \(channels=8, K\)"):
        kernels.conv_seq(x, None, torch.randn(7, 4))
    w = torch.randn(8, 4, requires_grad=True)
    with pytest.raises(ValueError, match="has no backward"):   # where Triton runs (CUDA, or the interpreter)
        kernels.conv_seq(x.to(DEV), None, w.detach().to(DEV).requires_grad_(), backend="triton")
    y = kernels.conv_seq(x, None, w)  # autograd: the PyTorch twin
    y.sum().backward()
    assert w.grad is not None


def test_conv_step_equals_the_prefill_conv(model):
    """The decode conv continues the prefill's causal conv: the Mixer's forward over T tokens in one call
    equals one call of T-1 then a step."""
    m = next(b.mixer for b in model.backbone.layers if b.kind == "mamba")
    u = torch.randn(2, 7, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        whole = m(u)
        st = m.new_state(2)
        m(u[:, :6], st)
        last = m.step(u[:, 6:], st)
    torch.testing.assert_close(last, whole[:, 6:], rtol=1e-5, atol=1e-5)


def test_mamba_step_op_matches_the_naive_recurrence():
    g = torch.Generator().manual_seed(3)
    b, H, P, N, G, K = 2, 4, 8, 16, 2, 4
    C = H * P + 2 * G * N
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    xBC, dt, z = r(b, C), r(b, H), r(b, H * P)
    conv, ssm = r(b, C, K), r(b, H, P, N)
    w, cb, A_log, D, dtb = r(C, 1, K), r(C), r(H).abs(), r(H), r(H)
    c2, s2 = conv.clone(), ssm.clone()
    y = mamba_step(xBC, dt, z, conv, ssm, w, cb, A_log, D, dtb, 0.0, math.inf, G)
    xc = conv_step_naive(c2, xBC, w.view(C, K), cb)
    x, B, Cm = xc.split([H * P, G * N, G * N], -1)
    with kernels.use_backend("naive"):
        want = kernels.ssd_step(s2, x.view(b, H, P), dt, -torch.exp(A_log), B.view(b, G, N), Cm.view(b, G, N),
                                D=D, z=z.view(b, H, P), dt_bias=dtb, dt_softplus=True)
    torch.testing.assert_close(y, want.view(b, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssm, s2) and torch.testing.assert_close(conv, c2)


def test_neg_A_is_cached_until_A_log_changes():
    A_log = torch.nn.Parameter(torch.zeros(4))
    with torch.no_grad():
        a = neg_A(A_log)
        assert neg_A(A_log) is a and torch.equal(a, -torch.ones(4))
        A_log.fill_(math.log(2.0))
        assert torch.equal(neg_A(A_log), -2 * torch.ones(4))
    assert neg_A(A_log).requires_grad  # training: never a cached (freed) graph


def test_neg_A_cache_leaves_with_its_tensor():
    """A cached -exp(A_log) is never served to another tensor that reuses a dead one's id or storage."""
    from holotron import mamba2

    with torch.no_grad():
        A_log = torch.zeros(4)
        neg_A(A_log)
        key = id(A_log)
        assert key in mamba2._A_cache
        del A_log
        assert key not in mamba2._A_cache
        fresh = torch.full((4,), math.log(3.0))
        assert torch.allclose(neg_A(fresh), -3 * torch.ones(4))


# ------------------------------------------------------------------------------------- compiled step


def test_compiled_step_equals_the_plain_loop(model):
    """torch.compile of the whole HybridLM.step (the 'eager' backend on the CPU: the graph Dynamo traces,
    the custom Mamba op kept opaque) gives the plain loop's greedy tokens."""
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(4))
    plain = generate(model, ids, 6, eos_token_id=[], engine=False)
    eng = Engine(model, max_batch=2, max_len=32, compile="eager")
    assert torch.equal(generate(model, ids, 6, eos_token_id=[], engine=eng), plain)
    assert eng.note is None


# ------------------------------------------------------------------------------------- sampling


def test_choose_tokens_never_sorts_the_vocabulary(monkeypatch):
    called = []
    orig = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda *a, **k: (called.append(1), orig(*a, **k))[1])
    logits = torch.randn(3, 5000)
    choose_tokens(logits, torch.ones(3), torch.tensor([5, 5000, 5000]), torch.tensor([2.0, 0.9, 2.0]), None)
    assert not called


def test_candidates_and_gumbel_draw_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).repeat(6000, 1)
    g = torch.Generator().manual_seed(1)
    n = 6000
    for kw, want in (({}, [0.4, 0.3, 0.2, 0.1]), ({"top_k": 2}, [4 / 7, 3 / 7, 0, 0]),
                     ({"top_p": 0.65}, [4 / 7, 3 / 7, 0, 0])):
        tok = sample(logits, 1.0, generator=g, **kw)
        freq = torch.bincount(tok, minlength=4).float() / n
        assert torch.allclose(freq, torch.tensor(want), atol=0.03), (kw, freq)
    assert torch.equal(sample(logits[:2], 0.0), torch.zeros(2, dtype=torch.long))


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_inductor_compiled_cuda_graph_step_equals_plain_loop():
    m = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=7).cuda()
    ids = torch.randint(3, 96, (3, 7), generator=torch.Generator().manual_seed(5)).cuda()
    plain = generate(m, ids, 10, eos_token_id=[], engine=False)
    eng = Engine(m, max_batch=3, max_len=32, compile=True)
    assert eng.note is None, eng.note
    assert torch.equal(generate(m, ids, 10, eos_token_id=[], engine=eng), plain)
    for dt in (torch.bfloat16, torch.float16):
        e16 = Engine(m, max_batch=3, max_len=32, ssm_dtype=dt)
        out = generate(m, ids, 10, eos_token_id=[], engine=e16)
        assert (out == plain).float().mean() > 0.8
