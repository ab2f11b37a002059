"""Inductor on graphs with symbolic sizes (issue 12): ATen graphs as
``make_fx(f, tracing_mode="symbolic")`` produces them (the form Ember's AOT hands a backend under a
ShapeEnv) are compiled once, then run at many sizes against eager — sizes that are not multiples of
the vector width, a size smaller than the one compiled for, sizes large enough for the OpenMP
``if()`` to go parallel — and nothing compiles again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor import compile_fx
from ember_inductor.codegen.cpp import PRELUDE
from ember_inductor.compile_fx import compile_inductor, generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime import cache as rt_cache

from inductor_util import assert_same

SIZES = (8, 2, 3, 17, 33)  # compiled at the first
# Note: make_fx's ShapeEnv gives equal sizes one symbol ("duck sizing") and guards on it; an input
# built so that two dims are equal at the first size must keep them equal at every size.


def _trace(fn: Callable[..., Any], inputs: Sequence[Any]) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="symbolic", decomposition_table=decompositions())(*inputs)


def _work() -> tuple[int, int, int]:
    c = rt_cache.counters
    return (compile_fx.counters["generated"], compile_fx.counters["compiled"],
            c["builds"] + c["disk_hits"])


def sweep(fn: Callable[..., Any], make: Callable[[int], tuple[Any, ...]],
          sizes: Sequence[int] = SIZES, fallbacks_ok: bool = False, **tol: float) -> str:
    """Trace ``fn`` symbolically on ``make(sizes[0])``, compile it once, run it on every size
    against eager, and check that no call compiled anything. Returns the wrapper source."""
    torch.manual_seed(0)
    inputs = make(sizes[0])
    gm = _trace(fn, inputs)
    src, info = generate_source(gm, key="test")
    assert ".size(" in src, "the graph was not symbolic"
    if not fallbacks_ok:
        assert not info["fallbacks"], info["fallbacks"]
    compiled = compile_inductor(gm, list(inputs))
    before = _work()
    for n in sizes:
        args = make(n)
        with torch.no_grad():
            expected = fn(*args)
            actual = compiled(*args)
        assert_same(list(actual), list(expected) if isinstance(expected, (tuple, list))
                    else [expected], check_stride=True, **tol)
    assert _work() == before, "a call at a new size compiled something"
    return src


# -- pointwise -----------------------------------------------------------------------------------
def test_pointwise_broadcast() -> None:
    def f(x, y, z):
        return (torch.tanh(x * y + 0.5) - torch.sigmoid(z) * x, torch.relu(x).exp() + y)

    sweep(f, lambda n: (torch.randn(n, n + 5), torch.randn(n + 5), torch.randn(n, 1)))


def test_pointwise_transposed_input_and_int_dtypes() -> None:
    def f(x, i):
        return (x.t() * 2 + 1, (i * 3) // 2, (i % 5).to(torch.float32) + x.t())

    sweep(f, lambda n: (torch.randn(n + 3, n), torch.randint(-9, 9, (n, n + 3))))


def test_size_as_scalar_operand() -> None:
    def f(x):
        return (x / x.size(1) + x.size(0), torch.full_like(x, 1) * x.shape[0])

    sweep(f, lambda n: (torch.randn(n, 2 * n + 1),))


def test_parallel_if_large_sizes() -> None:
    """Compiled small, run at sizes where the OpenMP if() turns parallel."""
    def f(x, b):
        return (F.gelu(x + b) * 0.5, (x * x).sum(-1))

    src = sweep(f, lambda n: (torch.randn(n, 96), torch.randn(96)), sizes=(4, 700, 333))
    assert "if(" in src


# -- reductions ----------------------------------------------------------------------------------
def test_reductions_over_symbolic_dims() -> None:
    def f(x):
        return (x.sum(1), x.mean(0), x.amax(-1, keepdim=True), x.argmax(0),
                x.var(1, correction=1), x.sum())

    sweep(f, lambda n: (torch.randn(n, n + 7),))


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "argmin", "var", "prod", "softmax",
                                "log_softmax"])
def test_reduction_every_axis(op: str) -> None:
    """Every axis of a 3-d tensor with three symbolic dims, with and without keepdim, contiguous
    and transposed (the reduction walks strided memory)."""
    def red(x, d, keep):
        if op in ("softmax", "log_softmax"):
            return getattr(torch, op)(x, d)
        if op == "var":
            return x.var(d, keepdim=keep)
        if op == "argmin":
            return x.argmin(d, keepdim=keep)
        return getattr(torch, op)(x, d, keepdim=keep) if op != "prod" else x.prod(d, keep)

    def f(x, y):
        return tuple(red(t, d, keep) for t in (x, y.transpose(0, 2)) for d in range(3)
                     for keep in (False, True))

    def make(n):
        return (torch.rand(n, n + 3, 2 * n + 1) + 0.5, torch.rand(2 * n + 1, n + 3, n) + 0.5)

    sweep(f, make, sizes=(5, 2, 9), rtol=1e-4, atol=1e-5)


def test_softmax_layer_norm() -> None:
    def f(x, w, b):
        return (torch.softmax(x, -1), torch.log_softmax(x, 0),
                F.layer_norm(x, (x.shape[-1],), w, b))

    sweep(f, lambda n: (torch.randn(n + 1, 3 * n), torch.randn(3 * n), torch.randn(3 * n)),
          atol=1e-5, rtol=1e-4)


def test_long_reduction_accumulates_exactly() -> None:
    """Compiled with a short reduction, run with a long one: no accumulator choice may rest on
    the example size."""
    def f(x):
        return (x.sum(-1), x.mean(-1))

    sweep(f, lambda n: (torch.rand(3, n) + 100,), sizes=(16, 40000), rtol=1e-6, atol=1e-3)


def test_low_precision_and_integer_dtypes() -> None:
    def f(x, i):
        return (torch.softmax(x, -1), x.sum(0), (x * 2).to(torch.float32).mean(1), i.sum(1),
                i.amax(0), (i > 0).any(1))

    sweep(f, lambda n: (torch.randn(n, n + 9, dtype=torch.bfloat16),
                        torch.randint(-50, 50, (n, n + 9))), sizes=(8, 3, 70))


# -- views, cat, indexing -------------------------------------------------------------------------
def test_views_with_computed_sizes() -> None:
    def f(x):
        b = x.size(0)
        y = (x + 1).view(b, -1, 4).transpose(1, 2).reshape(b * 4, -1)
        z = x.reshape(-1)[: x.numel() // 2]
        return (y * 2, z + 1, x[:, 1:] - x[:, :-1], x.unsqueeze(1).expand(b, 3, -1) * 1.0,
                x.flatten() * 3)

    sweep(f, lambda n: (torch.randn(n, 4 * (n + 1)),))


def test_cat_and_pad() -> None:
    def f(x, y):
        return (torch.cat([x, y * 2], 1), torch.cat([x, x], 0) + 1, F.pad(x, (1, 2)) * 3)

    sweep(f, lambda n: (torch.randn(n, n + 2), torch.randn(n, 3)))


def test_indexing() -> None:
    def f(w, idx, x, g):
        return (F.embedding(idx, w) * 2, torch.gather(x, 1, g), x.index_select(0, idx[0]),
                x[idx[0]] + 1)

    def make(n):
        v = n + 4
        return (torch.randn(v, 6), torch.randint(0, n, (2, n)), torch.randn(n, v),
                torch.randint(0, v, (n, 3)))

    sweep(f, make)


def test_select_and_slice_scatter() -> None:
    def f(x):
        return (x[:, -1] * 2, x[-1] + 1, torch.slice_scatter(x, x[:, :2] * 0, 1, 1, 3),
                torch.select_scatter(x, x[:, 0] * 2, 1, -1), x[1:-1, 2:] + 1)

    sweep(f, lambda n: (torch.randn(n + 2, n + 4),))


# -- matmul epilogues, MLP, attention --------------------------------------------------------------
def test_matmul_epilogue() -> None:
    def f(x, w, b, r):
        return (torch.relu(x @ w.t() + b) + r, torch.bmm(x.unsqueeze(0), w.t().unsqueeze(0)))

    sweep(f, lambda n: (torch.randn(n, 16), torch.randn(24, 16), torch.randn(24),
                        torch.randn(n, 24)))


def test_sdpa_and_conv_externs() -> None:
    """Extern kernels called with computed sizes: attention over a symbolic sequence length,
    a convolution over symbolic batch and image sizes, with fused epilogues."""
    def attn(q, k, v, w):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (y.transpose(1, 2).reshape(q.size(0), q.size(2), -1) @ w + 1,)

    sweep(attn, lambda n: (torch.randn(2, 4, n, 8), torch.randn(2, 4, n, 8),
                           torch.randn(2, 4, n, 8), torch.randn(32, 16)),
          sizes=(6, 2, 3, 17), fallbacks_ok=True, atol=1e-4, rtol=1e-4)

    def conv(x, w, b):
        return (torch.relu(F.conv2d(x, w, b, padding=1)) * 2, F.max_pool2d(x, 2).sum((2, 3)))

    sweep(conv, lambda n: (torch.randn(n, 3, n + 6, 2 * n + 3), torch.randn(5, 3, 3, 3),
                           torch.randn(5)), sizes=(4, 2, 5), fallbacks_ok=True, atol=1e-4,
          rtol=1e-4)


class _Block(torch.nn.Module):
    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.h = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (u.view(b, t, self.h, d // self.h).transpose(1, 2) for u in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(x)


def test_attention_block_sequence_lengths() -> None:
    torch.manual_seed(0)
    m = _Block().eval()
    params = dict(m.named_parameters())

    def f(x, *ps):
        return (torch.func.functional_call(m, dict(zip(params, ps)), (x,)),)

    ps = tuple(params.values())
    sweep(f, lambda n: (torch.randn(2, n, 32),) + ps, fallbacks_ok=True, atol=1e-4, rtol=1e-4)


def test_mlp_batch_sizes() -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10),
                            torch.nn.LogSoftmax(-1)).eval()
    params = dict(m.named_parameters())

    def f(x, *ps):
        return (torch.func.functional_call(m, dict(zip(params, ps)), (x,)),)

    ps = tuple(params.values())
    sweep(f, lambda n: (torch.randn(n, 20),) + ps)


# -- SymInt inputs and outputs ---------------------------------------------------------------------
def test_symint_inputs_and_outputs() -> None:
    """A forward that returns sizes for its backward; a backward that takes them as SymInts."""
    def fwd(x):
        y = torch.tanh(x)
        return (y, x.size(0), x.size(0) * x.size(1))

    def bwd(g, n, numel):
        return (g.view(n, numel // n) * 2 + n,)

    gf = _trace(fwd, (torch.randn(8, 5),))
    cf = compile_inductor(gf, [torch.randn(8, 5)])
    x = torch.randn(8, 5)
    _, n, numel = cf(x)
    gb = _trace(bwd, (torch.randn(40), n, numel))
    assert [p.meta["val"].__class__ for p in gb.graph.nodes if p.op == "placeholder"][1:] == \
        [torch.SymInt, torch.SymInt]
    cb = compile_inductor(gb, [torch.randn(40), n, numel])
    before = _work()
    for rows, cols in ((8, 5), (3, 7), (2, 2), (17, 9)):
        x = torch.randn(rows, cols)
        y, n, numel = cf(x)
        assert (n, numel) == (rows, rows * cols) and isinstance(n, int)
        assert_same(y, torch.tanh(x))
        g = torch.randn(numel)
        assert_same(cb(g, n, numel)[0], bwd(g, n, numel)[0])
    assert _work() == before


def test_factories_with_symbolic_sizes() -> None:
    """arange/zeros/full sized by a SymInt input or by a tensor's size, and a value that is a
    size."""
    def f(x, n):
        return (torch.arange(x.size(0)) * 2 + x.size(1), torch.zeros(n, 3) + x.sum(),
                torch.full((n,), n) * 1.5, x + torch.arange(x.size(1)).unsqueeze(0), x.t() * 2)

    gm = _trace(f, (torch.randn(8, 6), 5))
    fn = compile_inductor(gm, [torch.randn(8, 6), 5])
    before = _work()
    for shape, n in (((8, 6), 5), ((3, 4), 2), ((17, 9), 33)):
        x = torch.randn(shape)
        assert_same(list(fn(x, n)), list(f(x, n)), check_stride=True)
    assert _work() == before


def test_cache_key_is_the_symbolic_source() -> None:
    """The same function traced at another example size is the same symbolic graph: its
    wrapper comes from the cache, nothing is generated."""
    def f(x):
        return (torch.softmax(x * 3, -1) + x.size(0),)

    gm = _trace(f, (torch.randn(6, 10),))
    compile_inductor(gm, [torch.randn(6, 10)])
    gen = compile_fx.counters["generated"]
    gm2 = _trace(f, (torch.randn(9, 13),))
    fn = compile_inductor(gm2, [torch.randn(9, 13)])
    assert compile_fx.counters["generated"] == gen
    x = torch.randn(4, 21)
    assert_same(fn(x)[0], f(x)[0])


def test_unbacked_size_runs_as_aten_ops_rather_than_specializing() -> None:
    """A size only known from data (nonzero) cannot be bound from the inputs: the graph runs as
    its ATen ops (logged; tests/inductor/test_unbacked_inductor.py), it never bakes in the
    example's value."""
    def f(x):
        return (x[x > 0] * 2,)

    gm = make_fx(f, tracing_mode="symbolic", decomposition_table=decompositions())(
        torch.randn(8))
    fn = compile_inductor(gm, [torch.randn(8)])
    for n_pos in (3, 6, 0):  # other counts of positive elements than the example's
        x = torch.cat([torch.rand(n_pos) + 0.5, -torch.rand(8 - n_pos) - 0.5])
        out = fn(x)[0]
        assert out.shape == (n_pos,)
        torch.testing.assert_close(out, f(x)[0])


# -- snapshot ---------------------------------------------------------------------------------------
SNAPSHOTS = Path(__file__).parent / "snapshots"


def test_snapshot_dynamic() -> None:
    """Generated code of a small dynamic graph: symbols bound from the inputs, passed to the
    kernel as int64_t, symbolic loop bounds and allocation sizes."""
    def f(x, b):
        return (torch.softmax(x + b, -1), (x * 2).sum(0))

    gm = _trace(f, (torch.randn(8, 12), torch.randn(12)))
    src, _ = generate_source(gm, key="snapshot")
    # the C++ prelude (helpers, libm declarations) is test_snapshots.py's business
    text = src.replace(PRELUDE, "\n// <PRELUDE>\n")
    path = SNAPSHOTS / "dynamic_softmax_colsum.py.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"generated code changed; see {path}"
    fn = load_wrapper(src, gm, "snapshot")
    for n, m in ((8, 12), (3, 5), (5, 19)):
        x, b = torch.randn(n, m), torch.randn(m)
        assert_same(list(fn(x, b)), list(f(x, b)), check_stride=True)
