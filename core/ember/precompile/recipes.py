"""Ready-made precompile recipes for the model bundled with Ember (``ember.examples``).

A recipe is a zero-argument function returning ``(fn, example_inputs)``; the command line
precompiles any such factory: ``python -m ember.precompile ember.precompile.recipes:demo_inference
-o out/demo``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["demo_inference", "demo_training", "forward", "loss"]


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A training step's loss; the caller runs ``loss.backward()`` on the loaded artifact."""
    return model(x).square().mean()


def demo_inference() -> tuple[Any, tuple]:
    """The bundled DemoModel's forward, for inference (precompiled under ``torch.no_grad()``)."""
    from ..examples import example_input, make_model

    return forward, (make_model().eval(), example_input())


def demo_training() -> tuple[Any, tuple]:
    """The bundled DemoModel's loss, with gradients (the caller runs backward)."""
    from ..examples import example_input, make_model

    return loss, (make_model().train(), example_input())
