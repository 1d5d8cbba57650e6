"""Numerical comparison helpers shared by the tests."""

from __future__ import annotations

import torch

# (relative RMS tolerance, absolute floor) per compared dtype
TOL = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-6),
    torch.float16: (5e-3, 1e-3),
    torch.bfloat16: (2e-2, 5e-3),
}


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double(), expected.double()
    return float(((a - e).pow(2).mean().sqrt()) / (e.pow(2).mean().sqrt() + 1e-30))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype=None, rtol=None, atol=None, name="output"):
    """Relative RMS error within ``rtol`` or absolute RMS within ``atol``; NaN or Inf never passes."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    dtype = dtype or actual.dtype
    r0, a0 = TOL.get(dtype, TOL[torch.float32])
    rtol = r0 if rtol is None else rtol
    atol = a0 if atol is None else atol
    assert torch.isfinite(actual).all(), (f"{name}: non-finite values "
                                          f"({(~torch.isfinite(actual)).sum().item()} of {actual.numel()})")
    a, e = actual.double(), expected.double()
    err = float((a - e).pow(2).mean().sqrt())
    ref = float(e.pow(2).mean().sqrt())
    assert err <= rtol * ref or err <= atol, (
        f"{name}: RMS error {err:.3e} vs reference RMS {ref:.3e} (relative {err / (ref + 1e-30):.3e}, "
        f"allowed relative {rtol:.1e} or absolute {atol:.1e}); max abs error {float((a - e).abs().max()):.3e}"
    )


class spy_chunks:
    """``with spy_chunks(eng) as chunks:`` records each prefill chunk the engine runs, through
    ``HybridLM.extend`` or a mixed pass (``HybridLM.mixed``), as ((b, T), real tokens, decode rows)."""

    def __init__(self, eng):
        self.lm, self.chunks = eng.lm, []

    def __enter__(self):
        ext, mix = self.lm.extend, self.lm.mixed

        def extend(x, st, rows, starts, counts, **kw):
            self.chunks.append((tuple(x.shape[:2]), sum(counts), 0))
            return ext(x, st, rows, starts, counts, **kw)

        def mixed(tokens, st, active, x, rows, starts, counts):
            self.chunks.append((tuple(x.shape[:2]), int(counts.sum()), tokens.shape[0]))
            return mix(tokens, st, active, x, rows, starts, counts)

        self.lm.extend, self.lm.mixed = extend, mixed
        return self.chunks

    def __exit__(self, *exc):
        del self.lm.extend, self.lm.mixed
