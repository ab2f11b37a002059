"""End to end: ember.compile(model, backend="aot_eager") in training, against eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import ember

from aot_util import assert_close


def _train_compare(model, inputs, loss_fn, rtol=1e-4, atol=1e-5):
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="aot_eager")
    le = loss_fn(ref(*inputs))
    lc = loss_fn(compiled(*inputs))
    assert_close(lc, le, rtol=rtol, atol=atol)
    le.backward()
    lc.backward()
    for (n, pe), (_, pc) in zip(ref.named_parameters(), model.named_parameters()):
        if pe.grad is None:
            assert pc.grad is None, n
        else:
            assert_close(pc.grad, pe.grad, rtol=rtol, atol=atol, msg=lambda m: f"{n}: {m}")
    for (n, be), (_, bc) in zip(ref.named_buffers(), model.named_buffers()):
        assert_close(bc, be, msg=lambda m: f"{n}: {m}")


def test_dropout_module_train_mode_rng():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="aot_eager")
    x = torch.randn(8, 16)
    torch.manual_seed(5)
    oc = compiled(x)
    torch.manual_seed(5)
    oe = ref(x)
    assert_close(oc, oe)
    oc.sum().backward()
    oe.sum().backward()
    for pe, pc in zip(ref.parameters(), model.parameters()):
        assert_close(pc.grad, pe.grad)
    assert not torch.equal(compiled(x), compiled(x))


def test_frozen_layer_e2e():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    for p in model[0].parameters():
        p.requires_grad_(False)
    _train_compare(model, [torch.randn(5, 6)], lambda o: o.pow(2).sum())
    assert model[0].weight.grad is None


def test_input_requires_grad_e2e():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.SiLU())
    x = torch.randn(5, 6, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    ref = copy.deepcopy(model)
    c = ember.compile(model, backend="aot_eager")
    c(x).sum().backward()
    ref(xe).sum().backward()
    assert_close(x.grad, xe.grad)


def test_batchnorm1d_running_stats_e2e():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    _train_compare(model, [torch.randn(6, 4)], lambda o: o.sum())
    assert model[1].num_batches_tracked.item() == 1


def _hf_tiny(kind):
    transformers = pytest.importorskip("transformers")
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=32,
                                      vocab_size=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, use_cache=False)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=64,
                                      max_position_embeddings=32, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        model = transformers.BertModel(cfg)
    return model


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_hf_tiny_training_step(kind):
    torch.manual_seed(0)
    model = _hf_tiny(kind)
    model.train()
    ids = torch.randint(0, 64, (2, 8))
    if kind == "gpt2":
        loss_fn = lambda o: o.logits.float().pow(2).mean()  # noqa: E731
    else:
        loss_fn = lambda o: o.last_hidden_state.float().pow(2).mean()  # noqa: E731
    _train_compare(model, [ids], loss_fn)
