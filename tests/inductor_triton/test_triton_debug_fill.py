"""The NaN-fill debug mode (option ``debug_fill``) on the Triton target: the wrapper of a GPU
graph allocates with ``device=``, which runtime/debug_fill.py's ``empty`` takes."""

from __future__ import annotations

import pytest
import torch

import ember
from ember_inductor.runtime import debug_fill

from triton_util import DEVICE, assert_same


_DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_empty_honours_the_device(device):
    t = debug_fill.empty((2, 3), (1, 2), dtype=torch.float32, device=device)
    assert t.device.type == device and t.stride() == (1, 2)
    if device != "meta":
        assert t.view(torch.int32).eq(debug_fill.PATTERNS[torch.float32][1]).all()
    assert debug_fill.empty((4,), (1,), dtype=torch.int64).device.type == "cpu"


def test_debug_fill_through_the_triton_target():
    def f(x, w):
        return torch.softmax(torch.relu(x @ w) * 2, -1).sum(0), x.t() + 1

    x = torch.randn(8, 16, device=DEVICE)
    w = torch.randn(16, 12, device=DEVICE)
    opts = {"debug_fill": True} | ({"cpu_codegen": "triton"} if DEVICE == "cpu" else {})
    cf = ember.compile(f, backend="inductor", options=opts)
    with ember.config.patch(suppress_errors=False):
        got = cf(x, w)
    assert_same(got, f(x, w))
