"""GPU time of one row exchange of the engine's swap graph (holotron/engine_sessions.py ``_capture_swap``) at the 12B
serving section's row shapes (64 rows, 1,152 KV slots, bf16 Mamba state, FP8 KV), three ways:

    per-layer   each layer's tensors, rows selected along dimension 0 (before 2026-12-06's stacks)
    stacks      the state's stacks (holotron/state_stacks.py), rows along dimension 1 (the stacks as built)
    wide        the stacks viewed as (L, R, bytes / 8) int64, rows along dimension 1 (the same bytes, 8 a lane)

    PYTHONPATH=. python3 dev/probes/swap_cost.py [--rows 64] [--slots 1152] [--out DIR]

Each variant is captured in a CUDA graph (two ops a tensor, as ``_capture_swap``) and replayed 50 times between
CUDA events; the median ms of 5 such runs. The rows are checked exchanged (every tensor's bytes) after each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch


def shapes(rows: int, slots: int) -> dict:
    """The 12B's row tensors (docs/architecture.md section 8): 28 Mamba layers, 6 attention layers (FP8 KV)."""
    return {"conv": (28, rows, 12288, 4, torch.bfloat16), "ssm": (28, rows, 128, 80, 128, torch.bfloat16),
            "k": (6, rows, 8, slots, 128, torch.uint8), "v": (6, rows, 8, slots, 128, torch.uint8),
            "ks": (6, rows, 8, slots, torch.float32), "vs": (6, rows, 8, slots, torch.float32)}


def timed(fn, idx, reps=50, runs=5) -> float:
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--slots", type=int, default=1152)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    torch.manual_seed(0)
    stacks = {}
    for name, (*shape, dtype) in shapes(args.rows, args.slots).items():
        stacks[name] = torch.randint(0, 100, shape, dtype=torch.uint8, device="cuda").view(torch.uint8) \
            if dtype == torch.uint8 else torch.randn(shape, device="cuda").to(dtype)
    idx = torch.tensor([3, 40], device="cuda")
    per_layer = [(t[i], 0) for t in stacks.values() for i in range(t.shape[0])]
    stacked = [(t, 1) for t in stacks.values()]
    wide = [(t.view(t.shape[0], t.shape[1], -1).view(torch.uint8).view(t.shape[0], t.shape[1], -1)
             .view(torch.int64), 1) for t in stacks.values()]
    moved = sum(t[:, :2].nbytes for t in stacks.values())
    res = {"rows": args.rows, "slots": args.slots, "bytes_two_rows": moved, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__}
    for name, tensors in (("per_layer", per_layer), ("stacks", stacked), ("wide", wide)):
        def swap(tensors=tensors):
            back = idx.flip(0)
            for t, dim in tensors:
                t.index_copy_(dim, idx, t.index_select(dim, back))
        before = {k: v[:, [3, 40]].clone() for k, v in stacks.items()}
        swap()
        ok = all(torch.equal(v[:, [40, 3]].view(torch.uint8), before[k].view(torch.uint8)) for k, v in stacks.items())
        swap()
        res[name] = {"ms": timed(swap, idx), "kernels": 2 * len(tensors), "exchanged": ok}
        print(f"{name:10s} {res[name]['ms']:.3f} ms  {2 * len(tensors)} ops  exchanged={ok}")
    print(f"bytes of two rows: {moved / 1e6:.0f} MB (select and copy: each read and written)")
    with open(os.path.join(args.out, "swap_cost.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
