"""Op-level tests of the Triton target against eager: pointwise (broadcasting, NaN/inf/-0.0,
integer division), reductions along each axis, var_mean, argmax, indexing (out of range raises
eager's IndexError), cat/pad, views, 2-D tiled transposes, dtypes the interpreter supports."""

from __future__ import annotations

import pytest
import torch

from triton_util import DEVICE, assert_same, compile_triton


def t(*shape, dtype=torch.float32, **kw):
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    if dtype.is_floating_point:
        x = torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)
    elif dtype == torch.bool:
        x = torch.randint(0, 2, shape, generator=g).bool()
    else:
        x = torch.randint(-20, 20, shape, generator=g).to(dtype)
    return x.to(DEVICE)


def special(*shape):
    x = t(*shape)
    flat = x.view(-1)
    vals = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40])
    flat[:len(vals)] = vals.to(DEVICE)
    return x


POINTWISE = {
    "chain": lambda x, y: torch.relu(x * 2 + y).sigmoid() - torch.tanh(y) / 3,
    "broadcast_row": lambda x, y: x + y[0],
    "broadcast_col": lambda x, y: x * y[:, :1] - 1.5,
    "math": lambda x, y: torch.exp(x).log1p() + torch.erf(y) + torch.sqrt(x.abs()) +
    torch.rsqrt(y.abs() + 1) + torch.expm1(y * 0.1) + torch.atan(x) + torch.floor(y * 3),
    "where_minmax": lambda x, y: torch.where(x > y, torch.maximum(x, y), torch.minimum(x, y)),
    "pow_clamp": lambda x, y: torch.clamp(x, -0.5, 0.5) ** 2 + y.pow(3),
    "gelu": lambda x, y: torch.nn.functional.gelu(x) + torch.nn.functional.silu(y),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise(name):
    fn = POINTWISE[name]
    x, y = t(6, 37), t(6, 37) + 0.5
    assert_same(compile_triton(fn)(x, y), fn(x, y))


def test_nan_inf_negative_zero():
    def fn(x):
        return (torch.maximum(x, torch.zeros_like(x)), torch.relu(x), x * -1.0, x.amax(1),
                x.argmax(1), torch.isnan(x), x.clamp(min=0))
    x = special(4, 12)
    assert_same(compile_triton(fn)(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division(dtype):
    def fn(a, b):
        return a // b, a % b, torch.div(a, b, rounding_mode="trunc"), (a * 3 - b) // 4
    a = t(5, 9, dtype=dtype)
    b = t(5, 9, dtype=dtype)
    b = torch.where(b == 0, torch.ones_like(b), b)
    assert_same(compile_triton(fn)(a, b), fn(a, b))


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's CUDA kernels do not raise on an integer "
                    "division by zero (nor does the Triton target there)")
def test_integer_division_by_zero_raises():
    def fn(a, b):
        return a // b
    a = t(4, dtype=torch.int64)
    b = torch.tensor([1, 2, 0, 3], device=DEVICE)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compile_triton(fn)(a, b)


def test_float_division_semantics():
    def fn(a, b):
        return a / b, a // b, torch.remainder(a, b), torch.fmod(a, b)
    a = torch.tensor([5.0, -5.0, 5.0, -5.0, 0.0, -0.0, 1.0, float("inf"), 7.5], device=DEVICE)
    b = torch.tensor([3.0, 3.0, -3.0, -3.0, 2.0, 2.0, 0.0, 2.0, 0.5], device=DEVICE)
    assert_same(compile_triton(fn)(a, b), fn(a, b))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, (0, 2)])
def test_reductions_each_axis(dim):
    def fn(x):
        p = x.prod(dim) if isinstance(dim, int) else x.prod(0)
        return x.sum(dim), x.amax(dim, keepdim=True), x.mean(dim), x.amin(dim), p
    x = t(4, 6, 10) * 0.5
    assert_same(compile_triton(fn)(x), fn(x), atol=1e-4, rtol=1e-4)


def test_argmax_argmin_ties_nan():
    def fn(x):
        return x.argmax(1), x.argmin(0), x.argmax(1, keepdim=True)
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, float("nan"), 5.0, float("nan")],
                      [0.0, 0.0, 0.0, 0.0]], device=DEVICE)
    assert_same(compile_triton(fn)(x), fn(x))


def test_var_mean_softmax_layernorm():
    def fn(x, w, b):
        v, m = torch.var_mean(x, dim=-1, unbiased=True)
        return (v, m, torch.softmax(x, -1), torch.log_softmax(x, 0),
                torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b))
    x, w, b = t(5, 33), t(33), t(33)
    assert_same(compile_triton(fn)(x, w, b), fn(x, w, b), atol=1e-5, rtol=1e-4)


