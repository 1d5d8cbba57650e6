"""Probe: would the answer's own attention pointer click better than the digits it writes? On dev screens (the
held-out split's ``DEV_SEED0`` range: for decisions), one question each, the inference prompt, the model writes
its answer's x value and then its y value (single-token coordinates, the word tokenizer); at each of the two
positions the last attention layer's first N query heads (what ``holotron.train --pointer-heads N`` trains)
attend over the image tokens. Four ways to pick the click, each scored by the scorer's rule
(``coords.coordinate_box_range``: the values that land in the target's box):

    greedy      the argmax coordinate at each position (the plain answer; y after the model's own x)
    top token   the centre of the most-attended image token (heads' probabilities averaged) at each position
    in cell     the argmax coordinate among the values inside that token's cell (its own axis), y after that x:
                the model still writes the value, its attention picks the cell it may write in
    in 3 cells  the same within three cells' width centred on that token (the cell and its two neighbours)

    python dev/probes/pointer_click.py CKPT [--n 200] [--heads 2] [--batch 8] [--json OUT.json]

CKPT: a holotron.train output folder with ``aux_heads.pt`` (for the layer index). CPU, fp32.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

import holotron
from holotron.data.eval_report import wilson_interval
from holotron.eval import DEV_SEED0
from holotron.processor import Processor
from holotron.tokenizer import coordinate_token_ids
from holotron.train.batches import ScreenBatches
from holotron.train.checkpoint import AUX_FILE
from holotron.train.heads import AuxHeads
from holotron.train.pointer import attention_scores
from holotron.train.tiles import normalize_tiles

METHODS = ("greedy", "top token", "in cell", "in 3 cells")


def load(folder, probe: str = "pointer_click"):
    """(model fp32 on the CPU, its training-only heads, the coordinates' ids, a dict whose "h" a hook keeps set
    to the residual stream entering the last attention layer, the hook) of a ground checkpoint folder."""
    model = holotron.load(folder, dtype=torch.float32, device="cpu").eval()
    aux = AuxHeads(model.config)
    aux.load_state_dict(torch.load(Path(folder) / AUX_FILE, map_location="cpu", weights_only=True))
    coords = coordinate_token_ids(Processor.from_pretrained(folder))
    if not coords:
        raise SystemExit(f"{probe}: the checkpoint's tokenizer has no single-token coordinates")
    seen = {}
    hook = model.language_model.backbone.layers[aux.layer].register_forward_hook(
        lambda m, a, out: seen.__setitem__("h", out))
    return model, aux, coords, seen, hook


def run(folder, n: int = 200, heads: int = 2, batch_size: int = 8, split: str = "heldout") -> dict:
    folder = Path(folder)
    model, aux, coords, seen, hook = load(folder)
    block = model.language_model.backbone.layers[aux.layer + 1]
    coord_t = torch.tensor(coords)
    emb = model.language_model.backbone.embeddings
    hits = {m: 0 for m in METHODS}
    axis_hits = {m: [0, 0] for m in METHODS}
    done = 0
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                seeds = [DEV_SEED0 + i for i in range(start, min(n, start + batch_size))]
                _, batch, is_img, x_emb, first = dev_batch(model, folder, seeds, split)
                pos = batch["image_positions"]
                counts = is_img.sum(1)
                ct = batch["coord_targets"]  # (row, label position, lo, hi, centre), x then y per row
                for b in range(len(seeds)):
                    (_, px, xlo, xhi, _), (_, py, ylo, yhi, _) = ct[ct[:, 0] == b][:2].tolist()
                    img = is_img[b].nonzero().squeeze(1)
                    xy = pos[first[b]: first[b] + counts[b]]                    # (n_img, 2) token centres, 0-1
                    cell = [_cell(xy[:, a]) for a in (0, 1)]

                    def at(e, t):  # logits over the coordinates and attention over the image tokens at position t
                        h = model.language_model.hidden_states(inputs_embeds=e[None, : t + 1])
                        logits = model.language_model.lm_head(h[0, t])[coord_t]
                        sc = attention_scores(block, seen["h"][:, : t + 1], torch.tensor([[t]]), heads)[0, :, 0]
                        return logits, torch.softmax(sc, -1)[:, img].mean(0)

                    picks = {}
                    lx, ax = at(x_emb[b], px - 1)
                    top_x = xy[int(ax.argmax())]
                    cx = _in_cell(lx, 1000 * float(top_x[0]), 1000 * cell[0])
                    cx3 = _in_cell(lx, 1000 * float(top_x[0]), 3000 * cell[0])
                    for m, xv in (("greedy", int(lx.argmax())), ("in cell", cx), ("top token", None),
                                  ("in 3 cells", cx3)):
                        e = x_emb[b].clone()
                        if xv is not None:
                            e[px] = emb.weight[coords[xv]]
                        ly, ay = at(e, py - 1)
                        top_y = xy[int(ay.argmax())]
                        if m == "greedy":
                            picks[m] = (xv, int(ly.argmax()))
                        elif m == "in cell":
                            picks[m] = (xv, _in_cell(ly, 1000 * float(top_y[1]), 1000 * cell[1]))
                        elif m == "in 3 cells":
                            picks[m] = (xv, _in_cell(ly, 1000 * float(top_y[1]), 3000 * cell[1]))
                        else:  # the x written there does not matter to this pick: the teacher-forced answer's
                            picks[m] = (round(1000 * float(top_x[0])), round(1000 * float(top_y[1])))
                    for m, (x, y) in picks.items():
                        okx, oky = xlo <= x <= xhi, ylo <= y <= yhi
                        axis_hits[m][0] += okx
                        axis_hits[m][1] += oky
                        hits[m] += okx and oky
                    done += 1
                print(f"{done} screens: " + ", ".join(f"{m} {hits[m] / done:.3f}" for m in METHODS), file=sys.stderr)
    finally:
        hook.remove()
    return {"model": str(folder), "split": split, "seeds": f"DEV_SEED0 + 0..{done - 1}", "screens": done,
            "heads": heads, **{m: {"accuracy": hits[m] / done, "ci95": list(wilson_interval(hits[m], done)),
                                  "x_in_box": axis_hits[m][0] / done, "y_in_box": axis_hits[m][1] / done}
                               for m in METHODS}}


def dev_batch(model, folder, seeds: list[int], split: str):
    """One question per screen of ``seeds``: (the ScreenBatches, its batch, the image tokens (B, T), the input
    embeddings (B, T, D), each row's first image token's index among the batch's image tokens)."""
    ds = ScreenBatches(folder, model.config.vision, len(seeds), queries=1, split=split, seeds=seeds)
    batch = ds[0]
    is_img = batch["input_ids"] == model.config.image_token_id
    pixels = normalize_tiles(batch["pixel_values"], model.config.vision, None, batch["num_tiles"])
    counts = is_img.sum(1)
    return ds, batch, is_img, model.embed_inputs(batch["input_ids"], pixels), torch.cumsum(counts, 0) - counts


def _cell(v: torch.Tensor) -> float:
    """The token grid's spacing along one axis (0-1 units): the smallest gap between distinct centres."""
    u = torch.unique(v)
    return float((u[1:] - u[:-1]).min()) if len(u) > 1 else 1.0


def _in_cell(logits: torch.Tensor, centre: float, width: float) -> int:
    """The argmax coordinate (0-1000) among the values within half a cell of ``centre``."""
    lo, hi = max(0, math.floor(centre - width / 2)), min(1000, math.ceil(centre + width / 2))
    return lo + int(logits[lo: hi + 1].argmax())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    report(run(a.model, a.n, a.heads, a.batch), METHODS, a.json)
    return 0


def report(r: dict, methods, json_path=None) -> None:
    """One line per method (accuracy, interval, each axis in the box); the whole result to ``json_path``."""
    width = max(len(m) for m in methods)
    for m in methods:
        s = r[m]
        print(f"{m:{width}s} {100 * s['accuracy']:5.1f}%  (95% CI {100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f}; "
              f"x in box {100 * s['x_in_box']:.1f}%, y {100 * s['y_in_box']:.1f}%)")
    if json_path:
        Path(json_path).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    sys.exit(main())
