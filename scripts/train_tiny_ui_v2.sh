#!/usr/bin/env bash
# The recipe for holotron-tiny-ui v2, in jobs of under 10 minutes (docs/tiny-model.md says why each part):
#   match   the vision tower (from the shipped model's), the projector and a fresh embedding table under the
#           word-level tokenizer with single-token coordinates: every element and text of a whole screen is a
#           query of its label's word embeddings scored over the image tokens, the word under each token read
#           against the same table, the element centre each token carries, the characters
#           (holotron/train/matching.py); its gate: the matching accuracy on dev screens;
#   ground  the whole model from OUT/match (the first ground job) or resumed with its optimiser from
#           OUT/ground (later jobs): many short questions per screen, the in-box answer loss on the
#           coordinate tokens, the attention pointer on the last attention layer's heads (element + its label
#           text), centre targets, the matching losses alongside, padded and colour-augmented screens, one
#           warm-up / constant / cool-down schedule over GROUND_TOTAL minutes of all ground jobs together;
#   eval    the 1,000 held-out screens, the ladder (training looks, held-out looks, held-out vocabulary, per
#           role and size family) and the real-browser set, into OUT/eval.
#
#   bash scripts/train_tiny_ui_v2.sh OUT match MINUTES       # repeat with MATCH_TOTAL: each job resumes the previous
#   bash scripts/train_tiny_ui_v2.sh OUT ground MINUTES      # repeat; each job resumes the previous one
#   bash scripts/train_tiny_ui_v2.sh OUT eval
#
# Environment: CONFIG (default tiny-ui), WORKERS (default CPUs - 1), DEVICE (default auto), TOKENIZER (a word
# tokenizer folder; default: trained into OUT/match/tokenizer by the match job), VISION_FROM (default the
# bundled holotron-tiny-ui: its vision tower and projector start the match stage; "none": from scratch; since
# tiny-ui-v5 the bundled weights are this recipe's own third run, whose match stage started from tiny-ui-v4's:
# git archive 90a918f holotron/models/holotron-tiny-ui),
# MATCH_BATCH (64), MATCH_LR (1e-3), MATCH_REUSE (2), MATCH_TOTAL (training minutes of all match jobs together:
# the schedule's length; unset: one job, its schedule ending with its MINUTES), MATCH_COOLDOWN (0.15),
# GROUND_BATCH (32), QUERIES (16), GROUND_LR (1.5e-3), GROUND_TOTAL (minutes of grounding over all ground jobs,
# default 20: the schedule's length), COOLDOWN (the cool-down's share of GROUND_TOTAL, default 0.2), POINTER_CORE
# (set: ground jobs with --pointer-core), ELEMENT_HEADS (ground jobs with --pointer-element-heads N: the last N of
# the two pointer heads on the element's own tokens, the click pointer then those; default 0), PAD_AUG (0.5), EVAL_N (dev screens per eval, 64), FINAL_N (1000),
# LADDER_N (300), EVAL_WORKERS (rendering processes per eval, 5), LENGTH_MULTIPLE (ground batches' rows padded
# to a multiple of it, default 1), COMPILE (set: ground jobs with --compile), FONTS (mixed: match and ground jobs
# with --fonts mixed, the training screens' text in one face per screen of holotron/data/fonts/ or Aileron;
# unset: --fonts default, every screen in Aileron as before), TABLES (1: match and ground jobs with --tables on, a
# data table on about half of the app, web and mobile training screens, its rows' controls asked through the row's
# identifier, holotron/data/tables.py; unset or 0: --tables off, the screens as before), ICON_PLACES (1: match and
# ground jobs with --icon-places on, the training screens' icons moved so that only their glyph tells them apart:
# window controls at either end of the title bar, toolbar icons in vertical strips, holotron/data/icon_places.py;
# unset or 0: --icon-places off, the screens as before), TAB_PLACES (1: match and ground jobs with --tab-places on,
# now and then the training screens' tabs in a column, holotron/data/tab_places.py; unset or 0: off), EXTRA (more
# train options).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash scripts/train_tiny_ui_v2.sh OUT match|ground|eval [MINUTES]" >&2
    exit 2
fi
OUT=$1
JOB=$2
MIN=${3:-}
CONFIG=${CONFIG:-tiny-ui}
WORKERS=${WORKERS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 0 ))}
DEVICE=${DEVICE:-auto}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
case ${TABLES:-0} in 0) TABLES_ARGS=() ;; 1) TABLES_ARGS=(--tables on) ;;
    *) echo "TABLES must be 1 or 0, got '$TABLES'" >&2; exit 2 ;; esac
case ${ICON_PLACES:-0} in 0) ICON_ARGS=() ;; 1) ICON_ARGS=(--icon-places on) ;;
    *) echo "ICON_PLACES must be 1 or 0, got '$ICON_PLACES'" >&2; exit 2 ;; esac
case ${TAB_PLACES:-0} in 0) TAB_ARGS=() ;; 1) TAB_ARGS=(--tab-places on) ;;
    *) echo "TAB_PLACES must be 1 or 0, got '$TAB_PLACES'" >&2; exit 2 ;; esac
