"""Adversarial programs over Python values: set iteration order (hash order, not insertion
order; strings hash differently in every process), globals, closures, containers and scalar
arguments changed between calls. Every call must give eager's answer."""

from __future__ import annotations

import pytest
import torch

import ember

BACKENDS = ["eager", "aot_eager"]

W = {"alpha": 1.0, "beta": 2.0, "gamma": 3.0, "delta": 4.0, "eps": 5.0}
NAMES = {"alpha", "beta", "gamma", "delta", "eps"}


def same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)


def _set_literal(x, last):
    s = {"alpha", "beta", "gamma", "delta", last}
    return torch.stack([x * W[n] for n in s]), list(s)


def _set_built(x):
    s = set()
    for k in ["gamma", "alpha", "eps", "beta"]:
        s.add(k)
    return torch.stack([x * W[n] for n in s]), list(s), s.pop()


def _set_global(x):
    return torch.stack([x * W[n] for n in NAMES])


def _set_arg(x, names):
    return torch.stack([x * W[n] for n in names])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sets_iterate_in_python_order(backend):
    x = torch.ones(1)
    for fn, args in ((_set_literal, (x, "eps")), (_set_built, (x,)), (_set_global, (x,))):
        got, want = ember.compile(fn, backend=backend)(*args), fn(*args)
        if isinstance(want, tuple):
            same(got[0], want[0])
            assert list(got[1:]) == list(want[1:])
        else:
            same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_argument_with_the_same_items_in_another_order(backend):
    cf = ember.compile(_set_arg, backend=backend)
    x = torch.ones(1)
    a = {"alpha", "beta", "gamma", "delta", "eps"}
    # the same items, iterated in another order (a larger table, after deletions)
    b = set(f"tmp{i}" for i in range(40)) | a
    b -= {f"tmp{i}" for i in range(40)}
    same(cf(x, a), _set_arg(x, a))
    same(cf(x, b), _set_arg(x, b))


_PROG = """
import json, sys, torch, ember
from ember.capture import persist
sys.path.insert(0, {dir!r})
from progmod import f, g
x = torch.ones(1)
r = ember.compile(f, backend="eager")(x)
s = {{"alpha", "beta", "gamma", "delta", "eps"}}
r2 = ember.compile(g, backend="eager")(x, s)
print(json.dumps([bool(torch.equal(r, f(x))), bool(torch.equal(r2, g(x, s))),
                  persist.counters["hits"]]))
"""

_MOD = """
import torch
W = {"alpha": 1.0, "beta": 2.0, "gamma": 3.0, "delta": 4.0, "eps": 5.0}
NAMES = {"alpha", "beta", "gamma", "delta", "eps"}
def f(x):
    return torch.stack([x * W[n] for n in NAMES])
def g(x, names):
    return torch.stack([x * W[n] for n in names])
"""


@pytest.mark.slow
def test_persisted_capture_iterating_a_set_in_a_process_with_another_hash_seed(tmp_path, py):
    (tmp_path / "progmod.py").write_text(_MOD)
    code = _PROG.format(dir=str(tmp_path))
    cache = str(tmp_path / "cache")
    results = []
    for seed in ("1", "1", "2"):
        r = py(code, env={"EMBER_CACHE_DIR": cache, "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr[-2000:]
        results.append(r.stdout.strip().splitlines()[-1])
    import json
    ok = [json.loads(t) for t in results]
    assert all(a and b for a, b, _ in ok), ok
    assert ok[1][2] == 2  # the same hash seed: both captures were reused from disk


# ------------------------------------------------------------------------------------------
# one mutable object reached through two arguments


class _Acc:
    def __init__(self):
        self.total = 0.0


def _objs(x, a, c):
    a.total += 1
    c.total += 1
    return x * a.total


def _lists(x, l1, l2):
    l1.append(1)
    return x * len(l2)


def _dicts(x, d1, d2):
    d1["k"] = d1.get("k", 0) + 5
    return x * d2.get("k", 1)


def _nested(x, outer):
    outer["a"].append(1)
    return x * len(outer["b"])


_ALIASED = {
    "objects": (_objs, lambda: (_Acc(), _Acc()), lambda: (lambda o: (o, o))(_Acc())),
    "lists": (_lists, lambda: ([], []), lambda: (lambda o: (o, o))([])),
    "dicts": (_dicts, lambda: ({}, {}), lambda: (lambda o: (o, o))({})),
    "nested": (_nested, lambda: ({"a": [], "b": []},),
               lambda: (lambda o: ({"a": o, "b": o},))([])),
}


@pytest.mark.parametrize("first", ["distinct", "aliased"])
@pytest.mark.parametrize("case", sorted(_ALIASED))
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_object_through_two_arguments(case, first, backend):
    fn, distinct, aliased = _ALIASED[case]
    cf = ember.compile(fn, backend=backend)
    order = (distinct, aliased, distinct, aliased) if first == "distinct" else \
        (aliased, distinct, aliased)
    for make in order:
        mine, theirs = make(), make()
        same(cf(torch.ones(1), *mine), fn(torch.ones(1), *theirs))
        assert repr([getattr(o, "__dict__", o) for o in mine]) == \
            repr([getattr(o, "__dict__", o) for o in theirs])


# ------------------------------------------------------------------------------------------
# graph breaks: what runs after the break belongs to the function being called


def _factory(k):
    def f(x):
        y = x + 1
        print(end="")  # a graph break: k is read only by the resume function
        return y * k
    return f


@pytest.mark.parametrize("backend", BACKENDS)
def test_closures_of_one_factory_read_after_a_break(backend):
    x = torch.ones(1)
    f2, f3 = ember.compile(_factory(2.0), backend=backend), ember.compile(_factory(3.0),
                                                                          backend=backend)
    for _ in range(2):
        same(f2(x), x * 4)
        same(f3(x), x * 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functions_sharing_code_with_other_globals_after_a_break(backend):
    import types
    g1 = {"print": print, "__builtins__": __builtins__}
    code = compile("def h(x):\n    y = x + 1\n    print(end='')\n    return y * K\n", "<h>",
                   "exec")
    exec(code, g1)
    g2 = dict(g1)
    g1["K"], g2["K"] = 2.0, 5.0
    h1 = g1["h"]
    h2 = types.FunctionType(h1.__code__, g2)
    c1, c2 = ember.compile(h1, backend=backend), ember.compile(h2, backend=backend)
    x = torch.ones(1)
    for _ in range(2):
        same(c1(x), x * 4)
        same(c2(x), x * 10)
