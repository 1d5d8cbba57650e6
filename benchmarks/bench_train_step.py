"""One training step of the 12B language model on one GPU: the Triton scan against the chunked (PyTorch) one.

    PYTHONPATH=. python3 benchmarks/bench_train_step.py [--tokens 4096] [--steps 3] [--out DIR]
    python benchmarks/bench_train_step.py --tiny          a tiny config on the CPU (TRITON_INTERPRET=1): a dry run

What runs: the Nemotron-Nano-12B-v2 language model (TextConfig's defaults: 62 layers, 28 Mamba2, 6 attention,
28 MLP, 12.31 B parameters) with random bf16 weights made on the GPU (built on the meta device, then
``to_empty`` and filled in place: no CPU initialisation), A_log, D and dt_bias in fp32 as the model keeps
them. One sequence of 4,096 random tokens; loss = cross-entropy against random targets; activation
checkpointing per layer (each block's forward wrapped in ``torch.utils.checkpoint`` here, lm.py has no such
option); forward + backward, then a plain SGD update in place (no optimizer state; timed apart). No
optimizer such as AdamW: its two fp32 moments (98 GB) would not fit beside the weights and gradients.

Each scan backend is selected with ``holotron.kernels.use_backend``. First one forward + backward per backend
on the same weights and tokens (compiles included, no update): their losses and a few gradients are compared.
Then, per backend, warm-up steps and timed steps (CUDA events, median): tokens/s, and the peak of
``torch.cuda.max_memory_allocated`` over that backend's steps. Model FLOP/s count 6 x parameters (without the
embedding) x tokens plus the causal attention products, not the recomputation. JSON to
$OUT/bench_train_step.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time

TINY = dict(vocab_size=96, hidden_size=32, hybrid_override_pattern="M*-M", num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, intermediate_size=48, mamba_num_heads=4, mamba_head_dim=10,
            ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=8)
GIB = 1 << 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per backend after the first call")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per backend")
    ap.add_argument("--backends", default="triton,chunked")
    ap.add_argument("--lr", type=float, default=1e-6, help="the plain SGD update's step (0: no update)")
    ap.add_argument("--no-checkpoint", action="store_true", help="keep every layer's activations")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU, Triton interpreted: a dry run")
    args = ap.parse_args()
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        args.tokens = min(args.tokens, 40)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    run(args)


def build(cfg, dev, seed=0):
    """The model in bf16 (A_log, D, dt_bias fp32) straight on ``dev``: meta, to_empty, filled in place with
    the from-scratch recipe's distributions (HybridLM.init_weights), drawn on the device."""
    import torch

    from holotron.lm import HybridLM
    with torch.device("meta"):
        model = HybridLM(cfg)
    model = model.to(torch.bfloat16).to_empty(device=dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    n_layers = cfg.num_hidden_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":  # A in [-16, -1]
                p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=g, device=dev)))
            elif leaf == "dt_bias":  # softplus(dt_bias) log-uniform in [1e-3, 1e-1]
                u = torch.rand(p.shape, generator=g, device=dev)
                dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * u)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif leaf == "D" or (p.dim() == 1 and leaf == "weight"):  # D and the norms' weights
                p.fill_(1.0)
            elif leaf == "bias":
                p.zero_()
            elif "conv1d" in name:  # torch's default bound for a depthwise conv: 1 / sqrt(K)
                p.uniform_(-1 / math.sqrt(p.shape[-1]), 1 / math.sqrt(p.shape[-1]), generator=g)
            else:
                std = 0.02 / (math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "out_proj.weight",
                                                                        "down_proj.weight")) else 1)
                p.normal_(0.0, std, generator=g)
    return model


def checkpoint_layers(model):
    """Each block's forward through torch.utils.checkpoint (non-reentrant): only block inputs are kept."""
    from torch.utils.checkpoint import checkpoint

    def ck(fwd, x, layer_state=None, where=None):
        return checkpoint(fwd, x, layer_state, where, use_reentrant=False)
    for blk in model.backbone.layers:
        blk.forward = functools.partial(ck, blk.forward)


def no_autograd(backend, cfg, dev):
    """None when ssd_scan on ``backend`` gives a y that autograd can go back through (a small call with the
    model's head layout, inputs as the mixer passes them), else why not."""
    import torch

    from holotron import kernels
    H, P, N, G = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups
    g = torch.Generator(device=dev).manual_seed(2)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)
    x = r(1, 64, H, P).bfloat16().requires_grad_()
    dt = torch.nn.functional.softplus(r(1, 64, H) - 2).requires_grad_()
    A, D = -torch.rand(H, device=dev, generator=g) - 0.5, r(H)
    B, C = (r(1, 64, G, N) / N**0.5).bfloat16(), r(1, 64, G, N).bfloat16()
    try:
        y, _ = kernels.ssd_scan(x, dt, A, B, C, D=D, chunk_size=cfg.chunk_size, backend=backend)
    except Exception as e:  # noqa: BLE001
        return f"ssd_scan failed: {type(e).__name__}: {str(e)[:200]}"
    return None if y.requires_grad else "ssd_scan's output has no autograd history on this backend"


