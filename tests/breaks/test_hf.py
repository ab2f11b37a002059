"""Hugging Face GPT-2 and BERT in their *default* call paths (``model(input_ids)``; for GPT-2 that
means ``use_cache`` left at its default, so a ``DynamicCache`` is created, filled and returned)
compile with Ember, run correctly, and break no more often than torch.compile breaks on them.

Small configs with random weights, eval mode, nothing downloaded. Unlike the zoo tests
(tests/capture/test_zoo.py), the configs are *not* passed through the benchmarks' ``_hf_common``:
the cache stays on.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember
import ember.events

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32,
                                  vocab_size=VOCAB, bos_token_id=VOCAB - 1,
                                  eos_token_id=VOCAB - 1)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB,
                                  max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval()


def _torch_break_count(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """torch.compile's graph-break count on ``model(ids)``.

    torch reports breaks in two places that do not always agree:
    ``torch._dynamo.explain(...).graph_break_count`` counts every break its explain pass records
    (including, e.g., a data-dependent branch inside a resume function), while
    ``torch._dynamo.utils.counters["graph_break"]`` counts the breaks a normal
    ``torch.compile(backend="eager")`` run takes, keyed by reason, and skips some of those. We
    take the larger of the two as torch's number, so that Ember is held to the more lenient
    reading of torch's count and never to an undercount.
    """
    import torch._dynamo as dynamo

    with torch.no_grad():
        dynamo.reset()
        dynamo.utils.counters.clear()
        explained = dynamo.explain(model)(ids).graph_break_count
        dynamo.reset()
        dynamo.utils.counters.clear()
        torch.compile(model, backend="eager")(ids)
        counted = sum(dynamo.utils.counters["graph_break"].values())
        dynamo.reset()
    return max(explained, counted)


def _ember_run(model: torch.nn.Module,
               ids: torch.Tensor) -> tuple[Any, int, dict[str, int], str]:
    """Compile ``model`` with Ember after a reset and call it once; return its output, Ember's
    break count, the capture stats of that run, and a report (explain) for failure messages."""
    ember.reset()
    with torch.no_grad():
        out = ember.compile(model, backend="eager")(ids)
    c = ember.events.counters
    breaks = sum(c["graph_breaks"].values())
    stats = dict(c["stats"])
    graph_breaks = dict(c["graph_breaks"])
    with torch.no_grad():
        report = ember.explain(model)(ids)
    text = f"stats={stats}\nbreaks={graph_breaks}\nexplain:\n{report}"
    return out, breaks, stats, text


def _assert_compiled(stats: dict[str, int], text: str) -> None:
    assert stats.get("fallbacks", 0) == 0, f"Ember fell back to eager instead of compiling:\n{text}"
    assert stats.get("graphs", 0) >= 1, f"Ember captured no graph:\n{text}"


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    out = []
    for layer in cache.layers:
        out += [layer.keys, layer.values]
    return out


def test_gpt2_default_path_with_dynamic_cache() -> None:
    model = _gpt2()
    assert model.config.use_cache  # the default call path builds and returns a DynamicCache
    ids = _ids(0, 2, 8)
    with torch.no_grad():
        ref = model(ids)
    assert isinstance(ref.past_key_values, transformers.DynamicCache)

    out, ember_breaks, stats, text = _ember_run(model, ids)
    _assert_compiled(stats, text)
    torch.testing.assert_close(out.logits, ref.logits)
    assert isinstance(out.past_key_values, transformers.DynamicCache), type(out.past_key_values)
    assert len(out.past_key_values.layers) == len(ref.past_key_values.layers)
    torch.testing.assert_close(_cache_tensors(out.past_key_values),
                               _cache_tensors(ref.past_key_values))
    assert out.past_key_values.get_seq_length() == ids.shape[1]

    torch_breaks = _torch_break_count(model, ids)
    assert ember_breaks <= torch_breaks, (
        f"Ember breaks {ember_breaks} times on GPT-2, torch.compile {torch_breaks}\n{text}")


def test_gpt2_default_path_cached_entry_new_values() -> None:
    """A second call with other token ids of the same shape reuses the compiled entries (no
    recompile) and still matches eager, cache included."""
    model = _gpt2()
    ember.reset()
    compiled = ember.compile(model, backend="eager")
    with torch.no_grad():
        compiled(_ids(0, 2, 8))
        graphs = ember.events.counters["stats"]["graphs"]
        ids = _ids(1, 2, 8)
        out, ref = compiled(ids), model(ids)
    assert ember.events.counters["stats"]["fallbacks"] == 0
    assert ember.events.counters["stats"]["graphs"] == graphs, "recompiled on new token values"
    assert ember.events.counters["stats"]["recompiles"] == 0
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(_cache_tensors(out.past_key_values),
                               _cache_tensors(ref.past_key_values))


def test_bert_default_path() -> None:
    model = _bert()
    ids = _ids(0, 2, 8)
    with torch.no_grad():
        ref = model(ids)

    out, ember_breaks, stats, text = _ember_run(model, ids)
    _assert_compiled(stats, text)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output)

    torch_breaks = _torch_break_count(model, ids)
    assert ember_breaks <= torch_breaks, (
        f"Ember breaks {ember_breaks} times on BERT, torch.compile {torch_breaks}\n{text}")
