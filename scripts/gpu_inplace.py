"""Peak GPU memory of inference with and without in-place kernel results (scheduler.plan_in_place),
against torch.compile and eager (run by scripts/gpu_inplace.sh; each run in a fresh process with
fresh caches).

    python scripts/gpu_inplace.py --out DIR [--deadline SECONDS]

For GPT-2 124M (16 x 512), BERT-base (16 x 512) and resnet50 (64 x 3 x 224 x 224), float32,
``torch.no_grad()``: ``ember`` (Ember's inductor), ``ember_no_inplace`` (the same with
``plan_in_place`` returning nothing), ``torch`` (torch.compile's inductor, where time is left).
Each child compiles, runs twice (warm-up), then measures the memory one call adds over the
resident weights (``benchmarks.measure.peak_memory_mb``: ``max_memory_allocated`` after a peak
reset), and the largest difference from eager's output. Results: ``RESULT`` lines,
``<out>/inplace.json`` and ``<out>/inplace.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys
sys.path.insert(0, os.environ["EMBER_ROOT"])
import torch
from benchmarks import zoo
from benchmarks.measure import peak_memory_mb
case, variant = sys.argv[1], sys.argv[2]
# a CPU smoke run of this script (INPLACE_DEVICE=cpu): small models, Triton's interpreter
dev = os.environ.get("INPLACE_DEVICE", "cuda")
model, args = getattr(zoo, "_build_" + case)(dev, "full" if dev == "cuda" else "small")
model.eval()
def out_of(o):
    o = o.logits if hasattr(o, "logits") else o
    o = o.last_hidden_state if hasattr(o, "last_hidden_state") else o
    return o[0] if isinstance(o, (tuple, list)) else o
with torch.no_grad():
    ref = out_of(model(*args)).float()
    if variant == "torch":
        fn = torch.compile(model)
    else:
        import ember
        if variant == "ember_no_inplace":
            import ember_inductor.scheduler as sched
            sched.plan_in_place = lambda s, outputs: {}
        opts = {} if dev == "cuda" else {"cpu_codegen": "triton"}
        fn = ember.compile(model, backend="inductor", options=opts)
    for _ in range(2):
        got = out_of(fn(*args)).float()
    if dev == "cuda":
        torch.cuda.synchronize()
    peak = peak_memory_mb(lambda: fn(*args), dev) or 0.0
err = float((got - ref).abs().max())
print("RESULT " + json.dumps({"case": case, "variant": variant, "peak_mib": round(peak, 1),
                               "max_abs_err": err, "ref_max": float(ref.abs().max())}))
"""


def run(case: str, variant: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EMBER_ROOT=str(ROOT), EMBER_CACHE_DIR=f"{tmp}/ember",
                   TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton")
        t = time.time()
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, case, variant], env=env,
                               capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"case": case, "variant": variant, "error": f"timeout {timeout:.0f}s"}
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                r["seconds"] = round(time.time() - t, 1)
                return r
        return {"case": case, "variant": variant, "error": (p.stderr or p.stdout)[-1500:]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=300.0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows = []
    # Ember with and without, model by model (the comparison this script is for), then
    # torch.compile
    models = ("gpt2", "resnet50", "bert")
    order = [(c, v) for c in models for v in ("ember", "ember_no_inplace")]
    order += [(c, "torch") for c in models]
    for case, variant in order:
        left = a.deadline - (time.time() - t0)
        if left < 30:
            rows.append({"case": case, "variant": variant, "error": "skipped: no time left"})
            continue
        r = run(case, variant, min(left - 5, 150))
        print("RESULT " + json.dumps(r), flush=True)
        rows.append(r)
    (out / "inplace.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | variant | peak MiB | max abs err (ref max) | s |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['variant']} | error: "
                         f"{r['error'].splitlines()[-1][:80] if r['error'] else ''} | | |")
        else:
            lines.append(f"| {r['case']} | {r['variant']} | {r['peak_mib']} | "
                         f"{r['max_abs_err']:.3g} ({r['ref_max']:.3g}) | {r['seconds']} |")
    (out / "inplace.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
