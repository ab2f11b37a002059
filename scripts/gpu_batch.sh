#!/usr/bin/env bash
# One device call running several GPU scripts, everything packed into $OUT/all.tgz (the device
# tool brings back at most 8 files):   bash scripts/gpu_batch.sh "PART1" "PART2" ...
# Each PART is a shell command run with OUT set to its own folder under /tmp/gpu_batch.
set -uo pipefail
FINAL="${OUT:-$PWD/gpu_out}"; mkdir -p "$FINAL"
W=/tmp/gpu_batch; rm -rf "$W"; mkdir -p "$W"
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
