"""The decode step's linear layers at the 12B's shapes: torch bf16, torch FP8 (_scaled_mm), our Triton GEMV.

    PYTHONPATH=. python3 benchmarks/bench_gemv.py [--out DIR] [--sweep-budget 60]

For each linear shape of the 12B LM (holotron/config.py's TextConfig defaults) and M in {1, 8, 16, 32, 128}
rows: ``F.linear`` with bf16 weights (cuBLAS), ``torch._scaled_mm`` with float8_e4m3fn weights and row-wise
scales (x quantised beforehand, outside the timing: a lower bound on torch's FP8 path), the Triton GEMV of
holotron/kernels/gemv_triton.py with bf16 and with FP8 weights (M <= 16) at its shape-picked launch settings;
then a sweep of the GEMV's launch settings at M = 1 (best kept per shape, within a time budget: what
``gemv_triton.pick_config``'s rule was set from) and the decode step's fused forms (norm, group-norm kernel,
relu^2, residual) at the best settings. Above 16 rows our product is the skinny one of
holotron/kernels/skinny_mm_triton.py: benchmarks/bench_mm.py measures it. Time:
``triton.testing.do_bench`` median of a CUDA graph of 16 calls cycling through copies of the weight (at least
256 MB, or 8 copies, so the L2 cache does not hold them), per call: kernel time without Python's launch
overhead, as in the decode engine's graphs (``triton_fp8_eager`` in the JSON: one eager call). GB/s: weight
bytes / time (the weight is read once per call; x and y are small). Floor: a device-to-device copy of a 1 GB
tensor in the same run (2 GB moved per copy). Last, a whole-LM estimate at M = 1: the sum over the 12B's
layers (28 Mamba, 28 MLP, 6 attention, lm_head). Prints a table last; JSON to ``$OUT/bench_gemv.json``."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from holotron.config import TextConfig
from holotron.kernels import gemv_triton
from holotron.quant import gemv, quantize_weight

MS = (1, 8, 16, 32, 128)


def shapes(cfg: TextConfig) -> dict[str, tuple[int, int]]:
    """name -> (K in, N out) of the LM's linear layers."""
    d = cfg.hidden_size
    return {"in_proj": (d, cfg.mamba_in_proj_size),
            "out_proj": (cfg.mamba_d_inner, d), "up": (d, cfg.intermediate_size), "down": (cfg.intermediate_size, d),
            "q": (d, cfg.num_attention_heads * cfg.head_dim), "k/v": (d, cfg.num_key_value_heads * cfg.head_dim),
            "o": (cfg.num_attention_heads * cfg.head_dim, d), "lm_head": (d, cfg.vocab_size)}


def per_layer(cfg: TextConfig) -> dict[str, int]:
    """How many times each shape runs in one decode step."""
    kinds = cfg.layer_kinds
    nm, na, nl = kinds.count("mamba"), kinds.count("attention"), kinds.count("mlp")
    return {"in_proj": nm, "out_proj": nm, "up": nl, "down": nl, "q": na, "k/v": 2 * na, "o": na, "lm_head": 1}


