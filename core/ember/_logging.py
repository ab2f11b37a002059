"""Logging for Ember: stdlib ``logging`` under ``ember.*`` loggers.

``EMBER_LOGS=graph,guards,aot`` turns on the named artifacts (each prints a readable intermediate
form at INFO on logger ``ember.<name>``); ``EMBER_LOGS=+all`` also sets DEBUG on ``ember``.
Known artifacts: graph, guards, graph_breaks, recompiles, aot, output_code, bytecode, plugins.
"""

from __future__ import annotations

import logging
import os
import sys

ARTIFACTS = ("graph", "guards", "graph_breaks", "recompiles", "aot", "output_code", "bytecode",
             "plugins", "fallback")

_enabled: set[str] = set()
_handler: logging.Handler | None = None

log = logging.getLogger("ember")


def get_artifact_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"ember.{name}")


def enabled(name: str) -> bool:
    """True when the artifact ``name`` should be rendered (rendering can be costly)."""
    return name in _enabled or logging.getLogger(f"ember.{name}").isEnabledFor(logging.INFO)


def set_logs(spec: str | None) -> None:
    """Enable artifacts from a comma-separated spec such as ``"graph,guards"`` or ``"+all"``."""
    global _handler
    for n in _enabled:  # switch off what an earlier call switched on
        lg = logging.getLogger(f"ember.{n}")
        lg.setLevel(logging.NOTSET)
        if _handler is not None and _handler in lg.handlers:
            lg.removeHandler(_handler)
        lg.propagate = True
    _enabled.clear()
    if not spec:
        return
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for n in names:
        if n in ("+all", "all"):
            _enabled.update(ARTIFACTS)
            if n == "+all":
                log.setLevel(logging.DEBUG)
            continue
        _enabled.add(n.lstrip("+"))
    for n in _enabled:
        lg = logging.getLogger(f"ember.{n}")
        lg.setLevel(logging.INFO)
        if _handler not in lg.handlers:
            lg.addHandler(_handler)
        lg.propagate = False


set_logs(os.environ.get("EMBER_LOGS"))
