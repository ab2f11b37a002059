"""The dynamic-shapes sweep, timed: Ember and torch.compile side by side in one process.

    python -m benchmarks.dynamic_sweep [--models gpt2,bert,llama] [--backends ember-inductor,torch-inductor]
                                       [--mode infer|train] [--lengths 50] [--iters 20]

For each zoo model (its ``small`` config, batch 4) and backend, with every cache of that backend
reset first and ``dynamic=None`` (automatic dynamic, both compilers' default):

* ``sweep s``: wall time of one call at each of N distinct sequence lengths (16..127, in a fixed
  shuffled order), compiles included; the same sweep in eager is the first row;
* ``graphs``: graphs compiled during the sweep (Ember: its capture counter; torch.compile: dynamo's
  ``unique_graphs``) — at most two is the goal: static first, then one dynamic graph;
* ``dyn ms`` / ``static ms``: steady-state median of ``--iters`` calls at one length (96) on the
  graph the sweep left (dynamic), and on a fresh ``dynamic=False`` compile at that length;
  ``dyn/static`` is their ratio (the goal: within 1.10).

CPU timings use ``time.perf_counter``; on CUDA every call is followed by a synchronize. Not a unit
test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from typing import Any, Callable

import torch

from . import zoo

STEADY_LENGTH = 96


def _lengths(n: int) -> list[int]:
    pool = list(range(16, 128))
    rng = random.Random(0)
    picked = rng.sample(pool, n)
    return picked


def _ids(vocab: int, length: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(length)
    return torch.randint(0, vocab, (4, length), generator=g).to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step(fn: Callable[..., Any], ids: torch.Tensor, mode: str, model: torch.nn.Module) -> None:
    if mode == "infer":
        with torch.no_grad():
            fn(ids)
    else:
        out = fn(ids)
        zoo.reduce_to_loss(out).backward()
        model.zero_grad(set_to_none=True)


def _compile(name: str, model: torch.nn.Module, dynamic: bool | None) -> Callable[..., Any]:
    fam, _, inner = name.partition("-")
    inner = inner.replace("-", "_")
    if fam == "ember":
        import ember

        return ember.compile(model, backend=inner, dynamic=dynamic)
    if fam == "torch":
        return torch.compile(model, backend=inner, dynamic=dynamic)
    return model


def _reset(name: str) -> None:
    if name.startswith("ember"):
        import ember

        ember.reset()
    elif name.startswith("torch"):
        import torch._dynamo as dynamo  # the peer, measured here only

        dynamo.reset()
        dynamo.utils.counters.clear()


def _graphs(name: str) -> int | str:
    if name.startswith("ember"):
        from ember import events

        return events.counters["stats"]["graphs"]
    if name.startswith("torch"):
        import torch._dynamo as dynamo

        return dynamo.utils.counters["stats"]["unique_graphs"]
    return "-"


def _median_ms(fn: Callable[..., Any], ids: torch.Tensor, mode: str, model: torch.nn.Module,
               iters: int, device: str) -> float:
    for _ in range(3):
        _step(fn, ids, mode, model)
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        _step(fn, ids, mode, model)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(models: list[str], backends: list[str], mode: str, n: int, iters: int,
        device: str) -> list[dict[str, Any]]:
    rows = []
    lengths = _lengths(n)
    for mname in models:
        model, (example,) = zoo.get_spec(mname).build(device, "small")
        vocab = int(example.max()) + 1
        model.train(mode == "train")
        for bname in ["eager", *backends]:
            _reset(bname)
            gc.collect()
            fn = _compile(bname, model, None)
            t0 = time.perf_counter()
            try:
                for length in lengths:
                    _step(fn, _ids(vocab, length, device), mode, model)
                _sync(device)
            except Exception as e:  # reported, never raised
                rows.append({"model": mname, "backend": bname,
                             "error": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            sweep = time.perf_counter() - t0
            graphs = _graphs(bname)
            steady = _ids(vocab, STEADY_LENGTH, device)
            dyn_ms = _median_ms(fn, steady, mode, model, iters, device)
            if bname == "eager":
                static_ms = dyn_ms
            else:
                _reset(bname)
                static_ms = _median_ms(_compile(bname, model, False), steady, mode, model,
                                       iters, device)
            rows.append({"model": mname, "backend": bname, "graphs": graphs,
                         "sweep_s": sweep, "dyn_ms": dyn_ms, "static_ms": static_ms})
            print(f"# {mname} {bname}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict[str, Any]], mode: str, n: int) -> str:
    out = [f"| model | backend | graphs in the sweep | sweep s ({n} lengths, {mode}) | "
           f"dyn ms @{STEADY_LENGTH} | static ms @{STEADY_LENGTH} | dyn/static |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['backend']} | failed: {r['error']} | | | | |")
            continue
        ratio = r["dyn_ms"] / r["static_ms"] if r["static_ms"] else float("nan")
        out.append(f"| {r['model']} | {r['backend']} | {r['graphs']} | {r['sweep_s']:.2f} | "
                   f"{r['dyn_ms']:.2f} | {r['static_ms']:.2f} | {ratio:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_sweep")
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--backends", default="ember-inductor,torch-inductor")
    ap.add_argument("--mode", choices=("infer", "train"), default="infer")
    ap.add_argument("--lengths", type=int, default=50)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = run(a.models.split(","), [b for b in a.backends.split(",") if b], a.mode, a.lengths,
               a.iters, a.device)
    print(render(rows, a.mode, a.lengths))


if __name__ == "__main__":
    main()
