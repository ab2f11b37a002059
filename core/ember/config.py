"""Ember configuration.

Every setting is a module attribute with a default; an ``EMBER_<NAME>`` environment variable
overrides it at import time (``EMBER_RECOMPILE_LIMIT=4``). Change settings at run time by plain
assignment (``ember.config.recompile_limit = 4``) or temporarily with :func:`patch`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

__all__ = ["recompile_limit", "suppress_errors", "verbose", "cache_dir", "aot_cache",
           "persist_capture", "dist_check", "dist_timeout", "dist_compile_once", "cpu_isa",
           "patch"]

#: Guard misses for one code object before Ember gives up and runs it eagerly.
recompile_limit: int = 8
#: Internal compile errors fall back to eager (True) or are raised (False, for debugging Ember).
suppress_errors: bool = True
#: Log full tracebacks of internal errors, not only their one-line reason.
verbose: bool = False
#: Root of Ember's on-disk caches.
cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "ember")
#: Reuse AOT autograd's forward/backward graphs from the on-disk cache (ember/aot/cache.py).
aot_cache: bool = True
#: Store captures on disk and rebuild them in later processes without tracing, after checking
#: every object they refer to and the entry's guards (ember/capture/persist.py).
#: ``EMBER_PERSIST_CAPTURE=0`` turns it off.
persist_capture: bool = True
#: Under torch.distributed (initialized, world size > 1): check at each compile that every rank
#: compiles the same graph, raising ember.RankDivergence instead of hanging (ember/distributed).
dist_check: bool = True
#: Seconds a rank waits for the others at a compile (their graph hash, or rank 0's compile of a
#: graph the ranks share through the cache) before raising ember.RankDivergence.
dist_timeout: float = 600.0
#: Ranks on one host sharing the cache directory: rank 0 compiles each graph first, the others
#: wait and then compile from what it wrote to the on-disk caches (one rank builds every kernel).
#: Off by default: on a host with a core per rank, compiling at once is as fast (the kernel
#: cache's per-entry lock already keeps two ranks from building one kernel), see
#: docs/distributed.md; on for many ranks sharing few cores, or compiles short of memory.
dist_compile_once: bool = False
#: Inline calls to user functions up to this depth (deeper calls are a graph break).
max_inline_depth: int = 64
#: Debug mode of code-generating backends (inductor's ``debug_fill`` option): every buffer they
#: allocate or reuse is filled with a NaN pattern first, and what kernels write and graphs return
#: is checked for it (``EMBER_DEBUG_FILL=1``). Slow.
debug_fill: bool = False
#: The instruction set the inductor backend's C++ is built for: "native" (this CPU, gcc's
#: -march=native) or a lower x86-64 level ("x86-64-v4" AVX-512, "x86-64-v3" AVX2, "x86-64-v2",
#: "x86-64"), e.g. to run and measure the AVX2 code on an AVX-512 machine. The inductor option
#: ``cpu_isa`` overrides it per compile. ``EMBER_CPU_ISA=x86-64-v3``.
cpu_isa: str = "native"


def _coerce(current: Any, raw: str) -> Any:
    if isinstance(current, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(current, int):
        return int(raw)
    if isinstance(current, float):
        return float(raw)
    return raw


def _apply_env() -> None:
    g = globals()
    for name in ("recompile_limit", "suppress_errors", "verbose", "cache_dir", "max_inline_depth",
                 "aot_cache", "persist_capture", "debug_fill", "dist_check", "dist_timeout",
                 "dist_compile_once", "cpu_isa"):
        raw = os.environ.get("EMBER_" + name.upper())
        if raw is not None:
            g[name] = _coerce(g[name], raw)


@contextlib.contextmanager
def patch(**settings: Any) -> Iterator[None]:
    """Temporarily change settings: ``with ember.config.patch(recompile_limit=2): ...``."""
    g = globals()
    unknown = [k for k in settings if k not in g or k.startswith("_")]
    if unknown:
        raise AttributeError(f"ember.config has no setting(s) {unknown}")
    old = {k: g[k] for k in settings}
    g.update(settings)
    try:
        yield
    finally:
        g.update(old)


_apply_env()
