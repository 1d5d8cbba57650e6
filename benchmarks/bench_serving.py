"""Serving throughput of the 12B model on one GPU: holotron.engine (CUDA-graph decode, batching) for the
hybrid Nemotron-H 12B and for a pure-attention model of the same parameter count.

    PYTHONPATH=. python3 benchmarks/bench_serving.py [--budget 210]   # CUDA; JSON + PNG to $OUT (or .)
    PYTHONPATH=. python3 benchmarks/bench_serving.py --small          # tiny configs, any device (smoke test)
    PYTHONPATH=. python3 benchmarks/bench_serving.py --decode-only    # the decode sweeps alone (below)
    PYTHONPATH=. python3 benchmarks/bench_serving.py --serving-only   # the serving section alone (below)

Measured, random bf16 weights initialised on the GPU, fp32 Mamba state:
  decode   tokens/s at batch 1..256 after a 1,024-token prompt (hybrid): per step, the CUDA-graph replay
           alone (CUDA events) and the engine's whole step (replay, token read-back, host bookkeeping),
           for the fp32 and the bf16 Mamba state, the eager HybridLM.step and the torch.compiled one;
           the GPU kernels (and copies) of one step, counted by the torch profiler;
  context  at 4k, 16k and 64k tokens, for both models: the largest batch whose state fits next to the
           weights, and tokens/s at batch 1, 8, 32, ... up to it (graph replay);
  prefill  tokens/s at 16,384 tokens, batch 1, in one call and in 8,192-token chunks;
  e2e      holotron.generate on a 1,024-token prompt with the engine and with the plain loop: decode
           tokens/s of each, and whether their greedy tokens agree;
  vision   a 13-tile screenshot through RADIO + mlp1.
Computed: state bytes per sequence at 4k, 32k and 128k tokens for both models.

``--kv-dtype fp8``: every engine (and the prefix they continue) keeps its attention KV cache in FP8
(``Engine(kv_dtype=torch.float8_e4m3fn)``, holotron/kv_cache.py): the state bytes, the rows that fit and the
floors count its codes and scales; the e2e section's ``generate`` keeps the model's dtype (it has no such
option).

Rows of the decode timings other than the prefilled ones hold uninitialised state of the right shape
and length (the step's work and bytes do not depend on the values). Floors: bytes moved per step (the
weights read, the fp32 Mamba state read and written, the KV read) at the copy bandwidth measured in
the same run, or the matmul FLOPs at the measured bf16 matmul rate, whichever is larger. Every
configuration is guarded: an out-of-memory is recorded as "OOM", and work left when ``--budget``
seconds are near is recorded as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from timing import median_ms  # noqa: E402  (benchmarks/ is on sys.path)

from holotron import engine_chunks, engine_sessions, layers, mamba2  # noqa: E402
from holotron import state as holo_state  # noqa: E402
from holotron.config import TextConfig  # noqa: E402
from holotron.engine import Engine, Request  # noqa: E402
from holotron.engine_chunks import row_buckets  # noqa: E402
from holotron.generate import generate  # noqa: E402
from holotron.kv_cache import kv_slot_bytes  # noqa: E402
from holotron.lm import HybridLM  # noqa: E402
from holotron.state import DecodeState  # noqa: E402

KV_DTYPE = None  # the engines' KV cache (None: the model's dtype; torch.float8_e4m3fn with --kv-dtype fp8)

SMALL = dict(vocab_size=512, hidden_size=64, hybrid_override_pattern="M-M*-M-M*-",
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16)


# the serving section's engine settings (--serving-only runs each on the same workload, --variants picks some)
SERVING_VARIANTS = {"serving": {}, "serving_eager_chunks": dict(prefill_graphs=False),
                    "serving_mixed": dict(mixed=True),                          # mixed graphs, short prompts as chunks
                    "serving_mixed_fed": dict(mixed=True, step_prompt_max=32),  # ... short prompts through the steps
                    "serving_bf16_state": dict(ssm_dtype=torch.bfloat16),
                    "serving_mixed_bf16_state": dict(mixed=True, ssm_dtype=torch.bfloat16)}


class Clock:
    def __init__(self, budget: float):
        self.t0, self.budget = time.perf_counter(), budget

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_cuda():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


# ----------------------------------------------------------------------------- models


def attention_config(hybrid: TextConfig) -> TextConfig:
    """Every Mamba layer replaced by attention; the MLPs widened so the parameter count matches."""
    pat = hybrid.hybrid_override_pattern.replace("M", "*")
    with torch.device("meta"):
        n_h = HybridLM(hybrid).num_parameters()
        cfg = dataclasses.replace(hybrid, hybrid_override_pattern=pat)
        n_a = HybridLM(cfg).num_parameters()
    n_mlp = pat.count("-")
    extra = (n_h - n_a) / (2 * hybrid.hidden_size * n_mlp)
    step = 128 if hybrid.intermediate_size >= 1024 else 8
    width = hybrid.intermediate_size + int(round(extra / step)) * step
    return dataclasses.replace(cfg, intermediate_size=width)


@torch.no_grad()
def build(cfg: TextConfig, dev: torch.device, dtype: torch.dtype, seed: int = 0) -> HybridLM:
    """Built on the meta device, allocated on ``dev`` (no CPU copy), filled there by parameter name."""
    with torch.device("meta"):
        model = HybridLM(cfg)
    model = model.to(dtype).to_empty(device=dev)   # A_log, D, dt_bias stay fp32 (HybridLM.keep_fp32)
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.uniform_(1.0, 16.0, generator=g).log_()
        elif leaf == "dt_bias":
            dt = torch.empty_like(p).uniform_(math.log(1e-3), math.log(1e-1), generator=g).exp_()
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1
        elif leaf == "D" or name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            p.fill_(1.0)
        elif "conv1d" in name:
            p.normal_(0.0, 0.5, generator=g) if leaf == "weight" else p.zero_()
        elif "embeddings" in name:
            p.normal_(0.0, 1.0, generator=g)
        elif p.dim() == 2:
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=g)
        else:
            p.normal_(0.0, 0.1, generator=g)
    return model.eval()


def state_bytes(cfg: TextConfig, lengths: list[int], dtype=torch.bfloat16) -> dict:
    """Inference-state bytes of one sequence (computed from the shapes: a DecodeState on the meta device)."""
    with torch.device("meta"):
        lm = HybridLM(cfg).to(dtype)
        st = DecodeState.allocate(lm, 1, 1, kv_dtype=KV_DTYPE)
    return {str(n): st.bytes_per_row(n) for n in lengths}


# ----------------------------------------------------------------------------- ceilings


def ceilings(dev, small: bool) -> dict:
    if dev.type != "cuda":
        return {"copy_GBps": float("nan"), "bf16_matmul_TFLOPs": float("nan")}
    n = 2**28 if not small else 2**20
    src = torch.empty(n, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    # F821 noqa: ruff misreads a lambda over names `del`-ed after it has run (astral-sh/ruff#9858)
    ms = median_ms(lambda: dst.copy_(src), 3, 10, dev)  # noqa: F821
    bw = 2 * src.nbytes / (ms * 1e-3)
    del src, dst
    k = 8192
    a = torch.randn(k, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, k, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, 3, 10, dev)
    return {"copy_GBps": bw / 1e9, "bf16_matmul_TFLOPs": 2 * k**3 / (ms * 1e-3) / 1e12}


def step_floor_ms(lm: HybridLM, b: int, ctx: int, ceil: dict, ssm_bytes: int = 4) -> float:
    """The larger of: bytes of one decode step at the copy bandwidth, matmul FLOPs at the matmul rate
    (``ssm_bytes``: bytes per element of the Mamba state, 4 for fp32, 2 for a 16-bit state)."""
    cfg = lm.config
    emb = lm.backbone.embeddings.weight
    # the weights as stored (bf16, or FP8 codes + fp32 scales after --quantize), embedding excluded (one row read)
    tensors = [t for t in [*lm.parameters(), *lm.buffers()] if t is not emb and t.dim() >= 1]
    n_w = sum(t.numel() for t in tensors if t.dim() == 2)
    wbytes = sum(t.numel() * t.element_size() for t in tensors) + b * cfg.hidden_size * 2
    kinds = cfg.layer_kinds
    mamba_row = kinds.count("mamba") * (
        (cfg.mamba_num_heads * cfg.mamba_head_dim + 2 * cfg.n_groups * cfg.ssm_state_size) * cfg.conv_kernel * 2
        + cfg.mamba_num_heads * cfg.mamba_head_dim * cfg.ssm_state_size * ssm_bytes)
    kv_row = kinds.count("attention") * kv_slot_bytes(cfg.num_key_value_heads, cfg.head_dim, KV_DTYPE,
                                                       torch.bfloat16) * ctx
    nbytes = wbytes + b * (2 * mamba_row + kv_row)
    flops = 2 * n_w * b
    t_bytes = nbytes / (ceil["copy_GBps"] * 1e9)
    t_flops = flops / (ceil["bf16_matmul_TFLOPs"] * 1e12)
    return max(t_bytes, t_flops) * 1e3


# ----------------------------------------------------------------------------- decode timing


def set_rows(eng: Engine, b: int, ctx: int) -> None:
    eng.state.lengths[:b].fill_(ctx)
    eng.active[:b].fill_(1)


def clear_rows(eng: Engine) -> None:
    with torch.inference_mode():
        for s in list(eng.sessions.values()):
            eng._close(s)
        eng.active.zero_()
        eng.state.lengths.zero_()


def replay_ms(eng: Engine, b: int, ctx: int, steps: int) -> float:
    """Milliseconds per decode step: the graph of batch size b replayed ``steps`` times (CUDA events)."""
    with torch.inference_mode():
        set_rows(eng, b, ctx)
        if eng.cuda_graph:
            run = eng.graphs[b].replay
        else:
            def run():
                eng._step(b)
        for _ in range(2):
            run()
        eng.state.lengths[:b].fill_(ctx)
        sync(eng.device)
        t = time.perf_counter()
        if eng.device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(steps):
                run()
            e1.record()
            e1.synchronize()
            ms = e0.elapsed_time(e1) / steps
        else:
            for _ in range(steps):
                run()
            ms = (time.perf_counter() - t) * 1e3 / steps
    clear_rows(eng)
    return ms


def engine_step_ms(eng: Engine, b: int, ctx: int, steps: int) -> float:
    """Milliseconds per ``Engine.step()`` with b live rows (replay, token read-back, bookkeeping), wall clock."""
    with torch.inference_mode():
        for r in range(b):  # b sessions decoding forever, at length ctx
            s = eng.session()
            s.request = Request(None, None, {}, None, max_new_tokens=10**9, session=s, phase="decode")
            s.length = ctx
            eng._hold(r, s)
        set_rows(eng, b, ctx)
    eng.step()
    sync(eng.device)
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    ms = (time.perf_counter() - t) * 1e3 / steps
    clear_rows(eng)
    return ms


def make_engine(lm, batches, max_len, small, compile=False, ssm_dtype=torch.float32):
    return Engine(lm, max_batch=max(batches), max_len=max_len, batch_sizes=batches, zero_state=small,
                  compile=compile, ssm_dtype=ssm_dtype, kv_dtype=KV_DTYPE)


def kernels_per_step(eng: Engine, b: int, ctx: int) -> tuple[int | None, list]:
    """GPU kernels and copies one step of batch b launches (the nodes its CUDA graph replays), and where the
    step's GPU time goes (kernel name, calls, total us; the 12 largest): the torch profiler over one eager
    call of the same step, its b rows decoding at length ctx (states written, ctx keys attended)."""
    if eng.device.type != "cuda":
        return None, []
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        set_rows(eng, b, ctx)
        eng._step(b)
        sync(eng.device)
        eng.state.lengths[:b].fill_(ctx)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eng._step(b)
            sync(eng.device)
    clear_rows(eng)
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list] = {}
    for e in evs:
        k = by.setdefault(e.name[:90], [0, 0.0])
        k[0] += 1
        k[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
    top = sorted(([n, c, round(t, 1)] for n, (c, t) in by.items()), key=lambda r: -r[2])[:12]
    return len(evs), top


def decode_sweep(lm, batches, ctx, steps, ceil, clk, small, prefix=None, compile=False,
                 ssm_dtype=torch.float32, fused="auto") -> list[dict]:
    """Decode after a ctx-token prompt at each batch size; rows [0, 8) hold ``prefix`` when given.
    ``fused``: holotron.decode_ops's mode for the capture ("off": the plain step, as before the fused ops)."""
    from holotron.decode_ops import fused_decode

    with fused_decode(fused):
        rows = _decode_sweep(lm, batches, ctx, steps, ceil, clk, small, prefix, compile, ssm_dtype)
    for r in rows:
        r["fused"] = fused
    return rows


