"""Bisect the training crash of docs/cudagraphs.md (Known problems) on the GPU machine.

On the H200 (2026-12-04), GPT-2 training steps of ember-cudagraphs, torch-cudagraphs and
ember-aot-eager@reduce-overhead models timed interleaved in one process died with
``CUDA error: unspecified launch failure``; each alone passes the tests. This runs each
combination in its own process (``CUDA_LAUNCH_BLOCKING=1``, a timeout each), the models built
as the benchmark runner builds them (one deep copy per backend), steps interleaved as its timing
loop does, and prints one line per combination: ok (and the largest gradient difference from
eager over the steps) or the error's last lines. Suspects it separates: two Ember recordings of
one graph id (the two Ember models share their graphs' ids: the forward registry that pairs a
backward with its forward's pool is keyed by that id), Ember beside torch's CUDA graph trees.

    python3 scripts/gpu_cudagraphs_crash.py            # every combination (about 3 minutes)
    python3 scripts/gpu_cudagraphs_crash.py one ember-cudagraphs,torch-cudagraphs
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

COMBOS = [
    "ember-cudagraphs",
    "ember-cudagraphs,ember-cudagraphs",
    "ember-aot-eager@reduce-overhead,ember-aot-eager@reduce-overhead",
    "ember-cudagraphs,ember-aot-eager@reduce-overhead",
    "ember-cudagraphs,torch-cudagraphs",
    "torch-cudagraphs,ember-aot-eager@reduce-overhead",
    "ember-cudagraphs,torch-cudagraphs,ember-aot-eager@reduce-overhead",
]


def one(combo: str, steps: int = 12) -> int:
    import copy

    import torch

    sys.path.insert(0, os.getcwd())
    from benchmarks.backends import make_compiled
    from benchmarks.zoo import get_spec, reduce_to_loss

    base, inputs = get_spec("gpt2").build("cuda", "small")
    names = combo.split(",")
    ref = copy.deepcopy(base)
    models = [copy.deepcopy(base) for _ in names]
    fns = [make_compiled(n, m) for n, m in zip(names, models)]

    def step(fn, m):
        for p in m.parameters():
            p.grad = None
        loss = reduce_to_loss(fn(*inputs))
        loss.backward()
        return loss.detach()

    step(ref, ref)
    want = {n: p.grad.clone() for n, p in ref.named_parameters() if p.grad is not None}
    worst = 0.0
    for s in range(steps):
        for name, fn, m in zip(names, fns, models):
            step(fn, m)
            torch.cuda.synchronize()
            for n, p in m.named_parameters():
                if n in want and p.grad is not None:
                    worst = max(worst, (p.grad.float() - want[n].float()).abs().max().item())
    print(f"ok after {steps} interleaved steps; largest gradient difference from eager {worst:.3g}")
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "one":
        return one(sys.argv[2])
    combos = sys.argv[1:] or COMBOS
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1")
    for combo in combos:
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "one", combo], env=env,
                               capture_output=True, text=True, timeout=90)
            ok = [ln for ln in p.stdout.splitlines() if ln.startswith("ok after")]
            tail = (p.stdout + p.stderr).strip().splitlines()
            verdict = ok[-1] if p.returncode == 0 and ok else \
                f"rc={p.returncode}: " + " | ".join(tail[-6:])
        except subprocess.TimeoutExpired:
            verdict = "timeout (90 s)"
        print(f"{combo:70} {time.time() - t0:5.1f}s  {verdict}"[:1500], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
