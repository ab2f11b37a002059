"""A Python scalar type passed where torch takes a dtype (transformers 5.25's mamba:
``torch.tensor(0, dtype=int)``) is captured as that dtype. Before, the class went into the fx
graph as is, fx generated ``dtype = <class 'int'>`` (a SyntaxError) and the frame ran eagerly."""

from __future__ import annotations

import pytest
import torch

import ember


@pytest.mark.parametrize("make", [
    lambda x: x + torch.tensor(0, dtype=int),
    lambda x: x.to(float) * 2,
    lambda x: torch.zeros(3, dtype=bool) | (x > 0),
    lambda x: torch.full((3,), 2, dtype=float) + x,
    lambda x: torch.ones(3, dtype=complex) * x,
], ids=["tensor_int", "to_float", "zeros_bool", "full_float", "ones_complex"])
def test_python_type_as_dtype(make) -> None:
    ember.reset()
    ember.events.counters["stats"].clear()
    x = torch.randn(3)
    with ember.config.patch(suppress_errors=False, persist_capture=False):  # trace it here
        out = ember.compile(make, backend="eager")(x)
    ref = make(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref)
    stats = ember.events.counters["stats"]
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] == 1