def _decode_sweep(lm, batches, ctx, steps, ceil, clk, small, prefix, compile, ssm_dtype) -> list[dict]:
    rows = []
    eng = None
    t = time.perf_counter()
    try:
        eng = make_engine(lm, batches, ctx + steps + 16, small, compile, ssm_dtype)
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        free_cuda()
        return [{"batch": b, "context": ctx, "status": "OOM"} for b in batches]
    capture_s = time.perf_counter() - t
    label = f"{'compiled' if compile else 'eager'} step, {str(ssm_dtype).split('.')[-1]} state"
    prof = {b: kernels_per_step(eng, b, ctx) for b in (batches[0], batches[-1])}
    n_kernels = {b: v[0] for b, v in prof.items()}
    print(f"  {label}: capture {capture_s:.1f} s, kernels per step {n_kernels}", flush=True)
    for b, (_, top) in prof.items():
        for name, calls, us in top[:8]:
            print(f"    batch {b:>4}: {us:9.1f} us  {calls:>4} x  {name}", flush=True)
    if prefix is not None:
        with torch.inference_mode():
            for r in range(min(8, eng.max_batch)):
                eng.state.load(r, prefix.state, 0)
    for b in batches:
        if clk.left() < 8:
            rows.append({"batch": b, "context": ctx, "status": "skipped (time)"})
            continue
        try:
            ms = replay_ms(eng, b, ctx, steps)
            host = engine_step_ms(eng, b, ctx, max(4, steps // 2))
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
            clear_rows(eng)
            rows.append({"batch": b, "context": ctx, "status": "OOM"})
            continue
        floor = step_floor_ms(lm, b, ctx, ceil, torch.empty(0, dtype=ssm_dtype).element_size()) \
            if not small else float("nan")
        rows.append({"batch": b, "context": ctx, "status": "ok", "graph_ms": ms, "engine_step_ms": host,
                     "tokens_per_s": b / (host * 1e-3), "graph_tokens_per_s": b / (ms * 1e-3),
                     "floor_ms": floor, "fraction_of_floor": floor / ms if floor == floor else float("nan"),
                     "capture_s": capture_s, "naive_step": eng.naive_step, "compiled": bool(compile),
                     "ssm_dtype": str(ssm_dtype), "kernels_per_step": n_kernels.get(b),
                     "kernel_time_us": prof[b][1] if b in prof else None, "note": eng.note})
        print(f"  decode ({label}) ctx {ctx:>6} batch {b:>4}: graph {ms:7.2f} ms/step, "
              f"engine.step {host:7.2f} ms -> {b / (host * 1e-3):9.0f} tok/s (floor {floor:.2f} ms)", flush=True)
    del eng
    free_cuda()
    return rows


def max_rows(lm: HybridLM, ctx: int, cap: int, dev) -> tuple[int, int]:
    """The most rows whose decode state (ctx + margin tokens) fits in free memory, and the bytes per row."""
    with torch.device("meta"):
        meta_lm = HybridLM(lm.config).to(lm.dtype)
        per = DecodeState.allocate(meta_lm, 1, 1, kv_dtype=KV_DTYPE).bytes_per_row(ctx + 64)["total"]
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 2**28
    headroom = 3 * 2**30 if dev.type == "cuda" else 0
    b = max(0, (free - headroom) // (per + lm.config.vocab_size * 10))
    return int(min(b, cap)), per


def context_sweep(lm, name, contexts, steps, ceil, clk, small, cap) -> list[dict]:
    out = []
    for ctx in contexts:
        if clk.left() < 20:
            out.append({"model": name, "context": ctx, "status": "skipped (time)"})
            continue
        top, per_row = max_rows(lm, ctx, cap, lm.device)
        if top < 1:
            out.append({"model": name, "context": ctx, "status": "OOM", "max_batch": 0, "state_bytes_per_row": per_row})
            continue
        batches = [b for b in (1, 8, 32, 64, 128, 256, 512) if b < top] + [top]
        for attempt in range(3):
            rows = decode_sweep(lm, batches, ctx, steps, ceil, clk, small)
            if rows and rows[-1].get("status") == "OOM" and attempt < 2:
                top = int(top * 0.85)
                batches = [b for b in batches if b < top] + [top]
                continue
            break
        for r in rows:
            r.update(model=name, max_batch=top, state_bytes_per_row=per_row)
        out.extend(rows)
    return out


# ----------------------------------------------------------------------------- prefill, e2e, vision


def prefill_tps(eng: Engine, n: int, chunk: int, dev, reps: int) -> dict:
    ids = torch.randint(0, eng.vocab, (n,), device=dev)
    eng.prefill_tokens = chunk
    eng.prefix(ids[: 2 * chunk if 2 * chunk < n else n])  # warm-up: the chunked path's first masked call
    times = []
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        pre = eng.prefix(ids)
        sync(dev)
        times.append(time.perf_counter() - t)
        del pre
    s = statistics.median(times)
    return {"tokens": n, "chunk": chunk, "seconds": s, "tokens_per_s": n / s, "all_s": times}


def e2e(lm, dev, n_prompt: int, n_new: int) -> dict:
    ids = torch.randint(0, lm.config.vocab_size, (1, n_prompt), device=dev)
    out = {}
    for label, engine in (("engine", None), ("plain", False)):
        stamps = []
        sync(dev)
        t = time.perf_counter()
        toks = generate(lm, ids, n_new, eos_token_id=[], engine=engine,
                        streamer=lambda _: stamps.append(time.perf_counter()))
        total = time.perf_counter() - t
        dec = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        out[label] = {"tokens": toks[0].tolist(), "seconds": total, "first_token_s": stamps[0] - t,
                      "decode_tokens_per_s": 1 / dec}
    out["greedy_equal"] = out["engine"]["tokens"] == out["plain"]["tokens"]
    out["common_prefix"] = next((i for i, (a, b) in enumerate(zip(out["engine"]["tokens"], out["plain"]["tokens"]))
                                 if a != b), n_new)
    for k in ("engine", "plain"):
        out[k]["tokens"] = out[k]["tokens"][:8]
    from holotron.engine import release
    release(lm)
    return out


def agreement(lm, prefix, steps: int) -> dict:
    """The graph step (eager and compiled) against the plain loop (``HybridLM.forward`` on an
    InferenceState), all fed the plain loop's greedy tokens from the same prefilled prompt: per step,
    max |logit difference| / max |logit| and whether the argmax agrees; where it does not, the plain
    loop's gap between its two largest logits (a near-tie that rounding flips)."""
    P = prefix.length
    st = lm.new_state(1, capacity=P + steps + 1, kv_dtype=KV_DTYPE)
    out = {}
    with torch.inference_mode():
        for d, s in zip(st.layers, prefix.state.layers):
            if hasattr(d, "ssm"):
                d.conv.copy_(s.conv)
                d.ssm.copy_(s.ssm)
            elif d is not None:
                for a, b in zip(d.tensors(), s.tensors()):   # k, v (FP8: codes and scales)
                    a[:, :, :P].copy_(b[:, :, :P])
        st.seqlen = P
        engs = {"graph": Engine(lm, 1, P + steps + 16, keep_logits=True, kv_dtype=KV_DTYPE),
                "compiled_graph": Engine(lm, 1, P + steps + 16, keep_logits=True, compile=True, kv_dtype=KV_DTYPE)}
        for e in engs.values():
            e.state.load(0, prefix.state, 0)
            e.active[0] = 1
        stats = {k: {"rel_diff": [], "argmax_equal": [], "gap_where_unequal": []} for k in engs}
        tok = prefix.logits.argmax().view(1, 1)
        for _ in range(steps):
            ref = lm(tok, state=st, logits_to_keep=1)[0, -1]
            top2 = ref.topk(2).values
            for k, e in engs.items():
                e.tokens[0] = tok[0, 0]
                e.graphs[1].replay() if e.cuda_graph else e._step(1)
                got = e.logits[0]
                stats[k]["rel_diff"].append(float((got - ref).abs().max() / ref.abs().max()))
                eq = bool(got.argmax() == ref.argmax())
                stats[k]["argmax_equal"].append(eq)
                if not eq:
                    stats[k]["gap_where_unequal"].append(float(top2[0] - top2[1]))
            tok = ref.argmax().view(1, 1)
        for k, v in stats.items():
            out[k] = {"max_rel_logit_diff": max(v["rel_diff"]),
                      "median_rel_logit_diff": statistics.median(v["rel_diff"]),
                      "argmax_agree": f"{sum(v['argmax_equal'])}/{steps}",
                      "top2_gap_where_unequal": v["gap_where_unequal"]}
    del engs
    free_cuda()
    return out


def serving(lm, prefix, n_req: int, rows: int, suffix: int, dev, seed: int = 0, warmup: bool = True,
            repeats: int = 1, **engine_kw) -> dict:
    """Continuous batching with refill: ``n_req`` requests continuing one shared prefix (a screenshot +
    system prompt) with their own ``suffix``-token text, ``rows`` rows, 16..64 new tokens each. ``warmup``:
    the same workload first runs once untimed on its own engine, so that no kernel is compiled inside the
    timing (a first run pays Triton's compilation of every kernel variant it meets: about 1.3 s of 3.3 on an
    H200 with an empty cache, 2026-12-04). ``engine_kw``: ``Engine`` settings (its defaults otherwise). The
    engine captures its prefill graphs of the suffixes at every bucket of rows first, as a server at startup.
    ``repeats``: timed runs, each on a fresh engine; the figures are the median run's (by tokens/s), every run's
    tokens/s in ``tokens_per_s_runs`` (the section's spread between two runs on two machines was 3-10%,
    docs/benchmarks.md "Agents at concurrency, second run")."""

    def run():
        g = torch.Generator().manual_seed(seed)
        eng = Engine(lm, rows, prefix.length + suffix + 64 + 16, **{"kv_dtype": KV_DTYPE, **engine_kw})
        eng.capture_chunks([(b, suffix) for b in row_buckets(rows)])   # startup work, before the timing
        # mixed passes: the shapes met most (many rows decoding, a few admitted); others are captured in the run
        eng.capture_mixed([(nb, b, suffix) for nb in eng.batch_sizes if nb >= rows // 4 for b in (1, 2, 3, 4)])
        reqs = [eng.submit(torch.randint(0, lm.config.vocab_size, (suffix,), generator=g).to(dev), prefix=prefix,
                           max_new_tokens=int(torch.randint(16, 65, (1,), generator=g))) for _ in range(n_req)]
        steps, live = 0, []
        sync(dev)
        t = time.perf_counter()
        while not eng.idle:
            eng.step()
            steps += 1
            live.append(eng.live)
        sync(dev)
        s = time.perf_counter() - t
        toks = sum(len(r.tokens) for r in reqs)
        out = {"requests": n_req, "rows": rows, "prefix_tokens": prefix.length, "suffix_tokens": suffix,
               "new_tokens": toks, "steps": steps, "seconds": s, "tokens_per_s": toks / s,
               "mixed": eng.mixed, "prefill_graphs": eng.prefill_graphs, "step_prompt_max": eng.step_prompt_max,
               "ssm_dtype": str(eng.ssm_dtype).replace("torch.", ""), "mixed_graphs": len(eng.mixed_graphs),
               "kv_dtype": str(eng.kv_dtype).replace("torch.", ""),
               "mean_live_rows": statistics.mean(live), "all_done": all(r.done for r in reqs),
               "engine_stats": dict(eng.stats),
               "ttft_ms_p50": 1e3 * statistics.median(r.t_first - r.t_submit for r in reqs if r.t_first is not None)}
        del eng, reqs   # the engine's rows go before the next run's engine is built
        free_cuda()
        return out

    warm_s = run()["seconds"] if warmup else None
    runs = sorted((run() for _ in range(max(1, repeats))), key=lambda r: r["tokens_per_s"])
    out = dict(runs[len(runs) // 2])   # the median run (the upper one of an even count)
    out.update(warmup_run_s=warm_s, repeats=len(runs), tokens_per_s_runs=[r["tokens_per_s"] for r in runs])
    return out


def vision(dev, small: bool) -> dict:
    from benchmarks.bench_vision import randomize
    from holotron.vision import Projector, RadioVisionModel, VisionConfig, embed_tiles
    if small:
        cfg = VisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8, max_img_size=128,
                           image_size=64, projector_hidden_size=128, projector_output_size=96, num_prefix_tokens=16)
    else:
        cfg = VisionConfig(num_prefix_tokens=16)
    with torch.device("meta"):
        vm, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    vm, mlp1 = vm.to_empty(device=dev), mlp1.to_empty(device=dev)
    randomize(vm, 0)
    randomize(mlp1, 1)
    vm, mlp1 = vm.to(torch.bfloat16).eval(), mlp1.to(torch.bfloat16).eval()
    x = torch.randn(13, 3, cfg.image_size, cfg.image_size, device=dev, dtype=torch.bfloat16)
    with torch.inference_mode():
        ms = median_ms(lambda: embed_tiles(vm, mlp1, x), 3, 10, dev)
    return {"tiles": 13, "image_tokens": 13 * cfg.tokens_per_tile, "ms": ms, "tiles_per_s": 13 / (ms * 1e-3)}


# ----------------------------------------------------------------------------- chart, table


def chart(res: dict, png: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {4096: "tab:blue", 16384: "tab:orange", 65536: "tab:red", 1024: "tab:green"}
    for key, style, lab in (("decode_1k", "o-", ""), ("decode_1k_compiled", "^:", ", compiled step")):
        ok = [r for r in res.get(key, []) if isinstance(r, dict) and r.get("status") == "ok"]
        if ok:
            ax.plot([r["batch"] for r in ok], [r["tokens_per_s"] for r in ok], style, color=colors[1024],
                    label=f"hybrid, 1k context{lab}")
    for model, style in (("hybrid", "o-"), ("attention", "s--")):
        for ctx in (4096, 16384, 65536):
            rs = [r for r in res.get("contexts", []) if r.get("model") == model and r["context"] == ctx
                  and r.get("status") == "ok"]
            if rs:
                ax.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], style, color=colors[ctx],
                        label=f"{model}, {ctx // 1024}k context (largest batch {rs[-1]['max_batch']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sequences (batch)")
    ax.set_ylabel("decode tokens/s (one H200)")
    ax.set_title("holotron.engine decode, one H200: hybrid 12B vs same-size pure attention")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return png


def table(res: dict) -> None:
    print("\n== decode after a 1,024-token prompt (hybrid 12B) ==")
    print(f"{'step':>9} {'fused':>5} {'state':>9} {'batch':>6} {'kernels':>8} {'graph ms':>9} {'step ms':>8} "
          f"{'tok/s':>9} "
          f"{'graph tok/s':>11} {'floor ms':>9} {'of floor':>8}")
    for key in [k for k in res if k.startswith("decode_1k")]:
        for r in res[key] if isinstance(res[key], list) else []:
            if r.get("status") != "ok":
                print(f"{key:>9} {r['batch']:>6} {r['status']}")
                continue
            print(f"{'compiled' if r['compiled'] else 'eager':>9} {r.get('fused', 'auto'):>5} "
                  f"{r['ssm_dtype'].split('.')[-1]:>9} {r['batch']:>6} "
                  f"{r['kernels_per_step'] or '':>8} {r['graph_ms']:9.2f} {r['engine_step_ms']:8.2f} "
                  f"{r['tokens_per_s']:9.0f} {r['graph_tokens_per_s']:11.0f} {r['floor_ms']:9.2f} "
                  f"{r['fraction_of_floor']:8.0%}")
    print("\n== largest batch by context ==")
    ctxs = sorted({r["context"] for r in res.get("contexts", [])})
    for model in ("hybrid", "attention"):
        for ctx in ctxs:
            rs = [r for r in res.get("contexts", []) if r.get("model") == model and r["context"] == ctx]
            if not rs:
                continue
            last = rs[-1]
            if last.get("status") == "ok":
                print(f"{model:>9} {ctx:>6}: max batch {last['max_batch']:>4}  {last['tokens_per_s']:9.0f} tok/s "
                      f"({last['graph_ms']:.2f} ms/step)")
            else:
                print(f"{model:>9} {ctx:>6}: {last.get('status')}")
    for key in ("prefill", "e2e", "agreement", "serving", "vision"):
        if key in res:
            print(f"\n== {key} ==\n{json.dumps(res[key], default=str)[:600]}")


# ----------------------------------------------------------------------------- main


def _checked(ok, what: str):
    """An argparse type that keeps the flag's text once ``ok(text)`` holds, else one usage error naming ``what``."""
    def parse(s: str) -> str:
        try:
            good = ok(s)
        except ValueError:
            good = False
        if not good:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return s
    return parse


def _budget(s: str) -> float:
    _checked(lambda v: 0 < float(v) < float("inf"), "seconds > 0")(s)
    return float(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny configs (smoke test on any device)")
    ap.add_argument("--budget", type=_budget, default=210.0, help="seconds; later sections are skipped near it")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--decode-only", action="store_true",
                    help="only the decode sweeps at batch 1, 8, 64, 128: the plain and the fused step, fp32 / bf16 / "
                         "fp16 state (and the compiled step with --compile)")
    ap.add_argument("--serving-only", action="store_true",
                    help="only the serving section: 128 requests continuing one 1,024-token prefix, 64 rows")
    ap.add_argument("--quantize", choices=["fp8"], default=None,
                    help="FP8 weights for the language model's linear layers (holotron.quant.quantize_); with "
                         "--decode-only the eager step only (fp32 and bf16 state)")
    ap.add_argument("--fused", choices=["on", "off", "both"], default="both",
                    help="with --decode-only: the fused decode ops (holotron/decode_ops.py) on, off, or both")
    ap.add_argument("--compile", action="store_true", help="with --decode-only: also the torch.compiled step")
    ap.add_argument("--batches", default="1,8,64,128",
                    type=_checked(lambda v: v and min(int(x) for x in v.split(",")) >= 1,
                                  "a comma-separated list of integers >= 1"),
                    help="with --decode-only: the batch sizes")
    ap.add_argument("--states", default="fp32,bf16,fp16",
                    type=_checked(lambda v: v and set(v.split(",")) <= {"fp32", "bf16", "fp16"},
                                  "a comma-separated subset of fp32,bf16,fp16"),
                    help="with --decode-only: the Mamba state dtypes")
    ap.add_argument("--variants", default=None,
                    type=_checked(lambda v: v and set(v.split(",")) <= set(SERVING_VARIANTS),
                                  "a comma-separated subset of " + ",".join(SERVING_VARIANTS)),
                    help="with --serving-only: the engine settings to run (default: all of them)")
    ap.add_argument("--kv-dtype", choices=["auto", "fp8"], default="auto",
                    help="the engines' attention KV cache: auto = the model's dtype, fp8 = e4m3 with a scale per slot")
    args = ap.parse_args(argv)
    global KV_DTYPE
    KV_DTYPE = torch.float8_e4m3fn if args.kv_dtype == "fp8" else None
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not args.small:
        print("bench_serving: no CUDA GPU; use --small for a CPU smoke test", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    clk = Clock(args.budget)
    small = args.small
    hyb_cfg = TextConfig(**SMALL) if small else TextConfig()
    att_cfg = attention_config(hyb_cfg)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    batches = [1, 2, 4, 8] if small else [1, 8, 32, 64, 128, 256]
    contexts = [64, 256, 1024] if small else [4096, 16384, 65536]
    prompt = 64 if small else 1024
    steps = 6 if small else 16
    res: dict = {
        "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "python": platform.python_version(), "small": small,
        "fused_prefill": mamba2.FUSED_PREFILL,  # HOLOTRON_FUSED_PREFILL
        "chunk_step": engine_chunks.CHUNK_STEP,  # HOLOTRON_CHUNK_STEP
        "norm16": layers.NORM16,  # HOLOTRON_NORM16
        "prefix_graphs": engine_sessions.PREFIX_GRAPHS,  # HOLOTRON_PREFIX_GRAPHS
        "batch_loads": engine_sessions.BATCH_LOADS,  # HOLOTRON_BATCH_LOADS
        "state_stacks": holo_state.STACKS,  # HOLOTRON_STATE_STACKS
        "lazy_rows": engine_sessions.LAZY_ROWS,  # HOLOTRON_LAZY_ROWS
        "command": "PYTHONPATH=. python3 benchmarks/bench_serving.py" + (" --small" if small else "")
                   + (" --decode-only" if args.decode_only else "")
                   + (" --serving-only" if args.serving_only else "")
                   + (f" --fused {args.fused} --batches {args.batches} --states {args.states}" if args.decode_only
                      else "") + (" --compile" if args.compile else "")
                   + (f" --kv-dtype {args.kv_dtype}" if args.kv_dtype != "auto" else "")
                   + (f" --variants {args.variants}" if args.variants else ""),
        "kv_dtype": args.kv_dtype,
    }
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    res["state_bytes_per_sequence"] = {"hybrid": state_bytes(hyb_cfg, [4096, 32768, 131072]),
                                       "attention": state_bytes(att_cfg, [4096, 32768, 131072])}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_serving.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    def section(name, fn):
        if clk.left() < 10:
            res[name] = "skipped (time)"
            return None
        t = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001
            res[name] = "OOM" if is_oom(e) else f"error: {type(e).__name__}: {e}"
            traceback.print_exc()
            free_cuda()
            out = None
        else:
            res[name] = out
        print(f"[{clk.elapsed():6.1f} s] {name} done in {time.perf_counter() - t:.1f} s", flush=True)
        save()
        return out

    res["ceilings"] = ceilings(dev, small)
    ceil = res["ceilings"]
    print(f"{res['device']}  torch {res['torch']}  triton {res['triton']}  copy {ceil['copy_GBps']:.0f} GB/s  "
          f"bf16 matmul {ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s  KV cache {args.kv_dtype}", flush=True)

    t = time.perf_counter()
    lm = build(hyb_cfg, dev, dtype)
    if args.quantize:
        from holotron.quant import quantize_

        quantize_(lm, args.quantize)
        res["command"] += f" --quantize {args.quantize}"
    res["quantize"] = args.quantize
    res["hybrid"] = {"params": lm.num_parameters(), "pattern": hyb_cfg.hybrid_override_pattern,
                     "build_s": time.perf_counter() - t}
    print(f"hybrid: {lm.num_parameters() / 1e9:.2f} B parameters, built in {time.perf_counter() - t:.1f} s", flush=True)

    # the 1k prompt, prefilled for real (also compiles the scan kernels), then the decode sweep
    helper = Engine(lm, max_batch=1, max_len=prompt + 64, cuda_graph=False, kv_dtype=KV_DTYPE)  # the prefix's format
    ids = torch.randint(0, hyb_cfg.vocab_size, (prompt,), device=dev)
    t = time.perf_counter()
    pre = helper.prefix(ids)
    sync(dev)
    res["prompt_prefill_first_s"] = time.perf_counter() - t
    logits_ok = bool(torch.isfinite(pre.logits).all())
    res["prompt_logits_finite"] = logits_ok
    # F821 noqa: ruff misreads a lambda over names `del`-ed after it has run (astral-sh/ruff#9858)
    if args.decode_only:
        batches = [1, 2, 4, 8] if small else [int(v) for v in args.batches.split(",")]
        # (fused, compiled, state): the plain step first (the figures before the fused ops), then the fused one
        configs = [("off", False, torch.float32), ("on", False, torch.float32), ("off", False, torch.bfloat16),
                   ("on", False, torch.bfloat16), ("on", False, torch.float16)]
        if args.compile:
            configs += [("on", True, torch.bfloat16), ("off", True, torch.bfloat16)]
        if args.fused != "both":
            configs = [c for c in configs if c[0] == args.fused]
        named = dict(fp32=torch.float32, bf16=torch.bfloat16, fp16=torch.float16)
        configs = [c for c in configs if c[2] in [named[v] for v in args.states.split(",")]]
        for fz, comp, sdt in configs:
            key = "decode_1k" + ("_compiled" if comp else "") + {torch.float32: "", torch.bfloat16: "_bf16",
                                                                  torch.float16: "_fp16"}[sdt] + f"_fused_{fz}"
            section(key, lambda: decode_sweep(lm, batches, prompt, steps, ceil, clk, small, prefix=pre,  # noqa: F821
                                              compile=comp, ssm_dtype=sdt, fused=fz))  # noqa: B023
        res["elapsed_s"] = clk.elapsed()
        save()
        table(res)
        return 0
    if args.serving_only:  # the engine's defaults, then other engine settings on the same workload (same run)
        n_req, rows = (16, 4) if small else (128, 64)
        variants = {k: kw for k, kw in SERVING_VARIANTS.items()
                    if args.variants is None or k in args.variants.split(",")}
        for key, kw in variants.items():
            section(key, lambda kw=kw: serving(lm, pre, n_req, rows, 16, dev, repeats=1 if small else 3,  # noqa: F821
                                               **kw))
        res["elapsed_s"] = clk.elapsed()
        save()
        keys = tuple(variants)
        print(json.dumps({k: res[k] for k in keys}, indent=1, default=str))
        return 0
    section("decode_1k", lambda: decode_sweep(lm, batches, prompt, steps, ceil, clk, small, prefix=pre))  # noqa: F821
    section("prefill", lambda: [prefill_tps(helper, 1024 if small else 16384, c, dev, 3)  # noqa: F821
                                for c in ((256, 1024) if small else (8192, 16384))])
    del helper
    free_cuda()
    section("e2e", lambda: e2e(lm, dev, prompt, 8 if small else 32))
    section("serving", lambda: serving(lm, pre, 16 if small else 128, 4 if small else 64, 16, dev))  # noqa: F821
    res.setdefault("contexts", [])
    section("contexts_hybrid", lambda: context_sweep(lm, "hybrid", contexts, 8, ceil, clk, small, 512))
    if isinstance(res.get("contexts_hybrid"), list):
        res["contexts"] += res["contexts_hybrid"]
    if clk.left() > 110:  # torch.compile of the whole step: tens of seconds on a cold cache
        t = time.perf_counter()
        section("decode_1k_compiled", lambda: decode_sweep(lm, batches, prompt, steps, ceil, clk, small,
                                                           prefix=pre, compile=True))  # noqa: F821
        res["compile_and_sweep_s"] = time.perf_counter() - t
        section("agreement", lambda: agreement(lm, pre, 32))  # noqa: F821
    else:
        res["decode_1k_compiled"] = "skipped (time)"
    del pre
    del lm
    free_cuda()
    if clk.left() > 40:
        t = time.perf_counter()
        lm = build(att_cfg, dev, dtype, seed=1)
        res["attention"] = {"params": lm.num_parameters(), "pattern": att_cfg.hybrid_override_pattern,
                            "intermediate_size": att_cfg.intermediate_size, "build_s": time.perf_counter() - t}
        print(f"attention: {lm.num_parameters() / 1e9:.2f} B parameters", flush=True)
        section("contexts_attention", lambda: context_sweep(lm, "attention", contexts, 8, ceil, clk, small, 512))
        if isinstance(res.get("contexts_attention"), list):
            res["contexts"] += res["contexts_attention"]
        del lm
        free_cuda()
    else:
        res["attention"] = "skipped (time)"
    section("vision", lambda: vision(dev, small))
    if dev.type == "cuda":
        res["peak_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    res["chart"] = chart(res, os.path.join(args.out, "serving_chart.png"))
    res["elapsed_s"] = clk.elapsed()
    save()
    table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
