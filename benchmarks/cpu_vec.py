"""Interleaved timings of the CPU vectorization cases of issue 21: eager, Ember built for this CPU
(``-march=native``) and Ember built for AVX2 (``cpu_isa="x86-64-v3"``), one process, the
variants run in turn every iteration, medians reported with the CPU's model name and the load.

    python -m benchmarks.cpu_vec [--iters 30] [--threads N] [--cpu-time] [--cases a,b]

``--cpu-time`` times the process's CPU time instead of the wall clock: on a machine shared with
other work (load above the core count) wall times measure the OS scheduler's slices, CPU time
still measures the work (use it with ``--threads 1``).

On a checkout without the ``cpu_isa`` option the AVX2 column is left out (to time "before")."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import ember


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _sincos(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * torch.cos(y) + torch.sigmoid(x) * 0.5).relu().sum(-1)


def _cases() -> dict[str, tuple[Callable[..., Any], list[torch.Tensor], bool]]:
    """name -> (function, inputs, training step or not)"""
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)
    w, b = r(4096), r(4096)
    return {
        "sincos_train": (_sincos, [r(256, 4096), r(256, 4096)], True),
        "gelu_train": (lambda t: F.gelu(t).sum(-1), [r(256, 4096)], True),
        "gelu_tanh_train": (lambda t: F.gelu(t, approximate="tanh").sum(-1), [r(256, 4096)], True),
        "layer_norm_train": (lambda t: F.layer_norm(t, (4096,), w, b).sum(-1), [r(256, 4096)],
                             True),
        "softmax_train": (lambda t: (t.softmax(-1) * t).sum(-1), [r(256, 4096)], True),
        "softmax_infer": (lambda t: t.softmax(-1), [r(256, 4096)], False),
        "log2_infer": (lambda t: torch.log2(t.abs()) * t, [r(256, 4096)], False),
    }


def _step(fn: Callable[..., Any], inputs: list[torch.Tensor], train: bool) -> None:
    if train:
        for t in inputs:
            t.grad = None
        fn(*inputs).sum().backward()
    else:
        with torch.no_grad():
            fn(*inputs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cases", default="")
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    clock = time.process_time if a.cpu_time else time.perf_counter
    cases = _cases()
    names = [n for n in (a.cases.split(",") if a.cases else cases)]
    print(f"# CPU: {_cpu()}; torch threads {torch.get_num_threads()}; "
          f"{'CPU' if a.cpu_time else 'wall'} time; load before {os.getloadavg()[0]:.2f}")
    print(f"{'case':18s} {'eager ms':>9s} {'native ms':>10s} {'x':>6s} {'avx2 ms':>9s} {'x':>6s}")
    for name in names:
        fn, inputs, train = cases[name]
        inputs = [t.clone().requires_grad_(train) for t in inputs]
        variants: dict[str, Callable[..., Any]] = {"eager": fn, "native": ember.compile(fn)}
        try:
            variants["avx2"] = ember.compile(fn, options={"cpu_isa": "x86-64-v3"})
        except ValueError:
            pass  # a checkout without the option
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(3):
            for v in variants.values():
                _step(v, inputs, train)
        for _ in range(a.iters):
            for k, v in variants.items():
                t0 = clock()
                _step(v, inputs, train)
                times[k].append(clock() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        row = f"{name:18s} {med['eager']:9.2f} {med['native']:10.2f} " \
              f"{med['eager'] / med['native']:5.2f}x"
        if "avx2" in med:
            row += f" {med['avx2']:9.2f} {med['eager'] / med['avx2']:5.2f}x"
        print(row, flush=True)
    print(f"# load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
