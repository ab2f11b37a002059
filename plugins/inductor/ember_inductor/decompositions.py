"""The decomposition table inductor asks AOT autograd for: torch's core ATen decompositions (fewer
ops to lower) minus attention (kept whole, an extern kernel), plus the normalization ops so they
reach the lowering as reductions and pointwise math."""

from __future__ import annotations

from typing import Any, Callable

import functools

import torch

__all__ = ["decompositions"]

aten = torch.ops.aten


@functools.lru_cache(None)
def _table() -> dict[Any, Callable[..., Any]]:
    return _build()


def decompositions() -> dict[Any, Callable[..., Any]]:
    return dict(_table())


def _build() -> dict[Any, Callable[..., Any]]:
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    for op in (aten.scaled_dot_product_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
               # kept whole, ATen's kernel: decomposed, it is a zero-filled table, then an
               # out-of-place index_put (accumulate) that copies the whole table again before
               # adding the few rows the batch used (bert's 8192x256 word table: a 4 ms copy of
               # a 77 ms training step on one thread)
               aten.embedding_dense_backward.default):
        table.pop(op, None)
    for op in (aten.native_layer_norm.default, aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit_no_training.default,
               aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
               aten.native_group_norm.default, aten.native_batch_norm.default):
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    if aten.index_add.default in table:
        table[aten.index_add.default] = _index_add_refusing_negative(table[aten.index_add.default])
    return table


def _index_add_refusing_negative(decomp: Callable[..., Any]) -> Callable[..., Any]:
    """torch's index_add decomposition is an index_put, which counts a negative index from the
    end; eager's index_add refuses one (IndexError): it is made out of range here, so that the
    index_put's bounds check raises as eager does."""
    def index_add(x: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Any:
        n = x.shape[dim] if x.dim() else 1
        return decomp(x, dim, torch.where(index < 0, n, index), source, alpha=alpha)
    return index_add
