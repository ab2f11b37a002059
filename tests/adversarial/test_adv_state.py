"""Adversarial programs: compile, call, change some state the way user code can, call again;
every call must give eager's answer (and gradients). Each test names the state it changes."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn

import ember

BACKENDS = ["eager", "aot_eager"]
ALL = ["eager", "aot_eager", "inductor"]


def same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# global state read through torch functions


_STATES = {
    "deterministic": (torch.are_deterministic_algorithms_enabled,
                      lambda: torch.use_deterministic_algorithms(True),
                      lambda: torch.use_deterministic_algorithms(False)),
    "warn_only": (torch.is_deterministic_algorithms_warn_only_enabled,
                  lambda: torch.use_deterministic_algorithms(True, warn_only=True),
                  lambda: torch.use_deterministic_algorithms(False)),
    "initial_seed": (torch.initial_seed, lambda: torch.manual_seed(1234),
                     lambda: torch.manual_seed(0)),
    "num_threads": (torch.get_num_threads,
                    lambda: torch.set_num_threads(torch.get_num_threads() + 1),
                    lambda: torch.set_num_threads(torch.get_num_threads() - 1)),
    "anomaly": (torch.is_anomaly_enabled, lambda: torch.autograd.set_detect_anomaly(True),
                lambda: torch.autograd.set_detect_anomaly(False)),
    "matmul_precision": (torch.get_float32_matmul_precision,
                         lambda: torch.set_float32_matmul_precision("medium"),
                         lambda: torch.set_float32_matmul_precision("highest")),
}


@pytest.mark.parametrize("state", sorted(_STATES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_global_state_query_is_guarded(state, backend):
    query, on, off = _STATES[state]

    def f(x):
        v = query()
        return x + (1 if v else 0), v

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    assert cf(x)[1] == f(x)[1]
    on()
    try:
        got, want = cf(x), f(x)
    finally:
        off()
    assert got[1] == want[1]
    same(got[0], want[0])
    assert cf(x)[1] == f(x)[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode_after_no_grad(backend):
    def f(x):
        return x + 1, torch.is_inference_mode_enabled()

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    with torch.no_grad():
        assert cf(x)[1] is False
    with torch.inference_mode():
        assert cf(x)[1] is True


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_dtype_changed(backend):
    def f(x):
        return x + torch.ones(2)

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2, dtype=torch.float64)
    same(cf(x), f(x))
    torch.set_default_dtype(torch.float64)
    try:
        got, want = cf(x), f(x)
    finally:
        torch.set_default_dtype(torch.float32)
    assert got.dtype == want.dtype
    same(got, want)


# ------------------------------------------------------------------------------------------
# class attributes: properties, staticmethods, classmethods replaced on the class


def _holder():
    class Holder:
        k = 2.0

        def __init__(self):
            self._v = 1.0

        @property
        def v(self):
            return self._v * 2

        @staticmethod
        def s(t):
            return t + 1

        @classmethod
        def c(cls, t):
            return t * cls.k
    return Holder


@pytest.mark.parametrize("backend", BACKENDS)
def test_property_replaced_on_class(backend):
    Holder = _holder()
    h = Holder()

    def f(x):
        return x * h.v

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    same(cf(x), f(x))
    h._v = 3.0
    same(cf(x), f(x))
    Holder.v = property(lambda self: self._v * 10)
    same(cf(x), f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_staticmethod_and_classmethod_replaced_on_class(backend):
    Holder = _holder()
    h = Holder()

    def f(x):
        return h.s(x) + h.c(x)

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    same(cf(x), f(x))
    Holder.s = staticmethod(lambda t: t - 100)
    same(cf(x), f(x))
    Holder.c = classmethod(lambda cls, t: t * 7)
    same(cf(x), f(x))
    Holder.k = 5.0
    same(cf(x), f(x))


# ------------------------------------------------------------------------------------------
# functions


def _plus_one(x):
    return x + 1


def _times_ten(x):
    return x * 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_inlined_function_code_replaced(backend):
    def helper(x):
        return x + 1

    def f(x):
        return helper(x) * 2

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    same(cf(x), f(x))
    helper.__code__ = _times_ten.__code__
    same(cf(x), f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_arguments(backend):
    def g(x, k):
        return x * k

    x = torch.ones(2)
    a = ember.compile(functools.partial(g, k=2.0), backend=backend)
    b = ember.compile(functools.partial(g, k=3.0), backend=backend)
    same(a(x), x * 2)
    same(b(x), x * 3)
    same(a(x), x * 2)


# ------------------------------------------------------------------------------------------
# hooks added after compiling


def _pair(seed=0):
    torch.manual_seed(seed)
    a = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    b = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    b.load_state_dict(a.state_dict())
    return a, b


def _step(cm, a, m, x):
    x1 = x.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    got, want = cm(x1), m(x2)
    same(got, want)
    got.sum().backward()
    want.sum().backward()
    same(x1.grad, x2.grad)
    for p, q in zip(a.parameters(), m.parameters()):
        same(p.grad, q.grad)


@pytest.mark.parametrize("where", ["root", "child"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_full_backward_hook_added_after_compiling(where, backend):
    a, b = _pair()
    ca = ember.compile(a, backend=backend)
    x = torch.randn(5, 3)
    _step(ca, a, b, x)
    for m in (a, b):
        target = m if where == "root" else m[2]
        target.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 5,))
    _step(ca, a, b, x)
    _step(ca, a, b, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_backward_hook_added_after_compiling(backend):
    a, b = _pair()
    ca = ember.compile(a, backend=backend)
    x = torch.randn(5, 3)
    _step(ca, a, b, x)
    seen = []
    h = nn.modules.module.register_module_full_backward_hook(
        lambda mod, gi, go: seen.append(type(mod).__name__))
    try:
        n0 = len(seen)
        b(x.requires_grad_()).sum().backward()
        eager_calls = len(seen) - n0
        n1 = len(seen)
        ca(x.detach().requires_grad_()).sum().backward()
        assert len(seen) - n1 == eager_calls
    finally:
        h.remove()


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_hook_on_parameter_added_after_compiling(backend):
    a, b = _pair()
    ca = ember.compile(a, backend=backend)
    x = torch.randn(5, 3)
    _step(ca, a, b, x)
    for m in (a, b):
        m[0].weight.register_hook(lambda g: g * 10)
    for m in (a, b):
        m.zero_grad()
    _step(ca, a, b, x)
