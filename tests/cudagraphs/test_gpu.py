"""The cudagraphs backend on a GPU: results equal eager's for inference and training of the zoo
models (small sizes), graphs are actually replayed, and the stale-memory cases behave as
docs/cudagraphs.md says (parameter replaced, output kept across steps, new shape, input
mutation, dropout, a forward run twice before its backward). Skipped without CUDA (CI)."""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ember
from ember_cudagraphs import runtime

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CUDA graphs); this machine has none")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import zoo  # noqa: E402

DEV = "cuda"


@pytest.fixture(autouse=True)
def fresh():
    ember.reset()
    torch.manual_seed(0)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # compare float32 with float32
    yield
    torch.backends.cudnn.allow_tf32 = tf32
    ember.reset()


def _wrappers(before: set[int]) -> list[runtime.CUDAGraphed]:
    return [g for g in list(runtime.ALL) if id(g) not in before]


def _ids() -> set[int]:
    return {id(g) for g in list(runtime.ALL)}


def _stat(ws, key, kind=None):
    return sum(g.stats[key] for g in ws if kind is None or g.kind == kind)


def _close(a, b, rtol=1e-4, atol=1e-4, msg=""):
    assert len(a) == len(b), msg
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=msg)


class Net(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1 = nn.Linear(d, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


MODELS = ["mlp", "transformer_block", "convnet", "gpt2", "bert"]


def _build(name):
    spec = zoo.get_spec(name)
    if spec.missing():
        pytest.skip(f"{name} needs {', '.join(spec.missing())}")
    return spec.build(DEV, "small")


def _infer_beside_eager(name, tol=1e-4, **compile_kwargs):
    """Four compiled inference calls of zoo model ``name``, each compared with eager's output;
    returns the CUDA-graph wrappers they made."""
    model, inputs = _build(name)
    model.eval()
    before = _ids()
    fast = ember.compile(model, **compile_kwargs)
    with torch.no_grad():
        ref = [t.clone() if isinstance(t, torch.Tensor) else t
               for t in zoo.flatten_outputs(model(*inputs))]
        for i in range(4):
            out = zoo.flatten_outputs(fast(*inputs))
            _close(out, ref, rtol=tol, atol=tol, msg=f"{name} call {i}")
            del out
    return _wrappers(before)


def _train_beside_eager(name, steps, rtol, atol, **compile_kwargs):
    """``steps`` SGD steps of zoo model ``name`` compiled and of an eager copy, loss and every
    gradient compared each step; returns the CUDA-graph wrappers they made."""
    ref, inputs = _build(name)
    ref.train()
    model = copy.deepcopy(ref)
    before = _ids()
    fast = ember.compile(model, **compile_kwargs)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=1e-3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(steps):
        results = []
        for m, f, o in ((ref, ref, opt_ref), (model, fast, opt)):
            o.zero_grad(set_to_none=True)
            loss = zoo.reduce_to_loss(f(*inputs))
            loss.backward()
            results.append([loss.detach().clone()] +
                           [p.grad.clone() for p in m.parameters() if p.grad is not None])
            o.step()
            del loss
        _close(results[1], results[0], rtol=rtol, atol=atol, msg=f"{name} step {step}")
    return _wrappers(before)


@pytest.mark.parametrize("name", MODELS)
def test_zoo_inference_matches_eager_and_replays(name):
    ws = _infer_beside_eager(name, backend="cudagraphs")
    assert ws and _stat(ws, "replay") >= 2, [g.stats for g in ws]
    assert all(g.refused is None for g in ws), [g.refused for g in ws]


@pytest.mark.parametrize("name", MODELS)
def test_zoo_training_gradients_equal_eager_with_optimizer(name):
    ws = _train_beside_eager(name, 5, rtol=2e-3, atol=2e-4, backend="cudagraphs")
    assert _stat(ws, "replay", "forward") >= 3 and _stat(ws, "replay", "backward") >= 3, \
        [(g.name, g.stats, g.refused) for g in ws]
    fw = [g for g in ws if g.kind == "forward"]
    bw = [g for g in ws if g.kind == "backward"]
    assert fw[0].pool is bw[0].pool  # one pool for the step's forward and backward


def test_training_memory_does_not_grow_across_steps():
    torch.manual_seed(0)
    model = Net().to(DEV)
    fast = ember.compile(model, backend="cudagraphs")
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 32, device=DEV)
    mem = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        fast(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        mem.append(torch.cuda.memory_allocated())
    assert mem[3:] == [mem[3]] * 5, mem


def test_parameter_replaced_records_again_and_reads_the_new_values():
    model = Net().to(DEV).eval()
    before = _ids()
    fast = ember.compile(model, backend="cudagraphs")
    x = torch.randn(4, 32, device=DEV)
    with torch.no_grad():
        for _ in range(3):
            fast(x)
        model.fc1.weight.data = model.fc1.weight.data * 2  # same Parameter, new storage
        torch.testing.assert_close(fast(x), model(x))
        sd = {k: v * 0.5 for k, v in model.state_dict().items()}
        model.load_state_dict(sd, assign=True)  # new Parameters: recaptured by Ember's guards
        torch.testing.assert_close(fast(x), model(x))
        torch.testing.assert_close(fast(x), model(x))
        with torch.no_grad():
            model.fc2.bias.add_(1.0)  # in place, same address: read in place
        torch.testing.assert_close(fast(x), model(x))
    assert _stat(_wrappers(before), "record") >= 2


def test_output_kept_across_steps_raises_with_the_way_out():
    model = Net().to(DEV).eval()
    fast = ember.compile(model, backend="cudagraphs")
    x1, x2 = torch.randn(4, 32, device=DEV), torch.randn(4, 32, device=DEV)
    with torch.no_grad():
        fast(x1), fast(x1)
        kept = fast(x1)
        cloned = kept.clone()
        fast(x2)
        with pytest.raises(RuntimeError, match=r"clone.*cudagraph_mark_step_begin"):
            kept + 1
        torch.testing.assert_close(cloned, model(x1))
        fresh = fast(x2)
        torch.testing.assert_close(fresh, model(x2))


def test_new_shapes_record_until_the_limit_then_warn_once(caplog):
    model = Net().to(DEV).eval()
    fast = ember.compile(model, backend="cudagraphs", dynamic=True,
                         options={"max_recordings": 2})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ember.cudagraphs"):
        for n in (2, 2, 3, 3, 4, 4, 5, 5, 2):
            x = torch.randn(n, 32, device=DEV)
            torch.testing.assert_close(fast(x), model(x))
    warns = [r.getMessage() for r in caplog.records if "max_recordings=2" in r.getMessage()]
    assert len(warns) == 1 and "mark_dynamic" in warns[0]


def test_input_mutation_reaches_the_input_every_call():
    def f(x, y):
        x.add_(1)
        return y * 2 + x

    fast = ember.compile(f, backend="cudagraphs")
    x, y = torch.zeros(8, device=DEV), torch.randn(8, device=DEV)
    xr = torch.zeros(8, device=DEV)
    for _ in range(5):
        out = fast(x, y)
        ref = f(xr, y)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x, xr)


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(512, 512))

    def forward(self, x):
        return torch.nn.functional.dropout(x * self.w, p=0.3, training=self.training)


