#!/usr/bin/env bash
# A ground job that continues from the shipped weights on the GPU machine, where the working tree and a whole
# checkpoint folder together would pass the 64 MiB a device call carries. Two steps:
#   bash dev/ground_start.sh prepare    # here: runs/ground-aux <- the training-only heads and trainer state of the
#                                       # run that made the shipped weights (AUX=COMMIT:PATH, default tiny-ui-v11's;
#                                       # dev/checkpoints/README.md), about 12 MB
#   bash dev/ground_start.sh assemble   # there (carry runs/ground-aux): runs/v2/ground <- the bundled weights +
#                                       # runs/ground-aux; then, in the same command, for example:
#   EVAL_N=0 COMPILE=1 LENGTH_MULTIPLE=64 ELEMENT_HEADS=1 GROUND_TOTAL=88 JOBS="ground:8.6" bash dev/v2_job.sh
# The ground job finds trainer_state.json without an optimiser state, so it starts a fresh optimiser where the
# earlier jobs' schedule left off (scripts/train_tiny_ui_v2.sh; GROUND_TOTAL must exceed the minutes done, 70.3
# for tiny-ui-v11); later calls to the same warm machine resume with its optimiser (the same command without
# `assemble`). ELEMENT_HEADS=1 trains head 1 on the element's own tokens, the click pointer the bundled
# generation_config.json names. tiny-ui-v7 came from tiny-ui-v6's weights this way with
# AUX=2e51893:dev/checkpoints/tiny-v2-run3-ground and GROUND_TOTAL=12.5, tiny-ui-v8 from tiny-ui-v7's with
# AUX=db5ffa7:dev/checkpoints/tiny-v7-ground in three calls, tiny-ui-v10 from tiny-ui-v9's with
# AUX=d5fd491:dev/checkpoints/tiny-v8-ground, TABLES=1 FONTS=mixed ICON_PLACES=1 GROUND_TOTAL=53.8 COOLDOWN=0.15 in
# two calls, tiny-ui-v11 from tiny-ui-v10's with AUX=835f6d7:dev/checkpoints/tiny-v10-ground and TAB_PLACES=1 as well,
# GROUND_TOTAL=71 then 70.5 (docs/tiny-model.md).
set -euo pipefail
AUX=${AUX:-cb9d797:dev/checkpoints/tiny-v11-ground}
case "${1:-}" in
prepare)
    commit=${AUX%%:*} path=${AUX#*:}
    for f in aux_heads.pt trainer_state.json; do
        git cat-file -e "$commit:$path/$f" 2>/dev/null || {
            echo "AUX=$AUX: no $path/$f at $commit (dev/checkpoints/README.md lists the kept checkpoints)" >&2; exit 2; }
    done
    rm -rf runs/ground-aux.tmp && mkdir -p runs/ground-aux.tmp
    git archive "$commit" "$path/aux_heads.pt" "$path/trainer_state.json" | tar -x -C runs/ground-aux.tmp
    mv "runs/ground-aux.tmp/$path"/* runs/ground-aux.tmp/
    rm -rf "runs/ground-aux.tmp/${path%%/*}" runs/ground-aux && mv runs/ground-aux.tmp runs/ground-aux
    ls -la runs/ground-aux ;;
assemble)
    for f in aux_heads.pt trainer_state.json; do
        [ -f "runs/ground-aux/$f" ] || { echo "runs/ground-aux/$f missing: run 'prepare' here and carry runs/ground-aux" >&2; exit 2; }
    done
    [ ! -e runs/v2/ground ] || { echo "runs/v2/ground exists: move it away first" >&2; exit 2; }
    mkdir -p runs/v2 && rm -rf runs/v2/ground.tmp && cp -r holotron/models/holotron-tiny-ui runs/v2/ground.tmp
    rm -f runs/v2/ground.tmp/README.md
    cp runs/ground-aux/aux_heads.pt runs/ground-aux/trainer_state.json runs/v2/ground.tmp/
    mv runs/v2/ground.tmp runs/v2/ground
    ls -la runs/v2/ground ;;
*)
    echo "usage: bash dev/ground_start.sh prepare|assemble" >&2; exit 2 ;;
esac
