"""Custom ops whose Python backward cannot be traced (it reads tensor values and branches on
them, like transformers 5.17's grouped-matmul fallback): AOT autograd runs that backward as one
opaque op in the backward graph instead of running the whole frame eagerly."""

from __future__ import annotations

import logging

import pytest
import torch

import ember
import ember.events
from ember.aot.opaque import opaque_custom_backwards


def _grouped(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype)
    start = 0
    for i, end in enumerate(offs.tolist()):
        if start == end:
            continue
        torch.mm(input[start:end], weight[i], out=out[start:end])
        start = end
    return out


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _backward(ctx, grad):
    input, weight = ctx.saved_tensors
    gi, gw = torch.zeros_like(input), torch.zeros_like(weight)
    start = 0
    for i, end in enumerate(ctx.offs.tolist()):  # data-dependent: cannot be traced
        if start == end:
            continue
        gi[start:end] = grad[start:end] @ weight[i].T
        gw[i] = input[start:end].T @ grad[start:end]
        start = end
    return gi, gw, None


torch.library.custom_op("ember_test::grouped_mm", _grouped, mutates_args=(),
                        schema="(Tensor input, Tensor weight, Tensor offs) -> Tensor")
torch.library.register_fake(
    "ember_test::grouped_mm",
    lambda input, weight, offs: input.new_empty(input.size(0), weight.size(2)))
torch.library.register_autograd("ember_test::grouped_mm", _backward, setup_context=_setup)


def _scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


torch.library.custom_op("ember_test::scaled", _scaled, mutates_args=(),
                        schema="(Tensor x, float s) -> Tensor")
torch.library.register_fake("ember_test::scaled", lambda x, s: torch.empty_like(x))
torch.library.register_autograd(
    "ember_test::scaled", lambda ctx, g: (g * ctx.s, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "s", inputs[1]))


def _mutating_backward(ctx, grad):
    (w,) = ctx.saved_tensors
    grad = grad.clone()
    ctx.scale.mul_(1.0)  # changes a tensor the forward saw, then reads a tensor value
    return grad * w * float(ctx.scale.sum().item()), None


def _scaled_by(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * scale.sum()


torch.library.custom_op("ember_test::scaled_by", _scaled_by, mutates_args=(),
                        schema="(Tensor x, Tensor scale) -> Tensor")
torch.library.register_fake("ember_test::scaled_by", lambda x, scale: torch.empty_like(x))


def _setup_scaled_by(ctx, inputs, output):
    ctx.save_for_backward(torch.ones_like(inputs[0]))
    ctx.scale = inputs[1]


torch.library.register_autograd("ember_test::scaled_by", _mutating_backward,
                                setup_context=_setup_scaled_by)


class MoE(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = torch.nn.Linear(6, 4)
        self.w = torch.nn.Parameter(torch.randn(4, 6, 5) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, expert = self.router(x).softmax(-1).max(-1)
        order = expert.argsort()
        counts = torch.histc(expert.float(), bins=4, min=0, max=3).long()
        offs = counts.cumsum(0)
        y = torch.ops.ember_test.grouped_mm(torch.sin(x[order]), self.w, offs)
        y = y * gate[order, None]
        return torch.ops.ember_test.scaled(y, 2.0).tanh().sum(0)


def _train(m: torch.nn.Module, fn, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    m.zero_grad(set_to_none=True)
    out = fn(x)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in m.parameters()]


def _assert_like_eager(m: torch.nn.Module, compiled, x: torch.Tensor) -> None:
    """One training step of ``compiled``: its output and every parameter's gradient equal
    eager's."""
    ref, ref_g = _train(m, m, x)
    out, g = _train(m, compiled, x)
    torch.testing.assert_close(out, ref)
    for a, b in zip(g, ref_g, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_untraceable_custom_backward_runs_opaque(backend: str, caplog, monkeypatch) -> None:
    monkeypatch.setattr(ember.config, "aot_cache", False)  # trace here (the log is checked)
    torch.manual_seed(0)
    m = MoE()
    compiled = ember.compile(m, backend=backend)
    ember.reset()
    with caplog.at_level(logging.INFO, logger="ember"):
        for seed in range(3):  # different routings: different offs each call
            x = torch.randn(9, 6, generator=torch.Generator().manual_seed(seed))
            _assert_like_eager(m, compiled, x)
    stats = ember.events.counters["stats"]
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0
    assert any("ember_test::grouped_mm cannot be traced" in r.getMessage()
               for r in caplog.records)
    # the traceable custom backward (scaled) was traced, not made opaque
    assert not any("ember_test::scaled cannot" in r.getMessage() for r in caplog.records)


def test_opaque_op_in_the_backward_graph() -> None:
    from ember.aot import aot_compile

    torch.manual_seed(0)
    w = torch.randn(3, 4, 2, requires_grad=True)
    x = torch.randn(7, 4, requires_grad=True)
    offs = torch.tensor([2, 2, 7])  # an empty group: the branch the backward takes

    class G(torch.nn.Module):
        def forward(self, x, w, offs):
            return (torch.ops.ember_test.grouped_mm(x, w, offs),)

    gm = torch.fx.symbolic_trace(G())
    fn = aot_compile(gm, [x, w, offs], backend=ember.get_backend("aot_eager"))
    (out,) = fn(x, w, offs)
    gx, gw = torch.autograd.grad(out.square().sum(), [x, w])
    ref = torch.ops.ember_test.grouped_mm(x, w, offs)
    rx, rw = torch.autograd.grad(ref.square().sum(), [x, w])
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)
    (v,) = fn._variants.values()
    bw_ops = {str(n.target) for n in v.partition.bw.graph.nodes if n.op == "call_function"}
    assert "ember.custom_op_backward.default" in bw_ops
    # with other offsets (other group sizes), the same compiled graphs give eager's gradients
    offs2 = torch.tensor([0, 5, 7])
    (out,) = fn(x, w, offs2)
    gx, gw = torch.autograd.grad(out.square().sum(), [x, w])
    ref = torch.ops.ember_test.grouped_mm(x, w, offs2)
    rx, rw = torch.autograd.grad(ref.square().sum(), [x, w])
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


def test_wrappers_call_through_outside_tracing() -> None:
    with opaque_custom_backwards():
        pass  # wraps every registered custom op's backward
    x = torch.randn(5, 4, requires_grad=True)
    w = torch.randn(2, 4, 3, requires_grad=True)
    out = torch.ops.ember_test.grouped_mm(x, w, torch.tensor([3, 5]))
    gx, = torch.autograd.grad(out.sum(), [x])
    ref = torch.cat([torch.ones(3, 3) @ w[0].T, torch.ones(2, 3) @ w[1].T])
    torch.testing.assert_close(gx, ref)


def test_opaque_backward_through_the_aot_cache(tmp_path, monkeypatch) -> None:
    """The opaque node is self-describing (op name, JSON layout): a warm start rebuilds it."""
    monkeypatch.setattr(ember.config, "aot_cache", True)
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))  # the variable wins over the config
    torch.manual_seed(0)
    m = MoE()
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(5))
    ref, ref_g = _train(m, m, x)
    from ember.aot import cache

    hits = cache.counters["hits"]
    for _ in range(2):  # cold, then warm (a fresh capture reads the stored AOT graphs)
        ember.reset()
        out, g = _train(m, ember.compile(m, backend="aot_eager"), x)
        torch.testing.assert_close(out, ref)
        for a, b in zip(g, ref_g):
            torch.testing.assert_close(a, b)
    assert cache.counters["hits"] == hits + 1, "the warm start did not read the stored graphs"


