"""Guards checked by the version of the state they read (ember/capture/stable.py).

The property that matters: an entry whose covered guards are checked by dict and class version
tags decides exactly as the same guards evaluated in Python would, after any change a user can
make to a model, its classes, its module's globals or the builtins. Each test compares the
compiled module with eager and, for every entry, the entry's decision (hit or miss) with its
explanation function, which evaluates every guard of the original source in Python."""

from __future__ import annotations

import builtins
import random

import pytest
import torch
import torch.nn as nn

import ember
from ember.capture import stable
from ember.capture import tensor_check as tc
from ember.capture.frame import MISS

SCALE = 1.0

pytestmark = pytest.mark.skipif(not stable.supported(),
                                reason="state versions are read on CPython 3.11 and 3.12 only")


@pytest.fixture(scope="module", autouse=True)
def ext():
    e = tc.extension(wait=600)
    # CI has a compiler and torch's headers: the extension must build there
    assert e is not None and hasattr(e, "Stable"), f"the guard extension did not build ({tc._state})"
    return e


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = 2.0
        self.mode = "relu"
        self.sizes = [1, 2]  # a list: a guard on its contents must stay in Python
        self.extra = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * abs(self.scale)
        y = torch.relu(y) if self.mode == "relu" else torch.tanh(y)
        y = y + self.sizes[0]
        if self.extra is not None:
            y = self.extra(y)
        return y + x


class Block2(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


class Net(nn.Module):
    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(n)])
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x)) * SCALE


def _alt_forward(self: Block, x: torch.Tensor) -> torch.Tensor:
    return self.lin(x) - x


def _mutations() -> dict:
    """name -> (apply(model) -> undo or None): each something a guard must see."""
    def hook(m):
        h = m.blocks[2].register_forward_hook(lambda mod, i, o: o * 3)
        return h.remove

    def pre_hook(m):
        h = m.blocks[1].lin.register_forward_pre_hook(lambda mod, a: (a[0] + 1,))
        return h.remove

    def global_hook(m):
        h = torch.nn.modules.module.register_module_forward_hook(
            lambda mod, i, o: o + 1 if isinstance(mod, nn.LayerNorm) else None)
        return h.remove

    def set_float(m):
        m.blocks[3].scale = 5.0 if m.blocks[3].scale != 5.0 else -3.0

    def set_str(m):
        m.blocks[0].mode = "tanh" if m.blocks[0].mode == "relu" else "relu"

    def list_in_place(m):
        m.blocks[4].sizes[0] += 7

    def new_param(m):
        m.blocks[1].lin.weight = nn.Parameter(torch.randn(8, 8))

    def new_child(m):
        m.blocks[2].lin = nn.Linear(8, 8)

    def fill_none(m):
        m.blocks[5].extra = nn.Tanh() if m.blocks[5].extra is None else None

    def instance_forward(m):
        b = m.blocks[0]
        b.forward = lambda x: x * 0 + 1

        def undo():
            del b.forward
        return undo

    def class_forward(m):
        old = Block.__dict__["forward"]
        Block.forward = _alt_forward

        def undo():
            Block.forward = old
        return undo

    def class_property(m):
        Block.scale = property(lambda self: 4.0)

        def undo():
            del Block.scale
        return undo

    def swap_class(m):
        b = m.blocks[3]
        b.__class__ = Block2 if type(b) is Block else Block

    def replace_dict(m):
        b = m.blocks[1]
        object.__setattr__(b, "__dict__", {**b.__dict__, "scale": 9.0})

    def module_global(m):
        global SCALE
        SCALE = SCALE + 1.0

    def shadow_builtin(m):
        globals()["abs"] = lambda v: -v

        def undo():
            globals().pop("abs", None)
        return undo

    def reorder(m):
        mods = m.blocks._modules
        k = list(mods)[0]
        mods[k] = mods.pop(k)  # the first block runs last

    def in_place_weight(m):
        with torch.no_grad():
            m.blocks[2].lin.weight.mul_(2)

    def to_double(m):
        m.double()

        def undo():
            m.float()
        return undo

    def train(m):
        m.train(not m.training)

    return {f.__name__: f for f in (hook, pre_hook, global_hook, set_float, set_str,
                                      list_in_place, new_param, new_child, fill_none,
                                      instance_forward, class_forward, class_property,
                                      swap_class, replace_dict, module_global, shadow_builtin,
                                      reorder, in_place_weight, to_double, train)}


def _check(f, m, x) -> None:
    """The compiled module equals eager; each entry decides as its guards in Python do."""
    xx = x.to(next(m.parameters()).dtype)
    with torch.no_grad():
        want = m(xx)
        got = f(xx)
        torch.testing.assert_close(got, want)
        cf = f.__dict__["_ember_call"]
        for e in list(cf.cache.entries):
            python_says = e.failed_guard(cf.fn, m, xx)
            hit = e(cf.fn, m, xx) is not MISS
            assert hit == (python_says is None), (hit, python_says)


