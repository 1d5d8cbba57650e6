"""The training path's causal depthwise conv as K shifted multiply-adds (``CONV_CONFIG["shift"]``,
holotron/kernels/conv_naive.py) equals the F.conv1d form: values and gradients, with pads, and through a Mamba2
layer's forward and backward."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close

from holotron.kernels import conv_naive, conv_seq


def _inputs(b=3, t=11, c=6, K=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, c, generator=g).to(dtype).requires_grad_()
    w = torch.randn(c, K, generator=g).requires_grad_()
    bias = torch.randn(c, generator=g).requires_grad_()
    return x, w, bias


def _run(shift, monkeypatch, x, w, bias, counts=None):
    monkeypatch.setitem(conv_naive.CONV_CONFIG, "shift", shift)
    out = conv_seq(x, None, w, bias, counts)
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    grads = torch.autograd.grad(out, (x, w, bias), gy)
    return out, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("counts", [None, [11, 3, 0]], ids=["full", "pads"])
@pytest.mark.parametrize("K", [4, 1, 2])
def test_shift_equals_conv1d(monkeypatch, dtype, counts, K):
    x, w, bias = _inputs(K=K, dtype=dtype)
    cnt = None if counts is None else torch.tensor(counts)
    ref, gref = _run(False, monkeypatch, x, w, bias, cnt)
    out, g = _run(True, monkeypatch, x, w, bias, cnt)
    assert out.dtype == ref.dtype == dtype
    rt, at = (1e-5, 1e-6) if dtype == torch.float32 else (2e-2, 1e-2)
    assert_close(out, ref, rtol=rt, atol=at, name="y")
    for name, a, r in zip(("dx", "dweight", "dbias"), g, gref):
        assert_close(a, r, rtol=rt, atol=at, name=name)
    if counts is not None:  # a pad is read as zero: a row with no real token is silu(bias) throughout
        assert_close(out[2].float(), torch.nn.functional.silu(bias).detach().expand(11, -1), rtol=rt, atol=at,
                     name="all pads")


def test_shift_is_causal(monkeypatch):
    """Changing token t changes no output before t (and the K - 1 after it do change)."""
    monkeypatch.setitem(conv_naive.CONV_CONFIG, "shift", True)
    x, w, bias = (v.detach() for v in _inputs())
    y0 = conv_seq(x, None, w, bias)
    x2 = x.clone()
    x2[:, 5] += 1.0
    y1 = conv_seq(x2, None, w, bias)
    assert torch.equal(y0[:, :5], y1[:, :5])
    assert not torch.equal(y0[:, 5:9], y1[:, 5:9])


def test_mamba2_layer_forward_backward_with_shift(monkeypatch):
    """A Mamba2 mixer's output and every parameter's gradient are the same either way (the training path)."""
    from holotron.mamba2 import Mamba2Mixer

    torch.manual_seed(0)
    m = Mamba2Mixer(d_model=32, n_heads=4, head_dim=16, d_state=8, n_groups=2, d_conv=4, chunk_size=8)
    u = torch.randn(2, 13, 32)

    def run(shift):
        monkeypatch.setitem(conv_naive.CONV_CONFIG, "shift", shift)
        m.zero_grad()
        out = m(u)
        out.square().mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    ref, gref = run(False)
    out, g = run(True)
    assert_close(out, ref, rtol=1e-5, atol=1e-6, name="y")
    for n in gref:
        assert_close(g[n], gref[n], rtol=1e-4, atol=1e-6, name=n)
