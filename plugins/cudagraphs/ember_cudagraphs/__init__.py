"""Ember's cudagraphs backend (CUDA graph capture and replay).

Not implemented yet: declared so that it is listed and named in errors; using it raises
:class:`ember.NotImplementedYet`.
"""

from __future__ import annotations

from typing import Any

import ember


def compile_cudagraphs(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    raise ember.NotImplementedYet(
        "the 'cudagraphs' backend is not implemented yet in this version of ember-cudagraphs. "
        "Use backend='eager' or backend='aot_eager' for now.")


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="cudagraphs", compile=compile_cudagraphs, level="aten",
                          devices=("cuda",), tags=("experimental",),
                          description="CUDA graph capture/replay (not implemented yet)")]
