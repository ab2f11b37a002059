"""matmul over symbolic sizes keeps its sizes symbolic, on every torch version.

torch 2.11's C++ matmul kernel reads concrete sizes: run over capture's symbolic FakeTensors it
specialized the sequence length of a 4-d attention product (guard ``size(1) == N``, one graph per
length) and failed on 3-d @ 2-d (``Cannot call numel()``). Capture and AOT now run ops through
torch's Python decompositions under dynamic shapes. Each case compiles a static graph, then one
dynamic graph that serves every later length, with eager's results (values, shape and strides)."""

from __future__ import annotations

import pytest
import torch

import ember

from ._util import graphs, stats


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


_lin = torch.nn.Linear(16, 48)
_head = torch.nn.Linear(16, 24, bias=False)  # linear without bias calls matmul


def _attention(x):
    q, k, v = _lin(x).split(16, dim=2)
    shape = (*q.shape[:-1], -1, 4)
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    w = torch.matmul(q, k.transpose(-1, -2)).softmax(-1)
    return (w @ v).transpose(1, 2).reshape(x.shape)


def _three_by_two(x):
    return torch.matmul(x, _lin.weight.t())[..., :16] + x @ _lin.weight[:16].t()


def _head_no_bias(x):
    return _head(x).sum(-1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_attention, _three_by_two, _head_no_bias],
                         ids=["attention4d", "matmul3d2d", "linear_no_bias"])
def test_matmul_sizes_stay_symbolic(fn, backend):
    cf = ember.compile(fn, backend=backend)
    for n in (3, 4, 5, 7, 9):
        x = torch.randn(2, n, 16, requires_grad=backend == "aot_eager")
        want, got = fn(x), cf(x)
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and got.stride() == want.stride()
        if x.requires_grad:
            gw, = torch.autograd.grad(want.sum(), x)
            gg, = torch.autograd.grad(got.sum(), x)
            torch.testing.assert_close(gg, gw)
    assert graphs(cf) == 2, [c.guards for c in ember.captures(cf)]
    s = stats()
    assert s.get("recompiles", 0) == 1 and s.get("fallbacks", 0) == 0, s
