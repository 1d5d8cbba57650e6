"""Probe: where one mixed engine pass spends its GPU time at 12B (the agents issue's largest phase).

At 100 one-tile agents the best run of 2026-12-05 spent 18.5 of its 29.6 s in 399 mixed passes of about 46 ms
(100 decoding rows + about 635 prompt tokens of one to a few turns; docs/benchmarks.md, "Agents at concurrency,
second run"), and the run's floor is about half its time. This probe times, as CUDA graphs on one
``DecodeState`` (random bf16 weights, rows with ``--history`` tokens each): the decode step at ``--decode``
active rows, the chunk alone (``extend_static``, ``--chunk`` rows x ``--tokens``), and the mixed pass of both;
then profiles the mixed pass eagerly (the same kernels; a graph replay hides them from the profiler) and sums
the GPU time of its kernels by kind: products, the scan, the conv, attention, norms, copies and casts,
other elementwise work. The products' rate is their FLOPs (2 x linear weights x tokens) over their time.

    PYTHONPATH=. python3 dev/probes/mixed_profile.py --out $OUT [--ssm-dtype bfloat16]
    python dev/probes/mixed_profile.py --small --out /tmp/mp      # a CPU smoke test (CPU times, tiny model)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_serving import SMALL, build  # noqa: E402
from timing import captured, median_ms  # noqa: E402

from holotron import mamba2  # noqa: E402
from holotron.config import TextConfig  # noqa: E402
from holotron.state import DecodeState  # noqa: E402

KINDS = [  # (kind, pattern over the kernel's name), first match wins
    ("products", r"gemm|cutlass|nvjet|xmma|cublas|matmul|skinny_mm|gemv|_mm_"),
    ("scan", r"_scan|ssd|_step_kernel|state_passing"),
    ("conv", r"conv"),
    ("attention", r"attn|flash|fmha|sdpa|softmax"),
    ("norms", r"norm|rms"),
    ("copies and casts", r"copy|cast|cat|index|gather|scatter|put|take|fill"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|silu|mul|add|exp|where"),
]


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, pat in KINDS if re.search(pat, low)), "other")


def profile_summary(prof, cuda: bool) -> dict:
    """A profile's kernels: their total ms, ms by kind (``kind_of``), the 25 longest (ms, calls, name). On CUDA
    the kernels' own entries only (CPU ops carry their kernels' time too: counted once, there); on a CPU every
    op's own time."""
    by_kind: dict[str, float] = {}
    kernels = []
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", 0) if cuda else ev.self_cpu_time_total
        if cuda:
            kind = getattr(ev, "device_type", None)
            if kind is not None and kind != torch.autograd.DeviceType.CUDA:
                continue
            if kind is None and ev.key.startswith(("aten::", "cuda", "holotron::", "triton::")):
                continue
        if us <= 0:
            continue
        by_kind[kind_of(ev.key)] = by_kind.get(kind_of(ev.key), 0.0) + us / 1e3
        kernels.append((us / 1e3, ev.count, ev.key[:90]))
    return {"profiled_ms": sum(by_kind.values()),
            "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"ms": ms, "calls": c, "name": k} for ms, c, k in sorted(kernels, reverse=True)[:25]]}


def print_summary(summary: dict, title: str, extra: str | None = None) -> None:
    total = summary["profiled_ms"]
    print(f"\n{title} (eager, profiled): {total:.2f} ms")
    for k, ms in summary["by_kind_ms"].items():
        print(f"  {k:18s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    if extra:
        print(f"  {extra}")
    for r in summary["top_kernels"][:12]:
        print(f"  {r['ms']:7.2f} ms  x{r['calls']:<4d} {r['name']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="tiny config on the CPU (a smoke test)")
    ap.add_argument("--decode", type=int, default=100, help="decoding rows")
    ap.add_argument("--chunk", type=int, default=2, help="chunk rows (turns)")
    ap.add_argument("--tokens", type=int, default=320, help="tokens per chunk row")
    ap.add_argument("--history", type=int, default=1800, help="tokens each row holds already")
    ap.add_argument("--ssm-dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.small else "cuda")
    cuda = dev.type == "cuda"
    cfg = TextConfig(**SMALL) if args.small else TextConfig()
    dtype = torch.float32 if args.small else torch.bfloat16
    lm = build(cfg, dev, dtype)
    n, b, t = args.decode, args.chunk, args.tokens
    R, L = n + b, -(-(args.history + t + 64) // 64) * 64
    st = DecodeState.allocate(lm, R, L, getattr(torch, args.ssm_dtype))
    st.lengths.fill_(args.history)
    g = torch.Generator(device=dev).manual_seed(0)
    toks = torch.randint(0, cfg.vocab_size, (n,), device=dev, generator=g)
    active = torch.ones(n, dtype=torch.long, device=dev)
    x = torch.randn(b, t, cfg.hidden_size, device=dev, dtype=dtype, generator=g)
    rows = torch.arange(n, n + b, device=dev)
    starts = torch.full((b,), args.history, device=dev)
    counts = torch.full((b,), t, device=dev)

    def reset():  # every pass writes one slot past the history (decode) or the chunk's slots: lengths back
        st.lengths.fill_(args.history)

    passes = {
        "decode step": lambda: lm.step(toks, st.rows(n), active),
        "chunk (extend_static)": lambda: lm.extend_static(x, st, rows, starts, counts),
        "mixed pass": lambda: lm.mixed(toks, st, active, x, rows, starts, counts),
    }

    res: dict = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "fused_prefill": mamba2.FUSED_PREFILL,
                 "decode_rows": n, "chunk_rows": b, "chunk_tokens": t, "history": args.history,
                 "ssm_dtype": args.ssm_dtype, "ms": {}}
    with torch.inference_mode():
        for name, fn in passes.items():
            run = captured(fn, dev, after=reset).replay if cuda else fn
            res["ms"][name] = median_ms(lambda run=run: (run(), reset()), 1, 2 if args.small else 10, dev)
            print(f"{name:24s} {res['ms'][name]:8.2f} ms{' (graph)' if cuda else ''}", flush=True)
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        passes["mixed pass"]()
        reset()
        with torch.profiler.profile(activities=acts) as prof:
            passes["mixed pass"]()
            if cuda:
                torch.cuda.synchronize()
        reset()
    summ = profile_summary(prof, cuda)
    lin = sum(m.weight.numel() for m in lm.modules() if isinstance(m, torch.nn.Linear))
    flops = 2 * lin * (n + b * t)
    res.update(summ, linear_params=lin,
               product_tflops=flops / (summ["by_kind_ms"].get("products", float("nan")) * 1e-3) / 1e12)
    print_summary(summ, f"mixed pass, {'GPU' if cuda else 'CPU'} time by kind",
                  f"products at {res['product_tflops']:.0f} TFLOP/s ({flops / 1e12:.1f} TFLOP)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mixed_profile.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
