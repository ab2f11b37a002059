#!/usr/bin/env bash
# Multi-GPU distributed run (needs a machine with >= 2 GPUs; not lent as of 2026-12-04):
# GPT-2 124M under DDP and under FSDP2 (bf16 MixedPrecisionPolicy) with NCCL on 2 GPUs,
# eager vs Ember (aot_eager, inductor) vs torch.compile: step time, peak memory, first-step
# seconds, first losses, Ember's graph/split counts. Then the CPU distributed tests (gloo).
# Logs and tables under $OUT (or ./gpu_out).
#   bash scripts/gpu_dist.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  -e ./core -e ./plugins/eager -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs \
  >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $ngpu" | tee "$OUT/env.txt"
nvidia-smi -L >>"$OUT/env.txt" 2>&1
rc=0
if [ "$ngpu" -lt 2 ]; then
  echo "blocked: this machine has $ngpu GPU(s); the NCCL runs need 2" | tee -a "$OUT/env.txt"
else
  for mode in ddp fsdp; do
    timeout "${RUN_TIMEOUT:-150}" torchrun --standalone --nproc-per-node 2 scripts/gpu_dist.py \
      --mode "$mode" --out "$OUT" >"$OUT/gpu_dist_$mode.log" 2>&1
    r=$?; [ $r -ne 0 ] && { echo "$mode: exit $r (see gpu_dist_$mode.log)"; rc=$r; }
    cat "$OUT/gpu_dist_$mode.md" 2>/dev/null || tail -30 "$OUT/gpu_dist_$mode.log"
  done
fi
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/distributed \
  tests/aot/test_checkpoint.py 2>&1 | tee "$OUT/tests_distributed.log" | tail -5
exit $rc
