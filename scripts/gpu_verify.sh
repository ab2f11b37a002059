#!/usr/bin/env bash
# One device call (about 5 minutes): what the 2026-12-07 afternoon session built and could not
# run on a GPU (its device budget was spent).
#   1. the MoE training corpus on CUDA (mixtral, qwen2_moe, olmoe: fell back before the fix of
#      aot/opaque.py; expected 0 fallbacks, 0 wrong)
#   2. the new tests on CUDA's stack (torch 2.11, Python 3.12): the C++ guard extension builds
#      and agrees with Python, the state-version guards; the opaque backward; tests/cudagraphs
#   3. benchmarks.guard_cost on that host's Python
#   OUT=... bash scripts/gpu_verify.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
source scripts/gpu_env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/capture/test_tensor_check.py \
  tests/capture/test_stable_guards.py tests/aot/test_opaque_backward.py tests/cudagraphs \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/tests.log" | tail -15
# the guards' per-call cost on this host's Python 3.12 (state-version check included)
timeout 60 python3 -m benchmarks.guard_cost resnet50-like >"$OUT/guard_cost.txt" 2>&1
echo "guard_cost rc=$?"; tail -4 "$OUT/guard_cost.txt"
EMBER_HF_DEVICE=cuda EMBER_TRITON_COMPILE_WORKERS=4 timeout 150 python3 scripts/gpu_hf_corpus.py \
  --budget 120 --modes train mixtral qwen2_moe olmoe >"$OUT/moe.log" 2>&1
echo "moe rc=$?"
grep -h -E "^\||SUMMARY|FALLBACK" "$OUT/moe.log" | cut -c1-600
