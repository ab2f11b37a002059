"""Random numbers in generated kernels (the Triton target): ``rand``, ``randn``, their ``_like``
forms and ``bernoulli`` (dropout's mask) become Philox draws fused into the kernels that use
them.

Each call of a compiled graph draws one seed from torch's generator of the graph's device (an
ATen ``randint`` in the wrapper: fresh numbers every call, reproducible under
``torch.manual_seed``, the generator advanced as a compiled program's own stream — not eager's
numbers, eager's distribution). Each random op of the graph reads the Philox stream at
``(seed, base + flat index)``, ``base`` the count of values the graph's earlier random ops took,
so no two ops of a call share numbers. A backward that needs a mask gets it saved by the
forward (AOT never recomputes random ops).

The C++ target keeps these ops as ATen calls (``GraphLowering.random_in_kernels`` is set by
``compile_fx.generate_source`` for the Triton target only); so do a user's ``generator=``,
float64 (Philox gives 24 random bits) and ``rand`` in bfloat16/float16 (rounding could give
1.0, which eager never returns).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..ir import ExternKernel, Layout, Pointwise
from ..sizes import contiguous_strides, product
from ..virtualized import ops
from .common import loader, meta, shape_of
from .registry import Unsupported, current, register

aten = torch.ops.aten


def _graph() -> Any:
    g = current()
    if not getattr(g, "random_in_kernels", False):
        raise Unsupported("random numbers run as ATen calls on this target")
    return g


def _seed(g: Any, device: torch.device) -> Any:
    """The graph's seed buffer: one ``randint`` per call, made at the first random op."""
    seed = getattr(g, "_rng_seed", None)
    if seed is None:
        seed = ExternKernel(
            g.new_name(), Layout((1,), (1,), torch.int64, device), aten.randint.low,
            [0, 2**31 - 1, [1]], {"dtype": torch.int64, "device": device}, "fallback",
            ["philox seed"])
        g.operations.append(seed)
        g._rng_seed = seed
        g._rng_offset = 0
    return seed


def _uniform_or_normal(kind: str, size: list[Any], device: torch.device
                       ) -> Callable[[Any], Any]:
    """index -> the float32 draw (``kind`` "rand" or "randn") of that element."""
    g = _graph()
    numel = product(size)  # symbolic sizes: offsets are expressions of the kernel's size args
    seed = _seed(g, device)
    base = g._rng_offset
    if isinstance(base + numel, int) and base + numel >= 2**31:
        raise Unsupported("more random numbers per call than one Philox offset range")
    g._rng_offset = base + numel
    sl = seed.make_loader()
    strides = contiguous_strides(size)

    def draw(i: Any) -> Any:
        flat = base + sum(ix * st for ix, st, sz in zip(i, strides, size) if sz != 1)
        return getattr(ops, kind)(sl([0]), ops.index_expr(flat, torch.int32))
    return draw


def _check(kwargs: dict[str, Any]) -> None:
    if kwargs.get("generator") is not None:
        raise Unsupported("a user's generator")


def _random(kind: str, **kwargs: Any) -> Any:
    _check(kwargs)
    m = meta()
    dt = m.dtype
    if dt not in ((torch.float32,) if kind == "rand" else
                  (torch.float32, torch.bfloat16, torch.float16)):
        raise Unsupported(f"{kind} in {dt}")
    size = shape_of(m)
    draw = _uniform_or_normal(kind, size, m.device)
    return Pointwise(m.device, dt, size, lambda i: ops.to_dtype(draw(i), dt), 3)


@register(aten.rand.default)
def rand(size: Any, **kwargs: Any) -> Any:
    return _random("rand", **kwargs)


@register(aten.randn.default)
def randn(size: Any, **kwargs: Any) -> Any:
    return _random("randn", **kwargs)


@register(aten.rand_like.default)
def rand_like(x: Any, **kwargs: Any) -> Any:
    return _random("rand", **kwargs)


@register(aten.randn_like.default)
def randn_like(x: Any, **kwargs: Any) -> Any:
    return _random("randn", **kwargs)


def _bernoulli(p_at: Callable[[Any], Any], **kwargs: Any) -> Any:
    _check(kwargs)
    m = meta()
    dt = m.dtype
    if dt == torch.float64:
        raise Unsupported("bernoulli in float64")
    size = shape_of(m)
    draw = _uniform_or_normal("rand", size, m.device)
    # P(rand < p) = p, as eager's Bernoulli(p)
    return Pointwise(m.device, dt, size, lambda i: ops.to_dtype(
        ops.lt(draw(i), p_at(i)), dt), 3)


@register(aten.bernoulli.p)
def bernoulli_p(x: Any, p: Any = 0.5, **kwargs: Any) -> Any:
    if not isinstance(p, (int, float)):
        raise Unsupported("bernoulli with a non-constant p")
    return _bernoulli(lambda i: ops.constant(float(p), torch.float32), **kwargs)


@register(aten.bernoulli.default)
def bernoulli(x: Any, **kwargs: Any) -> Any:
    pl = loader(x, shape_of(meta()))
    return _bernoulli(lambda i: ops.to_dtype(pl(i), torch.float32), **kwargs)
