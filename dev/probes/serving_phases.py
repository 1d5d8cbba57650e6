"""Probe: where the serving section's engine steps spend their wall time, host against GPU (issue 18).

On the H100 (2026-12-06) the serving section's mixed passes took 19.3 ms each in the engine (0.64 s / 33) against
16.47 ms for the profiled graph of the shape met most (62 decoding rows + 4 x 16 prompt tokens,
``mixed_profile.py``), while its decode steps took about what their graph takes. This probe runs the section's
workload (``bench_serving.serving``: 128 requests continuing one 1,024-token prefix, 16-token suffixes, 16..64 new
tokens, 64 rows, FP8 KV, bf16 Mamba state, mixed passes) twice on one engine, the second run instrumented: each
engine step's wall split into the host's phases (admissions, row compaction, picking and filling the chunk, the
wait for the graph, the bookkeeping after it, the chunk's finish) and, on CUDA, the GPU time of each graph replay
(events around it). What the wall holds beyond the replay is time the GPU may wait for the host.

    PYTHONPATH=. python3 dev/probes/serving_phases.py --out $OUT
    python dev/probes/serving_phases.py --small --out /tmp/sp      # a CPU smoke test (tiny model, CPU times)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_serving import SMALL, build  # noqa: E402

from holotron.config import TextConfig  # noqa: E402
from holotron.engine import Engine  # noqa: E402
from holotron.engine_chunks import row_buckets  # noqa: E402

PHASES = ("_admit", "_compact", "_pick_chunk", "_fill_chunk", "_after_decode", "_finish_chunk", "_sync")
SPANS = ("_admit", "_compact", "_finish_chunk")   # also timed on the GPU: events at entry and exit (the span holds
# the phase's own kernels and any wait for the host as it queues them)


class Timed:
    """Wraps an engine's methods (instance attributes) to sum their host seconds into the current step's record."""

    def __init__(self, eng: Engine):
        self.eng, self.cur, self.steps, self.cuda = eng, None, [], eng.device.type == "cuda"
        for name in PHASES:
            self._wrap(name)
        self._wrap_graphs()

    def _wrap(self, name: str) -> None:
        f = getattr(self.eng, name)

        def w(*a, **k):
            if name == "_after_decode" and self.cur is not None and self.cur.get("end_ev") is not None:
                t = time.perf_counter()
                self.cur["end_ev"].synchronize()   # the wait for the replay; the tolist inside then returns at once
                self.cur["wait"] += time.perf_counter() - t
            span = self.cuda and self.cur is not None and name in SPANS
            if span:
                ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev[0].record()
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                if self.cur is not None:
                    self.cur[name] += time.perf_counter() - t
                if span:
                    ev[1].record()
                    self.cur["events"].append((name.strip("_"), *ev))

        setattr(self.eng, name, w)

    def _wrap_graphs(self) -> None:
        timed = self

        class Replay:
            def __init__(self, g, kind):
                self.g, self.kind = g, kind

            def replay(self):
                rec = timed.cur
                t = time.perf_counter()
                if timed.cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    self.g.replay()
                    b.record()
                    rec["events"].append((self.kind, a, b))
                    rec["end_ev"] = b
                else:
                    self.g.replay()
                rec["launch"] += time.perf_counter() - t

        eng = self.eng
        for d, kind in ((eng.graphs, "decode"), (eng.mixed_graphs, "mixed")):
            for key in list(d):
                d[key] = Replay(d[key], kind)
        if getattr(eng, "_swap_graph", None) is not None:
            eng._swap_graph = Replay(eng._swap_graph, "swap")

    def step(self) -> None:
        self.cur = collections.defaultdict(float, kind=None, events=[], end_ev=None)
        st = self.eng.stats
        before = (st["mixed_steps"], st["decode_steps"])
        t = time.perf_counter()
        self.eng.step()
        self.cur["wall"] = time.perf_counter() - t
        self.cur["kind"] = ("mixed" if st["mixed_steps"] > before[0] else "decode" if st["decode_steps"] > before[1]
                            else "other")   # other: a chunk alone, or admissions only
        self.steps.append(self.cur)
        self.cur = None

    def summary(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
        by = collections.defaultdict(list)
        for s in self.steps:
            gpu = collections.defaultdict(float)
            for kind, a, b in s["events"]:
                gpu[kind] += a.elapsed_time(b) / 1e3
            s["gpu"] = dict(gpu)
            by[s["kind"]].append(s)
        out = {}
        for kind, ss in by.items():
            ms = lambda key: 1e3 * statistics.mean(s.get(key, 0.0) for s in ss)  # noqa: E731
            row = {"steps": len(ss), "wall_ms": ms("wall"), "launch_ms": ms("launch"), "wait_ms": ms("wait")}
            row.update({f"{p.strip('_')}_ms": ms(p) for p in PHASES})
            for g in ("decode", "mixed", "swap") + tuple(p.strip("_") for p in SPANS):
                row[f"gpu_{g}_ms"] = 1e3 * statistics.mean(s["gpu"].get(g, 0.0) for s in ss)
            row["wall_minus_gpu_ms"] = row["wall_ms"] - sum(row[f"gpu_{g}_ms"] for g in ("decode", "mixed", "swap"))
            out[kind] = row
        return out


def workload(eng: Engine, pre, n_req: int, suffix: int, vocab: int, dev, runner=None) -> dict:
    g = torch.Generator().manual_seed(0)
    reqs = [eng.submit(torch.randint(0, vocab, (suffix,), generator=g).to(dev), prefix=pre,
                       max_new_tokens=int(torch.randint(16, 65, (1,), generator=g))) for _ in range(n_req)]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t, steps = time.perf_counter(), 0
    while not eng.idle:
        (runner.step if runner else eng.step)()
        steps += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t
    toks = sum(len(r.tokens) for r in reqs)
    return {"steps": steps, "seconds": s, "new_tokens": toks, "tokens_per_s": toks / s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TextConfig(**SMALL) if args.small else TextConfig()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    kv = torch.float8_e4m3fn if dev.type == "cuda" else None
    lm = build(cfg, dev, dtype)
    prompt, n_req, rows, suffix = (64, 16, 4, 16) if args.small else (1024, 128, 64, 16)
    helper = Engine(lm, max_batch=1, max_len=prompt + 64, cuda_graph=False, kv_dtype=kv)
    with torch.inference_mode():
        pre = helper.prefix(torch.randint(0, cfg.vocab_size, (prompt,), device=dev))
    del helper
    eng = Engine(lm, rows, pre.length + suffix + 64 + 16, kv_dtype=kv, mixed=True, ssm_dtype=torch.bfloat16)
    eng.capture_chunks([(b, suffix) for b in row_buckets(rows)])
    eng.capture_mixed([(nb, b, suffix) for nb in eng.batch_sizes if nb >= rows // 4 for b in (1, 2, 3, 4)])
    warm = workload(eng, pre, n_req, suffix, cfg.vocab_size, dev)
    eng.reset_stats()
    plain = workload(eng, pre, n_req, suffix, cfg.vocab_size, dev)
    stats_plain = dict(eng.stats)
    eng.reset_stats()
    timed = Timed(eng)
    inst = workload(eng, pre, n_req, suffix, cfg.vocab_size, dev, runner=timed)
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "small": args.small, "warm_run": warm, "plain_run": plain, "plain_stats": stats_plain,
           "instrumented_run": inst, "instrumented_stats": dict(eng.stats), "by_step_kind": timed.summary()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serving_phases.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['device']}: plain {plain['tokens_per_s']:.0f} tok/s ({plain['steps']} steps, "
          f"{plain['seconds']:.3f} s); instrumented {inst['tokens_per_s']:.0f}")
    cols = ["steps", "wall_ms", "gpu_decode_ms", "gpu_mixed_ms", "gpu_swap_ms", "gpu_admit_ms", "gpu_compact_ms",
            "gpu_finish_chunk_ms", "wall_minus_gpu_ms", "admit_ms",
            "compact_ms", "pick_chunk_ms", "fill_chunk_ms", "launch_ms", "wait_ms", "after_decode_ms",
            "finish_chunk_ms", "sync_ms"]
    print("kind    " + " ".join(f"{c[:-3] if c.endswith('_ms') else c:>12}" for c in cols))
    for kind, row in res["by_step_kind"].items():
        print(f"{kind:8}" + " ".join(f"{row[c]:12.3f}" if isinstance(row[c], float) else f"{row[c]:12d}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
