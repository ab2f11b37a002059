"""The table from ATen ops to lowering functions, and the state a lowering can read."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

__all__ = ["LOWERINGS", "register", "Unsupported", "current", "EXTERN_OPS"]

LOWERINGS: dict[Any, Callable[..., Any]] = {}
_state = threading.local()
aten = torch.ops.aten


class Unsupported(Exception):
    """Raised by a lowering for a case it does not handle: the op runs as an ATen fallback."""


def register(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a lowering for OpOverloads, or for every overload of an OpOverloadPacket."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn

    return deco


def current() -> Any:
    """The GraphLowering running now (its ``node`` is the fx node being lowered)."""
    return _state.graph


def set_current(graph: Any) -> None:
    _state.graph = graph


# Ops routed to ATen by design: the wins are in fusing what surrounds them.
EXTERN_OPS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten.scaled_dot_product_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten.mv.default, aten.dot.default,
}
try:  # oneDNN's linear kernel: patterns.fuse_linears routes float32 matrix multiplies to it
    EXTERN_OPS.add(torch.ops.mkldnn._linear_pointwise.default)
except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
    pass
