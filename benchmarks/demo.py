"""``python -m benchmarks demo``: Ember's bundled model, eager vs Ember vs torch.compile.

The README's first command (through scripts/demo.sh). It runs the benchmark runner on one model
(:class:`ember.examples.DemoModel`, the model of ``python -m ember demo``) with three variants:
eager PyTorch, ``ember.compile(model)`` with the default backend (inductor) and
``torch.compile(model)`` (TorchInductor, the peer). It prints accuracy (PyTorch's rule against an
fp64 reference), median time per call and speedup over eager, measured interleaved in one process,
and the compile seconds of each compiler in fresh processes: cold (empty on-disk caches) and warm
(the caches the cold run filled). torch.compile lives here, in benchmarks/, never in the product.
"""

from __future__ import annotations

import sys

from .backends import availability
from .runner import RUNNABLE, Row, RunConfig, run

__all__ = ["demo"]

EMBER = "ember-inductor"
EMBER_FALLBACK = "ember-aot-eager"
PEER = "torch-inductor"


def _f(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _table(rows: list[Row]) -> str:
    head = ["backend", "accuracy", "median ms", "speedup", "cold compile s", "warm compile s",
            "graphs", "status"]
    cells = [[r.backend, r.accuracy, _f(r.median_ms, ".2f"),
              "—" if r.speedup is None else f"{r.speedup:.2f}x",
              _f(r.cold_compile_s, ".2f"), _f(r.warm_compile_s, ".2f"),
              "—" if r.graphs is None else f"{r.graphs} ({r.graph_breaks} breaks)", r.status]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])


def demo(iters: int = 200, max_seconds: float = 20.0, probes: bool = True) -> int:
    """Print the comparison; 0 when Ember ran its graphs and passed the accuracy check."""
    ember_b = EMBER
    why = availability(EMBER)
    if why is not None:
        print(f"{EMBER}: {why}\n  -> showing {EMBER_FALLBACK} instead (no speedup expected: it "
              "runs the captured ATen graphs as they are)\n", flush=True)
        ember_b = EMBER_FALLBACK
    backends = ["eager", ember_b, PEER]
    # a ~5 ms step: 200 interleaved iterations (order rotating), the median of each; every
    # variant warms up 10 calls first (torch.compile's first calls after compiling are slower)
    cfg = RunConfig(device="cpu", mode="infer", backends=backends, models=["demo"], iters=iters,
                    warmup=10, max_seconds=max_seconds,
                    compile_probes="cold,warm" if probes else "none",
                    probe_backends=[ember_b, PEER], overhead=False)
    rows, _ = run(cfg)
    by = {r.backend: r for r in rows}

    print()
    print("Ember demo: DemoModel (2 pre-norm transformer blocks, d=128) on (8, 64, 128), CPU "
          "inference, fp32")
    print(_table(rows))
    e, p = by[ember_b], by[PEER]
    print()
    if e.speedup and p.speedup:
        print(f"speed: {ember_b} {e.speedup:.2f}x over eager, torch.compile {p.speedup:.2f}x "
              f"(ratio {e.speedup / p.speedup:.2f})")
    if e.cold_compile_s is not None and p.cold_compile_s:
        print(f"cold compile: {ember_b} {e.cold_compile_s:.2f} s vs torch.compile "
              f"{p.cold_compile_s:.2f} s ({e.cold_compile_s / p.cold_compile_s:.0%} of it); "
              f"warm: {_f(e.warm_compile_s, '.2f')} s vs {_f(p.warm_compile_s, '.2f')} s")
    for r in rows:
        if r.note:
            print(f"note: {r.backend}: {r.note}")
    print("columns: accuracy = PyTorch's benchmark rule against an fp64 reference; median ms "
          "interleaved in one process; compile s = first compiled call minus one eager call, in a "
          "fresh process with empty (cold) / filled (warm) caches.")
    ok = e.status in RUNNABLE and e.accuracy.startswith("pass") and bool(e.graphs)
    if not ok:
        print(f"FAILED: {ember_b}: status {e.status}, accuracy {e.accuracy}", file=sys.stderr)
    return 0 if ok else 1
