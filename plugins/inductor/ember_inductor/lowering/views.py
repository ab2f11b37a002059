"""View ops. A view of stored data becomes a ReinterpretView (sizes/strides/offset read from the
node's FakeTensor, so no data moves); a view of a lazy value remaps the index of its ``inner_fn``.
Also concatenation, padding and the scatter-into-slice ops, as masked pointwise bodies."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from ..ir import Buffer, IRNode, Layout, Pointwise, ReinterpretView
from ..sizes import (FloorDiv, ModularIndexing, contiguous_strides, is_symbolic, known_eq,
                     product, size_hint, statically_true, to_expr, to_stride)
from ..virtualized import ops
from .common import dtype_value, is_value, loader, meta, shape_of, size_value
from .registry import Unsupported, current, register

aten = torch.ops.aten

Remap = Callable[[Sequence[Any]], list[Any]]


def _storage_view(x: IRNode, in_meta: Any, out_meta: Any) -> IRNode | None:
    """A ReinterpretView of ``x``'s storage matching ``out_meta``, when ``x``'s layout is the one
    ``in_meta`` describes (then the view's strides and offset carry over exactly)."""
    if not isinstance(x, (Buffer, ReinterpretView)) or not isinstance(in_meta, torch.Tensor):
        return None
    lay = x.layout
    in_shape = shape_of(in_meta)
    if len(lay.size) != len(in_shape) or not all(known_eq(a, b) for a, b in zip(lay.size, in_shape)):
        return None
    if any(sz != 1 and not known_eq(st, to_stride(ms))
           for sz, st, ms in zip(lay.size, lay.stride, in_meta.stride())):
        return None
    storage = x.storage()
    offset = lay.offset + to_expr(out_meta.storage_offset()) - to_expr(in_meta.storage_offset())
    return ReinterpretView(storage, Layout(tuple(shape_of(out_meta)),
                                           tuple(to_stride(s) for s in out_meta.stride()),
                                           x.dtype, x.device, offset))


def view_op(x: Any, remap: Remap | None) -> IRNode:
    g = current()
    out_meta = g.meta()
    arg0 = g.node.args[0]
    in_meta = arg0.meta.get("val") if isinstance(arg0, torch.fx.Node) else None
    v = _storage_view(x, in_meta, out_meta)
    if v is not None:
        return v
    if remap is None:
        if isinstance(x, Pointwise):
            x = g.realize_like_meta(x, in_meta)
            v = _storage_view(x, in_meta, out_meta)
            if v is not None:
                return v
        raise Unsupported("view of this layout")
    ld = x.make_loader()
    size = shape_of(out_meta)
    return Pointwise(x.device, x.dtype, size, lambda idx: ld(remap(idx)), x.op_count())


@register(aten.permute.default)
def permute(x: Any, dims: Sequence[int]) -> Any:
    n = len(x.get_size())
    dims = [d % n for d in dims]

    def remap(idx: Sequence[Any]) -> list[Any]:
        out: list[Any] = [0] * n
        for j, d in enumerate(dims):
            out[d] = idx[j]
        return out
    return view_op(x, remap)


@register(aten.t.default)
def t(x: Any) -> Any:
    return view_op(x, lambda idx: list(reversed(idx)))


@register(aten.transpose.int)
def transpose(x: Any, d0: int, d1: int) -> Any:
    n = len(x.get_size())
    if n == 0:
        return view_op(x, lambda idx: list(idx))
    d0, d1 = d0 % n, d1 % n

    def remap(idx: Sequence[Any]) -> list[Any]:
        out = list(idx)
        out[d0], out[d1] = out[d1], out[d0]
        return out
    return view_op(x, remap)


@register(aten.expand.default)
def expand(x: Any, size: Sequence[int], implicit: bool = False) -> Any:
    in_size = x.get_size()
    out_size = shape_of(meta())
    n, k = len(out_size), len(in_size)

    def remap(idx: Sequence[Any]) -> list[Any]:
        return [0 if in_size[i] == 1 and out_size[n - k + i] != 1 else idx[n - k + i]
                for i in range(k)]
    return view_op(x, remap)


@register(aten.unsqueeze.default)
def unsqueeze(x: Any, dim: int) -> Any:
    n = len(x.get_size()) + 1
    d = dim % n
    return view_op(x, lambda idx: [i for j, i in enumerate(idx) if j != d])


@register(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def squeeze(x: Any, dims: Any = None) -> Any:
    size = x.get_size()
    n = len(size)
    if dims is None:
        drop = {i for i, s in enumerate(size) if s == 1}
    else:
        ds = [dims] if isinstance(dims, int) else list(dims)
        drop = {d % n for d in ds if size[d % n] == 1} if n else set()

    def remap(idx: Sequence[Any]) -> list[Any]:
        it = iter(idx)
        return [0 if i in drop else next(it) for i in range(n)]
    return view_op(x, remap)


@register(aten.slice.Tensor)
def slice_(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    size = x.get_size()
    d = dim % len(size)
    n = size[d]
    if not isinstance(step, int):
        raise Unsupported("symbolic slice step")
    try:
        s = _clamp_index(0 if start is None else start, n)
    except Unsupported:
        return view_op(x, None)  # a view of the storage needs no bound arithmetic

    def remap(idx: Sequence[Any]) -> list[Any]:
        out = list(idx)
        out[d] = s + step * idx[d]
        return out
    return view_op(x, remap)


def _clamp_index(s: Any, n: Any) -> Any:
    """A slice bound ``s`` normalized into [0, n] as Python does; symbolic bounds only where the
    result is known for every size (else the op falls back to ATen)."""
    if isinstance(s, int) and isinstance(n, int):
        if s < 0:
            s += n
        return min(max(s, 0), n)
    if isinstance(s, int) and s >= (1 << 62):
        return n  # "to the end"
    if statically_true(sympy.sympify(s) >= 0):
        if statically_true(sympy.sympify(s) <= n):
            return s
        if statically_true(sympy.sympify(s) >= n):
            return n
    elif statically_true(sympy.sympify(s) < 0):
        t = s + n
        if statically_true(sympy.sympify(t) >= 0):
            return t
    raise Unsupported(f"slice bound {s} of a dim of size {n}")


@register(aten.select.int)
def select(x: Any, dim: int, index: int) -> Any:
    size = x.get_size()
    d = dim % len(size)
    i0 = _select_index(index, size[d])

    def remap(idx: Sequence[Any]) -> list[Any]:
        out = list(idx)
        out.insert(d, i0)
        return out
    return view_op(x, remap)


def _select_index(index: Any, n: Any) -> Any:
    if isinstance(index, int):
        return index + n if index < 0 else index
    if statically_true(sympy.sympify(index) >= 0):
        return index
    if statically_true(sympy.sympify(index) < 0):
        return index + n
    raise Unsupported(f"select index {index} of unknown sign")


def reshape_remap(old: Sequence[Any], new: Sequence[Any]) -> Remap:
    """Index remapping from a contiguous reshape of ``old`` to ``new``: dims are matched in groups
    of equal products, so only merged groups pay a division."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    old = list(old)
    new = list(new)
    symbolic = any(is_symbolic(v) for v in old + new)
    # symbolic sizes: dims are grouped by their example values, and every group's products are
    # then checked to be equal for all sizes (else the reshape falls back to ATen)
    h = size_hint if symbolic else (lambda v: v)
    while i < len(old) or j < len(new):
        gi, gj = [], []
        po = pn = 1
        # always take at least one dim from each side that has dims left
        if i < len(old):
            gi.append(i); po *= h(old[i]); i += 1
        if j < len(new):
            gj.append(j); pn *= h(new[j]); j += 1
        while po != pn:
            if po < pn and i < len(old):
                gi.append(i); po *= h(old[i]); i += 1
            elif j < len(new):
                gj.append(j); pn *= h(new[j]); j += 1
            else:
                break
        # absorb trailing size-1 dims
        while i < len(old) and old[i] == 1 and (j >= len(new) or new[j] != 1):
            gi.append(i); i += 1
        while j < len(new) and new[j] == 1 and (i >= len(old) or old[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
        if symbolic and not known_eq(product([old[k] for k in gi]), product([new[k] for k in gj])):
            raise Unsupported("reshape whose dim groups match only for the example sizes")

    def remap(idx: Sequence[Any]) -> list[Any]:
        out: list[Any] = [0] * len(old)
        for gi, gj in groups:
            flat: Any = 0
            strides = contiguous_strides([new[k] for k in gj])
            for k, st in zip(gj, strides):
                if new[k] != 1:
                    flat = flat + idx[k] * st
            ostr = contiguous_strides([old[k] for k in gi])
            for pos, (k, st) in enumerate(zip(gi, ostr)):
                if old[k] == 1:
                    out[k] = 0
                elif len([q for q in gi if old[q] != 1]) == 1:
                    out[k] = flat
                elif pos == 0:
                    out[k] = FloorDiv(flat, st)
                else:
                    out[k] = ModularIndexing(flat, st, old[k])
        return out
    return remap


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(x: Any, size: Sequence[Any]) -> Any:
    old = x.get_size()
    new = shape_of(meta())
    if not known_eq(product(old), product(new)):
        raise Unsupported("reshape with mismatched numel")
    remap = reshape_remap(old, new)
    if isinstance(x, Pointwise) and _divides(remap, len(new)):
        # merging dims of a lazy value would put divisions into every consumer's index and keep
        # the consumer from fusing with loops over the original shape: store it, view the storage
        g = current()
        arg0 = g.node.args[0]
        in_meta = arg0.meta.get("val") if isinstance(arg0, torch.fx.Node) else None
        if isinstance(in_meta, torch.Tensor) and in_meta.is_contiguous():
            x = g.realize(x)
    return view_op(x, remap)


def _divides(remap: Remap, n: int) -> bool:
    from ..sizes import var
    return any(e.has(FloorDiv) or e.has(ModularIndexing)
               for e in remap([var(i) for i in range(n)]) if hasattr(e, "has"))


@register(aten.flip.default)
def flip(x: Any, dims: Sequence[int]) -> Any:
    """A reversed index (torch's flip copies: strides cannot be negative), lazy: it fuses into
    its consumer instead of an ATen copy of a stored input."""
    size = x.get_size()
    n = len(size)
    if n == 0:
        return x
    ds = {d % n for d in dims}
    ld = x.make_loader()

    def inner(idx: Sequence[Any]) -> Any:
        return ld([size[i] - 1 - v if i in ds else v for i, v in enumerate(idx)])
    return Pointwise(x.device, x.dtype, list(size), inner, x.op_count())


@register(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(x: Any) -> Any:
    return x


@register(aten.as_strided.default)
def as_strided(x: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    return view_op(x, None)


def _split(x: Any, sizes: Sequence[int], dim: int) -> list[Any]:
    g = current()
    node = g.node
    n = len(x.get_size())
    d = dim % n
    metas = node.meta["val"]
    outs = []
    start = 0
    in_meta = node.args[0].meta.get("val")
    for sz, m in zip(sizes, metas):
        v = _storage_view(x, in_meta, m)
        if v is None:
            s0 = start
            ld = x.make_loader()

            def remap(idx: Sequence[Any], s0: Any = s0) -> list[Any]:
                out = list(idx)
                out[d] = idx[d] + s0
                return out
            v = Pointwise(x.device, x.dtype, shape_of(m),
                          (lambda ld, remap: lambda idx: ld(remap(idx)))(ld, remap), x.op_count())
        outs.append(v)
        start += sz
    return outs


@register(aten.split_with_sizes.default)
def split_with_sizes(x: Any, sizes: Sequence[int], dim: int = 0) -> Any:
    return _split(x, sizes, dim)


@register(aten.split.Tensor)
def split(x: Any, split_size: int, dim: int = 0) -> Any:
    metas = current().node.meta["val"]
    n = len(x.get_size())
    return _split(x, [to_expr(m.shape[dim % n]) for m in metas], dim)


@register(aten.unbind.int)
def unbind(x: Any, dim: int = 0) -> Any:
    n = len(x.get_size())
    d = dim % n
    outs = []
    ld = x.make_loader()
    for k in range(len(current().node.meta["val"])):
        size = [s for i, s in enumerate(x.get_size()) if i != d]
        outs.append(Pointwise(x.device, x.dtype, size, (lambda k: lambda idx: ld(
            list(idx[:d]) + [k] + list(idx[d:])))(k), x.op_count()))
    return outs


# -- concatenation and padding: masked bodies --------------------------------------------------------
@register(aten.cat.default)
def cat(tensors: Sequence[Any], dim: int = 0) -> Any:
    m = meta()
    out_size = shape_of(m)
    d = dim % len(out_size)
    parts = [t for t in tensors if is_value(t) and not (len(t.get_size()) == 1 and t.get_size()[0] == 0
                                                       and len(out_size) > 1)]
    starts, loaders = [], []
    acc = 0
    for t in parts:
        starts.append(acc)
        acc += t.get_size()[d]
        loaders.append(t.make_loader())
    dt = m.dtype

    def inner(idx: Sequence[Any]) -> Any:
        result: Any = None
        first = True
        for k in reversed(range(len(parts))):
            s0 = starts[k]
            sub = list(idx)
            sub[d] = idx[d] - s0
            ld = loaders[k]

            def body(ld: Any = ld, sub: Any = sub, src: Any = parts[k]) -> Any:
                v = ld(sub)
                return ops.to_dtype(v, dt) if src.dtype != dt else v
            if first:
                # the last part is read only where it lies: below its start its index would be
                # negative (a read before the buffer, which may be unmapped memory)
                if s0 == 0:
                    result = body()
                else:
                    ge = ops.ge(ops.index_expr(idx[d], torch.int64), size_value(s0))
                    result = ops.masked(ge, body, 0, dt)
                first = False
                continue
            i = ops.index_expr(idx[d], torch.int64)
            cond = ops.lt(i, size_value(s0 + parts[k].get_size()[d]))
            # the part's own reads are masked to where it lies, both ends: below its start its
            # index is negative (a middle part of GPT-2's q/k/v gradient cat read 768 elements
            # before its buffer: an illegal memory access on the GPU when that buffer began a
            # segment of the allocator)
            inside = cond if s0 == 0 else ops.logical_and(ops.ge(i, size_value(s0)), cond)
            result = ops.where(cond, ops.masked(inside, body, 0, dt), result)
        return result

    if not parts:
        raise Unsupported("cat of empty tensors")
    cost = 2 * len(parts) + sum(p.op_count() for p in parts)
    return Pointwise(m.device, dt, out_size, inner, cost)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x: Any, pad: Sequence[int], value: Any = 0) -> Any:
    m = meta()
    out_size = shape_of(m)
    n = len(out_size)
    in_size = x.get_size()
    if not all(isinstance(p, int) for p in pad) or not isinstance(value, (bool, int, float)):
        raise Unsupported("symbolic padding or fill value")
    lo = [0] * n
    for k in range(len(pad) // 2):
        lo[n - 1 - k] = pad[2 * k]
    ld = x.make_loader()
    dt = m.dtype
    value = dtype_value(value, dt)  # a float16 pad of 0.1 is half(0.1), as in eager

    def inner(idx: Sequence[Any]) -> Any:
        src = [i - l for i, l in zip(idx, lo)]
        cond = None
        for k in range(n):
            # no check where every source index is inside the input (a negative padding crops)
            if lo[k] <= 0 and statically_true(sympy.sympify(out_size[k] - lo[k]) <= in_size[k]):
                continue
            e = ops.index_expr(src[k], torch.int64)
            c = ops.logical_and(ops.ge(e, ops.constant(0, torch.int64)),
                                ops.lt(e, size_value(in_size[k])))
            cond = c if cond is None else ops.logical_and(cond, c)
        if cond is None:
            return ld(src)
        return ops.where(cond, ops.masked(cond, lambda: ld(src), value, dt), ops.constant(value, dt))

    return Pointwise(m.device, dt, out_size, inner, x.op_count() + 3)


@register(aten.slice_scatter.default)
def slice_scatter(base: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None,
                  step: int = 1) -> Any:
    m = meta()
    size = shape_of(m)
    d = dim % len(size)
    n = size[d]
    if not isinstance(step, int):
        raise Unsupported("symbolic slice step")
    s = _clamp_index(0 if start is None else start, n)
    if isinstance(s, int) and isinstance(n, int):
        e = _clamp_index(n if end is None else end, n)
        e = max(e, s)
    else:
        # symbolic: the slice holds exactly src's elements along d (ATen checks that), so the
        # end follows from the start and src's size, whatever ``end`` was clamped to
        e = s + step * src.get_size()[d]
    bl = loader(base, size, m.dtype)
    sl = src.make_loader()
    dt = m.dtype

    def inner(idx: Sequence[Any]) -> Any:
        i = ops.index_expr(idx[d], torch.int64)
        cond = ops.logical_and(ops.ge(i, size_value(s)), ops.lt(i, size_value(e)))
        if step != 1:
            cond = ops.logical_and(cond, ops.eq(
                ops.index_expr(ModularIndexing(idx[d] - s, 1, step), torch.int64),
                ops.constant(0, torch.int64)))
        sub = list(idx)
        sub[d] = FloorDiv(idx[d] - s, step) if step != 1 else idx[d] - s

        def body() -> Any:
            v = sl(sub)
            return ops.to_dtype(v, dt) if src.dtype != dt else v
        return ops.where(cond, ops.masked(cond, body, 0, dt), bl(idx))

    return Pointwise(m.device, dt, size, inner, base.op_count() + src.op_count() + 3)


@register(aten.select_scatter.default)
def select_scatter(base: Any, src: Any, dim: int, index: int) -> Any:
    m = meta()
    size = shape_of(m)
    d = dim % len(size)
    i0 = _select_index(index, size[d])
    bl = loader(base, size, m.dtype)
    sl = src.make_loader()
    dt = m.dtype

    def inner(idx: Sequence[Any]) -> Any:
        cond = ops.eq(ops.index_expr(idx[d], torch.int64), size_value(i0))
        sub = [i for k, i in enumerate(idx) if k != d]

        def body() -> Any:
            v = sl(sub)
            return ops.to_dtype(v, dt) if src.dtype != dt else v
        return ops.where(cond, ops.masked(cond, body, 0, dt), bl(idx))

    return Pointwise(m.device, dt, size, inner, base.op_count() + src.op_count() + 3)
