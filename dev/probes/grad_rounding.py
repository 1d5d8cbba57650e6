"""Probe: which rounding makes the Triton backward's dA error larger than mamba_ssm's? (docs/benchmarks.md: at
1 x 4096, relative RMS against float64, ours / mamba_ssm: dA 6.4e-4 / 3.9e-4, every other gradient equal or
smaller.) The backward's formulas (the transcription of tests/test_kernels_grad.py, ``bwd_reference``, written
again here per chunk with heads at once) run in float64 on the 12B layer's sizes, with bf16 rounding put back
where the kernels round: the chunk states the forward stores (``states_dtype`` = x's dtype for bf16 inputs), the
state gradients the backward stores between its launches (the ``dst`` buffer, x's dtype), and the operands of
the matrix products (``OPS`` "half": the operands cast to bf16, fp32 accumulation). Each variant turns one
rounding on or off; the errors are against the same formulas without rounding (= float64 autograd, which the
tests hold them to). Inputs as dev/probes/ssd_tune.py's (bf16 x, B, C, dt; softplus(dt + bias); random dy),
dt processed first (the gradient with respect to it: the ddt column).

    python dev/probes/grad_rounding.py [--l 4096] [--heads 128] [--q 64] [--json OUT]

CPU, float64; about a minute at the full sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# where the kernels round, and how: "b" bf16 (storage, or a product's operand in OPS "half"), "t" tf32 (an fp32
# operand of tl.dot's default precision: 10 mantissa bits), "f" not at all (fp32 storage, "ieee" products)
#   st  the chunk states the forward stores          ds  the state gradients stored between the launches
#   cs  the state operand of the products C S^T       dso the dS operand of B dS^T and (x w) dS^T
#   up  the (dy exp(cs)) operand of the dS chunk terms C^T (dy exp(cs))
#   op  the other products' computed operands (W, dG, x w)
SITES = ("st", "ds", "cs", "dso", "up", "op")
VARIANTS = {  # name: rounding per site
    "exact": "ffffff",
    "kernel now": "bbbbbb",
    "fp32 storage": "ffbbbb",
    "fp32 storage, tf32 state products": "ffttbb",
    "fp32 storage, tf32 state and update products": "fftttb",
    "bf16 storage, tf32 state and update products": "bbtttb",
    "fp32 dS, tf32 dS products": "bfbtbb",
    "fp32 dS, tf32 dS and update products": "bfbttb",
    "only the other products rounded": "fffffb",
}


def bf(t: torch.Tensor, how) -> torch.Tensor:
    """``t`` rounded as the site says: "b" / True bf16, "t" tf32 (round to nearest, 10 mantissa bits), else as is."""
    if how in ("b", True):
        return t.to(torch.bfloat16).to(t.dtype)
    if how == "t":
        i = t.float().view(torch.int32)
        i = (i + 0x1000 + ((i >> 13) & 1) - 1) & ~0x1FFF
        return i.view(torch.float32).to(t.dtype)
    return t


def grads(x, dt, A, B, C, dy, Q, how="ffffff"):
    """dx, ddt (processed dt), dA, dB, dC of y = ssd(x, dt, A, B, C) (one sequence, no D, zero initial state)
    against the upstream dy, float64 math with the rounding ``how`` says per site (SITES)."""
    rs, rd, rc, rdo, ru, ro = how
    l, h, p = x.shape
    g, n = B.shape[-2:]
    k = h // g
    starts = list(range(0, l, Q))
    states, S = [], torch.zeros(h, p, n, dtype=x.dtype)
    for c0 in starts:  # the forward: the state entering each chunk, stored
        c1 = min(c0 + Q, l)
        states.append(bf(S, rs))
        Bc = B[c0:c1].repeat_interleave(k, dim=1)
        cs = (dt[c0:c1] * A).cumsum(0)
        w = dt[c0:c1] * torch.exp(cs[-1] - cs)
        S = torch.exp(cs[-1])[:, None, None] * S + torch.einsum("qh,qhp,qhn->hpn", w, x[c0:c1], Bc)
    dx, ddt, dA = torch.zeros_like(x), torch.zeros_like(dt), torch.zeros_like(A)
    dB, dC = torch.zeros_like(B), torch.zeros_like(C)
    dS = torch.zeros(h, n, p, dtype=x.dtype)      # the gradient of the state leaving the chunk (transposed)
    for ci in reversed(range(len(starts))):
        c0 = starts[ci]
        c1 = min(c0 + Q, l)
        q = c1 - c0
        St = states[ci].transpose(-1, -2)                                   # (h, n, p)
        dSr = bf(dS, rd)                                                    # as stored between the launches
        xc, dyc = x[c0:c1].transpose(0, 1), dy[c0:c1].transpose(0, 1)      # (h, q, p)
        dtc = dt[c0:c1].T
        Bc = B[c0:c1].repeat_interleave(k, dim=1).transpose(0, 1)           # (h, q, n)
        Cc = C[c0:c1].repeat_interleave(k, dim=1).transpose(0, 1)
        cs = (dtc * A[:, None]).cumsum(-1)
        cL = cs[:, -1:]
        causal = torch.ones(q, q, dtype=torch.bool).tril()
        Lm = torch.exp((cs[:, :, None] - cs[:, None, :]).masked_fill(~causal, -math.inf))
        M = (Cc @ Bc.transpose(-1, -2)) * Lm
        Wm = M * dtc[:, None, :]
        w = dtc * torch.exp(cL - cs)
        R = Bc @ bf(dSr, rdo)
        dxc = bf(Wm, ro).transpose(-1, -2) @ dyc + w[..., None] * R
        dWm = (dyc @ xc.transpose(-1, -2)) * causal
        dM = dWm * dtc[:, None, :]
        dG = dM * Lm
        ecs = torch.exp(cs)[..., None]
        dCc = bf(dG, ro) @ Bc + ecs * (dyc @ bf(St, rc).transpose(-1, -2))
        dBc = bf(dG, ro).transpose(-1, -2) @ Cc + bf(xc * w[..., None], ro) @ bf(dSr, rdo).transpose(-1, -2)
        dw = (xc * R).sum(-1)
        E = dM * M
        dcs = E.sum(-1) - E.sum(-2) + (dyc * ecs * (Cc @ bf(St, rc))).sum(-1) - dw * w
        dcs[:, -1] += (dSr * torch.exp(cL)[..., None] * St).sum((-1, -2)) + (dw * w).sum(-1)
        da = dcs.flip(-1).cumsum(-1).flip(-1)
        dx[c0:c1] = dxc.transpose(0, 1)
        ddt[c0:c1] = ((dWm * M).sum(-2) + torch.exp(cL - cs) * dw + A[:, None] * da).T
        dA += (dtc * da).sum(-1)
        dB[c0:c1] += dBc.view(g, k, q, n).sum(1).transpose(0, 1)
        dC[c0:c1] += dCc.view(g, k, q, n).sum(1).transpose(0, 1)
        dS = torch.exp(cL)[..., None] * dS + Cc.transpose(-1, -2) @ bf(dyc * ecs, ru)
    return dict(x=dx, dt=ddt, A=dA, B=dB, C=dC)


def rel(a, b) -> float:
    return float(((a - b).pow(2).mean() / b.pow(2).mean().clamp_min(1e-300)).sqrt())


def run(l=4096, heads=128, q=64, seed=0) -> dict:
    g_, p, n = max(1, heads // 16), 80, 128
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    x, B, C = (bf(r(*s), True) for s in ((l, heads, p), (l, g_, n), (l, g_, n)))
    dt = F.softplus(bf(r(l, heads) * 0.5 - 1.0, True) + r(heads) * 0.1)
    A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 4 - 0.5
    dy = bf(r(l, heads, p), True)
    out = {"l": l, "heads": heads, "chunk": q, "errors": {}}
    ref = grads(x, dt, A, B, C, dy, q)
    for name, how in VARIANTS.items():
        got = grads(x, dt, A, B, C, dy, q, how)
        out["errors"][name] = {k: rel(got[k], ref[k]) for k in ref}
        print(f"{name:46s} " + "  ".join(f"d{k} {v:.2e}" for k, v in out["errors"][name].items()), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--l", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--q", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    out = run(a.l, a.heads, a.q, a.seed)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
