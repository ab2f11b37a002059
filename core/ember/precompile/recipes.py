"""Ready-made precompile recipes: the model bundled with Ember (``ember.examples``) and, from the
Ember source tree, every model of the benchmark zoo (``benchmarks/zoo.py``).

A recipe is a factory returning ``(fn, example_inputs)`` or ``(fn, example_inputs, settings)``
(``settings``: ``{"grad": False}`` precompiles under ``torch.no_grad()``); the command line
precompiles any such factory, passing it the extra words of the command as arguments::

    python -m ember precompile ember.precompile.recipes:demo_inference -o out/demo
    python -m ember precompile ember.precompile.recipes:zoo gpt2 step -o out/gpt2_step
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["demo_inference", "demo_training", "zoo", "forward", "loss", "zoo_infer",
           "zoo_step"]


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A training step's loss; the caller runs ``loss.backward()`` on the loaded artifact."""
    return model(x).square().mean()


def demo_inference() -> tuple[Any, tuple, dict]:
    """The bundled DemoModel's forward, for inference (precompiled under ``torch.no_grad()``)."""
    from ..examples import example_input, make_model

    return forward, (make_model().eval(), example_input()), {"grad": False}


def demo_training() -> tuple[Any, tuple]:
    """The bundled DemoModel's loss, with gradients (the caller runs backward)."""
    from ..examples import example_input, make_model

    return loss, (make_model().train(), example_input())


_HF_FIELDS = ("logits", "last_hidden_state", "pooler_output")


def zoo_infer(model: torch.nn.Module, *inputs: Any) -> Any:
    """A zoo model's inference step: its output (a Hugging Face model's tensor fields, as a
    tuple: fields are read by attribute, which capture supports)."""
    out = model(*inputs)
    if hasattr(model, "config"):
        return tuple(getattr(out, k) for k in _HF_FIELDS if getattr(out, k, None) is not None)
    return out


def zoo_step(model: torch.nn.Module, *inputs: Any) -> torch.Tensor:
    """A zoo model's training step, as the benchmark runner defines it: forward, the loss (the
    mean of every floating output, summed) and ``loss.backward()``; returns the loss."""
    out = zoo_infer(model, *inputs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum(t.float().mean() for t in outs if t.is_floating_point())
    loss.backward()
    return loss


def zoo(model: str = "mlp", step: str = "infer", device: str = "cpu",
        size: str | None = None) -> tuple[Any, tuple, dict]:
    """A model of the benchmark zoo (``benchmarks/zoo.py``; run from the root of the Ember
    source tree) with its example inputs: ``step`` "infer" (under no_grad) or "step" (a
    training step calling backward()); ``size`` "small" (default on the CPU) or "full"."""
    try:
        from benchmarks.zoo import get_spec
    except ImportError as e:
        raise SystemExit("the zoo recipe needs benchmarks/zoo.py: run from the root of the "
                         f"Ember source tree ({e})") from None
    if step not in ("infer", "step"):
        raise SystemExit(f"zoo recipe: step must be 'infer' or 'step', got {step!r}")
    m, inputs = get_spec(model).build(device, size or ("small" if device == "cpu" else "full"))
    if step == "infer":  # the model as the zoo builds it (train mode), as the runner does
        return zoo_infer, (m, *inputs), {"grad": False}
    return zoo_step, (m, *inputs), {"grad": True}
