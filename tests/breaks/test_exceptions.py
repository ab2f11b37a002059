"""Exceptions raised and caught inside traced code are traced (the frames' exception tables
route them to the program's own ``except``), not a reason to run the frame eagerly; one nothing
catches is still a graph break at the root instruction, and the user sees the real exception."""

from __future__ import annotations

import collections.abc

import pytest
import torch

import ember
import ember.events


class _Registry(collections.abc.Mapping):
    def __init__(self) -> None:
        self._m = {"sin": torch.sin}

    def __getitem__(self, k):
        return self._m[k]

    def __iter__(self):
        return iter(self._m)

    def __len__(self) -> int:
        return len(self._m)


REG = _Registry()


def _run(fn, *args):
    ember.reset()
    out = ember.compile(fn, backend="eager")(*args)
    return out, dict(ember.events.counters["stats"]), sum(
        ember.events.counters["graph_breaks"].values())


def test_mapping_get_missing_key_in_one_graph() -> None:
    def f(x):
        return REG.get("eager", torch.cos)(x) + REG.get("sin")(x)

    x = torch.randn(4)
    out, stats, breaks = _run(f, x)
    torch.testing.assert_close(out, f(x))
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] == 1 and breaks == 0, stats


def test_try_except_keyerror_stopiteration_and_raise() -> None:
    def f(x, d):
        try:
            y = d["missing"]
        except KeyError as e:
            y = len(e.args)
        it = iter([1])
        next(it)
        try:
            next(it)
        except StopIteration:
            y += 10
        try:
            raise ValueError("boom")
        except (TypeError, ValueError) as e:
            y += len(str(e))
        try:
            try:
                [][3]
            except KeyError:
                y = -1000  # not taken: IndexError is not a KeyError
        except IndexError:
            y += 100
        return x * y

    x = torch.randn(4)
    out, stats, breaks = _run(f, x, {"a": 1})
    torch.testing.assert_close(out, f(x, {"a": 1}))
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] == 1 and breaks == 0, stats


def test_exception_propagates_through_inlined_frames() -> None:
    def inner(d):
        return d["k"]

    def middle(d):
        return inner(d) + 1

    def f(x, d):
        try:
            return x * middle(d)
        except KeyError:
            return x - 1

    x = torch.randn(3)
    for d in ({}, {"k": 2}):
        ember.reset()
        out = ember.compile(f, backend="eager")(x, d)
        torch.testing.assert_close(out, f(x, d))
        assert ember.events.counters["stats"].get("fallbacks", 0) == 0


def test_uncaught_exception_reaches_the_user() -> None:
    def f(x, d):
        y = x + 1
        return y * d["missing"]

    with pytest.raises(KeyError):
        ember.reset()
        ember.compile(f, backend="eager")(torch.randn(2), {})


def test_reraise_and_finally() -> None:
    def f(x, d):
        n = 0
        try:
            try:
                d["nope"]
            finally:
                n += 1
        except KeyError:
            n += 2
        try:
            try:
                d["nope"]
            except KeyError:
                raise
        except KeyError:
            n += 4
        return x + n

    x = torch.randn(3)
    out, stats, _ = _run(f, x, {})
    torch.testing.assert_close(out, f(x, {}))
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] == 1, stats
