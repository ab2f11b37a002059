"""Attention masks that mask nothing are dropped before tracing (core/ember/aot/masks.py): the
rewrite is exact, and applies only to masks computed from constants."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import ember
from ember.aot.masks import drop_constant_masks

B, H, T, D = 2, 3, 8, 4


def _hf_bidirectional(q: torch.Tensor) -> torch.Tensor:
    # transformers' sdpa_mask under a compiler, for an encoder without padding
    return (torch.arange(T)[None, None, :, None] >= 0).expand(B, -1, T, T)


def _zeros_float(q: torch.Tensor) -> torch.Tensor:
    return torch.zeros(T, T).expand(B, 1, -1, -1)


def _causal(q: torch.Tensor) -> torch.Tensor:
    return torch.arange(T)[None, :] <= torch.arange(T)[:, None]


def _from_input(q: torch.Tensor) -> torch.Tensor:
    return (q[:, :1, :, :1] > -100).expand(-1, -1, -1, T)  # all True, but not known early


def _random(q: torch.Tensor) -> torch.Tensor:
    return torch.rand(T, T) >= 0  # all True, but random ops never run at compile time


def _uninitialized(q: torch.Tensor) -> torch.Tensor:
    return torch.empty(T, T).fill_(0.0)  # never evaluated: empty and an in-place fill


def _causal_float(q: torch.Tensor) -> torch.Tensor:
    keep = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    return torch.zeros(T, T).masked_fill(~keep, float("-inf"))


def _gpt2_like(q: torch.Tensor) -> torch.Tensor:
    # transformers' causal sdpa_mask under a compiler: positions compared, batch-expanded
    pos = torch.arange(T).unsqueeze(0).expand(B, -1)
    b = torch.arange(B)[:, None, None, None]
    qi, ki = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
    return (pos[b, ki] <= pos[b, qi]).expand(B, -1, T, T)


def _causal_bottom_right(q: torch.Tensor) -> torch.Tensor:
    # a causal mask aligned to the bottom right (queries after a prefix): not SDPA's is_causal
    return torch.arange(T)[None, :] <= torch.arange(T)[:, None] + 1


def _causal_float_min(q: torch.Tensor) -> torch.Tensor:
    keep = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    return torch.zeros(T, T).masked_fill(~keep, torch.finfo(torch.float32).min)


def _qkv() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(3)]


def _sdpa(mask_fn: Any) -> Any:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_fn(q), scale=0.25)
    return f


@pytest.mark.parametrize("mask_fn,dropped", [
    (_hf_bidirectional, "none"), (_zeros_float, "none"), (_causal, "causal"),
    (_causal_float, "causal"), (_gpt2_like, "causal"), (_causal_bottom_right, None),
    (_causal_float_min, None), (_from_input, None), (_random, None),
    (_uninitialized, None)])
def test_masks_that_mask_nothing_are_dropped_and_only_those(mask_fn: Any, dropped: Any) -> None:
    f = _sdpa(mask_fn)
    q, k, v = _qkv()
    gm = _captured(f, q, k, v)  # the torch-level graph capture hands to AOT autograd
    assert drop_constant_masks(gm) == int(dropped is not None)
    sdpa = [n for n in gm.graph.nodes
            if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target)]
    assert len(sdpa) == 1
    assert (sdpa[0].kwargs.get("attn_mask") is None) == (dropped is not None), gm.code
    assert sdpa[0].kwargs.get("is_causal", False) == (dropped == "causal"), gm.code
    if mask_fn is not _random:
        # exact but for the causal kernel's summation order
        tol = 0 if dropped != "causal" else 1e-6
        torch.testing.assert_close(gm(q, k, v)[0], f(q, k, v), rtol=tol, atol=tol)
    if dropped:  # the mask's computation is gone from the graph
        assert not any(n.op not in ("placeholder", "output")
                       and "scaled_dot_product_attention" not in str(n.target)
                       for n in gm.graph.nodes), gm.code


def _captured(f: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    seen: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example: Any, **kw: Any) -> Any:
        seen.append(gm)
        return gm

    ember.register_backend("masks_torch_level", record, level="torch")
    ember.compile(f, backend="masks_torch_level")(*args)
    assert len(seen) == 1
    return seen[0]


def test_a_captured_encoder_attention_runs_without_its_all_true_mask() -> None:
    """Through ember.compile: the ATen graph's attention has no mask; results equal eager's."""
    seen: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example: Any, **kw: Any) -> Any:
        seen.append(gm)
        return gm

    ember.register_backend("masks_recording", record, level="aten")
    f = _sdpa(_hf_bidirectional)
    q, k, v = _qkv()
    got = ember.compile(f, backend="masks_recording")(q, k, v)
    torch.testing.assert_close(got, f(q, k, v))
    assert seen
    for gm in seen:
        for n in gm.graph.nodes:
            if n.op == "call_function" and "attention" in str(n.target):
                assert n.kwargs.get("attn_mask") is None and (len(n.args) <= 3 or
                                                              n.args[3] is None), gm.code


def test_a_mask_that_would_broadcast_the_result_is_kept() -> None:
    from ember.aot.masks import _kind

    q = (B, H, T, D)
    assert _kind(torch.ones(B, H, T, T, dtype=torch.bool), q, q) == "none"
    assert _kind(torch.ones(5, B, H, T, T, dtype=torch.bool), q, q) is None
    assert _kind(torch.ones(3, 1, T, T, dtype=torch.bool), q, q) is None  # 3 batches, not 2
    assert _kind(torch.ones(T, T, dtype=torch.bool).tril(), q, q) == "causal"
    assert _kind(torch.ones(T, T, dtype=torch.bool).tril(), q, (B, H, T + 1, D)) is None


def _dynamic_sdpa(threshold: int) -> Any:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t = q.shape[0], q.shape[2]
        pos = torch.arange(t, device=q.device) + 0
        mask = (pos[None, None, :, None] >= threshold).expand(b, -1, t, t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)
    return f


def _data_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = (q[:, :1, :, :1] > -1e9).expand(-1, -1, -1, q.shape[2])  # all True, from data
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)


def _alpha_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, t = q.shape[0], q.shape[2]
    pos = torch.add(torch.arange(t), 1, alpha=-2)  # pos - 2: negative for the first two
    mask = (pos[None, None, :, None] >= -1).expand(b, -1, t, t)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)


def _wrapped_dtype_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, t = q.shape[0], q.shape[2]
    small = torch.zeros(1, dtype=torch.int8)
    pos = (torch.arange(t) + 120).to(small)  # int8: wraps below zero past 127
    mask = (pos[None, None, :, None] >= 0).expand(b, -1, t, t)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)


@pytest.mark.parametrize("f,dropped", [(_dynamic_sdpa(0), True), (_dynamic_sdpa(1), False),
                                       (_data_mask, False), (_alpha_mask, False),
                                       (_wrapped_dtype_mask, False)])
def test_masks_with_symbolic_sizes_are_dropped_when_true_for_every_size(
        f: Any, dropped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamic=True: the mask depends on a size and cannot be computed once; bounds prove
    ``arange(s) + 0 >= 0`` True for every size (transformers' encoder mask), nothing else."""
    from ember.aot import masks

    seen: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule) -> int:
        seen.append(gm)  # the graph the pass rewrote, as AOT autograd then traces it
        return run(gm)

    run = masks.drop_constant_masks
    monkeypatch.setattr(masks, "drop_constant_masks", recording)
    cf = ember.compile(f, backend="aot_eager", dynamic=True)
    for t in (8, 11):
        g = torch.Generator().manual_seed(t)
        q, k, v = (torch.randn(B, H, t, D, generator=g) for _ in range(3))
        torch.testing.assert_close(cf(q, k, v), f(q, k, v))
    assert len(seen) == 1 and any(isinstance(n.meta.get("example_value"), torch.Tensor)
                                  for n in seen[0].graph.nodes)
    sdpa = [n for n in seen[0].graph.nodes
            if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target)]
    assert len(sdpa) == 1
    assert (sdpa[0].kwargs.get("attn_mask") is None) == dropped, seen[0].code
