#!/usr/bin/env bash
# One device call (about 6 minutes): the profiles behind the GPU gaps still open.
#   1. mixtral training through inductor on CUDA with EMBER_VERBOSE=1 (the fallback's traceback)
#   2. resnet50 inference, small (batch 2): Ember's generated code (EMBER_LOGS=output_code) and
#      the top kernels of eager / Ember / torch.compile (the reduce-overhead gap: 1.29 vs 0.92 ms)
#   3. BERT training, small, and GPT-2 training, full: top kernels side by side
#   OUT=... bash scripts/gpu_profiles.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT/profile"
export EMBER_CACHE_DIR=/tmp/ember_prof_cache
source scripts/gpu_env.sh
EMBER_VERBOSE=1 EMBER_TRITON_COMPILE_WORKERS=2 timeout 60 python3 scripts/gpu_hf_corpus.py \
  --budget 40 --modes train mixtral >"$OUT/moe_verbose.log" 2>&1
echo "moe rc=$?"
EMBER_LOGS=output_code timeout 110 python3 scripts/gpu_profile.py --model resnet50 --mode infer \
  --size small --out "$OUT/profile" --top 50 >"$OUT/profile_resnet50.log" 2>&1
echo "resnet50 rc=$?"
timeout 100 python3 scripts/gpu_profile.py --model bert --mode train --size small \
  --out "$OUT/profile" --top 50 >"$OUT/profile_bert.log" 2>&1
echo "bert rc=$?"
timeout 130 python3 scripts/gpu_profile.py --model gpt2 --mode train --size full \
  --out "$OUT/profile" --top 80 >"$OUT/profile_gpt2.log" 2>&1
echo "gpt2 rc=$?"
grep -h -A4 "bf16 autocast" "$OUT"/profile/*.txt
