"""The hookspec: ember_graph_passes and ember_compile_event, as plugins see them."""

from __future__ import annotations

import logging
import operator

import pluggy
import pytest
import torch

import ember
from ember import events, hookspecs, plugins
from ember.backends import compile_graph
from ember.plugins import get_backend


def _gm():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)


def _register(obj, name):
    plugins.plugin_manager().register(obj, name=name)
    return obj


def test_every_hook_is_prefixed_and_documented():
    specs = [n for n in dir(hookspecs) if n.startswith("ember_")]
    assert sorted(specs) == ["ember_backends", "ember_compile_event", "ember_graph_passes",
                            "ember_precompile_graph"]
    for n in specs:
        fn = getattr(hookspecs, n)
        assert getattr(fn, "ember_spec", None) is not None, n
        assert len((fn.__doc__ or "").strip().splitlines()) >= 3, f"{n} needs a docstring"
    assert isinstance(ember.hookimpl, pluggy.HookimplMarker)


# -- ember_graph_passes ----------------------------------------------------------------------

class _AddToMul:
    """A torch-stage pass that rewrites `+` into `*`, and records what it saw."""

    def __init__(self):
        self.stages, self.graphs = [], []

    @ember.hookimpl
    def ember_graph_passes(self, stage):
        self.stages.append(stage)
        if stage != "torch":
            return []

        def add_to_mul(gm):
            self.graphs.append(gm)
            for node in gm.graph.nodes:
                if node.op == "call_function" and node.target is operator.add:
                    node.target = operator.mul
            gm.recompile()  # mutates in place: returns None

        return [add_to_mul]


def test_torch_stage_passes_run_before_the_backend_sees_the_graph():
    p = _register(_AddToMul(), "add-to-mul")
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm.code)
        return gm.forward

    x = torch.tensor([-1.0, 2.0, 3.0])
    out = compile_graph(_gm(), [x], get_backend(backend))(x)
    assert p.stages == ["torch"] and len(p.graphs) == 1
    assert torch.equal(out, torch.relu(x) * 1)  # the pass's rewrite reached the backend
    assert "relu * 1" in seen[0]


class _ReturnsNewGraph:
    @ember.hookimpl
    def ember_graph_passes(self):  # opt-in arguments: this one takes none
        def replace(gm):
            return torch.fx.symbolic_trace(lambda x: x - 100)

        return [replace]


def test_pass_may_return_a_new_graph_and_hooks_may_take_fewer_arguments():
    _register(_ReturnsNewGraph(), "replacer")
    x = torch.ones(2)
    out = compile_graph(_gm(), [x], get_backend(lambda gm, ex: gm.forward))(x)
    assert torch.equal(out, x - 100)


class _Recorder:
    def __init__(self, tag, log):
        self.tag, self.log = tag, log

    @ember.hookimpl
    def ember_graph_passes(self, stage):
        return [lambda gm: self.log.append(self.tag)]


def test_passes_run_in_plugin_registration_order():
    order = []
    for tag in ("first", "second", "third"):
        _register(_Recorder(tag, order), f"rec-{tag}")
    compile_graph(_gm(), [torch.ones(1)], get_backend(lambda gm, ex: gm.forward))
    assert order == ["first", "second", "third"]
    assert len(plugins.graph_passes("torch")) == 3


class _NotCallable:
    @ember.hookimpl
    def ember_graph_passes(self, stage):
        return ["not a pass"]


def test_non_callable_pass_is_a_clear_error():
    _register(_NotCallable(), "bad-pass")
    with pytest.raises(TypeError, match="non-callable"):
        plugins.graph_passes("torch")


# -- ember_compile_event -----------------------------------------------------------------------

class _Observer:
    def __init__(self):
        self.events = []

    @ember.hookimpl
    def ember_compile_event(self, event):
        self.events.append(event)


class _Raising:
    @ember.hookimpl
    def ember_compile_event(self, event):
        raise RuntimeError("observer bug")


def test_observers_receive_events_with_kind_data_and_time():
    obs = _register(_Observer(), "observer")
    events.emit("graph_captured", nodes=3, function="f.py:1")
    (ev,) = obs.events
    assert isinstance(ev, events.CompileEvent)
    assert ev.kind == "graph_captured" and ev.data == {"nodes": 3, "function": "f.py:1"}
    assert ev.time > 0
    assert events.counters["events"]["graph_captured"] == 1


def test_raising_observer_never_breaks_the_program_nor_other_observers(caplog):
    first = _register(_Observer(), "observer-1")
    _register(_Raising(), "raising")
    last = _register(_Observer(), "observer-2")
    with caplog.at_level(logging.WARNING, logger="ember.events"):
        events.emit("fallback", reason="r")  # must not raise
    assert len(first.events) == 1 and len(last.events) == 1
    assert any("'raising'" in r.getMessage() and "observer bug" in (r.exc_text or str(r.exc_info))
               for r in caplog.records)


def test_backend_compiled_event_reaches_observers():
    obs = _register(_Observer(), "observer")
    compile_graph(_gm(), [torch.ones(2)], get_backend(lambda gm, ex: gm.forward))
    kinds = [e.kind for e in obs.events]
    assert kinds == ["backend_compiled"]
    assert obs.events[0].data["backend"] == "<lambda>" and obs.events[0].data["seconds"] >= 0


def test_counters_are_cleared_by_reset():
    events.emit("graph_break", reason="x")
    assert events.counters["events"]["graph_break"] == 1
    ember.reset()
    assert events.counters["events"]["graph_break"] == 0
