"""The chart of docs/benchmarks.md's "Agents at concurrency, second run" section (2026-12-05), from the run files
in dev/runs: left, total tokens/s of 100 one-tile agents (hybrid) under each engine setting, with the goal and the
attention model's figure of 2026-12-04; right, the twelve-tile turns against concurrency (hybrid at 32 and 100
agents from 2026-12-04 with a bf16 KV cache and an fp32 Mamba state, at 256 from 2026-12-05 with an FP8 KV cache,
a bf16 state and the fused prefill; a cut run hollow, its rate over the tokens it processed).

    python dev/plot_agents_settings.py docs/agents_settings.png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = Path(__file__).parent / "runs"


def row(name: str, model: str = "hybrid", agents: int | None = None) -> dict:
    rows = json.loads((RUNS / name).read_text())["rows"]
    return next(r for r in rows if r["model"] == model and (agents is None or r["agents"] == agents))


SETTINGS = [  # (label, file): every run here finished its 800 turns
    ("defaults of\n2026-12-04", "agents-mixedoff-8192-float32-fused0-min0-2026-12-05-call2.json"),
    ("fuller chunks\n(min 4,096)", "agents-mixedoff-8192-float32-fused0-min4096-2026-12-05-call1.json"),
    ("16-bit\nstate", "agents-mixedoff-8192-bfloat16-fused0-min0-2026-12-05-call1.json"),
    ("fused\nprefill", "agents-mixedoff-8192-float32-fused1-min0-2026-12-05-call2.json"),
    ("fused +\n16-bit state", "agents-mixedoff-8192-bfloat16-fused1-min0-2026-12-05-call2.json"),
    ("fused + 16-bit\n+ mixed passes", "agents-mixedon-8192-bfloat16-fused1-min0-2026-12-05-call2.json"),
]

fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.35, 1]})
vals = [row(f)["total_tokens_per_s"] for _, f in SETTINGS]
a.bar(range(len(vals)), vals, color="tab:blue")
for i, v in enumerate(vals):
    a.annotate(f"{v:,.0f}", (i, v), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
a.axhline(12000, color="black", ls="--", lw=1)
a.annotate("goal 12,000", (len(vals) - 0.6, 12000), textcoords="offset points", xytext=(0, 3), fontsize=8, ha="right")
att = row("agents-onetile-graphs-2026-12-04.json", "attention")["total_tokens_per_s"]
a.axhline(att, color="tab:red", ls=":", lw=1)
a.annotate(f"attention model, 2026-12-04: {att:,.0f}", (-0.4, att), textcoords="offset points", xytext=(0, 3),
           fontsize=8, color="tab:red")
a.set_xticks(range(len(vals)), [s for s, _ in SETTINGS], fontsize=8)
a.set_ylim(0, 13500)
a.set_ylabel("total tokens/s (prompt + image + output)")
a.set_title("100 agents, one-tile turns, hybrid: engine settings")

pts = [(32, row("agents-twelve-32-2026-12-04.json")), (100, row("agents-twelve-100-2026-12-04.json")),
       (256, row("agents-twelve-256-fp8-bf16-fused-2026-12-05.json"))]
b.plot([n for n, _ in pts], [r["total_tokens_per_s"] for _, r in pts], "-", color="tab:blue", label="hybrid")
for n, r in pts:
    cut = r["status"] != "ok"
    b.plot(n, r["total_tokens_per_s"], "o", color="tab:blue", mfc="white" if cut else "tab:blue")
    how = "bf16 KV, fp32 state" if n < 256 else "FP8 KV, bf16 state, fused,\ncut at the time budget"
    b.annotate(f"{r['total_tokens_per_s']:,.0f} ({r['rows']} rows)\n{how}", (n, r["total_tokens_per_s"]),
               textcoords="offset points", xytext=(-60 if n == 256 else 4, -34), fontsize=7, color="tab:blue")
att32 = row("agents-twelve-32-2026-12-04.json", "attention")
b.plot(32, att32["total_tokens_per_s"], "o", color="tab:red", mfc="white", label="attention")
b.annotate(f"{att32['total_tokens_per_s']:,.0f} ({att32['rows']} rows, cut)", (32, att32["total_tokens_per_s"]),
           textcoords="offset points", xytext=(4, -12), fontsize=7, color="tab:red")
b.plot(100, 0, "x", color="tab:red", ms=10)
b.annotate("attention: 100 agents do not fit\n(GPU + 124 GiB of host memory)", (100, 0), textcoords="offset points",
           xytext=(6, 8), fontsize=7, color="tab:red")
b.set_xlim(0, 280)
b.set_ylim(-500, 14000)
b.set_xlabel("concurrent agents")
b.set_title("twelve-tile turns (13 tiles + text), 8 per agent")
b.grid(alpha=0.3)
b.legend(fontsize=8, loc="lower right")
fig.suptitle("holotron.engine agent sessions, one H200, 12B random bf16 weights (2026-12-04 / 2026-12-05)")
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else "agents_settings.png", dpi=120)
