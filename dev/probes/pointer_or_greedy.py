"""Probe, CPU, offline: would taking the model's greedy click where it lies near the pointer's beat the pointer?

Reads two ``holotron.eval --out`` folders' predictions.jsonl of the same screens (the click pointer's, then the
same model's with ``--pointer off``) and rescores, for k cells (a token's cell: 1000 / 32 units at the tiny model's
one 1,024 px tile), the greedy click where it is within k cells of the pointer's (on both axes, or axis by axis),
else the pointer's; prints hits and the paired change against the pointer (exact McNemar p).

    python dev/probes/pointer_or_greedy.py POINTER/predictions.jsonl GREEDY/predictions.jsonl
"""

import json
import math
import sys

from holotron.grounding import Box, Point, point_in_box, to_pixels

CELL = 1000 / 32


def load(path: str) -> dict:
    return {r["id"]: r for r in map(json.loads, open(path))}


def hit(r: dict, x: float, y: float) -> bool:
    w, h = r["image_size"]
    return point_in_box(to_pixels(Point(x, y), w, h), Box(*r["box"]), w, h)


def mcnemar(won: int, lost: int) -> float:
    n = won + lost
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(won, lost) + 1)) / 2 ** n) if n else 1.0


def main(argv: list[str]) -> int:
    ptr, greedy = load(argv[0]), load(argv[1])
    ids = sorted(ptr)
    base = [ptr[i]["hit"] for i in ids]
    print("pointer", sum(base), "greedy", sum(greedy[i]["hit"] for i in ids), "of", len(ids))
    assert all(hit(ptr[i], *ptr[i]["click"]) == ptr[i]["hit"] for i in ids if ptr[i]["click"]), "rescoring differs"
    for k in (0.5, 1.0, 1.5, 2.0, 3.0):
        for per_axis in (False, True):
            hits = []
            for i in ids:
                p, g = ptr[i]["click"], greedy[i]["click"]
                if p is None or g is None:
                    hits.append(ptr[i]["hit"])
                    continue
                near = [abs(g[a] - p[a]) <= k * CELL for a in (0, 1)]
                c = [g[a] if near[a] else p[a] for a in (0, 1)] if per_axis else (g if all(near) else p)
                hits.append(hit(ptr[i], *c))
            won = sum(h and not b for h, b in zip(hits, base))
            lost = sum(b and not h for h, b in zip(hits, base))
            print(f"k={k} {'axis by axis' if per_axis else 'both axes':12s} {sum(hits)} won {won} lost {lost} "
                  f"p={mcnemar(won, lost):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
