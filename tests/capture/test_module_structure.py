"""No stale results when a module's structure changes after compiling: children appended,
deleted or registered, parameters registered, containers read by position, length, membership
or as a whole. Each case compares with eager before and after the change, on every backend that
takes the capture as it is."""

from __future__ import annotations

import pytest
import torch

import ember

BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with ember.config.patch(persist_capture=False):
        yield
    ember.reset()


def _same(a, b):
    torch.testing.assert_close(a, b)


def _lin(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", ["append", "delete", "setattr_child", "replace_child",
                                    "insert_front"])
def test_sequential_changed_after_compile(backend, change):
    m = torch.nn.Sequential(_lin(0), torch.nn.Tanh())
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        _same(f(x), m(x))
        if change == "append":
            m.append(_lin(1))
        elif change == "delete":
            del m[0]
        elif change == "setattr_child":
            m.extra = _lin(2)  # a child registered by attribute is iterated too
        elif change == "replace_child":
            m[1] = torch.nn.Sigmoid()
        else:
            m.insert(0, torch.nn.Sigmoid())
        _same(f(x), m(x))


class _Stack(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(_lin(i) for i in range(n))

    def forward(self, x):
        for i in range(len(self.layers)):
            x = self.layers[i](x).relu()
        if self.layers:  # bool() of a ModuleList is its length
            x = x + 1
        return self.layers[-1](x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_modulelist_by_length_and_position(backend):
    m = _Stack(2)
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        _same(f(x), m(x))
        m.layers.append(_lin(7))  # len() and [-1] both change
        _same(f(x), m(x))
        del m.layers[0]
        _same(f(x), m(x))


class _Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleDict({"a": _lin(0), "b": _lin(1)})

    def forward(self, x):
        y = x
        for name in self.experts:
            y = y + self.experts[name](x)
        if "c" in self.experts:
            y = y * 2
        return y


@pytest.mark.parametrize("backend", BACKENDS)
def test_moduledict_keys_and_membership(backend):
    m = _Experts()
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        _same(f(x), m(x))
        m.experts["c"] = _lin(2)
        _same(f(x), m(x))
        m.experts.pop("a")
        _same(f(x), m(x))


class _ParamSum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = _lin(0)
        self.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(3))])

    def forward(self, x):
        y = self.lin(x)
        for s in self.scales:
            y = y * s
        reg = sum(p.sum() for p in self.parameters())
        return y + reg


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameters_registered_after_compile(backend):
    m = _ParamSum()
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 3)
    with torch.no_grad():
        _same(f(x), m(x))
        m.scales.append(torch.nn.Parameter(torch.full((3,), 2.0)))
        _same(f(x), m(x))
        m.lin.register_parameter("extra", torch.nn.Parameter(torch.full((1,), 5.0)))
        _same(f(x), m(x))


def test_training_gradients_follow_the_new_structure():
    m = torch.nn.Sequential(_lin(0))
    f = ember.compile(m, backend="aot_eager")
    x = torch.randn(2, 3)
    f(x).sum().backward()
    m.append(_lin(1))
    m.zero_grad()
    f(x).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(got, m.parameters()):
        _same(g, p.grad)


_WARM = """
import sys, torch, ember
n = int(sys.argv[1])
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n)])
x = torch.randn(1, 2)
with torch.no_grad():
    got, want = ember.compile(m, backend="eager")(x), m(x)
print("ok" if torch.equal(got, want) else f"WRONG {got} {want}")
"""


def test_persisted_capture_not_reused_for_another_structure(tmp_path, py):
    """A capture persisted by one process for a 1-layer Sequential must not be rebound to a
    2-layer one in a fresh process (it was: same code object, same guards but the length)."""
    env = {"EMBER_CACHE_DIR": str(tmp_path / "cache")}
    for n in (1, 2, 3, 2):
        r = py(_WARM, env=env, args=[str(n)])
        assert r.returncode == 0 and r.stdout.strip() == "ok", (n, r.stdout, r.stderr[-2000:])