def test_dropout_draws_fresh_masks_from_eager_distribution_when_replayed():
    model = DropNet().to(DEV)
    before = _ids()
    fast = ember.compile(model, backend="cudagraphs")
    x = torch.rand(512, 512, device=DEV) + 1.0  # never zero
    masks = []
    for _ in range(6):
        model.w.grad = None
        out = fast(x)
        out.sum().backward()
        zero = out.detach() == 0
        masks.append(zero)
        frac = zero.float().mean().item()
        assert abs(frac - 0.3) < 0.01, frac
        kept = ~zero
        torch.testing.assert_close(out.detach()[kept], (x / 0.7)[kept])
        torch.testing.assert_close(model.w.grad, torch.where(zero, 0.0, x / 0.7))
        del out
    for a, b in zip(masks[2:], masks[3:]):  # the replayed steps
        assert (a != b).float().mean().item() > 0.3
    assert _stat(_wrappers(before), "replay", "forward") >= 3


def test_forward_twice_before_backward_gives_eager_gradients():
    ref = Net().to(DEV)
    model = copy.deepcopy(ref)
    fast = ember.compile(model, backend="cudagraphs")
    for _ in range(4):
        x1, x2 = torch.randn(4, 32, device=DEV), torch.randn(4, 32, device=DEV)
        for m, f in ((ref, ref), (model, fast)):
            for p in m.parameters():
                p.grad = None
            (f(x1).sum() + f(x2).square().sum()).backward()
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4)


