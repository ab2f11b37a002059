#!/usr/bin/env bash
# Validate Ember on the GPU machine (torch 2.11, Python 3.12): the suites that do not need this
# machine's torch, in parallel, and torch.compile's graph counts for the HF corpus on that torch.
# Run there as:  bash scripts/device_validate.sh   (logs and a summary land in $OUT)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# test-only wheels the machine lacks (expecttest, for torch.testing._internal): carry .whl
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site; fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e core -e plugins/eager \
    -e plugins/aot_eager -e plugins/inductor -e plugins/cudagraphs >/tmp/install.log 2>&1 \
    || { cat /tmp/install.log; exit 1; }
python3 -c "import torch, sys, transformers; print(sys.version, torch.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
T=${T:-540}
P="python3 -m pytest -q -p no:cacheprovider --timeout=400"
( timeout $T $P tests/capture tests/breaks tests/core tests/aot tests/dynamic tests/adversarial -n 5 >"$OUT/core.log" 2>&1; echo "rc=$?" >>"$OUT/core.log" ) &
( timeout $T $P tests/inductor tests/precompile tests/benchmarks -n 4 >"$OUT/inductor.log" 2>&1; echo "rc=$?" >>"$OUT/inductor.log" ) &
( timeout $T $P tests/hf -n 4 >"$OUT/hf.log" 2>&1; echo "rc=$?" >>"$OUT/hf.log" ) &
# torch.compile's counts on this torch, in 3 shards (REGEN=0 skips)
[ "${REGEN:-1}" = 1 ] && NAMES=$(python3 -c "from tests.hf import models; print(' '.join(models.SPECS))")
i=0; [ "${REGEN:-1}" = 1 ] && for shard in $(python3 -c "
import sys; n=sys.argv[1:]; print(' '.join(','.join(n[k::3]) for k in range(3)))" $NAMES); do
  ( EMBER_HF_ORACLE=/tmp/oracle_$i.json timeout $T python3 -m tests.hf.regen_oracle ${shard//,/ } >/tmp/regen_$i.log 2>&1 ) &
  i=$((i+1)); done
( timeout $T python3 scripts/device_diag.py mixtral qwen2_moe >"$OUT/diag.log" 2>&1 ) &
wait
[ "${REGEN:-1}" = 1 ] && cat /tmp/regen_*.log >"$OUT/regen.log"
[ "${REGEN:-1}" = 1 ] && python3 - <<'PY' >"$OUT/oracle.json"
import json, glob
d = {}
for f in sorted(glob.glob("/tmp/oracle_*.json")):
    d.update(json.load(open(f)))
print(json.dumps(d, indent=1, sort_keys=True))
PY
for f in core inductor hf; do echo "== $f"; tail -n 25 "$OUT/$f.log"; done
