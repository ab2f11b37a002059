"""AOT autograd over symbolic shapes (issue 12): graphs whose placeholders carry symbolic
FakeTensors / SymInts in ``meta["val"]`` and a CompileContext with ``fake_mode`` are traced once
and run at every size; results and gradients match eager.

The fakes are made here as capture makes them (one ShapeEnv, FakeTensorMode(shape_env=...),
``from_tensor`` with a StatelessSymbolicContext and a Source), without capture."""

from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.fx as fx
from torch._guards import GuardSource, Source
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import ember
from ember.aot import aot_compile
from ember.context import CompileContext, InputInfo

from aot_util import assert_close, lift, state_tensors

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class _Src(Source):
    """A minimal Source: what the ShapeEnv records as where a symbol came from."""

    label: str

    @property
    def _name_template(self) -> str:
        return self.label

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


class Spy:
    """aot_eager, recording the ATen graphs it gets and counting calls of what it returns."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, fx.GraphModule, list[Any]]] = []
        self.calls = 0
        aot_eager = ember.get_backend("aot_eager")
        spy = self

        def compile(gm: fx.GraphModule, example_inputs: list[Any], *,
                    context: Any = None) -> Callable[..., Any]:
            spy.graphs.append((context.kind if context is not None else "?", gm,
                               list(example_inputs)))

            def run(*args: Any) -> Any:
                spy.calls += 1
                return gm(*args)

            return run

        self.backend = dataclasses.replace(aot_eager, name="aot_eager_spy", compile=compile)

    def graph(self, kind: str) -> fx.GraphModule:
        return next(g for k, g, _ in self.graphs if k == kind)


def _context(gm: fx.GraphModule, mode: FakeTensorMode | None,
             infos: Sequence[InputInfo] | None = None) -> CompileContext:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if infos is None:
        infos = [InputInfo("symint" if isinstance(n.meta.get("val"), torch.SymInt) else "user",
                           n.name, False) for n in phs]
    ctx = CompileContext(graph_id="dyn_test", kind="inference", inputs=tuple(infos),
                         device="cpu", mode=None, options={})
    if mode is not None:
        if any(f.name == "fake_mode" for f in dataclasses.fields(CompileContext)):
            ctx = dataclasses.replace(ctx, fake_mode=mode)
        else:  # before capture's field lands: the same attribute, set on the instance
            object.__setattr__(ctx, "fake_mode", mode)
    return ctx


def symbolic_inputs(example: Sequence[Any], dynamic: Sequence[Any], names: Sequence[str]
                    ) -> tuple[FakeTensorMode, list[Any]]:
    """Symbolic values for ``example``: a tensor's dims listed in ``dynamic[i]`` (a tuple of
    dims) get symbols; an int with ``dynamic[i]`` true becomes a SymInt."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    vals: list[Any] = []
    for a, dyn, name in zip(example, dynamic, names):
        src = _Src(name)
        if isinstance(a, torch.Tensor):
            sizes = [DimDynamic.DYNAMIC if d in (dyn or ()) else DimDynamic.STATIC
                     for d in range(a.dim())]
            vals.append(mode.from_tensor(
                a, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes), source=src))
        elif dyn:
            vals.append(env.create_symintnode(env.create_symbol(a, src, positive=None), hint=a,
                                              source=src))
        else:
            vals.append(a)
    return mode, vals


