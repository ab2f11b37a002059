#!/usr/bin/env bash
# One device call running several GPU scripts, everything packed into $OUT/all.tgz (the device
# tool brings back at most 8 files):   bash scripts/gpu_batch.sh "PART1" "PART2" ...
# Each PART is a shell command run with OUT set to its own folder under /tmp/gpu_batch.
set -uo pipefail
FINAL="${OUT:-$PWD/gpu_out}"; mkdir -p "$FINAL"
W=/tmp/gpu_batch; rm -rf "$W"; mkdir -p "$W"
# Wheels carried in .whl (expecttest for torch's OpInfo database), as the device README says
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
# The device's site-packages come without bytecode files and cannot take them: every fresh process
# would compile torch's modules from source (about 3 s per process, measured in the startup
# times). A user's install has them: keep them in a writable prefix, filled once here.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-/tmp/pycache}"
python3 -c "import torch, torch._dynamo, torch._inductor.codecache, triton, sympy, transformers" \
  >/dev/null 2>&1 || true
i=0
for part in "$@"; do
  i=$((i + 1)); d="$W/part$i"; mkdir -p "$d"
  echo "== part $i: $part ($(date +%T))" | tee -a "$FINAL/batch.txt"
  t0=$(date +%s)
  ( export OUT="$d"; eval "$part" ) > "$d/console.log" 2>&1
  echo "   rc=$? in $(( $(date +%s) - t0 ))s" | tee -a "$FINAL/batch.txt"
  tail -25 "$d/console.log" >> "$FINAL/batch.txt"
done
tar -czf "$FINAL/all.tgz" -C "$W" .
