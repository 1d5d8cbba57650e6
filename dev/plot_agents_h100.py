"""The chart of docs/benchmarks.md's section "The hybrid at 256 twelve-tile agents, the host limit fixed"
(2026-12-06, NVIDIA H100): total tokens/s of twelve-tile turns (13 tiles + text, 8 per agent) against concurrent
agents, the hybrid at 100 (fourth session) and 256 (sixth), the attention model at 100 with a host limit (fifth);
a run cut by its time budget hollow, its rate over the turns it finished; the rows each run held on the GPU.

    python dev/plot_agents_h100.py docs/agents_twelve_h100.png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = Path(__file__).parent / "runs"


def row(name: str, model: str) -> dict:
    return next(r for r in json.loads((RUNS / name).read_text())["rows"] if r["model"] == model)


hybrid = [row("agents-twelve-100-hybrid-mixed-vs-h100-2026-12-06d.json", "hybrid"),
          row("agents-twelve-256-hybrid-h100-2026-12-06f.json", "hybrid")]
attention = row("agents-twelve-100-attention-h100-2026-12-06e.json", "attention")

fig, ax = plt.subplots(figsize=(7.5, 4.6))
ax.plot([r["agents"] for r in hybrid], [r["total_tokens_per_s"] for r in hybrid], "-", color="tab:blue",
        label="hybrid (Mamba2 + 6 attention layers)")
for r, model, colour in [*[(r, "hybrid", "tab:blue") for r in hybrid], (attention, "attention", "tab:red")]:
    cut = r["status"] != "ok"
    v = r["total_tokens_per_s"]
    ax.plot(r["agents"], v, "o", color=colour, mfc="white" if cut else colour, ms=8,
            label="attention (same size)" if model == "attention" else None)
    note = f"{v:,.0f} tok/s, {r['rows']} rows\n{r['turns_completed']:,} / {r['turns_expected']:,} turns"
    if r.get("sessions_dropped"):
        note += f", {r['sessions_dropped']} sessions dropped"
    ax.annotate(note, (r["agents"], v), textcoords="offset points", xytext=(-50 if r["agents"] > 200 else 8, -32),
                fontsize=8, color=colour)
ax.set_xlim(0, 280)
ax.set_ylim(0, 14500)
ax.set_xlabel("concurrent agents")
ax.set_ylabel("total tokens/s (prompt + image + output)")
ax.set_title("twelve-tile turns, 8 per agent, FP8 KV cache, bf16 Mamba state\n"
             "hollow: cut by the time budget (rate over the turns done)", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="upper right")
fig.suptitle("holotron.engine, one NVIDIA H100 80GB, 12B random bf16 weights (2026-12-06)", fontsize=10)
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else "agents_twelve_h100.png", dpi=120)
