"""Probe: the twelve-tile agents run that never returned a step on an H100 (2026-12-06, docs/benchmarks.md,
"States read and written in place"), at its token counts with a tiny model, so a variant takes seconds.

Each variant (agents, engine rows, mixed passes on / off, vision stream on / off, then optional ``key=value``
fields: ``lm=tiny|12b|12b/PATTERN`` (the 12B's dims, all its layers or the given pattern), ``vis=tiny|real|real/L``
(RADIO ViT-H, its 32 blocks or L of them), ``kv=fp8|auto``, ``graph=1|0`` (CUDA graphs), ``block=0|1``
(``CUDA_LAUNCH_BLOCKING``: the watchdog's stack then names the op that does not return), ``vg=1|0`` (vision graphs),
``pg=auto|on|off`` (prefill graphs)) runs ``bench_agents.run_agents`` in a subprocess of its own under a time
limit, with the watchdog's stacks (``faulthandler``) after ``--watchdog`` seconds without a progress line; a
variant that hangs is killed (after ``look_inside``: the GPU's load and cuda-gdb's list of the kernels running)
and the next one runs. One line per variant at the end, and ``engine_hang.json``.

    PYTHONPATH=. python3 dev/probes/engine_hang.py --out $OUT                     # the GPU's variants
    PYTHONPATH=. python3 dev/probes/engine_hang.py --variants "100:100:off:on:lm=12b:vis=real:graph=0:block=1" \
        --limit 150 --out $OUT                                                    # the 12B, op by op
    python dev/probes/engine_hang.py --device cpu --variants 6:4:on:on --image-size 64 --out /tmp/eh  # CPU check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
VARIANTS = "100:74:on:on,100:74:off:on,100:74:on:off,100:100:on:on,8:6:on:on,8:8:on:on"


def one(a) -> int:
    """The child: one variant; prints a JSON line starting with '@@'."""
    sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
    import bench_agents as ba
    import torch

    from holotron.vision import VisionConfig

    n, rows, mixed, vs, *extra = a.child.split(":")
    n, rows = int(n), int(rows)
    opt = dict(lm="tiny", vis="tiny", kv="fp8", graph="1", block="0", vg="1", pg="auto")
    opt.update(kv_.split("=", 1) for kv_ in extra)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    lm, _, pattern = opt["lm"].partition("/")
    tcfg, _ = ba.configs(lm == "tiny")["hybrid"]
    if pattern:
        tcfg = dataclasses.replace(tcfg, hybrid_override_pattern=pattern)
    vis, _, depth = opt["vis"].partition("/")
    if vis == "tiny":
        vcfg = VisionConfig(**dict(ba.SMALL_VISION, image_size=a.image_size, max_img_size=a.image_size),
                            projector_output_size=tcfg.hidden_size)
    else:
        vcfg = VisionConfig(num_prefix_tokens=16, projector_output_size=tcfg.hidden_size,
                            **({"num_hidden_layers": int(depth)} if depth else {}))
    model = ba.build_vl(tcfg, vcfg, dev, dtype, seed=0)
    if opt["vg"] == "0":   # the vision encoder eager (no vision graphs)
        from holotron.engine import Engine
        Engine._vision_graph = lambda self, b, S: None
    tiles = ba.CASES["twelve-tile"]
    plan = ba.make_plan(n, a.turns, tiles * model.config.tokens_per_tile, (40, 80), (80, 120), tcfg.vocab_size, 0)
    max_len = -(-(max(ba.history(p) for p in plan) + 64) // 256) * 256
    args = types.SimpleNamespace(prefill_tokens=8192, phase_timing="on", ssm_dtype=torch.bfloat16,
                                 kv_dtype=torch.float8_e4m3fn if opt["kv"] == "fp8" else None, overlap="auto",
                                 mixed=mixed, prefill_graphs=opt["pg"],
                                 step_prompt_max=None, prefill_min_tokens=0, vision_stream=vs, small=True,
                                 watchdog=a.watchdog, cuda_graph=None if opt["graph"] == "1" else False)
    t = time.perf_counter()
    r = ba.run_agents(model, plan, tiles, rows, max_len, args, t + a.limit)
    keep = ("status", "turns_completed", "turns_expected", "sessions_on_host_peak", "mixed_steps", "decode_steps",
            "wall_s", "warmup_s")
    print("@@" + json.dumps({"tokens_per_tile": model.config.tokens_per_tile, **{k: r[k] for k in keep}}),
          flush=True)
    return 0


def look_inside(pid: int) -> str:
    """What a hung child's GPU does: three samples of nvidia-smi's load (busy: a kernel that does not end; idle:
    a wait that is never met), then the kernels running, from cuda-gdb attached to the child."""
    out = []
    for _ in range(3):
        out.append(_cmd(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"], 20))
        time.sleep(1)
    out.append(_cmd(["cuda-gdb", "-p", str(pid), "-batch", "-ex", "info cuda kernels", "-ex", "info cuda devices",
                     "-ex", "thread apply all bt 6"], 60))
    return "\n".join(out)


def _cmd(argv: list[str], timeout: float) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr)[-4000:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]}: {type(e).__name__}: {e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=VARIANTS, help="agents:rows:mixed:vision-stream, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--image-size", type=int, default=128, help="tiny ViT (patch 4): 128 gives 256 tokens a tile")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds a variant may run")
    ap.add_argument("--watchdog", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return one(a)
    os.makedirs(a.out, exist_ok=True)
    res = []
    for v in a.variants.split(","):
        cmd = [sys.executable, __file__, "--child", v, "--device", a.device, "--image-size", str(a.image_size),
               "--turns", str(a.turns), "--limit", str(a.limit), "--watchdog", str(a.watchdog)]
        t = time.perf_counter()
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1" if ":block=1" in v else "0")
        with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
            p = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env)
            try:
                rc = p.wait(timeout=a.limit + 30)
                gpu = ""
            except subprocess.TimeoutExpired:
                # the first hung child: the GPU's load and the kernels running; then killed
                gpu = "" if any(r["rc"] == "killed" for r in res) else look_inside(p.pid)
                p.kill()
                p.wait()
                rc = "killed"
            fo.seek(0)
            fe.seek(0)
            out, err = fo.read(), fe.read()
        rec = {"variant": v, "rc": rc, "seconds": round(time.perf_counter() - t, 1)}
        for line in out.splitlines():
            if line.startswith("@@"):
                rec.update(json.loads(line[2:]))
        rec["progress"] = [ln.strip() for ln in out.splitlines() if "progress" in ln or "warm-up" in ln][-3:]
        rec["stacks"] = err[-6000:] if ("Timeout" in err or rc != 0) else ""
        rec["gpu"] = gpu
        res.append(rec)
        with open(os.path.join(a.out, "engine_hang.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(f"{v:>16} rc {rc} {rec['seconds']:6.1f} s {rec.get('status')} "
              f"{rec.get('turns_completed')}/{rec.get('turns_expected')}", flush=True)
        if rec["stacks"]:
            frames = [ln.strip() for ln in rec["stacks"].splitlines() if ln.strip().startswith("File")]
            print("   " + "\n   ".join(frames[:10]), flush=True)
        if gpu:
            print(gpu[-3000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
