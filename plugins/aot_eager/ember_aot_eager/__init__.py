"""Ember's aot_eager backend: AOT autograd in core, then the forward and backward ATen graphs run
as they are. The reference that separates capture and AOT bugs from codegen bugs: if a program
is right under ``aot_eager`` but wrong under ``inductor``, the bug is in inductor's lowering or
codegen; if it is wrong under ``aot_eager`` but right under ``eager``, it is in AOT autograd.
"""

from __future__ import annotations

from typing import Any

import torch

import ember

__all__ = ["compile_aot_eager"]


def compile_aot_eager(gm: Any, example_inputs: list[Any], **options: Any) -> Any:
    """Run an ATen graph from Ember's AOT autograd as is (no decompositions, no codegen).

    ``gm`` is the functional forward or backward graph; the returned callable takes its inputs
    positionally and returns its output tuple. Options are accepted and ignored.

    Views run as reshapes: tracing chose ``view`` where the FakeTensor strides allowed it, and
    some ops' meta kernels give other strides than their real kernels (``softplus_backward`` of a
    transposed gradient: contiguous in the meta kernel, the gradient's layout in the real one),
    so a traced ``view`` can fail at run time. A reshape is that same view whenever the view
    succeeds, and a copy where it would fail.
    """
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _VIEWS]
    if views:
        # In place, so that the callable stays ``gm.forward``: what precompile recognizes as
        # "the graph as is" (ember.precompile emits the graph's own source).
        for n in views:
            n.target = torch.ops.aten.reshape.default
        gm.recompile()
    return gm.forward


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="aot_eager", compile=compile_aot_eager, level="aten",
                          decompositions=None, recompute=False,  # each op its own kernel
                          description="AOT autograd, then the ATen graphs run as is", options={})]
