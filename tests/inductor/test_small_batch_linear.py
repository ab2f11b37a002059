"""Small-batch linear layers (batch-1 / few-row inference): the matrix multiply kernel that
timing picks (patterns.onednn_chosen, under a fake timer here) is the one used, and either gives
eager's results."""

from __future__ import annotations

import pytest
import torch

from ember_inductor import patterns

from inductor_util import assert_same
from test_pattern_linear import LINEAR, _compile, fake_timings

pytestmark = pytest.mark.skipif(patterns.linear_op() is None, reason="torch built without oneDNN")


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("winner", ["aten", "onednn"])
def test_small_m_follows_the_timing(m, winner, monkeypatch, tmp_path) -> None:
    asked = fake_timings(monkeypatch, tmp_path, winner)
    g = torch.Generator().manual_seed(2)
    k, n = 1024, 1024
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5,
               torch.randn(n, generator=g))

    def fn(x, w, b):
        return (torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)),)

    src, call = _compile(fn, (x, w, b))
    assert asked == [["aten", "onednn"]]
    assert (LINEAR in src) == (winner == "onednn"), src
    assert_same(call(x, w, b), fn(x, w, b))


def test_linear_layer_addmm_is_written_as_linear() -> None:
    """addmm(bias, x, W.t()) on a graph input W is one ``linear`` call in the wrapper (ATen's
    linear runs that very addmm), with or without ``out=``; a weight that is not a transposed
    input (``x @ c + b`` with ``c`` already [K, N]) stays an addmm."""
    g = torch.Generator().manual_seed(3)
    x, w1, b1, w2, b2, c = (torch.randn(2, 16, generator=g), torch.randn(32, 16, generator=g),
                            torch.randn(32, generator=g), torch.randn(16, 32, generator=g),
                            torch.randn(16, generator=g), torch.randn(16, 16, generator=g))

    def fn(x, w1, b1, w2, b2, c):
        F = torch.nn.functional
        h = F.linear(F.linear(x, w1, b1).relu(), w2, b2)
        h2 = F.linear(F.linear(h, w1, b1).relu(), w2, b2)   # reuses dead buffers: out=
        return (torch.addmm(b2, h2, c),)

    args = (x, w1, b1, w2, b2, c)
    src, call = _compile(fn, args, onednn_linear=False)
    body = src.split("\ndef call(", 1)[1]
    assert body.count("torch._C._nn.linear(") == 4, body
    assert len([ln for ln in body.splitlines() if "linear(" in ln and "out=" in ln]) == 2, body
    assert "addmm.default(" in body or "addmm.out(" in body, body
    for _ in range(2):
        out = call(*args)
        assert torch.equal(out[0], fn(*args)[0])  # the same kernel: bitwise eager
