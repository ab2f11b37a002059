"""Lowerings of reductions (sum, mean, amax/amin, argmax/argmin, prod, any/all, var/var_mean, std)
and of softmax/log_softmax, composed from reductions and pointwise IR."""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from ..ir import Pointwise, Reduction
from ..sizes import product, statically_true
from ..virtualized import ops
from .common import check_dtype, is_value, loader, meta, size_value
from .registry import Unsupported, current, register

aten = torch.ops.aten


def _dims(x: Any, dims: Any) -> list[int]:
    n = len(x.get_size())
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % n if n else 0 for d in dims})


def acc_dtype(dtype: torch.dtype, rtype: str) -> torch.dtype:
    if rtype in ("sum", "prod"):
        if dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        if not dtype.is_floating_point:
            return torch.int64
    return dtype


def reduce(x: Any, dims: Sequence[int], keepdim: bool, rtype: str, out_dtype: torch.dtype,
           value_fn: Any = None) -> Any:
    """A realized Reduction of ``x`` over ``dims``; ``value_fn(v)`` maps the loaded value."""
    size = x.get_size()
    dims = list(dims)
    if len(size) == 0:
        dims = []
    out_size = [1 if i in dims else s for i, s in enumerate(size) if keepdim or i not in dims]
    rranges = [size[d] for d in dims]
    src_dtype = x.dtype if value_fn is None else out_dtype
    acc = acc_dtype(src_dtype, rtype) if rtype in ("sum", "prod") else src_dtype
    check_dtype(out_dtype)
    load = x.make_loader()
    kept = [i for i in range(len(size)) if i not in dims]

    def inner(idx: Sequence[Any], ridx: Sequence[Any]) -> Any:
        full: list[Any] = [0] * len(size)
        if keepdim:
            for i in kept:
                full[i] = idx[i]
        else:
            for j, i in enumerate(kept):
                full[i] = idx[j]
        for j, d in enumerate(dims):
            full[d] = ridx[j]
        v = load(full)
        if value_fn is not None:
            v = value_fn(v)
        if acc != src_dtype:
            v = ops.to_dtype(v, acc)
        return v

    if product(rranges) == 0 and rtype in ("max", "min", "argmax", "argmin"):
        raise Unsupported("empty max/min reduction")  # eager raises; let ATen say so
    n = product(rranges)
    if rtype == "sum" and isinstance(n, int) and 1 < n <= TINY_SUM and rranges:
        return _unrolled_sum(x, out_dtype, out_size, rranges, inner, acc)
    red = Reduction(x.device, out_dtype, out_size, rranges, rtype, inner, acc)
    return current().realize(red)


#: sums of at most this many elements are unrolled into a pointwise body (a sum over a dim of
#: size 3 after a reshape: a reduction loop of 3 iterations innermost, scalar, its value stored)
TINY_SUM = 3


def _unrolled_sum(x: Any, out_dtype: torch.dtype, out_size: Sequence[Any],
                  rranges: Sequence[Any], inner: Any, acc: torch.dtype) -> Any:
    import itertools

    points = list(itertools.product(*[range(int(r)) for r in rranges]))

    def body(idx: Sequence[Any]) -> Any:
        total = ops.constant(0, acc)  # as the reduction's accumulator starts
        for r in points:
            total = ops.add(total, inner(idx, list(r)))
        return ops.to_dtype(total, out_dtype) if acc != out_dtype else total

    cost = len(points) * (1 + x.op_count()) + 1
    return Pointwise(x.device, out_dtype, out_size, body, cost)


def _acc_to_out(buf: Any, out_dtype: torch.dtype) -> Any:
    if buf.dtype == out_dtype:
        return buf
    ld = buf.make_loader()
    return Pointwise(buf.device, out_dtype, buf.get_size(), lambda i: ops.to_dtype(ld(i), out_dtype))


