"""What one capture produces, as a plain value: :class:`Capture`.

Capture (``convert.capture_frame``) traces one call and returns a :class:`Capture`: the
torch-level graph, its inputs with their sources and kinds, the guards and the generated entry
source. Compiling it with a backend (``convert.compile_capture``) is a separate step that turns
it into the entry function serving later calls. Precompile, caches and golden tests read the
artifact; ``ember.last_capture()`` / ``ember.captures(fn)`` return the recent ones.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

__all__ = ["Capture", "CaptureInput", "last_capture", "recent_captures", "record"]


@dataclasses.dataclass(frozen=True)
class CaptureInput:
    """One graph input (placeholder order)."""

    #: ``"parameter"``, ``"buffer"`` or ``"user"`` (see :mod:`ember.context`)
    kind: str
    #: where the value comes from, a Python expression over the function's arguments
    source: str
    #: the expression the entry reads it with once the guards hold (an identity-guarded
    #: parameter is read through its namespace reference)
    fetch: str
    #: the same object on every call (parameters and buffers: identity-guarded)
    stable_address: bool
    #: the structured source (:mod:`ember.capture.sources`) that ``source`` prints
    origin: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def module_path(self) -> str | None:
        """For a parameter or buffer, its path below the module it was read from
        (``"fc.weight"``, as ``named_parameters()`` spells it); else None."""
        if self.origin is None or self.kind not in ("parameter", "buffer"):
            return None
        return self.origin.module_path()


@dataclasses.dataclass
class Capture:
    """One captured frame: the graph (None when it has no tensor op), its inputs, its guards,
    and the generated entry source. ``example_inputs`` (the real tensors of the capturing call)
    are dropped once the graph is compiled, so keeping a Capture does not keep them alive."""

    #: ``"<file>:<line> in <name>"`` of the captured function
    function: str
    #: stable graph name (``CompileContext.graph_id``), or "" when there is no graph
    graph_id: str
    graph: Any  # torch.fx.GraphModule | None
    inputs: tuple[CaptureInput, ...]
    guards: tuple[str, ...]
    #: the entry's source: guards, graph call, side effects, result or graph break
    entry_source: str = ""
    #: the graph-break reason when the frame was split, else None
    break_reason: str | None = None
    example_inputs: list[Any] | None = dataclasses.field(default=None, repr=False)
    #: the entry's body lines after the graph call (side effects, return or break)
    body: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    @property
    def parameter_sources(self) -> list[str]:
        return [i.source for i in self.inputs if i.kind in ("parameter", "buffer")]

    def readable(self) -> str:
        """The graph, guards and entry as one readable text."""
        parts = [f"# capture of {self.function}"]
        if self.break_reason:
            parts.append(f"# graph break: {self.break_reason}")
        if self.graph is not None:
            parts.append(self.graph.print_readable(print_output=False))
        parts.append("# guards\n" + "\n".join(self.guards))
        parts.append("# entry\n" + self.entry_source)
        return "\n".join(parts)


_lock = threading.Lock()
_recent: collections.deque[Capture] = collections.deque(maxlen=32)


def record(cap: Capture) -> None:
    with _lock:
        _recent.append(cap)


def last_capture() -> Capture | None:
    """The most recent capture in this process (any function), or None."""
    with _lock:
        return _recent[-1] if _recent else None


def recent_captures() -> list[Capture]:
    """The last captures (up to 32), oldest first."""
    with _lock:
        return list(_recent)


def clear() -> None:
    with _lock:
        _recent.clear()