def test_looped_reduction():
    # rows longer than a persistent block: the looped form
    def fn(x):
        return x.sum(-1), torch.softmax(x, -1), x.amax(-1), x.argmax(-1)
    x = t(3, 5000)
    assert_same(compile_triton(fn)(x), fn(x), atol=1e-4, rtol=1e-4)


def test_bool_any_all():
    def fn(x):
        return x.any(1), x.all(0), (x > 0).sum(1)
    x = t(6, 7)
    assert_same(compile_triton(fn)(x), fn(x))


def test_indexing():
    def fn(w, idx, x, g):
        return (torch.nn.functional.embedding(idx, w) * 2, x[idx[:, 0]], torch.gather(x, 1, g),
                torch.index_select(x, 0, idx[0]))
    w, x = t(10, 8), t(10, 5)
    idx = torch.tensor([[1, 9], [0, 3], [-1, 2]], device=DEVICE)
    g = torch.randint(0, 5, (10, 3)).to(DEVICE)
    idx_e = idx.clamp(min=0)
    assert_same(compile_triton(fn)(w, idx_e, x, g), fn(w, idx_e, x, g))

    def neg(x, i):  # x[i] wraps negative indices as eager does
        return x[i] + 1
    assert_same(compile_triton(neg)(x, idx[:, 0]), neg(x, idx[:, 0]))


def test_index_out_of_range_raises():
    def fn(w, idx):
        return torch.nn.functional.embedding(idx, w) + 1
    w = t(10, 4)
    ok = torch.tensor([1, 2], device=DEVICE)
    bad = torch.tensor([1, 10], device=DEVICE)
    cf = compile_triton(fn)
    assert_same(cf(w, ok), fn(w, ok))
    with pytest.raises(IndexError):
        cf(w, bad)


def test_cat_pad_views():
    def fn(x, y):
        a = torch.cat([x, y * 2], 1)
        b = torch.nn.functional.pad(x, (1, 2, 0, 1), value=-1.0)
        c = x.t().contiguous() + 1
        d = x.view(3, 2, 10).permute(2, 0, 1).reshape(10, 6) * y.reshape(10, 6)
        return a, b, c, d, x[1:, ::2] - 1
    x, y = t(6, 10), t(6, 10)
    assert_same(compile_triton(fn)(x, y), fn(x, y))


def test_transpose_2d_tiles():
    def fn(x):
        return x.t() * 2 + 1, (x.permute(1, 0) + x.t()).sum(1)
    x = t(48, 40)
    assert_same(compile_triton(fn)(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int8, torch.bool,
                                   torch.float16, torch.bfloat16])
def test_dtypes(dtype):
    if dtype in (torch.float16, torch.bfloat16) and DEVICE == "cpu":
        pytest.skip("the interpreter has no bfloat16/float16 arithmetic; tested on the GPU")

    def fn(x, y):
        if dtype == torch.bool:
            return x & y, x | ~y, (x ^ y).sum()
        return x * 2 + y, (x - y).abs(), x.sum(0), x.amax(1), (x > y).to(dtype)
    x, y = t(5, 7, dtype=dtype), t(5, 7, dtype=dtype)
    assert_same(compile_triton(fn)(x, y), fn(x, y))


def test_low_precision_sum_accumulates_in_float32():
    if DEVICE == "cpu":
        pytest.skip("the interpreter has no bfloat16 arithmetic; tested on the GPU")

    def fn(x):
        return x.sum(-1), torch.softmax(x, -1)
    x = t(4, 3000, dtype=torch.bfloat16)
    ref = fn(x.float())
    out = compile_triton(fn)(x)
    torch.testing.assert_close(out[0].float(), ref[0], atol=0.5, rtol=1e-2)
    torch.testing.assert_close(out[1].float(), ref[1], atol=1e-3, rtol=2e-2)


def test_dynamic_shapes_sizes_are_arguments():
    def fn(x, y):
        return torch.softmax(x * y, -1), x.sum(0)
    cf = compile_triton(fn, dynamic=True)
    for n in (3, 9, 17):
        x, y = t(n, 12), t(n, 12)
        assert_same(cf(x, y), fn(x, y))


def test_dynamic_flattened_index_divides_by_a_product_of_sizes():
    """A transposing copy with a symbolic dim: the flattened index is divided by ``32*s`` and
    taken modulo products of sizes. Printed without parentheses (``xindex // 32*s``) it read
    and wrote the wrong elements, past the buffer's end (HF switch_transformers training
    segfaulted in the interpreter); the C++ printer had the same flaw."""
    def fn(x):
        return (x.transpose(1, 2).contiguous() * 2,)
    cf = compile_triton(fn, dynamic=True)
    for n in (3, 5, 9):
        x = t(2, n, 4, 8)
        assert_same(cf(x), fn(x))


