"""Hand a captured graph to a backend: directly (level "torch") or through AOT autograd ("aten")."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from . import events
from .context import CompileContext, InputInfo, device_of
from .exc import BackendCompilerFailed, EmberError, InferenceOnlyBackend
from .plugins import Backend, graph_passes
from .state import global_state, set_global_state

__all__ = ["compile_graph", "call_backend", "check_outputs", "takes_symbolic"]

log = logging.getLogger("ember.backends")


def takes_symbolic(backend: Any) -> bool:
    """Can ``backend`` compile graphs with symbolic sizes? ``level="torch"`` backends run the
    torch-level graph, which is valid for every size; ``level="aten"`` ones go through AOT
    autograd, which declares it with ``ember.aot.SUPPORTS_DYNAMIC`` (until then they compile
    static graphs: one per shape, as before). (Here rather than in capture: capture does not
    import the stages after it.)"""
    if getattr(backend, "level", "torch") != "aten":
        return True
    try:
        from . import aot
    except Exception:
        return False
    return bool(getattr(aot, "SUPPORTS_DYNAMIC", False))


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _run_passes(gm: torch.fx.GraphModule, stage: str) -> torch.fx.GraphModule:
    for p in graph_passes(stage):
        out = p(gm)
        if out is not None:
            gm = out
    return gm


# Kept under these names for the modules that import them from here.
_global_state = global_state
_set_global_state = set_global_state


def call_backend(backend: Backend, gm: torch.fx.GraphModule, example_inputs: list[Any],
                 options: dict[str, Any], context: CompileContext | None) -> Any:
    """``backend.compile(gm, example_inputs, **options)``, plus ``context=`` when the compile
    function declares a ``context`` parameter (opt-in, decided once per Backend)."""
    if context is not None and backend.accepts_context:
        return backend.compile(gm, example_inputs, **options, context=context)
    return backend.compile(gm, example_inputs, **options)


def make_context(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Backend,
                 options: dict[str, Any], inputs: Sequence[InputInfo] | None,
                 graph_id: str | None, fake_mode: Any = None) -> CompileContext:
    n = sum(1 for node in gm.graph.nodes if node.op == "placeholder")
    if inputs is None or len(inputs) != n:
        inputs = [InputInfo("user", node.target if isinstance(node.target, str) else "", False)
                  for node in gm.graph.nodes if node.op == "placeholder"]
    kind = "training" if _needs_grad(example_inputs) else "inference"
    return CompileContext(graph_id=graph_id or "graph", kind=kind, inputs=tuple(inputs),
                          device=device_of(example_inputs), mode=options.get("mode"),
                          options=options, backend=backend.name, fake_mode=fake_mode)


def _output_spec(gm: torch.fx.GraphModule) -> tuple[int | None, tuple[bool, ...]]:
    """(number of outputs, or None when the graph returns one bare value; per output whether
    it is a tensor)."""
    out = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if out is None:
        return None, ()
    res = out.args[0]

    def is_tensor(a: Any) -> bool:
        if not isinstance(a, torch.fx.Node):
            return False
        v = a.meta.get("example_value", a.meta.get("val"))
        return isinstance(v, torch.Tensor)

    if isinstance(res, (tuple, list)):
        return len(res), tuple(is_tensor(a) for a in res)
    return None, (is_tensor(res),)


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) for v in value[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"{type(value).__name__} of {len(value)} [{inner}{more}]"
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    return type(value).__name__


def check_outputs(value: Any, spec: tuple[int | None, tuple[bool, ...]], backend: Backend,
                  what: str = "graph") -> None:
    """Raise :class:`BackendCompilerFailed` when a compiled callable's result does not have
    the graph's output structure (a bare tensor for a tuple, a wrong count, a non-tensor where
    the graph returns a tensor)."""
    n, tensors = spec
    problem = None
    if n is None:
        if tensors and tensors[0] and not isinstance(value, torch.Tensor):
            problem = "a tensor"
    elif not isinstance(value, (tuple, list)) or len(value) != n:
        problem = f"a tuple or list of {n} output(s)"
    else:
        bad = [i for i, (t, v) in enumerate(zip(tensors, value))
               if t and not isinstance(v, torch.Tensor)]
        if bad:
            problem = f"tensors at output position(s) {bad}"
    if problem is not None:
        raise BackendCompilerFailed(
            f"backend {backend.name!r} ({backend.provider}) compiled a {what} into a callable that "
            f"returned {_describe(value)}; the {what} returns {problem}. The callable a backend "
            "returns must return what gm returns (gm.forward is always right).")


def _ddp_split(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Backend,
               options: dict[str, Any], inputs: Sequence[InputInfo] | None,
               graph_id: str | None, fake_mode: Any) -> Callable[..., Any] | None:
    """Inside a DDP forward: the graph split at gradient-bucket boundaries, each piece compiled
    by :func:`compile_graph` (ember/distributed/ddp.py); None when it stays whole."""
    from .distributed.ddp import active_ddp, maybe_split

    if active_ddp() is None:
        return None

    def piece(sub: torch.fx.GraphModule, ex: list[Any], *, inputs: Any, graph_id: str) -> Any:
        return compile_graph(sub, ex, backend, options, inputs=inputs, graph_id=graph_id)

    return maybe_split(gm, example_inputs, list(inputs or ()), graph_id or "graph", piece,
                       fake_mode=fake_mode)


class _CheckFirstCall:
    """Calls the backend's callable; the first call's result is checked against the graph's
    output structure. ``swap`` (set by the caller) replaces this wrapper with the raw callable
    once checked, so later calls pay nothing."""

    __slots__ = ("fn", "spec", "backend", "checked", "swap", "__weakref__")

    def __init__(self, fn: Callable[..., Any], spec: tuple, backend: Backend):
        self.fn, self.spec, self.backend, self.checked = fn, spec, backend, False
        self.swap: Callable[[Callable[..., Any]], None] | None = None

    def __call__(self, *args: Any) -> Any:
        out = self.fn(*args)
        if not self.checked:
            check_outputs(out, self.spec, self.backend)
            self.checked = True
            if self.swap is not None:
                self.swap(self.fn)
        return out


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Backend,
                  options: dict[str, Any] | None = None, *,
                  inputs: Sequence[InputInfo] | None = None,
                  graph_id: str | None = None, fake_mode: Any = None) -> Callable[..., Any]:
    """Compile one captured torch-level graph with ``backend``; returns a callable taking the
    graph's inputs as positional arguments and returning its outputs.

    ``inputs`` (one :class:`InputInfo` per placeholder) and ``graph_id`` feed the
    :class:`CompileContext` given to backends that accept ``context=``; without them every input
    is a ``"user"`` input. The result's first call checks the output structure (an error naming
    the backend otherwise); set its ``swap`` attribute to drop the check after that call.
    ``fake_mode``:
    the FakeTensorMode (with its ShapeEnv) of a dynamic capture, for ``CompileContext``."""
    from .distributed import ranks
    if ranks.active():
        # under torch.distributed: every rank must compile this same graph now (else an error,
        # not a hang), and ranks sharing the cache let rank 0 compile it first (distributed/)
        return ranks.agreed(gm, example_inputs, graph_id or "graph", lambda: compile_graph(
            gm, example_inputs, backend, options, inputs=inputs, graph_id=graph_id,
            fake_mode=fake_mode))
    options = dict(options or {})
    options.pop("context", None)
    if not backend.training and _needs_grad(example_inputs):
        raise InferenceOnlyBackend(
            f"backend {backend.name!r} is inference-only, but this graph needs gradients (an input "
            "requires grad and grad mode is on). Run under torch.no_grad()/inference_mode(), or "
            "use a backend that supports training (e.g. 'aot_eager' or 'inductor')."
        )
    gm = _run_passes(gm, "torch")
    split = _ddp_split(gm, example_inputs, backend, options, inputs, graph_id, fake_mode)
    if split is not None:
        return split
    context = make_context(gm, example_inputs, backend, options, inputs, graph_id, fake_mode)
    spec = _output_spec(gm)
    t0 = time.perf_counter()
    state = _global_state()
    try:
        if backend.level == "aten":
            from .aot import aot_compile  # late: AOT autograd is only needed by aten backends

            compiled = aot_compile(gm, list(example_inputs), backend=backend, options=options,
                                   context=context)
        else:
            compiled = call_backend(backend, gm, list(example_inputs), options, context)
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
    return _CheckFirstCall(compiled, spec, backend)
