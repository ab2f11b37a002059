"""Helpers of the dynamic-shape tests: graph counting through Ember's public API."""

from __future__ import annotations

from typing import Any

import ember


def graphs(fn: Any) -> int:
    """Captured graphs behind ``fn`` (what ember.compile returned), resume functions included."""
    return sum(1 for c in ember.captures(fn) if c.graph is not None)


def stats() -> dict[str, int]:
    return dict(ember.events.counters["stats"])

