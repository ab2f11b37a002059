"""numpy functions of constants fold to constants (found on Hugging Face's pegasus_x: its
sinusoidal positions scale by ``np.log(float(self.max_scale))``, and each numpy call and each
numpy scalar operation was a graph break: 9 graphs where torch.compile has 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember


@pytest.fixture(autouse=True)
def _raise_errors():
    with ember.config.patch(suppress_errors=False):
        ember.reset()
        yield
    ember.reset()


def _positions(x: torch.Tensor, max_scale: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1] // 2
    div = torch.exp(torch.arange(d).type_as(x) * -(np.log(float(max_scale)) / (d - 1)))
    return div * x[..., :d] + np.sqrt(2.0) + np.prod([2, 3])


def test_ufuncs_and_functions_of_constants_are_one_graph() -> None:
    x = torch.randn(4, 8)
    torch.testing.assert_close(ember.compile(_positions, backend="eager")(x), _positions(x))
    c = ember.events.counters
    assert c["stats"]["graphs"] == 1 and sum(c["graph_breaks"].values()) == 0, dict(c["graph_breaks"])


def test_a_changed_argument_recompiles() -> None:
    def f(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * np.log(scale)

    cf = ember.compile(f, backend="eager")
    x = torch.randn(4)
    for s in (10.0, 100.0):
        torch.testing.assert_close(cf(x, s), f(x, s))


def test_random_and_arrays_are_not_folded() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * float(np.random.rand()) + float(np.ones(2).sum())

    cf = ember.compile(f, backend="eager")
    x = torch.randn(4)
    a, b = cf(x), cf(x)
    assert not torch.equal(a, b)  # np.random.rand ran on each call