def bench(fn) -> float:
    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def gbench(fns: list, calls: int = 16) -> float:
    """ms per call of a CUDA graph that calls ``fns`` in turn (``calls`` calls, at least one of each): the
    decode engine's setting, without Python's launch overhead. Each fn reads its own weight copy, so the
    weights read within one replay exceed the L2 cache."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    n = max(calls, len(fns))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fns[i % len(fns)]()
    return bench(g.replay) / n


def copies(nbytes: int) -> int:
    return max(1, min(8, -(-256 * 2**20 // nbytes)))


def copy_gbs() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    return 2 * (1 << 30) / ms / 1e6


def sweep_configs(n: int, k: int, w_bytes: int, m: int) -> list[dict]:
    """The shape-picked settings first, then BLOCK_N x BLOCK_K (bytes of a row per step) x warps x pipeline
    stages, with the split the picker's rule gives for that BLOCK_N and half of it."""
    dev = torch.device("cuda")
    base = gemv_triton.pick_config(m, n, k, w_bytes, dev)
    sms = gemv_triton._sm_count(dev.index)
    out = []
    for bn in (16, 32, 64):
        split = 1
        while triton.cdiv(n, bn) * split < 4 * sms and split < 16:
            split *= 2
        for bk_bytes in (512, 1024):
            bk = bk_bytes // w_bytes
            if m == 1 and bk * bn > 16384:
                continue
            for sp in dict.fromkeys((split, max(1, split // 2))):
                if k // sp < 2 * bk:
                    continue
                for warps, stages in ((4, 1), (8, 1), (4, 3), (8, 3)):
                    out.append(dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT=sp, num_warps=warps, STAGES=stages))
    out = [c for c in out if c != base]
    return [base] + out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep-budget", type=float, default=60.0, help="seconds for the launch-settings sweep")
    ap.add_argument("--quick", action="store_true",
                    help="M = 1 only, no sweep: the picked settings and the fused forms at them")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = TextConfig()
    shp, count = shapes(cfg), per_layer(cfg)
    floor = copy_gbs()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"copy {floor:,.0f} GB/s", flush=True)
    rows, weights = [], {}
    has_smm = hasattr(torch, "_scaled_mm")
    for name, (k, n) in shp.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies(2 * n * k))]
        qs = [quantize_weight(w) for w in ws]
        weights[name] = (ws, qs)
        for m in (1,) if a.quick else MS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r = dict(shape=name, K=k, N=n, M=m)
            r["torch_bf16"] = gbench([lambda w=w: F.linear(x, w) for w in ws])
            if has_smm:
                xs = (x.float().abs().amax(1, keepdim=True) / 448).clamp_min(1e-12)
                xq = (x.float() / xs).to(torch.float8_e4m3fn)
                try:
                    r["torch_fp8"] = gbench([lambda q=q, s=s: torch._scaled_mm(
                        xq, q.t(), scale_a=xs, scale_b=s[None, :], out_dtype=torch.bfloat16) for q, s in qs])
                except (RuntimeError, ValueError) as e:
                    r["torch_fp8"], r["torch_fp8_error"] = None, str(e).splitlines()[0][:160]
            if m <= 16:
                r["triton_bf16"] = gbench([lambda w=w: gemv(x, w) for w in ws])
                r["triton_fp8"] = gbench([lambda q=q, s=s: gemv(x, q, s) for q, s in qs])
                r["triton_fp8_eager"] = bench(lambda: gemv(x, *qs[0]))  # with Python's launch overhead
            for key, nbytes in (("torch_bf16", 2), ("torch_fp8", 1), ("triton_bf16", 2), ("triton_fp8", 1)):
                if r.get(key):
                    r[key + "_gbs"] = n * k * nbytes / r[key] / 1e6
            rows.append(r)
            print(r, flush=True)

    # the sweep: best launch settings at M = 1 (the batch-1 step), within the budget: every shape its share
    best, t0 = {}, time.perf_counter()
    jobs = [(1, name, lab) for name in shp for lab in ("bf16", "fp8")]
    for i, (m, name, label) in enumerate([] if a.quick else jobs):
        k, n = shp[name]
        ws, qs = weights[name]
        args_ = [(w, None) for w in ws] if label == "bf16" else qs
        share = t0 + a.sweep_budget * (i + 1) / len(jobs)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        found = None
        for c in sweep_configs(n, k, args_[0][0].element_size(), m):
            if time.perf_counter() > share and found is not None:
                break
            t = gbench([lambda wt=wt, sc=sc, c=c: gemv(x, wt, sc, config=c) for wt, sc in args_])
            if found is None or t < found[0]:
                found = (t, c)
        best[f"{name}/{label}/{m}"] = dict(ms=found[0], config=found[1], N=n, K=k,
                                           w_bytes=args_[0][0].element_size(),
                                           gbs=n * k * args_[0][0].element_size() / found[0] / 1e6)
        print(f"  sweep {name}/{label}/{m}: {found[0]:.4f} ms {found[1]}", flush=True)

    if a.quick:  # the picked settings stand in for the best
        for name, (k, n) in shp.items():
            r1 = next(r for r in rows if r["shape"] == name and r["M"] == 1)
            for label, wb in (("bf16", 2), ("fp8", 1)):
                best[f"{name}/{label}/1"] = dict(ms=r1[f"triton_{label}"], N=n, K=k, w_bytes=wb,
                                                 config=gemv_triton.pick_config(1, n, k, wb, torch.device("cuda")),
                                                 gbs=r1[f"triton_{label}_gbs"])

    # the decode step's fused forms at the best settings, M = 1: what the norm / residual / act cost
    fused = {"in_proj": dict(norm=True), "up": dict(norm=True, act="relu2"), "q": dict(norm=True),
             "k/v": dict(norm=True), "lm_head": dict(norm=True), "out_proj": dict(group_norm=True, res=True),
             "down": dict(res=True), "o": dict(res=True)}
    from holotron.kernels.group_norm_triton import group_rms_norm_triton
    for name, f in fused.items():
        k, n = shp[name]
        ws, qs = weights[name]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        g = torch.rand(k, device="cuda") + 0.5
        r = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
        for label, args_ in (("bf16", [(w, None) for w in ws]), ("fp8", qs)):
            c = best[f"{name}/{label}/1"]["config"]
            kw = dict(norm=g if f.get("norm") else None, act=f.get("act"), residual=r if f.get("res") else None)
            if f.get("group_norm"):  # Mamba2's group norm in its own kernel, then the GEMV with the residual
                def call(wt, sc, c=c, kw=kw):
                    return gemv(group_rms_norm_triton(x, g, cfg.n_groups, 1e-5), wt, sc, config=c, **kw)
            else:
                def call(wt, sc, c=c, kw=kw):
                    return gemv(x, wt, sc, config=c, **kw)
            t = gbench([lambda wt=wt, sc=sc, call=call: call(wt, sc) for wt, sc in args_])
            best[f"{name}/{label}/1/fused"] = dict(ms=t, plain_ms=best[f"{name}/{label}/1"]["ms"], what=sorted(f))

    # whole-LM estimate at M = 1
    one = {r["shape"]: r for r in rows if r["M"] == 1}
    est = {}
    for key in ("torch_bf16", "torch_fp8", "triton_bf16", "triton_fp8"):
        if all(one[nm].get(key) for nm in shp):
            est[key] = sum(count[nm] * one[nm][key] for nm in shp)
    est["triton_fp8_lm_head_bf16"] = est["triton_fp8"] - one["lm_head"]["triton_fp8"] + one["lm_head"]["triton_bf16"]
    for lab in ("bf16", "fp8"):
        if all(f"{nm}/{lab}/1" in best for nm in shp):
            est[f"triton_{lab}_best_of_sweep"] = sum(count[nm] * best[f"{nm}/{lab}/1"]["ms"] for nm in shp)
    wbytes = sum(count[nm] * shp[nm][0] * shp[nm][1] for nm in shp)
    est["floor_bf16_ms"] = 2 * wbytes / floor / 1e6
    est["floor_fp8_ms"] = wbytes / floor / 1e6
    est["floor_fp8_lm_head_bf16_ms"] = (wbytes + shp["lm_head"][0] * shp["lm_head"][1]) / floor / 1e6

    res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, copy_gbs=floor, rows=rows, sweep_best=best,
               step_estimate_ms=est,
               layer_counts=count, weight_params=wbytes)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench_gemv.json").write_text(json.dumps(res, indent=1) + "\n")

    def f(v, w=7):
        return f"{v:{w}.4f}" if v else " " * (w - 1) + "-"

    def pct(r, key):
        return f"{r[key + '_gbs'] / floor:4.0%}" if r.get(key) else "   -"

    print(f"\ncopy floor {floor:,.0f} GB/s; ms (median) and fraction of copy bandwidth in weight bytes")
    print(f"{'shape':>8} {'K':>6} {'N':>6} {'M':>4} | {'bf16':>7} {'%':>4} | {'smm fp8':>7} {'%':>4} | "
          f"{'tri bf16':>8} {'%':>4} | {'tri fp8':>7} {'%':>4}")
    for r in rows:
        print(f"{r['shape']:>8} {r['K']:>6} {r['N']:>6} {r['M']:>4} | {f(r['torch_bf16'])} {pct(r, 'torch_bf16')} | "
              f"{f(r.get('torch_fp8'))} {pct(r, 'torch_fp8')} | {f(r.get('triton_bf16'), 8)} "
              f"{pct(r, 'triton_bf16')} | {f(r.get('triton_fp8'))} {pct(r, 'triton_fp8')}")
    print("\nbest of sweep (ms, % of copy); fused: the decode step's form at those settings:")
    for key, b in best.items():
        if key.endswith("/fused"):
            print(f"  {key:>24} {b['ms']:.4f} (plain {b['plain_ms']:.4f}) {b['what']}")
        else:
            print(f"  {key:>24} {b['ms']:.4f} {b['gbs'] / floor:4.0%} {b['config']}")
    print("\none decode step's linear layers at M = 1, ms:")
    for key, v in est.items():
        print(f"  {key:>28} {v:.3f}")


if __name__ == "__main__":
    main()
