"""The decode step's fused linear ops (holotron/decode_ops.py, the GEMV kernel's norm / group norm / relu^2 /
residual): against their plain composition and float64, one op at a time and through the whole model's step
(bf16 and FP8 weights), on Triton's CPU interpreter here and on the GPU under ``-m gpu``."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_lm import tiny_config, tiny_lm
from torch import nn

from holotron import decode_ops, quant
from holotron.decode_ops import fused_decode, linear_residual, norm_linear
from holotron.layers import GatedRMSNorm, RMSNorm
from holotron.quant import gemv, gemv_ref, quantize_
from holotron.state import DecodeState

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts launches of the fused kernel (so a test cannot pass on the plain path by accident)."""
    calls = []
    real = quant.gemv

    def counting(*a, **kw):
        calls.append(kw.get("backend"))
        return real(*a, **kw)

    monkeypatch.setattr(decode_ops, "gemv", counting)
    return calls


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("split", [1, 3])
def test_gemv_norm_act_residual_match_float64(m, wdtype, split):
    """Every fused part against its float64 twin: rmsnorm over the row (its sum of squares from the same pass,
    or, K split over programs, from the reducing launch), relu^2, scale, residual."""
    g = torch.Generator().manual_seed(m * 10 + split)
    k, n = 128, 40
    x = (torch.randn(m, k, generator=g) * 3).to(DEV)
    w = torch.randn(n, k, generator=g) / 10
    scale = None
    if wdtype == torch.float8_e4m3fn:
        w, scale = quant.quantize_weight(w)
        scale = scale.to(DEV)
    w = w.to(wdtype).to(DEV)
    gw = (torch.rand(k, generator=g) + 0.5).to(DEV)
    res = torch.randn(m, n, generator=g).to(DEV)
    cfg = dict(BLOCK_N=16, BLOCK_K=32, SPLIT=split, num_warps=4)
    for act, r in ((None, res), ("relu2", None)):
        want = gemv_ref(x.double(), w.double(), None if scale is None else scale.double(),
                        None if r is None else r.double(), norm=gw.double(), act=act)
        y = gemv(x, w, scale, r, norm=gw, act=act, out_dtype=torch.float32, backend="triton", config=cfg)
        assert _rel(y, want) < 1e-5, (act, _rel(y, want))
    # the reference itself is the module math: RMSNorm then the product
    nm = RMSNorm(k).double()
    nm.weight.data.copy_(gw.double().cpu())
    xd = x.double().cpu()
    direct = nm(xd) @ w.double().cpu().T * (1 if scale is None else scale.double().cpu())
    got = gemv_ref(xd, w.double().cpu(), None if scale is None else scale.double().cpu(), norm=gw.double().cpu())
    assert _rel(got, direct) < 1e-6  # RMSNorm computes in fp32


