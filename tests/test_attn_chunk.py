"""The chunk attention kernel (holotron/kernels/attn_chunk_triton.py): a chunk of new tokens per row against
that row's cache, positions on the device; against the same attention done row by row with SDPA, on
Triton's CPU interpreter here and on the GPU under ``-m gpu``."""

from __future__ import annotations

import pytest
import torch

from holotron.kernels import available_backends
from holotron.kernels.attn_chunk_triton import chunk_attention_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif("triton" not in available_backends(DEV), reason="triton not installed")


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_chunk_attention_kernel_equals_row_by_row_sdpa(dtype):
    """Rows not in order of the cache, a row starting at slot 0 (no history), a row of one new token, a row
    whose pads fill a whole block of queries, GQA (2 query heads per KV head), a head size padded to 32,
    the cache a strided view (rows of a larger state); keys past each row's last slot are never read. (bf16 on
    the GPU only: this machine's Triton interpreter returns garbage from bf16 ``tl.dot``, also in a bare
    16 x 16 product.)"""
    from holotron.kernels.attn_chunk_triton import chunk_attention_triton

    g = torch.Generator().manual_seed(3)
    b, t, hq, hkv, hd, L = 4, 70, 4, 2, 24, 200
    q = torch.randn(b, t, hq, hd, generator=g).to(DEV, dtype)
    k = torch.randn(7, hkv, L, hd, generator=g).to(DEV, dtype)[1:]
    v = torch.randn(7, hkv, L, hd, generator=g).to(DEV, dtype)[1:]
    rows = torch.tensor([5, 0, 3, 2], device=DEV)
    starts = torch.tensor([40, 0, 129, 7], device=DEV)
    counts = torch.tensor([70, 33, 1, 5], device=DEV)
    want = chunk_attention_reference(q.float(), k.float(), v.float(), rows, starts, counts)
    got = chunk_attention_triton(q, k, v, rows, starts, counts)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert torch.equal(got[1, 33:], torch.zeros_like(got[1, 33:]))  # pads give zeros
    k2, v2 = k.clone(), v.clone()
    for r, s0, n in zip(rows.tolist(), starts.tolist(), counts.tolist()):
        k2[r, :, s0 + n:] = float("nan")
        v2[r, :, s0 + n:] = float("nan")
    torch.testing.assert_close(chunk_attention_triton(q, k2, v2, rows, starts, counts), got, rtol=0, atol=0)
