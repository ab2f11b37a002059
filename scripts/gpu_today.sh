#!/usr/bin/env bash
# One device call (about 9 minutes), everything under $OUT:
#   1. scripts/gpu_lean.sh with every test of tests/cudagraphs/test_gpu.py (the in-place weight
#      test with and without the split, host profiles under reduce-overhead)
#   2. the CUDA-graph tables again with the runner timing each step in its steady state
#   3. with the time left: GPT-2 training, full size, bf16, with Ember's generated code
#      (EMBER_LOGS=output_code), kernels by CUDA time beside torch's
#   DEADLINE=575 OUT=... bash scripts/gpu_today.sh
set -uo pipefail
T0=$(date +%s)
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
DEADLINE="${DEADLINE:-575}"  # seconds this call may take in all
TESTS_K="" bash scripts/gpu_lean.sh
export EMBER_CACHE_DIR=/tmp/ember_lean_cache PYTHONUNBUFFERED=1
left=$(( DEADLINE - ($(date +%s) - T0) ))
if [ $left -gt 120 ]; then
  OVERHEAD_TIMEOUT=40 timeout $(( left < 240 ? left : 240 )) bash scripts/gpu_cudagraphs.sh bench \
    >"$OUT/cg_bench.txt" 2>&1
  echo "bench rc=$?"; grep -E "ms \(peak|over eager|^ember|^torch|^eager" "$OUT/cg_bench.txt" | cut -c1-260
fi
left=$(( DEADLINE - ($(date +%s) - T0) ))
if [ $left -gt 60 ]; then
  EMBER_LOGS=output_code timeout $left python3 scripts/gpu_profile.py --model gpt2 --mode train \
    --size full --out "$OUT/profile" --top 60 >"$OUT/profile_gpt2_train.log" 2>&1
  echo "gpt2 train profile rc=$? (limit ${left}s)"; grep -A4 "bf16, mode" "$OUT"/profile/*.txt
else
  echo "no time left for the GPT-2 profile"
fi
