"""The decode step's Mamba2 kernels at a decode batch: the SSD step (``STEP_CONFIG``) and the conv window
(``CONV_CONFIG``) at several launch settings, timed in CUDA graphs over per-layer states (no L2 reuse), GB/s
against a device copy of the same run. Each setting is checked against the first (default) one.

    PYTHONPATH=. python3 dev/probes/step_sweep.py [--batch 128] [--out DIR]"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from holotron.config import TextConfig
from holotron.kernels import conv_step, ssd_step
from holotron.kernels import conv_step_triton as CS
from holotron.kernels import ssd_triton_step as TS


def graph_ms(fns):
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return do_bench(g.replay, warmup=5, rep=40, return_mode="median") / len(fns)


def copy_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * (1 << 30) / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    cfg = TextConfig()
    b, H, P, N, G = a.batch, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups
    dev = "cuda"
    copy = copy_gbs()
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(b, H, P, device=dev, dtype=torch.bfloat16, generator=g)
    z = torch.randn(b, H, P, device=dev, dtype=torch.bfloat16, generator=g)
    dt = torch.randn(b, H, device=dev, dtype=torch.bfloat16, generator=g)
    B = torch.randn(b, G, N, device=dev, dtype=torch.bfloat16, generator=g)
    C = torch.randn(b, G, N, device=dev, dtype=torch.bfloat16, generator=g)
    A = -torch.rand(H, device=dev) - 0.5
    D = torch.randn(H, device=dev)
    bias = torch.randn(H, device=dev)
    out = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               copy_gbs=copy, batch=b, step=[], conv=[])
    default_step, default_conv = dict(TS.STEP_CONFIG), dict(CS.CONV_CONFIG)
    for sdt in (torch.float32, torch.bfloat16):
        states = [torch.randn(b, H, P, N, device=dev, generator=g).to(sdt) for _ in range(a.layers)]
        nbytes = 2 * states[0].numel() * sdt.itemsize
        pristine = states[0].clone()  # the timing runs update the states: each check starts from this copy
        ref = None
        for bp in (None, 8, 32):
            for wp in (2, 4, 8):
                for stream in (False, True):
                    TS.STEP_CONFIG.update(BLOCK_P=bp, num_warps=wp, stream=stream)
                    s0 = pristine.clone()
                    y = ssd_step(s0, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, backend="triton")
                    if ref is None:
                        ref = (y.float(), s0.float())
                    err = max((y.float() - ref[0]).abs().max().item(), (s0.float() - ref[1]).abs().max().item())
                    fns = [lambda st=st: ssd_step(st, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True,
                                                  backend="triton") for st in states]
                    ms = graph_ms(fns)
                    r = dict(state=str(sdt), BLOCK_P=bp, num_warps=wp, stream=stream, us=ms * 1e3, err=err,
                             pct=nbytes / ms / 1e6 / copy)
                    out["step"].append(r)
                    print(r, flush=True)
        TS.STEP_CONFIG.clear()
        TS.STEP_CONFIG.update(default_step)
        del states
    c = cfg.mamba_d_inner + 2 * G * N
    convs = [torch.randn(b, c, cfg.conv_kernel, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(a.layers)]
    xc = torch.randn(b, c, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(c, cfg.conv_kernel, device=dev, dtype=torch.bfloat16, generator=g)
    cb = torch.randn(c, device=dev, dtype=torch.bfloat16, generator=g)
    nbytes = 2 * convs[0].numel() * 2 + 2 * xc.numel() * 2
    pristine = convs[0].clone()
    ref = None
    for bc in (128, 256, 512, 1024):
        for wp in (2, 4, 8):
            CS.CONV_CONFIG.update(BLOCK_C=bc, num_warps=wp)
            c0 = pristine.clone()
            y = conv_step(c0, xc, w, cb)
            if ref is None:
                ref = (y.float(), c0.float())
            err = max((y.float() - ref[0]).abs().max().item(), (c0.float() - ref[1]).abs().max().item())
            ms = graph_ms([lambda cv=cv: conv_step(cv, xc, w, cb) for cv in convs])
            r = dict(BLOCK_C=bc, num_warps=wp, us=ms * 1e3, err=err, pct=nbytes / ms / 1e6 / copy)
            out["conv"].append(r)
            print(r, flush=True)
    CS.CONV_CONFIG.update(default_conv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "step_sweep.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"\ncopy {copy:,.0f} GB/s, batch {b}; us per layer (% of copy in bytes moved)")
    for key in ("step", "conv"):
        for r in sorted(out[key], key=lambda r: (r.get("state", ""), r["us"]))[:12]:
            print(f"  {key} {r}")


if __name__ == "__main__":
    main()
