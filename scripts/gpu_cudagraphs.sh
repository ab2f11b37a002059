#!/usr/bin/env bash
# The cudagraphs backend on the GPU machine (one H200, Python 3.12, torch 2.11, no internet),
# under 5 minutes (each part under a timeout; a killed run's log still has per-model lines); logs and tables under $OUT (default ./gpu_out):
#   1. tests/cudagraphs on the GPU (tests.log): zoo models (small) inference and training equal
#      eager's and replay; stale-memory cases; dropout; reduce-overhead with aot_eager.
#   2. overhead.txt: per-call overhead of a tiny function (x + 1 on 4 elements), side by side in
#      one process: eager, ember-cudagraphs, torch-cudagraphs, ember-aot-eager@reduce-overhead,
#      ember-inductor@reduce-overhead, torch-inductor@reduce-overhead;
#   3. the benchmark runner, --size small (GPT-2 and BERT batch 4, resnet50 batch 2), inference
#      and training steps (bench-{infer,train}-{A,B}.log), CUDA-event timings and peak memory
#      (torch.cuda.max_memory_allocated), tables in $OUT/bench/: A = the CUDA-graph backends
#      (ember-cudagraphs, torch.compile(backend="cudagraphs"), ember-aot-eager@reduce-overhead),
#      B = ember-inductor@reduce-overhead vs torch-inductor@reduce-overhead.
#   4. crash.txt (only with the argument `crash`): scripts/gpu_cudagraphs_crash.py, the training
#      crash of docs/cudagraphs.md bisected by backend combination, one process each.
#   bash scripts/gpu_cudagraphs.sh [tests|bench|all|crash]
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
  # 1. per-call overhead of x + 1 on 4 elements, every variant side by side in one process
  #    (the runner's per_call_overhead, interleaved samples)
  timeout "${OVERHEAD_TIMEOUT:-60}" python3 - >"$OUT/overhead.txt" 2>"$OUT/overhead.err" <<'PY'
import os
from benchmarks.measure import per_call_overhead
names = ["eager", "ember-cudagraphs", "torch-cudagraphs", "ember-aot-eager@reduce-overhead",
         "ember-inductor@reduce-overhead", "torch-inductor@reduce-overhead"]
res = per_call_overhead(names, "cuda", samples=21, calls=200)
print(f"load {os.getloadavg()}")
print(f"{'variant':36} {'us/call':>9} {'over eager':>11}  note")
for n in names:
    r = res.get(n, {})
    us, ov = r.get("us_per_call"), r.get("overhead_us")
    print(f"{n:36} {us if us is None else round(us, 1)!s:>9} {ov if ov is None else round(ov, 1)!s:>11}"
          f"  {r.get('note', '')}")
PY
  echo "overhead rc=$?" >>"$OUT/overhead.txt"; cat "$OUT/overhead.txt"; tail -3 "$OUT/overhead.err"
  # 2. the runner: small GPT-2/BERT (batch 4), resnet50 (batch 2); CUDA-event medians and peak
  #    memory; the CUDA-graph backends first, then the inductor reduce-overhead pair (slower to
  #    compile), appended to the same reports
  common=(--device cuda --size small --models gpt2,bert,resnet50 --iters 40 --warmup 3
          --max-seconds 3 --compile-probes none --no-overhead --out "$OUT/bench" --append)
  A="eager,ember-cudagraphs,torch-cudagraphs,ember-aot-eager@reduce-overhead"
  B="eager,ember-inductor@reduce-overhead,torch-inductor@reduce-overhead"
  for run in "infer A 70 50" "train A 80 55" "infer B 45 25" "train B 45 25"; do
    set -- $run
    backends=$A; [ "$2" = B ] && backends=$B
    timeout "$3" python3 -m benchmarks run --mode "$1" --backends "$backends" --deadline "$4" \
      "${common[@]}" >"$OUT/bench-$1-$2.log" 2>&1
    echo "$1 $2 rc=$?" >>"$OUT/bench-$1-$2.log"
    grep -E "ms|rc=|failed|skipped" "$OUT/bench-$1-$2.log" | tail -12
  done
  ls "$OUT/bench" 2>/dev/null
fi
if [ "$what" = crash ]; then
  timeout 300 python3 scripts/gpu_cudagraphs_crash.py 2>&1 | tee "$OUT/crash.txt"
fi
exit $rc
