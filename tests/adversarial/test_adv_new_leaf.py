"""A tensor made inside the compiled region that requires grad and has no history is a leaf of
autograd in eager (it collects its own ``.grad``): a graph cannot return one (its outputs have a
history, or none when no input requires grad), so the frame runs eagerly there. Found by the
adversarial guard probe: ``torch.zeros(3, requires_grad=True)`` came back not requiring grad."""

from __future__ import annotations

import pytest
import torch

import ember


def made_with_flag(x):
    w = torch.zeros(3, requires_grad=True)
    return x + w, w


def made_then_flagged(x):
    w = x.detach() * 2
    w.requires_grad_()
    return (x * w).sum(), w


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("x_requires_grad", [False, True])
@pytest.mark.parametrize("fn", [made_with_flag, made_then_flagged], ids=lambda f: f.__name__)
def test_a_leaf_made_inside_collects_its_gradient_as_in_eager(fn, x_requires_grad, backend):
    xe = torch.arange(3.0, requires_grad=x_requires_grad)
    xc = xe.detach().clone().requires_grad_(x_requires_grad)
    oe, we = fn(xe)
    oc, wc = ember.compile(fn, backend=backend)(xc)
    assert (wc.requires_grad, wc.is_leaf) == (we.requires_grad, we.is_leaf)
    assert oc.requires_grad == oe.requires_grad
    oe.sum().backward()
    oc.sum().backward()
    torch.testing.assert_close(wc.grad, we.grad)
    if x_requires_grad:
        torch.testing.assert_close(xc.grad, xe.grad)


def test_a_call_returning_its_leaf_argument_stays_in_the_graph():
    """``x.contiguous()`` of a leaf input returns the input itself: nothing new, no break."""
    def f(x):
        return x.contiguous() * 2

    ember.reset()
    x = torch.ones(3, requires_grad=True)
    out = ember.compile(f, backend="aot_eager")(x)
    assert out.grad_fn is not None
    assert ember.last_capture().break_reason is None


def test_views_of_parameters_under_no_grad_stay_in_the_graph():
    """Under ``no_grad`` a view of a parameter (``weight.T``, ``weight[0]``) is a leaf that
    requires grad in eager as well: it is its base's view, nothing new (Falcon's and DeBERTa's
    forwards read ``self.weight.T``)."""
    lin = torch.nn.Linear(3, 4)

    def f(x):
        return x @ lin.weight.T + lin.weight[0].sum()

    ember.reset()
    x = torch.randn(2, 3)
    with torch.no_grad():
        got = ember.compile(f, backend="aot_eager")(x)
        want = f(x)
    torch.testing.assert_close(got, want)
    assert ember.last_capture().break_reason is None
