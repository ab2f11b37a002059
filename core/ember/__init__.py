"""Ember: a compiler for PyTorch programs.

    import ember
    fast = ember.compile(model, backend="inductor")
    ember.list_backends()
"""

from __future__ import annotations

from . import config
from ._logging import set_logs
from .api import OptimizedModule, compile, disable, is_compiling, reset
from .api import captures, last_capture
from .api import mark_dynamic, mark_static
from .api import cudagraph_mark_step_begin
from .context import CompileContext
from .exc import (BackendCompilerFailed, BackendConflict, BackendLoadError, BackendNotFound,
                  DeviceUnavailable, EmberError, GraphBreakError, InferenceOnlyBackend,
                  NotImplementedYet, RankDivergence, UnknownOption, Unsupported)
from .hookspecs import hookimpl
from .plugins import Backend, get_backend, list_backends, register_backend
from . import precompile  # a callable module: ember.precompile(fn, ...), ember.precompile.load

__version__ = "0.1.0"

__all__ = [
    "compile", "disable", "reset", "is_compiling", "list_backends", "register_backend",
    "get_backend", "Backend", "hookimpl", "OptimizedModule", "config", "set_logs",
    "EmberError", "BackendNotFound", "BackendLoadError", "BackendConflict", "BackendCompilerFailed",
    "Unsupported", "GraphBreakError", "NotImplementedYet", "InferenceOnlyBackend", "allow_in_graph", "explain",
    "CompileContext", "precompile", "UnknownOption",
]
__all__ += ["mark_dynamic", "mark_static", "DynamicShapeError", "RankDivergence",
            "DeviceUnavailable", "cudagraph_mark_step_begin"]


def allow_in_graph(fn):  # noqa: ANN001, ANN201 - documented in the user guide
    """Call ``fn`` inside the graph as one opaque node instead of tracing into it."""
    from .capture.frame import mark_allow_in_graph

    return mark_allow_in_graph(fn)


def explain(fn, **compile_kwargs):  # noqa: ANN001, ANN201
    """``ember.explain(fn)(*args)`` runs fn once under Ember and returns an ExplainReport."""
    from .api import compile as _compile, reset as _reset
    from .capture.explain import explain as _explain

    return _explain(fn, compile_fn=_compile, reset_fn=_reset, **compile_kwargs)


def __getattr__(name: str):  # noqa: ANN202
    # DynamicShapeError lives with symbolic shapes (sympy, ShapeEnv): imported on first use, so
    # that ``import ember`` (and loading a precompiled artifact) does not pay for them.
    if name == "DynamicShapeError":
        from .capture.symbolic import DynamicShapeError

        return DynamicShapeError
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
