"""The hooks a plugin may implement. Every hook is prefixed ``ember_``.

A plugin is a module with ``@ember.hookimpl`` functions and one entry point in the group
``ember.plugins``. Implementations may accept fewer arguments than the spec names (pluggy passes
only those they ask for), so the spec can grow without breaking plugins: arguments are only ever
added, never reordered or removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from .plugins import Backend

hookspec = pluggy.HookspecMarker("ember")
hookimpl = pluggy.HookimplMarker("ember")

__all__ = ["hookspec", "hookimpl", "ember_backends", "ember_graph_passes", "ember_compile_event"]


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------

@hookspec
def ember_backends() -> list["Backend"]:
    """Declare the backends this plugin provides.

    Called once, the first time a backend of this plugin is looked up (``compile(...,
    backend=name)``) or ``list_backends()`` needs details beyond names. Return a list of
    :class:`ember.Backend`. All results are collected; two plugins declaring the same name is an
    error that names both distributions.
    """


# --------------------------------------------------------------------------------------------
# Graph passes
# --------------------------------------------------------------------------------------------

@hookspec
def ember_graph_passes(stage: str) -> list[Callable[..., Any]]:
    """Passes to run on every graph at ``stage``.

    ``stage`` is ``"torch"`` (right after capture, before the backend sees the graph) or
    ``"aten"`` (after AOT autograd, on the forward and backward graphs). A pass is called as
    ``pass_(gm: torch.fx.GraphModule) -> GraphModule | None``; returning None means it mutated
    ``gm`` in place. All results are collected and run in plugin registration order.
    """


# --------------------------------------------------------------------------------------------
# Observation
# --------------------------------------------------------------------------------------------

@hookspec
def ember_compile_event(event: Any) -> None:
    """Observe a compile event.

    ``event`` is an :class:`ember.events.CompileEvent` with ``kind`` (``"graph_captured"``,
    ``"graph_break"``, ``"recompile"``, ``"backend_compiled"``, ``"fallback"``, ``"timing"``)
    and a ``data`` dict. Called for every event on every implementation; results are ignored and an
    exception in an observer is logged, never raised into the user's program.
    """
