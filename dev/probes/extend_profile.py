"""Probe: where a prefill chunk into engine rows (``HybridLM.extend``) spends its time at 12B, next to the
plain ``forward`` over an InferenceState on the same tokens. Random bf16 weights on the GPU.

    PYTHONPATH=. python3 dev/probes/extend_profile.py --out $OUT

Cases (25 rows x ~320 tokens, the agents benchmark's one-tile turn): forward (no pads, no state rows),
extend on consecutive rows with equal counts (no mask), extend with varied counts (pads: the
masked path) on non-consecutive rows (Mamba states copied in and out), the same after 2,000 tokens of
history (attention over the cache). Times are CUDA-event medians; the last case is also profiled
(the top CUDA kernels by total time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_serving import SMALL, build  # noqa: E402
from timing import times_ms  # noqa: E402

from holotron.config import TextConfig  # noqa: E402
from holotron.state import DecodeState  # noqa: E402


def cuda_ms(fn, reps=3):
    """Median milliseconds per call after one warm-up call (benchmarks/timing.py)."""
    return statistics.median(times_ms(fn, 1, reps, "cuda" if torch.cuda.is_available() else "cpu"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--small", action="store_true", help="tiny config on the CPU (a smoke test)")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.small else "cuda")
    cfg = TextConfig(**SMALL) if args.small else TextConfig()
    lm = build(cfg, dev, torch.float32 if args.small else torch.bfloat16)
    b, t, D = args.rows, args.tokens, lm.config.hidden_size
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(b, t, D, device=dev, dtype=lm.dtype, generator=g)
    st = DecodeState.allocate(lm, 32, 4096)
    res = {"rows": b, "tokens": t}

    def fwd():
        s = lm.new_state(b, capacity=t)
        lm(inputs_embeds=x, state=s, logits_to_keep=1)

    x1 = torch.randn(1, 16 * t, D, device=dev, dtype=lm.dtype, generator=g)

    def fwd_long():  # one long prompt: generate's prefill
        s = lm.new_state(1, capacity=16 * t)
        lm(inputs_embeds=x1, state=s, logits_to_keep=1)

    varied = [t - (i * 7) % 24 for i in range(b)]
    scattered = list(range(31, 31 - b, -1))

    def ext(rows, counts, start):
        def run():
            lm.extend(x, st, rows, [start] * b, counts, advance=False)
        return run

    with torch.inference_mode():
        cases = {
            "forward (InferenceState, no pads)": fwd,
            "forward, one row of 16 x tokens": fwd_long,
            "extend, consecutive rows, no pads": ext(list(range(b)), [t] * b, 0),
            "extend, scattered rows, pads": ext(scattered, varied, 0),
            "extend, scattered rows, pads, 2,000 tokens of history": ext(scattered, varied, 2000),
        }
        for name, fn in cases.items():
            ms = cuda_ms(fn)
            n = 16 * t if fn is fwd_long else b * t
            res[name] = {"ms": ms, "tokens_per_s": n / ms * 1e3}
            print(f"{name:62s} {ms:8.1f} ms  {n / ms * 1e3:9.0f} tok/s", flush=True)
        prof_fn = cases["extend, scattered rows, pads, 2,000 tokens of history"]
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda"
                                                         else [])
        with torch.profiler.profile(activities=acts) as prof:
            prof_fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=25)
        print(table)
        res["profile"] = table
        cpu = prof.key_averages().table(sort_by="cpu_time_total", row_limit=12)
        res["profile_cpu"] = cpu
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "extend_profile.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
