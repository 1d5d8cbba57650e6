"""Where the answer's attention looks: on new screens of a split (held-out by default), one question each, the
exact inference prompt with the answer teacher-forced, the softmax of the last attention layer's first N query
heads (what ``holotron.train --pointer-heads N`` trains) at one answer position (``--offset``: 0 predicts the
answer's first token ``{"``, 4 its first x digit with the byte-level BPE; with the word tokenizer 3 predicts
the x value, 7 the y value), as the layer computes it. It reports the attention mass on
the asked element's image tokens, how often the most-attended token is on it, how far that token lies from
the element when it is not (another element far away: a reading / matching miss; a neighbour: a blur), and the
error of the attention-weighted mean of the image tokens' screen positions (what the layer can pass on to the
digits), each per axis in screen units (0-1). With single-token coordinates (the word tokenizer) and an offset that
predicts one, also the value that position writes (greedy) against the teacher-forced answer and against the
most-attended token's own position (0-1000).

    python dev/probes/pointer_where.py runs/next/point --n 48 [--heads 2] [--offset 4] [--split heldout] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import statistics
import sys
from pathlib import Path

import torch

import holotron
from holotron.processor import Processor
from holotron.tokenizer import coordinate_token_ids
from holotron.train.batches import ScreenBatches
from holotron.train.checkpoint import AUX_FILE
from holotron.train.heads import AuxHeads
from holotron.train.pointer import attention_scores
from holotron.train.tiles import normalize_tiles
from holotron.weights import CheckpointError


def where(folder, n: int = 48, heads: int = 2, offset: int = 4, split: str = "heldout", seed: int = 7,
          batch_size: int = 8) -> dict:
    folder = Path(folder)
    if not (folder / AUX_FILE).is_file():
        raise SystemExit(f"pointer_where: {folder} has no {AUX_FILE}: point it at a holotron.train output folder")
    model = holotron.load(folder, dtype=torch.float32, device="cpu").eval()
    aux = AuxHeads(model.config)  # only for the index of the layer before the last attention layer
    try:
        aux.load_state_dict(torch.load(folder / AUX_FILE, map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:
        raise SystemExit(f"pointer_where: error: {folder / AUX_FILE} is not this model's training-only heads "
                         f"({str(e).splitlines()[0][:200]})") from None
    layers = model.language_model.backbone.layers
    block = layers[aux.layer + 1]
    heads = min(heads, block.mixer.n_heads)
    batch_size = min(batch_size, n)
    data = ScreenBatches(folder, model.config.vision, batch_size, seed=seed, queries=1, split=split)
    coords = coordinate_token_ids(Processor.from_pretrained(folder))
    seen = {}
    hook = layers[aux.layer].register_forward_hook(lambda m, a, out: seen.__setitem__("h", out))
    rows = []
    try:
        with torch.no_grad():
            for step in range(math.ceil(n / batch_size)):
                batch = data[step]
                ids = batch["input_ids"]
                is_img = ids == model.config.image_token_id
                pixels = normalize_tiles(batch["pixel_values"], model.config.vision, None, batch["num_tiles"])
                hs = model.language_model.hidden_states(inputs_embeds=model.embed_inputs(ids, pixels))
                pos, counts = batch["image_positions"], is_img.sum(1)
                starts = torch.cumsum(counts, 0) - counts
                targets = batch["pointer_targets"]
                for j, (b, t) in enumerate(batch["pointer_queries"].tolist()):
                    if step * batch_size + b >= n:
                        break
                    t += offset
                    scores = attention_scores(block, seen["h"][b:b + 1, : t + 1], torch.tensor([[t]]), heads)[0]
                    p = torch.softmax(scores[:, 0], -1)                                          # (heads, t + 1)
                    img = is_img[b, : t + 1].nonzero().squeeze(1)
                    xy = pos[starts[b]: starts[b] + counts[b]][: len(img)]
                    el = targets[targets[:, 0] == j, 1]
                    centre = xy[el].mean(0)
                    written = _written(model, hs[b, t], int(ids[b, t + 1]), coords)
                    for hh in range(heads):
                        w = p[hh, img]
                        top = int(w.argmax())
                        rows.append({"mass": float(w[el].sum()), "on": bool((el == top).any()),
                                     "top_err": (xy[top] - centre).abs().tolist(),
                                     "mean_err": ((w[:, None] * xy).sum(0) / w.sum() - centre).abs().tolist()})
                        if written is not None:  # the coordinate the position writes, against its two sources
                            axis = 0 if offset < 5 else 1
                            value, truth = written
                            own = 1000 * float(xy[top][axis])
                            rows[-1]["written"] = {"to_answer": abs(value - truth), "to_top_token": abs(value - own)}
    finally:
        hook.remove()
    off = [r for r in rows if not r["on"]]
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    out = {"model": str(folder), "split": split, "screens": len(rows) // heads, "heads": heads, "offset": offset,
           "mass_on_element": statistics.mean(r["mass"] for r in rows),
           "top_on_element": sum(r["on"] for r in rows) / len(rows),
           "top_off_distance_median": [med([r["top_err"][a] for r in off]) for a in (0, 1)],
           "mean_position_error_median": [med([r["mean_err"][a] for r in rows]) for a in (0, 1)]}
    wr = [r["written"] for r in rows if "written" in r]
    if wr:  # single-token coordinates: the value this position writes (greedy), in 0-1000 units
        out["written_error_median"] = med([r["to_answer"] for r in wr])
        out["written_to_top_token_median"] = med([r["to_top_token"] for r in wr])
        out["written_nearer_top_token"] = sum(r["to_top_token"] < r["to_answer"] for r in wr) / len(wr)
    return out


def _written(model, h: torch.Tensor, label: int, coords: list[int] | None) -> tuple[float, float] | None:
    """(the coordinate the greedy answer writes at hidden state ``h`` (D,), the teacher-forced one), 0-1000, when
    the next token ``label`` is a single-token coordinate; else None."""
    if coords is None or label not in coords:
        return None
    logits = model.language_model.lm_head(h.to(model.language_model.lm_head.weight.dtype)).float()
    pick = int(logits[coords].argmax())
    return float(pick), float(coords.index(label))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a holotron.train output folder (with aux_heads.pt)")
    ap.add_argument("--n", type=int, default=48, help="screens (one question each)")
    ap.add_argument("--heads", type=int, default=2, help="the last attention layer's first N query heads")
    ap.add_argument("--offset", type=int, default=4, help="answer position: 0 predicts '{\"', 4 the first x digit "
                    "(BPE); word tokenizer: 3 the x value, 7 the y value")
    ap.add_argument("--split", default="heldout", choices=("heldout", "train"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.n < 1 or a.heads < 1 or not 0 <= a.offset <= 8:
        ap.error("--n and --heads must be >= 1, --offset within the answer's first x and y (0-8)")
    try:
        r = where(a.model, a.n, a.heads, a.offset, a.split, a.seed)
    except CheckpointError as e:
        raise SystemExit(f"pointer_where: error: {e}") from None
    if a.json:
        print(json.dumps(r))
        return 0
    print(f"{r['model']}, {r['screens']} {r['split']} screens, heads 0-{r['heads'] - 1} "
          f"at answer position {r['offset']}:")
    print(f"  attention mass on the element          {r['mass_on_element']:.3f}")
    print(f"  most-attended token on the element     {100 * r['top_on_element']:.1f}%")
    dx, dy = r["top_off_distance_median"]
    print(f"  when it is not: its distance (median)  {dx:.3f} x, {dy:.3f} y of the screen")
    ex, ey = r["mean_position_error_median"]
    print(f"  attention-mean position error (median) {ex:.3f} x, {ey:.3f} y of the screen")
    if "written_error_median" in r:
        print(f"  the coordinate written here: {r['written_error_median']:.0f} units from the answer, "
              f"{r['written_to_top_token_median']:.0f} from the most-attended token's own position (medians); "
              f"nearer that token on {100 * r['written_nearer_top_token']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
