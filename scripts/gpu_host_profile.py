"""Where the host time of one compiled step goes on the GPU machine: cProfile over many calls
of a zoo model's step under Ember (any runner variant name), after warm-up, top functions by
own time and by cumulative time. Under CUDA graphs a small model's step is bound by this.

    python3 scripts/gpu_host_profile.py --model resnet50 --mode infer \
        --variant ember-inductor@reduce-overhead [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.getcwd())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--mode", default="infer", choices=["infer", "train"])
    ap.add_argument("--size", default="small")
    ap.add_argument("--variant", default="ember-inductor@reduce-overhead")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    from benchmarks.backends import make_compiled
    from benchmarks.zoo import get_spec, reduce_to_loss

    m, inputs = get_spec(args.model).build("cuda", args.size)
    m.train(args.mode == "train")
    f = make_compiled(args.variant, m)
    if args.mode == "infer":
        def step():
            with torch.no_grad():
                return f(*inputs)
    else:
        def step():
            m.zero_grad(set_to_none=True)
            reduce_to_loss(f(*inputs)).backward()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        step()
        torch.cuda.synchronize()
    plain = (time.perf_counter() - t0) / args.calls * 1e3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        step()
        torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    print(f"{args.model} {args.mode} {args.size} {args.variant}: {plain:.3f} ms per synchronized "
          f"step without the profiler; {args.calls} calls profiled")
    st.sort_stats("tottime").print_stats(args.top)
    st.sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