def dyn_compile(gm: fx.GraphModule, example: Sequence[Any], dynamic: Sequence[Any],
                spy: Spy | None = None, infos: Sequence[InputInfo] | None = None) -> Any:
    """``aot_compile`` ``gm`` (its placeholders get symbolic meta vals) with fake_mode set."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mode, vals = symbolic_inputs(example, dynamic, [n.name for n in phs])
    for n, v in zip(phs, vals):
        n.meta["val"] = v
    spy = spy or Spy()
    compiled = aot_compile(gm, list(example), backend=spy.backend,
                           context=_context(gm, mode, infos))
    compiled.symbols_before = set(mode.shape_env.var_to_range)  # type: ignore[attr-defined]
    return compiled


def _branch_on_count(x: torch.Tensor) -> Any:
    y = x[x > 0]
    return y.sum() if y.shape[0] > 2 else y.prod()  # a guard on an unbacked size


torch.fx.wrap("_branch_on_count")


def trace(fn: Callable[..., Any]) -> fx.GraphModule:
    gm = fx.symbolic_trace(fn)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    gm.recompile()
    return gm


def _leaf(t: torch.Tensor, rg: bool) -> torch.Tensor:
    return t.detach().clone().requires_grad_(rg)


def check_training(fn: Callable[..., Any], make: Callable[[int], list[Any]],
                   dynamic: Sequence[Any], sizes: Sequence[int], spy: Spy | None = None) -> Spy:
    """One compile at ``sizes[0]``; forward results and input gradients equal eager's at every
    size, through the compiled graphs (the spy counts their calls)."""
    spy = spy or Spy()
    gm = trace(fn)
    first = make(sizes[0])
    compiled = dyn_compile(gm, first, dynamic, spy)
    for s in sizes:
        args = make(s)
        ours = [_leaf(a, a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        ref = [_leaf(a, a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        calls = spy.calls
        out = compiled(*ours)
        exp = fn(*ref)
        exp = exp if isinstance(exp, tuple) else (exp,)
        assert_close(list(out), list(exp))
        loss = sum((o.float() * (k + 1)).sum() for k, o in enumerate(out)
                   if isinstance(o, torch.Tensor) and o.requires_grad)
        loss_ref = sum((o.float() * (k + 1)).sum() for k, o in enumerate(exp)
                       if isinstance(o, torch.Tensor) and o.requires_grad)
        loss.backward()
        loss_ref.backward()
        for a, b in zip(ours, ref):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert_close(a.grad, b.grad)
        assert spy.calls == calls + 2, f"size {s}: the compiled forward/backward did not run"
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"], "compiled more than once"
    assert set(compiled.fake_mode.shape_env.var_to_range) == compiled.symbols_before
    return spy


def check_inference(fn: Callable[..., Any], make: Callable[[int], list[Any]],
                    dynamic: Sequence[Any], sizes: Sequence[int]) -> Spy:
    spy = Spy()
    gm = trace(fn)
    with torch.no_grad():
        compiled = dyn_compile(gm, make(sizes[0]), dynamic, spy)
        for s in sizes:
            args = make(s)
            calls = spy.calls
            out = compiled(*args)
            exp = fn(*args)
            assert_close(list(out), list(exp if isinstance(exp, tuple) else (exp,)))
            assert spy.calls == calls + 1, f"size {s}: the compiled graph did not run"
    assert [k for k, _, _ in spy.graphs] == ["inference"], "compiled more than once"
    assert set(compiled.fake_mode.shape_env.var_to_range) == compiled.symbols_before
    return spy


def _placeholder_vals(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _targets(gm: fx.GraphModule) -> set[Any]:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


# --------------------------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------------------------

def test_inference_pointwise_and_reduction_over_symbolic_dims() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> Any:
        return (torch.sin(x) * y).sum(0), torch.softmax(x, 0), x.mean(1)

    spy = check_inference(f, lambda s: [torch.randn(s, s + 1), torch.randn(s + 1)],
                          [(0, 1), (0,)], [3, 5, 8, 2])
    g = spy.graph("inference")
    vals = _placeholder_vals(g)
    assert all(isinstance(v, torch.Tensor) for v in vals)
    assert any(isinstance(s, torch.SymInt) for s in vals[0].shape), vals[0].shape


def test_inference_reshape_with_computed_sizes() -> None:
    def f(x: torch.Tensor) -> Any:
        n, m = x.size(0), x.size(1)
        flat = x.reshape(n * m)
        halves = x.view(n, m // 2, 2).sum(-1)
        return flat * 2, halves, x.new_zeros((n + 1, m))

    spy = check_inference(f, lambda s: [torch.randn(s, 2 * s)], [(0, 1)], [3, 4, 7])
    assert aten.sym_size.int in _targets(spy.graph("inference"))


def test_inference_symint_argument() -> None:
    def f(x: torch.Tensor, n: int) -> Any:
        return x * n + x.size(0), torch.arange(n) * 2, x.narrow(0, 0, n) + 1

    spy = check_inference(f, lambda s: [torch.randn(s + 2, 3), s], [(0,), True], [2, 4, 6])
    vals = _placeholder_vals(spy.graph("inference"))
    assert isinstance(vals[1], torch.SymInt)
    _, _, example = spy.graphs[0]
    assert type(example[1]) is int and isinstance(example[0], torch.Tensor)


def test_inference_output_views_of_inputs() -> None:
    # outputs that alias the input are regenerated as views, with geometry evaluated per call
    def f(x: torch.Tensor) -> Any:
        return x[1:], x.t(), x.view(-1), x.unsqueeze(0)[:, :, 1:] * 1

    check_inference(f, lambda s: [torch.randn(s, s + 2)], [(0, 1)], [3, 6, 4])


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------

def test_training_pointwise_reduction_and_mean() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        y = torch.tanh(x @ w)
        return y.mean(), y.sum(1), torch.softmax(y, 0)

    def make(s: int) -> list[Any]:
        return [torch.randn(s, 4, requires_grad=True), torch.randn(4, 3, requires_grad=True)]

    spy = check_training(f, make, [(0,), None], [3, 5, 8])
    fw, bw = spy.graph("forward"), spy.graph("backward")
    assert any(isinstance(v, torch.SymInt) for v in _placeholder_vals(bw)) or \
        aten.sym_size.int not in _targets(bw)
    # the backward never reads a size off a tensor the forward did not save
    saved = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    for n in bw.graph.nodes:
        if n.target is aten.sym_size.int:
            assert n.args[0].name in saved


def test_training_sizes_saved_as_symint_outputs() -> None:
    # mean's backward divides by the (symbolic) element count, expand/view by the sizes: they
    # come from the forward as int outputs, not from dead tensors
    def f(x: torch.Tensor) -> Any:
        n = x.size(0)
        return (x.view(n, -1, 2) * 3).mean(1).exp()

    spy = check_training(f, lambda s: [torch.randn(s, 2 * s, requires_grad=True)], [(0, 1)],
                         [2, 3, 5])
    fw, bw = spy.graph("forward"), spy.graph("backward")
    bw_vals = _placeholder_vals(bw)
    assert any(isinstance(v, torch.SymInt) for v in bw_vals), bw.code
    fw_out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    assert any(isinstance(o.meta.get("val"), torch.SymInt) for o in fw_out
               if isinstance(o, fx.Node)), fw.code
    # bw's example inputs are concrete: ints for SymInt placeholders
    _, _, example = spy.graphs[1]
    assert all(type(e) is int for e, v in zip(example, bw_vals) if isinstance(v, torch.SymInt))
    for n in bw.graph.nodes:  # no size read off a primal the forward did not save
        if n.target is aten.sym_size.int:
            assert n.args[0].op == "placeholder"


def test_training_mlp_module_with_parameters() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    gm, names = lift(model)
    params = state_tensors(model, names)
    spy = Spy()
    example = [torch.randn(4, 6)] + params
    compiled = dyn_compile(gm, example, [(0,)] + [None] * len(params), spy)
    for batch in (4, 7, 2, 9):
        x = torch.randn(batch, 6)
        model.zero_grad()
        out = compiled(x, *params)[0]
        (out * torch.arange(3.0)).sum().backward()
        ours = [p.grad.clone() for p in params]
        model.zero_grad()
        ref = model(x)
        (ref * torch.arange(3.0)).sum().backward()
        assert_close(out, ref)
        for a, p in zip(ours, params):
            assert_close(a, p.grad, rtol=1e-4, atol=1e-5)
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]


def test_training_symint_argument_and_views() -> None:
    def f(x: torch.Tensor, n: int) -> Any:
        y = x.narrow(1, 0, n) * n
        return y.transpose(0, 1).reshape(-1), x[:, n:].sum(0)

    def make(s: int) -> list[Any]:
        return [torch.randn(s + 1, s + 3, requires_grad=True), s]

    check_training(f, make, [(0, 1), True], [2, 3, 5])


def test_training_input_requires_grad_output_alias() -> None:
    # an output that is a view of another output; the user gets views with eager's geometry
    def f(x: torch.Tensor) -> Any:
        y = x * 2
        return y, y[1:].t(), y.view(-1)

    check_training(f, lambda s: [torch.randn(s, 3, requires_grad=True)], [(0,)], [3, 5, 4])


def test_inference_then_training_variant_at_another_size() -> None:
    # variants key on requires_grad only: the training variant built at a new size serves all
    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        return (x @ w).relu().sum(0)

    spy = Spy()
    gm = trace(f)
    w = torch.randn(4, 2)
    with torch.no_grad():
        compiled = dyn_compile(gm, [torch.randn(3, 4), w], [(0,), None], spy)
    wr = w.clone().requires_grad_(True)
    for s in (5, 2, 6):
        x = torch.randn(s, 4)
        wr.grad = None
        out = compiled(x, wr)[0]
        out.sum().backward()
        g = wr.grad.clone()
        wr.grad = None
        f(x, wr).sum().backward()
        assert_close(g, wr.grad)
    assert [k for k, _, _ in spy.graphs] == ["inference", "forward", "backward"]
    assert len(compiled._variants) == 2


# --------------------------------------------------------------------------------------------
# guards, data-dependent ops, no new symbols
# --------------------------------------------------------------------------------------------

def test_guard_added_by_tracing_is_checked(caplog: pytest.LogCaptureFixture) -> None:
    # broadcasting two symbolic sizes makes tracing guard on their relation; a call where it
    # does not hold runs eagerly (right answer), never through the graph traced for it
    def f(x: torch.Tensor, y: torch.Tensor) -> Any:
        return x + y

    spy = Spy()
    gm = trace(f)
    with torch.no_grad():
        compiled = dyn_compile(gm, [torch.randn(4, 3), torch.randn(4, 3)], [(0,), (0,)], spy)
        env = compiled.fake_mode.shape_env
        x, y = torch.randn(6, 3), torch.randn(6, 3)
        calls = spy.calls
        assert_close(compiled(x, y)[0], x + y)
        assert spy.calls == calls + 1
        x, y = torch.randn(5, 3), torch.randn(1, 3)  # broadcast: the traced graph's guard fails
        with caplog.at_level(logging.WARNING, logger="ember.aot"):
            out = compiled(x, y)[0]
        assert_close(out, x + y)
        assert env.guards  # the traced graph assumed the sizes equal
        assert spy.calls == calls + 1
        assert "size guard" in caplog.text


def test_data_dependent_op_gets_an_unbacked_size() -> None:
    # nonzero's row count is an unbacked symbol inside the graph, read from the result at run
    # time: one graph serves every input size and every count (tests/aot/test_unbacked.py)
    def f(x: torch.Tensor) -> Any:
        return torch.nonzero(x) * 2

    gm = trace(f)
    spy = Spy()
    with torch.no_grad():
        compiled = dyn_compile(gm, [torch.tensor([0.0, 1.0, 2.0])], [(0,)], spy)
        for x in (torch.tensor([0.0, 1.0, 2.0, 0.0, 3.0]), torch.zeros(4), torch.ones(2)):
            assert_close(compiled(x)[0], f(x))
    assert spy.calls == 3


def test_item_is_read_at_run_time() -> None:
    def f(x: torch.Tensor) -> Any:
        return x * x.sum().item()

    gm = trace(f)
    spy = Spy()
    compiled = dyn_compile(gm, [torch.randn(3, requires_grad=True)], [(0,)], spy)
    for n in (3, 5):
        x = torch.randn(n)
        xc, xe = _leaf(x, True), _leaf(x, True)
        out = compiled(xc)[0]
        ref = f(xe)
        assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        assert_close(xc.grad, xe.grad)
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]


def test_branch_on_data_is_refused_with_reason() -> None:
    def f(x: torch.Tensor) -> Any:
        return _branch_on_count(x)

    gm = trace(f)
    with torch.no_grad(), pytest.raises(RuntimeError, match="data-dependent.*a branch on it"):
        dyn_compile(gm, [torch.tensor([0.0, 1.0, 2.0])], [(0,)])


def test_static_compile_is_unchanged() -> None:
    # no fake_mode: example inputs traced as constants, placeholders plain
    def f(x: torch.Tensor) -> Any:
        return x.view(-1) * 2

    gm = trace(f)
    spy = Spy()
    with torch.no_grad():
        compiled = aot_compile(gm, [torch.randn(2, 3)], backend=spy.backend,
                               context=_context(gm, None))
        compiled(torch.randn(2, 3))
    g = spy.graph("inference")
    assert aten.sym_size.int not in _targets(g)
    assert all(isinstance(s, int) for v in _placeholder_vals(g) for s in v.shape)


# --------------------------------------------------------------------------------------------
# readable names (issue 9 §4)
# --------------------------------------------------------------------------------------------

def test_aten_placeholders_named_after_sources() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.fc(x)).relu()

    model = Net()
    gm, names = lift(model)
    state = state_tensors(model, names)
    infos = [InputInfo("user", "x", False)]
    for n in names:
        mod, leaf = n.rsplit(".", 1)
        is_param = isinstance(state[names.index(n)], torch.nn.Parameter)
        infos.append(InputInfo("parameter" if is_param else "buffer",
                               f"self._modules['{mod}']."
                               f"{'_parameters' if is_param else '_buffers'}['{leaf}']", True))
    spy = Spy()
    compiled = aot_compile(gm, [torch.randn(5, 4)] + state, backend=spy.backend,
                           context=_context(gm, None, infos))
    out = compiled(torch.randn(5, 4), *state)[0]
    out.sum().backward()
    fw_names = [n.name for n in spy.graph("forward").graph.nodes if n.op == "placeholder"]
    assert fw_names[:3] == ["l_x", "p_fc_weight", "p_fc_bias"], fw_names
    assert "b_bn_running_mean" in fw_names and "p_bn_weight" in fw_names
    bw_names = [n.name for n in spy.graph("backward").graph.nodes if n.op == "placeholder"]
    assert "tangents_1" in bw_names
    assert all(n.isidentifier() for n in fw_names + bw_names)
    assert len(set(fw_names)) == len(fw_names)


def test_readable_name_forms() -> None:
    from ember.aot.names import readable_name, readable_names

    assert readable_name("parameter", "self._modules['fc']._parameters['weight']") == \
        "p_fc_weight"
    assert readable_name("buffer", "self._modules['0']._buffers['running_mean']") == \
        "b_0_running_mean"
    assert readable_name("user", "x") == "l_x"
    assert readable_name("user", "L['x']") == "l_L_x"
    assert readable_name("", "", "arg0") == "arg0"
    long = readable_name("parameter", "self." + ".".join(["block"] * 40) + ".weight")
    assert long.isidentifier() and long.endswith("_weight") and len(long) <= 80
    infos = [InputInfo("user", "x", False), InputInfo("user", "x", False)]
    assert readable_names(infos, ["a", "b"]) == ["l_x", "l_x_1"]
    assert readable_names([], ["3d", "class"]) == ["_3d", "_class"]


# --------------------------------------------------------------------------------------------
# end to end: ember.compile(..., dynamic=True) with capture's fake_mode
# --------------------------------------------------------------------------------------------

@pytest.fixture
def aten_spy() -> Any:
    """An in-process level="aten" backend: aot_eager, recording the kinds of graph it gets and
    whether their placeholders are symbolic."""
    seen: list[tuple[str, bool]] = []

    def compile_spy(gm: fx.GraphModule, example_inputs: list[Any], *,
                    context: Any = None) -> Callable[..., Any]:
        symbolic = any(isinstance(s, torch.SymInt) for v in _placeholder_vals(gm)
                       for s in (v.shape if isinstance(v, torch.Tensor) else (v,)))
        seen.append((context.kind, symbolic))
        return gm.forward

    ember.register_backend("aot_dyn_spy", compile_spy, level="aten")
    return seen


def test_e2e_training_one_graph_for_all_sizes(aten_spy: list[tuple[str, bool]]) -> None:
    assert ember.aot.SUPPORTS_DYNAMIC

    def f(x: torch.Tensor, w: torch.Tensor, n: int) -> Any:
        y = (x @ w).relu()
        z = y.view(y.size(0), -1, 2).mean(1) * n
        return z, y[1:].t(), x.narrow(0, 0, n).sum(0)

    c = ember.compile(f, backend="aot_dyn_spy", dynamic=True)
    w = torch.randn(4, 6, requires_grad=True)
    for b, n in ((3, 2), (5, 3), (7, 4), (4, 2), (9, 5)):
        x = torch.randn(b, 4, requires_grad=True)
        x2, w2 = _leaf(x, True), _leaf(w, True)
        out, ref = c(x, w, n), f(x2, w2, n)
        assert_close(list(out), list(ref))
        sum((o * (i + 1)).sum() for i, o in enumerate(out)).backward()
        sum((o * (i + 1)).sum() for i, o in enumerate(ref)).backward()
        assert_close(x.grad, x2.grad)
        assert_close(w.grad, w2.grad)
        w.grad = None
    assert aten_spy == [("forward", True), ("backward", True)]


def test_e2e_module_batch_sweep_aot_eager() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    c = ember.compile(model, backend="aot_eager", dynamic=True)
    for b in (3, 5, 7, 2, 9):
        x = torch.randn(b, 6)
        model.zero_grad()
        out = c(x)
        out.pow(2).sum().backward()
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ref = model(x)
        ref.pow(2).sum().backward()
        assert_close(out, ref)
        for a, p in zip(ours, model.parameters()):
            assert_close(a, p.grad, rtol=1e-4, atol=1e-5)


def test_specializing_decomposition_is_reported_and_checked(
        caplog: pytest.LogCaptureFixture) -> None:
    # a decomposition that reads a size as a Python int fixes it: the warning says so, and a
    # call at another size does not run the graph traced for the first one
    def cos_fixing_size(x: torch.Tensor) -> torch.Tensor:
        n = int(x.shape[0])  # specializes the symbol
        return torch.sin(x + 1.5707963267948966) * (n // n)

    spy = Spy()
    spy.backend = dataclasses.replace(spy.backend, decompositions={aten.cos.default:
                                                                   cos_fixing_size})
    gm = trace(lambda x: torch.cos(x) * 2)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ember.aot"):
        compiled = dyn_compile(gm, [torch.randn(4, 3)], [(0,)], spy)
        assert "specialized sizes to constants" in caplog.text
        x = torch.randn(4, 3)
        assert_close(compiled(x)[0], torch.cos(x) * 2)
        calls = spy.calls
        x = torch.randn(6, 3)
        assert_close(compiled(x)[0], torch.cos(x) * 2)
        assert spy.calls == calls  # ran eagerly: the traced graph holds only for 4 rows


def test_training_input_mutation_and_batchnorm_buffers() -> None:
    # running statistics (mutated buffers) and an in-place update of a user input, at several
    # sizes through one compile
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU())
    ref_model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                    torch.nn.ReLU())
    ref_model.load_state_dict(model.state_dict())
    gm, names = lift(model)
    state = state_tensors(model, names)
    spy = Spy()
    # batch and image size symbolic
    compiled = dyn_compile(gm, [torch.randn(2, 3, 6, 7)] + state,
                           [(0, 2, 3)] + [None] * len(state), spy)
    for b, h in ((2, 6), (3, 9), (4, 5)):
        x = torch.randn(b, 3, h, h + 1)
        model.zero_grad()
        ref_model.zero_grad()
        out = compiled(x, *state)[0]
        ref = ref_model(x)
        assert_close(out, ref, rtol=1e-4, atol=1e-5)
        out.square().sum().backward()
        ref.square().sum().backward()
        assert_close(model[0].weight.grad, ref_model[0].weight.grad, rtol=1e-4, atol=1e-4)
        assert_close(model[1].running_mean, ref_model[1].running_mean)
        assert_close(model[1].running_var, ref_model[1].running_var)
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]


def test_training_user_input_mutated() -> None:
    def f(x: torch.Tensor, acc: torch.Tensor) -> Any:
        acc.add_(x.sum(0))
        return (x * acc).tanh()

    def make(s: int) -> list[Any]:
        return [torch.randn(s, 3, requires_grad=True), torch.zeros(3)]

    gm = trace(f)
    spy = Spy()
    compiled = dyn_compile(gm, make(4), [(0,), None], spy)
    for s in (4, 6, 2):
        x, acc = make(s)
        x2, acc2 = _leaf(x, True), acc.clone()
        out = compiled(x, acc)[0]
        ref = f(x2, acc2)
        assert_close(out, ref)
        assert_close(acc, acc2)
        out.sum().backward()
        ref.sum().backward()
        assert_close(x.grad, x2.grad)
    assert [k for k, _, _ in spy.graphs] == ["forward", "backward"]


def test_training_under_autocast() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        return (x @ w).float().softmax(-1)

    spy = Spy()
    gm = trace(f)
    w = torch.randn(5, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled = dyn_compile(gm, [torch.randn(3, 5), w], [(0,), None], spy)
        for s in (3, 7):
            x = torch.randn(s, 5)
            w.grad = None
            out = compiled(x, w)[0]
            out.square().sum().backward()
            g = w.grad.clone()
            w.grad = None
            ref = f(x, w)
            ref.square().sum().backward()
            assert out.dtype == ref.dtype
            assert_close(out, ref)
            assert_close(g, w.grad)


@pytest.mark.parametrize("dynamic", [False, True])
def test_input_alias_of_an_input_with_another_storage_offset(dynamic: bool) -> None:
    # capture guards sizes and strides, not storage offsets: x and big[k:] with the same
    # geometry reach one graph; a returned view of the input starts where the input starts
    def f(x: torch.Tensor) -> Any:
        return x[1:], x.view(torch.int32)[:, 2:], torch.view_as_real(x.to(torch.complex64)[1:])

    gm = trace(f)
    spy = Spy()
    x = torch.randn(4, 5)
    with torch.no_grad():
        if dynamic:
            compiled = dyn_compile(gm, [x], [(0,)], spy)
        else:
            compiled = aot_compile(gm, [x], backend=spy.backend, context=_context(gm, None))
        for k in (0, 1, 3):
            y = torch.randn(4 + k, 5)[k:]
            out, ref = compiled(y), f(y)
            for a, b in zip(out, ref):
                assert torch.equal(a, b)
            assert out[0].storage_offset() == ref[0].storage_offset()
            assert out[0].data_ptr() == ref[0].data_ptr()
            assert out[1].data_ptr() == ref[1].data_ptr()


# --------------------------------------------------------------------------------------------
# a warm start (persisted capture) of a graph with symbolic sizes
# --------------------------------------------------------------------------------------------

_WARM_PROGRAM = '''
import torch, ember

def f(x, w):
    return (x * w).sum(dim=0)

cf = ember.compile(f, backend="aot_eager", dynamic=True)
for n in (4, 6):
    x = torch.randn(n, 5, requires_grad=True)
    w = torch.randn(n, 5)
    out = cf(x, w)
    out.sum().backward()
    assert torch.allclose(out, (x * w).sum(dim=0)) and torch.allclose(x.grad, w)
print("ok")
'''


def test_warm_start_keeps_symbolic_graph_symbolic(tmp_path: Any) -> None:
    # A persisted capture is rebuilt without its FakeTensorMode: had a graph with symbolic sizes
    # been stored, AOT would trace the rebuilt one with the example sizes while the guards
    # admit every size (the second process failed at n=6). Such captures are not stored.
    import os
    import subprocess
    import sys

    prog = tmp_path / "warm_prog.py"
    prog.write_text(_WARM_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env["EMBER_CACHE_DIR"] = str(tmp_path / "cache")
    for run in range(2):
        r = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == "ok", (run, r.stderr[-2000:])
