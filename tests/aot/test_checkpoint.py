"""Activation checkpointing (torch.utils.checkpoint, non-reentrant) inside a compiled region:
one graph, no break per block, the region's values recomputed in the backward (not saved),
gradients as eager's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import ember
import ember.aot.compile as aot_compile
from ember import events


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x))) + x


class Net(torch.nn.Module):
    def __init__(self, ckpt: bool, **kw) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.ckpt, self.kw = ckpt, kw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False, **self.kw) if self.ckpt else blk(x)
        return x.pow(2).sum()


def _run(monkeypatch, model: torch.nn.Module, backend: str):
    parts = []
    real = aot_compile.partition_joint

    def spy(*a, **k):
        parts.append(real(*a, **k))
        return parts[-1]

    monkeypatch.setattr(aot_compile, "partition_joint", spy)
    monkeypatch.setattr(ember.config, "aot_cache", False)  # trace and partition here
    ember.reset()
    x = torch.randn(4, 16)
    compiled = ember.compile(model, backend=backend)
    compiled(x).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-5)
    return parts, dict(events.counters["stats"])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointed_blocks_recompute_in_one_graph(monkeypatch, backend):
    parts, stats = _run(monkeypatch, Net(ckpt=True), backend)
    assert stats.get("graphs") == 1 and not stats.get("graph_breaks") and \
        not stats.get("fallbacks"), stats
    (part,) = parts
    # nothing computed inside a checkpointed block is saved: only the inputs and parameters,
    # and, for a backend that does not fuse (no recompute of cheap ops), each block's output
    # (the residual ``add``: the next block's input, as eager's checkpoint saves it)
    fw_inputs = {n.name for n in part.fw.graph.nodes if n.op == "placeholder"}
    inner = set(part.saved_names) - fw_inputs
    if not ember.get_backend(backend).recompute:
        inner = {s for s in inner if not s.startswith("add")}
    assert not inner, part.saved_names
    # ... and the backward recomputes them (the blocks' matmuls and sines are in it)
    bw_ops = {str(n.target) for n in part.bw.graph.nodes if n.op == "call_function"}
    assert any("sin" in t for t in bw_ops) and any("addmm" in t or "mm" in t for t in bw_ops)


def test_without_checkpoint_activations_are_saved(monkeypatch):
    parts, _ = _run(monkeypatch, Net(ckpt=False), "aot_eager")
    (part,) = parts
    fw_inputs = {n.name for n in part.fw.graph.nodes if n.op == "placeholder"}
    assert set(part.saved_names) - fw_inputs  # the same model saves activations otherwise


def test_selective_checkpoint_context_fn_runs_between_graphs(monkeypatch):
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy
        return CheckpointPolicy.PREFER_RECOMPUTE

    kw = {"context_fn": lambda: create_selective_checkpoint_contexts(policy)}
    _, stats = _run(monkeypatch, Net(ckpt=True, **kw), "aot_eager")
    assert not stats.get("fallbacks"), stats  # correct (checked in _run), not compiled as one
