"""The decode batches' matrix products at the 12B's shapes: cuBLAS (bf16), torch._scaled_mm (FP8) and our
skinny product (holotron/kernels/skinny_mm_triton.py, bf16 and FP8 weights), side by side.

    PYTHONPATH=. python3 benchmarks/bench_mm.py [--rows 8,32,64,128,256] [--sweep-rows 128] [--budget 240]

First a sweep of the skinny product's launch settings at ``--sweep-rows`` (every shape and weight kind its
share of ``--budget`` seconds; staged: tile shape, then stages / warps, then the K split and FP8's
accumulator promotion), each setting checked against torch's product before it is timed; then, at every
``--rows``, each product at the settings ``pick`` gives, and at 128 rows the decode step's fused forms (relu^2,
residual add) against torch's product followed by the same ops. Time: a CUDA graph of 16 calls cycling
through copies of the weight (benchmarks/bench_gemv.py's ``gbench``: the L2 cache does not hold them), per
call. % = weight bytes / time against a device-to-device copy measured in the same run. Last, one decode
step's linear layers (28 Mamba, 28 MLP, 6 attention, lm_head) summed per row count. JSON to
``$OUT/bench_mm.json``; a table last."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_gemv import copies, copy_gbs, gbench, per_layer, shapes  # noqa: E402

from holotron.config import TextConfig  # noqa: E402
from holotron.kernels import skinny_mm_triton as SM  # noqa: E402
from holotron.quant import quantize_rows, quantize_weight  # noqa: E402

FP8 = torch.float8_e4m3fn


def stages_of_sweep(kind: str):
    """The staged sweep's candidate overrides: (stage, [tile dicts])."""
    bks = (64, 128) if kind == "16bit" else (128, 256)
    yield "tile", [dict(BLOCK_N=bn, BLOCK_K=bk) for bn in (64, 128, 256) for bk in bks]
    yield "pipeline", [dict(STAGES=st, num_warps=wp) for st in (3, 4, 5, 6) for wp in (4, 8)]
    yield "split", ["split-1", "split+1", dict(SPLIT=1), dict(BLOCK_M=64)] + \
        ([dict(ACC_K=32)] if kind == "fp8" else []) + [dict(TMA=False)]


