"""The content check of frozen inputs (freezing.FrozenCall) states its price: the watched bytes
are known, the first check logs its measured cost once with the way out, and a write through
``.data`` is still seen after that first, reported check."""

from __future__ import annotations

import copy
import logging

import torch

import ember
from ember_inductor import freezing

from test_freezing import _channels_last_pays, _fresh, _model  # noqa: F401  (fixtures)

LOGGER = "ember.inductor.freezing"


def _reports(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "snapshot" in r.getMessage()]


def test_content_check_reports_its_cost_once_and_still_sees_data_writes(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    eager = _model()
    cm = copy.deepcopy(eager)
    # the linear layer on eager's addmm: a timed choice of a pre-transposed or packed weight
    # would make its weight a watched input too (autotune.tune_linears)
    compiled = ember.compile(cm, backend="inductor", options={"onednn_linear": False})
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
        reports = _reports(caplog)
        assert len(reports) == 1, [r.getMessage() for r in caplog.records]
        msg = reports[0].getMessage()
        assert "'freezing_check': 'version'" in msg
        # the watched inputs are the convolution weights and BatchNorm tensors, and the
        # reported size is theirs
        watched = sum(t.numel() * t.element_size() for t in (
            cm.conv.weight, cm.conv2.weight, cm.conv2.bias, *cm.bn.parameters(),
            *cm.bn.buffers(), *cm.bn2.parameters(), *cm.bn2.buffers(), cm.fc.bias)
            if t.is_floating_point())
        assert f"({watched} bytes," in msg, msg
        # a write the version counter does not see, after the reported first check
        folds = freezing.counters["folds"]
        for m in (eager, cm):
            m.conv.weight.data[0, 0, 0, 0] += 0.5
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
        assert freezing.counters["folds"] == folds + 1
    assert len(_reports(caplog)) == 1


def test_version_check_reports_nothing(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    eager = _model()
    compiled = ember.compile(copy.deepcopy(eager), backend="inductor",
                             options={"freezing_check": "version"})
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    assert _reports(caplog) == []


class _BigWeight(torch.nn.Module):
    """A 1x1 convolution whose weight (128*64 elements) is larger than its result at this
    input size (128*2*2): batch-1 inference on a small image, the late layers of a ResNet."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 128, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def _big_weight() -> _BigWeight:
    torch.manual_seed(0)
    m = _BigWeight()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
    return m.eval()


def test_batchnorm_not_folded_into_a_weight_larger_than_the_result(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    x = torch.randn(1, 64, 2, 2)
    for mode, folded in (("auto", 0), ("always", 1)):
        caplog.clear()
        eager = _big_weight()
        cm = copy.deepcopy(eager)
        before = freezing.counters["conv_bn"]
        compiled = ember.compile(cm, backend="inductor", options={"fold_conv_bn": mode})
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
            assert freezing.counters["conv_bn"] == before + folded
            msg = _reports(caplog)[0].getMessage()
            # auto: only the BatchNorm's tensors are watched, not the convolution weight
            weight = cm.conv.weight.numel() * 4
            watched = int(msg.split(" bytes,")[0].rsplit("(", 1)[1])
            assert (watched >= weight) == (mode == "always"), msg
            # a write that bumps no version counter is seen either way
            for m in (eager, cm):
                m.bn.weight.data[3] += 0.5
                m.conv.weight.data[3, 0, 0, 0] -= 0.5
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
        ember.reset()
