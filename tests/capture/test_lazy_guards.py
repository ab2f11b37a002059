"""Constants read from outside are guarded lazily: only when tracing looks at them. These tests
pin down both halves: a constant that is only forwarded does not recompile, and every way of
looking at one does guard it (a stale answer would be a wrong result)."""

from __future__ import annotations

import torch

import ember


def _count() -> int:
    return ember.events.counters["stats"]["recompiles"]


def test_forwarded_constant_does_not_recompile() -> None:
    def f(x, tag):
        return x + 1, tag

    ember.reset()
    cf = ember.compile(f, backend="eager")
    x = torch.zeros(2)
    for tag in ("a", "b", 3, None):
        out, t = cf(x, tag)
        assert t == tag
        torch.testing.assert_close(out, x + 1)
    assert _count() == 0


def test_constant_compared_with_a_list_is_guarded() -> None:
    def f(x, a):
        if a == [1, 2]:
            return x + 1
        return x - 1

    ember.reset()
    cf = ember.compile(f, backend="eager")
    x = torch.zeros(2)
    for a in (3, [1, 2], 3, [2, 1]):
        torch.testing.assert_close(cf(x, a), f(x, a))


def test_constant_used_in_arithmetic_and_branches_is_guarded() -> None:
    def f(x, k, flag):
        y = x * k
        if flag:
            y = y + 1
        return y

    ember.reset()
    cf = ember.compile(f, backend="eager")
    x = torch.ones(3)
    for k, flag in ((2, True), (3, True), (3, False), (2.5, None)):
        torch.testing.assert_close(cf(x, k, flag), f(x, k, flag))
    assert _count() == 3


def test_none_then_tensor_argument() -> None:
    def f(x, mask=None):
        if mask is not None:
            x = x * mask
        return x + 1

    ember.reset()
    cf = ember.compile(f, backend="eager")
    x = torch.ones(3)
    m = torch.tensor([0.0, 1.0, 2.0])
    torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x, m), f(x, m))
    torch.testing.assert_close(cf(x), f(x))


def test_identity_test_against_a_constant_is_guarded() -> None:
    def f(x, y):
        if x is y:
            return x * 2
        return x + 1

    ember.reset()
    cf = ember.compile(f, backend="eager")
    x = torch.full((2,), 3.0)  # x * 2 != x + 1
    for y in (3, x, 3, torch.zeros(2)):
        torch.testing.assert_close(cf(x, y), f(x, y))
