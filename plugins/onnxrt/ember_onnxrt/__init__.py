"""Ember's ``onnxrt`` backend: inference graphs run by ONNX Runtime.

The ATen inference graph is translated to ONNX with onnxscript's torch_lib functions and onnx-ir
(not torch's own ONNX exporter nor its graph-export tracer), partitioned so that what ONNX Runtime cannot take runs as
ATen between its subgraphs, and called with inputs and outputs bound to torch's memory. See
``backend.py`` (partitioning, frozen weights), ``translate.py`` (ATen -> ONNX) and
``session.py`` (sessions, cache, I/O binding); docs/backend_author_guide.md walks through it.

This module stays light (the lazy-import rule): onnxruntime, onnxscript and onnx are imported
when a graph is compiled.
"""

from __future__ import annotations

from typing import Any

import ember

__all__ = ["compile_onnxrt"]


def compile_onnxrt(gm: Any, example_inputs: list[Any], *, context: Any = None,
                   **options: Any) -> Any:
    """Compile one ATen inference graph with ONNX Runtime (see ``ember_onnxrt.backend``)."""
    from .backend import compile_onnxrt as _compile

    return _compile(gm, example_inputs, context=context, **options)


def _runtime() -> str:
    from .session import runtime_info

    return runtime_info()


def _decompositions() -> Any:
    """ATen ops torch_lib has no function for, decomposed while tracing into ops it has (so they
    run in ONNX Runtime instead of splitting the graph)."""
    import torch
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    # (not var/std: torch's decompositions of those emit prims ops that functionalization
    # refuses; they stay ATen)
    return get_decompositions([aten.rsub.Scalar, aten.rsub.Tensor,
                               aten._weight_norm_interface])


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    from .backend import OPTIONS

    return [ember.Backend(name="onnxrt", compile=compile_onnxrt, level="aten", training=False,
                          decompositions=_decompositions, options=OPTIONS, runtime=_runtime,
                          description="inference through ONNX Runtime (ATen -> ONNX with "
                                      "onnxscript's torch_lib; unsupported ops stay ATen)")]


@ember.hookimpl
def ember_precompile_graph(backend: str, name: str, gm: Any, compiled: Any,
                           options: dict) -> "tuple[str, dict[str, bytes]] | None":
    from .backend import Compiled

    if isinstance(compiled, Compiled):  # (its own ember_precompile is found first anyway)
        return compiled.ember_precompile(name)
    return None
