#!/usr/bin/env bash
# Set up (scripts/setup.sh, idempotent), then compile Ember's bundled model with the default
# backend (inductor) and print, side by side: accuracy against an fp64 reference, median ms per
# call and speedup over eager, for eager PyTorch, Ember and torch.compile (the peer), plus each
# compiler's cold and warm compile seconds in fresh processes (benchmarks/demo.py).
# Extra arguments go to `python -m benchmarks demo`, e.g.  bash scripts/demo.sh --no-probes
# The product's own demo (eager comparison only) is `python -m ember demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" -m ember backends
echo
exec "$ROOT/.venv/bin/python" -m benchmarks demo "$@"
