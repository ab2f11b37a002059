"""The ``ops`` handler: IR bodies (``inner_fn``) call ``ops.load``, ``ops.add``, ``ops.exp`` ... and
whichever handler is installed decides what that means: the C++ code generator emits a line of C++,
the dependency analysis records which buffers are read at which index. A Triton code generator is
one more handler over the same IR.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

__all__ = ["ops", "set_ops_handler"]

_state = threading.local()


class _OpsProxy:
    def __getattr__(self, name: str) -> Any:
        handler = getattr(_state, "handler", None)
        if handler is None:
            raise RuntimeError(f"ops.{name} called with no ops handler installed")
        return getattr(handler, name)


ops: Any = _OpsProxy()


@contextlib.contextmanager
def set_ops_handler(handler: Any) -> Iterator[Any]:
    prior = getattr(_state, "handler", None)
    _state.handler = handler
    try:
        yield handler
    finally:
        _state.handler = prior
