"""The skinny matrix product of decode batches (holotron/kernels/skinny_mm_triton.py): bf16 / fp16 and FP8 x FP8,
split K or not, tensor descriptors or pointers, the relu^2 / residual epilogue, against float64; bad arguments;
on Triton's CPU interpreter here and at the 12B's shapes on the GPU (``-m gpu``)."""

from __future__ import annotations

import pytest
import torch

from holotron import quant
from holotron.kernels.skinny_mm_triton import pick, skinny_mm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


def _operands(m: int, n: int, k: int, kind, device: str, seed: int):
    """(x, w, xs, ws, the float64 product of the decoded operands); kind a 16-bit dtype or FP8 (x quantised per
    row, w per channel)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device=device, generator=g) / k ** 0.5
    if kind == FP8:
        q, s = quant.quantize_weight(w)
        xq, xs = quant.quantize_rows(x)
        return xq, q, xs, s, (xq.double() * xs.double()) @ (q.double() * s.double()[:, None]).T
    x, w = x.to(kind), w.to(kind)
    return x, w, None, None, x.double() @ w.double().T


def _rel_max(y, exact):
    return ((y.double() - exact).abs().max() / exact.abs().max()).item()


CONFIGS = [None, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, STAGES=1, SPLIT=3),
           dict(BLOCK_N=64, BLOCK_K=64, SPLIT=2, TMA=False)]


@pytest.mark.parametrize("kind", [torch.bfloat16, torch.float16, FP8])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["picked", "split3", "pointers-split2"])
@pytest.mark.parametrize("m,n,k", [(40, 96, 256), (3, 130, 200)])
def test_product_matches_float64(kind, cfg, m, n, k):
    """Rows / columns / K not multiples of the tiles (K = 200: a partial last tile; FP8 rows of 200 bytes are
    not 16-byte multiples: pointers instead of descriptors), split K or not."""
    x, w, xs, ws, exact = _operands(m, n, k, kind, "cpu", 7)
    on = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    y = skinny_mm(on(x), on(w), on(xs), on(ws), out_dtype=torch.float32, config=cfg)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert _rel_max(y.cpu(), exact) < 1e-6


@pytest.mark.parametrize("kind", [torch.bfloat16, FP8])
@pytest.mark.parametrize("split", [1, 2])
def test_epilogue_relu2_and_residual(kind, split):
    """act(x @ w^T * scales) + residual, in fp32, rounded once to the output dtype."""
    x, w, xs, ws, exact = _operands(24, 80, 128, kind, "cpu", 3)
    res = torch.randn(24, 80, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    on = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    cfg = dict(BLOCK_K=32, SPLIT=split)
    y = skinny_mm(on(x), on(w), on(xs), on(ws), residual=on(res), act="relu2", out_dtype=torch.float32, config=cfg)
    want = exact.clamp_min(0) ** 2 + res.double()
    assert _rel_max(y.cpu(), want) < 1e-6
    yb = skinny_mm(on(x), on(w), on(xs), on(ws), residual=on(res), config=cfg)  # default dtype: bf16
    assert yb.dtype == torch.bfloat16 and _rel_max(yb.cpu(), exact + res.double()) < 1e-2


def test_bad_arguments_name_the_culprit():
    x = torch.randn(4, 32, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(8, 32, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="share a dtype"):
        skinny_mm(x, w.half())
    with pytest.raises(ValueError, match="share a dtype"):
        skinny_mm(x, w[:, :16])
    with pytest.raises(ValueError, match="scales"):
        skinny_mm(x, w, ws=torch.ones(8, device=DEV))
    with pytest.raises(ValueError, match="act must be"):
        skinny_mm(x, w, act="gelu")
    with pytest.raises(ValueError, match=r"residual must be \(4, 8\)"):
        skinny_mm(x, w, residual=torch.zeros(4, 9, device=DEV))
    with pytest.raises(ValueError, match="unknown launch settings"):
        skinny_mm(x, w, config=dict(BLOCK=4))
    with pytest.raises(ValueError, match="ACC_K must be a positive"):
        skinny_mm(x, w, config=dict(ACC_K=0))
    with pytest.raises(ValueError, match="no columns"):
        skinny_mm(x[:, :0], w[:, :0])
    assert skinny_mm(x[:0], w).shape == (0, 8) and skinny_mm(x, w[:0]).shape == (4, 0)


def test_pick_splits_k_only_when_the_strips_are_too_few():
    """Many strips (the vocabulary): one slice; few strips with a long K (the 12B's down projection): split."""
    dev = torch.device("cpu")
    assert pick(128, 131072, 5120, torch.bfloat16, dev)["SPLIT"] == 1
    down = pick(128, 5120, 20480, FP8, dev)
    assert down["SPLIT"] > 1 and (5120 // down["BLOCK_N"]) * down["SPLIT"] <= 2 * 132
    assert pick(3, 64, 64, torch.bfloat16, dev, dict(SPLIT=5))["SPLIT"] == 5
    # FP8's accumulator: promoted every 32 products up to 64 rows, every K block above (never: not offered)
    assert pick(64, 5120, 5120, FP8, dev)["ACC_K"] == 32
    wide = pick(128, 5120, 5120, FP8, dev)
    assert wide["ACC_K"] == wide["BLOCK_K"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [torch.bfloat16, FP8])
@pytest.mark.parametrize("n,k", [(22656, 5120), (5120, 10240), (5120, 20480), (1024, 5120)])
@pytest.mark.parametrize("m", [8, 128, 200])
def test_gpu_real_shapes(kind, n, k, m):
    """At the 12B's shapes: FP8 no further from float64 than torch._scaled_mm (Hopper's FP8 accumulator promoted
    to fp32 often enough) and within 1e-3; 16-bit within 1e-4 (fp32 accumulation over up to 20,480 products; a
    bf16 output alone would round by 4e-3)."""
    x, w, xs, ws, exact = _operands(m, n, k, kind, "cuda", 0)
    err = _rel_max(skinny_mm(x, w, xs, ws, out_dtype=torch.float32), exact)
    if kind == FP8:
        peer = torch._scaled_mm(x, w.t(), scale_a=xs, scale_b=ws[None, :], out_dtype=torch.float32)
        err_peer = _rel_max(peer, exact)
        assert err < 1e-3 and err <= 2 * err_peer + 1e-5, (err, err_peer)
    else:
        assert err < 1e-4, err
