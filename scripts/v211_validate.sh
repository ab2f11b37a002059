#!/usr/bin/env bash
# Validate Ember against torch 2.11 on a machine WITHOUT a GPU (the GPU machine runs torch 2.11 on
# Python 3.12; it is often unavailable). Not part of CI.
#
#   bash scripts/v211_validate.sh setup        # create the venv (once)
#   bash scripts/v211_validate.sh tests        # capture, breaks, core, aot, dynamic suites
#   bash scripts/v211_validate.sh hf           # the Hugging Face corpus (eval and train)
#   bash scripts/v211_validate.sh all          # setup + tests + hf
#   bash scripts/v211_validate.sh pytest ARGS  # any pytest command line in the 2.11 venv
#
# setup creates $V211 (default /tmp/v211) from $PYTHON (default python3; 3.11 or 3.12) with
# torch==2.11.0 and transformers==5.17.0 (the GPU machine's versions), pytest, hypothesis,
# pytest-xdist, pytest-timeout and expecttest, plus Ember's core and plugins installed editable
# from this checkout (so edits are live in this venv and in .venv alike).
#
# DOWNLOAD SIZE: the torch 2.11 wheel on PyPI is a CUDA build; with its nvidia-* dependencies it
# downloads about 4.7 GB (the venv is about 5 GB). It runs on the CPU: ignore the CUDA warnings.
# (The CPU-only wheel from https://download.pytorch.org/whl/cpu is a few hundred MB, where that
# index is reachable: TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/v211_validate.sh setup)
#
# The machine has few cores: the suites run one after another with 2 xdist workers (V211_WORKERS
# to change) and a per-test timeout; V211_SUITES="tests/dynamic tests/aot" runs only those. Logs go
# to $OUT (default /tmp/v211_out, outside the checkout): env.txt, one <suite>.log per suite, hf.log.
# The HF corpus compares graph counts with torch.compile's on the running torch: tests/hf picks
# the oracle file for torch 2.11 (tests/hf/oracle-2.11.json) by itself.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
V211="${V211:-/tmp/v211}"
VPY="$V211/bin/python"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-/tmp/v211_out}"
WORKERS="${V211_WORKERS:-2}"
TORCH_VERSION="2.11.0"
TRANSFORMERS_VERSION="5.17.0"
log() { echo "[v211] $*" >&2; }

setup() {
    if [ -x "$VPY" ] && "$VPY" -c "import sys, torch, ember, transformers, pytest, xdist
sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" >/dev/null 2>&1; then
        log "up to date ($V211)"
        return 0
    fi
    [ -x "$VPY" ] || { log "creating $V211 with $("$PYTHON" -V 2>&1)"; "$PYTHON" -m venv "$V211"; }
    pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }
    # torch first: nothing installed later may pull another torch
    log "installing torch==$TORCH_VERSION (about 4.7 GB with its CUDA libraries)"
    if [ -n "${TORCH_INDEX:-}" ]; then
        pip install "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX" || return 1
    else
        pip install "torch==$TORCH_VERSION" || return 1
    fi
    pip install --upgrade "setuptools>=61" wheel || return 1
    pip install -e ./core -e ./plugins/eager -e ./plugins/aot_eager -e ./plugins/inductor \
        -e ./plugins/cudagraphs || return 1
    pip install "transformers==$TRANSFORMERS_VERSION" pytest hypothesis pytest-xdist \
        pytest-timeout expecttest || return 1
    "$VPY" -c "import sys, torch; v = torch.__version__; print('[v211] torch', v, file=sys.stderr)
sys.exit(0 if v.split('+')[0] == '$TORCH_VERSION' else 1)" || { log "torch pin lost"; return 1; }
}

env_txt() {
    mkdir -p "$OUT"
    "$VPY" - <<'PY' 2>/dev/null | tee "$OUT/env.txt"
import sys, torch, transformers, ember
print("python", sys.version.split()[0], "torch", torch.__version__,
      "transformers", transformers.__version__, "backends", ember.list_backends())
PY
}

run_pytest() {  # run_pytest LOGNAME ARGS...
    local name="$1"; shift
    mkdir -p "$OUT"
    "$VPY" -m pytest -n "$WORKERS" -q -p no:cacheprovider --timeout="${TEST_TIMEOUT:-400}" "$@" \
        2>&1 | grep -v -i "cuda" | tee "$OUT/$name.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -60
    return "${PIPESTATUS[0]}"
}

what="${1:-all}"
rc=0
case "$what" in
    setup) setup; exit $? ;;
    pytest) shift; "$VPY" -m pytest "$@"; exit $? ;;
    tests|hf|all) ;;
    *) log "usage: $0 [setup|tests|hf|all|pytest ARGS...]"; exit 2 ;;
esac
if [ "$what" = all ]; then setup || exit 1; fi
[ -x "$VPY" ] || { log "no venv at $V211: run '$0 setup' first"; exit 1; }
env_txt
if [ "$what" = tests ] || [ "$what" = all ]; then
    # in groups, so one slow suite does not hold both workers for the rest
    for suite in ${V211_SUITES:-tests/capture tests/breaks tests/core tests/aot tests/dynamic}; do
        log "$suite"
        run_pytest "$(basename "$suite")" "$suite" || rc=1
    done
fi
if [ "$what" = hf ] || [ "$what" = all ]; then
    log "tests/hf (eval and train)"
    run_pytest hf tests/hf || rc=1
fi
exit $rc
