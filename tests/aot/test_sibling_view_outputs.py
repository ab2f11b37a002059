"""Outputs that are views of one intermediate (found on Hugging Face's prophetnet in training:
its decoder returns ``y[:, :n]`` and ``y[:, n:]`` of one layer norm). AOT autograd regenerated
the second as an as_strided view of the first, reaching past the first's elements: the forward
values were right, the gradients wrong. Only a view that lies within a dense earlier output may
be regenerated from it."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import ember


def _split(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * w
    return y[:, :8], y[:, 8:]


def _overlapping(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * w
    return y[:, :16], y[:, 8:]


def _strided(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = (x * w).transpose(0, 1)
    return y[::2], y[1::2]


def _base_and_view(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * w
    return y, y[:, 8:]


@pytest.mark.parametrize("fn", [_split, _overlapping, _strided, _base_and_view],
                         ids=lambda f: f.__name__.strip("_"))
def test_gradients_through_views_of_one_intermediate(fn: Callable[..., tuple]) -> None:
    x = torch.randn(2, 24, 4)
    w = torch.randn(4, requires_grad=True)

    def grads(f: Callable[..., tuple]) -> tuple[list[torch.Tensor], torch.Tensor]:
        w.grad = None
        outs = f(x, w)
        g = torch.Generator().manual_seed(0)
        sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs).backward()
        return [o.detach().clone() for o in outs], w.grad.clone()

    ref_outs, ref_grad = grads(fn)
    old = ember.config.suppress_errors
    ember.config.suppress_errors = False
    try:
        ember.reset()
        outs, grad = grads(ember.compile(fn, backend="aot_eager"))
    finally:
        ember.config.suppress_errors = old
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(grad, ref_grad)


def test_view_of_an_earlier_output_still_aliases_it() -> None:
    """The case the regeneration is for keeps working: ``y`` and ``y[:, 8:]`` share memory."""
    x = torch.randn(2, 24, 4)
    w = torch.randn(4)
    ember.reset()
    y, tail = ember.compile(_base_and_view, backend="aot_eager")(x, w)
    y.mul_(0)
    assert tail.abs().sum() == 0
