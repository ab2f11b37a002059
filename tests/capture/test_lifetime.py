"""Compiled code does not keep alive the objects its guards identify (capture/lifetime.py).

A cache entry holds the modules, tensors and user objects it identifies through weak
references and dies with the first of them: deleting a model frees it (and everything compiled
for it), a loop over fresh models stays bounded, and a new model at a dead one's address is
compiled fresh rather than matched by the dead model's entry.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import ember
from ember import config
from ember.capture import frame, lifetime

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(persist_capture=False, suppress_errors=False):
        yield
    ember.reset()


def _model(d: int = 8) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 4))


def _collect() -> None:
    for _ in range(2):
        gc.collect()


def _caches() -> list:
    """Every live entry list: the per-code caches, and those ember.compile(model) keeps
    per model."""
    found = {id(c): c for c in frame._code_caches.values()}
    for o in gc.get_objects():
        if type(o) is frame.CodeCache:
            found.setdefault(id(o), o)
    return list(found.values())


def _live_entries() -> int:
    return sum(len(c.entries) for c in _caches())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_compiled_module_is_freed(backend: str, train: bool) -> None:
    m = _model()
    refs = [weakref.ref(m), weakref.ref(m[0].weight), weakref.ref(m[2].bias)]
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 8)
    if train:
        out = f(x)
        out.sum().backward()
        assert m[0].weight.grad is not None
        del out
    else:
        with torch.no_grad():
            torch.testing.assert_close(f(x), m(x))
    assert _live_entries() >= 1
    if backend != "eager":  # what the backend made (AOT's wrapper, inductor's kernels, ...)
        (entry,) = [e for c in _caches() for e in c.entries]
        refs.append(weakref.ref(entry.__globals__["___compiled"]))
        del entry
    del f, m
    _collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert _live_entries() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_passed_to_compiled_function_is_freed(backend: str) -> None:
    g = ember.compile(lambda mod, x: mod(x) * 2, backend=backend)
    m = _model()
    r = weakref.ref(m)
    x = torch.randn(2, 8)
    torch.testing.assert_close(g(m, x), m(x) * 2)
    del m
    _collect()
    assert r() is None
    # the function is still usable with another model, and gives that model's answer
    m2 = _model()
    torch.testing.assert_close(g(m2, x), m2(x) * 2)


_GLOBAL_MODEL = None


def _through_global(x):
    return _GLOBAL_MODEL(x) + 1


def test_module_reached_through_a_global_is_freed() -> None:
    global _GLOBAL_MODEL
    _GLOBAL_MODEL = _model()
    r = weakref.ref(_GLOBAL_MODEL)
    f = ember.compile(_through_global, backend="eager")
    x = torch.randn(2, 8)
    torch.testing.assert_close(f(x), _GLOBAL_MODEL(x) + 1)
    _GLOBAL_MODEL = None
    _collect()
    assert r() is None
    _GLOBAL_MODEL = _model()
    try:  # a new model under the same global: compiled fresh, its own answer
        torch.testing.assert_close(f(x), _GLOBAL_MODEL(x) + 1)
    finally:
        _GLOBAL_MODEL = None


def test_module_reached_through_a_closure_is_freed() -> None:
    def make(m):
        return lambda x: m(x) - 1

    m = _model()
    r = weakref.ref(m)
    fn = make(m)
    f = ember.compile(fn, backend="eager")
    x = torch.randn(2, 8)
    torch.testing.assert_close(f(x), m(x) - 1)
    del m, fn, f
    _collect()
    assert r() is None
    assert _live_entries() == 0


class _Holder:
    def __init__(self, mod):
        self.mod = mod


def test_module_held_by_a_user_object_is_freed() -> None:
    f = ember.compile(lambda h, x: h.mod(x), backend="eager")
    h = _Holder(_model())
    rh, rm = weakref.ref(h), weakref.ref(h.mod)
    x = torch.randn(2, 8)
    torch.testing.assert_close(f(h, x), h.mod(x))
    del h
    _collect()
    assert rh() is None and rm() is None


class _SelfReferencing(torch.nn.Module):
    """A child's hook and an attribute are bound methods of the root: the children's dicts
    refer back to the root (an entry must not hold those dicts)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.fc.register_forward_hook(self._hook)
        self.act = self.helper

    def _hook(self, mod, inp, out):
        return out * 2

    def helper(self, y):
        return y.relu()

    def forward(self, x):
        return self.act(self.fc(x))


@pytest.mark.parametrize("how", ["module", "function"])
def test_module_whose_children_refer_back_to_it_is_freed(how: str) -> None:
    m = _SelfReferencing()
    r = weakref.ref(m)
    x = torch.randn(2, 8)
    if how == "module":
        f = ember.compile(m, backend="eager")
        out = f(x)
    else:
        f = ember.compile(lambda mod, y: mod(y), backend="eager")
        out = f(m, x)
    torch.testing.assert_close(out, m(x))
    del m, f, out
    _collect()
    assert r() is None


def test_entry_and_backend_artifacts_die_with_the_model() -> None:
    made = []

    class Compiled:
        def __init__(self, gm):
            self.gm = gm

        def __call__(self, *args):
            return self.gm(*args)

    def backend(gm, example_inputs):
        c = Compiled(gm)
        made.append(weakref.ref(c))
        return c

    m = _model()
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 8)
    torch.testing.assert_close(f(x), m(x))
    entry = next(e for c in _caches() for e in c.entries)
    re = weakref.ref(entry)
    del entry
    assert len(made) == 1 and made[0]() is not None
    del f, m
    _collect()
    assert made[0]() is None  # the backend's callable (and what it holds) is freed
    assert re() is None


