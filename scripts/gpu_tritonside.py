"""Cold compile and warm start of inductor's Triton target against torch.compile (run by
scripts/gpu_tritonside.sh on the GPU machine; each measurement in a fresh process).

    python scripts/gpu_tritonside.py --out DIR [--deadline SECONDS]

For each case (``tiny``: a small matmul + softmax graph; ``gpt2``: GPT-2 124M 16x512 inference
under bf16 autocast; ``gpt2_train``: one forward+backward of GPT-2 small-config, fp32) and each
backend (``ember``: Ember's inductor; ``torch``: torch.compile's inductor):

* cold: fresh caches (``EMBER_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` in a
  new folder), a fresh process;
* warm: the same caches, another fresh process.

Then a tiny graph is precompiled (``ember.precompile``) and its artifact loaded in a fresh
process with empty Ember and Triton caches: Triton compiles there must be 0 (the artifact
carries the binaries and tuning choices).

Timed: ``ember.compile``/``torch.compile`` (with the imports each makes), the compile and the
first call (synchronized), after one eager call in the same process (so CUDA, cuBLAS and cuDNN
start-up are not counted for either backend); ``import torch`` and model building are not counted. Ember's runs also report its Triton counters (compiles in this process, binaries
built by the worker pool, disk hits, tunings) and its ``ember.inductor.triton`` debug log; the
warm runs write a cProfile (``profile_<case>_<backend>_<phase>.txt``). Results: ``RESULT`` lines
on stdout, ``<out>/startup.json`` and ``<out>/startup.md``.
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
import io, json, logging, os, sys, time, cProfile, pstats
sys.path.insert(0, os.environ["EMBER_ROOT"])
import torch
case, backend, prof_out = sys.argv[1], sys.argv[2], sys.argv[3]
logs = []
class H(logging.Handler):
    def emit(self, r):
        logs.append(f"{r.name}: {r.getMessage()}"[:400])
lg = logging.getLogger("ember.inductor.triton"); lg.setLevel(logging.DEBUG); lg.addHandler(H())
lg.propagate = False
wl = logging.getLogger("ember"); wl.setLevel(logging.WARNING); wl.addHandler(H())
train = False
if case == "tiny":
    def model(x, w):
        return torch.softmax(torch.relu(x @ w) * 2, -1).sum(0)
    args = (torch.randn(64, 128, device="cuda"), torch.randn(128, 256, device="cuda"))
    amp = False
else:
    from benchmarks.zoo import _build_gpt2
    m, args = _build_gpt2("cuda", "full" if case == "gpt2" else "small")
    train = case.endswith("_train")
    m.train(train)
    amp = case == "gpt2"
    model = m
def step(fn):
    with torch.autocast("cuda", torch.bfloat16, enabled=amp):
        if train:
            out = fn(*args)
            loss = (out.logits if hasattr(out, "logits") else out).float().sum()
            loss.backward()
            return loss.detach()
        with torch.no_grad():
            out = fn(*args)
            return out.logits if hasattr(out, "logits") else out
ref = step(model); torch.cuda.synchronize()
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
# timed from here: the compiler's own imports (torch.compile imports torch._dynamo when called;
# Ember's FakeTensorMode imports it too), the compile and the first call
if backend == "ember":
    import ember
    from ember_inductor.runtime import triton as rt
    compiled = ember.compile(model, backend="inductor")
else:
    compiled = torch.compile(model)
out = step(compiled); torch.cuda.synchronize()
prof.disable()
dt = time.perf_counter() - t
t2 = time.perf_counter(); step(compiled); torch.cuda.synchronize(); second = time.perf_counter() - t2
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
open(prof_out, "w").write(s.getvalue())
err = float((out.float() - ref.float()).abs().max())
res = {"seconds": round(dt, 3), "second_call_s": round(second, 4), "max_abs_err": err}
if backend == "ember":
    res["counters"] = dict(rt.counters)
    res["procs"] = len(rt._procs)
res["logs"] = logs[-30:]
print("CHILD " + json.dumps(res), flush=True)
"""


def run_child(case: str, backend: str, phase: str, cache: Path, out: Path, timeout: float) -> dict:
    env = dict(os.environ)
    env.update({"EMBER_CACHE_DIR": str(cache / "ember"),
                "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
                "TRITON_CACHE_DIR": str(cache / "triton"), "EMBER_ROOT": str(ROOT)})
    env.pop("TRITON_INTERPRET", None)
    prof = out / f"profile_{case}_{backend}_{phase}.txt"
    t = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, case, backend, str(prof)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s"}
    wall = time.perf_counter() - t
    (out / f"child_{case}_{backend}_{phase}.log").write_text(r.stdout[-20000:] + "\n--- stderr\n"
                                                              + r.stderr[-20000:])
    line = [x for x in r.stdout.splitlines() if x.startswith("CHILD ")]
    if not line:
        return {"error": (r.stderr or r.stdout)[-600:], "process_s": round(wall, 1)}
    res = json.loads(line[-1][6:])
    res["process_s"] = round(wall, 1)
    return res


