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

__all__ = ["hookspec", "hookimpl", "ember_backends", "ember_graph_passes", "ember_compile_event",
           "ember_precompile_graph"]


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------

@hookspec
def ember_backends() -> list["Backend"]:
    """Declare the backends this plugin provides.

    Called once per plugin, right after its module is imported: the first time any backend is
    looked up (``compile(..., backend=name)``) or backends are listed (``list_backends()``,
    ``python -m ember backends``). Return a list of :class:`ember.Backend`. All plugins' results
    are collected; a name declared by two plugins cannot be used, and asking for it raises
    :class:`ember.BackendConflict` naming both distributions. Keep the module that defines this
    hook light: import heavy machinery inside ``Backend.compile``.

    ``Backend.compile(gm, example_inputs, **options)`` is called once per graph (for
    ``level="aten"``: once for the inference graph, or once for the forward and once for the
    backward graph). It may opt in to a :class:`ember.CompileContext` by declaring a parameter
    named ``context`` (``def compile(gm, example_inputs, *, context=None, **options)``); Ember
    reads the signature once per Backend and passes ``context=`` only then, so compile functions
    written without it keep working. The context says:

    * ``graph_id``: a stable name (``<function>_<file>_<line>_<n>``; ATen graphs append
      ``.inference``/``.forward``/``.backward``), for logs and cache keys;
    * ``kind``: ``"inference"`` or ``"training"`` for torch-level graphs (training: autograd will
      differentiate through the result), ``"inference"``, ``"forward"`` or ``"backward"`` for
      ATen graphs;
    * ``inputs``: one :class:`ember.context.InputInfo` per placeholder: ``kind``
      (``"parameter"``, ``"buffer"``, ``"user"``; for backward graphs ``"activation"`` for a
      saved value and ``"tangent"``; a parameter saved for the backward keeps its kind),
      ``source`` (a Python expression such as ``self.fc._parameters['weight']``) and
      ``stable_address`` (the same tensor object on every call: parameters and buffers; their
      values may still change in place);
    * ``device``, ``mode``, ``options`` (read-only) and ``backend`` (the name).

    The callable ``compile`` returns must return what ``gm`` returns: its first result is
    checked, and a wrong number or structure of outputs raises
    :class:`ember.BackendCompilerFailed` naming the backend and what it returned.
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
    ``gm`` in place. Called once per graph compiled. All plugins' results are collected and the
    passes run in plugin registration order, each on the previous one's output.
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


# --------------------------------------------------------------------------------------------
# Precompile
# --------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def ember_precompile_graph(backend: str, name: str, gm: Any, compiled: Any,
                           options: dict) -> "tuple[str, dict[str, bytes]] | None":
    """Write one compiled graph into an ``ember.precompile`` artifact (docs/precompile.md).

    Called by ``ember.precompile`` for each graph that backend ``backend`` compiled (``name``:
    ``"forward"``/``"backward"`` or ``"graph"``; ``gm`` the graph; ``compiled`` what
    ``Backend.compile`` returned for it) when ``compiled`` has no ``ember_precompile(name)``
    method of its own. Return ``(fragment, cache_entries)``: Python source, run in the artifact's
    module, defining ``make_<name>(cache)`` that returns a callable with the graph's calling
    convention (``cache``: the entries back, or None to build from the fragment), and
    ``{entry name: bytes}`` (compiled kernels) for the artifact's cache. Return None when this
    plugin does not handle that graph; the first non-None result wins.
    """
