"""Random ops keep torch's RNG semantics; the min-cut partitioner saves what is expensive and
recomputes cheap pointwise ops for a backend that fuses them (``Backend.recompute``), only views
for one that runs each op as a kernel (aot_eager, cudagraphs); EMBER_LOGS=aot prints the
graphs."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot.partition import is_random

from aot_util import assert_close, compile_fn


def _dropout_fn(x, w):
    return (F.dropout(x @ w, p=0.5, training=True),)


def _setup(n=64, d=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).requires_grad_()
    w = torch.randn(d, d, generator=g).requires_grad_()
    return x, w


def test_dropout_masks_differ_between_calls():
    x, w = _setup()
    c = compile_fn(_dropout_fn, [x, w])
    a, b = c(x, w)[0], c(x, w)[0]
    assert not torch.equal(a == 0, b == 0)


def test_dropout_matches_eager_under_same_seed_and_advances_rng():
    x, w = _setup()
    c = compile_fn(_dropout_fn, [x, w])
    torch.manual_seed(123)
    e = _dropout_fn(x, w)[0]
    state_e = torch.get_rng_state()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    o = c(x, w)[0]
    after = torch.get_rng_state()
    assert not torch.equal(before, after)  # the global generator was advanced
    assert torch.equal(after, state_e)  # ... by as much as eager advances it
    assert_close(o, e)


def test_dropout_distribution():
    x = torch.ones(200, 200, requires_grad=True)
    c = compile_fn(lambda x: (F.dropout(x, p=0.3, training=True),), [x])
    out = c(x)[0]
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.02
    assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))


def test_dropout_backward_reuses_forward_mask():
    x, w = _setup()
    c = compile_fn(_dropout_fn, [x, w])
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.manual_seed(7)
    out = c(x, w)[0]
    torch.manual_seed(99)  # a recomputed mask would come from this state
    out.sum().backward()
    torch.manual_seed(7)
    _dropout_fn(xe, we)[0].sum().backward()
    assert_close(x.grad, xe.grad)
    assert_close(w.grad, we.grad)
    bw = c._variants[(True, True)].partition.bw
    assert not any(is_random(n) for n in bw.graph.nodes)


def test_rand_like_in_graph():
    x, = _setup()[:1]
    c = compile_fn(lambda x: (x * torch.rand_like(x),), [x])
    torch.manual_seed(3)
    out = c(x)[0]
    torch.manual_seed(3)
    ref = x * torch.rand_like(x)
    assert_close(out, ref)
    out.sum().backward()
    torch.manual_seed(3)
    assert_close(x.grad, torch.rand_like(x))


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _fusing(recompute: bool = True) -> ember.Backend:
    """aot_eager's compile, declared as a backend that fuses cheap ops (or not)."""
    from ember_aot_eager import compile_aot_eager

    return ember.Backend(f"fusing_{recompute}", compile_aot_eager, level="aten",
                         recompute=recompute)


def test_partition_saves_matmul_and_recomputes_pointwise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g, requires_grad=True)
    w1 = torch.randn(32, 8, generator=g, requires_grad=True)
    w2 = torch.randn(8, 32, generator=g, requires_grad=True)
    fn = lambda x, w1, w2: (F.linear(F.gelu(F.linear(x, w1)), w2),)  # noqa: E731
    c = compile_fn(fn, [x, w1, w2], backend=_fusing())
    part = c._variants[(True, True, True)].partition
    saved = [n for n in part.fw.graph.nodes if n.op == "output"][0].args[0][1:]
    saved_ops = [getattr(s, "target", None) for s in saved]
    aten = torch.ops.aten
    assert aten.gelu.default not in saved_ops  # recomputed in the backward
    assert aten.gelu.default in _ops(part.bw)
    assert aten.mm.default in saved_ops  # the matmul result is saved, not recomputed
    # eager saves x, w1, h=x@w1.T, gelu(h), w2: we save x, w1, h, w2 (no gelu output)
    assert part.saved_bytes <= (16 * 8 + 32 * 8 + 16 * 32 + 8 * 32) * 4


