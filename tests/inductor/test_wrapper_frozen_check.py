"""The per-call check that frozen inputs are unchanged (runtime/compare.same_contents): byte-wise
where both tensors are dense with the same strides, torch.equal otherwise; a change anywhere,
a NaN that stays NaN, a -0.0 that became 0.0, through a compiled model whose parameter is
written through ``.data`` (no version counter bump)."""

from __future__ import annotations

import copy

import torch
from torch import nn

import ember
from ember_inductor.runtime.compare import same_contents


def test_same_contents_bytes() -> None:
    a = torch.randn(257, 33)
    b = a.clone()
    assert same_contents(a, b)
    b.view(-1)[-1] += 1  # the last byte range
    assert not same_contents(a, b)
    b = a.clone()
    b[0, 0] = b[0, 0].item() * 2 + 1
    assert not same_contents(a, b)
    n = torch.tensor([float("nan"), 1.0])
    assert same_contents(n, n.clone())           # torch.equal says False: no needless refold
    z = torch.tensor([0.0, 1.0])
    assert not same_contents(torch.tensor([-0.0, 1.0]), z)  # a changed sign bit is a change
    assert same_contents(torch.empty(0), torch.empty(0))


def test_same_contents_layouts() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert same_contents(x, x.clone())
    y = x.clone()
    y[1, 2, 3, 4] = -7.0
    assert not same_contents(x, y)
    # different strides or a non-dense view: compared by value
    assert same_contents(x, x.contiguous())
    t = torch.randn(6, 8)[:, ::2]
    assert same_contents(t, t.clone())
    u = t.clone()
    u[5, 3] += 1
    assert not same_contents(t, u)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.pos = nn.Parameter(torch.randn(8, 16))
        self.fc = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids) + self.pos * 2)


def test_write_through_data_is_noticed() -> None:
    torch.manual_seed(0)
    eager = _Net().eval().requires_grad_(False)
    cm = copy.deepcopy(eager)
    compiled = ember.compile(cm, backend="inductor")
    ids = torch.randint(0, 64, (3, 8))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), eager(ids))
        for m in (eager, cm):
            m.pos.data[7, 15] += 1.0  # no version counter bump
        torch.testing.assert_close(compiled(ids), eager(ids))
