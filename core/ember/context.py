"""What a backend may know about the graph it compiles: :class:`CompileContext`.

A backend opts in by naming a ``context`` parameter in its compile function::

    def compile_mine(gm, example_inputs, *, context=None, **options):
        frozen = [i for i, inp in enumerate(context.inputs) if inp.stable_address]
        ...

Ember inspects the compile function's signature once per :class:`ember.Backend` and passes
``context=`` only to functions that declare a parameter of that name (as pluggy passes a hook
only the arguments it names): a ``(gm, example_inputs, **options)`` backend keeps working
unchanged and never sees ``context`` among its options.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from typing import Any, Callable, Mapping, Sequence

__all__ = ["CompileContext", "InputInfo", "INPUT_KINDS", "GRAPH_KINDS", "accepts_context"]

#: ``InputInfo.kind`` values. ``parameter``/``buffer``: an ``nn.Module`` parameter or buffer the
#: graph reads (guarded by identity, so the same tensor object on every call); ``user``: an
#: argument or any other tensor read per call; ``activation``: (backward graphs) a value the
#: forward graph saved; ``tangent``: (backward graphs) the gradient of a forward output;
#: ``symint``: a symbolic int (a dynamic Python int argument, or a size a forward graph saved
#: for its backward); its ``meta["val"]`` is a ``torch.SymInt``.
INPUT_KINDS = ("parameter", "buffer", "user", "activation", "tangent", "symint")

#: ``CompileContext.kind`` values. ``level="aten"`` backends see ``"inference"`` (forward-only
#: graph: no input needs grad or grad mode is off), ``"forward"`` and ``"backward"`` (the two
#: graphs of a training variant). ``level="torch"`` backends see ``"inference"`` or
#: ``"training"`` (an input requires grad and grad mode is on: autograd will differentiate
#: through whatever the backend returns, so it must stay differentiable).
GRAPH_KINDS = ("inference", "training", "forward", "backward")


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One graph input, in placeholder order."""

    #: one of :data:`INPUT_KINDS`
    kind: str
    #: where the value comes from, as a Python expression over the compiled function's
    #: arguments (``self.fc._parameters['weight']``, ``x``); ``""`` when it has none (saved
    #: activations, tangents)
    source: str
    #: True when the same tensor object (same storage, same address) is passed on every call
    #: that reaches this compiled graph: parameters and buffers (their identity is guarded).
    #: Their *values* may still change between calls (an optimizer step updates them in place).
    stable_address: bool

    @property
    def is_parameter(self) -> bool:
        return self.kind == "parameter"


@dataclasses.dataclass(frozen=True)
class CompileContext:
    """Handed to a backend's ``compile(gm, example_inputs, context=...)``; frozen."""

    #: a stable name for this graph, usable in logs and as a cache-file stem:
    #: ``<function>_<file stem>_<line>_<n>`` (n counts the graphs of that function), with
    #: ``.forward``/``.backward``/``.inference`` appended for ATen graphs
    graph_id: str
    #: one of :data:`GRAPH_KINDS`
    kind: str
    #: one :class:`InputInfo` per placeholder of ``gm``, in order
    inputs: tuple[InputInfo, ...]
    #: device of the graph's tensors: ``"cpu"``, ``"cuda:0"``, ... (the first tensor input's)
    device: str
    #: ``ember.compile(mode=...)`` (None when not given)
    mode: str | None
    #: ``ember.compile(options=...)`` (read-only); also passed as ``**options``
    options: Mapping[str, Any]
    #: the backend's name
    backend: str = ""
    #: dynamic shapes: the ``FakeTensorMode`` (with its ``ShapeEnv``) whose symbols the graph's
    #: placeholders carry in ``meta["val"]``; None when the graph is static
    fake_mode: Any = None

    def __post_init__(self) -> None:
        if self.kind not in GRAPH_KINDS:
            raise ValueError(f"CompileContext.kind must be one of {GRAPH_KINDS}, got {self.kind!r}")
        for i in self.inputs:
            if i.kind not in INPUT_KINDS:
                raise ValueError(f"InputInfo.kind must be one of {INPUT_KINDS}, got {i.kind!r}")
        if not isinstance(self.options, types.MappingProxyType):
            object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))
        object.__setattr__(self, "inputs", tuple(self.inputs))

    @property
    def parameter_indices(self) -> tuple[int, ...]:
        """Positions of the inputs that are parameters or buffers (stable addresses)."""
        return tuple(i for i, inp in enumerate(self.inputs) if inp.kind in ("parameter", "buffer"))

    @property
    def static_input_indices(self) -> tuple[int, ...]:
        """Positions of the inputs whose address is the same on every call."""
        return tuple(i for i, inp in enumerate(self.inputs) if inp.stable_address)

    def derive(self, **changes: Any) -> "CompileContext":
        """A copy with some fields replaced (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def accepts_context(fn: Callable[..., Any]) -> bool:
    """Does ``fn`` declare a parameter named ``context`` (keyword-passable)?"""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("context")
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def device_of(example_inputs: Sequence[Any]) -> str:
    import torch

    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            return str(t.device)
    return "cpu"


def graph_id_for(code: types.CodeType | None, n: int) -> str:
    """``<function>_<file stem>_<line>_<n>``, characters outside ``[A-Za-z0-9_]`` replaced."""
    if code is None:
        return f"graph_{n}"
    stem = code.co_filename.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    raw = f"{code.co_name}_{stem}_{code.co_firstlineno}_{n}"
    return re.sub(r"[^A-Za-z0-9_]", "_", raw)
