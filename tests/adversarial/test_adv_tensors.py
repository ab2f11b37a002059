"""Adversarial programs over tensor arguments: metadata changing between calls, inputs that
share memory (views of each other, ``p.data`` of a parameter) while the graph mutates one, and
in-place updates called repeatedly. Every call must give eager's answer and eager's side
effects."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember

BACKENDS = ["eager", "aot_eager"]
ALL = ["eager", "aot_eager", "inductor"]


def same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)


def _mutate_a_read_c(a, c):
    a.add_(1)
    return c * 2


@pytest.mark.parametrize("backend", ALL)
def test_mutated_input_aliased_by_a_later_call(backend):
    cf = ember.compile(_mutate_a_read_c, backend=backend)
    same(cf(torch.zeros(4), torch.zeros(4)), torch.zeros(4))
    for make in (lambda b: (b, b[:]), lambda b: (b[:4], b[2:6]), lambda b: (b.view(2, 4), b)):
        b1, b2 = torch.zeros(8), torch.zeros(8)
        got = cf(*make(b1))
        want = _mutate_a_read_c(*make(b2))
        same(got, want)
        same(b1, b2)


@pytest.mark.parametrize("backend", ALL)
def test_mutated_input_aliased_at_the_first_call(backend):
    cf = ember.compile(_mutate_a_read_c, backend=backend)
    b1, b2 = torch.zeros(4), torch.zeros(4)
    same(cf(b1, b1[:]), _mutate_a_read_c(b2, b2[:]))
    same(b1, b2)
    x1, y1, x2, y2 = (torch.zeros(4) for _ in range(4))
    same(cf(x1, y1), _mutate_a_read_c(x2, y2))
    same(x1, x2)
    same(y1, y2)


@pytest.mark.parametrize("backend", ALL)
def test_argument_shares_memory_with_a_parameter(backend):
    w = nn.Parameter(torch.ones(2, 2))

    def f(x):
        x.mul_(2)
        return w.sum() + x.sum()

    cf = ember.compile(f, backend=backend)
    with torch.no_grad():
        same(cf(torch.ones(2, 2)), torch.tensor(12.0))
        got = cf(w.data)  # x is w's storage: eager sees w doubled
    same(got, torch.tensor(16.0))
    same(w.detach(), torch.full((2, 2), 2.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_buffer_aliased_by_the_input(backend):
    torch.manual_seed(0)
    a, b = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    ca = ember.compile(a, backend=backend)
    x = torch.randn(3, 4)
    same(ca(x), b(x))
    # the input is a view of the running mean the graph updates
    same(ca(a.running_mean.expand(3, 4)), b(b.running_mean.expand(3, 4)))
    same(a.running_mean, b.running_mean)


@pytest.mark.parametrize("backend", ALL)
def test_input_mutation_called_repeatedly(backend):
    def f(x, counter):
        counter.add_(1)
        x.mul_(counter)
        return x.sum() + counter

    cf = ember.compile(f, backend=backend)
    xs = [torch.ones(3), torch.ones(3)]
    cs = [torch.zeros(()), torch.zeros(())]
    for _ in range(3):
        same(cf(xs[0], cs[0]), f(xs[1], cs[1]))
        same(xs[0], xs[1])
        same(cs[0], cs[1])


@pytest.mark.parametrize("backend", ALL)
def test_running_stats_over_calls_and_modes(backend):
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
    b = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
    b.load_state_dict(a.state_dict())
    ca = ember.compile(a, backend=backend)
    for step in range(5):
        if step == 3:
            a.eval()
            b.eval()
        x = torch.randn(6, 3)
        same(ca(x), b(x))
        same(a[1].running_mean, b[1].running_mean)
        same(a[1].running_var, b[1].running_var)
        assert int(a[1].num_batches_tracked) == int(b[1].num_batches_tracked)


_VIEWS = {
    "transposed": lambda: torch.arange(6.0).reshape(2, 3).t(),
    "expanded": lambda: torch.arange(3.0).expand(2, 3),
    "offset": lambda: torch.arange(12.0)[6:].reshape(2, 3),
    "strided": lambda: torch.arange(12.0).reshape(2, 6)[:, ::2],
    "noncontig_3d": lambda: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
}


@pytest.mark.parametrize("view", sorted(_VIEWS))
@pytest.mark.parametrize("backend", ALL)
def test_layouts_between_calls(view, backend):
    def f(x):
        y = x * 2 + 1
        return y.sum(0), y.is_contiguous(), x.stride()

    cf = ember.compile(f, backend=backend)
    base = torch.arange(6.0).reshape(2, 3) if view != "noncontig_3d" else \
        torch.arange(24.0).reshape(4, 2, 3)
    for x in (base, _VIEWS[view](), base):
        got, want = cf(x), f(x)
        same(got[0], want[0])
        assert got[1:] == want[1:]


@pytest.mark.parametrize("backend", ALL)
def test_dtype_shape_requires_grad_between_calls(backend):
    def f(x, w):
        return (x * w).sum(-1)

    cf = ember.compile(f, backend=backend)
    cases = [(torch.ones(2, 3), torch.ones(3)),
             (torch.ones(2, 3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)),
             (torch.ones(4, 3), torch.ones(3)),
             (torch.ones(2, 3), torch.ones(3, requires_grad=True))]
    for x, w in cases:
        got, want = cf(x, w), f(x, w)
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
        same(got, want)
    w1 = torch.ones(3, requires_grad=True)
    w2 = torch.ones(3, requires_grad=True)
    cf(torch.arange(6.0).reshape(2, 3), w1).sum().backward()
    f(torch.arange(6.0).reshape(2, 3), w2).sum().backward()
    same(w1.grad, w2.grad)


@pytest.mark.parametrize("backend", ALL)
def test_conj_and_neg_views(backend):
    def f(x):
        return x * 2

    cf = ember.compile(f, backend=backend)
    x = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    same(cf(x), f(x))
    same(cf(x.conj()), f(x.conj()))


@pytest.mark.parametrize("backend", ALL)
def test_manual_seed_between_calls(backend):
    def f(x):
        return x + torch.rand(3)

    cf = ember.compile(f, backend=backend)
    x = torch.zeros(3)
    for seed in (1, 2, 1):
        torch.manual_seed(seed)
        got = cf(x)
        after = torch.rand(2)
        torch.manual_seed(seed)
        want = f(x)
        same(got, want)
        same(after, torch.rand(2))  # the generator advanced as eager's did


# ------------------------------------------------------------------------------------------
# tensor properties outside the tensor guard, read as Python values

_BASE = torch.arange(8.0)
_PROPS = {
    "is_leaf": ("x.is_leaf", lambda: torch.ones(2, requires_grad=True),
                lambda: torch.ones(2, requires_grad=True) * 1),
    "grad_fn": ("x.grad_fn is None", lambda: torch.ones(2, requires_grad=True),
                lambda: torch.ones(2, requires_grad=True) * 1),
    "is_view": ("x._is_view()", lambda: torch.arange(4.0), lambda: _BASE[:4]),
    "base": ("x._base is None", lambda: torch.arange(4.0), lambda: _BASE[:4]),
    "storage_offset": ("x.storage_offset()", lambda: _BASE[:4], lambda: _BASE[4:]),
    "derived_offset": ("x[1:].storage_offset()", lambda: _BASE[:4], lambda: _BASE[4:]),
    "is_conj": ("x.is_conj()", lambda: torch.ones(2, dtype=torch.complex64),
                lambda: torch.ones(2, dtype=torch.complex64).conj()),
    "version": ("x._version", lambda: torch.ones(2), lambda: torch.ones(2).add_(0)),
    "retains_grad": ("x.retains_grad", lambda: torch.ones(2, requires_grad=True) * 1,
                     lambda: _retained()),
    "storage_nbytes": ("x.untyped_storage().nbytes()", lambda: _BASE[:4],
                       lambda: torch.arange(4.0)),
}


def _retained():
    t = torch.ones(2, requires_grad=True) * 1
    t.retain_grad()
    return t


@pytest.mark.parametrize("prop", sorted(_PROPS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_property_read_is_guarded(prop, backend):
    expr, first, second = _PROPS[prop]
    f = eval(f"lambda x: (x * 2, {expr})")
    cf = ember.compile(f, backend=backend)
    for make in (first, second, first):
        got, want = cf(make()), f(make())
        assert got[1] == want[1]
        same(got[0], want[0])


def test_method_of_an_argument_object_after_a_break():
    # a bound builtin method of an argument (here the storage) read after a graph break must
    # be this call's, not the first call's
    def f(x):
        return x * 2, x.untyped_storage().nbytes()

    cf = ember.compile(f, backend="eager")
    assert cf(torch.arange(8.0)[:4])[1] == 32
    assert cf(torch.arange(4.0))[1] == 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_generator_state_read(backend):
    g = torch.Generator().manual_seed(3)

    def f(x):
        return x * g.initial_seed()

    cf = ember.compile(f, backend=backend)
    same(cf(torch.ones(1)), torch.full((1,), 3.0))
    g.manual_seed(11)
    same(cf(torch.ones(1)), torch.full((1,), 11.0))


# ------------------------------------------------------------------------------------------
# autograd metadata changed inside the compiled function


@pytest.mark.parametrize("backend", ALL)
def test_requires_grad_set_in_place_inside(backend):
    def f(x):
        x.requires_grad_()
        return (x * 2).sum()

    cf = ember.compile(f, backend=backend)
    x = torch.ones(2)
    r = cf(x)
    assert x.requires_grad and r.requires_grad
    r.backward()
    same(x.grad, torch.full((2,), 2.0))


@pytest.mark.parametrize("backend", ALL)
def test_parameter_updated_under_no_grad_inside(backend):
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())

    def make(lin):
        def f(x):
            y = lin(x)
            with torch.no_grad():
                lin.weight.mul_(0.5)
            return y
        return f

    cf, f = ember.compile(make(a), backend=backend), make(b)
    x = torch.ones(1, 2)
    for _ in range(3):
        got, want = cf(x), f(x)
        same(got, want)
        same(a.weight, b.weight)
        got.sum().backward()
        want.sum().backward()
        same(a.weight.grad, b.weight.grad)