def test_mark_step_begin_lets_a_kept_forward_graph_be_overwritten():
    model = Net().to(DEV)
    before = _ids()
    fast = ember.compile(model, backend="cudagraphs")
    x = torch.randn(4, 32, device=DEV)
    fast(x).sum().backward()
    fast(x).sum().backward()
    outs = []
    for _ in range(3):  # forwards never differentiated, their autograd graphs kept
        ember.cudagraph_mark_step_begin()
        outs.append(fast(x))
    torch.testing.assert_close(outs[-1], model(x))
    with pytest.raises(RuntimeError, match="clone"):
        outs[0] + 1
    ws = _wrappers(before)
    assert _stat(ws, "replay", "forward") >= 3 and _stat(ws, "eager", "forward") == 0


def test_graphs_that_cannot_be_recorded_run_correctly_with_the_reason(caplog):
    def to_host(x):
        return (x.cpu() * 2).to(x.device) + 1

    x = torch.randn(8, device=DEV)
    with caplog.at_level(logging.INFO, logger="ember.cudagraphs"):
        fast = ember.compile(to_host, backend="cudagraphs")
        for _ in range(3):
            torch.testing.assert_close(fast(x), to_host(x))
    assert "runs without CUDA graphs" in caplog.text and "CPU tensor" in caplog.text


def test_reduce_overhead_records_aot_eager_callables():
    model = Net().to(DEV).eval()
    before = _ids()
    fast = ember.compile(model, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4, 32, device=DEV)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(fast(x), model(x))
    assert _stat(_wrappers(before), "replay") >= 2


def test_inference_mode_calls_replay_and_match_eager():
    model = Net().to(DEV).eval()
    before = _ids()
    fast = ember.compile(model, backend="cudagraphs")
    for i in range(4):
        x = torch.randn(4, 32, device=DEV)
        with torch.inference_mode():
            out = fast(x)
        torch.testing.assert_close(out, model(x))
        del out
    assert _stat(_wrappers(before), "replay") >= 2


# mode="reduce-overhead" with inductor: its Triton kernels recorded (issue 22)

@pytest.mark.parametrize("name", ["mlp", "transformer_block", "gpt2"])
def test_inductor_reduce_overhead_inference_matches_eager_and_replays(name):
    ws = _infer_beside_eager(name, tol=2e-3, mode="reduce-overhead")
    assert ws and _stat(ws, "replay") >= 2, [(g.stats, g.refused) for g in ws]


@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_inductor_reduce_overhead_training_gradients_equal_eager(name):
    ws = _train_beside_eager(name, 4, rtol=5e-3, atol=5e-4, mode="reduce-overhead")
    assert _stat(ws, "replay", "forward") >= 2 and _stat(ws, "replay", "backward") >= 2, \
        [(g.name, g.stats, g.refused) for g in ws]


class ConvBNNet(nn.Module):
    """Freezing folds the BatchNorm into the convolution and may derive constants from the
    linear layer's weight: every weight here feeds a folded constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


@pytest.mark.parametrize("mode,freezing", [(None, True), ("reduce-overhead", True),
                                          ("reduce-overhead", None)])
def test_inductor_inference_sees_weights_changed_in_place(mode, freezing):
    """Folded constants (freezing) under CUDA graphs: a replay runs no Python, so the check that
    the frozen parameters are unchanged must run outside the recording, every call. Each kind
    of in-place change must reach the result: an in-place op (version counter), copy_ through
    load_state_dict (version counter), and a write through .data (content only)."""
    model = ConvBNNet().to(DEV).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    before = _ids()
    opts = {} if freezing is None else {"freezing": freezing}  # (off by default on CUDA)
    if mode is not None:
        opts["mode"] = mode
    fast = ember.compile(model, options=opts or None)
    x = torch.randn(2, 3, 8, 8, device=DEV)
    changes = [
        ("in-place op", lambda: model.conv.weight.mul_(1.5)),
        ("load_state_dict", lambda: model.load_state_dict(
            {k: v * 0.5 if v.is_floating_point() else v
             for k, v in model.state_dict().items()})),
        ("bn buffer in place", lambda: model.bn.running_var.add_(1.0)),
        (".data write", lambda: model.fc.weight.data.mul_(-1.0)),
        ("conv .data write", lambda: model.conv.weight.data.add_(0.25)),
    ]
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
        for what, change in changes:
            change()
            for i in range(2):
                torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4,
                                           msg=f"after {what}, call {i}")
    if freezing:
        from ember_inductor.freezing import FrozenCall
        import gc
        calls = [o for o in gc.get_objects() if isinstance(o, FrozenCall)]
        assert calls and max(c.refolds for c in calls) >= 5, [c.refolds for c in calls]
    if mode == "reduce-overhead":
        ws = _wrappers(before)
        assert ws and _stat(ws, "replay") >= 2, [(g.stats, g.refused) for g in ws]
