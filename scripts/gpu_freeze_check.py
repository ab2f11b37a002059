"""What freezing's per-call check costs on the GPU: one zoo model's inference through Ember's
inductor with folded constants checked by content (default), by version counter only, and
without freezing, beside torch.compile, in one process (CUDA-event medians and host time per
call), plus how many parameters each call watches.

    python3 scripts/gpu_freeze_check.py --model resnet50 [--mode reduce-overhead]
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())


def _time(fn, iters=40):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts, hs = [], []
    for _ in range(iters):
        fn()  # steady state: the timed call follows one of its own
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        hs.append((time.perf_counter() - t0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2], sorted(hs)[len(hs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--size", default="small")
    ap.add_argument("--mode", default=None)
    args = ap.parse_args()
    import ember
    from benchmarks.zoo import get_spec
    from ember_inductor.freezing import FrozenCall

    base, inputs = get_spec(args.model).build("cuda", args.size)
    base.eval()
    variants = {"eager": None, "content": {}, "version": {"freezing_check": "version"},
                "no-freezing": {"freezing": False}, "torch": None}
    steps = {}
    for name, opts in variants.items():
        m = copy.deepcopy(base)
        if name == "eager":
            f = m
        elif name == "torch":
            f = torch.compile(m, mode=args.mode) if args.mode else torch.compile(m)
        else:
            if args.mode:  # options and mode cannot be passed together: the mode as an option
                opts = {**opts, "mode": args.mode}
            f = ember.compile(m, options=opts or None)

        def step(f=f):
            with torch.no_grad():
                return f(*inputs)
        step()
        steps[name] = step
    for o in gc.get_objects():
        if isinstance(o, FrozenCall):
            print(f"FrozenCall: check={o.check} watches {len(o.watch)} inputs, "
                  f"{o.watched_bytes / 2**20:.1f} MiB, refolds {o.refolds}")
    print(f"{args.model} {args.size} inference, mode {args.mode}, {torch.cuda.get_device_name(0)}")
    for name, step in steps.items():
        d, h = _time(step)
        print(f"{name:12} {d:8.3f} ms device  {h:8.3f} ms host per call")


if __name__ == "__main__":
    main()
