#!/usr/bin/env bash
# The `-m gpu` suite in two device calls (the whole of it outran a 235 s call on an H100, 2026-12-05: 65 of 105
# tests), failures named (-rf), each log to $OUT:
#   bash dev/probes/gpu_tests.sh 1   # the scan's kernels and gradients (tests/test_kernels*.py)
#   bash dev/probes/gpu_tests.sh 2   # everything else marked gpu (decode ops, engine, FP8, skinny products, ...)
set -u -o pipefail
export PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
part=${1:-1}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if [ "$part" = 1 ]; then
  files="tests/test_kernels.py tests/test_kernels_grad.py"
  ignore=""
else
  files="tests/"
  ignore="--ignore=tests/test_kernels.py --ignore=tests/test_kernels_grad.py"
fi
# shellcheck disable=SC2086
timeout ${LIMIT_S:-560} python3 -m pytest -q -rf -m gpu $files $ignore 2>&1 | tee "$OUT/pytest-gpu-$part.log" | tail -25
