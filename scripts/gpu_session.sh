#!/usr/bin/env bash
# One device call of a GPU session (issues 20 and 22), everything under $OUT, packed into
# $OUT/all.tgz (the device tool brings back few files):   bash scripts/gpu_session.sh a|b|c
#   a  correctness, in parallel after the launch figures: launch overhead and bandwidth alone
#      (check_launch/), then at once: tests/inductor_triton and tests/cudagraphs on CUDA, the
#      rest of scripts/gpu_triton_check.py, the OpInfo sweep on CUDA through inductor (6 shards)
#      and through torch.compile's inductor (the oracle, 3 shards), and the Hugging Face corpus
#      through inductor, eval and train (5 shards). Every part has a deadline: about 520 s.
#   b  the benchmark tables, alone on the machine: inference (GPT-2, BERT, resnet50, ViT-B/16)
#      and training (GPT-2, BERT, resnet50), bf16 autocast, eager vs Ember vs torch.compile.
#   c  cold and warm compile in fresh processes (GPT-2, BERT, resnet50), then profiles: GPT-2
#      training at full size, and mode="reduce-overhead" training (BERT, GPT-2, small sizes).
#   ab a with deadlines of about 190 s, then the inference table (GPT-2, BERT, resnet50).
set -uo pipefail
what="${1:-a}"
OUT="${OUT:-$PWD/gpu_out}"; mkdir -p "$OUT"
W=/tmp/gpu_session_$what; rm -rf "$W"; mkdir -p "$W"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPATH="$PWD:$PWD/core:$PWD/plugins/inductor:$PWD/plugins/eager:$PWD/plugins/aot_eager:$PWD/plugins/cudagraphs"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e ./core -e ./plugins/eager \
  -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs >"$W/install.log" 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then  # expecttest, for torch's OpInfo database
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    >>"$W/install.log" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONPYCACHEPREFIX=/tmp/pycache
unset TRITON_INTERPRET
(nvidia-smi -L; python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"; lscpu | grep 'Model name'; nproc) >"$W/env.txt" 2>&1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/summary.txt"; }

# ab: a, shortened (deadlines about 200 s), then b's inference table (GPT-2, BERT, resnet50)
S=${SHORT:-0}; [ "$what" = ab ] && S=1
DL=330; [ "$S" = 1 ] && DL=190; DL=${DL_OVERRIDE:-$DL}
case "$what" in
a|ab)
  timeout 120 python3 scripts/gpu_triton_check.py --parts launch,bandwidth --out "$W/check_launch" \
    >"$W/check_launch.log" 2>&1
  stamp "launch/bandwidth rc=$?"
  EMBER_TRITON_DEVICE=cuda timeout $((DL + 60)) python3 -m pytest -q -p no:cacheprovider \
    tests/inductor_triton >"$W/tests_triton.log" 2>&1 &
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/cudagraphs >"$W/tests_cg.log" 2>&1 &
  timeout $((DL + 60)) python3 scripts/gpu_triton_check.py --parts warm,zoo_small,zoo_full \
    --out "$W/check_rest" >"$W/check_rest.log" 2>&1 &
  for k in 0 1 2 3 4 5; do
    EMBER_TRITON_COMPILE_WORKERS=0 timeout $((DL + 80)) python3 tests/opinfo/sweep.py --device cuda \
      --backends inductor --samples 3 --shard $k/6 --deadline $DL --time-limit 60 \
      --out "$W/sweep_ember_$k.json" >"$W/sweep_ember_$k.log" 2>&1 &
  done
  for k in 0 1 2; do
    TORCHINDUCTOR_COMPILE_THREADS=1 timeout $((DL + 80)) python3 tests/opinfo/sweep.py --device cuda \
      --oracle inductor --samples 3 --shard $k/3 --deadline $DL --time-limit 60 \
      --out "$W/sweep_torch_$k.json" >"$W/sweep_torch_$k.log" 2>&1 &
  done
  for k in 0 1 2 3 4; do
    EMBER_TRITON_COMPILE_WORKERS=2 timeout $((DL + 70)) python3 scripts/gpu_hf_corpus.py --budget $DL \
      --shard $k/5 >"$W/hf_$k.log" 2>&1 &
  done
  wait
  stamp "all parts done"
  grep -h -E "passed|failed" "$W"/tests_*.log | tail -4 >>"$W/summary.txt"
  grep -h -E "samples\)|reached" "$W"/sweep_*.log >>"$W/summary.txt"
  grep -h SUMMARY "$W"/hf_*.log >>"$W/summary.txt"
  grep -h RESULT "$W"/check_*.log | cut -c1-600 >>"$W/summary.txt"
  if [ "$what" = ab ]; then
    timeout $((DL + 40)) python3 -m benchmarks run --device cuda --mode infer --amp \
      --models gpt2,bert,resnet50 --backends eager,ember-inductor,torch-inductor \
      --deadline $((DL - 40)) --no-overhead --compile-probes none --out "$W/bench" >"$W/bench_infer.log" 2>&1
    stamp "infer rc=$?"
    grep -h -E "ms|x " "$W"/bench_infer.log | tail -20 >>"$W/summary.txt"
  fi
  ;;
b)
  timeout 250 python3 -m benchmarks run --device cuda --mode infer --amp \
    --models gpt2,bert,resnet50,vit_b16 --backends eager,ember-inductor,torch-inductor \
    --deadline 200 --no-overhead --compile-probes none --out "$W/bench" >"$W/bench_infer.log" 2>&1
  stamp "infer rc=$?"
  timeout 300 python3 -m benchmarks run --device cuda --mode train --amp \
    --models gpt2,bert,resnet50 --backends eager,ember-inductor,torch-inductor \
    --deadline 250 --no-overhead --compile-probes none --out "$W/bench" >"$W/bench_train.log" 2>&1
  stamp "train rc=$?"
  grep -h -E "ms|x " "$W"/bench_*.log | tail -30 >>"$W/summary.txt"
  ;;
c)
  timeout 300 python3 -m benchmarks run --device cuda --mode infer --amp \
    --models gpt2,bert,resnet50 --backends eager,ember-inductor,torch-inductor --iters 20 \
    --max-seconds 5 --compile-probes cold,warm --deadline 240 --no-overhead \
    --out "$W/probes" >"$W/probes.log" 2>&1
  stamp "probes rc=$?"
  # GPT-2 training at full size (Ember's Triton kernels: ~17 ms a step against torch.compile's
  # ~6.6 ms on 2026-12-07) with every kernel named, then reduce-overhead at small sizes
  timeout 100 python3 scripts/gpu_profile.py --model gpt2 --mode train --size full \
    --out "$W/profile" --top 80 >"$W/profile_gpt2_full.log" 2>&1
  stamp "profile gpt2 full rc=$?"
  for m in bert gpt2; do
    timeout 100 python3 scripts/gpu_profile.py --model $m --mode train --size small \
      --compile-mode reduce-overhead --out "$W/profile" --top 60 >"$W/profile_$m.log" 2>&1
    stamp "profile $m rc=$?"
  done
  grep -h -E "ms|cold|warm" "$W"/probes.log | tail -30 >>"$W/summary.txt"
  grep -h -A4 "bf16 autocast" "$W"/profile/*.txt >>"$W/summary.txt" 2>/dev/null
  ;;
esac
cp "$W/summary.txt" "$W/env.txt" "$OUT/" 2>/dev/null
tar -czf "$OUT/all.tgz" -C "$W" .
cat "$W/env.txt" "$W/summary.txt"
