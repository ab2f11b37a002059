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
    kind: str
    data: dict[str, Any]
    time: float


def emit(kind: str, **data: Any) -> None:
    counters["events"][kind] += 1
    from .plugins import plugin_manager  # late: events are emitted long after import

    pm = plugin_manager()
    if not pm.hook.ember_compile_event.get_hookimpls():
        return
    event = CompileEvent(kind, data, time.time())
    for impl in pm.hook.ember_compile_event.get_hookimpls():
        try:
            impl.function(event=event) if impl.argnames else impl.function()
        except Exception:  # an observer never breaks the user's program
            log.warning("compile-event observer %s raised", impl.plugin_name, exc_info=True)
