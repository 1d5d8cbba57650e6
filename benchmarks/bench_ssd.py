"""Times the SSD scan and decode step per backend on a CUDA GPU; prints a table, writes JSON.

    python benchmarks/bench_ssd.py [--out DIR]      (JSON goes to DIR/bench_ssd.json, DIR=$OUT if set)

Scan: H=128, P=80, N=128, G=8, L=4096, batch 1, bf16 (the Holotron-12B Mamba layer at 4k prefill),
with D per head, dt_bias and softplus. Step: batch 1 and 8 at the same H, P, N, G.
Times are medians of triton.testing.do_bench (CUDA events). Floors: the bytes each scan must
move at the measured copy bandwidth, and its matmul FLOPs at the measured bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from holotron.kernels import ssd_scan, ssd_step  # noqa: E402

H, P, N, G, L = 128, 80, 128, 8, 4096
Q = 128


def inputs(b, l, dtype, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    return dict(
        x=r(b, l, H, P).to(dtype), dt=(r(b, l, H) - 1).to(dtype), A=-torch.rand(H, device=dev, generator=g) - 0.5,
        B=(r(b, l, G, N) / N**0.5).to(dtype), C=r(b, l, G, N).to(dtype),
        D=r(H), dt_bias=r(H) * 0.5,
    )


def ceilings(dev):
    """Measured copy bandwidth (bytes/s) and bf16 matmul rate (FLOP/s) on random data."""
    src = torch.randn(1 << 28, device=dev)  # 1 GiB
    dst = torch.empty_like(src)
    t = do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3
    bw = 2 * src.numel() * 4 / t
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = do_bench(lambda: a @ bm, return_mode="median") * 1e-3
    return bw, 2 * 8192**3 / t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw, mm = ceilings(dev)
    rows = []

    kw = inputs(1, L, torch.bfloat16, dev)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    el = 2  # bf16 bytes
    bytes_min = (x.numel() * 2 + dt.numel() + B.numel() * 2) * el + H * P * N * 4  # x, y, dt, B, C, state
    n_chunks = triton.cdiv(L, Q)
    # matmul FLOPs of the chunked algorithm (full Q x Q blocks, as the kernels compute them):
    # C B^T, (W) x, chunk states, C . S_in
    flops = n_chunks * H * (2 * Q * Q * N + 2 * Q * Q * P + 2 * Q * P * N + 2 * Q * N * P)
    for backend in ("triton", "chunked"):
        fn = lambda: ssd_scan(x, dt, A, B, C, dt_softplus=True, chunk_size=Q, backend=backend, **kw)  # noqa: E731
        fn()
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        s = ms * 1e-3
        rows.append(dict(op="ssd_scan", backend=backend, shape=f"b1 L{L} H{H} P{P} N{N} G{G} bf16",
                         ms=ms, GBps=bytes_min / s / 1e9, TFLOPs=flops / s / 1e12,
                         floor_bytes_ms=bytes_min / bw * 1e3, floor_flops_ms=flops / mm * 1e3))

    for b in (1, 8):
        kw = inputs(b, 1, torch.bfloat16, dev, seed=1)
        x, dt, A, B, C = (kw.pop(k)[:, 0] if k != "A" else kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
        state = torch.randn(b, H, P, N, device=dev)
        bytes_step = 2 * state.numel() * 4 + (2 * x.numel() + 2 * B.numel()) * el
        for backend in ("triton", "naive"):
            fn = lambda: ssd_step(state, x, dt, A, B, C, dt_softplus=True, backend=backend, **kw)  # noqa: E731
            fn()
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            rows.append(dict(op="ssd_step", backend=backend, shape=f"b{b} H{H} P{P} N{N} G{G} bf16",
                             ms=ms, GBps=bytes_step / (ms * 1e-3) / 1e9, TFLOPs=None,
                             floor_bytes_ms=bytes_step / bw * 1e3, floor_flops_ms=None))

    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                copy_GBps=bw / 1e9, bf16_matmul_TFLOPs=mm / 1e12)
    print(f"# {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"copy {meta['copy_GBps']:.0f} GB/s  bf16 matmul {meta['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    print(f"| op | backend | shape | median ms | GB/s (min bytes) | TFLOP/s | floor ms (bytes) | floor ms (FLOPs) |")
    print("|---|---|---|---|---|---|---|---|")
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for r in rows:
        print(f"| {r['op']} | {r['backend']} | {r['shape']} | {r['ms']:.3f} | {f(r['GBps'], '.0f')} | "
              f"{f(r['TFLOPs'], '.1f')} | {f(r['floor_bytes_ms'], '.3f')} | {f(r['floor_flops_ms'], '.3f')} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_ssd.json"), "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
