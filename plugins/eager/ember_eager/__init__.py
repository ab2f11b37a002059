"""Ember's eager backend: runs the captured graph as it is (a capture-only reference)."""

from __future__ import annotations

from typing import Any

import ember


def compile_eager(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    return gm.forward


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="eager", compile=compile_eager, level="torch",
                          description="runs the captured torch-level graph as is", options={})]
