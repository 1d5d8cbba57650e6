"""Probe: where the time of the SSD scan's forward + backward goes, kernel by kernel (torch profiler, GPU).

    python dev/probes/ssd_bwd_profile.py OUT_DIR [SCAN_CONFIG_JSON] [BWD_CONFIG_JSON]

At 1 x 4096 and 1 x 16384 (the 12B layer's sizes, bf16, D, dt_bias, softplus): GPU microseconds per
forward + backward by kernel name, averaged over 5 profiled calls after warm-up; rows to OUT_DIR/ssd_bwd_profile.json.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))

from ssd_tune import SHAPES, call, inputs  # noqa: E402


def main():
    import torch
    from torch.profiler import ProfilerActivity, profile

    from holotron.kernels import ssd_triton_backward as TB
    from holotron.kernels import ssd_triton_scan as TS

    out_dir = sys.argv[1]
    if len(sys.argv) > 2:
        TS.SCAN_CONFIG.update(json.loads(sys.argv[2]))
    if len(sys.argv) > 3:
        TB.BWD_CONFIG.update(json.loads(sys.argv[3]))
    rows = []
    for b, l in SHAPES[:2]:
        kw = inputs(b, l, grad=True)
        dy = torch.randn(kw["x"].shape, device="cuda").bfloat16()

        def step():
            return torch.autograd.grad(call(kw, "triton")[0], list(kw.values()), dy)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        reps = 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                step()
            torch.cuda.synchronize()
        us = defaultdict(float)
        for e in prof.events():
            if e.device_type.name == "CUDA":
                us[e.name[:80]] += e.device_time_total / reps if hasattr(e, "device_time_total") else 0.0
        top = sorted(us.items(), key=lambda kv: -kv[1])
        row = dict(shape=f"{b}x{l}", total_us=sum(us.values()), kernels=top[:15])
        rows.append(row)
        print(f"{b}x{l}: {row['total_us']:.0f} us GPU per forward + backward")
        for k, v in top[:15]:
            print(f"  {v:9.1f}  {k}")
    with open(os.path.join(out_dir, "ssd_bwd_profile.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
