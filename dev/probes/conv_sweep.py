"""Probe: launch settings of the prefill's causal conv (holotron/kernels/conv_seq_triton.py, ``CONV_SEQ_CONFIG``).

A profile of one mixed engine pass at 12B (docs/benchmarks.md, "Token buckets of 16") had ``_conv_seq`` at
about 41 us a layer for 2 x 320 tokens of 12,288 channels, about 4x the time its bytes take (x read and the
output written once: 31.5 MB). This probe times the conv as a CUDA graph of ``--reps`` calls (the window
update included, and a copy of the window, b x 98 KB) at the agents' and the prefill's shapes for each
setting of a small grid, checks every setting's output against the current one, and prints each shape's
best setting and its rate on those bytes.

    PYTHONPATH=. python3 dev/probes/conv_sweep.py --out $OUT
    python dev/probes/conv_sweep.py --small --out /tmp/cs      # a CPU smoke test (Triton's interpreter, 2 settings)
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

from holotron.kernels import conv_seq_triton as cst  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="tiny shapes, two settings, on the CPU")
    ap.add_argument("--reps", type=int, default=20, help="calls per graph replay")
    args = ap.parse_args()
    cuda = not args.small
    dev = torch.device("cuda" if cuda else "cpu")
    C, K, width = (96, 4, 200) if args.small else (12288, 4, 22656 + 12288)   # in_proj's row: the conv input a slice
    shapes = [(2, 8)] if args.small else [(2, 320), (4, 160), (1, 8192)]
    grid = [dict(BLOCK_T=8, BLOCK_C=64, num_warps=2), dict(BLOCK_T=16, BLOCK_C=256, num_warps=4)] if args.small else [
        dict(BLOCK_T=bt, BLOCK_C=bc, num_warps=nw)
        for bt, bc, nw in itertools.product((8, 16, 32, 64), (128, 256, 512), (4, 8))
        if bt * bc <= 16384]
    default = dict(cst.CONV_SEQ_CONFIG)
    dtype = torch.float32 if args.small else torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(C, K, device=dev, dtype=dtype, generator=g)
    bias = torch.randn(C, device=dev, dtype=dtype, generator=g)
    res: dict = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "channels": C, "default": default, "rows": []}
    for b, t in shapes:
        buf = torch.randn(b, t, width, device=dev, dtype=dtype, generator=g)
        x = buf[:, :, width - C:]                   # a strided slice, as the mixer reads it
        counts = torch.full((b,), t, device=dev)
        win0 = torch.randn(b, C, K, device=dev, dtype=dtype, generator=g)
        ref = None
        floor_mb = 2 * b * t * C * x.element_size() / 1e6
        best = None
        for cfg in [default] + grid:
            cst.CONV_SEQ_CONFIG = {**default, **cfg}
            win = win0.clone()

            def call(win=win):
                win.copy_(win0)
                return cst.conv_seq_triton(x, win, w, bias, counts)
            out = call()
            if ref is None:
                ref = out.clone()
            ok = bool(torch.equal(out, ref))
            us = per_call_us(call, args.reps, dev)
            row = {"rows": b, "tokens": t, **cfg, "us": us, "equal": ok, "gb_per_s": floor_mb / us * 1e3}
            res["rows"].append(row)
            if ok and (best is None or us < best["us"]):
                best = row
            print(f"{b}x{t:<5d} {cfg}  {us:8.1f} us  {row['gb_per_s']:7.0f} GB/s  equal {ok}", flush=True)
        print(f"best {b}x{t}: {best}", flush=True)
    cst.CONV_SEQ_CONFIG = default
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "conv_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
