"""Helpers shared by the lowerings: broadcasting loaders, scalars, type promotion."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from ..ir import IRNode, Pointwise
from ..sizes import to_expr
from ..virtualized import ops
from .registry import Unsupported, current

__all__ = ["meta", "shape_of", "size_value", "is_size_expr", "loader", "pointwise", "promote",
           "scalar_dtype", "is_value", "SUPPORTED_DTYPES", "dtype_value"]

SUPPORTED_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}


def shape_of(t: Any) -> list[Any]:
    """A tensor's (meta's) sizes: ints, or sympy expressions for symbolic sizes."""
    return [to_expr(s) for s in t.shape]


def size_value(e: Any, dtype: torch.dtype = torch.int64) -> Any:
    """An ops value for a size: a constant, or the expression computed from the symbols."""
    if isinstance(e, (int, float)):
        return ops.constant(e, dtype)
    v = ops.index_expr(e, torch.int64)
    return v if dtype == torch.int64 else ops.to_dtype(v, dtype)


def meta() -> Any:
    return current().meta()


def is_value(x: Any) -> bool:
    return isinstance(x, IRNode)


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {dtype}")


def is_size_expr(x: Any) -> bool:
    """A symbolic size (a sympy expression over the graph's size symbols) used as a scalar."""
    return isinstance(x, sympy.Expr) and not x.is_number


def scalar_dtype(x: Any) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int) or is_size_expr(x):
        return torch.int64
    if isinstance(x, float):
        return torch.float64
    raise Unsupported(f"scalar of type {type(x).__name__}")


_HALVES = (torch.float16, torch.bfloat16)


def dtype_value(x: Any, dtype: torch.dtype) -> Any:
    """A Python number as a value of ``dtype``: rounded to float16/bfloat16 (the kernels compute
    16-bit values in float32, where a constant would keep every bit); others as they are."""
    if dtype in _HALVES and isinstance(x, (int, float)) \
            and not isinstance(x, bool):
        return float(torch.tensor(x, dtype=dtype).item())
    return x


def promote(*xs: Any) -> torch.dtype:
    """torch's result type of tensors (IR values) and Python scalars."""
    proxies = []
    for x in xs:
        if is_value(x):
            shape = () if len(x.get_size()) == 0 else (0,)
            proxies.append(torch.empty(shape, dtype=x.dtype))
        elif isinstance(x, (bool, int, float)):
            proxies.append(x)
        elif is_size_expr(x):
            proxies.append(2)  # an int scalar
        else:
            raise Unsupported(f"operand of type {type(x).__name__}")
    out = proxies[0]
    if len(proxies) == 1:
        return out.dtype if isinstance(out, torch.Tensor) else scalar_dtype(out)
    dt = torch.result_type(proxies[0], proxies[1])
    for p in proxies[2:]:
        dt = torch.result_type(torch.empty((0,), dtype=dt), p)
    return dt


def loader(x: Any, out_size: Sequence[Any], dtype: torch.dtype | None = None,
           exact: bool = False) -> Callable[[Sequence[Any]], Any]:
    """A loader of ``x`` broadcast to ``out_size`` (and cast to ``dtype``). A Python number is a
    value of ``dtype`` (rounded to float16/bfloat16 as eager's TensorIterator converts a wrapped
    number: ``half(0.1) - 0.1`` is 0, ``torch.where(c, x, 0.1) == 0.1`` true); ``exact`` keeps
    every bit of it, for the ops whose eager kernel computes with the number itself in float32
    (mul, div, lerp's weight, addcmul's value)."""
    if not is_value(x):
        if is_size_expr(x):
            sdt = dtype or torch.int64
            return lambda idx: ops.to_dtype(ops.index_expr(x, torch.int64), sdt)
        if not isinstance(x, (bool, int, float)):
            raise Unsupported(f"operand of type {type(x).__name__}")
        dt = dtype or scalar_dtype(x)
        c = x if exact else dtype_value(x, dt)
        return lambda idx: ops.constant(c, dt)
    size = x.get_size()
    n, k = len(out_size), len(size)
    if k > n:
        raise Unsupported("broadcast to fewer dims")
    inner = x.make_loader()
    bcast = [size[i] == 1 and out_size[n - k + i] != 1 for i in range(k)]
    src_dtype = x.dtype

    def load(idx: Sequence[Any]) -> Any:
        sub = [0 if b else i for i, b in zip(idx[n - k:], bcast)]
        v = inner(sub)
        if dtype is not None and dtype != src_dtype:
            v = ops.to_dtype(v, dtype)
        return v

    return load


def pointwise(fn: Callable[..., Any], inputs: Sequence[Any], compute_dtype: torch.dtype | None = None,
              out_dtype: torch.dtype | None = None, size: Sequence[Any] | None = None,
              exact_scalars: bool = False) -> Pointwise:
    """A Pointwise applying ``fn`` to ``inputs`` (IR values or scalars) broadcast to the node's
    output size. Inputs are cast to ``compute_dtype`` (default: the output dtype), the result to
    the output dtype; Python numbers as ``loader`` takes them (``exact_scalars``: unrounded)."""
    m = meta()
    if size is None:
        size = shape_of(m)
    if out_dtype is None:
        out_dtype = m.dtype
    check_dtype(out_dtype)
    if compute_dtype is None:
        compute_dtype = out_dtype
    check_dtype(compute_dtype)
    loaders = [loader(x, size, compute_dtype, exact_scalars) for x in inputs]

    # float16/bfloat16 values are computed in float32, and a fused consumer reads the unrounded
    # result (fused kernels' usual choice: within 16-bit tolerances, but ones(half) * 0.1 ==
    # 0.1 is false, eager's true). Option emulate_precision_casts (GraphLowering.round_16bit):
    # each op's result rounded to its dtype here, as eager stores it (bfloat16 chains ~3x slower)
    rounds = out_dtype in _HALVES and compute_dtype in _HALVES and \
        bool(getattr(current(), "round_16bit", False))

    def inner(idx: Sequence[Any]) -> Any:
        vals = [ld(idx) for ld in loaders]
        v = fn(*vals)
        if rounds and not any(v is a for a in vals):
            v = ops.to_dtype(ops.to_dtype(v, torch.float32), out_dtype)
        return ops.to_dtype(v, out_dtype)

    device = next((x.device for x in inputs if is_value(x)), m.device if m is not None else
                  torch.device("cpu"))
    cost = 1 + sum(x.op_count() for x in inputs if is_value(x))
    return Pointwise(device, out_dtype, size, inner, cost)
