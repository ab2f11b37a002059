"""A graph break inside a loop: the frame is skipped (it runs as Python) and the modules it calls
are compiled, as torch.compile does (its frame-evaluation hook compiles every frame a skipped frame
calls). LayerDrop in Hugging Face decoders is the real case: ``if torch.rand([]) < p: continue``
inside the loop over layers."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn

import ember
from ember import events
from ember.capture import nested


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


class Decoder(nn.Module):
    def __init__(self, n: int = 3, layerdrop: float = 0.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(n)])
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2
        for layer in self.layers:
            if self.training:
                p = torch.rand([])
                if p < self.layerdrop:  # a branch on a tensor, inside the loop
                    continue
            x = layer(x)
        return x.sum()


def _grads(m: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_layers_compiled_under_skipped_frame(backend: str) -> None:
    ember.reset()
    m = Decoder().train()
    x = torch.randn(4, 8)
    compiled = ember.compile(m, backend=backend)
    for step in range(2):
        out = compiled(x)
        out.backward()
        got = _grads(m)
        m.zero_grad(set_to_none=True)
        ref = m(x)
        ref.backward()
        want = _grads(m)
        m.zero_grad(set_to_none=True)
        torch.testing.assert_close(out, ref)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    stats = events.counters["stats"]
    assert stats["skipped_frames"] == 1
    assert stats["fallbacks"] == 0
    # three layers: the first one, then one graph shared by the others (torch.compile: one
    # graph for all three, its parameters being graph inputs from the start)
    assert stats["graphs"] == 2
    # nothing stays routed after the frame returned
    assert list(nested.patched_classes()) == []
    assert "__call__" not in Layer.__dict__


def test_layerdrop_randomness_matches_eager() -> None:
    ember.reset()
    m = Decoder(n=4, layerdrop=0.5).train()
    x = torch.randn(2, 8)
    compiled = ember.compile(m, backend="aot_eager")
    for seed in range(4):
        torch.manual_seed(seed)
        out = compiled(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(out, m(x))


def test_eval_is_one_graph_and_direct_layer_calls_stay_eager() -> None:
    ember.reset()
    m = Decoder().eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(m, backend="eager")(x), m(x))
    assert events.counters["stats"]["graphs"] == 1
    assert events.counters["stats"]["skipped_frames"] == 0
    # outside a skipped frame, a layer called by the user is not compiled
    m.train()
    before = events.counters["stats"]["graphs"]
    m.layers[0](x)
    assert events.counters["stats"]["graphs"] == before


def test_module_with_hooks_is_compiled_with_its_hooks() -> None:
    ember.reset()
    m = Decoder(n=2).train()
    seen = []
    m.layers[1].register_forward_hook(lambda mod, inp, out: seen.append(out.shape) or out * 3)
    x = torch.randn(4, 8)
    out = ember.compile(m, backend="eager")(x)
    assert seen == [torch.Size([4, 8])]
    seen.clear()
    torch.testing.assert_close(out, m(x))
    assert events.counters["stats"]["fallbacks"] == 0


def test_other_threads_are_not_routed() -> None:
    """While one thread runs a skipped frame, another thread's module calls stay eager."""
    ember.reset()
    started, release = threading.Event(), threading.Event()

    class Slow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            started.set()
            release.wait(10)
            return x + 1

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Layer(), Layer()])
            self.slow = Slow()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                if x.sum() > 1e9:
                    break
                x = layer(x)
            return self.slow(x)

    m = Outer().train()
    other = Layer()
    x = torch.randn(4, 8)
    t = threading.Thread(target=lambda: ember.compile(m, backend="eager")(x))
    t.start()
    assert started.wait(60)
    graphs = events.counters["stats"]["graphs"]
    other(x)  # Layer.__call__ is routed now, but not for this thread
    assert events.counters["stats"]["graphs"] == graphs
    release.set()
    t.join(60)
    assert list(nested.patched_classes()) == []


class CheckpointingLayer(Layer):
    """A layer class with its own ``__call__`` (transformers' GradientCheckpointingLayer)."""

    checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.checkpointing and self.training:
            raise NotImplementedError
        return super().__call__(*args, **kwargs)


class CheckpointingDecoder(Decoder):
    def __init__(self) -> None:
        super().__init__(n=2)
        self.layers = nn.ModuleList([CheckpointingLayer() for _ in range(2)])


def test_layer_with_own_call_compiled_as_one_frame() -> None:
    """A class with its own ``__call__`` is compiled from that frame (its forward inlined
    through ``super().__call__``), not left eager with only its children compiled."""
    ember.reset()
    m = CheckpointingDecoder().train()
    x = torch.randn(4, 8)
    out = ember.compile(m, backend="aot_eager")(x)
    out.backward()
    got = _grads(m)
    m.zero_grad(set_to_none=True)
    ref = m(x)
    ref.backward()
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, _grads(m)):
        torch.testing.assert_close(g, w)
    stats = events.counters["stats"]
    assert stats["skipped_frames"] == 1 and stats["fallbacks"] == 0
    # one graph per layer, each holding the layer's relu (before: only nn.Linear children,
    # which are torch's own modules and not compiled on their own, so no graph at all)
    assert stats["graphs"] == 2
    assert list(nested.patched_classes()) == []
    assert "__call__" in CheckpointingLayer.__dict__
    assert CheckpointingLayer.__dict__["__call__"].__name__ == "__call__"
