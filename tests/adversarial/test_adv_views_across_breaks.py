"""Views that cross a graph break, and writes into memory another operand reads.

1. A graph output that is a view of another output (``y[1:]`` and ``y``) was regenerated as a
   view only when its base came *earlier* in the graph's outputs; otherwise inductor returned
   it as a buffer of its own, and a write through it after a graph break never reached ``y``
   (``bump(y[1:]); return y`` returned ``y`` unchanged). Outputs that share elements with no
   output holding both (``y[1:]``, ``y[:-1]`` of an intermediate) cannot be regenerated: the
   graph runs eagerly.
2. An op that writes a tensor overlapping another operand (``y[1:].add_(y[:-1])``) or itself
   (an expanded tensor) raises in eager, or, when eager cannot tell (non-contiguous views),
   computes element by element in memory order. A graph reads every operand before writing
   (functionalized), so such a call runs eagerly: eager's error, or eager's values."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import events

BACKENDS = ["eager", "aot_eager", "inductor"]


@ember.disable
def bump(t):
    t.add_(1)


def view_then_base(x):
    y = x * 1
    bump(y[1:])
    return y


def named_view_then_base(x):
    y = x * 1
    z = y[1:]
    bump(z)
    return z.sum(), y


def overlapping_views(x):
    y = x * 1
    a, b = y[1:], y[:-1]
    bump(a)
    return b


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [view_then_base, named_view_then_base, overlapping_views])
def test_a_write_through_a_view_after_a_break_reaches_its_base(backend, fn):
    x = torch.zeros(5, 3)
    ember.reset()
    got = ember.compile(fn, backend=backend)(x)
    want = fn(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gradients_through_a_view_output_returned_before_its_base(backend):
    def f(x):
        y = x * 2
        a = y[1:]
        bump_log()
        return (a * 3).sum() + (y * y).sum()

    calls = []

    @ember.disable
    def bump_log():
        calls.append(1)

    x = torch.randn(4, 3, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ember.reset()
    ember.compile(f, backend=backend)(x).backward()
    f(x2).backward()
    torch.testing.assert_close(x.grad, x2.grad)


def _partial_add(x):
    y = x * 1
    y[1:].add_(y[:-1])
    return y


def _partial_copy(x):
    y = x * 1
    y[1:].copy_(y[:-1])
    return y


def _expanded_write(x):
    y = (x * 1)[:1].expand(4, 8)
    y.add_(1)
    return y


def _memory_order(x):
    y = x.t() * 1  # not contiguous: eager cannot tell the overlap and adds in memory order
    y[1:].add_(y[:-1])
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_partial_add, _partial_copy, _expanded_write])
def test_an_overlapping_write_raises_eagers_error(backend, fn):
    x = torch.arange(64.).reshape(8, 8)
    with pytest.raises(RuntimeError) as want:
        fn(x.clone())
    ember.reset()
    with pytest.raises(RuntimeError) as got:
        ember.compile(fn, backend=backend)(x.clone())
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_overlapping_write_eager_allows_gives_eagers_values(backend):
    x = torch.arange(64.).reshape(8, 8)
    ember.reset()
    got = ember.compile(_memory_order, backend=backend)(x.clone())
    torch.testing.assert_close(got, _memory_order(x.clone()), rtol=0, atol=0)


def test_views_that_share_no_element_stay_in_the_graph():
    def f(boxes):
        b = boxes * 1
        b[:, 2].sub_(b[:, 0])
        b[:, 3].sub_(b[:, 1])
        return b

    boxes = torch.rand(6, 4) * 10
    ember.reset()
    got = ember.compile(f, backend="inductor")(boxes)
    torch.testing.assert_close(got, f(boxes))
    assert sum(events.counters["graph_breaks"].values()) == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_view_output_of_a_training_graph_can_be_written_in_place(backend):
    # ``return h.view(-1)`` then ``out.div_(t)``: eager allows the write; a view returned by an
    # autograd Function may not be written in place ("Output 0 of CompiledFunction is a view
    # and is being modified inplace")
    def f(x):
        return (x * 2).view(-1)

    x = torch.ones(4, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ember.reset()
    out = ember.compile(f, backend=backend)(x)
    out.div_(4)
    out.sum().backward()
    want = f(x2)
    want.div_(4)
    want.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_write_after_a_break_into_a_view_of_a_training_intermediate(backend):
    @ember.disable
    def scale(t):
        t.mul_(3)

    def f(x):
        y = x * 1
        scale(y.view(-1))
        return y

    x = torch.ones(4, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ember.reset()
    got = ember.compile(f, backend=backend)(x)
    (got * torch.arange(16.).view(4, 4)).sum().backward()
    want = f(x2)
    (want * torch.arange(16.).view(4, 4)).sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [view_then_base, named_view_then_base])
def test_view_outputs_stay_views_with_symbolic_sizes(backend, fn):
    ember.reset()
    compiled = ember.compile(fn, backend=backend, dynamic=True)
    for n in (5, 7):
        x = torch.zeros(n, 3)
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)


def test_column_splits_crossing_a_break_stay_compiled():
    # q, k, v of one projection share a storage and interleave, but share no element: each is
    # its own graph output (no fallback), and a write into one changes no other
    def f(x):
        q, k, v = (x * 1).split(4, dim=-1)  # their base is no output
        bump(q)
        return q + k * v

    x = torch.randn(3, 12)
    ember.reset()
    got = ember.compile(f, backend="inductor")(x)
    torch.testing.assert_close(got, f(x))
    assert events.counters["stats"]["fallbacks"] == 0
