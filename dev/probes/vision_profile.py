"""Probe: where the vision encoder's GPU time goes at the agents' tile counts (the agents issue's admissions).

At 100 one-tile agents the admissions' vision encoder takes about 3.3 s of GPU time for 800 tiles in calls of
one to three tiles (4.1 ms a tile, against a compute floor of 2.04 ms at the matmul rate; docs/benchmarks.md,
"The vision encoder on its own stream"). This probe times RADIO ViT-H/16 + mlp1 (random bf16 weights, 512 px
tiles) as CUDA graphs at ``--tiles`` tiles a call (ms a tile), then profiles one eager call of the first count
and sums its kernels' GPU time by kind (dev/probes/mixed_profile.py's kinds).

    PYTHONPATH=. python3 dev/probes/vision_profile.py --out $OUT
    python dev/probes/vision_profile.py --small --out /tmp/vp      # a CPU smoke test (tiny encoder)
    PYTHONPATH=. python3 dev/probes/vision_profile.py --backends default,flash,cudnn,efficient --out $OUT
        # the same timings with the ViT's attention held to each of torch's SDPA backends (the profile: default)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
sys.path.insert(0, os.path.dirname(__file__))
from bench_vision import flops_per_tile, randomize  # noqa: E402
from mixed_profile import print_summary, profile_summary  # noqa: E402
from timing import captured, median_ms  # noqa: E402

from holotron.vision import Projector, RadioVisionModel, VisionConfig, embed_tiles  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="tiny encoder on the CPU (a smoke test)")
    ap.add_argument("--tiles", default="1,2,3,4,8,13", help="tiles a call, comma-separated")
    ap.add_argument("--backends", default="default",
                    help="SDPA backends to time, comma-separated: default (torch's choice), flash, cudnn, efficient, "
                         "math")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    backends = args.backends.split(",")
    bad = [b for b in backends if b != "default" and b not in names]
    if bad:
        ap.error(f"--backends: unknown {bad}; choose from default, {', '.join(names)}")
    tiles = [int(t) for t in args.tiles.split(",")]
    dev = torch.device("cpu" if args.small else "cuda")
    cuda = dev.type == "cuda"
    if args.small:
        cfg = VisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8, max_img_size=128,
                           image_size=64, projector_hidden_size=128, projector_output_size=96, num_prefix_tokens=16)
    else:
        cfg = VisionConfig(num_prefix_tokens=16)
    dtype = torch.float32 if args.small else torch.bfloat16
    with torch.device("meta"):
        vm, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    vm, mlp1 = vm.to(dtype).to_empty(device=dev), mlp1.to(dtype).to_empty(device=dev)
    randomize(vm, 0)
    randomize(mlp1, 1)
    vm, mlp1 = vm.eval(), mlp1.eval()
    S = cfg.image_size
    gflop = flops_per_tile(cfg, cfg.num_prefix_tokens)["total"] / 1e9
    res: dict = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "tile_px": S, "gflop_per_tile": gflop,
                 "ms_per_call": {}, "ms_per_tile": {}}
    with torch.inference_mode():
        x = torch.randn(max(tiles), 3, S, S, device=dev, dtype=dtype)
        for b in backends:
            for n in tiles:
                fn = (lambda n=n: embed_tiles(vm, mlp1, x[:n]))
                try:
                    with sdpa_kernel([names[b]]) if b != "default" else contextlib.nullcontext():
                        run = captured(fn, dev).replay if cuda else fn
                        ms = median_ms(run, 2, 2 if args.small else 20, dev)
                except RuntimeError as e:  # a backend that does not take these shapes or this device
                    print(f"{b}: {n} tiles: not run ({str(e).splitlines()[0][:100]})", flush=True)
                    continue
                key = n if b == "default" else f"{b}:{n}"
                res["ms_per_call"][key], res["ms_per_tile"][key] = ms, ms / n
                print(f"{b:>9s} {n:3d} tiles  {ms:8.2f} ms a call  {ms / n:7.2f} ms a tile  "
                      f"{gflop * n / ms / 1e3:6.0f} TFLOP/s", flush=True)
        n = tiles[0]
        embed_tiles(vm, mlp1, x[:n])
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts) as prof:
            embed_tiles(vm, mlp1, x[:n])
            if cuda:
                torch.cuda.synchronize()
    summ = profile_summary(prof, cuda)
    res.update(summ, profiled_tiles=n)
    print_summary(summ, f"{n} tile(s), {'GPU' if cuda else 'CPU'} time by kind")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vision_profile.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
