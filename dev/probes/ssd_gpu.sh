#!/usr/bin/env bash
# The scan issue's GPU calls (issue 19), one phase per device call; logs and JSON to $OUT.
#   bash dev/probes/ssd_gpu.sh sweep   # GPU tests of the kernels and gradients, then ssd_tune.py: the two-pass
#                                      # forward's settings (SCAN_CONFIG TWO_PASS) and the backward with fp32 states
#                                      # (BWD_CONFIG STATES) or the two-pass training forward, each checked first
#                                      # (SKIP_TESTS=1: no pytest; ssd_tune checks every setting against float64)
#   bash dev/probes/ssd_gpu.sh bench   # the benchmark of record with the peers (carry .peers and .whl):
#                                      # bench_ssd.py forward and forward + backward, bench_train_step.py; the
#                                      # SCAN_CONFIG / BWD_CONFIG of a winner go in FWD_CFG / BWD_CFG (JSON) as
#                                      # bench_ssd's sweep sections
set -u
export PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
phase=${1:-sweep}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
if [ "$phase" = sweep ]; then
  [ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -m gpu tests/test_kernels.py tests/test_kernels_grad.py 2>&1 | tail -8
  FWD='[{}, {"TWO_PASS": true}, {"TWO_PASS": true, "TP_STATES": "bf16"}, {"TWO_PASS": true, "Q": 64},
        {"TWO_PASS": true, "Q": 64, "TP_STATES": "bf16"}, {"TWO_PASS": true, "Q": 256, "num_warps": 8, "TP_STATES": "bf16"},
        {"TWO_PASS": true, "TP_ROWS": 32}, {"TWO_PASS": true, "BLOCK_P": 32}, {"TWO_PASS": true, "tma": false}]'
  BWD='[{}, {"STATES": "fp32"}, {"STATES": "grads"}, {"STATES": "fp32", "BLOCK_N": 32}, {"scan": {"TWO_PASS": true}},
        {"scan": {"TWO_PASS": true}, "STATES": "grads"}]'
  timeout 330 python3 dev/probes/ssd_tune.py "$OUT" --budget 310 --fwd "$FWD" --bwd "$BWD" > "$OUT/tune.log" 2>&1
  tail -c 4000 "$OUT/tune.log"
fi
if [ "$phase" = bench ]; then
  FWD_CFG=${FWD_CFG:-'[{}]'}
  BWD_CFG=${BWD_CFG:-'[{}]'}
  timeout 420 python3 benchmarks/bench_ssd.py --sections ceilings,sweep,fwd,fwdbwd --configs "$FWD_CFG" \
    --bwd-configs "$BWD_CFG" --budget 400 --out "$OUT/ssd" > "$OUT/ssd.log" 2>&1
  tail -c 4000 "$OUT/ssd.log"
  timeout 150 python3 benchmarks/bench_train_step.py --steps 2 --out "$OUT/train" 2>&1 | tail -12
fi
ls -la "$OUT"