def _restore_classes() -> None:
    Block.forward = Block.__dict__.get("forward", Block.forward)
    if isinstance(Block.__dict__.get("scale"), property):
        del Block.scale


def _spy_rechecks(monkeypatch) -> list[int]:
    """How many covered guards each call re-evaluated in Python (one entry per such call)."""
    rechecks: list[int] = []
    real = stable._Recheck.__call__
    monkeypatch.setattr(stable._Recheck, "__call__",
                        lambda self, idx: rechecks.append(len(idx)) or real(self, idx))
    return rechecks


def test_a_model_in_a_loop_takes_the_version_check(monkeypatch):
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    rechecks = _spy_rechecks(monkeypatch)
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(f(x), m(x))
    entry = f.__dict__["_ember_call"].cache.entries[0]
    assert "___stable_ok" in entry.__globals__
    assert "___stable_ok" not in entry.source  # what the guard log and golden files show
    # the covered guards ran in Python once (the first call), never again
    assert len(rechecks) == 1 and rechecks[0] >= stable.MIN_COVERED


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_every_change_is_seen(name):
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    for _ in range(3):
        _check(f, m, x)
    undo = _mutations()[name](m)
    try:
        for _ in range(2):
            _check(f, m, x)
    finally:
        if undo:
            undo()
        _restore_classes()
    _check(f, m, x)  # and back


def test_random_sequences_of_changes():
    muts = _mutations()
    names = sorted(muts)
    for seed in range(3):
        rnd = random.Random(seed)
        m = Net().eval()
        x = torch.randn(3, 8)
        f = ember.compile(m, backend="eager")
        undos = []
        try:
            for _ in range(8):
                name = rnd.choice(names)
                u = muts[name](m)
                if u:
                    undos.append(u)
                _check(f, m, x)
                if undos and rnd.random() < 0.4:
                    undos.pop(rnd.randrange(len(undos)))()
                    _check(f, m, x)
        finally:
            for u in reversed(undos):
                u()
            _restore_classes()


def test_a_changing_global_rechecks_only_the_guards_that_read_it(monkeypatch):
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    rechecks = _spy_rechecks(monkeypatch)
    with torch.no_grad():
        f(x)
        covered = rechecks[0]
        rechecks.clear()
        for i in range(4):  # a module-level loop: its globals change on every step
            globals()["_loop_counter"] = i
            torch.testing.assert_close(f(x), m(x))
    globals().pop("_loop_counter", None)
    assert len(rechecks) == 4 and max(rechecks) < covered / 10, (rechecks, covered)


def test_without_the_extension_the_entry_is_unchanged(monkeypatch):
    monkeypatch.setattr(tc, "load_cached", lambda: None)
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    entry = f.__dict__["_ember_call"].cache.entries[0]
    assert "___stable_ok" not in entry.__globals__


def test_the_analysis_covers_module_guards_and_keeps_the_rest():
    import ast

    env = {"___M": nn.Linear(2, 2), "___G": {"k": 1}, "___L": [1, 2], "___T": (1, (2, "a"))}
    m = env["___M"]
    env["___p"] = m.weight
    g = stable._Graph(env, {"___M"}, {}, {"x"})

    def covered(expr: str) -> bool:
        try:
            g.conjunct(ast.parse(expr, mode="eval").body)
            return True
        except stable._NotCovered:
            return False

    assert covered("not ___M._forward_hooks")
    assert covered("(___M._parameters['weight']) is ___p")
    assert covered("type(___M.in_features) is int and ___M.in_features == 2")
    assert covered("'forward' not in ___M.__dict__")
    assert covered("list(___M._modules) == []")
    assert covered("(___G['k']) == 1 and len(___T) == 2 and ___T[1][1] == 'a'")
    assert not covered("___L == [1, 2]")  # a list compared by value: mutable
    assert not covered("x.shape == (2, 2)")  # an argument
    assert not covered("___M.weight is ___p")  # through Module.__getattr__
    assert not covered("___M.forward.__code__ is None")  # a special attribute
    assert not covered("(___G['k']) == 2")  # false now


def test_a_replaced_builtin_misses():
    """``builtins.abs = ...`` after the compile: the entry read ``abs`` and misses (what runs
    then is the user's business: Ember's own tracing calls builtins too)."""
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    for _ in range(3):
        _check(f, m, x)
    cf = f.__dict__["_ember_call"]
    entry = cf.cache.entries[0]
    real = builtins.abs
    builtins.abs = lambda v: 2 * real(v)
    try:
        with torch.no_grad():
            assert entry(cf.fn, m, x) is MISS
            assert "abs" in entry.failed_guard(cf.fn, m, x)
    finally:
        builtins.abs = real
    with torch.no_grad():
        assert entry(cf.fn, m, x) is not MISS


