"""Measure precompiled artifacts against eager, Ember's cold compile and torch.compile's warm
start, per zoo model (benchmarks/zoo.py), inference and a training step, in fresh processes.

    .venv/bin/python tests/precompile/measure_load.py                  # CPU, every zoo model
    python tests/precompile/measure_load.py --device cuda              # GPU ("full" zoo sizes)
    .venv/bin/python tests/precompile/measure_load.py mlp gpt2 --mode step --repeat 3

Per model and step ("infer": the model's output under no_grad; "step": forward, loss,
``loss.backward()`` inside the precompiled function):

* precompile once in this process and save the artifact;
* ``--repeat`` fresh processes: time from ``ember.precompile.load(path)`` to the first result
  (the loss and its gradients for a step), with the artifact's cache and an empty Ember
  on-disk cache (``EMBER_CACHE_DIR``), so nothing is compiled;
* ``--repeat`` fresh processes: one eager call (the first of the process, and a warm one), and
  in the first ``--cold-repeat`` of them Ember's cold compile: the first call of
  ``ember.compile(fn, backend=...)`` with an empty on-disk cache;
* torch.compile (``--no-torch-compile`` skips it): one fresh process fills its caches
  (``TORCHINDUCTOR_CACHE_DIR`` set to a temporary folder of this row; its first call is the cold
  start), then ``--repeat`` fresh processes sharing that folder time their first call (the warm
  start).

Times exclude ``import torch, ember`` and building the model (paid by any PyTorch program). Each
value is the median of the fresh processes; every child reports the 1-minute load average when
it starts (``os.getloadavg``), shown per row (min-max). Prints a markdown table on stdout (rows as
JSON on stderr as they come; ``--jsonl FILE`` appends them to FILE too, ``--table FILE``
prints the table of rows saved earlier). Not a test: timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pc_cases  # noqa: E402

_PRELUDE = r"""
import os, sys, time, json
LOADAVG = os.getloadavg()[0]
import torch
sys.path[:0] = {paths!r}
import pc_cases
model, inputs = pc_cases.build({model!r})
grad = {grad!r}
def sync():
    if {device!r} == "cuda":
        torch.cuda.synchronize()
def once(f):
    sync()
    t = time.perf_counter()
    with torch.set_grad_enabled(grad):
        out = f(model, *inputs)
    sync()
    return time.perf_counter() - t
"""

_CHILD_LOAD = _PRELUDE + r"""
import ember
t1 = time.perf_counter()
fn = ember.precompile.load({path!r})
t_load = time.perf_counter() - t1
with torch.set_grad_enabled(grad):
    out = fn(model, *inputs)
sync()
t_first = time.perf_counter() - t1
assert fn.used_cache or {device!r} != "cpu" or {backend!r} != "inductor"
print("RESULT " + json.dumps({{"load_s": t_load, "first_s": t_first, "loadavg": LOADAVG}}))
"""

_CHILD_EAGER = _PRELUDE + r"""
import statistics
fn = pc_cases.FUNCS[{mode!r}]
first = once(fn)
warm = statistics.median(once(fn) for _ in range(3))
res = {{"eager_first_s": first, "eager_s": warm, "loadavg": LOADAVG}}
if {cold!r}:
    import ember
    res["ember_cold_s"] = once(ember.compile(fn, backend={backend!r}))
