"""The SSD scan (forward, forward + backward) and the decode step on a CUDA GPU, next to the floor and two
peers measured in the same run; prints a short table per section last, writes JSON.

    python benchmarks/bench_ssd.py [--out DIR] [--budget S]    JSON to DIR/bench_ssd.json (DIR=$OUT if set)
    python benchmarks/bench_ssd.py --sections fwd,fwdbwd       pick sections (default: ceilings,sweep,fwd,fwdbwd;
                                   also step, and bwdsweep: the backward sweep alone, without fwdbwd)
    python benchmarks/bench_ssd.py --configs '{"Q": [128], "BLOCK_P": [64, 128]}'    narrow the sweep
                                   (a dict of lists: their product; a list of dicts; '[]': no sweep)
    python benchmarks/bench_ssd.py --bwd-configs '[{"BLOCK_N": 128}, {"chunk_size": 32, "BLOCK_P": 64}]'
                                   the backward sweep (same forms, over BWD_CONFIG; default BWD_SWEEP; '[]': none)
    python benchmarks/bench_ssd.py --sweep-s 120 --bwd-sweep-s 90    caps (s) of the two sweeps
    python benchmarks/bench_ssd.py --step-only                 copy bandwidth and the decode step (~1 min)
    python benchmarks/bench_ssd.py --dry                       the whole plumbing on the CPU: tiny shapes,
                                                               TRITON_INTERPRET=1, timings meaningless
    python benchmarks/bench_ssd.py --plot JSON --png FILE      the chart (time per shape, ours vs peers)

Shape: the Nemotron-Nano-12B / Holotron-12B Mamba layer, H=128, P=80, N=128, G=8, bf16, with D per head,
dt_bias and softplus, at four (batch, seqlen) shapes (SHAPES). Sections, each in its own subprocess (a
crash such as an illegal memory access kills the CUDA context, and a hang is cut by a timeout; either is
recorded and the next section runs):

- ceilings: device copy bandwidth (bytes read + written) and a bf16 8192^3 matmul.
- sweep: our forward over SCAN_CONFIG settings (Q x BLOCK_P x num_warps x num_stages, the automatic
  setting first, risky ones last), each checked against the float64 chunked scan at every shape before a
  short do_bench; a config that crashes its process is recorded and the sweep goes on in a new one. Each
  row also has the compiled kernel's registers, spills and shared memory (ssd_triton_scan.LAST_KERNEL),
  where the kernel exposes them (not under the interpreter).
- fwd: per shape the automatic setting and the sweep's three fastest re-timed; mamba_ssm's
  mamba_chunk_scan_combined (chunk 128, D, dt_bias, softplus, grouped B and C) and FLA's chunk_simple_gla
  (q = C, k = B dt, v = x, g = dt A, B and C expanded to every head outside the timing, no D term);
  relative RMS error of y and of the final state of each against ssd_scan(backend="chunked") in float64 on
  the same inputs (FLA against the same reference less its D x term); the floor; ours in a CUDA graph at
  the first shape (the automatic and the fastest setting; last, as a failed capture can spoil the context).
- fwdbwd: forward + backward with a fixed upstream gradient (autograd.grad of y, no state gradient) for
  ours (the automatic setting), mamba_ssm and FLA (its backward over q, k, v, g; the expansion outside);
  the error of every gradient against float64 autograd through the chunked scan at the first shape (FLA's
  through a differentiable expansion, against the reference without D). Then, in worker(s) of their own
  (the sweep's Triton cache, at most --bwd-sweep-s), the backward sweep: ours over ssd_triton_backward's
  BWD_CONFIG settings (BWD_SWEEP, each merged over the module's defaults; chunk_size, BLOCK_P, BLOCK_N,
  HEADS, warps and stages of its kernels), each first checked at the first shape (every gradient within BWD_TOL
  of the float64 reference, finite) and then forward + backward timed at every shape with the sweep's short
  do_bench, with the backward kernels' registers and spills (ssd_triton_backward.LAST_KERNEL); a config
  that crashes its process is recorded and the rest go on in a new one. The fastest right config is
  printed beside the fwdbwd rows.
- first call: fwd and fwdbwd run in one fresh process with an empty TRITON_CACHE_DIR, so each library's
  first forward call there is its cold forward (compiles, and mamba_ssm's autotuning, included) and its
  cold forward + backward is that plus its first forward + backward call (fwdbwd alone: that call).
- step: ssd_step in a CUDA graph over distinct per-layer states, fp32 and bf16 state (--step-only).

Times are medians of triton.testing.do_bench (CUDA events). Floors: the fewest bytes at the copy bandwidth
and the chunked algorithm's matmul FLOPs at the matmul rate (forward + backward: the backward's reads and
writes added, 3x the forward's FLOPs). Peers are benchmark-only, loaded by benchmarks/peers.py from the
ignored folders .peers/ (mamba_ssm) and a carried fla-core wheel; never dependencies.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

H, P, N, G, Q = 128, 80, 128, 8, 128
SHAPES = [(1, 4096), (1, 16384), (4, 8192), (8, 16384)]  # the four benchmark shapes (batch, seqlen)
SWEEP = dict(Q=[32, 16, 64], BLOCK_P=[64, 128], num_warps=[4, 8], num_stages=[3, 2])  # around the measured best
# the backward sweep: each dict over ssd_triton_backward.BWD_CONFIG's defaults ({}: the defaults as they are)
BWD_SWEEP = [{}, {"BLOCK_N": 128, "stages_dbc": 1}, {"warps_dx": 8, "BLOCK_P": 64}, {"BLOCK_P": 16},
             {"chunk_size": 32, "BLOCK_P": 64}, {"HEADS": 16, "warps_dx": 8, "BLOCK_P": 64}, {"stages_dbc": 2}]
BWD_TOL = 5e-2  # the backward sweep's check: the largest relative RMS error of a gradient vs float64
GRAD_NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias")
TOL = 1e-2  # the sweep's check: relative RMS error of y and of the final state vs float64 (bf16 gives ~2e-3)
STEP_B = [1, 8, 64, 128]
MAMBA_SSM_STEP_US = {1: 5.2, 8: 25.5, 64: 190.0, 128: 412.0}  # quoted: selective_state_update, CUDA graph
DEVICE = "cuda"
DRY = dict(H=4, P=24, N=16, G=2, SHAPES=[(1, 160), (2, 96)], STEP_B=[1, 2])
DRY_CONFIGS = [{}, dict(Q=64, BLOCK_P=16, num_warps=4, num_stages=1)]
DRY_BWD_CONFIGS = [{}, dict(HEADS=2, BLOCK_P=16)]
KERNEL_KEYS = ("n_regs", "n_spills", "shared")
HERE = os.path.dirname(os.path.abspath(__file__))


def scan_bytes(b, l):
    """x, dt, B, C read and y written once (bf16), the fp32 final state written once."""
    return 2 * (2 * b * l * H * P + b * l * H + 2 * b * l * G * N) + 4 * b * H * P * N


def scan_flops(b, l):
    """Matmul FLOPs of the chunked algorithm on full Q x Q blocks: C B^T per group, the weighted
    scores times X, the chunk states and C S_in per head."""
    nc = b * math.ceil(l / Q)
    return nc * (G * 2 * Q * Q * N + H * (2 * Q * Q * P + 2 * Q * P * N + 2 * Q * N * P))


def fwdbwd_bytes(b, l):
    """The forward's, plus the backward reading x, dy, dt, B, C and writing dx, ddt, dB, dC once (bf16)."""
    return scan_bytes(b, l) + 2 * (3 * b * l * H * P + 2 * b * l * H + 4 * b * l * G * N)


def fwdbwd_flops(b, l):
    """The forward's, plus two products per forward product in the backward (no recomputation)."""
    return 3 * scan_flops(b, l)


