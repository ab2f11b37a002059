"""Per-call cost of weakly held guard objects (ember/capture/lifetime.py), A/B in one process.

    python -m benchmarks.lifetime_overhead [--samples 31] [--calls 300] [--backends eager,inductor]

"strong" compiles with the namespace held strongly (the behaviour before lifetime.py: the
weak-name planner is patched to return nothing while that variant compiles); "weak" is the
default. Each variant gets its own code object (a class or function made from the same source
under another file name), so the two never share a cache entry list. Two programs, under
``torch.no_grad()``: ``x + 1`` on 4 elements, and a ``Sequential`` of 100 ``Linear(2, 2)``
(200 parameters; the root module and its 100 children are held weakly, the parameters
strongly as module state). Samples of ``calls`` back-to-back calls alternate between the
variants with the order rotating every round; the table shows medians in µs per call and the
load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable
from unittest import mock

import torch
from torch import nn

_SEQ = '''
class Seq(nn.Sequential):
    def forward(self, x):
        "TAG"
        for m in self:
            x = m(x)
        return x
'''

_ADD = '''
def add_one(x):
    "TAG"
    return x + 1
'''


def _fresh(src: str, name: str, tag: str) -> Any:
    ns: dict[str, Any] = {"nn": nn}
    # the tag in a docstring: equal code objects would share one cache (dict key equality)
    exec(compile(src.replace("TAG", tag), f"<lifetime-bench {tag}>", "exec"), ns)
    return ns[name]


def _compile(obj: Any, backend: str, weak: bool) -> Callable[..., Any]:
    import ember
    from ember.capture import output

    if weak:
        return ember.compile(obj, backend=backend)
    with mock.patch.object(output, "weak_names", lambda *a, **k: []):
        f = ember.compile(obj, backend=backend)
        f(*_INPUT[id(obj)])  # compiled (and its entry built) while patched
    return f


_INPUT: dict[int, tuple] = {}


def _case(kind: str, tag: str) -> tuple[Any, tuple]:
    if kind == "add":
        fn = _fresh(_ADD, "add_one", tag)
        args: tuple = (torch.randn(4),)
    else:
        torch.manual_seed(0)
        fn = _fresh(_SEQ, "Seq", tag)(*[nn.Linear(2, 2) for _ in range(100)]).eval()
        args = (torch.randn(1, 2),)
    _INPUT[id(fn)] = args
    return fn, args


def _stub_graph(f: Callable[..., Any], fn: Any, args: tuple) -> None:
    """Replace the compiled graph behind ``f`` (compiled from ``fn``) by a function returning
    its last output: what remains per call is the wrapper (dispatch, guards, fetching inputs)."""
    from ember.capture import frame

    inner = getattr(f, "__dict__", {}).get("_ember_call")  # ember.compile(model): its own cache
    if inner is not None:
        (entry,) = inner.cache.entries
    else:
        (entry,) = [e for (c, _), cache in frame._code_caches.items() if c is fn.__code__
                    for e in cache.entries]
    g = entry.__globals__
    real, seen = g["___compiled"], []
    g["___compiled"] = lambda *xs: seen.append(real(*xs)) or seen[-1]
    f(*args)
    result = seen[-1]
    g["___compiled"] = lambda *xs: result


def _time(f: Callable[..., Any], args: tuple, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        f(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=31)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--backends", default="eager,inductor")
    p.add_argument("--stub", action="store_true",
                   help="replace each compiled graph by a stub: time the wrapper alone")
    a = p.parse_args(argv)
    rows = []
    with torch.no_grad():
        for backend in a.backends.split(","):
            for kind, label in (("add", "x + 1 (4 elements)"),
                                ("seq", "100 x Linear(2, 2), 200 params")):
                variants = {}
                for weak in (False, True):
                    fn, args = _case(kind, f"{backend}-{kind}-{weak}")
                    f = _compile(fn, backend, weak)
                    for _ in range(20):
                        f(*args)
                    variants["weak" if weak else "strong"] = (f, args)
                    if a.stub:
                        _stub_graph(f, fn, args)
                eager_fn, eager_args = _case(kind, f"eager-ref-{kind}")
                variants["eager (no compile)"] = (eager_fn, eager_args)
                times: dict[str, list[float]] = {k: [] for k in variants}
                names = list(variants)
                for s in range(a.samples):
                    for k in names[s % len(names):] + names[:s % len(names)]:
                        f, args = variants[k]
                        times[k].append(_time(f, args, a.calls))
                med = {k: statistics.median(v) for k, v in times.items()}
                rows.append((backend, label, med["eager (no compile)"], med["strong"],
                             med["weak"], med["weak"] - med["strong"]))
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; samples {a.samples} x "
          f"{a.calls} calls; µs per call (median)"
          f"{'; compiled graphs stubbed (wrapper only)' if a.stub else ''}\n")
    print("| backend | program | eager | ember strong (before) | ember weak (after) | "
          "after - before |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b, label, e, s, w, d in rows:
        print(f"| {b} | {label} | {e:.2f} | {s:.2f} | {w:.2f} | {d:+.2f} |")


if __name__ == "__main__":
    main()
