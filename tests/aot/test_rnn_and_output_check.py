"""Issue 19: nn.LSTM/GRU/RNN train through AOT autograd on every backend, and a compiled graph
whose first result fails the output check falls back to its ATen graph instead of ending the
user's program.

The LSTM failure: oneDNN's ``mkldnn_rnn_layer`` returns the workspace its backward needs only
when grad mode is on; a compiled forward runs under no_grad, so the saved workspace was None.
Training traces now record RNNs in their matmul/pointwise form."""

from __future__ import annotations

import logging

import pytest
import torch

import ember


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind,kw", [
    ("LSTM", dict(num_layers=2, batch_first=True)),
    ("LSTM", dict(num_layers=1, bidirectional=True)),
    ("GRU", dict(num_layers=2)),
    ("RNN", dict(num_layers=1, nonlinearity="relu")),
])
def test_rnn_trains_like_eager(backend, kind, kw):
    torch.manual_seed(0)
    m = getattr(torch.nn, kind)(8, 16, **kw)
    x = torch.randn(3, 5, 8)
    ref_out, ref_h = m(x)
    (ref_out.sum() + (ref_h[0] if kind == "LSTM" else ref_h).sum()).backward()
    ref = _grads(m)
    m.zero_grad()
    f = ember.compile(m, backend=backend)
    for _ in range(2):  # the first call checks the outputs, the second runs as compiled
        m.zero_grad()
        out, h = f(x)
        (out.sum() + (h[0] if kind == "LSTM" else h).sum()).backward()
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        for g, r in zip(_grads(m), ref):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def _malformed_backend(which: str):
    """aot_eager, except that the ``which`` graph returns a string among its tensors."""

    def compile_(gm, example_inputs, *, context=None, **options):
        fwd = gm.forward
        if context is None or context.kind != which:
            return fwd

        def bad(*args):
            outs = list(fwd(*args))
            outs[-1] = "not a tensor"
            return outs

        return bad

    return ember.Backend(name=f"malformed_{which}", compile=compile_, level="aten",
                         options={})


@pytest.mark.parametrize("which", ["inference", "forward", "backward"])
def test_failed_output_check_falls_back_with_the_reason(which, caplog):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    f = ember.compile(m, backend=_malformed_backend(which))
    with caplog.at_level(logging.WARNING, logger="ember"):
        for _ in range(2):
            m.zero_grad()
            with torch.set_grad_enabled(which != "inference"):
                out = f(x)
                ref = m(x)
            torch.testing.assert_close(out, ref)
            if which != "inference":
                out.sum().backward()
                g = [p.grad.clone() for p in m.parameters()]
                m.zero_grad()
                ref.sum().backward()
                for a, b in zip(g, m.parameters()):
                    torch.testing.assert_close(a, b.grad)
    msgs = [r.getMessage() for r in caplog.records if "not all tensors" in r.getMessage()]
    assert len(msgs) == 1, msgs  # logged once, with the position and type
    assert "str" in msgs[0] and "ATen ops" in msgs[0]


def test_failed_output_check_raises_without_suppress_errors():
    m = torch.nn.Linear(4, 2)
    f = ember.compile(m, backend=_malformed_backend("inference"))
    with ember.config.patch(suppress_errors=False):
        with pytest.raises(ember.BackendCompilerFailed, match="position 0: str"):
            with torch.no_grad():
                f(torch.randn(3, 4))
