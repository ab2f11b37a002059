"""Errors that help: unknown backends, inference-only backends, unsupported Pythons, modes,
backends declared but not built yet."""

from __future__ import annotations

import types

import pytest
import torch

import ember
import ember.api
from ember import plugins
from ember.backends import compile_graph
from ember.plugins import get_backend, register_backend


def f(x):
    return torch.sin(x) * 2


def _gm():
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)


def passthrough(gm, example_inputs, **options):
    return gm.forward


# -- unknown backend ---------------------------------------------------------------------------

def test_unknown_backend_lists_installed_and_suggests_close_name():
    with pytest.raises(ember.BackendNotFound) as ei:
        ember.compile(f, backend="eagre")
    msg = str(ei.value)
    assert "unknown ember backend 'eagre'" in msg
    for name in ("aot_eager", "cudagraphs", "eager", "inductor"):
        assert name in msg
    assert "Did you mean 'eager'?" in msg
    assert isinstance(ei.value, LookupError)  # also catchable as a lookup failure


def test_unknown_first_party_backend_says_which_package_provides_it(monkeypatch):
    # As if ember-mybackend were a first-party plugin that is not installed here.
    monkeypatch.setitem(plugins.KNOWN_PROVIDERS, "mybackend",
                        ("plugins/mybackend", "ember-mybackend"))
    with pytest.raises(ember.BackendNotFound) as ei:
        ember.compile(f, backend="mybackend")
    assert "pip install ./plugins/mybackend" in str(ei.value)
    assert "ember-mybackend" in str(ei.value)


def test_not_found_message_for_each_first_party_backend():
    for name, (folder, dist) in plugins.KNOWN_PROVIDERS.items():
        msg = plugins._not_found_message(name, ["eager"], [])
        assert f"pip install ./{folder}" in msg and dist in msg


def test_unknown_third_party_backend_explains_the_options():
    with pytest.raises(ember.BackendNotFound, match="register_backend|callable"):
        get_backend("no_such_backend_anywhere")


def test_unknown_backend_fails_at_compile_not_at_first_call():
    with pytest.raises(ember.BackendNotFound):
        ember.compile(f, backend="nope")  # no call needed


# -- inference-only ----------------------------------------------------------------------------

def test_inference_only_backend_refuses_graph_that_needs_grad():
    register_backend("infer_only", passthrough, training=False)
    be = get_backend("infer_only")
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ember.EmberError) as ei:
        compile_graph(_gm(), [x], be)
    msg = str(ei.value)
    assert "'infer_only' is inference-only" in msg and "needs gradients" in msg
    assert "torch.no_grad()" in msg


def test_inference_only_backend_accepts_no_grad_and_plain_inputs():
    register_backend("infer_only2", passthrough, training=False)
    be = get_backend("infer_only2")
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out = compile_graph(_gm(), [x], be)(x)
    assert torch.equal(out, torch.relu(x.detach()) * 2)
    y = torch.randn(3)
    assert torch.equal(compile_graph(_gm(), [y], be)(y), torch.relu(y) * 2)


def test_backend_failure_names_backend_and_distribution():
    def broken(gm, example_inputs):
        raise ValueError("boom")

    with pytest.raises(ember.BackendCompilerFailed, match=r"'broken'.*ValueError: boom"):
        compile_graph(_gm(), [torch.ones(2)], get_backend(broken))


def test_backend_returning_non_callable_is_an_error():
    with pytest.raises(ember.BackendCompilerFailed, match="expected a callable"):
        compile_graph(_gm(), [torch.ones(2)], get_backend(lambda gm, ex: 42))


# -- declared, not built yet -------------------------------------------------------------------

def test_declared_backends_raise_not_implemented_yet():
    def unbuilt(gm, example_inputs, **options):
        raise ember.NotImplementedYet("the 'unbuilt' backend is not implemented yet; use "
                                      "backend='eager'")

    register_backend("unbuilt", unbuilt, tags=("experimental",), override=True)
    be = get_backend("unbuilt")
    assert "experimental" in be.tags
    with pytest.raises(ember.NotImplementedYet, match="not implemented yet") as ei:
        ember.compile(f, backend="unbuilt")(torch.ones(2))  # a user error: not swallowed
    assert isinstance(ei.value, NotImplementedError)
    assert "backend='eager'" in str(ei.value)


# -- unsupported Python -----------------------------------------------------------------------

@pytest.mark.parametrize("version", [(3, 13, 0), (3, 14, 1)])
def test_compile_refuses_python_3_13_plus(monkeypatch, version):
    monkeypatch.setattr(ember.api, "sys", types.SimpleNamespace(version_info=version))
    with pytest.raises(RuntimeError) as ei:
        ember.compile(f, backend="eager")
    msg = str(ei.value)
    assert f"ember.compile is not supported on Python {version[0]}.{version[1]}" in msg
    assert "3.11 and 3.12" in msg and "3.13+" in msg


def test_compile_refuses_python_older_than_3_11(monkeypatch):
    monkeypatch.setattr(ember.api, "sys", types.SimpleNamespace(version_info=(3, 10, 4)))
    with pytest.raises(RuntimeError, match=r"not supported on Python 3\.10.*3\.11 and 3\.12"):
        ember.compile(f, backend="eager")


def test_supported_pythons_pass_the_check(monkeypatch):
    for v in [(3, 11, 0), (3, 12, 5)]:
        monkeypatch.setattr(ember.api, "sys", types.SimpleNamespace(version_info=v))
        ember.api._check_python()


def test_unsupported_python_fails_at_compile_not_at_import(py):
    res = py("""
        import sys
        import pluggy, torch, torch.fx                # third-party imports first: they check too
        sys.version_info = (3, 13, 0, "final", 0)   # what Ember's own import sees
        import ember                                  # importing Ember must work
        try:
            ember.compile(lambda x: x, backend="eager")
        except RuntimeError as e:
            print("RAISED:", e)
    """)
    assert res.returncode == 0, res.stderr
    assert "RAISED: ember.compile is not supported on Python 3.13" in res.stdout


def test_disable_true_skips_every_check(monkeypatch):
    monkeypatch.setattr(ember.api, "sys", types.SimpleNamespace(version_info=(3, 13, 0)))
    assert ember.compile(f, backend="nope", disable=True) is f


# -- modes and options -------------------------------------------------------------------------

def test_unknown_mode_and_mode_with_options_are_errors():
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        ember.compile(f, backend="eager", mode="fastest")
    with pytest.raises(ValueError, match="either mode= or options="):
        ember.compile(f, backend="eager", mode="default", options={"a": 1})
