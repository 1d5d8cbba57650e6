"""Vision encoder throughput: RADIO ViT-H/16 + pixel shuffle + mlp1 on one 512 tile and on a 12-tile
screenshot (+ thumbnail = 13 tiles), bf16, random weights.

    PYTHONPATH=. python3 benchmarks/bench_vision.py            # on a CUDA GPU; JSON to $OUT (or .)
    PYTHONPATH=. python3 benchmarks/bench_vision.py --small    # tiny config, any device (a smoke test)

Reports the median of timed runs after warm-up (CUDA events), tiles/s, the FLOPs counted below and the
achieved TFLOP/s next to the measured bf16 matmul rate of the same GPU, plus a bf16-vs-fp32 check of the
output on one tile. FLOPs per tile with N = n_prefix + (S/P)^2 tokens, width D, depth L:
    encoder  L * (24 N D^2 + 4 N^2 D)   (qkv 6ND^2, proj 2ND^2, fc1+fc2 16ND^2; QK^T and PV 4N^2 D)
    patches  2 (S/P)^2 (3 P^2) D
    mlp1     2 T' (4D * H + H * D_lm)    (T' = tokens after pixel shuffle, H = projector hidden size)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from timing import times_ms as timeit  # noqa: E402  (benchmarks/ is on sys.path)

from holotron.vision import Projector, RadioVisionModel, VisionConfig, embed_tiles, pixel_shuffle


def flops_per_tile(cfg: VisionConfig, n_prefix: int) -> dict:
    g = cfg.image_size // cfg.patch_size
    N, D, L = n_prefix + g * g, cfg.hidden_size, cfg.num_hidden_layers
    enc = L * (24 * N * D * D + 4 * N * N * D)
    patches = 2 * g * g * 3 * cfg.patch_size ** 2 * D
    tp = cfg.tokens_per_tile
    proj = 2 * tp * (cfg.projector_input_size * cfg.projector_hidden_size
                     + cfg.projector_hidden_size * cfg.projector_output_size)
    return {"encoder": enc + patches, "projector": proj, "total": enc + patches + proj}


def matmul_tflops(device: torch.device, n: int, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = statistics.median(timeit(lambda: a @ b, 3, reps, device))
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "0.weight":
            p.fill_(1.0).add_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype), alpha=0.05)
        else:
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(0.02))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny config (smoke test on any device)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for bench_vision.json")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.small:
        print("bench_vision: no CUDA GPU; use --small for a CPU smoke test", file=sys.stderr)
        return 2
    if args.small:
        cfg = VisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8, max_img_size=128,
                           image_size=64, projector_hidden_size=128, projector_output_size=96, num_prefix_tokens=16)
        tiles_list, mm_n = (1, 13), 512
    else:
        cfg = VisionConfig(num_prefix_tokens=16)  # ViT-H/16, 512 tiles, 20480-wide mlp1 into 5120
        tiles_list, mm_n = (1, 13), 8192
    n_prefix = cfg.num_prefix_tokens
    torch.backends.cuda.matmul.allow_tf32 = False

    with torch.device("meta"):
        vm, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    vm, mlp1 = vm.to_empty(device=device), mlp1.to_empty(device=device)
    randomize(vm, 0)
    randomize(mlp1, 1)
    params = sum(p.numel() for p in vm.parameters()) + sum(p.numel() for p in mlp1.parameters())

    # correctness on one tile: bf16 against the same weights in fp32
    x1 = torch.randn(1, 3, cfg.image_size, cfg.image_size, device=device,
                     generator=torch.Generator(device=device).manual_seed(3))
    with torch.inference_mode():
        ref = embed_tiles(vm, mlp1, x1).double()
    vm, mlp1 = vm.to(torch.bfloat16).eval(), mlp1.to(torch.bfloat16).eval()
    with torch.inference_mode():
        got = embed_tiles(vm, mlp1, x1).double()
    rel = float((got - ref).norm() / ref.norm())
    finite = bool(torch.isfinite(got).all())

    tflops_mm = matmul_tflops(device, mm_n, 20)
    rows = []
    for T in tiles_list:
        x = torch.randn(T, 3, cfg.image_size, cfg.image_size, device=device,
                        generator=torch.Generator(device=device).manual_seed(T))
        gh = cfg.image_size // cfg.patch_size
        with torch.inference_mode():
            feats = vm(x)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            total = timeit(lambda: embed_tiles(vm, mlp1, x), args.warmup, args.reps, device)
            enc = timeit(lambda: vm(x), args.warmup, args.reps, device)
            proj = timeit(lambda: mlp1(pixel_shuffle(feats, gh, gh, cfg.merge)), args.warmup, args.reps, device)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        f = flops_per_tile(cfg, n_prefix)
        med, med_enc, med_proj = statistics.median(total), statistics.median(enc), statistics.median(proj)
        tf = T * f["total"] / (med * 1e-3) / 1e12
        rows.append({
            "tiles": T, "ms_median": med, "ms_min": min(total), "ms_max": max(total),
            "encoder_ms_median": med_enc, "shuffle_mlp1_ms_median": med_proj,
            "tiles_per_s": T / (med * 1e-3), "image_tokens": T * cfg.tokens_per_tile,
            "gflop": T * f["total"] / 1e9, "tflops": tf, "fraction_of_matmul_rate": tf / tflops_mm,
            "encoder_tflops": T * f["encoder"] / (med_enc * 1e-3) / 1e12,
            "mlp1_tflops": T * f["projector"] / (med_proj * 1e-3) / 1e12,
            "floor_ms_at_matmul_rate": T * f["total"] / (tflops_mm * 1e12) * 1e3,
            "peak_mem_gib": peak,
        })

    info = {
        "benchmark": "bench_vision", "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "triton": _triton_version(), "dtype": "bfloat16",
        "config": {"width": cfg.hidden_size, "depth": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
                   "patch": cfg.patch_size, "tile": cfg.image_size, "n_prefix": n_prefix,
                   "projector_hidden": cfg.projector_hidden_size, "lm_width": cfg.projector_output_size},
        "params": params, "warmup": args.warmup, "reps": args.reps,
        "matmul_bf16_tflops": tflops_mm, "matmul_n": mm_n,
        "check_bf16_vs_fp32_rel_err_1_tile": rel, "check_finite": finite,
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_vision.json"), "w") as fh:
        json.dump(info, fh, indent=1)

    print(f"# {info['device']}  torch {info['torch']}  triton {info['triton']}  bf16  params {params / 1e6:.1f} M")
    print(f"# bf16 matmul {mm_n}^3: {tflops_mm:.0f} TFLOP/s;  "
          f"bf16 vs fp32 on one tile: rel err {rel:.2e}, finite {finite}")
    print("| tiles | image tokens | median ms (min-max) | encoder ms | shuffle+mlp1 ms | tiles/s | GFLOP | TFLOP/s | "
          "of matmul rate | floor ms | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tiles']} | {r['image_tokens']} | {r['ms_median']:.2f} ({r['ms_min']:.2f}-{r['ms_max']:.2f}) | "
              f"{r['encoder_ms_median']:.2f} | {r['shuffle_mlp1_ms_median']:.2f} | {r['tiles_per_s']:.0f} | "
              f"{r['gflop']:.1f} | {r['tflops']:.0f} | {100 * r['fraction_of_matmul_rate']:.0f}% | "
              f"{r['floor_ms_at_matmul_rate']:.2f} | {r['peak_mem_gib']:.2f} |")
    return 0 if finite else 1


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
