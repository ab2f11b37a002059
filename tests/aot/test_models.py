"""Zoo models in training mode through AOT autograd (aot_eager): one SGD step's gradients equal
eager's, a 20-step loop tracks eager's losses, BatchNorm running statistics follow eager, and the
memory saved for backward is no larger than eager's."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import ember
from ember import events
from benchmarks.zoo import MLP, SmallResNet, TransformerBlock

from aot_util import assert_close, compile_module


class _CountingBackend:
    """aot_eager, counting the ATen graphs it is handed (proves the AOT path really ran)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        base = ember.get_backend("aot_eager")
        self.backend = dataclasses.replace(base, name="aot_eager_counting", compile=self._compile)
        self._inner = base.compile

    def _compile(self, gm, example_inputs, **options):
        self.graphs.append(gm)
        return self._inner(gm, example_inputs, **options)


def _models():
    torch.manual_seed(0)
    return {
        "mlp": (MLP(d=32, blocks=2), lambda: torch.randn(8, 32)),
        "transformer_block": (TransformerBlock(d=32, heads=4), lambda: torch.randn(2, 8, 32)),
        "convnet_bn": (SmallResNet(width=8), lambda: torch.randn(2, 3, 12, 12)),
    }


def _loss(out):
    out = out[0] if isinstance(out, (tuple, list)) else out
    return (out.float() ** 2).mean()


def _sgd_step(model, x, opt):
    opt.zero_grad(set_to_none=True)
    loss = _loss(model(x))
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("name", ["mlp", "transformer_block", "convnet_bn"])
def test_one_sgd_step_matches_eager(name):
    model, make_x = _models()[name]
    model.train()
    ref = copy.deepcopy(model)
    counting = _CountingBackend()
    compiled = ember.compile(model, backend=counting.backend)
    x = make_x()
    lr = 0.05
    opt_e = torch.optim.SGD(ref.parameters(), lr=lr)
    opt_c = torch.optim.SGD(model.parameters(), lr=lr)
    le = _sgd_step(ref, x, opt_e)
    lc = _sgd_step(compiled, x, opt_c)
    assert len(counting.graphs) >= 2, "expected AOT forward and backward graphs"
    assert_close(lc, le, rtol=1e-5, atol=1e-6)
    for (n, pe), (_, pc) in zip(ref.named_parameters(), model.named_parameters()):
        assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{n}: {m}")
        assert_close(pc, pe, rtol=1e-4, atol=1e-5)
    for (n, be), (_, bc) in zip(ref.named_buffers(), model.named_buffers()):
        assert_close(bc, be, rtol=1e-4, atol=1e-5, msg=lambda m: f"buffer {n}: {m}")


@pytest.mark.parametrize("name", ["mlp", "transformer_block", "convnet_bn"])
def test_twenty_step_loop_tracks_eager(name):
    model, make_x = _models()[name]
    model.train()
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="aot_eager")
    opt_e = torch.optim.SGD(ref.parameters(), lr=0.02, momentum=0.9)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    torch.manual_seed(1)
    xs = [make_x() for _ in range(4)]
    le, lc = [], []
    for step in range(20):
        x = xs[step % len(xs)]
        le.append(_sgd_step(ref, x, opt_e))
        lc.append(_sgd_step(compiled, x, opt_c))
    assert_close(torch.stack(lc), torch.stack(le), rtol=1e-3, atol=1e-5)
    assert le[-1] < le[0]  # the loop really trains


def test_batchnorm_eval_mode_after_training():
    model, make_x = _models()["convnet_bn"]
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="aot_eager")
    x = make_x()
    compiled(x).sum().backward()
    ref(x).sum().backward()
    model.eval(), ref.eval()
    with torch.no_grad():
        assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)
    for be, bc in zip(ref.buffers(), model.buffers()):
        assert_close(bc, be)


# -- saved-activation memory -----------------------------------------------------------------

def saved_bytes(fn) -> int:
    """Bytes of distinct storages saved for backward while running ``fn()``."""
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


@pytest.mark.parametrize("name", ["mlp", "transformer_block"])
def test_saved_memory_not_larger_than_eager(name):
    model, make_x = _models()[name]
    x = make_x()
    compiled = ember.compile(copy.deepcopy(model), backend="aot_eager")
    compiled(x)  # compile outside the measurement
    eager_bytes, _ = saved_bytes(lambda: model(x))
    ember_bytes, out = saved_bytes(lambda: compiled(x))
    assert out.requires_grad and out.grad_fn is not None
    assert 0 < ember_bytes <= eager_bytes, (ember_bytes, eager_bytes)


def test_saved_memory_lifted_mlp_direct_aot_compile():
    model, make_x = _models()["mlp"]
    x = make_x()
    call = compile_module(copy.deepcopy(model))
    call(x)
    eager_bytes, _ = saved_bytes(lambda: model(x))
    ember_bytes, out = saved_bytes(lambda: call(x))
    assert 0 < ember_bytes <= eager_bytes, (ember_bytes, eager_bytes)


def test_aot_timing_event_emitted():
    seen = []

    class Observer:
        @ember.hookimpl
        def ember_compile_event(self, event):
            if event.kind == "timing" and event.data.get("stage") == "aot":
                seen.append(event.data)

    obs = Observer()
    pm = ember.plugins.plugin_manager()
    pm.register(obs)
    try:
        model, make_x = _models()["mlp"]
        call = compile_module(model)
        call(make_x()).sum().backward()
    finally:
        pm.unregister(obs)
    assert seen and seen[0]["seconds"] > 0 and seen[0]["graph"] == "training"
