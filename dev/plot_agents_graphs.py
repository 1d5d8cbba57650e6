"""The chart of docs/benchmarks.md's "Agents at concurrency, the engine as graphs" section, from the run files in
dev/runs (2026-12-04): total tokens/s against concurrent agents, hybrid and attention, one-tile and twelve-tile
turns; a cut run is drawn hollow (its rate is over the turns it finished), a configuration that does not fit
the machine is marked on the axis.

    python dev/plot_agents_graphs.py docs/agents_graphs.png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = Path(__file__).parent / "runs"
FILES = ["agents-onetile-graphs-2026-12-04.json", "agents-twelve-32-2026-12-04.json",
         "agents-twelve-100-2026-12-04.json"]
rows = [r for f in FILES for r in json.loads((RUNS / f).read_text())["rows"]]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
colors = {"hybrid": "tab:blue", "attention": "tab:red"}
for ax, case in zip(axes, ("one-tile", "twelve-tile")):
    for model in ("hybrid", "attention"):
        mine = sorted((r for r in rows if r["model"] == model and r["case"] == case), key=lambda r: r["agents"])
        ran = [r for r in mine if "total_tokens_per_s" in r]
        if ran:
            ax.plot([r["agents"] for r in ran], [r["total_tokens_per_s"] for r in ran], "-", color=colors[model],
                    label=f"{model}: total tok/s")
            for r in ran:
                ax.plot(r["agents"], r["total_tokens_per_s"], "o", color=colors[model],
                        mfc="white" if r["status"] != "ok" else colors[model])
                note = "" if r["status"] == "ok" else f" (cut: {r['turns_completed']}/{r['turns_expected']} turns)"
                ax.annotate(f"{r['total_tokens_per_s']:,.0f}{note}", (r["agents"], r["total_tokens_per_s"]),
                            textcoords="offset points", xytext=(4, 6), fontsize=8, color=colors[model])
        for r in mine:
            if "total_tokens_per_s" not in r:
                ax.plot(r["agents"], 0, "x", color=colors[model], ms=10)
                ax.annotate(f"{model}: does not fit\n({r['status']})", (r["agents"], 0), textcoords="offset points",
                            xytext=(-150, 30), fontsize=8, color=colors[model])
    ax.set_title(f"{case} turns, 8 per agent")
    ax.set_xlabel("concurrent agents")
    ax.set_ylabel("total tokens/s (prompt + image + output)")
    ax.set_ylim(bottom=-500, top=13000)
    ax.set_xlim(0, 110)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
fig.suptitle("holotron.engine agent sessions, one H200, 12B random weights (2026-12-04)")
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else "agents_graphs.png", dpi=120)