def test_index_printers_parenthesize_products():
    import sympy

    from ember_inductor.codegen.triton import _tl
    from ember_inductor.sizes import FloorDiv, ModularIndexing, _c, to_py

    x = sympy.Symbol("x", integer=True, nonnegative=True)
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert _tl(FloorDiv(x, 32 * s)) == "(x // (32*s0))"
    assert _tl(ModularIndexing(x, 8 * s, 4)) == "((x // (8*s0)) % 4)"
    assert _tl(ModularIndexing(x, 1, 2 * s)) == "(x % (2*s0))"
    assert _c(FloorDiv(x, 32 * s)) == "(x / (32*s0))"
    assert _c(ModularIndexing(x, 8 * s, 4)) == "((x / (8*s0)) % 4)"
    assert _tl(FloorDiv(x + 1, 3)) == "((x + 1) // 3)"
    # the wrapper's size expressions (grids, allocations, views): HF Swin with every size
    # symbolic launched a grid of 1/16 of its buffer ("... // 4*(s8*...)")
    assert to_py(FloorDiv(x, 4 * s)) == "(x // (4*s0))"
    assert to_py(ModularIndexing(x, 1, 2 * s)) == "(x % (2*s0))"
    for n in range(1, 40):  # the printed expressions evaluate as the sympy ones do
        for e in (FloorDiv(x, 3 * s), ModularIndexing(x, 2 * s, 5), ModularIndexing(x, 1, 2 * s)):
            want = int(e.subs({x: 7 * n + 3, s: 2}))
            for printed in (_tl(e), to_py(e)):
                assert eval(printed.replace("x", str(7 * n + 3)).replace("s0", "2")) == want


