"""Lowerings of elementwise ATen ops to Pointwise IR."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir import Pointwise
from ..virtualized import ops
from ..sizes import to_expr
from .common import (check_dtype, dtype_value, is_size_expr, is_value, loader, meta, pointwise,
                     promote, shape_of)
from .registry import Unsupported, register

aten = torch.ops.aten

# ATen op -> ops handler method; the inputs are cast to the output dtype first.
UNARY = {
    aten.abs: "abs", aten.neg: "neg", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1",
    aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p",
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.sqrt: "sqrt",
    aten.rsqrt: "rsqrt", aten.reciprocal: "reciprocal", aten.sigmoid: "sigmoid", aten.erf: "erf",
    aten.erfc: "erfc", aten.floor: "floor", aten.ceil: "ceil", aten.trunc: "trunc",
    aten.frac: "frac", aten.sign: "sign", aten.relu: "relu", aten.silu: "silu",
    aten.bitwise_not: "bitwise_not", aten.lgamma: "lgamma",
}
# result bool, computed in the input dtype
PREDICATES = {aten.isnan: "isnan", aten.isinf: "isinf", aten.signbit: "signbit",
              aten.logical_not: "logical_not", aten.isfinite: "isfinite"}
BINARY = {
    aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
    aten.remainder: "remainder", aten.fmod: "fmod", aten.copysign: "copysign",
    aten.hypot: "hypot", aten.floor_divide: "floordiv", aten.bitwise_left_shift: "lshift",
    aten.bitwise_right_shift: "rshift", aten.fmax: "fmax", aten.fmin: "fmin",
}
COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge",
           aten.logical_and: "logical_and", aten.logical_or: "logical_or",
           aten.logical_xor: "logical_xor"}


def _unary(name: str) -> Any:
    def lower(x: Any) -> Any:
        if meta().dtype.is_complex:
            raise Unsupported("complex")
        return pointwise(lambda a: getattr(ops, name)(a), [x])
    return lower


def _predicate(name: str) -> Any:
    def lower(x: Any) -> Any:
        return pointwise(lambda a: getattr(ops, name)(a), [x], compute_dtype=x.dtype,
                         out_dtype=torch.bool)
    return lower


#: binary ops whose eager kernel computes with a Python number unconverted (in float32 for
#: float16/bfloat16 tensors); the others convert it to the tensor's dtype first (``loader``)
_EXACT_SCALAR = {"mul", "floordiv"}


def _binary(name: str) -> Any:
    def lower(a: Any, b: Any) -> Any:
        return pointwise(lambda x, y: getattr(ops, name)(x, y), [a, b],
                         exact_scalars=name in _EXACT_SCALAR)
    return lower


def _compare(name: str) -> Any:
    def lower(a: Any, b: Any) -> Any:
        return pointwise(lambda x, y: getattr(ops, name)(x, y), [a, b], compute_dtype=promote(a, b),
                         out_dtype=torch.bool)
    return lower


for _op, _n in UNARY.items():
    register(_op)(_unary(_n))
for _op, _n in PREDICATES.items():
    register(_op)(_predicate(_n))
for _op, _n in BINARY.items():
    register(_op)(_binary(_n))
for _op, _n in COMPARE.items():
    register(_op)(_compare(_n))


def _check_no_out(kwargs: dict[str, Any]) -> None:
    if kwargs.get("out") is not None:
        raise Unsupported("out=")


@register(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, alpha: Any = 1) -> Any:
    if alpha == 1:
        return pointwise(lambda x, y: ops.add(x, y), [a, b])
    return pointwise(lambda x, y, al: ops.add(x, ops.mul(y, al)), [a, b, alpha])


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, alpha: Any = 1) -> Any:
    if any(type(v) is bool or getattr(v, "dtype", None) is torch.bool for v in (a, b, alpha)):
        # ATen refuses (``mask - 1.5``: "Subtraction ... with a bool tensor is not supported"):
        # its kernel, called at run time, raises eager's error
        raise Unsupported("subtraction with a bool operand")
    if alpha == 1:
        return pointwise(lambda x, y: ops.sub(x, y), [a, b])
    return pointwise(lambda x, y, al: ops.sub(x, ops.mul(y, al)), [a, b, alpha])


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return sub(b, a, alpha)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        return pointwise(lambda x, y: ops.truediv(x, y), [a, b], exact_scalars=True)
    name = {"floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return pointwise(lambda x, y: getattr(ops, name)(x, y), [a, b], exact_scalars=True)


@register(aten.true_divide.Tensor)
def true_divide(a: Any, b: Any) -> Any:
    return div(a, b)


@register(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(a: Any, e: Any) -> Any:
    dt = meta().dtype
    e = dtype_value(e, dt)  # eager's float16 x ** 3.14159 raises to half(3.14159), as loader
    if isinstance(e, (int, float)) and dt.is_floating_point:
        if e == 2:
            return pointwise(lambda x: ops.mul(x, x), [a])
        if e == 1:
            return pointwise(lambda x: x, [a])
        if e == 3:
            return pointwise(lambda x: ops.mul(ops.mul(x, x), x), [a])
        if e == 0.5:
            return pointwise(lambda x: ops.sqrt(x), [a])
        if e == -1:
            return pointwise(lambda x: ops.reciprocal(x), [a])
        if e == -0.5:
            return pointwise(lambda x: ops.rsqrt(x), [a])
        if e == 0:
            return pointwise(lambda x: ops.constant(1, dt), [a])
    return pointwise(lambda x, y: ops.pow(x, y), [a, e])


@register(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(a: Any, b: Any) -> Any:
    return pointwise(lambda x, y: ops.pow(x, y), [a, b])


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(c: Any, a: Any, b: Any) -> Any:
    m = meta()
    size = shape_of(m)
    lc = loader(c, size, torch.bool)
    la, lb = loader(a, size, m.dtype), loader(b, size, m.dtype)
    check_dtype(m.dtype)
    cost = 1 + sum(x.op_count() for x in (c, a, b) if is_value(x))
    return Pointwise(m.device, m.dtype, size, lambda i: ops.where(lc(i), la(i), lb(i)), cost)


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    dt = meta().dtype
    inputs = [x] + [v for v in (lo, hi) if v is not None]

    def fn(*vals: Any) -> Any:
        v = vals[0]
        k = 1
        if lo is not None:
            v = ops.maximum(v, vals[k])
            k += 1
        if hi is not None:
            v = ops.minimum(v, vals[k])
        return v

    return pointwise(fn, inputs, compute_dtype=dt)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(x: Any, min: Any = None, max: Any = None) -> Any:
    return _clamp(x, min, max)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x: Any, min: Any) -> Any:
    return _clamp(x, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x: Any, max: Any) -> Any:
    return _clamp(x, None, max)


@register(aten.hardtanh.default)
def hardtanh(x: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    return _clamp(x, min_val, max_val)


@register(aten.gelu.default)
def gelu(x: Any, approximate: str = "none") -> Any:
    dt = meta().dtype
    if approximate == "tanh":
        def fn(a: Any) -> Any:
            c = ops.constant(math.sqrt(2 / math.pi), dt)
            inner = ops.mul(c, ops.add(a, ops.mul(ops.constant(0.044715, dt),
                                                  ops.mul(ops.mul(a, a), a))))
            return ops.mul(ops.mul(ops.constant(0.5, dt), a),
                           ops.add(ops.constant(1, dt), ops.tanh(inner)))
    else:
        def fn(a: Any) -> Any:
            return ops.mul(ops.mul(a, ops.constant(0.5, dt)),
                           ops.add(ops.constant(1, dt),
                                   ops.erf(ops.mul(a, ops.constant(math.sqrt(0.5), dt)))))
    return pointwise(fn, [x])


@register(aten.leaky_relu.default)
def leaky_relu(x: Any, negative_slope: Any = 0.01) -> Any:
    dt = meta().dtype
    return pointwise(lambda a: ops.where(ops.gt(a, ops.constant(0, dt)), a,
                                         ops.mul(a, ops.constant(negative_slope, dt))), [x])


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(a: Any, b: Any, w: Any) -> Any:
    return pointwise(lambda x, y, z: ops.add(x, ops.mul(z, ops.sub(y, x))), [a, b, w],
                     exact_scalars=True)


@register(aten.addcmul.default)
def addcmul(a: Any, b: Any, c: Any, value: Any = 1) -> Any:
    return pointwise(lambda x, y, z, v: ops.add(x, ops.mul(v, ops.mul(y, z))), [a, b, c, value],
                     exact_scalars=True)


@register(aten.addcdiv.default)
def addcdiv(a: Any, b: Any, c: Any, value: Any = 1) -> Any:
    return pointwise(lambda x, y, z, v: ops.add(x, ops.mul(v, ops.truediv(y, z))),
                     [a, b, c, value], exact_scalars=True)


# -- casts, copies, constants ---------------------------------------------------------------------
def _no_layout_change(kwargs: dict[str, Any]) -> None:
    mf = kwargs.get("memory_format")
    if mf not in (None, torch.preserve_format, torch.contiguous_format):
        raise Unsupported(f"memory_format={mf}")


@register(aten._to_copy.default)
def to_copy(x: Any, **kwargs: Any) -> Any:
    m = meta()
    if not is_value(x) or m.device != x.device:
        raise Unsupported("device copy")
    _no_layout_change(kwargs)
    return pointwise(lambda a: a, [x], compute_dtype=m.dtype)


@register(aten.clone.default)
def clone(x: Any, **kwargs: Any) -> Any:
    _no_layout_change(kwargs)
    return pointwise(lambda a: a, [x])


@register(aten.copy.default)
def copy(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    if is_value(src) and src.device != dst.device:
        raise Unsupported("device copy")
    return pointwise(lambda a: a, [src])


@register(aten.lift_fresh_copy.default)
def lift_fresh_copy(x: Any) -> Any:
    return pointwise(lambda a: a, [x])


def _const(value: Any) -> Any:
    m = meta()
    check_dtype(m.dtype)
    size = shape_of(m)
    dt = m.dtype
    if is_size_expr(value):
        return Pointwise(m.device, dt, size, lambda i: ops.to_dtype(
            ops.index_expr(value, torch.int64), dt), 1)
    if not isinstance(value, (bool, int, float)):
        raise Unsupported("non-constant fill")
    c = dtype_value(value, dt)  # full_like(half_x, 0.1) - 0.1 is 0, as in eager
    return Pointwise(m.device, dt, size, lambda i: ops.constant(c, dt), 1)


@register(aten.full.default)
def full(size: Any, fill_value: Any, **kwargs: Any) -> Any:
    return _const(fill_value)


@register(aten.scalar_tensor.default)
def scalar_tensor(value: Any, **kwargs: Any) -> Any:
    return _const(value)


@register(aten.zeros.default)
def zeros(*args: Any, **kwargs: Any) -> Any:
    return _const(0)


@register(aten.ones.default)
def ones(*args: Any, **kwargs: Any) -> Any:
    return _const(1)


@register(aten.full_like.default)
def full_like(x: Any, fill_value: Any, **kwargs: Any) -> Any:
    return _const(fill_value)


@register(aten.zeros_like.default)
def zeros_like(x: Any, **kwargs: Any) -> Any:
    return _const(0)


@register(aten.ones_like.default)
def ones_like(x: Any, **kwargs: Any) -> Any:
    return _const(1)


@register(aten.fill.Scalar)
def fill(x: Any, value: Any) -> Any:
    return _const(value)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(*args: Any, **kwargs: Any) -> Any:
    m = meta()
    nums = [a for a in args if isinstance(a, (int, float)) or is_size_expr(a)]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    elif len(nums) == 3:
        start, step = nums[0], nums[2]
    else:
        raise Unsupported("arange arguments")
    if not all(isinstance(v, int) or is_size_expr(v) for v in (start, step)):
        raise Unsupported("float arange")  # ATen computes these in double; keep exact
    if not isinstance(step, int):
        raise Unsupported("symbolic arange step")
    dt = m.dtype
    check_dtype(dt)
    n = to_expr(m.shape[0])
    return Pointwise(m.device, dt, [n], lambda i: ops.to_dtype(
        ops.index_expr(start + i[0] * step, torch.int64), dt), 1)


@register(aten.elu.default)
def elu(x: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Any:
    dt = meta().dtype
    if not dt.is_floating_point:
        raise Unsupported("integer elu")

    def fn(a: Any) -> Any:
        neg = ops.mul(ops.constant(alpha * scale, dt),
                      ops.expm1(ops.mul(a, ops.constant(input_scale, dt))))
        return ops.where(ops.gt(a, ops.constant(0, dt)), ops.mul(a, ops.constant(scale, dt)), neg)
    return pointwise(fn, [x])


@register(aten.softplus.default)
def softplus(x: Any, beta: Any = 1, threshold: Any = 20) -> Any:
    dt = meta().dtype
    if not dt.is_floating_point:
        raise Unsupported("integer softplus")

    def fn(a: Any) -> Any:
        bx = ops.mul(a, ops.constant(beta, dt))
        soft = ops.truediv(ops.log1p(ops.exp(bx)), ops.constant(beta, dt))
        return ops.where(ops.gt(bx, ops.constant(threshold, dt)), a, soft)
    return pointwise(fn, [x])


@register(aten.hardsigmoid.default)
def hardsigmoid(x: Any) -> Any:
    dt = meta().dtype
    return pointwise(lambda a: ops.truediv(ops.minimum(ops.maximum(
        ops.add(a, ops.constant(3, dt)), ops.constant(0, dt)), ops.constant(6, dt)),
        ops.constant(6, dt)), [x])


@register(aten.hardswish.default)
def hardswish(x: Any) -> Any:
    dt = meta().dtype
    return pointwise(lambda a: ops.truediv(ops.mul(a, ops.minimum(ops.maximum(
        ops.add(a, ops.constant(3, dt)), ops.constant(0, dt)), ops.constant(6, dt))),
        ops.constant(6, dt)), [x])
