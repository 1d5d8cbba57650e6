#!/usr/bin/env bash
# A ground job that continues from the shipped weights (tiny-ui-v6) on the GPU machine, where the working tree
# and runs/v2 together would pass the 64 MiB a device call carries. Two steps:
#   bash dev/v6_ground_start.sh prepare    # here: runs/v6-aux <- the v2 run's training-only heads and trainer
#                                          # state (commit 2e51893, dev/checkpoints/README.md), about 12 MB
#   bash dev/v6_ground_start.sh assemble   # there (carry runs/v6-aux and runs/tok-word): runs/v2/ground <- the
#                                          # bundled v6 weights + runs/v6-aux; then, in the same command:
#   COMPILE=1 LENGTH_MULTIPLE=64 ELEMENT_HEADS=1 GROUND_TOTAL=14 JOBS="ground:9.5" bash dev/v2_job.sh
# The ground job finds trainer_state.json without an optimiser state, so it starts a fresh optimiser where the
# v2 run's schedule left off (scripts/train_tiny_ui_v2.sh); ELEMENT_HEADS=1 trains head 1 on the element's own
# tokens, the click pointer v6's generation_config.json names.
set -euo pipefail
case "${1:-}" in
prepare)
    rm -rf runs/v6-aux.tmp && mkdir -p runs/v6-aux.tmp
    git archive 2e51893 dev/checkpoints/tiny-v2-run3-ground/aux_heads.pt \
        dev/checkpoints/tiny-v2-run3-ground/trainer_state.json | tar -x -C runs/v6-aux.tmp
    mv runs/v6-aux.tmp/dev/checkpoints/tiny-v2-run3-ground/* runs/v6-aux.tmp/
    rm -rf runs/v6-aux.tmp/dev runs/v6-aux && mv runs/v6-aux.tmp runs/v6-aux
    ls -la runs/v6-aux ;;
assemble)
    for f in aux_heads.pt trainer_state.json; do
        [ -f "runs/v6-aux/$f" ] || { echo "runs/v6-aux/$f missing: run 'prepare' here and carry runs/v6-aux" >&2; exit 2; }
    done
    [ -f runs/tok-word/tokenizer.json ] || { echo "runs/tok-word missing: carry it (the word tokenizer)" >&2; exit 2; }
    [ ! -e runs/v2/ground ] || { echo "runs/v2/ground exists: move it away first" >&2; exit 2; }
    mkdir -p runs/v2 && rm -rf runs/v2/ground.tmp && cp -r holotron/models/holotron-tiny-ui runs/v2/ground.tmp
    rm -f runs/v2/ground.tmp/README.md
    cp runs/v6-aux/aux_heads.pt runs/v6-aux/trainer_state.json runs/v2/ground.tmp/
    mv runs/v2/ground.tmp runs/v2/ground
    ls -la runs/v2/ground ;;
*)
    echo "usage: bash dev/v6_ground_start.sh prepare|assemble" >&2; exit 2 ;;
esac
