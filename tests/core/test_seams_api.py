"""Smaller promises (issue 9 §3): what ember.compile accepts, backend failures, threads, user
errors during tracing."""

from __future__ import annotations

import functools
import logging
import threading

import pytest
import torch

import ember
from ember import events


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _graphs():
    return events.counters["stats"]["graphs"]


def test_partial_compiles():
    def f(t, a, *, b):
        return t * a + b

    p = ember.compile(functools.partial(f, b=1.0), backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(p(x, 3.0), x * 3 + 1)
    assert _graphs() == 1
    pp = ember.compile(functools.partial(functools.partial(f, b=2.0), 4.0), backend="eager")
    torch.testing.assert_close(pp(x), x * 4 + 2)


def test_callable_instance_compiles_and_reads_its_state():
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, t):
            return t * self.k

    s = Scale(2.0)
    cs = ember.compile(s, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cs(x), x * 2)
    assert _graphs() == 1
    s.k = 5.0
    torch.testing.assert_close(cs(x), x * 5)


def test_bound_method_compiles():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def score(self, t):
            return self.lin(t).sum(-1)

    n = Net()
    cs = ember.compile(n.score, backend="eager")
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(cs(x), n.score(x))
    assert _graphs() == 1


@pytest.mark.parametrize("obj,what", [(int, "the class builtins.int"),
                                      (len, "the builtin 'len'"),
                                      (42, "a builtins.int object")])
def test_non_functions_are_named(obj, what):
    with pytest.raises(TypeError) as ei:
        ember.compile(obj, backend="eager")
    assert what in str(ei.value)


def test_backend_failure_warns_once_per_function(caplog):
    def broken(gm, example_inputs):
        raise ValueError("boom")

    def f(t):
        return t.sin() + 1

    cf = ember.compile(f, backend=broken)
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="ember"):
        for _ in range(3):
            torch.testing.assert_close(cf(x), f(x))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    msg = warnings[0].getMessage()
    assert "broken" in msg and "ValueError: boom" in msg and "eagerly" in msg
    ember.reset()
    with ember.config.patch(suppress_errors=False):
        with pytest.raises(ember.BackendCompilerFailed, match="boom"):
            ember.compile(f, backend=broken)(x)


def test_threads_missing_at_once_compile_once():
    compiles = []
    gate = threading.Barrier(4)

    def slow_backend(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    def f(t):
        return t * 2 + 1

    cf = ember.compile(f, backend=slow_backend)
    x = torch.randn(3)
    results, errors = [], []

    def work():
        try:
            gate.wait()
            results.append(cf(x))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(compiles) == 1
    for r in results:
        torch.testing.assert_close(r, x * 2 + 1)


def test_user_error_during_tracing_surfaces_once_without_noise(capfd):
    def f(t, w):
        return t @ w

    cf = ember.compile(f, backend="eager")
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError) as ei:
        cf(x, torch.randn(5, 5))
    assert "shapes cannot be multiplied" in str(ei.value)
    err = capfd.readouterr().err
    assert "fake_tensor" not in err and "Traceback" not in err, err
    # a good call afterwards compiles (the bad call did not give up on the function)
    w = torch.randn(3, 4)
    torch.testing.assert_close(cf(x, w), x @ w)
    assert _graphs() == 1
