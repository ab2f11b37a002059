"""Data-dependent shapes in AOT autograd (issue 9 §2): graphs whose forward or backward holds an
op whose result size or value depends on tensor data (``x[mask]``, ``nonzero``,
``masked_select``, ``x[mask] = v`` and ``index_put`` with a bool mask (their backward is
``grad[mask]``), ``.item()``) are traced with unbacked symbols and compiled as one graph, static or dynamic shapes,
as torch.compile does with ``capture_dynamic_output_shape_ops``; a branch on such a value still
refuses the graph with the reason.

Two levels: ``aot_compile`` directly (every op above reaches AOT), and ``ember.compile`` end to
end, with torch.compile as the oracle for the graph count. Capture breaks the graph on
data-dependent ops in the *forward* (as torch.compile does by default); only a data-dependent
*backward* reaches AOT from ``ember.compile``."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.fx as fx

import ember
import ember.events
from ember.aot import aot_compile

from aot_util import assert_close, lift
from test_dynamic_aot import Spy, _context, dyn_compile, trace

# -- programs ----------------------------------------------------------------------------------


def _setitem(y, m, v):
    y[m] = v  # forward static; the backward of v is grad[m] (an unbacked size)
    return y


fx.wrap("_setitem")  # fx's tracer cannot trace an item assignment; AOT traces through it


def masked_assign(x, m, v, w):
    y = _setitem(x.clone(), m, v)
    return ((y * w).sum(),)


def masked_sum(x, m, w):
    s = x[m]  # an unbacked size in the forward, saved for the backward (sin's)
    return ((s.sin().sum() * w).cos().sum(),)


def nonzero_index(x, w):
    idx = torch.nonzero(x > 0)
    return ((x[idx[:, 0], idx[:, 1]] * w.sum()).sum(),)


def masked_select_out(x, m):
    return (torch.masked_select(x, m).exp() * 2,)  # an output of unbacked size


def index_put_accumulate(x, m, v, w):
    y = torch.index_put(x, (m,), v, accumulate=True)  # the backward of v is grad[m] too
    return ((y * w).sin().sum(),)


def item_scale(x, w):
    return ((x * (w.sum().item() + 1.0)).sum(),)


PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[int], list[torch.Tensor]], tuple]] = {
    # name: (fn, inputs for a size n, which inputs require grad)
    "masked_assign": (masked_assign,
                      lambda n: [torch.randn(n, 5), torch.randn(n, 5) > 0, torch.randn(()),
                                 torch.randn(n, 5)], (0, 2, 3)),
    "masked_sum": (masked_sum, lambda n: [torch.randn(n, 5), torch.randn(n, 5) > 0,
                                          torch.randn(n, 5)], (0, 2)),
    "nonzero_index": (nonzero_index, lambda n: [torch.randn(n, 5), torch.randn(n, 5)], (0, 1)),
    "masked_select_out": (masked_select_out, lambda n: [torch.randn(n, 5),
                                                        torch.randn(n, 5) > 0], (0,)),
    "index_put_accumulate": (index_put_accumulate,
                             lambda n: [torch.randn(n, 5), torch.randn(n, 5) > 0,
                                        torch.randn(()), torch.randn(n, 5)], (0, 2, 3)),
    "item_scale": (item_scale, lambda n: [torch.randn(n, 5), torch.randn(n, 5)], (0, 1)),
}


def _leaves(args: Sequence[torch.Tensor], rg: Sequence[int]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(i in rg) for i, a in enumerate(args)]


def _check(compiled: Callable[..., Any], fn: Callable[..., Any], args: list[torch.Tensor],
           rg: Sequence[int]) -> None:
    """Forward outputs and every input gradient equal eager's."""
    ac, ae = _leaves(args, rg), _leaves(args, rg)
    out, ref = compiled(*ac), fn(*ae)
    assert_close(out, ref)
    if rg:
        g = [torch.randn_like(r) for r in ref]
        torch.autograd.backward(list(out), g)
        torch.autograd.backward(list(ref), g)
        for i in rg:
            assert_close(ac[i].grad, ae[i].grad)


def _unbacked_in(gm: fx.GraphModule) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(n.meta.get("val")) for n in gm.graph.nodes)


