"""May Ember start worker processes here?

Python forbids a daemonic process (a ``multiprocessing`` worker, a ``torch.multiprocessing``
rank started with ``daemon=True``, some launchers' and data loaders' workers) to start children:
``Process.start()`` raises ``AssertionError: daemonic processes are not allowed to have
children``. Code that would use a process pool (parallel kernel builds) asks
:func:`process_pool_allowed` first and falls back to threads or to building in-process.
Ember's C++ builds use threads running compiler subprocesses (``subprocess`` is allowed in a
daemonic process), so they need no fallback.
"""

from __future__ import annotations

import multiprocessing

__all__ = ["process_pool_allowed"]


def process_pool_allowed() -> bool:
    """False inside a daemonic process, where starting a ``multiprocessing`` child fails."""
    try:
        return not multiprocessing.current_process().daemon
    except Exception:
        return False
