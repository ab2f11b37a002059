"""The AOT cache on CUDA graphs (ember/aot/cache.py): rebuilt values on a GPU are ``DeviceVal``
stand-ins (geometry and device, no memory, no FakeTensorMode), the key names the GPU and the flags
that steer tracing, and the inductor plugin compiles from such values as from tracing's.

The GPU itself is exercised by scripts/gpu_session.sh (warm start in a fresh process); here the
stand-ins are checked on a CPU-only machine: CUDA values are made with FakeTensors, and the
plugin is run on CPU graphs whose values are rebuilt as ``DeviceVal`` on the CPU."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch import nn

import ember
from ember.aot import cache

from test_inductor_models import Attention, Block, ConvBN


pytestmark = pytest.mark.usefixtures("fresh_aot_cache")  # tests/conftest.py


def test_device_val_has_the_geometry_and_keeps_its_device_through_ops() -> None:
    v = cache._device_val([4, 8], [8, 1], 0, torch.bfloat16, "cuda:0")
    assert isinstance(v, cache.DeviceVal) and isinstance(v, torch.Tensor)
    assert (tuple(v.shape), v.stride(), v.dtype, v.device) == \
        ((4, 8), (8, 1), torch.bfloat16, torch.device("cuda", 0))
    assert v.untyped_storage().device.type == "meta"  # no GPU memory taken
    w = v[:, 2:].t()
    assert isinstance(w, cache.DeviceVal) and w.device == v.device
    assert (tuple(w.shape), w.stride(), w.storage_offset()) == ((6, 4), (1, 8), 2)
    s = (v.float() + 1).sum(0)
    assert s.device == v.device and s.dtype == torch.float32 and tuple(s.shape) == (8,)
    off = cache._device_val([3], [2], 5, torch.float32, "cuda:1")
    assert (off.storage_offset(), off.stride(), off.device) == (5, (2,), torch.device("cuda", 1))
    assert "cuda:1" in repr(off)


def _cuda_graph() -> fx.GraphModule:
    """A functional ATen graph whose values are CUDA FakeTensors (what tracing a CUDA program
    puts in ``meta["val"]``), made without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    g = fx.Graph()
    with FakeTensorMode(allow_non_fake_inputs=True):
        xv = torch.empty(4, 8, dtype=torch.bfloat16, device="cuda")
        wv = torch.empty(8, 3, dtype=torch.bfloat16, device="cuda")
        mmv = xv @ wv
        vals = [xv, wv, mmv, mmv.t(), mmv.max(1), mmv.max(1)[0]]
    x, w = g.placeholder("x"), g.placeholder("w")
    mm = g.call_function(aten.mm.default, (x, w))
    t = g.call_function(aten.t.default, (mm,))
    mx = g.call_function(aten.max.dim, (mm, 1))
    i0 = g.call_function(operator.getitem, (mx, 0))
    g.output((t, i0))
    for n, v in zip((x, w, mm, t, mx, i0), vals, strict=True):
        n.meta["val"] = v
    gm = fx.GraphModule(nn.Module(), g)
    return gm


def test_a_cuda_graph_round_trips_with_device_vals() -> None:
    gm = _cuda_graph()
    data = cache.dumps_graph(gm)
    back = cache.loads_graph(data)
    assert cache._same_graph(back, gm)
    for a, b in zip(gm.graph.nodes, back.graph.nodes):
        if isinstance(a.meta.get("val"), torch.Tensor):
            va, vb = a.meta["val"], b.meta["val"]
            assert isinstance(vb, cache.DeviceVal)
            assert (tuple(vb.shape), vb.stride(), vb.storage_offset(), vb.dtype, vb.device) == \
                (tuple(va.shape), va.stride(), va.storage_offset(), va.dtype, va.device)
    # a CPU value keeps the old record (entries written before this format stay valid)
    assert cache._enc_val(torch.empty(2, 3)) == {"T": [[2, 3], [3, 1], 0, "float32"]}
    # a device the cache does not rebuild is refused, not guessed
    with pytest.raises(ValueError, match="not a device"):
        cache._dec_val({"T": [[2], [1], 0, "float32", "meta"]})


def test_the_key_names_the_gpu_and_the_flags_tracing_reads(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    cpu_args = [torch.empty(2)]
    assert cache._cuda_text(["call_function add aten.add"], cpu_args) == ""
    cuda_args = [cache._device_val([2], [1], 0, torch.float32, "cuda:0")]
    # no usable GPU: a CUDA graph is traced as before, never keyed without the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(cache.Uncacheable, match="CUDA"):
        cache._cuda_text([], cuda_args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    texts = set()
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0, n=name: n)
        texts.add(cache._cuda_text([], cuda_args))
        # a graph that makes CUDA tensors from CPU inputs is keyed the same way
        assert cache._cuda_text(["call_function zeros device=cuda"], cpu_args) == \
            cache._cuda_text([], cuda_args)
    monkeypatch.setattr(torch.backends.cuda, "flash_sdp_enabled", lambda: False)
    texts.add(cache._cuda_text([], cuda_args))
    assert len(texts) == 3 and all(t for t in texts)


def _stand_in_vals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rebuild CPU values as DeviceVal on the CPU: what a CUDA hit gives the plugin."""
    monkeypatch.setattr(cache, "_tensor_like", lambda shape, stride, offset, dt:
                        cache._device_val(shape, stride, offset, dt, "cpu"))


def _close(a: Any, b: Any) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make,shape", [(Block, (4, 16)), (ConvBN, (2, 3, 8, 8)),
                                        (Attention, (2, 5, 16))],
                         ids=["block", "conv_bn", "attention"])
def test_inductor_compiles_from_device_vals(make: Any, shape: tuple[int, ...],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in_vals(monkeypatch)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))

    def model() -> nn.Module:
        torch.manual_seed(0)
        return make()

    for i in range(2):  # the first traces and stores, the second rebuilds from the cache
        with torch.no_grad():
            ref = model().eval()(x)
            _close(ember.compile(model().eval(), backend="inductor")(x), ref)
        m, r = model(), model()
        ember.compile(m, backend="inductor")(x).square().sum().backward()
        r(x).square().sum().backward()
        for p, q in zip(m.parameters(), r.parameters(), strict=True):
            _close(p.grad, q.grad)
        assert cache.counters["hits"] == 2 * i and cache.counters["misses"] == 2
