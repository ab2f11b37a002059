"""Measurements: interleaved timing, peak memory, per-call overhead, cold/warm compile probes."""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .backends import make_compiled

__all__ = ["Progress", "sync_fn", "time_interleaved", "peak_memory_mb", "per_call_overhead",
           "compile_probe", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent


class Progress:
    """One line per step on stderr (through rich when installed), with the run's elapsed time."""

    def __init__(self, quiet: bool = False):
        self.t0 = time.perf_counter()
        self.quiet = quiet
        try:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        except ImportError:  # pragma: no cover
            self._console = None

    def __call__(self, msg: str) -> None:
        if self.quiet:
            return
        line = f"[{time.perf_counter() - self.t0:7.1f}s] {msg}"
        if self._console is not None:
            self._console.print(line, markup=False)
        else:  # pragma: no cover
            print(line, file=sys.stderr, flush=True)


def sync_fn(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def time_interleaved(steps: dict[str, Callable[[], Any]], device: str, iters: int,
                     max_seconds: float, before: Callable[[str], None] | None = None,
                     min_iters: int = 5) -> dict[str, list[float]]:
    """Seconds per call of every step, alternating steps within each iteration (the order rotates
    every iteration so no backend always runs right after another). Stops after ``iters``
    iterations or ``max_seconds``, whichever comes first, but runs at least ``min_iters``.

    On CUDA each call is timed with a pair of CUDA events (device time, synchronised per call),
    right after one untimed call of the same step: a step is timed in its steady state, as in
    a loop of its own, not in the state the previous step left (its weights out of the L2
    cache, which holds a small model whole, and the clocks of a GPU that a host-bound eager
    step kept idle). Without it, whichever step followed eager in the rotation was slowest:
    the same CUDA-graph replay took 0.59 ms after eager and 0.42 ms after itself (GPT-2 small,
    H100, 2026-12-07).
    ``before(name)`` runs untimed before each call (e.g. to clear gradients).
    """
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    cuda = device.startswith("cuda")
    sync = sync_fn(device)
    if cuda:
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t_end = time.perf_counter() + max_seconds
    for i in range(iters):
        if i >= min_iters and time.perf_counter() > t_end:
            break
        k = i % len(names)
        for n in names[k:] + names[:k]:
            if cuda:  # the untimed call that puts the step in its steady state
                if before is not None:
                    before(n)
                steps[n]()
            if before is not None:
                before(n)
            sync()
            if cuda:
                start_ev.record()
                steps[n]()
                end_ev.record()
                end_ev.synchronize()
                times[n].append(start_ev.elapsed_time(end_ev) / 1e3)
            else:
                t0 = time.perf_counter()
                steps[n]()
                times[n].append(time.perf_counter() - t0)
    return times


def _proc_status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory_mb(step: Callable[[], Any], device: str) -> float | None:
    """Peak memory one call of ``step`` adds over what is resident before it, in MiB.

    CUDA: ``torch.cuda.max_memory_allocated`` after a peak reset. CPU: the process's peak RSS
    (Linux ``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs``, after ``malloc_trim``)
    minus RSS before the call: includes allocator slack, so a rough figure; ``None`` where the
    kernel does not allow the reset.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        # Hand freed heap pages back to the OS first: otherwise the step reuses pages that are
        # already resident and the peak never moves.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    base = _proc_status("VmRSS")
    step()
    peak = _proc_status("VmHWM")
    if base is None or peak is None:
        return None
    return max(peak - base, 0) / 2**20


_TINY_SRC = "def tiny(x):\n    return x + 1\n"


def _fresh_tiny(tag: str) -> Callable[[Any], Any]:
    # A distinct code object per backend, so no compiler's per-code cache is shared between them.
    ns: dict[str, Any] = {}
    exec(compile(_TINY_SRC, f"<benchmarks-tiny-{tag}>", "exec"), ns)
    return ns["tiny"]


def per_call_overhead(backends: list[str], device: str, samples: int = 30,
                      calls: int = 200) -> dict[str, dict[str, Any]]:
    """Microseconds per call of ``x + 1`` on 4 elements for every backend, interleaved; and the
    difference to eager. A backend that fails is reported with its error."""
    x = torch.randn(4, device=device) + 2.0
    fns: dict[str, Callable[[], Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for b in backends:
        try:
            f = make_compiled(b, _fresh_tiny(b))
            for _ in range(3):
                f(x)
            fns[b] = f
        except Exception as e:
            out[b] = {"us_per_call": None, "overhead_us": None,
                      "note": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    sync = sync_fn(device)
    per: dict[str, list[float]] = {b: [] for b in fns}
    for i in range(samples):
        order = list(fns)
        k = i % max(len(order), 1)
        for b in order[k:] + order[:k]:
            f = fns[b]
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                f(x)
            sync()
            per[b].append((time.perf_counter() - t0) / calls * 1e6)
    eager = statistics.median(per["eager"]) if per.get("eager") else None
    for b, ts in per.items():
        med = statistics.median(ts)
        out[b] = {"us_per_call": med, "overhead_us": None if eager is None else med - eager,
                  "note": ""}
    return out


def compile_probe(model: str, backend: str, device: str, mode: str, size: str, amp: bool,
                  cache_dir: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m benchmarks probe`` in a fresh process whose compiler caches live in
    ``cache_dir`` (Ember's, Inductor's and Triton's); returns its JSON answer or an error."""
    env = dict(os.environ)
    env.update({
        "EMBER_CACHE_DIR": os.path.join(cache_dir, "ember"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"),
        "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]),
    })
    cmd = [sys.executable, "-m", "benchmarks", "probe", "--model", model, "--backend", backend,
           "--device", device, "--mode", mode, "--size", size] + (["--amp"] if amp else [])
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(p.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"probe exited {p.returncode}: {tail[:160]}"}


def new_cache_dir() -> str:
    return tempfile.mkdtemp(prefix="ember-bench-cache-")
