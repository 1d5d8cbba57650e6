"""Probe: what one engine pass costs at 12B, the host's side and the GPU's: the decode step (captured and eager),
a chunk (eager ``extend``, ``extend_static`` eager and captured) and a ``mixed`` pass (decode rows + chunk, eager
and captured), at the agents benchmark's and the serving section's sizes. Random bf16 weights on the GPU; a
DecodeState of 128 rows x 4,096 slots with 1,000 tokens of history per row.

    PYTHONPATH=. python3 dev/probes/pass_cost.py --out $OUT      # (--small: tiny config on the CPU)

Per case: ``host_ms`` (the call returns: every kernel queued; nothing waits at the end), ``total_ms``
(the call and a synchronize), ``gpu_ms`` (CUDA events around the call), medians of 5 after 2 warm-ups, and
``syncs``: how many times the call made the host wait for the GPU (``torch.cuda.set_sync_debug_mode``
warnings). A pass whose host_ms is close to total_ms is host-bound (the GPU waits for launches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_serving import SMALL, build  # noqa: E402
from timing import captured  # noqa: E402

from holotron import mamba2  # noqa: E402
from holotron.config import TextConfig  # noqa: E402
from holotron.state import DecodeState  # noqa: E402


def measure(fn, dev, reps=5):
    cuda = dev.type == "cuda"
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize(dev)
    host, total, gpu = [], [], []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            a.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if cuda:
            b.record()
            torch.cuda.synchronize(dev)
        t2 = time.perf_counter()
        host.append(1e3 * (t1 - t0))
        total.append(1e3 * (t2 - t0))
        if cuda:
            gpu.append(a.elapsed_time(b))
    syncs = None
    if cuda:
        torch.cuda.synchronize(dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(x.message) for x in w)
    med = statistics.median
    return {"host_ms": med(host), "total_ms": med(total), "gpu_ms": med(gpu) if gpu else None, "syncs": syncs}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.small else "cuda")
    cfg = TextConfig(**SMALL) if args.small else TextConfig()
    dtype = torch.float32 if args.small else torch.bfloat16
    lm = build(cfg, dev, dtype)
    R, hist, D = 128, 1000, cfg.hidden_size
    st = DecodeState.allocate(lm, R, 4096)
    st.lengths.fill_(hist)
    g = torch.Generator(device=dev).manual_seed(0)
    toks = torch.randint(0, cfg.vocab_size, (R,), device=dev, generator=g)
    active = torch.ones(R, dtype=torch.long, device=dev)
    res: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
                 "fused_prefill": mamba2.FUSED_PREFILL,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cases": []}

    def reset():
        st.lengths.fill_(hist)

    def graph_of(fn):
        """fn captured in a CUDA graph (two warm-ups on a side stream first, as the engine does)."""
        with torch.inference_mode():
            return captured(fn, dev)

    cuda = dev.type == "cuda"
    graphs = {n: graph_of(lambda n=n: lm.step(toks[:n], st.rows(n), active[:n])) for n in (64, 100)} if cuda else {}
    reset()

    def chunk(b, t):
        return torch.randn(b, t, D, device=dev, dtype=dtype, generator=g)

    def on_dev(v):
        return torch.tensor(v, device=dev)

    cases = []
    for n in (64, 100):
        if n in graphs:
            cases.append((f"step graph n={n}", graphs[n].replay))
        cases.append((f"step eager n={n}", lambda n=n: lm.step(toks[:n], st.rows(n), active[:n])))
    for b, t, rows in ((1, 16, [110]), (4, 17, [101, 105, 110, 120]), (1, 320, [110]), (3, 320, [101, 110, 120]),
                       (8, 320, list(range(101, 125, 3))), (1, 2048, [110])):
        x = chunk(b, t)
        cnt = [t] * b
        starts = [hist] * b
        cases.append((f"extend {b}x{t} rows {'consecutive' if b == 1 else 'scattered'}",
                      lambda x=x, rows=rows, starts=starts, cnt=cnt: lm.extend(x, st, rows, starts, cnt,
                                                                               advance=False)))
        for n in (64, 100):  # the decode rows inactive (their state stays), the chunk's counts real
            cases.append((f"mixed eager n={n} + {b}x{t}",
                          lambda x=x, r=on_dev(rows), s0=on_dev(starts), c=on_dev(cnt), n=n: lm.mixed(
                              toks[:n], st, active[:n] * 0, x, r, s0, c)))
    if cuda:  # the chunk and the mixed pass as CUDA graphs, counts 0 at capture as the engine does
        for b, t in ((1, 16), (3, 16), (1, 320), (3, 384), (16, 384), (2, 3072)):  # history 1,000 + t fits 4,096
            rows_t = torch.arange(101, 101 + b, device=dev)
            starts_t = torch.full((b,), hist, device=dev)
            counts_t = torch.zeros(b, dtype=torch.long, device=dev)
            x = chunk(b, t)
            gr = graph_of(lambda x=x, r=rows_t, s0=starts_t, c=counts_t: lm.extend_static(x, st, r, s0, c))
            mix = {}
            if b * t <= 1152:   # the agents' and the serving section's chunks beside 64 / 100 decode rows
                idle = active * 0
                for n in (64, 100):
                    mix[n] = graph_of(lambda x=x, r=rows_t, s0=starts_t, c=counts_t, n=n: lm.mixed(
                        toks[:n], st, idle[:n], x, r, s0, c))
            counts_t.fill_(t)
            cases.append((f"extend graph {b}x{t}", gr.replay))
            cases.append((f"extend_static eager {b}x{t}",
                          lambda x=x, r=rows_t, s0=starts_t, c=counts_t: lm.extend_static(x, st, r, s0, c)))
            for n, mg in mix.items():   # the decode rows active: what a mixed engine step runs
                cases.append((f"mixed graph n={n} + {b}x{t}", lambda mg=mg, n=n: (idle[:n].fill_(1), mg.replay())))
    with torch.inference_mode():
        for name, fn in cases:
            r = measure(fn, dev, reps=2 if args.small else 5)
            reset()
            r["case"] = name
            res["cases"].append(r)
            print(f"{name:40s} host {r['host_ms']:8.2f} ms  total {r['total_ms']:8.2f} ms  "
                  f"gpu {r['gpu_ms'] if r['gpu_ms'] is None else round(r['gpu_ms'], 2)} ms  syncs {r['syncs']}",
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pass_cost.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