print("RESULT " + json.dumps(res))
"""

_CHILD_TORCH = _PRELUDE + r"""
fn = torch.compile(pc_cases.FUNCS[{mode!r}])
print("RESULT " + json.dumps({{"torch_s": once(fn), "loadavg": LOADAVG}}))
"""


def _child(code: str, env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EMBER_") and k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=pc_cases.ROOT, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def measure(model: str, mode: str, backend: str, device: str, tmp: str, repeat: int,
            cold_repeat: int, torch_compile: bool, ember_parts: bool = True) -> dict:
    grad = mode in pc_cases.GRAD_MODES
    fmt = {"paths": [HERE, pc_cases.ROOT], "model": model, "grad": grad, "device": device,
           "mode": mode, "backend": backend}
    row: dict = {"model": model, "mode": mode, "backend": backend, "device": device}
    children: list[dict] = []
    if ember_parts:
        children += _measure_ember(row, fmt, tmp, repeat, cold_repeat)
    if torch_compile:
        tdir = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=tmp, prefix="torchinductor-")}
        cold = _child(_CHILD_TORCH.format(**fmt), tdir)
        warms = [_child(_CHILD_TORCH.format(**fmt), tdir) for _ in range(repeat)]
        row["torch_cold_s"] = cold["torch_s"]
        row["torch_warm_s"] = _median(warms, "torch_s")
        row["torch_loadavg"] = [min(c["loadavg"] for c in [cold] + warms),
                                max(c["loadavg"] for c in [cold] + warms)]
    if ember_parts:
        row["loadavg"] = [min(c["loadavg"] for c in children),
                          max(c["loadavg"] for c in children)]
    return row


def _measure_ember(row: dict, fmt: dict, tmp: str, repeat: int, cold_repeat: int) -> list[dict]:
    import torch

    import ember

    model, mode, grad, backend = fmt["model"], fmt["mode"], fmt["grad"], fmt["backend"]
    m, inputs = pc_cases.build(model)
    t = time.perf_counter()
    with torch.set_grad_enabled(grad):
        art = ember.precompile(pc_cases.FUNCS[mode], m, *inputs, backend=backend)
    pre = time.perf_counter() - t
    path = os.path.join(tmp, f"{model}_{mode}")
    art.save(path)
    del m, inputs, art

    def fresh_dir(prefix: str) -> dict[str, str]:
        return {"EMBER_CACHE_DIR": tempfile.mkdtemp(dir=tmp, prefix=prefix)}

    loads = [_child(_CHILD_LOAD.format(path=path, **fmt), fresh_dir("load-"))
             for _ in range(repeat)]
    eagers = [_child(_CHILD_EAGER.format(cold=i < cold_repeat, **fmt), fresh_dir("cold-"))
              for i in range(repeat)]
    row.update({"precompile_s": pre, "load_s": _median(loads, "load_s"),
                "first_s": _median(loads, "first_s"),
                "first_all_s": [r["first_s"] for r in loads],
                "eager_first_s": _median(eagers, "eager_first_s"),
                "eager_s": _median(eagers, "eager_s"),
                "ember_cold_s": _median(eagers, "ember_cold_s")})
    return loads + eagers


_HEADER = ("| model | step | load avg (1 min) | precompile (s) | **load → first result (s)** | "
           "one eager call, first / warm (s) | goal: 2× eager + 0.5 (s) | meets goal, < 1 s | "
           "Ember cold compile (s) | torch.compile cold / warm start (s) |")


def table(rows: list[dict]) -> str:
    merged: dict[tuple, dict] = {}
    for r in rows:  # later rows complete (or replace) earlier ones of the same model and step
        merged.setdefault((r["model"], r["mode"], r["device"]), {}).update(r)
    out = [_HEADER, "|" + "---|" * _HEADER.count(" |")]
    for r in merged.values():
        if "first_s" not in r:
            continue
        goal = 2 * r["eager_first_s"] + 0.5
        meets = ("yes" if r["first_s"] <= goal else "**no**") + ", " + \
                ("yes" if r["first_s"] < 1.0 else "**no**")
        cold = f"{r['ember_cold_s']:.2f}" if r.get("ember_cold_s") is not None else "-"
        tc = (f"{r['torch_cold_s']:.2f} / {r['torch_warm_s']:.2f}" if "torch_cold_s" in r
              else "-")
        if "torch_loadavg" in r:
            tc += f" (load {r['torch_loadavg'][0]:.1f}–{r['torch_loadavg'][1]:.1f})"
        out.append(f"| {r['model']} | {r['mode']} | {r['loadavg'][0]:.1f}–{r['loadavg'][1]:.1f} "
                   f"| {r['precompile_s']:.2f} | **{r['first_s']:.3f}** | "
                   f"{r['eager_first_s']:.3f} / {r['eager_s']:.3f} | {goal:.2f} | {meets} | "
                   f"{cold} | {tc} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="zoo models (default: the zoo's default models "
                    "for the device)")
    ap.add_argument("--device", choices=["cpu", "cuda"],
                    default=os.environ.get("PC_DEVICE", "cpu"))
    ap.add_argument("--backend", default=None, help="default: inductor on cpu, aot_eager on "
                    "cuda (inductor has no CUDA path yet)")
    ap.add_argument("--mode", choices=["infer", "step", "train"], action="append",
                    help="infer, step (backward inside) or train (the caller runs backward); "
                    "default: infer and step")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per measurement")
    ap.add_argument("--cold-repeat", type=int, default=1, help="of those, how many also time "
                    "Ember's cold compile (default 1)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--only-torch-compile", action="store_true", help="only the torch.compile "
                    "columns (merged with an earlier run's rows by --table)")
    ap.add_argument("--jsonl", help="append each row to this file")
    ap.add_argument("--table", help="print the table of rows saved in this .jsonl and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table([json.loads(ln) for ln in f if ln.strip()]))
        return 0
    os.environ["PC_DEVICE"] = args.device  # pc_cases.build, here and in the children
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible to torch")
    sys.path.insert(0, pc_cases.ROOT)
    from benchmarks.zoo import default_models, get_spec

    backend = args.backend or ("inductor" if args.device == "cpu" else "aot_eager")
    models = args.models or default_models(args.device)
    rows: list[dict] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            missing = get_spec(model).missing()
            if missing:
                print(f"skipped {model}: missing {missing}", file=sys.stderr)
                continue
            for mode in args.mode or ["infer", "step"]:
                try:
                    row = measure(model, mode, backend, args.device, tmp, args.repeat,
                                  args.cold_repeat, not args.no_torch_compile,
                                  ember_parts=not args.only_torch_compile)
                except Exception as e:  # one model failing does not lose the others
                    failed.append(f"{model} {mode}: {type(e).__name__}: {str(e)[-1500:]}")
                    print(f"FAILED {failed[-1]}", file=sys.stderr, flush=True)
                    continue
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(row) + "\n")
    dev = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPUs"
    print(f"device: {args.device} ({dev}), torch {torch.__version__}, backend {backend}, "
          f"median of {args.repeat} fresh processes\n")
    print(table(rows))
    for f in failed:
        print(f"\nFAILED {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
