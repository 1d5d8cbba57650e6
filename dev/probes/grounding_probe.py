"""Where does a grounding checkpoint lose the click: in finding the element, or in writing where it is?

On new screens of a split (held-out by default), one question each, the exact inference prompt with the
answer teacher-forced, it measures with the training code's own loss (``holotron.train.losses.loss_fn``):

- the pointer: whether the image token the pointer head scores highest from the answering position lies
  on the asked element (needs the run's ``aux_heads.pt``; the heads are training-only); with
  ``--pointer-heads N``, whether the token each of the last attention layer's first N heads attends to
  most, at every answer position, lies on it (the target of ``holotron.train --pointer-heads``);
- the answer's digits, teacher-forced: the share of screens whose x (and y) is written with every digit
  right, and with its first digit right (the hundreds, for three-digit coordinates);
- the position head: the mean L1 error (0-1 screen units) of each image token's screen position read
  from the residual stream entering the last attention layer.

A model that points well and writes badly needs its answer tied to the pointer; one that points badly
needs more reading or more grounding. ``holotron.eval`` gives the generated answers' point-in-box.

    python dev/probes/grounding_probe.py runs/next/ground --n 64 [--split heldout] [--sizes FAMILY ...]
        [--layouts LAYOUT ...] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
from pathlib import Path

import torch

import holotron
from holotron.data import LAYOUTS, SIZES
from holotron.train.batches import ScreenBatches
from holotron.train.checkpoint import AUX_FILE
from holotron.train.heads import AuxHeads
from holotron.train.losses import loss_fn
from holotron.weights import CheckpointError


def _digit_runs(ids: list[int], digit_ids: set[int]) -> list[list[int]]:
    """Maximal runs of consecutive digit-token positions in an answer's token ids."""
    runs, cur = [], []
    for i, t in enumerate(ids):
        if t in digit_ids:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def probe(folder, n: int = 64, batch_size: int = 8, split: str = "heldout", seed: int = 7,
          device: str = "cpu", sizes: list[str] | None = None, layouts: list[str] | None = None,
          pointer_heads: int = 0) -> dict:
    folder = Path(folder)
    if not (folder / AUX_FILE).is_file():
        raise SystemExit(f"grounding_probe: {folder} has no {AUX_FILE} (the training-only heads a holotron.train "
                         "run writes beside its model): probe a training run's output, not a shipped model")
    dev = torch.device(device)
    model = holotron.load(folder, dtype=torch.float32, device=dev).eval()
    aux = AuxHeads(model.config)
    try:
        aux.load_state_dict(torch.load(folder / AUX_FILE, map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:  # unreadable, or heads of another --config
        raise SystemExit(f"grounding_probe: error: {folder / AUX_FILE} cannot be read as this model's "
                         f"training-only heads ({str(e).splitlines()[0][:200]})") from None
    aux.to(dev).eval()
    options = {"size": tuple(sizes)} if sizes else {}
    if layouts:
        options["layout"] = tuple(layouts)
    data = ScreenBatches(folder, model.config.vision, batch_size, seed=seed, queries=1, split=split, options=options)
    proc = data.processor
    digit_ids = {proc.token_to_id(str(d)) for d in range(10)}
    seen = {}
    hook = model.language_model.lm_head.register_forward_hook(lambda m, a, out: seen.__setitem__("logits", out))
    counts = dict(screens=0, pointer=0.0, x_all=0, y_all=0, x_first=0, y_first=0, both_all=0)
    pos_err, answer = [], []
    try:
        with torch.no_grad():
            for step in range(math.ceil(n / batch_size)):
                batch = data[step]
                parts = {}
                loss_fn(model, batch, dev, aux, aux_weight=1.0, parts=parts, pointer_weight=1.0,
                        pointer_heads=pointer_heads)
                rows = batch["input_ids"].shape[0]
                counts["screens"] += rows
                counts["pointer"] += parts["pointer_acc"] * rows
                pos_err.append(parts["position"] / 10)
                answer.append(parts["answer"])
                pred = seen["logits"].argmax(-1).tolist()
                target = batch["labels"][:, 1:]
                keep = target != -100
                k = 0
                for b in range(rows):  # the answer tokens of each row, in order (one question per screen)
                    t = target[b][keep[b]].tolist()
                    p, k = pred[k:k + len(t)], k + len(t)
                    runs = _digit_runs(t, digit_ids)
                    if len(runs) != 2:
                        raise ValueError(f"an answer without two numbers: {proc.decode(t)!r}")
                    ok = [all(p[i] == t[i] for i in r) for r in runs]
                    first = [p[r[0]] == t[r[0]] for r in runs]
                    counts["x_all"] += ok[0]
                    counts["y_all"] += ok[1]
                    counts["x_first"] += first[0]
                    counts["y_first"] += first[1]
                    counts["both_all"] += ok[0] and ok[1]
    finally:
        hook.remove()
    s = counts["screens"]
    return {"model": str(folder), "split": split,
            "pointer": f"attention heads 0-{pointer_heads - 1}" if pointer_heads else "head",
            "sizes": list(sizes) if sizes else "the split's",
            "layouts": list(layouts) if layouts else "the split's", "screens": s,
            "pointer_on_element": counts["pointer"] / s,
            "x_all_digits": counts["x_all"] / s, "y_all_digits": counts["y_all"] / s,
            "x_first_digit": counts["x_first"] / s, "y_first_digit": counts["y_first"] / s,
            "both_exact": counts["both_all"] / s,
            "position_l1": sum(pos_err) / len(pos_err), "answer_loss": sum(answer) / len(answer)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a holotron.train output folder (with aux_heads.pt)")
    ap.add_argument("--n", type=int, default=64, help="screens (one question each)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--split", default="heldout", choices=("heldout", "train"))
    ap.add_argument("--sizes", nargs="+", choices=sorted(SIZES), metavar="FAMILY",
                    help="screen size families instead of the split's own (holotron.data.styles.SIZES): the split's "
                         "looks and layouts at other sizes, to tell the sizes' part from the rest")
    ap.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), metavar="LAYOUT",
                    help="layouts instead of the split's own (holotron.data.layouts.LAYOUTS)")
    ap.add_argument("--seed", type=int, default=7, help="screen seeds start at seed x 10^12 (none a training run's)")
    ap.add_argument("--pointer-heads", type=int, default=0, metavar="N",
                    help="score the pointer of the last attention layer's first N heads at every answer position "
                         "(what holotron.train --pointer-heads N trains) instead of the pointer head")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.n < 1 or a.batch_size < 1 or a.pointer_heads < 0:
        ap.error("--n and --batch-size must be >= 1, --pointer-heads >= 0")
    try:
        r = probe(a.model, a.n, a.batch_size, a.split, a.seed, a.device, a.sizes, a.layouts, a.pointer_heads)
    except CheckpointError as e:  # a missing or broken checkpoint: one line, not a traceback
        raise SystemExit(f"grounding_probe: error: {e}") from None
    if a.json:
        print(json.dumps(r))
        return 0
    sizes = ("" if not a.sizes else f" at sizes {', '.join(a.sizes)}") + \
        ("" if not a.layouts else f" with layouts {', '.join(a.layouts)}")
    print(f"{r['model']}, {r['screens']} {r['split']} screens{sizes}, one question each, answers teacher-forced:")
    who = "pointer's" if not a.pointer_heads else f"{a.pointer_heads} heads'"
    print(f"  {who + ' best token on the element':37s} {100 * r['pointer_on_element']:5.1f}%")
    print(f"  x written right (every digit / first) {100 * r['x_all_digits']:5.1f}% / {100 * r['x_first_digit']:5.1f}%")
    print(f"  y written right (every digit / first) {100 * r['y_all_digits']:5.1f}% / {100 * r['y_first_digit']:5.1f}%")
    print(f"  x and y both exact                    {100 * r['both_exact']:5.1f}%")
    print(f"  image tokens' position, mean L1       {r['position_l1']:.3f} of the screen per axis")
    print(f"  answer loss                           {r['answer_loss']:.3f} nats per answer token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
