"""Profile one zoo model on the GPU: eager, Ember's inductor and torch.compile side by side
(bf16 autocast, CUDA-event medians), then torch.profiler's top kernels by CUDA time for each, so
that a gap is explained from a profile before kernels change (issue 20).

    python3 scripts/gpu_profile.py --model gpt2 --mode infer --out DIR
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())


def _time(fn, iters=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts, hs = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        hs.append((time.perf_counter() - t0) * 1e3)  # host time of the call (no sync inside)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    hs.sort()
    return ts[len(ts) // 2], hs[len(hs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--mode", default="infer", choices=["infer", "train"])
    ap.add_argument("--size", default="full")
    ap.add_argument("--out", default=".")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compile-mode", default=None,
                    help="mode of both compilers (reduce-overhead: CUDA graphs)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                    help="bf16 autocast, or fp32 without autocast (the CUDA-graph tables)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated runner backend names (benchmarks/backends.py, e.g. "
                         "eager,ember-cudagraphs,ember-aot-eager@reduce-overhead); default: "
                         "eager, ember and torch with --compile-mode")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import copy

    import ember
    from benchmarks.zoo import get_spec, reduce_to_loss
    from torch.profiler import ProfilerActivity, profile

    base, inputs = get_spec(args.model).build("cuda", args.size)
    from benchmarks.backends import make_compiled

    fns = {}
    names = args.variants.split(",") if args.variants else ["eager", "ember", "torch"]
    for name in names:
        m = copy.deepcopy(base)
        m.train(args.mode == "train")
        kw = {"mode": args.compile_mode} if args.compile_mode else {}
        if name in ("ember", "torch"):
            f = ember.compile(m, **kw) if name == "ember" else torch.compile(m, **kw)
        else:
            f = make_compiled(name, m)
        amp = args.dtype == "bf16"
        if args.mode == "infer":
            def step(f=f):
                with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=amp):
                    return f(*inputs)
        else:
            def step(f=f, m=m):
                m.zero_grad(set_to_none=True)
                with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                    loss = reduce_to_loss(f(*inputs))
                loss.backward()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"{name}: first call {time.perf_counter() - t0:.2f} s", flush=True)
        fns[name] = step
    times = {n: _time(f) for n, f in fns.items()}
    try:  # how each CUDA-graphed callable ran (replays, eager calls, recordings)
        from ember_cudagraphs.runtime import ALL
        for g in ALL:
            print(f"cudagraphs {g.name} ({g.kind}): {g.stats} refused={g.refused} "
                  f"failed={g.failed}", flush=True)
    except ImportError:
        pass
    lines = [f"{args.model} {args.mode} {args.size} {args.dtype}, mode {args.compile_mode}, "
             f"{torch.cuda.get_device_name(0)}"]
    for n, (t, h) in times.items():
        lines.append(f"{n:32} {t:8.3f} ms  {times[names[0]][0] / t:5.2f}x {names[0]}  "
                     f"(host {h:.3f} ms per call)")
    print("\n".join(lines), flush=True)
    for n, f in fns.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                f()
            torch.cuda.synchronize()
        avg = prof.key_averages()
        table = avg.table(sort_by="self_cuda_time_total", row_limit=args.top,
                          max_name_column_width=70)
        # the host side too: under CUDA graphs a step is bound by whichever of the two is longer
        cpu = avg.table(sort_by="self_cpu_time_total", row_limit=min(args.top, 30),
                        max_name_column_width=70)
        lines += ["", f"== {n} (5 steps)", table, f"-- {n} host time", cpu]
    with open(os.path.join(args.out, f"profile_{args.model}_{args.mode}_{args.dtype}_"
                                        f"{args.compile_mode or 'default'}"
                                        f"{'_variants' if args.variants else ''}.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
