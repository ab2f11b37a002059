"""Views of a tensor's storage with a recorded geometry: how AOT's runtime and precompiled
sources rebuild an output that aliases an input (imports only torch: precompiled sources use it)."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["view_of", "input_alias", "output_alias"]


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def view_of(base: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int,
            dtype: torch.dtype | None) -> torch.Tensor:
    """A view of ``base``'s storage with the given geometry (in elements of ``dtype``) and dtype,
    differentiable where eager's view is (complex <-> real reinterpretations, as ``view_as_real``,
    ``.real``, ``.imag`` and ``view_as_complex`` are); other dtype views are not differentiable in
    eager either, and are made directly on the storage."""
    if dtype is None or dtype == base.dtype:
        return base.as_strided(size, stride, offset)
    if base.is_complex() and dtype == base.real.dtype:
        return torch.view_as_real(base).as_strided(size, stride, offset)
    if dtype.is_complex and base.dtype == torch.empty(0, dtype=dtype).real.dtype:
        flat = base.as_strided(tuple(size) + (2,), tuple(2 * s for s in stride) + (1,),
                               2 * offset)
        return torch.view_as_complex(flat)
    with torch.no_grad():
        out = torch.empty(0, dtype=dtype, device=base.device)
        out.set_(base.untyped_storage(), offset, tuple(size), tuple(stride))
    return out


def input_alias(base: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int,
                base_offset: int, dtype: torch.dtype | None) -> torch.Tensor:
    """The output that was traced as a view of an input at ``offset`` when that input started at
    ``base_offset``, for an input that starts at ``base.storage_offset()`` now (capture does not
    guard storage offsets: ``x`` and ``big[1:]`` share a graph)."""
    now = base.storage_offset()
    if now != base_offset:
        itemsize = _itemsize(dtype or base.dtype)
        offset = (offset * itemsize + (now - base_offset) * base.element_size()) // itemsize
    return view_of(base, size, stride, offset, dtype)


def output_alias(base: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                 offset_bytes: int, dtype: torch.dtype | None) -> torch.Tensor:
    """The output that was traced as a view of another output ``base``, ``offset_bytes`` after
    where ``base`` starts."""
    nbytes = base.storage_offset() * base.element_size() + offset_bytes
    return view_of(base, size, stride, nbytes // _itemsize(dtype or base.dtype), dtype)