# -- AOT level ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_static_training_one_compile_serves_every_mask(name: str) -> None:
    fn, make, rg = PROGRAMS[name]
    spy = Spy()
    torch.manual_seed(0)
    args = make(4)
    gm, _ = lift(fn)
    compiled = aot_compile(gm, _leaves(args, rg), backend=spy.backend, options={},
                           context=_context(gm, None))
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]
    assert any(_unbacked_in(g) for _, g, _ in spy.graphs)
    for seed in range(3):  # new values: other masks, other counts, other .item()s
        torch.manual_seed(seed)
        _check(compiled, fn, make(4), rg)
    assert spy.calls == 6  # 3 forwards, 3 backwards: all through the compiled graphs
    assert len(spy.graphs) == 2  # no new variant


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_static_inference(name: str) -> None:
    fn, make, _ = PROGRAMS[name]
    spy = Spy()
    torch.manual_seed(0)
    gm, _ = lift(fn)
    compiled = aot_compile(gm, make(4), backend=spy.backend, options={},
                           context=_context(gm, None))
    for seed in range(2):
        torch.manual_seed(seed)
        args = make(4)
        assert_close(compiled(*args), fn(*args))
    assert [k for k, _, _ in spy.graphs] == ["inference"]
    assert spy.calls == 2


# masked_select's ATen trace fixes the mask's sizes to the traced ones (torch.compile's too: it
# recompiles per size): see test_dynamic_masked_select_specializes_but_stays_right
@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - {"masked_select_out"}))
def test_dynamic_training_one_graph_for_every_size(name: str) -> None:
    fn, make, rg = PROGRAMS[name]
    spy = Spy()
    torch.manual_seed(0)
    args = make(4)
    gm = trace(fn)
    # dim 0 of every tensor symbolic
    compiled = dyn_compile(gm, _leaves(args, rg), [(0,)] * len(args), spy)
    env = compiled.fake_mode.shape_env
    for n in (4, 6, 3):
        torch.manual_seed(n)
        _check(compiled, fn, make(n), rg)
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]
    assert spy.calls == 6
    assert any(_unbacked_in(g) for _, g, _ in spy.graphs)
    # no guard mentions an unbacked symbol (only the inputs' symbols are guarded)
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    assert not any(symbol_is_type(s, SymT.UNBACKED_INT) for g in env.guards
                   for s in g.expr.free_symbols)


def test_dynamic_masked_select_specializes_but_stays_right() -> None:
    fn, make, rg = PROGRAMS["masked_select_out"]
    spy = Spy()
    torch.manual_seed(0)
    args = make(4)
    compiled = dyn_compile(trace(fn), _leaves(args, rg), [(0,)] * len(args), spy)
    for n in (4, 6, 4, 3):  # the traced size through the graphs, others eagerly (guard fails)
        torch.manual_seed(n)
        _check(compiled, fn, make(n), rg)
    assert spy.calls == 4  # two calls at the traced size, forward and backward each


def test_dynamic_leaves_capture_settings_as_they_were() -> None:
    # capture's ShapeEnv refuses data-dependent ops (a graph break); AOT allows them only while
    # it traces
    fn, make, rg = PROGRAMS["masked_sum"]
    gm = trace(fn)
    from test_dynamic_aot import symbolic_inputs

    args = make(4)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mode, vals = symbolic_inputs(args, [(0,)] * 3, [n.name for n in phs])
    env = mode.shape_env
    import dataclasses

    env.settings = dataclasses.replace(env.settings, allow_scalar_outputs=False,
                                       allow_dynamic_output_shape_ops=False)
    for n, v in zip(phs, vals):
        n.meta["val"] = v
    compiled = aot_compile(gm, _leaves(args, rg), backend=ember.get_backend("aot_eager"),
                           context=_context(gm, mode))
    assert env.settings.allow_dynamic_output_shape_ops is False
    assert env.settings.allow_scalar_outputs is False
    _check(compiled, fn, make(5), rg)


