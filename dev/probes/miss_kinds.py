"""What kind of miss a grounding checkpoint makes on dev screens (a research probe, not a benchmark).

    python dev/probes/miss_kinds.py CHECKPOINT [N] [OUT.json]      # N dev screens of the held-out split

Each greedy click (the eval's own prompt and parsing, holotron.eval.answer_batch) on screens of the dev seeds
(holotron.eval.DEV_SEED0, never the reported ones) is put in one class:
  hit        inside the target's box (the benchmark's rule);
  near       a miss within one box size of the target's box on both axes (the right element, an imprecise
             click): which axis missed, and by how much in units of the box's half-size;
  other      inside another element's box or another text's box (the wrong element: identification);
  elsewhere  none of these.
Float32 on the CPU; about 1.5 s a screen on 2 cores."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import torch

from holotron import load
from holotron.data.screens import generate_sample
from holotron.eval import DEV_SEED0, answer_batch
from holotron.grounding import parse_click
from holotron.processor import Processor


def _inside(box, x: float, y: float, pad_x: float = 0.0, pad_y: float = 0.0) -> bool:
    x0, y0, x1, y1 = box  # pixels, x1 / y1 exclusive
    return x0 - pad_x <= x <= x1 - 1 + pad_x and y0 - pad_y <= y <= y1 - 1 + pad_y


def classify(sample, answer: str) -> dict:
    w, h = sample.size
    p = parse_click(answer)
    out = {"role": sample.target.role, "family": sample.settings["size_family"], "answer": answer}
    if p is None:
        return {**out, "kind": "unparseable"}
    x, y = p.x * w / 1000, p.y * h / 1000
    box = sample.target.box
    bw, bh = box[2] - box[0], box[3] - box[1]
    cx, cy = (box[0] + box[2] - 1) / 2, (box[1] + box[3] - 1) / 2
    out.update(dx=(x - cx) / (bw / 2), dy=(y - cy) / (bh / 2), box_w=1000 * bw / w, box_h=1000 * bh / h)
    if _inside(box, x, y):
        return {**out, "kind": "hit"}
    if _inside(box, x, y, bw, bh):
        ax = "x" if not box[0] <= x <= box[2] - 1 else ""
        ay = "y" if not box[1] <= y <= box[3] - 1 else ""
        return {**out, "kind": "near", "axis": ax + ay}
    others = [e.box for e in sample.elements if e is not sample.target] + [t.box for t in sample.texts]
    if any(_inside(b, x, y) for b in others):
        return {**out, "kind": "other"}
    return {**out, "kind": "elsewhere"}


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    ckpt, n = argv[0], int(argv[1]) if len(argv) > 1 else 64
    model = load(ckpt, dtype=torch.float32, device="cpu").eval()
    processor = Processor.from_pretrained(ckpt)
    rows, t0 = [], time.perf_counter()
    for start in range(0, n, 8):
        samples = [generate_sample(DEV_SEED0 + i, split="heldout") for i in range(start, min(n, start + 8))]
        answers = answer_batch(model, processor, [s.image for s in samples], [s.instruction for s in samples])
        rows += [classify(s, a) for s, a in zip(samples, answers)]
        print(f"{len(rows)}/{n} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    kinds = Counter(r["kind"] for r in rows)
    near_axes = Counter(r["axis"] for r in rows if r["kind"] == "near")
    summary = {"checkpoint": ckpt, "n": n, "kinds": dict(kinds), "near_axes": dict(near_axes),
               "near_dy_over_half_height": sorted(round(abs(r["dy"]), 2) for r in rows if r["kind"] == "near"),
               "near_dx_over_half_width": sorted(round(abs(r["dx"]), 2) for r in rows if r["kind"] == "near")}
    print(json.dumps(summary, indent=1))
    if len(argv) > 2:
        with open(argv[2], "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
