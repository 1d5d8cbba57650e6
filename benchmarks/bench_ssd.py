"""The SSD scan and decode step on a CUDA GPU, next to the floor and a peer; prints tables, writes JSON.

    python benchmarks/bench_ssd.py [--out DIR] [--quick]      JSON to DIR/bench_ssd.json (DIR=$OUT if set)
    python benchmarks/bench_ssd.py --smoke                    one fused scan per path (a hang check)
    python benchmarks/bench_ssd.py --step-only                copy bandwidth and the decode step only
                                                              (fp32 and bf16 state; ~1 min)
    python benchmarks/bench_ssd.py --cb-compare               the fused scan with C B^T per head (default)
                                                              vs once per group (SCAN_CONFIG["cb"] True /
                                                              "half"), timed and checked against float64
    python benchmarks/bench_ssd.py --plot JSON --png FILE     the chart of time vs seqlen (CPU is fine)

Shape: the Nemotron-Nano-12B / Holotron-12B Mamba layer, H=128, P=80, N=128, G=8, chunk 128, bf16,
with D per head, dt_bias and softplus, at four (batch, seqlen) shapes (SHAPES). Times are medians of
triton.testing.do_bench (CUDA events). Ceilings measured in the same run: device copy bandwidth and
a bf16 8192^3 matmul. Floors: the fewest bytes (x, dt, B, C read once, y written once, the fp32 final
state written once; the step reads and writes its state, fp32 or bf16) at the copy bandwidth, and the
chunked algorithm's matmul FLOPs at the matmul rate.

Peer: flash-linear-attention's chunk_simple_gla (fla-core, pure Python + Triton), when importable:
the same recurrence with B, C expanded to every head, k = B dt, g = dt A, inputs prepared outside the
timing (its time has no D term). mamba_ssm is not on the GPU image; its figures (MAMBA_SSM_MS,
measured elsewhere) are quoted and labelled as such, never measured here. Baselines are benchmark-only:
never a dependency.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

H, P, N, G, Q = 128, 80, 128, 8, 128
SHAPES = [(1, 4096), (1, 16384), (4, 8192), (8, 16384)]  # the four benchmark shapes (batch, seqlen)
SWEEP_L = [1024, 2048, 4096, 8192, 16384, 32768]  # batch 1
SWEEP_B = [1, 2, 4, 8, 16]  # seqlen 4096
STEP_B = [1, 8, 64, 128]
DEVICE = "cuda"  # (a CPU dry run of the code paths may set it to "cpu")
# quoted figures for mamba_ssm 2.3.2 (measured elsewhere: H200, torch 2.11, triton 3.6), not measured here
MAMBA_SSM_MS = {(1, 4096): 0.58, (1, 16384): 1.56, (4, 8192): 3.28, (8, 16384): 13.6}  # 1x4096: 0.50-0.66
MAMBA_SSM_STEP_US = {1: 5.2, 8: 25.5, 64: 190.0, 128: 412.0}  # selective_state_update in a CUDA graph


def inputs(b, l, dtype, dev, seed=0):
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    return dict(
        x=r(b, l, H, P).to(dtype), dt=(r(b, l, H) - 1).to(dtype), A=-torch.rand(H, device=dev, generator=g) - 0.5,
        B=(r(b, l, G, N) / N**0.5).to(dtype), C=r(b, l, G, N).to(dtype),
        D=r(H), dt_bias=r(H) * 0.5,
    )


def scan_bytes(b, l):
    return 2 * (2 * b * l * H * P + b * l * H + 2 * b * l * G * N) + 4 * b * H * P * N


def scan_flops(b, l):
    """Matmul FLOPs of the chunked algorithm on full Q x Q blocks: C B^T per group, the weighted
    scores times X, the chunk states and C S_in per head."""
    nc = b * math.ceil(l / Q)
    return nc * (G * 2 * Q * Q * N + H * (2 * Q * Q * P + 2 * Q * P * N + 2 * Q * N * P))


def copy_bandwidth(dev):
    """Bytes per second of a 1 GiB device-to-device copy (read + write)."""
    import torch
    from triton.testing import do_bench
    src = torch.randn(1 << 28, device=dev)  # 1 GiB
    dst = torch.empty_like(src)
    # F821 noqa: ruff misreads a lambda over names `del`-ed after it has run (astral-sh/ruff#9858)
    t = do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3  # noqa: F821
    del src, dst
    return 2 * (1 << 28) * 4 / t


def matmul_rate(dev):
    """FLOP/s of a bf16 8192^3 matmul."""
    import torch
    from triton.testing import do_bench
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = do_bench(lambda: a @ bm, return_mode="median") * 1e-3
    return 2 * 8192**3 / t


def ceilings(dev):
    return copy_bandwidth(dev), matmul_rate(dev)


def load_fla():
    try:
        import fla
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001  (a benchmark-only peer: report and go on)
        print(f"# fla not importable ({type(e).__name__}: {e}); no peer timed")
        return None, None


def fla_args(kw):
    """chunk_simple_gla's inputs for the same recurrence (no D): q = C, k = B dt, v = x, g = dt A."""
    import torch.nn.functional as F
    dt = F.softplus(kw["dt"].float() + kw["dt_bias"])  # (b, l, H)
    rep = H // G
    q = kw["C"].repeat_interleave(rep, dim=2).contiguous()
    k = (kw["B"].float().repeat_interleave(rep, dim=2) * dt[..., None]).to(kw["x"].dtype).contiguous()
    return dict(q=q, k=k, v=kw["x"].contiguous(), g=(dt * kw["A"]).contiguous(), scale=1.0, output_final_state=True)