def operands(name, k, n, m, kind, weights):
    ws, qs = weights[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if kind == "16bit":
        return [(x, w, None, None) for w in ws]
    xq, xs = quantize_rows(x)
    return [(xq, q, xs, s) for q, s in qs]


def check(ops, cfg, act=None, residual=None) -> float:
    """Largest error of the skinny product at ``cfg`` against torch's fp32 product, relative to its largest value."""
    x, w, xs, ws = ops[0]
    y = SM.skinny_mm(x, w, xs, ws, residual=residual, act=act, config=cfg).float()
    ref = x.float() @ w.float().T
    if xs is not None:
        ref = ref * xs.reshape(-1, 1) * ws[None, :]
    if act == "relu2":
        ref = ref.clamp_min(0) ** 2
    if residual is not None:
        ref = ref + residual.float()
    return ((y - ref).abs().max() / ref.abs().max()).item()


def time_mm(ops, cfg, **kw) -> float:
    return gbench([lambda o=o: SM.skinny_mm(*o, config=cfg, **kw) for o in ops])


def sweep(name, k, n, m, kind, weights, deadline, listed=None):
    """Best settings of the skinny product for one shape and weight kind within ``deadline``: the staged sweep,
    or the ``listed`` overrides (each at the picked split and unsplit)."""
    ops = operands(name, k, n, m, kind, weights)
    dt = torch.bfloat16 if kind == "16bit" else FP8
    dev = torch.device("cuda")
    picked = SM.pick(m, n, k, dt, dev)
    tried, best = [], None

    def run(over):
        nonlocal best
        cfg = SM.pick(m, n, k, dt, dev, over)
        key = json.dumps(cfg, sort_keys=True)
        if key in {t["key"] for t in tried}:
            return
        r = dict(key=key, config=cfg)
        try:
            r["err"] = check(ops, cfg)
            if r["err"] > 2e-2:
                r["why"] = "wrong"
            else:
                r["ms"] = time_mm(ops, cfg)
        except Exception as e:  # noqa: BLE001 - a setting that does not compile or launch (shared memory)
            r["why"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        tried.append(r)
        if r.get("ms") and (best is None or r["ms"] < best["ms"]):
            best = r

    run({})
    for o in listed or []:
        over = o.get(kind, o.get("all"))
        for sp in ({}, dict(SPLIT=1)):
            if over is not None and time.perf_counter() < deadline:
                run({**over, **sp})
    if listed:
        return dict(picked=picked, picked_ms=tried[0].get("ms"), best=best, tried=tried)
    base, keep = {}, {"tile": ("BLOCK_N", "BLOCK_K"), "pipeline": ("STAGES", "num_warps"), "split": ()}
    for stage, overs in stages_of_sweep(kind):
        for o in overs:
            if time.perf_counter() > deadline and best is not None:
                break
            if o in ("split-1", "split+1"):  # around the split the picker gave the best settings so far
                s = best["config"]["SPLIT"] + (1 if o == "split+1" else -1) if best else 0
                if s < 1:
                    continue
                o = dict(SPLIT=s)
            run({**base, **o})
        if best is not None:  # the next stage starts from the best so far
            base.update({kk: best["config"][kk] for kk in keep[stage]})
    pick_ms = tried[0].get("ms")
    return dict(picked=picked, picked_ms=pick_ms, best=best, tried=tried)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rows", default="8,32,64,128,256")
    ap.add_argument("--sweep-rows", default="128", help="row counts swept ('' for none)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the sweep")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    ap.add_argument("--configs", default="", help='JSON list of {"16bit": {...}} / {"fp8": {...}} / {"all": {...}} '
                    "overrides to sweep instead of the staged sweep")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = TextConfig()
    shp, count = shapes(cfg), per_layer(cfg)
    if a.shapes:
        shp = {s: shp[s] for s in a.shapes.split(",")}
    floor = copy_gbs()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"copy {floor:,.0f} GB/s", flush=True)
    weights = {}
    for name, (k, n) in shp.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies(2 * n * k))]
        weights[name] = (ws, [quantize_weight(w) for w in ws])

    swept, t0 = {}, time.perf_counter()
    jobs = [(m, name, kind) for m in (int(v) for v in a.sweep_rows.split(",") if v) for name in shp
            for kind in ("16bit", "fp8")]
    for i, (m, name, kind) in enumerate(jobs):
        k, n = shp[name]
        r = sweep(name, k, n, m, kind, weights, t0 + a.budget * (i + 1) / len(jobs),
                  json.loads(a.configs) if a.configs else None)
        swept[f"{name}/{kind}/{m}"] = r
        b = r["best"] or {}
        el = 2 if kind == "16bit" else 1
        print(f"  sweep {name}/{kind}/{m}: picked {r['picked_ms'] or 0:.4f} ms, best {b.get('ms', 0):.4f} ms "
              f"({n * k * el / b.get('ms', 1e9) / 1e6 / floor:4.0%}) {b.get('config')} ({len(r['tried'])} tried)",
              flush=True)

    rows = []
    for name, (k, n) in shp.items():
        ws, qs = weights[name]
        for m in (int(v) for v in a.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = quantize_rows(x)
            r = dict(shape=name, K=k, N=n, M=m)
            r["torch_bf16"] = gbench([lambda w=w: F.linear(x, w) for w in ws])
            r["torch_fp8"] = gbench([lambda q=q, s=s: torch._scaled_mm(
                xq, q.t(), scale_a=xs, scale_b=s[None, :], out_dtype=torch.bfloat16) for q, s in qs])
            r["ours_bf16_err"] = check([(x, ws[0], None, None)], None)
            r["ours_bf16"] = time_mm([(x, w, None, None) for w in ws], None)
            r["ours_fp8_err"] = check([(xq, qs[0][0], xs, qs[0][1])], None)
            r["ours_fp8"] = time_mm([(xq, q, xs, s) for q, s in qs], None)
            r["ours_fp8_acc32"] = time_mm([(xq, q, xs, s) for q, s in qs], dict(ACC_K=32))
            for key, el in (("torch_bf16", 2), ("torch_fp8", 1), ("ours_bf16", 2), ("ours_fp8", 1),
                            ("ours_fp8_acc32", 1)):
                r[key + "_pct"] = n * k * el / r[key] / 1e6 / floor
            if m == 128:  # the fused forms: relu^2 (up), the residual add (down, out_proj, o)
                res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                r["torch_bf16_relu2"] = gbench([lambda w=w: F.relu(F.linear(x, w)).square() for w in ws])
                r["ours_bf16_relu2"] = time_mm([(x, w, None, None) for w in ws], None, act="relu2")
                r["torch_bf16_residual"] = gbench([lambda w=w: res + F.linear(x, w) for w in ws])
                r["ours_bf16_residual"] = time_mm([(x, w, None, None) for w in ws], None, residual=res)
                r["ours_fused_err"] = max(check([(x, ws[0], None, None)], None, act="relu2"),
                                          check([(x, ws[0], None, None)], None, residual=res))
            rows.append(r)
            print({kk: (round(v, 5) if isinstance(v, float) else v) for kk, v in r.items()}, flush=True)

    est = {}
    for m in (int(v) for v in a.rows.split(",")):
        for key in ("torch_bf16", "torch_fp8", "ours_bf16", "ours_fp8", "ours_fp8_acc32"):
            est[f"{key}/{m}"] = sum(count[r["shape"]] * r[key] for r in rows if r["M"] == m)
    res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, copy_gbs=floor, sweep=swept, rows=rows, step_sum_ms=est,
               mm_config=SM.MM_CONFIG, layer_counts=count)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench_mm.json").write_text(json.dumps(res, indent=1) + "\n")

    print(f"\ncopy {floor:,.0f} GB/s; ms per call (% of copy bandwidth in weight bytes)")
    print(f"{'shape':>8} {'M':>4} | {'cuBLAS bf16':>14} | {'ours bf16':>14} | {'_scaled_mm':>14} | {'ours fp8':>14} |"
          f" {'fp8 acc 32':>14}")
    for r in rows:
        cell = lambda key: f"{r[key]:.4f} ({r[key + '_pct']:4.0%})"  # noqa: E731
        print(f"{r['shape']:>8} {r['M']:>4} | {cell('torch_bf16')} | {cell('ours_bf16')} | {cell('torch_fp8')} | "
              f"{cell('ours_fp8')} | {cell('ours_fp8_acc32')}")
    print("\none decode step's products, ms:")
    for key, v in est.items():
        print(f"  {key:>22} {v:.3f}")


if __name__ == "__main__":
    main()
