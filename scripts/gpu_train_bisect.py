"""Find what makes a zoo model's training step through Ember's inductor fail on the GPU (GPT-2
124M under bf16 autocast: "an illegal memory access" at its first call, 2026-12-06 on an H100).

Each variant runs in a fresh process (a CUDA error poisons its context) with fresh caches and
``CUDA_LAUNCH_BLOCKING=1`` (the error surfaces at the launch that made it), two training steps,
then compares the loss and every gradient with eager's. A failure prints the generated wrapper
lines around the failing call (linecache holds the wrapper's source) and the traceback's end.

    python3 scripts/gpu_train_bisect.py --out DIR [--models gpt2] [--variants default,no_inplace]
        [--deadline SECONDS] [--sanitize small]

Variants: default; no_inplace (scheduler.plan_in_place off); no_pad (pad_mm=False); no_tune
(EMBER_TRITON_TUNE=0: heuristic block sizes); serial (one loader thread, no compile pool);
fp32 (no autocast); small (the model's small size). ``--sanitize small``: the small size once more
under compute-sanitizer's memcheck (names the kernel and the address of a bad access).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, traceback
sys.path.insert(0, os.environ["EMBER_ROOT"])
import torch
from benchmarks import zoo
name, variant = sys.argv[1], sys.argv[2]
size = "small" if variant in ("small", "sanitize") else "full"
model, args = zoo.get_spec(name).build("cuda", size)
import copy
ref = copy.deepcopy(model)
model.train(); ref.train()
import ember
opts = {}
if variant == "no_inplace":
    import ember_inductor.scheduler as sched
    sched.plan_in_place = lambda s, outputs: {}
if variant == "no_pad":
    opts["pad_mm"] = False
amp = variant != "fp32"
def step(m, f):
    m.zero_grad(set_to_none=True)
    with torch.autocast("cuda", torch.bfloat16, enabled=amp):
        loss = zoo.reduce_to_loss(f(*args))
    loss.backward()
    return loss.detach().float()
fn = ember.compile(model, options=opts)
res = {"model": name, "variant": variant}
try:
    with ember.config.patch(suppress_errors=False):
        for i in range(2):
            got = step(model, fn)
        torch.cuda.synchronize()
except BaseException as e:
    tb = traceback.extract_tb(e.__traceback__)
    where = [f"{f.filename}:{f.lineno} {f.name}: {(f.line or '').strip()[:300]}" for f in tb
             if f.filename.startswith("<ember")]
    res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    res["where"] = where
    res["tb_tail"] = "".join(traceback.format_exception(e)[-6:])[-3000:]
    import linecache
    for f in tb:  # the failing wrapper's whole source (its kernels included), for reading
        if f.filename.startswith("<ember_inductor") and os.environ.get("BISECT_OUT"):
            tag = f.filename.strip("<>").replace(" ", "_")
            with open(os.path.join(os.environ["BISECT_OUT"], f"{name}_{variant}_{tag}.py"), "w") as fh:
                fh.write("".join(linecache.getlines(f.filename)))
    print("RESULT " + json.dumps(res), flush=True)
    sys.exit(0)
want = step(ref, ref)
worst = 0.0
for (n, p), q in zip(model.named_parameters(), ref.parameters()):
    if p.grad is None or q.grad is None:
        continue
    d = float((p.grad.float() - q.grad.float()).norm() / (q.grad.float().norm() + 1e-12))
    if d > worst:
        worst, res["worst_param"] = d, n
res["loss"] = [float(got), float(want)]
res["worst_grad_rel"] = worst
print("RESULT " + json.dumps(res), flush=True)
"""


def run(model: str, variant: str, timeout: float, out: Path) -> dict:
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, EMBER_ROOT=str(ROOT), EMBER_CACHE_DIR=f"{tmp}/ember",
               TRITON_CACHE_DIR=f"{tmp}/triton", CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1",
               BISECT_OUT=str(out))
    if variant == "no_tune":
        env["EMBER_TRITON_TUNE"] = "0"
    if variant == "serial":
        env["EMBER_TRITON_COMPILE_WORKERS"] = "0"
        env["EMBER_TRITON_COMPILE_THREADS"] = "1"
    cmd = [sys.executable, "-c", CHILD, model, variant]
    if variant == "sanitize":
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "5",
               "--show-backtrace", "no"] + cmd
    t = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=ROOT)
        text = p.stdout + "\n" + p.stderr
    except subprocess.TimeoutExpired as e:
        text = f"timeout {timeout:.0f}s\n" + str(e.stdout or "")[-2000:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / f"{model}_{variant}.log").write_text(text)
    r = {"model": model, "variant": variant, "error": text[-1500:]}
    for line in text.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
    if variant == "sanitize":
        r["sanitizer"] = [ln for ln in text.splitlines() if "=========" in ln][:40]
    r["seconds"] = round(time.time() - t, 1)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--variants", default="default,no_inplace,no_pad,no_tune,serial,small")
    ap.add_argument("--sanitize", default="")
    ap.add_argument("--deadline", type=float, default=400)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    order = [(m, v) for m in a.models.split(",") for v in a.variants.split(",") if v]
    if a.sanitize:
        order += [(m, "sanitize") for m in a.models.split(",")]
    rows = []
    for model, variant in order:
        left = a.deadline - (time.time() - t0)
        if left < 20:
            rows.append({"model": model, "variant": variant, "error": "skipped: no time left"})
            continue
        r = run(model, variant, min(left - 5, 200 if variant == "sanitize" else 120), out)
        print(json.dumps(r, indent=1), flush=True)
        rows.append(r)
    (out / "bisect.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
