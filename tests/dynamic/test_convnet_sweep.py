"""Issue 12: batch-size and image-size sweeps on the zoo's conv net (benchmarks/zoo.py
SmallResNet, narrow): at most two graphs, eager-matching results, with each backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import ember

from ._util import graphs, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.zoo import SmallResNet  # noqa: E402


BATCHES = [2, 3, 4, 5, 6, 7, 8, 9]
IMAGES = [16, 20, 24, 28, 32, 36, 40, 44]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _net(training: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallResNet(width=4).train(training)


def _run(backend: str, shapes: list[tuple[int, int]], training: bool) -> None:
    net = _net(training)
    ref = _net(training)  # its own BatchNorm running statistics, updated like the compiled one's
    compiled = ember.compile(net, backend=backend)
    for b, hw in shapes:
        x = torch.randn(b, 3, hw, hw, generator=torch.Generator().manual_seed(b * 100 + hw))
        if training:
            want = ref(x)
            want.square().mean().backward()
            got = compiled(x)
            got.square().mean().backward()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            for p, q in zip(net.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
            net.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)
        assert graphs(compiled) <= 2, f"shape {(b, 3, hw, hw)} compiled graph #{graphs(compiled)}"
    assert graphs(compiled) == 2
    s = stats()
    assert s.get("fallbacks", 0) == 0 and s.get("graph_breaks", 0) == 0, s


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_batch_size_sweep(backend: str) -> None:
    _run(backend, [(b, 16) for b in BATCHES], training=False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_image_size_sweep(backend: str) -> None:
    _run(backend, [(2, hw) for hw in IMAGES], training=False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_batch_size_sweep_training(backend: str) -> None:
    _run(backend, [(b, 16) for b in BATCHES], training=True)