def test_saved_tensor_of_unbacked_size_is_saved_not_recomputed() -> None:
    fn, make, rg = PROGRAMS["masked_sum"]
    spy = Spy()
    args = make(4)
    gm, _ = lift(fn)
    compiled = aot_compile(gm, _leaves(args, rg), backend=spy.backend, options={},
                           context=_context(gm, None))
    bw = spy.graph("backward")
    phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    # the backward reads x[m] (or what it computes from it) as an input of unbacked size
    assert any(isinstance(n.meta.get("val"), torch.Tensor) and _unbacked_in_val(n.meta["val"])
               for n in phs)
    assert torch.ops.aten.nonzero.default not in {n.target for n in bw.graph.nodes}
    _check(compiled, fn, make(4), rg)


def _unbacked_in_val(v: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(v))


def test_mask_count_mismatch_raises_as_eager() -> None:
    # y[m] = v with v of the traced count: another count is a shape error in eager; the
    # compiled graph runs the same ATen op and raises too, never a silent wrong answer
    def fn(x, m, v):
        return (_setitem(x.clone(), m, v) * 2,)

    m = torch.tensor([True, False, True, True])
    x, v = torch.randn(4), torch.randn(3)
    gm, _ = lift(fn)
    compiled = aot_compile(gm, _leaves([x, m, v], (0, 2)), backend=ember.get_backend("aot_eager"),
                           options={})
    _check(compiled, fn, [x, m, v], (0, 2))
    m2 = torch.tensor([True, False, False, True])
    with pytest.raises(RuntimeError):
        fn(*_leaves([x, m2, v], (0, 2)))
    with pytest.raises(RuntimeError):
        compiled(*_leaves([x, m2, v], (0, 2)))


