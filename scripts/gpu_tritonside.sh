#!/usr/bin/env bash
# Issue 20, the tritonside helper's GPU checks (one H200, torch 2.11, Triton 3.6, Python 3.12, no
# internet; under 6 minutes; everything under $OUT):
#   bash scripts/gpu_tritonside.sh
#   1. summary.txt      versions, GPU, each part's headline
#   2. tests.log        tests/inductor_triton on CUDA (EMBER_TRITON_DEVICE=cuda: real kernels;
#                       tuning off for time: the startup part tunes)
#   3. startup.md/.json scripts/gpu_tritonside.py: cold compile and warm start (fresh processes,
#                       fresh then reused caches) of a tiny graph, GPT-2 124M inference (bf16
#                       autocast, 16x512) and a GPT-2 small training step, Ember's inductor vs
#                       torch.compile; Ember's Triton counters (compiles in the process, pool
#                       builds, disk hits, tunings); profile_*.txt: cProfile of each run
# Targets (issue 20): cold compile <= 1/4 of torch.compile's; warm start < 1 s with 0 Triton
# compiles and 0 tunings.
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( ${BUDGET:-330} - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
unset TRITON_INTERPRET
export PYTHONPATH="$PWD/core:$PWD/plugins/inductor:$PWD/plugins/eager:$PWD/plugins/aot_eager:$PWD/plugins/cudagraphs:${PYTHONPATH:-}"
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e ./core -e ./plugins/eager -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs \
  >/tmp/ember_tritonside_install.log 2>&1 || echo "install failed (PYTHONPATH is used)" >> "$OUT/summary.txt"
{
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  echo "cpus $(nproc); $(lscpu | grep 'Model name' | head -1)"
} >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

echo "== startup (left $(left)s)" | tee -a "$OUT/summary.txt"
timeout 215 python3 scripts/gpu_tritonside.py --out "$OUT" --deadline 200 > "$OUT/startup.log" 2>&1
echo "startup rc=$?" | tee -a "$OUT/summary.txt"
cat "$OUT/startup.md" >> "$OUT/summary.txt" 2>/dev/null || tail -20 "$OUT/startup.log" >> "$OUT/summary.txt"

L=$(left)
echo "== tests on CUDA (left ${L}s)" | tee -a "$OUT/summary.txt"
if [ "$L" -gt 30 ]; then
  EMBER_TRITON_DEVICE=cuda EMBER_TRITON_TUNE=0 EMBER_CACHE_DIR=/tmp/ember_tritonside_tests \
    timeout $((L - 10)) python3 -m pytest -q -p no:cacheprovider tests/inductor_triton --durations=10 \
    > "$OUT/tests.log" 2>&1
  echo "tests rc=$?" | tee -a "$OUT/summary.txt"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -20 | tee -a "$OUT/summary.txt"
fi
rm -rf /tmp/ember_tritonside_tests
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
exit 0