def model_flops(cfg, n_params, tokens, seqlen):
    """6 N T (N without the embedding) plus the causal attention products (QK^T, PV: 2 x 2 T^2 d / 2 forward,
    3x for forward + backward) per attention layer."""
    n = n_params - cfg.vocab_size * cfg.hidden_size
    attn = cfg.layer_kinds.count("attention") * 3 * 2 * seqlen * seqlen * cfg.num_attention_heads * cfg.head_dim
    return 6 * n * tokens + attn * tokens // seqlen


def run(args):
    import torch
    import torch.nn.functional as F

    from holotron import kernels
    from holotron.config import TextConfig

    cuda = torch.cuda.is_available() and not args.tiny
    dev = torch.device("cuda" if cuda else "cpu")
    cfg = TextConfig(**TINY) if args.tiny else TextConfig()
    b, t = args.batch, args.tokens
    out = dict(meta=dict(date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv), torch=torch.__version__,
                         gpu=torch.cuda.get_device_name() if cuda else "cpu (dry run)", batch=b, seqlen=t,
                         checkpointing=not args.no_checkpoint, lr=args.lr, tiny=args.tiny),
               check={}, backends=[], errors=[])
    try:
        import triton
        out["meta"]["triton"] = triton.__version__
    except ImportError:
        out["meta"]["triton"] = None
    os.makedirs(args.out, exist_ok=True)

    def save():
        with open(os.path.join(args.out, "bench_train_step.json"), "w") as fh:
            json.dump(out, fh, indent=1)

    # ---- does it fit: weights + gradients (+ activations, a few GB with checkpointing)
    with torch.device("meta"):
        from holotron.lm import HybridLM
        shapes = HybridLM(cfg).to(torch.bfloat16)
    n_params = sum(p.numel() for p in shapes.parameters())
    w_bytes = sum(p.numel() * p.element_size() for p in shapes.parameters())
    del shapes
    total = torch.cuda.mem_get_info()[1] if cuda else None
    out["meta"].update(params=n_params, weight_GB=w_bytes / 1e9, grad_GB=w_bytes / 1e9,
                       device_GB=total and total / 1e9)
    print(f"# {out['meta']['gpu']}  torch {torch.__version__}  triton {out['meta']['triton']}  "
          f"params {n_params / 1e9:.2f} B: weights {w_bytes / 1e9:.1f} GB + gradients {w_bytes / 1e9:.1f} GB"
          + (f" of {total / 1e9:.0f} GB" if total else ""), flush=True)
    if total and 2 * w_bytes + 8 * GIB > total:
        print("# does not fit: weights + gradients + 8 GiB of activations exceed the device memory")
        out["errors"].append("does not fit")
        save()
        return

    t0 = time.perf_counter()
    model = build(cfg, dev)
    if not args.no_checkpoint:
        checkpoint_layers(model)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    out["meta"]["build_s"] = time.perf_counter() - t0
    print(f"# model built on {dev} in {out['meta']['build_s']:.1f} s", flush=True)
    params = [p for p in model.parameters()]
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev, generator=g)
    targets = torch.randint(0, cfg.vocab_size, (b, t), device=dev, generator=g)
    watch = {n: p for n, p in model.named_parameters()
             if n.endswith(("0.mixer.A_log", "0.mixer.D", "0.mixer.dt_bias", "0.mixer.in_proj.weight",
                            "0.mixer.out_proj.weight"))}

    def fwd_bwd():
        logits = model(ids)  # (b, t, V) fp32
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        return loss.detach()

    def sgd():
        grads = [p.grad for p in params]
        if args.lr:
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-args.lr)
        for p in params:
            p.grad = None

    backends = [s.strip() for s in args.backends.split(",") if s.strip()]
    for name in list(backends):  # a backend whose scan is not differentiable would silently cut the gradients
        why = no_autograd(name, cfg, dev)
        if why:
            out["errors"].append(f"{name}: {why}")
            print(f"# {name}: skipped: {why}", flush=True)
            backends.remove(name)
    # ---- the first forward + backward of each backend on the same weights and tokens (compiles included)
    first = {}
    for name in backends:
        try:
            with kernels.use_backend(name):
                t0 = time.perf_counter()
                loss = fwd_bwd()
                sync()
                first[name] = dict(s=time.perf_counter() - t0, loss=float(loss),
                                   grads={n: p.grad.detach().float().clone() for n, p in watch.items()})
            print(f"# {name}: first forward + backward {first[name]['s']:.2f} s, loss {first[name]['loss']:.4f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001  (a backend that fails: recorded, the other still runs)
            out["errors"].append(f"{name} first step: {type(e).__name__}: {str(e)[:300]}")
            print(f"# {name}: first step failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        for p in params:
            p.grad = None
        if cuda:
            torch.cuda.empty_cache()
    if len(first) == 2:
        a, c = (first[n] for n in backends)
        out["check"] = dict(loss=[a["loss"], c["loss"]], loss_abs_diff=abs(a["loss"] - c["loss"]),
                            grad_rel_diff={n: float((a["grads"][n] - c["grads"][n]).norm() / c["grads"][n].norm())
                                           for n in watch})
        print(f"# check {backends[0]} vs {backends[1]}: loss {a['loss']:.5f} vs {c['loss']:.5f}; gradient relative "
              "difference " + ", ".join(f"{n.split('layers.')[-1]} {v:.1e}"
                                        for n, v in out["check"]["grad_rel_diff"].items()), flush=True)
    first = {n: dict(s=v["s"], loss=v["loss"]) for n, v in first.items()}
    save()

    # ---- timed steps per backend
    flops = model_flops(cfg, n_params, b * t, t)
    for name in backends:
        if name not in first:
            continue
        row = dict(backend=name, first_call_s=first[name]["s"], first_loss=first[name]["loss"])
        try:
            with kernels.use_backend(name):
                for _ in range(args.warmup):
                    fwd_bwd()
                    sgd()
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                step_ms, sgd_ms, losses = [], [], []
                for _ in range(args.steps):
                    if cuda:
                        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                        ev[0].record()
                        losses.append(fwd_bwd())
                        ev[1].record()
                        sgd()
                        ev[2].record()
                        ev[2].synchronize()
                        step_ms.append(ev[0].elapsed_time(ev[1]))
                        sgd_ms.append(ev[1].elapsed_time(ev[2]))
                    else:
                        t0 = time.perf_counter()
                        losses.append(fwd_bwd())
                        t1 = time.perf_counter()
                        sgd()
                        step_ms.append((t1 - t0) * 1e3)
                        sgd_ms.append((time.perf_counter() - t1) * 1e3)
            ms = statistics.median(step_ms)
            row.update(fwd_bwd_ms=ms, fwd_bwd_ms_all=step_ms, sgd_ms=statistics.median(sgd_ms),
                       tokens_per_s=b * t / ms * 1e3, model_TFLOPs=flops / ms / 1e9,
                       losses=[float(v) for v in losses],
                       peak_GiB=torch.cuda.max_memory_allocated() / GIB if cuda else None)
            print(f"# {name}: forward + backward {ms:.1f} ms ({row['tokens_per_s']:.0f} tokens/s), SGD "
                  f"{row['sgd_ms']:.1f} ms, peak {_f(row['peak_GiB'], '.1f')} GiB", flush=True)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"# {name}: timed steps failed: {row['error']}", flush=True)
            for p in params:
                p.grad = None
        out["backends"].append(row)
        if cuda:
            torch.cuda.empty_cache()
        save()

    # ---- table
    m = out["meta"]
    print(f"\n## 12B training step{' (tiny config, CPU dry run)' if args.tiny else ''}: batch {b} x {t} tokens, "
          f"{'activation checkpointing per layer' if m['checkpointing'] else 'no checkpointing'}, bf16 weights, "
          f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}; forward + backward timed, the SGD update apart "
          "(no optimizer state)")
    print("| scan backend | tokens/s | fwd+bwd ms | SGD ms | model TFLOP/s | peak GiB | first call s | first loss |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out["backends"]:
        if r.get("error"):
            print(f"| {r['backend']} | failed: {r['error'][:100]} |")
            continue
        print(f"| {r['backend']} | {r['tokens_per_s']:.0f} | {r['fwd_bwd_ms']:.1f} | {r['sgd_ms']:.1f} | "
              f"{r['model_TFLOPs']:.0f} | {_f(r['peak_GiB'], '.1f')} | {r['first_call_s']:.1f} | "
              f"{r['first_loss']:.4f} |")
    ok = [r for r in out["backends"] if not r.get("error")]
    if len(ok) == 2:
        print(f"# {ok[1]['backend']} / {ok[0]['backend']} step time: {ok[1]['fwd_bwd_ms'] / ok[0]['fwd_bwd_ms']:.2f}x")
    if out["check"]:
        print(f"# same weights and tokens, first step: loss difference {out['check']['loss_abs_diff']:.2e}, gradient "
              "relative difference " + ", ".join(f"{k.split('layers.')[-1]} {v:.1e}"
                                                for k, v in out["check"]["grad_rel_diff"].items()))
    for e in out["errors"]:
        print("# FAILED:", e)
    save()
    print(f"# wrote {os.path.join(args.out, 'bench_train_step.json')}")


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


if __name__ == "__main__":
    main()
