"""Module instances share graphs: a function that sees a second instance of a module class in an
argument guards it by class from then on (its parameters and buffers become graph inputs read
on every call), so the layers of a model or the experts of a mixture compile twice, not once
each. Every case compares with eager, since sharing must never return another instance's
answer."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import events

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with ember.config.patch(persist_capture=False):
        yield
    ember.reset()


def _same(a, b):
    torch.testing.assert_close(a, b)


class Block(torch.nn.Module):
    def __init__(self, seed, bias=True, act=None):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(4, 4, bias=bias)
        self.act = act if act is not None else torch.nn.ReLU()
        self.scale = 2.0
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return self.act(self.lin(x)) * self.scale + self.shift


def _step(m, x):
    return m(x)


def _graphs():
    return events.counters["stats"]["graphs"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_instances_share_one_graph(backend):
    f = ember.compile(_step, backend=backend)
    blocks = [Block(i) for i in range(6)]
    x = torch.randn(2, 4)
    before = _graphs()
    with torch.no_grad():
        for _ in range(2):
            for b in blocks:
                _same(f(b, x), b(x))
    assert _graphs() - before == 2  # the first instance, then one graph for all the others


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_graph_reads_each_instances_state(backend):
    f = ember.compile(_step, backend=backend)
    blocks = [Block(i) for i in range(4)]
    x = torch.randn(2, 4)
    with torch.no_grad():
        for b in blocks:
            _same(f(b, x), b(x))
        blocks[2].lin.weight.add_(1.0)                       # in place
        blocks[3].lin.weight = torch.nn.Parameter(torch.ones(4, 4))   # replaced
        blocks[1].shift.zero_()                              # a buffer in place
        blocks[1].scale = 3.0                                # a plain attribute
        blocks[0].lin.weight.data = torch.zeros(4, 4)        # through .data (the first one)
        for b in blocks:
            _same(f(b, x), b(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_instances_of_one_class_with_other_structure(backend):
    f = ember.compile(_step, backend=backend)
    x = torch.randn(2, 4)
    variants = [Block(0), Block(1), Block(2, bias=False), Block(3, act=torch.nn.GELU()),
                Block(4, act=torch.nn.Sequential(torch.nn.Tanh(), torch.nn.ReLU()))]
    hooked = Block(5)
    hooked.act.register_forward_hook(lambda mod, args, out: out * 10)
    replaced = Block(6)
    replaced.forward = lambda t: t - 100  # an instance's own forward
    extra = Block(7)
    extra.lin.register_parameter("unused", torch.nn.Parameter(torch.ones(1)))
    with torch.no_grad():
        for _ in range(2):
            for b in [*variants, hooked, replaced, extra]:
                _same(f(b, x), b(x))


def test_training_gradients_of_each_instance():
    f = ember.compile(_step, backend="aot_eager")
    blocks = [Block(i) for i in range(4)]
    twins = [Block(i) for i in range(4)]
    x = torch.randn(2, 4)
    for b, t in zip(blocks, twins):
        f(b, x).pow(2).sum().backward()
        t(x).pow(2).sum().backward()
    for b, t in zip(blocks, twins):
        for (n, p), q in zip(b.named_parameters(), t.parameters()):
            _same(p.grad, q.grad)
    blocks[3].lin.weight.requires_grad_(False)  # requires_grad is guarded per instance
    blocks[3].zero_grad()
    f(blocks[3], x).sum().backward()
    assert blocks[3].lin.weight.grad is None and blocks[3].lin.bias.grad is not None


class _Counter(torch.nn.Module):
    """A buffer mutated in place by forward: each instance's own buffer must be updated."""

    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.zeros(3))
        self.register_buffer("b", torch.ones(3))

    def forward(self, x):
        self.a.add_(1)
        return x * self.a + self.b


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_buffers_mutated_by_forward_belong_to_their_instance(backend):
    f = ember.compile(_step, backend=backend)
    ref = [_Counter() for _ in range(3)]
    got = [_Counter() for _ in range(3)]
    aliased, aliased_ref = _Counter(), _Counter()
    aliased.b = aliased.a  # two buffers, one tensor: the shared graph assumed two
    aliased_ref.b = aliased_ref.a
    x = torch.randn(3)
    for _ in range(2):
        for r, g in zip([*ref, aliased_ref], [*got, aliased]):
            _same(f(g, x), r(x))
            _same(g.a, r.a)


def test_inference_graph_context_marks_shared_parameters_unstable():
    seen = []

    def compile_fn(gm, example_inputs, *, context=None, **options):
        seen.append([(i.kind, i.stable_address) for i in context.inputs])
        return gm.forward

    f = ember.compile(_step, backend=ember.Backend(name="sharing_ctx", compile=compile_fn))
    x = torch.randn(2, 4)
    blocks = [Block(i) for i in range(3)]  # alive together: the first is not replaced
    with torch.no_grad():
        for b in blocks:
            _same(f(b, x), b(x))
    assert len(seen) == 2
    first, shared = seen
    assert ("parameter", True) in first and ("parameter", False) not in first
    assert ("parameter", False) in shared and ("parameter", True) not in shared


