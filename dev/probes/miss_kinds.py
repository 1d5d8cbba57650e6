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
from holotron.grounding import Box, parse_click, point_in_box, to_pixels
from holotron.processor import Processor


def classify(sample, answer: str) -> dict:
    """One answer's class (module docstring), by the scorer's own rule (``holotron.grounding.Box``, edges
    included), with the click's offset from the box centre in half-sizes of the box."""
    w, h = sample.size
    p = parse_click(answer)
    out = {"role": sample.target.role, "family": sample.settings["size_family"], "answer": answer}
    if p is None:
        return {**out, "kind": "unparseable"}
    box = sample.target_box
    bw, bh = box.x1 - box.x0, box.y1 - box.y0
    px = to_pixels(p, w, h)
    out.update(dx=(px.x - (box.x0 + box.x1) / 2) / (bw / 2), dy=(px.y - (box.y0 + box.y1) / 2) / (bh / 2),
               box_w=1000 * bw / w, box_h=1000 * bh / h)
    if point_in_box(p, box, w, h):
        return {**out, "kind": "hit"}
    if point_in_box(p, Box(box.x0 - bw, box.y0 - bh, box.x1 + bw, box.y1 + bh, space="pixel"), w, h):
        axis = ("x" if not box.x0 <= px.x <= box.x1 else "") + ("y" if not box.y0 <= px.y <= box.y1 else "")
        return {**out, "kind": "near", "axis": axis}
    others = [e.box for e in sample.elements if e is not sample.target] + [t.box for t in sample.texts]
    if any(point_in_box(p, Box(*b, space="pixel"), w, h) for b in others):
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
