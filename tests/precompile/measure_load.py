"""Measure, per zoo model: ember.precompile time (cold), and in a fresh process the time from
``ember.precompile.load`` to the first result, next to one eager call (first and warm) and
Ember's cold compile (first call of ember.compile) in a fresh process; with --torch-compile also
torch.compile's warm start (a fresh process after one that filled torch's caches).

    .venv/bin/python tests/precompile/measure_load.py [--backend aot_eager] [--mode infer]
                                                      [--torch-compile] [MODEL ...]

``PC_DEVICE=cuda`` measures on the GPU ("full" zoo sizes).

Prints a markdown table (docs/precompile.md). Not a test: timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pc_cases  # noqa: E402

_CHILD_LOAD = r"""
import sys, time, json
t0 = time.perf_counter()
import torch, ember
sys.path[:0] = {paths!r}
import pc_cases
t_import = time.perf_counter() - t0
model, inputs = pc_cases.build({model!r})
grad = {grad!r}
t1 = time.perf_counter()
fn = ember.precompile.load({path!r})
t_load = time.perf_counter() - t1
with torch.set_grad_enabled(grad):
    out = fn(model, *inputs)
    if grad:
        out.backward()
if torch.cuda.is_available():
    torch.cuda.synchronize()
t_first = time.perf_counter() - t1
print("RESULT " + json.dumps({{"import_s": t_import, "load_s": t_load, "first_s": t_first}}))
"""

_CHILD_EAGER = r"""
import sys, time, json, statistics
import torch, ember
sys.path[:0] = {paths!r}
import pc_cases
model, inputs = pc_cases.build({model!r})
fn = pc_cases.FUNCS[{mode!r}]
grad = {grad!r}
def once(f):
    t = time.perf_counter()
    with torch.set_grad_enabled(grad):
        out = f(model, *inputs)
        if grad:
            out.backward()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t
first = once(fn)
warm = statistics.median(once(fn) for _ in range(3))
compiled = ember.compile(fn, backend={backend!r})
cold = once(compiled)
print("RESULT " + json.dumps({{"eager_first_s": first, "eager_s": warm, "ember_cold_s": cold}}))
"""


_CHILD_TORCH = r"""
import sys, time, json
import torch
sys.path[:0] = {paths!r}
import pc_cases
model, inputs = pc_cases.build({model!r})
fn = torch.compile(pc_cases.FUNCS[{mode!r}])
grad = {grad!r}
t = time.perf_counter()
with torch.set_grad_enabled(grad):
    out = fn(model, *inputs)
    if grad:
        out.backward()
if torch.cuda.is_available():
    torch.cuda.synchronize()
print("RESULT " + json.dumps({{"torch_compile_s": time.perf_counter() - t}}))
"""


def _child(code: str, cache_dir: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    if cache_dir is not None:  # an empty on-disk cache: Ember's compile is really cold
        env["EMBER_CACHE_DIR"] = cache_dir
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=pc_cases.ROOT, env=env, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def measure(model: str, mode: str, backend: str, tmp: str, torch_compile: bool) -> dict:
    import torch

    import ember

    m, inputs = pc_cases.build(model)
    grad = mode == "train"
    t = time.perf_counter()
    with torch.set_grad_enabled(grad):
        art = ember.precompile(pc_cases.FUNCS[mode], m, *inputs, backend=backend)
    pre = time.perf_counter() - t
    path = os.path.join(tmp, f"{model}_{mode}")
    art.save(path)
    paths = [HERE, pc_cases.ROOT]
    row = {"model": model, "mode": mode, "precompile_s": pre}
    row.update(_child(_CHILD_LOAD.format(paths=paths, model=model, grad=grad, path=path)))
    row.update(_child(_CHILD_EAGER.format(paths=paths, model=model, mode=mode, grad=grad,
                                          backend=backend),
                      cache_dir=tempfile.mkdtemp(dir=tmp, prefix="ember-cache-")))
    if torch_compile:
        code = _CHILD_TORCH.format(paths=paths, model=model, mode=mode, grad=grad)
        row["torch_cold_s"] = _child(code)["torch_compile_s"]  # fills torch's caches
        row["torch_warm_s"] = _child(code)["torch_compile_s"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["pointwise", "mlp", "transformer_block",
                                                   "convnet", "gpt2", "bert", "llama"])
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--mode", choices=["infer", "train"], action="append")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also torch.compile's cold and warm start (fresh processes)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for mode in args.mode or ["infer", "train"]:
                row = measure(model, mode, args.backend, tmp, args.torch_compile)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    tc = args.torch_compile
    print(f"| model | step | precompile (s) | load (s) | load → first result (s) | "
          f"one eager call, first / warm (s) | goal 2x eager + 0.5 (s) | Ember cold "
          f"compile, first call (s) |" + (" torch.compile cold / warm start (s) |" if tc else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if tc else ""))
    for r in rows:
        goal = 2 * r["eager_first_s"] + 0.5
        extra = f" {r['torch_cold_s']:.2f} / {r['torch_warm_s']:.2f} |" if tc else ""
        print(f"| {r['model']} | {r['mode']} | {r['precompile_s']:.2f} | {r['load_s']:.3f} | "
              f"**{r['first_s']:.3f}** | {r['eager_first_s']:.3f} / {r['eager_s']:.3f} | "
              f"{goal:.2f} | {r['ember_cold_s']:.2f} |" + extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
