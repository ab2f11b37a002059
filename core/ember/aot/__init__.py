"""AOT autograd: from a captured torch-level graph to forward and backward ATen graphs.

    capture → analysis (mutations, aliasing) → trace (joint fwd+bwd with make_fx, functionalize,
    decompose) → partition (min cut: what the forward saves) → backend.compile(fw), (bw) → runtime
    (autograd.Function, input mutations copied back, aliased outputs regenerated)

Used by :func:`ember.backends.compile_graph` for backends that declare ``level="aten"``.

Dynamic shapes: when the CompileContext carries capture's ``fake_mode``, the graphs are traced
over the placeholders' symbolic values (see notes/dynamic_contract.md); ``SUPPORTS_DYNAMIC`` tells
capture that ``level="aten"`` backends may be given such graphs.
"""

from __future__ import annotations

from .compile import AOTCompiled, aot_compile
from .partition import partition_joint
from .runtime import DoubleBackwardError

__all__ = ["aot_compile", "AOTCompiled", "DoubleBackwardError", "partition_joint",
           "SUPPORTS_DYNAMIC"]

#: AOT autograd traces symbolic graphs (``context.fake_mode``) without specializing them
SUPPORTS_DYNAMIC = True