def _sum(x: Any, dims: Any, keepdim: bool, out_dtype: torch.dtype,
         result_dtype: torch.dtype | None = None) -> Any:
    """The sum of ``x`` (as ``out_dtype``) over ``dims``, as ``result_dtype`` (default
    ``out_dtype``; the accumulator's dtype keeps the sum unrounded)."""
    acc = acc_dtype(out_dtype, "sum")
    if is_value(x) and x.dtype != out_dtype:
        xl = x
        x = Pointwise(x.device, out_dtype, x.get_size(),
                      (lambda ld: lambda i: ops.to_dtype(ld(i), out_dtype))(xl.make_loader()),
                      xl.op_count() + 1)
    buf = reduce(x, _dims(x, dims), keepdim, "sum", acc)
    return _acc_to_out(buf, out_dtype if result_dtype is None else result_dtype)


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(x: Any, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    return _sum(x, dims, keepdim, meta().dtype)


@register(aten.mean.dim, aten.mean.default)
def mean(x: Any, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    out_dtype = meta().dtype
    if not out_dtype.is_floating_point:
        raise Unsupported("integer mean")
    d = _dims(x, dims)
    n = product([x.get_size()[i] for i in d]) if x.get_size() else 1
    # divided in the sum's accumulator dtype, rounded once: as eager's mean of float16/bfloat16
    # (a float16 sum above 65504 was inf before the division)
    acc = acc_dtype(out_dtype, "sum")
    s = _sum(x, d, keepdim, out_dtype, acc)
    ld = s.make_loader()
    return Pointwise(x.device, out_dtype, s.get_size(), lambda i: ops.to_dtype(
        ops.truediv(ld(i), size_value(n, acc)), out_dtype), 2)


@register(aten.prod.dim_int, aten.prod.default)
def prod(x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    out_dtype = meta().dtype
    if x.dtype != out_dtype:
        raise Unsupported("prod with dtype")
    buf = reduce(x, _dims(x, dim), keepdim, "prod", acc_dtype(out_dtype, "prod"))
    return _acc_to_out(buf, out_dtype)


@register(aten.amax.default)
def amax(x: Any, dims: Any = (), keepdim: bool = False) -> Any:
    return reduce(x, _dims(x, dims), keepdim, "max", x.dtype)


@register(aten.amin.default)
def amin(x: Any, dims: Any = (), keepdim: bool = False) -> Any:
    return reduce(x, _dims(x, dims), keepdim, "min", x.dtype)


def _logical_reduction(x: Any, dim: Any, keepdim: bool, rtype: str) -> Any:
    r = reduce(x, _dims(x, dim), keepdim, rtype, torch.bool,
               value_fn=lambda v: ops.to_dtype(v, torch.bool))
    if meta().dtype != torch.bool:  # ATen's any/all of uint8 are uint8 (0 or 1), not bool
        from .common import pointwise

        return pointwise(lambda v: v, [r])
    return r


@register(aten.any.dim, aten.any.default, aten.any.dims)
def any_(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _logical_reduction(x, dim, keepdim, "any")


@register(aten.all.dim, aten.all.default, aten.all.dims)
def all_(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _logical_reduction(x, dim, keepdim, "all")


def _arg(x: Any, dim: Any, keepdim: bool, rtype: str) -> Any:
    if dim is None:
        if len(x.get_size()) > 1:
            raise Unsupported("flattened argmax")
        dim = 0
    return reduce(x, _dims(x, dim), keepdim, rtype, torch.int64)


@register(aten.argmax.default)
def argmax(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    if x.dtype is torch.bool:  # ATen refuses: its kernel, called at run time, raises
        raise Unsupported("argmax of bool")
    return _arg(x, dim, keepdim, "argmax")


@register(aten.argmin.default)
def argmin(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    if x.dtype is torch.bool:  # ATen refuses: its kernel, called at run time, raises
        raise Unsupported("argmin of bool")
    return _arg(x, dim, keepdim, "argmin")


@register(aten.max.dim)
def max_dim(x: Any, dim: int, keepdim: bool = False) -> Any:
    return (reduce(x, _dims(x, dim), keepdim, "max", x.dtype), _arg(x, dim, keepdim, "argmax"))


@register(aten.min.dim)
def min_dim(x: Any, dim: int, keepdim: bool = False) -> Any:
    return (reduce(x, _dims(x, dim), keepdim, "min", x.dtype), _arg(x, dim, keepdim, "argmin"))


def _var_mean(x: Any, dims: Any, correction: Any, keepdim: bool) -> tuple[Any, Any]:
    dt = x.dtype
    if not dt.is_floating_point:
        raise Unsupported("integer var")
    calc = torch.float32 if dt in (torch.bfloat16, torch.float16) else dt
    d = _dims(x, dims)
    n = product([x.get_size()[i] for i in d]) if x.get_size() else 1
    corr = 1 if correction is None else correction
    xl = x.make_loader()
    size = x.get_size()
    if getattr(current(), "shifted_var_mean", False) and (
            n > 0 if isinstance(n, int) else statically_true(sympy.sympify(n) >= 1)):
        # (GraphLowering.shifted_var_mean, both targets): the mean as the row's first element
        # plus the mean of the deviations from it, so its rounding error scales with the
        # spread, not the magnitude (a large mean, a small variance: eager's Welford accuracy,
        # still two passes). The plain sum gave 9e-4 relative error in C++ on rows of 3000
        # around 1e5 (eager 3e-8); the shift costs a broadcast load and a subtraction.
        def shift(i: Any) -> Any:
            return ops.to_dtype(xl([0 if k in d else i[k] for k in range(len(size))]), calc)
        s = reduce(Pointwise(x.device, calc, size,
                             lambda i: ops.sub(ops.to_dtype(xl(i), calc), shift(i)), 2),
                   d, True, "sum", calc)
        sl0 = s.make_loader()

        def mean_at(i: Any) -> Any:
            return ops.add(shift(i), ops.truediv(sl0(i), size_value(n, calc)))
        # the deviations' mean, on the reduced (kept) shape, broadcast to the input's
        dev_mean = loader(Pointwise(x.device, calc, s.get_size(), lambda i: ops.truediv(
            sl0(i), size_value(n, calc)), 2), x.get_size())

        def centered_at(i: Any) -> Any:
            # (x - shift) is exact for nearby values; never subtract a rounded large mean
            return ops.sub(ops.sub(ops.to_dtype(xl(i), calc), shift(i)), dev_mean(i))
    else:
        s = reduce(x, d, True, "sum", calc)
        sl = s.make_loader()

        def mean_at(i: Any) -> Any:
            return ops.truediv(sl(i), size_value(n, calc))
        ml = loader(Pointwise(x.device, calc, s.get_size(), mean_at, 2), x.get_size())

        def centered_at(i: Any) -> Any:
            return ops.sub(ops.to_dtype(xl(i), calc), ml(i))

    centered = Pointwise(x.device, calc, size, lambda i: (lambda c: ops.mul(c, c))(
        centered_at(i)), 3)
    ss = reduce(centered, d, keepdim, "sum", calc)
    ssl = ss.make_loader()
    if isinstance(n, int) and isinstance(corr, (int, float)):
        denom: Any = max(0, n - corr)
    elif isinstance(corr, int) and statically_true(sympy.sympify(n) >= corr):
        denom = n - corr
    else:
        raise Unsupported("var with a correction that may exceed the symbolic count")
    var = Pointwise(x.device, dt, ss.get_size(), lambda i: ops.to_dtype(
        ops.truediv(ssl(i), size_value(denom, calc)), dt), 2)
    if keepdim:
        mean = Pointwise(x.device, dt, s.get_size(), lambda i: ops.to_dtype(mean_at(i), dt), 2)
    else:
        kept = [s_ for i, s_ in enumerate(size) if i not in d]
        keep_idx = [i for i in range(len(size)) if i not in d]

        def mean_fn(i: Any) -> Any:
            full = [0] * len(size)
            for j, k in enumerate(keep_idx):
                full[k] = i[j]
            return ops.to_dtype(mean_at(full), dt)
        mean = Pointwise(x.device, dt, kept, mean_fn, 2)
    return var, mean


@register(aten.var_mean.correction)
def var_mean(x: Any, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return _var_mean(x, dims, correction, keepdim)


@register(aten.var.correction)
def var(x: Any, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return _var_mean(x, dims, correction, keepdim)[0]


@register(aten._softmax.default)
def softmax(x: Any, dim: int, half_to_float: bool) -> Any:
    return _softmax(x, dim, log=False)


@register(aten._log_softmax.default)
def log_softmax(x: Any, dim: int, half_to_float: bool) -> Any:
    return _softmax(x, dim, log=True)


def _softmax(x: Any, dim: int, log: bool) -> Any:
    out_dtype = meta().dtype
    calc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    if not calc.is_floating_point:
        raise Unsupported("integer softmax")
    size = x.get_size()
    if len(size) == 0:
        raise Unsupported("0-d softmax")
    d = _dims(x, dim)
    xl = x.make_loader()
    xc = Pointwise(x.device, calc, size, lambda i: ops.to_dtype(xl(i), calc), x.op_count() + 1)
    m = reduce(xc, d, True, "max", calc)
    ml = loader(m, size)
    xcl = xc.make_loader()

    def shifted(i: Any) -> Any:
        # rows of -inf: eager gives NaN for softmax; x - max would be NaN as well
        return ops.sub(xcl(i), ml(i))

    e = Pointwise(x.device, calc, size, lambda i: ops.exp(shifted(i)), x.op_count() + 3)
    s = reduce(e, d, True, "sum", calc)
    sl = loader(s, size)
    if log:
        return Pointwise(x.device, out_dtype, size, lambda i: ops.to_dtype(
            ops.sub(shifted(i), ops.log(sl(i))), out_dtype), x.op_count() + 4)
    if d == [len(size) - 1] and getattr(current(), "row_scratch", False):
        # along the rows: exp(x - max) is stored once (into the output, or a stack row of the
        # fused loop nest: scheduler._row_scratch_ok) and read back by the normalization instead
        # of recomputed; scaled by the row's reciprocal sum, as eager's kernel does
        e = current().realize(e)
        el = e.make_loader()
        return Pointwise(x.device, out_dtype, size, lambda i: ops.to_dtype(
            ops.mul(el(i), ops.reciprocal(sl(i))), out_dtype), x.op_count() + 4)
    el = e.make_loader()
    return Pointwise(x.device, out_dtype, size, lambda i: ops.to_dtype(
        ops.truediv(el(i), sl(i)), out_dtype), x.op_count() + 4)
