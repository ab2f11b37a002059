"""The public entry points: ``ember.compile`` and friends."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import torch

from .plugins import Backend, get_backend

__all__ = ["compile", "disable", "reset", "is_compiling", "OptimizedModule", "SUPPORTED_PYTHONS"]

F = TypeVar("F", bound=Callable[..., Any])

SUPPORTED_PYTHONS = ((3, 11), (3, 12))

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_python() -> None:
    v = sys.version_info[:2]
    if v not in SUPPORTED_PYTHONS:
        if v > SUPPORTED_PYTHONS[-1]:
            raise RuntimeError(
                f"ember.compile is not supported on Python {v[0]}.{v[1]}: Ember's bytecode capture "
                "supports CPython 3.11 and 3.12 only (Python 3.13+ is not supported yet). "
                "Use Python 3.11 or 3.12, or run the model without ember.compile.")
        raise RuntimeError(
            f"ember.compile is not supported on Python {v[0]}.{v[1]}: Ember's bytecode capture "
            "supports CPython 3.11 and 3.12 only. Use Python 3.11 or 3.12.")


class OptimizedModule(torch.nn.Module):
    """Wraps an ``nn.Module``: calls go through Ember, everything else reaches the original.

    Parameters, ``state_dict``, ``train()``/``eval()`` and attribute reads pass through to
    ``_orig_mod``; ``state_dict`` keys are those of the original module (no prefix).
    """

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable[..., Any]):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_ember_call"] = compiled_call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_ember_call"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> "OptimizedModule":
        self._orig_mod.train(mode)
        super().train(mode)
        return self

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def compile(model: Any = None, *, backend: str | Callable[..., Any] | Backend = "inductor",
            mode: str | None = None, options: dict[str, Any] | None = None,
            fullgraph: bool = False, dynamic: bool | None = None, disable: bool = False) -> Any:
    """Compile a function or ``nn.Module`` with Ember.

    Usable as ``fast = ember.compile(model, backend="eager")`` and as a decorator
    (``@ember.compile`` or ``@ember.compile(backend="eager")``). The result returns what the
    original returns; what Ember cannot compile runs eagerly, with the reason logged
    (``EMBER_LOGS=graph_breaks,fallback``). ``fullgraph=True`` makes any break an error.
    ``backend`` is a name from :func:`ember.list_backends`, an :class:`ember.Backend`, or a
    callable ``(gm, example_inputs) -> callable``.
    """
    if model is None:
        return functools.partial(compile, backend=backend, mode=mode, options=options,
                                 fullgraph=fullgraph, dynamic=dynamic, disable=disable)
    if mode not in _MODES:
        raise ValueError(f"ember.compile: unknown mode {mode!r}; expected one of {_MODES[1:]}")
    if options is not None and mode is not None:
        raise ValueError("ember.compile: pass either mode= or options=, not both (as torch.compile)")
    if disable:
        return model
    _check_python()
    if dynamic:
        import logging
        logging.getLogger("ember").warning(
            "ember.compile(dynamic=True): Ember compiles static shapes only for now; a new input "
            "shape recompiles (up to ember.config.recompile_limit). Pass dynamic=None to silence.")
    be = get_backend(backend)  # unknown names fail here, at compile(), with the list of backends
    opts = dict(options or {})
    if mode is not None:
        opts["mode"] = mode
    from .capture.frame import CompiledFunction

    if isinstance(model, torch.nn.Module):
        inner = CompiledFunction(type(model).forward, be, opts, fullgraph=fullgraph,
                                 bound_self=model, dynamic=dynamic)
        return OptimizedModule(model, inner)
    if not callable(model):
        raise TypeError(f"ember.compile expects a function or nn.Module, got {type(model).__name__}")
    return functools.wraps(model)(CompiledFunction(model, be, opts, fullgraph=fullgraph,
                                                   dynamic=dynamic))


def disable(fn: F | None = None, *, recursive: bool = True) -> Any:
    """Never compile ``fn`` nor (``recursive=True``, the default) anything it calls; inside a
    compiled region a call to it is a graph break that runs it eagerly. With
    ``recursive=False`` only ``fn`` itself is excluded: ember-compiled functions it calls still
    run compiled. Usable as a decorator."""
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    from .capture.frame import mark_disabled

    return mark_disabled(fn, recursive=recursive)


def reset() -> None:
    """Forget every compiled entry, guard and counter (as torch.compiler.reset())."""
    from . import events
    from .capture.frame import reset_caches

    reset_caches()
    events.counters.clear()


def is_compiling() -> bool:
    """True while Ember is tracing (inside a compiled region's capture), else False."""
    from .capture.frame import is_compiling as _ic

    return _ic()
