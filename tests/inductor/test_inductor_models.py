"""End-to-end: ``ember.compile(model, backend="inductor")`` on small models, inference and training
(gradients against eager), and the benchmark zoo by the accuracy rule."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ember

from inductor_util import compile_strict

ROOT = Path(__file__).resolve().parents[2]


class Block(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


class Attention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        return (a + s).transpose(1, 2).reshape(b, t, d)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        logits = self.head(torch.tanh(h))
        return torch.nn.functional.cross_entropy(logits.view(-1, 50), idx.view(-1))


MODELS = {
    "block": (Block, lambda: (torch.randn(4, 16),)),
    "convbn": (ConvBN, lambda: (torch.randn(2, 3, 8, 8),)),
    "attention": (Attention, lambda: (torch.randn(2, 8, 16),)),
    "embed": (Embed, lambda: (torch.randint(0, 50, (3, 5)),)),
}


def _model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    cls, inputs = MODELS[name]
    return cls(), inputs()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference(name: str) -> None:
    model, inputs = _model(name)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        actual = compile_strict(model)(*inputs)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_gradients(name: str) -> None:
    model, inputs = _model(name)
    ref = copy.deepcopy(model)
    out = compile_strict(model)(*inputs)
    expected = ref(*inputs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)
    for (n, b), (_, c) in zip(model.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-5, msg=n)  # running stats


def test_default_backend_is_inductor() -> None:
    calls = []
    fn = ember.compile(lambda x: torch.sin(x) * 2)
    x = torch.randn(5)
    with ember.config.patch(suppress_errors=False):
        calls.append(fn(x))
    torch.testing.assert_close(calls[0], torch.sin(x) * 2)
    assert "inductor" in ember.list_backends()


def test_modes_accepted() -> None:
    x = torch.randn(8, 8)
    for mode in ("default", "max-autotune", "reduce-overhead"):
        fn = ember.compile(lambda a: a.relu() + 1, backend="inductor", mode=mode)
        with ember.config.patch(suppress_errors=False):
            torch.testing.assert_close(fn(x), x.relu() + 1)


def _zoo():
    sys.path.insert(0, str(ROOT))
    from benchmarks import accuracy, zoo
    return zoo, accuracy


def _run_zoo(name: str, mode: str) -> None:
    zoo, accuracy = _zoo()
    spec = zoo.get_spec(name)
    if spec.missing():
        pytest.skip(f"needs {spec.missing()}")
    model, inputs = spec.build("cpu", "small")
    compiled_model = copy.deepcopy(model)
    ref64 = copy.deepcopy(model).double()
    inputs64 = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    fn = compile_strict(compiled_model)

    def step(m, f, args):
        if mode == "infer":
            with torch.no_grad():
                return zoo.step_result("infer", m, f(*args))
        loss = zoo.reduce_to_loss(f(*args))
        loss.backward()
        return zoo.step_result("train", m, loss)

    fp32 = step(model, model, inputs)
    fp64 = step(ref64, ref64, inputs64)
    res = step(compiled_model, fn, inputs)
    tol = accuracy.default_tolerance(mode, False)
    result = accuracy.compare(res, fp32, fp64, tol)
    assert result.ok, result.how


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pointwise", "mlp", "transformer_block", "convnet", "gpt2",
                                  "bert"])
def test_zoo_inference(name: str) -> None:
    _run_zoo(name, "infer")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pointwise", "mlp", "transformer_block", "convnet", "gpt2", "bert"])
def test_zoo_training(name: str) -> None:
    _run_zoo(name, "train")
