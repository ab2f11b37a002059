"""Ember's aot_eager backend: AOT autograd in core, then the forward and backward ATen graphs run
as they are. The reference that separates capture and AOT bugs from codegen bugs: if a program
is right under ``aot_eager`` but wrong under ``inductor``, the bug is in inductor's lowering or
codegen; if it is wrong under ``aot_eager`` but right under ``eager``, it is in AOT autograd.
"""

from __future__ import annotations

from typing import Any

import ember

__all__ = ["compile_aot_eager"]


def compile_aot_eager(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    """Run an ATen graph from Ember's AOT autograd as is (no decompositions, no codegen).

    ``gm`` is the functional forward or backward graph; the returned callable takes its inputs
    positionally and returns its output tuple. Options are accepted and ignored.
    """
    return gm.forward


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="aot_eager", compile=compile_aot_eager, level="aten",
                          decompositions=None,
                          description="AOT autograd, then the ATen graphs run as is")]
