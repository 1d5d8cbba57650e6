"""``HOLOTRON_NORM16`` (holotron/layers.py): an RMSNorm of a 16-bit CUDA tensor as one fused call on the 16-bit
tensors, against the default fp32 path."""

import pytest
import torch

from holotron import layers
from holotron.layers import RMSNorm


def _norm(dim: int, dtype: torch.dtype, device: str) -> RMSNorm:
    nm = RMSNorm(dim).to(device)
    with torch.no_grad():
        nm.weight.copy_(1 + 0.1 * torch.randn(dim, generator=torch.Generator().manual_seed(1)))
    return nm.to(dtype)


def test_norm16_leaves_cpu_tensors_and_autograd_on_the_fp32_path(monkeypatch):
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    nm = _norm(64, torch.bfloat16, "cpu")
    monkeypatch.setattr(layers, "NORM16", False)
    ref = nm(x)
    monkeypatch.setattr(layers, "NORM16", True)
    assert torch.equal(nm(x), ref)   # not CUDA: the fp32 path
    want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + nm.eps) * nm.weight.float()).bfloat16()
    assert (ref.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm16_on_cuda_is_the_fp32_path_within_one_rounding(monkeypatch, dtype):
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
    ulp = torch.finfo(dtype).eps * ref.float().abs().clamp(min=torch.finfo(dtype).tiny)
    assert got.dtype == dtype and bool(((got.float() - ref.float()).abs() <= ulp).all())
    assert (got == ref).float().mean() > 0.99
    x.requires_grad_(True)   # autograd recording: the fp32 path
    assert torch.equal(nm(x).detach(), ref)
