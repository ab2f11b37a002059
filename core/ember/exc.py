"""Exceptions raised by Ember. Every message says what went wrong, where, and what to do."""

from __future__ import annotations

__all__ = [
    "EmberError",
    "BackendNotFound",
    "BackendLoadError",
    "BackendConflict",
    "BackendCompilerFailed",
    "Unsupported",
    "GraphBreakError",
    "NotImplementedYet",
    "InferenceOnlyBackend",
    "UnknownOption",
    "RankDivergence",
    "DeviceUnavailable",
]


class EmberError(RuntimeError):
    """Base class of Ember's errors."""


class BackendNotFound(EmberError, LookupError):
    """``backend=`` names a backend that no installed plugin provides."""


class BackendLoadError(EmberError):
    """A plugin's module failed to import; carries the plugin and distribution names."""


class BackendConflict(EmberError):
    """Two plugins declare the same backend name."""


class BackendCompilerFailed(EmberError):
    """A backend raised while compiling a graph."""


class InferenceOnlyBackend(EmberError):
    """An inference-only backend was given a graph that needs gradients."""


class DeviceUnavailable(EmberError):
    """A backend needs a device this machine does not have (``backend="cudagraphs"`` without
    CUDA)."""


class UnknownOption(EmberError, ValueError):
    """``options=`` names an option the chosen backend does not take."""


class NotImplementedYet(EmberError, NotImplementedError):
    """A declared backend whose capability is not built yet."""


class Unsupported(EmberError):
    """Capture met something it cannot trace. With ``fullgraph=True`` this reaches the user."""

    def __init__(self, msg: str, *, where: str | None = None, hint: str | None = None):
        self.reason = msg
        self.where = where
        self.hint = hint
        text = msg
        if where:
            text += f"\n  at {where}"
        if hint:
            text += f"\n  {hint}"
        super().__init__(text)


class GraphBreakError(EmberError):
    """``fullgraph=True`` and the function does not capture as one graph; lists every break."""


class RankDivergence(EmberError):
    """Under ``torch.distributed``: the ranks did not compile the same graphs (one rank compiled
    a graph the others did not, or a different one). Raised instead of hanging in the next
    collective; the message names the graph, the function and the ranks."""