def test_compiled_module_keeps_working_while_alive() -> None:
    m = _model()
    f = ember.compile(m, backend="eager")
    x = torch.randn(2, 8)
    with torch.no_grad():
        expect = m(x)
        torch.testing.assert_close(f(x), expect)
        graphs = ember.events.counters["stats"]["graphs"]
        for _ in range(3):
            _collect()
            torch.testing.assert_close(f(x), expect)
    assert ember.events.counters["stats"]["graphs"] == graphs  # served by the same entry
    assert _live_entries() == 1
    # the weakly held objects are the root module and its submodules, not its parameters
    entry = next(e for c in _caches() for e in c.entries)
    weak = {type(v) for v in (lifetime.namespace(entry)[n] for n in lifetime.weak_of(entry))}
    assert torch.nn.Sequential in weak and torch.nn.Parameter not in weak


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_loop_over_fresh_models_stays_bounded(backend: str) -> None:
    x = torch.randn(2, 8)
    refs = []
    n = 50 if backend == "eager" else 6
    with torch.no_grad():
        for i in range(n):
            torch.manual_seed(i)
            m = _model()
            refs.append(weakref.ref(m))
            f = ember.compile(m, backend=backend)
            # a new model (often at a dead one's address) gets its own answer
            torch.testing.assert_close(f(x), m(x))
            assert _live_entries() <= 2
            del f, m
    _collect()
    assert all(r() is None for r in refs)
    assert _live_entries() == 0
    assert all(c.given_up is None for c in _caches())  # dead models' entries are not recompiles


def _step_with_break(mod, x):
    y = mod(x)
    print("between")  # a graph break: the rest runs in a compiled resume function
    return mod(y.relu())


def test_models_through_a_graph_break_are_freed_without_a_collection(capsys) -> None:
    """The capture's own cycles (and the first pass's graph-break exception) are broken when
    it ends: a dropped model dies by reference counting, so a loop over fresh models never
    sees a live stale entry (it would count as a recompile)."""
    g = ember.compile(_step_with_break, backend="eager")
    x = torch.randn(2, 8)
    refs = []
    warm = torch.nn.Linear(8, 8)  # the process's first capture imports parts of torch whose
    g(warm, x)                    # import-time cycles hold frames (and so the call's objects)
    del warm
    _collect()
    gc.disable()
    try:
        for _ in range(12):
            m = torch.nn.Linear(8, 8)
            refs.append(weakref.ref(m))
            torch.testing.assert_close(g(m, x), m(m(x).relu()))
            del m
            assert refs[-1]() is None
            # the root's and the resume function's: the first model's died with it; from the
            # second instance on, one entry guarded by class serves them all (holding none)
            assert _live_entries() <= 2
    finally:
        gc.enable()
    assert all(c.given_up is None for c in _caches())
    assert "between" in capsys.readouterr().out


def _identifies_a_module(entry) -> bool:
    ns = lifetime.namespace(entry)
    return any(isinstance(ns[n], torch.nn.Module) for n in lifetime.weak_of(entry))


@pytest.mark.parametrize("how", ["function", "module"])
def test_dead_entry_never_matches_an_object_at_the_same_address(how: str) -> None:
    """An entry specialized on a module (identity-guarded) is killed when the module dies,
    before its address can be reused: a new module, often at the same address, gets its own
    answer (its weights differ), never the dead one's graph constants."""
    g = ember.compile(lambda mod, x: mod(x), backend="eager")
    x = torch.randn(2, 8)
    specialized = reused = 0
    for i in range(12):
        m = _model()
        addr = id(m)
        f = ember.compile(m, backend="eager") if how == "module" else (lambda y, m=m: g(m, y))
        torch.testing.assert_close(f(x), m(x))
        entries = [e for c in _caches() for e in c.entries if _identifies_a_module(e)]
        specialized += bool(entries)
        del m, f
        _collect()
        assert all(lifetime.is_dead(e) for e in entries)
        m2 = _model()
        reused += id(m2) == addr
        with torch.no_grad():
            m2[0].weight.add_(float(i + 1))
        f = ember.compile(m2, backend="eager") if how == "module" else (lambda y, m=m2: g(m, y))
        torch.testing.assert_close(f(x), m2(x))
        del m2, entries, f
        _collect()
    assert specialized >= 1
    assert _live_entries() <= 1


def test_persisted_capture_is_rebound_and_freed(tmp_path, monkeypatch) -> None:
    from ember.capture import persist

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 8)
    with config.patch(persist_capture=True):
        m = _model()
        f = ember.compile(m, backend="eager")
        torch.testing.assert_close(f(x), m(x))
        saved = persist.counters["saved"]
        assert saved >= 1
        del f, m
        ember.reset()  # as a new process: the next compile rebuilds the stored capture
        hits = persist.counters["hits"]
        m2 = _model()
        r = weakref.ref(m2)
        f = ember.compile(m2, backend="eager")
        torch.testing.assert_close(f(x), m2(x))
        assert persist.counters["hits"] == hits + 1
        entry = next(e for c in _caches() for e in c.entries)
        assert getattr(entry, "persisted", False) and lifetime.weak_of(entry)
        del entry, f, m2
        _collect()
        assert r() is None
        assert _live_entries() == 0
