"""The benchmark zoo models each capture as exactly one graph, with no break and no fallback, and
match eager: in eval mode under ``torch.no_grad`` and in train mode with gradients enabled.

Models are built from ``benchmarks.zoo`` (the same classes and Hugging Face configs the benchmark
runner uses) at sizes smaller than the runner's "small" so the whole file runs in well under 90 s on
two CPU cores. Hugging Face models go through the zoo's ``_hf_common`` (dropout off, no KV cache),
as in the benchmarks; their default call path with a cache is covered by tests/breaks/test_hf.py.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
from torch import nn

import ember
import ember.events
from benchmarks import zoo


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _ids(vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(2))


def _mlp() -> tuple[nn.Module, tuple[Any, ...]]:
    return zoo._seeded(lambda: zoo.MLP(d=32, blocks=2)), (_randn(4, 32),)


def _transformer_block() -> tuple[nn.Module, tuple[Any, ...]]:
    return zoo._seeded(lambda: zoo.TransformerBlock(d=32, heads=4)), (_randn(2, 8, 32),)


def _convnet() -> tuple[nn.Module, tuple[Any, ...]]:
    return zoo._seeded(lambda: zoo.SmallResNet(width=8, classes=5)), (_randn(2, 3, 16, 16),)


def _gpt2() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = zoo._hf_common(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32,
                                    vocab_size=64, bos_token_id=63, eos_token_id=63))
    return zoo._seeded(lambda: GPT2LMHeadModel(cfg)), (_ids(64, 2, 8),)


def _bert() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import BertConfig, BertModel

    cfg = zoo._hf_common(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, vocab_size=64,
                                    max_position_embeddings=32))
    return zoo._seeded(lambda: BertModel(cfg)), (_ids(64, 2, 8),)


def _llama() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = zoo._hf_common(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                     max_position_embeddings=32))
    return zoo._seeded(lambda: LlamaForCausalLM(cfg)), (_ids(64, 2, 8),)


BUILDERS: dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]] = {
    "mlp": _mlp,
    "transformer_block": _transformer_block,
    "convnet": _convnet,
    "gpt2": _gpt2,
    "bert": _bert,
    "llama": _llama,
}
NAMES = list(BUILDERS)


class _Counting:
    """A backend that records each graph it is given and runs it as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward


def _assert_one_graph(name: str, counting: _Counting) -> None:
    c = ember.events.counters
    breaks = dict(c["graph_breaks"])
    assert sum(breaks.values()) == 0, f"{name}: graph breaks {breaks}"
    assert c["stats"]["fallbacks"] == 0, f"{name}: fell back to eager"
    assert c["stats"]["graphs"] == 1, f"{name}: {c['stats']['graphs']} graphs (want 1)"
    assert len(counting.graphs) == 1, f"{name}: backend got {len(counting.graphs)} graphs"
    ops = [n for n in counting.graphs[0].graph.nodes if n.op in ("call_function", "call_method",
                                                                    "call_module")]
    assert ops, f"{name}: the captured graph holds no operation"


def _explain_one_graph(name: str, model: nn.Module, inputs: tuple[Any, ...]) -> None:
    report = ember.explain(model)(*inputs)
    assert (report.graph_count, report.break_count, report.fallbacks) == (1, 0, []), (
        f"{name}:\n{report}")


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_zoo_inference_one_graph(name: str) -> None:
    model, inputs = BUILDERS[name]()
    model.eval()
    with torch.no_grad():
        expected = zoo.flatten_outputs(model(*inputs))
        ember.reset()
        counting = _Counting()
        compiled = ember.compile(model, backend=counting)
        got = zoo.flatten_outputs(compiled(*inputs))
        _assert_one_graph(name, counting)
        torch.testing.assert_close(got, expected)
        # The second call hits the cached entry: no recompile, same result.
        again = zoo.flatten_outputs(compiled(*inputs))
        torch.testing.assert_close(again, expected)
        assert len(counting.graphs) == 1
        assert ember.events.counters["stats"]["recompiles"] == 0
        # The same through backend="eager" and explain().
        ember.reset()
        torch.testing.assert_close(
            zoo.flatten_outputs(ember.compile(model, backend="eager")(*inputs)), expected)
        _explain_one_graph(name, model, inputs)


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_zoo_training_one_graph(name: str) -> None:
    model, inputs = BUILDERS[name]()
    model.train()
    ref_model = copy.deepcopy(model)
    with torch.enable_grad():
        ref_out = ref_model(*inputs)
        ref_loss = zoo.reduce_to_loss(ref_out)
        ref_loss.backward()

        ember.reset()
        counting = _Counting()
        compiled = ember.compile(model, backend=counting)
        out = compiled(*inputs)
        _assert_one_graph(name, counting)
        loss = zoo.reduce_to_loss(out)
        assert loss.requires_grad
        loss.backward()
    torch.testing.assert_close(zoo.flatten_outputs(out), zoo.flatten_outputs(ref_out))
    torch.testing.assert_close(loss, ref_loss)
    grads = {n: p.grad for n, p in model.named_parameters()}
    ref_grads = {n: p.grad for n, p in ref_model.named_parameters()}
    assert grads.keys() == ref_grads.keys()
    missing = [n for n, g in grads.items() if g is None and ref_grads[n] is not None]
    assert not missing, f"{name}: no gradient reached {missing[:5]}"
    torch.testing.assert_close(grads, ref_grads)
    # Buffers mutated by the forward (BatchNorm running statistics) are updated as in eager.
    torch.testing.assert_close(dict(model.named_buffers()), dict(ref_model.named_buffers()))


def test_zoo_training_then_eval_recompiles_on_training_flag() -> None:
    """The `training` flag is guarded: switching a compiled model to eval recompiles once and
    gives eval-mode results (BatchNorm running statistics), then stays cached."""
    model, inputs = _convnet()
    ref = copy.deepcopy(model)
    ember.reset()
    compiled = ember.compile(model, backend="eager")
    with torch.no_grad():
        compiled.train()
        ref.train()
        torch.testing.assert_close(compiled(*inputs), ref(*inputs))
        compiled.eval()
        ref.eval()
        torch.testing.assert_close(compiled(*inputs), ref(*inputs))
        torch.testing.assert_close(compiled(*inputs), ref(*inputs))
    assert ember.events.counters["stats"]["graphs"] == 2
    assert ember.events.counters["stats"]["recompiles"] == 1
