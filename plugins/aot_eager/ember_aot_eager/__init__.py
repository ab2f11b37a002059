"""Ember's aot_eager backend: AOT autograd in core, then the forward and backward ATen graphs run
as they are. The reference that separates capture and AOT bugs from codegen bugs."""

from __future__ import annotations

from typing import Any

import ember


def compile_aot_eager(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    return gm.forward


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="aot_eager", compile=compile_aot_eager, level="aten",
                          description="AOT autograd, then the ATen graphs run as is")]
