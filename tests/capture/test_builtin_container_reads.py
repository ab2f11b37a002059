"""Reads of a real container object through its builtin class's methods (a dict subclass whose
own ``get`` calls ``super().get``, ``key in obj``, ``len(obj)``, ``keys()``/``items()``) are
evaluated while tracing: what was read is guarded, so a change to the object recompiles
instead of replaying the old graph (Hugging Face's ``_CanRecordRegistry`` is such a dict)."""

from __future__ import annotations

import types

import pytest
import torch

import ember


class Registry(dict):
    """As transformers' output-recording registry: ``get`` through ``super().get``."""

    def get(self, key):
        return super().get(str(key)) or {}


class Plain(dict):
    pass


REG = Registry()
dict.__setitem__(REG, "a", {"scale": 2.0})
PLAIN = Plain(a=2.0, b=3.0)


def read_get(x):
    return x * REG.get("a").get("scale", 1.0)


def read_in(x):
    return x + 1 if "c" in PLAIN else x - 1


def read_len(x):
    return x * len(PLAIN)


def read_keys(x):
    for k in PLAIN.keys():
        x = x + len(k)
    return x


def read_items(x):
    for _, v in PLAIN.items():
        x = x * v
    return x


def read_super_contains(x):
    return x + 1 if Registry.__contains__(REG, "b") else x


def _mutate_reg():
    dict.__setitem__(REG, "a", {"scale": 5.0})


def _mutate_inner():
    dict.__getitem__(REG, "a")["scale"] = 7.0


def _add_c():
    PLAIN["c"] = 4.0


def _add_b_to_reg():
    dict.__setitem__(REG, "b", {})


CASES = [
    (read_get, _mutate_reg), (read_get, _mutate_inner), (read_in, _add_c), (read_len, _add_c),
    (read_keys, _add_c), (read_items, _add_c), (read_super_contains, _add_b_to_reg),
]


@pytest.fixture(autouse=True)
def _reset():
    yield
    dict.clear(REG)
    dict.__setitem__(REG, "a", {"scale": 2.0})
    PLAIN.clear()
    PLAIN.update(a=2.0, b=3.0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn,change", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_change_after_the_first_call_recompiles(fn, change, backend):
    cf = ember.compile(fn, backend=backend)
    x = torch.arange(3.0)
    torch.testing.assert_close(cf(x), fn(x))
    change()
    torch.testing.assert_close(cf(x), fn(x))  # eager's value after the change


def test_mappingproxy_len_is_guarded():
    ns = {"a": 1}
    proxy = types.MappingProxyType(ns)

    def f(x):
        return x * len(proxy)

    cf = ember.compile(f, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(cf(x), f(x))
    ns["b"] = 2
    torch.testing.assert_close(cf(x), f(x))


def test_unchanged_object_reuses_the_graph():
    cf = ember.compile(read_get, backend="eager")
    x = torch.ones(2)
    cf(x)
    before = ember.last_capture().graph_id
    cf(x)
    assert ember.last_capture().graph_id == before


_MODULE = r'''
import inspect
import os
import torch


class Registry(dict):
    def get(self, key):
        return super().get(str(key)) or {}


REG = Registry()
dict.__setitem__(REG, "a", {"scale": float(os.environ["SCALE"])})


def plus(x):
    return x + 1


def minus(x):
    return x - 1


def inner(x, fn=plus if os.environ["DEFAULT"] == "plus" else minus):
    return fn(x)


def _make():
    def twice(x, n=0):  # its closure holds itself
        return x if n else twice(x * 2, 1)
    return twice


TWICE = _make()


def f(x):
    # an introspection result (held by the capture, read by no guard), as transformers'
    # apply_chunking_to_forward counts a forward's parameters
    n = len(inspect.signature(plus).parameters)
    return inner(x) * REG.get("a").get("scale", 1.0) + TWICE(x) * n
'''

_SCRIPT = r'''
import torch, ember, regmod
from ember.capture import persist
x = torch.arange(3.0)
got = ember.compile(regmod.f, backend="aot_eager")(x)
print("SAME", bool(torch.equal(got, regmod.f(x))), "HITS", persist.counters["hits"],
      "SAVED", persist.counters["saved"])
'''


def test_persisted_capture_of_a_registry_a_function_default_and_a_recursive_closure(tmp_path,
                                                                                      py):
    """Such a capture is stored (a module's global object by name, a default function and a
    closure holding itself by what they are, an ``inspect.signature`` result it does not read
    again) and reused by a later process; a later process
    where the registry holds another value, or the default is another function, gets eager's
    answer."""
    (tmp_path / "regmod.py").write_text(_MODULE)
    cache = tmp_path / "cache"
    # one stored capture per function and arguments: a process whose guards refuse it
    # captures and stores its own, which the next such process reuses
    runs = [("2.0", "plus", "SAVED 1"), ("2.0", "plus", "HITS 1"),
            ("5.0", "plus", "HITS 0 SAVED 1"), ("5.0", "plus", "HITS 1"),
            ("2.0", "minus", "HITS 0 SAVED 1"), ("2.0", "minus", "HITS 1")]
    for scale, default, expect in runs:
        r = py(_SCRIPT, env={"EMBER_CACHE_DIR": str(cache), "PYTHONPATH": str(tmp_path),
                             "SCALE": scale, "DEFAULT": default})
        assert "SAME True" in r.stdout and expect in r.stdout, \
            (scale, default, r.stdout + r.stderr[-3000:])
