"""Probe, CPU: a held-out eval's hits by layout and by (role, layout), from ``holotron.eval --out``'s
predictions.jsonl (synthetic held-out screens: each is rebuilt from its seed to read its layout).

    python dev/probes/misses_by_layout.py D/predictions.jsonl [--misses tab,radio]

``--misses``: also list the misses of these roles (instruction, box, click in pixels, the element under the click).
"""

import argparse
import collections
import json
import sys

from holotron.data.screens import generate_sample


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictions")
    ap.add_argument("--misses", default="", help="comma-separated roles whose misses are listed")
    a = ap.parse_args(argv)
    by_layout = collections.defaultdict(lambda: [0, 0])
    by_role = collections.defaultdict(lambda: [0, 0])
    listed = set(filter(None, a.misses.split(",")))
    for r in map(json.loads, open(a.predictions)):
        seed = int(r["id"].split("-")[-1])
        s = generate_sample(seed, split="heldout")
        if s.instruction != r["instruction"]:
            raise SystemExit(f"seed {seed}: the rebuilt screen asks {s.instruction!r}, the file {r['instruction']!r}: "
                             "not a default held-out eval")
        lay = s.settings["layout"]
        for d, key in ((by_layout, lay), (by_role, (r["role"], lay))):
            d[key][0] += 1
            d[key][1] += r["hit"]
        if not r["hit"] and r["role"] in listed:
            w, h = r["image_size"]
            cx, cy = r["click"][0] * w / 1000, r["click"][1] * h / 1000
            under = [(e.role, e.label) for e in s.elements if e.box[0] <= cx <= e.box[2] and e.box[1] <= cy <= e.box[3]]
            print(lay, r["role"], repr(r["instruction"]), "box", r["box"], "click", (round(cx), round(cy)), "on",
                  under[:2], r["vocab"])
    for key, (n, hits) in sorted(by_layout.items()):
        print(f"{key:20s} {n:4d} {hits:4d} {hits / n:.2f}")
    for (role, lay), (n, hits) in sorted(by_role.items()):
        print(f"{role:12s} {lay:20s} {n:4d} {hits:4d} misses {n - hits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
