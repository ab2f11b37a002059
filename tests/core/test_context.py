"""CompileContext: handed to backends that declare a ``context`` parameter, never to others."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ember
from ember.context import CompileContext, InputInfo


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return self.fc(x) * self.scale


def _recording(level="torch"):
    seen = []

    def compile_fn(gm, example_inputs, *, context=None, **options):
        seen.append((context, len(example_inputs), dict(options)))
        return gm.forward

    return seen, ember.Backend(name=f"ctx_{level}", compile=compile_fn, level=level)


def test_torch_level_context_names_parameters_buffers_and_user_inputs():
    seen, be = _recording()
    m = Net()
    x = torch.randn(2, 3)
    with torch.no_grad():
        out = ember.compile(m, backend=be, mode="max-autotune")(x)
        torch.testing.assert_close(out, m(x))
    [(ctx, n, opts)] = seen
    assert isinstance(ctx, CompileContext)
    assert ctx.kind == "inference"
    assert ctx.device == "cpu" and ctx.mode == "max-autotune" and ctx.backend == "ctx_torch"
    assert opts == {"mode": "max-autotune"} and "context" not in opts
    assert len(ctx.inputs) == n
    kinds = sorted(i.kind for i in ctx.inputs)
    assert kinds == ["buffer", "parameter", "parameter", "user"]
    for i in ctx.inputs:
        assert i.stable_address == (i.kind in ("parameter", "buffer"))
        assert i.source  # an expression
    user = [i for i in ctx.inputs if i.kind == "user"]
    assert user[0].source == "x"
    assert any("scale" in i.source for i in ctx.inputs if i.kind == "buffer")
    assert ctx.graph_id.startswith("forward_") and ctx.graph_id.isidentifier()
    assert sorted(ctx.parameter_indices) == sorted(
        k for k, i in enumerate(ctx.inputs) if i.kind != "user")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.kind = "forward"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.options["x"] = 1  # type: ignore[index]


def test_torch_level_training_kind():
    seen, be = _recording()
    m = Net()
    ember.compile(m, backend=be)(torch.randn(2, 3)).sum().backward()
    assert seen[0][0].kind == "training"
    assert m.fc.weight.grad is not None


def test_aten_level_forward_backward_contexts():
    seen, be = _recording("aten")
    m = Net()
    x = torch.randn(2, 3, requires_grad=True)
    out = ember.compile(m, backend=be)(x)
    ref = m(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    kinds = [c.kind for c, _, _ in seen]
    assert kinds == ["forward", "backward"]
    fw, bw = seen[0][0], seen[1][0]
    assert fw.graph_id.endswith(".forward") and bw.graph_id.endswith(".backward")
    assert fw.graph_id.rsplit(".", 1)[0] == bw.graph_id.rsplit(".", 1)[0]
    assert len(fw.inputs) == seen[0][1] and len(bw.inputs) == seen[1][1]
    assert sorted(i.kind for i in fw.inputs) == ["buffer", "parameter", "parameter", "user"]
    assert {i.kind for i in bw.inputs} <= {"activation", "tangent", "parameter", "buffer",
                                           "user"}
    assert bw.inputs[-1].kind == "tangent"
    # a saved primal keeps its identity: a saved parameter is still a stable parameter
    for i in bw.inputs:
        assert i.stable_address == (i.kind in ("parameter", "buffer"))


def test_aten_level_inference_context():
    seen, be = _recording("aten")
    m = Net()
    with torch.no_grad():
        ember.compile(m, backend=be)(torch.randn(2, 3))
    [(ctx, n, _)] = seen
    assert ctx.kind == "inference" and ctx.graph_id.endswith(".inference") and len(ctx.inputs) == n


def test_old_style_backends_never_see_context():
    got = []

    def plain(gm, example_inputs):
        got.append("plain")
        return gm.forward

    def kwargs_backend(gm, example_inputs, **options):
        got.append(sorted(options))
        return gm.forward

    x = torch.randn(3)
    for b in (plain, kwargs_backend, ember.Backend(name="kw_aten", compile=kwargs_backend,
                                                  level="aten")):
        ember.reset()
        f = ember.compile(lambda t: t.sin() + 1, backend=b)
        torch.testing.assert_close(f(x), x.sin() + 1)
    assert got[0] == "plain" and all(g == [] for g in got[1:]) and len(got) == 3


def test_accepts_context_is_decided_from_the_signature():
    def a(gm, ex, *, context=None):
        return gm.forward

    def b(gm, ex, **kw):
        return gm.forward

    def c(gm, ex, context):
        return gm.forward

    assert ember.Backend(name="a", compile=a).accepts_context
    assert not ember.Backend(name="b", compile=b).accepts_context
    assert ember.Backend(name="c", compile=c).accepts_context
    assert ember.get_backend(a).accepts_context  # plain callables keep their signature


def test_context_validates_kinds():
    with pytest.raises(ValueError):
        CompileContext("g", "sideways", (), "cpu", None, {})
    with pytest.raises(ValueError):
        CompileContext("g", "forward", (InputInfo("weird", "", False),), "cpu", None, {})


def test_wrong_output_structure_is_an_error_naming_the_backend():
    def bare(gm, example_inputs):
        return lambda *a: gm(*a)[0]  # a bare tensor instead of the output tuple

    def short(gm, example_inputs):
        return lambda *a: ()

    x = torch.randn(4, 3)
    for b, what in ((bare, "Tensor"), (short, "tuple of 0")):
        ember.reset()
        f = ember.compile(lambda t: t.cos() * 2, backend=b)
        with ember.config.patch(suppress_errors=False):
            with pytest.raises(ember.BackendCompilerFailed) as ei:
                f(x)
        msg = str(ei.value)
        assert b.__name__ in msg and what in msg, msg


def test_output_check_runs_once_then_gets_out_of_the_way():
    calls = []

    def be(gm, example_inputs):
        def run(*a):
            calls.append(1)
            return gm(*a)
        return run

    f = ember.compile(lambda t: t + 1, backend=be)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(f(x), x + 1)
    assert len(calls) == 3


def test_graph_ids_are_distinct_per_graph_and_stable_after_reset():
    seen, be = _recording()

    def f(t):
        y = t.sin()
        print("break")
        return y.cos()

    def run():
        ember.reset()
        seen.clear()
        cf = ember.compile(f, backend=be)
        cf(torch.randn(3))
        cf(torch.randn(4))  # a recompile: another graph
        return [c.graph_id for c, _, _ in seen]

    ids = run()
    assert len(ids) == len(set(ids)) >= 3
    assert run() == ids  # the same program gives the same names
    assert ember.last_capture().graph_id in ids
