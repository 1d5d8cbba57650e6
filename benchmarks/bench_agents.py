"""Computer-use agents at concurrency on one GPU: N agents, each a multi-turn session of holotron.engine,
every turn a new screenshot plus a short instruction answered by ~100 generated tokens, zero think time;
throughput and latency against N, for the hybrid Nemotron-H 12B VL model and for the same model with a
pure-attention language model of the same parameter count (modelled on H Company's experiment: 100
concurrent computer-use agents on one GPU, throughput against concurrency).

    PYTHONPATH=. python3 benchmarks/bench_agents.py                  # CUDA; JSON + PNG to $OUT (or .)
    PYTHONPATH=. python3 benchmarks/bench_agents.py --cases one-tile --agents 1,8,32,64,100 --budget 540
    PYTHONPATH=. python3 benchmarks/bench_agents.py --small          # tiny configs, any device (smoke test)
    PYTHONPATH=. python3 benchmarks/bench_agents.py --cases twelve-tile --agents 100 --max-rows 32  # offload
    PYTHONPATH=. python3 benchmarks/bench_agents.py --cases twelve-tile --agents 256 --kv-dtype fp8 --ssm-dtype bfloat16

Workload, per (model, case, N): N agents, ``--turns`` turns each (default 8). A turn is one screenshot
(case ``one-tile``: 1 tile; case ``twelve-tile``: 12 tiles + the thumbnail = 13 tiles), i.e. tiles x 256
``<image>`` tokens at 12B, then 40..80 random text tokens, answered by exactly 80..120 generated tokens
(``eos_token_id=[]``: the weights are random); the lengths are drawn uniformly from a seeded generator,
the same for both models. Every agent opens a session and submits turn 1; then ``Engine.step()`` runs in
a loop and an agent whose turn is done submits its next one on the same session at once, so each turn
prefills only its own new tokens; an agent that has done its turns closes its session. The engine has
``max_batch`` = N rows, or as many as fit in the free GPU memory less ``--margin-gib`` (10 GiB; the captured
graphs, the vision encoder's batches and the prefill's activations live there; ``Engine.rows_that_fit``),
or ``--max-rows``: the other sessions then wait in host memory (``offload``: a session whose turn has
just ended is saved to the host when a queued turn needs its row) and are restored when their next turn
is admitted. ``max_len`` is the longest history an agent reaches plus 64 tokens, rounded up to 256.
``--kv-dtype fp8``: the attention layers' KV cache in FP8 (``Engine(kv_dtype=torch.float8_e4m3fn)``: e4m3 codes and
a scale per slot, holotron/kv_cache.py); the rows that fit and the host bytes are counted with its bytes
(``auto``: the model's dtype, as before).
Random bf16 weights initialised on the GPU (no CPU copy of the 12B weights): the language model is
bench_serving's ``build``, RADIO ViT-H/16 + mlp1 are bench_vision's ``randomize``; the screenshot is one
random normal tensor (tiles, 3, 512, 512) shared by every turn (the encoder's work does not depend on
the values). Before the timed run, one warm-up turn (Triton JIT, cuBLAS) runs on the same engine and
the engine's counters are reset.

Reported per (model, case, N): output tokens/s and total tokens/s ((prompt tokens, image tokens included,
+ output tokens) / wall time from the first submit to the last token); time to first token and per-turn
latency, p50 / p95 over every turn (``t_first - t_submit``, ``t_done - t_submit``: queueing included);
peak GPU memory (``torch.cuda.max_memory_allocated`` from before the engine is built); rows, state
bytes per row, sessions in host memory at the peak; the engine's phase seconds (``timing=True``, the
default ``--phase-timing on``, waits for the GPU after each phase: decode = moving the decoding rows
together, graph replay, token read-back, bookkeeping; admit = rows, saves to and restores from the host,
embedding, the vision encoder; prefill = the chunks run alone; mixed = the passes that ran a chunk and the
decoding rows' tokens together, ``Engine(mixed=True)``; those waits keep the host from queueing a phase
while the GPU runs the one before, so ``--phase-timing off`` gives the throughput without them, its phase
seconds host-side only); errors (``req.error``) and whether every turn completed.

Decode efficiency: the engine's decode tokens/s during its decode phase (the tokens of captured steps alone,
not those of mixed passes, over ``decode_s``) divided by the captured step alone (``eng.graphs[b].replay()``,
CUDA events, 10 reps, right after the run on the state it left, rows [0, b) active as in a step of the run:
``step_ms``) at b = the captured size for min(N, rows), counting min(N, rows) tokens a step; both numbers are
printed. That ratio also falls when fewer rows decode (turns prefilling, agents finished), so
``graph_fraction`` gives the overhead alone: the replay time of the batch sizes the run actually stepped at,
summed over its steps, over ``decode_s``.

An out-of-memory is recorded as "OOM" and the sweep goes on; the largest N that ran is reported per
model and case; configurations left when ``--budget`` seconds are near (each (model, case) gets an
equal share of what is left, estimated from the previous N) are recorded as "skipped (time)", a run
still going at the end of the budget is cut ("cut (time)", its completed turns counted); a
configuration whose host-side sessions would not fit in 80 % of the available host memory is
"skipped (host memory)", unless ``--host-limit-gib`` bounds them: past it a session is dropped and its next
turn prefills its whole conversation again (``Engine(host_limit=)``; ``sessions_dropped``, ``replayed_turns``
and ``replayed_tokens`` count it; replayed tokens are not counted as throughput). The JSON
(``bench_agents.json``) is rewritten after every configuration.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import platform
import shlex
import sys
import time
import traceback
from collections import Counter

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_serving import SMALL, Clock, attention_config, build, free_cuda, is_oom, sync  # noqa: E402
from bench_vision import randomize  # noqa: E402
from timing import times_ms  # noqa: E402  (benchmarks/ is on sys.path)

from holotron import engine_chunks, engine_sessions, layers, mamba2  # noqa: E402
from holotron import state as holo_state  # noqa: E402
from holotron.config import TextConfig  # noqa: E402
from holotron.engine import Engine, row_bytes  # noqa: E402
from holotron.engine_chunks import row_buckets  # noqa: E402
from holotron.model import Holotron, HolotronConfig  # noqa: E402
from holotron.state_snapshot import pinned_held, pooled_bytes, reserve_pages  # noqa: E402
from holotron.vision import VisionConfig  # noqa: E402

CASES = {"one-tile": 1, "twelve-tile": 13}           # tiles per screenshot (12 + the thumbnail)
PROGRESS_S = 30.0   # seconds between a run's progress lines (and the JSON's "running" entry)
IMAGE_TOKEN_ID = 18                                  # <image>; random text ids are drawn from [32, vocab)
TEXT_ID_LOW = 32
SMALL_VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, mlp_ratio=2.0,
                    max_img_size=64, num_prefix_tokens=4, image_size=32, projector_hidden_size=48)


# ----------------------------------------------------------------------------- the models


@torch.no_grad()
def build_vl(text: TextConfig, vision: VisionConfig, dev: torch.device, dtype: torch.dtype, seed: int = 0) -> Holotron:
    """A Holotron with random weights made on ``dev``: the language model through ``build``, RADIO + mlp1
    on the meta device, then allocated on ``dev`` in ``dtype`` and filled there (``randomize``)."""
    cfg = HolotronConfig(text=text, vision=vision, image_token_id=IMAGE_TOKEN_ID)
    with torch.device("meta"):
        model = Holotron(cfg)
    model.language_model = build(text, dev, dtype, seed)
    model.vision_model = model.vision_model.to(dtype).to_empty(device=dev)
    model.mlp1 = model.mlp1.to(dtype).to_empty(device=dev)
    randomize(model.vision_model, seed + 1)
    randomize(model.mlp1, seed + 2)
    return model.eval()


def configs(small: bool) -> dict[str, tuple[TextConfig, VisionConfig]]:
    hyb = TextConfig(**SMALL) if small else TextConfig()
    att = attention_config(hyb)
    vis = dict(SMALL_VISION) if small else dict(num_prefix_tokens=16)   # ViT-H/16, 512-pixel tiles
    return {name: (t, VisionConfig(**vis, projector_output_size=t.hidden_size))
            for name, t in (("hybrid", hyb), ("attention", att))}


# ----------------------------------------------------------------------------- the workload


def make_plan(n_agents: int, turns: int, image_tokens: int, text: tuple[int, int], gen: tuple[int, int],
              vocab: int, seed: int = 0) -> list[list[tuple[torch.Tensor, int]]]:
    """Per agent, per turn: (prompt ids: the screenshot's <image> tokens then random text, new tokens)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.full((image_tokens,), IMAGE_TOKEN_ID, dtype=torch.long)
    plan = []
    for _ in range(n_agents):
        agent = []
        for _ in range(turns):
            n_text = int(torch.randint(text[0], text[1] + 1, (1,), generator=g))
            n_new = int(torch.randint(gen[0], gen[1] + 1, (1,), generator=g))
            agent.append((torch.cat([img, torch.randint(TEXT_ID_LOW, vocab, (n_text,), generator=g)]), n_new))
        plan.append(agent)
    return plan


def history(agent: list[tuple[torch.Tensor, int]]) -> int:
    return sum(ids.numel() + n for ids, n in agent)


def host_available() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pct(xs: list[float], q: float) -> float:
    """The q-quantile, linear between the closest ranks; nan for no values."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ----------------------------------------------------------------------------- one configuration


def step_ms(eng: Engine, b: int, reps: int) -> float:
    """Milliseconds of the decode step at captured batch b alone: the graph replayed (CUDA events), or the
    eager step without CUDA graphs; on the state and lengths the run left, with rows [0, b) active, as a step
    of the run has them: an inactive row skips its Mamba state stores, and timing the step on the idle rows
    the run leaves behind (every turn done) made it about 3.5 ms (a quarter) faster than any step of the run at
    100 one-tile hybrid rows. The replays write those rows' states and next tokens: call it once the run is over
    (its sessions are closed next); ``active``, ``tokens`` and the lengths are put back."""
    fn = eng.graphs[b].replay if eng.cuda_graph else (lambda: eng._step(b))
    with torch.inference_mode():
        kept = [(t, t.clone()) for t in (eng.active, eng.tokens, eng.state.lengths)]
        eng.active[:b].fill_(1)
        try:
            return pct(times_ms(fn, 1, reps, eng.device), 0.5)
        finally:
            for t, v in kept:
                t.copy_(v)


def run_agents(model, plan, tiles: int, rows: int, max_len: int, args, deadline: float, report=None) -> dict:
    """The agent loop on a fresh engine; the measurements of one (model, case, N). ``report(dict)``, when given,
    gets the warm-up's parts and then, every ``PROGRESS_S`` seconds of the run, the turns done so far and the
    engine's phase seconds (printed too), so a run killed from outside leaves where it was in the JSON."""
    dev = model.device
    n = len(plan)
    px = torch.randn(tiles, 3, model.config.vision.image_size, model.config.vision.image_size, device=dev,
                     dtype=model.dtype, generator=torch.Generator(device=dev).manual_seed(7))
    image_kw = dict(pixel_values=px, num_tiles=[tiles])
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()   # host pages for saved sessions, allocated now as a server would at startup
    reserved = reserve_pages(int(getattr(args, "host_reserve_gib", 0) * 2**30)) if dev.type == "cuda" else 0
    reserve_s = time.perf_counter() - t
    t = time.perf_counter()
    eng = Engine(model, max_batch=rows, max_len=max_len, prefill_tokens=args.prefill_tokens,
                 timing=args.phase_timing == "on",
                 ssm_dtype=args.ssm_dtype, kv_dtype=args.kv_dtype, overlap=args.overlap == "on",
                 mixed=None if args.mixed == "auto" else args.mixed == "on" and args.overlap != "on",
                 prefill_graphs=None if args.prefill_graphs == "auto" else args.prefill_graphs == "on",
                 step_prompt_max=args.step_prompt_max, prefill_min_tokens=args.prefill_min_tokens,
                 vision_stream=args.vision_stream == "on", cuda_graph=getattr(args, "cuda_graph", None),
                 host_limit=_host_limit(args))
    setup_s = time.perf_counter() - t

    watch = getattr(args, "watchdog", 0)
    if watch:   # a step that never returns (a GPU kernel that does not end): every thread's stack on stderr
        faulthandler.dump_traceback_later(watch, repeat=True)
    # warm-up: one turn alone, then turns of min(N, 4) sessions together, the second turn of each too
    # (Triton JIT of the scan's launch settings for one and for several sequences, vision, cuBLAS), and the
    # prefill graphs of whole turns at every bucket of rows (what a server captures at startup); the
    # counters are reset after it (graphs the run still meets are captured in it: chunk_captures,
    # mixed_captures, capture_s)
    t = time.perf_counter()
    parts = {}

    def part(name, t_prev):
        sync(dev)
        now = time.perf_counter()
        parts[name] = round(now - t_prev, 2)
        if report:
            report({"warmup": dict(parts)})
        return now

    turn_len = sorted({len(p[0]) + 1 for a in plan for p in a})
    eng.capture_chunks([(b, tl) for b in row_buckets(min(n, rows)) for tl in turn_len])  # every bucket they meet
    tp = part("chunk_graphs", t)
    eng.capture_vision(row_buckets(min(eng.vision_tiles, n * tiles)))
    tp = part("vision_graphs", tp)
    # a mixed engine: the passes of the shapes met most (many rows decoding, a few turns admitted a step)
    live = min(n, rows)
    eng.capture_mixed([(nb, b, tl) for nb in eng.batch_sizes if live // 2 <= nb <= live for b in (1, 2, 3, 4)
                       for tl in turn_len])
    tp = part("mixed_graphs", tp)
    for k in (1, min(n, 4)):
        ss = [eng.session() for _ in range(k)]
        for turn in range(min(2, len(plan[0]))):
            warm = [eng.submit(plan[i][turn][0], session=q, max_new_tokens=2, eos_token_id=[], **image_kw)
                    for i, q in enumerate(ss)]
            eng.run()
            bad = [w.error for w in warm if w.error]
            if bad:
                raise RuntimeError(f"warm-up turn failed: {bad[0]}")
        for q in ss:
            eng.close(q)
    part("warm_turns", tp)
    eng.reset_stats()
    warmup_s = time.perf_counter() - t
    print(f"  warm-up {warmup_s:.1f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items()), flush=True)

    sessions = [eng.session() for _ in range(n)]
    nxt, cur, reqs, n_prompt = [0] * n, [None] * n, [], {}

    def submit(i):
        ids, n_new = plan[i][nxt[i]]
        cur[i] = eng.submit(ids, session=sessions[i], max_new_tokens=n_new, eos_token_id=[], **image_kw)
        n_prompt[id(cur[i])] = ids.numel()   # a replayed turn's input_ids grow by its conversation (host limit)
        reqs.append(cur[i])
        nxt[i] += 1

    per_step = Counter()   # decoding rows per engine step -> steps
    host_peak, host_bytes_peak, cut, stalled = 0, 0, False, False
    timeline = []   # (s, turns done, tokens counted as in total_tokens_per_s) at each progress line
    sync(dev)
    t0 = time.perf_counter()
    for i in range(n):
        submit(i)
    waiting = set(range(n))
    t_report = t_armed = t0
    if watch:
        faulthandler.dump_traceback_later(watch, repeat=True)
    while waiting:
        now = time.perf_counter()
        if now > deadline:
            cut = True
            break
        if watch and now - t_armed > 1.0:   # re-armed about once a second while steps return
            faulthandler.dump_traceback_later(watch, repeat=True)
            t_armed = now
        if now - t_report > PROGRESS_S:
            t_report = now
            done = sum(1 for r in reqs if r.done)
            st = eng.stats
            tokens = sum(n_prompt[id(r)] for r in reqs if r.t_first is not None) + sum(len(r.tokens) for r in reqs)
            timeline.append((round(now - t0, 1), done, tokens))
            prog = {"s": round(now - t0, 1), "turns_done": done, "tokens": tokens,
                    "turns_expected": sum(len(a) for a in plan),
                    "agents_done": n - len(waiting), "steps": eng.steps,
                    "on_host": sum(1 for q in sessions if q.on_host),
                    **{k: round(st[k], 1) for k in ("decode_s", "prefill_s", "admit_s", "mixed_s")},
                    **_host_memory()}
            print("  progress " + " ".join(f"{k} {v}" for k, v in prog.items()), flush=True)
            if report:
                report({"warmup": dict(parts), "progress": prog})
        before, mixed_before = eng.stats["decode_tokens"], eng.stats["mixed_steps"]
        eng.step()
        if eng.stats["mixed_steps"] == mixed_before:   # the decode phase: a captured step alone
            per_step[eng.stats["decode_tokens"] - before] += 1
        for i in sorted(i for i in waiting if cur[i].done):
            if cur[i].error is None and nxt[i] < len(plan[i]):
                submit(i)
            else:   # the agent is done: its session ends (its row is free, nothing goes to the host)
                waiting.discard(i)
                eng.close(sessions[i])
        if rows < n:
            on_host = [q for q in sessions if q.on_host]
            if len(on_host) > host_peak or eng.steps % 32 == 0:
                host_peak = max(host_peak, len(on_host))
                host_bytes_peak = max(host_bytes_peak, sum(q.snapshot.nbytes() for q in on_host))
        if waiting and eng.idle:   # nothing queued or running, yet turns are not done: the engine lost them
            stalled = True
            break
    sync(dev)
    if watch:
        faulthandler.cancel_dump_traceback_later()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")

    # the captured step alone, on the state the run left: at min(N, rows), and at every size the run used
    live = min(n, rows)
    size = {m: next(b for b in eng.batch_sizes if b >= m) for m in per_step if m}
    b_main = next(b for b in eng.batch_sizes if b >= live)
    reps = 10 if args.small or dev.type == "cuda" else 3
    graph_ms = {b_main: step_ms(eng, b_main, reps)}
    for b in sorted(set(size.values()) - {b_main}):
        graph_ms[b] = step_ms(eng, b, max(3, reps // 2))
    graph_s = sum(k * graph_ms[size[m]] * 1e-3 for m, k in per_step.items() if m)
    mem = eng.memory()
    st = dict(eng.stats)
    prefilled = eng.prefill_tokens_done
    # the turns that finished, counted before the sessions close: closing one cancels its turn in flight, which
    # marks that turn done too (a cut run's count and latencies included those before)
    finished = [r for r in reqs if r.done and r.error is None]
    for q in sessions:
        eng.close(q)
    note = eng.note

    started = [r for r in reqs if r.t_first is not None]
    prompt = sum(n_prompt[id(r)] for r in started)
    out_tok = sum(len(r.tokens) for r in reqs)
    alone = st["decode_tokens"] - st["mixed_tokens"]   # decode tokens of captured steps (not of mixed passes)
    engine_tps = alone / st["decode_s"] if st["decode_s"] else float("nan")
    graph_tps = live / (graph_ms[b_main] * 1e-3)
    expected = sum(len(a) for a in plan)
    errors = [r.error for r in reqs if r.error is not None]
    status = "cut (time)" if cut else "stalled" if stalled else "ok"
    return {
        "status": status, "rows": rows, "max_len": max_len, "turns_expected": expected,
        "turns_completed": len(finished), "all_turns_completed": len(finished) == expected and not errors,
        "errors": len(errors), "first_errors": errors[:3],
        "prompt_tokens": prompt, "output_tokens": out_tok, "prefilled_tokens": prefilled, "wall_s": wall,
        "timeline": timeline + [(round(wall, 1), len(finished), prompt + out_tok)],   # runs compared at equal shares
        "output_tokens_per_s": out_tok / wall, "total_tokens_per_s": (prompt + out_tok) / wall,
        "ttft_p50_s": pct([r.t_first - r.t_submit for r in started], 0.5),
        "ttft_p95_s": pct([r.t_first - r.t_submit for r in started], 0.95),
        "latency_p50_s": pct([r.t_done - r.t_submit for r in finished], 0.5),
        "latency_p95_s": pct([r.t_done - r.t_submit for r in finished], 0.95),
        "peak_GiB": peak, "state_bytes_per_row": mem["row_bytes"], "state_mamba_bytes_per_row": mem["row_mamba_bytes"],
        "state_kv_bytes_per_row": mem["row_kv_bytes"], "state_GiB": mem["state_bytes"] / 2**30,
        "sessions_on_host_peak": host_peak, "host_GiB_peak": host_bytes_peak / 2**30,
        "pinned_GiB_peak": _pinned_peak() / 2**30,
        "sessions_dropped": st["sessions_dropped"], "replayed_turns": st["replayed_turns"],
        "replayed_tokens": st["replayed_tokens"], "row_moves": st.get("row_moves", 0),
        "decode_steps": st["decode_steps"], "decode_tokens": st["decode_tokens"],
        "mean_decode_rows": st["decode_tokens"] / st["decode_steps"] if st["decode_steps"] else 0.0,
        "mixed": eng.mixed, "mixed_steps": st["mixed_steps"], "mixed_decode_tokens": st["mixed_tokens"],
        "prefill_graphs": eng.prefill_graphs, "chunk_graphs": len(eng.chunk_graphs),
        "vision_graphs": len(eng.vision_graphs or {}),
        "chunk_captures_in_run": st["chunk_captures"], "capture_s_in_run": st["capture_s"],
        "chunk_tokens": st["chunk_tokens"], "chunk_slots": st["chunk_slots"],   # bucketed chunks: pads = slots - tokens
        "mixed_graphs": len(eng.mixed_graphs), "mixed_captures_in_run": st["mixed_captures"],
        "decode_s": st["decode_s"], "prefill_s": st["prefill_s"], "admit_s": st["admit_s"], "mixed_s": st["mixed_s"],
        "vision_s": st.get("vision_s", 0.0), "vision_tiles": st.get("vision_tiles", 0),
        "vision_calls": st.get("vision_calls", 0),
        "other_s": wall - st["decode_s"] - st["prefill_s"] - st["admit_s"] - st["mixed_s"],
        "engine_decode_tokens_per_s": engine_tps, "graph_batch": b_main, "graph_ms": graph_ms[b_main],
        "graph_tokens_per_s": graph_tps, "decode_efficiency": engine_tps / graph_tps,
        "graph_ms_by_batch": {str(b): v for b, v in sorted(graph_ms.items())},
        "graph_fraction": graph_s / st["decode_s"] if st["decode_s"] else float("nan"),
        "setup_s": setup_s, "warmup_s": warmup_s, "note": note,
        "host_reserve_GiB": reserved / 2**30, "host_reserve_s": reserve_s,
        "host_pages_free_GiB": pooled_bytes() / 2**30,
    }


# ----------------------------------------------------------------------------- the sweep


def sweep(args, res: dict, save) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    clk = Clock(args.budget)
    reserve = 5.0 if args.small else 20.0   # seconds kept for the table and the chart
    cfgs = configs(args.small)
    text, gen = ((8, 16), (6, 10)) if args.small else ((40, 80), (80, 120))
    res["workload"] = {"turns": args.turns, "text_tokens": list(text), "new_tokens": list(gen),
                       "tiles": {c: CASES[c] for c in args.cases}, "seed": args.seed}
    res["models"], rows_out = {}, res["rows"]
    for mi, name in enumerate(args.models):
        tcfg, vcfg = cfgs[name]
        todo = [(c, n) for c in args.cases for n in args.agents]
        if clk.left() < reserve + 10:
            rows_out += [{"model": name, "case": c, "agents": n, "status": "skipped (time)"} for c, n in todo]
            save()
            continue
        t = time.perf_counter()
        model = build_vl(tcfg, vcfg, dev, dtype, seed=mi)
        if args.quantize:   # FP8 weights for the language model's linear layers (holotron/quant.py)
            from holotron.quant import quantize_

            quantize_(model, args.quantize)
        lm = model.language_model
        res["models"][name] = {"params": model.num_parameters(), "lm_params": lm.num_parameters(),
                               "pattern": tcfg.hybrid_override_pattern, "intermediate_size": tcfg.intermediate_size,
                               "tokens_per_tile": model.config.tokens_per_tile, "build_s": time.perf_counter() - t}
        print(f"{name}: {model.num_parameters() / 1e9:.2f} B parameters ({lm.num_parameters() / 1e9:.2f} B LM), "
              f"built in {time.perf_counter() - t:.1f} s", flush=True)
        for ci, case in enumerate(args.cases):
            groups_left = (len(args.models) - mi) * len(args.cases) - ci
            group_end = clk.elapsed() + max(0.0, clk.left() - reserve) / groups_left
            tiles = CASES[case]
            prev = None   # (agents, seconds) of the previous configuration that ran
            for n in args.agents:
                row = {"model": name, "case": case, "agents": n, "turns": args.turns, "tiles": tiles,
                       "image_tokens_per_turn": tiles * model.config.tokens_per_tile}
                est = prev[1] * (n / prev[0]) ** 0.75 if prev else 0.0   # measured: time grows slower than N
                if clk.left() < reserve + 5 or (prev and clk.elapsed() + est > group_end):
                    row["status"] = "skipped (time)"
                    rows_out.append(row)
                    save()
                    continue
                plan = make_plan(n, args.turns, tiles * model.config.tokens_per_tile, text, gen,
                                 tcfg.vocab_size, args.seed)
                max_len = -(-(max(history(a) for a in plan) + 64) // 256) * 256
                rows = n
                free_cuda()
                if dev.type == "cuda":
                    free = torch.cuda.mem_get_info(dev)[0] - int(args.margin_gib * 2**30)
                    rows = min(n, Engine.rows_that_fit(model, max_len, max(0, free), args.ssm_dtype, args.kv_dtype))
                if args.max_rows:
                    rows = min(rows, args.max_rows)
                row.update(max_len=max_len, rows=rows)
                if rows < 1:
                    row["status"] = "OOM"
                    row["why"] = "not one row of max_len tokens fits next to the weights"
                    rows_out.append(row)
                    save()
                    continue
                need = (n - rows) * row_bytes(lm, max_len, args.ssm_dtype, args.kv_dtype)["total"]
                avail = host_available()
                limit = _host_limit(args)
                if limit is not None:
                    need = min(need, limit)   # past it sessions are dropped, not saved
                if need and avail is not None and need > 0.8 * avail:
                    row["status"] = "skipped (host memory)"
                    row["why"] = (f"{n - rows} sessions on the host need up to {need / 2**30:.0f} GiB, "
                                  f"{avail / 2**30:.0f} GiB available" if limit is None or need < limit else
                                  f"--host-limit-gib {args.host_limit_gib:g} is more than 80% of the "
                                  f"{avail / 2**30:.0f} GiB available; pass a smaller one")
                    rows_out.append(row)
                    save()
                    continue
                t = time.perf_counter()
                try:
                    res["running"] = dict(row)

                    def report(d, running=res["running"]):
                        running.update(d)
                        save()

                    row.update(run_agents(model, plan, tiles, rows, max_len, args, clk.t0 + args.budget - reserve,
                                          report))
                except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                    row["status"] = "OOM" if is_oom(e) else f"error: {type(e).__name__}: {str(e)[:300]}"
                    if not is_oom(e):
                        traceback.print_exc()
                row["seconds"] = time.perf_counter() - t
                faulthandler.cancel_dump_traceback_later()   # (--watchdog) also after an error
                res.pop("running", None)
                free_cuda()
                rows_out.append(row)
                save()
                if row["status"] == "ok":
                    prev = (n, row["seconds"])
                    print(f"[{clk.elapsed():6.1f} s] {name:>9} {case:>11} N={n:<4} rows {rows:<4} "
                          f"{row['output_tokens_per_s']:8.0f} out tok/s {row['total_tokens_per_s']:9.0f} total tok/s  "
                          f"TTFT p50 {row['ttft_p50_s']:.3f} s  turn p50 {row['latency_p50_s']:.2f} s  "
                          f"decode {row['engine_decode_tokens_per_s']:.0f} vs graph {row['graph_tokens_per_s']:.0f} "
                          f"tok/s ({row['seconds']:.1f} s)", flush=True)
                else:
                    print(f"[{clk.elapsed():6.1f} s] {name:>9} {case:>11} N={n:<4} {row['status']}", flush=True)
        del model, lm
        free_cuda()
    largest = {}
    for r in rows_out:
        if r.get("status") == "ok" and r.get("all_turns_completed"):
            d = largest.setdefault(r["model"], {})
            d[r["case"]] = max(d.get(r["case"], 0), r["agents"])
    res["largest_agents_ok"] = largest
    res["elapsed_s"] = clk.elapsed()


# ----------------------------------------------------------------------------- chart, table


def chart(res: dict, png: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cases = [c for c in CASES if any(r.get("case") == c for r in res["rows"])]
    if not cases:
        return None
    fig, axes = plt.subplots(1, len(cases), figsize=(6.5 * len(cases), 4.8), squeeze=False)
    colors = {"hybrid": "tab:blue", "attention": "tab:red"}
    for ax, case in zip(axes[0], cases):
        for model in ("hybrid", "attention"):
            ok = [r for r in res["rows"] if r.get("model") == model and r.get("case") == case
                  and r.get("status") == "ok"]
            if not ok:
                continue
            x = [r["agents"] for r in ok]
            ax.plot(x, [r["total_tokens_per_s"] for r in ok], "o-", color=colors[model], label=f"{model}: total")
            ax.plot(x, [r["output_tokens_per_s"] for r in ok], "s--", color=colors[model], label=f"{model}: output")
        ax.set_xscale("log", base=2)
        agents = sorted({r["agents"] for r in res["rows"] if r.get("case") == case and r.get("status") == "ok"})
        if agents:
            ax.set_xticks(agents, [str(a) for a in agents])
            ax.minorticks_off()
        ax.set_xlabel("concurrent agents")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{case} screenshots, {res['workload']['turns']} turns per agent")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"holotron.engine agent sessions on {res['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def table(res: dict) -> None:
    print(f"\n== agents at concurrency ({res['device']}, {res['workload']['turns']} turns each, KV cache "
          f"{res.get('kv_dtype', 'auto')}) ==")
    print(f"{'model':>9} {'case':>11} {'N':>4} {'rows':>4} {'out tok/s':>9} {'tot tok/s':>9} {'TTFT p50':>8} "
          f"{'p95':>7} {'turn p50':>8} {'p95':>7} {'peak GiB':>8} {'dec tok/s':>9} {'graph':>9} {'eff':>5} "
          f"{'gfrac':>5} {'done':>5} status")
    for r in res["rows"]:
        if r.get("status") not in ("ok", "cut (time)", "stalled") or "wall_s" not in r:
            print(f"{r['model']:>9} {r['case']:>11} {r['agents']:>4} {r.get('rows', ''):>4} {r['status']}")
            continue
        print(f"{r['model']:>9} {r['case']:>11} {r['agents']:>4} {r['rows']:>4} {r['output_tokens_per_s']:9.0f} "
              f"{r['total_tokens_per_s']:9.0f} {r['ttft_p50_s']:8.3f} {r['ttft_p95_s']:7.3f} "
              f"{r['latency_p50_s']:8.2f} {r['latency_p95_s']:7.2f} {r['peak_GiB']:8.1f} "
              f"{r['engine_decode_tokens_per_s']:9.0f} {r['graph_tokens_per_s']:9.0f} {r['decode_efficiency']:5.0%} "
              f"{r['graph_fraction']:5.0%} {r['turns_completed']:>2}/{r['turns_expected']:<2} {r['status']}"
              + (f" ({r['errors']} errors)" if r["errors"] else ""))
    print(f"largest N that ran with every turn done: {json.dumps(res.get('largest_agents_ok', {}))}")


# ----------------------------------------------------------------------------- main


def _ints(s: str) -> list[int]:
    """A comma-separated list of concurrencies, each >= 1."""
    try:
        out = [int(x) for x in s.split(",") if x]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers >= 1, got {s!r}")
    return out


def _at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = lo - 1
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {s!r}")
        return v
    return parse


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}")
    return v


def _names(allowed):
    def parse(s: str) -> list[str]:
        out = [x for x in s.split(",") if x]
        bad = [x for x in out if x not in allowed]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}, got {s!r}")
        return out
    return parse


def _host_memory() -> dict:
    """The process's resident host memory and torch's pinned bytes (cached free blocks included), in GiB, for
    the progress lines (a run the host kills for memory leaves where it stood)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        out["rss_GiB"] = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    held = pinned_held()
    if held is not None:
        out["pinned_GiB"] = round(held / 2**30, 1)
    return out


def _pinned_peak() -> int:
    """The peak of torch's pinned bytes so far (0 where unknown)."""
    if pinned_held() is None:
        return 0
    return torch.cuda.host_memory_stats().get("allocated_bytes.peak", 0)


def _host_limit(args) -> int | None:
    gib = getattr(args, "host_limit_gib", None)
    return None if gib is None else int(gib * 2**30)


def _gib(s: str) -> float:
    v = float(s)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected GiB >= 0, got {s!r}")
    return v


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny configs, N 1,2,4, 2 turns (smoke test, any device)")
    ap.add_argument("--cases", type=_names(list(CASES)), default=list(CASES), help="one-tile,twelve-tile")
    ap.add_argument("--agents", type=_ints, default=None, help="concurrencies (default 1,8,32,64,100,128,256)")
    ap.add_argument("--turns", type=_at_least(1), default=None, help="turns per agent (default 8; 2 with --small)")
    ap.add_argument("--models", type=_names(["hybrid", "attention"]), default=["hybrid", "attention"])
    ap.add_argument("--budget", type=_seconds, default=540.0, help="seconds; configurations near it are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON and the PNG")
    ap.add_argument("--ssm-dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="the Mamba state's dtype (16-bit drift against fp32: docs/benchmarks.md, 16-bit Mamba state)")
    ap.add_argument("--margin-gib", type=_gib, default=10.0,
                    help="GPU memory kept free beside the rows (graphs, vision batches, prefill activations); "
                         "more when a twelve-tile run fills the GPU")
    ap.add_argument("--kv-dtype", choices=["auto", "fp8"], default="auto",
                    help="the attention KV cache: auto = the model's dtype, fp8 = e4m3 with a scale per slot")
    ap.add_argument("--overlap", choices=["auto", "on", "off"], default="auto",
                    help="prefill chunks on their own CUDA stream while decoding goes on (auto: the engine's "
                         "default, off)")
    ap.add_argument("--phase-timing", choices=["on", "off"], default="on",
                    help="wait for the GPU after each phase of an engine step to time it (on: the phase seconds "
                         "are exact, but the host cannot queue the next phase's work while the GPU runs; off: "
                         "the throughput without those waits, phase seconds only host-side)")
    ap.add_argument("--mixed", choices=["auto", "on", "off"], default="auto",
                    help="prefill chunks and the decoding rows' tokens in one pass, a CUDA graph per shape (auto: "
                         "the engine's default, off)")
    ap.add_argument("--prefill-graphs", choices=["auto", "on", "off"], default="auto",
                    help="prefill chunks as CUDA graphs per (rows, tokens) bucket (auto: the engine's default, on)")
    ap.add_argument("--prefill-min-tokens", type=_at_least(0), default=0,
                    help="while rows decode, wait (at most 8 steps) until this many prompt tokens can share a chunk")
    ap.add_argument("--vision-stream", choices=["on", "off"], default="off",
                    help="admissions' screenshots on their own CUDA stream while the step's pass runs (their turns "
                         "prefilled from the next step)")
    ap.add_argument("--step-prompt-max", type=_at_least(0), default=None,
                    help="text-only turns up to this many tokens read through decode steps (0: off; default: the "
                         "engine's, 32, or 0 with mixed passes)")
    ap.add_argument("--prefill-tokens", type=_at_least(1), default=8192, help="the engine's prefill chunk (tokens)")
    ap.add_argument("--max-rows", type=_at_least(1), default=None,
                    help="at most this many engine rows (default: N, or as many as fit); the other sessions wait")
    ap.add_argument("--watchdog", type=_at_least(0), default=0,
                    help="seconds a step may go on (warm-up: the whole warm-up) before every thread's Python stack "
                         "goes to stderr, again every as many seconds while it lasts; 0: off")
    ap.add_argument("--host-limit-gib", type=_gib, default=None,
                    help="host memory the saved sessions may take; past it a session is dropped and its next turn "
                         "prefills its whole conversation again (Engine(host_limit=)); default: no limit, and a "
                         "configuration whose sessions would not fit on the host is skipped")
    ap.add_argument("--host-reserve-gib", type=_gib, default=0.0,
                    help="pinned host pages for saved sessions allocated before each run, timed apart from it "
                         "(holotron.state_snapshot.reserve_pages; pinning host memory is slow, a server does it at "
                         "startup); they count against --host-limit-gib")
    ap.add_argument("--quantize", choices=["fp8"], default=None,
                    help="FP8 weights for the language models' linear layers (holotron.quant.quantize_; W8A8 above "
                         "one row on CUDA); default: the weights as built (bf16 on CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", action="store_true", help="the PNG (drawn anyway when matplotlib is importable)")
    ap.add_argument("--no-plot", action="store_true", help="no PNG")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.small:
        print("bench_agents: no CUDA GPU; use --small for a CPU smoke test", file=sys.stderr)
        return 2
    args.agents = args.agents or ([1, 2, 4] if args.small else [1, 8, 32, 64, 100, 128, 256])
    args.turns = args.turns or (2 if args.small else 8)
    args.ssm_dtype = getattr(torch, args.ssm_dtype)
    args.kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else None
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res: dict = {
        "benchmark": "bench_agents", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "python": platform.python_version(),
        "fused_prefill": mamba2.FUSED_PREFILL,  # HOLOTRON_FUSED_PREFILL
        "chunk_step": engine_chunks.CHUNK_STEP,  # HOLOTRON_CHUNK_STEP
        "norm16": layers.NORM16,  # HOLOTRON_NORM16
        "prefix_graphs": engine_sessions.PREFIX_GRAPHS,  # HOLOTRON_PREFIX_GRAPHS
        "batch_loads": engine_sessions.BATCH_LOADS,  # HOLOTRON_BATCH_LOADS
        "state_stacks": holo_state.STACKS,  # HOLOTRON_STATE_STACKS
        "lazy_rows": engine_sessions.LAZY_ROWS,  # HOLOTRON_LAZY_ROWS
        "command": "PYTHONPATH=. python3 benchmarks/bench_agents.py" + (" " + shlex.join(argv) if argv else ""),
        "small": args.small, "ssm_dtype": str(args.ssm_dtype), "prefill_tokens": args.prefill_tokens,
        "kv_dtype": "fp8" if args.kv_dtype is not None else "auto",
        "overlap": args.overlap, "mixed": args.mixed, "prefill_graphs": args.prefill_graphs,
        "phase_timing": args.phase_timing,
        "prefill_min_tokens": args.prefill_min_tokens, "vision_stream": args.vision_stream,
        "agents": args.agents, "max_rows": args.max_rows, "host_limit_gib": args.host_limit_gib,
        "host_reserve_gib": args.host_reserve_gib,
        "quantize": args.quantize,
        "cases": args.cases, "model_names": args.models,
        "budget_s": args.budget, "host_bytes_available": host_available(), "rows": [],
    }
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_agents.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    print(f"{res['device']}  torch {res['torch']}  triton {res['triton']}  {args.ssm_dtype} Mamba state  "
          f"KV cache {'fp8 (e4m3, a scale per slot)' if args.kv_dtype is not None else 'model dtype'}  "
          f"prefill chunk {args.prefill_tokens}", flush=True)
    save()
    sweep(args, res, save)
    res["chart"] = None
    if not args.no_plot:
        res["chart"] = chart(res, os.path.join(args.out, "agents_throughput.png"))
        if res["chart"] is None and args.plot:
            print("bench_agents: matplotlib is not importable; no PNG", file=sys.stderr)
    save()
    table(res)
    print(f"wrote {path}" + (f" and {res['chart']}" if res["chart"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