def test_partition_pointwise_chain_saves_only_input():
    x = torch.randn(1000, requires_grad=True)
    c = compile_fn(lambda x: (x.sin().cos().exp() * 2,), [x], backend=_fusing())
    part = c._variants[(True,)].partition
    assert part.n_saved == 1 and part.saved_bytes == 4000
    c(x)[0].sum().backward()
    xe = x.detach().clone().requires_grad_()
    (xe.sin().cos().exp() * 2).sum().backward()
    assert_close(x.grad, xe.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "fusing_False"])
def test_a_backend_that_does_not_fuse_gets_what_the_backward_reads(backend: str) -> None:
    """Nothing the backward reads is computed again in it (an extra kernel per op for such a
    backend): ``relu`` after batch norm, ``gelu``, ``sin``... are saved, as eager saves them;
    views are still rebuilt from what is saved."""
    be = ember.get_backend("aot_eager") if backend == "aot_eager" else _fusing(False)
    assert be.recompute is False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g, requires_grad=True)
    w1 = torch.randn(32, 8, generator=g, requires_grad=True)
    w2 = torch.randn(8, 32, generator=g, requires_grad=True)
    fn = lambda x, w1, w2: (F.linear(F.gelu(F.linear(x, w1)).relu(), w2).sin(),)  # noqa: E731
    c = compile_fn(fn, [x, w1, w2], backend=be)
    part = c._variants[(True, True, True)].partition
    aten = torch.ops.aten
    computing = [t for t in _ops(part.bw) if t in (aten.gelu.default, aten.relu.default,
                                                   aten.sin.default, aten.mm.default)]
    assert aten.gelu.default not in computing and aten.relu.default not in computing
    assert aten.sin.default not in computing  # sin's backward reads cos(x): nothing recomputed
    c(x, w1, w2)[0].sum().backward()
    ref = [t.detach().clone().requires_grad_() for t in (x, w1, w2)]
    fn(*ref)[0].sum().backward()
    assert_close([x.grad, w1.grad, w2.grad], [r.grad for r in ref])
    # the same graph through a backend that fuses: gelu is recomputed there
    fused = compile_fn(fn, [x, w1, w2], backend=_fusing())._variants[(True, True, True)]
    assert aten.gelu.default in _ops(fused.partition.bw)


def test_the_backends_declare_whether_they_fuse() -> None:
    assert ember.get_backend("aot_eager").recompute is False
    assert ember.get_backend("inductor").recompute is True
    if "cudagraphs" in ember.list_backends():
        assert ember.get_backend("cudagraphs").recompute is False
    assert ember.Backend("x", lambda gm, ex: gm, level="aten").recompute is True  # the default


def test_partition_graphs_are_functional_aten():
    x = torch.randn(4, 4, requires_grad=True)
    def fn(x):
        y = x * 2
        y.add_(1)
        return (y.relu(),)
    part = compile_fn(fn, [x])._variants[(True,)].partition
    for gm in (part.fw, part.bw):
        for n in gm.graph.nodes:
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                assert n.target.namespace == "aten"
                assert not n.target._schema.is_mutable, n.target


def test_aot_logging_with_caplog(caplog):
    caplog.set_level(logging.INFO, logger="ember.aot")
    x = torch.randn(3, requires_grad=True)
    compile_fn(lambda x: (x.sin() * 2,), [x])
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "ember.aot")
    assert "AOT forward graph" in text and "AOT backward graph" in text
    assert "torch.ops.aten.sin.default" in text and "torch.ops.aten.cos.default" in text


def test_ember_logs_env_prints_aot_graphs(py):
    code = """
import torch, ember
m = torch.nn.Linear(4, 2)
f = ember.compile(m, backend="aot_eager")
f(torch.randn(3, 4)).sum().backward()
"""
    r = py(code, env={"EMBER_LOGS": "aot"})
    assert r.returncode == 0, r.stderr
    assert "AOT forward graph" in r.stderr and "AOT backward graph" in r.stderr
    assert "aten.addmm" in r.stderr or "aten.mm" in r.stderr
