"""The loop-level IR: device-agnostic, sizes and indices as sympy expressions.

A value produced by lowering is one of

* :class:`Pointwise`: lazy, ``inner_fn(index) -> ops value``. Chains of pointwise ops compose their
  ``inner_fn``s, which is how they fuse; nothing is stored until the value is *realized*.
* :class:`Reduction`: ``inner_fn(index, rindex)`` combined over ``reduction_ranges``; always realized.
* :class:`Buffer` (realized storage) and :class:`ReinterpretView` (a strided view of a buffer that
  moves no data: permute, expand, slice, select, unsqueeze, as_strided, compatible reshapes).

Realized storage comes from :class:`ComputedBuffer` (a Pointwise or Reduction the code generator
turns into loops), :class:`InputBuffer` (a graph input) and :class:`ExternKernel` outputs (an ATen
call in the wrapper: matmul, convolution, attention, and every op without a lowering).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import sympy
import torch

from .sizes import contiguous_strides, product, rvar, var
from .virtualized import ops

__all__ = ["Layout", "IRNode", "Pointwise", "Reduction", "Buffer", "InputBuffer", "ComputedBuffer",
           "ExternKernel", "MultiOutput", "ReinterpretView", "NoneValue"]


@dataclasses.dataclass
class Layout:
    size: tuple[Any, ...]
    stride: tuple[Any, ...]
    dtype: torch.dtype
    device: torch.device
    offset: Any = 0

    def index(self, idx: Sequence[Any]) -> Any:
        out: Any = self.offset
        for i, st, sz in zip(idx, self.stride, self.size):
            if sz != 1:
                out = out + i * st
        return sympy.sympify(out)

    def numel(self) -> Any:
        return product(self.size)

    def storage_span(self) -> Any:
        """Elements the storage must hold for this view."""
        if any(s == 0 for s in self.size):
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))

    def is_contiguous(self) -> bool:
        return all(sz == 1 or st == cs for sz, st, cs in
                   zip(self.size, self.stride, contiguous_strides(self.size)))

    def same_as(self, other: "Layout") -> bool:
        return (self.size == other.size and self.offset == other.offset and self.dtype == other.dtype
                and all(a == 1 or s1 == s2 for a, s1, s2 in zip(self.size, self.stride, other.stride)))


class IRNode:
    dtype: torch.dtype
    device: torch.device

    def get_size(self) -> list[Any]:
        raise NotImplementedError

    def make_loader(self) -> Callable[[Sequence[Any]], Any]:
        raise NotImplementedError

    def op_count(self) -> int:
        return 0


class NoneValue(IRNode):
    """An optional tensor output that is None (e.g. convolution_backward's unused gradients)."""


class Pointwise(IRNode):
    def __init__(self, device: torch.device, dtype: torch.dtype, ranges: Sequence[Any],
                 inner_fn: Callable[[Sequence[Any]], Any], ops_estimate: int = 1,
                 origins: Sequence[str] = ()):
        self.device = device
        self.dtype = dtype
        self.ranges = list(ranges)
        self.inner_fn = inner_fn
        self.ops_estimate = ops_estimate
        self.origins = list(origins)

    def get_size(self) -> list[Any]:
        return self.ranges

    def make_loader(self) -> Callable[[Sequence[Any]], Any]:
        return self.inner_fn

    def op_count(self) -> int:
        return self.ops_estimate


class Reduction(IRNode):
    """``ranges``: output size (the store iterates it); ``reduction_ranges``: what is combined.
    ``reduction_type``: sum, prod, max, min, argmax, argmin, any, all."""

    def __init__(self, device: torch.device, dtype: torch.dtype, ranges: Sequence[Any],
                 reduction_ranges: Sequence[Any], reduction_type: str,
                 inner_fn: Callable[[Sequence[Any], Sequence[Any]], Any], src_dtype: torch.dtype,
                 origins: Sequence[str] = ()):
        self.device = device
        self.dtype = dtype
        self.ranges = list(ranges)
        self.reduction_ranges = list(reduction_ranges)
        self.reduction_type = reduction_type
        self.inner_fn = inner_fn
        self.src_dtype = src_dtype
        self.origins = list(origins)

    def get_size(self) -> list[Any]:
        return self.ranges


class _LaidOut(IRNode):
    """A node read straight from a named storage through ``layout`` (size/stride/offset)."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.dtype = layout.dtype
        self.device = layout.device

    def get_size(self) -> list[Any]:
        return list(self.layout.size)

    def storage(self) -> "Buffer":
        raise NotImplementedError

    def make_loader(self) -> Callable[[Sequence[Any]], Any]:
        name, layout = self.storage().name, self.layout
        return lambda idx: ops.load(name, layout.index(idx))


class Buffer(_LaidOut):
    """Realized storage with a name in the generated code."""

    def __init__(self, name: str, layout: Layout):
        self.name = name
        super().__init__(layout)

    def storage(self) -> "Buffer":
        return self


class InputBuffer(Buffer):
    def __init__(self, name: str, layout: Layout, position: int):
        super().__init__(name, layout)
        self.position = position


class ComputedBuffer(Buffer):
    """A Pointwise or Reduction stored into ``layout``: one loop nest of the code generator."""

    def __init__(self, name: str, layout: Layout, data: Pointwise | Reduction):
        super().__init__(name, layout)
        self.data = data

    def iteration(self) -> tuple[list[Any], list[Any]]:
        """(ranges, reduction ranges) of the loops that compute this buffer."""
        if isinstance(self.data, Reduction):
            return self.data.ranges, self.data.reduction_ranges
        return self.data.ranges, []

    def body(self, index: Sequence[Any], rindex: Sequence[Any]) -> Any:
        if isinstance(self.data, Reduction):
            return self.data.inner_fn(index, rindex)
        return self.data.inner_fn(index)

    def canonical_vars(self) -> tuple[list[Any], list[Any]]:
        ranges, rranges = self.iteration()
        return [var(i) for i in range(len(ranges))], [rvar(i) for i in range(len(rranges))]


class ExternKernel(Buffer):
    """A call of an ATen op in the wrapper. ``args``/``kwargs`` hold IR values (buffers and views)
    and plain constants. ``kind`` is "extern" for the kernels routed to ATen by design (matmul,
    convolution, attention) and "fallback" for ops with no lowering. ``layout`` is that of a single
    tensor result; multi-output ops are read through :class:`MultiOutput`."""

    def __init__(self, name: str, layout: Layout | None, op: Any, args: Sequence[Any],
                 kwargs: dict[str, Any], kind: str, origins: Sequence[str] = ()):
        super().__init__(name, layout if layout is not None else Layout((), (), torch.float32,
                                                                        torch.device("cpu")))
        self.op = op
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.kind = kind
        self.multi = layout is None
        self.origins = list(origins)


class MultiOutput(Buffer):
    """Element ``path`` (a tuple of indices) of a multi-output extern kernel's result."""

    def __init__(self, name: str, layout: Layout, parent: ExternKernel, path: tuple[int, ...]):
        super().__init__(name, layout)
        self.parent = parent
        self.path = path


class ReinterpretView(_LaidOut):
    """``buffer``'s storage read through another size/stride/offset; moves no data."""

    def __init__(self, buffer: Buffer, layout: Layout):
        self.buffer = buffer
        super().__init__(layout)

    def storage(self) -> Buffer:
        return self.buffer
