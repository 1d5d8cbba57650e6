"""Bytes held by the inference state after N decode steps: the Mamba part is constant, only KV grows.

    python benchmarks/state_memory.py [--steps 100 10000] [--out DIR]   (JSON to DIR/state_memory.json)

Measured: a small random HybridLM (CPU, fp32) prefills a 16-token prompt and decodes N tokens, one
at a time, through one InferenceState; the table reports ``state.nbytes()`` by part, both the slots
in use and the allocated capacity (which doubles when exceeded; ``generate`` reserves prompt + new
tokens up front, so there allocated == in use). Computed (not run): the same for the 12B
configuration, from the tensor shapes of a state allocated on the meta device, batch 1, bf16 KV.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from holotron.config import TextConfig  # noqa: E402
from holotron.lm import HybridLM  # noqa: E402

SMALL = dict(vocab_size=1024, hidden_size=256, hybrid_override_pattern="M-M*-M-M*-",
             num_attention_heads=8, num_key_value_heads=2, head_dim=32, intermediate_size=512,
             mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=64, n_groups=2, conv_kernel=4, chunk_size=64)
PROMPT = 16


def fmt(n: int) -> str:
    return f"{n:,}"


def measure(steps: list[int]) -> list[dict]:
    torch.manual_seed(0)
    model = HybridLM(TextConfig(**SMALL)).eval()
    state = model.new_state(1)
    rows = []
    with torch.inference_mode():
        logits = model(torch.randint(0, 1024, (1, PROMPT)), state=state)[:, -1]
        for step in range(1, max(steps) + 1):
            tok = logits.argmax(-1, keepdim=True)
            logits = model(tok, state=state)[:, -1]
            if step in steps:
                used, alloc = state.nbytes(used_only=True), state.nbytes()
                rows.append({"config": "small (measured)", "decode_steps": step, "positions": state.seqlen,
                             "mamba": used["mamba"], "kv_in_use": used["attention"], "kv_allocated": alloc["attention"],
                             "mask_in_use": used["positions"], "total_in_use": used["total"],
                             "total_allocated": alloc["total"]})
    return rows


def computed_12b(steps: list[int]) -> list[dict]:
    cfg = TextConfig()
    with torch.device("meta"):
        model = HybridLM(cfg).to(torch.bfloat16)
    rows = []
    for n in steps:
        state = model.new_state(1, capacity=PROMPT + n)
        state.seqlen = PROMPT + n
        b = state.nbytes(used_only=True)
        rows.append({"config": "12B (computed)", "decode_steps": n, "positions": state.seqlen, "mamba": b["mamba"],
                     "kv_in_use": b["attention"], "kv_allocated": b["attention"], "mask_in_use": b["positions"],
                     "total_in_use": b["total"], "total_allocated": b["total"]})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 10_000])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    rows = measure(args.steps) + computed_12b(args.steps)
    wall = time.time() - t0
    cols = ["config", "decode_steps", "positions", "mamba", "kv_in_use", "kv_allocated", "mask_in_use", "total_in_use"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(fmt(r[c]) if isinstance(r[c], int) else str(r[c]) for c in cols) + " |")
    meta = {"small_config": SMALL, "prompt": PROMPT, "batch": 1, "dtype_small": "float32",
            "dtype_12b": "bfloat16 (ssm fp32)", "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(wall, 1)}
    print(f"\n{meta}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "state_memory.json"), "w") as f:
        json.dump({"rows": rows, "meta": meta}, f, indent=2)


if __name__ == "__main__":
    main()
