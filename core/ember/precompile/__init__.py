"""Precompile: a whole computation ahead of time, as standalone Python source plus a cache.

    art = ember.precompile(lambda model, x: model(x), model, x, backend="aot_eager")
    art.save("out/mlp")                      # out/mlp/artifact.py + out/mlp/artifact.cache
    fn = ember.precompile.load("out/mlp")    # in another process: no capture, no tracing
    y = fn(model, x)                         # weights are read from the model passed

``ember.precompile`` is this module, and calling it calls :func:`precompile`. See
docs/precompile.md for the artifact format, the checks, training and the backend protocol.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .container import CacheError
from .errors import PrecompileError, PrecompileGraphBreak
from .runtime import InputMismatchError

__all__ = ["precompile", "load", "Artifact", "Loaded", "PrecompileError", "PrecompileGraphBreak",
           "InputMismatchError", "CacheError"]


def precompile(fn: Any, *example_inputs: Any, backend: Any = "aot_eager",
               options: dict[str, Any] | None = None) -> Any:
    """Capture ``fn(*example_inputs)`` as one graph (a graph break is a
    :class:`PrecompileGraphBreak` listing each break), compile it with ``backend`` and return an
    :class:`Artifact` (``.source``, ``.cache``, ``.save(path)``, ``.load()``).

    Modules among the arguments are passed again at call time: their parameters and buffers are
    graph inputs, read from the model given to each call. ``fn`` may also be an ``nn.Module``
    (then the loaded callable takes the module first: ``loaded(model, *inputs)``).
    """
    from .build import precompile as _build

    return _build(fn, *example_inputs, backend=backend, options=options)


def load(path: str | None = None, *, source: str | None = None, cache: bytes | None = None
         ) -> Any:
    """Load an artifact saved by ``Artifact.save`` (or given as ``source=``/``cache=``) and
    return a :class:`Loaded` callable. Loading executes the artifact's source."""
    from .loader import load as _load

    return _load(path, source=source, cache=cache)


def __getattr__(name: str) -> Any:
    if name == "Artifact":
        from .build import Artifact
        return Artifact
    if name == "Loaded":
        from .loader import Loaded
        return Loaded
    raise AttributeError(name)


class _CallableModule(types.ModuleType):
    """``ember.precompile(fn, ...)`` calls :func:`precompile`; ``ember.precompile.load`` loads."""

    def __call__(self, fn: Any, *example_inputs: Any, backend: Any = "aot_eager",
                 options: dict[str, Any] | None = None) -> Any:
        return precompile(fn, *example_inputs, backend=backend, options=options)


sys.modules[__name__].__class__ = _CallableModule
