"""Per-call overhead of Ember's capture (eager backend) against torch.compile's (eager backend).

    python -m benchmarks.overhead [--samples 41] [--calls 500]

Three ways of running the same tiny program are timed side by side in this one process: plain
eager, ``ember.compile(fn, backend="eager")`` and ``torch.compile(fn, backend="eager")``. With an
eager backend the graph itself costs what eager costs, so the difference to eager is the wrapper's
per-call overhead (guard checks, dispatch, building the output). Two programs:

* ``x + 1`` on a 4-element tensor;
* a 20-layer ``nn.Sequential`` of ``nn.Linear(4, 4)`` on a (1, 4) input (guards on a module with
  40 parameters).

All under ``torch.no_grad()``, after warm-up (compiled and cached). Each sample times ``calls``
back-to-back calls of one variant; variants alternate within a round and the order rotates every
round; the table shows the median over samples in µs per call. Prints a markdown table.

A negative overhead means the compiled variant is faster than eager: for the Sequential both
compilers call ``F.linear`` directly from one graph and skip twenty ``nn.Module.__call__``s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn


def _cases() -> dict[str, tuple[Callable[[], Callable[..., Any]], torch.Tensor]]:
    def make_add() -> Callable[..., Any]:
        def add_one(x: torch.Tensor) -> torch.Tensor:  # a fresh code object per variant
            return x + 1
        return add_one

    def make_seq() -> Callable[..., Any]:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)]).eval()

    return {
        "x + 1 (4 elements)": (make_add, torch.randn(4) + 2.0),
        "20 x nn.Linear(4, 4) Sequential": (make_seq, torch.randn(1, 4)),
    }


def _variants(make: Callable[[], Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    import ember

    eager = make()
    return {
        "eager": eager,
        "ember (eager backend)": ember.compile(make(), backend="eager"),
        "torch.compile (eager backend)": torch.compile(make(), backend="eager"),
    }


def measure(samples: int = 41, calls: int = 500) -> dict[str, dict[str, float]]:
    """Median µs per call for each case and variant."""
    import ember
    import torch._dynamo

    results: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for case, (make, x) in _cases().items():
            ember.reset()
            torch._dynamo.reset()
            fns = _variants(make)
            ref = fns["eager"](x)
            for name, f in fns.items():  # warm up: compile, cache, check the result
                for _ in range(20):
                    out = f(x)
                torch.testing.assert_close(out, ref, msg=f"{case}: {name} differs from eager")
            per: dict[str, list[float]] = {n: [] for n in fns}
            names = list(fns)
            for i in range(samples):
                k = i % len(names)
                for n in names[k:] + names[:k]:
                    f = fns[n]
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        f(x)
                    per[n].append((time.perf_counter() - t0) / calls * 1e6)
            results[case] = {n: statistics.median(ts) for n, ts in per.items()}
            graphs = ember.events.counters["stats"]["graphs"]
            recompiles = ember.events.counters["stats"]["recompiles"]
            if graphs != 1 or recompiles:
                raise SystemExit(f"{case}: Ember compiled {graphs} graphs / {recompiles} "
                                 "recompiles; expected exactly one graph")
    return results


def render(results: dict[str, dict[str, float]], samples: int, calls: int) -> str:
    lines = [
        "| program | eager µs/call | ember µs/call | torch.compile µs/call | ember overhead µs "
        "| torch overhead µs | ember − torch µs |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case, r in results.items():
        e = r["eager"]
        em = r["ember (eager backend)"]
        tc = r["torch.compile (eager backend)"]
        lines.append(f"| {case} | {e:.2f} | {em:.2f} | {tc:.2f} | {em - e:+.2f} | {tc - e:+.2f} "
                     f"| {em - tc:+.2f} |")
    cpu = platform.processor() or platform.machine()
    lines.append("")
    lines.append(f"Median of {samples} samples x {calls} calls, interleaved, under torch.no_grad; "
                 f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, "
                 f"torch {torch.__version__}, {cpu}, {os.cpu_count()} CPUs, "
                 f"{torch.get_num_threads()} torch threads.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=41)
    p.add_argument("--calls", type=int, default=500)
    a = p.parse_args(argv)
    print(render(measure(a.samples, a.calls), a.samples, a.calls))


if __name__ == "__main__":
    main()
