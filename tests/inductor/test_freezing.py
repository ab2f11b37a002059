"""Freezing (ember_inductor/freezing.py): in inference, parameter-only computation is folded once
(BatchNorm into the preceding convolution, constant subexpressions), results match eager, and a
changed parameter is noticed on the next call, however it was changed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
from ember_inductor import freezing


@pytest.fixture(autouse=True)
def _channels_last_pays(monkeypatch):
    """These tests check the channels-last plan itself; whether it pays for an inference graph
    is timed on the machine (layout.channels_last_chosen): here it always does."""
    from ember_inductor import layout as _layout

    monkeypatch.setattr(_layout, "channels_last_chosen", lambda gm: True)
    # and convolutions stay aten.convolution (the timed oneDNN entry: test_choices.py)
    monkeypatch.setattr(_layout, "_onednn_conv_chosen", lambda plan, node, args: False)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 1, bias=True)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = self.bn2(self.conv2(y)) + 1.0
        return self.fc(y.mean((2, 3))) * self.fc.bias.exp().sum()


def _model() -> ConvBN:
    torch.manual_seed(0)
    m = ConvBN()
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        for bn in (m.bn, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m.eval()


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    yield
    ember.reset()


def _pair(**kw):
    eager = _model()
    compiled_model = copy.deepcopy(eager)
    return eager, compiled_model, ember.compile(compiled_model, backend="inductor", **kw)


def _check(eager, compiled, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)


def test_batchnorm_folded_and_results_equal():
    before = dict(freezing.counters)
    eager, _, compiled = _pair()
    x = torch.randn(2, 3, 10, 10)
    _check(eager, compiled, x)
    assert freezing.counters["graphs"] == before.get("graphs", 0) + 1
    assert freezing.counters["conv_bn"] == before.get("conv_bn", 0) + 2
    folds = freezing.counters["folds"]
    _check(eager, compiled, x)
    assert freezing.counters["folds"] == folds  # unchanged parameters: no refold


def _mutations():
    def inplace(m):
        m.conv.weight.mul_(1.5)          # under no_grad, as an optimizer step
        m.bn.running_var.add_(0.5)

    def via_data(m):
        m.bn.weight.data.add_(0.25)       # .data: neither version counter nor pointer changes
        m.conv2.weight.data.mul_(-1.0)

    def fc_bias(m):
        m.fc.bias.data.copy_(torch.linspace(-1, 1, 5))

    def state_dict(m):
        sd = {k: v + 0.1 for k, v in m.state_dict().items()}
        m.load_state_dict(sd)

    return [inplace, via_data, fc_bias, state_dict]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_changed_parameter_is_noticed(mutate):
    eager, cmodel, compiled = _pair()
    x = torch.randn(2, 3, 10, 10)
    _check(eager, compiled, x)
    with torch.no_grad():
        mutate(eager)
        mutate(cmodel)
    _check(eager, compiled, x)
    with torch.no_grad():
        changed = eager(x)
    assert not torch.allclose(changed, _model()(x), atol=1e-4)  # the mutation mattered


def test_version_check_mode_sees_inplace_updates():
    eager, cmodel, compiled = _pair(options={"freezing_check": "version"})
    x = torch.randn(2, 3, 10, 10)
    _check(eager, compiled, x)
    with torch.no_grad():
        for m in (eager, cmodel):
            m.conv.weight.mul_(0.5)
            m.bn2.bias.add_(1.0)
    _check(eager, compiled, x)


def test_training_graphs_are_not_frozen():
    torch.manual_seed(0)
    m = _model().train()
    ref = copy.deepcopy(m)
    before = freezing.counters["graphs"]
    compiled = ember.compile(m, backend="inductor")
    x = torch.randn(2, 3, 10, 10)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    assert freezing.counters["graphs"] == before
    torch.testing.assert_close(m.conv.weight.grad, ref.conv.weight.grad, rtol=1e-4, atol=1e-5)


def test_freezing_off():
    before = freezing.counters["graphs"]
    eager, _, compiled = _pair(options={"freezing": False})
    _check(eager, compiled, torch.randn(2, 3, 10, 10))
    assert freezing.counters["graphs"] == before


def test_buffers_updated_by_the_graph_refold():
    # train-mode BatchNorm under no_grad: an inference graph that writes the running statistics
    # back into its (frozen) buffers after every call; each call must see the new values
    eager = _model().train()
    cmodel = copy.deepcopy(eager)
    compiled = ember.compile(cmodel, backend="inductor")
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        for i in range(3):
            torch.testing.assert_close(compiled(x + i), eager(x + i), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cmodel.bn.running_mean, eager.bn.running_mean)
            torch.testing.assert_close(cmodel.bn2.running_var, eager.bn2.running_var)


def test_folding_a_graph_rebuilt_from_the_aot_cache():
    """A warm start rebuilds the ATen graph from the AOT cache with real (uninitialized) tensors
    as values, not FakeTensors: the folded convolutions get their values without FakeTensorMode
    (whose first use imports torch._dynamo), and the results are the same."""
    x = torch.randn(2, 3, 10, 10)
    eager, _, compiled = _pair()
    _check(eager, compiled, x)  # fills the AOT cache
    ember.reset()
    before = dict(freezing.counters)
    created = []
    orig = freezing._propagate_on_meta

    def spy(gm):
        created.append(gm)
        return orig(gm)

    freezing._propagate_on_meta = spy
    try:
        eager, _, compiled = _pair()
        _check(eager, compiled, x)
    finally:
        freezing._propagate_on_meta = orig
    assert created, "the rebuilt graph was expected to go through the real-tensor path"
    assert freezing.counters["conv_bn"] == before.get("conv_bn", 0) + 2


@pytest.mark.parametrize("layout_opt", [True, False])
def test_folded_convolution_weights_are_kept_channels_last(layout_opt):
    """Folded weights read only by channels-last 2-d convolutions are stored channels-last (ATen
    would otherwise copy them on every call), on the first fold and on every refold; with the
    layout optimisation off they stay contiguous (a channels-last weight would make eager-layout
    convolutions return channels-last results). Results and strides as eager's throughout."""
    seen = []
    orig = freezing.freeze

    def spy(*a, **k):
        r = orig(*a, **k)
        seen.append(r)
        return r

    freezing.freeze = spy
    try:
        eager, cmodel, compiled = _pair(options={"layout_opt": layout_opt})
        x = torch.randn(2, 3, 10, 10)
        _check(eager, compiled, x)
    finally:
        freezing.freeze = orig
    (frozen,) = [f for f in seen if f is not None]
    # both convolution weights (the 1x1 one is contiguous either way)
    assert len(frozen.channels_last) == (2 if layout_opt else 0)
    assert sum(c.dim() == 4 and not c.is_contiguous() for c in frozen.example_consts) == (
        1 if layout_opt else 0)
    for k in frozen.channels_last:
        assert frozen.example_consts[k].is_contiguous(memory_format=torch.channels_last)
        p = [n for n in frozen.gm.graph.nodes if n.op == "placeholder"][-len(
            frozen.example_consts) + k]
        assert p.meta["val"].stride() == frozen.example_consts[k].stride()
    # a changed weight is refolded (channels-last again) and noticed
    with torch.no_grad():
        for m in (eager, cmodel):
            m.conv.weight.mul_(-0.5)
            m.conv2.weight.add_(0.25)
    _check(eager, compiled, x)
    with torch.no_grad():
        got, want = compiled(x.to(memory_format=torch.channels_last)), eager(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert got.stride() == want.stride()
