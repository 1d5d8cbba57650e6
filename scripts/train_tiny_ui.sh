#!/usr/bin/env bash
# The recipe for holotron-tiny-ui, in three stages, then the 1,000-screen held-out score:
#   1. reading: the vision tower + projector + character and text-class heads on colour-augmented tile
#      mosaics of text crops: characters alone for the first half, then label classes beside them;
#   2. grounding: the whole model from stage 1's weights, answer loss + auxiliary image-token losses + the
#      pointer loss (from each question's answering position to the image tokens on its element);
#   3. pointing: grounding continued from stage 2 with the pointer loss moved onto the last attention layer's
#      own heads (--pointer-heads) at every answer position, so the layer that feeds the digits attends to the
#      element (from the shipped stage-2 weights: 10.0% held-out against 5.0% for the same minutes without it).
#
#   bash scripts/train_tiny_ui.sh OUT [READ_MINUTES] [GROUND_MINUTES] [POINT_MINUTES]   # defaults 3, 5 and 7
#
# Environment: CONFIG (default tiny-ui), WORKERS (default: CPUs - 1), DEVICE (default auto), TOKENIZER (a
# tokenizer folder; default: the byte-level BPE one of tiny-ui-v4, built into OUT/tokenizer),
# EVAL_N (default 1000), READ_TILE (the reading mosaics' side in px; default 384 for tiny-ui, else the config's tile), READ_BATCH (default 256), READ_LR (default 1e-3), READ_REUSE (steps per rendered
# batch, default 3: in the third run 15 workers rendered about 2,000 mosaic tiles/s and the H200 waited for
# them 50-70% of the time; it trains on about 5,000 tiles/s),
# GROUND_BATCH (default 32), POINTER_WEIGHT (default 1; the pointer loss), POINTER_HEADS (stage 3's heads, default 2),
# POINT_LR (stage 3's peak lr, default 1e-3), GROUND_POINTER_HEADS (stage 2's --pointer-heads: default 0, the
# pointer head; e.g. 2 with STAGES=read,ground,eval for two stages, not yet measured),
# GROUND_COLOUR_AUG (on / off, default on: one colour draw per screen), GRID_AUG (the --grid-aug share of
# grounding screens tiled on a random grid near their ratio; default 0, not yet measured on a GPU),
# GROUND_LAYOUTS (space-separated --layouts for grounding, e.g. "app dialog web mobile form mosaic"; default: the
# training split's five; not yet measured on a GPU),
# EXTRA (more train options), STAGES (which of read, ground, point, eval to run, comma-separated; default all
# four: e.g. STAGES=read in one job, STAGES=ground in a later one, which reads OUT/read, and STAGES=point,eval
# in a third, which reads OUT/ground).
# Writes OUT/read, OUT/ground, OUT/point (the model: bf16 shards of at most 8 MB, tokenizer, configs,
# trainer_state.json, train_log.csv) and OUT/eval.json (of the last stage this call trained; with
# STAGES=eval alone, of OUT/point if it holds a model, else OUT/ground). Stops at the first failing stage.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/train_tiny_ui.sh OUT [READ_MINUTES] [GROUND_MINUTES] [POINT_MINUTES]" >&2
    exit 2
fi
OUT=$1
READ_MIN=${2:-3}
GROUND_MIN=${3:-5}
POINT_MIN=${4:-7}
CONFIG=${CONFIG:-tiny-ui}
if [ -z "${READ_TILE+set}" ] && [ "$CONFIG" = tiny-ui ]; then READ_TILE=384; fi
WORKERS=${WORKERS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 0 ))}
DEVICE=${DEVICE:-auto}
EVAL_N=${EVAL_N:-1000}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
# the byte-level BPE tokenizer tiny-ui-v4 shipped with (python -m holotron.tokenizer rebuilds it byte for byte);
# the bundled model's own is the word-level one of the v2 recipe (scripts/train_tiny_ui_v2.sh)
TOK=${TOKENIZER:-$OUT/tokenizer}
PY=${PYTHON:-python3}
if [ -z "${TOKENIZER:-}" ] && [ ! -f "$TOK/tokenizer.json" ]; then
    $PY -m holotron.tokenizer --out "$TOK" >&2
fi
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
LAYOUT_ARGS=()
if [ -n "${GROUND_LAYOUTS:-}" ]; then read -r -a names <<< "$GROUND_LAYOUTS"; LAYOUT_ARGS=(--layouts "${names[@]}"); fi
STAGES=",${STAGES:-read,ground,point,eval},"
for s in ${STAGES//,/ }; do
    case $s in read|ground|point|eval) ;; *) echo "STAGES: unknown stage '$s' (read, ground, point, eval)" >&2; exit 2 ;; esac
done
want() { [[ $STAGES == *",$1,"* ]]; }
if want ground && ! want read && [ ! -f "$OUT/read/config.json" ]; then
    echo "STAGES=$STAGES: grounding starts from $OUT/read, which holds no checkpoint: run STAGES=read first" >&2
    exit 2
fi
if want point && ! want ground && [ ! -f "$OUT/ground/config.json" ]; then
    echo "STAGES=$STAGES: pointing starts from $OUT/ground, which holds no checkpoint: run STAGES=ground first" >&2
    exit 2
fi
if want eval && ! want ground && ! want point && [ ! -f "$OUT/ground/config.json" ]; then
    echo "STAGES=$STAGES: no model in $OUT/ground to evaluate: run STAGES=ground first" >&2
    exit 2
fi

common=(--config "$CONFIG" --tokenizer "$TOK" --device "$DEVICE" --workers "$WORKERS" --steps 1000000
        --lr 2e-3 --log-every 10 --log-seconds 20 --max-shard-size 8MB "${EXTRA_ARGS[@]}")

want read && $PY -m holotron.train --stage read "${common[@]}" --out "$OUT/read" ${READ_TILE:+--read-tile "$READ_TILE"} --batch-size "${READ_BATCH:-256}" \
    --time-budget "$READ_MIN" --eval-every 200 --lr "${READ_LR:-1e-3}" --reuse "${READ_REUSE:-3}"
grounding=(--batch-size "${GROUND_BATCH:-32}" --queries 8 --aux-weight 0.5 --pointer-weight "${POINTER_WEIGHT:-1}"
           --colour-aug "${GROUND_COLOUR_AUG:-on}" --grid-aug "${GRID_AUG:-0}" ${LAYOUT_ARGS[@]+"${LAYOUT_ARGS[@]}"}
           --eval-every 300 --eval-n 64)
want ground && $PY -m holotron.train "${common[@]}" "${grounding[@]}" --init-from "$OUT/read" --out "$OUT/ground" \
    --pointer-heads "${GROUND_POINTER_HEADS:-0}" --time-budget "$GROUND_MIN"
want point && $PY -m holotron.train "${common[@]}" "${grounding[@]}" --init-from "$OUT/ground" --out "$OUT/point" \
    --pointer-heads "${POINTER_HEADS:-2}" --lr "${POINT_LR:-1e-3}" --time-budget "$POINT_MIN"
want eval || exit 0
# the last stage this call trained; with eval alone, the last one OUT holds
FINAL=$OUT/ground
if want point || { ! want ground && [ -f "$OUT/point/config.json" ]; }; then FINAL=$OUT/point; fi
$PY -m holotron.eval --model "$FINAL" --n "$EVAL_N" --device "$DEVICE" --json --no-progress > "$OUT/eval.json"
$PY - "$OUT/eval.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
lo, hi = r["ci95"]
print(f"held-out point-in-box: {r['hits']}/{r['n']} = {100 * r['accuracy']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f})")
PYEOF
