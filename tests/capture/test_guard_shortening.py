"""Guards read through identity-guarded objects (GuardSet.shortened): a path below a module
whose identity is guarded is read from the namespace reference, not walked from the root on
every call. What must hold: the rewrite never changes what a guard means (string literals,
longer names, an identity guard's own object), and every change the long form caught is still
caught (an attribute, a submodule, a parameter replaced)."""

from __future__ import annotations

import torch

import ember
from ember.capture.output import GuardSet
from ember.capture.sources import Attr, Local, ModuleChild


def _guards(*pairs):
    gs = GuardSet()
    for src, ref in pairs:
        gs.add_identity(src, ref)
    return gs


def test_paths_below_a_guarded_object_read_its_reference():
    s = Local("self")
    inner = ModuleChild(s, "inner")
    fc = ModuleChild(inner, "fc")
    gs = _guards((s, "___M_0"), (inner, "___Inner_1"), (fc, "___Linear_2"))
    gs.add(f"type({inner}.k) is float and ({inner}.k) == 3.0")
    gs.add(f"({fc}.in_features) == 4")
    got = gs.shortened()
    # a root is a local already: kept; a child's identity guard reads through its guarded
    # parent
    assert got[0] == "(self) is ___M_0"
    assert got[1] == "(self._modules['inner']) is ___Inner_1"
    assert got[2] == "(___Inner_1._modules['fc']) is ___Linear_2"
    assert got[3] == "type(___Inner_1.k) is float and (___Inner_1.k) == 3.0"
    assert got[4] == "(___Linear_2.in_features) == 4"
    # the long form is kept for the guard log and for naming the guard that failed
    assert gs.exprs[3] == f"type({inner}.k) is float and ({inner}.k) == 3.0"


def test_an_identity_guard_is_never_rewritten_to_itself():
    s = Local("self")
    a = Attr(s, "a")
    gs = _guards((a, "___A_1"))
    assert gs.shortened() == ["(self.a) is ___A_1"]


def test_string_literals_longer_names_and_scopes_are_kept():
    s = Local("self")
    a = Attr(s, "a")
    gs = _guards((a, "___A_1"))
    kept = ["type(___code.co_varnames[0]) is str and (___code.co_varnames[0]) == 'self.a'",
            '(self.ab) == 2',            # a longer attribute name, not self.a
            '(xself.a) == 2',            # the tail of another name
            '(___g.self.a) == 2',        # the tail of another path
            'all(x is self.a for x in ___xs)']  # a comprehension: its own scope
    for k in kept:
        gs.add(k)
    got = gs.shortened()
    assert got[1:] == kept
    gs.add("(self.a.b) == 'self.a' and (self.a)[0] == \"it's self.a\"")
    assert gs.shortened()[-1] == "(___A_1.b) == 'self.a' and (___A_1)[0] == \"it's self.a\""


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 3.0
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * self.k


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Scaled()

    def forward(self, x):
        return self.inner(x).relu()


def _close(a, b):
    return torch.allclose(a, b, atol=1e-6)


def test_changes_below_a_guarded_module_are_still_caught():
    torch.manual_seed(0)
    m = Outer()
    x = torch.randn(2, 4)
    f = ember.compile(m, backend="eager")
    with torch.no_grad():
        assert _close(f(x), m(x))
        src = ember.last_capture().entry_source
        # the nested attribute is read through the inner module's reference
        assert "._modules['inner'].k" not in src.split("___compiled")[0]
        m.inner.k = 5.0                                   # an attribute of a submodule
        assert _close(f(x), m(x))
        m.inner.fc = torch.nn.Linear(4, 4)                # a submodule replaced
        assert _close(f(x), m(x))
        m.inner.fc.weight = torch.nn.Parameter(torch.randn(4, 4))  # a parameter replaced
        assert _close(f(x), m(x))
        m.inner = Scaled()                                # the guarded module itself
        m.inner.k = -1.0
        assert _close(f(x), m(x))
        with torch.no_grad():
            m.inner.fc.weight.data = torch.randn(4, 4).t()  # same object, other strides
        assert _close(f(x), m(x))
