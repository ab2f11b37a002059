"""Why mixtral / qwen2_moe / olmoe training falls back on CUDA only (issue 20's HF corpus):
one training step of each through a backend with internal errors raised, not swallowed, and the
whole traceback printed (the op whose decomposition or meta function guards on a data-dependent
value).

    EMBER_HF_DEVICE=cuda python3 scripts/gpu_moe_debug.py [--backend inductor] [names]
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("names", nargs="*", default=["mixtral"])
    a = ap.parse_args()
    os.environ.setdefault("EMBER_HF_DEVICE", "cuda")
    warnings.filterwarnings("ignore")
    import ember
    from tests.hf import harness, models

    ember.config.suppress_errors = False
    for name in a.names:
        model, inputs = harness.build(name, "train")
        ember.reset()
        f = ember.compile(model, backend=a.backend)
        try:
            out = f(**inputs)
            models.loss_of(out).backward()
            print(f"{name} {a.backend}: ok", flush=True)
        except BaseException:
            print(f"{name} {a.backend}: FAILED", flush=True)
            traceback.print_exc(file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
