"""FP8 weights and the GEMV kernel (holotron/quant.py, holotron/kernels/gemv_triton.py).

The kernel runs in Triton's CPU interpreter here (tests/conftest.py sets TRITON_INTERPRET=1 without a GPU),
on small awkward shapes (K = 80, N = 60: no dimension a multiple of a block), against the same product in
float64; its output buffers are NaN-filled, so an element it should write and does not shows up.
"""

from __future__ import annotations

import pytest
import torch
from tiny_lm import scan_backend_of_the_device, tiny_lm, write_checkpoint  # noqa: F401 - fixture
from torch import nn

import holotron
from holotron import quant
from holotron.quant import FP8Linear, gemv, gemv_ref, quantize_, quantize_weight

triton = pytest.importorskip("triton")
from holotron.kernels import gemv_triton  # noqa: E402 - after the importorskip

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def nan_buffers(monkeypatch):
    def nan_empty(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(gemv_triton, "_empty", nan_empty)


def _case(m, n, k, xdtype, wdtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(xdtype)
    w = torch.randn(n, k, generator=g)
    scale = None
    if wdtype == torch.float8_e4m3fn:
        w, scale = quantize_weight(w)
        scale = scale.to(DEV)
    else:
        w = w.to(wdtype)
    res = torch.randn(m, n, generator=g).to(xdtype)
    return x.to(DEV), w.to(DEV), scale, res.to(DEV)


def _want(x, w, scale, res):
    y = x.double() @ w.double().T
    if scale is not None:
        y = y * scale.double()
    return y if res is None else y + res.double()


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_res", [False, True])
def test_gemv_matches_float64(m, wdtype, xdtype, with_res):
    x, w, scale, res = _case(m, 60, 80, xdtype, wdtype)
    res = res if with_res else None
    y = gemv(x, w, scale, res, backend="triton")
    assert y.dtype == xdtype and y.shape == (m, 60)
    want = _want(x, w, scale, res)
    err = ((y.double() - want).abs().max() / want.abs().max()).item()
    assert err < TOL[xdtype], err


@pytest.mark.parametrize("split,block_n,block_k", [(2, 16, 32), (3, 32, 16), (8, 16, 16)])
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_split_k(split, block_n, block_k, m):
    """Split K (partials in fp32, a second launch adds them): every slice counted once, none twice."""
    x, w, scale, res = _case(m, 60, 80, torch.float32, torch.float8_e4m3fn, seed=1)
    cfg = dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4)
    y = gemv(x, w, scale, res, backend="triton", config=cfg)
    torch.testing.assert_close(y.double(), _want(x, w, scale, res), rtol=2e-5, atol=2e-5)


def test_gemv_out_dtype_and_leading_dims():
    x, w, scale, res = _case(3, 60, 80, torch.bfloat16, torch.float8_e4m3fn, seed=2)
    res32 = res.float().view(3, 1, 60)
    y = gemv(x.view(3, 1, 80), w, scale, res32, out_dtype=torch.float32, backend="triton")
    assert y.shape == (3, 1, 60) and y.dtype == torch.float32
    torch.testing.assert_close(y.view(3, 60).double(), _want(x, w, scale, res32.view(3, 60)), rtol=1e-5, atol=1e-5)


def test_gemv_ref_is_the_same_product():
    x, w, scale, res = _case(3, 60, 80, torch.float32, torch.float8_e4m3fn, seed=3)
    torch.testing.assert_close(gemv_ref(x, w, scale, res).double(), _want(x, w, scale, res), rtol=1e-5, atol=1e-5)
    assert gemv(x, w, scale, res, backend="ref").dtype == torch.float32


def test_gemv_refuses_bad_arguments():
    x, w, scale, _ = _case(2, 60, 80, torch.float32, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale"):
        gemv(x, w)
    with pytest.raises(ValueError, match="weight must be"):
        gemv(x[:, :40], w, scale)
    with pytest.raises(ValueError, match="residual"):
        gemv(x, w, scale, torch.zeros(2, 59, device=DEV))
    with pytest.raises(ValueError, match="cannot run"):
        gemv(torch.zeros(17, 80, device=DEV), w, scale, backend="triton")


def test_quantize_weight_per_channel():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(60, 80, generator=g) * torch.logspace(-3, 2, 60)[:, None]
    w[5] = 0.0
    q, s = quantize_weight(w, rows=7)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (60,)
    assert s[5] == 1.0 and (q[5].float() == 0).all()
    assert torch.allclose(q.float().abs().amax(1)[torch.arange(60) != 5], torch.tensor(448.0))
    deq = q.float() * s[:, None]
    rel = ((deq - w).norm(dim=1) / w.norm(dim=1).clamp_min(1e-30))[torch.arange(60) != 5]
    assert rel.max() < 0.04  # e4m3: 3 mantissa bits, relative rounding <= 1/16, RMS about 2-3 %


def test_fp8_linear_is_a_drop_in():
    torch.manual_seed(0)
    lin = nn.Linear(80, 60, bias=True)
    f = FP8Linear.from_linear(lin)
    assert f.weight.shape == (60, 80) and f.weight.dtype == torch.float32 and f.weight.device == lin.weight.device
    x = torch.randn(2, 5, 80)
    want = x.double() @ f.dequantize(torch.float64).T + lin.bias.double()
    torch.testing.assert_close(f(x).double(), want, rtol=1e-5, atol=1e-5)
    assert (f(x) - lin(x)).abs().max() < 0.05 * lin(x).abs().max()
    f.to(torch.bfloat16)
    assert f.weight.dtype == torch.bfloat16 and f.weight_fp8.dtype == torch.float8_e4m3fn
    assert f.weight_scale.dtype == torch.float32 and f(x.bfloat16()).dtype == torch.bfloat16
    assert set(f.state_dict()) == {"weight_fp8", "weight_scale", "bias"}


def _linears(model):
    return {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, (nn.Linear, FP8Linear))}


def test_quantize_swaps_the_lm_linears_only():
    model = tiny_lm()
    before = {n: p.clone() for n, p in model.named_parameters()}
    quantize_(model, "fp8")
    kinds = _linears(model)
    assert kinds.pop("lm_head") == "Linear"
    assert kinds and set(kinds.values()) == {"FP8Linear"}
    assert {n.rsplit(".", 1)[-1] for n in kinds} == {"in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                                                     "up_proj", "down_proj"}
    for n, p in model.named_parameters():  # embedding, norms, A_log / D / dt_bias, conv1d: untouched
        assert torch.equal(p, before[n]), n
    assert "FP8Linear" == type(quantize_(tiny_lm(), "fp8", lm_head=True).lm_head).__name__
    with pytest.raises(ValueError, match="quantize must be"):
        quantize_(model, "int4")


def test_quantized_lm_runs_prefill_and_decode(scan_backend_of_the_device):  # noqa: F811
    model = tiny_lm()
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    ref = model(ids)
    quantize_(model, "fp8", lm_head=True)
    out = model(ids)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.1, rel
    state = model.new_state(2)
    assert state.layers[1].k.dtype == torch.float32  # KV cache in the compute dtype, not float8
    model(ids[:, :8], state=state)
    torch.testing.assert_close(model(ids[:, 8:], state=state)[:, -1], out[:, -1], rtol=1e-4, atol=1e-4)


def test_quantized_model_through_the_engine_equals_the_plain_loop(scan_backend_of_the_device):  # noqa: F811
    """The decode step calls the Linear modules, so FP8Linear plugs into the engine's step unchanged: the
    engine (its HybridLM.step) and the plain loop give the same greedy tokens on the quantised model."""
    from holotron.generate import generate

    model = quantize_(tiny_lm(seed=3), "fp8", lm_head=True)
    ids = torch.randint(3, 96, (3, 7), generator=torch.Generator().manual_seed(4))
    plain = generate(model, ids, 10, eos_token_id=[], engine=False)
    fast = generate(model, ids, 10, eos_token_id=[], engine=True)
    assert torch.equal(fast, plain)


def test_load_quantize(tmp_path):
    src = write_checkpoint(tiny_lm(), tmp_path / "ckpt", max_shard_size=4000)
    plain = holotron.load(src)
    model = holotron.load(src, quantize="fp8")
    ref = quantize_(plain, "fp8")
    kinds = _linears(model)
    assert kinds == _linears(ref) and list(kinds.values()).count("FP8Linear") == len(kinds) - 1
    sd, sd_ref = model.state_dict(), ref.state_dict()
    assert sd.keys() == sd_ref.keys() and all(torch.equal(sd[n].float(), sd_ref[n].float()) for n in sd)
    with pytest.raises(holotron.weights.CheckpointError, match="quantize must be None or 'fp8', got 'int8'"):
        holotron.load(src, quantize="int8")
    with pytest.raises(holotron.weights.CheckpointError, match="float8 weights"):
        holotron.save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(5120, 5120), (1024, 5120), (5120, 20480), (22656, 5120)])
