"""Probe: our SSD scan's launch settings on a GPU (forward and forward + backward), each checked first.

    python dev/probes/ssd_tune.py OUT_DIR [--fwd JSON_LIST] [--bwd JSON_LIST] [--budget S] [--fwd-share F]
                                  [--shapes 2x320,4x160] [--mixed 1]

Each setting runs in a worker process (a fault such as an illegal memory access costs only that worker;
the driver starts a new one at the next setting). Rows go to OUT_DIR/ssd_tune.jsonl as they come:
forward: relative RMS error of y and the final state against the float64 chunked scan at 1x4096, then
do_bench medians at the four shapes, with the kernel's registers / spills / shared memory; backward
(BWD_CONFIG settings): the error of every gradient against float64 autograd at 1x2048, then forward +
backward medians at the four shapes. The 12B layer's sizes: H 128, P 80, N 128, G 8, bf16, D, dt_bias,
softplus. The forward settings stop at F (0.45) of the budget when backward ones follow. ``--shapes``: other
batch x length shapes to time (a mixed pass's chunk: 2 rows of 320 tokens at 100 one-tile agents); ``--mixed 1``:
the forward as a mixed pass calls it, with the gate z and an initial state (bf16 rows, as the engine keeps
them). A research probe: the benchmark of record is benchmarks/bench_ssd.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

H, P, N, G = 128, 80, 128, 8
SHAPES = [(1, 4096), (1, 16384), (4, 8192), (8, 16384)]


MIXED = False   # --mixed 1: with z and an initial state


def inputs(b, l, seed=0, grad=False):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    kw = dict(x=r(b, l, H, P).bfloat16(), dt=(r(b, l, H) * 0.5 - 1.0).bfloat16(),
              A=-torch.rand(H, generator=g, device="cuda") * 4 - 0.5, B=r(b, l, G, N).bfloat16(),
              C=r(b, l, G, N).bfloat16(), D=r(H), dt_bias=r(H) * 0.1)
    if MIXED:
        kw.update(z=r(b, l, H, P).bfloat16(), initial_state=r(b, H, P, N).bfloat16().float())
    if grad:
        for k in kw:
            kw[k] = kw[k].detach().requires_grad_()
    return kw


def call(kw, backend):
    from holotron.kernels import ssd_scan

    return ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], D=kw["D"], dt_bias=kw["dt_bias"],
                    dt_softplus=True, chunk_size=128, backend=backend, z=kw.get("z"),
                    initial_state=kw.get("initial_state"))


def rel(a, b):
    a, b = a.double(), b.double()
    return float(((a - b).pow(2).mean() / b.pow(2).mean().clamp_min(1e-30)).sqrt())


def worker(kind, cfgs, out):
    import torch
    import triton.testing as tt

    from holotron.kernels import ssd_triton_scan as TS

    if kind == "fwd":
        TB = SimpleNamespace(BWD_CONFIG={}, LAST_KERNEL={})
    else:
        from holotron.kernels import ssd_triton_backward as TB

    def kern_info(d):
        return {k: dict(regs=getattr(v, "n_regs", None), spills=getattr(v, "n_spills", None),
                        shared=getattr(getattr(v, "metadata", None), "shared", None)) for k, v in d.items()}

    if kind == "fwd":
        kw = inputs(1, 4096)
        k64 = {k: v.double() for k, v in kw.items()}
        ref_y, ref_s = call(k64, "chunked")
    else:
        kw = inputs(1, 2048, grad=True)
        k64 = {k: v.detach().double().requires_grad_() for k, v in kw.items()}
        dy = torch.randn(kw["x"].shape, device="cuda").bfloat16()
        y, _ = call(k64, "chunked")
        ref = torch.autograd.grad(y, list(k64.values()), dy.double())
    base_s, base_b = dict(TS.SCAN_CONFIG), dict(TB.BWD_CONFIG)
    for cfg in cfgs:
        TS.SCAN_CONFIG.update(base_s)
        TB.BWD_CONFIG.update(base_b)
        row = dict(kind=kind, cfg=cfg)
        print("start", json.dumps(row), flush=True)
        if kind == "fwd":
            TS.SCAN_CONFIG.update(cfg)
        else:  # "scan": the forward's settings under this backward
            TB.BWD_CONFIG.update({k: v for k, v in cfg.items() if k != "scan"})
            TS.SCAN_CONFIG.update(cfg.get("scan", {}))
        t0 = time.time()
        if kind == "fwd":
            y, s = call(kw, "triton")
            torch.cuda.synchronize()
            row["first_s"] = time.time() - t0
            row["err"] = dict(y=rel(y, ref_y), state=rel(s, ref_s))
            row["kernels"] = kern_info(TS.LAST_KERNEL)
            ok = max(row["err"].values()) < 1e-2
        else:
            y, _ = call(kw, "triton")
            gr = torch.autograd.grad(y, list(kw.values()), dy)
            torch.cuda.synchronize()
            row["first_s"] = time.time() - t0
            row["err"] = {k: rel(a, b) for k, a, b in zip(kw, gr, ref)}
            row["kernels"] = kern_info(TB.LAST_KERNEL)
            ok = all(e == e and e < 5e-2 for e in row["err"].values())
        row["ok"] = ok
        if ok:
            row["ms"] = {}
            for b, l in SHAPES:
                k2 = inputs(b, l, grad=kind != "fwd")
                if kind == "fwd":
                    f = lambda: call(k2, "triton")  # noqa: E731
                else:
                    d2 = torch.randn(k2["x"].shape, device="cuda").bfloat16()
                    f = lambda: torch.autograd.grad(call(k2, "triton")[0], list(k2.values()), d2)  # noqa: E731
                row["ms"][f"{b}x{l}"] = tt.do_bench(f, warmup=5, rep=30, return_mode="median")
                del k2
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)


def _shapes(arg):
    return [tuple(int(v) for v in s.split("x")) for s in arg.split(",")]


def main():
    global SHAPES, MIXED
    if sys.argv[1] == "--worker":
        kind, cfgs, path = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
        SHAPES, MIXED = _shapes(sys.argv[5]), sys.argv[6] == "1"
        with open(path, "a") as out:
            worker(kind, cfgs, out)
        return
    out_dir = sys.argv[1]
    args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    budget = float(args.get("--budget", 400))
    shapes, mixed = args.get("--shapes", ",".join(f"{b}x{l}" for b, l in SHAPES)), args.get("--mixed", "0")
    fwd = json.loads(args.get("--fwd", "[]"))
    bwd = json.loads(args.get("--bwd", "[]"))
    path = os.path.join(out_dir, "ssd_tune.jsonl")
    t0 = time.time()
    share = float(args.get("--fwd-share", 0.45)) if bwd else 1.0  # the forward's part of the budget
    for kind, cfgs in (("fwd", fwd), ("bwd", bwd)):
        todo = list(cfgs)
        t_end = t0 + (budget * share if kind == "fwd" else budget)
        while todo and time.time() < t_end:
            n0 = sum(1 for _ in open(path)) if os.path.exists(path) else 0
            try:
                subprocess.run([sys.executable, __file__, "--worker", kind, json.dumps(todo), path, shapes, mixed],
                               timeout=max(5.0, t_end - time.time()))
            except subprocess.TimeoutExpired:
                print("# budget spent", flush=True)
                break
            done = (sum(1 for _ in open(path)) if os.path.exists(path) else 0) - n0
            if done < len(todo):  # the worker died at todo[done]
                with open(path, "a") as f:
                    f.write(json.dumps(dict(kind=kind, cfg=todo[done], ok=False, crashed=True)) + "\n")
                todo = todo[done + 1:]
            else:
                todo = []
    rows = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
    for r in rows:
        ms = " ".join(f"{v:7.3f}" for v in r.get("ms", {}).values())
        kern = " ".join(f"{k}:{v['regs']}r/{v['spills']}s/{v['shared']}B" for k, v in r.get("kernels", {}).items())
        err = max(r["err"].values()) if r.get("err") else float("nan")
        print(f"{r['kind']} {json.dumps(r['cfg']):60s} ok={r['ok']} err={err:.2e} first={r.get('first_s', 0):5.1f}s "
              f"{ms} {kern}")


if __name__ == "__main__":
    main()
