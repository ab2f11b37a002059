#!/usr/bin/env bash
# The smallest useful device call (about 4 minutes), by priority, for a session whose device
# time is nearly spent: the in-place weight-change tests under CUDA graphs (with and without
# the split), then host profiles of BERT training and resnet50 inference under
# reduce-overhead (Ember, then torch).           OUT=... bash scripts/gpu_lean.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
export EMBER_CACHE_DIR=/tmp/ember_lean_cache
source scripts/gpu_env.sh
# TESTS_K: which GPU tests (default the in-place and reduce-overhead ones; empty: all)
K="${TESTS_K-weights_changed or inductor_reduce_overhead or parameter_replaced}"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/cudagraphs/test_gpu.py \
  ${K:+-k "$K"} >"$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head
timeout 60 python3 - >"$OUT/tests_nosplit.log" 2>&1 <<'PY'
import sys, pytest
import ember_inductor.freezing as fr
del fr.FrozenCall.ember_cudagraphs_split
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/cudagraphs/test_gpu.py",
                      "-k", "weights_changed_in_place"]))
PY
echo "without the split rc=$? (1 expected)"; grep -E "^FAILED|passed|failed|after " "$OUT/tests_nosplit.log" | head -8
for spec in "resnet50 infer ember" "bert train ember" "bert train torch"; do
  set -- $spec
  timeout 45 python3 scripts/gpu_host_profile.py --model $1 --mode $2 --calls 100 \
    --variant $3-inductor@reduce-overhead >"$OUT/host_$1_$2_$3.log" 2>&1
  echo "host $spec rc=$?"; head -1 "$OUT/host_$1_$2_$3.log"
done
