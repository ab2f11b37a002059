"""GPU checks of the inductor backend's Triton target (run by scripts/gpu_triton.sh).

Prints ``RESULT <name> <json>`` lines and writes them to ``<out>/check.json``. Each part runs in
its own try: a failure is printed (``ERROR <part>``) and the next part runs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
results: dict = {}
OUT = ["."]
T0 = time.time()


def result(name: str, value) -> None:
    results[name] = value
    print(f"RESULT {name} {json.dumps(value, default=str)}", flush=True)


def part(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001
        print(f"ERROR {fn.__name__}\n{traceback.format_exc()}", flush=True)


class FallbackCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.msgs = []

    def emit(self, record):
        msg = record.getMessage()
        if "eagerly" in msg or "fell back" in msg or "fallback" in record.name:
            self.msgs.append(msg[:300])


def wrapper_of(fn, *inputs):
    """The generated wrapper's ``call`` for ``fn`` (Triton target on CUDA inputs)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember_inductor.compile_fx import generate_source, load_wrapper
    from ember_inductor.decompositions import decompositions

    gm = make_fx(fn, decomposition_table=decompositions())(*inputs)
    src, _ = generate_source(gm, key=f"check{id(fn)}", options={})
    return load_wrapper(src, gm, f"check{id(fn)}"), src


def per_call_us(f, n=2000):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def launch_overhead():
    import ember
    x = torch.randn(1024, device="cuda")

    def f(x):
        return (x * 2 + 1,)
    call, src = wrapper_of(f, x)
    k = call.__globals__["kernel0"]
    out = torch.empty_like(x)
    call(x)
    from ember_inductor.runtime import triton as rt
    consts = {kk: v for kk, v in k.config.items() if kk not in ("num_warps", "num_stages")}
    r = {
        "launcher_us": per_call_us(lambda: k(1024, x, out)),
        "ember_c_launcher": k._plan is not None,
        "triton_jit_us": per_call_us(lambda: k.fn[(1,)](x, out, **consts)),
        "eager_op_us": per_call_us(lambda: torch.add(x, 1, out=out)),
        "wrapper_us": per_call_us(lambda: call(x)),
        "fast_path": k._run is not None,
        "counters": dict(rt.counters),
    }
    if k._plan is not None:  # the same kernel through Triton's launcher (the A/B of cuda_launch)
        plan, k._plan = k._plan, None
        k._fast = k._specialize()
        r["triton_launcher_us"] = per_call_us(lambda: k(1024, x, out))
        k._plan = plan
        k._fast = k._specialize()

    def g(x, y):
        return torch.relu(x * y + 1).sum(-1)
    a, b = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
    cf = ember.compile(g)
    tc = torch.compile(g)
    cf(a, b), tc(a, b)
    r["tiny_graph_eager_us"] = per_call_us(lambda: g(a, b), 1000)
    r["tiny_graph_ember_us"] = per_call_us(lambda: cf(a, b), 1000)
    r["tiny_graph_torch_compile_us"] = per_call_us(lambda: tc(a, b), 1000)
    result("launch_overhead", r)


def bandwidth():
    n = 64 * 1024 * 1024  # 256 MB of float32
    x = torch.randn(n, device="cuda")

    def f(x):
        return (x * 2 + 1,)
    call, _ = wrapper_of(f, x)
    y = torch.empty_like(x)

    def timed(fn, reps=20):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / reps / 1e3
    out = call(x)[0]
    ok = torch.allclose(out, x * 2 + 1)
    t_k = timed(lambda: call(x))
    t_c = timed(lambda: y.copy_(x))
    k = call.__globals__["kernel0"]
    result("bandwidth_256MB", {"fused_TBps": 2 * n * 4 / t_k / 1e12, "copy_TBps": 2 * n * 4 / t_c / 1e12,
                               "ratio": t_c / t_k, "correct": ok, "config": k.config})