# ============================================================================ the driver (no CUDA here)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sections", default="ceilings,sweep,fwd,fwdbwd",
                    help="comma list of ceilings, sweep, fwd, fwdbwd, step, bwdsweep (fwdbwd runs it after itself)")
    ap.add_argument("--step-only", action="store_true", help="copy bandwidth and the decode step only")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for the whole run; a section that would start past it is skipped")
    ap.add_argument("--sweep-s", type=float, default=120.0, help="seconds at most for the config sweep")
    ap.add_argument("--sweep-rep", type=float, default=25.0, help="do_bench rep (ms) of each swept config")
    ap.add_argument("--configs", default=None, help="JSON: a dict of lists or a list of SCAN_CONFIG dicts")
    ap.add_argument("--bwd-sweep-s", type=float, default=90.0, help="seconds at most for the backward sweep")
    ap.add_argument("--bwd-configs", default=None,
                    help="JSON: a dict of lists or a list of BWD_CONFIG dicts (default BWD_SWEEP; '[]': none)")
    ap.add_argument("--shapes", default=None, help="e.g. 1x4096,4x8192 (default: the four benchmark shapes)")
    ap.add_argument("--dry", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes: a plumbing check")
    ap.add_argument("--plot", default=None, help="a bench_ssd.json to chart (no GPU needed)")
    ap.add_argument("--png", default="docs/ssd_scan_time.png")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--state", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plot:
        return plot(args.plot, args.png)
    if args.dry:
        dry_dims()
    if args.worker:
        return worker(args)
    drive(args)


def dry_dims():
    global H, P, N, G, SHAPES, STEP_B, DEVICE
    H, P, N, G, SHAPES, STEP_B = (DRY[k] for k in ("H", "P", "N", "G", "SHAPES", "STEP_B"))
    DEVICE = "cpu"
    os.environ["TRITON_INTERPRET"] = "1"


def expand(s):
    """A dict of lists (their product, in the lists' order) or a list of dicts: a list of config dicts."""
    if isinstance(s, dict):
        keys = list(s)
        return [dict(zip(keys, v)) for v in itertools.product(*(s[k] if isinstance(s[k], list) else [s[k]]
                                                                for k in keys))]
    return [dict(c) for c in s]


def sweep_configs(spec, dry):
    """The configs to sweep, the automatic one ({}) first, then in the order given (a dict's product order)
    except that the likelier ones go first: the automatic pairing of warps and chunk (8 warps at Q 128, 4 at
    Q 64) and 2 stages before the others; the risky ones last (16-column dots with 8 warps faulted once on
    triton 3.6; 3 stages of 128-wide P blocks may not fit in shared memory)."""
    if spec is None and dry:
        return [dict(c) for c in DRY_CONFIGS]
    cfgs = expand(json.loads(spec) if spec is not None else SWEEP)

    def risk(c):
        bp, nw, ns, q = c.get("BLOCK_P"), c.get("num_warps"), c.get("num_stages"), c.get("Q")
        paired = nw is None or q is None or nw == (8 if q > 64 else 4)
        return ((bp == 16 and nw == 8) * 4 + (ns == 3) * 2 + (ns == 3 and (bp or 128) >= 128),
                (not paired) + (ns not in (None, 2)))
    if spec is not None and not cfgs:
        return []  # '[]': no sweep, the automatic setting alone (in fwd)
    return [{}] + sorted((c for c in cfgs if c), key=risk)  # stable: the given order within a risk level


def bwd_configs(spec, dry):
    """The backward sweep's configs, BWD_CONFIG overrides in the order given, the defaults ({}) first."""
    if spec is None:
        return [dict(c) for c in (DRY_BWD_CONFIGS if dry else BWD_SWEEP)]
    cfgs = expand(json.loads(spec))
    return [{}] + [c for c in cfgs if c] if cfgs else []


class Section:
    """One worker subprocess; its `@@` lines are records, the rest is echoed. Killed past ``deadline`` or
    after ``idle`` seconds without a line (a hang in the kernel)."""

    def __init__(self, args, name, state, fresh_cache=False, deadline=None, idle=150.0):
        self.records, self.tail, self.rc, self.killed = [], [], None, None
        path = os.path.join(state["tmp"], f"state-{name}.json")
        with open(path, "w") as fh:
            json.dump(state, fh)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--state", path]
        if args.dry:
            cmd.append("--dry")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if args.dry:
            env["TRITON_INTERPRET"] = "1"
        if fresh_cache:  # compiles (and the peers' autotuning) from scratch: the first calls are cold
            env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{name}-", dir=state["tmp"])
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                             cwd=os.path.dirname(HERE))
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: ([lines.put(ln) for ln in p.stdout], lines.put(None)), daemon=True).start()
        last = time.time()
        while True:
            try:
                ln = lines.get(timeout=1.0)
            except queue.Empty:
                now = time.time()
                if deadline is not None and now > deadline:
                    self.killed = f"past its deadline ({now - t0:.0f} s)"
                elif now - last > idle:
                    self.killed = f"no output for {idle:.0f} s (a hang?)"
                if self.killed:
                    p.kill()
                    break
                continue
            if ln is None:
                break
            last = time.time()
            if ln.startswith("@@"):
                self.records.append(json.loads(ln[2:]))
            else:
                print(ln, end="", flush=True)
                self.tail = (self.tail + [ln.rstrip()])[-25:]
        self.rc = p.wait()
        self.seconds = time.time() - t0

    def failure(self):
        if self.rc == 0 and not self.killed:
            return None
        return dict(rc=self.rc, killed=self.killed, tail=self.tail[-12:])