def test_separately_compiled_models_stay_specialized():
    """ember.compile(model) for two models of one class: each keeps its own entries (its
    parameters stable, foldable), unlike two instances passed to one compiled function."""
    seen = []

    def compile_fn(gm, example_inputs, *, context=None, **options):
        seen.append({i.stable_address for i in context.inputs if i.kind == "parameter"})
        return gm.forward

    be = ember.Backend(name="sharing_sep", compile=compile_fn)
    x = torch.randn(2, 4)
    blocks = [Block(i) for i in range(3)]
    compiled = [ember.compile(b, backend=be) for b in blocks]
    with torch.no_grad():
        for b, c in zip(blocks, compiled):
            _same(c(x), b(x))
    assert seen == [{True}] * 3


class _Routed(torch.nn.Module):
    """A loop over layers with a data-dependent branch inside: the frame runs eagerly and the
    layers it calls are compiled one by one (capture/nested.py), sharing one graph."""

    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(i) for i in range(n))

    def forward(self, x):
        for layer in self.layers:
            if x.sum() > 1e9:  # a branch on a value: a break inside the loop
                x = x * 0
            x = layer(x)
        return x


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_layers_called_by_a_skipped_frame_share_a_graph(backend):
    m = _Routed(6)
    f = ember.compile(m, backend=backend)
    x = torch.randn(2, 4)
    before = _graphs()
    with torch.no_grad():
        _same(f(x), m(x))
        _same(f(x), m(x))
    assert _graphs() - before <= 3  # the layers: 2, not 6 (and whatever the frame captured)


class _IndexedLayer(torch.nn.Module):
    def __init__(self, i):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.layer_idx = i  # an int the forward reads: a constant of each graph

    def forward(self, x):
        return self.lin(x) * (self.layer_idx + 1)


class _IndexedRouted(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(_IndexedLayer(i) for i in range(n))

    def forward(self, x):
        for layer in self.layers:
            if x.sum() > 1e9:
                x = x * 0
            x = layer(x).tanh()
        return x


def test_layers_past_the_recompile_limit_get_entries_of_their_own():
    """Each layer reads its own int: the shared entries recompile per layer until the limit;
    the layers after it are compiled on their own, not run eagerly."""
    m = _IndexedRouted(12)
    f = ember.compile(m, backend="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        _same(f(x), m(x))
        _same(f(x), m(x))
        after_two = _graphs()
        _same(f(x), m(x))
    assert _graphs() == after_two  # every layer has its entry now
    assert after_two >= 12


_WARM = """
import torch, ember
from ember import events

class Block(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        torch.manual_seed(s)
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.lin(x).relu()

def step(m, x):
    return m(x)

f = ember.compile(step, backend="eager")
x = torch.randn(2, 4)
blocks = [Block(i) for i in range(4)]  # alive together (an entry dies with its module)
with torch.no_grad():
    for b in blocks:
        assert torch.equal(f(b, x), b(x))
print(events.counters["stats"]["graphs"], len(f.cache.entries) if hasattr(f, "cache") else -1)
"""


def test_warm_start_shares_as_a_cold_one(tmp_path, py):
    """Cold and warm processes end with the same graphs: a first entry rebuilt from the on-disk
    cache records its module argument as a traced one does (Frame._saw_modules), so the second
    instance gets the shared graph, not one more specialized one. (tests/breaks/
    test_nested_skip.py counted one graph too many on a warm cache before that.)"""
    env = {"EMBER_CACHE_DIR": str(tmp_path / "cache")}
    outs = []
    for _ in range(2):
        r = py(_WARM, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.split())
    cold, warm = outs
    assert cold[0] == "2"       # the first instance, then one shared graph
    assert warm[0] == "2"       # the rebuilt first entry, then one shared graph (traced)


def test_models_made_one_after_another_are_each_specialized():
    """A sweep: each model dropped before the next is made. The first one's entry dies with it,
    and the next one is specialized on (stable, foldable parameters), not shared."""
    import gc

    seen = []

    def compile_fn(gm, example_inputs, *, context=None, **options):
        seen.append({i.stable_address for i in context.inputs if i.kind == "parameter"})
        return gm.forward

    f = ember.compile(_step, backend=ember.Backend(name="sharing_sweep", compile=compile_fn))
    x = torch.randn(2, 4)
    with torch.no_grad():
        for i in range(3):
            b = Block(i)
            _same(f(b, x), b(x))
            del b
            gc.collect()
    assert seen == [{True}] * 3
