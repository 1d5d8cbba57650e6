"""Runs of benchmarks/bench_agents.py compared at the same share of their turns (runs cut by a time budget cover
different shares of their conversations, and later turns attend over longer histories, so whole-run tokens/s of a
run cut early and of one that finished are not comparable). From each row's "timeline" (s, turns done, tokens at
every progress line and at the end), interpolated at ``--share`` of the turns expected:

    python dev/compare_at_share.py RUN.json [RUN.json ...] [--share 0.45]
"""

from __future__ import annotations

import argparse
import json
import sys


def at_share(timeline: list, turns: float) -> tuple[float, float] | None:
    """(s, tokens) where ``turns`` turns were done, linearly between the two progress lines around it."""
    prev = (0.0, 0, 0)
    for s, done, tok in timeline:
        if done >= turns:
            f = 0.0 if done == prev[1] else (turns - prev[1]) / (done - prev[1])
            return prev[0] + f * (s - prev[0]), prev[2] + f * (tok - prev[2])
        prev = (s, done, tok)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="bench_agents.json files")
    ap.add_argument("--share", type=float, default=None,
                    help="share of the turns expected (default: the smallest share any run finished)")
    args = ap.parse_args(argv)
    rows = []
    for path in args.runs:
        try:
            for r in json.load(open(path))["rows"]:
                if r.get("timeline"):
                    rows.append((path, r))
        except (OSError, ValueError, KeyError) as e:
            print(f"compare_at_share: {path}: {e}", file=sys.stderr)
            return 2
    if not rows:
        print("compare_at_share: no row with a timeline (bench_agents.py records it since 2026-12-06)", file=sys.stderr)
        return 2
    share = args.share or min(r["turns_completed"] / r["turns_expected"] for _, r in rows)
    print(f"at {share:.1%} of each run's turns")
    for path, r in rows:
        hit = at_share(r["timeline"], share * r["turns_expected"])
        what = "not reached" if hit is None else f"{hit[1] / hit[0]:,.0f} tok/s ({hit[0]:.0f} s)"
        print(f"  {r['model']} {r['case']} N={r['agents']} rows={r['rows']}: {what}   {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
