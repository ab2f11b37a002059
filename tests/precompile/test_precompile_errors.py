"""Every call-time check of a precompiled artifact, and what precompile refuses."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.precompile import InputMismatchError, PrecompileError, PrecompileGraphBreak


class Net(torch.nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.fc = torch.nn.Linear(d, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x)).relu()


def step(model, x):
    return model(x).sum()


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 8)
    return ember.precompile(step, model, x).load(), model, x


def _raises(fn, *args, match):
    with pytest.raises(InputMismatchError, match=match):
        fn(*args)


def test_input_checks(loaded):
    fn, model, x = loaded
    _raises(fn, model, x.double(), match=r"'x' dtype: expected torch.float32, given torch.float64")
    _raises(fn, model, torch.randn(4, 8), match=r"'x' shape: expected \(3, 8\), given \(4, 8\)")
    _raises(fn, model, torch.randn(8, 3).t(),
            match=r"'x' strides \(memory layout\): expected \(8, 1\), given \(1, 3\)")
    _raises(fn, model, x.to("meta"), match=r"'x' device: expected cpu, given meta")
    _raises(fn, model, x.to_sparse(), match=r"'x' layout: expected torch.strided")
    _raises(fn, model, x.clone().requires_grad_(), match=r"'x' requires_grad")
    _raises(fn, model, [x], match=r"argument 'x': expected a Tensor, given list")


def test_model_checks(loaded):
    fn, model, x = loaded
    _raises(fn, Net(d=6), x, match=r"model.fc.weight shape: expected \(4, 8\), given \(4, 6\)")
    _raises(fn, Net().double(), x, match=r"model.fc.weight dtype: expected torch.float32")
    m = Net()
    m.fc.bias.requires_grad_(False)
    _raises(fn, m, x, match=r"model.fc.bias requires_grad: expected True, given False")
    m = Net()
    m.fc.weight = torch.nn.Parameter(m.fc.weight.detach().to("meta"))
    _raises(fn, m, x, match=r"model.fc.weight device: expected cpu, given meta")
    m = Net()
    m.extra = torch.nn.Linear(2, 2)
    _raises(fn, m, x, match=r"parameters and buffers.*extra: \['extra.weight', 'extra.bias'\]")
    _raises(fn, torch.nn.Sequential(torch.nn.Linear(8, 4)), x, match=r"class: expected .*Net")
    _raises(fn, Net().eval(), x, match=r"model.<root> mode: expected train\(\), given eval\(\)")
    m = Net()
    m.fc.register_forward_hook(lambda mod, inp, out: out * 2)
    _raises(fn, m, x, match=r"model.fc forward hooks: expected none, given some")


def test_state_checks(loaded):
    fn, model, x = loaded
    with torch.no_grad():
        _raises(fn, model, x, match=r"grad mode: expected enabled")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _raises(fn, model, x, match=r"autocast on cpu: expected disabled")


def test_new_weights_give_that_models_results(loaded):
    fn, _, x = loaded
    torch.manual_seed(123)
    other = Net()
    import copy
    ref = step(copy.deepcopy(other), x)
    torch.testing.assert_close(fn(other, x), ref)


def test_value_argument_is_checked():
    def f(x, n):
        return x * n

    fn = ember.precompile(f, torch.ones(2), 3).load()
    assert torch.equal(fn(torch.ones(2), 3), torch.full((2,), 3.0))
    with pytest.raises(InputMismatchError, match=r"argument 'n': expected 3, given 4"):
        fn(torch.ones(2), 4)


def test_graph_break_lists_breaks_with_location():
    model, x = Net(), torch.randn(3, 8)

    def f(model, x):
        y = model(x)
        if y.sum().item() > 0:  # a value read in Python: a graph break
            return y
        return -y

    with pytest.raises(PrecompileGraphBreak) as e:
        ember.precompile(f, model, x)
    msg = str(e.value)
    assert "item" in msg and f"{__file__}:" in msg and "one graph" in msg
    assert len(e.value.breaks) >= 1


def test_training_step_limits_are_clear_errors():
    """backward() inside is supported; computing after it, or create_graph, is refused with
    what to do."""
    model, x = Net(), torch.randn(3, 8)

    def after(model, x):
        loss = model(x).sum()
        loss.backward()
        return loss.detach() * 2  # tensor work after backward: a second graph

    with pytest.raises(PrecompileError, match=r"after calling backward\(\).*may only return"):
        ember.precompile(after, model, x)

    def double(model, x):
        loss = model(x).sum()
        loss.backward(create_graph=True)
        return loss

    with pytest.raises(PrecompileError, match=r"create_graph=True"):
        ember.precompile(double, model, x)
    assert all(p.grad is None for p in model.parameters())  # precompile ran no backward


_GLOBAL_W = torch.randn(8, 8)


def test_tensor_not_among_arguments_refused():
    def f(x):
        return x @ _GLOBAL_W

    with pytest.raises(PrecompileError, match=r"not an argument nor a parameter/buffer"):
        ember.precompile(f, torch.randn(2, 8))


def test_unsupported_backend_names_protocol():
    def opaque(gm, example_inputs):
        return lambda *a: gm(*a)

    with pytest.raises(PrecompileError, match=r"does not support precompile.*ember_precompile"):
        ember.precompile(lambda x: x.sin(), torch.randn(2), backend=opaque)


def test_side_effect_refused():
    def f(x, log):
        log.append(1)
        return x + 1

    with pytest.raises(PrecompileError, match="side effect"):
        ember.precompile(f, torch.randn(2), [])


def test_unsupported_argument_type_refused():
    class Holder:
        pass

    with pytest.raises(PrecompileError, match=r"argument 'h' of type Holder"):
        ember.precompile(lambda x, h: x + 1, torch.randn(2), Holder())


def test_tied_and_repeated_tensors_must_stay_tied():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    m, x = Tied(), torch.randn(2, 4)
    fn = ember.precompile(lambda m, x, y: m(x) + y, m, x, x).load()
    other = Tied()
    torch.testing.assert_close(fn(other, x, x), other(x) + x)
    untied = Tied()
    untied.b.weight = torch.nn.Parameter(untied.a.weight.detach().clone())
    _raises(fn, untied, x, x, match=r"m.b.weight: expected the same tensor object")
    _raises(fn, other, x, x.clone(), match=r"'y': expected the same tensor object")


def test_python_values_the_graph_depends_on_are_checked():
    class Scaled(torch.nn.Module):
        def __init__(self, scale=2.0, heads=4):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.scale, self.heads = scale, heads

        def forward(self, x):
            return self.fc(x).view(x.shape[0], self.heads, -1) * self.scale

    m, x = Scaled(), torch.randn(2, 4)
    fn = ember.precompile(lambda model, x: model(x), m, x).load()
    assert "_rt.check_guard(" in fn.source
    torch.testing.assert_close(fn(Scaled(), x).shape, m(x).shape)
    _raises(fn, Scaled(scale=3.0), x, match=r"guard `.*model.scale.*`: expected True")
    _raises(fn, Scaled(heads=2), x, match=r"guard `.*model.heads.*`")