def test_the_state_check_answers_as_python_under_random_changes(ext):
    """The C++ state check alone (scripts/stable_fuzz.py: one object's hooks, parameters,
    attribute and class method): after each random change it answers exactly as the four
    guards evaluated in Python, and with only instance changes it takes the fast path in most
    passing states (a class changed breaks its node for good: Python from then on)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "stable_fuzz.py"
    spec = importlib.util.spec_from_file_location("stable_fuzz", path)
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    r = fuzz.run(ext, instance_only=True, steps=4000, seed=1)
    assert r["mismatches"] == 0 and r["fast"] > r["passing"] // 2, r
    r = fuzz.run(ext, instance_only=False, steps=4000, seed=2)
    assert r["mismatches"] == 0, r


def test_entries_built_before_the_extension_loads_are_split_once_it_does(monkeypatch):
    """A process's first entries may be built while the extension is still building: once it
    loads, their code is swapped for the version-checked one (lifetime.split_pending)."""
    from ember.capture import lifetime

    ext = tc._ext
    monkeypatch.setattr(tc, "_ext", None)
    monkeypatch.setattr(tc, "load_cached", lambda: None)
    m = Net().eval()
    x = torch.randn(3, 8)
    f = ember.compile(m, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    entry = f.__dict__["_ember_call"].cache.entries[0]
    assert "___stable_ok" not in entry.__globals__
    monkeypatch.setattr(tc, "_ext", ext)
    monkeypatch.undo()
    assert lifetime.split_pending() >= 1
    assert "___stable_ok" in entry.__globals__
    for _ in range(3):
        _check(f, m, x)
    m.blocks[3].scale = -1.0
    _check(f, m, x)


_HOOKS = ["_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_state_dict_hooks", "_load_state_dict_pre_hooks", "_forward_hooks_with_kwargs",
          "_forward_pre_hooks_with_kwargs"]


def _synthetic_entry(term: str, objs: dict):
    """An entry whose guards are ``term`` and enough covered hook guards on a Linear
    (``___M``) to be split, built as make_entry builds one: (its runtime source, the entry,
    the Linear). ``objs``: the other weakly held names ``term`` reads."""
    import weakref

    from ember.capture import lifetime

    m = nn.Linear(2, 2)
    env = {"___M": m, **objs}
    hooks = " and\n            ".join(f"not ___M.{h}" for h in _HOOKS)
    src = ("def ___entry(___fn, x):\n    try:\n"
           f"        if not ({term} and\n            {hooks}):\n"
           "            return ___MISS\n    except Exception:\n        return ___MISS\n"
           "    return 'hit'\n")
    g = {"___MISS": "miss", **{f"{n}__wr": weakref.ref(o) for n, o in env.items()}}
    run = stable.split(src, g, env, sorted(env), {})
    assert run is not src and "___stable_ok()" in run
    exec(compile(lifetime._with_prologue(run, sorted(env), {}, guarded=True), "<test>", "exec"),
         g)
    return run, g["___entry"], m


def test_a_kept_guard_with_or_keeps_its_parentheses():
    """The entry's guards are one ``and`` chain; a kept term such as a symbolic relation
    ``(s0 > 2 or s1 > 2)`` must stay one term when the covered ones leave the chain."""
    run, entry, m = _synthetic_entry("x is not None and\n            (x > 0 or x < -5)", {})
    assert "(x > 0 or x < -5)" in run
    assert entry(None, 1) == "hit" and entry(None, -7) == "hit"
    assert entry(None, -1) == "miss"  # with the parentheses lost: 'hit'
    m.register_forward_hook(lambda *a: None)
    assert entry(None, 1) == "miss"


def test_a_guard_with_or_tracks_every_operand():
    """``___A.x == 1 or ___B.y == 2`` read while the first operand decides it: after ``A.x``
    changes the guard passes through the second one, whose state must then be tracked too."""
    import ast

    class O:
        pass

    A, B = O(), O()
    A.x, B.y = 1, 2
    g = stable._Graph({"___A": A, "___B": B}, {"___A", "___B"}, {}, set())
    deps = g.conjunct(ast.parse("___A.x == 1 or ___B.y == 2", mode="eval").body)
    assert {g.nodes[i][2] for i in deps if g.nodes[i][0] == stable.WEAK} == {A, B}
    # and through the real check: A changes (the second operand decides), then B changes
    run, entry, _ = _synthetic_entry("(___A.x == 1 or ___B.y == 2)", {"___A": A, "___B": B})
    assert "___A.x" not in run
    assert entry(None, 0) == "hit"
    A.x = 0
    assert entry(None, 0) == "hit"  # through B.y == 2
    B.y = 3
    assert entry(None, 0) == "miss"
