#!/usr/bin/env bash
# The cudagraphs backend on the GPU machine (one H200, Python 3.12, torch 2.11, no internet),
# under 5 minutes (each part under a timeout; a killed run's log still has per-model lines); logs and tables under $OUT (default ./gpu_out):
#   1. tests/cudagraphs on the GPU (tests.log): zoo models (small) inference and training equal
#      eager's and replay; stale-memory cases; dropout; reduce-overhead with aot_eager.
#   2. the benchmark runner, --size small (GPT-2 and BERT batch 4, resnet50 batch 2), inference
#      (bench-infer.log) and training steps (bench-train.log), CUDA-event timings and peak memory
#      (torch.cuda.max_memory_allocated), tables in $OUT/bench/: eager, ember-cudagraphs,
#      torch-cudagraphs (torch.compile(backend="cudagraphs")), ember-aot-eager@reduce-overhead,
#      ember-inductor@reduce-overhead, torch-inductor@reduce-overhead. The inference run also
#      writes the per-call overhead of a tiny function (x + 1 on 4 elements) for each of them,
#      side by side in one process.
#   bash scripts/gpu_cudagraphs.sh [tests|bench|all]
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
for n in ("_construct_storage_from_data_pointer", "_set_storage_data_ptr_access_error_msg",
          "_construct_CUDA_Tensor_From_Storage_And_Metadata"):
    print(n, hasattr(torch._C, n))
print("register_generator_state", hasattr(torch.cuda.CUDAGraph, "register_generator_state"))
PY
(uptime; nproc) >>"$OUT/env.txt" 2>&1
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  EMBER_LOGS="${EMBER_LOGS:-}" timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -rs \
    -p no:cacheprovider --durations=15 tests/cudagraphs 2>&1 | tee "$OUT/tests.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  B="eager,ember-cudagraphs,torch-cudagraphs,ember-aot-eager@reduce-overhead"
  B="$B,ember-inductor@reduce-overhead,torch-inductor@reduce-overhead"
  common=(--device cuda --size small --models gpt2,bert,resnet50 --backends "$B"
          --iters 60 --warmup 5 --max-seconds 5 --compile-probes none --out "$OUT/bench" --append)
  timeout "${INFER_TIMEOUT:-70}" python3 -m benchmarks run --mode infer --deadline 45 \
    "${common[@]}" >"$OUT/bench-infer.log" 2>&1; echo "infer rc=$?" >>"$OUT/bench-infer.log"
  tail -25 "$OUT/bench-infer.log"
  timeout "${TRAIN_TIMEOUT:-70}" python3 -m benchmarks run --mode train --deadline 45 \
    --no-overhead "${common[@]}" >"$OUT/bench-train.log" 2>&1
  echo "train rc=$?" >>"$OUT/bench-train.log"
  tail -25 "$OUT/bench-train.log"
  ls "$OUT/bench" 2>/dev/null
fi
exit $rc