class _ItemInBackward(torch.autograd.Function):
    """A backward that reads a Python number from a tensor (gradient clipping by its max)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 / (g.abs().max().item() + 1.0)


def _item_in_backward(x):
    return _ItemInBackward.apply(x)


fx.wrap("_item_in_backward")


def item_backward(x, w):
    return ((_item_in_backward(x) * w).sum(),)


@pytest.mark.parametrize("via", ["aot_compile", "ember.compile"])
def test_item_inside_the_backward(via: str) -> None:
    args = [torch.randn(4, 5), torch.randn(4, 5)]
    if via == "aot_compile":
        spy = Spy()
        gm, _ = lift(item_backward)
        compiled = aot_compile(gm, _leaves(args, (0, 1)), backend=spy.backend, options={},
                               context=_context(gm, None))
        assert _unbacked_in(spy.graph("backward"))
    else:
        graphs, fallbacks, compiled = _ember_graphs(item_backward, _leaves(args, (0, 1)), None)
        assert (graphs, fallbacks) == (1, 0)
    for seed in range(2):  # the number is read at run time, not baked in
        torch.manual_seed(seed)
        _check(compiled, item_backward, [torch.randn(4, 5), torch.randn(4, 5)], (0, 1))


# -- refusal: a branch on data -----------------------------------------------------------------

def _branch_on_count(x):
    y = x[x > 0]
    return y.sum() if y.shape[0] > 2 else y.prod()


fx.wrap("_branch_on_count")


def _branchy(x):
    return (_branch_on_count(x) * 2,)


@pytest.mark.parametrize("rg", [False, True])
def test_branch_on_unbacked_size_is_refused_with_reason(rg: bool) -> None:
    gm, _ = lift(_branchy)
    with pytest.raises(RuntimeError, match=r"data-dependent shape or value.*u0 > 2.*a branch on it"):
        aot_compile(gm, [torch.randn(5, requires_grad=rg)],
                    backend=ember.get_backend("aot_eager"), options={})


# -- ember.compile end to end, torch.compile as the oracle -------------------------------------

def _torch_graphs(fn: Callable[..., Any], args: list[torch.Tensor], dynamic: bool | None,
                  capture_dynamic_output_shape_ops: bool) -> int:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cc = CompileCounterWithBackend("aot_eager")
    with torch._dynamo.config.patch(
            capture_dynamic_output_shape_ops=capture_dynamic_output_shape_ops):
        out = torch.compile(fn, backend=cc, dynamic=dynamic)(*args)
        torch.autograd.backward([o.sum() for o in out])
    torch._dynamo.reset()
    return cc.frame_count


def _ember_graphs(fn: Callable[..., Any], args: list[torch.Tensor], dynamic: bool | None,
                  backend: str = "aot_eager") -> tuple[int, int, Any]:
    ember.reset()
    ember.events.counters["stats"].clear()
    compiled = ember.compile(fn, backend=backend, dynamic=dynamic)
    out = compiled(*args)
    torch.autograd.backward([o.sum() for o in out])
    stats = dict(ember.events.counters["stats"])
    return stats.get("graphs", 0), stats.get("fallbacks", 0), compiled


E2E = ["masked_assign", "index_put_accumulate"]  # data-dependent backward only: one graph


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", E2E)
def test_ember_compile_one_graph_as_torch_compile(name: str, dynamic: bool) -> None:
    fn, make, rg = PROGRAMS[name]
    torch.manual_seed(0)
    args = make(4)
    # torch.compile compiles it as one graph when its ShapeEnv allows data-dependent outputs
    # (by default the backward's nonzero fails its backend and it breaks the graph there)
    assert _torch_graphs(fn, _leaves(args, rg), dynamic, True) == 1
    graphs, fallbacks, compiled = _ember_graphs(fn, _leaves(args, rg), dynamic)
    assert (graphs, fallbacks) == (1, 0)
    with ember.config.patch(suppress_errors=False):
        for seed in range(3):
            torch.manual_seed(seed)
            for n in ((4, 6) if dynamic else (4,)):
                _check(compiled, fn, make(n), rg)
    assert ember.events.counters["stats"].get("fallbacks", 0) == 0


@pytest.mark.parametrize("name", ["masked_sum", "nonzero_index", "masked_select_out"])
def test_ember_compile_forward_data_dependent_breaks_as_torch_compile(name: str) -> None:
    # capture breaks on a data-dependent op in the forward, as torch.compile does by default;
    # Ember's count is at most torch's (torch also counts an empty graph before the break)
    fn, make, rg = PROGRAMS[name]
    torch.manual_seed(0)
    args = make(4)
    t = _torch_graphs(fn, _leaves(args, rg), None, False)
    graphs, fallbacks, compiled = _ember_graphs(fn, _leaves(args, rg), None)
    assert 1 <= graphs <= t and fallbacks == 0
    _check(compiled, fn, make(4), rg)


class _BranchOnData(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if g[x > 0].shape[0] > 2:  # a branch on a data-dependent size in the backward
            return g * 2
        return g * 3


def test_ember_compile_branch_on_data_in_backward_falls_back_with_reason(caplog) -> None:
    def fn(x, w):
        return ((_BranchOnData.apply(x) * w).sum(),)

    args = [torch.randn(6), torch.randn(6)]
    with caplog.at_level(logging.INFO, logger="ember"):
        graphs, fallbacks, compiled = _ember_graphs(fn, _leaves(args, (0,)), None)
    assert fallbacks == 1
    assert any(r.name == "ember.fallback" and "data-dependent" in r.getMessage()
               and "a branch on it" in r.getMessage() for r in caplog.records)
    _check(compiled, fn, args, (0,))


def _assign_into_input(x, m, v, w):
    x[m] = v  # an input mutated through a mask by a value that requires grad
    return ((x * w).sum(),)


@pytest.mark.parametrize("dynamic", [False, True])
def test_ember_compile_masked_assign_into_an_input(dynamic: bool) -> None:
    ember.reset()
    ember.events.counters["stats"].clear()
    compiled = ember.compile(_assign_into_input, backend="aot_eager", dynamic=dynamic)
    with ember.config.patch(suppress_errors=False):
        for n in (4, 6):
            torch.manual_seed(n)
            x, m = torch.randn(n, 5), torch.randn(n, 5) > 0
            v, w = torch.randn(()), torch.randn(n, 5)
            xc, vc, wc = x.clone(), v.clone().requires_grad_(), w.clone().requires_grad_()
            xe, ve, we = x.clone(), v.clone().requires_grad_(), w.clone().requires_grad_()
            out, ref = compiled(xc, m, vc, wc)[0], _assign_into_input(xe, m, ve, we)[0]
            out.backward()
            ref.backward()
            assert_close(out, ref)
            assert_close(xc, xe)  # the input's new value, as eager's
            assert_close(vc.grad, ve.grad)
            assert_close(wc.grad, we.grad)
    assert ember.events.counters["stats"].get("fallbacks", 0) == 0
