"""From a bench_mm.py JSON (a --configs sweep at 128 rows): per weight kind, the tile (split aside) of least total
time over the swept shapes, against the peer's (cuBLAS bf16 / torch._scaled_mm) total of the same run. Prints
shell ``export`` lines that put the winner on the decode path (HOLOTRON_MM_CONFIG, HOLOTRON_MM_ROWS /
HOLOTRON_FP8_GEMM_ROWS) only where it beats the peer; a summary on stderr.

    eval $(python3 dev/probes/mm_choose.py $OUT/bench_mm.json)"""

import collections
import json
import sys

d = json.load(open(sys.argv[1]))
peers = {"16bit": "torch_bf16", "fp8": "torch_fp8"}
rows = {r["shape"]: r for r in d["rows"] if r["M"] == 128}
keys = ("BLOCK_N", "BLOCK_K", "STAGES", "num_warps")
chosen = {}
for kind in ("16bit", "fp8"):
    best = collections.defaultdict(dict)  # tile -> shape -> ms
    shapes = []
    for name, sw in d["sweep"].items():
        shape, k, _ = name.rsplit("/", 2)
        if k != kind:
            continue
        shapes.append(shape)
        for t in sw["tried"]:
            if t.get("ms"):
                tile = tuple(t["config"].get(x) for x in keys)
                best[tile][shape] = min(best[tile].get(shape, 1e9), t["ms"])
    full = {tile: sum(v.values()) for tile, v in best.items() if len(v) == len(shapes)}
    if not full:
        continue
    tile = min(full, key=full.get)
    peer = sum(rows[s][peers[kind]] for s in shapes)
    print(f"{kind}: best tile {dict(zip(keys, tile))} total {full[tile]:.4f} ms over {shapes}; peer {peer:.4f}",
          file=sys.stderr)
    if full[tile] < peer:
        chosen[kind] = dict(zip(keys, tile))
if chosen:
    print(f"export HOLOTRON_MM_CONFIG='{json.dumps(chosen)}'")
    print(f"export CHOSEN='{' '.join(chosen)}'")
    if "16bit" in chosen:
        print("export HOLOTRON_MM_ROWS=128")
    if "fp8" in chosen:
        print("export HOLOTRON_FP8_GEMM_ROWS=128")
else:
    print("export CHOSEN=''")
