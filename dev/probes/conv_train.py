"""Probe: the training path's causal depthwise conv, forward + backward, F.conv1d against K shifted multiply-adds
(``CONV_CONFIG["shift"]``, holotron/kernels/conv_naive.py), on a GPU, at the shapes training meets:

    tiny     the tiny model's ground stage: 32 screens x 1,345 tokens, 768 channels, fp32 weights under bf16
             autocast (holotron.train on CUDA)
    12b      the 12B model's training step: 1 x 4,096 tokens, 12,288 channels, bf16 weights and inputs
             (benchmarks/bench_train_step.py)

Each case: the outputs and gradients of both forms compared, then CUDA-event medians of forward + backward; also
the shifted form through ``torch.compile`` (one fused kernel each way: what a compiled training step would get).

    python dev/probes/conv_train.py [OUT_DIR]      # JSON to OUT_DIR/conv_train.json
    python dev/probes/conv_train.py --smoke        # tiny shapes on the CPU (a check of the probe itself)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from holotron.kernels import conv_naive, conv_seq

CASES = {"tiny": dict(b=32, t=1345, c=768, weights=torch.float32, autocast=True),
         "12b": dict(b=1, t=4096, c=12288, weights=torch.bfloat16, autocast=False)}


def run_case(b, t, c, weights, autocast, reps=50, dev="cuda") -> dict:
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(b, t, c, device=dev, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(c, 4, device=dev, generator=g) * 0.5).to(weights).requires_grad_()
    bias = torch.randn(c, device=dev, generator=g).to(weights).requires_grad_()
    gy = torch.randn(b, t, c, device=dev, generator=g).bfloat16()
    out = {}
    res = {}
    plain = conv_naive._shifted
    for shift in (False, True, "compiled"):
        conv_naive.CONV_CONFIG["shift"] = bool(shift)
        conv_naive._shifted = torch.compile(plain) if shift == "compiled" else plain

        def step():
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
                y = conv_seq(x, None, w, bias)
            return y, torch.autograd.grad(y, (x, w, bias), gy)

        y, grads = step()
        res[shift] = [y.detach().float(), *(v.float() for v in grads)]
        for _ in range(3):
            step()
        times = []
        for _ in range(reps):
            if dev == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                step()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                step()
                times.append(1e3 * (time.perf_counter() - t0))
        name = {False: "conv1d", True: "shift", "compiled": "shift_compiled"}[shift]
        out[name] = {"ms": statistics.median(times), "ms_min": min(times)}
    conv_naive.CONV_CONFIG["shift"] = False
    conv_naive._shifted = plain
    out["rel_diff"] = {f"{v} {k}": float((a - r).norm() / r.norm().clamp_min(1e-30))
                       for v in (True, "compiled")
                       for k, a, r in zip(("y", "dx", "dweight", "dbias"), res[v], res[False])}
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    smoke = "--smoke" in argv
    argv = [a for a in argv if a != "--smoke"]
    res = {"device": "cpu (smoke)" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, case in CASES.items():
        if smoke:
            case = dict(case, b=2, t=37, c=24)
        res[name] = run_case(**case, reps=3 if smoke else 50, dev="cpu" if smoke else "cuda")
        r = res[name]
        print(f"{name}: conv1d {r['conv1d']['ms']:.3f} ms, shift {r['shift']['ms']:.3f} ms, compiled shift "
              f"{r['shift_compiled']['ms']:.3f} ms (forward + backward); relative differences "
              f"{', '.join(f'{k} {v:.1e}' for k, v in r['rel_diff'].items())}", flush=True)
    if argv:
        Path(argv[0]).mkdir(parents=True, exist_ok=True)
        (Path(argv[0]) / "conv_train.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