def test_opaque_backward_with_dynamic_sizes(monkeypatch) -> None:
    """Under dynamic shapes the opaque op's outputs carry the inputs' symbolic sizes: one graph
    serves every token count."""
    monkeypatch.setattr(ember.config, "aot_cache", False)
    torch.manual_seed(0)
    m = MoE()
    compiled = ember.compile(m, backend="aot_eager", dynamic=True)
    ember.reset()
    for n in (9, 11, 13):
        x = torch.randn(n, 6, generator=torch.Generator().manual_seed(n))
        ref, ref_g = _train(m, m, x)
        out, g = _train(m, compiled, x)
        torch.testing.assert_close(out, ref)
        for a, b in zip(g, ref_g):
            torch.testing.assert_close(a, b)
    stats = ember.events.counters["stats"]
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0


def test_backward_that_mutated_before_failing_is_not_made_opaque(caplog, monkeypatch) -> None:
    """A backward that changed an outside tensor before its data-dependent read cannot be
    replaced (its partial trace would stay): the graph runs eagerly, with eager's results."""
    monkeypatch.setattr(ember.config, "aot_cache", False)

    def fn(x, s):
        return torch.ops.ember_test.scaled_by(x * 2, s).sum()

    x, s = torch.randn(4, requires_grad=True), torch.tensor([1.5, 0.5])
    with caplog.at_level(logging.INFO, logger="ember"):
        out = ember.compile(fn, backend="aot_eager")(x, s)
    out.backward()
    xe = x.detach().clone().requires_grad_()
    fn(xe, s.clone()).backward()
    torch.testing.assert_close(x.grad, xe.grad)
    assert not any("scaled_by cannot be traced" in r.getMessage() for r in caplog.records)
    assert any("data-dependent" in r.getMessage() for r in caplog.records)


def test_backward_on_another_thread_still_runs_opaque(monkeypatch) -> None:
    """On a GPU the autograd engine runs the backward nodes of CUDA tensors on its device
    thread, not the tracing thread: the wrapper must not depend on the tracing thread's state
    there (Mixtral, Qwen2-MoE and OLMoE training fell back on CUDA only). Simulated on the CPU:
    the trace looks inactive from inside the backward wrapper, as it does from that thread."""
    import sys

    from ember.aot import opaque

    real = opaque._active

    def active_except_in_backward() -> bool:
        return real() and sys._getframe(1).f_code.co_name != "backward"

    monkeypatch.setattr(opaque, "_active", active_except_in_backward)
    monkeypatch.setattr(ember.config, "aot_cache", False)
    torch.manual_seed(0)
    m = MoE()
    compiled = ember.compile(m, backend="aot_eager")
    ember.reset()
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(1))
    _assert_like_eager(m, compiled, x)
    stats = ember.events.counters["stats"]
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0, dict(stats)
