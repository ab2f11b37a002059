"""Regression tests for the capture gaps the Hugging Face corpus (tests/hf) found: each program
compiles as one graph (no fallback) and matches eager, gradients included."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import ember
import ember.events


def _compile_run(fn, *args, backend="eager"):
    ember.reset()
    out = ember.compile(fn, backend=backend)(*args)
    return out, dict(ember.events.counters["stats"]), sum(
        ember.events.counters["graph_breaks"].values())


def _one_graph(stats, breaks):
    assert stats.get("fallbacks", 0) == 0 and stats.get("graphs") == 1 and breaks == 0, stats


class _ScaledClip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x.clamp(-1, 1) * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 100.0 * ctx.k + x * 0, None  # not the true derivative: must be the one used


def test_custom_autograd_function_forward_traced_and_its_backward_used() -> None:
    def f(x):
        return _ScaledClip.apply(x.sin(), 2.0).cos()

    for backend in ("eager", "aot_eager"):
        x = torch.randn(5, requires_grad=True)
        out, stats, breaks = _compile_run(f, x, backend=backend)
        _one_graph(stats, breaks)
        out.sum().backward()
        got, x.grad = x.grad, None
        ref = f(x)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(got, x.grad)


def test_parametrized_modules() -> None:
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3, padding=1),
                                                       name="weight", dim=2)
    lin = torch.nn.Linear(4, 4)
    torch.nn.utils.parametrize.register_parametrization(lin, "weight", torch.nn.Tanh())
    model = torch.nn.Sequential(conv, torch.nn.Flatten(1), torch.nn.Unflatten(1, (4, 5)))

    def f(x):
        return lin(model(x).transpose(1, 2))

    for backend in ("eager", "aot_eager"):
        x = torch.randn(2, 4, 5)
        out, stats, breaks = _compile_run(f, x, backend=backend)
        _one_graph(stats, breaks)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in (*conv.parameters(), *lin.parameters())]
        for p in (*conv.parameters(), *lin.parameters()):
            p.grad = None
        ref = f(x)
        ref.square().sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(grads, [p.grad for p in (*conv.parameters(),
                                                            *lin.parameters())])
        for p in (*conv.parameters(), *lin.parameters()):
            p.grad = None


@torch.jit.script
def _scripted(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(y) + 1


@functools.lru_cache
def _cached_flag(n: int) -> bool:
    return n > 2


def test_script_function_and_lru_cache_are_traced() -> None:
    def f(x):
        return _scripted(x, x.cos()) * (2 if _cached_flag(3) else 3)

    x = torch.randn(4)
    out, stats, breaks = _compile_run(f, x)
    _one_graph(stats, breaks)
    torch.testing.assert_close(out, f(x))


def test_torch_helper_lambda_is_inlined_not_a_graph_node() -> None:
    import torch.testing._internal.common_utils as cu  # noqa: F401  (a torch.* module)

    helper = eval("lambda t: t.abs() + 1", {"__name__": "torch.testing._fake"})
    helper.__module__ = "torch.testing._fake"

    def f(x):
        return helper(x) * 2

    x = torch.randn(3)
    out, stats, breaks = _compile_run(f, x)
    _one_graph(stats, breaks)
    torch.testing.assert_close(out, f(x))


class SmallConfig:
    def __init__(self) -> None:
        self.layers = 2
        self.kinds = ["a", "b"]
        self.is_encoder_decoder = True

    def __eq__(self, other):
        return type(other) is type(self) and vars(other) == vars(self)

    def decoder_view(self, decoder: bool = True) -> "SmallConfig":
        out = copy.deepcopy(self)
        out.layers = self.layers + (1 if decoder else 0)
        return out


def test_config_copied_and_method_folded_with_state_guard() -> None:
    cfg = SmallConfig()

    def f(x):
        c = copy.deepcopy(cfg)
        c.layers = 5
        return x * c.layers + x * cfg.decoder_view(decoder=True).layers

    x = torch.randn(3)
    ember.reset()
    compiled = ember.compile(f, backend="eager")
    torch.testing.assert_close(compiled(x), f(x))
    assert ember.events.counters["stats"].get("fallbacks", 0) == 0
    cfg.layers = 7  # the state guard notices: a recompile, not a stale answer
    torch.testing.assert_close(compiled(x), f(x))


def test_break_in_function_with_cell_variables_resumes() -> None:
    """A function whose locals are captured by an inner function resumes after a break (the
    resume function receives the cells themselves), instead of running eagerly."""
    def f(x, n):
        k = 2
        acc = []

        def inner(t):
            return t * k
        y = inner(x)
        print("break")
        k = 3
        acc.append(1)
        z = inner(y) + len(acc)

        def bump():
            nonlocal k
            k = k + n
        bump()
        print("again")
        return z * k

    x = torch.randn(3)
    for backend in ("eager", "aot_eager"):
        ember.reset()
        compiled = ember.compile(f, backend=backend)
        for n in (4, 5):
            torch.testing.assert_close(compiled(x, n), f(x, n))
        stats = ember.events.counters["stats"]
        assert stats.get("fallbacks", 0) == 0 and stats["graphs"] >= 3, dict(stats)


def test_break_in_try_block_still_compiles_the_callee() -> None:
    def helper(x):
        y = x.sin()
        print("break")
        return y.cos() * 2

    def f(x):
        try:
            out = helper(x)
        finally:
            pass
        return out + 1

    x = torch.randn(3)
    out, stats, _ = _compile_run(f, x)
    torch.testing.assert_close(out, f(x))
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] >= 2, stats


def _item(x):
    n = x.sum().item()
    return x * n


def _nonzero(x):
    return (x > 0).nonzero().sum() + x.sum()


def _arange_tensor_end(x, n):
    return torch.arange(n) * x.sum()


def _branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@pytest.mark.parametrize("fn,extra", [(_item, ()), (_nonzero, ()),
                                      (_arange_tensor_end, (torch.tensor(5),)), (_branch, ())])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_data_dependent_ops_break_there_not_the_whole_frame(fn, extra, backend) -> None:
    x = torch.randn(4)
    out, stats, breaks = _compile_run(fn, x, *extra, backend=backend)
    torch.testing.assert_close(out, fn(x, *extra))
    assert stats.get("fallbacks", 0) == 0 and breaks == 1 and stats.get("graphs", 0) >= 1, stats


def test_sparse_csr_input_runs_eagerly_with_a_reason(caplog) -> None:
    def f(x, s):
        return (s @ x).sum()

    x, s = torch.randn(3, 2), torch.eye(3).to_sparse_csr()
    with caplog.at_level("INFO", logger="ember.fallback"):
        out, stats, _ = _compile_run(f, x, s)
    torch.testing.assert_close(out, f(x, s))
    assert stats.get("fallbacks") == 1
    assert "layout torch.sparse_csr" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # not an internal error


class _Act(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x)


class _Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for lin in self.lins:
            act = _Act()  # built per layer, inside the loop (ACT2FN-style)
            x = act(lin(x))
        return x


def test_parameterless_module_built_in_a_loop() -> None:
    m = _Layers()
    x = torch.randn(2, 4)
    out, stats, breaks = _compile_run(m, x)
    _one_graph(stats, breaks)
    torch.testing.assert_close(out, m(x))


def test_model_output_from_before_a_break() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutput

    def f(x):
        out = BaseModelOutput(last_hidden_state=x.sin())
        print("break")
        keys = list(out.keys())
        return out[keys[0]] * len(keys), out.to_tuple()[0]

    x = torch.randn(3)
    out, stats, _ = _compile_run(f, x)
    torch.testing.assert_close(out, f(x))
    assert stats.get("fallbacks", 0) == 0 and stats["graphs"] == 2, stats