def drive(args):
    t_start = time.time()
    end = t_start + args.budget
    if args.step_only:
        args.sections = "ceilings,step"
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    out = dict(meta=dict(date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv), budget_s=args.budget,
                         dims=dict(H=H, P=P, N=N, G=G, Q=Q), dry=args.dry),
               ceilings={}, sweep=[], fwd=[], graph=[], first_call=[], fwdbwd=[], grad_accuracy=[], bwd_sweep=[],
               bwd_best=None, step=[], failures=[], skipped=[])
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench_ssd-")
    base_state = dict(tmp=tmp, shapes=shapes, out=args.out, sweep_rep=args.sweep_rep,
                      triton_cache=os.environ.get("TRITON_CACHE_DIR"))  # the sweep's (shared) cache

    def save():
        with open(os.path.join(args.out, "bench_ssd.json"), "w") as fh:
            json.dump(out, fh, indent=1)

    def take(sec, name):
        for r in sec.records:
            k, v = r["k"], r["v"]
            if k == "meta":
                out["meta"].update(v)
            elif k == "ceilings":
                out["ceilings"].update(v)
            elif k in ("fwd", "graph", "first_call", "fwdbwd", "grad_accuracy", "step"):
                out[k].append(v)
            elif k == "fail":
                out["failures"].append(dict(section=name, **v))
        f = sec.failure()
        if f:
            out["failures"].append(dict(section=name, **f))
            print(f"# section {name} failed: {f['killed'] or 'exit ' + str(f['rc'])}", flush=True)
        save()

    # seconds a section needs to be worth starting, and what the sweeps leave for the ones after them; the
    # backward sweep runs after fwdbwd (its reserve counted there) unless it is a section of its own
    bwd = bwd_configs(args.bwd_configs, args.dry)
    bwd_after_fwdbwd = bool(bwd) and "bwdsweep" not in sections
    need = dict(ceilings=15, sweep=40, fwd=40, fwdbwd=60, step=40, bwdsweep=25)
    reserve = dict(ceilings=15, sweep=0, fwd=70, fwdbwd=110 + (args.bwd_sweep_s if bwd_after_fwdbwd else 0),
                   step=60, bwdsweep=args.bwd_sweep_s if bwd else 0)
    later = lambda name: sum(reserve[p] for s in sections[sections.index(name) + 1:] for p in s.split(","))
    if "fwd" in sections and "fwdbwd" in sections:  # one cold-cache worker: each library compiles once
        sections = [s for s in sections if s != "fwdbwd"]
        sections[sections.index("fwd")] = "fwd,fwdbwd"
    for name in sections:
        left = end - time.time()
        parts = name.split(",")
        if any(p not in need for p in parts):
            print(f"# unknown section {name!r} (one of {', '.join(need)})")
            continue
        if left < need[parts[0]]:
            out["skipped"].append(dict(section=name, why=f"{left:.0f} s of the budget left"))
            print(f"# section {name} skipped: over the time budget", flush=True)
            continue
        print(f"# ---- section {name} ({left:.0f} s of the budget left)", flush=True)
        state = dict(base_state, ceilings=out["ceilings"])
        if name in ("sweep", "bwdsweep"):
            cap = args.sweep_s if name == "sweep" else args.bwd_sweep_s
            run_sweep(args, state, out, save, min(time.time() + cap, end - later(name)), kind=name)
            continue
        state["best"] = best_configs(out["sweep"], shapes)
        cold = "fwd" in parts or "fwdbwd" in parts
        take(Section(args, name, state, fresh_cache=cold, deadline=end + 30, idle=240 if cold else 150), name)
        if name == "fwd,fwdbwd" and not out["fwdbwd"] and end - time.time() > need["fwdbwd"]:
            print("# ---- section fwdbwd again, alone (the shared worker ended before it)", flush=True)
            take(Section(args, "fwdbwd", state, fresh_cache=True, deadline=end + 30, idle=240), "fwdbwd")
        if "fwdbwd" in parts and bwd_after_fwdbwd:
            deadline = min(time.time() + args.bwd_sweep_s, end - later(name))
            if deadline - time.time() < need["bwdsweep"]:
                out["skipped"].append(dict(section="bwdsweep", why=f"{deadline - time.time():.0f} s left for it"))
                print("# backward sweep skipped: over the time budget", flush=True)
            else:
                print(f"# ---- the backward sweep ({deadline - time.time():.0f} s at most)", flush=True)
                run_sweep(args, state, out, save, deadline, kind="bwdsweep")

    out["bwd_best"] = best_bwd(out["bwd_sweep"], shapes)
    out["meta"]["wall_s"] = time.time() - t_start
    save()
    print_tables(out)
    print(f"# wrote {os.path.join(args.out, 'bench_ssd.json')} ({out['meta']['wall_s']:.0f} s)")


def run_sweep(args, state, out, save, deadline, kind="sweep"):
    """A sweep in a worker (kind "sweep": the forward's configs, rows in out["sweep"]; "bwdsweep": the
    backward's, rows in out["bwd_sweep"]); a worker that dies mid-config has that config recorded as crashed
    and the rest go on in a new worker (the Triton cache keeps what was compiled). No config starts past
    ``deadline``."""
    todo = sweep_configs(args.configs, args.dry) if kind == "sweep" else bwd_configs(args.bwd_configs, args.dry)
    rows = out["sweep" if kind == "sweep" else "bwd_sweep"]
    key = lambda c: json.dumps(c, sort_keys=True)
    crashes = 0
    while todo and time.time() < deadline - 10 and crashes < 6:
        sec = Section(args, kind, dict(state, configs=todo, deadline=deadline), deadline=deadline + 20,
                      idle=90 if kind == "sweep" else 150)
        started, done = None, set()
        for r in sec.records:
            if r["k"] == "start":
                started = r["v"]
            elif r["k"] == "cfg":
                rows.append(r["v"])
                done.add(key(r["v"]["config"]))
                started = None
            elif r["k"] == "fail":
                out["failures"].append(dict(section=kind, **r["v"]))
        todo = [c for c in todo if key(c) not in done]
        f = sec.failure()
        if f is None:
            break
        if not any(r["k"] in ("start", "cfg") for r in sec.records):  # died before its first config: no retry
            out["failures"].append(dict(section=kind, **f))
            break
        crashes += 1
        if started is not None:
            rows.append(dict(config=started, crashed=f, shapes=[]))
            todo = [c for c in todo if key(c) != key(started)]
        print(f"# {kind}: the worker died ({f['killed'] or 'exit ' + str(f['rc'])}) "
              + (f"in config {started}" if started is not None else "after a config that lost the CUDA context")
              + "; going on in a new one", flush=True)
        save()
    if todo:
        out["skipped"].append(dict(section=kind, why=f"{len(todo)} configs not run (time or crashes)",
                                   configs=todo))
    save()


def best_configs(rows, shapes, k=3):
    """Per shape, the k fastest configs among those right at every shape (the automatic one if none)."""
    good = [r for r in rows if not r.get("crashed") and len(r.get("shapes", [])) == len(shapes)
            and all(s.get("ok") and s.get("ms") is not None for s in r["shapes"])]
    best = {}
    for b, l in shapes:
        timed = [(s["ms"], r["config"]) for r in good for s in r["shapes"] if (s["b"], s["l"]) == (b, l)]
        best[f"{b}x{l}"] = [c for _, c in sorted(timed, key=lambda t: t[0])[:k]] or [{}]
    return best


def best_bwd(rows, shapes):
    """The backward config right (checked) and timed at every shape with the least summed time, or None."""
    good = [r for r in rows if r.get("ok") and len(r.get("shapes", [])) == len(shapes)
            and all(s.get("ms") is not None for s in r["shapes"])]
    if not good:
        return None
    r = min(good, key=lambda r: sum(s["ms"] for s in r["shapes"]))
    return dict(config=r["config"], max_err=r.get("max_err"), ms={f"{s['b']}x{s['l']}": s["ms"] for s in r["shapes"]})


# ============================================================================ workers (one per section)


def emit(k, v):
    print("@@" + json.dumps(dict(k=k, v=v)), flush=True)


