#!/usr/bin/env bash
# One device call (about 6 minutes): why backend="cudagraphs" is slower than aot_eager under
# mode="reduce-overhead" though both replay one CUDA graph of the same ATen graph (resnet50
# inference 2.79 vs 1.62 ms, GPT-2 0.84 vs 0.60, BERT 0.86 vs 0.56 in the 2026-12-07 table),
# and the reduce-overhead gaps to torch.compile (BERT training, resnet50 inference).
# Each profile: CUDA-event medians and host time per call, CUDA-graph counters, torch.profiler
# tables (device kernels, host ops) per variant.      OUT=... bash scripts/gpu_cg_profiles.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT/profile"
export EMBER_CACHE_DIR=/tmp/ember_prof_cache
source scripts/gpu_env.sh
V=eager,ember-cudagraphs,ember-aot-eager@reduce-overhead,torch-cudagraphs
for m in resnet50 gpt2; do
  timeout 100 python3 scripts/gpu_profile.py --model $m --mode infer --size small --dtype fp32 \
    --variants $V --out "$OUT/profile" --top 30 >"$OUT/profile_${m}_cg.log" 2>&1
  echo "$m variants rc=$?"
done
timeout 100 python3 scripts/gpu_profile.py --model bert --mode train --size small --dtype fp32 \
  --variants eager,ember-cudagraphs,ember-aot-eager@reduce-overhead,ember-inductor@reduce-overhead,torch-inductor@reduce-overhead \
  --out "$OUT/profile" --top 40 >"$OUT/profile_bert_train_ro.log" 2>&1
echo "bert train rc=$?"
timeout 100 python3 scripts/gpu_profile.py --model resnet50 --mode infer --size small --dtype fp32 \
  --variants eager,ember-inductor@reduce-overhead,torch-inductor@reduce-overhead \
  --out "$OUT/profile" --top 40 >"$OUT/profile_resnet50_ro.log" 2>&1
echo "resnet50 ro rc=$?"
grep -h -B1 -A6 -E "(bf16|fp32), mode" "$OUT"/profile/*.txt
grep -h "cudagraphs " "$OUT"/profile_*.log | cut -c1-300