def capture(f):
    """``f`` run once on a side stream (warm-up, as CUDA graph capture wants), then captured in a CUDA
    graph: returns (the graph, what the captured call returned)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f()
    return g, out


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def smoke():
    """Each scan path once at a real shape, and a packed one; a hang here is a bug in the waits."""
    import torch

    from holotron.kernels import ssd_scan
    dev = torch.device(DEVICE)
    kw = inputs(2, 1024, torch.bfloat16, dev)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    y, s = ssd_scan(x, dt, A, B, C, dt_softplus=True, backend="triton", **kw)
    cu = torch.tensor([0, 300, 301, 1024], device=dev)
    y2, s2 = ssd_scan(x[:1], dt[:1], A, B[:1], C[:1], dt_softplus=True, cu_seqlens=cu, backend="triton", **kw)
    torch.cuda.synchronize()
    print("smoke ok", bool(torch.isfinite(y).all()), bool(torch.isfinite(y2).all()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the 12B layer shapes only, no sweeps or variants")
    ap.add_argument("--unfused", action="store_true", help="the four-kernel scan (when the fused one hangs)")
    ap.add_argument("--step-only", action="store_true",
                    help="copy bandwidth and the decode step (fp32 and bf16 state) only")
    ap.add_argument("--cb-compare", action="store_true",
                    help="only the fused scan with and without SCAN_CONFIG['cb'] at the 12B layer shapes, "
                         "time and accuracy")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds; later sections are skipped past it")
    ap.add_argument("--png", default="docs/ssd_scan_time.png")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    if args.plot:
        return plot(args.plot, args.png)
    if args.smoke:
        return smoke()
    run(args)


def run(args):
    import torch
    import triton
    from triton.testing import do_bench

    from holotron.kernels import ssd_scan, ssd_step
    from holotron.kernels import ssd_triton_scan as T
    from holotron.kernels import ssd_triton_step as TS

    if args.unfused:
        T.SCAN_CONFIG["fused"] = False
    dev = torch.device(DEVICE)
    t_start = time.perf_counter()
    late = lambda frac: time.perf_counter() - t_start > frac * args.budget  # noqa: E731
    torch.backends.cuda.matmul.allow_tf32 = False
    bw = copy_bandwidth(dev)
    mm = None if args.step_only else matmul_rate(dev)
    fla, fla_ver = (None, None) if args.step_only or args.cb_compare else load_fla()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                fla=fla_ver, copy_GBps=bw / 1e9, bf16_matmul_TFLOPs=mm and mm / 1e12,
                date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv))
    print(f"# {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  fla {fla_ver}  "
          f"copy {bw / 1e9:.0f} GB/s  bf16 matmul {'-' if mm is None else f'{mm / 1e12:.0f}'} TFLOP/s", flush=True)
    out = dict(meta=meta, accuracy=[], scan=[], variants=[], step=[], first_call=[], cb_compare=[])
    os.makedirs(args.out, exist_ok=True)

    def save():
        with open(os.path.join(args.out, "bench_ssd.json"), "w") as fh:
            json.dump(out, fh, indent=1)

    def ours(kw):
        k = dict(kw)
        x, dt, A, B, C = (k.pop(n) for n in ("x", "dt", "A", "B", "C"))
        return lambda: ssd_scan(x, dt, A, B, C, dt_softplus=True, chunk_size=Q, backend="triton", **k)

    def bench(fn, rep=200):
        return do_bench(fn, warmup=25, rep=rep, return_mode="median")

    if args.cb_compare:
        cb_compare(out, args, T, ours, bench, late, dev, save)
        return

    if not args.step_only:
        # ---- first call (compile) at a new shape, and accuracy vs float64 at the real shape
        kw = inputs(1, 4096, torch.bfloat16, dev, seed=1)
        t = time.perf_counter()
        ours(kw)()
        torch.cuda.synchronize()
        out["first_call"].append(dict(what="ssd_scan first call b1 L4096 (compile, cold cache)",
                                      s=time.perf_counter() - t))
        t = time.perf_counter()
        ours(inputs(2, 3000, torch.bfloat16, dev, seed=2))()
        torch.cuda.synchronize()
        out["first_call"].append(dict(what="ssd_scan first call at a second shape b2 L3000", s=time.perf_counter() - t))
        print("# first calls:", [f"{r['what']}: {r['s']:.2f} s" for r in out["first_call"]], flush=True)

        for b, l in [(1, 4096), (2, 8192)]:
            kw = inputs(b, l, torch.bfloat16, dev, seed=3)
            kw["D"] = None  # the peer has no D term: compare like with like
            k64 = {n: (v.double() if torch.is_tensor(v) and n != "A" else v) for n, v in kw.items()}
            from holotron.kernels import ssd_scan as S
            y_ref, s_ref = S(k64["x"], k64["dt"], kw["A"], k64["B"], k64["C"], dt_bias=k64["dt_bias"], dt_softplus=True,
                             chunk_size=Q, backend="chunked")
            row = dict(shape=f"b{b} L{l}")
            for name, cfg in (("fused", dict(fused=True)), ("fused cb", dict(cb=True)),
                              ("four-kernel", dict(fused=False))):
                old = dict(T.SCAN_CONFIG)
                T.SCAN_CONFIG.update(cfg)
                y, s = ours(kw)()
                T.SCAN_CONFIG.clear(), T.SCAN_CONFIG.update(old)
                row[f"{name} y"], row[f"{name} state"] = rel(y, y_ref), rel(s, s_ref)
            if fla is not None:
                o, ht = fla(**fla_args(kw))
                row["fla y"], row["fla state"] = rel(o, y_ref), rel(ht.transpose(-1, -2), s_ref)
            out["accuracy"].append(row)
            print("# relative RMS error vs float64:",
                  {k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            del k64, y_ref, s_ref
        save()

        # ---- variants of the fused scan's launch settings
        base = dict(T.SCAN_CONFIG)
        variants = [dict(), dict(P_TILE=16), dict(P_TILE=16, num_warps=4), dict(P_TILE=32),
                    dict(state_ops="half"), dict(P_TILE=16, state_ops="half"), dict(BLOCK_M=128), dict(num_warps=4),
                    dict(cb=True), dict(cb="half"), dict(fused=False)]
        if args.quick:
            variants = [dict()]
        for b, l in ([(1, 4096), (8, 16384)] if not args.quick else []):
            kw = inputs(b, l, torch.bfloat16, dev)
            for v in variants:
                if late(0.45) or (b > 1 and v.get("fused") is False):
                    continue
                T.SCAN_CONFIG.clear(), T.SCAN_CONFIG.update({**base, **v})
                try:
                    ms = bench(ours(kw), rep=100)
                except Exception as e:  # noqa: BLE001  (a config that does not compile: say so, go on)
                    print(f"# variant {v} failed: {type(e).__name__}: {str(e)[:200]}")
                    ms = None
                out["variants"].append(dict(shape=f"b{b} L{l}", config=v, ms=ms))
                print(f"# variant b{b} L{l} {v}: {ms}", flush=True)
            del kw
        best, score = dict(), {}
        for r in out["variants"]:  # the fused config with the least time relative to the best, summed over shapes
            if r["ms"] is not None and r["config"].get("fused", True):
                fastest = min(q["ms"] for q in out["variants"] if q["shape"] == r["shape"] and q["ms"] is not None)
                score.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r["ms"] / fastest)
        full = {k: sum(v) for k, v in score.items() if len(v) == max(map(len, score.values()))}
        if full:
            best = json.loads(min(full, key=full.get))
        T.SCAN_CONFIG.clear(), T.SCAN_CONFIG.update({**base, **best})
        meta["scan_config"] = dict(T.SCAN_CONFIG)
        print("# scan config:", T.SCAN_CONFIG, flush=True)
        save()

        # ---- the scan at the four benchmark shapes and the sweeps, next to the peer and the floor
        shapes = list(SHAPES)
        if not args.quick:
            shapes += ([(1, l) for l in SWEEP_L if (1, l) not in shapes]
                       + [(b, 4096) for b in SWEEP_B if (b, 4096) not in shapes])
        for b, l in shapes:
            if late(0.6) and (b, l) not in SHAPES:
                print(f"# skipped b{b} L{l}: over the time budget")
                continue
            kw = inputs(b, l, torch.bfloat16, dev)
            ms = bench(ours(kw))
            row = dict(b=b, l=l, ms=ms, GBps=scan_bytes(b, l) / ms / 1e6, TFLOPs=scan_flops(b, l) / ms / 1e9,
                       floor_bytes_ms=scan_bytes(b, l) / bw * 1e3, floor_flops_ms=scan_flops(b, l) / mm * 1e3,
                       mamba_ssm_quoted_ms=MAMBA_SSM_MS.get((b, l)))
            row["floor_ms"] = max(row["floor_bytes_ms"], row["floor_flops_ms"])
            if fla is not None and not late(0.6):
                fa = fla_args(kw)
                t = time.perf_counter()
                fla(**fa)
                torch.cuda.synchronize()
                row["fla_first_call_s"] = time.perf_counter() - t
                row["fla_ms"] = bench(lambda: fla(**fa))
                del fa
            if (b, l) == (1, 4096):  # the scan captured in a CUDA graph: no host time in the figure
                g, _ = capture(ours(kw))
                row["graph_ms"] = bench(g.replay)
            out["scan"].append(row)
            print(f"# scan b{b} L{l}: {ms:.3f} ms  fla {row.get('fla_ms')}  floor {row['floor_ms']:.3f}", flush=True)
            del kw
            torch.cuda.empty_cache()
            save()

    # ---- the decode step, in a CUDA graph over distinct per-layer states (no L2 reuse), and eager; the
    # state in fp32 and in bf16 (fp32 math, stored rounded: half the bytes)
    step_variants = [dict(BLOCK_P=16, num_warps=4), dict(BLOCK_P=8, num_warps=2)]
    if args.quick:
        step_variants = [dict(TS.STEP_CONFIG)]
    for b in STEP_B:
        if late(0.85):
            break
        kw = inputs(b, 1, torch.bfloat16, dev, seed=1)
        x, dt, A, B, C = (kw.pop(k)[:, 0] if k != "A" else kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
        for sdt, sname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            sbytes = b * H * P * N * sdt.itemsize
            layers = max(2, min(32, math.ceil(400e6 / sbytes)))
            states = [torch.randn(b, H, P, N, device=dev).to(sdt) for _ in range(layers)]
            for v in step_variants:
                TS.STEP_CONFIG.update(v)
                fn = lambda st: ssd_step(st, x, dt, A, B, C, dt_softplus=True, backend="triton", **kw)  # noqa: E731
                # F821 noqa: ruff misreads a lambda over names `del`-ed after it has run (astral-sh/ruff#9858)
                g, _ = capture(lambda: [fn(st) for st in states])  # noqa: F821
                us = bench(g.replay) * 1e3 / layers
                eager_us = bench(lambda: fn(states[0])) * 1e3  # noqa: F821
                bytes_step = 2 * sbytes + 2 * (2 * b * H * P + 2 * b * G * N + b * H)  # state read + written
                row = dict(b=b, state_dtype=sname, config=dict(v), layers=layers, graph_us=us, eager_us=eager_us,
                           state_bytes=2 * sbytes, bytes=bytes_step, TBps=bytes_step / us / 1e6,
                           floor_us=bytes_step / bw * 1e6,
                           mamba_ssm_quoted_us=MAMBA_SSM_STEP_US.get(b) if sname == "fp32" else None)
                ref = [r for r in out["step"]
                       if r["b"] == b and r["config"] == row["config"] and r["state_dtype"] == "fp32"]
                row["speedup_vs_fp32"] = ref[-1]["graph_us"] / us if ref and sname != "fp32" else None
                out["step"].append(row)
                sp = row["speedup_vs_fp32"]
                print(f"# step b{b} {sname} state {v}: graph {us:.2f} us/layer ({row['TBps']:.2f} TB/s, floor "
                      f"{row['floor_us']:.2f} us), eager {eager_us:.1f} us"
                      + ("" if sp is None else f", x{sp:.2f} vs fp32"),
                      flush=True)
            del states
            torch.cuda.empty_cache()
        save()

    # ---- tables
    if out["scan"]:
        print_scan_table(out["scan"])
    print_step_table(out["step"])
    save()


def print_scan_table(rows):
    print("\n| batch x seqlen | ours ms | graph ms | FLA ms (measured) | mamba_ssm ms (quoted) | floor ms | x floor | "
          "FLA / ours | mamba_ssm / ours | GB/s | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for r in rows:
        fl, mb = r.get("fla_ms"), r.get("mamba_ssm_quoted_ms")
        print(f"| {r['b']} x {r['l']} | {r['ms']:.3f} | {f(r.get('graph_ms'), '.3f')} | {f(fl, '.3f')} | "
              f"{f(mb, '.2f')} | {r['floor_ms']:.3f} | {r['ms'] / r['floor_ms']:.1f} | "
              f"{f(fl and fl / r['ms'], '.2f')} | {f(mb and mb / r['ms'], '.2f')} | {r['GBps']:.0f} | "
              f"{r['TFLOPs']:.0f} |")


def _fmt(v, fmt):
    return "-" if v is None else format(v, fmt)


def print_step_table(rows):
    print("\n| batch | state | step config | graph us/layer | state MB moved | TB/s | floor us | x floor | "
          "speed-up vs fp32 state | mamba_ssm us (quoted) | eager us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['b']} | {r.get('state_dtype', 'fp32')} | {r['config']} | {r['graph_us']:.2f} | "
              f"{_fmt(r.get('state_bytes') and r['state_bytes'] / 1e6, '.1f')} | {r['TBps']:.2f} | "
              f"{r['floor_us']:.2f} | {r['graph_us'] / r['floor_us']:.2f} | {_fmt(r.get('speedup_vs_fp32'), '.2f')} | "
              f"{_fmt(r['mamba_ssm_quoted_us'], '.1f')} | {r['eager_us']:.1f} |")


CB_MODES = [("per head", dict(cb=False)), ("cb fp32", dict(cb=True)), ("cb half", dict(cb="half"))]


def cb_compare(out, args, T, ours, bench, late, dev, save):
    """The fused scan at the four benchmark shapes with C B^T recomputed per head (today's default) and computed
    once per (chunk, group) by _chunk_cb (SCAN_CONFIG["cb"]: True = fp32 buffer, "half" = bf16 buffer):
    median ms of each, eager and (1 x 4096) in a CUDA graph, and the relative RMS error of y and of
    the final state vs the chunked scan in float64 (computed one batch row at a time)."""
    import torch

    from holotron.kernels import ssd_scan
    base = dict(T.SCAN_CONFIG)
    for b, l in SHAPES:
        if late(0.7):
            print(f"# cb-compare: skipped b{b} L{l}: over the time budget", flush=True)
            continue
        kw = inputs(b, l, torch.bfloat16, dev, seed=3)
        row = dict(b=b, l=l, config=base)
        res = {}
        for name, v in CB_MODES:
            T.SCAN_CONFIG.clear(), T.SCAN_CONFIG.update({**base, **v})
            try:
                f = ours(kw)
                res[name] = f()
                row[f"{name} ms"] = bench(f, rep=100)
                if (b, l) == SHAPES[0]:  # (1 x 4096) captured in a CUDA graph (no host sync), replay equals eager
                    g, (yg, sg) = capture(f)
                    g.replay()
                    torch.cuda.synchronize()
                    row[f"{name} graph ms"] = bench(g.replay, rep=100)
                    row[f"{name} graph == eager"] = bool(torch.equal(yg, res[name][0])
                                                         and torch.equal(sg, res[name][1]))
                    del g, yg, sg
            except Exception as e:  # noqa: BLE001  (report and go on: the other modes still tell)
                print(f"# cb-compare b{b} L{l} {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                row[f"{name} ms"] = None
                res.pop(name, None)
        T.SCAN_CONFIG.clear(), T.SCAN_CONFIG.update(base)
        if not late(0.85):  # accuracy vs float64, a batch row at a time (the float64 scan is large)
            sq = {name: [0.0, 0.0, 0.0, 0.0] for name in res}
            for i in range(b):
                k64 = {n: (v[i:i + 1].double() if torch.is_tensor(v) and v.dim() > 1 else v) for n, v in kw.items()}
                x, dt, A, B, C = (k64.pop(n) for n in ("x", "dt", "A", "B", "C"))
                y_ref, s_ref = ssd_scan(x, dt, A, B, C, dt_softplus=True, chunk_size=Q, backend="chunked", **k64)
                for name, (y, s) in res.items():
                    a = sq[name]
                    a[0] += float((y[i:i + 1].double() - y_ref).pow(2).sum())
                    a[1] += float(y_ref.pow(2).sum())
                    a[2] += float((s[i:i + 1].double() - s_ref).pow(2).sum())
                    a[3] += float(s_ref.pow(2).sum())
                del x, dt, B, C, k64, y_ref, s_ref
            for name, a in sq.items():
                row[f"{name} y err"], row[f"{name} state err"] = math.sqrt(a[0] / a[1]), math.sqrt(a[2] / a[3])
        del kw, res
        torch.cuda.empty_cache()
        out["cb_compare"].append(row)
        print("# cb-compare", {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items() if k != "config"},
              flush=True)
        save()
    print_cb_table(out["cb_compare"])
    save()


def print_cb_table(rows):
    names = [n for n, _ in CB_MODES]
    print("\n| batch x seqlen | " + " | ".join(f"{n} ms" for n in names) + " | " +
          " | ".join(f"{n} speed-up" for n in names[1:]) + " | " + " | ".join(f"{n} y err" for n in names) + " | " +
          " | ".join(f"{n} state err" for n in names) + " |")
    print("|---" * (1 + 4 * len(names) - 1) + "|")
    for r in rows:
        t0 = r.get(f"{names[0]} ms")
        sp = [(t0 / r[f"{n} ms"]) if t0 and r.get(f"{n} ms") else None for n in names[1:]]
        print(f"| {r['b']} x {r['l']} | " + " | ".join(_fmt(r.get(f"{n} ms"), ".3f") for n in names) + " | " +
              " | ".join(_fmt(v, ".3f") for v in sp) + " | " +
              " | ".join(_fmt(r.get(f"{n} y err"), ".2e") for n in names) + " | " +
              " | ".join(_fmt(r.get(f"{n} state err"), ".2e") for n in names) + " |")
    for r in rows:
        if any(k.endswith("graph ms") for k in r):
            print(f"# {r['b']} x {r['l']} in a CUDA graph: " + ", ".join(
                f"{n} {_fmt(r.get(f'{n} graph ms'), '.3f')} ms (replay == eager: {r.get(f'{n} graph == eager')})"
                for n in names))


def plot(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = json.load(open(path))
    rows = sorted([r for r in d["scan"] if r["b"] == 1], key=lambda r: r["l"])
    L = [r["l"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(L, [r["ms"] for r in rows], "o-", label="holotron ssd_scan (triton)")
    if any(r.get("fla_ms") for r in rows):
        ax.plot(L, [r.get("fla_ms") for r in rows], "s-",
                label=f"FLA chunk_simple_gla {d['meta'].get('fla')} (measured)")
    mb = [(r["l"], r["mamba_ssm_quoted_ms"]) for r in rows if r.get("mamba_ssm_quoted_ms")]
    if mb:
        ax.plot(*zip(*mb), "^--", label="mamba_ssm 2.3.2 (quoted figures, not measured here)")
    ax.plot(L, [r["floor_ms"] for r in rows], "k:", label="floor (bytes at copy bandwidth / FLOPs at matmul rate)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("seqlen (batch 1)")
    ax.set_ylabel("ms")
    m = d["meta"]
    ax.set_title(f"SSD scan, H=128 P=80 N=128 G=8 chunk 128 bf16\n"
                 f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}, {m['date']}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print("wrote", png)


if __name__ == "__main__":
    main()
