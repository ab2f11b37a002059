"""Machine-level calibration: from how much work an OpenMP parallel loop pays, on this machine.

The C++ generator (``codegen/cpp.py``) runs a loop nest with ``#pragma omp parallel for`` when its
work (elements times inner length) reaches :func:`parallel_min_work`, and serially below (a
parallel region costs a fork and a join: microseconds, more on a machine with many cores or
several sockets, less with few threads). That crossover is a property of the machine, not of a
graph, so it is measured once per machine (CPU model, ISA, thread count, torch version: the key
of :func:`ember_inductor.autotune.machine`) and kept in the on-disk cache; every later compile,
in any process, reads it.

The measurement: one small C++ library (built and cached like every kernel) with the same
pointwise loop (``b[i] = (a[i] * 1.5f + b[i]) / (1 + sqrt(a[i]))``, float32: a division and a
square root per element, between the cheapest generated loops, a copy or an add, and those
calling ``exp`` or ``sin``; the work measure of the generator does not weigh operations) run serially
and as ``omp parallel for``, at sizes from 2^10 to 2^20 elements; each size is repeated inside the
library (up to 128 times, about 2^20 elements a call) so that the call overhead counts little,
and the two variants are interleaved over a few rounds (the fastest of each). The threshold is the smallest
size from which the parallel loop is faster at that size and every larger size measured,
clamped to
[:data:`MIN_WORK`, :data:`MAX_WORK`]: past 2^20 elements a parallel loop pays on any machine
with more than one thread that is not overloaded, and the clamp keeps one noisy calibration
(a burst of load from other work) from making every loop serial. With one thread there is
nothing to decide: loops are never worth a parallel region (``1 << 62``).

``options={"parallel_min_work": n}`` (inductor option) forces the threshold.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter
from typing import Any

__all__ = ["parallel_min_work", "DEFAULT", "MIN_WORK", "MAX_WORK", "counters", "override"]

log = logging.getLogger("ember.inductor.calibrate")

#: the threshold before calibration (and where it cannot run: no compiler, a failure)
DEFAULT = 32768
MIN_WORK = 1 << 10
MAX_WORK = 1 << 20
#: one thread: never a parallel region
SERIAL = 1 << 62
_SIZES = [1 << k for k in range(10, 21)]
_ROUNDS = 3
_ELEMENTS_PER_CALL = 1 << 20
#: repetitions inside one call at most (a parallel region on a loaded machine can cost a
#: millisecond: the calibration stays well under a second)
_MAX_REPS = 128

#: ``measured``: calibrations run; ``cached``: read from the on-disk cache
counters: Counter[str] = Counter()

#: a value forced for the code generated now (the option; tests): None: calibrated
override: list[int | None] = [None]

_SOURCE = r"""
extern "C" void ember_cal_serial(const float* __restrict__ a, float* __restrict__ b,
                                 long long n, long long reps) {
  for (long long r = 0; r < reps; r++) {
    for (long long i = 0; i < n; i++) b[i] = (a[i] * 1.5f + b[i]) / (1.0f + __builtin_sqrtf(a[i]));
  }
}
extern "C" void ember_cal_parallel(const float* __restrict__ a, float* __restrict__ b,
                                   long long n, long long reps) {
  for (long long r = 0; r < reps; r++) {
    #pragma omp parallel for
    for (long long i = 0; i < n; i++) b[i] = (a[i] * 1.5f + b[i]) / (1.0f + __builtin_sqrtf(a[i]));
  }
}
"""


def _measure() -> dict[int, tuple[float, float]]:
    """{size: (serial seconds, parallel seconds)} per element-pass, the fastest of interleaved
    rounds."""
    import ctypes

    import torch

    from .runtime.cache import load_cpp

    lib = load_cpp(_SOURCE)
    fns = {"serial": lib.ember_cal_serial, "parallel": lib.ember_cal_parallel}
    for f in fns.values():
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
        f.restype = None
    a = torch.rand(_SIZES[-1])
    b = torch.rand(_SIZES[-1])
    out: dict[int, tuple[float, float]] = {}
    for n in _SIZES:
        reps = max(1, min(_MAX_REPS, _ELEMENTS_PER_CALL // n))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for f in fns.values():  # warm-up (thread pool start, page faults)
            f(a.data_ptr(), b.data_ptr(), n, 1)
        for _ in range(_ROUNDS):
            for k, f in fns.items():
                t = time.perf_counter()
                f(a.data_ptr(), b.data_ptr(), n, reps)
                times[k].append((time.perf_counter() - t) / reps)
        # the fastest round: load from other work only adds time (see autotune._time_all)
        out[n] = (min(times["serial"]), min(times["parallel"]))
    return out


def threshold_from(times: dict[int, tuple[float, float]]) -> int:
    """The smallest size from which the parallel loop is faster at that size and at every
    larger one, clamped to [MIN_WORK, MAX_WORK]."""
    best = MAX_WORK
    for n in sorted(times, reverse=True):
        serial, parallel = times[n]
        if parallel < serial:
            best = n
        else:
            break
    return max(MIN_WORK, min(MAX_WORK, best))


@functools.lru_cache(maxsize=None)
def _calibrated(key: str, threads: int) -> int:
    from .autotune import machine
    from .runtime.cache import get_text, put_text

    if threads <= 1:
        return SERIAL
    text = get_text("calibrate", key)
    if text is not None:
        try:
            value = int(json.loads(text)["parallel_min_work"])
            counters["cached"] += 1
            return value
        except (ValueError, KeyError, TypeError):
            pass
    try:
        t0 = time.perf_counter()
        times = _measure()
        value = threshold_from(times)
    except Exception as e:  # no compiler, a failed build: the default, not cached
        log.info("OpenMP threshold calibration failed (%s: %s); using %d",
                 type(e).__name__, e, DEFAULT)
        return DEFAULT
    counters["measured"] += 1
    put_text("calibrate", key, json.dumps({
        "parallel_min_work": value, "machine": machine(),
        "us_per_call": {str(n): [s * 1e6, p * 1e6] for n, (s, p) in times.items()}}))
    log.debug("OpenMP parallel threshold: %d elements (calibrated in %.2fs)", value,
              time.perf_counter() - t0)
    return value


def parallel_min_work() -> int:
    """Work (elements x inner length) from which a generated loop nest runs as an OpenMP
    parallel loop on this machine (calibrated once per machine and thread count)."""
    if override[0] is not None:
        return override[0]
    from .autotune import machine, machine_key

    return _calibrated("parallel_min_work|" + machine_key(), int(machine()["threads"]))


def machine_info() -> dict[str, Any]:
    """For reports: the calibrated threshold and the machine it was measured on."""
    from .autotune import machine

    return {"parallel_min_work": parallel_min_work(), **machine()}


# -- the tile of column reductions ----------------------------------------------------------------

#: outputs per tile of the column form (codegen/cpp.py ``column_reduction``): the candidates
#: timed, and the tile used before calibration or where it cannot run
TILE_CANDIDATES = (64, 128, 256, 512, 1024)
DEFAULT_TILE = 256
#: the shape timed: a mean and a variance (two dependent blocks, as the generated code runs them)
#: over the rows of a [ROWS, COLS] float32 matrix, column tiles across COLS
_TILE_ROWS, _TILE_COLS = 256, 2048
_TILE_ROUNDS = 5

#: a tile forced for the code generated now (tests): None: calibrated
tile_override: list[int | None] = [None]

_TILE_SOURCE = r"""
template <int T>
static void colvar(const float* __restrict__ a, float* __restrict__ out, long long rows,
                   long long cols) {
  for (long long xt = 0; xt < cols; xt += T) {
    const long long xe = xt + T < cols ? xt + T : cols;
    float acc0[T];
    for (long long x = xt; x < xe; x++) acc0[x - xt] = 0.0f;
    for (long long r = 0; r < rows; r++) {
      #pragma omp simd
      for (long long x = xt; x < xe; x++) acc0[x - xt] = acc0[x - xt] + a[r * cols + x];
    }
    float val0[T];
    for (long long x = xt; x < xe; x++) val0[x - xt] = acc0[x - xt] / (float)rows;
    float acc1[T];
    for (long long x = xt; x < xe; x++) acc1[x - xt] = 0.0f;
    for (long long r = 0; r < rows; r++) {
      #pragma omp simd
      for (long long x = xt; x < xe; x++) {
        float d = a[r * cols + x] - val0[x - xt];
        acc1[x - xt] = acc1[x - xt] + d * d;
      }
    }
    for (long long x = xt; x < xe; x++) out[x] = acc1[x - xt];
  }
}
@@WRAPPERS@@
"""


def _tile_source() -> str:
    wrappers = "\n".join(
        f'extern "C" void ember_cal_tile{t}(const float* a, float* o, long long r, long long c, '
        f'long long reps) {{ for (long long i = 0; i < reps; i++) colvar<{t}>(a, o, r, c); }}'
        for t in TILE_CANDIDATES)
    return _TILE_SOURCE.replace("@@WRAPPERS@@", wrappers)


def _measure_tiles() -> dict[int, float]:
    """{tile: seconds per pass over the matrix}, the fastest of interleaved rounds."""
    import ctypes

    import torch

    from .runtime.cache import load_cpp

    lib = load_cpp(_tile_source())
    fns = {}
    for t in TILE_CANDIDATES:
        f = getattr(lib, f"ember_cal_tile{t}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_longlong] * 3
        f.restype = None
        fns[t] = f
    a = torch.rand(_TILE_ROWS, _TILE_COLS)
    o = torch.empty(_TILE_COLS)
    reps = 4
    times: dict[int, list[float]] = {t: [] for t in fns}
    for f in fns.values():  # warm-up (page faults, caches)
        f(a.data_ptr(), o.data_ptr(), _TILE_ROWS, _TILE_COLS, 1)
    for _ in range(_TILE_ROUNDS):
        for t, f in fns.items():
            t0 = time.perf_counter()
            f(a.data_ptr(), o.data_ptr(), _TILE_ROWS, _TILE_COLS, reps)
            times[t].append((time.perf_counter() - t0) / reps)
    return {t: min(v) for t, v in times.items()}


@functools.lru_cache(maxsize=None)
def _tile_calibrated(key: str) -> int:
    from .autotune import machine
    from .runtime.cache import get_text, put_text

    text = get_text("calibrate", key)
    if text is not None:
        try:
            value = int(json.loads(text)["column_tile"])
            if value in TILE_CANDIDATES:
                counters["cached"] += 1
                return value
        except (ValueError, KeyError, TypeError):
            pass
    try:
        t0 = time.perf_counter()
        times = _measure_tiles()
    except Exception as e:  # no compiler, a failed build: the default, not cached
        log.info("column tile calibration failed (%s: %s); using %d", type(e).__name__, e,
                 DEFAULT_TILE)
        return DEFAULT_TILE
    # the fastest; a smaller tile within 2% of it (noise) is kept instead (less stack, more
    # tiles to share among threads)
    best = min(times, key=times.__getitem__)
    value = min(t for t in TILE_CANDIDATES if times[t] <= times[best] * 1.02)
    counters["measured"] += 1
    put_text("calibrate", key, json.dumps({
        "column_tile": value, "machine": machine(),
        "us_per_pass": {str(t): s * 1e6 for t, s in times.items()}}))
    log.debug("column reduction tile: %d outputs (calibrated in %.2fs: %s)", value,
              time.perf_counter() - t0, {t: round(s * 1e6, 1) for t, s in times.items()})
    return value


def column_tile() -> int:
    """Outputs per tile of the column form of reductions over strided values (codegen/cpp.py):
    the fastest of :data:`TILE_CANDIDATES` on this machine, timed once per machine (CPU model,
    ISA, threads, torch version) on a mean and variance over the rows of a 256x2048 matrix, and
    kept in the on-disk cache."""
    if tile_override[0] is not None:
        return tile_override[0]
    from .autotune import machine_key

    return _tile_calibrated("column_tile|" + machine_key())
