#!/usr/bin/env bash
# One device call (about 6 minutes): the profiles behind the GPU gaps still open.
#   1. BERT training (small, fp32) under mode="reduce-overhead": device kernels and host time of
#      eager / Ember / torch.compile (the 1.90 vs 1.63 ms row of the CUDA-graph table)
#   2. resnet50 inference (batch 2, fp32) under reduce-overhead (1.13 vs 1.01 ms)
#   3. GPT-2 training (full, bf16 autocast) with Ember's generated code (EMBER_LOGS=output_code)
#      so that its largest Triton kernels can be mapped to their ops
#   OUT=... bash scripts/gpu_profiles.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT/profile"
export EMBER_CACHE_DIR=/tmp/ember_prof_cache
source scripts/gpu_env.sh
timeout 120 python3 scripts/gpu_profile.py --model bert --mode train --size small --dtype fp32 \
  --compile-mode reduce-overhead --out "$OUT/profile" --top 40 >"$OUT/profile_bert_ro.log" 2>&1
echo "bert rc=$?"
timeout 110 python3 scripts/gpu_profile.py --model resnet50 --mode infer --size small --dtype fp32 \
  --compile-mode reduce-overhead --out "$OUT/profile" --top 40 >"$OUT/profile_resnet50_ro.log" 2>&1
echo "resnet50 rc=$?"
EMBER_LOGS=output_code timeout 150 python3 scripts/gpu_profile.py --model gpt2 --mode train \
  --size full --out "$OUT/profile" --top 60 >"$OUT/profile_gpt2.log" 2>&1
echo "gpt2 rc=$?"
grep -h -A4 -E "(bf16|fp32), mode" "$OUT"/profile/*.txt
