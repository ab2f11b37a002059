"""Issue 12: a sequence-length sweep (50 distinct lengths) on tiny GPT-2, BERT and Llama models
built from transformers configs compiles at most two graphs per model (static, then dynamic) and
matches eager at every length, with the eager, aot_eager and inductor backends, in inference and
training."""

from __future__ import annotations

import pytest
import torch

import ember

from ._util import graphs, stats

transformers = pytest.importorskip("transformers")

from hf import models as hf_models  # noqa: E402

LENGTHS = list(range(2, 52))  # 50 distinct lengths (positions: 64)
MODELS = ["gpt2", "bert", "llama"]
BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _ids(length: int) -> torch.Tensor:
    return torch.randint(3, hf_models.VOCAB, (2, length),
                         generator=torch.Generator().manual_seed(length))


def _loss(out) -> torch.Tensor:
    return sum(t.float().pow(2).mean() for t in hf_models.float_leaves(out))


def _no_dropout(model: torch.nn.Module) -> None:
    """Training mode without randomness, so eager and compiled runs compare exactly."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for attr in ("attention_dropout", "dropout", "attn_dropout", "resid_dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)


def _sweep(name: str, backend: str, training: bool) -> None:
    model, _ = hf_models.build(name)
    model.train(training)
    _no_dropout(model)
    compiled = ember.compile(model, backend=backend)
    params = [p for p in model.parameters() if p.requires_grad]
    for length in LENGTHS:
        ids = _ids(length)
        if training:
            model.zero_grad(set_to_none=True)
            want = _loss(model(input_ids=ids))
            want.backward()
            want_grads = [p.grad.clone() for p in params]
            model.zero_grad(set_to_none=True)
            got = _loss(compiled(input_ids=ids))
            got.backward()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            for p, g in zip(params, want_grads):
                torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-5)
        else:
            with torch.no_grad():
                want = hf_models.float_leaves(model(input_ids=ids))
                got = hf_models.float_leaves(compiled(input_ids=ids))
            assert len(got) == len(want)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        # fail at the first length that compiles a third graph (keeps failures cheap)
        assert graphs(compiled) <= 2, f"{name}: length {length} compiled graph #{graphs(compiled)}"
    s = stats()
    assert graphs(compiled) == 2, f"{name}: {graphs(compiled)} graph(s)"
    assert s.get("recompiles", 0) == 1
    assert s.get("fallbacks", 0) == 0 and s.get("graph_breaks", 0) == 0, s


def _params():
    out = []
    for backend in BACKENDS:
        for name in MODELS:
            for mode in ("inference", "training"):
                marks = [pytest.mark.slow] if backend == "inductor" or mode == "training" else []
                out.append(pytest.param(name, backend, mode, marks=marks,
                                        id=f"{name}-{backend}-{mode}"))
    return out


@pytest.mark.parametrize("name,backend,mode", _params())
def test_sequence_length_sweep(name: str, backend: str, mode: str) -> None:
    _sweep(name, backend, mode == "training")
