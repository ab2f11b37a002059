"""Data-dependent sizes (unbacked symbols) under the inductor backend (issue 9 §2).

Inductor does not lower unbacked sizes: a forward or backward ATen graph that holds one (the
backward of ``y[mask] = v`` is ``grad[mask]``) runs as its ATen ops inside the compiled graph,
with the reason logged on ``ember.inductor`` (``EMBER_LOGS=inductor``); the other graph of the
pair is still generated code. Never a fallback of the whole function, never a wrong result."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.fx as fx

import ember
import ember.events


def _setitem(y, m, v):
    y[m] = v
    return y


def masked_assign(x, m, v, w):
    y = _setitem(x.clone(), m, v)  # the backward of v is grad[m]: an unbacked size
    return ((y * w).sin().sum(),)


def _inputs(n: int) -> list[torch.Tensor]:
    return [torch.randn(n, 5), torch.randn(n, 5) > 0, torch.randn(()), torch.randn(n, 5)]


RG = (0, 2, 3)


def _leaves(args: Sequence[torch.Tensor], rg: Sequence[int]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(i in rg) for i, a in enumerate(args)]


def _check(compiled: Callable[..., Any], fn: Callable[..., Any], args: list[torch.Tensor],
           rg: Sequence[int]) -> None:
    ac, ae = _leaves(args, rg), _leaves(args, rg)
    out, ref = compiled(*ac), fn(*ae)
    torch.testing.assert_close(out, ref)
    g = [torch.randn_like(r) for r in ref]
    torch.autograd.backward(list(out), g)
    torch.autograd.backward(list(ref), g)
    for i in rg:
        torch.testing.assert_close(ac[i].grad, ae[i].grad)


@pytest.mark.parametrize("dynamic", [False, True])
def test_masked_assign_trains_as_one_graph(dynamic: bool, caplog) -> None:
    from ember_inductor import compile_fx

    ember.reset()
    ember.events.counters["stats"].clear()
    # "compiled" counts graphs that became generated code, cache hits included ("generated"
    # counts only fresh code generation, which a warm cache skips)
    generated = compile_fx.counters["compiled"]
    compiled = ember.compile(masked_assign, backend="inductor", dynamic=dynamic)
    with ember.config.patch(suppress_errors=False), \
            caplog.at_level(logging.INFO, logger="ember.inductor"):
        for seed, n in ((0, 4), (1, 4), (2, 6)):
            torch.manual_seed(seed)
            _check(compiled, masked_assign, _inputs(n), RG)
    stats = dict(ember.events.counters["stats"])
    assert stats.get("fallbacks", 0) == 0
    # static: a second graph for n=6 (automatic dynamic is off); dynamic: one for all sizes
    assert stats["graphs"] == (1 if dynamic else 2)
    msgs = [r.getMessage() for r in caplog.records if "runs as ATen ops" in r.getMessage()]
    assert msgs and all(".backward" in m and "aten.index.Tensor" in m for m in msgs)
    # the forward graphs (no unbacked size) are generated code
    assert compile_fx.counters["compiled"] > generated


def test_forward_with_unbacked_size_runs_as_aten_ops(caplog) -> None:
    # through aot_compile directly (capture breaks the graph at x[m], as torch.compile does by
    # default): the forward holds x[m]; inductor hands both graphs to ATen, results are right
    from ember.aot import aot_compile

    def fn(x, m, w):
        return ((x[m].sin().sum() * w).cos(),)

    gm = fx.symbolic_trace(fn)  # returns a tuple, as captured graphs do
    torch.manual_seed(0)
    args = [torch.randn(4, 5), torch.randn(4, 5) > 0, torch.randn(3)]
    with caplog.at_level(logging.INFO, logger="ember.inductor"):
        compiled = aot_compile(gm, _leaves(args, (0, 2)), backend=ember.get_backend("inductor"),
                               options={})
    assert any("runs as ATen ops" in r.getMessage() and "aten.index.Tensor" in r.getMessage()
               for r in caplog.records)
    for seed in range(2):
        torch.manual_seed(seed)
        _check(compiled, fn, [torch.randn(4, 5), torch.randn(4, 5) > 0, torch.randn(3)], (0, 2))
