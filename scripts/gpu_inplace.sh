#!/usr/bin/env bash
# The inplace helper's GPU check (one H200 or H100, torch 2.11, Triton 3.6, Python 3.12, no
# internet; under 6 minutes; everything under $OUT):
#   bash scripts/gpu_inplace.sh
#   summary.txt    versions, GPU, the table below
#   inplace.md     scripts/gpu_inplace.py: peak memory one inference call adds over the weights
#                  (max_memory_allocated) for GPT-2 124M, BERT-base (16 x 512) and resnet50 (64 x
#                  224^2), float32: Ember with in-place kernel results, Ember without them
#                  (plan_in_place off), torch.compile where time is left; each output's largest
#                  difference from eager
# Expected: Ember's peak lower with in-place results than without (the wrapper plans of a GPT-2
# block and a conv bottleneck: 888 -> 504 and 98 -> 61 MiB); errors as without.
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
unset TRITON_INTERPRET
export PYTHONPATH="$PWD:$PWD/core:$PWD/plugins/inductor:$PWD/plugins/eager:$PWD/plugins/aot_eager:$PWD/plugins/cudagraphs:${PYTHONPATH:-}"
{
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
} >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
timeout 340 python3 scripts/gpu_inplace.py --out "$OUT" --deadline 320 > "$OUT/inplace.log" 2>&1
echo "gpu_inplace rc=$?" | tee -a "$OUT/summary.txt"
cat "$OUT/inplace.md" >> "$OUT/summary.txt" 2>/dev/null || tail -30 "$OUT/inplace.log" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit 0