def test_every_fp8_code_is_widened_exactly():
    """Every finite e4m3 code, the smallest subnormal to 448, through the one-row GEMV: the float64 product."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[torch.isfinite(codes.float())]
    k = codes.numel()
    w = codes.view(1, k).repeat(16, 1).to(DEV)
    scale = torch.linspace(0.5, 2.0, 16).to(DEV)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(0)).to(DEV)
    want = gemv_ref(x.double(), w.double(), scale.double())
    y = gemv(x, w, scale, out_dtype=torch.float32, backend="triton",
             config=dict(BLOCK_N=16, BLOCK_K=64, SPLIT=1, num_warps=4))
    assert _rel(y, want) < 1e-6


@pytest.fixture(params=[(1, 1), (16, 2), (1, 2)], ids=["one-row", "rows-through-tl.dot", "rows-norm-kernels"])
def rows(request, monkeypatch):
    """(FUSED_MAX_ROWS, batch): the fused GEMV at one row (the default); forced up to 16 rows (the tl.dot
    tile); and 2 rows past the limit, where the norms run as row kernels before the skinny product (16-bit
    weights forced onto it: ``MM_ROWS``)."""
    monkeypatch.setattr(decode_ops, "FUSED_MAX_ROWS", request.param[0])
    monkeypatch.setattr(decode_ops, "MM_ROWS", 256)
    return request.param


@pytest.fixture
def row_kernel_calls(monkeypatch):
    """Counts launches of the row-norm, group-norm kernels and the skinny product."""
    from holotron.kernels import group_norm_triton, rows_triton, skinny_mm_triton

    calls = []
    for mod, name in ((rows_triton, "row_norm_quant"), (group_norm_triton, "group_rms_norm_triton"),
                      (skinny_mm_triton, "skinny_mm")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    return calls


def test_group_norm_kernel_equals_the_module():
    from holotron.kernels.group_norm_triton import group_rms_norm_triton

    g = torch.Generator().manual_seed(2)
    nm = GatedRMSNorm(96, groups=4)
    nm.weight.data.copy_(torch.rand(96, generator=g) + 0.5)
    v = torch.randn(3, 96, generator=g) * 4
    for dtype in (torch.float32, torch.bfloat16):
        m = copy.deepcopy(nm).to(DEV, dtype)
        vv = v.to(DEV, dtype)
        got = group_rms_norm_triton(vv, m.weight, 4, m.eps)
        want = m.normed(vv.float(), dtype)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-5 if dtype == torch.float32 else 1e-2,
                                   atol=1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_group_normed_into_rows_of_a_buffer(mode, row_kernel_calls):
    """``group_normed(v, gnorm, out)`` (a mixed pass's two parts written into one buffer): the same bits as
    without ``out``, only its rows written, the kernel launched when it is on; a wrong ``out`` is refused."""
    g = torch.Generator().manual_seed(3)
    nm = GatedRMSNorm(96, groups=4)
    nm.weight.data.copy_(torch.rand(96, generator=g) + 0.5)
    m = nm.to(DEV, torch.bfloat16)
    v = (torch.randn(5, 96, generator=g) * 3).to(DEV, torch.bfloat16)
    buf = torch.full((9, 96), 7.0, device=DEV, dtype=torch.bfloat16)
    with torch.inference_mode(), fused_decode(mode):
        want = decode_ops.group_normed(v, m)
        got = decode_ops.group_normed(v, m, buf[2:7])
    assert got.data_ptr() == buf[2:7].data_ptr()
    assert torch.equal(buf[2:7], want)
    assert (buf[:2] == 7).all() and (buf[7:] == 7).all()
    assert row_kernel_calls.count("group_rms_norm_triton") == (2 if mode == "on" else 0)
    with pytest.raises(ValueError, match="out must be contiguous"):
        decode_ops.group_normed(v, m, buf[:4])


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_norm_linear_and_linear_residual_fused_equal_plain(wdtype, kernel_calls, rows, row_kernel_calls):
    torch.manual_seed(0)
    d, hid = 64, 128
    norm = RMSNorm(d).to(DEV)
    norm.weight.data.uniform_(0.5, 1.5)
    up, down = nn.Linear(d, hid, bias=False), nn.Linear(hid, d, bias=False)
    gnorm = GatedRMSNorm(hid, groups=4).to(DEV)
    gnorm.weight.data.uniform_(0.5, 1.5)
    up, down = up.to(DEV, torch.bfloat16), down.to(DEV, torch.bfloat16)
    if wdtype == torch.float8_e4m3fn:
        up, down = quant.FP8Linear.from_linear(up), quant.FP8Linear.from_linear(down)
    norm, gnorm = norm.to(torch.bfloat16), gnorm.to(torch.bfloat16)
    x = torch.randn(rows[1], 1, d, device=DEV).to(torch.bfloat16)
    with torch.inference_mode():
        with fused_decode("off"):
            h0 = norm_linear(x, norm, up, act="relu2")
            y0 = linear_residual(h0, down, x, gnorm)
        assert not kernel_calls
        del row_kernel_calls[:]   # the plain path's FP8Linear on CUDA runs the skinny product too: not counted
        with fused_decode("on"):
            h1 = norm_linear(x, norm, up, act="relu2")
            y1 = linear_residual(h1, down, x, gnorm)
            lg = norm_linear(x, norm, up, out_dtype=torch.float32)
        if rows[1] <= rows[0]:
            assert len(kernel_calls) == 3
        else:  # past the GEMV's rows: the norms as row kernels (on CUDA with FP8 weights, quantising too), then
            # the skinny product with relu^2 / the residual in its epilogue (FP8 on the CPU: the widened weights)
            assert not kernel_calls and {"group_rms_norm_triton", "row_norm_quant"} <= set(row_kernel_calls)
            assert row_kernel_calls.count("skinny_mm") == (3 if wdtype == torch.bfloat16 or DEV == "cuda" else 0)
    assert h1.dtype == h0.dtype == torch.bfloat16 and y1.dtype == y0.dtype and lg.dtype == torch.float32
    # the fused path skips the bf16 rounding of the normalised x: a few bf16 ulps apart; with FP8 weights on CUDA
    # one side quantises x to e4m3 (3 mantissa bits: the plain FP8Linear's skinny product, or the fused row
    # kernels) where the other multiplies bf16 x by the widened weights (the GEMV)
    tol = 6e-2 if wdtype == torch.float8_e4m3fn and DEV == "cuda" else 3e-2
    assert _rel(h1, h0) < tol and _rel(y1, y0) < tol


def test_plain_path_where_the_kernel_cannot_run(kernel_calls, monkeypatch):
    """fp32 weights, a bias, more rows than FUSED_MAX_ROWS, autograd, or mode "off": the plain composition."""
    monkeypatch.setattr(decode_ops, "FUSED_MAX_ROWS", 16)
    norm = RMSNorm(32).to(DEV)
    lin32 = nn.Linear(32, 16, bias=False).to(DEV)
    biased = nn.Linear(32, 16).to(DEV, torch.bfloat16)
    lin = nn.Linear(32, 16, bias=False).to(DEV, torch.bfloat16)
    x = torch.randn(2, 32, device=DEV)
    with fused_decode("on"):
        torch.testing.assert_close(norm_linear(x, norm, lin32), lin32(norm(x)), rtol=0, atol=0)
        norm_linear(x.bfloat16(), norm.to(torch.bfloat16), biased)
        norm_linear(torch.randn(17, 32, device=DEV, dtype=torch.bfloat16), norm, lin)
        norm_linear(x.bfloat16().requires_grad_(), norm, lin)
        norm_linear(x.bfloat16(), norm, lin)  # grad enabled, lin's weight trainable: autograd must see it
        assert not kernel_calls
        with torch.inference_mode():
            norm_linear(x.bfloat16(), norm, lin)
        assert len(kernel_calls) == 1
    with pytest.raises(ValueError, match="mode must be one of"):
        fused_decode("fast")


@pytest.mark.parametrize("fp8", [False, True])
def test_fused_model_step_is_as_accurate_as_the_plain_step(fp8, kernel_calls, rows, row_kernel_calls):
    """A bf16 (or FP8) model's decode steps, fused and plain, against the same model's fp32 twin, teacher-forced
    on the fp32 greedy tokens: the fused step is no further from fp32 than the plain one (it rounds less)."""
    cfg = tiny_config(hybrid_override_pattern="M*-M-", hidden_size=64, intermediate_size=96, mamba_num_heads=4,
                      mamba_head_dim=16, ssm_state_size=16, n_groups=2)
    ref = tiny_lm(cfg, seed=3).to(DEV)
    low = copy.deepcopy(ref).to(torch.bfloat16)
    if fp8:
        quantize_(low)
        ref = copy.deepcopy(low)  # the fp32 twin of the FP8 model: its widened weights in fp32
        for blk in ref.backbone.layers:
            for name, mod in list(blk.mixer.named_children()):
                if isinstance(mod, quant.FP8Linear):
                    lin = nn.Linear(mod.in_features, mod.out_features, bias=False, device=DEV)
                    lin.weight.data.copy_(mod.dequantize(torch.float32))
                    setattr(blk.mixer, name, lin)
        ref = ref.float()
    nb = rows[1]
    ids = torch.randint(3, 96, (nb, 5), generator=torch.Generator().manual_seed(0)).to(DEV)
    states = {}
    with torch.inference_mode():
        for key, model in (("ref", ref), ("plain", low), ("fused", low)):
            tmp = model.new_state(nb, capacity=5)
            model(ids, state=tmp)
            st = DecodeState.allocate(model, nb, 32)
            for r in range(nb):
                st.load(r, tmp, r)
            states[key] = st
        tok = ids[:, -1]
        errs = {"plain": [], "fused": []}
        for _ in range(10):
            want = ref.step(tok, states["ref"])
            with fused_decode("off"):
                plain = low.step(tok, states["plain"])
            n0 = len(kernel_calls)
            with fused_decode("on"):
                fused = low.step(tok, states["fused"])
            if nb <= rows[0]:
                assert len(kernel_calls) - n0 == 2 * 4 + 4 + 1  # 2 per Mamba / MLP block, q k v o, lm_head
            else:
                assert len(kernel_calls) == 0 and row_kernel_calls
            assert fused.dtype == torch.float32
            errs["plain"].append(_rel(plain, want))
            errs["fused"].append(_rel(fused, want))
            tok = want.argmax(-1)
    print({k: round(max(v), 5) for k, v in errs.items()})
    assert max(errs["fused"]) <= 1.25 * max(errs["plain"]) + 1e-3, errs
    # FP8 on CUDA: the plain step itself is about 0.05 from the fp32 twin (H100, 2026-12-06)
    assert max(errs["fused"]) < (0.1 if fp8 and DEV == "cuda" else 0.05), errs


@pytest.mark.gpu
def test_gpu_fused_step_in_the_captured_engine():
    """On the GPU the fused step is the default: the captured engine's greedy tokens equal the eager fused
    step's, and its logits stay as close to fp32 as the plain step's."""
    from holotron.engine import Engine

    cfg = tiny_config(hybrid_override_pattern="M*-M-M*-", hidden_size=256, intermediate_size=512,
                      mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=32, n_groups=2, vocab_size=512)
    model = tiny_lm(cfg, seed=5).cuda().to(torch.bfloat16)
    prompts = [[5, 9, 13, 40], [7, 8, 100, 200, 3]]
    outs = {}
    for mode in ("on", "off"):
        with fused_decode(mode):
            eng = Engine(model, max_batch=1, max_len=64)  # one row: the fused path's batch
            outs[mode] = []
            for p in prompts:
                req = eng.submit(p, max_new_tokens=12)
                eng.run()
                outs[mode].append(req.tokens)
    # both runs greedy-decode the same bf16 model: near-ties aside, the same tokens
    same = sum(a == b for x, y in zip(outs["on"], outs["off"]) for a, b in zip(x, y))
    assert same >= 0.8 * sum(len(x) for x in outs["on"]), outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_kernel_equals_masked_sdpa(dtype):
    """Split over the keys and combined: equal to SDPA with the key mask, for rows of 1 key, keys ending
    inside a block and inside a chunk, and a full cache; the cache a strided view (rows of a larger state)."""
    import torch.nn.functional as F

    from holotron.kernels.attn_decode_triton import attn_decode_triton

    g = torch.Generator().manual_seed(4)
    b, hkv, r, hd, L = 4, 2, 5, 24, 600
    q = torch.randn(b, hkv, r, hd, generator=g).to(DEV, dtype)
    k = torch.randn(b + 2, hkv, L, hd, generator=g).to(DEV, dtype)[:b]
    v = torch.randn(b + 2, hkv, L, hd, generator=g).to(DEV, dtype)[:b]
    n = torch.tensor([1, 70, 257, 600], device=DEV)
    mask = (torch.arange(L, device=DEV)[None, :] < n[:, None])[:, None, None]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    got = attn_decode_triton(q, k, v, n)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    # keys past n_keys are never read: garbage there changes nothing
    k2, v2 = k.clone(), v.clone()
    for i, m in enumerate(n.tolist()):
        k2[i, :, m:] = float("nan")
        v2[i, :, m:] = float("nan")
    torch.testing.assert_close(attn_decode_triton(q, k2, v2, n), got, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_row_norm_quant_matches_torch():
    """On the GPU the kernel stores e4m3 itself: its codes decode to within e4m3 rounding of the normalised
    rows (the conversion rounds to nearest: no code off by more than one step)."""
    from holotron.kernels.rows_triton import row_norm_quant

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 5120, device="cuda", generator=g).to(torch.bfloat16) * 3
    w = torch.rand(5120, device="cuda", generator=g) + 0.5
    norm = RMSNorm(5120).cuda()
    norm.weight.data.copy_(w)
    want = norm(x.float())
    q, s = row_norm_quant(x, w, norm.eps, quant=True)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    torch.testing.assert_close(s[:, 0] * 448, want.abs().amax(1), rtol=1e-4, atol=0)
    ref = (want / s).to(torch.float8_e4m3fn).float()
    step = (ref.abs().clamp_min(2.0 ** -6).log2().floor() - 3).exp2()
    assert ((q.float() - ref).abs() <= step * 1.01).all()
    y, none = row_norm_quant(x, w, norm.eps)
    assert none is None
    torch.testing.assert_close(y.float(), want.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_batched_step_through_the_row_kernels(fp8):
    """Four rows (past the GEMV's one): norm / group-norm / quantising row kernels and the attention kernel,
    teacher-forced against the plain step: as close to the fp32 twin as the plain step."""
    cfg = tiny_config(hybrid_override_pattern="M*-M-", hidden_size=256, intermediate_size=512, mamba_num_heads=8,
                      mamba_head_dim=32, ssm_state_size=32, n_groups=2, vocab_size=512)
    ref = tiny_lm(cfg, seed=6).cuda()
    low = copy.deepcopy(ref).to(torch.bfloat16)
    if fp8:
        quantize_(low)
    ids = torch.randint(3, 512, (4, 7), generator=torch.Generator().manual_seed(1)).cuda()
    states = {}
    with torch.inference_mode():
        for key, model in (("ref", ref), ("plain", low), ("fused", low)):
            tmp = model.new_state(4, capacity=7)
            model(ids, state=tmp)
            st = DecodeState.allocate(model, 4, 32)
            for r in range(4):
                st.load(r, tmp, r)
            states[key] = st
        tok, errs = ids[:, -1], {"plain": [], "fused": []}
        for _ in range(8):
            want = ref.step(tok, states["ref"])
            with fused_decode("off"):
                errs["plain"].append(_rel(low.step(tok, states["plain"]), want))
            with fused_decode("on"):
                errs["fused"].append(_rel(low.step(tok, states["fused"]), want))
            tok = want.argmax(-1)
    # FP8 above one row also rounds the activations to e4m3 (W8A8): allowed twice the plain error
    assert max(errs["fused"]) <= (2.0 if fp8 else 1.25) * max(errs["plain"]) + 1e-3, errs


def test_gemv_refuses_bad_fused_arguments():
    """A norm of the wrong length or an unknown act: a short error naming the argument."""
    x = torch.randn(1, 96, device=DEV)
    w = torch.randn(40, 96, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match="norm must be"):
        gemv(x, w, norm=torch.ones(95, device=DEV))
    with pytest.raises(ValueError, match="act must be"):
        gemv(x, w, act="gelu")


@pytest.mark.parametrize("mm_rows", [0, 4])
def test_rows_take_the_skinny_product_up_to_mm_rows(mm_rows, monkeypatch, row_kernel_calls):
    """Above one row, 16-bit weights multiply through the skinny product (relu^2 / residual in its epilogue) up to
    ``MM_ROWS`` rows, else through the layer itself; either way within bf16 rounding of the plain composition."""
    monkeypatch.setattr(decode_ops, "MM_ROWS", mm_rows)
    torch.manual_seed(1)
    norm = RMSNorm(64).to(DEV, torch.bfloat16)
    up = nn.Linear(64, 96, bias=False).to(DEV, torch.bfloat16)
    down = nn.Linear(96, 64, bias=False).to(DEV, torch.bfloat16)
    x = torch.randn(3, 1, 64, device=DEV, dtype=torch.bfloat16)
    with torch.inference_mode():
        with fused_decode("off"):
            h0 = norm_linear(x, norm, up, act="relu2")
            y0 = linear_residual(h0, down, x)
        with fused_decode("on"):
            h1 = norm_linear(x, norm, up, act="relu2")
            y1 = linear_residual(h1, down, x)
    assert row_kernel_calls.count("skinny_mm") == (2 if mm_rows >= 3 else 0)
    assert h1.shape == h0.shape and y1.dtype == y0.dtype == torch.bfloat16
    assert _rel(h1, h0) < 3e-2 and _rel(y1, y0) < 3e-2


@pytest.mark.parametrize("pads", ["none", "after", "anywhere"])
def test_fused_mamba_prefill_is_as_accurate_as_the_plain_one(pads, monkeypatch):
    _fused_prefill_check(pads, monkeypatch, d=64, heads=4, t=11)


@pytest.mark.gpu
@pytest.mark.parametrize("pads", ["none", "after", "anywhere"])
def test_gpu_fused_mamba_prefill(pads, monkeypatch):
    """The same on the GPU at a larger mixer (12B-like head and group sizes) and a longer chunk."""
    _fused_prefill_check(pads, monkeypatch, d=512, heads=16, t=300, head_dim=80, d_state=128, groups=2)


def _fused_prefill_check(pads, monkeypatch, d, heads, t, head_dim=16, d_state=16, groups=2):
    """A bf16 Mamba2 mixer's prefill with the kernels on (the conv as one Triton kernel over the token-major
    chunk, the gate inside the scan, the group-norm kernel before out_proj) against its fp32 twin, next to
    the plain bf16 prefill: no further from fp32 on the real tokens, the conv windows equal (the same bf16
    inputs kept), the SSD states as close as the Triton scan's without the other kernels (the interpreter's
    scan rounds a bf16 state differently from the chunked one); pads none, after each row's tokens, or
    anywhere."""
    from holotron import kernels
    from holotron.kernels import conv_seq_triton
    from holotron.mamba2 import Mamba2Mixer
    from holotron.state import Positions

    monkeypatch.setattr("holotron.mamba2.FUSED_PREFILL", True)   # HOLOTRON_FUSED_PREFILL=1
    calls = []
    real = conv_seq_triton.conv_seq_triton
    monkeypatch.setattr(conv_seq_triton, "conv_seq_triton", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(5)
    m32 = Mamba2Mixer(d, n_heads=heads, head_dim=head_dim, d_state=d_state, n_groups=groups, chunk_size=8).to(DEV)
    with torch.no_grad():
        for p in m32.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(DEV) * (0.3 if p.dim() > 1 else 0.5))
        m32.A_log.copy_(torch.rand(heads, generator=g).to(DEV))
        m32.norm.weight.add_(1.0)
    m16 = copy.deepcopy(m32).to(torch.bfloat16)
    for name in ("A_log", "D", "dt_bias"):
        getattr(m16, name).data = getattr(m32, name).data.clone()
    b = 3
    u = torch.randn(b, t, d, generator=g).to(DEV)
    mask = None
    if pads == "after":
        mask = torch.arange(t)[None, :] < torch.tensor([t, t * 2 // 3, 3])[:, None]
    elif pads == "anywhere":
        mask = torch.arange(t)[None, :] >= torch.tensor([0, t // 3, t - 3])[:, None]
    where = None if mask is None else Positions(mask=mask.to(DEV), pads_after=pads == "after")
    start = m32.new_state(b)
    start.conv.copy_(torch.randn(start.conv.shape, generator=g).to(DEV))
    start.ssm.copy_(torch.randn(start.ssm.shape, generator=g).to(DEV))
    states = {}
    # Triton's interpreter casts fp32 to bf16 by truncation, not to nearest (a GPU rounds to nearest): on the
    # CPU the Triton conv's outputs are then further from exact than the PyTorch twin's (measured:
    # holotron/kernels/README.md, "Numerics"), so there the plain Triton path takes the Triton conv too, and the
    # states compare the scan's part alone; on a GPU the plain path keeps the PyTorch conv.
    conv = Mamba2Mixer._conv
    with torch.inference_mode():
        for key, mod, mode, backend in (("ref", m32, "off", "chunked"), ("plain", m16, "off", "chunked"),
                                        ("plain_triton", m16, "off", "triton"), ("fused", m16, "on", "triton")):
            st = mod.new_state(b)
            st.conv.copy_(start.conv)
            st.ssm.copy_(start.ssm)
            if key == "plain_triton" and DEV == "cpu":
                monkeypatch.setattr(Mamba2Mixer, "_conv", lambda self, x, st, m, after, fused, rows=None:
                                    conv(self, x, st, m, after, True, rows))
            with fused_decode(mode), kernels.use_backend(backend):
                states[key] = (mod(u.to(mod.in_proj.weight.dtype), st, where), st)
            monkeypatch.setattr(Mamba2Mixer, "_conv", conv)
    assert calls, "the Triton conv did not run"
    keep = torch.ones(b, t, dtype=torch.bool) if mask is None else mask
    want = states["ref"][0][keep.to(DEV)]
    err = {k: _rel(states[k][0][keep.to(DEV)], want) for k in ("plain", "fused")}
    assert states["fused"][0].dtype == torch.bfloat16
    assert err["fused"] <= 1.25 * err["plain"] + 1e-3 and err["fused"] < 0.05, err
    assert torch.equal(states["fused"][1].conv, states["plain"][1].conv)
    ssm_err = {k: _rel(states[k][1].ssm, states["ref"][1].ssm) for k in ("plain", "plain_triton", "fused")}
    assert ssm_err["fused"] <= 1.25 * ssm_err["plain_triton"] + 1e-3 and ssm_err["fused"] < 0.05, ssm_err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_relu2_kernel_is_torchs_bits(dtype):
    """One pass of relu(x)^2 gives the same bits as torch's relu then square, at sizes that end mid-block. Triton's
    CPU interpreter truncates fp32 -> bf16 (the GPU rounds to nearest), so there bf16 may be one step low."""
    from holotron.kernels.rows_triton import relu2

    exact = DEV == "cuda" or dtype != torch.bfloat16

    g = torch.Generator().manual_seed(5)
    for shape in ((0, 8), (1,), (4097,), (3, 5, 700)):
        x = (torch.randn(shape, generator=g) * 30).to(DEV, dtype)
        got = relu2(x)
        assert got.shape == x.shape and got.dtype == dtype
        want = torch.relu(x).square()
        if exact:
            assert torch.equal(got, want)
        else:
            low = torch.nextafter(want, torch.zeros_like(want))
            assert ((got == want) | (got == low)).all() and (got <= want).all()


def test_mlp_uses_the_relu2_kernel_only_without_autograd(monkeypatch):
    """The MLP's forward takes the one-pass relu^2 under no_grad (same output bits as the plain path); with
    autograd recording, torch's ops, so the backward exists."""
    from holotron.kernels import rows_triton
    from holotron.layers import MLP

    calls = []
    real = rows_triton.relu2
    monkeypatch.setattr(rows_triton, "relu2", lambda x: calls.append(x.shape) or real(x))
    mlp = MLP(48, 80).to(DEV, torch.bfloat16)
    x = torch.randn(2, 7, 48, generator=torch.Generator().manual_seed(1)).to(DEV, torch.bfloat16)
    with torch.no_grad():
        with fused_decode("off"):
            want = mlp(x)
        assert not calls
        with fused_decode("on"):
            got = mlp(x)
    assert calls == [(2, 7, 80)]
    if DEV == "cuda":
        assert torch.equal(got, want)
    else:  # the interpreter's bf16 rounding (above): the activations may be one step low
        assert _rel(got, want) < 2e-2
    monkeypatch.setattr(decode_ops, "RELU2", False)
    with torch.no_grad(), fused_decode("on"):
        mlp(x)
    assert len(calls) == 1
    monkeypatch.setattr(decode_ops, "RELU2", True)
    with fused_decode("on"):
        y = mlp(x.requires_grad_())
    y.float().sum().backward()
    assert len(calls) == 1 and x.grad is not None and mlp.up_proj.weight.grad is not None
