"""A training graph must not save a value that shares memory with one of its outputs when it
can save something else: the user may write into that output before the backward runs.

Found by tests/adversarial/test_adv_alias_fuzz.py's generator: ``v = y.diagonal(); r =
relu(v)``, a graph break, then ``v.mul_(3)``. Eager's relu saved its result ``r``, so eager's
backward is fine. The min cut saved ``v`` (as cheap as ``r``, and relu recomputed from it in the
backward); the write made it stale, and autograd refused to unpack it ("A view was created in
no_grad mode and its base ... has been modified inplace"). A value aliasing an output now costs
far more to save than any other, so the cut takes ``r``. For a backend that does not recompute
cheap ops (``Backend.recompute=False``), the outputs themselves are treated so too."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import ember


@ember.disable
def scale(t: torch.Tensor) -> None:  # a graph break that writes into t
    t.mul_(3)


def diagonal_then_relu(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    v = y.diagonal()
    r = torch.relu(v)
    scale(v)
    return y.sum() + r.sum()


def slice_then_exp(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    v = y[1:]
    r = v.exp()
    scale(v)
    return y.sum() + (r * r).sum()


def base_of_a_view_output(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    flat = y.view(-1)
    t = torch.tanh(y)
    scale(flat)
    return flat.sum() + (t * t).sum()


def output_read_only_by_an_unused_one(x: torch.Tensor) -> torch.Tensor:
    # found by a training fuzz once aot_eager stopped recomputing cheap ops: ``u`` is an output
    # (it crosses the break) whose value the unused ``dead``'s backward would need; eager never
    # checks it (the loss does not reach ``dead``), so a saved ``u`` must not be what Ember keeps
    y = x * 2
    u = y * 2
    col = u[..., 1]
    dead = torch.sigmoid(u) * u
    s = col.sum(0, keepdim=True) + col
    scale(col)
    return s.sum() + dead.numel()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [diagonal_then_relu, slice_then_exp, base_of_a_view_output,
                                output_read_only_by_an_unused_one],
                         ids=lambda f: f.__name__)
def test_a_write_into_an_output_after_a_break_leaves_the_backward_right(
        backend: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x = torch.randn(5, 5, requires_grad=True)
    ref = fn(x)
    ref.backward()
    ref_grad, x.grad = x.grad, None
    ember.reset()
    old = ember.config.suppress_errors
    ember.config.suppress_errors = False
    try:
        out = ember.compile(fn, backend=backend)(x)
        out.backward()
    finally:
        ember.config.suppress_errors = old
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_grad)
