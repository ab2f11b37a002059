"""Sources as structured values (issue 9 §4): they print exactly as the expression strings
capture used before (guards and golden snapshots depend on it), answer structural questions
without looking at their text, and are torch ``Source``s that a ShapeEnv accepts."""

from __future__ import annotations

import ast
import pathlib
import pickle

import pytest
import torch
import torch._guards
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                   StatelessSymbolicContext)

from ember.capture import sources as S
from ember.capture.sources import (Attr, Buffer, CellContents, ClosureCell, Defaults, Global,
                                   GetItem, Local, ModuleChild, NamespaceRef, Param,
                                   TensorSize, TensorStride, source_name)

SELF = Local("self")
FC_W = Param(ModuleChild(SELF, "fc"), "weight")


@pytest.mark.parametrize("src, text", [
    (Local("x"), "x"),
    (NamespaceRef("___G"), "___G"),
    (Attr(SELF, "scale"), "self.scale"),
    (Attr(SELF, "__func__", paren=True), "(self).__func__"),
    (GetItem(Local("xs"), 0), "(xs)[0]"),
    (GetItem(Local("d"), "k"), "(d)['k']"),
    (GetItem(Local("d"), "k", paren=False), "d['k']"),
    (Global(NamespaceRef("___G"), "w"), "___G['w']"),
    (ModuleChild(SELF, "0"), "self._modules['0']"),
    (FC_W, "self._modules['fc']._parameters['weight']"),
    (Buffer(SELF, "shift"), "self._buffers['shift']"),
    (ClosureCell(Local("___fn"), 1), "___fn.__closure__[1]"),
    (CellContents(ClosureCell(Local("___fn"), 0)), "___fn.__closure__[0].cell_contents"),
    (Defaults(Local("___fn")), "___fn.__defaults__"),
    (Defaults(Local("___fn")).item(2), "___fn.__defaults__[2]"),
    (Defaults(Local("___fn")).kwdefaults().item("n"), "___fn.__kwdefaults__['n']"),
    (TensorSize(Local("x"), 0), "x.size()[0]"),
    (TensorStride(Attr(SELF, "t"), 1), "self.t.stride()[1]"),
    (GetItem(GetItem(Local("args"), 1), "a"), "((args)[1])['a']"),
])
def test_prints_as_the_legacy_expression(src, text):
    assert str(src) == text
    assert f"({src}) is None" == f"({text}) is None"
    assert source_name(src) == text


def test_values_hashable_and_equal_by_structure():
    a = Param(ModuleChild(Local("self"), "fc"), "weight")
    assert a == FC_W and hash(a) == hash(FC_W) and a is not FC_W
    assert {a: 1}[FC_W] == 1
    # same text, different kinds of source: not equal
    assert Local("x") != NamespaceRef("x")
    assert Param(SELF, "w") != Buffer(SELF, "w")
    # an unhashable key (a slice) still makes a hashable source
    s = GetItem(Local("t"), slice(1, 2))
    assert str(s) == "(t)[slice(1, 2, None)]" and hash(s) == hash(GetItem(Local("t"), slice(1, 2)))
    with pytest.raises(dataclasses_frozen_error()):
        a.key = "bias"  # type: ignore[misc]


def dataclasses_frozen_error():
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_structural_queries():
    assert FC_W.is_parameter() and not FC_W.is_buffer()
    b = Buffer(ModuleChild(ModuleChild(SELF, "blocks"), "0"), "running_mean")
    assert b.is_buffer() and not b.is_parameter()
    assert FC_W.base == ModuleChild(SELF, "fc") and FC_W.root == SELF
    assert FC_W.module_path() == "fc.weight" and FC_W.module_source() == SELF
    assert b.module_path() == "blocks.0.running_mean"
    g = Param(ModuleChild(Global(NamespaceRef("___G"), "model"), "fc"), "bias")
    assert g.module_path() == "fc.bias" and g.module_source() == Global(NamespaceRef("___G"),
                                                                         "model")
    assert Local("x").module_path() is None and Local("x").base is None
    # a value read through a parameter (an element of a ParameterList-held tensor, say)
    through = GetItem(FC_W, 0)
    assert through.in_module_state() and not through.is_parameter()
    assert through.module_state() == FC_W
    assert not GetItem(Local("xs"), 0).in_module_state()
    assert [str(s) for s in GetItem(Local("xs"), 0).chain()] == ["(xs)[0]", "xs"]


def test_rebase_replaces_an_ancestor():
    ref = NamespaceRef("___Linear_1")
    assert str(FC_W.rebase(FC_W.base, ref)) == "___Linear_1._parameters['weight']"
    assert FC_W.rebase(Local("other"), ref) == FC_W
    assert FC_W.rebase(FC_W, ref) == ref


