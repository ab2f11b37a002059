"""Hand a captured graph to a backend: directly (level "torch") or through AOT autograd ("aten")."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from . import events
from .exc import BackendCompilerFailed, EmberError, InferenceOnlyBackend
from .plugins import Backend, graph_passes

__all__ = ["compile_graph"]

log = logging.getLogger("ember.backends")


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _run_passes(gm: torch.fx.GraphModule, stage: str) -> torch.fx.GraphModule:
    for p in graph_passes(stage):
        out = p(gm)
        if out is not None:
            gm = out
    return gm


def _global_state() -> tuple:
    return (torch.is_grad_enabled(),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                  for d in ("cpu", "cuda")))


def _set_global_state(state: tuple) -> None:
    grad, autocast = state
    torch._C._set_grad_enabled(grad)
    for d, enabled, dtype in autocast:
        torch.set_autocast_enabled(d, enabled)
        torch.set_autocast_dtype(d, dtype)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Backend,
                  options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Compile one captured torch-level graph with ``backend``; returns a callable taking the
    graph's inputs as positional arguments and returning its outputs."""
    options = dict(options or {})
    if not backend.training and _needs_grad(example_inputs):
        raise InferenceOnlyBackend(
            f"backend {backend.name!r} is inference-only, but this graph needs gradients (an input "
            "requires grad and grad mode is on). Run under torch.no_grad()/inference_mode(), or "
            "use a backend that supports training (e.g. 'aot_eager' or 'inductor')."
        )
    gm = _run_passes(gm, "torch")
    t0 = time.perf_counter()
    state = _global_state()
    try:
        if backend.level == "aten":
            from .aot import aot_compile  # late: AOT autograd is only needed by aten backends

            compiled = aot_compile(gm, list(example_inputs), backend=backend, options=options)
        else:
            compiled = backend.compile(gm, list(example_inputs), **options)
    except EmberError:
        raise
    except Exception as e:
        _set_global_state(state)
        raise BackendCompilerFailed(
            f"backend {backend.name!r} ({backend.distribution}) failed to compile a graph: "
            f"{type(e).__name__}: {e}"
        ) from e
    # Tracing a graph (AOT autograd runs it) executes its grad-mode and autocast switches:
    # compiling must leave the caller's state as it found it.
    _set_global_state(state)
    if not callable(compiled):
        raise BackendCompilerFailed(
            f"backend {backend.name!r} returned {type(compiled).__name__}, expected a callable")
    events.emit("backend_compiled", backend=backend.name, seconds=time.perf_counter() - t0,
                nodes=len(gm.graph.nodes))
    return compiled
