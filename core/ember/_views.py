"""Views of a tensor's storage with a recorded geometry: how AOT's runtime and precompiled
sources rebuild an output that aliases an input (imports only torch: precompiled sources use it)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["view_of", "input_alias", "output_alias", "elements_meet", "self_overlapping"]


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


# -- overlap of views ---------------------------------------------------------------------------

#: Offsets compared element by element up to this many elements per tensor (beyond: spans only)
_EXACT_LIMIT = 1 << 16


def _geometry(t: torch.Tensor) -> tuple[Any, ...] | None:
    """(storage offset, sizes, strides) as ints, or None when any is symbolic."""
    g = (t.storage_offset(), tuple(t.shape), tuple(t.stride()))
    if not isinstance(g[0], int) or not all(isinstance(v, int) for v in (*g[1], *g[2])):
        return None
    return g


def _offsets(g: tuple[Any, ...]) -> list[int]:
    """Every element's storage offset (plain Python: callers may be inside a fake-tensor mode)."""
    offset, sizes, strides = g
    out = [offset]
    for n, st in zip(sizes, strides):
        out = [o + i * st for o in out for i in range(n)]
    return out


def _span(g: tuple[Any, ...]) -> tuple[int, int]:
    """The first and the last storage offset a geometry addresses."""
    offset, sizes, strides = g
    return (offset + sum((n - 1) * st for n, st in zip(sizes, strides) if st < 0),
            offset + sum((n - 1) * st for n, st in zip(sizes, strides) if st > 0))


def self_overlapping(t: torch.Tensor) -> bool:
    g = _geometry(t)
    if g is None:
        return False  # symbolic: only the stride-0 case is certain, and it is checked at run time
    _, sizes, strides = g
    if any(n > 1 and st == 0 for n, st in zip(sizes, strides)):
        return True
    numel = t.numel()
    if numel <= 1 or numel > _EXACT_LIMIT or t.is_contiguous():
        return False
    return len(set(_offsets(g))) < numel


def elements_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do views ``a`` and ``b`` of one storage share an element, other than as the very same view?
    Conservative (True) where sizes are symbolic or too many to compare."""
    ga, gb = _geometry(a), _geometry(b)
    if ga is None or gb is None:
        return True
    if a.numel() == 0 or b.numel() == 0:
        return False
    if ga == gb and a.dtype == b.dtype:
        return False  # the same elements: each is read before it is written, as in eager
    if a.element_size() != b.element_size():
        return True
    (a0, a1), (b0, b1) = _span(ga), _span(gb)
    if a1 < b0 or b1 < a0:
        return False
    if a.numel() > _EXACT_LIMIT or b.numel() > _EXACT_LIMIT:
        return True
    return not set(_offsets(ga)).isdisjoint(_offsets(gb))
