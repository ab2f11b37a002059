"""Backends declare the options they take; ember.compile / ember.precompile refuse others at
compile() time, naming the key, close matches and the valid keys (issue 19)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ember


def _model() -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


def test_misspelled_inductor_option_names_close_match_and_valid_keys():
    with pytest.raises(ember.UnknownOption) as e:
        ember.compile(_model(), options={"freezng": False})
    msg = str(e.value)
    assert "'freezng'" in msg and "Did you mean 'freezing'" in msg
    assert "buffer_pool" in msg and "layout_opt" in msg  # the valid keys are listed
    assert isinstance(e.value, ValueError)


def test_declared_options_are_accepted_and_mode_always_is():
    m = _model()
    x = torch.randn(2, 4)
    out = ember.compile(m, options={"freezing": False, "buffer_pool": False})(x)
    torch.testing.assert_close(out, m(x))
    ember.compile(m, backend="aot_eager", options={"mode": "max-autotune"})


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_backends_without_options_refuse_any(backend):
    with pytest.raises(ember.UnknownOption, match="takes no options"):
        ember.compile(_model(), backend=backend, options={"freezing": False})


def test_plain_callable_options_are_its_keyword_parameters():
    seen = {}

    def mine(gm, example_inputs, *, alpha=1):
        seen["alpha"] = alpha
        return gm.forward

    with pytest.raises(ember.UnknownOption, match="Did you mean 'alpha'"):
        ember.compile(_model(), backend=mine, options={"alpah": 2})
    m = _model()
    ember.compile(m, backend=mine, options={"alpha": 2})(torch.randn(2, 4))
    assert seen["alpha"] == 2


def test_undeclared_backend_taking_kwargs_accepts_anything():
    def anything(gm, example_inputs, **options):
        return gm.forward

    be = ember.Backend(name="anything_test", compile=anything)
    assert be.accepted_options() is None
    m = _model()
    x = torch.randn(2, 4)
    torch.testing.assert_close(ember.compile(m, backend=be, options={"whatever": 1})(x), m(x))


def test_backend_options_are_read_only():
    be = ember.Backend(name="ro_test", compile=lambda gm, ex, **o: gm.forward,
                       options={"k": "a knob"})
    with pytest.raises(TypeError):
        be.options["k2"] = "x"  # type: ignore[index]
    with pytest.raises(ember.UnknownOption, match="Its options: k\\."):
        be.check_options({"q": 1})


def test_precompile_validates_options():
    with pytest.raises(ember.UnknownOption, match="ember.precompile: backend 'aot_eager'"):
        ember.precompile(lambda m, x: m(x), _model(), torch.randn(2, 4),
                         options={"freezing": False})


def test_cli_lists_options():
    out = subprocess.run([sys.executable, "-m", "ember", "backends", "--options"],
                         capture_output=True, text=True, check=True).stdout
    assert "inductor:" in out and "freezing_check" in out
    assert "eager:\n  (no options)" in out