def test_mm_epilogue_and_scalar_reduction():
    def fn(x, w, b):
        h = torch.relu(x @ w + b)
        return h, h.sum(), (h * h).mean()
    x, w, b = t(8, 16), t(16, 12), t(12)
    assert_same(compile_triton(fn)(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)


def test_split_reductions(monkeypatch):
    """Few long rows: each row's reduction is split across programs (partial results in a
    workspace, then a finishing kernel); forced on here with small thresholds."""
    from ember_inductor.codegen import triton as tcg

    monkeypatch.setattr(tcg, "SPLIT_IN_INTERPRETER", [True])
    monkeypatch.setattr(tcg, "SPLIT_MIN_LENGTH", [2000])
    monkeypatch.setattr(tcg, "SPLIT_CHUNK", [700])

    def fn(x, m):
        return (x.sum(), x.amax(), (x * 2).sum(0), x.prod(0), m.any(), m.all(0),
                x.mean(1, keepdim=True))
    x = t(3000, 3) * 0.1 + 1
    m = t(3000, 3) > -3
    assert_same(compile_triton(fn)(x, m), fn(x, m), atol=1e-4, rtol=1e-4)


def _force_split(monkeypatch, min_length=2000, chunk=300):
    from ember_inductor.codegen import triton as tcg

    monkeypatch.setattr(tcg, "SPLIT_IN_INTERPRETER", [True])
    monkeypatch.setattr(tcg, "SPLIT_MIN_LENGTH", [min_length])
    monkeypatch.setattr(tcg, "SPLIT_CHUNK", [chunk])


@pytest.mark.parametrize("channels_last", [True, False])
def test_split_batch_norm_training(monkeypatch, channels_last):
    """A batch norm's statistics in training: per channel over N*H*W, few long rows (resnet50
    on a GPU ran them in under 64 programs: 2.4 ms for one kernel). Split across programs,
    the two-pass variance and the backward's sums each in their own split kernel, the running
    statistics and the weight gradient finished after them; output, gradients and running
    statistics equal eager's."""
    _force_split(monkeypatch)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def fn(x, w, b, rm, rv):
        y = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
        return torch.relu(y) * 2

    def run(f):
        x = (t(4, 6, 30, 30) * 3 + 5).to(memory_format=fmt).requires_grad_()
        w, b = (t(6) + 1).requires_grad_(), t(6).requires_grad_()
        rm, rv = torch.zeros(6, device=x.device), torch.ones(6, device=x.device)
        out = f(x, w, b, rm, rv)
        out.backward(torch.ones_like(out))
        return out, x.grad, w.grad, b.grad, rm, rv
    torch.manual_seed(0)
    want = run(fn)
    torch.manual_seed(0)
    got = run(compile_triton(fn))
    assert_same(got, want, atol=1e-4, rtol=1e-4)


def test_split_with_symbolic_sizes(monkeypatch):
    """Parts are chosen from the example sizes; each part's range is computed from the sizes
    of the call: one compiled graph serves other batch sizes."""
    _force_split(monkeypatch)

    def fn(x):
        return x.sum(0), torch.var_mean(x, dim=0), x.amax()
    f = compile_triton(fn, dynamic=True)
    for n in (3000, 2100, 4500):
        x = t(n, 5)
        assert_same(f(x), fn(x), atol=1e-4, rtol=1e-4)


def test_split_cuts_a_group_at_its_looped_blocks(monkeypatch):
    """The scheduler cuts a group whose looped blocks all split (a variance: the mean's sum,
    then the squares' sum reading it) into one group per block, and leaves others whole."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.codegen.triton import split_policy
    from ember_inductor.decompositions import decompositions
    from ember_inductor.lowering import GraphLowering
    from ember_inductor.scheduler import CppRegion, Scheduler
    from ember_inductor.sizes import SizeEnv, size_env

    _force_split(monkeypatch)

    def groups(x):
        gm = make_fx(lambda x: torch.var_mean(x, dim=(0, 2)),
                     decomposition_table=decompositions())(x)
        with size_env(SizeEnv()):
            graph = GraphLowering(gm)
            graph.run()
            sched = Scheduler(graph, split_policy=split_policy(4, interpret=True))
        return [g for s in sched.steps if isinstance(s, CppRegion) for g in s.groups]

    long = groups(torch.randn(8, 3, 1000).cpu())
    assert [g.split for g in long if g.split] and len([g for g in long if g.split]) == 2
    assert all(len([b for b in g.blocks if b.inner]) == 1 for g in long if g.split)
    short = groups(torch.randn(2, 3, 100).cpu())
    assert not any(g.split for g in short)


def test_cuda_reduction_tiles_for_rows_side_by_side(monkeypatch):
    """GPU kernels of reductions generated from fake CUDA tensors (no GPU needed): a column sum
    of [8192, 768] (a bias gradient: rows side by side in memory) gets tiles across 64 rows
    among the candidates tuning times; a [40000, 3] column sum (3 rows) is split into parts
    filling the GPU, its first kernel tiled across the rows."""
    import ast

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's configurations, not the interpreter's

    def kernels(shape):
        with FakeTensorMode(allow_non_fake_inputs=True):
            gm = make_fx(lambda x: (x * 2).sum(0), decomposition_table=decompositions())(
                torch.empty(*shape, device="cuda"))
        src, _ = generate_source(gm, key=f"cols-{shape}")
        table = src.split("KERNELS = ", 1)[1].split("\n", 1)[0]
        return ast.literal_eval(table)

    col = [k for k in kernels((8192, 768)).values() if "RBLOCK" in k["config"]]
    assert len(col) == 1 and col[0]["grid"] == "1d"
    assert any(c["XBLOCK"] == 64 for c in col[0]["candidates"][:2]), col[0]
    split = kernels((40000, 3))
    part = [k for k in split.values() if k["grid"] == "split"]
    assert len(part) == 1 and part[0]["config"]["XBLOCK"] == 4, part
    assert int(part[0]["numels"][1]) >= 8, part  # parts per row


def test_pointwise_across_a_reshape():
    """A GELU over [4, 6, 10] and its cast over [24, 10]; a LayerNorm over rows [4, 6] and its
    cast over [24, 10]: each fused into one kernel (scheduler ``_member_refined``)."""
    def fn(x, w):
        g = torch.nn.functional.gelu(x, approximate="tanh")
        n = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
        return g.view(-1, 10) * 2, n.reshape(24, 10) + 1
    x, w = t(4, 6, 10), t(10)
    assert_same(compile_triton(fn)(x, w), fn(x, w), atol=1e-5, rtol=1e-5)


def test_repeated_layers_share_one_kernel_definition():
    """Layers identical but for their buffers: one kernel in the module, called once per layer
    with that layer's arguments (codegen/triton.py ``_canonical_kernel``)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    def f(x, w1, w2, w3):
        h = torch.nn.functional.gelu(x @ w1)
        h = torch.nn.functional.gelu(h @ w2)
        return torch.nn.functional.gelu(h @ w3) * 2

    args = [t(8, 16)] + [t(16, 16) for _ in range(3)]
    gm = make_fx(f, decomposition_table=decompositions())(*[a.cpu() for a in args])
    src, _ = generate_source(gm, key="twins", options={"cpu_codegen": "triton"})
    kernel_defs = src.count("@triton.jit\ndef kernel")
    assert kernel_defs == 2, src  # two gelus share one kernel; the last one also scales
    assert_same(compile_triton(f)(*args), f(*args))


def test_tensors_made_inside_a_graph_with_no_input_are_made_on_their_device():
    # no tensor input: the values made inside decide the target (the CPU target allocated
    # torch.zeros(10, device="cuda") on the CPU)
    def fn():
        return (torch.zeros(10, device=DEVICE), torch.arange(6, device=DEVICE) * 2,
                torch.full((3,), 1.5, device=DEVICE))
    got, want = compile_triton(fn)(), fn()
    assert [g.device for g in got] == [w.device for w in want]
    assert_same(got, want)
