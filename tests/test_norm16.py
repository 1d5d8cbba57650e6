"""``HOLOTRON_NORM16`` (holotron/layers.py): an RMSNorm of a 16-bit tensor as the decode step's Triton row kernel
(holotron/kernels/rows_triton.py) where holotron/decode_ops.py's kernels run, against the default fp32 path."""

import pytest
import torch

from holotron import layers
from holotron.decode_ops import fused_decode
from holotron.kernels import rows_triton
from holotron.layers import RMSNorm


def _norm(dim: int, dtype: torch.dtype, device: str) -> RMSNorm:
    nm = RMSNorm(dim).to(device)
    with torch.no_grad():
        nm.weight.copy_(1 + 0.1 * torch.randn(dim, generator=torch.Generator().manual_seed(1)))
    return nm.to(dtype)


@pytest.fixture
def row_calls(monkeypatch):
    calls = []
    real = rows_triton.row_norm_quant
    monkeypatch.setattr(rows_triton, "row_norm_quant", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    return calls


def test_norm16_runs_the_row_kernel_only_where_the_kernels_run(monkeypatch, row_calls):
    """Switch off, kernels off, autograd recording, an empty batch: the fp32 path, bit for bit. Switch and kernels
    on (Triton's CPU interpreter here): the row kernel, within the interpreter's rounding (it truncates fp32 ->
    bf16 where the GPU rounds to nearest, tests/test_decode_ops.py) of the fp32 path."""
    x = (3 * torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))).bfloat16()
    nm = _norm(64, torch.bfloat16, "cpu")
    monkeypatch.setattr(layers, "NORM16", False)
    with torch.inference_mode(), fused_decode("on"):
        ref = nm(x)
    want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + nm.eps) * nm.weight.float()).bfloat16()
    assert (ref.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    monkeypatch.setattr(layers, "NORM16", True)
    with torch.inference_mode(), fused_decode("off"):
        assert torch.equal(nm(x), ref)
    with fused_decode("on"):
        assert torch.equal(nm(x.clone().requires_grad_()).detach(), ref)   # autograd: the fp32 path
        with torch.inference_mode():
            assert nm(x[:0]).shape == (0, 7, 64)
        assert not row_calls
        with torch.inference_mode():
            got = nm(x)
    assert row_calls == [(14, 64)] and got.shape == x.shape and got.dtype == torch.bfloat16
    assert ((got.float() - ref.float()).abs() <= 2 ** -7 * ref.float().abs()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm16_on_cuda_is_the_fp32_path_within_one_rounding(monkeypatch, dtype, row_calls):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = (3 * torch.randn(740, 5120, device="cuda", generator=torch.Generator("cuda").manual_seed(0))).to(dtype)
    nm = _norm(5120, dtype, "cuda")
    monkeypatch.setattr(layers, "NORM16", False)
    with torch.inference_mode():
        ref = nm(x)
    monkeypatch.setattr(layers, "NORM16", True)
    with torch.inference_mode():
        got = nm(x)
    assert row_calls == [(740, 5120)]
    ulp = torch.finfo(dtype).eps * ref.float().abs().clamp(min=torch.finfo(dtype).tiny)
    assert got.dtype == dtype and bool(((got.float() - ref.float()).abs() <= ulp).all())
    assert (got == ref).float().mean() > 0.99
    x.requires_grad_(True)   # autograd recording: the fp32 path
    assert torch.equal(nm(x).detach(), ref)