def zoo(size="small", amp=False, models=None, budget=60.0):
    import ember
    from benchmarks import zoo as Z
    names = models or Z.default_models("cuda")
    out = {}
    handler = FallbackCounter()
    logging.getLogger("ember").addHandler(handler)
    logging.getLogger("ember").setLevel(logging.INFO)
    t_start = time.time()
    for name in names:
        if time.time() - t_start > budget:
            out[name] = "skipped (time)"
            continue
        spec = Z.get_spec(name)
        if spec.missing():
            out[name] = f"missing {spec.missing()}"
            continue
        try:
            handler.msgs.clear()
            model, inputs = spec.build("cuda", size)
            import copy
            ref = copy.deepcopy(model)
            ctx = torch.autocast("cuda", torch.bfloat16) if amp else torch.autocast("cuda", enabled=False)
            t = time.time()
            cm = ember.compile(model)
            with ctx:
                o = Z.flatten_outputs(cm(*inputs))
                e = Z.flatten_outputs(ref(*inputs))
            errs = [((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-6)).item()
                    for a, b in zip(o, e) if isinstance(a, torch.Tensor) and a.is_floating_point()]
            with ctx:
                Z.reduce_to_loss(cm(*inputs)).backward()
                Z.reduce_to_loss(ref(*inputs)).backward()
            gerr = max([((p.grad.float() - q.grad.float()).abs().max() /
                         (q.grad.float().abs().max() + 1e-6)).item()
                        for p, q in zip(model.parameters(), ref.parameters())
                        if p.grad is not None and q.grad is not None] or [0.0])
            out[name] = {"out_rel_err": max(errs or [0.0]), "grad_rel_err": gerr,
                         "seconds": round(time.time() - t, 1),
                         "fallbacks": handler.msgs[:3]}
        except Exception as e:  # noqa: BLE001
            out[name] = f"ERROR {type(e).__name__}: {str(e)[:300]}"
        torch.cuda.empty_cache()
    result(f"zoo_{size}{'_bf16' if amp else ''}", out)


def warm_start():
    code = r"""
import torch, ember, json, os
from ember_inductor.runtime import triton as rt
def f(x, w):
    return torch.softmax(torch.relu(x @ w) * 2, -1).sum(0)
x, w = torch.randn(64, 128, device="cuda"), torch.randn(128, 256, device="cuda")
import time, cProfile, pstats, io; t = time.perf_counter()
prof = cProfile.Profile(); prof.enable()
cf = ember.compile(f); y = cf(x, w); torch.cuda.synchronize()
prof.disable()
s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
open(os.environ["EMBER_PROFILE_OUT"], "w").write(s.getvalue())
print(json.dumps({"seconds": time.perf_counter() - t, "ok": bool(torch.allclose(y, f(x, w), atol=1e-4)), **rt.counters}))
"""
    runs = []
    for i in range(2):
        prof = Path(OUT[0]) / "warm_start_profile.txt" if i else Path("/tmp/ember_cold_profile.txt")
        env = dict(os.environ, EMBER_PROFILE_OUT=str(prof))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=env)
        runs.append(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-800:])
    result("warm_start", {"cold": runs[0], "warm": runs[1]})


PARTS = ("launch", "bandwidth", "warm", "zoo_small", "zoo_full")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of " + ", ".join(PARTS))
    a = p.parse_args()
    want = set(a.parts.split(","))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    OUT[0] = a.out
    import triton
    result("versions", {"torch": torch.__version__, "triton": triton.__version__,
                        "gpu": torch.cuda.get_device_name(0)})
    if "launch" in want:
        part(launch_overhead)
    if "bandwidth" in want:
        part(bandwidth)
    if "warm" in want:
        part(warm_start)
    # fp32 correctness without TF32 (convolutions and matmuls default to TF32 on this GPU:
    # a difference there is cuDNN's, not Ember's)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if "zoo_small" in want:
        part(lambda: zoo("small", budget=45))
    torch.backends.cudnn.allow_tf32 = True
    if "zoo_full" in want:
        part(lambda: zoo("full", amp=True, budget=max(0.0, 140 - (time.time() - T0))))
    Path(a.out, "check.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
