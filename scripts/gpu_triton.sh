#!/usr/bin/env bash
# Issue 20 on the GPU machine (one H200, torch 2.11, triton 3.6, Python 3.12, no internet):
# the inductor backend's Triton target for real. Under 6 minutes; everything under $OUT.
#   bash scripts/gpu_triton.sh
# Parts (each logged on its own, a failing part never stops the next):
#   1. summary.txt        versions, GPU, and each part's headline
#   2. tests.log          tests/inductor_triton on CUDA (EMBER_TRITON_DEVICE=cuda, no interpreter)
#   3. check.log/.json    scripts/gpu_triton_check.py: zoo correctness (infer+train vs eager),
#                         launch overhead (one kernel; a tiny graph's wrapper), 256 MB fused
#                         pointwise bandwidth vs a device copy, warm start (fresh process: Triton
#                         compiles and tunings must be 0; warm_start_profile_1.txt: cProfile)
#   4. bench_*.log        benchmarks side by side (eager, ember-inductor, torch-inductor; bf16
#                         autocast), inference then training, if time is left
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( ${BUDGET:-340} - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# caches outside $OUT (only a few small files come back from it); a fresh one: a cold start
export EMBER_CACHE_DIR=/tmp/ember_gpu_triton_cache
rm -rf "$EMBER_CACHE_DIR" /tmp/ember_gpu_triton_cache_tests
unset TRITON_INTERPRET
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e ./core -e ./plugins/eager -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs \
  >/tmp/ember_gpu_install.log 2>&1 || { echo "install failed; trying PYTHONPATH:"; tail -5 /tmp/ember_gpu_install.log; } | tee -a "$OUT/summary.txt"
export PYTHONPATH="$PWD/core:$PWD/plugins/inductor:$PWD/plugins/eager:$PWD/plugins/aot_eager:$PWD/plugins/cudagraphs:${PYTHONPATH:-}"
{
  python3 - <<'PY'
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
try:
    import triton; print("triton", triton.__version__)
except Exception as e:
    print("triton import failed:", e)
PY
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
} >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

echo "== tests (left $(left)s)" | tee -a "$OUT/summary.txt"
EMBER_TRITON_DEVICE=cuda EMBER_TRITON_TUNE=0 EMBER_CACHE_DIR=/tmp/ember_gpu_triton_cache_tests \
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/inductor_triton --durations=10 \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?" | tee -a "$OUT/summary.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -20 | tee -a "$OUT/summary.txt"

echo "== checks (left $(left)s)" | tee -a "$OUT/summary.txt"
timeout 170 python3 scripts/gpu_triton_check.py --out "$OUT" > "$OUT/check.log" 2>&1
echo "check rc=$?" | tee -a "$OUT/summary.txt"
grep -E "^(RESULT|FAIL|ERROR)" "$OUT/check.log" | tee -a "$OUT/summary.txt"

L=$(left)
if [ "$L" -gt 60 ]; then
  echo "== bench infer+train bf16 (left ${L}s)" | tee -a "$OUT/summary.txt"
  for mode in infer train; do
    L=$(left); [ "$L" -gt 30 ] || break
    timeout $((L - 10)) python3 -m benchmarks run --device cuda --mode $mode --amp \
      --backends eager,ember-inductor,torch-inductor --deadline $((L - 20)) \
      --out "/tmp/ember_gpu_bench_$mode" > "$OUT/bench_$mode.log" 2>&1
    echo "bench $mode rc=$?" | tee -a "$OUT/summary.txt"
    cat /tmp/ember_gpu_bench_$mode/*.md >> "$OUT/bench_$mode.log" 2>/dev/null
    tail -30 "$OUT/bench_$mode.log" >> "$OUT/summary.txt"
  done
fi
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
exit 0