def kernel_info(k):
    """n_regs, n_spills and shared (bytes) of a Triton CompiledKernel, those it has ({} for None or the
    interpreter's stand-in)."""
    info = {}
    try:
        md = getattr(k, "metadata", None)
        vals = dict(n_regs=getattr(k, "n_regs", None), n_spills=getattr(k, "n_spills", None),
                    shared=md.get("shared") if isinstance(md, dict) else getattr(md, "shared", None))
        info = {a: int(v) for a, v in vals.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    except Exception:  # noqa: BLE001  (a kernel object of another Triton: no figures, no crash)
        pass
    return info


def last_kernels(module):
    """{name: kernel_info} of ``module.LAST_KERNEL`` (a dict name -> CompiledKernel), those with figures."""
    d = getattr(module, "LAST_KERNEL", None)
    if not isinstance(d, dict):
        return {}
    return {str(n): i for n, i in ((n, kernel_info(k)) for n, k in list(d.items())) if i}


def forget_kernels(module):
    """Empties ``module.LAST_KERNEL`` before a call, so what it holds after comes from that call."""
    d = getattr(module, "LAST_KERNEL", None)
    if isinstance(d, dict):
        d.clear()


def crash_text(msg):
    """An error after which the CUDA context is gone (the worker must stop)."""
    return "illegal" in msg.lower() or "cuda error" in msg.lower()


def worker(args):
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    state = json.load(open(args.state))
    global SHAPES
    SHAPES = [tuple(s) for s in state["shapes"]]
    W = Worker(args, state)
    for part in args.worker.split(","):
        getattr(W, part)()


class Worker:
    def __init__(self, args, state):
        import torch
        self.torch, self.args, self.state = torch, args, state
        self.dev = torch.device(DEVICE)
        self.cuda = self.dev.type == "cuda"
        self.first_fwd = {}  # library -> seconds of its first forward call in this process (None: failed)
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    # ---------------------------------------------------------------- helpers
    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def bench(self, fn, rep=200.0):
        """Median ms: do_bench on a GPU, a few timed calls on the CPU (dry runs: meaningless figures)."""
        if self.cuda:
            from triton.testing import do_bench
            return do_bench(fn, warmup=max(5.0, rep / 4), rep=rep, return_mode="median")
        ts = []
        for _ in range(2):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[len(ts) // 2]

    def inputs(self, b, l, seed=0, grad=False):
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        r = lambda *s: torch.randn(*s, device=self.dev, generator=g)
        kw = dict(x=r(b, l, H, P).bfloat16(), dt=(r(b, l, H) - 1).bfloat16(),
                  A=-torch.rand(H, device=self.dev, generator=g) - 0.5,
                  B=(r(b, l, G, N) / N**0.5).bfloat16(), C=r(b, l, G, N).bfloat16(), D=r(H), dt_bias=r(H) * 0.5)
        if grad:
            for v in kw.values():
                v.requires_grad_(True)
        return kw

    def reference(self, kw, with_D=True):
        """ssd_scan(backend="chunked") in float64, a batch row at a time: (y, final state) in fp32."""
        from holotron.kernels import ssd_scan
        torch = self.torch
        ys, ss = [], []
        with torch.no_grad():
            for i in range(kw["x"].shape[0]):
                d = {n: (v[i:i + 1] if v.dim() > 1 else v).detach().double() for n, v in kw.items()}
                y, s = ssd_scan(d["x"], d["dt"], d["A"], d["B"], d["C"], D=d["D"] if with_D else None,
                                dt_bias=d["dt_bias"], dt_softplus=True, chunk_size=Q, backend="chunked")
                ys.append(y.float())
                ss.append(s.float())
                del d, y, s
        return torch.cat(ys), torch.cat(ss)

    def grad_reference(self, kw, dy, with_D=True):
        """Gradients of sum(y * dy) by float64 autograd through the chunked scan: {name: fp32 tensor}."""
        from holotron.kernels import ssd_scan
        torch = self.torch
        names = [n for n in GRAD_NAMES if with_D or n != "D"]
        d = {n: kw[n].detach().double().requires_grad_(True) for n in names}
        y, _ = ssd_scan(d["x"], d["dt"], d["A"], d["B"], d["C"], D=d.get("D"), dt_bias=d["dt_bias"],
                        dt_softplus=True, chunk_size=Q, backend="chunked")
        gs = torch.autograd.grad(y, [d[n] for n in names], dy.double())
        return {n: g.float() for n, g in zip(names, gs)}

    def rel(self, a, ref):
        """||a - ref|| / ||ref|| accumulated in float64 a leading index at a time (large tensors)."""
        if a is None or ref is None:
            return None
        num = den = 0.0
        rows = [(a, ref)] if a.dim() < 2 or a.numel() < (1 << 24) else zip(a, ref)
        for x, r in rows:
            x, r = x.detach().double(), r.detach().double()
            num += float((x - r).pow(2).sum())
            den += float(r.pow(2).sum())
        return math.sqrt(num / den) if den > 0 else float("nan")

    def poison(self, b, l):
        """Hand NaN-filled blocks of y's and the state's sizes back to the caching allocator, so that an
        element the kernel leaves unwritten shows up in the check."""
        torch = self.torch
        t = [torch.full((b, l, H, P), float("nan"), device=self.dev, dtype=torch.bfloat16),
             torch.full((b, H, P, N), float("nan"), device=self.dev)]
        del t

    def scan_module(self):
        try:
            from holotron.kernels import ssd_triton_scan as T
        except Exception as e:  # noqa: BLE001  (the new kernel may not be there yet: say so)
            emit("fail", dict(what="holotron.kernels.ssd_triton_scan", error=f"{type(e).__name__}: {e}"))
            return None
        cfg = getattr(T, "SCAN_CONFIG", None)
        if cfg is None or not {"Q", "BLOCK_P", "num_warps", "num_stages"} <= set(cfg):
            print(f"# note: ssd_triton_scan.SCAN_CONFIG is {cfg}: not the keys Q, BLOCK_P, num_warps, num_stages "
                  "(an older kernel?); swept keys are set anyway", flush=True)
        return T

    def set_config(self, T, base, cfg):
        T.SCAN_CONFIG.clear()
        T.SCAN_CONFIG.update({**base, **cfg})

    def ours(self, kw):
        from holotron.kernels import ssd_scan
        return lambda: ssd_scan(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], D=kw["D"], dt_bias=kw["dt_bias"],
                                dt_softplus=True, chunk_size=Q, backend="triton")

    def peers(self):
        import peers
        if not self.cuda:
            peers.cpu_shims()
        mamba, mver = peers.load_mamba()
        fla, fver = peers.load_fla(dry=not self.cuda)
        for f, v in ((mamba, mver), (fla, fver)):
            if f is None:
                print("#", v, flush=True)
                emit("fail", dict(what="peer", error=v))
        import triton
        torch = self.torch
        gpu = torch.cuda.get_device_name() if self.cuda else "cpu (dry run)"
        emit("meta", dict(mamba_ssm=mver if mamba else None, fla=fver if fla else None, torch=torch.__version__,
                          triton=triton.__version__, gpu=gpu))
        return peers, mamba, fla

    def shared_cache(self):
        """From here on compile into (and reuse) the sweep's Triton cache: this process's cold first calls are
        done. Triton reads TRITON_CACHE_DIR at each compile."""
        if self.state.get("triton_cache"):
            os.environ["TRITON_CACHE_DIR"] = self.state["triton_cache"]
        else:
            os.environ.pop("TRITON_CACHE_DIR", None)

    def late(self, slack=0.0):
        return time.time() > self.state.get("deadline", 1e18) - slack

    # ---------------------------------------------------------------- sections
    def ceilings(self):
        import platform

        import triton
        torch = self.torch
        meta = dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                    gpu=torch.cuda.get_device_name() if self.cuda else "cpu (dry run)")
        try:
            from holotron.kernels import ssd_triton_backward as TB
            meta["bwd_config"] = dict(getattr(TB, "BWD_CONFIG", {}))
        except Exception as e:  # noqa: BLE001
            meta["bwd_config"] = f"ssd_triton_backward not importable: {type(e).__name__}"
        T = self.scan_module()
        meta["scan_config_default"] = dict(T.SCAN_CONFIG) if T is not None else None
        emit("meta", meta)
        bw, mm = self.copy_bandwidth(), self.matmul_rate()
        emit("ceilings", dict(copy_Bps=bw, bf16_matmul_flops=mm))
        print(f"# {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  copy {bw / 1e9:.0f} GB/s  "
              f"bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)

    def copy_bandwidth(self):
        """Bytes per second of a 1 GiB device-to-device copy (read + write)."""
        n = (1 << 28) if self.cuda else (1 << 22)
        src = self.torch.randn(n, device=self.dev)
        dst = self.torch.empty_like(src)
        return 2 * n * 4 / (self.bench(lambda: dst.copy_(src)) * 1e-3)

    def matmul_rate(self):
        """FLOP/s of a bf16 8192^3 matmul on random data."""
        m = 8192 if self.cuda else 256
        a = self.torch.randn(m, m, device=self.dev, dtype=self.torch.bfloat16)
        b = self.torch.randn(m, m, device=self.dev, dtype=self.torch.bfloat16)
        return 2 * m**3 / (self.bench(lambda: a @ b) * 1e-3)

    def sweep(self):
        torch = self.torch
        T = self.scan_module()
        if T is None:
            return
        base = dict(T.SCAN_CONFIG)
        data = {}
        for b, l in SHAPES:
            kw = self.inputs(b, l, seed=11)
            data[(b, l)] = (kw, *self.reference(kw))
        print(f"# sweep: {len(self.state['configs'])} configs x {len(SHAPES)} shapes; references ready", flush=True)
        for cfg in self.state["configs"]:
            if self.late(5):
                print("# sweep: out of time", flush=True)
                break
            emit("start", cfg)
            self.set_config(T, base, cfg)
            row, t0 = dict(config=cfg, shapes=[]), time.time()
            for (b, l), (kw, y_ref, s_ref) in data.items():
                r = dict(b=b, l=l, ok=False)
                try:
                    self.poison(b, l)
                    f = self.ours(kw)
                    forget_kernels(T)
                    y, s = f()
                    self.sync()
                    r.update(last_kernels(T).get("scan", {}))
                    r["y_err"], r["state_err"] = self.rel(y, y_ref), self.rel(s, s_ref)
                    finite = bool(torch.isfinite(y).all() and torch.isfinite(s).all())
                    r["ok"] = finite and r["y_err"] < TOL and r["state_err"] < TOL
                    del y, s
                    if r["ok"]:
                        r["ms"] = self.bench(f, rep=self.state.get("sweep_rep", 25.0) if self.cuda else 1)
                    else:
                        r["why"] = "not finite" if not finite else "wrong output"
                except Exception as e:  # noqa: BLE001  (a config that does not compile or launch: recorded)
                    r["why"] = f"{type(e).__name__}: {str(e)[:300]}"
                    if crash_text(str(e)):
                        row["shapes"].append(r)
                        emit("cfg", dict(row, s=time.time() - t0))
                        print(f"# sweep {cfg}: {r['why'][:120]}: the CUDA context is gone, stopping", flush=True)
                        sys.exit(3)
                row["shapes"].append(r)
                if not r["ok"]:
                    break  # wrong somewhere: out of the race
            for k in KERNEL_KEYS:  # the row's figure: the largest over its shapes (the kernel may differ by shape)
                v = [r[k] for r in row["shapes"] if r.get(k) is not None]
                if v:
                    row[k] = max(v)
            emit("cfg", dict(row, s=time.time() - t0))
            print(f"# sweep {cfg}: " + ", ".join(
                f"{r['b']}x{r['l']} " + (f"{r['ms']:.3f} ms" if r.get("ms") is not None else r.get("why", "?")[:60])
                for r in row["shapes"]) + f"  ({time.time() - t0:.1f} s{kernel_text(row)})", flush=True)

    def fwd(self):
        T = self.scan_module()
        peers, mamba, fla = self.peers()
        base = dict(T.SCAN_CONFIG) if T is not None else {}
        for b, l in SHAPES:
            emit("fwd", self.fwd_shape(b, l, T, base, peers, mamba, fla))
            self.first_fwd.update({k: None for k in ("ours", "mamba_ssm", "fla") if k not in self.first_fwd})
            if self.cuda:
                self.torch.cuda.empty_cache()
        if T is not None and self.cuda:  # last: a capture that fails can leave the context unusable
            b, l = SHAPES[0]
            for tag, cfg in (("auto", {}), ("best", (self.state.get("best", {}).get(f"{b}x{l}") or [{}])[0])):
                emit("graph", self.graph(b, l, T, base, tag, cfg))

    def graph(self, b, l, T, base, tag, cfg):
        """Ours captured in a CUDA graph (no host time in the figure); the replay must equal the eager call."""
        torch = self.torch
        kw = self.inputs(b, l, seed=3)
        row = dict(b=b, l=l, tag=tag, config=cfg)
        try:
            self.set_config(T, base, cfg)
            g, (yg, sg) = capture(self.ours(kw))
            g.replay()
            self.sync()
            y, s = self.ours(kw)()
            row["ms"] = self.bench(g.replay)
            row["replay_equals_eager"] = bool(torch.equal(yg, y) and torch.equal(sg, s))
            print(f"# graph {b}x{l} {tag} {cfg}: {row['ms']:.3f} ms, replay == eager: {row['replay_equals_eager']}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"# graph {b}x{l} {tag} failed: {row['error']}", flush=True)
        self.set_config(T, base, {})
        return row

    def fwd_shape(self, b, l, T, base, peers, mamba, fla):
        kw = self.inputs(b, l, seed=3)
        y_ref, s_ref = self.reference(kw)
        row = dict(b=b, l=l, ours={})
        libs = [("ours {}", {}, self.ours(kw))] if T is not None else []
        if mamba is not None:
            libs.append(("mamba_ssm", None, lambda: peers.mamba_call(mamba, kw)))
        if fla is not None:
            fa = peers.fla_prepare(kw, H)
            libs.append(("fla", None, lambda: peers.fla_call(fla, fa)))
        if T is not None:  # the sweep's fastest, compiled in the sweep's cache (the cold first calls are done)
            libs += [(None, cfg, self.ours(kw)) for cfg in self.state.get("best", {}).get(f"{b}x{l}", []) if cfg]
        for name, cfg, f in libs:
            if name is None:
                self.shared_cache()
                name = "ours " + json.dumps(cfg, sort_keys=True)
            try:
                if cfg is not None:
                    self.set_config(T, base, cfg)
                t = time.perf_counter()
                y, s = f()
                self.sync()
                lib = name.split(" ")[0]
                if lib not in self.first_fwd:  # this process's first call of the library, its Triton cache empty
                    self.first_fwd[lib] = time.perf_counter() - t
                    emit("first_call", dict(lib=lib, what="forward", b=b, l=l, s=self.first_fwd[lib]))
                if name == "fla":  # no D term: its reference is ours less D x
                    Dx = kw["D"][:, None] * kw["x"].float()
                    e = dict(y_err=self.rel(y, y_ref - Dx), state_err=self.rel(s, s_ref),
                             y_err_with_Dx_added=self.rel(y.float() + Dx, y_ref))
                else:
                    e = dict(y_err=self.rel(y, y_ref), state_err=self.rel(s, s_ref))
                y = s = Dx = None
                rec = dict(ms=self.bench(f), **e)
                if name.startswith("ours"):
                    rec["config"] = cfg
                    row["ours"][name[5:]] = rec
                else:
                    row[name] = rec
                print(f"# fwd {b}x{l} {name}: {rec['ms']:.3f} ms, y err {e['y_err']:.2e}, state err "
                      f"{e['state_err']:.2e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"# fwd {b}x{l} {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                row.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
        timed = {k: v for k, v in row["ours"].items() if v.get("ms") is not None}
        if timed:
            k = min(timed, key=lambda k: timed[k]["ms"])
            row["ours_best"] = dict(timed[k], key=k)
            row["ours_auto"] = row["ours"].get("{}")
        if T is not None:
            self.set_config(T, base, {})
        return row

    def fwdbwd(self):
        T = self.scan_module()
        peers, mamba, fla = self.peers()
        for i, (b, l) in enumerate(SHAPES):
            emit("fwdbwd", self.fwdbwd_shape(b, l, T is not None, peers, mamba, fla, first=i == 0))
            if self.cuda:
                self.torch.cuda.empty_cache()

    def grad_inputs(self, b, l):
        """The forward + backward inputs (leaves that want gradients) and the fixed upstream gradient dy."""
        torch = self.torch
        kw = self.inputs(b, l, seed=5, grad=True)
        dy = torch.randn(kw["x"].shape, device=self.dev, generator=torch.Generator(self.dev).manual_seed(6))
        return kw, dy.bfloat16()

    def fwdbwd_shape(self, b, l, ours, peers, mamba, fla, first):
        torch = self.torch
        kw, dy = self.grad_inputs(b, l)
        leaves = [kw[n] for n in GRAD_NAMES]
        fns = []
        if ours:
            fns.append(("ours", lambda: torch.autograd.grad(self.ours(kw)()[0], leaves, dy)))
        if mamba is not None:
            fns.append(("mamba_ssm", lambda: torch.autograd.grad(peers.mamba_call(mamba, kw, False), leaves, dy)))
        if fla is not None:
            fa = {n: v.detach().requires_grad_(True) for n, v in peers.fla_prepare(kw, H).items()}
            fns.append(("fla", lambda: torch.autograd.grad(peers.fla_call(fla, fa, False), list(fa.values()), dy)))
        row = dict(b=b, l=l)
        for name, f in fns:
            try:
                t = time.perf_counter()
                f()
                self.sync()
                if first:  # the first forward + backward of a cold cache; after a first forward in this process,
                    # that forward's time is added (its compiles are part of the cold forward + backward)
                    dt = time.perf_counter() - t
                    pre = self.first_fwd.get(name)
                    emit("first_call", dict(lib=name, what="forward+backward", b=b, l=l, s=dt + (pre or 0.0),
                                            after_first_forward_s=dt if name in self.first_fwd else None))
                row[name] = dict(ms=self.bench(f))
                print(f"# fwd+bwd {b}x{l} {name}: {row[name]['ms']:.3f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"# fwd+bwd {b}x{l} {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                row.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
        if first:
            self.grad_accuracy(kw, dy, peers, mamba, fla, ours)
        return row

    def grad_accuracy(self, kw, dy, peers, mamba, fla, ours):
        """Every gradient of each library against float64 autograd through the chunked scan, same inputs."""
        b, l = kw["x"].shape[:2]
        try:
            ref = self.grad_reference(kw, dy)
            ref_noD = self.grad_reference(kw, dy, with_D=False) if fla is not None else None
        except Exception as e:  # noqa: BLE001
            emit("fail", dict(what="float64 gradient reference", error=f"{type(e).__name__}: {str(e)[:300]}"))
            return
        leaves = [kw[n] for n in GRAD_NAMES]
        runs = []
        if ours:
            runs.append(("ours", lambda: self.ours(kw)()[0], GRAD_NAMES, ref))
        if mamba is not None:
            runs.append(("mamba_ssm", lambda: peers.mamba_call(mamba, kw, False), GRAD_NAMES, ref))
        if fla is not None:  # through the expansion q = C, k = B dt, g = dt A: no D
            runs.append(("fla", lambda: peers.fla_call(fla, peers.fla_prepare(kw, H), False),
                         [n for n in GRAD_NAMES if n != "D"], ref_noD))
        for name, f, names, r in runs:
            row = dict(lib=name, b=b, l=l, **self.grad_errors(f, kw, names, dy, r))
            emit("grad_accuracy", row)
            print(f"# grad error {name}: " + ", ".join(f"{k} {v:.2e}" for k, v in row.items()
                                                         if k.startswith("d") and isinstance(v, float)), flush=True)
        del leaves, ref, ref_noD

    def grad_errors(self, f, kw, names, dy, ref):
        """{"dNAME": relative RMS error of that gradient vs ref[NAME] (NaN: not finite; None: no gradient)} of
        the output of ``f()`` with upstream gradient dy; {"error": text} if it raised."""
        torch = self.torch
        row = {}
        try:
            y = f()
            gs = torch.autograd.grad(y, [kw[n] for n in names], dy, allow_unused=True)
            for n, g in zip(names, gs):
                row[f"d{n}"] = self.rel(g, ref[n]) if g is not None else None
                if g is not None and not bool(torch.isfinite(g).all()):
                    row[f"d{n}"] = float("nan")
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return row

    def bwd_module(self):
        try:
            from holotron.kernels import ssd_triton_backward as TB
        except Exception as e:  # noqa: BLE001  (an import failure is recorded, not fatal)
            emit("fail", dict(what="holotron.kernels.ssd_triton_backward", error=f"{type(e).__name__}: {e}"))
            return None
        if not isinstance(getattr(TB, "BWD_CONFIG", None), dict):
            emit("fail", dict(what="holotron.kernels.ssd_triton_backward", error="no BWD_CONFIG dict"))
            return None
        return TB

    def bwdsweep(self):
        """Ours forward + backward over BWD_CONFIG settings: each checked at the first shape (every gradient
        finite and within BWD_TOL of float64 autograd), then timed at every shape; BWD_CONFIG restored."""
        TB = self.bwd_module()
        if TB is None:
            return
        base = dict(TB.BWD_CONFIG)
        cfgs = self.state["configs"]
        unknown = sorted({k for c in cfgs for k in c} - set(base))
        if unknown:
            print(f"# note: ssd_triton_backward.BWD_CONFIG is {base}: no keys {unknown} (an older kernel?); "
                  "they are set anyway", flush=True)
        data = [(b, l, *self.grad_inputs(b, l)) for b, l in SHAPES]
        try:
            ref = self.grad_reference(data[0][2], data[0][3])
        except Exception as e:  # noqa: BLE001
            emit("fail", dict(what="float64 gradient reference", error=f"{type(e).__name__}: {str(e)[:300]}"))
            return
        rep = self.state.get("sweep_rep", 25.0) if self.cuda else 1
        print(f"# bwd sweep: {len(cfgs)} configs x {len(SHAPES)} shapes; the float64 gradients ready", flush=True)
        try:
            for cfg in cfgs:
                if self.late(5):
                    print("# bwd sweep: out of time", flush=True)
                    break
                emit("start", cfg)
                TB.BWD_CONFIG.clear()
                TB.BWD_CONFIG.update({**base, **cfg})
                row, t0 = dict(config=cfg, ok=False, shapes=[]), time.time()
                self.bwd_config(TB, cfg, row, data, ref, rep)
                emit("cfg", dict(row, s=time.time() - t0))
                print(f"# bwd sweep {cfg}: max grad err {_f(row.get('max_err'), '.1e')}; " + (", ".join(
                    f"{r['b']}x{r['l']} " + (f"{r['ms']:.3f} ms" if r.get("ms") is not None else r.get("why", "?")[:60])
                    for r in row["shapes"]) or row.get("why", "?")[:200]) + f"  ({time.time() - t0:.1f} s)",
                    flush=True)
                if row.get("context_lost"):
                    sys.exit(3)
        finally:
            TB.BWD_CONFIG.clear()
            TB.BWD_CONFIG.update(base)

    def bwd_config(self, TB, cfg, row, data, ref, rep):
        """One backward config into ``row``: the check at the first shape, then the timings."""
        torch = self.torch
        _, _, kw0, dy0 = data[0]
        forget_kernels(TB)
        errs = self.grad_errors(lambda: self.ours(kw0)()[0], kw0, GRAD_NAMES, dy0, ref)
        self.sync()
        row["errors"] = errs
        vals = [errs.get(f"d{n}") for n in GRAD_NAMES]
        if errs.get("error"):
            row["why"] = errs["error"]
            row["context_lost"] = crash_text(errs["error"])
            return
        if any(v is None for v in vals):
            row["why"] = "no gradient for " + ", ".join(n for n, v in zip(GRAD_NAMES, vals) if v is None)
            return
        row["max_err"] = max(vals)
        if not all(math.isfinite(v) for v in vals):
            row["why"] = "not finite"
            return
        if row["max_err"] > BWD_TOL:
            row["why"] = f"wrong gradients (max error {row['max_err']:.1e} > {BWD_TOL})"
            return
        for b, l, kw, dy in data:
            leaves = [kw[n] for n in GRAD_NAMES]
            f = lambda: torch.autograd.grad(self.ours(kw)()[0], leaves, dy)
            r = dict(b=b, l=l)
            try:
                forget_kernels(TB)
                f()
                self.sync()
                r["kernels"] = last_kernels(TB)
                r["ms"] = self.bench(f, rep=rep)
            except Exception as e:  # noqa: BLE001  (a config that does not compile or launch here: recorded)
                r["why"] = f"{type(e).__name__}: {str(e)[:300]}"
                row["context_lost"] = crash_text(r["why"])
            row["shapes"].append(r)
            if r.get("ms") is None:
                row["why"] = f"{b}x{l}: {r['why']}"
                return
        row["ok"] = True

    def step(self):
        """ssd_step in a CUDA graph over distinct per-layer states (no L2 reuse), and eager; fp32 and bf16 state."""
        bw = self.state["ceilings"].get("copy_Bps") or self.copy_bandwidth()
        for b in STEP_B:
            for sdt in ("fp32", "bf16"):
                emit("step", self.step_one(b, sdt, bw))
            if self.cuda:
                self.torch.cuda.empty_cache()

    def step_one(self, b, sname, bw):
        torch = self.torch
        from holotron.kernels import ssd_step
        from holotron.kernels import ssd_triton_step as TS
        kw = self.inputs(b, 1, seed=1)
        x, dt, B, C = (kw[k][:, 0] for k in ("x", "dt", "B", "C"))
        sdt = dict(fp32=torch.float32, bf16=torch.bfloat16)[sname]
        sbytes = b * H * P * N * sdt.itemsize
        layers = max(2, min(32, math.ceil(400e6 / sbytes)))
        states = [torch.randn(b, H, P, N, device=self.dev).to(sdt) for _ in range(layers)]
        fn = lambda st: ssd_step(st, x, dt, kw["A"], B, C, D=kw["D"], dt_bias=kw["dt_bias"], dt_softplus=True,
                                 backend="triton")
        row = dict(b=b, state_dtype=sname, config=dict(getattr(TS, "STEP_CONFIG", {})), layers=layers)
        try:
            if self.cuda:
                g, _ = capture(lambda: [fn(st) for st in states])
                row["graph_us"] = self.bench(g.replay) * 1e3 / layers
            else:
                row["graph_us"] = self.bench(lambda: [fn(st) for st in states]) * 1e3 / layers
            row["eager_us"] = self.bench(lambda: fn(states[0])) * 1e3
            bytes_step = 2 * sbytes + 2 * (2 * b * H * P + 2 * b * G * N + b * H)  # state read + written
            row.update(bytes=bytes_step, TBps=bytes_step / row["graph_us"] / 1e6, floor_us=bytes_step / bw * 1e6,
                       mamba_ssm_quoted_us=MAMBA_SSM_STEP_US.get(b) if sname == "fp32" else None)
            print(f"# step b{b} {sname}: graph {row['graph_us']:.2f} us/layer, eager {row['eager_us']:.1f} us",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"# step b{b} {sname} failed: {row['error']}", flush=True)
        return row


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


# ============================================================================ tables and the chart


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def kernel_text(d):
    """', 168 regs, 0 spills, 96 KiB shared' of a kernel_info-like dict ('' without figures)."""
    parts = [f"{d['n_regs']} regs" if d.get("n_regs") is not None else None,
             f"{d['n_spills']} spills" if d.get("n_spills") is not None else None,
             f"{d['shared'] / 1024:.0f} KiB shared" if d.get("shared") is not None else None]
    parts = [p for p in parts if p]
    return (", " + ", ".join(parts)) if parts else ""


def _ratio(a, b):
    return None if not a or not b else a / b


def print_tables(out):
    c = out["ceilings"]
    m = out["meta"]
    head = [m.get("gpu"), m.get("torch") and f"torch {m['torch']}", m.get("triton") and f"triton {m['triton']}",
            m.get("mamba_ssm"), m.get("fla"), c.get("copy_Bps") and f"copy {c['copy_Bps'] / 1e9:.0f} GB/s",
            c.get("bf16_matmul_flops") and f"bf16 matmul {c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s"]
    print("\n# " + " | ".join(h for h in head if h))
    bw, mm = c.get("copy_Bps"), c.get("bf16_matmul_flops")
    floor = lambda nb, nf: max(nb / bw, nf / mm) * 1e3 if bw and mm else None

    if out["sweep"]:
        nshapes = len({(s["b"], s["l"]) for r in out["sweep"] for s in r.get("shapes", [])})
        ok = [r for r in out["sweep"] if not r.get("crashed") and len(r["shapes"]) == nshapes
              and all(s.get("ok") for s in r["shapes"])]
        why = lambda r: "crashed" if r.get("crashed") else next(
            (s.get("why", "?")[:50] for s in r["shapes"] if not s.get("ok")), "not every shape")
        bad = [f"{json.dumps(r['config'], sort_keys=True)}: {why(r)}" for r in out["sweep"] if r not in ok]
        print(f"\n## sweep: {len(out['sweep'])} configs, {len(ok)} right and timed at every shape; failed or "
              f"crashed: {'; '.join(bad[:8]) or 'none'}{' ...' if len(bad) > 8 else ''}")
        shapes = sorted({(s["b"], s["l"]) for r in ok for s in r["shapes"]})
        if shapes:
            print("| config | " + " | ".join(f"{b}x{l} ms" for b, l in shapes)
                  + " | sum / best sum | regs | spills | shared KiB |")
            print("|---" * (len(shapes) + 5) + "|")
            tot = {json.dumps(r["config"], sort_keys=True): sum(s["ms"] for s in r["shapes"]) for r in ok}
            bsum = min(tot.values())
            for r in sorted(ok, key=lambda r: tot[json.dumps(r["config"], sort_keys=True)])[:6]:
                ms = {(s["b"], s["l"]): s["ms"] for s in r["shapes"]}
                print(f"| {json.dumps(r['config'], sort_keys=True) if r['config'] else 'auto'} | "
                      + " | ".join(_f(ms.get(s), ".3f") for s in shapes)
                      + f" | {tot[json.dumps(r['config'], sort_keys=True)] / bsum:.3f} | {_f(r.get('n_regs'), 'd')} | "
                      f"{_f(r.get('n_spills'), 'd')} | {_f(r.get('shared') and r['shared'] / 1024, '.0f')} |")

    graphs = {(r["b"], r["l"], r["tag"]): r for r in out.get("graph", [])}
    if out["fwd"]:
        print("\n## forward (ms; error = relative RMS vs float64: y / final state)")
        print("| b x l | ours best | its config | ours auto | graph (auto) | mamba_ssm | FLA | floor | best / floor | "
              "mamba_ssm / ours | FLA / ours | ours err | mamba_ssm err | FLA err |")
        print("|---" * 14 + "|")
        for r in out["fwd"]:
            b, l = r["b"], r["l"]
            ob, oa = r.get("ours_best") or {}, r.get("ours_auto") or {}
            mb, fl = r.get("mamba_ssm") or {}, r.get("fla") or {}
            rb = lambda d: _f(_ratio(d.get("ms"), ob.get("ms")), ".2f")
            fm = floor(scan_bytes(b, l), scan_flops(b, l))
            gm = graphs.get((b, l, "auto"), {}).get("ms")
            err = lambda d: f"{_f(d.get('y_err'), '.1e')} / {_f(d.get('state_err'), '.1e')}" if d else "-"
            print(f"| {b}x{l} | {_f(ob.get('ms'), '.3f')} | {json.dumps(ob.get('config')) if ob else '-'} | "
                  f"{_f(oa.get('ms'), '.3f')} | {_f(gm, '.3f')} | {_f(mb.get('ms'), '.3f')} | "
                  f"{_f(fl.get('ms'), '.3f')} | {_f(fm, '.3f')} | {_f(_ratio(ob.get('ms'), fm), '.2f')} | "
                  f"{rb(mb)} | {rb(fl)} | "
                  f"{err(oa or ob)} | {err(mb)} | {err(fl)} |")

    bb = out.get("bwd_best") or {}
    if out["fwdbwd"]:
        print("\n## forward + backward (ms; ours: the automatic setting; ours best bwd: the backward sweep's "
              f"fastest right config, {json.dumps(bb.get('config')) if bb else 'none'}, its own short do_bench)")
        print("| b x l | ours | ours best bwd | mamba_ssm | FLA (q, k, v, g) | floor | ours / floor | "
              "mamba_ssm / ours | FLA / ours |")
        print("|---" * 9 + "|")
        for r in out["fwdbwd"]:
            b, l = r["b"], r["l"]
            o, mb, fl = (r.get(k, {}).get("ms") for k in ("ours", "mamba_ssm", "fla"))
            fm = floor(fwdbwd_bytes(b, l), fwdbwd_flops(b, l))
            print(f"| {b}x{l} | {_f(o, '.3f')} | {_f(bb.get('ms', {}).get(f'{b}x{l}'), '.3f')} | {_f(mb, '.3f')} | "
                  f"{_f(fl, '.3f')} | {_f(fm, '.3f')} | "
                  f"{_f(_ratio(o, fm), '.2f')} | {_f(_ratio(mb, o), '.2f')} | {_f(_ratio(fl, o), '.2f')} |")
            if r.get("errors"):
                print(f"|   errors: {r['errors']} |")

    if out.get("bwd_sweep"):
        rows = out["bwd_sweep"]
        shapes = sorted({(s["b"], s["l"]) for r in rows for s in r.get("shapes", [])})
        ok = [r for r in rows if r.get("ok")]
        tot = {id(r): sum(s["ms"] for s in r["shapes"]) for r in ok}
        bsum = min(tot.values()) if tot else None
        print(f"\n## backward sweep: {len(rows)} configs, {len(ok)} right (max gradient error <= {BWD_TOL}) and "
              "timed at every shape (forward + backward, ms; kernels: regs / spills at the first shape)")
        print("| config | " + " | ".join(f"{b}x{l} ms" for b, l in shapes)
              + " | sum / best sum | max grad err | kernels | why not |")
        print("|---" * (len(shapes) + 5) + "|")
        order = sorted(rows, key=lambda r: (not r.get("ok"), tot.get(id(r), 0.0)))
        for r in order:
            ms = {(s["b"], s["l"]): s.get("ms") for s in r.get("shapes", [])}
            ks = next((s.get("kernels") for s in r.get("shapes", []) if s.get("kernels")), {}) or {}
            kt = ", ".join(f"{n} {_f(i.get('n_regs'), 'd')}/{_f(i.get('n_spills'), 'd')}" for n, i in ks.items())
            why = "crashed: " + str(r["crashed"].get("killed") or f"exit {r['crashed'].get('rc')}") \
                if r.get("crashed") else r.get("why", "")
            print(f"| {json.dumps(r['config'], sort_keys=True) if r['config'] else 'default'} | "
                  + " | ".join(_f(ms.get(s), ".3f") for s in shapes)
                  + f" | {_f(tot[id(r)] / bsum if id(r) in tot and bsum else None, '.3f')} | "
                  f"{_f(r.get('max_err'), '.1e')} | {kt or '-'} | {why[:80]} |")
    for (b, l, tag), r in graphs.items():
        print(f"# {b}x{l} in a CUDA graph, {tag} config {json.dumps(r.get('config'))}: "
              + (f"{r['ms']:.3f} ms, replay == eager: {r.get('replay_equals_eager')}" if r.get("ms") is not None
                 else f"failed: {r.get('error', '?')[:150]}"))

    if out["grad_accuracy"]:
        print("\n## gradient error (relative RMS vs float64 autograd through the chunked scan; FLA without D)")
        names = [f"d{n}" for n in GRAD_NAMES]
        print("| lib | b x l | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 2) + "|")
        for r in out["grad_accuracy"]:
            print(f"| {r['lib']} | {r['b']}x{r['l']} | " + " | ".join(_f(r.get(n), ".1e") for n in names) + " |"
                  + (f" {r['error'][:100]}" if r.get("error") else ""))

    if out["first_call"]:
        print("\n## first call (s, wall, compiles and autotuning included, empty Triton cache, fresh process)")
        print("| lib | what | b x l | s |")
        print("|---|---|---|---|")
        for r in out["first_call"]:
            print(f"| {r['lib']} | {r['what']} | {r['b']}x{r['l']} | {r['s']:.2f} |")

    if out["step"]:
        print("\n## decode step (us per layer in a CUDA graph)")
        print("| batch | state | graph us | TB/s | floor us | x floor | mamba_ssm us (quoted) | eager us |")
        print("|---|---|---|---|---|---|---|---|")
        for r in out["step"]:
            if r.get("error"):
                print(f"| {r['b']} | {r['state_dtype']} | failed: {r['error'][:80]} |")
                continue
            print(f"| {r['b']} | {r['state_dtype']} | {r['graph_us']:.2f} | {r['TBps']:.2f} | {r['floor_us']:.2f} | "
                  f"{r['graph_us'] / r['floor_us']:.2f} | {_f(r.get('mamba_ssm_quoted_us'), '.1f')} | "
                  f"{r['eager_us']:.1f} |")

    for f in out["failures"]:
        print(f"# FAILED {f.get('section')}: {f.get('what', '')} {f.get('error', '') or f.get('killed') or ''} "
              f"{'' if f.get('rc') in (None, 0) else 'exit ' + str(f.get('rc'))}")
        for ln in f.get("tail", [])[-4:]:
            print("#   ", ln[:200])
    for s in out["skipped"]:
        print(f"# skipped {s['section']}: {s['why']}")


def plot(path, png):
    """A panel per section measured (forward, forward + backward): median ms per shape, ours next to the peers
    and the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = json.load(open(path))
    m, c = d["meta"], d.get("ceilings", {})
    dims = m.get("dims", dict(H=H, P=P, N=N, G=G))
    bw, mm = c.get("copy_Bps"), c.get("bf16_matmul_flops")
    ms = lambda key: lambda r: (r.get(key) or {}).get("ms")
    mamba = m.get("mamba_ssm") or "mamba_ssm"
    series = {  # label: (colour, forward getter, forward + backward getter)
        "holotron ssd_scan (fastest swept config)": ("C0", ms("ours_best"), None),
        "holotron ssd_scan (automatic config)": ("C9", ms("ours_auto"), ms("ours")),
        f"{mamba} mamba_chunk_scan_combined": ("C2", ms("mamba_ssm"), ms("mamba_ssm")),
        f"FLA chunk_simple_gla ({m.get('fla') or '?'}; no D; B, C expanded)": ("C3", ms("fla"), ms("fla")),
    }
    panels = [p for p in [("forward", d.get("fwd", []), scan_bytes, scan_flops, 1),
                          ("forward + backward", d.get("fwdbwd", []), fwdbwd_bytes, fwdbwd_flops, 2)] if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 5), squeeze=False)
    axes = axes[0]
    for ax, (title, rows, fb, ff, i_get) in zip(axes, panels):
        live = [(name, v[0], v[i_get]) for name, v in series.items() if v[i_get] is not None]
        w = 0.8 / (len(live) + 1)
        for i, (name, colour, get) in enumerate(live):
            pts = [(j + i * w, get(r)) for j, r in enumerate(rows) if get(r)]
            if pts:
                ax.bar(*zip(*pts), w, color=colour, label=name)
        if bw and mm and rows:
            fl = [max(fb(r["b"], r["l"]) / bw, ff(r["b"], r["l"]) / mm) * 1e3 for r in rows]
            ax.bar([j + len(live) * w for j in range(len(rows))], fl, w, color="0.85", hatch="//", edgecolor="0.5",
                   label="floor: bytes / copy bandwidth, FLOPs / matmul rate")
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(rows))], [f"{r['b']} x {r['l']}" for r in rows])
        ax.set_yscale("log")
        ax.set_xlabel("batch x seqlen")
        ax.set_ylabel("ms (median)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    handles = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"SSD scan, H={dims['H']} P={dims['P']} N={dims['N']} G={dims['G']}, bf16, D, dt_bias, softplus | "
                 f"{m.get('gpu')}, torch {m.get('torch')}, triton {m.get('triton')}, {m.get('date')}", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(png, dpi=120)
    print("wrote", png)


if __name__ == "__main__":
    main()
