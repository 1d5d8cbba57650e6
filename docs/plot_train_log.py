"""Loss curve (and held-out evals) of a holotron.train run as PNG, with matplotlib (run where it is installed)."""
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

state = json.load(open(sys.argv[1]))
log, evals = state["log"], state["evals"]
fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
minutes = [e["seconds"] / 60 for e in log]
if "answer" in log[0]:  # the answer cross-entropy logged apart from the auxiliary image-token losses
    ax.plot(minutes, [e["answer"] for e in log], lw=1.5, label="answer tokens (per logged step)")
    for key, name in (("label_in", "aux: text class, projector output"), ("label_mid", "aux: text class, mid-LM"),
                      ("position", "aux: 10 x L1 screen position")):
        if key in log[0]:
            ax.plot(minutes, [e[key] for e in log], lw=0.8, alpha=0.7, label=name)
    ax.set_ylabel("loss (nats; position: 10 x L1)")
else:
    ax.plot(minutes, [e["loss"] for e in log], lw=0.6, alpha=0.4, label="loss (per logged step)")
    ax.plot(minutes, [e["loss_ema"] for e in log], lw=1.5, label="loss (moving average)")
    ax.set_ylabel("cross-entropy on answer tokens (nats)")
ax.set_xlabel("training minutes (H200)")
ax.set_yscale("log")
ax.grid(alpha=0.3)
if evals:
    t = {e["step"]: e["seconds"] for e in log}
    ax2 = ax.twinx()
    xs = [t.get(e["step"], log[-1]["seconds"]) / 60 for e in evals]
    ax2.plot(xs, [100 * e["accuracy"] for e in evals], "o-", color="C2", label="held-out point-in-box %")
    ax2.set_ylabel("held-out accuracy during training (%)")
    ax2.set_ylim(0, 100)
    ax2.legend(loc="upper center")
ax.legend(loc="upper right")
ax.set_title(f"holotron.train --config {state['args']['config']}: {state['step']} steps")
fig.tight_layout()
fig.savefig(sys.argv[2])
