#!/usr/bin/env bash
# One short device call: warm starts on the GPU after the AOT cache learned CUDA graphs, whether a
# CUDA hit computes eager's result, and the whole reason of the MoE training fallbacks.
#   1. cold and warm compile of GPT-2 and BERT inference (bf16 autocast, full size), fresh processes
#   2. BERT (small) training step twice in one cache: the second run's graphs come from the AOT
#      cache (its "AOT s" column), checked by the accuracy rule
#   3. mixtral training through inductor on CUDA (the corpus' fallback), reasons printed whole
#   OUT=... bash scripts/gpu_warm.sh      (about 4 minutes)
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
export EMBER_CACHE_DIR=/tmp/ember_warm_cache
source scripts/gpu_env.sh
(nvidia-smi -L; python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)") >"$OUT/env.txt" 2>&1
timeout 140 python3 -m benchmarks run --device cuda --mode infer --amp --models gpt2,bert \
  --backends ember-inductor --iters 5 --max-seconds 2 --compile-probes cold,warm --deadline 120 \
  --no-overhead --out "$OUT/probes" >"$OUT/probes.log" 2>&1
echo "probes rc=$?"
for i in 1 2; do
  timeout 45 python3 -m benchmarks run --device cuda --mode train --amp --size small --models bert \
    --backends eager,ember-inductor --iters 10 --max-seconds 2 --compile-probes none --no-overhead \
    --out "$OUT/train$i" >"$OUT/train$i.log" 2>&1
  echo "train run $i rc=$?"
done
EMBER_TRITON_COMPILE_WORKERS=2 timeout 45 python3 scripts/gpu_hf_corpus.py --budget 30 --modes train \
  mixtral >"$OUT/moe.log" 2>&1
echo "moe rc=$?"
cat "$OUT/env.txt"
grep -h -E "^\| (gpt2|bert) |warm compile" "$OUT"/probes/*.md "$OUT"/train*/*.md
grep -h -E "^\||SUMMARY|FALLBACK" "$OUT/moe.log" | cut -c1-2000