case $JOB in match|ground) [ -n "$MIN" ] || { echo "$JOB needs MINUTES" >&2; exit 2; } ;; eval) ;;
    *) echo "unknown job '$JOB' (match, ground, eval)" >&2; exit 2 ;; esac

common=(--config "$CONFIG" --device "$DEVICE" --workers "$WORKERS" --steps 1000000 --log-every 10
        --log-seconds 20 --max-shard-size 8MB --vocab train --pad-aug "${PAD_AUG:-0.5}" --colour-aug on
        --eval-n "${EVAL_N:-64}" ${FONTS:+--fonts "$FONTS"} ${TABLES_ARGS[@]+"${TABLES_ARGS[@]}"}
        ${ICON_ARGS[@]+"${ICON_ARGS[@]}"} ${TAB_ARGS[@]+"${TAB_ARGS[@]}"} "${EXTRA_ARGS[@]}")

if [ "$JOB" = match ]; then
    tok=()
    if [ -n "${TOKENIZER:-}" ]; then tok=(--tokenizer "$TOKENIZER"); else tok=(--tokenizer-kind word); fi
    start=()
    VISION_FROM=${VISION_FROM:-holotron-tiny-ui}
    if [ -f "$OUT/match/training_state.pt" ]; then
        start=(--resume "$OUT/match")  # a later match job: the same schedule, its optimiser carried
    elif [ "$VISION_FROM" != none ]; then
        start=(--init-from "$VISION_FROM" --init-parts vision)
    fi
    $PY -m holotron.train --stage match "${common[@]}" "${tok[@]}" ${start[@]+"${start[@]}"} --out "$OUT/match" \
        --batch-size "${MATCH_BATCH:-64}" --lr "${MATCH_LR:-1e-3}" --reuse "${MATCH_REUSE:-2}" --save-optimizer \
        --time-budget "$MIN" --eval-every 300 --schedule wsd --cooldown "${MATCH_COOLDOWN:-0.15}" \
        ${MATCH_TOTAL:+--schedule-minutes "$MATCH_TOTAL"}
    exit 0
fi

if [ "$JOB" = ground ]; then
    start=(--init-from "$OUT/match")
    if [ -f "$OUT/ground/training_state.pt" ]; then
        start=(--resume "$OUT/ground")
    elif [ -f "$OUT/ground/trainer_state.json" ]; then
        # the weights of an earlier ground job without its optimiser state (e.g. copied from another machine):
        # a fresh optimiser, the schedule where that job left it
        done_min=$($PY -c "import json,sys; s = json.load(open(sys.argv[1]))
print(s['train_seconds'] / 60 + (s['args'].get('schedule_done') or 0))" \
                   "$OUT/ground/trainer_state.json")
        mv "$OUT/ground" "$OUT/ground-prev-$$"
        start=(--init-from "$OUT/ground-prev-$$" --schedule-done "$done_min" --rewarm-steps 50)
    elif [ ! -f "$OUT/match/config.json" ]; then
        echo "ground: no $OUT/match checkpoint and no $OUT/ground/training_state.pt: run the match job first" >&2
        exit 2
    fi
    $PY -m holotron.train "${common[@]}" "${start[@]}" --out "$OUT/ground" --save-optimizer \
        --batch-size "${GROUND_BATCH:-32}" --queries "${QUERIES:-16}" --followups short --lr "${GROUND_LR:-1.5e-3}" \
        --aux-weight 0.5 --pointer-weight 1 --pointer-heads 2 --match-weight 0.5 ${POINTER_CORE:+--pointer-core} \
        --pointer-element-heads "${ELEMENT_HEADS:-0}" \
        --schedule wsd --cooldown "${COOLDOWN:-0.2}" --schedule-minutes "${GROUND_TOTAL:-20}" --warmup 0.03 \
        --time-budget "$MIN" --eval-every 400 --length-multiple "${LENGTH_MULTIPLE:-1}" ${COMPILE:+--compile}
    exit 0
fi

# eval: the model of the last ground job, the three evals side by side (the model is small: the screens'
# rendering is the cost, in EVAL_WORKERS processes each)
MODEL=$OUT/ground
mkdir -p "$OUT/eval"
ew=(--device "$DEVICE" --batch-size 64 --json --no-progress --workers "${EVAL_WORKERS:-5}"
    --pointer "${POINTER:-auto}")
$PY -m holotron.eval --model "$MODEL" --n "${FINAL_N:-1000}" "${ew[@]}" > "$OUT/eval/heldout.json" &
a=$!
$PY -m holotron.eval --model "$MODEL" --ladder --n "${LADDER_N:-300}" "${ew[@]}" > "$OUT/eval/ladder.json" &
b=$!
$PY -m holotron.eval --model "$MODEL" --data "$HERE/scripts/browser_set/set/browser_set.json" --box-format xyxy \
    --box-space pixel --device "$DEVICE" --batch-size 32 --json --no-progress --pointer "${POINTER:-auto}" \
    > "$OUT/eval/browser.json" &
c=$!
wait $a && wait $b && wait $c
echo "wrote $OUT/eval/heldout.json, ladder.json, browser.json"
