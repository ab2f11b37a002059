"""A traced ``view`` must not fail when a kernel's real output strides differ from its meta
kernel's (found on Hugging Face's doge in training: ``softplus_backward`` of a transposed
gradient is contiguous under FakeTensor and keeps the gradient's layout in eager, so the
backward's ``view`` of it raised). torch.compile(backend="aot_eager") raises the same error."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ember


def _softplus_then_transpose(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h = F.softplus((x @ w).view(2, 8, 2)).transpose(-1, -2)
    return (h * y).sum()


def test_meta_and_real_strides_differ() -> None:
    # the premise: if torch fixes the meta kernel this test still passes, but no longer covers it
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.randn(2, 2, 8).transpose(1, 2)
    x = torch.randn(2, 8, 2)
    real = torch.ops.aten.softplus_backward(g, x, 1, 20).stride()
    with FakeTensorMode() as mode:
        fake = torch.ops.aten.softplus_backward(mode.from_tensor(g), mode.from_tensor(x), 1,
                                                20).stride()
    assert real == g.stride()
    assert fake in (real, (16, 2, 1))


def test_backward_view_of_a_kernel_with_wrong_meta_strides() -> None:
    x, y = torch.randn(16, 32), torch.randn(2, 2, 8)
    w = torch.randn(32, 2, requires_grad=True)
    ref = _softplus_then_transpose(x, w, y)
    ref.backward()
    ref_grad, w.grad = w.grad, None
    old = ember.config.suppress_errors
    ember.config.suppress_errors = False  # a fallback to eager would hide the failure
    try:
        ember.reset()
        out = ember.compile(_softplus_then_transpose, backend="aot_eager")(x, w, y)
        out.backward()
    finally:
        ember.config.suppress_errors = old
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w.grad, ref_grad)
    assert ember.events.counters["stats"]["graphs"] == 1
