"""Matrix multiplies routed to oneDNN (patterns.fuse_linears): ``addmm``/``mm`` on float32 become
``mkldnn._linear_pointwise`` calls where allowed and chosen; results equal eager's, whatever the
operands' layouts (a linear layer's transposed weight, a ``[K, N]`` weight as Hugging Face's
Conv1D keeps it, a strided activation); what is not eligible stays on ATen."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor import patterns
from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

from inductor_util import assert_same

pytestmark = pytest.mark.skipif(patterns.linear_op() is None, reason="torch built without oneDNN")

LINEAR = "torch.ops.mkldnn._linear_pointwise.default("


def _blocks(x, w1, b1, w2, c, b3):
    F = torch.nn.functional
    h = F.gelu(F.linear(x, w1, b1))           # addmm(b1, x, w1.t())
    y = F.linear(h, w2)                        # mm(h, w2.t())
    z = torch.addmm(b3, y[:, ::2], c)          # a strided activation, a [K, N] weight
    return (y, z * 2)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    return (r(8, 16), r(32, 16) / 4, r(32), r(24, 32) / 6, r(12, 20) / 4, r(20))


def _compile(fn, args, **options):
    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(*args)
    key = f"pattern-linear-{sorted(options.items())}"
    src, _ = generate_source(gm, key=key, options=options)
    return src, load_wrapper(src, gm, key)


def test_always_routes_every_matmul_and_matches_eager() -> None:
    args = _inputs()
    src, call = _compile(_blocks, args, onednn_linear="always")
    body = src.split("\ndef call(", 1)[1]
    assert body.count(LINEAR) == 3, body
    assert "aten.addmm" not in body and "aten.mm" not in body, body
    assert body.count("'gelu', [], 'none')") == 1, body  # the gelu is oneDNN's post-op
    expected = _blocks(*args)
    for _ in range(2):
        assert_same(call(*args), expected)


def test_off_keeps_aten() -> None:
    args = _inputs()
    src, call = _compile(_blocks, args, onednn_linear=False)
    assert LINEAR not in src
    assert "aten.addmm" in src and "aten.mm" in src
    assert_same(call(*args), _blocks(*args))


def test_auto_leaves_small_products_on_aten() -> None:
    args = _inputs()
    src, call = _compile(_blocks, args)  # every product far under the rule's size
    assert LINEAR not in src
    assert_same(call(*args), _blocks(*args))


def fake_timings(monkeypatch, tmp_path, prefer: str) -> list[list[str]]:
    """Replace the timer of autotune.choose by one under which ``prefer`` always wins (nothing
    is run); a fresh on-disk cache, so no earlier choice is read. Returns the candidate lists
    it was asked to time."""
    from ember_inductor import autotune

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[list[str]] = []

    def fake(cands):
        asked.append(sorted(cands))
        return {name: (1.0 if name == prefer else 2.0) for name in cands}

    monkeypatch.setattr(autotune, "_time_all", fake)
    return asked


@pytest.mark.parametrize("winner", ["aten", "onednn"])
def test_auto_follows_the_timing(winner, monkeypatch, tmp_path) -> None:
    asked = fake_timings(monkeypatch, tmp_path, winner)
    g = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(128, 256, generator=g), torch.randn(256, 256, generator=g) / 16,
               torch.randn(256, generator=g))

    def fn(x, w, b):
        return (torch.nn.functional.linear(x, w, b).relu(),)

    src, call = _compile(fn, (x, w, b))
    assert asked == [["aten", "onednn"]]
    assert (LINEAR in src) == (winner == "onednn"), src
    assert_same(call(x, w, b), fn(x, w, b))


def test_ineligible_stay_on_aten() -> None:
    # float64 operands, and an addmm with beta/alpha other than 1
    args = _inputs(torch.float64)
    src, call = _compile(_blocks, args, onednn_linear="always")
    assert LINEAR not in src
    assert_same(call(*args), _blocks(*args))

    def scaled(x, w, b):
        return (torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),)

    a = _inputs()
    src, call = _compile(scaled, a[:3], onednn_linear="always")
    assert LINEAR not in src
    assert_same(call(*a[:3]), scaled(*a[:3]))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_post_op_only_when_sole_reader(approximate) -> None:
    F = torch.nn.functional

    def fused(x, w, b):
        return (F.gelu(F.linear(x, w, b), approximate=approximate) * 3,)

    def shared(x, w, b):
        y = F.linear(x, w, b)
        return (F.gelu(y, approximate=approximate) + y,)

    a = _inputs()[:3]
    a = (a[0] * 8, a[1], a[2])  # results well into both tails of gelu
    for fn, post in ((fused, True), (shared, False)):
        src, call = _compile(fn, a, onednn_linear="always")
        body = src.split("\ndef call(", 1)[1]
        assert body.count(LINEAR) == 1, body
        assert (f"'gelu', [], '{approximate}')" in body) == post, body
        assert_same(call(*a), fn(*a))


def test_gelu_post_op_through_the_view_of_a_3d_linear() -> None:
    F = torch.nn.functional

    def fn(x, w, b):  # view(x) -> addmm -> view -> gelu, as a linear layer on [B, T, C]
        return (F.gelu(F.linear(x, w, b)) - 1,)

    g = torch.Generator().manual_seed(2)
    a = (torch.randn(2, 4, 16, generator=g) * 4, torch.randn(32, 16, generator=g) / 4,
         torch.randn(32, generator=g))
    src, call = _compile(fn, a, onednn_linear="always")
    body = src.split("\ndef call(", 1)[1]
    assert body.count(LINEAR) == 1 and "'gelu', [], 'none')" in body, body
    assert_same(call(*a), fn(*a))


def _gelu_new(x):
    # Hugging Face's gelu_new (GPT-2's activation), written out
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("shared", [False, True])
def test_written_out_tanh_gelu_becomes_the_post_op(shared) -> None:
    F = torch.nn.functional

    def fn(x, w, b):
        y = F.linear(x, w, b)
        h = _gelu_new(y)
        return (h + y,) if shared else (h * 2,)

    g = torch.Generator().manual_seed(3)
    a = (torch.randn(2, 4, 16, generator=g) * 4, torch.randn(32, 16, generator=g) / 4,
         torch.randn(32, generator=g))
    src, call = _compile(fn, a, onednn_linear="always")
    body = src.split("\ndef call(", 1)[1]
    assert body.count(LINEAR) == 1, body
    assert ("'gelu', [], 'tanh')" in body) == (not shared), body
    assert_same(call(*a), fn(*a))


@pytest.mark.parametrize("winner", ["aten", "onednn"])
def test_transposed_activation_is_timed_too(winner, monkeypatch, tmp_path) -> None:
    asked = fake_timings(monkeypatch, tmp_path, winner)
    g = torch.Generator().manual_seed(4)
    gt, x = torch.randn(256, 128, generator=g), torch.randn(256, 256, generator=g)

    def fn(gt, x):  # a weight gradient: mm(grad.t(), x)
        return (torch.mm(gt.t(), x),)

    src, call = _compile(fn, (gt, x))
    assert asked == [["aten", "onednn"]]
    assert (LINEAR in src) == (winner == "onednn")
    assert_same(call(gt, x), fn(gt, x))


def test_bias_must_be_a_dense_graph_input() -> None:
    # oneDNN reads its bias as contiguous whatever the strides: a strided bias (or one computed
    # in the graph, whose layout the lowering decides) stays on addmm
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(8, 16, generator=g), torch.randn(32, 16, generator=g) / 4
    strided = torch.randn(64, generator=g)[::2]

    def fn(x, w, b):
        return (torch.nn.functional.linear(x, w, b),)

    def computed(x, w, b):
        return (torch.nn.functional.linear(x, w, b * 2),)

    for f, b in ((fn, strided), (computed, strided.contiguous())):
        src, call = _compile(f, (x, w, b), onednn_linear="always")
        assert LINEAR not in src, src
        assert_same(call(x, w, b), f(x, w, b))
    src, call = _compile(fn, (x, w, strided.contiguous()), onednn_linear="always")
    assert LINEAR in src
