#!/usr/bin/env bash
# One device call of the tiny model's v2 recipe (scripts/train_tiny_ui_v2.sh) on the GPU machine:
#   BRING=none MATCH_TOTAL=9 JOBS="match:9.5" bash dev/v2_job.sh   # then BRING=none JOBS="ground:9.5", then
#   JOBS="ground:6 eval"   (GROUND_TOTAL=15 in all three)
# Runs the jobs in order into runs/v2 (kept on a warm machine between calls), then writes under $OUT: the logs,
# the trainer states and eval JSONs (logs.tgz), and the latest match and ground checkpoints without their
# optimiser states (match.tgz.aa, ground.tgz.aa, .ab, ...: pieces under 16 MB) so they can travel back if the
# machine is not kept.
set -uo pipefail
R=runs/v2
mkdir -p "$R/logs" "${OUT:=/tmp/out}"
export TOKENIZER=${TOKENIZER:-runs/tok-word} WORKERS=${WORKERS:-15}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader > "$R/logs/gpu.txt" 2>&1
status=0
for j in $JOBS; do
    name=${j%%:*}; min=${j#*:}; [ "$min" = "$j" ] && min=
    t0=$(date +%s)
    bash scripts/train_tiny_ui_v2.sh "$R" "$name" $min > "$R/logs/$name-$t0.log" 2>&1
    status=$?
    echo "$name $min: exit $status in $(( $(date +%s) - t0 )) s" | tee -a "$R/logs/jobs.txt"
    tail -c 3000 "$R/logs/$name-$t0.log"
    [ $status -eq 0 ] || break
done
tar czf "$OUT/logs.tgz" "$R/logs" $(ls -d $R/*/trainer_state.json $R/*/train_log.csv $R/eval 2>/dev/null)
# BRING: the checkpoints to bring back (default both; "none" on a call that another follows at once: six 15 MB
# pieces took long enough to come back that the warm machine was released before the next call, 2026-12-04)
for stage in ${BRING:-match ground}; do
    if [ -f "$R/$stage/config.json" ]; then
        tar czf - --exclude=training_state.pt -C "$R" "$stage" | split -b 15M - "$OUT/$stage.tgz."
    fi
done
ls -la "$OUT"
exit $status
