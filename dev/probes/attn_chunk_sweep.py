"""Probe: launch settings of the chunk attention kernel (holotron/kernels/attn_chunk_triton.py,
``CHUNK_ATTN_CONFIG``).

A profile of one mixed engine pass at 12B (docs/benchmarks.md, "Fewer kernels in a mixed pass": 100 decoding rows
+ two chunk rows of 320 tokens after 1,800 of history) had ``_chunk_attn`` at 1.03 ms for the 6 attention
layers: about 160 TFLOP/s on the chunk's 167 GFLOP of attention. This probe times the kernel as a CUDA graph of
``--reps`` calls at the engine's chunk shapes (40 query heads, 8 KV heads, head dim 128; bf16 and FP8 caches) for
each setting of a grid, checks every setting's output against the current setting's (within bf16 rounding: a
different key block sums in another order), and prints each shape's best setting and its rate.

    PYTHONPATH=. python3 dev/probes/attn_chunk_sweep.py --out $OUT
    python dev/probes/attn_chunk_sweep.py --small --fp8 both --out /tmp/as   # a CPU smoke test (the interpreter)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

if "--small" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from timing import per_call_us  # noqa: E402

from holotron.kernels import attn_chunk_triton as act  # noqa: E402
from holotron.kv_cache import quantize_kv  # noqa: E402


def _flops(starts, counts, hq, hd):
    """Two products of (query x key x head dim) per allowed pair, every query head."""
    pairs = sum(n * s + n * (n + 1) // 2 for s, n in zip(starts, counts))
    return 4 * pairs * hq * hd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="tiny shapes, two settings, on the CPU")
    ap.add_argument("--reps", type=int, default=10, help="calls per graph replay")
    ap.add_argument("--fp8", choices=["off", "on", "both"], default="off", help="an FP8 cache (or both)")
    args = ap.parse_args()
    cuda = not args.small
    dev = torch.device("cuda" if cuda else "cpu")
    hq, hkv, hd = (4, 2, 16) if args.small else (40, 8, 128)
    # (rows, new tokens a row, history a row): the one-tile agents' chunks, a long prompt
    shapes = [(2, 8, 5)] if args.small else [(2, 320, 1800), (4, 160, 1800), (1, 4096, 0)]
    grid = [dict(BLOCK_M=16, BLOCK_N=16, num_warps=2, num_stages=1)] if args.small else [
        dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns)
        for bm, bn, nw, ns in itertools.product((64, 128), (32, 64, 128), (4, 8), (1, 2, 3))]
    default = dict(act.CHUNK_ATTN_CONFIG)
    dtype = torch.float32 if args.small else torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "heads": [hq, hkv, hd], "default": default,
                 "rows": []}
    kinds = {"off": [False], "on": [True], "both": [False, True]}[args.fp8]
    for (b, t, hist), fp8 in itertools.product(shapes, kinds):
        L = hist + t + 16
        q = torch.randn(b, t, hq, hd, device=dev, dtype=dtype, generator=g)
        k = torch.randn(b, hkv, L, hd, device=dev, dtype=dtype, generator=g)
        v = torch.randn(b, hkv, L, hd, device=dev, dtype=dtype, generator=g)
        ks = vs = None
        if fp8:
            k, ks = quantize_kv(k)
            v, vs = quantize_kv(v)
        rows = torch.arange(b, device=dev)
        starts = torch.full((b,), hist, device=dev)
        counts = torch.full((b,), t, device=dev)
        flops = _flops([hist] * b, [t] * b, hq, hd)
        ref, best = None, None
        for cfg in [default] + grid:
            act.CHUNK_ATTN_CONFIG = {**default, **cfg}
            row = {"rows": b, "tokens": t, "history": hist, "fp8": fp8, **cfg}
            try:
                def call():
                    return act.chunk_attention_triton(q, k, v, rows, starts, counts, ks, vs)
                out = call()
                if ref is None:
                    ref = out.float().clone()
                err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                ok = err < (1e-5 if dtype == torch.float32 else 2e-2)
                us = per_call_us(call, args.reps, dev)
                row.update(us=us, rel_err=err, ok=ok, tflops=flops / us / 1e6)
            except Exception as e:  # noqa: BLE001 - a setting that does not fit (shared memory) is recorded
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:160]}")
            res["rows"].append(row)
            if row.get("ok") and (best is None or row["us"] < best["us"]):
                best = row
            print(f"{b}x{t}+{hist} fp8={fp8} {cfg}  {row.get('us', float('nan')):8.1f} us  "
                  f"{row.get('tflops', float('nan')):6.1f} TFLOP/s  ok {row.get('ok')}", flush=True)
        print(f"best {b}x{t}+{hist} fp8={fp8}: {best}", flush=True)
    act.CHUNK_ATTN_CONFIG = default
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_chunk_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
