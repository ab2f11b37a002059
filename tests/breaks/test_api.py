"""The user-facing API around graph breaks: ``ember.explain``, ``fullgraph=True`` errors,
``ember.disable``, ``ember.allow_in_graph``, ``EMBER_LOGS`` artifacts, the recompile limit, and
side effects across breaks happening once and in order."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Iterator

import pytest
import torch

import ember
import ember.events

THIS_FILE = __file__


def _where(fn: Callable[..., Any], needle: str) -> str:
    """``file:line`` of the first line of ``fn``'s source that contains ``needle``."""
    lines, first = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if needle in text:
            return f"{THIS_FILE}:{first + i}"
    raise AssertionError(f"{needle!r} not in the source of {fn.__name__}")


class Counting:
    """A backend that records every graph it receives and runs it unchanged."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward


def _ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    ember.reset()
    yield
    ember.reset()


# ---- programs --------------------------------------------------------------------------------

def two_breaks(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    print("two_breaks: between graphs")
    z = y * 2
    if z.sum() > 0:
        return z - 1
    return z + 1


def no_breaks(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + 1).sum(dim=-1)


def item_break(x: torch.Tensor) -> torch.Tensor:
    s = x.sum().item()
    return x * s


def shape_printer(x: torch.Tensor) -> torch.Tensor:
    print("shape", tuple(x.shape))
    return x * 2


def calls_twice(x: torch.Tensor) -> torch.Tensor:
    a = shape_printer(x)
    b = shape_printer(x[:1])
    return a.sum() + b.sum()


def breaks_in_loop(x: torch.Tensor) -> torch.Tensor:
    for i in range(3):
        x = x + 1
        print("iteration", i)
    return x


# ---- ember.explain ---------------------------------------------------------------------------

def test_explain_counts_graphs_and_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    report = ember.explain(two_breaks)(x)
    assert capsys.readouterr().out == "two_breaks: between graphs\n"  # ran exactly once
    torch.testing.assert_close(report.result, two_breaks(x))
    capsys.readouterr()

    assert report.graph_count == len(report.graphs) == 3
    assert report.break_count == len(report.breaks) == 2
    assert report.fallbacks == [] and report.recompiles == []

    first, second = report.breaks
    assert "print" in first.reason
    assert first.where == _where(two_breaks, "print(")
    assert first.function == "two_breaks"
    assert "data-dependent" in second.reason
    assert second.where == _where(two_breaks, "if z.sum()")
    assert "two_breaks" in second.function  # the resume function of two_breaks

    g1, g2, g3 = report.graphs
    assert g1.function == "two_breaks" and THIS_FILE in g1.where
    assert g1.op_counts == {"add": 1} and g1.ops == 1
    assert g2.op_counts == {"mul": 1, "sum": 1, "gt": 1} and g2.ops == 3
    assert g3.op_counts == {"sub": 1}  # sum(z) > 0 on this input: the first return
    for g in report.graphs:
        assert "def forward" in g.code
    assert report.op_count == 5

    # Guards: one entry per compiled function, each checking the tensor it was given.
    assert len(report.guards) == 3
    fn, guards = report.guards[0]
    assert "two_breaks" in fn
    assert any("(x).shape == (3,)" in g and "(x).dtype" in g for g in guards), guards
    assert any("is_grad_enabled" in g for g in guards), guards


def test_explain_report_prints() -> None:
    report = ember.explain(two_breaks)(torch.ones(3))
    text = str(report)
    assert text == repr(report)
    assert text.startswith("Graphs: 3  (ops: 5)\nGraph breaks: 2\n")
    assert "  1. print() inside a compiled region" in text
    assert f"at {_where(two_breaks, 'print(')} in two_breaks" in text
    assert f"at {_where(two_breaks, 'if z.sum()')}" in text
    assert "Graph 1: two_breaks" in text and "add x1" in text
    assert "Guards (" in text and "(x).shape == (3,)" in text


def test_explain_without_breaks() -> None:
    x = torch.randn(2, 5)
    report = ember.explain(no_breaks)(x)
    assert (report.graph_count, report.break_count) == (1, 0)
    assert report.fallbacks == [] and report.recompiles == []
    assert report.graphs[0].op_counts == {"mul": 1, "add": 1, "relu": 1, "sum": 1}
    torch.testing.assert_close(report.result, no_breaks(x))
    assert "Graph breaks: 0" in str(report)


def test_explain_item_break_names_line() -> None:
    x = torch.tensor([1.0, 2.0])
    report = ember.explain(item_break)(x)
    torch.testing.assert_close(report.result, item_break(x))
    assert report.break_count == 1
    assert report.breaks[0].where == _where(item_break, ".item()")
    assert "item" in report.breaks[0].reason


def test_explain_reports_recompiles_of_a_callee(capsys: pytest.CaptureFixture[str]) -> None:
    """A callee with a break is compiled as its own frame; calling it again with a new shape in
    the same run is a recompile, reported with the guard that failed."""
    x = torch.ones(3)
    report = ember.explain(calls_twice)(x)
    assert capsys.readouterr().out == "shape (3,)\nshape (1,)\n"
    torch.testing.assert_close(report.result, calls_twice(x))
    assert report.recompiles, str(report)
    fn, why = report.recompiles[0]
    assert "shape_printer" in fn and "shape == (3,)" in why
    assert [b.where for b in report.breaks].count(_where(shape_printer, "print(")) == 2


def test_explain_reports_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    """A break inside a loop makes the frame run eagerly (as torch.compile does)."""
    x = torch.zeros(2)
    report = ember.explain(breaks_in_loop)(x)
    assert capsys.readouterr().out == "iteration 0\niteration 1\niteration 2\n"
    torch.testing.assert_close(report.result, torch.full((2,), 3.0))
    assert report.graph_count == 0
    assert len(report.fallbacks) == 1
    fn, why = report.fallbacks[0]
    assert "breaks_in_loop" in fn
    assert "loop" in why and _where(breaks_in_loop, "print(") in why
    assert "Ran eagerly: 1" in str(report)


def test_explain_resets_first() -> None:
    """explain() captures afresh even when the function is already compiled and cached."""
    compiled = ember.compile(no_breaks, backend="eager")
    compiled(torch.ones(2, 2))
    report = ember.explain(no_breaks)(torch.ones(2, 2))
    assert report.graph_count == 1 and len(report.guards) == 1


# ---- fullgraph=True --------------------------------------------------------------------------

def test_fullgraph_error_lists_every_break() -> None:
    compiled = ember.compile(two_breaks, backend="eager", fullgraph=True)
    with pytest.raises(ember.GraphBreakError) as info:
        compiled(torch.ones(3))
    err = info.value
    assert isinstance(err, ember.EmberError)
    msg = str(err)
    assert "fullgraph=True" in msg and "2 graph break(s)" in msg
    assert "two_breaks" in msg
    lines = msg.splitlines()
    one = [i for i, s in enumerate(lines) if s.strip().startswith("1. ")]
    two = [i for i, s in enumerate(lines) if s.strip().startswith("2. ")]
    assert one and two and one[0] < two[0], msg
    assert "print" in lines[one[0]] and "data-dependent" in lines[two[0]]
    assert msg.index(_where(two_breaks, "print(")) < msg.index(_where(two_breaks, "if z.sum()"))
    assert len(err.breaks) == 2
    assert _where(two_breaks, "print(") in str(err.breaks[0])


def test_fullgraph_error_on_item() -> None:
    with pytest.raises(ember.GraphBreakError) as info:
        ember.compile(item_break, backend="eager", fullgraph=True)(torch.ones(2))
    assert "1 graph break(s)" in str(info.value)
    assert _where(item_break, ".item()") in str(info.value)
    assert len(info.value.breaks) == 1


def test_fullgraph_without_breaks_works() -> None:
    be = Counting()
    compiled = ember.compile(no_breaks, backend=be, fullgraph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), no_breaks(x))
    torch.testing.assert_close(compiled(x + 1), no_breaks(x + 1))
    assert len(be.graphs) == 1
    assert ember.events.counters["stats"]["graphs"] == 1


def test_fullgraph_module_without_breaks_works() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = ember.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))


def test_fullgraph_decorator_form() -> None:
    @ember.compile(backend="eager", fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        print("no")
        return x

    with pytest.raises(ember.GraphBreakError):
        f(torch.ones(1))


# ---- ember.disable ---------------------------------------------------------------------------

def test_disabled_function_is_never_compiled() -> None:
    be = Counting()
    inner = ember.compile(lambda t: t * 3, backend=be)

    @ember.disable
    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x) + 1  # an ember-compiled function called from a disabled one

    x = torch.arange(4.0)
    for _ in range(2):
        torch.testing.assert_close(outer(x), x * 3 + 1)
    compiled_outer = ember.compile(outer, backend=be)
    torch.testing.assert_close(compiled_outer(x), x * 3 + 1)
    assert ember.events.counters["stats"]["graphs"] == 0
    assert be.graphs == []
    # The ember-compiled function still compiles when called on its own.
    torch.testing.assert_close(inner(x), x * 3)
    assert ember.events.counters["stats"]["graphs"] == 1


def test_disable_as_decorator_with_arguments() -> None:
    @ember.disable(recursive=True)
    def f(x: torch.Tensor) -> torch.Tensor:
        return x - 1

    torch.testing.assert_close(ember.compile(f, backend="eager")(torch.ones(2)), torch.zeros(2))
    assert ember.events.counters["stats"]["graphs"] == 0


@ember.disable
def _eager_only(x: torch.Tensor) -> torch.Tensor:
    _eager_only.calls += 1  # type: ignore[attr-defined]
    return x.cos() * 2


_eager_only.calls = 0  # type: ignore[attr-defined]


def calls_disabled(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    y = _eager_only(y)
    return y + 1


def test_call_to_disabled_function_is_a_break() -> None:
    x = torch.linspace(-1, 1, 5)
    expected = (x.sin().cos() * 2) + 1
    be = Counting()
    _eager_only.calls = 0  # type: ignore[attr-defined]
    compiled = ember.compile(calls_disabled, backend=be)
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(compiled(x), expected)
    assert _eager_only.calls == 2  # type: ignore[attr-defined]  # ran eagerly, once per call
    assert len(be.graphs) == 2  # before and after the break; no graph holds cos
    targets = [str(n.target) for g in be.graphs for n in _ops(g)]
    assert not any("cos" in t for t in targets), targets
    breaks = ember.events.counters["graph_breaks"]
    assert sum(breaks.values()) == 1
    assert any("disable" in r for r in breaks), dict(breaks)

    report = ember.explain(calls_disabled)(x)
    assert report.break_count == 1
    assert report.breaks[0].where == _where(calls_disabled, "_eager_only(y)")


# ---- ember.allow_in_graph --------------------------------------------------------------------

def _opaque(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b + torch.sin(a) - b.exp()


ember.allow_in_graph(_opaque)


def uses_opaque(x: torch.Tensor) -> torch.Tensor:
    return _opaque(x, x + 1).relu()


def test_allow_in_graph_is_one_node() -> None:
    be = Counting()
    compiled = ember.compile(uses_opaque, backend=be)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), uses_opaque(x))
    torch.testing.assert_close(compiled(x * 2), uses_opaque(x * 2))
    assert len(be.graphs) == 1
    nodes = _ops(be.graphs[0])
    calls = [n for n in nodes if n.op == "call_function" and n.target is _opaque]
    assert len(calls) == 1, be.graphs[0].graph
    # Nothing from inside _opaque was traced into the graph.
    names = [getattr(n.target, "__name__", str(n.target)) for n in nodes]
    assert "sin" not in names and "exp" not in names, names
    assert len(nodes) == 3  # add, _opaque, relu


def test_allow_in_graph_returns_the_function() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        return t + 2

    assert ember.allow_in_graph(f) is f


def test_allow_in_graph_with_grad() -> None:
    x = torch.randn(4, requires_grad=True)
    out = ember.compile(uses_opaque, backend="eager")(x)
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    uses_opaque(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


# ---- EMBER_LOGS artifacts --------------------------------------------------------------------

ARTIFACT_LOGGERS = ("graph_breaks", "recompiles", "graph", "guards", "output_code")


@pytest.fixture()
def artifact_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Route the artifact loggers into caplog; restore their state afterwards.

    ``ember.set_logs`` gives each artifact logger its own stderr handler with ``propagate=False``,
    so records never reach caplog's root handler: attach caplog's handler to them directly.
    """
    loggers = [logging.getLogger(f"ember.{n}") for n in ARTIFACT_LOGGERS]
    saved = [(lg, lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        lg.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    try:
        yield caplog
    finally:
        ember.set_logs("")
        for lg, level, propagate, handlers in saved:
            lg.setLevel(level)
            lg.propagate = propagate
            lg.handlers[:] = handlers


def _records(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == f"ember.{name}"]


def test_logs_graph_breaks_recompiles_graph(artifact_logs: pytest.LogCaptureFixture,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    ember.set_logs("graph_breaks,recompiles,graph")
    compiled = ember.compile(two_breaks, backend="eager")
    compiled(torch.ones(3))
    compiled(torch.ones(4))  # new shape: recompile
    breaks = _records(artifact_logs, "graph_breaks")
    assert breaks and any(_where(two_breaks, "print(") in m and "print" in m for m in breaks)
    assert any(_where(two_breaks, "if z.sum()") in m for m in breaks), breaks
    graphs = _records(artifact_logs, "graph")
    assert len(graphs) >= 3 and all("captured graph" in m for m in graphs)
    assert any("def forward" in m and "two_breaks" in m for m in graphs)
    recompiles = _records(artifact_logs, "recompiles")
    assert recompiles and "two_breaks" in recompiles[0] and "guard failed" in recompiles[0]
    assert "shape == (3,)" in recompiles[0]


def test_logs_guards_and_output_code(artifact_logs: pytest.LogCaptureFixture) -> None:
    ember.set_logs("guards,output_code")
    ember.compile(no_breaks, backend="eager")(torch.ones(2, 3))
    guards = _records(artifact_logs, "guards")
    assert len(guards) == 1 and "guards for" in guards[0]
    assert "(x).shape == (2, 3)" in guards[0]
    code = _records(artifact_logs, "output_code")
    assert len(code) == 1 and "def ___entry(___fn, x)" in code[0]


def test_logs_off_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    """With no artifact enabled (loggers in their default state), compiling a function with
    breaks writes nothing to stderr: breaks are logged at INFO only."""
    loggers = [logging.getLogger(f"ember.{n}") for n in ARTIFACT_LOGGERS]
    saved = [(lg, lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    ember.set_logs("")
    for lg in loggers:
        lg.setLevel(logging.NOTSET)
        lg.propagate = True
        lg.handlers[:] = []
    try:
        capsys.readouterr()
        ember.compile(two_breaks, backend="eager")(torch.ones(2))
        captured = capsys.readouterr()
        assert captured.out == "two_breaks: between graphs\n"
        assert captured.err == ""
    finally:
        for lg, level, propagate, handlers in saved:
            lg.setLevel(level)
            lg.propagate = propagate
            lg.handlers[:] = handlers


# ---- recompile limit -------------------------------------------------------------------------

def scale(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n


def test_recompile_limit_runs_eagerly_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    be = Counting()
    x = torch.ones(2)
    with ember.config.patch(recompile_limit=2), caplog.at_level(logging.WARNING):
        # dynamic=False: with automatic dynamic (the default) the changing int would become a
        # symbolic int after its first change instead (tests/dynamic)
        compiled = ember.compile(scale, backend=be, dynamic=False)
        for n in range(6):
            torch.testing.assert_close(compiled(x, n), x * n)
        torch.testing.assert_close(compiled(x, 0), x * 0)  # an old entry still serves n == 0
    assert len(be.graphs) == 2  # n == 0, then one recompile for n == 1; then eager
    stats = ember.events.counters["stats"]
    assert stats["graphs"] == 2 and stats["recompiles"] == 2
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "recompile limit" in r.getMessage()]
    assert len(warnings) == 1, warnings
    msg = warnings[0]
    assert "scale" in msg and "(2)" in msg
    assert "(n) == 1" in msg  # names the guard that kept failing
    assert "recompile_limit" in msg


def test_recompile_limit_default_is_eight() -> None:
    assert ember.config.recompile_limit == 8
    with ember.config.patch(recompile_limit=3):
        assert ember.config.recompile_limit == 3
    assert ember.config.recompile_limit == 8


def test_reset_forgets_given_up_functions() -> None:
    x = torch.ones(2)
    with ember.config.patch(recompile_limit=1):
        compiled = ember.compile(scale, backend="eager")
        compiled(x, 1)
        compiled(x, 2)  # over the limit: eager from now on
        assert ember.events.counters["stats"]["graphs"] == 1
        ember.reset()
        compiled(x, 3)
        assert ember.events.counters["stats"]["graphs"] == 1


# ---- side effects across breaks --------------------------------------------------------------

LOG: list[Any] = []


def effects(x: torch.Tensor, acc: list[Any]) -> torch.Tensor:
    acc.append("start")
    LOG.append(1)
    y = x * 2
    print("first", len(acc))
    acc.append(float(y.sum()))
    LOG.append(2)
    if y.sum() > 0:
        acc.append("positive")
        print("second")
        y = y + 1
    else:
        acc.append("negative")
    LOG.append(3)
    acc.append(y.sum().item())
    print("third", acc[-1])
    return y


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["pos", "neg"])
def test_side_effects_once_in_order(sign: float, capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.tensor([1.0, 2.0]) * sign
    LOG.clear()
    ref_acc: list[Any] = []
    ref = effects(x, ref_acc)
    ref_out, ref_log = capsys.readouterr().out, list(LOG)

    compiled = ember.compile(effects, backend="eager")
    for call in range(3):  # compile, then cached entries (twice)
        LOG.clear()
        acc: list[Any] = []
        got = compiled(x, acc)
        torch.testing.assert_close(got, ref)
        assert capsys.readouterr().out == ref_out, f"call {call}"
        assert acc == ref_acc, f"call {call}"
        assert LOG == ref_log, f"call {call}"
    assert ember.events.counters["stats"]["graphs"] >= 2  # it did split and compile
    assert ember.events.counters["stats"]["fallbacks"] == 0


def test_side_effects_interleave_with_print_in_callee(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def helper(t: torch.Tensor) -> torch.Tensor:
        seen.append("helper-before")
        print("in helper")
        seen.append("helper-after")
        return t + 1

    def f(t: torch.Tensor) -> torch.Tensor:
        seen.append("f-before")
        print("in f")
        u = helper(t * 2)
        seen.append("f-after")
        print("done")
        return u

    x = torch.ones(3)
    expected = f(x)
    ref_seen, ref_out = list(seen), capsys.readouterr().out
    seen.clear()
    torch.testing.assert_close(ember.compile(f, backend="eager")(x), expected)
    assert seen == ref_seen
    assert capsys.readouterr().out == ref_out == "in f\nin helper\ndone\n"
