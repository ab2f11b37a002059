#!/usr/bin/env bash
# Set up Ember's development environment in .venv (idempotent; fast when already done).
#
#   1. .venv from python3 (3.11 or 3.12; override with PYTHON=/path/to/python)
#   2. torch==2.13.0 FIRST: anything torch-dependent installed before it would pull a
#      multi-GB CUDA build of torch instead of the CPU build this project pins
#   3. ember (core) and every first-party plugin under plugins/ (each folder with a
#      pyproject.toml), editable, with the dependencies their pyprojects declare
#   4. test and benchmark tools: pytest, hypothesis, transformers (pinned: tests/hf/oracle.json
#      holds torch.compile's graph counts for that version), matplotlib, pytest-timeout,
#      expecttest (torch.testing._internal, imported by the OpInfo sweep, needs it), triton
#      (the inductor GPU target's code generator, run on the CPU by its interpreter in tests)
#
# A stamp in .venv records what was installed; a second run with unchanged inputs does nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.ember-setup-stamp"
TORCH_VERSION="2.13.0"
TEST_DEPS=(pytest hypothesis "transformers==5.24.0" matplotlib pytest-timeout expecttest
           "triton==3.9.0")

log() { echo "[setup] $*" >&2; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "error: $PYTHON not found; install Python 3.11 or 3.12 (or set PYTHON=...)"
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)'; then
    log "error: $("$PYTHON" -V 2>&1) is too old: Ember needs Python 3.11 or 3.12"
    exit 1
fi

# What the stamp covers: this script, every pyproject, and the interpreter.
want="$( { cat "$ROOT/scripts/setup.sh" "$ROOT"/core/pyproject.toml "$ROOT"/plugins/*/pyproject.toml
           "$PYTHON" -VV; } | sha256sum | cut -d' ' -f1)"
if [ -x "$VPY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
        && "$VPY" -c 'import torch, ember, pytest' >/dev/null 2>&1; then
    log "up to date ($VENV)"
    exit 0
fi

t0=$SECONDS
if [ ! -x "$VPY" ]; then
    log "creating $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }

if "$VPY" -c "import sys, torch; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" >/dev/null 2>&1; then
    log "torch $TORCH_VERSION already installed"
else
    log "installing torch==$TORCH_VERSION (first, so nothing pulls another build)"
    pip install "torch==$TORCH_VERSION"
fi

# setuptools/wheel in the venv: the tests pip-install fixture plugins with --no-build-isolation.
log "installing build tools, ember and its plugins (editable)"
pip install --upgrade "setuptools>=61" wheel
editables=(-e ./core)
for d in plugins/*/; do
    [ -f "$d/pyproject.toml" ] && editables+=(-e "./${d%/}")
done
pip install "${editables[@]}"

log "installing test tools: ${TEST_DEPS[*]}"
pip install "${TEST_DEPS[@]}"

# The pin must have survived: a dependency resolver may not replace torch.
"$VPY" -c "import sys, torch; v = torch.__version__; print('[setup] torch', v, file=sys.stderr); sys.exit(0 if v.split('+')[0] == '$TORCH_VERSION' else 1)"
"$VPY" -m ember backends >&2
# Ember's guard extension (ember/capture/tensor_check.py), built once against this torch; a
# machine without a compiler keeps the Python check (the line says why)
"$VPY" -c "from ember.capture import tensor_check as t; import sys; print('[setup] tensor check:', 'C++' if t.extension(wait=300) is not None else 'Python (' + t.state() + ')', file=sys.stderr)"
echo "$want" > "$STAMP"
log "done in $((SECONDS - t0)) s"
