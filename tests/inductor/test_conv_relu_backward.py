"""The compare-and-select loops of ReLU's backward and BatchNorm's (``where(x <= 0, 0, g)``),
built with ``-fno-trapping-math`` so that they vectorize, give eager's values bit for bit: NaN,
infinities and signed zeros included."""

from __future__ import annotations

import pytest
import torch

import ember


@pytest.fixture(autouse=True)
def _strict():
    """A graph that fails to compile raises (never a silent eager fallback)."""
    with ember.config.patch(suppress_errors=False):
        yield


def _special(n: int) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(n)
    x[::7] = 0.0
    x[1::7] = -0.0
    x[2::11] = float("nan")
    x[3::13] = float("inf")
    x[4::13] = -float("inf")
    x[5::17] = 1e-40  # subnormal
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)) if a.dtype == torch.float32 \
        else torch.equal(a, b)


def test_relu_backward_select_matches_eager_bitwise() -> None:
    def f(x: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sel = torch.where(x <= 0, torch.zeros_like(g), g + y)
        return sel, sel.sum(0), torch.where(x > 0, x / g, -x * g)

    x, g, y = _special(4096).view(64, 64), _special(4096).flip(0).view(64, 64), \
        torch.randn(64, 64)
    got = ember.compile(f, backend="inductor")(x, g, y)
    want = f(x, g, y)
    _same_bits(got[0], want[0])
    _same_bits(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], equal_nan=True)


def test_conv_relu_training_gradients_with_nonfinite_upstream() -> None:
    """A conv-bn-relu training step whose upstream gradient holds inf and -0.0: the input
    gradient's non-finite pattern is eager's."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU())
    ref = __import__("copy").deepcopy(m)
    f = ember.compile(m, backend="inductor")
    x1 = torch.randn(2, 3, 6, 6, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    gy = torch.randn(2, 8, 6, 6)
    gy[0, 0, 0, 0] = -0.0
    out1, out2 = f(x1), ref(x2)
    torch.testing.assert_close(out1, out2, rtol=1e-4, atol=1e-5)
    assert out1.stride() == out2.stride()
    out1.backward(gy)
    out2.backward(gy)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-5)
    assert x1.grad.stride() == x2.grad.stride()
    for p1, p2 in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-4)
        assert p1.grad.stride() == p2.grad.stride()