@pytest.mark.parametrize("m", [1, 8, 16])
def test_gemv_real_shapes(n, k, m):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) / k ** 0.5
    res = torch.randn(m, n, device="cuda", generator=g, dtype=torch.float32)
    q, s = quant.quantize_weight(w)
    for wt, sc in ((w, None), (q, s)):
        want = _want(x, wt.float(), sc, res)
        y = gemv(x, wt, sc, res, out_dtype=torch.float32)
        assert ((y.double() - want).abs().max() / want.abs().max()).item() < 1e-5


def test_fp8_matmul_quantises_rows_and_scales_back():
    """W8A8 above 16 rows: x rounded per row to e4m3 (relative error at most 1/16 per element), both scales
    applied; the result is within e4m3 rounding of the exact product, and exact when x is already e4m3 on
    the row's scale."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(32, 64, generator=g) * torch.logspace(-2, 2, 32)[:, None]).to(torch.bfloat16)
    q, s = quant.quantize_weight(torch.randn(48, 64, generator=g))
    try:
        y = quant.fp8_matmul(x, q, s)
    except (RuntimeError, NotImplementedError) as e:  # a torch without CPU _scaled_mm
        pytest.skip(f"torch._scaled_mm unavailable here: {e}")
    exact = x.double() @ (q.double() * s.double()[:, None]).T
    rel = ((y.double() - exact).norm(dim=1) / exact.norm(dim=1))
    assert y.shape == (32, 48) and y.dtype == torch.bfloat16 and rel.max() < 0.06, rel.max()
    # rows already on the e4m3 grid of their own scale come back exactly (up to the bf16 output)
    xs = x.float().abs().amax(1, keepdim=True) / quant.FP8_MAX
    on_grid = ((x.float() / xs).to(torch.float8_e4m3fn).float() * xs).to(torch.bfloat16)
    xs2 = on_grid.float().abs().amax(1, keepdim=True) / quant.FP8_MAX
    if torch.equal((on_grid.float() / xs2).to(torch.float8_e4m3fn).float() * xs2, on_grid.float()):
        y2 = quant.fp8_matmul(on_grid, q, s)
        ex2 = on_grid.double() @ (q.double() * s.double()[:, None]).T
        assert ((y2.double() - ex2).abs() / ex2.abs().max()).max() < 1e-2


@pytest.mark.gpu
def test_gpu_fp8_linear_above_16_rows_uses_the_tensor_cores(monkeypatch):
    lin = torch.nn.Linear(256, 512, bias=False).cuda().to(torch.bfloat16)
    f8 = quant.FP8Linear.from_linear(lin)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    calls = []
    real = quant.fp8_matmul
    monkeypatch.setattr(quant, "fp8_matmul", lambda *a: calls.append(1) or real(*a))
    y = f8(x)
    assert calls and y.dtype == torch.bfloat16
    exact = x.double() @ f8.dequantize(torch.float64).T
    assert ((y.double() - exact).norm() / exact.norm()).item() < 0.06


def test_env_rows_reads_and_reports(monkeypatch):
    """The row limits' environment variables: a number is taken, a bad value is named in a warning and the
    default kept."""
    monkeypatch.setenv("HOLOTRON_TEST_ROWS", "96")
    assert quant.env_rows("HOLOTRON_TEST_ROWS", 64) == 96
    monkeypatch.delenv("HOLOTRON_TEST_ROWS")
    assert quant.env_rows("HOLOTRON_TEST_ROWS", 64) == 64
    monkeypatch.setenv("HOLOTRON_TEST_ROWS", "lots")
    with pytest.warns(UserWarning, match="HOLOTRON_TEST_ROWS='lots' is not a non-negative integer"):
        assert quant.env_rows("HOLOTRON_TEST_ROWS", 64) == 64
