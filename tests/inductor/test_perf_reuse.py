"""Buffer reuse in the wrapper (scheduler.plan_buffer_reuse): a buffer a C++ kernel writes takes
over the storage of a dead buffer of the same dtype and extent, never one that is still visible
(an output, an input, a view an ATen call returned), and results stay those of eager."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
import ember_inductor.compile_fx as compile_fx


@pytest.fixture
def sources(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    seen: list[str] = []
    orig = compile_fx.load_wrapper

    def spy(src, gm, key):
        seen.append(src)
        return orig(src, gm, key)

    monkeypatch.setattr(compile_fx, "load_wrapper", spy)
    yield seen
    ember.reset()


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mid = None
        for i, fc in enumerate(self.fcs):
            x = torch.tanh(fc(x)) * 2.0 + x
            if i == 1:
                mid = x
        return x, mid  # mid is an output: its storage must never be reused


def test_reuse_in_inference_and_training(sources):
    torch.manual_seed(0)
    m = Chain()
    ref = copy.deepcopy(m)
    x = torch.randn(16, 32)
    compiled = ember.compile(m, backend="inductor", options={"freezing": False})
    with torch.no_grad():
        out, mid = compiled(x)
        rout, rmid = ref(x)
    torch.testing.assert_close(out, rout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mid, rmid, rtol=1e-5, atol=1e-5)
    assert any("# reuse" in s for s in sources), "no buffer was reused"
    # training: forward and backward graphs with reuse give eager's gradients
    xg = torch.randn(16, 32, requires_grad=True)
    a, b = compiled(xg)
    (a.sum() + b.pow(2).sum()).backward()
    xr = xg.detach().clone().requires_grad_(True)
    ra, rb = ref(xr)
    (ra.sum() + rb.pow(2).sum()).backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    # outputs of one call are not overwritten by the next
    with torch.no_grad():
        o1, m1 = compiled(x)
        keep = (o1.clone(), m1.clone())
        compiled(x * 3)
    torch.testing.assert_close(o1, keep[0])
    torch.testing.assert_close(m1, keep[1])


def test_plan_never_reuses_aliased_or_kept():
    from ember_inductor.ir import Buffer, ExternKernel, Layout
    from ember_inductor.scheduler import CppRegion, plan_buffer_reuse

    def lay():
        return Layout((8,), (1,), torch.float32, torch.device("cpu"))

    bufs = {n: Buffer(n, lay()) for n in ("a", "b", "c", "d")}
    r0 = CppRegion("k0", [], reads=[], writes=["a"])
    r1 = CppRegion("k1", [], reads=["a"], writes=["b"])
    r2 = CppRegion("k2", [], reads=["b"], writes=["c"])
    r3 = CppRegion("k3", [], reads=["c"], writes=["d"])
    last = {"a": 1, "b": 2, "c": 3, "d": 3}
    reuse, held = plan_buffer_reuse([r0, r1, r2, r3], bufs, last, keep={"d"})
    assert reuse == {"c": "a"}  # d is kept (an output): it never takes a dead buffer's storage
    assert held == {"a"}
    reuse, held = plan_buffer_reuse([r0, r1, r2, r3], bufs, last, keep=set())
    assert reuse == {"c": "a", "d": "b"}
    # a buffer read by an ATen call whose result aliases it (a view) is never a donor
    v = ExternKernel("v", lay(), torch.ops.aten.t.default, [bufs["a"]], {}, "fallback", [])
    bufs["v"] = v
    last2 = {"a": 2, "v": 4, "b": 3, "c": 4, "d": 4}
    reuse2, _ = plan_buffer_reuse([r0, v, r1, r2, r3], bufs, last2, keep=set())
    assert "a" not in reuse2.values() and "v" not in reuse2.values()
