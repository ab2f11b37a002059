"""Small models through the Triton target, inference and training, against eager (gradients
and BatchNorm running statistics included)."""

from __future__ import annotations

import copy

import pytest
import torch

import ember
from triton_util import DEVICE, _decompositions, assert_same, compile_triton


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.l1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.l2 = torch.nn.Linear(32, 4)

    def forward(self, idx):
        h = self.emb(idx).mean(1)
        h = torch.nn.functional.gelu(self.ln(self.l1(h)))
        return torch.log_softmax(self.l2(self.bn(h)), -1)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        h = torch.relu(self.c2(h) + h)
        return self.fc(h.mean((2, 3)))


class Attention(torch.nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)
        self.ln = torch.nn.LayerNorm(d)
        self.h = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.h) ** 0.5, -1) @ v
        return x + self.o(a.transpose(1, 2).reshape(b, s, d))


MODELS = {
    "mlp": (MLP, lambda: torch.randint(0, 20, (8, 5))),
    "convnet": (ConvNet, lambda: torch.randn(2, 3, 8, 8)),
    "attention": (Attention, lambda: torch.randn(2, 6, 16)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_train_and_eval(name):
    cls, make = MODELS[name]
    torch.manual_seed(0)
    model = cls().to(DEVICE)
    ref = copy.deepcopy(model)
    x = make().to(DEVICE)
    out = compile_triton(model)(x)
    expected = ref(x)
    assert_same(out, expected, atol=1e-4, rtol=1e-4)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=n)
    for (n, b), (_, c) in zip(model.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(b, c, msg=n)
    model.eval()
    ref.eval()
    with torch.no_grad():
        assert_same(compile_triton(model)(x), ref(x), atol=1e-4, rtol=1e-4)


def test_triton_callables_may_be_recorded_into_cuda_graphs():
    """mode="reduce-overhead" records inductor's Triton callables: none carries the refusal
    core's reduce-overhead path reads (it was set until tests/cudagraphs passed on the H100 with
    them recorded, 2026-12-05)."""
    from ember_inductor import compile_inductor

    seen = []

    def backend(gm, example_inputs, **options):
        fn = compile_inductor(gm, example_inputs, **options)
        seen.append(getattr(fn, "ember_cudagraphs_refuse", None))
        return fn

    opts = {"cpu_codegen": "triton"} if DEVICE == "cpu" else {}
    ember.register_backend("inductor_triton_record", backend, level="aten",
                           decompositions=_decompositions, override=True)
    x = torch.randn(8, 16, device=DEVICE)
    with ember.config.patch(suppress_errors=False):
        out = ember.compile(lambda t: torch.tanh(t) * 2, backend="inductor_triton_record",
                            options=opts)(x)
    torch.testing.assert_close(out, torch.tanh(x) * 2)
    assert seen and all(s is None for s in seen)