def test_is_a_torch_source_accepted_by_shape_env():
    assert isinstance(FC_W, torch._guards.Source)
    name = FC_W.name if S.NAME_IS_PROPERTY else FC_W.name()  # type: ignore[operator]
    assert name == str(FC_W)
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    src = Attr(SELF, "x")
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fake = mode.from_tensor(torch.randn(5, 3), source=src, symbolic_context=ctx)
    assert isinstance(fake.shape[0], torch.SymInt) and fake.shape[1] == 3
    guards = env.produce_guards([fake], [src])
    assert any("self.x.size()[0]" in g for g in guards), guards
    # our own TensorSize prints as torch's TensorPropertySource does
    sym = env.create_symbol(7, TensorSize(Local("y"), 0), dynamic_dim=DimDynamic.DYNAMIC)
    assert str(TensorSize(Local("y"), 0)) in [source_name(s) for s in env.var_to_sources[sym]]


def test_pickles():
    assert pickle.loads(pickle.dumps(FC_W)) == FC_W
    assert str(pickle.loads(pickle.dumps(GetItem(Local("d"), "k")))) == "(d)['k']"


def test_source_name_reads_strings_and_torch_sources():
    assert source_name("x.y") == "x.y"

    class Named:
        def name(self):
            return "z"
    assert source_name(Named()) == "z"


def test_does_not_import_torch_dynamo():
    tree = ast.parse(pathlib.Path(S.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("torch._dynamo") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("torch._dynamo")


def test_guard_source_local_or_global():
    def gs(s):
        v = s.guard_source
        return v() if callable(v) else v
    assert gs(FC_W) is torch._guards.GuardSource.LOCAL
    assert gs(Attr(Global(NamespaceRef("___G"), "m"), "w")) is torch._guards.GuardSource.GLOBAL


def test_equality_is_by_kind_and_expression():
    assert GetItem(Local("x"), 1) != GetItem(Local("x"), True)  # 1 == True, but not as sources
    assert Local("x") != NamespaceRef("x")
    # never equal to its text: code holding strings converts explicitly
    assert Local("x") != "x" and "x" != Local("x") and Local("x") not in ("y", "x")
    assert str(Local("x")) in ("y", "x")


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        return self.fc(x) + self.shift


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(_Inner(), _Inner())
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.blocks(x) * self.scale


def test_capture_inputs_carry_structured_sources():
    import ember
    m = _Outer()
    ember.compile(m, backend="eager")(torch.randn(2, 3))
    cap = ember.last_capture()
    by_path = {i.module_path: i for i in cap.inputs if i.kind in ("parameter", "buffer")}
    assert set(by_path) == {"blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.shift",
                            "blocks.1.fc.weight", "blocks.1.fc.bias", "blocks.1.shift", "scale"}
    assert dict(m.named_parameters()).keys() | dict(m.named_buffers()).keys() == set(by_path)
    shift = by_path["blocks.1.shift"]
    assert shift.kind == "buffer" and shift.origin.is_buffer()
    assert shift.source == "self._modules['blocks']._modules['1']._buffers['shift']"
    assert str(shift.origin) == shift.source and shift.origin.module_source() == Local("self")
    w = by_path["blocks.0.fc.weight"]
    assert w.kind == "parameter" and w.origin.is_parameter() and w.stable_address
    user = [i for i in cap.inputs if i.kind == "user"]
    assert [i.origin for i in user] == [Local("x")] and user[0].module_path is None
    # a parameter is fetched through its module's namespace reference (identity-guarded)
    assert w.fetch.startswith("___") and w.fetch != w.source


def test_parameter_guard_reads_through_identity_guarded_module():
    from ember.capture.output import OutputGraph
    out = OutputGraph({})
    mod = ModuleChild(SELF, "fc")
    out.guards.add_identity(mod, "___fc_ref")
    assert out.guards.identity[mod] == "___fc_ref"
    assert str(out._short_path(Param(mod, "weight"))) == "___fc_ref._parameters['weight']"
    assert out._short_path(Param(ModuleChild(SELF, "other"), "w")) == \
        Param(ModuleChild(SELF, "other"), "w")
    lin = torch.nn.Linear(1, 1)
    ref = out.ns(lin, "Linear")
    assert out.stable_ref(lin, mod) == "(self._modules['fc'])"
    out.guards.add_identity(Attr(SELF, "lin"), ref)
    assert out.stable_ref(lin, Attr(SELF, "lin")) == ref
