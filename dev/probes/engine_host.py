"""Probe: the engine's host work per decode step, apart from the model's compute, on the CPU.

On the H200 the engine's decode phase ran at 69.9% of the captured step alone at 100 one-tile agents (18.1 ms a
step against 14.5; docs/benchmarks.md, "The engine as graphs"). Between two replays the host reads the step's
tokens (the one sync), does each row's bookkeeping, compacts rows, looks at admissions and the prefill queue:
time in which the GPU waits. This probe measures that host time with a model so small that its forward is
cheap, the step itself (``HybridLM.step``, eager here: no CUDA graphs on the CPU) timed apart with cProfile.

    python dev/probes/engine_host.py [--rows 100] [--steps 200] [--new 64] [--json OUT.json]

Reported per decode step: wall ms, ms inside ``Engine._step`` (what the GPU replays as a graph: the model's
step and the token choice), the rest (the host's work between replays), and the engine functions with the most
own time under cProfile (a second run of as many steps). A CPU's Python speed is not the GPU host's, but the
same code runs.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from tiny_lm import tiny_config, tiny_lm  # noqa: E402

from holotron import kernels  # noqa: E402
from holotron.engine import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed")
    ap.add_argument("--new", type=int, default=None, help="tokens per turn (default: steps + 20, none finish)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = tiny_config(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, mamba_num_heads=2, mamba_head_dim=8, ssm_state_size=8, n_groups=1)
    lm = tiny_lm(cfg)
    new = args.new or args.steps + 20
    with kernels.use_backend("chunked"):
        eng = Engine(lm, max_batch=args.rows, max_len=new + 64)
        g = torch.Generator().manual_seed(0)
        for _ in range(args.rows):
            eng.submit(torch.randint(3, 90, (24,), generator=g), max_new_tokens=new)
        while eng.stats["decode_steps"] < 5 or eng.live < args.rows:  # every row admitted and decoding
            eng.step()
        eng.reset_stats()
        inner = [0.0]
        step = eng._step

        def timed(b):  # what a CUDA graph replays on the GPU: the model's step and the token choice
            t = time.perf_counter()
            step(b)
            inner[0] += time.perf_counter() - t

        eng._step = timed
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        wall = time.perf_counter() - t0
        n, model_s = eng.stats["decode_steps"], inner[0]
        prof = cProfile.Profile()  # then the host functions' own time, in more steps
        prof.enable()
        for _ in range(args.steps):
            eng.step()
        prof.disable()
    st = pstats.Stats(prof)
    own = sorted(((v[2], f"{Path(k[0]).name}:{k[1]} {k[2]}") for k, v in st.stats.items()
                  if "holotron/engine" in k[0] or "holotron/state" in k[0]), reverse=True)[:12]
    res = dict(rows=args.rows, steps=n, wall_ms_per_step=1e3 * wall / n, model_step_ms=1e3 * model_s / n,
               host_ms_per_step=1e3 * (wall - model_s) / n,
               engine_own_ms_profiled=[(round(1e3 * s / n, 4), f) for s, f in own], torch=torch.__version__)
    print(f"{args.rows} rows, {n} decode steps: {res['wall_ms_per_step']:.3f} ms a step, of which the model's step "
          f"{res['model_step_ms']:.3f} ms and the host's work around it {res['host_ms_per_step']:.3f} ms")
    print("engine functions, own time per step under cProfile (inflated by the profiler):")
    for ms, f in res["engine_own_ms_profiled"]:
        print(f"  {ms:8.4f} ms  {f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
