"""ember.compile end to end through the registry: these need graph capture (core/ember/capture)
to produce graphs; each asserts that a graph really reached the backend, not only that results
match (a fallback to eager would also match)."""

from __future__ import annotations

import torch

import ember
from ember import events, plugins


def f(x, y):
    return torch.sin(x) * y + 1


def _graphs() -> int:
    return events.counters["events"]["backend_compiled"]


def test_eager_backend_compiles_a_graph_and_matches_eager():
    x, y = torch.randn(8), torch.randn(8)
    fast = ember.compile(f, backend="eager")
    assert torch.allclose(fast(x, y), f(x, y))
    assert _graphs() >= 1


def test_callable_backend_receives_graph_and_example_inputs():
    seen = []

    def my_backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    x, y = torch.randn(4), torch.randn(4)
    out = ember.compile(f, backend=my_backend)(x, y)
    assert torch.allclose(out, f(x, y))
    assert len(seen) == 1
    gm, inputs = seen[0]
    assert isinstance(gm, torch.fx.GraphModule)
    assert [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)] == [(4,), (4,)]


def test_decorator_forms():
    @ember.compile(backend="eager")
    def g(x):
        return x.cos() + 2

    @ember.compile
    def h(x):  # the default backend: inductor
        return x + 1

    x = torch.randn(3)
    assert torch.allclose(g(x), x.cos() + 2)
    assert g.__name__ == "g" and _graphs() >= 1
    assert h.backend.name == "inductor"
    with torch.no_grad():
        assert torch.allclose(h(x), x + 1)


def test_module_wrapper_passes_parameters_state_and_mode_through():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    om = ember.compile(m, backend="eager")
    assert isinstance(om, ember.OptimizedModule)
    assert list(om.state_dict()) == list(m.state_dict())
    assert [p is q for p, q in zip(om.parameters(), m.parameters())] == [True] * 4
    om.eval()
    assert not m.training
    om.train()
    assert m.training
    x = torch.randn(3, 4)
    assert torch.allclose(om(x), m(x))
    assert _graphs() >= 1


def test_graph_passes_run_on_captured_graphs():
    seen = []

    class P:
        @ember.hookimpl
        def ember_graph_passes(self, stage):
            return [lambda gm: seen.append((stage, gm))] if stage == "torch" else []

    plugins.plugin_manager().register(P(), name="e2e-pass")
    x, y = torch.randn(4), torch.randn(4)
    assert torch.allclose(ember.compile(f, backend="eager")(x, y), f(x, y))
    assert [s for s, _ in seen] == ["torch"]
    assert any(n.op == "call_function" for n in seen[0][1].graph.nodes)


def test_compile_events_reach_observers():
    got = []

    class Obs:
        @ember.hookimpl
        def ember_compile_event(self, event):
            got.append(event.kind)

    plugins.plugin_manager().register(Obs(), name="e2e-observer")
    ember.compile(f, backend="eager")(torch.randn(2), torch.randn(2))
    assert "backend_compiled" in got


def test_inference_only_backend_refuses_training_graph_at_call():
    ember.register_backend("e2e_infer", lambda gm, ex: gm.forward, training=False)
    w = torch.randn(4, requires_grad=True)

    def g(x):
        return (x * w).sum()

    fast = ember.compile(g, backend="e2e_infer")
    try:
        fast(torch.randn(4))
    except ember.EmberError as e:
        assert "inference-only" in str(e)
    else:
        raise AssertionError("an inference-only backend accepted a graph that needs grad")
    with torch.no_grad():
        assert torch.allclose(fast(torch.ones(4)), w.detach().sum())


def test_ember_logs_graph_prints_the_captured_graph(py):
    res = py("""
        import torch, ember
        def f(x):
            return torch.sin(x) + 1
        ember.compile(f, backend="eager")(torch.randn(3))
    """, env={"EMBER_LOGS": "graph"})
    assert res.returncode == 0, res.stderr
    assert "sin" in res.stderr, res.stderr


def test_demo_compiles_and_matches(py):
    res = py("", args=["-m", "ember", "demo", "--iters", "3"])
    assert "max abs diff" in res.stdout
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: every backend matched eager" in res.stdout
