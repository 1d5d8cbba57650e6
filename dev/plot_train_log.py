"""Loss curves (and held-out evals) of holotron.train runs as one PNG, one panel per run, with matplotlib.

    python dev/plot_train_log.py RUN/trainer_state.json [MORE/trainer_state.json ...] OUT.png
    GPU=H100 python dev/plot_train_log.py ...     # the GPU named on the time axis (default H200)

A reading-stage run (``--stage read``) shows its character and text-class losses and the share of characters
and label classes its evals read right; a matching run (``--stage match``) its losses and the dev screens' share of
queries matched, words and characters read; a grounding run the answer loss, the auxiliary losses it logged and
its held-out point-in-box evals."""
import bisect
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _eval_label(evals) -> str:
    """Runs with teacher-forced evals (the v2 recipe on) evaluate on the dev seeds, earlier runs on the first of
    the reported held-out seeds."""
    return "dev point-in-box %" if "tf_inbox" in evals[0] else "held-out point-in-box %"


def panel(ax, state):
    log, evals = state["log"], state["evals"]
    minutes = [e["seconds"] / 60 for e in log]
    steps = [e["step"] for e in log]
    # an eval's minute: that of the last logged step at or before it (a job's final step is rarely a logged one)
    at = [minutes[max(0, bisect.bisect_right(steps, e["step"]) - 1)] for e in evals]
    ax2 = ax.twinx() if evals or "pointer_acc" in log[0] else None
    if "read" in log[0]:  # the reading stage
        ax.plot(minutes, [e["char"] for e in log], lw=1.2, label="character loss")
        ax.plot(minutes, [e["read"] for e in log], lw=1.2, label="text-class loss (trained from --labels-after)")
        ax.set_ylabel("loss (nats)")
        ax2.plot(at, [100 * e["char_acc"] for e in evals], "o-", ms=2, color="C2", label="held-out characters read %")
        ax2.plot(at, [100 * e["read_acc"] for e in evals], "o-", ms=2, color="C3",
                 label="held-out label classes read %")
        ax2.set_ylabel("held-out share read right (%)")
    elif "match" in log[0] and "answer" not in log[0]:  # the matching stage (--stage match)
        for key, name in (("match", "matching loss"), ("word", "word under each token"), ("centre", "element centre"),
                          ("char", "characters")):
            ax.plot(minutes, [e[key] for e in log], lw=1.0, label=name)
        ax.set_ylabel("loss (nats; centre: L1)")
        for key, name, colour in (("match_acc", "dev queries matched %", "C2"), ("word_acc", "dev words read %", "C3"),
                                  ("char_acc", "dev characters read %", "C4")):
            ax2.plot(at, [100 * e[key] for e in evals], "o-", ms=2, color=colour, label=name)
        ax2.set_ylabel("dev share right (%)")
    elif "answer" in log[0]:  # grounding with auxiliary image-token losses
        ax.plot(minutes, [e["answer"] for e in log], lw=1.5, label="answer tokens")
        for key, name in (("label_in", "aux: text class, projector output"), ("label_mid", "aux: text class, mid-LM"),
                          ("position", "aux: 10 x L1 screen position"), ("pointer", "pointer loss")):
            if key in log[0]:
                ax.plot(minutes, [e[key] for e in log], lw=0.8, alpha=0.8, label=name)
        ax.set_ylabel("loss (nats; position: 10 x L1)")
        if ax2 is not None:
            if "pointer_acc" in log[0]:
                ax2.plot(minutes, [100 * e["pointer_acc"] for e in log], lw=0.8, color="C9",
                         label="pointer on the element %")
            if "inbox" in log[0]:
                ax2.plot(minutes, [100 * e["inbox"] for e in log], lw=0.8, color="C7",
                         label="answer in the box, teacher-forced, training batches %")
            if evals:
                ax2.plot(at, [100 * e["accuracy"] for e in evals], "o-", color="C2", label=_eval_label(evals))
            ax2.set_ylabel("%")
    else:
        ax.plot(minutes, [e["loss"] for e in log], lw=0.6, alpha=0.4, label="loss (per logged step)")
        ax.plot(minutes, [e["loss_ema"] for e in log], lw=1.5, label="loss (moving average)")
        ax.set_ylabel("cross-entropy on answer tokens (nats)")
        if evals:
            ax2.plot(at, [100 * e["accuracy"] for e in evals], "o-", color="C2", label=_eval_label(evals))
            ax2.set_ylabel("held-out accuracy during training (%)")
    ax.set_xlabel(f"training minutes ({os.environ.get('GPU', 'H200')})")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=7)
    if ax2 is not None:
        ax2.set_ylim(0, 100)
        ax2.legend(loc="center right", fontsize=7)
    stage = state["args"].get("stage", "ground")
    src = state["args"].get("init_from")
    ax.set_title(f"--config {state['args']['config']} --stage {stage}: {state['step']} steps"
                 + (f", from {src}" if src else ""), fontsize=9)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python dev/plot_train_log.py STATE.json [STATE.json ...] OUT.png")
    states = [json.load(open(p)) for p in sys.argv[1:-1]]
    fig, axes = plt.subplots(1, len(states), figsize=(7 * len(states), 4.5), dpi=100, squeeze=False)
    for ax, state in zip(axes[0], states):
        panel(ax, state)
    fig.tight_layout()
    fig.savefig(sys.argv[-1])
