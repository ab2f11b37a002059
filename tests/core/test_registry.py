"""The backend registry: declarations, in-process registration, listing, the table, conflicts."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import plugins
from ember.plugins import Backend, backend_table, get_backend, list_backends, register_backend

FIRST_PARTY = {"eager": ("ember-eager", "torch"), "aot_eager": ("ember-aot-eager", "aten"),
               "inductor": ("ember-inductor", "aten"), "cudagraphs": ("ember-cudagraphs", "aten")}


def _gm():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)


def passthrough(gm, example_inputs, **options):
    return gm.forward


# -- Backend declarations ---------------------------------------------------------------------

def test_backend_validates_level_name_and_compile():
    with pytest.raises(ValueError, match="level must be 'torch' or 'aten'"):
        Backend(name="x", compile=passthrough, level="bytecode")
    with pytest.raises(ValueError, match="non-empty string"):
        Backend(name="", compile=passthrough)
    with pytest.raises(TypeError, match="compile must be callable"):
        Backend(name="x", compile="not callable")


def test_backend_normalises_tuples_and_is_hashable_with_decomposition_dict():
    b = Backend(name="x", compile=passthrough, devices=["cpu"], tags="debug",
                decompositions={torch.ops.aten.relu.default: lambda x: x})
    assert b.devices == ("cpu",) and b.tags == ("debug",)
    hash(b)  # a dict of decompositions must not make the declaration unhashable
    assert torch.ops.aten.relu.default in b.get_decompositions()


def test_decompositions_callable_is_called_lazily():
    calls = []

    def table():
        calls.append(1)
        return {"op": "fn"}

    b = Backend(name="x", compile=passthrough, level="aten", decompositions=table)
    assert calls == []
    assert b.get_decompositions() == {"op": "fn"} and calls == [1]
    assert Backend(name="y", compile=passthrough).get_decompositions() == {}


# -- listing ---------------------------------------------------------------------------------

def test_first_party_backends_are_discovered_with_their_distribution():
    rows = {r["name"]: r for r in backend_table()}
    for name, (dist, level) in FIRST_PARTY.items():
        assert rows[name]["distribution"] == dist
        assert rows[name]["level"] == level
        assert rows[name]["status"] == "ok"
        assert rows[name]["version"] == "0.1.0"
    assert rows["cudagraphs"]["devices"] == "cuda"


def test_list_backends_hides_experimental_by_default():
    default = list_backends()
    assert {"eager", "aot_eager"} <= set(default)
    assert "inductor" in default and "cudagraphs" in default  # first-party, no longer tagged
    register_backend("exp_backend", passthrough, tags=("experimental",), override=True)
    assert "exp_backend" not in list_backends()
    assert "exp_backend" in list_backends(exclude_tags=())
    everything = list_backends(exclude_tags=())
    assert set(FIRST_PARTY) <= set(everything)
    assert list_backends(exclude_tags=None) == everything
    assert everything == sorted(everything)
    assert ember.list_backends is list_backends


def test_exclude_tags_applies_to_in_process_backends():
    register_backend("dbg_backend", passthrough, tags=("debug",))
    assert "dbg_backend" not in list_backends()
    assert "dbg_backend" in list_backends(exclude_tags=())
    assert "dbg_backend" in list_backends(exclude_tags=("experimental",))


# -- register_backend --------------------------------------------------------------------------

def test_register_backend_as_call():
    assert register_backend("mine_call", passthrough) is passthrough
    b = get_backend("mine_call")
    assert b.compile is passthrough and b.distribution == "<in-process>"
    assert "mine_call" in list_backends()


def test_register_backend_as_bare_decorator_and_with_arguments():
    @register_backend
    def mine_bare(gm, example_inputs):
        return gm.forward

    @register_backend(name="mine_named", training=False, tags=("debug",))
    def whatever(gm, example_inputs):
        return gm.forward

    assert get_backend("mine_bare").compile is mine_bare
    named = get_backend("mine_named")
    assert named.compile is whatever and named.training is False and named.tags == ("debug",)


def test_register_backend_again_replaces_in_process_registration():
    register_backend("mine_twice", passthrough)

    def other(gm, example_inputs):
        return gm.forward

    register_backend("mine_twice", other)
    assert get_backend("mine_twice").compile is other


def test_register_backend_refuses_a_plugin_name_unless_override():
    with pytest.raises(ember.BackendConflict, match="ember-eager"):
        register_backend("eager", passthrough)
    register_backend("eager", passthrough, override=True)
    assert get_backend("eager").compile is passthrough


def test_registered_backend_appears_in_table():
    register_backend("mine_table", passthrough, training=False, devices=("cpu",))
    row = next(r for r in backend_table() if r["name"] == "mine_table")
    assert row["training"] == "inference-only" and row["devices"] == "cpu"
    assert row["distribution"] == "<in-process>" and row["status"] == "ok"


# -- get_backend --------------------------------------------------------------------------------

def test_get_backend_accepts_backend_object_and_callable():
    b = Backend(name="obj", compile=passthrough)
    assert get_backend(b) is b

    def two_args(gm, example_inputs):
        return gm.forward

    wrapped = get_backend(two_args)
    assert wrapped.name == "two_args" and wrapped.level == "torch"
    gm = _gm()
    # options a plain callable does not declare (mode=...) are not forced on it
    fn = wrapped.compile(gm, [torch.ones(2)], mode="max-autotune")
    assert torch.equal(fn(torch.tensor([-1.0, 2.0])), torch.tensor([1.0, 3.0]))


def test_get_backend_passes_options_to_callables_that_take_them():
    seen = {}

    def with_kwargs(gm, example_inputs, **options):
        seen.update(options)
        return gm.forward

    def with_mode(gm, example_inputs, mode=None):
        seen["only_mode"] = mode
        return gm.forward

    get_backend(with_kwargs).compile(_gm(), [], mode="default", extra=1)
    get_backend(with_mode).compile(_gm(), [], mode="reduce-overhead", extra=1)
    assert seen == {"mode": "default", "extra": 1, "only_mode": "reduce-overhead"}


def test_get_backend_rejects_other_types():
    with pytest.raises(TypeError, match="backend= must be"):
        get_backend(42)


# -- in-process pluggy plugins -------------------------------------------------------------------

class _PluginA:
    @ember.hookimpl
    def ember_backends(self):
        return [Backend(name="from_pm_plugin", compile=passthrough, tags=("debug",)),
                Backend(name="clash", compile=passthrough)]


class _PluginB:
    @ember.hookimpl
    def ember_backends(self):
        return [Backend(name="clash", compile=passthrough)]


def test_in_process_plugin_object_provides_backends():
    plugins.plugin_manager().register(_PluginA(), name="plugin-a")
    assert get_backend("from_pm_plugin").plugin == "plugin-a"
    assert "from_pm_plugin" in list_backends(exclude_tags=())


def test_conflict_names_both_and_leaves_other_backends_working():
    plugins.plugin_manager().register(_PluginA(), name="plugin-a")
    plugins.plugin_manager().register(_PluginB(), name="plugin-b")
    with pytest.raises(ember.BackendConflict) as ei:
        get_backend("clash")
    msg = str(ei.value)
    assert "'plugin-a'" in msg and "'plugin-b'" in msg and "Uninstall" in msg
    assert get_backend("eager").distribution == "ember-eager"  # the others keep working
    assert get_backend("from_pm_plugin").name == "from_pm_plugin"
    assert "clash" in list_backends()
    statuses = [r["status"] for r in backend_table() if r["name"] == "clash"]
    assert len(statuses) == 2 and all(s.startswith("CONFLICT: also declared by") for s in statuses)


class _BadDeclaration:
    @ember.hookimpl
    def ember_backends(self):
        return ["not a Backend"]


def test_in_process_plugin_with_bad_declaration_is_skipped():
    plugins.plugin_manager().register(_BadDeclaration(), name="bad-decl")
    assert "eager" in list_backends()


def test_rescan_rediscovers_and_keeps_in_process_backends():
    register_backend("survives_rescan", passthrough)
    before = backend_table()
    plugins.rescan()
    assert plugins._registry.records is None
    assert backend_table() == before
    assert get_backend("survives_rescan").compile is passthrough
