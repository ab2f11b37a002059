#!/usr/bin/env bash
# Validation on the GPU machine (Python 3.12, torch 2.11, CUDA): install Ember offline (the
# machine has no registry access; every dependency is already there), run the capture, breaks and
# AOT suites, then the benchmark runner on CUDA. Logs go to $OUT (or ./gpu_out).
#   bash scripts/gpu_validate.sh [tests|bench|all]
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
what="${1:-all}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e ./core -e ./plugins/eager -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs \
  >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 - <<'PY' | tee "$OUT/env.txt"
import sys, torch, ember
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("backends", ember.list_backends())
PY
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider \
    tests/capture tests/breaks tests/aot 2>&1 | tee "$OUT/tests.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m benchmarks run --device cuda --mode infer --out "$OUT/bench" "${@:2}" 2>&1 | tail -40
fi
exit $rc
