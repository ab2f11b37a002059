"""Compile events: counters for tests and benchmarks, plus the ``ember_compile_event`` hook."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any

__all__ = ["CompileEvent", "counters", "emit"]

log = logging.getLogger("ember.events")

#: counters["stats"]["graphs"], counters["graph_breaks"][reason], ... ; cleared by ember.reset().
counters: collections.defaultdict[str, collections.Counter] = collections.defaultdict(
    collections.Counter)


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """What an ``ember_compile_event`` observer receives: ``kind`` (``"graph_captured"``,
    ``"graph_break"``, ``"recompile"``, ``"backend_compiled"``, ``"fallback"``, ``"timing"``),
    a ``data`` dict whose keys depend on the kind, and the wall-clock ``time`` of the event."""

    kind: str
    data: dict[str, Any]
    time: float


def emit(kind: str, **data: Any) -> None:
    """Count ``kind`` in ``counters["events"]`` and call every ``ember_compile_event`` observer.

    Observers are called one by one, so that one raising (logged on ``ember.events``) neither
    stops the others nor reaches the user's program.
    """
    counters["events"][kind] += 1
    from .plugins import ensure_loaded, plugin_manager  # late: events come long after import

    ensure_loaded()  # entry-point plugins may observe even when backend= was a callable
    impls = plugin_manager().hook.ember_compile_event.get_hookimpls()
    if not impls:
        return
    event = CompileEvent(kind, dict(data), time.time())
    for impl in reversed(impls):  # registration order
        try:
            impl.function(event=event) if impl.argnames else impl.function()
        except Exception:  # an observer never breaks the user's program
            log.warning("ember_compile_event observer %r raised on %r event; ignored",
                        impl.plugin_name, kind, exc_info=True)
