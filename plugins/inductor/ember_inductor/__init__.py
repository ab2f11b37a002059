"""Ember's inductor backend (lowering, fusion, Triton and C++ codegen).

Not implemented yet: the backend is declared so that it is listed and named in errors, and using
it raises :class:`ember.NotImplementedYet`. This module must stay light (no triton import) so that
listing backends stays cheap.
"""

from __future__ import annotations

from typing import Any

import ember


def compile_inductor(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    raise ember.NotImplementedYet(
        "the 'inductor' backend is not implemented yet in this version of ember-inductor. "
        "Use backend='eager' or backend='aot_eager' for now.")


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="inductor", compile=compile_inductor, level="aten",
                          tags=("experimental",),
                          description="lowering + fusion + Triton/C++ codegen (not implemented yet)")]
