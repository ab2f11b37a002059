"""Indirect indexing: embedding, index.Tensor (advanced indexing), gather, index_select. The index
tensor's value becomes a loop variable of the load (``ops.indirect_indexing``)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..ir import Pointwise
from ..virtualized import ops
from .common import check_dtype, is_value, loader, meta, shape_of
from .registry import Unsupported, register

aten = torch.ops.aten


def _index_dtype_ok(t: Any) -> None:
    if not is_value(t) or t.dtype not in (torch.int64, torch.int32):
        raise Unsupported("index tensor dtype")


@register(aten.embedding.default)
def embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Any:
    _index_dtype_ok(indices)
    m = meta()
    size = shape_of(m)
    wl = weight.make_loader()
    il = indices.make_loader()
    nrows = weight.get_size()[0]
    k = len(indices.get_size())
    check_dtype(m.dtype)

    def inner(idx: Sequence[Any]) -> Any:
        row = ops.indirect_indexing(il(idx[:k]), nrows, False)
        return wl([row] + list(idx[k:]))
    return Pointwise(m.device, m.dtype, size, inner, 2 + indices.op_count())


@register(aten.index_select.default)
def index_select(x: Any, dim: int, index: Any) -> Any:
    _index_dtype_ok(index)
    m = meta()
    size = shape_of(m)
    n = len(x.get_size())
    if n == 0:
        raise Unsupported("0-d index_select")
    d = dim % n
    xl, il = x.make_loader(), index.make_loader()
    dimsize = x.get_size()[d]
    scalar_index = len(index.get_size()) == 0

    def inner(idx: Sequence[Any]) -> Any:
        i = ops.indirect_indexing(il([] if scalar_index else [idx[d]]), dimsize, False)
        sub = list(idx)
        sub[d] = i
        return xl(sub)
    return Pointwise(m.device, m.dtype, size, inner, 2 + x.op_count())


@register(aten.gather.default)
def gather(x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Any:
    _index_dtype_ok(index)
    m = meta()
    size = shape_of(m)
    n = len(x.get_size())
    if n == 0:
        raise Unsupported("0-d gather")
    d = dim % n
    xl, il = x.make_loader(), index.make_loader()
    dimsize = x.get_size()[d]

    def inner(idx: Sequence[Any]) -> Any:
        sub = list(idx)
        sub[d] = ops.indirect_indexing(il(idx), dimsize, False)
        return xl(sub)
    return Pointwise(m.device, m.dtype, size, inner, 2 + x.op_count())


@register(aten.index.Tensor)
def index(x: Any, indices: Sequence[Any]) -> Any:
    m = meta()
    out_size = shape_of(m)
    xsize = x.get_size()
    indices = list(indices) + [None] * (len(xsize) - len(indices))
    where = [i for i, t in enumerate(indices) if t is not None]
    for i in where:
        t = indices[i]
        if not is_value(t) or t.dtype not in (torch.int64, torch.int32):
            raise Unsupported("boolean or non-integer index")  # data-dependent shape
    if not where:
        raise Unsupported("index without tensors")
    bshape = _broadcast([list(indices[i].get_size()) for i in where])
    nb = len(bshape)
    adjacent = where == list(range(where[0], where[-1] + 1))
    first = where[0] if adjacent else 0
    loaders = {i: loader(indices[i], bshape) for i in where}
    xl = x.make_loader()
    rest = [i for i in range(len(xsize)) if i not in where]

    def inner(idx: Sequence[Any]) -> Any:
        bidx = list(idx[first:first + nb])
        sub: list[Any] = [0] * len(xsize)
        for i in where:
            sub[i] = ops.indirect_indexing(loaders[i](bidx), xsize[i])
        if adjacent:
            outer = list(idx[:first]) + list(idx[first + nb:])
        else:
            outer = list(idx[nb:])
        for i, v in zip(rest, outer):
            sub[i] = v
        return xl(sub)

    check_dtype(m.dtype)
    return Pointwise(m.device, m.dtype, out_size, inner, 2 + len(where))


def _broadcast(shapes: Sequence[Sequence[Any]]) -> list[Any]:
    """torch.broadcast_shapes over sizes that may be symbolic (a symbolic size broadcasts only
    with 1 or an equal size)."""
    from ..sizes import known_eq

    n = max(len(sh) for sh in shapes)
    out: list[Any] = [1] * n
    for sh in shapes:
        for i, v in enumerate(sh):
            j = n - len(sh) + i
            if v == 1:
                continue
            if out[j] == 1:
                out[j] = v
            elif not known_eq(out[j], v):
                raise Unsupported("index tensors of mismatched sizes")
    return out
