#!/usr/bin/env bash
# The CPU tables of docs/benchmarks.md (issue 21) in one go: the zoo and the wide corpus, inference
# and training, eager vs Ember's inductor (native build and the AVX2 build, x86-64-v3) vs
# torch.compile's inductor in one process per run; cold/warm compile probes for the zoo's
# inference. Then `python -m benchmarks summary` prints the combined tables (one per Ember build).
#
#   bash scripts/cpu_tables.sh [OUT]     # OUT defaults to docs/benchmarks; about 40 min on 2 quiet cores
#
# Set THREADS=1 for one thread (a loaded machine); EMBER_CACHE_DIR is a fresh directory per run
# of this script, so every speed choice and the OpenMP calibration are timed on this machine now.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-docs/benchmarks}"
PY="$ROOT/.venv/bin/python"
export EMBER_CACHE_DIR="${EMBER_CACHE_DIR:-$(mktemp -d /tmp/ember-tables.XXXXXX)}"
if [ -n "${THREADS:-}" ]; then export OMP_NUM_THREADS="$THREADS"; fi
B=eager,ember-inductor,ember-inductor+x86-64-v3,torch-inductor
C="--device cpu --backends $B --no-overhead --out $OUT --iters ${ITERS:-20} --max-seconds ${MAX_SECONDS:-8}"
P="--probe-backends ember-inductor,ember-inductor+x86-64-v3,torch-inductor"
lscpu | grep -E "Model name|^CPU\(s\)" || true
uptime
"$PY" -m benchmarks run $C --mode infer --corpus zoo --tag inductor --compile-probes cold,warm $P \
    --deadline "${DEADLINE_ZOO_INFER:-1500}"
"$PY" -m benchmarks run $C --mode infer --corpus wide --compile-probes none --deadline 600
"$PY" -m benchmarks run $C --mode train --corpus zoo --tag inductor --compile-probes none --deadline 900
"$PY" -m benchmarks run $C --mode train --corpus wide --compile-probes none --deadline 600
uptime
"$PY" -m benchmarks summary "$OUT/cpu-infer-inductor.json" "$OUT/cpu-train-inductor.json" > "$OUT/cpu-summary-zoo.md"
"$PY" -m benchmarks summary "$OUT/cpu-infer-wide.json" "$OUT/cpu-train-wide.json" > "$OUT/cpu-summary-wide.md"
cat "$OUT/cpu-summary-zoo.md" "$OUT/cpu-summary-wide.md"
