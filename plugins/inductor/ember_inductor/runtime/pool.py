"""The buffer pool of a generated wrapper: its internal buffers (written by its C++ kernels, dead
by the end of a call, never returned nor aliased by what it returns), kept allocated between calls.

A fresh CPU buffer of more than a few hundred KiB comes from ``mmap`` (or from heap the allocator
trimmed), so every call pays page faults on its first touch of each page; a kept buffer is already
mapped. The buffers hold no values between calls: each call writes them before reading them, as it
would a fresh ``torch.empty_strided``.

One call at a time takes the pool; a call that finds it taken (another thread, or a re-entrant
call) allocates fresh buffers, as a wrapper without a pool does. Buffers with symbolic sizes are
made for the sizes of the call that takes the pool; a call with other sizes drops them and makes
new ones. Imports only the standard library (the wrapper imports it; so does a precompiled
artifact).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["BufferPool"]


class BufferPool:
    """``make(*sizes)`` returns the list of buffers; ``take(*sizes)`` returns that list (kept
    from an earlier call when ``sizes`` are the same) or, when the pool is taken, a fresh one;
    ``release(buffers)`` gives it back (in a ``finally``: an exception releases it too)."""

    def __init__(self, make: Callable[..., list[Any]]):
        self._make = make
        self._lock = threading.Lock()
        self._sizes: tuple[Any, ...] | None = None
        self._buffers: list[Any] | None = None

    def take(self, *sizes: Any) -> list[Any]:
        if not self._lock.acquire(False):
            return self._make(*sizes)  # taken: this call's buffers are its own
        try:
            if sizes != self._sizes or self._buffers is None:
                self._buffers = None  # the old ones go before the new ones are made
                self._buffers = self._make(*sizes)
                self._sizes = sizes
        except BaseException:
            self._lock.release()
            raise
        return self._buffers

    def release(self, buffers: list[Any]) -> None:
        if buffers is self._buffers and self._lock.locked():
            self._lock.release()

    def clear(self) -> None:
        """Drop the kept buffers (they are made again by the next call)."""
        with self._lock:
            self._buffers = None
            self._sizes = None

    @property
    def nbytes(self) -> int:
        """Bytes the kept buffers hold (0 before the first call)."""
        bufs = self._buffers or []
        return sum(b.untyped_storage().nbytes() for b in bufs)
