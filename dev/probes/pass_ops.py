"""Probe (CPU): the copies, casts and index ops of one mixed engine pass, by the line of holotron that issues them.

A GPU profile of a mixed pass at 12B (docs/benchmarks.md, "Token buckets of 16") counted 211 direct copies and
119 casts; a profile names kernels, not the code behind them. This probe runs ``HybridLM.mixed`` once on a tiny
bf16 model with the decode step's kernels on (Triton's CPU interpreter), records every aten op whose name holds "copy",
"index", "cat", "gather", "scatter" or "clone", and every ``.to`` that makes a new tensor, through a
``TorchDispatchMode``, and prints them by count with the innermost holotron line that called them. On the CPU
the scan and the conv take their PyTorch paths (holotron/kernels/ssd_chunked.py, conv_naive.py), so their
internal ops differ from the GPU's; the rest (norms, casts, the rows' states in and out, concatenations) is the
same code. It was how the mixed pass's fp32 group norm of the decoding rows was found (now the group-norm
kernel, holotron/mamba2.py); with ``--norm16`` the three casts of each RMSNorm go.

    python dev/probes/pass_ops.py [--pattern M-M*-] [--norm16]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HOLOTRON_FUSED_DECODE", "on")
if "--norm16" in sys.argv:
    os.environ["HOLOTRON_NORM16"] = "1"

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_serving import SMALL, build  # noqa: E402

from holotron.lm import TextConfig  # noqa: E402
from holotron.state import DecodeState  # noqa: E402

WORDS = ("copy", "index", "cat", "gather", "scatter", "clone")


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        out = func(*args, **(kwargs or {}))
        cast = name.startswith(("aten.to.", "aten._to_copy")) and isinstance(out, torch.Tensor) \
            and isinstance(args[0], torch.Tensor) and out is not args[0]   # a cast or copy, not a no-op .to
        if cast or any(w in name for w in WORDS):
            frames = [f for f in traceback.extract_stack() if f"{os.sep}holotron{os.sep}" in f.filename]
            f = frames[-1] if frames else None
            where = f"{os.path.basename(f.filename)}:{f.lineno}  {(f.line or '')[:72]}" if f else "?"
            self.count[(name, where)] += 1
        return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", default=None, help="hybrid_override_pattern of the tiny model (default: SMALL's)")
    ap.add_argument("--norm16", action="store_true", help="HOLOTRON_NORM16=1 (set before holotron is imported)")
    args = ap.parse_args()
    kw = dict(SMALL) if args.pattern is None else {**SMALL, "hybrid_override_pattern": args.pattern}
    cfg = TextConfig(**kw)
    lm = build(cfg, torch.device("cpu"), torch.bfloat16)
    n, b, t, hist = 6, 2, 32, 40
    st = DecodeState.allocate(lm, n + b, 128, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    active = torch.ones(n, dtype=torch.long)
    x = torch.randn(b, t, cfg.hidden_size, generator=g).bfloat16()
    rows, starts, counts = torch.arange(n, n + b), torch.full((b,), hist), torch.full((b,), t)
    ops = _Ops()
    with torch.inference_mode():
        st.lengths.fill_(hist)
        lm.mixed(toks, st, active, x, rows, starts, counts)   # first call: compiles, caches
        st.lengths.fill_(hist)
        with ops:
            lm.mixed(toks, st, active, x, rows, starts, counts)
    print(f"layers {cfg.hybrid_override_pattern}  ({n} decoding rows, {b} x {t} chunk tokens)")
    for (name, where), c in sorted(ops.count.items(), key=lambda kv: -kv[1]):
        print(f"{c:4d}  {name:32s} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
