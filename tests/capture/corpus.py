"""The capture corpus: small programs that must capture as one graph, with their inputs.

Every factory returns ``(callable, calls[, state])`` (see ``_harness``). ``R(...)`` marks a call
that must recompile (new shape, dtype, Python value, training flag, grad mode...), ``M(...)`` one
that may, and a plain tuple one that must not. Tensors are tiny; factories are deterministic under
the harness seed (they are built twice: eager reference and compiled candidate).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
import types
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._harness import Call, K, M, Program, R, program, t

PROGRAMS: dict[str, Program] = {}


def prog(fn=None, **opts):  # noqa: ANN001, ANN201
    if fn is None:
        return lambda f: program(PROGRAMS, **opts)(f)
    return program(PROGRAMS)(fn)


def std(*shape: int, dtype: torch.dtype = torch.float32) -> list:
    """Three calls: first, same metadata/new values (no recompile), larger first dim (recompile)."""
    bigger = (shape[0] + 1,) + tuple(shape[1:])
    return [(t(*shape, dtype=dtype),), (t(*shape, dtype=dtype),), R(t(*bigger, dtype=dtype))]


SCALE = 3.0
TABLE = {"relu": torch.relu, "tanh": torch.tanh}


def _helper_global(x):  # noqa: ANN001, ANN202
    return x * SCALE + 1


# ==================================================================================================
# Tensor operators, methods and torch functions
# ==================================================================================================

@prog
def op_add_scalar():
    return (lambda x: x + 1), std(3) + [R(t(3, dtype=torch.float64)), (t(3),)]


@prog
def op_binary_arith():
    def f(x, y):
        return x + y, x - y, x * y, x / (y.abs() + 1)
    return f, [(t(2, 3), t(2, 3)), (t(2, 3), t(2, 3)), R(t(2, 3), t(3)), (t(2, 3), t(2, 3))]


@prog
def op_floordiv_mod_pow():
    def f(x):
        return x // 2, x % 3, x ** 2, -x, abs(x), +x
    return f, std(4)


@prog
def op_reverse_operators():
    def f(x):
        return 2 - x, 3 / (x.abs() + 1), 2 ** x, 1 + x, 5 * x
    return f, std(3)


@prog
def op_matmul_operator():
    def f(a, b):
        return a @ b
    return f, [(t(2, 3), t(3, 4)), (t(2, 3), t(3, 4)), R(t(5, 3), t(3, 2))]


@prog
def op_comparisons_logical():
    def f(x, y):
        m = (x > y) & (x < 2) | ~(x == y)
        return m, x >= 0, x != y, m ^ (y <= 0)
    return f, [(t(4), t(4)), (t(4), t(4)), R(t(2, 2), t(2, 2))]


@prog
def op_unary_math():
    def f(x):
        a = torch.sin(x) + torch.cos(x) * torch.exp(x)
        return a - torch.log1p(x.abs()) + x.tanh().sigmoid()
    return f, std(5)


@prog
def op_reductions():
    def f(x):
        return x.sum(), x.mean(dim=0), x.sum(1, keepdim=True), x.amax(-1), x.argmax(), x.prod(0)
    return f, std(2, 3)


@prog
def op_max_dim_namedtuple():
    def f(x):
        r = x.max(dim=1)
        v, i = torch.min(x, 0)
        return r.values * 2, r.indices, v, i
    return f, std(3, 4)


@prog
def op_std_var_norm():
    def f(x):
        return x.std(), x.var(dim=1, unbiased=False), x.norm(), torch.linalg.vector_norm(x, ord=1)
    return f, std(3, 4)


@prog
def op_views():
    def f(x):
        a = x.view(-1)
        b = x.reshape(x.shape[1], x.shape[0])
        c = x.permute(1, 0).contiguous()
        d = x.transpose(0, 1).flatten()
        e = x.unsqueeze(0).squeeze(0).unsqueeze(-1)
        return a, b, c, d, e
    return f, std(2, 3)


@prog
def op_cat_stack_split():
    def f(x, y):
        c = torch.cat([x, y], dim=0)
        s = torch.stack((x, y), 1)
        p1, p2 = torch.split(c, [1, c.shape[0] - 1])
        q = c.chunk(2, dim=1)
        return c, s, p1, p2, q[0] + 1
    return f, [(t(2, 4), t(2, 4)), (t(2, 4), t(2, 4)), R(t(3, 4), t(3, 4))]


@prog
def op_indexing_basic():
    def f(x):
        return x[0], x[:, 1], x[..., None], x[1:3], x[::2], x[-1, -1], x[None, :, 0]
    return f, std(4, 3)


@prog
def op_indexing_tensor_index():
    def f(x, idx):
        return x[idx], x[:, idx[:2]], x.index_select(0, idx)
    return f, [(t(4, 3), torch.tensor([0, 2, 1])), (t(4, 3), torch.tensor([2, 2, 0])),
               R(t(5, 3), torch.tensor([0, 2, 1]))]


@prog
def op_setitem_local():
    def f(x):
        y = x.clone()
        y[0] = 1.0
        y[:, 1] += 2
        y[y > 1.5] = 0.0
        return y
    return f, std(3, 3)


@prog
def op_inplace_methods_local():
    def f(x):
        y = x.clone()
        y.add_(1).mul_(2)
        y.relu_()
        y.clamp_(max=3.0)
        return y
    return f, std(5)


@prog
def op_inplace_operators_local():
    def f(x, z):
        y = x * 1
        y += 1
        y *= z
        y -= 0.5
        y /= 2
        return y
    return f, [(t(3), t(3)), (t(3), t(3)), R(t(2, 3), t(2, 3))]


@prog
def op_where_clamp_masked_fill():
    def f(x):
        return torch.where(x > 0, x, x * 0.1), x.clamp(-0.5, 0.5), x.masked_fill(x < 0, -1.0)
    return f, std(6)


@prog
def op_creation_from_shape():
    def f(x):
        z = torch.zeros(x.shape)
        o = torch.ones_like(x)
        a = torch.arange(x.shape[0])
        fl = torch.full((2, 3), 1.5)
        e = torch.eye(3)
        return x + z + o, a * 2, fl, e
    return f, std(4)


@prog
def op_creation_dtype_kw():
    def f(x):
        z = torch.zeros(2, 3, dtype=x.dtype)
        r = torch.arange(0, 6, 2, dtype=torch.float32)
        l = torch.linspace(0, 1, steps=5)
        return z + 1, r, l, torch.empty_like(x).fill_(2.0)
    return f, std(3) + [R(t(3, dtype=torch.float64))]


@prog
def op_dtype_conversions():
    def f(x, y):
        return x.to(torch.float64), x.double(), x.int(), x.float(), x.type_as(y), x.to(y), x.long()
    return f, [(t(3), t(3, dtype=torch.float64)), (t(3), t(3, dtype=torch.float64)),
               R(t(3), t(3, dtype=torch.int32))]


@prog
def op_new_tensors():
    def f(x):
        return x.new_zeros(2), x.new_ones((2, 2)), x.new_full((3,), 7.0), x.new_tensor([1.0, 2.0])
    return f, std(3) + [R(t(3, dtype=torch.float64))]


@prog
def op_einsum_bmm_addmm():
    def f(a, b, c):
        return torch.einsum("bij,bjk->bik", a, b), torch.bmm(a, b), torch.addmm(c, a[0], b[0])
    return f, [(t(2, 3, 4), t(2, 4, 5), t(3, 5)), (t(2, 3, 4), t(2, 4, 5), t(3, 5)),
               R(t(1, 3, 4), t(1, 4, 5), t(3, 5))]


@prog
def op_softmax_family():
    def f(x):
        return torch.softmax(x, dim=-1), x.log_softmax(0), torch.logsumexp(x, 1)
    return f, std(2, 5)


@prog
def op_cumulative_flip_roll():
    def f(x):
        return x.cumsum(0), torch.cumprod(x, dim=1), x.flip(0), torch.roll(x, 1, 1)
    return f, std(3, 3)


@prog
def op_sort_topk():
    def f(x):
        s = torch.sort(x, dim=-1, descending=True)
        tk = x.topk(2)
        return s.values, s.indices, tk[0], tk.indices
    return f, std(3, 5)


@prog
def op_gather_scatter():
    def f(x, idx):
        g = x.gather(1, idx)
        s = torch.zeros_like(x).scatter_(1, idx, 1.0)
        a = torch.zeros(x.shape[0], 5).scatter_add(1, idx, g)
        return g, s, a
    idx = torch.tensor([[0, 1], [2, 0], [1, 1]])
    return f, [(t(3, 4), idx), (t(3, 4), idx.flip(1)), R(t(3, 5), idx)]


@prog
def op_expand_repeat():
    def f(x):
        e = x.unsqueeze(0).expand_as(torch.empty(4, x.shape[0]))
        return x.expand(3, -1), x.repeat(2, 1), e, x.tile((2,))
    return f, std(4)


@prog
def op_transpose_props():
    def f(x):
        return x.T + 1, x.mT * 2, x.t().contiguous()
    return f, std(2, 3)


@prog
def op_tensor_metadata_python():
    def f(x):
        n = x.numel() + x.dim() + x.ndim + x.size(1) + len(x.shape)
        fl = x.is_floating_point() and x.is_contiguous()
        return x * n if fl else x - n
    return f, std(2, 3) + [R(t(2, 3).t())]


@prog
def op_tensor_constant():
    def f(x):
        c = torch.tensor([1.0, 2.0, 3.0])
        return x + c, torch.as_tensor([4.0, 5.0, 6.0]) * x
    return f, [(t(3),), (t(3),), R(t(2, 3))]


@prog
def op_iterate_tensor():
    def f(x):
        acc = 0
        for row in x:
            acc = acc + row * 2
        a, b = x.unbind(1)
        return acc, a - b
    return f, [(t(3, 2),), (t(3, 2),), R(t(4, 2))]


@prog
def op_elementwise_minmax():
    def f(x, y):
        return torch.maximum(x, y), torch.max(x, y), torch.minimum(x, y), x.max(), torch.min(y)
    return f, [(t(4), t(4)), (t(4), t(4)), R(t(5), t(5))]


@prog
def op_integer_bitwise():
    def f(a, b):
        return a & b, a | b, a ^ b, ~a, a << 1, b >> 1, a // 3, torch.remainder(a, 3)
    i = torch.int64
    return f, [(t(4, dtype=i), t(4, dtype=i)), (t(4, dtype=i), t(4, dtype=i)),
               R(t(4, dtype=torch.int32), t(4, dtype=torch.int32))]


@prog
def op_bool_tensor_reductions():
    def f(x):
        m = x > 0
        return m.any(), m.all(dim=0), m.sum(), (m.float() * x).sum(1), torch.logical_not(m)
    return f, std(3, 3)


@prog
def op_bfloat16_inputs():
    def f(x, y):
        return (x * y + 1).to(torch.float32), x.float() @ y.float().t()
    b = torch.bfloat16
    return f, [(t(2, 3, dtype=b), t(2, 3, dtype=b)), (t(2, 3, dtype=b), t(2, 3, dtype=b)),
               R(t(2, 3), t(2, 3))]


@prog
def op_broadcast_outer():
    def f(x, y):
        o = torch.outer(x, y)
        return x[:, None] * y[None, :], o, torch.dot(x, x), torch.mv(o, y)
    return f, [(t(3), t(4)), (t(3), t(4)), R(t(2), t(4))]


@prog
def op_unbound_method_and_operator_module():
    def f(x, y):
        a = torch.Tensor.add(x, y)
        b = operator.mul(a, 2)
        c = operator.getitem(b, 0)
        return operator.neg(c), operator.truediv(a, 2)
    return f, [(t(2, 2), t(2, 2)), (t(2, 2), t(2, 2)), R(t(3, 2), t(3, 2))]


@prog
def op_math_scale():
    def f(q, k):
        return (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return f, [(t(2, 3, 4), t(2, 3, 4)), (t(2, 3, 4), t(2, 3, 4)), R(t(2, 3, 8), t(2, 3, 8))]


@prog
def op_view_inplace_local():
    def f(x):
        y = x.clone()
        y[0].mul_(2)
        v = y.view(-1)
        v[-1] = 5.0
        return y, v
    return f, std(2, 3)


@prog
def op_chained_methods():
    def f(x):
        return x.abs().add(1).log().mul(0.5).exp().sub(1).div(2).pow(2).sqrt().neg()
    return f, std(4)


@prog
def op_torch_functional_misc():
    def f(x):
        a = torch.lerp(x, torch.zeros_like(x), 0.25)
        return a, torch.addcmul(x, x, x, value=0.5), torch.clamp_min(x, 0)
    return f, std(4)


@prog
def op_triu_tril_diag():
    def f(x):
        return torch.triu(x), x.tril(-1), torch.diagonal(x), torch.diag(x.diagonal())
    return f, std(3, 3)


@prog
def op_rounding():
    def f(x):
        return torch.round(x * 3), x.floor(), x.ceil(), x.trunc(), x.sign(), x.frac()
    return f, std(5)


@prog
def op_inplace_on_param_free_buffer_like():
    def f(x):
        acc = torch.zeros(x.shape[1])
        for i in range(x.shape[0]):
            acc.add_(x[i])
        return acc
    return f, [(t(3, 2),), (t(3, 2),), R(t(4, 2),)]


@prog
def op_getattr_dtype_device_is():
    def f(x):
        y = x if x.dtype is torch.float32 else x.float()
        return y.to(x.device) + (1 if x.device.type == "cpu" else 2)
    return f, std(3) + [R(t(3, dtype=torch.float16))]


@prog
def op_requires_grad_input():
    def f(x, w):
        return (x @ w).tanh().sum(0)
    return f, [(t(2, 3), t(3, 2, rg=True)), (t(2, 3), t(3, 2, rg=True)), R(t(2, 3), t(3, 2))]


# ==================================================================================================
# torch.nn.functional
# ==================================================================================================

@prog
def fn_activations():
    def f(x):
        return (F.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x),
                F.leaky_relu(x, negative_slope=0.1), F.elu(x), F.softplus(x), F.hardtanh(x),
                F.relu6(x), F.mish(x))
    return f, std(6)


@prog
def fn_linear():
    def f(x, w, b):
        return F.linear(x, w, b), F.linear(x, w)
    return f, [(t(2, 3), t(4, 3), t(4)), (t(2, 3), t(4, 3), t(4)), R(t(5, 3), t(4, 3), t(4))]


@prog
def fn_conv2d():
    def f(x, w):
        return F.conv2d(x, w, stride=2, padding=1), F.conv2d(x, w, padding="same")
    return f, [(t(1, 2, 6, 6), t(3, 2, 3, 3)), (t(1, 2, 6, 6), t(3, 2, 3, 3)),
               R(t(2, 2, 5, 5), t(3, 2, 3, 3))]


@prog
def fn_pooling():
    def f(x):
        a = F.avg_pool2d(x, kernel_size=2, stride=1)
        return F.max_pool2d(x, 2), a, F.adaptive_avg_pool2d(x, 1)
    return f, std(1, 2, 4, 4)


@prog
def fn_norms():
    def f(x, w, b, rm, rv):
        return (F.layer_norm(x, (x.shape[-1],), w, b), F.group_norm(x.unsqueeze(-1), 2),
                F.batch_norm(x, rm, rv, w, b, training=False), F.normalize(x, dim=-1))
    return f, [(t(3, 4), t(4), t(4), t(4), t(4).abs()), (t(3, 4), t(4), t(4), t(4), t(4).abs()),
               R(t(5, 4), t(4), t(4), t(4), t(4).abs())]


@prog
def fn_losses():
    def f(logits, target, y):
        return (F.cross_entropy(logits, target), F.mse_loss(logits, y),
                F.nll_loss(F.log_softmax(logits, -1), target, reduction="sum"),
                F.l1_loss(logits, y, reduction="none"))
    return f, [(t(3, 4), torch.tensor([0, 3, 1]), t(3, 4)),
               (t(3, 4), torch.tensor([2, 2, 1]), t(3, 4)),
               R(t(2, 4), torch.tensor([0, 3]), t(2, 4))]


@prog
def fn_dropout_eval_pad_embedding():
    def f(x, idx, emb):
        a = F.dropout(x, p=0.5, training=False)
        b = F.pad(x, (1, 2))
        c = F.embedding(idx, emb)
        return a, b, c
    return f, [(t(2, 3), torch.tensor([[0, 2], [1, 1]]), t(4, 3)),
               (t(2, 3), torch.tensor([[3, 2], [1, 0]]), t(4, 3)),
               R(t(2, 3), torch.tensor([[0, 2, 1]]), t(4, 3))]


@prog
def fn_sdpa():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return f, [(t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),
               (t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),
               R(t(1, 2, 3, 8), t(1, 2, 3, 8), t(1, 2, 3, 8))]


@prog
def fn_one_hot_interpolate_cos():
    def f(idx, x):
        oh = F.one_hot(idx, num_classes=4)
        up = F.interpolate(x, scale_factor=2, mode="nearest")
        cs = F.cosine_similarity(x.flatten(1), x.flatten(1).flip(1), dim=1)
        return oh, up, cs
    return f, [(torch.tensor([0, 3, 1]), t(1, 2, 3, 3)), (torch.tensor([2, 2, 1]), t(1, 2, 3, 3)),
               R(torch.tensor([0, 3]), t(1, 2, 3, 3))]


@prog
def fn_softmax_dim_kw_dtype():
    def f(x):
        return F.softmax(x, dim=-1, dtype=torch.float64), F.log_softmax(x, 1), F.glu(x, dim=-1)
    return f, std(2, 4)


@prog
def fn_unfold_pixel_shuffle():
    def f(x):
        return F.unfold(x, kernel_size=2), F.pixel_shuffle(x, 2)
    return f, std(1, 4, 2, 2)


# ==================================================================================================
# Python numbers, bools, strings, None
# ==================================================================================================

@prog
def py_int_arg():
    def f(x, n):
        return x * n + n // 2
    return f, [(t(3), 2), (t(3), 2), R(t(3), 3), (t(3), 2)]


@prog
def py_float_arg():
    def f(x, a):
        return x * a - a
    return f, [(t(3), 0.5), (t(3), 0.5), M(t(3), 1.5)]


@prog
def py_bool_flag():
    def f(x, flag):
        if flag:
            return x + 1
        return x - 1
    return f, [(t(3), True), (t(3), True), R(t(3), False), (t(3), True)]


@prog
def py_string_mode():
    def f(x, mode):
        if mode == "relu":
            return torch.relu(x)
        elif mode.startswith("tan"):
            return torch.tanh(x)
        return x
    return f, [(t(4), "relu"), (t(4), "relu"), R(t(4), "tanh"), R(t(4), "id")]


@prog
def py_none_default():
    def f(x, bias=None):
        y = x * 2
        if bias is not None:
            y = y + bias
        return y
    return f, [(t(3),), (t(3), None), R(t(3), t(3)), (t(3),)]


@prog
def py_int_arithmetic():
    def f(x, n):
        a = (n * 3 + 1) // 2 % 5
        b = n ** 2 - divmod(n, 3)[1]
        c = -n if n > 2 else abs(n - 10)
        return x * a + b - c
    return f, [(t(2), 4), (t(2), 4), R(t(2), 7)]


@prog
def py_float_conversions():
    def f(x, v):
        return x * round(v, 1) + int(v) + float(int(v * 10)) / 10 + math.floor(v)
    return f, [(t(2), 2.345), (t(2), 2.345), M(t(2), 3.7)]


@prog
def py_string_ops():
    def f(x, name):
        key = f"{name}_{x.dim()}d".upper()
        table = {"A_1D": 1.0, "B_1D": 2.0, "A_2D": 3.0}
        return x * table[key] + len(name + "xyz")
    return f, [(t(3), "a"), (t(3), "a"), R(t(3), "b"), R(t(2, 2), "a")]


@prog
def py_chained_comparison():
    def f(x, n):
        if 0 < n < 5 and not (n == 3):
            return x + n
        return x - n
    return f, [(t(2), 1), (t(2), 1), R(t(2), 3), R(t(2), 7)]


@prog
def py_bool_ops_values():
    def f(x, a, b):
        c = a or b
        d = a and b
        return x * (c if c else 0.5) + (1 if d is None else 0)
    return f, [(t(2), 0, 2), (t(2), 0, 2), R(t(2), 3, None)]


@prog
def py_return_mixed_constants():
    def f(x):
        return x + 1, 3, "label", None, True, 2.5
    return f, std(2)


@prog
def py_ternary():
    def f(x, k):
        return x * 2 if k > 0 else x / 2
    return f, [(t(3), 1), (t(3), 1), R(t(3), -1)]


@prog
def py_while_counter():
    def f(x):
        i = 0
        while i < 3:
            x = x * 2 + i
            i += 1
        return x
    return f, std(3)


@prog
def py_for_break_continue_else():
    def f(x):
        for i in range(10):
            if i % 2 == 0:
                continue
            x = x + i
            if i > 5:
                break
        else:
            x = x * 100
        return x
    return f, std(3)


@prog
def py_shape_arithmetic():
    def f(x):
        n = x.shape[0] * 2
        return torch.zeros(n, x.shape[1] - 1) + x[:1, :1], n
    return f, std(2, 3)


@prog
def py_math_module():
    def f(x):
        c = math.log(4.0) - math.exp(0.5) + math.cos(0.0) + math.sqrt(2) * math.e
        return x * math.pi + c, math.isfinite(c), math.inf > c
    return f, std(3)


@prog
def py_global_constant_and_function():
    def f(x):
        return _helper_global(x) + SCALE, TABLE["tanh"](x)
    return f, std(3)


@prog
def py_try_finally_no_exception():
    def f(x):
        try:
            y = x + 1
        finally:
            y = y * 2
        return y
    return f, std(3)


@prog(full=False)
def py_try_except_caught():
    def f(x, d):
        try:
            v = d["missing"]
        except KeyError:
            v = 2.0
        return x * v
    return f, [(t(3), {"a": 1}), (t(3), {"a": 1})]


@prog
def py_assert_true():
    def f(x):
        assert x.dim() == 2, "expects 2d"
        assert isinstance(x, torch.Tensor)
        return x.sum(-1)
    return f, std(2, 2)


@prog
def py_augassign_python():
    def f(x, n):
        s = 0
        s += n
        s *= 3
        s -= 1
        s //= 2
        s **= 2
        return x + s
    return f, [(t(2), 3), (t(2), 3), R(t(2), 4)]


@prog
def py_int_vs_bool_isinstance():
    def f(x, v):
        if isinstance(v, bool):
            return x + 100
        if isinstance(v, int):
            return x + v
        return x * v
    return f, [(t(2), True), (t(2), True), R(t(2), 3), R(t(2), 0.5)]


# ==================================================================================================
# Containers: tuples, lists, dicts, sets; slices and ranges
# ==================================================================================================

@prog
def ct_tuple_arg_unpack():
    def f(pair):
        a, b = pair
        return a * b, (a, b)[1] - a
    return f, [((t(3), t(3)),), ((t(3), t(3)),), R((t(4), t(4)),)]


@prog
def ct_list_arg_loop():
    def f(xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = acc + x
        return acc
    return f, [([t(2), t(2), t(2)],), ([t(2), t(2), t(2)],), R([t(2), t(2)],)]


@prog
def ct_dict_arg():
    def f(d):
        return d["a"] * d["b"] + d.get("c", 1.0)
    return f, [({"a": t(3), "b": t(3)},), ({"a": t(3), "b": t(3)},),
               R({"a": t(3), "b": t(3), "c": t(3)},)]


@prog
def ct_return_nested():
    def f(x):
        return {"y": x + 1, "parts": [x * 2, (x - 1, None)], "n": 3}
    return f, std(2)


@prog
def ct_local_list_mutation():
    def f(x):
        out = []
        out.append(x)
        out.extend([x * 2, x * 3])
        out.insert(0, x - 1)
        last = out.pop()
        out.reverse()
        out[1] = out[1] + last
        del out[0]
        return torch.stack(out), len(out)
    return f, std(3)


@prog
def ct_list_comprehension():
    def f(x):
        ys = [x * i for i in range(4) if i != 2]
        return torch.cat(ys)
    return f, std(2)


@prog
def ct_dict_methods():
    def f(x):
        d = {"a": x, "b": x * 2}
        d["c"] = x + 1
        d.update({"d": x - 1})
        d.setdefault("a", x * 100)
        p = d.pop("b")
        tot = sum(v.sum() for v in d.values())
        ks = list(d.keys())
        return tot + p, ks, "c" in d, [k for k, v in d.items()]
    return f, std(3)


@prog
def ct_dict_comprehension():
    def f(x):
        d = {f"k{i}": x * i for i in range(3)}
        inv = {v: k for k, v in {"a": 1, "b": 2}.items()}
        return d["k2"] - d["k1"], inv[2]
    return f, std(2)


@prog
def ct_set_ops():
    def f(x, n):
        s = {1, 2, n}
        s.add(5)
        s2 = s | {7}
        common = s & {2, 5, 9}
        return x * len(s2) + (1 if n in s else 0) + len(common) + sum(sorted(s))
    return f, [(t(2), 3), (t(2), 3), R(t(2), 2)]


@prog
def ct_list_slicing():
    def f(xs):
        a = xs[1:]
        b = xs[::-1]
        c = xs[:-1]
        return torch.stack(a).sum(0), b[0], len(c)
    return f, [([t(2), t(2), t(2), t(2)],), ([t(2), t(2), t(2), t(2)],), R([t(2), t(2), t(2)],)]


@prog
def ct_tuple_ops_star_unpack():
    def f(x):
        tup = (x, x + 1) + (x + 2,)
        rep = (1, 2) * 2
        first, *rest = tup
        *init, last = rep
        return first + sum(rest), sum(init) + last
    return f, std(3)


@prog
def ct_nested_list_of_tensors():
    def f(grid):
        return [[c * 2 for c in row] for row in grid], grid[1][0] + grid[0][1]
    return f, [([[t(2), t(2)], [t(2), t(2)]],), ([[t(2), t(2)], [t(2), t(2)]],)]


@prog
def ct_list_index_count_contains():
    def f(x, ks):
        i = ks.index(3)
        c = ks.count(2)
        return x * i + c + (10 if 4 in ks else 0)
    return f, [(t(2), [1, 2, 3, 2]), (t(2), [1, 2, 3, 2]), R(t(2), [3, 4])]


@prog
def ct_sort_sorted_reversed():
    def f(x, ks):
        ks2 = list(ks)
        ks2.sort()
        r = list(reversed(ks2))
        s = sorted(ks, key=lambda v: -v)
        return x * ks2[0] + r[0] + s[-1]
    return f, [(t(2), [3, 1, 2]), (t(2), [3, 1, 2]), R(t(2), [5, 4, 6])]


@prog
def ct_zip_enumerate():
    def f(xs, ws):
        out = 0
        for i, (x, w) in enumerate(zip(xs, ws), start=1):
            out = out + x * w * i
        return out
    return f, [([t(2), t(2)], [0.5, 2.0]), ([t(2), t(2)], [0.5, 2.0])]


@prog
def ct_del_and_ordered_dict():
    def f(od):
        d = collections.OrderedDict(od)
        del d["a"]
        d.move_to_end("b")
        return [v * 2 for v in d.values()], list(d)
    return f, [(collections.OrderedDict(a=t(2), b=t(2), c=t(2)),),
               (collections.OrderedDict(a=t(2), b=t(2), c=t(2)),)]


@prog
def ct_defaultdict_local():
    def f(x):
        d = collections.defaultdict(list)
        for i in range(3):
            d[i % 2].append(x * i)
        return torch.stack(d[0]).sum(0), len(d[1])
    return f, std(2)


@prog
def ct_list_as_shape():
    def f(x, shape):
        return x.view(shape), x.reshape(*shape[::-1])
    return f, [(t(6), [2, 3]), (t(6), [2, 3]), R(t(6), [3, 2])]


@prog
def ct_tuple_with_none():
    def f(pair):
        a, b = pair
        return a * 2 if b is None else a + b
    return f, [((t(2), None),), ((t(2), None),), R((t(2), t(2)),)]


@prog
def ct_slice_objects():
    def f(x, s):
        s2 = slice(1, None)
        return x[s], x[s2], s.start + (s.stop or 0)
    return f, [(t(5), slice(0, 3)), (t(5), slice(0, 3)), R(t(5), slice(1, 4))]


@prog
def ct_range_objects():
    def f(x):
        r = range(0, 8, 2)
        rr = reversed(range(3))
        return x * len(r) + r[1] + r[-1] + sum(list(rr)) + (4 in r)
    return f, std(2)


@prog
def ct_range_arg():
    def f(x, r):
        acc = x
        for i in r:
            acc = acc + i
        return acc
    return f, [(t(2), range(3)), (t(2), range(3)), R(t(2), range(1, 5))]


@prog
def ct_list_of_pairs_return():
    def f(x):
        pairs = [(i, x * i) for i in range(3)]
        return dict(pairs), list(zip(*pairs))[0]
    return f, std(2)


@prog
def ct_list_multiplication_and_concat():
    def f(x):
        xs = [x] * 3 + [x + 1]
        return torch.stack(xs), len(xs)
    return f, std(2)


@prog
def ct_dict_iteration_order():
    def f(d):
        out = []
        for k in d:
            out.append(d[k] * len(k))
        return out
    return f, [({"bb": t(2), "a": t(2)},), ({"bb": t(2), "a": t(2)},), R({"a": t(2), "bb": t(2)},)]


@prog
def ct_tuple_compare_and_hash():
    def f(x, key):
        table = {(1, 2): 10.0, (3, 4): 20.0}
        return x * table[key] + (key < (2, 0))
    return f, [(t(2), (1, 2)), (t(2), (1, 2)), R(t(2), (3, 4))]


@prog
def ct_list_len_guard():
    def f(xs):
        if len(xs) > 2:
            return xs[0] + xs[2]
        return xs[0] - xs[1]
    return f, [([t(2), t(2), t(2)],), ([t(2), t(2), t(2)],), R([t(2), t(2)],)]


# ==================================================================================================
# torch.Size, dtypes, devices
# ==================================================================================================

@prog
def sz_size_ops():
    def f(x):
        s = x.shape
        return torch.zeros(s) + x, s[-1], len(s), s == (2, 3), tuple(s), s.numel(), list(s)
    return f, std(2, 3)


@prog
def sz_size_unpack_concat():
    def f(x):
        b, c = x.size()
        new = x.shape[:-1] + (c * 2,)
        return x.repeat(1, 2).view(new), b, torch.Size([b, c])
    return f, std(2, 3)


@prog
def sz_dtype_arg():
    def f(x, dtype):
        return x.to(dtype) * 2
    return f, [(t(3), torch.float64), (t(3), torch.float64), R(t(3), torch.float16),
               R(t(3), torch.int32)]


@prog
def sz_dtype_checks():
    def f(x):
        a = x.dtype == torch.float32
        b = x.dtype.is_floating_point
        c = torch.is_floating_point(x)
        d = x.dtype in (torch.float16, torch.bfloat16)
        return x.float() + (a + b + c + d), x.dtype
    return f, std(2) + [R(t(2, dtype=torch.bfloat16)), R(t(2, dtype=torch.int64))]


@prog
def sz_device_ops():
    def f(x):
        d = x.device
        z = torch.zeros(2, device=d)
        cpu = torch.device("cpu")
        return z + x[:2], d.type == "cpu", d == cpu, str(d)
    return f, std(3)


@prog
def sz_finfo_default_dtype():
    def f(x):
        eps = torch.finfo(x.dtype).eps
        dt = torch.get_default_dtype()
        big = torch.iinfo(torch.int32).max
        return (x + eps).to(dt), x.clamp(max=big)
    return f, std(3) + [R(t(3, dtype=torch.float64))]


@prog
def sz_promote_types():
    def f(x, y):
        dt = torch.promote_types(x.dtype, y.dtype)
        return x.to(dt) + y.to(dt), torch.result_type(x, y)
    return f, [(t(2), t(2, dtype=torch.float64)), (t(2), t(2, dtype=torch.float64)),
               R(t(2), t(2, dtype=torch.int32))]


@prog
def sz_size_arg():
    def f(x, s):
        return x.reshape(s) * s[0]
    return f, [(t(6), torch.Size([2, 3])), (t(6), torch.Size([2, 3])), R(t(6), torch.Size([3, 2]))]


@prog
def sz_device_arg():
    def f(x, dev):
        return x.to(dev) + torch.ones(1, device=dev)
    return f, [(t(2), torch.device("cpu")), (t(2), torch.device("cpu")), M(t(2), "cpu")]


# ==================================================================================================
# nn.Module: attributes, containers, training flag, parameters and buffers
# ==================================================================================================

def _mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@prog(backward=True)
def mod_linear():
    m = nn.Linear(3, 2)
    return m, std(2, 3)[:2] + [R(t(5, 3)), (t(2, 3),)]


@prog(backward=True)
def mod_sequential_mlp():
    m = _mlp()
    return m, [(t(2, 4),), (t(2, 4),), R(t(3, 4),), R(t(2, 4, rg=True),)]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


@prog
def mod_convnet_eval():
    m = ConvNet().eval()
    return m, [(t(2, 1, 4, 4),), (t(2, 1, 4, 4),), R(t(3, 1, 4, 4),)]


@prog
def mod_batchnorm_train_buffers():
    m = nn.BatchNorm1d(3)
    return m, [(t(4, 3),), (t(4, 3),), R(t(4, 3), _before=m.eval), K(t(4, 3), _before=m.train)]


class TrainingFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


@prog
def mod_training_flag():
    m = TrainingFlag()
    return m, [(t(1, 2),), (t(1, 2),), R(t(1, 2), _before=m.eval), (t(1, 2),),
               K(t(1, 2), _before=m.train)]


class SubmoduleTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = TrainingFlag()
        self.b = TrainingFlag()

    def forward(self, x):
        return self.a(x) + self.b(x)


@prog
def mod_submodule_training_flag():
    m = SubmoduleTraining()
    return m, [(t(1, 2),), (t(1, 2),), R(t(1, 2), _before=m.b.eval), R(t(1, 2), _before=m.eval)]


class ListNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return x


@prog(backward=True)
def mod_modulelist_enumerate():
    return ListNet(), std(2, 3)


class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 2)})

    def forward(self, x, which="a"):
        outs = {k: h(x) for k, h in self.heads.items()}
        return outs, self.heads[which](x), list(self.heads.keys())


@prog
def mod_moduledict():
    m = DictNet()
    return m, [(t(1, 3),), (t(1, 3), "a"), R(t(1, 3), "b")]


class SeqIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2), nn.Sigmoid())

    def forward(self, x):
        y = self.seq[0](x)
        z = self.seq[1:](y)
        return z, len(self.seq), self.seq[-1](x)


@prog
def mod_sequential_index_slice():
    return SeqIndex(), std(1, 2)


class ParamLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 1, bias=False)

    def forward(self, x):
        reg = 0
        for name, p in self.named_parameters():
            if "weight" in name:
                reg = reg + p.pow(2).sum()
        n = sum(p.numel() for p in self.parameters())
        return self.b(self.a(x)) + reg, n
    pass


@prog(backward=True)
def mod_named_parameters_loop():
    return ParamLoop(), std(3, 2)


class BufferNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.5, -0.5]))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.steps += 1
        return (x - self.mean) * self.steps, [n for n, _ in self.named_buffers()]


@prog
def mod_buffer_mutation():
    return BufferNet(), [(t(2),), (t(2),), (t(2),), R(t(3, 2),)]


class RunningMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("avg", torch.zeros(3))

    def forward(self, x):
        with torch.no_grad():
            self.avg.mul_(0.9).add_(x.mean(0) * 0.1)
        return x - self.avg


@prog
def mod_running_average_buffer():
    return RunningMean(), [(t(2, 3),), (t(2, 3),), R(t(4, 3),)]


class PyAttrs(nn.Module):
    def __init__(self, scale=2.0, act="gelu", use_bias=True):
        super().__init__()
        self.scale = scale
        self.act = act
        self.use_bias = use_bias
        self.dims = [3, 3]
        self.lin = nn.Linear(*self.dims, bias=use_bias)

    def forward(self, x):
        y = self.lin(x) * self.scale
        y = F.gelu(y) if self.act == "gelu" else F.relu(y)
        if self.use_bias and self.lin.bias is not None:
            y = y + self.lin.bias
        return y


@prog
def mod_python_attributes():
    m = PyAttrs()

    def change():
        m.act = "relu"
    return m, [(t(1, 3),), (t(1, 3),), R(t(1, 3), _before=change)]


@prog
def mod_python_attributes_no_bias():
    m = PyAttrs(scale=0.5, act="relu", use_bias=False)
    return m, std(2, 3)


class Helper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def _block(self, x, k=1):
        return self.lin(x) * k

    def forward(self, x):
        return self._block(x) + self._block(x, k=3)


@prog
def mod_helper_method():
    return Helper(), std(2, 3)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x).relu()


class Middle(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.other = Inner()

    def forward(self, x):
        return self.inner(x) + self.other(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mid = Middle()
        self.head = nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.mid(x) + self.mid.inner.lin.weight.sum())


@prog(backward=True)
def mod_nested_three_levels():
    return Outer(), std(2, 2)


class KwForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, *, scale=1.0, mask=None, extra=()):
        y = self.lin(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        for e in extra:
            y = y + e
        return y


@prog
def mod_forward_kwargs_defaults():
    m = KwForward()
    return m, [K(t(1, 2)), K(t(1, 2), scale=1.0), R(t(1, 2), mask=torch.tensor([[True, False]])),
               R(t(1, 2), extra=(1.0, 2.0)), K(t(1, 2))]


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2 + super(Child, self).forward(x)


@prog
def mod_super_forward():
    return Child(), std(1, 2)


class WithProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self._temp = 0.5

    @property
    def temperature(self):
        return self._temp * 2

    def forward(self, x):
        return self.lin(x) / self.temperature
    pass


@prog
def mod_property():
    return WithProperty(), std(1, 2)


class DirectParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 2))
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + self.weight.shape[0]


@prog(backward=True)
def mod_direct_parameter():
    return DirectParam(), std(2, 2)


class EmbedNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.ln = nn.LayerNorm(4)
        self.pos = nn.Parameter(torch.randn(8, 4) * 0.1)

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        return self.ln(x)


@prog(backward=True)
def mod_embedding_layernorm():
    return EmbedNorm(), [(torch.tensor([[1, 2, 3]]),), (torch.tensor([[4, 5, 6]]),),
                         R(torch.tensor([[1, 2, 3, 4]]),)]


@prog
def mod_multihead_attention():
    m = nn.MultiheadAttention(4, 2, batch_first=True).eval()

    def f(x):
        out, w = m(x, x, x, need_weights=True)
        return out, w
    return f, [(t(1, 3, 4),), (t(1, 3, 4),), R(t(1, 2, 4),)]


class IsinstanceModule(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        y = self.lin(x)
        if isinstance(self.act, nn.ReLU):
            return self.act(y) + 1
        if isinstance(self.lin, (nn.Conv2d, nn.Linear)):
            return self.act(y) - 1
        return y


@prog
def mod_isinstance_submodule():
    return IsinstanceModule(nn.Tanh()), std(1, 2)


class GetattrLayers(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(3):
            setattr(self, f"layer{i}", nn.Linear(2, 2))

    def forward(self, x):
        for i in range(3):
            x = getattr(self, f"layer{i}")(x)
        if hasattr(self, "layer3"):
            x = x * 100
        return x, hasattr(self, "layer0")


@prog
def mod_getattr_hasattr_layers():
    return GetattrLayers(), std(1, 2)


class IdentityFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.id = nn.Identity()
        self.flat = nn.Flatten()
        self.unflat = nn.Unflatten(1, (2, 3))

    def forward(self, x):
        return self.unflat(self.flat(self.id(x)))


@prog
def mod_identity_flatten_unflatten():
    return IdentityFlatten(), std(2, 2, 3)[:2] + [R(t(3, 2, 3),)]


class TensorAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.const = torch.arange(3.0)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) + self.const


@prog
def mod_plain_tensor_attribute():
    return TensorAttr(), std(1, 3)


class AttrCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.history = []
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        self.calls += 1
        self.history.append(x.shape[0])
        self.last = "seen"
        return self.lin(x)


@prog
def mod_python_attr_side_effects():
    m = AttrCounter()
    return m, [(t(1, 2),), M(t(1, 2),), M(t(3, 2),)], lambda: (m.calls, list(m.history), m.last)


class ParamShapeControl(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        if self.w.shape[0] > 2:
            return x @ self.w
        return x @ self.w.t() + 1
    pass


@prog
def mod_parameter_shape_control():
    return ParamShapeControl(3), std(2, 3)


@prog(backward=True)
def mod_parameter_as_input():
    p = nn.Parameter(torch.randn(3))

    def f(x, w):
        return (x * w).sum()
    return f, [(t(3), p), (t(3), p), R(t(4), nn.Parameter(torch.randn(4)))]


class HookModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.lin.register_forward_hook(lambda mod, inp, out: out * 2)

    def forward(self, x):
        return self.lin(x) + 1


@prog(full=False)
def mod_forward_hook():
    return HookModule(), std(1, 2)


class PreHookModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.lin.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))

    def forward(self, x):
        return self.lin(x)


@prog(full=False)
def mod_forward_pre_hook():
    return PreHookModule(), std(1, 2)


class ReturnsDataclassOutput(nn.Module):
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        hidden: torch.Tensor
        aux: object = None

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x):
        h = self.lin(x)
        return self.Out(logits=h.softmax(-1), hidden=h)


@prog
def mod_returns_dataclass():
    return ReturnsDataclassOutput(), std(1, 2)


@prog
def mod_train_mode_dropout_p0():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(p=0.0), nn.GELU())
    return m, [(t(1, 2),), (t(1, 2),), R(t(1, 2), _before=m.eval)]


@prog
def mod_layernorm_groupnorm_modules():
    m = nn.Sequential(nn.Conv1d(2, 4, 1), nn.GroupNorm(2, 4), nn.SiLU())
    ln = nn.LayerNorm([4, 3])

    def f(x):
        return ln(m(x)), m[1].num_groups
    return f, std(2, 2, 3)


class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


@prog(backward=True)
def mod_tied_weights():
    return TiedWeights(), [(torch.tensor([[0, 4]]),), (torch.tensor([[1, 2]]),),
                           R(torch.tensor([[1, 2, 3]]),)]


@prog
def mod_modules_children_iteration():
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))

    def f(x):
        for c in m.children():
            x = c(x)
        nlin = sum(1 for mod in m.modules() if isinstance(mod, nn.Linear))
        return x, nlin, [n for n, _ in m.named_children()]
    return f, std(1, 2)


class BlockTransformer(nn.Module):
    def __init__(self, d=8, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


@prog(backward=True)
def mod_transformer_block():
    return BlockTransformer(), [(t(1, 3, 8),), (t(1, 3, 8),), R(t(2, 4, 8),)]


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 2)

    def forward(self, xs):
        h = torch.zeros(xs.shape[1], 2)
        outs = []
        for step in range(xs.shape[0]):
            h = torch.tanh(self.cell(torch.cat([xs[step], h], dim=-1)))
            outs.append(h)
        return torch.stack(outs), h


@prog
def mod_unrolled_rnn():
    return Recurrent(), [(t(3, 1, 2),), (t(3, 1, 2),), R(t(4, 1, 2),)]


@prog
def mod_compile_method_via_function():
    m = nn.Linear(2, 2)

    def f(x):
        return m.forward(x) + m(x), m.in_features, m.weight.dtype
    return f, std(1, 2)


@prog
def mod_module_train_toggle_inside_not():
    m = nn.BatchNorm1d(2)
    m.eval()

    def f(x):
        return m(x) if not m.training else m(x) * 0
    return f, [(t(3, 2),), (t(3, 2),), R(t(3, 2), _before=m.train)]


class ModuleCallsFunctionalOnParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3)

    def forward(self, x):
        w = self.conv.weight * 0.5
        return F.conv2d(x, w, self.conv.bias, padding=self.conv.padding)


@prog
def mod_functional_on_submodule_params():
    return ModuleCallsFunctionalOnParams(), std(1, 2, 4, 4)


# ==================================================================================================
# Builtins
# ==================================================================================================

@prog
def bi_len_variants():
    def f(x, xs, d, s):
        return x * (len(xs) + len(d) + len(s) + len(x) + len((1, 2)))
    return f, [(t(3), [1, 2], {"a": 1}, "abc"), (t(3), [1, 2], {"a": 1}, "abc"),
               R(t(3), [1], {"a": 1}, "abc")]


@prog
def bi_isinstance_variants():
    def f(x, v):
        out = x
        if isinstance(x, torch.Tensor):
            out = out + 1
        if isinstance(v, (int, float)):
            out = out * v
        if isinstance(v, (list, tuple)):
            out = out + len(v)
        if isinstance(x, nn.Parameter):
            out = out * 0
        return out
    return f, [(t(2), 3), (t(2), 3), R(t(2), [1, 2]), R(t(2), 2.0)]


@prog
def bi_getattr_hasattr_obj():
    def f(x, obj):
        s = getattr(obj, "scale", 1.0)
        off = getattr(obj, "offset", 0.0)
        if hasattr(obj, "power"):
            x = x ** obj.power
        return x * s + off
    return f, [(t(2), types.SimpleNamespace(scale=2.0)), M(t(2), types.SimpleNamespace(scale=2.0)),
               R(t(2), types.SimpleNamespace(scale=2.0, power=2))]


@prog
def bi_range_variants():
    def f(x):
        out = x
        for i in range(5, 0, -2):
            out = out + i
        for j in range(len(x)):
            out = out + x[j]
        return out, list(range(3))
    return f, std(3)


@prog
def bi_min_max_abs_sum_numbers():
    def f(x, a, b):
        c = sum([a, b]) + max([1, 5, 2]) + min((4, 2))
        return x * min(a, b) + max(a, b, 3) - abs(a - b) + c
    return f, [(t(2), 1, 2), (t(2), 1, 2), R(t(2), 4, 2)]


@prog
def bi_all_any():
    def f(x, flags):
        if all(flags):
            x = x + 1
        if any(f > 1 for f in flags):
            x = x * 2
        return x, all([]), any([])
    return f, [(t(2), [1, 2]), (t(2), [1, 2]), R(t(2), [0, 1])]


@prog
def bi_map_filter():
    def f(xs):
        doubled = list(map(lambda v: v * 2, xs))
        pos = list(filter(lambda i: i % 2 == 0, range(len(xs))))
        return torch.stack(doubled)[pos]
    return f, [([t(2), t(2), t(2)],), ([t(2), t(2), t(2)],)]


@prog
def bi_conversions():
    def f(x, v):
        return x * float(v) + int("3") + bool(v) + len(str(v)) + int(True)
    return f, [(t(2), 2), (t(2), 2), R(t(2), 12)]


@prog
def bi_round_divmod_pow():
    def f(x, n):
        q, r = divmod(n, 4)
        return x * pow(2, q) + round(n / 3) + r
    return f, [(t(2), 9), (t(2), 9), R(t(2), 14)]


@prog
def bi_type_checks():
    def f(x, v):
        if type(v) is int:
            return x + v
        if type(v).__name__ == "float":
            return x * v
        return x
    return f, [(t(2), 2), (t(2), 2), R(t(2), 0.5)]


@prog
def bi_callable_iter_next():
    def f(x, fns):
        it = iter(fns)
        first = next(it)
        out = first(x) if callable(first) else x
        for g in it:
            out = g(out)
        return out
    return f, [(t(3), [torch.relu, torch.tanh]), (t(3), [torch.relu, torch.tanh]),
               R(t(3), [torch.sigmoid, torch.tanh])]


@prog
def bi_sum_of_tensors():
    def f(xs):
        return sum(xs), sum(xs, torch.ones(2)), sum(x.sum() for x in xs)
    return f, [([t(2), t(2)],), ([t(2), t(2)],), R([t(2), t(2), t(2)],)]


@prog
def bi_enumerate_zip_three():
    def f(a, b, c):
        out = []
        for i, (x, y, z) in enumerate(zip(a, b, c)):
            out.append(x * y + z + i)
        return out
    return f, [([t(2)] * 2, [t(2)] * 2, [1.0, 2.0]), ([t(2)] * 2, [t(2)] * 2, [1.0, 2.0])]


@prog
def bi_max_min_of_tensor_list_len():
    def f(xs):
        longest = max(xs, key=len)
        shortest = min(len(x) for x in xs)
        return longest * 2, shortest
    return f, [([t(2), t(4), t(3)],), ([t(2), t(4), t(3)],)]


@prog
def bi_setattr_local_object():
    def f(x):
        ns = types.SimpleNamespace()
        setattr(ns, "y", x * 2)
        ns.z = ns.y + 1
        return ns.z, vars(ns)["y"]
    return f, std(2)


# ==================================================================================================
# dataclasses, namedtuples, plain objects
# ==================================================================================================

@dataclasses.dataclass
class Config:
    scale: float = 2.0
    act: str = "relu"
    layers: int = 2


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    eps: float = 1e-5
    mode: str = "mean"


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


PairNT = collections.namedtuple("PairNT", ["a", "b"])


class Scaler:
    def __init__(self, s):
        self.s = s

    def apply(self, x):
        return x * self.s

    def __call__(self, x):
        return self.apply(x) + 1

    @staticmethod
    def twice(x):
        return x * 2

    @classmethod
    def build(cls, s):
        return cls(s)


@prog
def obj_dataclass_config_arg():
    def f(x, cfg):
        for _ in range(cfg.layers):
            x = x * cfg.scale
        return torch.relu(x) if cfg.act == "relu" else torch.tanh(x)
    return f, [(t(3), Config()), M(t(3), Config()), R(t(3), Config(act="tanh")),
               R(t(3), Config(layers=3))]


@prog
def obj_frozen_dataclass():
    def f(x, cfg):
        m = x.mean() if cfg.mode == "mean" else x.sum()
        return (x - m) / (x.std() + cfg.eps)
    c = FrozenConfig()
    return f, [(t(4), c), (t(4), c), R(t(4), FrozenConfig(mode="sum"))]


@prog
def obj_dataclass_constructed_returned():
    def f(x):
        cfg = Config(scale=x.shape[0] * 1.0, act="gelu")
        out = dataclasses.replace(cfg, layers=5)
        return x * cfg.scale, out
    return f, std(2)


@prog
def obj_namedtuple_arg_and_return():
    def f(p):
        q = Point(p.x + 1, y=p.y * 2)
        return q, q.x + q[1], q._replace(x=q.y), len(q)
    return f, [(Point(t(2), t(2)),), (Point(t(2), t(2)),), R(Point(t(3), t(3)),)]


@prog
def obj_collections_namedtuple():
    def f(x):
        p = PairNT(x, x * 2)
        a, b = p
        return PairNT(b, a), p._fields, p.a + p.b
    return f, std(2)


@prog
def obj_simplenamespace_arg():
    def f(x, ns):
        return x * ns.w + ns.b
    ns = types.SimpleNamespace
    return f, [(t(2), ns(w=2.0, b=1.0)), M(t(2), ns(w=2.0, b=1.0)),
               R(t(2), types.SimpleNamespace(w=3.0, b=1.0))]


@prog
def obj_method_call_and_dunder_call():
    def f(x, sc):
        return sc.apply(x), sc(x), Scaler.twice(x), Scaler.build(3.0).apply(x)
    s = Scaler(2.0)
    return f, [(t(2), s), (t(2), s)]


@prog
def obj_attribute_mutation_visible():
    class Tracker:
        def __init__(self):
            self.count = 0
            self.last = None
            self.items = []

    tr = Tracker()

    def f(x, obj):
        obj.count += 1
        obj.last = x * 2
        obj.items.append(obj.count)
        return obj.last + obj.count
    return f, [(t(2), tr), M(t(2), tr), M(t(2), tr)]


@prog
def obj_object_holding_tensors():
    class Holder:
        def __init__(self):
            self.w = torch.randn(2, 2)
            self.tag = "h"

    h = Holder()

    def f(x):
        return x @ h.w, h.tag
    return f, std(3, 2)


@prog
def obj_class_attribute_and_instance():
    class Cfg:
        factor = 3

        def __init__(self):
            self.offset = 1

    c = Cfg()

    def f(x):
        return x * Cfg.factor + c.offset + c.factor
    return f, std(2)


@prog
def obj_inherited_method():
    class A:
        def go(self, x):
            return x + 1

    class B(A):
        def go(self, x):
            return super().go(x) * 2

    b = B()

    def f(x):
        return b.go(x)
    return f, std(2)


@prog
def obj_dataclass_with_tensor_fields():
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        mask: torch.Tensor
        name: str = "b"

    def f(b):
        return (b.x * b.mask).sum(-1), b.name
    return f, [(Batch(t(2, 3), t(2, 3)),), (Batch(t(2, 3), t(2, 3)),), R(Batch(t(3, 3), t(3, 3)),)]


@prog
def obj_dataclass_asdict_fields():
    def f(x, cfg):
        names = [fld.name for fld in dataclasses.fields(cfg)]
        return x * len(names), names
    return f, [(t(2), Config()), M(t(2), Config())]


# ==================================================================================================
# Functions: closures, lambdas, nested functions, *args/**kwargs, defaults
# ==================================================================================================

@prog
def fn_closure_tensor_and_int():
    w = torch.randn(3)
    k = 4

    def f(x):
        return x * w + k
    return f, std(3)[:2]


@prog
def fn_nonlocal_mutation():
    calls = [0]
    total = 0

    def make():
        count = 0

        def f(x):
            nonlocal count
            count += 1
            calls[0] += 1
            return x * count
        return f, lambda: count
    f, get = make()
    return f, [(t(2),), M(t(2),), M(t(2),)], lambda: (get(), list(calls), total)


@prog
def fn_lambda_argument():
    def f(x, g):
        return g(x) + 1
    return f, [(t(2), lambda v: v * 2), R(t(2), lambda v: v - 3), R(t(2), torch.sin)]


@prog
def fn_nested_def():
    def f(x):
        def inner(y, k=2):
            return y * k

        def inner2(y):
            return inner(y, k=3) + inner(y)
        return inner2(x)
    return f, std(2)


@prog
def fn_recursion():
    def power(x, n):
        if n == 0:
            return torch.ones_like(x)
        return x * power(x, n - 1)

    def f(x, n):
        return power(x, n)
    return f, [(t(2), 3), (t(2), 3), R(t(2), 4)]


@prog
def fn_star_args():
    def total(*xs):
        out = xs[0]
        for v in xs[1:]:
            out = out + v
        return out

    def f(a, b, c):
        return total(a, b, c), total(*[a, b]), total(a)
    return f, [(t(2), t(2), t(2)), (t(2), t(2), t(2)), R(t(3), t(3), t(3))]


@prog
def fn_star_kwargs():
    def g(x, **kw):
        out = x * kw.get("scale", 1.0)
        if "shift" in kw:
            out = out + kw["shift"]
        return out, sorted(kw)

    def f(x):
        return g(x), g(x, scale=2.0), g(x, **{"shift": 1.0, "scale": 3.0})
    return f, std(2)


@prog
def fn_varargs_toplevel():
    def f(*xs, **kw):
        y = sum(xs)
        return y * kw.get("w", 1.0), len(xs)
    return f, [K(t(2), t(2)), K(t(2), t(2)), R(t(2), t(2), t(2)), R(t(2), t(2), w=2.0)]


@prog
def fn_defaults_kwonly():
    def g(x, a=1, *, b=2, c=None):
        y = x * a + b
        return y if c is None else y * c

    def f(x):
        return g(x), g(x, 2), g(x, b=5), g(x, c=0.5, a=3)
    return f, std(2)


@prog
def fn_functools_partial():
    def scale(x, s, shift=0.0):
        return x * s + shift
    p = functools.partial(scale, s=2.0)
    q = functools.partial(scale, shift=1.0)

    def f(x):
        return p(x), q(x, 3.0), functools.partial(torch.add, alpha=2)(x, x)
    return f, std(2)


@prog
def fn_decorator_wraps():
    def twice(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k) * 2
        return wrapper

    @twice
    def core(x, b=1.0):
        return x + b

    def f(x):
        return core(x), core(x, b=3.0)
    return f, std(2)


@prog
def fn_generator_expression():
    def f(xs):
        return sum(x * 2 for x in xs), max(len(x) for x in xs), tuple(x + 1 for x in xs)
    return f, [([t(2), t(2)],), ([t(2), t(2)],)]


@prog
def fn_nested_comprehensions():
    def f(x):
        grid = [[x * (i + j) for j in range(2)] for i in range(2)]
        flat = [v for row in grid for v in row if v is not None]
        s = {i * i for i in range(4)}
        return torch.stack(flat), sorted(s)
    return f, std(2)


@prog
def fn_closures_in_loop():
    def f(x):
        fns = []
        for i in range(3):
            fns.append(lambda v, i=i: v + i)
        late = [lambda v: v * j for j in range(2)]
        return [g(x) for g in fns], [g(x) for g in late]
    return f, std(2)


@prog
def fn_higher_order_returns_function():
    def make_scaler(k):
        def s(v):
            return v * k
        return s

    def f(x):
        s3 = make_scaler(3)
        return s3(x) + make_scaler(2)(x)
    return f, std(2)


@prog
def fn_global_function_helper():
    def f(x):
        return _helper_global(x) * 2
    return f, std(3)


@prog
def fn_lambda_inline():
    def f(x):
        sq = lambda v: v * v  # noqa: E731
        return sq(x) + (lambda a, b=1: a + b)(x)
    return f, std(2)


@prog
def fn_method_defaults_mutable_untouched():
    def g(x, acc=None):
        acc = [] if acc is None else acc
        acc.append(x)
        return acc

    def f(x):
        return torch.stack(g(x) + g(x * 2))
    return f, std(2)


@prog
def fn_kwargs_toplevel_tensor():
    def f(x, *, y, scale=1.0):
        return x * y * scale
    return f, [K(t(2), y=t(2)), K(t(2), y=t(2), scale=1.0), M(t(2), y=t(2), scale=2.0)]


@prog
def fn_args_passthrough_unpack_dict():
    def g(a, b, c=0.0):
        return a * b + c

    def f(x):
        args = (x, 2.0)
        kw = {"c": 1.0}
        return g(*args, **kw), g(**{"a": x, "b": 3.0})
    return f, std(2)


@prog
def fn_torch_function_variable():
    ops = [torch.relu, torch.sigmoid, F.silu]

    def f(x):
        out = x
        for op in ops:
            out = op(out)
        return out
    return f, std(3)


# ==================================================================================================
# Grad mode and autocast
# ==================================================================================================

@prog
def gr_no_grad_block():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y, x + 1, y.requires_grad
    return f, [(t(2, rg=True),), (t(2, rg=True),), R(t(2),)]


@prog
def gr_enable_grad_inside_no_grad():
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
        return a, b
    return f, [(t(2, rg=True),), (t(2, rg=True),)]


@prog
def gr_set_grad_enabled_ctx():
    def f(x, flag):
        with torch.set_grad_enabled(flag):
            y = x.sin()
        return y
    return f, [(t(2, rg=True), False), (t(2, rg=True), False), R(t(2, rg=True), True)]


@prog
def gr_is_grad_enabled_branch():
    def f(x):
        if torch.is_grad_enabled():
            return x * 2
        return x * 3
    return f, [(t(2, rg=True),), (t(2, rg=True),), R(t(2, rg=True), _ctx=torch.no_grad),
               K(t(2, rg=True))]


@prog
def gr_no_grad_decorated_helper():
    @torch.no_grad()
    def stats(x):
        return x.mean(), x.std()

    def f(x):
        m, s = stats(x)
        return (x - m) / s
    return f, [(t(4, rg=True),), (t(4, rg=True),)]


@prog
def gr_called_under_outer_no_grad():
    def f(x, w):
        return (x @ w).relu()
    return f, [(t(2, 2), t(2, 2, rg=True)), R(t(2, 2), t(2, 2, rg=True), _ctx=torch.no_grad),
               (t(2, 2), t(2, 2, rg=True))]


@prog
def gr_detach_and_requires_grad_():
    def f(x):
        y = x.detach() * 2
        z = (x * 3).detach()
        return y + x, z
    return f, [(t(2, rg=True),), (t(2, rg=True),)]


@prog
def gr_autocast_cpu_bf16():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            d = torch.relu(c)
        return c, d.float() + 1, c.dtype
    return f, [(t(2, 3), t(3, 2)), (t(2, 3), t(3, 2)), R(t(4, 3), t(3, 2))]


@prog
def gr_autocast_disabled_inside():
    def f(a, b):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            c = a @ b
            with torch.autocast(device_type="cpu", enabled=False):
                d = a.float() @ b.float()
        return c.float(), d
    return f, [(t(2, 3), t(3, 2)), (t(2, 3), t(3, 2))]


@prog(backward=True)
def gr_module_under_no_grad_in_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def forward(self, x):
            with torch.no_grad():
                frozen = self.a(x)
            return self.b(frozen) + self.a(x)
    return Net(), std(1, 2)


@prog
def gr_inference_style_eval_no_grad():
    m = _mlp().eval()

    def f(x):
        with torch.no_grad():
            return m(x).argmax(-1)
    return f, std(2, 4)


@prog(backward=True)
def gr_backward_through_graph():
    def f(x, w):
        return ((x * w).sin() + w.cos()).sum(0)
    return f, [(t(3, 2, rg=True), t(2, rg=True)), (t(3, 2, rg=True), t(2, rg=True)),
               R(t(4, 2, rg=True), t(2, rg=True))]


# ==================================================================================================
# Mutation: input tensors, caller-visible containers and objects
# ==================================================================================================

@prog
def mut_input_add_():
    def f(x):
        x.add_(1)
        return x * 2
    return f, std(3)


@prog
def mut_input_setitem():
    def f(x, v):
        x[0] = v
        x[1:, 0] = -1.0
        return x.sum()
    return f, [(t(3, 2), 5.0), (t(3, 2), 5.0), R(t(4, 2), 5.0)]


@prog
def mut_input_through_view():
    def f(x):
        x[0].zero_()
        x.view(-1)[-1] = 7.0
        x.t()[0].mul_(2)
        return x + 0
    return f, std(2, 3)


@prog
def mut_input_returned():
    def f(x, y):
        x.mul_(y)
        return x
    return f, [(t(3), t(3)), (t(3), t(3)), R(t(4), t(4))]


@prog
def mut_input_copy_and_fill():
    def f(dst, src):
        dst.copy_(src * 2)
        src.fill_(0.5)
        return dst - src
    return f, [(t(3), t(3)), (t(3), t(3))]


@prog
def mut_input_list_element():
    def f(xs):
        xs[0].add_(1)
        xs[1][0] = 9.0
        return xs[0] + xs[1]
    return f, [([t(2), t(2)],), ([t(2), t(2)],)]


@prog
def mut_caller_list_append():
    def f(x, out):
        out.append(x * 2)
        out.append(len(out))
        return x + 1
    return f, [(t(2), []), (t(2), []), R(t(2), [1])]


@prog
def mut_caller_list_pop_insert():
    def f(x, lst):
        v = lst.pop(0)
        lst.insert(1, "mid")
        lst[-1] = x.sum()
        return x * v
    return f, [(t(2), [2, 3, 4]), (t(2), [2, 3, 4]), R(t(2), [5, 3, 4])]


@prog
def mut_caller_dict_update():
    def f(x, d):
        d["out"] = x * 2
        d["count"] = d.get("count", 0) + 1
        d.pop("tmp", None)
        return x - 1
    return f, [(t(2), {}), (t(2), {}), R(t(2), {"count": 3, "tmp": 1})]


@prog
def mut_caller_nested_containers():
    def f(x, state):
        state["hist"].append(x.mean())
        state["meta"]["n"] += 1
        return x * state["meta"]["n"]
    return f, [(t(2), {"hist": [], "meta": {"n": 0}}), M(t(2), {"hist": [], "meta": {"n": 0}})]


@prog
def mut_same_list_across_calls():
    log = []

    def f(x):
        log.append(x.sum())
        return x * 2
    return f, [(t(2),), M(t(2),), M(t(2),)], lambda: list(log)


@prog
def mut_global_via_fresh_globals():
    g = {"torch": torch, "COUNTER": 0, "CACHE": {}}
    src = (
        "def f(x):\n"
        "    global COUNTER\n"
        "    COUNTER += 1\n"
        "    CACHE['last'] = x * 2\n"
        "    return x + COUNTER\n")
    exec(compile(src, "<corpus:mut_global>", "exec"), g)
    return g["f"], [(t(2),), M(t(2),), M(t(2),)], lambda: (g["COUNTER"], dict(g["CACHE"]))


@prog
def mut_module_param_inplace_no_grad():
    m = nn.Linear(2, 2)

    def f(x):
        with torch.no_grad():
            m.weight.mul_(0.5)
        return m(x)
    return f, [(t(1, 2),), (t(1, 2),)], lambda: m.weight.detach().clone()


@prog
def mut_input_and_alias_output():
    def f(x):
        y = x.view(2, 2)
        y.add_(1)
        return y, x
    return f, [(t(4),), (t(4),)]


@prog
def mut_return_input_object():
    def f(x, lst):
        lst.append(1)
        return x, lst, x * 2
    return f, [(t(2), []), (t(2), [])]


@prog
def mut_setattr_caller_object_tensor():
    ns = types.SimpleNamespace(acc=torch.zeros(2))

    def f(x):
        ns.acc = ns.acc + x
        ns.n = getattr(ns, "n", 0) + 1
        return ns.acc * 2
    return f, [(t(2),), M(t(2),), M(t(2),)], lambda: (ns.acc.clone(), ns.n)


@prog
def mut_list_sort_in_place_caller():
    def f(x, ks):
        ks.sort(reverse=True)
        ks.extend([0])
        return x * ks[0]
    return f, [(t(2), [1, 3, 2]), (t(2), [1, 3, 2])]


@prog
def mut_inplace_on_int_tensor_input():
    def f(x):
        x += 3
        x //= 2
        return x
    return f, [(t(3, dtype=torch.int64),), (t(3, dtype=torch.int64),)]


@prog
def mut_input_index_put():
    def f(x, idx):
        x.index_put_((idx,), torch.tensor(0.0))
        x[idx] += 1
        return x.clone()
    return f, [(t(4), torch.tensor([1, 3])), (t(4), torch.tensor([0, 2]))]
