"""CPU-side behaviour of the cudagraphs backend: the errors and info logs without CUDA, the
declared options, the safety checks (on fake CUDA tensors), and the runtime under Ember's AOT
autograd with CPU fake graphs (training with an optimizer, zero_grad(set_to_none=True), a
parameter whose storage is swapped)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember_cudagraphs import runtime
from ember_cudagraphs.runtime import CUDAGraphed, for_graph
from ember_cudagraphs.safety import refusal_reason

from cudagraph_fakes import FakeOps

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")


def _f(x):
    return torch.sin(x) * 2


@no_cuda
def test_backend_without_cuda_raises_naming_the_device():
    fn = ember.compile(_f, backend="cudagraphs")
    with pytest.raises(ember.DeviceUnavailable) as ei:
        fn(torch.randn(3))
    msg = str(ei.value)
    assert "backend='cudagraphs'" in msg and "CUDA device" in msg and "aot_eager" in msg
    gm = make_fx(lambda x: (x + 1,))(torch.ones(2))
    with pytest.raises(ember.DeviceUnavailable):
        ember.get_backend("cudagraphs").compile(gm, [torch.ones(2)])


def test_reduce_overhead_on_cpu_compiles_as_the_default_mode_with_an_info_log(caplog):
    ember.reset()
    fn = ember.compile(_f, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(5)
    with caplog.at_level(logging.INFO, logger="ember.aot"):
        torch.testing.assert_close(fn(x), _f(x))
    assert "mode='reduce-overhead'" in caplog.text and "compiled without CUDA graphs" in caplog.text


def test_options_are_declared_and_checked():
    be = ember.get_backend("cudagraphs")
    # no longer experimental: the training crash of docs/cudagraphs.md was found and fixed
    assert "experimental" not in be.tags and "cudagraphs" in ember.list_backends(exclude_tags=())
    assert set(be.accepted_options()) == {"max_recordings"}
    with pytest.raises(ember.UnknownOption, match="max_recordings"):
        ember.compile(_f, backend="cudagraphs", options={"max_recording": 2})
    from ember_cudagraphs import _max_recordings
    assert _max_recordings({"max_recordings": 3}) == 3
    with pytest.raises(ValueError, match="max_recordings must be an int"):
        _max_recordings({"max_recordings": "many"})


# -- safety checks on fake CUDA tensors (no GPU needed) ----------------------------------------

def _cuda(*shape, device="cuda"):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(*shape, device=device)


def _graph(fn, *inputs):
    return make_fx(fn)(*inputs)


def test_safety_accepts_device_only_graphs_and_dropout():
    x = _cuda(4, 4)
    assert refusal_reason(_graph(lambda x: (x.sin() * 2,), x), [x]) is None
    # SDPA's philox seed/offset reach a backward as meta tensors (device decided at run time)
    seed = torch.empty(2, dtype=torch.uint64, device="meta")
    assert refusal_reason(_graph(lambda s, x: (x.sin(),), seed, x), [seed, x]) is None
    gm = _graph(lambda x: torch.ops.aten.native_dropout.default(x, 0.5, True), x)
    assert refusal_reason(gm, [x]) is None  # the default generator is replayed safely


@pytest.mark.parametrize("case, fragment", [
    ("cpu_input", "input 0 is a cpu tensor"),
    ("to_cpu", "makes a CPU tensor from the inputs"),
    ("from_cpu", "reads a CPU tensor into a CUDA one"),
    ("devices", "several devices"),
    ("item", "synchronizes with the host: _local_scalar_dense"),
    ("nonzero", "synchronizes with the host: nonzero"),
    ("cpu_generator", "cpu generator"),
    ("rng_state", "RNG state"),
    ("mutation", "mutates input"),
])
def test_safety_refuses_with_the_reason(case, fragment):
    x = _cuda(4)
    if case == "cpu_input":
        cpu = torch.ones(4)
        assert fragment in refusal_reason(_graph(lambda x: (x + 1,), cpu), [cpu])
        return
    if case == "devices":
        if torch.cuda.is_available() and torch.cuda.device_count() < 2:
            pytest.skip("a fake cuda:1 tensor needs a second GPU where CUDA is present")
        y = _cuda(4, device="cuda:1")
        assert fragment in refusal_reason(_graph(lambda x, y: (x + 1, y + 1), x, y), [x, y])
        return
    g = torch.fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = x
    cpu_gen = torch.Generator()
    if case == "to_cpu":
        n = g.call_function(torch.ops.aten._to_copy.default, (p,), {"device": torch.device("cpu")})
        n.meta["val"] = torch.empty(4)
    elif case == "from_cpu":
        c = g.get_attr("const")
        c.meta["val"] = torch.ones(4)
        n = g.call_function(torch.ops.aten._to_copy.default, (c,), {"device": x.device})
        n.meta["val"] = x
    elif case == "item":
        n = g.call_function(torch.ops.aten._local_scalar_dense.default, (p,))
        n.meta["val"] = 1.0
    elif case == "nonzero":
        n = g.call_function(torch.ops.aten.nonzero.default, (p,))
    elif case == "cpu_generator":
        n = g.call_function(torch.ops.aten.bernoulli.p, (p, 0.5), {"generator": cpu_gen})
        n.meta["val"] = x
    elif case == "rng_state":
        n = g.call_function(torch.ops.aten.get_rng_state.default if hasattr(
            torch.ops.aten, "get_rng_state") else torch.get_rng_state, ())
    else:
        n = g.call_function(torch.ops.aten.add_.Tensor, (p, p))
        n.meta["val"] = x
    g.output((n,))
    gm = types.SimpleNamespace(graph=g)  # (a generator constant has no Python source)
    reason = refusal_reason(gm, [x], [True])
    assert reason is not None and fragment in reason, reason
    if case == "mutation":  # a parameter updated in place is read in place: fine
        assert refusal_reason(gm, [x], [False]) is None


# -- the runtime under Ember's AOT autograd, with CPU fake graphs -------------------------------

@pytest.fixture
def fake_backend():
    ops = FakeOps()
    prev = runtime.set_ops(ops)
    made: list[CUDAGraphed] = []

    def compile_fake(gm, example_inputs, *, context=None, **options):
        g = for_graph(gm.forward, name=context.graph_id, kind=context.kind,
                      device=torch.device("cpu"), inputs=context.inputs)
        made.append(g)
        return g

    be = ember.Backend(name="fake_cudagraphs", compile=compile_fake, level="aten", options={})
    ember.reset()
    yield be, made, ops
    ember.reset()
    runtime.set_ops(prev)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_training_steps_match_eager_with_an_optimizer_and_set_to_none(fake_backend):
    be, made, ops = fake_backend
    torch.manual_seed(0)
    ref = _Net()
    net = _Net()
    net.load_state_dict(ref.state_dict())
    fast = ember.compile(net, backend=be)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(5):
        x = torch.randn(6, 8)
        for model, o, f in ((ref, opt_ref, ref), (net, opt, fast)):
            o.zero_grad(set_to_none=True)
            loss = f(x).square().mean()
            loss.backward()
            o.step()
        for (n, p), q in zip(ref.named_parameters(), net.parameters()):
            torch.testing.assert_close(q, p, msg=f"step {step}: {n}")
    fw = [g for g in made if g.kind == "forward"]
    bw = [g for g in made if g.kind == "backward"]
    assert len(fw) == 1 and len(bw) == 1
    assert fw[0].stats["replay"] == 3 and bw[0].stats["replay"] == 3
    assert fw[0].stats["eager"] == 0 and bw[0].stats["eager"] == 0
    # the backward reads the forward's saved activations in place
    rec_bw = next(iter(bw[0].recordings.values()))
    assert any(r[3] == "pool" for r in rec_bw.in_place)


def test_a_swapped_parameter_storage_records_again(fake_backend):
    be, made, ops = fake_backend
    net = _Net().eval()
    fast = ember.compile(net, backend=be)
    x = torch.randn(2, 8)
    with torch.no_grad():
        fast(x), fast(x), fast(x)
        net.fc1.weight.data = net.fc1.weight.data * 2  # .to() and some optimizers do this
        torch.testing.assert_close(fast(x), net(x))
    (g,) = made
    assert g.stats["record"] == 2 and g.stats["replay"] == 1


def test_inference_output_kept_across_calls_is_invalidated_not_changed(fake_backend):
    be, made, ops = fake_backend
    net = _Net().eval()
    fast = ember.compile(net, backend=be)
    x1, x2 = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        fast(x1), fast(x1)
        kept = fast(x1)
        expected = kept.clone()
        fast(x2)
    from cudagraph_fakes import was_killed
    assert was_killed(ops, kept)  # on a GPU, reading it raises the clone/mark-step message
    torch.testing.assert_close(expected, net(x1).detach())


def test_forward_twice_before_backward_gives_eager_gradients(fake_backend):
    """Two forwards, then one backward (gradient accumulation): the second forward must not
    replay over the first one's saved activations; every gradient equals eager's."""
    be, made, ops = fake_backend
    torch.manual_seed(0)
    ref = _Net()
    net = _Net()
    net.load_state_dict(ref.state_dict())
    fast = ember.compile(net, backend=be)
    for _ in range(5):
        x1, x2 = torch.randn(3, 8), torch.randn(3, 8)
        for m, f in ((ref, ref), (net, fast)):
            for p in m.parameters():
                p.grad = None
            (f(x1).sum() + f(x2).square().sum()).backward()
        for p, q in zip(ref.parameters(), net.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    fw = next(g for g in made if g.kind == "forward")
    bw = next(g for g in made if g.kind == "backward")
    assert fw.pool is bw.pool and fw.saved_tail > 0
    assert fw.stats["replay"] >= 3 and bw.stats["replay"] >= 3  # the first forward's pair
    assert fw.stats["eager"] >= 3  # the second forward: the first one's backward is pending
    assert not ops.killed  # nothing a backward still needs was invalidated


def test_backward_replays_when_a_saved_activation_views_the_user_input(fake_backend):
    """A 3-d input to a Linear: the forward saves a view of the input, which the runtime
    rebuilds over the caller's tensor (not pool memory); the backward must still record."""
    be, made, ops = fake_backend
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    net.load_state_dict(ref.state_dict())
    fast = ember.compile(net, backend=be)
    for _ in range(4):
        x = torch.randn(2, 5, 8)
        for m, f in ((ref, ref), (net, fast)):
            for p in m.parameters():
                p.grad = None
            f(x).sum().backward()
        for p, q in zip(ref.parameters(), net.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    fw = next(g for g in made if g.kind == "forward")
    bw = next(g for g in made if g.kind == "backward")
    assert "argview" in next(iter(fw.recordings.values())).saved_kinds or \
        "arg" in next(iter(fw.recordings.values())).saved_kinds
    assert fw.stats["replay"] == 2 and bw.stats["replay"] == 2, (fw.stats, bw.stats)


def test_callables_recorded_into_cuda_graphs_keep_no_buffers_between_calls():
    from ember.aot.compile import _cuda_graphs, _no_kept_buffers

    x, cpu = _cuda(4), torch.ones(4)
    assert _cuda_graphs({"mode": "reduce-overhead"}, [x])
    assert not _cuda_graphs({"mode": "reduce-overhead"}, [cpu])
    assert not _cuda_graphs({"mode": "default"}, [x])
    inductor = ember.get_backend("inductor")
    assert _no_kept_buffers({"mode": "reduce-overhead"}, inductor) == {
        "mode": "reduce-overhead", "buffer_pool": False}
    aot_eager = ember.get_backend("aot_eager")
    assert _no_kept_buffers({"mode": "reduce-overhead"}, aot_eager) == {"mode": "reduce-overhead"}


class _ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def test_frozen_graph_records_only_its_compiled_graph_and_checks_outside(monkeypatch):
    """Inductor's freezing under reduce-overhead (CPU fake graphs standing in for CUDA's): core
    hands the recording to the FrozenCall (ember_cudagraphs_split), which records the compiled
    graph with the folded constants as inputs read in place and keeps its per-call check
    outside. A parameter changed in place refolds, the new constants sit at new addresses,
    and the graph records again: every result equals eager's."""
    import ember.aot.compile as aot_compile
    from ember_inductor import freezing

    ops = FakeOps()
    prev = runtime.set_ops(ops)
    made: list[CUDAGraphed] = []
    wrapped: list[object] = []

    def wrap(fn, gm, example, ctx):
        wrapped.append(fn)
        g = for_graph(fn, name=ctx.graph_id, kind=ctx.kind, device=torch.device("cpu"),
                      inputs=ctx.inputs)
        made.append(g)
        return g

    def reduce_overhead(fn, gm, example, context, backend):  # core's, minus the CUDA test
        split = getattr(fn, "ember_cudagraphs_split", None)
        return split(wrap) if split is not None else wrap(fn, gm, example, context)

    monkeypatch.setattr(aot_compile, "_reduce_overhead", reduce_overhead)
    try:
        ember.reset()
        torch.manual_seed(0)
        model = _ConvBN().eval()
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 2.0)
        fast = ember.compile(model, options={"mode": "reduce-overhead"})
        x = torch.randn(2, 3, 6, 6)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(fast(x), model(x))
            for change in (lambda: model.conv.weight.data.mul_(-1.0),  # content only
                           lambda: model.bn.running_var.add_(1.0),  # version counter
                           lambda: model.load_state_dict(model.state_dict())):  # copy_
                change()
                for _ in range(2):
                    torch.testing.assert_close(fast(x), model(x))
        assert len(made) == 1 and not isinstance(wrapped[0], freezing.FrozenCall)
        g = made[0]
        # the constants are inputs read in place: a refold (new addresses) records again
        assert g.stats["record"] >= 3 and g.stats["replay"] >= 2, g.stats
        assert g.stats["eager"] == 0, g.stats
    finally:
        ember.reset()
        runtime.set_ops(prev)
