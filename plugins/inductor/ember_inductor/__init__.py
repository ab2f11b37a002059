"""Ember's inductor backend: ATen graphs lowered to a loop-level IR, fused, and compiled to C++
(OpenMP) for the CPU, with matmul/convolution/attention and ops without a lowering left to ATen.

This module stays light: the compiler is imported when a graph is compiled.
"""

from __future__ import annotations

from typing import Any

import ember

from .precompile import ember_precompile_graph  # noqa: F401  (hookimpl for ember.precompile)

__all__ = ["compile_inductor"]


def compile_inductor(gm: Any, example_inputs: list[Any], *, context: Any = None,
                     **options: Any) -> Any:
    """Compile an ATen graph from Ember's AOT autograd; see :mod:`ember_inductor.compile_fx`.
    ``context`` (an ember CompileContext) is optional."""
    from .compile_fx import compile_inductor as compile_fx

    return compile_fx(gm, example_inputs, context=context, **options)


def _decompositions() -> Any:
    from .decompositions import decompositions

    return decompositions()


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="inductor", compile=compile_inductor, level="aten",
                          decompositions=_decompositions, devices=("cpu",),
                          description="lowering + fusion + C++/OpenMP codegen (CPU)")]
