#!/usr/bin/env bash
# Set up (scripts/setup.sh, idempotent), then compile Ember's bundled model and print
# correctness (max abs diff vs eager PyTorch) and speed (median ms per call, eager vs Ember).
# Extra arguments go to `python -m ember demo`, e.g.  bash scripts/demo.sh --backend eager
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" -m ember backends
echo
exec "$ROOT/.venv/bin/python" -m ember demo "$@"