PRECOMPILE = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["EMBER_ROOT"])
import torch, ember
mode, path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
def f(x, w):
    return torch.softmax(torch.relu(x @ w) * 2, -1).sum(0) + torch.var_mean(x, 0)[0].sum()
x, w = torch.randn(64, 128, device="cuda"), torch.randn(128, 256, device="cuda")
ref = f(x, w); torch.cuda.synchronize()
from ember_inductor.runtime import triton as rt
t = time.perf_counter()
if mode == "save":
    art = ember.precompile(f, x, w, backend="inductor")
    art.save(path)
    fn = art.load()
else:
    fn = ember.precompile.load(path)
out = fn(x, w); torch.cuda.synchronize()
print("CHILD " + json.dumps({"seconds": round(time.perf_counter() - t, 3),
                             "max_abs_err": float((out - ref).abs().max()), "counters": rt.counters}))
"""


def precompile_check(out: Path, timeout: float) -> dict:
    """Precompile a tiny graph in one process (its own caches), load the artifact in a fresh
    process with empty Ember and Triton caches: Triton compiles there must be 0."""
    res = {}
    art = out / "tiny_artifact.py"
    for mode in ("save", "load"):
        cache = Path(tempfile.mkdtemp(prefix=f"tritonside_pc_{mode}_"))
        env = dict(os.environ, EMBER_CACHE_DIR=str(cache / "ember"),
                   TRITON_CACHE_DIR=str(cache / "triton"), EMBER_ROOT=str(ROOT))
        env.pop("TRITON_INTERPRET", None)
        try:
            r = subprocess.run([sys.executable, "-c", PRECOMPILE, mode, str(art)],
                               capture_output=True, text=True, timeout=timeout, env=env)
            line = [x for x in r.stdout.splitlines() if x.startswith("CHILD ")]
            res[mode] = json.loads(line[-1][6:]) if line else {"error": r.stderr[-800:]}
        except subprocess.TimeoutExpired:
            res[mode] = {"error": "timeout"}
        shutil.rmtree(cache, ignore_errors=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=240.0)
    p.add_argument("--cases", default="tiny,gpt2,gpt2_train")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: dict = {}
    for case in a.cases.split(","):
        for backend in ("ember", "torch"):
            cache = Path(tempfile.mkdtemp(prefix=f"tritonside_{case}_{backend}_"))
            for phase in ("cold", "warm"):
                left = a.deadline - (time.time() - t0)
                if left < 20:
                    results[f"{case}/{backend}/{phase}"] = {"error": "skipped: out of time"}
                    continue
                r = run_child(case, backend, phase, cache, out, timeout=min(150.0, left))
                results[f"{case}/{backend}/{phase}"] = r
                print(f"RESULT {case} {backend} {phase} " + json.dumps(
                    {k: v for k, v in r.items() if k != "logs"}), flush=True)
            shutil.rmtree(cache, ignore_errors=True)
    if a.deadline - (time.time() - t0) > 25:
        pc = precompile_check(out, timeout=60)
        results["precompile"] = pc
        print("RESULT precompile " + json.dumps(pc), flush=True)
    (out / "startup.json").write_text(json.dumps(results, indent=1))
    rows = ["| case | backend | cold s | warm s | second call s | max abs err (cold) | Ember counters (cold → warm) |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for case in a.cases.split(","):
        for backend in ("ember", "torch"):
            c = results.get(f"{case}/{backend}/cold", {})
            w = results.get(f"{case}/{backend}/warm", {})
            cnt = ""
            if backend == "ember":
                keys = ("compiles", "pool_builds", "disk_hits", "tuned", "tune_hits")
                cnt = " → ".join(", ".join(f"{k}={d.get('counters', {}).get(k)}" for k in keys)
                                 for d in (c, w))
            rows.append(f"| {case} | {backend} | {c.get('seconds', c.get('error', '?'))} | "
                        f"{w.get('seconds', w.get('error', '?'))} | {w.get('second_call_s', '')} "
                        f"| {c.get('max_abs_err', '')} | {cnt} |")
    for case in a.cases.split(","):
        e, t = results.get(f"{case}/ember/cold", {}), results.get(f"{case}/torch/cold", {})
        if "seconds" in e and "seconds" in t:
            rows.append(f"\n{case}: Ember cold / torch.compile cold = "
                        f"{e['seconds'] / t['seconds']:.2f} (target <= 0.25)")
    pc = results.get("precompile", {}).get("load", {})
    if pc:
        rows.append(f"\nprecompiled tiny graph loaded in a fresh process with empty caches: "
                    f"{pc.get('seconds')} s, Triton compiles {pc.get('counters', {}).get('compiles')}"
                    f" (target 0), max abs err {pc.get('max_abs_err')}")
    (out / "startup.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
